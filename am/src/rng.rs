//! The seeded generator of the transports' fault injection (loss, delay, duplication), so a
//! faulty run replays from a seed: the workspace's one [`Rng`] (`isotach-rng`, xoshiro256++).
//! Not for cryptography.

pub use isotach_rng::Rng;
