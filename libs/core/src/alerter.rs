//! The alerter core: alert rules over the log.
//!
//! `D8GpuNodeGroupHeldOnDra` fires for each group held on DRA after the module
//! upgrade and clears when the group is released (reference, "If DRA was
//! enabled before the module upgrade").

use std::collections::BTreeMap;

use switchyard_proto::v1::{AlertCleared, AlertRaised, DomainEvent, domain_event::Kind};

use crate::names::{ALERT_HELD_ON_DRA, ALERT_LABEL_NODE_GROUP};

/// Alerts firing: (alert name, labels) -> summary.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Alerter {
    pub firing: BTreeMap<(String, BTreeMap<String, String>), String>,
}

fn event(kind: Kind) -> DomainEvent {
    DomainEvent { kind: Some(kind) }
}

fn group_labels(group: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(ALERT_LABEL_NODE_GROUP.to_string(), group.to_string())])
}

impl Alerter {
    /// Folds the alerter's own events.
    pub fn apply(&mut self, event: &DomainEvent) {
        match &event.kind {
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

    /// The alerts an event raises or clears (already folded into the state).
    pub fn handle(&mut self, input: &DomainEvent) -> Vec<DomainEvent> {
        self.apply(input);
        let decision = match &input.kind {
            Some(Kind::NodeGroupHeldOnDra(held)) => {
                let key = (ALERT_HELD_ON_DRA.to_string(), group_labels(&held.group));
                (!self.firing.contains_key(&key)).then(|| event_raised(&held.group))
            }
            Some(Kind::NodeGroupReleased(released)) => {
                let key = (ALERT_HELD_ON_DRA.to_string(), group_labels(&released.group));
                self.firing.contains_key(&key).then(|| {
                    event(Kind::AlertCleared(AlertCleared {
                        alert_name: ALERT_HELD_ON_DRA.into(),
                        labels: group_labels(&released.group),
                    }))
                })
            }
            _ => None,
        };
        decision.into_iter().inspect(|d| self.apply(d)).collect()
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
