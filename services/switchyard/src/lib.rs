//! The `switchyard` command as a library: its commands (one module each,
//! owning its arguments) and the reference rendered from their clap
//! definitions — docs/reference/commands.md and the man pages.

#![forbid(unsafe_code)]

mod backend;
pub mod cli;
mod complete;
mod crdgen;
mod demo;
mod doctor;
mod dra_cmd;
mod evidence_cmd;
mod handover;
mod keys_cmd;
mod kube_args;
mod log_cmd;
mod man;
mod migrate;
mod move_cmd;
mod operator;
mod output;
mod plan;
pub mod reference;
mod rollback;
mod serve;
mod state;
