//! The class-compiler core: a GPUClass becomes DeviceClasses, one per
//! allocation variant, each published as an extended resource applications
//! request (reference, "Step 2. Create a GPU class").
//!
//! Devices are published by the GPU driver `gpu.deckhouse.io` with the
//! attributes `type` (`gpu` for a whole card, `mig` for a MIG partition),
//! `profile` (a MIG partition's profile, e.g. `1g.5gb`) and the PhysicalGPU
//! labels of the card (`gpu.deckhouse.io/device` becomes the attribute
//! `device`). A class's label selector becomes CEL over those attributes.
//!
//! Variants and their names (deterministic; `<p>` is a MIG profile):
//!
//! | variant | DeviceClass | extended resource | devices |
//! |---|---|---|---|
//! | whole card | `<class>.gpu.deckhouse.io` | `gpu.deckhouse.io/<class>` | `type == "gpu"` |
//! | MIG profile | `<class>-mig-<p>.gpu.deckhouse.io` | `gpu.deckhouse.io/<class>-mig-<p>` | `type == "mig" && profile == "<p>"` |
//! | share | `<class>-shared.gpu.deckhouse.io` | `gpu.deckhouse.io/<class>-shared` | `type == "gpu"`, shareable (`allowMultipleAllocations`) |
//! | legacy bridge | `<class>-legacy.gpu.deckhouse.io` | `nvidia.com/gpu` | as the whole card |
//!
//! The legacy bridge (`spec.legacyBridge`) serves manifests that still request
//! `nvidia.com/gpu` from DRA; at most one class in the cluster may have it. A
//! class whose DeviceClass or extended-resource name another class already
//! publishes (class `a100-shared` against the shares of class `a100`) is
//! refused too.
//!
//! A deleted class keeps its DeviceClasses while a ResourceClaim names one of
//! them; once none does, the class is retired and its DeviceClasses and
//! namespace restriction are deleted.
//!
//! A class whose spec cannot be compiled — a selector key no PhysicalGPU
//! label has, an unknown MIG profile, nothing offered — is refused with the
//! reason; its DeviceClasses stay as they were.
//!
//! On the `nvidia-operator` backend the same variants select the NVIDIA DRA
//! driver's devices (`gpu.nvidia.com`, attributes as its kubelet plugin
//! publishes them: `type` `gpu` or `mig`, `profile`, `productName`,
//! `architecture`, `brand`); a selector names those attributes by their
//! qualified names (`gpu.nvidia.com/productName`), and each test first asks
//! whether the device has the attribute (a device without it would fail the
//! whole allocation attempt, not just not match). The driver's own classes
//! (`gpu.nvidia.com`, `mig.nvidia.com`) are left alone, and since the driver's
//! `gpu.nvidia.com` class maps `nvidia.com/gpu` itself on `resource.k8s.io/v1`,
//! a bridge is refused while any class that is not ours maps it. The driver
//! shares a card through the claim's configuration, not through a class: a
//! share variant is refused.

use std::collections::BTreeMap;

use switchyard_proto::v1::{
    CompiledVariant, DomainEvent, GpuClassCompiled, GpuClassObserved, GpuClassRetired,
    LabelSelector, domain_event::Kind,
};

use crate::backend::{Backend, nvidia};
use crate::effects::Effect;
use crate::names::{CLASS_RESOURCE_PREFIX, NVIDIA_GPU};

pub use crate::names::GPU_DRIVER;

/// PhysicalGPU labels a class may select on; each is a device attribute of
/// the same name in the driver's domain.
pub const SELECTABLE_LABELS: [&str; 3] = [
    "gpu.deckhouse.io/device",
    "gpu.deckhouse.io/product",
    "gpu.deckhouse.io/architecture",
];

/// The NVIDIA DRA driver's string attributes a class may select on, by
/// their qualified names.
pub const NVIDIA_SELECTABLE: [&str; 3] = [
    "gpu.nvidia.com/productName",
    "gpu.nvidia.com/architecture",
    "gpu.nvidia.com/brand",
];

/// What a class compiles against: the driver whose devices it selects,
/// the selector keys it takes, and whether each attribute test is guarded
/// by the attribute's presence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Profile {
    pub driver: &'static str,
    keys: &'static [&'static str],
    /// What a key is, and what it must be: "label", "a label of …".
    key_noun: &'static str,
    what_keys: &'static str,
    guarded: bool,
}

impl Profile {
    pub const DECKHOUSE: Profile = Profile {
        driver: GPU_DRIVER,
        keys: &SELECTABLE_LABELS,
        key_noun: "label",
        what_keys: "a label of PhysicalGPU objects",
        guarded: false,
    };
    pub const NVIDIA: Profile = Profile {
        driver: nvidia::DRIVER,
        keys: &NVIDIA_SELECTABLE,
        key_noun: "attribute",
        what_keys: "an attribute the NVIDIA DRA driver publishes",
        guarded: true,
    };

    /// The profile of the driver `backend` serves the cards with.
    pub fn of(backend: &Backend) -> Profile {
        [Profile::DECKHOUSE, Profile::NVIDIA]
            .into_iter()
            .find(|p| p.driver == backend.driver())
            .unwrap_or(Profile::DECKHOUSE)
    }

    /// `device.attributes["<driver>"]`.
    fn attributes(&self) -> String {
        format!("device.attributes[{}]", quote(self.driver))
    }

    /// `test` over attribute `name`, guarded where the profile says.
    fn guard(&self, name: &str, test: String) -> String {
        if self.guarded {
            format!("{} in {} && {test}", quote(name), self.attributes())
        } else {
            test
        }
    }
}

/// The MIG profiles NVIDIA data-centre cards offer (A100 40/80 GB, A30,
/// H100/H200), with and without media extensions.
pub const MIG_PROFILES: [&str; 19] = [
    "1g.5gb", "1g.6gb", "1g.10gb", "1g.12gb", "1g.18gb", "1g.20gb", "1g.24gb", "2g.10gb",
    "2g.12gb", "2g.20gb", "2g.24gb", "2g.35gb", "3g.20gb", "3g.40gb", "4g.20gb", "4g.24gb",
    "4g.40gb", "7g.40gb", "7g.80gb",
];

#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClassCompiler {
    /// GPUClass -> its last compilation (or refusal).
    pub(crate) compiled: BTreeMap<String, GpuClassCompiled>,
    /// GPUClass -> the DeviceClass names its status lists, as observed.
    pub(crate) published: BTreeMap<String, Vec<String>>,
    /// GPUClass -> the refusal its status shows, as observed (empty: none).
    pub(crate) refusal_shown: BTreeMap<String, String>,
    /// Deleted GPUClasses whose DeviceClasses claims still use.
    pub(crate) deleted: std::collections::BTreeSet<String>,
    /// ResourceClaim (namespace, name) -> the DeviceClasses it names.
    pub(crate) claims: BTreeMap<(String, String), Vec<String>>,
    /// DeviceClasses that exist, as observed, with the extended resource
    /// each maps (empty: none).
    pub(crate) device_classes: BTreeMap<String, String>,
    /// The backend, as recorded in the log: which driver classes select.
    pub(crate) backend: Backend,
    /// Retired classes -> their DeviceClasses, until those are gone.
    pub(crate) retired: BTreeMap<String, Vec<String>>,
    /// GPUClass -> its last observation and when it came (the count of
    /// observations so far): what to compile if its generation is not
    /// compiled yet, in the order the classes came.
    pub(crate) observed: BTreeMap<String, (u64, GpuClassObserved)>,
    pub(crate) observations: u64,
}

fn quote(s: &str) -> String {
    format!("{s:?}")
}

/// CEL for one selector key as a device attribute of the profile's driver.
fn attribute(key: &str, profile: &Profile) -> Result<String, String> {
    if !profile.keys.contains(&key) {
        return Err(format!(
            "spec.selector: {} {key:?} is not {}; expected one of {}",
            profile.key_noun,
            profile.what_keys,
            profile.keys.join(", ")
        ));
    }
    let name = key.rsplit('/').next().unwrap_or(key);
    Ok(format!("{}.{name}", profile.attributes()))
}

/// A label selector as CEL over the devices' attributes.
pub fn selector_cel(selector: &LabelSelector, profile: &Profile) -> Result<Vec<String>, String> {
    let attrs = profile.attributes();
    let mut terms = Vec::new();
    for (key, value) in &selector.match_labels {
        let name = key.rsplit('/').next().unwrap_or(key);
        let test = format!("{} == {}", attribute(key, profile)?, quote(value));
        terms.push(profile.guard(name, test));
    }
    for (i, r) in selector.match_expressions.iter().enumerate() {
        let attr = attribute(&r.key, profile)?;
        let name = r.key.rsplit('/').next().unwrap_or(&r.key);
        let list = || {
            format!(
                "[{}]",
                r.values
                    .iter()
                    .map(|v| quote(v))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        let needs_values = matches!(r.operator.as_str(), "In" | "NotIn");
        if needs_values == r.values.is_empty() {
            return Err(format!(
                "spec.selector.matchExpressions[{i}]: operator {} {} values",
                r.operator,
                if needs_values { "needs" } else { "takes no" }
            ));
        }
        terms.push(match r.operator.as_str() {
            "In" => profile.guard(name, format!("{attr} in {}", list())),
            "NotIn" => format!("!({} in {attrs}) || !({attr} in {})", quote(name), list()),
            "Exists" => format!("{} in {attrs}", quote(name)),
            "DoesNotExist" => format!("!({} in {attrs})", quote(name)),
            other => {
                return Err(format!(
                    "spec.selector.matchExpressions[{i}].operator: {other:?}; expected In, NotIn, Exists or DoesNotExist"
                ));
            }
        });
    }
    Ok(terms)
}

/// The variants of a class, or why its spec cannot be compiled.
pub fn compile(
    class: &GpuClassObserved,
    profile: &Profile,
) -> Result<Vec<CompiledVariant>, String> {
    let name = &class.name;
    let selector = selector_cel(&class.selector.clone().unwrap_or_default(), profile)?;
    if profile.driver == nvidia::DRIVER && class.time_slicing_replicas >= 2 {
        return Err(format!(
            "spec.sharing.timeSlicingReplicas: {}: the NVIDIA DRA driver shares a card through the claim's configuration (its GpuConfig sharing), not through a class; expected 0 or 1 on the nvidia-operator backend",
            class.time_slicing_replicas
        ));
    }
    let variant = |variant: String, suffix: &str, terms: &[String]| {
        let mut all = vec![format!("device.driver == {}", quote(profile.driver))];
        all.extend(terms.iter().cloned());
        all.extend(selector.iter().map(|t| format!("({t})")));
        CompiledVariant {
            variant,
            device_class: format!("{name}{suffix}.gpu.deckhouse.io"),
            extended_resource_name: format!("{CLASS_RESOURCE_PREFIX}{name}{suffix}"),
            cel_selector: all.join(" && "),
        }
    };
    let attr = |a: &str| format!("{}.{a}", profile.attributes());
    let mut variants = Vec::new();
    if class.whole.unwrap_or(true) {
        variants.push(variant(
            "whole".into(),
            "",
            &[format!("{} == \"gpu\"", attr("type"))],
        ));
    }
    for (i, profile) in class.mig_profiles.iter().enumerate() {
        if !MIG_PROFILES.contains(&profile.as_str()) {
            return Err(format!(
                "spec.partitions.migProfiles[{i}]: {profile:?} is not a MIG profile of a supported card; expected one of {}",
                MIG_PROFILES.join(", ")
            ));
        }
        variants.push(variant(
            profile.clone(),
            &format!("-mig-{profile}"),
            &[
                format!("{} == \"mig\"", attr("type")),
                format!("{} == {}", attr("profile"), quote(profile)),
            ],
        ));
    }
    if class.legacy_bridge {
        let mut bridge = variant(
            "legacy".into(),
            "-legacy",
            &[format!("{} == \"gpu\"", attr("type"))],
        );
        bridge.extended_resource_name = NVIDIA_GPU.into();
        variants.push(bridge);
    }
    if class.time_slicing_replicas >= 2 {
        variants.push(variant(
            "shared".into(),
            "-shared",
            &[
                format!("{} == \"gpu\"", attr("type")),
                "device.allowMultipleAllocations".into(),
            ],
        ));
    }
    if variants.is_empty() {
        return Err(
            "spec.partitions: the class offers nothing (whole: false, no MIG profiles, no sharing)"
                .into(),
        );
    }
    Ok(variants)
}

/// The namespaces a class is restricted to, sorted, or why one is not a name.
fn namespaces(class: &GpuClassObserved) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for (i, ns) in class.namespaces.iter().enumerate() {
        let valid = !ns.is_empty()
            && ns.len() <= 63
            && ns
                .bytes()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
            && !ns.starts_with('-')
            && !ns.ends_with('-');
        if !valid {
            return Err(format!(
                "spec.namespaces[{i}]: {ns:?} is not a namespace name (lowercase letters, digits and '-', at most 63)"
            ));
        }
        out.push(ns.clone());
    }
    out.sort();
    out.dedup();
    Ok(out)
}

impl ClassCompiler {
    /// Each GPUClass's last compilation (or refusal), by class: the
    /// read-only view the checks read.
    pub fn compiled(&self) -> &BTreeMap<String, GpuClassCompiled> {
        &self.compiled
    }

    /// Folds an event (`_at`: the compiler keeps no time).
    pub fn apply(&mut self, event: &DomainEvent, _at: i64) {
        match &event.kind {
            Some(Kind::GpuClassCompiled(c)) => {
                self.compiled.insert(c.gpu_class.clone(), c.clone());
            }
            Some(Kind::GpuClassObserved(c)) => {
                self.observations += 1;
                self.observed
                    .insert(c.name.clone(), (self.observations, c.clone()));
                self.published
                    .insert(c.name.clone(), c.device_class_names.clone());
                self.refusal_shown
                    .insert(c.name.clone(), c.refused_condition.clone());
                // Created again before it was retired: not deleted after all.
                self.deleted.remove(&c.name);
            }
            Some(Kind::GpuClassRemoved(c)) => {
                self.observed.remove(&c.name);
                if self.compiled.contains_key(&c.name) {
                    self.deleted.insert(c.name.clone());
                }
            }
            Some(Kind::GpuClassRetired(r)) => {
                self.deleted.remove(&r.gpu_class);
                self.compiled.remove(&r.gpu_class);
                self.published.remove(&r.gpu_class);
                self.refusal_shown.remove(&r.gpu_class);
                self.retired
                    .insert(r.gpu_class.clone(), r.device_classes.clone());
            }
            Some(Kind::ResourceClaimObserved(c)) => {
                self.claims.insert(
                    (c.namespace.clone(), c.name.clone()),
                    c.device_classes.clone(),
                );
            }
            Some(Kind::ResourceClaimRemoved(c)) => {
                self.claims.remove(&(c.namespace.clone(), c.name.clone()));
            }
            Some(Kind::DeviceClassObserved(d)) => {
                self.device_classes
                    .insert(d.name.clone(), d.extended_resource_name.clone());
            }
            Some(Kind::BackendConfigured(b)) => self.backend = Backend::from_event(b),
            Some(Kind::DeviceClassRemoved(d)) => {
                self.device_classes.remove(&d.name);
                let gone = |classes: &Vec<String>| {
                    !classes.iter().any(|c| self.device_classes.contains_key(c))
                };
                let done: Vec<String> = self
                    .retired
                    .iter()
                    .filter(|(_, classes)| gone(classes))
                    .map(|(name, _)| name.clone())
                    .collect();
                for name in done {
                    self.retired.remove(&name);
                }
            }
            _ => {}
        }
    }

    /// Deleted classes whose DeviceClasses no claim names any more.
    fn retirements(&self) -> Vec<DomainEvent> {
        self.deleted
            .iter()
            .filter_map(|name| {
                let classes: Vec<String> = self
                    .compiled
                    .get(name)?
                    .variants
                    .iter()
                    .map(|v| v.device_class.clone())
                    .collect();
                let in_use = self
                    .claims
                    .values()
                    .any(|used| used.iter().any(|c| classes.contains(c)));
                (!in_use).then(|| DomainEvent {
                    kind: Some(Kind::GpuClassRetired(GpuClassRetired {
                        gpu_class: name.clone(),
                        device_classes: classes,
                    })),
                })
            })
            .collect()
    }

    /// Compiles a class when it is first seen and whenever its spec changes;
    /// retires a deleted class once no claim uses its DeviceClasses.
    pub fn handle(&mut self, event: &DomainEvent, now: i64) -> Vec<DomainEvent> {
        self.apply(event, now);
        match &event.kind {
            Some(
                Kind::GpuClassRemoved(_)
                | Kind::ResourceClaimObserved(_)
                | Kind::ResourceClaimRemoved(_),
            ) => {
                let decisions = self.retirements();
                for d in &decisions {
                    self.apply(d, now);
                }
                decisions
            }
            Some(Kind::GpuClassObserved(class)) => {
                self.compile_due(&class.name, now).into_iter().collect()
            }
            // Another driver: every class compiles again for it.
            Some(Kind::BackendConfigured(_)) => self.catch_up(now),
            _ => Vec::new(),
        }
    }

    /// After a rebuild from the log: the compilations and retirements due but
    /// not recorded (classes observed before this service started, or
    /// decisions a crash kept from being recorded), folded. Classes compile in
    /// the order they came, as they would have live.
    pub fn catch_up(&mut self, now: i64) -> Vec<DomainEvent> {
        let mut due: Vec<(u64, String)> = self
            .observed
            .iter()
            .map(|(name, (at, _))| (*at, name.clone()))
            .collect();
        due.sort();
        let mut decisions: Vec<DomainEvent> = due
            .into_iter()
            .filter_map(|(_, name)| self.compile_due(&name, now))
            .collect();
        let retirements = self.retirements();
        for d in &retirements {
            self.apply(d, now);
        }
        decisions.extend(retirements);
        decisions
    }

    /// The compilation of `name`'s last observed spec, folded, unless that
    /// generation is compiled already.
    fn compile_due(&mut self, name: &str, now: i64) -> Option<DomainEvent> {
        let (_, class) = self.observed.get(name)?;
        let previous = self.compiled.get(name);
        let profile = Profile::of(&self.backend);
        let driver = if profile.driver == GPU_DRIVER {
            ""
        } else {
            profile.driver
        };
        if previous.is_some_and(|p| p.generation == class.generation && p.driver == driver) {
            return None;
        }
        let compiled = match compile(class, &profile)
            .and_then(|v| self.clash(&class.name, v))
            .and_then(|v| Ok((v, namespaces(class)?)))
        {
            Ok((variants, namespaces)) => GpuClassCompiled {
                gpu_class: class.name.clone(),
                variants,
                refused: String::new(),
                generation: class.generation,
                namespaces,
                driver: driver.into(),
            },
            Err(reason) => GpuClassCompiled {
                gpu_class: class.name.clone(),
                variants: previous.map(|p| p.variants.clone()).unwrap_or_default(),
                refused: reason,
                generation: class.generation,
                namespaces: previous.map(|p| p.namespaces.clone()).unwrap_or_default(),
                driver: driver.into(),
            },
        };
        let decision = DomainEvent {
            kind: Some(Kind::GpuClassCompiled(compiled)),
        };
        self.apply(&decision, now);
        Some(decision)
    }

    /// Refuses variants whose DeviceClass or extended resource another class
    /// already publishes (the legacy bridge's `nvidia.com/gpu` included).
    fn clash(
        &self,
        class: &str,
        variants: Vec<CompiledVariant>,
    ) -> Result<Vec<CompiledVariant>, String> {
        // A class that is not ours mapping nvidia.com/gpu: on v1 the NVIDIA
        // driver's own `gpu.nvidia.com` does (F14).
        let ours = |device_class: &str| {
            self.compiled
                .values()
                .any(|c| c.variants.iter().any(|v| v.device_class == device_class))
        };
        if let Some(v) = variants.iter().find(|v| v.variant == "legacy")
            && let Some((other, _)) = self
                .device_classes
                .iter()
                .find(|(name, mapped)| **mapped == v.extended_resource_name && !ours(name))
        {
            return Err(format!(
                "spec.legacyBridge: DeviceClass {other} already maps {NVIDIA_GPU} (the NVIDIA DRA driver's class does on resource.k8s.io/v1); at most one class may, and with two the scheduler takes the one created last"
            ));
        }
        for v in &variants {
            for (other, compiled) in self.compiled.iter().filter(|(name, _)| *name != class) {
                for theirs in &compiled.variants {
                    if theirs.extended_resource_name == v.extended_resource_name {
                        return Err(if v.variant == "legacy" {
                            format!(
                                "spec.legacyBridge: class {other} already bridges {}; at most one class may",
                                v.extended_resource_name
                            )
                        } else {
                            format!(
                                "variant {}: extended resource {} is already published by class {other}",
                                v.variant, v.extended_resource_name
                            )
                        });
                    }
                    if theirs.device_class == v.device_class {
                        return Err(format!(
                            "variant {}: DeviceClass {} is already published by class {other}",
                            v.variant, v.device_class
                        ));
                    }
                }
            }
        }
        Ok(variants)
    }

    /// DeviceClasses and class status not yet as compiled; the DeviceClasses
    /// of retired classes that still exist.
    pub fn effects(&self) -> Vec<Effect> {
        let retire = self
            .retired
            .iter()
            .filter(|(_, classes)| classes.iter().any(|c| self.device_classes.contains_key(c)))
            .map(|(name, classes)| Effect::RetireDeviceClasses {
                gpu_class: name.clone(),
                device_classes: classes.clone(),
            });
        self.compiled
            .iter()
            .filter(|(class, _)| !self.deleted.contains(*class))
            .filter(|(class, compiled)| {
                let names: Vec<&str> = compiled
                    .variants
                    .iter()
                    .map(|v| v.device_class.as_str())
                    .collect();
                self.refusal_shown.get(*class).map_or("", String::as_str) != compiled.refused
                    || self
                        .published
                        .get(*class)
                        .map(|d| d.iter().map(String::as_str).collect::<Vec<_>>())
                        != Some(names)
            })
            .map(|(class, compiled)| Effect::PublishDeviceClasses {
                gpu_class: class.clone(),
                variants: compiled.variants.clone(),
                refused: (!compiled.refused.is_empty()).then(|| compiled.refused.clone()),
                namespaces: compiled.namespaces.clone(),
            })
            .chain(retire)
            .collect()
    }
}
