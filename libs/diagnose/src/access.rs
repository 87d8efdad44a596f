//! The rows about who may do what with devices: claims asking for DRA admin
//! access outside the namespaces Kubernetes honours it in, and the namespaces
//! that grant it; tenants who may write DeviceClasses or ResourceSlices; a
//! node agent that may write every node's ResourceSlices without the chart's
//! own-node admission policy.
//!
//! RBAC is evaluated here, from the roles and bindings as listed: a
//! ClusterRole's stored rules together with those of the ClusterRoles its
//! aggregation rule selects (what the aggregation controller stores, in case
//! it has not yet). Only ClusterRoleBindings can grant DeviceClasses and
//! ResourceSlices — the authorizer checks a cluster-scoped request against
//! them alone — so a RoleBinding naming those resources grants nothing and is
//! not a finding.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, PolicyRule, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use switchyard_core::names;

use super::{Finding, Row, View, label, name_of, namespace_of, sh};

/// The namespace label under which Kubernetes (1.33+) honours `adminAccess`.
pub const ADMIN_ACCESS_LABEL: &str = "resource.kubernetes.io/admin-access";
/// The label's name while DRAAdminAccess was alpha (1.32); no longer honoured.
const ALPHA_ADMIN_ACCESS_LABEL: &str = "resource.k8s.io/admin-access";
const RESOURCE_GROUP: &str = "resource.k8s.io";
const WRITE_VERBS: [&str; 5] = ["create", "update", "patch", "delete", "deletecollection"];
/// Labels the Helm chart puts on its ServiceAccounts and bindings.
const PART_OF_LABEL: &str = "app.kubernetes.io/part-of";
const PART_OF: &str = "switchyard";
const COMPONENT_LABEL: &str = "app.kubernetes.io/component";
const INSTANCE_LABEL: &str = "app.kubernetes.io/instance";
const NODE_AGENT: &str = "node-agent";
/// Where GPU drivers run their service accounts: Deckhouse's GPU module (the
/// DRA adapter), NVIDIA's DRA driver chart and the GPU Operator.
const DRIVER_NAMESPACES: [&str; 3] = [
    names::MODULE_NAMESPACE,
    "nvidia-dra-driver-gpu",
    "gpu-operator",
];
/// Groups every user or every service account is in: a grant to one of them
/// is a grant to tenants.
const EVERYONE: [&str; 3] = [
    "system:authenticated",
    "system:unauthenticated",
    "system:serviceaccounts",
];

/// The names of a claim spec's requests that ask for admin access. Only an
/// exact request can (DeviceSubRequest has no adminAccess field).
fn admin_requests(spec: Option<&k8s_openapi::api::resource::v1::DeviceClaim>) -> Vec<&str> {
    spec.and_then(|d| d.requests.as_ref())
        .into_iter()
        .flatten()
        .filter(|r| r.exactly.as_ref().and_then(|e| e.admin_access) == Some(true))
        .map(|r| r.name.as_str())
        .collect()
}

/// The objects asking for admin access, by namespace: (`Kind/ns/name`, requests).
fn admin_objects<'a>(v: &View<'a>) -> BTreeMap<&'a str, Vec<(String, Vec<&'a str>)>> {
    let mut out: BTreeMap<&str, Vec<(String, Vec<&str>)>> = BTreeMap::new();
    for claim in &v.s.claims {
        let requests = admin_requests(claim.spec.devices.as_ref());
        if !requests.is_empty() {
            let ns = namespace_of(&claim.metadata);
            let object = format!("ResourceClaim/{ns}/{}", name_of(&claim.metadata));
            out.entry(ns).or_default().push((object, requests));
        }
    }
    for template in &v.s.claim_templates {
        let requests = admin_requests(template.spec.spec.devices.as_ref());
        if !requests.is_empty() {
            let ns = namespace_of(&template.metadata);
            let object = format!("ResourceClaimTemplate/{ns}/{}", name_of(&template.metadata));
            out.entry(ns).or_default().push((object, requests));
        }
    }
    out
}

fn is_admin_namespace(meta: &ObjectMeta) -> bool {
    label(meta, ADMIN_ACCESS_LABEL) == Some("true")
}

fn describe(objects: &[(String, Vec<&str>)]) -> String {
    objects
        .iter()
        .map(|(o, r)| format!("{o} (request {})", r.join(", ")))
        .collect::<Vec<_>>()
        .join(", ")
}

/// ResourceClaims and ResourceClaimTemplates asking for `adminAccess` in a
/// namespace without `resource.kubernetes.io/admin-access: "true"`.
pub(crate) fn admin_access_outside_admin_namespace(v: &View<'_>) -> Vec<Finding> {
    let mut out = Vec::new();
    for (ns, objects) in admin_objects(v) {
        let namespace = v.s.namespaces.iter().find(|n| name_of(&n.metadata) == ns);
        if namespace.is_some_and(|n| is_admin_namespace(&n.metadata)) {
            continue;
        }
        let alpha =
            namespace.is_some_and(|n| label(&n.metadata, ALPHA_ADMIN_ACCESS_LABEL) == Some("true"));
        let mut cause = format!(
            "{} ask{} for adminAccess — access to devices in use by other claims — but namespace {ns} is not labelled {ADMIN_ACCESS_LABEL}=true",
            describe(&objects),
            if objects.len() == 1 { "s" } else { "" },
        );
        if alpha {
            cause.push_str(&format!(
                " (it carries {ALPHA_ADMIN_ACCESS_LABEL}, the alpha label Kubernetes 1.33 replaced)"
            ));
        }
        cause.push_str(": Kubernetes refuses such objects on create since 1.33, so these were made before the label was removed or on a server that did not check (1.31, or the DRAAdminAccess gate off); an allocated claim keeps its admin access, a template's new claims are refused and its pods stay Pending. If the namespace is an admin namespace, label it instead");
        let mut all = vec![format!("Namespace/{ns}")];
        all.extend(objects.iter().map(|(o, _)| o.clone()));
        let targets: Vec<String> = objects
            .iter()
            .map(|(o, _)| {
                let (kind, rest) = o.split_once('/').unwrap_or_default();
                let name = rest.rsplit('/').next().unwrap_or_default();
                sh(&format!("{}/{name}", kind.to_ascii_lowercase()))
            })
            .collect();
        out.push(Finding::new(
            Row::AdminAccessOutsideAdminNamespace,
            all,
            cause,
            format!("kubectl -n {} delete {}", sh(ns), targets.join(" ")),
        ));
    }
    out
}

/// Namespaces labelled `resource.kubernetes.io/admin-access: "true"`, and
/// who may create claims there (informational).
pub(crate) fn admin_access_namespaces(v: &View<'_>) -> Vec<Finding> {
    let admin = admin_objects(v);
    let rbac = Rbac::new(v);
    let mut out = Vec::new();
    for namespace in
        v.s.namespaces
            .iter()
            .filter(|n| is_admin_namespace(&n.metadata))
    {
        let ns = name_of(&namespace.metadata);
        let objects = admin.get(ns).map(Vec::as_slice).unwrap_or_default();
        let mut all = vec![format!("Namespace/{ns}")];
        all.extend(objects.iter().map(|(o, _)| o.clone()));
        let creators = rbac.claim_creators(ns);
        let mut cause = format!(
            "namespace {ns} is labelled {ADMIN_ACCESS_LABEL}=true: whoever may create ResourceClaims or ResourceClaimTemplates in it can get admin access to every device of the cluster, including devices in use by other claims"
        );
        if creators.is_empty() {
            cause.push_str(
                "; no one but system components and cluster administrators may create claims there",
            );
        } else {
            cause.push_str(&format!(
                "; may create claims there: {}",
                creators.join(", ")
            ));
        }
        if objects.is_empty() {
            cause.push_str("; nothing there asks for admin access now");
        } else {
            cause.push_str(&format!("; asking for it now: {}", describe(objects)));
        }
        out.push(Finding::new(
            Row::AdminAccessNamespace,
            all,
            cause,
            format!("kubectl label namespace {} {ADMIN_ACCESS_LABEL}-", sh(ns)),
        ));
    }
    out
}

/// ClusterRoleBindings that give a tenant write access to DeviceClasses or
/// ResourceSlices.
pub(crate) fn tenant_writes_dra_inventory(v: &View<'_>) -> Vec<Finding> {
    let rbac = Rbac::new(v);
    let mut out = Vec::new();
    for binding in &v.s.cluster_role_bindings {
        let name = name_of(&binding.metadata);
        let rules = rbac.cluster_role_rules(&binding.role_ref.name);
        let grants: Vec<String> = ["deviceclasses", "resourceslices"]
            .into_iter()
            .filter_map(|resource| {
                let verbs = writes(&rules, RESOURCE_GROUP, resource);
                (!verbs.is_empty()).then(|| {
                    format!(
                        "{} on {resource}",
                        verbs.into_iter().collect::<Vec<_>>().join(", ")
                    )
                })
            })
            .collect();
        if grants.is_empty() {
            continue;
        }
        let subjects = binding.subjects.as_deref().unwrap_or_default();
        let tenants: Vec<(usize, &Subject)> = subjects
            .iter()
            .enumerate()
            .filter(|(_, s)| rbac.is_tenant(s, None))
            .collect();
        if tenants.is_empty() {
            continue;
        }
        let role = format!("ClusterRole/{}", binding.role_ref.name);
        let mut objects = vec![format!("ClusterRoleBinding/{name}"), role.clone()];
        objects.extend(tenants.iter().map(|(_, s)| subject_object(s, None)));
        let who: Vec<String> = tenants
            .iter()
            .map(|(_, s)| subject_object(s, None))
            .collect();
        let cause = format!(
            "ClusterRoleBinding {name} gives {role}'s {} ({RESOURCE_GROUP}) to {}: DeviceClasses decide which devices a claim may get and ResourceSlices are the inventory the scheduler allocates from — only cluster administration should write DeviceClasses and only the DRA driver ResourceSlices",
            grants.join("; "),
            who.join(", ")
        );
        let fix = if tenants.len() == subjects.len() {
            format!("kubectl delete clusterrolebinding {}", sh(name))
        } else {
            // Remove only the tenants, last first so the indices hold.
            let ops: Vec<String> = tenants
                .iter()
                .rev()
                .map(|(i, _)| format!(r#"{{"op":"remove","path":"/subjects/{i}"}}"#))
                .collect();
            format!(
                "kubectl patch clusterrolebinding {} --type json -p '[{}]'",
                sh(name),
                ops.join(",")
            )
        };
        out.push(Finding::new(
            Row::TenantWritesDraInventory,
            objects,
            cause,
            fix,
        ));
    }
    out
}

/// The chart's node agent may write ResourceSlices, but no admission policy
/// keeps it to its own node's.
pub(crate) fn node_agent_slices_unconfined(v: &View<'_>) -> Vec<Finding> {
    let rbac = Rbac::new(v);
    let mut out = Vec::new();
    for account in &v.s.service_accounts {
        let meta = &account.metadata;
        if label(meta, PART_OF_LABEL) != Some(PART_OF)
            || label(meta, COMPONENT_LABEL) != Some(NODE_AGENT)
        {
            continue;
        }
        let (ns, name) = (namespace_of(meta), name_of(meta));
        let bindings: Vec<&ClusterRoleBinding> =
            v.s.cluster_role_bindings
                .iter()
                .filter(|b| {
                    b.subjects.iter().flatten().any(|s| {
                        s.kind == "ServiceAccount"
                            && s.name == name
                            && s.namespace.as_deref() == Some(ns)
                    }) && !writes(
                        &rbac.cluster_role_rules(&b.role_ref.name),
                        RESOURCE_GROUP,
                        "resourceslices",
                    )
                    .is_empty()
                })
                .collect();
        if bindings.is_empty() {
            continue;
        }
        let username = format!("system:serviceaccount:{ns}:{name}");
        let policies: Vec<&str> = v
            .s
            .admission_policies
            .iter()
            .filter(|p| {
                let Some(spec) = &p.spec else { return false };
                let names_agent = spec
                    .match_conditions
                    .iter()
                    .flatten()
                    .any(|c| c.expression.contains(&username));
                let covers_slices = spec
                    .match_constraints
                    .as_ref()
                    .and_then(|m| m.resource_rules.as_ref())
                    .into_iter()
                    .flatten()
                    .any(|r| {
                        let has = |list: &Option<Vec<String>>, want: &str| {
                            list.iter().flatten().any(|x| x == want || x == "*")
                        };
                        has(&r.api_groups, RESOURCE_GROUP) && has(&r.resources, "resourceslices")
                    });
                names_agent && covers_slices
            })
            .map(|p| name_of(&p.metadata))
            .collect();
        let enforced = policies.iter().any(|p| {
            v.s.admission_policy_bindings.iter().any(|b| {
                b.spec.policy_name == *p && b.spec.validation_actions.iter().any(|a| a == "Deny")
            })
        });
        if enforced {
            continue;
        }
        let expected = format!("{name}-own-node");
        let mut objects = vec![format!("ServiceAccount/{ns}/{name}")];
        objects.extend(
            bindings
                .iter()
                .map(|b| format!("ClusterRoleBinding/{}", name_of(&b.metadata))),
        );
        let cause = match policies.first() {
            None => {
                objects.push(format!("ValidatingAdmissionPolicy/{expected}"));
                format!(
                    "the node agent's ServiceAccount {ns}/{name} may write ResourceSlices, and RBAC cannot say \"only its own node's\": no ValidatingAdmissionPolicy matches its ResourceSlice writes (the chart's is {expected}), so an agent's token can publish or delete any node's inventory"
                )
            }
            Some(p) => {
                objects.push(format!("ValidatingAdmissionPolicy/{p}"));
                format!(
                    "the node agent's ServiceAccount {ns}/{name} may write ResourceSlices; ValidatingAdmissionPolicy {p} would keep it to its own node's, but no ValidatingAdmissionPolicyBinding binds it with validationActions Deny, so it is not enforced"
                )
            }
        };
        let release = label(meta, INSTANCE_LABEL).unwrap_or(PART_OF);
        out.push(Finding::new(
            Row::NodeAgentSlicesUnconfined,
            objects,
            cause,
            format!(
                "helm upgrade {} deploy/helm/switchyard -n {} --reuse-values --set nodeAgent.admissionPolicy.enabled=true",
                sh(release),
                sh(ns)
            ),
        ));
    }
    out
}

/// The write verbs `rules` grant on `group`/`resource` (`*` as itself).
fn writes(rules: &[&PolicyRule], group: &str, resource: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for rule in rules {
        let has = |list: &Option<Vec<String>>, want: &str| {
            list.iter().flatten().any(|x| x == want || x == "*")
        };
        if !has(&rule.api_groups, group) || !has(&rule.resources, resource) {
            continue;
        }
        for verb in &rule.verbs {
            if verb == "*" || WRITE_VERBS.contains(&verb.as_str()) {
                out.insert(verb.clone());
            }
        }
    }
    out
}

/// `Kind/name`, or `ServiceAccount/ns/name`.
fn subject_object(s: &Subject, binding_ns: Option<&str>) -> String {
    match s.kind.as_str() {
        "ServiceAccount" => format!(
            "ServiceAccount/{}/{}",
            s.namespace.as_deref().or(binding_ns).unwrap_or("default"),
            s.name
        ),
        kind => format!("{kind}/{}", s.name),
    }
}

/// The cluster's roles and bindings, read as the authorizer would.
struct Rbac<'v, 'a> {
    v: &'v View<'a>,
}

impl<'v, 'a> Rbac<'v, 'a> {
    fn new(v: &'v View<'a>) -> Self {
        Rbac { v }
    }

    /// A ClusterRole's rules: stored, and those of the roles it aggregates.
    fn cluster_role_rules(&self, name: &str) -> Vec<&'a PolicyRule> {
        let mut seen = BTreeSet::new();
        let mut out = Vec::new();
        self.collect(name, &mut seen, &mut out);
        out
    }

    fn collect(&self, name: &str, seen: &mut BTreeSet<String>, out: &mut Vec<&'a PolicyRule>) {
        if !seen.insert(name.to_string()) {
            return;
        }
        let Some(role) = self
            .v
            .s
            .cluster_roles
            .iter()
            .find(|r| name_of(&r.metadata) == name)
        else {
            return;
        };
        out.extend(role.rules.iter().flatten());
        let selectors = role
            .aggregation_rule
            .as_ref()
            .and_then(|a| a.cluster_role_selectors.as_ref());
        for selector in selectors.into_iter().flatten() {
            for other in &self.v.s.cluster_roles {
                if selects(selector, &other.metadata) {
                    self.collect(name_of(&other.metadata), seen, out);
                }
            }
        }
    }

    fn role_rules(&self, ns: &str, name: &str) -> Vec<&'a PolicyRule> {
        self.v
            .s
            .roles
            .iter()
            .filter(|r| namespace_of(&r.metadata) == ns && name_of(&r.metadata) == name)
            .flat_map(|r| r.rules.iter().flatten())
            .collect()
    }

    /// Not a system component, Switchyard or the GPU driver.
    fn is_tenant(&self, s: &Subject, binding_ns: Option<&str>) -> bool {
        match s.kind.as_str() {
            "ServiceAccount" => {
                let ns = s.namespace.as_deref().or(binding_ns).unwrap_or("default");
                self.is_tenant_account(ns, &s.name)
            }
            "User" => match s.name.strip_prefix("system:serviceaccount:") {
                Some(rest) => {
                    let (ns, name) = rest.split_once(':').unwrap_or((rest, ""));
                    self.is_tenant_account(ns, name)
                }
                None => !s.name.starts_with("system:"),
            },
            "Group" => {
                if EVERYONE.contains(&s.name.as_str()) {
                    return true;
                }
                match s.name.strip_prefix("system:serviceaccounts:") {
                    Some(ns) => ns != "kube-system" && !DRIVER_NAMESPACES.contains(&ns),
                    None => !s.name.starts_with("system:"),
                }
            }
            _ => true,
        }
    }

    fn is_tenant_account(&self, ns: &str, name: &str) -> bool {
        if ns == "kube-system" || DRIVER_NAMESPACES.contains(&ns) {
            return false;
        }
        let switchyard = self.v.s.service_accounts.iter().any(|a| {
            namespace_of(&a.metadata) == ns
                && name_of(&a.metadata) == name
                && label(&a.metadata, PART_OF_LABEL) == Some(PART_OF)
        });
        !switchyard
    }

    /// Tenants who may create ResourceClaims or ResourceClaimTemplates in `ns`,
    /// each with the binding that lets them.
    fn claim_creators(&self, ns: &str) -> Vec<String> {
        let creates = |rules: &[&PolicyRule]| {
            ["resourceclaims", "resourceclaimtemplates"]
                .iter()
                .any(|r| {
                    writes(rules, RESOURCE_GROUP, r)
                        .iter()
                        .any(|v| v == "create" || v == "*")
                })
        };
        let mut out = BTreeSet::new();
        for b in &self.v.s.cluster_role_bindings {
            if creates(&self.cluster_role_rules(&b.role_ref.name)) {
                for s in b
                    .subjects
                    .iter()
                    .flatten()
                    .filter(|s| self.is_tenant(s, None))
                {
                    out.insert(format!(
                        "{} (ClusterRoleBinding/{})",
                        subject_object(s, None),
                        name_of(&b.metadata)
                    ));
                }
            }
        }
        for b in self
            .v
            .s
            .role_bindings
            .iter()
            .filter(|b| namespace_of(&b.metadata) == ns)
        {
            let rules = match b.role_ref.kind.as_str() {
                "ClusterRole" => self.cluster_role_rules(&b.role_ref.name),
                _ => self.role_rules(ns, &b.role_ref.name),
            };
            if creates(&rules) {
                for s in b
                    .subjects
                    .iter()
                    .flatten()
                    .filter(|s| self.is_tenant(s, Some(ns)))
                {
                    out.insert(format!(
                        "{} (RoleBinding/{ns}/{})",
                        subject_object(s, Some(ns)),
                        name_of(&b.metadata)
                    ));
                }
            }
        }
        out.into_iter().collect()
    }
}

/// Whether a label selector selects an object; an empty selector selects
/// every object, as `LabelSelectorAsSelector` makes it for the aggregation
/// controller.
fn selects(selector: &LabelSelector, meta: &ObjectMeta) -> bool {
    let labels = meta.labels.clone().unwrap_or_default();
    let match_labels = selector.match_labels.as_ref();
    let expressions = selector.match_expressions.as_ref();
    match_labels
        .into_iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v))
        && expressions.into_iter().flatten().all(|e| {
            let values = e.values.as_deref().unwrap_or_default();
            match e.operator.as_str() {
                "In" => labels.get(&e.key).is_some_and(|v| values.contains(v)),
                "NotIn" => labels.get(&e.key).is_none_or(|v| !values.contains(v)),
                "Exists" => labels.contains_key(&e.key),
                "DoesNotExist" => !labels.contains_key(&e.key),
                _ => false,
            }
        })
}
