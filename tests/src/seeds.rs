//! The seeds of property loops, and a guard that prints the seed of a failure.

/// The seeds a property loop runs: `0..count`, or only `ISOTACH_TEST_SEED` when it is set (to
/// replay a failure).
pub fn seeds(count: u64) -> Vec<u64> {
    match std::env::var("ISOTACH_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        Some(seed) => vec![seed],
        None => (0..count).collect(),
    }
}

/// Prints the seed on stderr if the test panics while the guard is alive.
#[derive(Debug)]
pub struct SeedGuard {
    /// The seed being run.
    pub seed: u64,
}

impl Drop for SeedGuard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "failing seed: {} (replay with ISOTACH_TEST_SEED={})",
                self.seed, self.seed
            );
        }
    }
}
