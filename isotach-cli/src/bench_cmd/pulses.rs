//! Pulses over a measurement window: the pulse period a workload saw, counted from the SMM's
//! drained EOP markers between the window's edges (warm-up and drain left out), beside the
//! CPU meter (`cpu.rs`) that reads the same window.

use std::time::Instant;

/// Pulses drained by an SMM over a span of time.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Pulses {
    /// Pulses ended (EOP markers drained) in the span.
    pub(crate) count: u64,
    /// The span, s.
    pub(crate) span_s: f64,
}

impl Pulses {
    /// Mean pulse period, µs (0 when no pulse ended).
    pub(crate) fn period_us(self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.span_s * 1e6 / self.count as f64
        }
    }
}

/// The pulse at the window's opening, then the pulses counted up to its close.
#[derive(Debug, Default)]
pub(super) struct PulseClock {
    opened: Option<(Instant, u64)>,
    pub(super) closed: Option<Pulses>,
}

impl PulseClock {
    /// Opens at the first call at or after `start`, closes at the first at or after `end`.
    pub(super) fn observe(&mut self, now: Instant, pulse: u64, start: Instant, end: Instant) {
        match self.opened {
            None if now >= start => self.opened = Some((now, pulse)),
            Some((t0, p0)) if now >= end && self.closed.is_none() => {
                self.closed = Some(Pulses {
                    count: pulse.saturating_sub(p0),
                    span_s: (now - t0).as_secs_f64(),
                });
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_pulse_clock_counts_pulses_between_the_window_edges_only() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let (start, end) = (at(100), at(1100));
        let mut c = PulseClock::default();
        c.observe(at(50), 10, start, end); // warm-up: not counted
        c.observe(at(120), 14, start, end); // opens at pulse 14
        c.observe(at(600), 300, start, end);
        assert!(c.closed.is_none());
        c.observe(at(1120), 514, start, end); // closes: 500 pulses over 1 s
        c.observe(at(1500), 900, start, end); // the drain: ignored
        let p = c.closed.unwrap();
        assert_eq!(p.count, 500);
        assert!((p.span_s - 1.0).abs() < 1e-9, "{}", p.span_s);
        assert!((p.period_us() - 2000.0).abs() < 1e-6, "{}", p.period_us());
        assert_eq!(Pulses::default().period_us(), 0.0);
    }
}
