//! What a service may do on the API server, as data: each service's crate
//! lists its permissions, the Helm chart's roles grant exactly those, and the
//! chart test compares the two, so the documented permissions and the Role
//! cannot drift apart.

/// Verbs on a resource in an API group (the core group is `""`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Permission {
    pub group: &'static str,
    /// A resource or a subresource, e.g. `pods/eviction`.
    pub resource: &'static str,
    pub verbs: &'static [&'static str],
    /// Only these objects (`resourceNames`); empty: any.
    pub names: &'static [&'static str],
}

/// Watching a kind: get, list, watch.
pub const READ: &[&str] = &["get", "list", "watch"];

impl Permission {
    /// `verbs` on `group`/`resource`.
    pub const fn new(
        group: &'static str,
        resource: &'static str,
        verbs: &'static [&'static str],
    ) -> Self {
        Permission {
            group,
            resource,
            verbs,
            names: &[],
        }
    }

    /// `verbs` on the objects `names` of `group`/`resource` only.
    pub const fn named(
        group: &'static str,
        resource: &'static str,
        verbs: &'static [&'static str],
        names: &'static [&'static str],
    ) -> Self {
        Permission {
            group,
            resource,
            verbs,
            names,
        }
    }

    /// Watching `group`/`resource`.
    pub const fn read(group: &'static str, resource: &'static str) -> Self {
        Permission::new(group, resource, READ)
    }
}
