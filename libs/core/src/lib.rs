//! The decision cores of Switchyard, one module per service —
//! [`stack_assigner`], [`class_compiler`], [`claim_allocator`], [`alerter`],
//! and [`inventory`] for the observers — each implementing the one
//! [`Core`](cores::Core) shape, plus what several share: the cluster model
//! ([`cluster`]), the stack rules ([`stack_rules`]), placements and their
//! rewrite ([`placement`]), the reference's names ([`names`]), the stack
//! backends' labels ([`backend`]), effects, log subjects and the rollback
//! planner.
//!
//! Every core is a deterministic fold: `fold(state, event)` folds any event of
//! the log (a fact or a decision) into the state, and `decide(state, input)`
//! returns the decisions an input implies. No I/O, no clock, no randomness,
//! ordered maps only — so replaying a log yields the same state and
//! re-deciding its facts yields the same decisions, byte for byte.

#![forbid(unsafe_code)]

pub mod alerter;
pub mod authors;
pub mod backend;
pub mod claim_allocator;
pub mod class_compiler;
pub mod cluster;
pub mod command;
pub mod cores;
pub mod effects;
pub mod inventory;
mod joined;
pub mod names;
pub mod placement;
pub mod rollback;
pub mod selector;
pub mod service;
pub mod service_name;
pub mod stack_assigner;
pub mod stack_rules;
pub mod subjects;

pub use command::Command;
pub use cores::{Core, CoreState};
pub use service::{Input, Record, ServiceName};
pub use switchyard_proto::v1 as events;
