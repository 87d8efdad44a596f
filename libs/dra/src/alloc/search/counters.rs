//! Shared counters of partitionable devices: what a pool has left, reserved and released.

use std::sync::Arc;

use super::{Loc, Run};
use crate::alloc::Counters;
use crate::alloc::pools::Pool;

impl Run<'_> {
    /// Counters left in the device's pool after existing allocations.
    pub fn available_counters(&self, pool: &Pool) -> Arc<Counters> {
        let mut cache = self.a.available_counters.lock().expect("counters cache");
        cache
            .entry(pool.pool.clone())
            .or_insert_with(|| {
                let mut available = pool.counter_sets.clone();
                for &s in pool.slices.iter().chain(&pool.other_slices) {
                    let slice = &self.a.slices[s];
                    for (d, device) in slice.devices.iter().enumerate() {
                        if device.consumes.is_empty()
                            || !self.a.state.is_allocated(&slice.device_id(d))
                        {
                            continue;
                        }
                        for (set, counters) in &device.consumes {
                            let Some(set) = available.get_mut(set) else {
                                continue;
                            };
                            for (name, q) in counters {
                                if let Some(v) = set.get_mut(name) {
                                    *v = v.sub(q);
                                }
                            }
                        }
                    }
                }
                Arc::new(available)
            })
            .clone()
    }

    pub(super) fn reserve_counters(&mut self, loc: Loc) -> bool {
        let available = self.available_counters(&self.pools[loc.pool]);
        let device = self.device(loc);
        let consumed = self
            .consumed_counters
            .entry(self.pools[loc.pool].pool.clone())
            .or_default();
        for (set, counters) in &device.consumes {
            let set = consumed.entry(set.clone()).or_default();
            for (name, q) in counters {
                let sum = set.get(name).map_or(q.clone(), |s| s.add(q));
                set.insert(name.clone(), sum);
            }
        }
        let zero = crate::Quantity::zero();
        let exhausted = available.iter().any(|(set, counters)| {
            counters.iter().any(|(name, left)| {
                let used = consumed.get(set).and_then(|s| s.get(name)).unwrap_or(&zero);
                left < used
            })
        });
        if exhausted {
            self.release_counters(loc);
            return false;
        }
        true
    }

    pub(super) fn release_counters(&mut self, loc: Loc) {
        let device = self.device(loc);
        let Some(consumed) = self.consumed_counters.get_mut(&self.pools[loc.pool].pool) else {
            return;
        };
        for (set, counters) in &device.consumes {
            let set = consumed.entry(set.clone()).or_default();
            for (name, q) in counters {
                let left = set
                    .get(name)
                    .map_or_else(|| crate::Quantity::zero().sub(q), |s| s.sub(q));
                set.insert(name.clone(), left);
            }
        }
    }
}
