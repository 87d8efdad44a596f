//! Who may write each kind of record: the observers write the facts, each
//! decision has the service that decides it. A record signed by a service
//! that never writes its kind is forged (or a bug) however good its
//! signature: a stack-assigner key cannot vouch for a `ModuleSettingsObserved`.
//!
//! An operator's command is recorded by the service that takes it (the
//! actor names the operator, the signature is the service's), so the table
//! is about signers, not actors. The match is exhaustive on purpose: a new
//! kind of record does not compile until it has its authors.

use switchyard_proto::v1::domain_event::Kind;

use crate::service::ServiceName;

const INVENTORY: &[ServiceName] = &[ServiceName::Inventory];
/// A GPU is reported by its node's agent; in a cluster inventory records what
/// the agents published as PhysicalGPU objects.
const GPU_OBSERVERS: &[ServiceName] = &[ServiceName::Inventory, ServiceName::NodeAgent];
const STACK_ASSIGNER: &[ServiceName] = &[ServiceName::StackAssigner];
const CLASS_COMPILER: &[ServiceName] = &[ServiceName::ClassCompiler];
const CLAIM_ALLOCATOR: &[ServiceName] = &[ServiceName::ClaimAllocator];
const ALERTER: &[ServiceName] = &[ServiceName::Alerter];
/// The services that run elected, with standbys: all but the node agent,
/// which runs once per node.
pub const ELECTED: &[ServiceName] = &[
    ServiceName::Inventory,
    ServiceName::StackAssigner,
    ServiceName::ClassCompiler,
    ServiceName::ClaimAllocator,
    ServiceName::Alerter,
];
/// A node's rollback is the stack-assigner's, an application's the
/// claim-allocator's.
const ROLLBACK: &[ServiceName] = &[ServiceName::StackAssigner, ServiceName::ClaimAllocator];

/// The services that may write a record of this kind.
pub fn authors(kind: &Kind) -> &'static [ServiceName] {
    match kind {
        Kind::PhysicalGpuObserved(_) | Kind::PhysicalGpuRemoved(_) => GPU_OBSERVERS,
        Kind::NodeObserved(_)
        | Kind::NodeRemoved(_)
        | Kind::NodeGroupObserved(_)
        | Kind::NodeGroupRemoved(_)
        | Kind::ModuleSettingsObserved(_)
        | Kind::WorkloadObserved(_)
        | Kind::WorkloadRemoved(_)
        | Kind::ResourceQuotaObserved(_)
        | Kind::PodObserved(_)
        | Kind::PodRemoved(_)
        | Kind::GpuClassObserved(_)
        | Kind::GpuClassRemoved(_)
        | Kind::ResourceSliceObserved(_)
        | Kind::ResourceSliceRemoved(_)
        | Kind::DeviceClassObserved(_)
        | Kind::DeviceClassRemoved(_)
        | Kind::ResourceClaimObserved(_)
        | Kind::ResourceClaimRemoved(_) => INVENTORY,
        // The drain's refusal and the move as written are met by the
        // stack-assigner's edge.
        Kind::EvictionBlocked(_)
        | Kind::NodeGroupWritten(_)
        | Kind::StackAssigned(_)
        | Kind::NodeGroupHeldOnDra(_)
        | Kind::NodeGroupReleased(_)
        | Kind::HandoverStarted(_)
        | Kind::HandoverRefused(_)
        | Kind::NodeCordoned(_)
        | Kind::NodeDrained(_)
        | Kind::NodeGroupChanged(_)
        | Kind::NodeReadinessObserved(_)
        | Kind::NodeUncordoned(_)
        | Kind::HandoverCompleted(_)
        | Kind::HandoverStalled(_)
        | Kind::ReadinessSelectorsConfigured(_)
        | Kind::BackendConfigured(_)
        | Kind::ExclusivityLost(_)
        | Kind::ExclusivityRestored(_)
        | Kind::StackSwitchHeld(_) => STACK_ASSIGNER,
        Kind::GpuClassCompiled(_) | Kind::GpuClassRetired(_) => CLASS_COMPILER,
        Kind::ApplicationMoveStarted(_)
        | Kind::ApplicationMoveRefused(_)
        | Kind::WorkloadRewritten(_)
        | Kind::WorkloadRestarted(_)
        | Kind::ApplicationMoveVerified(_)
        | Kind::ResourceQuotaTranslated(_)
        | Kind::LeftoverLabelsCleared(_)
        | Kind::SourceGroupRetired(_)
        | Kind::CompletionRefused(_)
        | Kind::MigrationStarted(_)
        | Kind::MigrationRefused(_)
        | Kind::WaveStarted(_)
        | Kind::WaveCompleted(_)
        | Kind::MigrationPaused(_)
        | Kind::MigrationResumed(_)
        | Kind::MigrationAborted(_)
        | Kind::MigrationCompleted(_)
        | Kind::EvidenceRecorded(_)
        | Kind::EvidenceChecked(_) => CLAIM_ALLOCATOR,
        Kind::RollbackStarted(_) | Kind::StepCompensated(_) | Kind::RollbackCompleted(_) => {
            ROLLBACK
        }
        Kind::AlertRaised(_) | Kind::AlertCleared(_) => ALERTER,
        // Each writes its own (see check_author).
        Kind::LeaderTermStarted(_) => ELECTED,
    }
}

/// Whether only the observers write this kind: a fact of the cluster, not
/// a decision.
pub fn is_observation(kind: &Kind) -> bool {
    let authors = authors(kind);
    std::ptr::eq(authors, INVENTORY) || std::ptr::eq(authors, GPU_OBSERVERS)
}

/// Whether `identity` (a service's name, as the keyring and the log's actors
/// spell it) may write `kind`; why not, if not.
pub fn check_author(identity: &str, kind: &Kind) -> Result<(), String> {
    if let Kind::LeaderTermStarted(term) = kind
        && term.service != identity
    {
        return Err(format!(
            "signed by {identity}, but it starts a term of {}: a service starts only its own",
            term.service
        ));
    }
    let allowed = authors(kind);
    if allowed.iter().any(|s| s.as_str() == identity) {
        return Ok(());
    }
    let names: Vec<&str> = allowed.iter().map(|s| s.as_str()).collect();
    Err(format!(
        "signed by {identity}, which never writes this kind of record (its author: {})",
        names.join(" or ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_proto::v1::{AlertRaised, ModuleSettingsObserved, RollbackStarted};

    #[test]
    fn facts_are_the_observers_and_decisions_their_deciders() {
        let settings = Kind::ModuleSettingsObserved(ModuleSettingsObserved::default());
        assert_eq!(check_author("inventory", &settings), Ok(()));
        assert_eq!(
            check_author("stack-assigner", &settings),
            Err("signed by stack-assigner, which never writes this kind of record (its author: inventory)".into())
        );
        let rollback = Kind::RollbackStarted(RollbackStarted::default());
        assert!(check_author("stack-assigner", &rollback).is_ok());
        assert!(check_author("claim-allocator", &rollback).is_ok());
        assert!(check_author("alerter", &rollback).is_err());
        assert!(
            check_author(
                "ops@example.com",
                &Kind::AlertRaised(AlertRaised::default())
            )
            .is_err()
        );
    }
}
