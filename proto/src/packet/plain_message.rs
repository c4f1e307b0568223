//! Non-isotach message: passed through FIFO, never waits on logical time (read replies and
//! state-transfer images between SMM nodes ride in it).

use super::codec::{Fields, PACKET_LEN_MAX, begin, open, push_u16, seal};
use super::{DecodeError, Kind};

/// Largest payload of a non-isotach message.
pub const PLAIN_PAYLOAD_MAX: usize = 4096;
/// Encoded length of a non-isotach message without its payload.
pub const PLAIN_LEN_MIN: usize = 12;

/// A non-isotach message: passed through FIFO, never waits on logical time.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct PlainMessage {
    /// Source host.
    pub source: u16,
    /// Destination host.
    pub dest: u16,
    /// At most [`PLAIN_PAYLOAD_MAX`] bytes.
    pub payload: Vec<u8>,
}

/// A decoded non-isotach message whose payload stays in the packet's buffer: what the SIU and
/// the SMM read on the hot path (a read's answer) without copying the payload out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlainView<'a> {
    /// Source host.
    pub source: u16,
    /// Destination host.
    pub dest: u16,
    /// At most [`PLAIN_PAYLOAD_MAX`] bytes.
    pub payload: &'a [u8],
}

impl PlainView<'_> {
    /// Appends the encoded packet; returns its CRC.
    pub fn encode(&self, out: &mut Vec<u8>) -> u32 {
        debug_assert!(self.payload.len() <= PLAIN_PAYLOAD_MAX);
        let start = begin(out, Kind::Plain);
        push_u16(out, self.source);
        push_u16(out, self.dest);
        push_u16(out, self.payload.len() as u16);
        out.extend_from_slice(self.payload);
        seal(out, start)
    }
}

impl PlainMessage {
    /// Appends the encoded packet; returns its CRC.
    pub fn encode(&self, out: &mut Vec<u8>) -> u32 {
        self.view().encode(out)
    }

    /// This message, its payload borrowed.
    pub fn view(&self) -> PlainView<'_> {
        PlainView {
            source: self.source,
            dest: self.dest,
            payload: &self.payload,
        }
    }

    /// Decodes a non-isotach message.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let v = Self::parse(bytes)?;
        Ok(Self {
            source: v.source,
            dest: v.dest,
            payload: v.payload.to_vec(),
        })
    }

    /// Checks a non-isotach message exactly as [`PlainMessage::decode`] does, without
    /// copying its payload out.
    pub fn parse(bytes: &[u8]) -> Result<PlainView<'_>, DecodeError> {
        let mut f = Fields::new(open(bytes, Kind::Plain, PACKET_LEN_MAX)?);
        let source = f.u16()?;
        let dest = f.u16()?;
        let len = usize::from(f.u16()?);
        if len > PLAIN_PAYLOAD_MAX {
            return Err(DecodeError::OutOfRange {
                field: "plain.len",
                value: len as u64,
            });
        }
        let payload = f.take(len)?;
        f.finish(PACKET_LEN_MAX)?;
        Ok(PlainView {
            source,
            dest,
            payload,
        })
    }
}
