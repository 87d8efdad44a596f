//! `switchyard-node-agent`: `serve` the node's assigned stack, or `discover`
//! what the node would publish ([`switchyard_node_agent::main`]).

fn main() -> std::process::ExitCode {
    switchyard_node_agent::main()
}
