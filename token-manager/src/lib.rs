//! The token manager (TM): a sans-IO state machine of a software isotach switch.
//!
//! A TM has one reliable FIFO link per neighbour: the SIUs of the hosts attached to its
//! switch and the TMs of neighbouring switches. It runs token waves (wave `k + 1` goes out
//! only after token `k` arrived from every neighbour), barrier rounds, signal epochs, reset
//! waves and the lost-token timer, and it **forwards isotach traffic**: a message goes onto its
//! output link ahead of the first wave the TM sends after it arrived, so it precedes every
//! token the TM sends that link later (the FIFO guarantee the hardware switch gave for free).
//! It *rides with that wave* rather than leaving the moment it arrives: the order of messages
//! and tokens on every link is the same either way (no wave goes out in between), and the
//! messages share the wave's datagram instead of waking the neighbour once more each.
//! Non-isotach traffic, which never waits on logical time, leaves at once.
//!
//! Like the SIU it owns no sockets, threads, clocks or randomness: input goes in through
//! [`TokenManager::handle_input`] and [`TokenManager::handle_timeout`], output comes out of
//! [`TokenManager::poll_transmit`] and [`TokenManager::poll_timeout`].
//!
//! The code: this file holds the configuration, the counters, the state and that API (input
//! decoding, queue limits, timers); `waves` the tokens, the wave rule, epochs' signals,
//! barrier bits and restarts; `forward` riding and held messages; `pacing` idle pacing and
//! busy news.
//!
//! Barriers run over the trunks, which form a tree (the topology refuses a cycle): a TM sends
//! round `r` of barrier `b` to a trunk neighbour once every *other* neighbour reached round
//! `r`, and to a host once *every* neighbour did. Round `r` from a neighbour therefore means "every host on that side entered round
//! `r`", and a host hears round `r` only when every host has entered it.
//!
//! **Idle pacing** (`timing.idle-pace-us`, `docs/design.md`, "Idle pacing"): a wave that is
//! ready (every neighbour's token arrived) goes out at once only if something needs logical
//! time — a token that gates it said BUSY, a BUSY token (even a duplicate or an early one)
//! arrived since the last wave, or a message passed through this TM whose pulse has not ended
//! (every wave up to its TS + 1 goes unpaced). Otherwise the
//! TM arms a pace timer and sends the wave when it fires ([`TokenManager::poll_timeout`]), or
//! as soon as busy news arrives. Pacing only delays a wave: the wave rule, forwarding and the
//! lost-token timer are unchanged. BUSY spreads between TMs over the trunks (a tree),
//! never back to the link it came from, so it dies out once nothing is busy.

#![warn(missing_docs)]

use isotach_proto::Generation;
use isotach_proto::Input;
use isotach_proto::config::{EPOCH_PULSES_MIN, Limits, Timing};
use isotach_proto::packet::{self, BARRIERS, BufPool, DecodeError, IsotachMessage, Kind, Token};
use isotach_proto::topology::{Hop, SwitchId, Topology};
use isotach_proto::wave::LastTwo;
use std::collections::VecDeque;
use std::sync::Arc;
use thiserror::Error;

/// Index of a link (a neighbour) of a token manager.
pub type LinkId = usize;

/// Configuration of one token manager.
#[derive(Debug, Clone)]
pub struct TmConfig {
    /// The switch this TM manages.
    pub switch: SwitchId,
    /// The cluster topology.
    pub topology: Arc<Topology>,
    /// Token timer and epoch length.
    pub timing: Timing,
    /// Queue limits.
    pub limits: Limits,
}

/// Why the TM refused or dropped an input. It stays usable after every error.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TmError {
    /// No such link.
    #[error("link {0} does not exist")]
    NoSuchLink(LinkId),
    /// Undecodable bytes (a token with a bad CRC lands here and is dropped).
    #[error("undecodable packet on link {link}: {error}")]
    Decode {
        /// The link.
        link: LinkId,
        /// Why.
        error: DecodeError,
    },
    /// A packet kind a TM never handles (markers belong between a host and its SIU).
    #[error("a {kind:?} packet is not expected on link {link}")]
    UnexpectedKind {
        /// The link.
        link: LinkId,
        /// Its kind.
        kind: Kind,
    },
    /// A token whose source port is not the neighbour on that link.
    #[error("token on link {link} claims port {port:#06x}, expected {expected:#06x}")]
    ForeignToken {
        /// The link.
        link: LinkId,
        /// The claimed port.
        port: u16,
        /// The neighbour's port.
        expected: u16,
    },
    /// A message to a host that does not exist.
    #[error("message for unknown host {0}")]
    NoSuchHost(u16),
    /// The output queue is full; the input was not consumed.
    #[error("output queue full ({0} packets); input not consumed")]
    Backpressure(usize),
}

/// Counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TmStats {
    /// Waves sent (one token to every link each).
    pub waves: u64,
    /// In-sequence tokens accepted.
    pub tokens_accepted: u64,
    /// Duplicate tokens ignored.
    pub tokens_duplicate: u64,
    /// Early tokens dropped.
    pub tokens_early: u64,
    /// Tokens dropped for a bad CRC, a foreign port or a stale generation.
    pub tokens_dropped: u64,
    /// Repeat tokens sent by the lost-token timer.
    pub tokens_repeated: u64,
    /// Waves held back by idle pacing (each went out when its pace timer fired or busy news
    /// released it).
    pub waves_paced: u64,
    /// Paced waves released before their pace timer fired (a BUSY token or a message).
    pub waves_released: u64,
    /// Isotach and non-isotach messages forwarded.
    pub messages_forwarded: u64,
    /// Isotach messages held for a neighbour that had not started yet (released later).
    pub messages_held: u64,
    /// Times the messages riding with the next wave left at once to make room in a queue
    /// near its limit.
    pub riding_released_for_room: u64,
    /// Isotach messages of another generation than this TM's dropped (stamped by their
    /// source SIU): sent before a restart this TM took, or held or riding here when one
    /// came. Delivered, they would land in a pulse of another generation.
    pub messages_stale: u64,
    /// Barrier rounds sent to hosts (barrier waves).
    pub barrier_rounds: u64,
    /// Logical-time restarts.
    pub resets: u64,
    /// Inputs refused with an error.
    pub errors: u64,
}

/// One neighbour.
#[derive(Debug, Clone)]
struct Link {
    peer: Hop,
    port: u16,
    /// In-sequence tokens accepted from this neighbour.
    accepted: u64,
    last_two: LastTwo,
    barrier_recv: [u32; BARRIERS],
    barrier_sent: [u32; BARRIERS],
    /// Isotach messages for this neighbour held until it proves it started this generation
    /// (its first token arrives): an unstarted SIU would refuse them, and they must not be
    /// lost. Released before any wave after wave 1, so they still precede the token that ends
    /// their pulse.
    held: VecDeque<Vec<u8>>,
    /// Isotach messages for this neighbour that leave with the next wave, just ahead of its
    /// token (see the crate documentation).
    riding: Vec<Vec<u8>>,
    /// Busy news from this neighbour (a BUSY token, a message it sent through us): every wave
    /// up to this one goes out unpaced. 0: none in this generation.
    busy_until_wave: u64,
}

/// Signals gathered for one epoch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct EpochSignals {
    epoch: u64,
    signals: u8,
    reset: bool,
}

/// A token manager. See the crate documentation.
#[derive(Debug)]
pub struct TokenManager {
    cfg: TmConfig,
    port: u16,
    links: Vec<Link>,
    /// `route[host]`: the link towards that host.
    route: Vec<LinkId>,
    started: bool,
    generation: Generation,
    waves: u64,
    /// Signals for the current epoch and the next (neighbours run at most one wave ahead).
    epoch_signals: [EpochSignals; 2],
    token_deadline_us: Option<u64>,
    /// When the next wave, ready but idle, goes out (idle pacing); `None` when not pacing.
    pace_deadline_us: Option<u64>,
    out: VecDeque<(LinkId, Vec<u8>)>,
    /// Messages held in all links (counted against the queue limit).
    held: usize,
    /// Messages riding with the next wave in all links (counted against the queue limit).
    riding: usize,
    /// Buffers for the tokens this TM builds, handed in by its driver
    /// ([`TokenManager::buffers`]).
    pool: BufPool,
    stats: TmStats,
}

impl TokenManager {
    /// A new TM; it waits for a reset token.
    pub fn new(cfg: TmConfig) -> Self {
        let topo = Arc::clone(&cfg.topology);
        assert!(
            usize::from(cfg.switch) < topo.switch_count(),
            "switch not in topology"
        );
        // `epoch_of` divides by it, and signals gathered over an epoch need two pulses at least
        // (the config loader and `check_bounds` refuse fewer).
        assert!(
            cfg.timing.epoch_pulses >= EPOCH_PULSES_MIN,
            "timing.epoch-pulses is {}, below {EPOCH_PULSES_MIN}",
            cfg.timing.epoch_pulses
        );
        let mut links: Vec<Link> = topo
            .hosts_at(cfg.switch)
            .map(|h| Link::new(Hop::Host(h), Topology::host_port(h)))
            .collect();
        for &s in topo.switch_neighbours(cfg.switch) {
            let port = Topology::switch_port(s);
            links.push(Link::new(Hop::Switch(s), port));
        }
        // A TM with no neighbour would send waves forever (every link answered vacuously).
        assert!(!links.is_empty(), "switch {} has no neighbour", cfg.switch);
        let route = (0..topo.host_count() as u16)
            .map(|h| {
                let hop = topo.next_hop(cfg.switch, h);
                links
                    .iter()
                    .position(|l| l.peer == hop)
                    .expect("the next hop towards every host is a neighbour")
            })
            .collect();
        Self {
            port: Topology::switch_port(cfg.switch),
            links,
            route,
            started: false,
            generation: Generation::NONE,
            waves: 0,
            epoch_signals: [EpochSignals::default(); 2],
            token_deadline_us: None,
            pace_deadline_us: None,
            out: VecDeque::new(),
            held: 0,
            riding: 0,
            pool: BufPool::default(),
            stats: TmStats::default(),
            cfg,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &TmConfig {
        &self.cfg
    }

    /// How many links (neighbours) the TM has.
    pub fn link_count(&self) -> usize {
        self.links.len()
    }

    /// The neighbours, indexed by [`LinkId`].
    pub fn links(&self) -> impl Iterator<Item = Hop> + '_ {
        self.links.iter().map(|l| l.peer)
    }

    /// The link to a neighbour.
    pub fn link_to(&self, peer: Hop) -> Option<LinkId> {
        self.links.iter().position(|l| l.peer == peer)
    }

    /// Logical time has started.
    pub fn started(&self) -> bool {
        self.started
    }

    /// Current generation.
    pub fn generation(&self) -> Generation {
        self.generation
    }

    /// Waves sent in this generation.
    pub fn waves(&self) -> u64 {
        self.waves
    }

    /// The buffers this TM builds its tokens in: its driver hands it buffers it is done with
    /// (a received packet's, a spare of its links') so that those cost no allocation once
    /// buffers circulate (`isotach_proto::packet::BufPool`).
    pub fn buffers(&mut self) -> &mut BufPool {
        &mut self.pool
    }

    /// Counters.
    pub fn stats(&self) -> TmStats {
        self.stats
    }

    /// Packets waiting in the output queue, with the messages riding with the next wave.
    pub fn queue_depth(&self) -> usize {
        self.out.len() + self.riding
    }

    /// Packets queued here in all (output queue, riding and held messages), against
    /// `limits.queue_packets_max`.
    fn queued(&self) -> usize {
        self.out.len() + self.riding + self.held
    }

    /// Is the queue too full for one more input? A token can trigger a reset wave plus a
    /// token wave: two packets per link. Riding messages never make it so: they leave at
    /// once instead (forwarding on arrival is always correct), because only a wave frees
    /// them, and a wave may need a token queued behind an input refused for room.
    fn make_room(&mut self) -> bool {
        let limit = self.cfg.limits.queue_packets_max;
        if self.queued() + 2 * self.links.len() > limit && self.riding > 0 {
            for link in 0..self.links.len() {
                self.release_riding(link);
            }
            self.stats.riding_released_for_room += 1;
        }
        debug_assert!(self.riding == 0 || self.queued() + 2 * self.links.len() <= limit);
        self.queued() + 2 * self.links.len() > limit
    }

    /// Next packet to send, with the link it goes on.
    pub fn poll_transmit(&mut self) -> Option<(LinkId, Vec<u8>)> {
        self.out.pop_front()
    }

    /// When [`TokenManager::handle_timeout`] wants to run: the lost-token timer, or the pace
    /// timer of an idle wave, whichever is first.
    pub fn poll_timeout(&self) -> Option<u64> {
        match (self.token_deadline_us, self.pace_deadline_us) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Is the TM holding a ready wave back (idle pacing)?
    pub fn pacing(&self) -> bool {
        self.pace_deadline_us.is_some()
    }

    /// Runs the timers: the pace timer of an idle wave (the wave goes out), then the
    /// lost-token timer (when no wave went out for a token timeout, resend every link its last
    /// two tokens, marked repeat).
    pub fn handle_timeout(&mut self, now_us: u64) {
        // With the output queue full (nobody drains it) tokens would only pile up: skip this
        // round; the timers re-arm.
        let full = self.make_room();
        if let Some(pace) = self.pace_deadline_us
            && now_us >= pace
        {
            if full {
                self.pace_deadline_us = Some(now_us + self.cfg.timing.idle_pace_us);
            } else {
                self.try_send_waves(now_us);
            }
        }
        let Some(deadline) = self.token_deadline_us else {
            return;
        };
        if now_us < deadline {
            return;
        }
        for link in (0..self.links.len()).filter(|_| !full) {
            let repeats: Vec<Token> = self.links[link].last_two.repeats().collect();
            for t in repeats {
                self.push_token(link, t);
                self.stats.tokens_repeated += 1;
            }
        }
        self.token_deadline_us = Some(now_us + self.cfg.timing.token_timeout_us);
    }

    /// Handles one packet that arrived on `link`.
    pub fn handle_input(&mut self, now_us: u64, link: LinkId, bytes: &[u8]) -> Result<(), TmError> {
        self.counted(now_us, link, Input::Borrowed(bytes))
    }

    /// [`TokenManager::handle_input`] for a driver that owns the input's buffer: a message
    /// forwarded as it came leaves in `buf` itself (taken, `buf` left empty), with no copy and
    /// no allocation. An input refused or not consumed leaves `buf` as it was.
    pub fn handle_input_owned(
        &mut self,
        now_us: u64,
        link: LinkId,
        buf: &mut Vec<u8>,
    ) -> Result<(), TmError> {
        self.counted(now_us, link, Input::Owned(buf))
    }

    fn counted(&mut self, now_us: u64, link: LinkId, inp: Input<'_>) -> Result<(), TmError> {
        let r = self.input(now_us, link, inp);
        if r.is_err() {
            self.stats.errors += 1;
        }
        r
    }

    fn input(&mut self, now_us: u64, link: LinkId, inp: Input<'_>) -> Result<(), TmError> {
        let bytes = inp.bytes();
        if link >= self.links.len() {
            return Err(TmError::NoSuchLink(link));
        }
        if self.make_room() {
            return Err(TmError::Backpressure(self.cfg.limits.queue_packets_max));
        }
        let decode = |error| TmError::Decode { link, error };
        match packet::peek_kind(bytes).map_err(decode)? {
            Kind::Token => match Token::decode(bytes) {
                Ok(t) => self.token(now_us, link, t),
                Err(e) => {
                    self.stats.tokens_dropped += 1;
                    Err(decode(e))
                }
            },
            Kind::IsotachMessage => {
                // Checked in full (a forwarded message is never malformed) but not copied out.
                let dest = IsotachMessage::validate(bytes).map_err(decode)?;
                if self.started && !self.in_this_generation(bytes) {
                    self.stats.messages_stale += 1;
                    return Ok(());
                }
                // Its pulse must end at the destination: every wave up to the one that ends
                // it (TS + 1) goes unpaced, bounded by the window an SIU accepts.
                let ends = IsotachMessage::peek_stamp(bytes).map_or(0, |(ts, _, _)| {
                    let window = u64::from(self.cfg.limits.pulses_ahead_max);
                    ts.get().saturating_add(1).min(self.waves + window)
                });
                self.forward(dest, inp, true)?;
                self.busy_news(now_us, link, ends);
                Ok(())
            }
            Kind::Plain => {
                let m = packet::PlainMessage::parse(bytes).map_err(decode)?;
                self.forward(m.dest, inp, false)?;
                self.busy_news(now_us, link, 0);
                Ok(())
            }
            kind => {
                packet::Packet::decode(bytes).map_err(decode)?;
                Err(TmError::UnexpectedKind { link, kind })
            }
        }
    }
}

impl Link {
    fn new(peer: Hop, port: u16) -> Self {
        Self {
            peer,
            port,
            accepted: 0,
            last_two: LastTwo::default(),
            barrier_recv: [0; BARRIERS],
            barrier_sent: [0; BARRIERS],
            held: VecDeque::new(),
            riding: Vec::new(),
            busy_until_wave: 0,
        }
    }
}

mod forward;
mod pacing;
mod waves;

#[cfg(test)]
mod tests;
