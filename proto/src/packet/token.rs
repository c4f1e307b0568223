//! The token: ends a pulse on the link it travels (`docs/design.md`, "Why logical time holds").
//! Carries the 2-bit wave sequence number, the repeat/reset/end-of-epoch/restart/busy flags,
//! the barrier and signal bits and the logical-time generation.

use super::codec::{Fields, begin, check_bits, open, push_u16, push_u32, seal};
use super::{BARRIER_MASK, DecodeError, Kind};
use crate::logical::{Generation, WaveSeq};

/// Encoded length of a token.
pub const TOKEN_LEN: usize = 16;

/// Token flag bits (byte 2, above the 2-bit sequence number).
mod token_flags {
    use crate::logical::WaveSeq;
    pub(super) const SEQ: u8 = WaveSeq::BITS;
    pub(super) const REPEAT: u8 = 0b0000_0100;
    pub(super) const RESET: u8 = 0b0000_1000;
    pub(super) const END_OF_EPOCH: u8 = 0b0001_0000;
    pub(super) const RESTART: u8 = 0b0010_0000;
    pub(super) const BUSY: u8 = 0b0100_0000;
    pub(super) const ALL: u8 = SEQ | REPEAT | RESET | END_OF_EPOCH | RESTART | BUSY;
}

/// A token: ends a pulse on the link it travels. 16 bytes on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Token {
    /// 2-bit sequence number (`start` = 1; a reply to `r` carries `(r + 1) mod 4`).
    pub seq: WaveSeq,
    /// A resend by the lost-token algorithm.
    pub repeat: bool,
    /// The reset signal, gathered and delivered like the other signals (requirement 37).
    pub reset: bool,
    /// The token that ends an epoch; its signal bits are delivered.
    pub end_of_epoch: bool,
    /// A restart token: logical time starts again in `generation` (which must be newer than the
    /// receiver's). Not a wave token: its sequence number is 0 and it ends no pulse.
    pub restart: bool,
    /// The sender has work that needs logical time to advance (idle pacing,
    /// `docs/design.md`, "Idle pacing"): a token manager that receives it sends its next wave
    /// at once instead of waiting `timing.idle-pace-us`. A hint only: it changes when tokens
    /// go, never which, so a wrong value costs speed or latency, not correctness.
    pub busy: bool,
    /// Barrier bits (bit b = barrier b).
    pub barrier: u8,
    /// Application signal bits.
    pub signals: u8,
    /// The sender's port: a host id, or `0x8000 | switch id` for a token manager.
    pub source_port: u16,
    /// Logical-time generation (bumped by every restart, compared in serial-number arithmetic);
    /// tokens of another generation are dropped.
    pub generation: Generation,
}

impl Token {
    /// Appends the encoded token; returns its CRC.
    pub fn encode(&self, out: &mut Vec<u8>) -> u32 {
        debug_assert!(self.barrier & !BARRIER_MASK == 0);
        let start = begin(out, Kind::Token);
        let mut flags = self.seq.bits();
        if self.repeat {
            flags |= token_flags::REPEAT;
        }
        if self.reset {
            flags |= token_flags::RESET;
        }
        if self.end_of_epoch {
            flags |= token_flags::END_OF_EPOCH;
        }
        if self.restart {
            flags |= token_flags::RESTART;
        }
        if self.busy {
            flags |= token_flags::BUSY;
        }
        out.push(flags);
        out.push(self.barrier & BARRIER_MASK);
        push_u16(out, self.source_port);
        out.push(self.signals);
        out.push(0);
        push_u32(out, self.generation.get());
        seal(out, start)
    }

    /// Encodes into a fixed array.
    pub fn to_bytes(&self) -> [u8; TOKEN_LEN] {
        let mut v = Vec::with_capacity(TOKEN_LEN);
        self.encode(&mut v);
        let mut a = [0u8; TOKEN_LEN];
        a.copy_from_slice(&v);
        a
    }

    /// Is `bytes` a valid token marked repeat? A repeat only re-sends one of the last two
    /// tokens; over a reliable link its original is already on the way, so a driver whose
    /// link is full may drop it (the token timer would otherwise fill every queue with
    /// repeats while logical time waits).
    pub fn is_repeat(bytes: &[u8]) -> bool {
        Self::decode(bytes).is_ok_and(|t| t.repeat)
    }

    /// Decodes a token.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut f = Fields::new(open(bytes, Kind::Token, TOKEN_LEN)?);
        let flags = check_bits("token.flags", f.u8()?, token_flags::ALL)?;
        let barrier = check_bits("token.barrier", f.u8()?, BARRIER_MASK)?;
        let source_port = f.u16()?;
        let signals = f.u8()?;
        f.reserved(1, "token.reserved")?;
        let generation = Generation::new(f.u32()?);
        f.finish(TOKEN_LEN)?;
        Ok(Self {
            seq: WaveSeq::from_bits(flags),
            repeat: flags & token_flags::REPEAT != 0,
            reset: flags & token_flags::RESET != 0,
            end_of_epoch: flags & token_flags::END_OF_EPOCH != 0,
            restart: flags & token_flags::RESTART != 0,
            busy: flags & token_flags::BUSY != 0,
            barrier,
            signals,
            source_port,
            generation,
        })
    }
}
