//! Running a simulation: the next event, until a condition, a stall or an end time.

use super::{RunEnd, Sim};
use crate::host::{Host, Observer};

impl<H: Host, O: Observer> Sim<H, O> {
    /// Time of the next event.
    pub fn peek_time_us(&self) -> Option<u64> {
        self.queue.peek().map(|s| s.at_us)
    }

    /// Processes the next event; false when there is none.
    pub fn step(&mut self) -> bool {
        let Some(s) = self.queue.pop() else {
            return false;
        };
        debug_assert!(s.at_us >= self.now_us, "time never runs backwards");
        self.now_us = s.at_us;
        self.stats.events += 1;
        self.dispatch(s.event);
        true
    }

    /// Runs until `stop` holds (checked before every event), nothing is left to do, or the
    /// minimum recvclock has not grown for `stall_us` of virtual time.
    pub fn run_until(&mut self, mut stop: impl FnMut(&Self) -> bool, stall_us: u64) -> RunEnd {
        loop {
            if stop(self) {
                return RunEnd::Stopped;
            }
            if let Some(end) = self.step_unless_done(stall_us) {
                return end;
            }
        }
    }

    /// Runs as [`Sim::run_until`] until `stop(self, all)` holds, where `all` says whether
    /// `each(self, h)` holds for every host `h`. `each` must depend only on host `h`'s
    /// behaviour and its SIU: it is evaluated again for a host only after either ran, so
    /// the run stops at the same event as checking every host before every event would,
    /// without the cost of thousands of hosts per event.
    pub fn run_until_hosts(
        &mut self,
        each: impl Fn(&Self, usize) -> bool,
        mut stop: impl FnMut(&Self, bool) -> bool,
        stall_us: u64,
    ) -> RunEnd {
        let mut ok: Vec<bool> = (0..self.hosts.len()).map(|h| each(self, h)).collect();
        let mut failing = ok.iter().filter(|&&o| !o).count();
        self.clear_touched();
        loop {
            for h in std::mem::take(&mut self.touched) {
                let h = usize::from(h);
                self.touched_flag[h] = false;
                let now = each(self, h);
                if now != ok[h] {
                    ok[h] = now;
                    if now {
                        failing -= 1;
                    } else {
                        failing += 1;
                    }
                }
            }
            debug_assert!(failing <= ok.len());
            if stop(self, failing == 0) {
                return RunEnd::Stopped;
            }
            if let Some(end) = self.step_unless_done(stall_us) {
                return end;
            }
        }
    }

    /// Runs the next event, or says why the run ends: nothing is left, or the next event
    /// comes after `stall_us` without progress (the clock then moves to the stall).
    fn step_unless_done(&mut self, stall_us: u64) -> Option<RunEnd> {
        let Some(next) = self.peek_time_us() else {
            return Some(RunEnd::Exhausted);
        };
        let stall_at = self.progress_at_us.saturating_add(stall_us);
        if next > stall_at {
            self.now_us = self.now_us.max(stall_at);
            return Some(RunEnd::Stalled);
        }
        self.step();
        None
    }

    /// Runs every event up to `now + duration_us`, then sets the clock there.
    pub fn run_for(&mut self, duration_us: u64) {
        let end = self.now_us.saturating_add(duration_us);
        while self.peek_time_us().is_some_and(|t| t <= end) {
            self.step();
        }
        self.now_us = end;
    }
}
