//! A small in-memory rig that wires the SIU test tools of the prototype report's test plan
//! (section 3.1.1; package `isotach-tools`, re-exported here) to one [`isotach_siu::Siu`], and
//! the seed helpers of the property loops.
//!
//! * [`TokenBouncer`] plays the token manager on the SIU's network side.
//! * [`ByteGenerator`] plays the host.
//! * [`Receiver`] collects and decodes what the SIU hands its host.
//!
//! [`Rig`] connects the three to an SIU state machine and keeps the order in which packets crossed
//! the SIU's network link ([`Rig::trace`]), which is what the requirement suite asserts on. The
//! same roles run on a real wire as `isotach tool bounce|send|recv`.

#![warn(missing_docs)]

mod rig;
mod seeds;

pub use isotach_tools::{
    ByteGenerator, Receiver, SentToken, TokenBits, TokenBouncer, TokenRole, XorShift,
};
pub use rig::{Rig, Wire, siu_config, test_topology};
pub use seeds::{SeedGuard, seeds};
