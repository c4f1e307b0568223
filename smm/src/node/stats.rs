//! Counters and gauges, and which counter an error lands in.

use super::SmmNode;
use crate::{SmmError, SmmStats};

impl SmmNode {
    /// Counters and gauges.
    pub fn stats(&self) -> SmmStats {
        let mut s = self.stats;
        let (now, max) = self.memory.read_pending();
        s.read_pending = now as u64;
        s.read_pending_max = max as u64;
        s.markers_outstanding = self.markers_outstanding;
        s.rmw_unknown_functions = self.memory.unknown_functions();
        s
    }

    /// Input the node refused: malformed (`bad_input`) or over a table limit (`refused`).
    pub(super) fn count_input_error(&mut self, e: &SmmError) {
        match e {
            SmmError::BadInput(_) => self.stats.bad_input += 1,
            SmmError::Limit(_) => self.stats.refused += 1,
            _ => {}
        }
    }

    /// An operation that failed where it executed: counted, never returned (its place in the
    /// order was already decided).
    pub(super) fn count_exec_error(&mut self, e: &SmmError) {
        match e {
            SmmError::AssignWithoutSched(_) => self.stats.assigns_without_sched += 1,
            SmmError::NotACopy(_) | SmmError::Unmapped(_) => self.stats.not_a_copy += 1,
            _ => self.stats.bad_input += 1,
        }
    }
}
