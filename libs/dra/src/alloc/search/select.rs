//! Whether a device may serve a request: selectors (cached), per-device node selection, capacity.

use super::{Loc, RequestData, Run, fatal};
use crate::alloc::capacity;
use crate::alloc::nodes::node_matches;
use crate::alloc::{AllocateError, SelectorFailure, claim_name};

impl<'a> Run<'a> {
    /// Class and request selectors, and per-device node selection; cached.
    pub fn selectable(
        &self,
        key: (usize, usize, usize),
        data: &RequestData<'a>,
        loc: Loc,
    ) -> Result<bool, AllocateError> {
        if let Some(&hit) = self.matches.borrow().get(&(loc, key.0, key.1, key.2)) {
            return Ok(hit);
        }
        let verdict = self.selectable_uncached(key.0, data, loc)?;
        self.matches
            .borrow_mut()
            .insert((loc, key.0, key.1, key.2), verdict);
        Ok(verdict)
    }

    fn selectable_uncached(
        &self,
        c: usize,
        data: &RequestData<'a>,
        loc: Loc,
    ) -> Result<bool, AllocateError> {
        let device = self.device(loc);
        let class_name = data.class.metadata.name.as_deref().unwrap_or_default();
        for (i, compiled) in &data.class_compiled {
            match self.a.matches_compiled(compiled, device) {
                Ok(true) => {}
                Ok(false) => return Ok(false),
                Err(SelectorFailure::Compile(e)) => {
                    return Err(fatal(format!(
                        "class {class_name}: selector #{i}: CEL compile error: {e}"
                    )));
                }
                Err(SelectorFailure::Runtime(e)) => {
                    return Err(fatal(format!(
                        "class {class_name}: selector #{i}: CEL runtime error: {e}"
                    )));
                }
            }
        }
        let claim = || claim_name(self.claims[c]);
        for (i, compiled) in data.compiled.iter().enumerate() {
            match self.a.matches_compiled(compiled, device) {
                Ok(true) => {}
                Ok(false) => return Ok(false),
                Err(SelectorFailure::Compile(e)) => {
                    return Err(fatal(format!(
                        "claim {}: selector #{i}: CEL compile error: {e}",
                        claim()
                    )));
                }
                Err(SelectorFailure::Runtime(e)) => {
                    return Err(fatal(format!(
                        "claim {}: selector #{i}: CEL runtime error: {e}",
                        claim()
                    )));
                }
            }
        }
        if self.a.slices[loc.slice].per_device_node_selection {
            return node_matches(
                self.node,
                device.node_name.as_deref(),
                device.all_nodes,
                device.node_selector.as_ref(),
            )
            .map_err(fatal);
        }
        Ok(true)
    }

    pub fn capacity_fits(&self, data: &RequestData<'a>, loc: Loc) -> Result<(), capacity::Misfit> {
        let id = self.device_id(loc);
        capacity::fits(
            self.a.state.capacity.get(&id),
            data.capacity.as_ref(),
            &self.device(loc).capacity,
            self.allocating_capacity.get(&id),
        )
    }
}
