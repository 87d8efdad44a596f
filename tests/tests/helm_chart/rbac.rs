//! The rendered roles and bindings: each service's role grants exactly its documented permissions.

use std::collections::BTreeSet;

use serde_json::{Value, json};
use switchyard_api::rbac::Permission;

use crate::support::{NAMESPACE, NATS_URL, RELEASE, kind, name, render, strings};

/// Every permission each service's role grants, as each service's crate
/// lists them: exactly these, nothing else.
const PERMISSIONS: [(&str, &[Permission]); 6] = [
    ("inventory", switchyard_inventory::PERMISSIONS),
    ("stack-assigner", switchyard_stack_assigner::PERMISSIONS),
    ("class-compiler", switchyard_class_compiler::PERMISSIONS),
    ("claim-allocator", switchyard_claim_allocator::PERMISSIONS),
    ("node-agent", switchyard_node_agent::PERMISSIONS),
    ("alerter", switchyard_alerter::PERMISSIONS),
];

/// (group/resource, verb) pairs of a service's permissions.
fn pairs(permissions: &[Permission]) -> BTreeSet<(String, String)> {
    permissions
        .iter()
        .flat_map(|p| {
            p.verbs
                .iter()
                .map(move |verb| (format!("{}/{}", p.group, p.resource), verb.to_string()))
        })
        .collect()
}

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
        assert_eq!(
            granted(role),
            pairs(permissions),
            "{kind_wanted} {role_name}"
        );
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
        pairs(switchyard_node_agent::EVENT_PERMISSIONS)
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
