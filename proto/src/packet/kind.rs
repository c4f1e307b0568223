//! The kind byte: which of the eight layouts a packet has, and the smallest length of each.

use super::{
    BSM_LEN, CHR_LEN, DecodeError, EOI_LEN, EOP_LEN_MIN, MSG_MESSAGE_LEN_MIN, PLAIN_LEN_MIN,
    SOI_LEN, TOKEN_LEN,
};

/// Packet kinds; the second byte of every packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    /// Token: ends a pulse.
    Token = 0x01,
    /// Start of isochron (host to SIU).
    StartOfIsochron = 0x02,
    /// Isotach message carrying one sref.
    IsotachMessage = 0x03,
    /// End of isochron (host to SIU).
    EndOfIsochron = 0x04,
    /// Isochron marker (SIU to host).
    IsochronMarker = 0x05,
    /// End-of-pulse marker (SIU to host).
    EopMarker = 0x06,
    /// Barrier/signal marker (host to SIU).
    BarrierSignalMarker = 0x07,
    /// Non-isotach message, passed through untouched.
    Plain = 0x08,
}

impl Kind {
    /// The kind named by a kind byte.
    pub fn from_byte(byte: u8) -> Result<Self, DecodeError> {
        Ok(match byte {
            0x01 => Self::Token,
            0x02 => Self::StartOfIsochron,
            0x03 => Self::IsotachMessage,
            0x04 => Self::EndOfIsochron,
            0x05 => Self::IsochronMarker,
            0x06 => Self::EopMarker,
            0x07 => Self::BarrierSignalMarker,
            0x08 => Self::Plain,
            other => return Err(DecodeError::UnknownKind(other)),
        })
    }

    /// Smallest encoded length of this kind.
    pub fn len_min(self) -> usize {
        match self {
            Self::Token => TOKEN_LEN,
            Self::StartOfIsochron => SOI_LEN,
            Self::IsotachMessage => MSG_MESSAGE_LEN_MIN,
            Self::EndOfIsochron => EOI_LEN,
            Self::IsochronMarker => CHR_LEN,
            Self::EopMarker => EOP_LEN_MIN,
            Self::BarrierSignalMarker => BSM_LEN,
            Self::Plain => PLAIN_LEN_MIN,
        }
    }
}
