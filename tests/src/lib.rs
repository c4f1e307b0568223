//! Test-harness roles from the SIU test plan of the prototype report (section 3.1.1), and a
//! small in-memory rig that wires them to one [`isotach_siu::Siu`].
//!
//! The report's tools become three I/O-free roles that speak the real wire format
//! ([`isotach_proto::packet`]); a later issue runs the same roles as `isotach tool bounce|send|recv`
//! on a real wire:
//!
//! * [`TokenBouncer`] plays the token manager on the SIU's network side: it answers tokens with
//!   correct sequence numbers, can pause after N waves, inject early or repeat tokens, set barrier,
//!   signal, end-of-epoch and reset bits, send isotach messages between tokens, and records
//!   everything it heard.
//! * [`ByteGenerator`] plays the host: it builds start-of-isochron, message, end-of-isochron,
//!   barrier/signal marker, non-isotach and (host mode) token packets as bytes, can corrupt a CRC
//!   and can resend the previous packet.
//! * [`Receiver`] collects and decodes what the SIU hands its host, with helpers to pick out EOP
//!   markers, isochron markers and messages.
//!
//! [`Rig`] connects the three to an SIU state machine and keeps the order in which packets crossed
//! the SIU's network link ([`Rig::trace`]), which is what the requirement suite asserts on.

#![warn(missing_docs)]

mod bouncer;
mod generator;
mod receiver;
mod rig;
mod rng;

pub use bouncer::{SentToken, TokenBits, TokenBouncer, TokenRole};
pub use generator::ByteGenerator;
pub use receiver::Receiver;
pub use rig::{Rig, Wire, siu_config, test_topology};
pub use rng::{SeedGuard, XorShift, seeds};
