//! What every layout shares: the `[version, kind]` header, the trailing CRC-32, the
//! big-endian field reader and writer, and the checks every decoder runs in the same order
//! (length, version, kind, length bounds, CRC; the kind's own file checks its fields).

use super::{DecodeError, Kind, PLAIN_LEN_MIN, PLAIN_PAYLOAD_MAX};

/// The wire format version this crate speaks.
pub const VERSION: u8 = 1;
/// Bytes of the trailing CRC.
pub const CRC_LEN: usize = 4;
/// Bytes of the header every packet starts with: `[version, kind]`.
pub(super) const HEADER_LEN: usize = 2;
/// Smallest packet of any kind: a header and a CRC.
pub(super) const PACKET_LEN_MIN: usize = HEADER_LEN + CRC_LEN;
/// Number of barriers (bits in a barrier field).
pub const BARRIERS: usize = 2;
/// Mask of valid barrier bits.
pub const BARRIER_MASK: u8 = 0b11;
/// Largest encoded packet (a non-isotach message with the largest payload).
pub const PACKET_LEN_MAX: usize = PLAIN_LEN_MIN + PLAIN_PAYLOAD_MAX;

/// CRC-32 (IEEE) of `bytes`.
pub fn crc32(bytes: &[u8]) -> u32 {
    crc32fast::hash(bytes)
}

/// The CRC carried in the last four bytes of an encoded packet (0 if too short).
pub fn carried_crc(bytes: &[u8]) -> u32 {
    match bytes.len().checked_sub(CRC_LEN) {
        Some(at) => u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]),
        None => 0,
    }
}

/// Reads the kind of an encoded packet after checking its version, without checking the rest.
pub fn peek_kind(bytes: &[u8]) -> Result<Kind, DecodeError> {
    if bytes.len() < PACKET_LEN_MIN {
        return Err(DecodeError::Short {
            need: PACKET_LEN_MIN,
            got: bytes.len(),
        });
    }
    if bytes[0] != VERSION {
        return Err(DecodeError::BadVersion(bytes[0]));
    }
    Kind::from_byte(bytes[1])
}

/// Checks version, kind, length bounds and CRC; returns the body (bytes between the kind
/// byte and the CRC).
pub(super) fn open(bytes: &[u8], kind: Kind, len_max: usize) -> Result<&[u8], DecodeError> {
    let found = peek_kind(bytes)?;
    if found != kind {
        return Err(DecodeError::WrongKind {
            expected: kind,
            found,
        });
    }
    if bytes.len() < kind.len_min() {
        return Err(DecodeError::Short {
            need: kind.len_min(),
            got: bytes.len(),
        });
    }
    if bytes.len() > len_max {
        return Err(DecodeError::Long {
            max: len_max,
            got: bytes.len(),
        });
    }
    let at = bytes.len() - CRC_LEN;
    let computed = crc32(&bytes[..at]);
    let found = carried_crc(bytes);
    if computed != found {
        return Err(DecodeError::BadCrc { found, computed });
    }
    Ok(&bytes[HEADER_LEN..at])
}

/// Appends `[VERSION, kind]`; returns the packet's start offset for [`seal`].
pub(super) fn begin(out: &mut Vec<u8>, kind: Kind) -> usize {
    let start = out.len();
    out.push(VERSION);
    out.push(kind as u8);
    start
}

/// Appends the CRC of everything from `start`; returns it.
pub(super) fn seal(out: &mut Vec<u8>, start: usize) -> u32 {
    let crc = crc32(&out[start..]);
    out.extend_from_slice(&crc.to_be_bytes());
    crc
}

/// Big-endian field reader over a body whose length was already checked.
pub(super) struct Fields<'a> {
    body: &'a [u8],
    at: usize,
}

impl<'a> Fields<'a> {
    pub(super) fn new(body: &'a [u8]) -> Self {
        Self { body, at: 0 }
    }

    pub(super) fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.body.len());
        let Some(end) = end else {
            return Err(DecodeError::Short {
                need: HEADER_LEN + self.at + n + CRC_LEN,
                got: HEADER_LEN + self.body.len() + CRC_LEN,
            });
        };
        let slice = &self.body[self.at..end];
        self.at = end;
        Ok(slice)
    }

    pub(super) fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    pub(super) fn u16(&mut self) -> Result<u16, DecodeError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    pub(super) fn u32(&mut self) -> Result<u32, DecodeError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub(super) fn u64(&mut self) -> Result<u64, DecodeError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }

    /// A reserved field: must be zero.
    pub(super) fn reserved(&mut self, n: usize, field: &'static str) -> Result<(), DecodeError> {
        let b = self.take(n)?;
        match b.iter().find(|&&x| x != 0) {
            Some(&x) => Err(DecodeError::OutOfRange {
                field,
                value: u64::from(x),
            }),
            None => Ok(()),
        }
    }

    /// Everything must have been read.
    pub(super) fn finish(&self, len_max: usize) -> Result<(), DecodeError> {
        if self.at != self.body.len() {
            return Err(DecodeError::Long {
                max: len_max.min(HEADER_LEN + self.at + CRC_LEN),
                got: HEADER_LEN + self.body.len() + CRC_LEN,
            });
        }
        Ok(())
    }
}

/// A flags field: bits outside `mask` must be zero.
pub(super) fn check_bits(field: &'static str, value: u8, mask: u8) -> Result<u8, DecodeError> {
    if value & !mask != 0 {
        return Err(DecodeError::OutOfRange {
            field,
            value: u64::from(value),
        });
    }
    Ok(value)
}

pub(super) fn push_u16(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_be_bytes());
}
pub(super) fn push_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_be_bytes());
}
pub(super) fn push_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_be_bytes());
}
