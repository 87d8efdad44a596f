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
            p.verbs.iter().map(move |verb| {
                (
                    format!("{}/{}{}", p.group, p.resource, names(p.names)),
                    verb.to_string(),
                )
            })
        })
        .collect()
}

/// (group/resource, verb) pairs of a role's rules; a non-resource URL as
/// (`url:<path>`, verb).
fn granted(role: &Value) -> BTreeSet<(String, String)> {
    let mut pairs = BTreeSet::new();
    for rule in role["rules"].as_array().unwrap() {
        let only = names(&strings(&rule["resourceNames"]));
        for url in strings(&rule["nonResourceURLs"]) {
            for verb in strings(&rule["verbs"]) {
                pairs.insert((format!("url:{url}"), verb.to_string()));
            }
        }
        for group in strings(&rule["apiGroups"]) {
            for resource in strings(&rule["resources"]) {
                for verb in strings(&rule["verbs"]) {
                    pairs.insert((format!("{group}/{resource}{only}"), verb.to_string()));
                }
            }
        }
    }
    pairs
}

/// `[a,b]` for a rule limited to those objects, nothing for any.
fn names(names: &[&str]) -> String {
    if names.is_empty() {
        String::new()
    } else {
        format!("[{}]", names.join(","))
    }
}

/// A service's non-resource permissions as (`url:<path>`, verb) pairs.
fn urls(permissions: &[(&str, &[&str])]) -> BTreeSet<(String, String)> {
    permissions
        .iter()
        .flat_map(|(url, verbs)| {
            verbs
                .iter()
                .map(move |v| (format!("url:{url}"), v.to_string()))
        })
        .collect()
}

#[test]
fn each_role_grants_exactly_the_documented_permissions() {
    let docs = render(&[NATS_URL]);
    for (component, permissions) in PERMISSIONS {
        let role_name = format!("{RELEASE}-{component}");
        let role = docs
            .iter()
            .find(|doc| kind(doc) == "ClusterRole" && name(doc) == role_name)
            .unwrap_or_else(|| panic!("no ClusterRole {role_name}"));
        let mut documented = pairs(permissions);
        if component == "inventory" {
            documented.extend(urls(switchyard_inventory::NON_RESOURCE_PERMISSIONS));
        }
        assert_eq!(granted(role), documented, "ClusterRole {role_name}");
        let binding = docs
            .iter()
            .find(|doc| kind(doc) == "ClusterRoleBinding" && name(doc) == role_name)
            .unwrap_or_else(|| panic!("no ClusterRoleBinding {role_name}"));
        assert_eq!(binding["roleRef"]["name"], role_name.as_str());
        assert_eq!(
            binding["subjects"],
            json!([{"kind": "ServiceAccount", "name": role_name, "namespace": NAMESPACE}])
        );
    }
    // The node agent's and the alerter's Events about cluster-scoped
    // objects live in `default`.
    for (component, permissions) in [
        ("node-agent", switchyard_node_agent::EVENT_PERMISSIONS),
        ("alerter", switchyard_alerter::EVENT_PERMISSIONS),
    ] {
        let events_role = format!("{RELEASE}-{component}-events");
        let role = docs
            .iter()
            .find(|doc| kind(doc) == "Role" && name(doc) == events_role)
            .unwrap_or_else(|| panic!("no Role {events_role}"));
        assert_eq!(role["metadata"]["namespace"], "default");
        assert_eq!(granted(role), pairs(permissions));
        let binding = docs
            .iter()
            .find(|doc| kind(doc) == "RoleBinding" && name(doc) == events_role)
            .unwrap_or_else(|| panic!("no RoleBinding {events_role}"));
        assert_eq!(binding["roleRef"]["name"], events_role.as_str());
        assert_eq!(
            binding["subjects"],
            json!([{"kind": "ServiceAccount", "name": format!("{RELEASE}-{component}"), "namespace": NAMESPACE}])
        );
    }
    // No role or binding besides these and each elected service's Lease's
    // (render::services_run_elected_with_a_standby_by_default).
    let roles = docs
        .iter()
        .filter(|doc| kind(doc).ends_with("Role") || kind(doc).ends_with("RoleBinding"))
        .count();
    assert_eq!(roles, 2 * PERMISSIONS.len() + 4 + 2 * 5);
}
