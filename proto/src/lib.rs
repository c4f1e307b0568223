//! The Isotach data-plane wire format, the switch/host topology and the cluster
//! configuration every other crate agrees on.
//!
//! * [`packet`]: every packet kind that crosses an SIU, with a fixed big-endian layout, a
//!   version byte and a trailing CRC-32. `docs/wire.md` documents the layout byte by byte.
//! * [`topology`]: switches (token managers), hosts and links; routes and logical distances.
//! * [`reply`]: payloads of the non-isotach replies between SMM nodes (reads, state transfer).
//! * [`config`]: the TOML cluster configuration that builds a [`topology::Topology`].
//!
//! Nothing here does I/O; decoders never panic on any input.
#![warn(missing_docs)]

pub mod config;
pub mod input;
pub mod logical;
pub mod packet;
pub mod reply;
pub mod topology;
pub mod wave;

pub use input::Input;
pub use logical::{Generation, Pulse, WaveSeq};
pub use packet::{
    BarrierSignalMarker, DecodeError, EndOfIsochron, EopMarker, IsochronMarker, IsotachMessage,
    Kind, Packet, PlainMessage, Sref, SrefOp, StartOfIsochron, Token, Width,
};
pub use topology::{Hop, HostId, SwitchId, Topology, TopologyError};
