//! The Kubernetes adapter of Switchyard, shared by the services' crates.
//!
//! - [`facts`]: Kubernetes objects as fact events (pure); inventory's
//!   watchers (`services/inventory/src/edge.rs`) append them to the log.
//! - [`platform`]: what the API server gives the module — its version, the
//!   feature gates, whether it serves the DRA API.
//! - [`watch`]: watches that re-list at once after 410 Gone and try again
//!   within a second while the API server is away.
//! - [`write`]: what every service's writers share — one field manager per
//!   service, Server-Side Apply with the manager's fields restated,
//!   read-decide-write with a resourceVersion precondition, retries with
//!   backoff, objects written concurrently. Each service's own writers live
//!   in its crate (`services/<name>/src/edge.rs`).

#![forbid(unsafe_code)]

pub mod facts;
pub mod platform;
pub mod watch;
pub mod write;
