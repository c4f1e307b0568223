//! End of isochron, host to SIU: closes the open isochron.

use super::codec::{Fields, begin, open, push_u16, push_u32, seal};
use super::{DecodeError, Kind};

/// Encoded length of an end-of-isochron packet.
pub const EOI_LEN: usize = 12;

/// End of an isochron, host to SIU. 12 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct EndOfIsochron {
    /// Must match the open isochron's `iso_id`.
    pub iso_id: u32,
}

impl EndOfIsochron {
    /// Appends the encoded packet; returns its CRC.
    pub fn encode(&self, out: &mut Vec<u8>) -> u32 {
        let start = begin(out, Kind::EndOfIsochron);
        push_u32(out, self.iso_id);
        push_u16(out, 0);
        seal(out, start)
    }

    /// Decodes an end-of-isochron packet.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut f = Fields::new(open(bytes, Kind::EndOfIsochron, EOI_LEN)?);
        let iso_id = f.u32()?;
        f.reserved(2, "eoi.reserved")?;
        f.finish(EOI_LEN)?;
        Ok(Self { iso_id })
    }
}
