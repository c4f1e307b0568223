//! Start of isochron, host to SIU: opens an isochron and says how the SIU stamps it
//! (channel, sequence set, logged TS, gap, send delta, isochron distance).

use super::codec::{Fields, begin, check_bits, open, push_u16, push_u32, seal};
use super::{DecodeError, Kind};

/// Encoded length of a start-of-isochron packet.
pub const SOI_LEN: usize = 24;

mod soi_flags {
    pub(super) const LOGGED: u8 = 0b01;
    pub(super) const HOST_GAP: u8 = 0b10;
    pub(super) const ALL: u8 = LOGGED | HOST_GAP;
}

/// Valid bits of the sequence-set byte: the set is 0 or 1.
const SEQSET_MASK: u8 = 0b1;

/// Start of an isochron, host to SIU. 24 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct StartOfIsochron {
    /// Host-chosen id, echoed in the isochron marker.
    pub iso_id: u32,
    /// Channel (requirement 27).
    pub channel: u8,
    /// Sequence set, 0 or 1 (requirement 27).
    pub seqset: u8,
    /// The TS of this isochron bounds later isochrons of the other set.
    pub logged: bool,
    /// The host supplies `gap` for the logged TS (requirement 28).
    pub host_gap: bool,
    /// Host-supplied gap, used when `host_gap` is set.
    pub gap: u32,
    /// Extra pulses of slack so tokens may flow while the isochron is sent (requirement 25).
    pub send_delta: u32,
    /// Isochron distance: the largest logical distance to any destination (≥ 1).
    pub distance: u16,
}

impl StartOfIsochron {
    /// Appends the encoded packet; returns its CRC.
    pub fn encode(&self, out: &mut Vec<u8>) -> u32 {
        let start = begin(out, Kind::StartOfIsochron);
        push_u32(out, self.iso_id);
        out.push(self.channel);
        out.push(self.seqset);
        let mut flags = 0;
        if self.logged {
            flags |= soi_flags::LOGGED;
        }
        if self.host_gap {
            flags |= soi_flags::HOST_GAP;
        }
        out.push(flags);
        out.push(0);
        push_u16(out, self.distance);
        push_u32(out, self.gap);
        push_u32(out, self.send_delta);
        seal(out, start)
    }

    /// Decodes a start-of-isochron packet.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut f = Fields::new(open(bytes, Kind::StartOfIsochron, SOI_LEN)?);
        let iso_id = f.u32()?;
        let channel = f.u8()?;
        let seqset = check_bits("soi.seqset", f.u8()?, SEQSET_MASK)?;
        let flags = check_bits("soi.flags", f.u8()?, soi_flags::ALL)?;
        f.reserved(1, "soi.reserved")?;
        let distance = f.u16()?;
        if distance == 0 {
            return Err(DecodeError::OutOfRange {
                field: "soi.distance",
                value: 0,
            });
        }
        let gap = f.u32()?;
        let send_delta = f.u32()?;
        f.finish(SOI_LEN)?;
        Ok(Self {
            iso_id,
            channel,
            seqset,
            logged: flags & soi_flags::LOGGED != 0,
            host_gap: flags & soi_flags::HOST_GAP != 0,
            gap,
            send_delta,
            distance,
        })
    }
}
