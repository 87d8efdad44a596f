//! The protobuf messages of Switchyard, generated at build time from `proto/`.
//!
//! Messages have canonical protobuf JSON (`serde`) through pbjson, which the CLI
//! uses for `-o json`. Map fields are `BTreeMap`s so encodings are deterministic.
//! [`schema`] describes that JSON for integrations, which receive each event as
//! a CloudEvent whose `type` is [`v1::domain_event::Kind::cloudevent_type`].

#![forbid(unsafe_code)]

pub mod schema;

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

    /// Writes the three views of the one list of event kinds below, so they
    /// cannot drift apart: `Kind::type_name`, `Kind::cloudevent_type` and
    /// `EVENT_TYPES`. A kind's message is named like its oneof case.
    macro_rules! event_kinds {
        ($($kind:ident => $cloudevent_type:literal,)*) => {
            /// Every kind of [`DomainEvent`] as `(type name, CloudEvent type, message)`:
            /// the name recorded in `Envelope.event_type`, the `type` of the
            /// CloudEvent an integration receives, and the full protobuf name of
            /// the event's message (the CloudEvent's `data`).
            pub const EVENT_TYPES: &[(&str, &str, &str)] = &[
                $((
                    stringify!($kind),
                    $cloudevent_type,
                    concat!("switchyard.v1.", stringify!($kind)),
                ),)*
            ];

            impl domain_event::Kind {
                /// The event's type name as recorded in `Envelope.event_type`.
                pub fn type_name(&self) -> &'static str {
                    match self {
                        $(domain_event::Kind::$kind(_) => stringify!($kind),)*
                    }
                }

                /// The `type` of the CloudEvent that publishes the event:
                /// `io.switchyard.<noun>.<verb>`, where the noun names what the
                /// event is about and the verb, in the past tense, what happened to it.
                pub fn cloudevent_type(&self) -> &'static str {
                    match self {
                        $(domain_event::Kind::$kind(_) => $cloudevent_type,)*
                    }
                }
            }
        };
    }

    // In the order of events.proto. The noun is the object the event is
    // about, which is not always the first word of its name: NodeGroupChanged
    // and NodeGroupWritten move a node to another group, so they are the
    // node's events; NodeGroupHeldOnDra is the NodeGroup's.
    event_kinds! {
        // Cluster facts (inventory).
        NodeObserved => "io.switchyard.node.observed",
        NodeRemoved => "io.switchyard.node.removed",
        NodeGroupObserved => "io.switchyard.node_group.observed",
        NodeGroupRemoved => "io.switchyard.node_group.removed",
        ModuleSettingsObserved => "io.switchyard.module_settings.observed",
        PhysicalGpuObserved => "io.switchyard.physical_gpu.observed",
        PhysicalGpuRemoved => "io.switchyard.physical_gpu.removed",
        WorkloadObserved => "io.switchyard.workload.observed",
        ResourceQuotaObserved => "io.switchyard.resource_quota.observed",
        PodObserved => "io.switchyard.pod.observed",
        PodRemoved => "io.switchyard.pod.removed",
        GpuClassObserved => "io.switchyard.gpu_class.observed",
        ResourceSliceObserved => "io.switchyard.resource_slice.observed",
        ResourceSliceRemoved => "io.switchyard.resource_slice.removed",
        DeviceClassObserved => "io.switchyard.device_class.observed",
        DeviceClassRemoved => "io.switchyard.device_class.removed",
        EvictionBlocked => "io.switchyard.eviction.blocked",
        GpuClassRemoved => "io.switchyard.gpu_class.removed",
        ResourceClaimObserved => "io.switchyard.resource_claim.observed",
        ResourceClaimRemoved => "io.switchyard.resource_claim.removed",
        WorkloadRemoved => "io.switchyard.workload.removed",
        NodeGroupWritten => "io.switchyard.node.group_written",
        // Stack decisions (stack-assigner).
        StackAssigned => "io.switchyard.stack.assigned",
        NodeGroupHeldOnDra => "io.switchyard.node_group.held_on_dra",
        NodeGroupReleased => "io.switchyard.node_group.released",
        // GPU classes (class-compiler).
        GpuClassCompiled => "io.switchyard.gpu_class.compiled",
        GpuClassRetired => "io.switchyard.gpu_class.retired",
        // Node handover (stack-assigner).
        HandoverStarted => "io.switchyard.handover.started",
        HandoverRefused => "io.switchyard.handover.refused",
        NodeCordoned => "io.switchyard.node.cordoned",
        NodeDrained => "io.switchyard.node.drained",
        NodeGroupChanged => "io.switchyard.node.group_changed",
        NodeReadinessObserved => "io.switchyard.node_readiness.observed",
        NodeUncordoned => "io.switchyard.node.uncordoned",
        HandoverCompleted => "io.switchyard.handover.completed",
        HandoverStalled => "io.switchyard.handover.stalled",
        // Application move (claim-allocator).
        ApplicationMoveStarted => "io.switchyard.application_move.started",
        ApplicationMoveRefused => "io.switchyard.application_move.refused",
        WorkloadRewritten => "io.switchyard.workload.rewritten",
        WorkloadRestarted => "io.switchyard.workload.restarted",
        ApplicationMoveVerified => "io.switchyard.application_move.verified",
        // Completion.
        ResourceQuotaTranslated => "io.switchyard.resource_quota.translated",
        LeftoverLabelsCleared => "io.switchyard.leftover_labels.cleared",
        SourceGroupRetired => "io.switchyard.source_group.retired",
        CompletionRefused => "io.switchyard.completion.refused",
        // Rollback.
        RollbackStarted => "io.switchyard.rollback.started",
        StepCompensated => "io.switchyard.step.compensated",
        RollbackCompleted => "io.switchyard.rollback.completed",
        // Alerts (alerter).
        AlertRaised => "io.switchyard.alert.raised",
        AlertCleared => "io.switchyard.alert.cleared",
        // Migration in waves (claim-allocator).
        MigrationStarted => "io.switchyard.migration.started",
        MigrationRefused => "io.switchyard.migration.refused",
        WaveStarted => "io.switchyard.wave.started",
        WaveCompleted => "io.switchyard.wave.completed",
        MigrationPaused => "io.switchyard.migration.paused",
        MigrationResumed => "io.switchyard.migration.resumed",
        MigrationAborted => "io.switchyard.migration.aborted",
        MigrationCompleted => "io.switchyard.migration.completed",
        // Node readiness gates (stack-assigner).
        ReadinessSelectorsConfigured => "io.switchyard.readiness_selectors.configured",
        StackSwitchHeld => "io.switchyard.stack_switch.held",
        BackendConfigured => "io.switchyard.backend.configured",
        ExclusivityLost => "io.switchyard.exclusivity.lost",
        ExclusivityRestored => "io.switchyard.exclusivity.restored",
        // Exit evidence (claim-allocator).
        EvidenceRecorded => "io.switchyard.evidence.recorded",
        EvidenceChecked => "io.switchyard.evidence.checked",
        // Leadership (any elected service).
        LeaderTermStarted => "io.switchyard.leader.term_started",
    }

    impl From<domain_event::Kind> for DomainEvent {
        fn from(kind: domain_event::Kind) -> Self {
            DomainEvent { kind: Some(kind) }
        }
    }
}
