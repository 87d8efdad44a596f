//! `switchyard-stack-assigner`: the stack-assigner as a process ([`switchyard_stack_assigner::main`]).

fn main() -> std::process::ExitCode {
    switchyard_stack_assigner::main()
}
