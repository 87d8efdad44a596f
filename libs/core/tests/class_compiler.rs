//! GPU classes into DeviceClasses: the variants and their names, the CEL each
//! carries — compiled and evaluated by the DRA engine against devices shaped
//! like the driver's — refusals that name the field, and recompilation.

use std::collections::BTreeMap;

use switchyard_core::class_compiler::{ClassCompiler, Profile, compile};
use switchyard_core::effects::Effect;
use switchyard_dra::Quantity;
use switchyard_dra::cel::{Attribute, Compiler, Device};
use switchyard_proto::v1::{
    DomainEvent, GpuClassObserved, LabelSelector, LabelSelectorRequirement, domain_event::Kind,
};

fn class(name: &str, device: &str) -> GpuClassObserved {
    GpuClassObserved {
        name: name.into(),
        selector: Some(LabelSelector {
            match_labels: [("gpu.deckhouse.io/device".to_string(), device.to_string())].into(),
            match_expressions: Vec::new(),
        }),
        generation: 1,
        ..GpuClassObserved::default()
    }
}

fn card(device: &str, kind: &str, profile: Option<&str>, shareable: bool) -> Device {
    let mut attributes = BTreeMap::from([
        ("device".to_string(), Attribute::String(device.into())),
        ("type".to_string(), Attribute::String(kind.into())),
        (
            "architecture".to_string(),
            Attribute::String("Ampere".into()),
        ),
    ]);
    if let Some(p) = profile {
        attributes.insert("profile".into(), Attribute::String(p.into()));
    }
    Device {
        driver: "gpu.deckhouse.io".into(),
        allow_multiple_allocations: shareable,
        attributes,
        capacity: BTreeMap::from([("memory".to_string(), Quantity::parse("40Gi").unwrap())]),
    }
}

/// The variants of `class` whose selector picks `device`.
fn picks(variants: &[switchyard_proto::v1::CompiledVariant], device: &Device) -> Vec<String> {
    let cel = Compiler::default();
    variants
        .iter()
        .filter(|v| {
            cel.eval(&v.cel_selector, device)
                .unwrap_or_else(|e| panic!("{}: {e}", v.cel_selector))
        })
        .map(|v| v.variant.clone())
        .collect()
}

#[test]
fn a_class_compiles_into_named_variants_whose_selectors_pick_the_right_devices() {
    let mut a100 = class("a100", "a100-sxm4-40gb");
    a100.mig_profiles = vec!["1g.5gb".into(), "3g.20gb".into()];
    a100.time_slicing_replicas = 4;
    let variants = compile(&a100, &Profile::DECKHOUSE).unwrap();
    let names: Vec<(&str, &str, &str)> = variants
        .iter()
        .map(|v| {
            (
                v.variant.as_str(),
                v.device_class.as_str(),
                v.extended_resource_name.as_str(),
            )
        })
        .collect();
    assert_eq!(
        names,
        [
            ("whole", "a100.gpu.deckhouse.io", "gpu.deckhouse.io/a100"),
            (
                "1g.5gb",
                "a100-mig-1g.5gb.gpu.deckhouse.io",
                "gpu.deckhouse.io/a100-mig-1g.5gb"
            ),
            (
                "3g.20gb",
                "a100-mig-3g.20gb.gpu.deckhouse.io",
                "gpu.deckhouse.io/a100-mig-3g.20gb"
            ),
            (
                "shared",
                "a100-shared.gpu.deckhouse.io",
                "gpu.deckhouse.io/a100-shared"
            ),
        ]
    );
    assert_eq!(
        picks(&variants, &card("a100-sxm4-40gb", "gpu", None, false)),
        ["whole"]
    );
    assert_eq!(
        picks(
            &variants,
            &card("a100-sxm4-40gb", "mig", Some("1g.5gb"), false)
        ),
        ["1g.5gb"]
    );
    assert_eq!(
        picks(&variants, &card("a100-sxm4-40gb", "gpu", None, true)),
        ["whole", "shared"]
    );
    assert!(picks(&variants, &card("h100-sxm5-80gb", "gpu", None, false)).is_empty());
    assert!(
        picks(
            &variants,
            &card("a100-sxm4-40gb", "mig", Some("2g.10gb"), false)
        )
        .is_empty()
    );
    // The same class always compiles to the same bytes.
    assert_eq!(compile(&a100, &Profile::DECKHOUSE).unwrap(), variants);
}

#[test]
fn match_expressions_become_cel() {
    let mut c = class("ampere", "unused");
    c.selector = Some(LabelSelector {
        match_labels: BTreeMap::new(),
        match_expressions: vec![
            LabelSelectorRequirement {
                key: "gpu.deckhouse.io/device".into(),
                operator: "In".into(),
                values: vec!["a100-sxm4-40gb".into(), "a100-sxm4-80gb".into()],
            },
            LabelSelectorRequirement {
                key: "gpu.deckhouse.io/architecture".into(),
                operator: "Exists".into(),
                values: Vec::new(),
            },
            LabelSelectorRequirement {
                key: "gpu.deckhouse.io/product".into(),
                operator: "NotIn".into(),
                values: vec!["NVIDIA A100-PCIE-40GB".into()],
            },
        ],
    });
    let variants = compile(&c, &Profile::DECKHOUSE).unwrap();
    assert_eq!(
        picks(&variants, &card("a100-sxm4-40gb", "gpu", None, false)),
        ["whole"]
    );
    assert!(picks(&variants, &card("h100-sxm5-80gb", "gpu", None, false)).is_empty());
    let mut no_arch = card("a100-sxm4-40gb", "gpu", None, false);
    no_arch.attributes.remove("architecture");
    assert!(
        picks(&variants, &no_arch).is_empty(),
        "Exists needs the attribute"
    );
}

#[test]
fn bad_classes_are_refused_naming_the_field() {
    let mut unknown_key = class("x", "a100-sxm4-40gb");
    unknown_key
        .selector
        .as_mut()
        .unwrap()
        .match_labels
        .insert("gpu.deckhouse.io/vendor".into(), "nvidia".into());
    assert!(
        compile(&unknown_key, &Profile::DECKHOUSE)
            .unwrap_err()
            .contains("label \"gpu.deckhouse.io/vendor\"")
    );
    let mut bad_profile = class("x", "a100-sxm4-40gb");
    bad_profile.mig_profiles = vec!["1g.5gb".into(), "9g.99gb".into()];
    assert!(
        compile(&bad_profile, &Profile::DECKHOUSE)
            .unwrap_err()
            .starts_with("spec.partitions.migProfiles[1]: \"9g.99gb\"")
    );
    let mut nothing = class("x", "a100-sxm4-40gb");
    nothing.whole = Some(false);
    assert!(
        compile(&nothing, &Profile::DECKHOUSE)
            .unwrap_err()
            .contains("offers nothing")
    );
    let mut no_values = class("x", "a100-sxm4-40gb");
    no_values.selector.as_mut().unwrap().match_expressions = vec![LabelSelectorRequirement {
        key: "gpu.deckhouse.io/device".into(),
        operator: "In".into(),
        values: Vec::new(),
    }];
    assert!(
        compile(&no_values, &Profile::DECKHOUSE)
            .unwrap_err()
            .starts_with("spec.selector.matchExpressions[0]: operator In needs values")
    );
}

fn observed(c: &GpuClassObserved) -> DomainEvent {
    DomainEvent {
        kind: Some(Kind::GpuClassObserved(c.clone())),
    }
}

#[test]
fn a_changed_spec_is_compiled_again_and_a_refusal_keeps_the_device_classes() {
    let mut core = ClassCompiler::default();
    let mut a100 = class("a100", "a100-sxm4-40gb");
    let first = core.handle(&observed(&a100), 0);
    assert_eq!(first.len(), 1);
    assert!(
        core.handle(&observed(&a100), 0).is_empty(),
        "same generation: nothing"
    );
    // Published: no effect left.
    a100.device_class_names = vec!["a100.gpu.deckhouse.io".into()];
    core.handle(&observed(&a100), 0);
    assert!(core.effects().is_empty());

    // A bad new generation: refused, the DeviceClasses stay, the status says why.
    a100.generation = 2;
    a100.mig_profiles = vec!["9g.99gb".into()];
    let refused = core.handle(&observed(&a100), 0);
    let Some(Kind::GpuClassCompiled(c)) = &refused[0].kind else {
        panic!("{refused:?}")
    };
    assert!(c.refused.contains("9g.99gb"));
    assert_eq!(c.variants.len(), 1, "the previous variants are kept");
    let effects = core.effects();
    assert!(
        matches!(&effects[..], [Effect::PublishDeviceClasses { refused: Some(why), .. }] if why == &c.refused),
        "{effects:?}"
    );
    // Once the status shows the refusal, nothing more to do.
    a100.refused_condition = c.refused.clone();
    core.handle(&observed(&a100), 0);
    assert!(core.effects().is_empty());

    // Fixed: compiled again with the MIG variant.
    a100.generation = 3;
    a100.mig_profiles = vec!["1g.5gb".into()];
    core.handle(&observed(&a100), 0);
    let Some(compiled) = core.compiled().get("a100") else {
        panic!()
    };
    assert!(compiled.refused.is_empty());
    assert_eq!(compiled.variants.len(), 2);
}

#[test]
fn one_legacy_bridge_and_no_clashing_names() {
    let mut core = ClassCompiler::default();
    let mut a100 = class("a100", "a100-sxm4-40gb");
    a100.legacy_bridge = true;
    a100.time_slicing_replicas = 2;
    core.handle(&observed(&a100), 0);
    let bridge = core.compiled()["a100"]
        .variants
        .iter()
        .find(|v| v.variant == "legacy")
        .expect("a bridge")
        .clone();
    assert_eq!(bridge.extended_resource_name, "nvidia.com/gpu");
    assert_eq!(bridge.device_class, "a100-legacy.gpu.deckhouse.io");
    assert_eq!(
        picks(&[bridge], &card("a100-sxm4-40gb", "gpu", None, false)),
        ["legacy"]
    );

    // A second bridge is refused, naming the class that has it.
    let mut h100 = class("h100", "h100-sxm5-80gb");
    h100.legacy_bridge = true;
    core.handle(&observed(&h100), 0);
    assert_eq!(
        core.compiled()["h100"].refused,
        "spec.legacyBridge: class a100 already bridges nvidia.com/gpu; at most one class may"
    );
    assert!(core.compiled()["h100"].variants.is_empty());

    // A class named like another class's share clashes with it.
    let shared = class("a100-shared", "a100-sxm4-40gb");
    core.handle(&observed(&shared), 0);
    assert!(
        core.compiled()["a100-shared"].refused.contains(
            "extended resource gpu.deckhouse.io/a100-shared is already published by class a100"
        ),
        "{}",
        core.compiled()["a100-shared"].refused
    );
}

#[test]
fn a_namespace_restriction_is_compiled_and_bad_names_refused() {
    let mut core = ClassCompiler::default();
    let mut a100 = class("a100", "a100-sxm4-40gb");
    a100.namespaces = vec!["team-b".into(), "team-a".into(), "team-b".into()];
    core.handle(&observed(&a100), 0);
    assert_eq!(core.compiled()["a100"].namespaces, ["team-a", "team-b"]);
    let effects = core.effects();
    assert!(
        matches!(&effects[..], [Effect::PublishDeviceClasses { namespaces, .. }] if namespaces == &["team-a", "team-b"]),
        "{effects:?}"
    );
    a100.generation = 2;
    a100.namespaces = vec!["Team_A".into()];
    core.handle(&observed(&a100), 0);
    assert!(
        core.compiled()["a100"]
            .refused
            .starts_with("spec.namespaces[0]: \"Team_A\" is not a namespace name"),
        "{}",
        core.compiled()["a100"].refused
    );
    assert_eq!(
        core.compiled()["a100"].namespaces,
        ["team-a", "team-b"],
        "the last good restriction stays"
    );
}

#[test]
fn a_deleted_class_keeps_its_device_classes_while_a_claim_uses_them() {
    use switchyard_proto::v1::{
        DeviceClassObserved, DeviceClassRemoved, GpuClassRemoved, ResourceClaimObserved,
        ResourceClaimRemoved,
    };
    let ev = |kind| DomainEvent { kind: Some(kind) };
    let mut core = ClassCompiler::default();
    let mut a100 = class("a100", "a100-sxm4-40gb");
    core.handle(&observed(&a100), 0);
    a100.device_class_names = vec!["a100.gpu.deckhouse.io".into()];
    core.handle(&observed(&a100), 0);
    core.handle(
        &ev(Kind::DeviceClassObserved(DeviceClassObserved {
            name: "a100.gpu.deckhouse.io".into(),
            selectors: Vec::new(),
            extended_resource_name: "gpu.deckhouse.io/a100".into(),
        })),
        0,
    );
    let claim = ResourceClaimObserved {
        namespace: "ml".into(),
        name: "train-gpu".into(),
        device_classes: vec!["a100.gpu.deckhouse.io".into()],
        node: String::new(),
        ..Default::default()
    };
    core.handle(&ev(Kind::ResourceClaimObserved(claim.clone())), 0);

    // Deleted while a claim names its DeviceClass: nothing goes yet.
    let removed = core.handle(
        &ev(Kind::GpuClassRemoved(GpuClassRemoved {
            name: "a100".into(),
        })),
        0,
    );
    assert!(removed.is_empty(), "{removed:?}");
    assert!(core.effects().is_empty(), "{:?}", core.effects());

    // The claim goes: the class is retired, its DeviceClass deleted.
    let retired = core.handle(
        &ev(Kind::ResourceClaimRemoved(ResourceClaimRemoved {
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
        })),
        0,
    );
    assert!(
        matches!(&retired[..], [d] if matches!(&d.kind, Some(Kind::GpuClassRetired(r)) if r.device_classes == ["a100.gpu.deckhouse.io"])),
        "{retired:?}"
    );
    assert_eq!(
        core.effects(),
        [Effect::RetireDeviceClasses {
            gpu_class: "a100".into(),
            device_classes: vec!["a100.gpu.deckhouse.io".into()],
        }]
    );
    core.handle(
        &ev(Kind::DeviceClassRemoved(DeviceClassRemoved {
            name: "a100.gpu.deckhouse.io".into(),
        })),
        0,
    );
    assert!(core.effects().is_empty());
    assert!(!core.compiled().contains_key("a100"));
}

// ---------------------------------------------------------------- nvidia-operator

fn nvidia_backend() -> switchyard_proto::v1::BackendConfigured {
    use switchyard_core::backend::Backend;
    Backend::NvidiaOperator(Box::default()).to_event()
}

/// A device as the NVIDIA DRA driver's kubelet plugin publishes it (a whole
/// H100, or one of its MIG partitions), with or without `productName`.
fn nvidia_device(kind: &str, profile: Option<&str>, product: Option<&str>) -> Device {
    let mut attributes = BTreeMap::from([
        ("type".to_string(), Attribute::String(kind.into())),
        (
            "architecture".to_string(),
            Attribute::String("Hopper".into()),
        ),
        ("brand".to_string(), Attribute::String("Nvidia".into())),
        ("uuid".to_string(), Attribute::String("GPU-0".into())),
    ]);
    if let Some(p) = product {
        attributes.insert("productName".into(), Attribute::String(p.into()));
    }
    if let Some(p) = profile {
        attributes.insert("profile".into(), Attribute::String(p.into()));
    }
    Device {
        driver: "gpu.nvidia.com".into(),
        allow_multiple_allocations: false,
        attributes,
        capacity: BTreeMap::from([("memory".to_string(), Quantity::parse("80Gi").unwrap())]),
    }
}

fn h100_class() -> GpuClassObserved {
    GpuClassObserved {
        name: "h100".into(),
        selector: Some(LabelSelector {
            match_labels: [(
                "gpu.nvidia.com/productName".to_string(),
                "NVIDIA H100 80GB HBM3".to_string(),
            )]
            .into(),
            match_expressions: vec![LabelSelectorRequirement {
                key: "gpu.nvidia.com/architecture".into(),
                operator: "In".into(),
                values: vec!["Hopper".into()],
            }],
        }),
        mig_profiles: vec!["1g.10gb".into()],
        generation: 1,
        ..GpuClassObserved::default()
    }
}

#[test]
fn on_the_nvidia_backend_a_class_selects_the_nvidia_drivers_devices_with_every_attribute_guarded() {
    let variants = compile(&h100_class(), &Profile::NVIDIA).unwrap();
    assert_eq!(
        variants[0].cel_selector,
        "device.driver == \"gpu.nvidia.com\" && device.attributes[\"gpu.nvidia.com\"].type == \"gpu\" && (\"productName\" in device.attributes[\"gpu.nvidia.com\"] && device.attributes[\"gpu.nvidia.com\"].productName == \"NVIDIA H100 80GB HBM3\") && (\"architecture\" in device.attributes[\"gpu.nvidia.com\"] && device.attributes[\"gpu.nvidia.com\"].architecture in [\"Hopper\"])"
    );
    let product = Some("NVIDIA H100 80GB HBM3");
    assert_eq!(
        picks(&variants, &nvidia_device("gpu", None, product)),
        ["whole"]
    );
    assert_eq!(
        picks(&variants, &nvidia_device("mig", Some("1g.10gb"), product)),
        ["1g.10gb"]
    );
    assert!(
        picks(
            &variants,
            &nvidia_device("gpu", None, Some("NVIDIA A100-SXM4-80GB"))
        )
        .is_empty()
    );
    // A device without the attribute does not match: the guard keeps the
    // expression from failing (which would abort the allocation attempt).
    assert!(picks(&variants, &nvidia_device("gpu", None, None)).is_empty());
    // Deckhouse's devices are not the NVIDIA driver's.
    assert!(picks(&variants, &card("a100-sxm4-40gb", "gpu", None, false)).is_empty());
}

#[test]
fn on_the_nvidia_backend_bad_classes_are_refused_naming_the_field() {
    let mut physical_gpu_label = h100_class();
    physical_gpu_label.selector = Some(LabelSelector {
        match_labels: [("gpu.deckhouse.io/device".to_string(), "h100".to_string())].into(),
        match_expressions: Vec::new(),
    });
    assert_eq!(
        compile(&physical_gpu_label, &Profile::NVIDIA).unwrap_err(),
        "spec.selector: attribute \"gpu.deckhouse.io/device\" is not an attribute the NVIDIA DRA driver publishes; expected one of gpu.nvidia.com/productName, gpu.nvidia.com/architecture, gpu.nvidia.com/brand"
    );
    let mut shared = h100_class();
    shared.time_slicing_replicas = 4;
    assert!(
        compile(&shared, &Profile::NVIDIA)
            .unwrap_err()
            .starts_with("spec.sharing.timeSlicingReplicas: 4: the NVIDIA DRA driver shares a card through the claim's configuration")
    );
}

#[test]
fn the_bridge_is_refused_while_the_nvidia_drivers_own_class_maps_nvidia_com_gpu() {
    use switchyard_proto::v1::DeviceClassObserved;
    let ev = |kind| DomainEvent { kind: Some(kind) };
    let mut core = ClassCompiler::default();
    core.handle(&ev(Kind::BackendConfigured(nvidia_backend())), 0);
    // The driver's classes as its chart renders them on resource.k8s.io/v1.
    for (name, mapped) in [("gpu.nvidia.com", "nvidia.com/gpu"), ("mig.nvidia.com", "")] {
        core.handle(
            &ev(Kind::DeviceClassObserved(DeviceClassObserved {
                name: name.into(),
                selectors: Vec::new(),
                extended_resource_name: mapped.into(),
            })),
            0,
        );
    }
    let mut bridge = h100_class();
    bridge.legacy_bridge = true;
    let decided = core.handle(&observed(&bridge), 0);
    let Some(Kind::GpuClassCompiled(c)) = &decided[0].kind else {
        panic!("{decided:?}")
    };
    assert_eq!(
        c.refused,
        "spec.legacyBridge: DeviceClass gpu.nvidia.com already maps nvidia.com/gpu (the NVIDIA DRA driver's class does on resource.k8s.io/v1); at most one class may, and with two the scheduler takes the one created last"
    );
    assert_eq!(c.driver, "gpu.nvidia.com");
    // Without the bridge the class compiles; the driver's classes are
    // never among what it publishes.
    let mut plain = h100_class();
    plain.generation = 2;
    let decided = core.handle(&observed(&plain), 0);
    let Some(Kind::GpuClassCompiled(c)) = &decided[0].kind else {
        panic!("{decided:?}")
    };
    assert!(c.refused.is_empty(), "{}", c.refused);
    assert!(
        c.variants
            .iter()
            .all(|v| !v.device_class.ends_with("nvidia.com"))
    );
}

#[test]
fn a_class_compiled_before_the_backend_was_recorded_compiles_again_for_the_nvidia_driver() {
    let ev = |kind| DomainEvent { kind: Some(kind) };
    let mut core = ClassCompiler::default();
    let mut c = h100_class();
    c.selector = None;
    let first = core.handle(&observed(&c), 0);
    let Some(Kind::GpuClassCompiled(first)) = &first[0].kind else {
        panic!()
    };
    assert!(first.variants[0].cel_selector.contains("gpu.deckhouse.io"));
    let again = core.handle(&ev(Kind::BackendConfigured(nvidia_backend())), 0);
    let Some(Kind::GpuClassCompiled(again)) = &again[0].kind else {
        panic!("{again:?}")
    };
    assert_eq!(
        (again.generation, again.driver.as_str()),
        (1, "gpu.nvidia.com")
    );
    assert!(
        again.variants[0]
            .cel_selector
            .starts_with("device.driver == \"gpu.nvidia.com\"")
    );
    // Recorded once: the same backend again changes nothing.
    assert!(
        core.handle(&ev(Kind::BackendConfigured(nvidia_backend())), 0)
            .is_empty()
    );
}
