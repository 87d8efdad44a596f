//! A claim's `matchAttribute` / `distinctAttribute` constraints, kept as devices are picked.

use std::collections::BTreeMap;

use crate::alloc::Device;

/// A `matchAttribute` or `distinctAttribute` constraint of a claim.
pub(crate) struct Constraint {
    pub(super) requests: Vec<String>,
    pub(super) attribute: String,
    pub(super) distinct: bool,
    /// matchAttribute: the first device's value; distinctAttribute: the
    /// values seen, keyed by request name as Kubernetes keys them.
    pub(super) values: BTreeMap<String, crate::cel::Attribute>,
    pub(super) count: usize,
}

impl Constraint {
    fn applies(&self, request: &str, sub: Option<&str>) -> bool {
        self.requests.is_empty()
            || self.requests.iter().any(|r| r == request)
            || sub.is_some_and(|s| self.requests.iter().any(|r| *r == format!("{request}/{s}")))
    }

    pub(super) fn add(
        &mut self,
        request: &str,
        sub: Option<&str>,
        driver: &str,
        device: &Device,
    ) -> bool {
        if !self.applies(request, sub) {
            return true;
        }
        let Some(value) = lookup_attribute(device, driver, &self.attribute) else {
            return false;
        };
        if self.count == 0 {
            self.values.insert(request.to_string(), value.clone());
            self.count = 1;
            return true;
        }
        let same = |a: &crate::cel::Attribute, b: &crate::cel::Attribute| a == b;
        if self.distinct {
            if self.values.values().any(|seen| same(seen, value)) {
                return false;
            }
            self.values.insert(request.to_string(), value.clone());
        } else if !self
            .values
            .values()
            .next()
            .is_some_and(|first| same(first, value))
        {
            return false;
        }
        self.count += 1;
        true
    }

    pub(super) fn remove(&mut self, request: &str, sub: Option<&str>) {
        if !self.applies(request, sub) {
            return;
        }
        if self.distinct {
            self.values.remove(request);
        }
        self.count -= 1;
        if !self.distinct && self.count == 0 {
            self.values.clear();
        }
    }
}

/// The attribute a constraint names: fully qualified, or under the driver's
/// domain when the device publishes it unqualified.
pub(crate) fn lookup_attribute<'d>(
    device: &'d Device,
    driver: &str,
    name: &str,
) -> Option<&'d crate::cel::Attribute> {
    if let Some(v) = device.cel.attributes.get(name) {
        return Some(v);
    }
    let (domain, short) = name.split_once('/')?;
    if domain != driver {
        return None;
    }
    device.cel.attributes.get(short)
}
