//! `switchyard-class-compiler`: the class-compiler as a process ([`switchyard_class_compiler::main`]).

fn main() -> std::process::ExitCode {
    switchyard_class_compiler::main()
}
