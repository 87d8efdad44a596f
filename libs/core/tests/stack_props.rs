//! Property tests over random clusters and random fact sequences for the
//! invariants of ARCHITECTURE.md that concern the stack-assigner:
//! 1. every node has exactly one stack, and it is the one the rules give;
//! 2. the rules are honoured for every node after every fact;
//! 3. a group held on DRA stays held, and alerting, until it is released;
//! 4. replaying the log yields the same state, and re-deciding its facts the
//!    same decisions, byte for byte.

mod support;

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use prost::Message;
use support::*;
use switchyard_core::alerter::Alerter;
use switchyard_core::stack_assigner::StackAssigner;
use switchyard_core::stack_rules::rule;
use switchyard_proto::v1::{DomainEvent, Stack, domain_event::Kind};

const NODES: [&str; 6] = ["n0", "n1", "n2", "n3", "n4", "n5"];
const GROUPS: [&str; 4] = ["gpu", "gpu-b", "gpu-dra", "master"];

fn fact() -> impl Strategy<Value = DomainEvent> {
    let node = prop::sample::select(&NODES[..]);
    let group = prop::sample::select(&GROUPS[..]);
    prop_oneof![
        6 => (node.clone(), prop::option::of(group.clone()), 0u8..10).prop_map(|(n, g, kind)| match kind {
            0 => mk_control_plane(n),
            1 => mk_opted_out(n, g.unwrap_or("gpu-dra")),
            _ => mk_node(n, g),
        }),
        1 => node.prop_map(mk_node_removed),
        4 => (group.clone(), any::<bool>()).prop_map(|(g, gpu)| mk_group(g, gpu)),
        1 => group.prop_map(mk_group_removed),
        2 => (any::<bool>(), prop::bool::weighted(0.85), prop::bool::weighted(0.7))
            .prop_map(|(dra, gates, upgraded)| mk_settings(dra, gates, if upgraded { "1.9.0" } else { "" })),
    ]
}

/// An independent model of the hold: which groups are held after each fact.
#[derive(Default)]
struct HoldModel {
    settings_seen: bool,
    held: BTreeSet<String>,
}

impl HoldModel {
    fn observe(&mut self, fact: &DomainEvent, core_before: &StackAssigner) {
        match fact.kind.as_ref().unwrap() {
            Kind::ModuleSettingsObserved(s) => {
                if !self.settings_seen && s.dra_enabled && !s.previous_module_version.is_empty() {
                    self.held.extend(
                        core_before
                            .cluster()
                            .groups
                            .iter()
                            .filter(|(_, g)| g.gpu.is_some())
                            .map(|(n, _)| n.clone()),
                    );
                }
                self.settings_seen = true;
                if !s.dra_enabled {
                    self.held.clear();
                }
            }
            Kind::NodeGroupObserved(g) if g.gpu.is_none() => {
                self.held.remove(&g.group);
            }
            Kind::NodeGroupRemoved(g) => {
                self.held.remove(&g.group);
            }
            _ => {}
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    #[test]
    fn stack_assignment_invariants(facts in prop::collection::vec(fact(), 1..60)) {
        let mut core = StackAssigner::default();
        let mut model = HoldModel::default();
        let mut log: Vec<DomainEvent> = Vec::new();
                let mut firing: BTreeMap<String, i32> = BTreeMap::new();
        let mut alerter = Alerter::default();
        for fact in &facts {
            model.observe(fact, &core);
                        let mut decisions = core.handle_fact(fact, 0);
            // The alerter sees the stack-assigner's decisions and alerts on them.
            let alerts: Vec<DomainEvent> = decisions.iter().flat_map(|d| alerter.handle(d, 0)).collect();
            decisions.extend(alerts);
            for d in &decisions {
                match &d.kind {
                    Some(Kind::AlertRaised(a)) => *firing.entry(a.labels["node_group"].clone()).or_default() += 1,
                    Some(Kind::AlertCleared(a)) => *firing.entry(a.labels["node_group"].clone()).or_default() -= 1,
                    _ => {}
                }
            }
            log.push(fact.clone());
            log.extend(decisions);

            // 0: nothing is decided before the module settings are known.
            if core.cluster().module.observations == 0 {
                prop_assert!(core.assignments().is_empty(), "decided before the settings: {:?}", core.assignments());
                continue;
            }
            // 1 + 2: exactly the cluster's nodes are assigned, each as the rules say.
            prop_assert_eq!(
                core.assignments().keys().collect::<Vec<_>>(),
                core.cluster().nodes.keys().collect::<Vec<_>>()
            );
            for (name, node) in &core.cluster().nodes {
                let group = node.group().unwrap_or_default();
                let expected = rule(node, core.cluster(), core.held().contains(group));
                let a = &core.assignments()[name];
                prop_assert_eq!((a.stack, a.reason), expected, "node {}", name);
                prop_assert_eq!(a.group.as_str(), group);
            }
            // 3: held exactly as the model says; a held group's plain nodes are on DRA;
            //    the alert fires once per held group and is cleared on release.
            prop_assert_eq!(core.held(), &model.held);
            for group in core.held() {
                prop_assert_eq!(firing.get(group).copied().unwrap_or(0), 1, "alert for {}", group);
                for name in core.cluster().members.get(group).into_iter().flatten() {
                    let node = &core.cluster().nodes[name];
                    if !node.is_control_plane() && !node.gpu_disabled() && core.cluster().module.feature_gates_ready {
                        prop_assert_eq!(core.assignments()[name].stack, Stack::Dra);
                    }
                }
            }
            prop_assert!(firing.iter().all(|(g, n)| *n == i32::from(core.held().contains(g))));
        }

        // 4: replay gives the same state; re-deciding the facts the same bytes.
        let mut replayed = StackAssigner::default();
        for event in &log {
            replayed.apply(event, 0);
        }
        prop_assert_eq!(&replayed, &core);
                let mut again = StackAssigner::default();
        let mut alerter = Alerter::default();
        let mut relog = Vec::new();
        for fact in &facts {
            relog.push(fact.encode_to_vec());
            let decisions = again.handle_fact(fact, 0);
            let alerts: Vec<DomainEvent> = decisions.iter().flat_map(|d| alerter.handle(d, 0)).collect();
            relog.extend(decisions.iter().chain(&alerts).map(Message::encode_to_vec));
        }
        let original: Vec<Vec<u8>> = log.iter().map(Message::encode_to_vec).collect();
        prop_assert_eq!(relog, original);
    }
}
