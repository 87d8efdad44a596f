//! The class-compiler core: a GPUClass becomes DeviceClasses, one per
//! allocation variant, each published as an extended resource applications
//! request (reference, "Step 2. Create a GPU class").
//!
//! This build compiles the whole-card variant; MIG partitions and shares, and
//! the translation of the class's device selector into CEL, come with the DRA
//! engine.

use std::collections::BTreeMap;

use switchyard_proto::v1::{CompiledVariant, DomainEvent, GpuClassCompiled, domain_event::Kind};

use crate::effects::Effect;
use crate::names::CLASS_RESOURCE_PREFIX;

/// The NVIDIA DRA driver's name and its whole-GPU device type.
pub const NVIDIA_DRIVER: &str = "gpu.nvidia.com";

#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClassCompiler {
    pub compiled: BTreeMap<String, Vec<CompiledVariant>>,
    /// GPUClass -> the DeviceClass names its status lists, as observed.
    pub published: BTreeMap<String, Vec<String>>,
}

/// The variants of a class: today, the whole card.
pub fn compile(class: &str) -> Vec<CompiledVariant> {
    vec![CompiledVariant {
        variant: "whole".into(),
        device_class: format!("{class}.gpu.deckhouse.io"),
        extended_resource_name: format!("{CLASS_RESOURCE_PREFIX}{class}"),
        cel_selector: format!(
            "device.driver == \"{NVIDIA_DRIVER}\" && device.attributes[\"{NVIDIA_DRIVER}\"].type == \"gpu\""
        ),
    }]
}

impl ClassCompiler {
    pub fn apply(&mut self, event: &DomainEvent) {
        match &event.kind {
            Some(Kind::GpuClassCompiled(c)) => {
                self.compiled
                    .insert(c.gpu_class.clone(), c.variants.clone());
            }
            Some(Kind::GpuClassObserved(c)) => {
                self.published
                    .insert(c.name.clone(), c.device_class_names.clone());
            }
            _ => {}
        }
    }

    /// Compiles a class the first time it is seen.
    pub fn handle(&mut self, event: &DomainEvent) -> Vec<DomainEvent> {
        self.apply(event);
        let Some(Kind::GpuClassObserved(class)) = &event.kind else {
            return Vec::new();
        };
        if self.compiled.contains_key(&class.name) {
            return Vec::new();
        }
        let decision = DomainEvent {
            kind: Some(Kind::GpuClassCompiled(GpuClassCompiled {
                gpu_class: class.name.clone(),
                variants: compile(&class.name),
            })),
        };
        self.apply(&decision);
        vec![decision]
    }

    /// DeviceClasses and class status not yet as compiled.
    pub fn effects(&self) -> Vec<Effect> {
        self.compiled
            .iter()
            .filter(|(class, variants)| {
                let names: Vec<&str> = variants.iter().map(|v| v.device_class.as_str()).collect();
                self.published
                    .get(*class)
                    .map(|d| d.iter().map(String::as_str).collect::<Vec<_>>())
                    != Some(names)
            })
            .map(|(class, variants)| Effect::PublishDeviceClasses {
                gpu_class: class.clone(),
                variants: variants.clone(),
            })
            .collect()
    }
}
