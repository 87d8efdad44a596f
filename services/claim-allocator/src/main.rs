//! `switchyard-claim-allocator`: the claim-allocator as a process ([`switchyard_claim_allocator::main`]).

fn main() -> std::process::ExitCode {
    switchyard_claim_allocator::main()
}
