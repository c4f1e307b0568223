//! Why bytes are not a valid packet: one [`DecodeError`] variant per check a decoder makes,
//! in the order it makes them (length, version, kind, length again, CRC, field ranges).

use super::{Kind, VERSION};
use thiserror::Error;

/// Why bytes are not a valid packet.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DecodeError {
    /// Fewer bytes than the kind needs.
    #[error("packet too short: {got} bytes, need {need}")]
    Short {
        /// Bytes needed.
        need: usize,
        /// Bytes present.
        got: usize,
    },
    /// More bytes than the kind's layout holds.
    #[error("packet too long: {got} bytes, layout holds {max}")]
    Long {
        /// Bytes the layout holds.
        max: usize,
        /// Bytes present.
        got: usize,
    },
    /// The version byte is not [`VERSION`].
    #[error("unsupported wire version {0} (speak {VERSION})")]
    BadVersion(u8),
    /// The kind byte names no packet kind.
    #[error("unknown packet kind 0x{0:02x}")]
    UnknownKind(u8),
    /// The kind byte names another kind than the decoder expects.
    #[error("expected a {expected:?} packet, found {found:?}")]
    WrongKind {
        /// Kind the caller asked for.
        expected: Kind,
        /// Kind in the packet.
        found: Kind,
    },
    /// The trailing CRC does not match the bytes.
    #[error("bad CRC: packet says 0x{found:08x}, bytes give 0x{computed:08x}")]
    BadCrc {
        /// CRC carried by the packet.
        found: u32,
        /// CRC of the bytes.
        computed: u32,
    },
    /// A field holds a value outside its range (including non-zero reserved bits).
    #[error("field `{field}` out of range: {value}")]
    OutOfRange {
        /// The field's name as in `docs/wire.md`.
        field: &'static str,
        /// The offending value.
        value: u64,
    },
}
