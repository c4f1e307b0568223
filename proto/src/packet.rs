//! Data-plane packets: fixed big-endian layouts, a version byte and a trailing CRC-32.
//!
//! Every packet starts with `[version, kind]` and ends with the CRC-32 (IEEE) of all bytes
//! before it. Reserved bytes and flag bits must be zero. `docs/wire.md` lists every byte.
//!
//! Decoders check, in this order: the 6-byte minimum, version, kind, the kind's minimum and
//! maximum length, CRC, then every field's range. They return a [`DecodeError`] and never panic.
//!
//! One file per packet kind, in the order a pulse uses them:
//!
//! | file | kind | travels |
//! |------|------|---------|
//! | `token.rs` | [`Token`] | every link; ends a pulse |
//! | `start_of_isochron.rs` | [`StartOfIsochron`] | host → SIU |
//! | `isotach_message.rs` | [`IsotachMessage`], [`Sref`], [`SrefOp`], [`Width`] | host → host, stamped by the SIU |
//! | `end_of_isochron.rs` | [`EndOfIsochron`] | host → SIU |
//! | `isochron_marker.rs` | [`IsochronMarker`] | SIU → host |
//! | `eop_marker.rs` | [`EopMarker`] | SIU → host; ends a pulse at the host |
//! | `barrier_signal_marker.rs` | [`BarrierSignalMarker`] | host → SIU |
//! | `plain_message.rs` | [`PlainMessage`] | host → host, FIFO, outside logical time |
//!
//! and the codec they share: `kind.rs` ([`Kind`]), `error.rs` ([`DecodeError`]), `codec.rs`
//! (header, CRC, the field reader and writer, [`peek_kind`]) and `any.rs` ([`Packet`]). A node
//! builds its packets in the buffers of the packets it consumed ([`BufPool`]).

mod any;
mod barrier_signal_marker;
mod codec;
mod end_of_isochron;
mod eop_marker;
mod error;
mod isochron_marker;
mod isotach_message;
mod kind;
mod plain_message;
mod start_of_isochron;
mod token;

pub use any::Packet;
pub use barrier_signal_marker::{BSM_LEN, BarrierSignalMarker};
pub use codec::{
    BARRIER_MASK, BARRIERS, CRC_LEN, PACKET_LEN_MAX, VERSION, carried_crc, crc32, peek_kind,
};
pub use end_of_isochron::{EOI_LEN, EndOfIsochron};
pub use eop_marker::{EOP_LEN_MIN, EopMarker, SORT_VECTOR_MAX};
pub use error::DecodeError;
pub use isochron_marker::{CHR_LEN, IsochronMarker};
pub use isotach_bufpool::{BUFFER_BYTES_MAX, BUFFER_BYTES_MIN};
pub use isotach_message::{
    IsotachMessage, MEM_MESSAGE_LEN, MSG_MESSAGE_LEN_MIN, MSG_PAYLOAD_MAX, RMW_MESSAGE_LEN, RmwOp,
    RmwSref, Sref, SrefOp, Stamp, Width,
};
pub use kind::Kind;
pub use plain_message::{PLAIN_LEN_MIN, PLAIN_PAYLOAD_MAX, PlainMessage, PlainView};

/// Most buffers a node keeps for the packets it builds.
pub const POOL_BUFFERS_MAX: usize = 64;
/// The buffers a node (an SMM, an SIU, a token manager) builds its packets in: its driver
/// hands it the buffers of packets it is done with and tops it up from its links' spares.
pub type BufPool = isotach_bufpool::BufPool<POOL_BUFFERS_MAX>;
pub use start_of_isochron::{SOI_LEN, StartOfIsochron};
pub use token::{TOKEN_LEN, Token};

#[cfg(test)]
mod tests;
