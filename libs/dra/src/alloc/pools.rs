//! Gathering the pools a node can use (`GatherPools`): the newest generation
//! of each pool, complete or marked incomplete, invalid pools marked with
//! their reason, sorted by driver and pool name with pools whose devices have
//! binding conditions last.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;

use super::nodes::node_matches;
use super::{Allocator, Counters};

#[derive(Debug)]
pub(crate) struct Pool {
    pub driver: Arc<str>,
    pub pool: Arc<str>,
    pub incomplete: bool,
    pub invalid: Option<String>,
    /// Slices with devices that target the node, by name.
    pub slices: Vec<usize>,
    /// Slices of the pool that do not target the node (their devices still
    /// consume the pool's counters).
    pub other_slices: Vec<usize>,
    pub counter_sets: Counters,
}

impl Pool {
    pub fn id(&self) -> String {
        format!("{}/{}", self.driver, self.pool)
    }

    fn marked(
        driver: &Arc<str>,
        pool: &Arc<str>,
        incomplete: bool,
        invalid: Option<String>,
    ) -> Pool {
        Pool {
            driver: driver.clone(),
            pool: pool.clone(),
            incomplete,
            invalid,
            slices: Vec::new(),
            other_slices: Vec::new(),
            counter_sets: BTreeMap::new(),
        }
    }
}

/// [`gather`], remembered per node and its labels.
pub(crate) fn gathered(a: &Allocator, node: &Node) -> Result<Arc<Vec<Arc<Pool>>>, String> {
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let none = BTreeMap::new();
    let labels = node.metadata.labels.as_ref().unwrap_or(&none);
    if let Some((seen, pools)) = a.gathered.lock().expect("pools cache").get(name)
        && seen == labels
    {
        return Ok(pools.clone());
    }
    let pools = Arc::new(gather(a, node)?);
    a.gathered
        .lock()
        .expect("pools cache")
        .insert(name.to_string(), (labels.clone(), pools.clone()));
    Ok(pools)
}

fn gather(a: &Allocator, node: &Node) -> Result<Vec<Arc<Pool>>, String> {
    let node_name = node.metadata.name.as_deref().unwrap_or_default();
    let for_node = a
        .slices_on_node
        .get(node_name)
        .into_iter()
        .flatten()
        .chain(&a.slices_shared);
    // Pool → slices of its newest generation, in the order they were met.
    let mut pools: HashMap<(Arc<str>, Arc<str>), Vec<usize>> = HashMap::new();
    for &i in for_node {
        let s = &a.slices[i];
        let relevant = if !s.shared_counters.is_empty() {
            true
        } else if s.node_name.as_deref().is_some_and(|n| !n.is_empty())
            || s.all_nodes
            || s.node_selector.is_some()
        {
            node_matches(
                node,
                s.node_name.as_deref(),
                s.all_nodes,
                s.node_selector.as_ref(),
            )
            .map_err(|e| format!("failed to perform node selection for slice {}: {e}", s.name))?
        } else if s.per_device_node_selection {
            let mut any = false;
            for d in &s.devices {
                if node_matches(
                    node,
                    d.node_name.as_deref(),
                    d.all_nodes,
                    d.node_selector.as_ref(),
                )
                .map_err(|e| {
                    format!(
                        "failed to perform node selection for device {} in slice {}: {e}",
                        d.name, s.name
                    )
                })? {
                    any = true;
                    break;
                }
            }
            any
        } else {
            continue;
        };
        if !relevant {
            continue;
        }
        let entry = pools.entry((s.driver.clone(), s.pool.clone())).or_default();
        match entry.first().map(|&f| a.slices[f].generation) {
            Some(g) if s.generation < g => {}
            Some(g) if s.generation > g => *entry = vec![i],
            _ => entry.push(i),
        }
    }

    let mut result = Vec::with_capacity(pools.len());
    let mut with_binding_conditions = Vec::new();
    for ((driver, pool), members) in pools {
        let first = &a.slices[members[0]];
        let built = if members.len() as i64 == first.slice_count {
            built(a, &driver, &pool, members, None)
        } else {
            // Slices for other nodes may complete the pool, unless a newer
            // generation exists somewhere.
            let mut all = Vec::new();
            let mut obsolete = false;
            for &i in a
                .by_pool
                .get(&(driver.clone(), pool.clone()))
                .into_iter()
                .flatten()
            {
                let s = &a.slices[i];
                if s.generation == first.generation {
                    all.push(i);
                } else if s.generation > first.generation {
                    obsolete = true;
                    break;
                }
            }
            if obsolete {
                continue;
            }
            if all.len() as i64 != first.slice_count {
                result.push(Arc::new(Pool::marked(&driver, &pool, true, None)));
                continue;
            }
            built(a, &driver, &pool, members, Some(all))
        };
        if built.slices.iter().any(|&i| {
            a.slices[i]
                .devices
                .iter()
                .any(|d| d.binding_conditions.is_some())
        }) {
            with_binding_conditions.push(built);
        } else {
            result.push(built);
        }
    }
    let by_id = |p: &Arc<Pool>, q: &Arc<Pool>| (&p.driver, &p.pool).cmp(&(&q.driver, &q.pool));
    result.sort_by(by_id);
    with_binding_conditions.sort_by(by_id);
    result.extend(with_binding_conditions);
    Ok(result)
}

/// [`build`], remembered: a pool made of the same slices is the same pool
/// for every node (most pools a node sees are other nodes' counter pools).
fn built(
    a: &Allocator,
    driver: &Arc<str>,
    pool: &Arc<str>,
    mut members: Vec<usize>,
    all: Option<Vec<usize>>,
) -> Arc<Pool> {
    members.sort_unstable();
    let key = (members.clone(), all.is_some());
    if let Some(hit) = a.built.lock().expect("pools cache").get(&key) {
        return hit.clone();
    }
    let made = Arc::new(build(a, driver, pool, members, all));
    a.built
        .lock()
        .expect("pools cache")
        .insert(key, made.clone());
    made
}

fn build(
    a: &Allocator,
    driver: &Arc<str>,
    pool: &Arc<str>,
    mut members: Vec<usize>,
    all: Option<Vec<usize>>,
) -> Pool {
    members.sort_by(|&x, &y| a.slices[x].name.cmp(&a.slices[y].name));
    let (counter_slices, device_slices): (Vec<usize>, Vec<usize>) = members
        .iter()
        .partition(|&&i| !a.slices[i].shared_counters.is_empty());
    let invalid = |reason: String| Pool::marked(driver, pool, false, Some(reason));

    let mut names = BTreeSet::new();
    for &i in &device_slices {
        for d in &a.slices[i].devices {
            if !names.insert(&d.name) {
                return invalid(format!("duplicate device name {}", d.name));
            }
        }
    }
    let mut counter_sets: Counters = BTreeMap::new();
    for &i in &counter_slices {
        for (name, counters) in &a.slices[i].shared_counters {
            if counter_sets.contains_key(name) {
                return invalid(format!("duplicate counter set name {name}"));
            }
            counter_sets.insert(name.clone(), counters.clone());
        }
    }
    if let Err(reason) = check_consumption(a, &counter_sets, &members) {
        return invalid(reason);
    }
    let mut other_slices = Vec::new();
    if let Some(all) = all.filter(|all| all.len() != members.len()) {
        let targeting: BTreeSet<&str> =
            members.iter().map(|&i| a.slices[i].name.as_str()).collect();
        other_slices = all
            .into_iter()
            .filter(|&i| !targeting.contains(a.slices[i].name.as_str()))
            .collect();
        if let Err(reason) = check_consumption(a, &counter_sets, &other_slices) {
            return invalid(reason);
        }
    }
    Pool {
        driver: driver.clone(),
        pool: pool.clone(),
        incomplete: false,
        invalid: None,
        slices: device_slices,
        other_slices,
        counter_sets,
    }
}

fn check_consumption(a: &Allocator, sets: &Counters, slices: &[usize]) -> Result<(), String> {
    for &i in slices {
        for d in &a.slices[i].devices {
            for (set, counters) in &d.consumes {
                let Some(available) = sets.get(set) else {
                    return Err(format!("counter set {set} not found"));
                };
                for name in counters.keys() {
                    if !available.contains_key(name) {
                        return Err(format!("counter {name} not found in counter set {set}"));
                    }
                }
            }
        }
    }
    Ok(())
}
