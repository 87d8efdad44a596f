//! The protobuf messages of Switchyard, generated at build time from `proto/`.
//!
//! Messages have canonical protobuf JSON (`serde`) through pbjson, which the CLI
//! uses for `-o json`. Map fields are `BTreeMap`s so encodings are deterministic.

#![forbid(unsafe_code)]

pub mod v1 {
    #![allow(clippy::all, missing_docs)]
    include!(concat!(env!("OUT_DIR"), "/switchyard.v1.rs"));
    include!(concat!(env!("OUT_DIR"), "/switchyard.v1.serde.rs"));

    /// Version of the payload schema this build writes and understands.
    pub const SCHEMA_VERSION: u32 = 1;

    /// An event of `kind`: how cores and adapters build the events they record.
    pub fn event(kind: domain_event::Kind) -> DomainEvent {
        DomainEvent { kind: Some(kind) }
    }

    impl domain_event::Kind {
        /// The event's type name as recorded in `Envelope.event_type`.
        pub fn type_name(&self) -> &'static str {
            use domain_event::Kind::*;
            match self {
                MigrationStarted(_) => "MigrationStarted",
                MigrationRefused(_) => "MigrationRefused",
                WaveStarted(_) => "WaveStarted",
                WaveCompleted(_) => "WaveCompleted",
                MigrationPaused(_) => "MigrationPaused",
                MigrationResumed(_) => "MigrationResumed",
                MigrationAborted(_) => "MigrationAborted",
                MigrationCompleted(_) => "MigrationCompleted",
                NodeObserved(_) => "NodeObserved",
                NodeRemoved(_) => "NodeRemoved",
                NodeGroupObserved(_) => "NodeGroupObserved",
                NodeGroupRemoved(_) => "NodeGroupRemoved",
                ModuleSettingsObserved(_) => "ModuleSettingsObserved",
                PhysicalGpuObserved(_) => "PhysicalGpuObserved",
                PhysicalGpuRemoved(_) => "PhysicalGpuRemoved",
                WorkloadObserved(_) => "WorkloadObserved",
                ResourceQuotaObserved(_) => "ResourceQuotaObserved",
                PodObserved(_) => "PodObserved",
                PodRemoved(_) => "PodRemoved",
                GpuClassObserved(_) => "GpuClassObserved",
                ResourceSliceObserved(_) => "ResourceSliceObserved",
                ResourceSliceRemoved(_) => "ResourceSliceRemoved",
                DeviceClassObserved(_) => "DeviceClassObserved",
                DeviceClassRemoved(_) => "DeviceClassRemoved",
                EvictionBlocked(_) => "EvictionBlocked",
                NodeGroupWritten(_) => "NodeGroupWritten",
                GpuClassRemoved(_) => "GpuClassRemoved",
                ResourceClaimObserved(_) => "ResourceClaimObserved",
                ResourceClaimRemoved(_) => "ResourceClaimRemoved",
                WorkloadRemoved(_) => "WorkloadRemoved",
                GpuClassRetired(_) => "GpuClassRetired",
                StackAssigned(_) => "StackAssigned",
                NodeGroupHeldOnDra(_) => "NodeGroupHeldOnDra",
                NodeGroupReleased(_) => "NodeGroupReleased",
                GpuClassCompiled(_) => "GpuClassCompiled",
                HandoverStarted(_) => "HandoverStarted",
                HandoverRefused(_) => "HandoverRefused",
                NodeCordoned(_) => "NodeCordoned",
                NodeDrained(_) => "NodeDrained",
                NodeGroupChanged(_) => "NodeGroupChanged",
                NodeReadinessObserved(_) => "NodeReadinessObserved",
                NodeUncordoned(_) => "NodeUncordoned",
                HandoverCompleted(_) => "HandoverCompleted",
                HandoverStalled(_) => "HandoverStalled",
                ApplicationMoveStarted(_) => "ApplicationMoveStarted",
                ApplicationMoveRefused(_) => "ApplicationMoveRefused",
                WorkloadRewritten(_) => "WorkloadRewritten",
                WorkloadRestarted(_) => "WorkloadRestarted",
                ApplicationMoveVerified(_) => "ApplicationMoveVerified",
                ResourceQuotaTranslated(_) => "ResourceQuotaTranslated",
                LeftoverLabelsCleared(_) => "LeftoverLabelsCleared",
                SourceGroupRetired(_) => "SourceGroupRetired",
                CompletionRefused(_) => "CompletionRefused",
                RollbackStarted(_) => "RollbackStarted",
                StepCompensated(_) => "StepCompensated",
                RollbackCompleted(_) => "RollbackCompleted",
                AlertRaised(_) => "AlertRaised",
                AlertCleared(_) => "AlertCleared",
                ReadinessSelectorsConfigured(_) => "ReadinessSelectorsConfigured",
                StackSwitchHeld(_) => "StackSwitchHeld",
                EvidenceRecorded(_) => "EvidenceRecorded",
                EvidenceChecked(_) => "EvidenceChecked",
            }
        }
    }

    impl From<domain_event::Kind> for DomainEvent {
        fn from(kind: domain_event::Kind) -> Self {
            DomainEvent { kind: Some(kind) }
        }
    }
}
