//! The results of a successful search: devices, configuration and node selector.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationConfiguration, DeviceAllocationResult, DeviceRequest,
    DeviceRequestAllocationResult, DeviceToleration,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as WireQuantity;

use super::{Picked, Run, fatal};
use crate::alloc::AllocateError;

impl Run<'_> {
    pub(super) fn results(&self) -> Result<Vec<AllocationResult>, AllocateError> {
        let mut out = Vec::with_capacity(self.claims.len());
        for (c, claim) in self.claims.iter().enumerate() {
            let requests = claim
                .spec
                .devices
                .as_ref()
                .and_then(|d| d.requests.as_deref())
                .unwrap_or_default();
            let results: Vec<DeviceRequestAllocationResult> = self.results[c]
                .iter()
                .map(|p| {
                    let device = self.device(p.loc);
                    let tolerations = self.lookup_tolerations(requests, p);
                    DeviceRequestAllocationResult {
                        request: match &p.parent {
                            Some(parent) => format!("{parent}/{}", p.request),
                            None => p.request.clone(),
                        },
                        driver: p.id.driver.to_string(),
                        pool: p.id.pool.to_string(),
                        device: p.id.device.to_string(),
                        admin_access: p.admin.then_some(true),
                        tolerations: tolerations.filter(|t| !t.is_empty()).map(<[_]>::to_vec),
                        share_id: p.share_id.clone(),
                        consumed_capacity: p.consumed.as_ref().map(|m| {
                            m.iter()
                                .map(|(k, v)| (k.clone(), WireQuantity(v.canonical())))
                                .collect()
                        }),
                        binding_conditions: device
                            .binding_conditions
                            .clone()
                            .filter(|v| !v.is_empty()),
                        binding_failure_conditions: device
                            .binding_failure_conditions
                            .clone()
                            .filter(|v| !v.is_empty()),
                    }
                })
                .collect();

            let mut config: Vec<DeviceAllocationConfiguration> = Vec::new();
            let mut class_ranges: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
            for (r, entry) in self.requests[c].iter().enumerate() {
                let _ = r;
                let data = &entry.alternatives[entry.selected];
                let class = data.class.metadata.name.as_deref().unwrap_or_default();
                if let Some(&(start, end)) = class_ranges.get(class) {
                    for item in &mut config[start..end] {
                        item.requests
                            .get_or_insert_with(Vec::new)
                            .push(data.full_name());
                    }
                    continue;
                }
                let start = config.len();
                for item in data.class.spec.config.iter().flatten() {
                    config.push(DeviceAllocationConfiguration {
                        source: "FromClass".into(),
                        requests: Some(vec![data.full_name()]),
                        opaque: item.opaque.clone(),
                    });
                }
                class_ranges.insert(class, (start, config.len()));
            }
            let claim_configs = claim
                .spec
                .devices
                .as_ref()
                .and_then(|d| d.config.as_deref())
                .unwrap_or_default();
            for item in claim_configs {
                let named = item.requests.as_deref().unwrap_or_default();
                let copy = || DeviceAllocationConfiguration {
                    source: "FromClaim".into(),
                    requests: item.requests.clone().filter(|r| !r.is_empty()),
                    opaque: item.opaque.clone(),
                };
                if named.is_empty() {
                    config.push(copy());
                    continue;
                }
                for (r, request) in requests.iter().enumerate() {
                    if named.contains(&request.name) {
                        config.push(copy());
                        continue;
                    }
                    let entry = &self.requests[c][r];
                    let data = &entry.alternatives[entry.selected];
                    if data.parent.is_some() && named.contains(&data.full_name()) {
                        config.push(copy());
                    }
                }
            }
            let node_name = self.node.metadata.name.clone().unwrap_or_default();
            let node_selector = self
                .node_selector(&self.results[c], &node_name)
                .map_err(|e| {
                    fatal(format!(
                        "create NodeSelector for claim {}: {e}",
                        claim.metadata.name.as_deref().unwrap_or_default()
                    ))
                })?;
            out.push(AllocationResult {
                allocation_timestamp: None,
                devices: Some(DeviceAllocationResult {
                    config: (!config.is_empty()).then_some(config),
                    results: (!results.is_empty()).then_some(results),
                }),
                node_selector,
            });
        }
        Ok(out)
    }

    fn lookup_tolerations<'r>(
        &self,
        requests: &'r [DeviceRequest],
        p: &Picked,
    ) -> Option<&'r [DeviceToleration]> {
        let name = p.parent.as_deref().unwrap_or(&p.request);
        let request = requests.iter().find(|r| r.name == name)?;
        match &p.parent {
            None => request.exactly.as_ref()?.tolerations.as_deref(),
            Some(_) => request
                .first_available
                .iter()
                .flatten()
                .find(|s| s.name == p.request)?
                .tolerations
                .as_deref(),
        }
    }

    fn node_selector(&self, picked: &[Picked], node: &str) -> Result<Option<NodeSelector>, String> {
        let mut fields: Vec<NodeSelectorRequirement> = Vec::new();
        let mut expressions: Vec<NodeSelectorRequirement> = Vec::new();
        for p in picked {
            let slice = &self.a.slices[p.loc.slice];
            let device = self.device(p.loc);
            let (name, selector) = if slice.per_device_node_selection {
                (device.node_name.as_ref(), device.node_selector.as_ref())
            } else {
                (slice.node_name.as_ref(), slice.node_selector.as_ref())
            };
            if name.is_some() || device.binds_to_node {
                return Ok(Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_fields: Some(vec![NodeSelectorRequirement {
                            key: "metadata.name".into(),
                            operator: "In".into(),
                            values: Some(vec![node.to_string()]),
                        }]),
                        match_expressions: None,
                    }],
                }));
            }
            if let Some(selector) = selector {
                match selector.node_selector_terms.as_slice() {
                    [] => {}
                    [term] => {
                        add_new(
                            term.match_fields.as_deref().unwrap_or_default(),
                            &mut fields,
                        );
                        add_new(
                            term.match_expressions.as_deref().unwrap_or_default(),
                            &mut expressions,
                        );
                    }
                    terms => {
                        return Err(format!(
                            "unsupported ResourceSlice.NodeSelector with {} terms",
                            terms.len()
                        ));
                    }
                }
            }
        }
        if fields.is_empty() && expressions.is_empty() {
            return Ok(None);
        }
        Ok(Some(NodeSelector {
            node_selector_terms: vec![NodeSelectorTerm {
                match_fields: (!fields.is_empty()).then_some(fields),
                match_expressions: (!expressions.is_empty()).then_some(expressions),
            }],
        }))
    }
}

fn add_new(from: &[NodeSelectorRequirement], to: &mut Vec<NodeSelectorRequirement>) {
    for requirement in from {
        let values: std::collections::BTreeSet<&String> =
            requirement.values.iter().flatten().collect();
        let present = to.iter().any(|e| {
            e.key == requirement.key
                && e.operator == requirement.operator
                && e.values
                    .iter()
                    .flatten()
                    .collect::<std::collections::BTreeSet<_>>()
                    == values
        });
        if !present {
            to.push(requirement.clone());
        }
    }
}
