//! `switchyard-alerter`: the alerter as a process ([`switchyard_alerter::main`]).

fn main() -> std::process::ExitCode {
    switchyard_alerter::main()
}
