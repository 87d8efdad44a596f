//! The alerter core: alert rules over the log.
//!
//! `D8GpuNodeGroupHeldOnDra` fires for each group held on DRA after the module
//! upgrade and clears when the group is released (reference, "If DRA was
//! enabled before the module upgrade"). Every alert of the module — this one
//! and those the module status and the chart's PrometheusRule carry — is
//! defined and decided in [`rules`].

pub mod rules;

use std::collections::{BTreeMap, BTreeSet};

use switchyard_proto::v1::{AlertCleared, AlertRaised, DomainEvent, domain_event::Kind, event};

use crate::names::{ALERT_HELD_ON_DRA, ALERT_LABEL_NODE_GROUP};

/// The groups held on DRA, and the alerts firing: (alert name, labels) -> summary.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Alerter {
    pub(crate) held: BTreeSet<String>,
    pub(crate) firing: BTreeMap<(String, BTreeMap<String, String>), String>,
}

fn group_labels(group: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(ALERT_LABEL_NODE_GROUP.to_string(), group.to_string())])
}

impl Alerter {
    /// The alerts firing, by name and labels, with their summaries: the
    /// read-only view `status` and the checks read.
    pub fn firing(&self) -> &BTreeMap<(String, BTreeMap<String, String>), String> {
        &self.firing
    }

    /// Folds the hold decisions and the alerter's own events.
    /// (`_at`: the alerter keeps no time.)
    pub fn apply(&mut self, event: &DomainEvent, _at: i64) {
        match &event.kind {
            Some(Kind::NodeGroupHeldOnDra(held)) => {
                self.held.insert(held.group.clone());
            }
            Some(Kind::NodeGroupReleased(released)) => {
                self.held.remove(&released.group);
            }
            Some(Kind::AlertRaised(a)) => {
                self.firing
                    .insert((a.alert_name.clone(), a.labels.clone()), a.summary.clone());
            }
            Some(Kind::AlertCleared(a)) => {
                self.firing
                    .remove(&(a.alert_name.clone(), a.labels.clone()));
            }
            _ => {}
        }
    }

    /// Folds an event of the log; returns the alerts it raises or clears.
    pub fn handle(&mut self, input: &DomainEvent, now: i64) -> Vec<DomainEvent> {
        self.apply(input, now);
        self.catch_up(now)
    }

    /// The alerts to raise or clear for the state folded so far — after a
    /// rebuild, those a late start or a crash kept from being recorded — folded.
    pub fn catch_up(&mut self, now: i64) -> Vec<DomainEvent> {
        let firing = |group: &str| {
            self.firing
                .contains_key(&(ALERT_HELD_ON_DRA.to_string(), group_labels(group)))
        };
        let clear = self
            .firing
            .keys()
            .filter(|(name, labels)| {
                name == ALERT_HELD_ON_DRA
                    && labels
                        .get(ALERT_LABEL_NODE_GROUP)
                        .is_none_or(|group| !self.held.contains(group))
            })
            .map(|(name, labels)| {
                event(Kind::AlertCleared(AlertCleared {
                    alert_name: name.clone(),
                    labels: labels.clone(),
                }))
            });
        let raise = self
            .held
            .iter()
            .filter(|group| !firing(group))
            .map(|group| event_raised(group));
        let decisions: Vec<DomainEvent> = clear.chain(raise).collect();
        for decision in &decisions {
            self.apply(decision, now);
        }
        decisions
    }
}

fn event_raised(group: &str) -> DomainEvent {
    event(Kind::AlertRaised(AlertRaised {
        alert_name: ALERT_HELD_ON_DRA.into(),
        labels: group_labels(group),
        summary: format!(
            "node group {group} has spec.gpu but is held on DRA since the module upgrade; \
             drain its nodes, remove spec.gpu, wait for this alert to clear, then set spec.gpu again"
        ),
    }))
}
