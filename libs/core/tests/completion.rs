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
