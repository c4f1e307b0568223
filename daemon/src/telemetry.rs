//! Telemetry of a daemon: named latency histograms (HDR, microseconds) and a rate meter,
//! shared between the driver loop (which records) and the admin service (which reads).
//!
//! Recording takes an uncontended mutex once per sample; samples come at most once per
//! pulse, so this costs far less than the pulse itself. Every histogram has a fixed range
//! ([`HIST_MAX_US`]); larger samples are clamped to it rather than refused.

use hdrhistogram::Histogram;
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

/// Largest recordable sample (one minute): histograms have a fixed size.
pub const HIST_MAX_US: u64 = 60_000_000;

/// The summary of one histogram.
#[derive(Debug, Clone, PartialEq)]
pub struct HistSummary {
    /// Its name (snake_case, unit `_us`).
    pub name: &'static str,
    /// Samples recorded.
    pub count: u64,
    /// Smallest sample.
    pub min_us: u64,
    /// Median.
    pub p50_us: u64,
    /// 90th percentile.
    pub p90_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// 99.9th percentile.
    pub p999_us: u64,
    /// Largest sample.
    pub max_us: u64,
    /// Mean.
    pub mean_us: f64,
}

/// Named histograms; see the module documentation.
#[derive(Debug)]
pub struct Telemetry {
    hists: Mutex<Vec<(&'static str, Histogram<u64>)>>,
}

impl Telemetry {
    /// Histograms with these names (3 significant digits, 1 µs to [`HIST_MAX_US`]).
    pub fn new(names: &[&'static str]) -> Self {
        let hists = names
            .iter()
            .map(|&n| {
                let h = Histogram::new_with_bounds(1, HIST_MAX_US, 3)
                    .expect("1..HIST_MAX_US with 3 digits is a valid histogram");
                (n, h)
            })
            .collect();
        Self {
            hists: Mutex::new(hists),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<(&'static str, Histogram<u64>)>> {
        self.hists.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records `us` in histogram `name` (unknown names are ignored: telemetry never fails the
    /// caller).
    pub fn record(&self, name: &str, us: u64) {
        let mut hists = self.lock();
        if let Some((_, h)) = hists.iter_mut().find(|(n, _)| *n == name) {
            h.saturating_record(us.clamp(1, HIST_MAX_US));
        }
    }

    /// Every histogram's summary, in creation order.
    pub fn summaries(&self) -> Vec<HistSummary> {
        self.lock()
            .iter()
            .map(|(name, h)| HistSummary {
                name,
                count: h.len(),
                min_us: if h.is_empty() { 0 } else { h.min() },
                p50_us: h.value_at_quantile(0.5),
                p90_us: h.value_at_quantile(0.9),
                p99_us: h.value_at_quantile(0.99),
                p999_us: h.value_at_quantile(0.999),
                max_us: h.max(),
                mean_us: h.mean(),
            })
            .collect()
    }

    /// Empties every histogram (a new measurement window).
    pub fn reset(&self) {
        self.lock().iter_mut().for_each(|(_, h)| h.reset());
    }
}

/// Events per second over windows of about one second (the last full window).
#[derive(Debug, Clone, Copy)]
pub struct RateMeter {
    start: Instant,
    count_at_start: u64,
    rate_per_s: f64,
}

impl RateMeter {
    /// A meter whose first window starts now at `count`.
    pub fn new(count: u64) -> Self {
        Self::new_at(count, Instant::now())
    }

    /// A meter whose first window starts at `now` at `count`.
    pub fn new_at(count: u64, now: Instant) -> Self {
        Self {
            start: now,
            count_at_start: count,
            rate_per_s: 0.0,
        }
    }

    /// Observes the running `count` now; returns the current rate.
    pub fn observe(&mut self, count: u64) -> f64 {
        self.observe_at(count, Instant::now())
    }

    /// Observes the running `count` at `now` (monotonic within a window; a count that went
    /// down, as after a logical-time restart, starts a new window and the rate reads 0 until
    /// it is full); returns the rate of the last full window.
    pub fn observe_at(&mut self, count: u64, now: Instant) -> f64 {
        let elapsed = now.saturating_duration_since(self.start).as_secs_f64();
        if count < self.count_at_start {
            *self = Self::new_at(count, now);
        } else if elapsed >= 1.0 {
            self.rate_per_s = (count - self.count_at_start) as f64 / elapsed;
            self.start = now;
            self.count_at_start = count;
        }
        self.rate_per_s
    }

    /// The rate of the last full window.
    pub fn rate_per_s(&self) -> f64 {
        self.rate_per_s
    }
}

/// Measures the time between successive events (pulses, waves) and records it.
#[derive(Debug, Clone, Copy)]
pub struct PeriodMeter {
    last: Option<(Instant, u64)>,
}

impl PeriodMeter {
    /// A meter with no event seen yet.
    pub const fn new() -> Self {
        Self { last: None }
    }

    /// The running `count` of events is now this; when it grew by k, records the time since
    /// the last growth divided by k in `name`. Reads the clock only when the count moved.
    pub fn observe(&mut self, t: &Telemetry, name: &str, count: u64) {
        if self.last.is_some_and(|(_, n)| n == count) {
            return;
        }
        self.observe_at(t, name, count, Instant::now());
    }

    /// [`PeriodMeter::observe`] at `now`.
    pub fn observe_at(&mut self, t: &Telemetry, name: &str, count: u64, now: Instant) {
        match self.last {
            Some((at, n)) if count > n => {
                let per = now.saturating_duration_since(at).as_micros() as u64 / (count - n);
                t.record(name, per);
                self.last = Some((now, count));
            }
            Some((_, n)) if count == n => {}
            _ => self.last = Some((now, count)),
        }
    }
}

impl Default for PeriodMeter {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_summarise_what_was_recorded() {
        let t = Telemetry::new(&["a_us", "b_us"]);
        for us in 1..=1000 {
            t.record("a_us", us);
        }
        t.record("b_us", u64::MAX);
        t.record("nope_us", 5);
        let s = t.summaries();
        assert_eq!(s.len(), 2);
        assert_eq!((s[0].name, s[0].count, s[0].min_us), ("a_us", 1000, 1));
        assert!((499..=501).contains(&s[0].p50_us), "{}", s[0].p50_us);
        assert!((989..=991).contains(&s[0].p99_us), "{}", s[0].p99_us);
        assert!(s[1].max_us >= HIST_MAX_US && s[1].max_us <= HIST_MAX_US + HIST_MAX_US / 500);
        t.reset();
        assert!(t.summaries().iter().all(|h| h.count == 0 && h.max_us == 0));
    }

    #[test]
    fn period_meter_divides_by_the_events_seen() {
        let t = Telemetry::new(&["p_us"]);
        let mut m = PeriodMeter::new();
        let t0 = Instant::now();
        let at = |us: u64| t0 + std::time::Duration::from_micros(us);
        m.observe_at(&t, "p_us", 10, at(0));
        m.observe_at(&t, "p_us", 10, at(50));
        assert_eq!(
            t.summaries()[0].count,
            0,
            "no period before the second event"
        );
        m.observe_at(&t, "p_us", 14, at(400));
        let s = &t.summaries()[0];
        assert_eq!(
            (s.count, s.min_us, s.max_us),
            (1, 100, 100),
            "400 µs over 4 events"
        );
        m.observe_at(&t, "p_us", 2, at(500));
        m.observe_at(&t, "p_us", 3, at(530));
        let s = &t.summaries()[0];
        assert_eq!((s.count, s.min_us), (2, 30), "a restart starts over");
    }

    #[test]
    fn rate_meter_reports_full_windows_and_restarts_when_the_count_goes_down() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + std::time::Duration::from_millis(ms);
        let mut r = RateMeter::new_at(100, at(0));
        assert_eq!(r.observe_at(150, at(500)), 0.0, "no full window yet");
        assert_eq!(r.observe_at(2100, at(2000)), 1000.0, "2000 events in 2 s");
        assert_eq!(r.observe_at(2600, at(2500)), 1000.0, "the last full window");
        assert_eq!(
            r.observe_at(3, at(2600)),
            0.0,
            "a restart opens a new window"
        );
        assert_eq!(r.observe_at(503, at(3600)), 500.0);
        assert_eq!(r.rate_per_s(), 500.0);
    }
}
