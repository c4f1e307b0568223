//! The test tools' seeded generator: the workspace's one generator (`isotach-rng`) with the
//! draws a property loop and `isotach tool send` ask for.

/// Picks test inputs from a seed. The name is kept for its callers; the generator is
/// [`isotach_rng::Rng`] (xoshiro256++).
#[derive(Debug, Clone)]
pub struct XorShift(isotach_rng::Rng);

impl XorShift {
    /// A generator for `seed` (any value, including 0).
    pub fn new(seed: u64) -> Self {
        Self(isotach_rng::Rng::new(seed))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// A value in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0);
        self.0.below(n)
    }

    /// A value in `lo..=hi` (`lo` <= `hi`).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        assert!(lo <= hi);
        self.0.range_inclusive(lo, hi)
    }

    /// True with probability `num / den` (`den` > 0).
    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }
}
