//! Workload placements: the part of a pod template an application move
//! rewrites (resources, the group node selector, tolerations), and what a
//! placement asks for.

use std::collections::BTreeMap;

use switchyard_proto::v1::{ResourceList, Taint, Toleration, WorkloadPlacement};

use crate::names::{CLASS_RESOURCE_PREFIX, NVIDIA_GPU};

fn rewrite_list(list: &ResourceList, class: &str) -> ResourceList {
    let mut quantities = list.quantities.clone();
    if let Some(count) = quantities.remove(NVIDIA_GPU) {
        quantities.insert(format!("{CLASS_RESOURCE_PREFIX}{class}"), count);
    }
    ResourceList { quantities }
}

/// Whether `toleration` tolerates `taint`, as the scheduler matches them.
pub fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    let effect = toleration.effect.is_empty() || toleration.effect == taint.effect;
    let key = match toleration.operator.as_str() {
        "Exists" => toleration.key.is_empty() || toleration.key == taint.key,
        _ => toleration.key == taint.key && toleration.value == taint.value,
    };
    effect && key
}

/// The toleration a moved workload gets for `taint`: key, value and effect.
pub fn toleration_for(taint: &Taint) -> Toleration {
    Toleration {
        key: taint.key.clone(),
        operator: "Equal".into(),
        value: taint.value.clone(),
        effect: taint.effect.clone(),
        toleration_seconds: None,
    }
}

/// The manifest change of a move: the GPU request becomes the class's extended
/// resource, the binding to `source_group` (its `group_label`) goes, and with
/// `taint` (the nvidia-operator backend's pilot taint on DRA nodes) a
/// toleration for it is added unless one tolerates it already; nothing else
/// changes. Tolerations not recorded (an old record) are left as they are.
pub fn rewrite(
    before: &WorkloadPlacement,
    group_label: &str,
    source_group: &str,
    class: &str,
    taint: Option<&Taint>,
) -> WorkloadPlacement {
    let lists = |lists: &BTreeMap<String, ResourceList>| {
        lists
            .iter()
            .map(|(container, list)| (container.clone(), rewrite_list(list, class)))
            .collect()
    };
    let mut node_selector = before.node_selector.clone();
    if node_selector
        .get(group_label)
        .is_some_and(|g| g == source_group)
    {
        node_selector.remove(group_label);
    }
    let mut tolerations = before.tolerations.clone();
    if let (Some(taint), Some(list)) = (taint, tolerations.as_mut())
        && !list.items.iter().any(|t| tolerates(t, taint))
    {
        list.items.push(toleration_for(taint));
    }
    WorkloadPlacement {
        container_limits: lists(&before.container_limits),
        container_requests: lists(&before.container_requests),
        node_selector,
        tolerations,
    }
}

/// Whether the placement still asks for device-plugin GPUs.
pub fn requests_nvidia_gpu(placement: &WorkloadPlacement) -> bool {
    placement
        .container_limits
        .values()
        .chain(placement.container_requests.values())
        .any(|list| list.quantities.contains_key(NVIDIA_GPU))
}
