//! The DRA engine. So far: [`quantity`], Kubernetes resource quantities done
//! exactly (the capacities and selectors of DRA devices are quantities).

#![forbid(unsafe_code)]

pub mod quantity;

pub use quantity::{Format, ParseError, Quantity};
