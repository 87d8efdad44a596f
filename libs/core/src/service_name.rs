//! The six services of Switchyard by name: who owns a command, an effect or
//! a record.

use std::fmt;
use std::str::FromStr;

/// The six services of Switchyard.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ServiceName {
    Inventory,
    NodeAgent,
    StackAssigner,
    ClassCompiler,
    ClaimAllocator,
    Alerter,
}

impl ServiceName {
    /// Every service, in the order the runtime lists them.
    pub const ALL: [ServiceName; 6] = [
        ServiceName::Inventory,
        ServiceName::NodeAgent,
        ServiceName::StackAssigner,
        ServiceName::ClassCompiler,
        ServiceName::ClaimAllocator,
        ServiceName::Alerter,
    ];

    /// The services that decide on the log, in the order they see a record:
    /// fixed, so the log is too.
    pub const DISPATCH_ORDER: [ServiceName; 4] = [
        ServiceName::StackAssigner,
        ServiceName::ClassCompiler,
        ServiceName::ClaimAllocator,
        ServiceName::Alerter,
    ];

    /// The name as it appears in the log's `actor`, flags and object names.
    pub const fn as_str(self) -> &'static str {
        match self {
            ServiceName::Inventory => "inventory",
            ServiceName::NodeAgent => "node-agent",
            ServiceName::StackAssigner => "stack-assigner",
            ServiceName::ClassCompiler => "class-compiler",
            ServiceName::ClaimAllocator => "claim-allocator",
            ServiceName::Alerter => "alerter",
        }
    }
}

impl fmt::Display for ServiceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is not one of the six services.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownService(pub String);

impl fmt::Display for UnknownService {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} is not a service: expected one of inventory, node-agent, stack-assigner, class-compiler, claim-allocator, alerter",
            self.0
        )
    }
}

impl std::error::Error for UnknownService {}

impl FromStr for ServiceName {
    type Err = UnknownService;
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        ServiceName::ALL
            .into_iter()
            .find(|s| s.as_str() == name)
            .ok_or_else(|| UnknownService(name.to_string()))
    }
}
