//! The stack a node is assigned, as its `node.deckhouse.io/gpu-stack` label
//! names it.

/// The stack a node is assigned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stack {
    Dra,
    DevicePlugin,
}

impl Stack {
    /// Its value of the node label `node.deckhouse.io/gpu-stack`.
    pub fn label(self) -> &'static str {
        match self {
            Stack::Dra => "dra",
            Stack::DevicePlugin => "device-plugin",
        }
    }

    pub fn from_label(value: &str) -> Option<Stack> {
        [Stack::Dra, Stack::DevicePlugin]
            .into_iter()
            .find(|s| s.label() == value)
    }
}
