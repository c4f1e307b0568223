//! Isochron marker, SIU to host: the isochron left the SIU with its timestamp. It sorts in
//! its pulse's bucket where the isochron does, so the host runs its local part there.

use super::codec::{Fields, begin, open, push_u16, push_u32, push_u64, seal};
use super::{DecodeError, Kind};
use crate::logical::Pulse;

/// Encoded length of an isochron marker.
pub const CHR_LEN: usize = 32;

/// Isochron marker, SIU to host: the isochron left the SIU with timestamp `ts`. 32 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct IsochronMarker {
    /// The isochron's id from its start-of-isochron packet.
    pub iso_id: u32,
    /// This host (the isochron's source).
    pub source: u16,
    /// The isochron's timestamp.
    pub ts: Pulse,
    /// The isochron's first sequum: the marker sorts where the isochron does.
    pub sequum: u64,
    /// XOR of the CRCs of the isochron's messages as they left the SIU.
    pub crc_xor: u32,
}

impl IsochronMarker {
    /// Appends the encoded packet; returns its CRC.
    pub fn encode(&self, out: &mut Vec<u8>) -> u32 {
        let start = begin(out, Kind::IsochronMarker);
        push_u32(out, self.iso_id);
        push_u16(out, self.source);
        push_u64(out, self.ts.get());
        push_u64(out, self.sequum);
        push_u32(out, self.crc_xor);
        seal(out, start)
    }

    /// Decodes an isochron marker.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut f = Fields::new(open(bytes, Kind::IsochronMarker, CHR_LEN)?);
        let iso_id = f.u32()?;
        let source = f.u16()?;
        let ts = Pulse::new(f.u64()?);
        let sequum = f.u64()?;
        let crc_xor = f.u32()?;
        f.finish(CHR_LEN)?;
        Ok(Self {
            iso_id,
            source,
            ts,
            sequum,
            crc_xor,
        })
    }
}
