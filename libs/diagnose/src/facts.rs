//! The snapshot as the cores see the cluster: its Nodes, NodeGroups and the
//! gpu ModuleConfig folded into [`Cluster`] facts with the builders inventory
//! records them with ([`switchyard_kube::facts`]), so that which stack serves
//! a node is the core's stack rules' answer ([`switchyard_core::stack_rules`]),
//! not the doctor's.

use switchyard_core::cluster::Cluster;
use switchyard_core::events::domain_event::Kind;
use switchyard_kube::facts;
use switchyard_kube::platform::Platform;

use super::Snapshot;

/// What the stack rules read, on the `deckhouse` backend (the one whose
/// NodeGroups and ModuleConfig the snapshot lists): the groups, the module's
/// settings (none without a gpu ModuleConfig) and the nodes.
pub(crate) fn cluster(s: &Snapshot) -> Cluster {
    let mut cluster = Cluster::default();
    for group in &s.node_groups {
        cluster.apply_owned(facts::node_group(group));
    }
    // The snapshot reads whether resource.k8s.io/v1 is served, not the API
    // server's version and gates (`/version`, `/metrics`): a served API is
    // taken as the gates ready, and the gates' row points to the module
    // status for the rest.
    let platform = Platform {
        dra_api_served: s.dra_api_served,
        ..Platform::default()
    };
    let settings = s
        .module_config
        .as_ref()
        .and_then(|config| facts::module_settings(config, "", &platform));
    if let Some(mut settings) = settings {
        if let Some(Kind::ModuleSettingsObserved(observed)) = settings.kind.as_mut() {
            observed.feature_gates_ready = s.dra_api_served;
        }
        cluster.apply_owned(settings);
    }
    for node in &s.nodes {
        cluster.apply_owned(facts::node(node));
    }
    cluster
}
