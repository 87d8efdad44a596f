//! The rendered roles and bindings: each service's role grants exactly its documented permissions.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use crate::support::{NAMESPACE, NATS_URL, RELEASE, kind, name, render, strings};

/// Every permission each service's role grants, as `group/resource verbs...`
/// (core group empty): exactly these, nothing else.
const PERMISSIONS: [(&str, &[&str]); 6] = [
    (
        "inventory",
        &[
            "/nodes get list watch",
            "/pods get list watch",
            "/resourcequotas get list watch",
            "apps/deployments get list watch",
            "apps/statefulsets get list watch",
            "deckhouse.io/nodegroups get list watch",
            "deckhouse.io/moduleconfigs get list watch",
            "gpu.deckhouse.io/gpuclasses get list watch",
            "gpu.deckhouse.io/physicalgpus get list watch",
            "resource.k8s.io/resourceslices get list watch",
            "resource.k8s.io/deviceclasses get list watch",
            "resource.k8s.io/resourceclaims get list watch",
        ],
    ),
    (
        "stack-assigner",
        &[
            "/nodes get list watch patch",
            "/pods get list watch",
            "/pods/eviction create",
            "policy/poddisruptionbudgets get list watch",
            "deckhouse.io/nodegroups get list watch",
            "deckhouse.io/moduleconfigs get list watch",
        ],
    ),
    (
        "class-compiler",
        &[
            "gpu.deckhouse.io/gpuclasses get list watch",
            "gpu.deckhouse.io/physicalgpus get list watch",
            "gpu.deckhouse.io/gpuclasses/status patch update",
            "resource.k8s.io/deviceclasses get list watch create patch delete",
            "admissionregistration.k8s.io/validatingadmissionpolicies get create patch delete",
            "admissionregistration.k8s.io/validatingadmissionpolicybindings get create patch delete",
        ],
    ),
    (
        "claim-allocator",
        &[
            "apps/deployments get list watch patch",
            "apps/statefulsets get list watch patch",
            "/pods get list watch",
            "/resourcequotas get list watch patch",
            "deckhouse.io/nodegroups get list watch patch",
            "resource.k8s.io/resourceclaims get list watch",
            "resource.k8s.io/resourceslices get list watch",
            "resource.k8s.io/deviceclasses get list watch",
            "resource.k8s.io/resourceclaims/status patch update",
        ],
    ),
    (
        "node-agent",
        &[
            "/nodes get list watch",
            "gpu.deckhouse.io/physicalgpus get list watch create patch update delete",
            "gpu.deckhouse.io/physicalgpus/status get list watch create patch update delete",
            "resource.k8s.io/resourceslices get list watch create patch update delete",
            "resource.k8s.io/resourceclaims get list watch",
        ],
    ),
    ("alerter", &["/events create patch"]),
];

/// (group/resource, verb) pairs of a role's rules.
fn granted(role: &Value) -> BTreeSet<(String, String)> {
    let mut pairs = BTreeSet::new();
    for rule in role["rules"].as_array().unwrap() {
        assert!(
            rule.get("resourceNames").is_none() && rule.get("nonResourceURLs").is_none(),
            "{rule}"
        );
        for group in strings(&rule["apiGroups"]) {
            for resource in strings(&rule["resources"]) {
                for verb in strings(&rule["verbs"]) {
                    pairs.insert((format!("{group}/{resource}"), verb.to_string()));
                }
            }
        }
    }
    pairs
}

#[test]
fn each_role_grants_exactly_the_documented_permissions() {
    let docs = render(&[NATS_URL]);
    for (component, permissions) in PERMISSIONS {
        let role_name = format!("{RELEASE}-{component}");
        let kind_wanted = if component == "alerter" {
            "Role"
        } else {
            "ClusterRole"
        };
        let role = docs
            .iter()
            .find(|doc| kind(doc) == kind_wanted && name(doc) == role_name)
            .unwrap_or_else(|| panic!("no {kind_wanted} {role_name}"));
        let expected: BTreeSet<(String, String)> = permissions
            .iter()
            .flat_map(|line| {
                let mut words = line.split(' ');
                let resource = words.next().unwrap();
                words.map(move |verb| (resource.to_string(), verb.to_string()))
            })
            .collect();
        assert_eq!(granted(role), expected, "{kind_wanted} {role_name}");
        let binding_kind = format!("{kind_wanted}Binding");
        let binding = docs
            .iter()
            .find(|doc| kind(doc) == binding_kind && name(doc) == role_name)
            .unwrap_or_else(|| panic!("no {binding_kind} {role_name}"));
        assert_eq!(binding["roleRef"]["name"], role_name.as_str());
        assert_eq!(
            binding["subjects"],
            json!([{"kind": "ServiceAccount", "name": role_name, "namespace": NAMESPACE}])
        );
    }
    // The node agent's Events about cluster-scoped objects live in `default`.
    let events_role = format!("{RELEASE}-node-agent-events");
    let role = docs
        .iter()
        .find(|doc| kind(doc) == "Role" && name(doc) == events_role)
        .unwrap_or_else(|| panic!("no Role {events_role}"));
    assert_eq!(role["metadata"]["namespace"], "default");
    assert_eq!(
        granted(role),
        BTreeSet::from([
            ("events.k8s.io/events".to_string(), "create".to_string()),
            ("events.k8s.io/events".to_string(), "patch".to_string()),
        ])
    );
    let binding = docs
        .iter()
        .find(|doc| kind(doc) == "RoleBinding" && name(doc) == events_role)
        .unwrap_or_else(|| panic!("no RoleBinding {events_role}"));
    assert_eq!(binding["roleRef"]["name"], events_role.as_str());
    assert_eq!(
        binding["subjects"],
        json!([{"kind": "ServiceAccount", "name": format!("{RELEASE}-node-agent"), "namespace": NAMESPACE}])
    );
    // No role or binding besides these.
    let roles = docs
        .iter()
        .filter(|doc| kind(doc).ends_with("Role") || kind(doc).ends_with("RoleBinding"))
        .count();
    assert_eq!(roles, 2 * PERMISSIONS.len() + 2);
}
