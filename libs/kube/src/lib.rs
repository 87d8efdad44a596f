//! The Kubernetes adapter of Switchyard, shared by the services' crates.
//!
//! - [`facts`]: Kubernetes objects as fact events (pure).
//! - [`inventory`]: watchers over Nodes, NodeGroups, the ModuleConfig,
//!   GPUClasses, PhysicalGPUs, Pods, workloads, quotas, ResourceSlices and
//!   DeviceClasses that append what changed to the log, once — across watch
//!   restarts, re-lists and restarts of the process.
//! - [`watch`]: watches that re-list at once after 410 Gone and try again
//!   within a second while the API server is away.
//! - [`write`]: what every service's writers share — one field manager per
//!   service, Server-Side Apply with the manager's fields restated,
//!   read-decide-write with a resourceVersion precondition, retries with
//!   backoff, objects written concurrently. Each service's own writers live
//!   in its crate (`services/<name>/src/edge.rs`).

#![forbid(unsafe_code)]

pub mod facts;
pub mod inventory;
pub mod platform;
pub mod watch;
pub mod write;
