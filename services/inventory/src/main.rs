//! `switchyard-inventory`: the inventory as a process ([`switchyard_inventory::main`]).

fn main() -> std::process::ExitCode {
    switchyard_inventory::main()
}
