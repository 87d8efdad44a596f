//! Consumable capacity: what a request consumes of a shareable device under
//! the device's request policy, and whether it still fits.

use std::collections::BTreeMap;

use crate::quantity::{Format, Quantity};

use super::{Capacity, Policy, Range};

/// Capacity per name (a device's consumed or requested capacity).
pub(crate) type Amounts = BTreeMap<String, Quantity>;

/// What a request consumes of one capacity: its request rounded up to the
/// policy, or the policy's default (else the whole capacity) when it asks
/// for nothing.
pub(crate) fn consumed(requested: Option<&Quantity>, capacity: &Capacity) -> Quantity {
    let Some(requested) = requested else {
        return match capacity.policy.as_ref().and_then(|p| p.default.clone()) {
            Some(default) => default,
            None => capacity.value.clone(),
        };
    };
    let Some(policy) = &capacity.policy else {
        return requested.clone();
    };
    if let Some(range @ Range { min: Some(min), .. }) = &policy.range {
        return round_up_range(requested, min, range.step.as_ref());
    }
    if !policy.valid_values.is_empty() {
        return policy
            .valid_values
            .iter()
            .find(|v| requested <= *v)
            .cloned()
            .unwrap_or_else(|| requested.clone());
    }
    requested.clone()
}

fn round_up_range(requested: &Quantity, min: &Quantity, step: Option<&Quantity>) -> Quantity {
    if requested < min {
        return min.clone();
    }
    let Some(step) = step else {
        return requested.clone();
    };
    let (value, step, min) = (
        requested.value_rounded_up(),
        step.value_rounded_up(),
        min.value_rounded_up(),
    );
    let added = value.wrapping_sub(min);
    let mut n = added.checked_div(step).unwrap_or(0);
    if added.checked_rem(step).unwrap_or(0) != 0 {
        n += 1;
    }
    Quantity::from_parts(min.wrapping_add(step.wrapping_mul(n)), 0, Format::BinarySI)
}

/// Whether `value` breaks the policy (a default is always allowed).
fn violates(value: &Quantity, policy: Option<&Policy>) -> bool {
    let Some(policy) = policy else {
        return false;
    };
    if policy.default.as_ref() == Some(value) {
        return false;
    }
    if let Some(range) = &policy.range {
        if range.max.as_ref().is_some_and(|max| value > max) {
            return true;
        }
        if let Some(step) = &range.step {
            let min = range.min.as_ref().map_or(0, Quantity::value_rounded_up);
            let added = value.value_rounded_up().wrapping_sub(min);
            return added.checked_rem(step.value_rounded_up()).unwrap_or(0) != 0;
        }
        return false;
    }
    !policy.valid_values.is_empty() && !policy.valid_values.iter().any(|v| v == value)
}

/// Why a request does not fit a device's capacities.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Misfit {
    /// The request names a capacity the device does not have.
    Undefined,
    /// The request breaks a request policy.
    Policy(String),
    /// Not enough is left of a capacity.
    Exhausted(String),
}

/// `CmpRequestOverCapacity`: whether `requests` fits `capacities` on top of
/// what existing allocations (`allocated`) and this attempt (`allocating`)
/// already consume.
pub(crate) fn fits(
    allocated: Option<&Amounts>,
    requests: Option<&Amounts>,
    capacities: &BTreeMap<String, Capacity>,
    allocating: Option<&Amounts>,
) -> Result<(), Misfit> {
    if requests.is_some_and(|r| r.keys().any(|name| !capacities.contains_key(name))) {
        return Err(Misfit::Undefined);
    }
    for (name, capacity) in capacities {
        let consumed = consumed(requests.and_then(|r| r.get(name)), capacity);
        if violates(&consumed, capacity.policy.as_deref()) {
            return Err(Misfit::Policy(name.clone()));
        }
        let mut total = match allocated.and_then(|a| a.get(name)) {
            Some(already) => already.add(&consumed),
            None => consumed,
        };
        if let Some(more) = allocating.and_then(|a| a.get(name)) {
            total = total.add(more);
        }
        if total > capacity.value {
            return Err(Misfit::Exhausted(name.clone()));
        }
    }
    Ok(())
}

/// What a request consumes of each capacity of a shareable device.
pub(crate) fn consumed_all(
    requests: Option<&Amounts>,
    capacities: &BTreeMap<String, Capacity>,
) -> Amounts {
    capacities
        .iter()
        .map(|(name, c)| {
            (
                name.clone(),
                consumed(requests.and_then(|r| r.get(name)), c),
            )
        })
        .collect()
}
