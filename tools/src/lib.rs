//! The test tools of the SIU test plan of the prototype report (section 3.1.1) as I/O-free
//! roles that speak the real wire format ([`isotach_proto::packet`]). The in-memory requirement
//! suite (package `isotach-tests`) wires them to an SIU state machine; `isotach tool
//! bounce|send|recv` runs them on a real wire.
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
//! * [`XorShift`] picks random inputs from a seed (property loops, `isotach tool send`).

#![warn(missing_docs)]

mod bouncer;
mod generator;
mod receiver;
mod rng;

pub use bouncer::{SentToken, TokenBits, TokenBouncer, TokenRole};
pub use generator::ByteGenerator;
pub use receiver::Receiver;
pub use rng::XorShift;
