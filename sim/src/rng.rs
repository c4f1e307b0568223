//! The simulator's seeded generator: the workspace's one generator (`isotach-rng`,
//! xoshiro256++) under the simulator's name.
//!
//! Every consumer (the network, the pause scheduler, each host) gets its own stream, derived
//! from the run's seed and a stream number ([`SimRng::stream`]), so changing what one host
//! draws does not change what the network draws. A trace replays from its seed as long as the
//! pinned `rand_xoshiro` version stays.

pub use isotach_rng::Rng as SimRng;
