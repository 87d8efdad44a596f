//! Workload placements: the part of a pod template an application move
//! rewrites (resources and the group node selector), and what a placement asks for.

use std::collections::BTreeMap;

use switchyard_proto::v1::{ResourceList, WorkloadPlacement};

use crate::names::{CLASS_RESOURCE_PREFIX, GROUP_LABEL, NVIDIA_GPU};

fn rewrite_list(list: &ResourceList, class: &str) -> ResourceList {
    let mut quantities = list.quantities.clone();
    if let Some(count) = quantities.remove(NVIDIA_GPU) {
        quantities.insert(format!("{CLASS_RESOURCE_PREFIX}{class}"), count);
    }
    ResourceList { quantities }
}

/// The manifest change of a move: the GPU request becomes the class's extended
/// resource, the binding to `source_group` goes; nothing else changes.
pub fn rewrite(before: &WorkloadPlacement, source_group: &str, class: &str) -> WorkloadPlacement {
    let lists = |lists: &BTreeMap<String, ResourceList>| {
        lists
            .iter()
            .map(|(container, list)| (container.clone(), rewrite_list(list, class)))
            .collect()
    };
    let mut node_selector = before.node_selector.clone();
    if node_selector
        .get(GROUP_LABEL)
        .is_some_and(|g| g == source_group)
    {
        node_selector.remove(GROUP_LABEL);
    }
    WorkloadPlacement {
        container_limits: lists(&before.container_limits),
        container_requests: lists(&before.container_requests),
        node_selector,
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
