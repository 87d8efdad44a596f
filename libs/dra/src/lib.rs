//! The DRA engine. So far: [`quantity`], Kubernetes resource quantities done
//! exactly (the capacities and selectors of DRA devices are quantities), and
//! [`cel`], device selectors evaluated as Kubernetes evaluates them.

#![forbid(unsafe_code)]

pub mod cel;
pub mod quantity;

pub use quantity::{Format, ParseError, Quantity};
