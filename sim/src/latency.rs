//! Isochron latency: from the moment a host issues an isochron to its execution at the
//! issuer — the EOP marker of the isochron's pulse reaching the host, when the SMM drains
//! the pulse — in virtual microseconds and in pulses (pulses that ended in between).
//!
//! Each host keeps its own samples, at most [`LATENCY_SAMPLES_PER_HOST_MAX`] (later ones are
//! counted as dropped); the report merges them and takes exact percentiles.

use serde::Serialize;

/// Most samples one host keeps (16 bytes each).
pub const LATENCY_SAMPLES_PER_HOST_MAX: usize = 4096;

/// One host's samples, or a run's once merged.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LatencySamples {
    /// (virtual µs, pulses) per isochron.
    samples: Vec<(u64, u64)>,
    /// Samples not kept (over the cap).
    dropped: u64,
}

/// The percentiles of a run's isochron latency. Keys are documented in `docs/sim.md`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct LatencySummary {
    /// Isochrons measured.
    pub isochron_latency_samples: u64,
    /// Median latency, virtual µs.
    pub isochron_latency_p50_us: u64,
    /// 99th percentile, virtual µs.
    pub isochron_latency_p99_us: u64,
    /// Median latency in pulses.
    pub isochron_latency_p50_pulses: u64,
    /// 99th percentile in pulses.
    pub isochron_latency_p99_pulses: u64,
    /// Samples not kept because a host had [`LATENCY_SAMPLES_PER_HOST_MAX`] already.
    pub isochron_latency_dropped: u64,
}

impl LatencySamples {
    /// Records one isochron's latency (dropped, and counted, beyond the cap).
    pub fn record(&mut self, us: u64, pulses: u64) {
        if self.samples.len() >= LATENCY_SAMPLES_PER_HOST_MAX {
            self.dropped += 1;
            return;
        }
        self.samples.push((us, pulses));
        debug_assert!(self.samples.len() <= LATENCY_SAMPLES_PER_HOST_MAX);
    }

    /// Adds `other`'s samples (a run's merge of its hosts: no cap).
    pub fn merge(&mut self, other: &Self) {
        self.samples.extend_from_slice(&other.samples);
        self.dropped += other.dropped;
    }

    /// Samples kept.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// No samples?
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// The 50th and 99th percentiles (nearest rank) of both measures; zeros without samples.
    pub fn summary(&self) -> LatencySummary {
        let mut us: Vec<u64> = self.samples.iter().map(|s| s.0).collect();
        let mut pulses: Vec<u64> = self.samples.iter().map(|s| s.1).collect();
        us.sort_unstable();
        pulses.sort_unstable();
        LatencySummary {
            isochron_latency_samples: self.samples.len() as u64,
            isochron_latency_p50_us: percentile(&us, 50),
            isochron_latency_p99_us: percentile(&us, 99),
            isochron_latency_p50_pulses: percentile(&pulses, 50),
            isochron_latency_p99_pulses: percentile(&pulses, 99),
            isochron_latency_dropped: self.dropped,
        }
    }
}

/// The `p`th percentile of `sorted` by nearest rank: the smallest value with at least `p`% of
/// the values at or below it (0 for no values).
fn percentile(sorted: &[u64], p: u64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (p as usize * sorted.len()).div_ceil(100).max(1);
    sorted[rank - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_by_nearest_rank() {
        assert_eq!(percentile(&[], 50), 0);
        assert_eq!(percentile(&[7], 99), 7);
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 50), 50);
        assert_eq!(percentile(&v, 99), 99);
        let v: Vec<u64> = (1..=10).collect();
        assert_eq!(percentile(&v, 50), 5);
        assert_eq!(percentile(&v, 99), 10);
    }

    #[test]
    fn a_host_keeps_its_cap_and_counts_the_rest_and_a_merge_sums() {
        let mut a = LatencySamples::default();
        for i in 0..LATENCY_SAMPLES_PER_HOST_MAX as u64 + 5 {
            a.record(i, i % 7);
        }
        assert_eq!(a.len(), LATENCY_SAMPLES_PER_HOST_MAX);
        let mut b = LatencySamples::default();
        b.record(1_000_000, 40);
        let mut run = LatencySamples::default();
        run.merge(&a);
        run.merge(&b);
        let s = run.summary();
        assert_eq!(
            s.isochron_latency_samples,
            LATENCY_SAMPLES_PER_HOST_MAX as u64 + 1
        );
        assert_eq!(s.isochron_latency_dropped, 5);
        assert_eq!(s.isochron_latency_p99_pulses, 6);
        assert_eq!(s.isochron_latency_p50_us, 2048);
        assert!(
            s.isochron_latency_p99_us < 1_000_000,
            "one outlier is not the 99th"
        );
    }
}
