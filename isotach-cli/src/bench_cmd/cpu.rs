//! The process's CPU time over a measurement window: what a run's work cost, beside how fast it
//! went. Meaningful with `--spin-us 0` only — spinning waits keep every core busy, so the CPU per
//! unit of work is then the inverse of the rate (`docs/bench.md`, thirteenth session).
//!
//! The process: the token manager, the SIUs and the applications of the daemon benches are
//! threads of this process (the raw baseline's peer is another process, or an idle thread with
//! `--in-process`), so its CPU time is theirs.

use nix::time::{ClockId, clock_gettime};
use std::time::{Duration, Instant};

/// CPU time this process used so far (every thread), if the clock can be read.
fn process_cpu() -> Option<Duration> {
    clock_gettime(ClockId::CLOCK_PROCESS_CPUTIME_ID)
        .ok()
        .map(Duration::from)
}

/// CPU time used over a span of wall-clock time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct CpuSpan {
    /// CPU time used, s (every thread of the process).
    pub(crate) cpu_s: f64,
    /// The span, s.
    pub(crate) span_s: f64,
}

impl CpuSpan {
    /// CPU per unit of work, µs (`None` for no work).
    pub(crate) fn us_per(self, work: u64) -> Option<f64> {
        (work > 0).then(|| self.cpu_s * 1e6 / work as f64)
    }

    /// Cores busy on average over the span.
    pub(crate) fn cores_busy(self) -> f64 {
        self.cpu_s / self.span_s.max(1e-9)
    }
}

/// Reads the process's CPU time when a window opens and when it closes.
#[derive(Debug, Default)]
pub(crate) struct CpuWindow {
    opened: Option<(Instant, Duration)>,
    closed: Option<CpuSpan>,
}

impl CpuWindow {
    /// Opens at the first call at or after `start`, closes at the first at or after `end`:
    /// two clock reads in all, whatever the calls between.
    pub(crate) fn observe(&mut self, now: Instant, start: Instant, end: Instant) {
        match self.opened {
            None if now >= start => self.opened = process_cpu().map(|cpu| (now, cpu)),
            Some((t0, cpu0)) if now >= end && self.closed.is_none() => {
                self.closed = process_cpu().map(|cpu| CpuSpan {
                    cpu_s: cpu.saturating_sub(cpu0).as_secs_f64(),
                    span_s: (now - t0).as_secs_f64(),
                });
            }
            _ => {}
        }
    }

    /// The window's CPU time, once it closed.
    pub(crate) fn span(&self) -> Option<CpuSpan> {
        self.closed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_measures_the_cpu_spent_inside_it() {
        let start = Instant::now();
        let end = start + Duration::from_millis(30);
        let mut w = CpuWindow::default();
        w.observe(start, start, end);
        assert_eq!(w.span(), None, "open, not closed");
        // Busy: the process uses about one core while the window is open.
        let mut now = Instant::now();
        let mut x = 0u64;
        while now < end {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            now = Instant::now();
            w.observe(now, start, end);
        }
        std::hint::black_box(x);
        let s = w.span().expect("closed at the end");
        assert!(s.span_s >= 0.03, "{s:?}");
        // Some CPU (other tests' threads may count too); never more than this machine's cores.
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        assert!(s.cpu_s > 0.0 && s.cores_busy() <= cores + 0.1, "{s:?}");
        assert_eq!(s.us_per(0), None);
        let per = s.us_per(1000).unwrap();
        assert!((per - s.cpu_s * 1e3).abs() < 1e-9);
        // Later calls change nothing.
        w.observe(Instant::now() + Duration::from_secs(1), start, end);
        assert_eq!(w.span(), Some(s));
    }
}
