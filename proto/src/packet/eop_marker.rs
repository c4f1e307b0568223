//! End-of-pulse marker, SIU to host: the pulse ended. Carries what the token that ended it
//! said (signals, barriers, reset, end of epoch), how many packets the pulse delivered and
//! the sort vector that orders up to [`SORT_VECTOR_MAX`] of them.

use super::codec::{
    BARRIER_MASK, Fields, begin, check_bits, open, push_u16, push_u32, push_u64, seal,
};
use super::{DecodeError, Kind};
use crate::logical::Pulse;

/// Most entries a sort vector carries (the hardware bucket size).
pub const SORT_VECTOR_MAX: usize = 32;
/// Encoded length of an EOP marker without its sort vector.
pub const EOP_LEN_MIN: usize = 32;

mod eop_flags {
    pub(super) const REPEAT: u8 = 0b001;
    pub(super) const RESET: u8 = 0b010;
    pub(super) const END_OF_EPOCH: u8 = 0b100;
    pub(super) const ALL: u8 = REPEAT | RESET | END_OF_EPOCH;
}

/// End-of-pulse marker, SIU to host. 32 bytes plus one byte per sort-vector entry.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct EopMarker {
    /// The pulse this marker ends (don't-care in host mode).
    pub ts: Pulse,
    /// Isotach messages plus isochron markers the SIU sent the host with TS `ts`; may exceed
    /// the sort vector. 0 on a host-mode repeat.
    pub count: u32,
    /// Host mode: the token that caused this marker was a repeat; count and vector are absent.
    pub repeat: bool,
    /// Reset signal (requirement 37).
    pub reset: bool,
    /// The token that ended the pulse ended an epoch.
    pub end_of_epoch: bool,
    /// Signal bits (requirements 37, 39).
    pub signals: u8,
    /// Barrier bits: barriers completed by this pulse's token (requirements 38, 39).
    pub barrier: u8,
    /// Kind byte copied from token `ts + 1` (requirement 16).
    pub token_kind: u8,
    /// CRC copied from token `ts + 1` (requirement 16).
    pub token_crc: u32,
    /// Arrival indices (from 0, in the order the host received the pulse's packets) listed in
    /// (source, sequum) order; at most [`SORT_VECTOR_MAX`] entries.
    pub sort_vector: Vec<u8>,
}

impl EopMarker {
    /// Appends the encoded packet; returns its CRC.
    pub fn encode(&self, out: &mut Vec<u8>) -> u32 {
        debug_assert!(self.sort_vector.len() <= SORT_VECTOR_MAX);
        let start = begin(out, Kind::EopMarker);
        let mut flags = 0;
        if self.repeat {
            flags |= eop_flags::REPEAT;
        }
        if self.reset {
            flags |= eop_flags::RESET;
        }
        if self.end_of_epoch {
            flags |= eop_flags::END_OF_EPOCH;
        }
        out.push(flags);
        out.push(self.barrier & BARRIER_MASK);
        out.push(self.signals);
        out.push(self.sort_vector.len() as u8);
        push_u16(out, 0);
        push_u64(out, self.ts.get());
        push_u32(out, self.count);
        push_u32(out, self.token_crc);
        out.push(self.token_kind);
        out.extend_from_slice(&[0, 0, 0]);
        out.extend_from_slice(&self.sort_vector);
        seal(out, start)
    }

    /// Decodes an EOP marker. The sort vector must be a permutation of `0..len` and no
    /// longer than `count`.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let len_max = EOP_LEN_MIN + SORT_VECTOR_MAX;
        let mut f = Fields::new(open(bytes, Kind::EopMarker, len_max)?);
        let flags = check_bits("eop.flags", f.u8()?, eop_flags::ALL)?;
        let barrier = check_bits("eop.barrier", f.u8()?, BARRIER_MASK)?;
        let signals = f.u8()?;
        let sort_len = usize::from(f.u8()?);
        if sort_len > SORT_VECTOR_MAX {
            return Err(DecodeError::OutOfRange {
                field: "eop.sort_len",
                value: sort_len as u64,
            });
        }
        f.reserved(2, "eop.reserved")?;
        let ts = Pulse::new(f.u64()?);
        let count = f.u32()?;
        if sort_len as u64 > u64::from(count) {
            return Err(DecodeError::OutOfRange {
                field: "eop.sort_len",
                value: sort_len as u64,
            });
        }
        let token_crc = f.u32()?;
        let token_kind = f.u8()?;
        f.reserved(3, "eop.reserved2")?;
        let sort_vector = f.take(sort_len)?.to_vec();
        let mut seen = 0u64;
        for &e in &sort_vector {
            if usize::from(e) >= sort_len || seen & (1 << e) != 0 {
                return Err(DecodeError::OutOfRange {
                    field: "eop.sort_vector",
                    value: u64::from(e),
                });
            }
            seen |= 1 << e;
        }
        f.finish(len_max)?;
        Ok(Self {
            ts,
            count,
            repeat: flags & eop_flags::REPEAT != 0,
            reset: flags & eop_flags::RESET != 0,
            end_of_epoch: flags & eop_flags::END_OF_EPOCH != 0,
            signals,
            barrier,
            token_kind,
            token_crc,
            sort_vector,
        })
    }
}
