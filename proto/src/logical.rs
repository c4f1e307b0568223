//! The numbers of logical time as types of their own: a pulse (a timestamp), a generation and
//! a wave's sequence number on the wire. Each offers only what the protocol defines on it — a generation wraps,
//! so it is compared with [`Generation::newer_than`], never with `<`; a wave sequence number
//! is two bits and only ever classified against what a link accepted (`wave::classify`).

use std::fmt;

/// A pulse of logical time: the timestamp an SIU gives an isochron and every message of it,
/// and the pulse an EOP marker ends. Pulses only move forward within a generation (64 bits do
/// not wrap), so they are ordered; they are not counts, so they have no arithmetic: the SIU's
/// and SMM's clocks count with the number ([`Pulse::get`]) and convert at their edge.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Pulse(u64);

impl Pulse {
    /// The first pulse of a generation.
    pub const ZERO: Self = Self(0);

    /// The pulse numbered `raw` (as the wire carries it).
    pub const fn new(raw: u64) -> Self {
        Self(raw)
    }

    /// The number the wire carries.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for Pulse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A logical-time generation: bumped by every restart of logical time, carried by every token
/// and stamped into every isotach message, compared in serial-number arithmetic (RFC 1982).
/// Generation 0 is the one before anything started; the first start is generation 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Generation(u32);

impl Generation {
    /// Before logical time first started.
    pub const NONE: Self = Self(0);
    /// Half the 32-bit space: a generation this far ahead or more is not newer (RFC 1982).
    const NEWER_SPAN_MAX: u32 = 0x8000_0000;

    /// The generation numbered `raw` (as the wire carries it).
    pub const fn new(raw: u32) -> Self {
        Self(raw)
    }

    /// The number the wire carries.
    pub const fn get(self) -> u32 {
        self.0
    }

    /// The generation a restart from this one starts (wrapping).
    pub const fn next(self) -> Self {
        Self(self.0.wrapping_add(1))
    }

    /// Whether this generation is newer than `other`, in serial-number arithmetic: the 32-bit
    /// generation wraps, and a forged or corrupted huge generation cannot pin a node for good —
    /// the next restart after it is newer again.
    pub const fn newer_than(self, other: Self) -> bool {
        let d = self.0.wrapping_sub(other.0);
        d != 0 && d < Self::NEWER_SPAN_MAX
    }
}

impl fmt::Display for Generation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A wave's sequence number as a token carries it: the wave number mod 4 (two bits).
/// The four values are unambiguous because a sender is at most two waves ahead of what its
/// receiver accepted (`docs/design.md`, "Why logical time holds").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct WaveSeq(u8);

impl WaveSeq {
    /// The two bits a token's flags byte carries.
    pub const BITS: u8 = 0b11;

    /// The sequence number of wave `n` (waves are numbered 1, 2, 3, … on a link).
    pub const fn of_wave(n: u64) -> Self {
        Self((n % 4) as u8)
    }

    /// The sequence number in the low two bits of `bits` (the rest is ignored).
    pub const fn from_bits(bits: u8) -> Self {
        Self(bits & Self::BITS)
    }

    /// The two bits (0..=3).
    pub const fn bits(self) -> u8 {
        debug_assert!(self.0 <= Self::BITS);
        self.0
    }

    /// How many waves this one is past `other`, mod 4.
    pub const fn after(self, other: Self) -> u8 {
        self.0.wrapping_sub(other.0) & Self::BITS
    }
}

impl fmt::Display for WaveSeq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generations_compare_across_the_wrap() {
        let g = Generation::new;
        assert!(g(1).newer_than(g(0)));
        assert!(!g(0).newer_than(g(0)));
        assert!(!g(0).newer_than(g(1)));
        assert!(g(0).newer_than(g(u32::MAX)), "0 follows u32::MAX");
        assert!(g(u32::MAX).newer_than(g(0x8000_0000)));
        assert!(
            !g(0x8000_0000).newer_than(g(0)),
            "half the space away is not newer"
        );
        assert_eq!(g(u32::MAX).next(), g(0));
        assert!(g(u32::MAX).next().newer_than(g(u32::MAX)));
    }

    #[test]
    fn wave_sequence_numbers_are_two_bits_mod_4() {
        assert_eq!(WaveSeq::of_wave(1).bits(), 1);
        assert_eq!(WaveSeq::of_wave(4).bits(), 0);
        assert_eq!(WaveSeq::of_wave(u64::MAX).bits(), 3);
        assert_eq!(WaveSeq::from_bits(0xff).bits(), 3);
        assert_eq!(WaveSeq::of_wave(1).after(WaveSeq::of_wave(3)), 2);
        assert_eq!(WaveSeq::of_wave(3).after(WaveSeq::of_wave(3)), 0);
    }
}
