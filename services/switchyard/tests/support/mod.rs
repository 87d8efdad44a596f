//! The harness of the tests that run Switchyard's services as processes on a
//! real control plane and JetStream: a service's process, the world they
//! run in, and the objects the tests make — `switchyard_testkit::migration`,
//! shared with the `switchyard-loadtest migrate` benchmark.
#![allow(dead_code, unused_imports)]

pub mod secured;

pub use switchyard_testkit::migration::*;
