//! Each service's core: the one place that knows which core type decides for
//! which service.

use crate::alerter::Alerter;
use crate::claim_allocator::ClaimAllocator;
use crate::class_compiler::ClassCompiler;
use crate::inventory::ObserverCore;
use crate::service::{Core, ServiceName};
use crate::stack_assigner::StackAssigner;

impl ServiceName {
    /// A fresh core of this service.
    pub fn core(self) -> Box<dyn Core> {
        match self {
            ServiceName::Inventory | ServiceName::NodeAgent => Box::new(ObserverCore::new(self)),
            ServiceName::StackAssigner => Box::new(StackAssigner::default()),
            ServiceName::ClassCompiler => Box::new(ClassCompiler::default()),
            ServiceName::ClaimAllocator => Box::new(ClaimAllocator::default()),
            ServiceName::Alerter => Box::new(Alerter::default()),
        }
    }
}

/// One fresh core of each service, in [`ServiceName::ALL`]'s order.
pub fn all() -> Vec<Box<dyn Core>> {
    ServiceName::ALL
        .into_iter()
        .map(ServiceName::core)
        .collect()
}
