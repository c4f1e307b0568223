//! The datagram network beneath the daemons' links, and its fault settings.
//!
//! Every TM and SIU runs its real link core (AM frames with retransmission, FIFO reordering,
//! hello, credit) over this network, so its faults are the real ones:
//!
//! * a datagram is lost with probability `loss` (the AM layer retransmits after its
//!   retransmission timeout, `rto_us` in the simulator);
//! * a datagram is delayed by the direction's base latency plus jitter, and with probability
//!   `reorder` by an extra delay, so later datagrams overtake it (the AM layer's FIFO
//!   reorder buffer puts them back in order);
//! * with probability `dup` a second copy is delivered (the AM layer drops it);
//! * **token corruption** (`token_corrupt`) happens above the link: a token handed to its
//!   receiver has one byte flipped, so the receiver must refuse it for its CRC and the
//!   lost-token algorithm recover.
//!
//! The host↔SIU link is in-process with a fixed latency and no faults.

use crate::rng::SimRng;

/// An inclusive range of microseconds, `lo..=hi`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RangeUs {
    /// Smallest value.
    pub lo: u64,
    /// Largest value.
    pub hi: u64,
}

impl RangeUs {
    /// `lo..=hi`; panics if `lo > hi` (validate user input before).
    pub fn new(lo: u64, hi: u64) -> Self {
        assert!(lo <= hi, "range {lo}..{hi} is empty");
        Self { lo, hi }
    }

    /// A range holding one value.
    pub fn fixed(v: u64) -> Self {
        Self { lo: v, hi: v }
    }

    /// A uniform draw.
    pub fn draw(&self, rng: &mut SimRng) -> u64 {
        rng.range_inclusive(self.lo, self.hi)
    }
}

impl std::fmt::Display for RangeUs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}..{}", self.lo, self.hi)
    }
}

/// Why a fault setting is unusable.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FaultError {
    /// A probability outside `[0, 1)`.
    #[error("{name} must be a probability in [0, 1), got {value}")]
    Probability {
        /// The setting.
        name: &'static str,
        /// Its value.
        value: f64,
    },
    /// A range whose low end exceeds its high end.
    #[error("{name} range {lo}..{hi} is empty (need lo <= hi)")]
    Range {
        /// The setting.
        name: &'static str,
        /// Low end.
        lo: u64,
        /// High end.
        hi: u64,
    },
    /// A value that must be positive.
    #[error("{name} must be at least 1")]
    Zero {
        /// The setting.
        name: &'static str,
    },
}

/// The datagram network's faults and timing, the same for every channel.
#[derive(Debug, Clone, PartialEq)]
pub struct Faults {
    /// Base one-way latency of a channel direction, drawn once per direction.
    pub latency_us: RangeUs,
    /// Extra delay of each datagram.
    pub jitter_us: RangeUs,
    /// Probability a datagram transmission is lost (the transport retransmits it).
    pub loss: f64,
    /// Probability a datagram is duplicated (the transport absorbs the copy).
    pub dup: f64,
    /// Probability a datagram is overtaken by a later one (the transport holds the later
    /// ones back until it arrives).
    pub reorder: f64,
    /// How long a reordered datagram is late.
    pub reorder_delay_us: RangeUs,
    /// Retransmission timeout of the transport.
    pub rto_us: u64,
    /// Probability a token is delivered with one byte flipped (dropped for a bad CRC).
    pub token_corrupt: f64,
    /// One-way latency of the host↔SIU links (FIFO, no faults).
    pub host_latency_us: u64,
}

impl Default for Faults {
    fn default() -> Self {
        Self {
            latency_us: RangeUs::new(20, 80),
            jitter_us: RangeUs::new(0, 20),
            loss: 0.0,
            dup: 0.0,
            reorder: 0.0,
            reorder_delay_us: RangeUs::new(1, 100),
            rto_us: 300,
            token_corrupt: 0.0,
            host_latency_us: 2,
        }
    }
}

impl Faults {
    /// Checks every setting.
    pub fn validate(&self) -> Result<(), FaultError> {
        for (name, value) in [
            ("loss", self.loss),
            ("dup", self.dup),
            ("reorder", self.reorder),
            ("token-corrupt", self.token_corrupt),
        ] {
            if !(0.0..1.0).contains(&value) {
                return Err(FaultError::Probability { name, value });
            }
        }
        for (name, r) in [
            ("latency-us", self.latency_us),
            ("jitter-us", self.jitter_us),
            ("reorder-delay-us", self.reorder_delay_us),
        ] {
            if r.lo > r.hi {
                return Err(FaultError::Range {
                    name,
                    lo: r.lo,
                    hi: r.hi,
                });
            }
        }
        if self.rto_us == 0 {
            return Err(FaultError::Zero { name: "rto-us" });
        }
        Ok(())
    }
}

/// What the network did, summed over all channels.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NetStats {
    /// Datagrams the daemons sent (AM frames: requests, replies, acks).
    pub datagrams: u64,
    /// Datagrams lost (the AM layer retransmits what it needs).
    pub retransmissions: u64,
    /// Datagrams delayed so that later ones overtook them.
    pub reordered: u64,
    /// Datagrams delivered twice (the AM layer drops the copy).
    pub duplicates_absorbed: u64,
    /// Tokens delivered with a flipped byte.
    pub tokens_corrupted: u64,
}

/// One direction of the in-process host↔SIU link: fixed latency, FIFO.
#[derive(Debug, Clone)]
pub(crate) struct Channel {
    base_latency_us: u64,
    last_delivery_us: u64,
}

impl Channel {
    /// A channel with a fixed latency and no faults (host↔SIU).
    pub(crate) fn fixed(latency_us: u64) -> Self {
        Self {
            base_latency_us: latency_us,
            last_delivery_us: 0,
        }
    }

    /// Delivery time of a packet handed to a fault-free channel at `now_us`.
    pub(crate) fn fixed_transit(&mut self, now_us: u64) -> u64 {
        self.deliver_at(now_us + self.base_latency_us)
    }

    /// FIFO: never before the previous delivery on this direction.
    fn deliver_at(&mut self, arrival_us: u64) -> u64 {
        let at = arrival_us.max(self.last_delivery_us);
        self.last_delivery_us = at;
        at
    }
}

/// Flips one byte of `bytes` (a token) so its CRC no longer matches.
pub(crate) fn corrupt(bytes: &mut [u8], rng: &mut SimRng) {
    if bytes.is_empty() {
        return;
    }
    let at = rng.below(bytes.len() as u64) as usize;
    let flip = rng.range_inclusive(1, 255) as u8;
    bytes[at] ^= flip;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_the_setting() {
        let f = Faults {
            loss: 1.0,
            ..Faults::default()
        };
        assert!(f.validate().unwrap_err().to_string().contains("loss"));
        let f = Faults {
            jitter_us: RangeUs { lo: 5, hi: 1 },
            ..Faults::default()
        };
        assert!(f.validate().unwrap_err().to_string().contains("jitter"));
    }

    #[test]
    fn corruption_always_breaks_the_crc() {
        use isotach_proto::packet::Token;
        let mut rng = SimRng::new(1);
        for _ in 0..1_000 {
            let mut b = Token::default().to_bytes();
            corrupt(&mut b, &mut rng);
            assert!(Token::decode(&b).is_err());
        }
    }
}
