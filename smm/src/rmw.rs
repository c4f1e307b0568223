//! Atomic read-modify-write operations (`add`, `compare_and_swap`, `apply`): every copy of the
//! variable executes them at the sref's place in the order and one copy answers the issuer
//! with the value it found. Because every copy runs the same deterministic operations in the
//! same order, replicas agree without `sched`/`assign`.
//!
//! `apply` runs a function the application registered under a number with
//! [`crate::SmmNode::register_rmw`]. It must be pure (the result depends only on the old value
//! and the argument) and registered under the same number on every host, or copies diverge.

use isotach_proto::packet::{RmwOp, Width};
use std::collections::HashMap;

/// A registered `apply` function: the new value from the old one and the argument.
pub type RmwFn = fn(old: u64, arg: u64) -> u64;

/// Most functions one node registers.
pub const RMW_FUNCTIONS_MAX: usize = 256;

/// The functions `apply` may name, by number.
#[derive(Debug, Clone, Default)]
pub struct RmwFunctions {
    by_number: HashMap<u16, RmwFn>,
}

impl RmwFunctions {
    /// Registers `f` as function `func` (replacing one of the same number). False when
    /// [`RMW_FUNCTIONS_MAX`] others are registered already.
    pub fn register(&mut self, func: u16, f: RmwFn) -> bool {
        if self.by_number.len() >= RMW_FUNCTIONS_MAX && !self.by_number.contains_key(&func) {
            return false;
        }
        self.by_number.insert(func, f);
        true
    }

    /// Whether function `func` is registered.
    pub fn knows(&self, func: u16) -> bool {
        self.by_number.contains_key(&func)
    }

    /// The value `op` leaves in a variable of `width` that held `old` (narrowed to the width
    /// on the way in and out); `None` for an `apply` of a function not registered here.
    pub fn new_value(&self, op: RmwOp, width: Width, old: u64, arg: u64, arg2: u64) -> Option<u64> {
        let old = old & width.max_value();
        let new = match op {
            RmwOp::Apply(func) => self.by_number.get(&func).map(|f| f(old, arg)),
            built_in => built_in.built_in(width, old, arg, arg2),
        }?;
        Some(new & width.max_value())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn functions_apply_narrowed_and_unknown_ones_are_none() {
        let mut f = RmwFunctions::default();
        assert!(f.register(3, |old, arg| old.wrapping_mul(arg)));
        assert!(f.knows(3) && !f.knows(4));
        assert_eq!(
            f.new_value(RmwOp::Apply(3), Width::W32, 1 << 31, 4, 0),
            Some(0),
            "wrapped to 32 bits"
        );
        assert_eq!(f.new_value(RmwOp::Apply(4), Width::W64, 1, 1, 0), None);
        assert_eq!(f.new_value(RmwOp::Add, Width::W64, 1, 2, 0), Some(3));
        for i in 0..RMW_FUNCTIONS_MAX as u16 {
            f.register(i, |o, _| o);
        }
        assert!(!f.register(9999, |o, _| o), "the table is bounded");
        assert!(f.register(3, |o, _| o), "replacing one is fine");
    }
}
