//! The decision cores of Switchyard.
//!
//! Every core is a deterministic fold: `apply(state, event)` folds any event of
//! the log (a fact or a decision) into the state, and `decide(state, fact)`
//! returns the decisions a just-applied fact implies. No I/O, no clock, no
//! randomness, ordered maps only — so replaying a log yields the same state and
//! re-deciding its facts yields the same decisions, byte for byte.

#![forbid(unsafe_code)]

pub mod alerter;
pub mod app_move;
pub mod class_compiler;
pub mod cluster;
pub mod completion;
pub mod effects;
pub mod handover;
pub mod names;
pub mod rollback;
pub mod stack;
pub mod subjects;

pub use switchyard_proto::v1 as events;
