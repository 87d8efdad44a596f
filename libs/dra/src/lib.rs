//! The DRA engine: [`quantity`], Kubernetes resource quantities done exactly
//! (the capacities and selectors of DRA devices are quantities); [`cel`],
//! device selectors evaluated as Kubernetes evaluates them; and [`alloc`], the
//! structured allocator with the scheduler's semantics and search order.

#![forbid(unsafe_code)]

pub mod alloc;
pub mod cel;
pub mod input;
pub mod quantity;

pub use quantity::{Format, ParseError, Quantity};
