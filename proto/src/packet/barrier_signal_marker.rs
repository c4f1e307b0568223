//! Barrier/signal marker, host to SIU: enter barriers, raise signals, ask for the reset
//! signal. The SIU puts them on its tokens.

use super::codec::{BARRIER_MASK, Fields, begin, check_bits, open, push_u32, seal};
use super::{DecodeError, Kind};

/// Encoded length of a barrier/signal marker.
pub const BSM_LEN: usize = 16;

mod bsm_flags {
    pub(super) const RESET: u8 = 0b1;
    pub(super) const ALL: u8 = RESET;
}

/// Barrier/signal marker, host to SIU: enter barriers and raise signals. 16 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct BarrierSignalMarker {
    /// Barriers the host enters.
    pub barrier: u8,
    /// Rounds the barriers entered run before they complete (at least 1; every host uses the
    /// same count). The SIU refuses 0 and a barrier already in progress.
    pub barrier_count: u32,
    /// Signal bits the host raises.
    pub signals: u8,
    /// The host asks for a reset signal.
    pub reset: bool,
}

impl BarrierSignalMarker {
    /// Appends the encoded packet; returns its CRC.
    pub fn encode(&self, out: &mut Vec<u8>) -> u32 {
        let start = begin(out, Kind::BarrierSignalMarker);
        out.push(self.barrier & BARRIER_MASK);
        out.push(self.signals);
        out.push(if self.reset { bsm_flags::RESET } else { 0 });
        out.extend_from_slice(&[0, 0, 0]);
        push_u32(out, self.barrier_count);
        seal(out, start)
    }

    /// Decodes a barrier/signal marker.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut f = Fields::new(open(bytes, Kind::BarrierSignalMarker, BSM_LEN)?);
        let barrier = check_bits("bsm.barrier", f.u8()?, BARRIER_MASK)?;
        let signals = f.u8()?;
        let reset = check_bits("bsm.flags", f.u8()?, bsm_flags::ALL)? & bsm_flags::RESET != 0;
        f.reserved(3, "bsm.reserved")?;
        let barrier_count = f.u32()?;
        f.finish(BSM_LEN)?;
        Ok(Self {
            barrier,
            barrier_count,
            signals,
            reset,
        })
    }
}
