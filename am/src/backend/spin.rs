//! Spin-then-sleep: a wait that traffic is likely to end soon keeps its thread on the CPU for
//! a short while before it sleeps in the kernel.
//!
//! Why: under load a daemon's wait usually ends tens of microseconds later (the next token,
//! the next batch). Sleeping costs a wake-up on both sides — the sender's `sendmsg` runs the
//! scheduler to wake the sleeper, the sleeper's CPU may idle (on a VM a halt and an exit to
//! the hypervisor) and come back — and on a 2-core VM that was a third of all CPU under the
//! transfers load. A thread that yields and polls instead stays runnable: whoever it waits
//! for runs in its place and the datagram is picked up without a wake-up.
//!
//! When: only while waits are short. Idle waves come milliseconds apart; spinning before
//! each would turn an idle daemon's few percent of a core into many. So the policy spins
//! only when the previous wait was served within [`WARM_FACTOR`] × the budget.

use std::io;
use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use super::poll_readable;

/// A wait served within this many spin budgets means traffic is flowing: the next one spins.
pub const WARM_FACTOR: u32 = 4;

/// The largest spin budget a configuration may ask for: beyond it a wait is a busy loop.
pub const SPIN_MAX: Duration = Duration::from_millis(1);

/// The default spin budget.
pub const SPIN_DEFAULT: Duration = Duration::from_micros(50);

/// Whether and how long the next wait spins (sans-IO: the caller reads the clock).
#[derive(Clone, Copy, Debug)]
pub struct SpinPolicy {
    budget: Duration,
    warm: bool,
}

impl SpinPolicy {
    /// Spin up to `budget` (clamped to [`SPIN_MAX`]; zero: never spin).
    pub fn new(budget: Duration) -> Self {
        Self {
            budget: budget.min(SPIN_MAX),
            warm: false,
        }
    }

    /// How long the next wait may spin before it sleeps (zero: sleep at once).
    pub fn spin_for(&self) -> Duration {
        if self.warm {
            self.budget
        } else {
            Duration::ZERO
        }
    }

    /// A wait ended: `served_after` is how long it took for data to arrive (`None`: it ended
    /// at its deadline with nothing).
    pub fn record(&mut self, served_after: Option<Duration>) {
        self.warm =
            !self.budget.is_zero() && served_after.is_some_and(|w| w <= self.budget * WARM_FACTOR);
    }
}

/// The spin half of spin-then-sleep: yields the CPU and checks whether `fd` is readable until
/// it is (`true`) or `until` passes (`false`). The check is a zero-timeout `poll`, which reads
/// the receive queue without its lock; a receive on every turn would take that lock against
/// the sender's enqueue and pick bulk datagrams up one by one.
pub fn until_readable(fd: BorrowedFd<'_>, until: Instant) -> io::Result<bool> {
    while Instant::now() < until {
        std::thread::yield_now();
        if poll_readable(fd, Some(Duration::ZERO))? {
            return Ok(true);
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    #[test]
    fn a_cold_policy_sleeps_at_once() {
        let p = SpinPolicy::new(50 * US);
        assert_eq!(p.spin_for(), Duration::ZERO);
    }

    #[test]
    fn short_waits_make_it_spin_and_long_ones_or_timeouts_stop_it() {
        let mut p = SpinPolicy::new(50 * US);
        p.record(Some(30 * US));
        assert_eq!(p.spin_for(), 50 * US);
        p.record(Some(200 * US));
        assert_eq!(p.spin_for(), 50 * US, "4 budgets is still traffic");
        p.record(Some(201 * US));
        assert_eq!(p.spin_for(), Duration::ZERO, "an idle wave's gap");
        p.record(Some(US));
        p.record(None);
        assert_eq!(p.spin_for(), Duration::ZERO, "a deadline is not traffic");
    }

    #[test]
    fn a_zero_budget_never_spins_and_the_budget_is_bounded() {
        let mut p = SpinPolicy::new(Duration::ZERO);
        p.record(Some(Duration::ZERO));
        assert_eq!(p.spin_for(), Duration::ZERO);
        let mut p = SpinPolicy::new(Duration::from_secs(1));
        p.record(Some(Duration::ZERO));
        assert_eq!(p.spin_for(), SPIN_MAX);
    }
}
