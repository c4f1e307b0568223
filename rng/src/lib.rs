//! The one seeded random number generator of the workspace: the simulator, fault injection in
//! the transports, the test tools and the examples all draw from [`Rng`], so every random
//! choice replays from a seed. A thin wrapper over `rand_xoshiro`'s xoshiro256++ (seeded
//! through SplitMix64 by [`SeedableRng::seed_from_u64`]); the generator itself is not kept
//! here. Not for cryptography.
//!
//! A run that needs several consumers (the network, a pause scheduler, each host) gives each
//! its own [`Rng::stream`], so changing what one consumer draws does not change what the
//! others draw.

#![warn(missing_docs)]

use rand_core::{RngCore, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

/// Odd multiplier that spreads a stream number over all 64 bits before it is mixed into the
/// run's seed.
const STREAM_MIX: u64 = 0xd1b5_4a32_d192_ed03;
/// Bits of a `u64` draw that fit the 53-bit mantissa of an `f64` in [`Rng::unit`].
const UNIT_BITS: u32 = 53;

/// A seeded xoshiro256++ generator.
#[derive(Debug, Clone)]
pub struct Rng(Xoshiro256PlusPlus);

impl Rng {
    /// A generator for `seed` (any value, including 0).
    pub fn new(seed: u64) -> Self {
        Self(Xoshiro256PlusPlus::seed_from_u64(seed))
    }

    /// The generator of stream `stream` of run `seed` (independent streams per consumer).
    pub fn stream(seed: u64, stream: u64) -> Self {
        Self::new(seed ^ stream.wrapping_mul(STREAM_MIX))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in `0..n` (0 when `n` is 0), without modulo bias.
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        // Lemire's multiply-shift with rejection.
        let threshold = n.wrapping_neg() % n;
        loop {
            let m = u128::from(self.next_u64()) * u128::from(n);
            if (m as u64) >= threshold {
                return (m >> 64) as u64;
            }
        }
    }

    /// Uniform in `lo..=hi` (`lo` when `hi <= lo`).
    pub fn range_inclusive(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        match (hi - lo).checked_add(1) {
            Some(span) => lo + self.below(span),
            None => self.next_u64(),
        }
    }

    /// Uniform in `lo..=hi` (`lo` when `hi <= lo`): [`Rng::range_inclusive`] under the name
    /// the transports use.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        self.range_inclusive(lo, hi)
    }

    /// Uniform in `[0, 1)` with 53 bits of precision.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> (u64::BITS - UNIT_BITS)) as f64 / (1u64 << UNIT_BITS) as f64
    }

    /// True with probability `p` (never for `p <= 0`, always for `p >= 1`).
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.unit() < p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_xoshiro256plusplus_seeded_from_u64() {
        let mut ours = Rng::new(42);
        let mut theirs = Xoshiro256PlusPlus::seed_from_u64(42);
        for _ in 0..8 {
            assert_eq!(ours.next_u64(), theirs.next_u64());
        }
    }

    #[test]
    fn same_seed_same_stream_and_streams_differ() {
        let draw = |seed, stream| {
            let mut r = Rng::stream(seed, stream);
            (0..8).map(|_| r.next_u64()).collect::<Vec<_>>()
        };
        assert_eq!(draw(7, 1), draw(7, 1));
        assert_ne!(draw(7, 1), draw(7, 2));
        assert_ne!(draw(7, 1), draw(8, 1));
    }

    #[test]
    fn ranges_stay_in_bounds() {
        let mut r = Rng::new(3);
        for _ in 0..10_000 {
            let v = r.range_inclusive(5, 9);
            assert!((5..=9).contains(&v));
            assert!((5..=9).contains(&r.range(5, 9)));
            assert!(r.below(3) < 3);
            let u = r.unit();
            assert!((0.0..1.0).contains(&u));
        }
        assert_eq!(r.range_inclusive(4, 4), 4);
        assert_eq!(r.range(9, 4), 9);
        assert_eq!(r.below(0), 0);
        // The full range has no span that fits a u64: drawn without overflow.
        let _ = r.range_inclusive(0, u64::MAX);
        assert!(!r.chance(0.0));
        assert!(!r.chance(-1.0));
        assert!(r.chance(1.0));
    }

    #[test]
    fn every_value_of_a_small_range_is_drawn() {
        let mut r = Rng::new(0);
        let mut seen = [false; 6];
        for _ in 0..1_000 {
            seen[r.below(6) as usize] = true;
        }
        assert!(seen.iter().all(|&s| s));
    }
}
