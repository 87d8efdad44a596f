//! Operators' commands: what a person asks a service to do. They are not in
//! the log; what the owning service decides on one is.

use switchyard_proto::v1::{DomainEvent, WorkloadRef};

/// An operator's request to hand `node` over to `target_group`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StartHandover {
    pub handover_id: String,
    pub node: String,
    pub target_group: String,
    /// Hand the last device-plugin node over even though `nvidia.com/gpu`
    /// workloads would go Pending.
    pub force: bool,
}

/// An operator's request to move a workload to `target_group`, requesting `gpu_class`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MoveApplication {
    pub move_id: String,
    pub workload: WorkloadRef,
    pub target_group: String,
    pub gpu_class: String,
}

/// An operator's request to complete the migration away from `source_group`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Complete {
    pub source_group: String,
    /// The GPU class whose devices the quotas are translated to.
    pub gpu_class: String,
    /// The trial period on DRA is over: rollbacks are no longer needed.
    pub trial_period_over: bool,
}

/// An operator's command, for the service that owns it.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    StartHandover(StartHandover),
    MoveApplication(MoveApplication),
    Complete(Complete),
    /// A planned rollback (`RollbackStarted`), for the node's or workload's owner.
    Rollback(DomainEvent),
}
