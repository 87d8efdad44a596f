//! The Events the node agent records (events.k8s.io/v1): `GpuHealthChanged`
//! on a PhysicalGPU, `HandoverBlocked` on the Node.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use switchyard_gpu::publish;

use super::agent::{HandoverBlocked, Stack};

/// What the agent tells people through Kubernetes Events (events.k8s.io/v1,
/// in `default`, where events about cluster-scoped objects live):
/// `GpuHealthChanged` on a PhysicalGPU, `HandoverBlocked` on the Node.
pub(super) struct Events {
    recorder: Recorder,
    node: String,
}

impl Events {
    pub(super) fn new(client: kube::Client, node: &str) -> Events {
        Events {
            recorder: Recorder::new(
                client,
                Reporter {
                    controller: "switchyard-node-agent".into(),
                    instance: Some(node.to_string()),
                },
            ),
            node: node.to_string(),
        }
    }

    async fn publish(&self, event: Event, regarding: &ObjectReference) {
        if let Err(e) = self.recorder.publish(&event, regarding).await {
            tracing::warn!(error = %e, reason = %event.reason, "recording an event");
        }
    }

    pub(super) async fn gpu_health_changed(
        &self,
        gpu: &switchyard_gpu::Gpu,
        reason: &str,
        reported: &BTreeMap<String, ObjectReference>,
    ) {
        let regarding = reported
            .get(&gpu.uuid)
            .cloned()
            .unwrap_or_else(|| ObjectReference {
                api_version: Some("gpu.deckhouse.io/v1alpha1".into()),
                kind: Some("PhysicalGPU".into()),
                name: Some(publish::physical_gpu_name(&self.node, gpu.index)),
                ..ObjectReference::default()
            });
        let (type_, action, note) = if gpu.healthy {
            (
                EventType::Normal,
                "Untaint",
                format!(
                    "GPU {} ({}, index {}) is healthy again ({reason}); its devices no longer carry the {} taint",
                    gpu.uuid,
                    gpu.product_name,
                    gpu.index,
                    publish::UNHEALTHY_TAINT
                ),
            )
        } else {
            (
                EventType::Warning,
                "Taint",
                format!(
                    "GPU {} ({}, index {}) is unhealthy ({reason}); its devices carry the {}:NoSchedule taint and the device plugins list them Unhealthy",
                    gpu.uuid,
                    gpu.product_name,
                    gpu.index,
                    publish::UNHEALTHY_TAINT
                ),
            )
        };
        let event = Event {
            type_,
            reason: "GpuHealthChanged".into(),
            note: Some(note),
            action: action.into(),
            secondary: None,
        };
        self.publish(event, &regarding).await;
    }

    pub(super) async fn handover_blocked(
        &self,
        blocked: &HandoverBlocked,
        to: Option<Stack>,
        node: &ObjectReference,
    ) {
        let event = Event {
            type_: EventType::Warning,
            reason: "HandoverBlocked".into(),
            note: Some(format!(
                "{blocked}; the switch to {} waits until they are released",
                to.map_or("no stack", Stack::label)
            )),
            action: "SwitchStack".into(),
            secondary: None,
        };
        self.publish(event, node).await;
    }
}
