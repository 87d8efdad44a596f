//! The stack rules (reference: "How the stacks are split across nodes"): which
//! stack serves a node, given the cluster facts. The stack-assigner decides
//! with them; a handover predicts a node's stack in its target group with them.
//! Each backend's rules are its strategy's
//! ([`crate::backend::strategy::Strategy::stack_rule`]).

use crate::backend::dispatch::strategy;
use switchyard_proto::v1::{Stack, StackReason};

use crate::cluster::{Cluster, Node};

/// The rules, for one node, on the cluster's backend. `held`: the node's
/// group is held on DRA (the `deckhouse` backend's upgrade hold).
pub fn rule(node: &Node, cluster: &Cluster, held: bool) -> (Stack, StackReason) {
    strategy(&cluster.backend).stack_rule(node, cluster, held)
}
