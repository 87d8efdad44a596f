//! Completion: quotas translated with the same values, leftover labels
//! cleared, and the source group kept until the trial period is over.

mod support;

use std::collections::BTreeMap;

use support::*;
use switchyard_core::claim_allocator::completion::Completion;
use switchyard_core::cluster::Cluster;
use switchyard_core::command::Complete;
use switchyard_core::effects::Effect;
use switchyard_proto::v1::{DomainEvent, domain_event::Kind};

fn names(decisions: &[DomainEvent]) -> Vec<&'static str> {
    decisions
        .iter()
        .map(|d| d.kind.as_ref().unwrap().type_name())
        .collect()
}

fn cluster(extra: Vec<DomainEvent>) -> Cluster {
    let mut cluster = Cluster::default();
    let base = vec![
        mk_group("gpu", true),
        mk_group("gpu-dra", false),
        mk_class("a100"),
        mk_quota(
            "team-a",
            "gpus",
            &[("requests.nvidia.com/gpu", "8"), ("pods", "20")],
        ),
        mk_quota("team-b", "cpu", &[("requests.cpu", "10")]),
        NodeSpec {
            labels: &[
                ("node.deckhouse.io/device-gpu.config", "x"),
                ("nvidia.com/gpu.product", "A100"),
                ("zone", "a"),
            ],
            ..NodeSpec::new("d1", "gpu-dra")
        }
        .fact(),
        mk_workload(
            "apps",
            "web",
            1,
            mk_placement(&[("gpu.deckhouse.io/a100", "1")], &[]),
        ),
    ];
    for fact in base.into_iter().chain(extra) {
        cluster.apply(&fact);
    }
    cluster
}

fn complete(trial_period_over: bool) -> Complete {
    Complete {
        source_group: "gpu".into(),
        gpu_class: "a100".into(),
        trial_period_over,
    }
}

fn reason(decisions: &[DomainEvent]) -> String {
    match &decisions[0].kind {
        Some(Kind::CompletionRefused(r)) => r.reason.clone(),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn completion_waits_for_the_last_node_and_the_last_application() {
    let with_node = cluster(vec![mk_node("w9", Some("gpu"))]);
    let r = reason(&Completion::default().complete(&with_node, &complete(true)));
    assert!(
        r.contains("hand over the remaining nodes") && r.contains("w9"),
        "{r}"
    );
    let with_app = cluster(vec![mk_workload(
        "apps",
        "train",
        2,
        mk_placement(&[("nvidia.com/gpu", "4")], &[]),
    )]);
    let r = reason(&Completion::default().complete(&with_app, &complete(true)));
    assert!(
        r.contains("move the remaining applications") && r.contains("Deployment apps/train"),
        "{r}"
    );
}

#[test]
fn quotas_keep_their_values_and_leftover_labels_are_cleared() {
    let cluster = cluster(vec![]);
    let mut completion = Completion::default();
    let decisions = completion.complete(&cluster, &complete(false));
    assert_eq!(
        names(&decisions),
        [
            "ResourceQuotaTranslated",
            "LeftoverLabelsCleared",
            "CompletionRefused"
        ]
    );
    let Some(Kind::ResourceQuotaTranslated(q)) = &decisions[0].kind else {
        unreachable!()
    };
    let expected: BTreeMap<String, String> = [
        ("requests.gpu.deckhouse.io/a100", "8"),
        ("a100-whole.deviceclass.resource.k8s.io/devices", "8"),
        ("pods", "20"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert_eq!((q.namespace.as_str(), &q.hard_after), ("team-a", &expected));
    assert_eq!(
        q.hard_before["requests.nvidia.com/gpu"], "8",
        "before-image kept"
    );
    let Some(Kind::LeftoverLabelsCleared(l)) = &decisions[1].kind else {
        unreachable!()
    };
    assert_eq!(
        l.removed.keys().collect::<Vec<_>>(),
        [
            "node.deckhouse.io/device-gpu.config",
            "nvidia.com/gpu.product"
        ]
    );
    let r = reason(&decisions[2..]);
    assert!(
        r.contains("keeps its spec.gpu") && r.contains("rollback needs Device Plugin nodes"),
        "{r}"
    );

    for d in &decisions {
        completion.apply(d);
    }
    let effects = completion.effects(&cluster);
    assert!(effects.contains(&Effect::SetQuota {
        namespace: "team-a".into(),
        name: "gpus".into(),
        hard: expected
    }));
    assert!(effects.contains(&Effect::RemoveNodeLabels {
        node: "d1".into(),
        labels: vec![
            "node.deckhouse.io/device-gpu.config".into(),
            "nvidia.com/gpu.product".into()
        ],
        group: "gpu-dra".into(),
    }));
    assert!(
        !effects
            .iter()
            .any(|e| matches!(e, Effect::RemoveSpecGpu { .. }))
    );
}

#[test]
fn after_the_trial_period_the_source_group_loses_spec_gpu() {
    let mut cluster = cluster(vec![]);
    let mut completion = Completion::default();
    let decisions = completion.complete(&cluster, &complete(true));
    let Some(Kind::SourceGroupRetired(r)) = &decisions.last().unwrap().kind else {
        panic!("{decisions:?}")
    };
    assert!(r.gpu_before.is_some() && !r.deleted);
    for d in &decisions {
        completion.apply(d);
    }
    assert!(
        completion
            .effects(&cluster)
            .contains(&Effect::RemoveSpecGpu {
                group: "gpu".into()
            })
    );
    cluster.apply(&mk_group("gpu", false));
    assert!(
        !completion
            .effects(&cluster)
            .contains(&Effect::RemoveSpecGpu {
                group: "gpu".into()
            })
    );
}

mod nvidia_operator {
    //! On the nvidia-operator backend: from the legacy pool, the quotas and
    //! the guide's final cutover; from a DRA pool, an abandoned migration
    //! checked clear before the DRA driver is uninstalled.

    use super::*;
    use switchyard_proto::v1::{AllocatedDevice, ResourceClaimObserved};

    const POOL: &str = "gpu-scheduling.platform.example.com/pool";

    fn backend() -> DomainEvent {
        ev(Kind::BackendConfigured(guide_backend().to_event()))
    }

    /// A GPU node of `pool` (none: "") as GPU Feature Discovery and the
    /// guide label it, `allocatable` nvidia.com/gpu from the device plugin.
    fn gfd_node(name: &str, pool: &str, dra: bool, allocatable: u32) -> DomainEvent {
        let mut labels = vec![(
            "nvidia.com/gpu.deploy.device-plugin",
            if dra { "false" } else { "true" },
        )];
        if dra {
            labels.push(("nvidia.com/dra-kubelet-plugin", "true"));
        }
        if !pool.is_empty() {
            labels.push((POOL, pool));
        }
        mk_gfd_node(name, &labels, allocatable)
    }

    fn claim(name: &str, node: &str) -> DomainEvent {
        ev(Kind::ResourceClaimObserved(ResourceClaimObserved {
            namespace: "apps".into(),
            name: name.into(),
            device_classes: vec!["gpu.nvidia.com".into()],
            node: node.into(),
            allocated: vec![AllocatedDevice {
                request: "gpu".into(),
                driver: "gpu.nvidia.com".into(),
                pool: node.into(),
                device: "gpu-0".into(),
            }],
            ..Default::default()
        }))
    }

    fn on_nvidia(facts: Vec<DomainEvent>) -> Cluster {
        let mut cluster = Cluster::default();
        let base = vec![
            backend(),
            mk_class("h100"),
            mk_quota("team-a", "gpus", &[("requests.nvidia.com/gpu", "4")]),
        ];
        for fact in base.into_iter().chain(facts) {
            cluster.apply(&fact);
        }
        cluster
    }

    fn from(pool: &str, class: &str, trial_period_over: bool) -> Complete {
        Complete {
            source_group: pool.into(),
            gpu_class: class.into(),
            trial_period_over,
        }
    }

    #[test]
    fn the_legacy_pool_completes_without_touching_the_operators_labels() {
        let cluster = on_nvidia(vec![
            gfd_node("gpu-1", "dra-pilot", true, 0),
            mk_h100_slice("gpu-1"),
        ]);
        let decisions = Completion::default().complete(&cluster, &from("legacy", "h100", false));
        assert_eq!(
            names(&decisions),
            ["ResourceQuotaTranslated", "CompletionRefused"],
            "no LeftoverLabelsCleared: GFD's and the operator's nvidia.com/* labels stay"
        );
        let r = reason(&decisions[1..]);
        assert!(
            r.contains("devicePlugin.enabled") && r.contains("trial period"),
            "{r}"
        );

        let decisions = Completion::default().complete(&cluster, &from("legacy", "h100", true));
        let Some(Kind::SourceGroupRetired(retired)) = &decisions.last().unwrap().kind else {
            panic!("{decisions:?}")
        };
        assert_eq!(retired.group, "legacy");
        assert!(retired.gpu_before.is_none());
        assert!(
            retired.next_step.contains("devicePlugin.enabled=false"),
            "{}",
            retired.next_step
        );
    }

    #[test]
    fn the_final_cutover_waits_for_the_legacy_pool_and_every_device_plugin() {
        let with_legacy = on_nvidia(vec![gfd_node("gpu-1", "legacy", false, 2)]);
        let r =
            reason(&Completion::default().complete(&with_legacy, &from("legacy", "h100", true)));
        assert!(
            r.contains("hand over the remaining nodes") && r.contains("gpu-1"),
            "{r}"
        );
        // A GPU node in no pool is the operator's default: the device plugin.
        let outside = on_nvidia(vec![
            gfd_node("gpu-1", "dra-pilot", true, 0),
            gfd_node("gpu-9", "", false, 2),
        ]);
        let decisions = Completion::default().complete(&outside, &from("legacy", "h100", true));
        let r = reason(&decisions[1..]);
        assert!(
            r.contains("final cutover") && r.contains("node gpu-9") && !r.contains("gpu-1"),
            "{r}"
        );
    }

    #[test]
    fn an_abandoned_migration_completes_only_once_the_last_dra_node_is_clear() {
        let abandon = from("dra-pilot", "", false);
        let r = reason(&Completion::default().complete(
            &on_nvidia(vec![gfd_node("gpu-1", "dra-pilot", true, 0)]),
            &abandon,
        ));
        assert!(
            r.contains("roll back the remaining nodes") && r.contains("gpu-1"),
            "{r}"
        );

        // gpu-1 rolled back, but the driver's devices are still published
        // and a claim still holds one: the driver must stay.
        let rolled_back = gfd_node("gpu-1", "legacy", false, 2);
        let r = reason(&Completion::default().complete(
            &on_nvidia(vec![
                rolled_back.clone(),
                mk_h100_slice("gpu-1"),
                claim("pilot", "gpu-1"),
            ]),
            &abandon,
        ));
        assert!(
            r.contains("uninstall DRA only after the last DRA node is clear")
                && r.contains("devices still published for: gpu-1")
                && r.contains("apps/pilot on gpu-1"),
            "{r}"
        );
        // Another DRA pool's node still serving DRA keeps the driver too.
        let r = reason(&Completion::default().complete(
            &on_nvidia(vec![rolled_back.clone(), gfd_node("gpu-7", "", true, 0)]),
            &abandon,
        ));
        assert!(r.contains("nodes still serving DRA: gpu-7"), "{r}");

        let decisions = Completion::default().complete(&on_nvidia(vec![rolled_back]), &abandon);
        assert_eq!(
            names(&decisions),
            ["SourceGroupRetired"],
            "no quota moves back"
        );
        let Some(Kind::SourceGroupRetired(retired)) = &decisions[0].kind else {
            unreachable!()
        };
        assert!(
            retired.next_step.contains("helm uninstall"),
            "{}",
            retired.next_step
        );
    }

    #[test]
    fn a_pool_the_backend_does_not_know_and_a_missing_class_are_refused() {
        let cluster = on_nvidia(vec![]);
        let r = reason(&Completion::default().complete(&cluster, &from("gpu", "h100", true)));
        assert!(
            r.contains("pool gpu") && r.contains("expected one of dra-pilot, legacy"),
            "{r}"
        );
        let r = reason(&Completion::default().complete(&cluster, &from("legacy", "", true)));
        assert!(r.contains("no GPU class named"), "{r}");
    }
}
