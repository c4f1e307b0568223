//! The SIU state machine.

use crate::pulse::{Placement, PulseLog, PulseSlot};
use crate::{Mode, Route, Side, SiuConfig, SiuError, SiuStats, Transmit};
use isotach_proto::packet::{
    self, BARRIERS, BarrierSignalMarker, EndOfIsochron, EopMarker, IsochronMarker, IsotachMessage,
    Kind, PlainMessage, Sref, SrefOp, StartOfIsochron, Token,
};
use isotach_proto::reply::{self, HostReply};
use isotach_proto::topology::{HostId, Topology};
use isotach_proto::wave::{Arrival, LastTwo, classify, generation_newer, seq_of};
use std::collections::{BTreeMap, VecDeque};

/// The isochron the host is sending now.
#[derive(Debug, Clone, Copy)]
struct OpenIsochron {
    iso_id: u32,
    ts: u64,
    distance: u16,
    first_sequum: u64,
    messages: u32,
    crc_xor: u32,
    opened_us: u64,
}

/// State of one barrier at this SIU. A barrier/signal marker with count `c` runs `c` rounds:
/// the SIU sends a barrier token, and each barrier round the token manager sends back answers
/// it; after the `c`-th the barrier completes (requirement 38). With the token manager's
/// spanning-tree rounds one round already spans every host; a longer count keeps every host in
/// the barrier for more rounds (all hosts must use the same count).
#[derive(Debug, Clone, Copy, Default)]
struct Barrier {
    /// Rounds still to run, including the one in progress; 0 when idle.
    rounds_left: u32,
    /// A barrier token is due on the next token.
    token_pending: bool,
    /// A barrier token went out; the token manager's round has not come back yet.
    awaiting_round: bool,
    /// In progress for an application that went away: a new application's marker for it
    /// takes it over instead of being refused.
    orphaned: bool,
}

/// A switch interface unit. See the crate documentation.
#[derive(Debug)]
pub struct Siu {
    cfg: SiuConfig,
    /// Source port of this SIU's tokens and of its token manager's tokens.
    port: u16,
    tm_port: u16,
    started: bool,
    generation: u32,
    /// Tokens sent to the network (normal ones; repeats do not count).
    sendclock: u64,
    /// In-sequence tokens received from the network.
    recvclock: u64,
    last_two: LastTwo,
    token_deadline_us: Option<u64>,
    next_sequum: u64,
    open: Option<OpenIsochron>,
    /// `latest_ts[channel][set]`: TS of the latest logged isochron (requirement 27). Kept
    /// absolute: 64-bit clocks do not wrap, so `gap = latest_ts - sendclock` is derived.
    latest_ts: Vec<[u64; 2]>,
    /// This host's isochrons by TS, for pulses not yet ended (at most one entry per pulse of
    /// the window ahead of `recvclock`).
    outstanding: BTreeMap<u64, u32>,
    barriers: [Barrier; BARRIERS],
    /// Signals (and the reset signal) the host raised that have not gone out on a token.
    signals_raised: u8,
    reset_signal_raised: bool,
    pulses: PulseLog,
    to_host: VecDeque<Vec<u8>>,
    to_net: VecDeque<Transmit>,
    /// Largest TS of an isotach message handed to the host in this generation.
    host_ts_max: u64,
    stats: SiuStats,
}

impl Siu {
    /// A new SIU; it waits for a reset token (or [`Siu::start`] if it initiates the reset).
    pub fn new(cfg: SiuConfig) -> Self {
        assert!(
            usize::from(cfg.host) < cfg.topology.host_count(),
            "host not in topology"
        );
        let port = Topology::host_port(cfg.host);
        let tm_port = Topology::switch_port(cfg.topology.switch_of(cfg.host));
        let channels = usize::from(cfg.limits.channels.max(1));
        let pulses = PulseLog::new(cfg.limits.pulses_ahead_max);
        Self {
            port,
            tm_port,
            started: false,
            generation: 0,
            sendclock: 0,
            recvclock: 0,
            last_two: LastTwo::default(),
            token_deadline_us: None,
            next_sequum: 0,
            open: None,
            latest_ts: vec![[0; 2]; channels],
            outstanding: BTreeMap::new(),
            barriers: [Barrier::default(); BARRIERS],
            signals_raised: 0,
            reset_signal_raised: false,
            pulses,
            to_host: VecDeque::new(),
            to_net: VecDeque::new(),
            host_ts_max: 0,
            stats: SiuStats::default(),
            cfg,
        }
    }

    // ---------------------------------------------------------------------------------------
    // Observers

    /// The configuration.
    pub fn config(&self) -> &SiuConfig {
        &self.cfg
    }
    /// The host this SIU serves.
    pub fn host(&self) -> HostId {
        self.cfg.host
    }
    /// SIU or host mode.
    pub fn mode(&self) -> Mode {
        self.cfg.mode
    }
    /// Logical time has started (a reset token was sent or received).
    pub fn started(&self) -> bool {
        self.started
    }
    /// Current logical-time generation.
    pub fn generation(&self) -> u32 {
        self.generation
    }
    /// Normal tokens sent in this generation.
    pub fn sendclock(&self) -> u64 {
        self.sendclock
    }
    /// In-sequence tokens received in this generation: the current pulse.
    pub fn recvclock(&self) -> u64 {
        self.recvclock
    }
    /// `gap[channel][set]`: how far the latest logged TS is ahead of the sendclock.
    pub fn gap(&self, channel: u8, set: u8) -> u64 {
        self.latest_ts.get(usize::from(channel)).map_or(0, |l| {
            l[usize::from(set & 1)].saturating_sub(self.sendclock)
        })
    }
    /// Counters.
    pub fn stats(&self) -> SiuStats {
        self.stats
    }
    /// Isotach packets handed to the host for pulses not yet ended.
    pub fn pending_pulse_packets(&self) -> u64 {
        self.pulses.pending()
    }
    /// This host's isochrons stamped for pulses that have not ended yet.
    pub fn outstanding_isochrons(&self) -> u64 {
        self.outstanding.values().map(|&n| u64::from(n)).sum()
    }
    /// Packets queued for the host and the network.
    pub fn queue_depths(&self) -> (usize, usize) {
        (self.to_host.len(), self.to_net.len())
    }

    // ---------------------------------------------------------------------------------------
    // Output

    /// Next packet for the host.
    pub fn poll_host(&mut self) -> Option<Vec<u8>> {
        self.to_host.pop_front()
    }

    /// Next packet for the network side.
    pub fn poll_net(&mut self) -> Option<Transmit> {
        self.to_net.pop_front()
    }

    /// When [`Siu::handle_timeout`] wants to run next.
    pub fn poll_timeout(&self) -> Option<u64> {
        let iso = self
            .open
            .map(|o| o.opened_us + self.cfg.limits.isochron_open_us_max);
        match (self.token_deadline_us, iso) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    // ---------------------------------------------------------------------------------------
    // Input

    /// Starts logical time: sends a reset token of a new generation, then the first token.
    /// Only the initiating SIU (node 0) calls this; the others start on the reset wave.
    pub fn start(&mut self, now_us: u64) {
        let generation = self.generation.wrapping_add(1);
        let reset = Token {
            restart: true,
            source_port: self.port,
            generation,
            ..Token::default()
        };
        self.push_net_token(reset);
        if self.started && self.cfg.mode == Mode::Siu {
            // Tell the host logical time restarts, as the SIUs that take the reset wave do.
            let slot = self.pulses.take_current();
            let bytes = reset.to_bytes();
            self.push_eop(self.recvclock, &reset, &bytes, slot, 0);
        }
        self.restart(now_us, generation, Some(reset));
    }

    /// Runs timers: the token timer (resend the last two tokens, marked repeat: requirement 9)
    /// and the open-isochron limit.
    pub fn handle_timeout(&mut self, now_us: u64) {
        if let Some(open) = self.open
            && now_us >= open.opened_us + self.cfg.limits.isochron_open_us_max
        {
            self.stats.isochrons_forced_closed += 1;
            self.close_isochron(now_us, open);
        }
        if let Some(deadline) = self.token_deadline_us
            && now_us >= deadline
        {
            // With the network queue full (nobody drains it) the repeats would only pile up:
            // skip this round; the timer re-arms and repeats once there is room.
            if self.room(Side::Net, 2).is_ok() {
                let repeats: Vec<Token> = self.last_two.repeats().collect();
                for t in repeats {
                    self.push_net_token(t);
                    self.stats.tokens_repeated += 1;
                }
            }
            self.token_deadline_us = Some(now_us + self.cfg.timing.token_timeout_us);
        }
    }

    /// Handles one packet from the host.
    pub fn handle_host(&mut self, now_us: u64, bytes: &[u8]) -> Result<(), SiuError> {
        let r = self.host_input(now_us, bytes);
        if r.is_err() {
            self.stats.errors += 1;
        }
        r
    }

    /// Handles one packet from the network side.
    pub fn handle_net(&mut self, now_us: u64, bytes: &[u8]) -> Result<(), SiuError> {
        let r = self.net_input(now_us, bytes);
        if r.is_err() {
            self.stats.errors += 1;
        }
        r
    }

    fn room(&self, side: Side, needed: usize) -> Result<(), SiuError> {
        let limit = self.cfg.limits.queue_packets_max;
        let len = match side {
            Side::Host => self.to_host.len(),
            Side::Net => self.to_net.len(),
        };
        if len + needed > limit {
            return Err(SiuError::Backpressure { side, limit });
        }
        Ok(())
    }

    fn host_input(&mut self, now_us: u64, bytes: &[u8]) -> Result<(), SiuError> {
        let decode = |e| SiuError::Decode {
            side: Side::Host,
            error: e,
        };
        let kind = packet::peek_kind(bytes).map_err(decode)?;
        // Non-isotach traffic needs room only where it goes: a full host-bound queue must not
        // hold it up (requirement 20).
        if kind == Kind::Plain {
            self.room(Side::Net, 1)?;
            return self.plain_from_host(bytes);
        }
        // An isotach packet yields at most: one net packet, or a marker (EOI) plus the tokens
        // requirement 26 held back (two at most), or a token forward; check room first so a
        // refusal consumes nothing.
        self.room(Side::Net, 2)?;
        self.room(Side::Host, 1)?;
        if kind == Kind::Token {
            if self.cfg.mode != Mode::Host {
                return Err(SiuError::WrongMode {
                    kind,
                    mode: self.cfg.mode,
                });
            }
            return self.token_from_host(now_us, bytes);
        }
        if !self.started {
            packet::Packet::decode(bytes).map_err(decode)?;
            return Err(SiuError::NotStarted);
        }
        match kind {
            Kind::StartOfIsochron => {
                let soi = StartOfIsochron::decode(bytes).map_err(decode)?;
                self.start_isochron(now_us, soi)
            }
            Kind::IsotachMessage => self.message_from_host(bytes),
            Kind::EndOfIsochron => {
                let eoi = EndOfIsochron::decode(bytes).map_err(decode)?;
                self.end_isochron(now_us, eoi)
            }
            Kind::BarrierSignalMarker => {
                let m = BarrierSignalMarker::decode(bytes).map_err(decode)?;
                self.barrier_signal_marker(now_us, m)
            }
            Kind::IsochronMarker | Kind::EopMarker | Kind::Token | Kind::Plain => {
                packet::Packet::decode(bytes).map_err(decode)?;
                Err(SiuError::UnexpectedKind {
                    side: Side::Host,
                    kind,
                })
            }
        }
    }

    fn net_input(&mut self, now_us: u64, bytes: &[u8]) -> Result<(), SiuError> {
        let decode = |e| SiuError::Decode {
            side: Side::Net,
            error: e,
        };
        let kind = match packet::peek_kind(bytes) {
            Ok(k) => k,
            Err(e) => return Err(decode(e)),
        };
        // Non-isotach traffic needs room only on the host side (requirement 20).
        if kind == Kind::Plain {
            self.room(Side::Host, 1)?;
            PlainMessage::decode(bytes).map_err(decode)?;
            self.stats.plain_to_host += 1;
            self.to_host.push_back(bytes.to_vec());
            return Ok(());
        }
        // A token may yield a token to the net, an EOP and (on reset) one more EOP.
        self.room(Side::Net, 1)?;
        self.room(Side::Host, 2)?;
        match kind {
            Kind::Token => match Token::decode(bytes) {
                Ok(t) => self.token_from_net(now_us, t, bytes),
                Err(e) => {
                    self.stats.tokens_bad += 1;
                    Err(decode(e))
                }
            },
            Kind::IsotachMessage => self.message_from_net(bytes),
            _ => {
                packet::Packet::decode(bytes).map_err(decode)?;
                Err(SiuError::UnexpectedKind {
                    side: Side::Net,
                    kind,
                })
            }
        }
    }

    // ---------------------------------------------------------------------------------------
    // No application attached

    /// Consumes a packet for the host that no application will read (none is attached): the
    /// driver hands it here instead of to the host. The packet is counted as dropped; a read or
    /// a copy request (state transfer) is answered with a refusal marked `absent`, so the
    /// requester is not left waiting; and the host's next isochron is stamped after the
    /// packet's pulse, so an application that attaches later orders its admission after every
    /// request answered on its behalf (`docs/design.md`, "Joining late"). Refused with
    /// back-pressure, not consumed, when the network queue has no room for the refusal.
    pub fn host_absent(&mut self, bytes: &[u8]) -> Result<(), SiuError> {
        self.room(Side::Net, 1)?;
        self.stats.absent_dropped += 1;
        if packet::peek_kind(bytes) != Ok(Kind::IsotachMessage) {
            return Ok(());
        }
        let Ok(m) = IsotachMessage::decode(bytes) else {
            return Ok(());
        };
        // Only pulses this SIU could have handed the host (within its window) move the floor.
        let window = u64::from(self.cfg.limits.pulses_ahead_max);
        if m.ts <= self.recvclock.saturating_add(window) {
            self.raise_ts_floor(m.ts.saturating_add(1));
        }
        if usize::from(m.source) >= self.cfg.topology.host_count() {
            return Ok(());
        }
        let Sref::Mem {
            op, addr, ref_id, ..
        } = m.sref
        else {
            return Ok(());
        };
        let answer = match op {
            SrefOp::Read => HostReply::ReadRefused {
                ref_id,
                absent: true,
            },
            SrefOp::Copy => HostReply::CopyRefused {
                page: reply::page_of(addr),
                join_id: ref_id,
                absent: true,
            },
            _ => return Ok(()),
        };
        let mut payload = Vec::with_capacity(reply::COPY_REFUSED_LEN);
        answer.encode(&mut payload);
        let plain = PlainMessage {
            source: self.cfg.host,
            dest: m.source,
            payload,
        };
        let mut out = Vec::with_capacity(packet::PLAIN_LEN_MIN + reply::COPY_REFUSED_LEN);
        plain.encode(&mut out);
        self.stats.absent_replies += 1;
        self.to_net.push_back(Transmit {
            route: Route::Host(m.source),
            bytes: out,
        });
        Ok(())
    }

    /// A (new) application attached to the host: its first isochron is stamped after every
    /// isotach message handed to the host before, so whatever a previous application received
    /// and lost is ordered before the new one's admission (`docs/design.md`, "Joining late").
    pub fn host_attached(&mut self) {
        self.raise_ts_floor(self.host_ts_max.saturating_add(1));
        for b in &mut self.barriers {
            b.orphaned = b.rounds_left > 0;
        }
    }

    /// Every later isochron of this host gets a TS of at least `ts` (both sequence sets of
    /// every channel: the next isochron is ordered after it whatever its set).
    fn raise_ts_floor(&mut self, ts: u64) {
        for sets in &mut self.latest_ts {
            for latest in sets.iter_mut() {
                *latest = (*latest).max(ts);
            }
        }
    }

    // ---------------------------------------------------------------------------------------
    // Non-isotach traffic: passed through at once, FIFO, never waiting on logical time
    // (requirements 20, 22).

    fn plain_from_host(&mut self, bytes: &[u8]) -> Result<(), SiuError> {
        let m = PlainMessage::decode(bytes).map_err(|e| SiuError::Decode {
            side: Side::Host,
            error: e,
        })?;
        if usize::from(m.dest) >= self.cfg.topology.host_count() {
            return Err(SiuError::NoSuchHost(m.dest));
        }
        self.stats.plain_to_net += 1;
        self.to_net.push_back(Transmit {
            route: Route::Host(m.dest),
            bytes: bytes.to_vec(),
        });
        Ok(())
    }

    // ---------------------------------------------------------------------------------------
    // Logical time

    /// Restarts logical time in `generation`: clocks to zero, tables cleared, first token out.
    /// `sent_reset` is the reset token this SIU just sent when it initiates the restart.
    fn restart(&mut self, now_us: u64, generation: u32, sent_reset: Option<Token>) {
        if self.started {
            self.stats.resets += 1;
        }
        self.started = true;
        self.generation = generation;
        self.sendclock = 0;
        self.recvclock = 0;
        self.last_two.clear();
        if let Some(reset) = sent_reset {
            // The reset is one of the last two tokens sent until token 2 goes out (after the
            // token manager answered): the token timer resends a lost reset too.
            self.last_two.remember(reset);
        }
        self.token_deadline_us = None;
        self.open = None;
        self.latest_ts.iter_mut().for_each(|l| *l = [0; 2]);
        self.host_ts_max = 0;
        self.outstanding.clear();
        self.barriers = [Barrier::default(); BARRIERS];
        self.signals_raised = 0;
        self.reset_signal_raised = false;
        self.pulses = PulseLog::new(self.cfg.limits.pulses_ahead_max);
        if self.cfg.mode == Mode::Siu {
            self.try_send_token(now_us);
        }
    }

    /// Handles a decoded token from the network; `bytes` is its encoding (for the CRC copy).
    fn token_from_net(&mut self, now_us: u64, t: Token, bytes: &[u8]) -> Result<(), SiuError> {
        if t.source_port != self.tm_port {
            self.stats.tokens_stale += 1;
            return Err(SiuError::ForeignToken(t.source_port));
        }
        if t.restart {
            if generation_newer(t.generation, self.generation) {
                return self.reset_from_net(now_us, t, bytes);
            }
            // An echo or a repeat of the restart that started this generation.
            self.stats.tokens_duplicate += 1;
            return Ok(());
        }
        if !self.started || t.generation != self.generation {
            self.stats.tokens_stale += 1;
            return Ok(());
        }
        match classify(self.recvclock, t.seq) {
            Arrival::InSequence => {
                self.stats.tokens_accepted += 1;
                self.accept_token(now_us, t, bytes);
            }
            Arrival::Duplicate => {
                self.stats.tokens_duplicate += 1;
                if self.cfg.mode == Mode::Host && t.repeat {
                    // Requirement 11: an EOP for every repeat token too, flagged repeat.
                    let ends = self.duplicate_pulse(t.seq);
                    self.push_eop(ends, &t, bytes, PulseSlot::default(), t.barrier);
                }
            }
            Arrival::Early => self.stats.tokens_early += 1,
        }
        Ok(())
    }

    /// The pulse a duplicate token ended (one of the two before the next).
    fn duplicate_pulse(&self, seq: u8) -> u64 {
        if seq == seq_of(self.recvclock) {
            self.recvclock.saturating_sub(1)
        } else {
            self.recvclock.saturating_sub(2)
        }
    }

    /// A reset token of a newer generation: tell the host (EOP with the reset bit for the pulse
    /// in progress, so it drains what arrived) and restart.
    fn reset_from_net(&mut self, now_us: u64, t: Token, bytes: &[u8]) -> Result<(), SiuError> {
        // In host mode the host runs the token protocol, so it hears of every reset, even the
        // first, and answers with its own first token.
        if self.started || self.cfg.mode == Mode::Host {
            let slot = self.pulses.take_current();
            self.push_eop(self.recvclock, &t, bytes, slot, 0);
        }
        self.restart(now_us, t.generation, None);
        Ok(())
    }

    /// Token `recvclock + 1` arrived: pulse `recvclock` ends.
    fn accept_token(&mut self, now_us: u64, t: Token, bytes: &[u8]) {
        let first = self.recvclock == 0;
        let ended = self.recvclock;
        self.recvclock += 1;
        self.outstanding = self.outstanding.split_off(&self.recvclock);
        let slot = self.pulses.end_pulse();
        if self.cfg.mode == Mode::Host {
            // Requirements 11, 18, 19, 33, 39: every token, repeat flagged, fields copied.
            self.push_eop(ended, &t, bytes, slot, t.barrier);
            return;
        }
        // The first token's barrier bits are the token manager's initial credit, not a
        // completed barrier.
        let completed = if first {
            0
        } else {
            self.complete_barriers(t.barrier)
        };
        let significant =
            slot.count() > 0 || completed != 0 || t.reset || (t.end_of_epoch && t.signals != 0);
        if significant {
            self.push_eop(ended, &t, bytes, slot, completed);
        }
        self.try_send_token(now_us);
    }

    /// Marks barriers completed by a token's barrier bits; returns the completed bits.
    fn complete_barriers(&mut self, bits: u8) -> u8 {
        let mut completed = 0;
        for (b, barrier) in self.barriers.iter_mut().enumerate() {
            if bits & (1 << b) == 0 || !barrier.awaiting_round {
                continue;
            }
            barrier.awaiting_round = false;
            barrier.rounds_left -= 1;
            if barrier.rounds_left == 0 {
                completed |= 1 << b;
                self.stats.barriers_completed += 1;
            } else {
                barrier.token_pending = true;
            }
        }
        completed
    }

    /// Builds and queues the EOP marker for pulse `ts` (requirements 13-19, 33-35, 37-39).
    fn push_eop(&mut self, ts: u64, t: &Token, bytes: &[u8], mut slot: PulseSlot, barrier: u8) {
        let host_mode = self.cfg.mode == Mode::Host;
        let repeat = host_mode && t.repeat;
        let (count, sort_vector) = if repeat {
            (0, Vec::new())
        } else {
            (slot.count(), slot.sort_vector())
        };
        let signals = if host_mode || t.end_of_epoch {
            t.signals
        } else {
            0
        };
        let eop = EopMarker {
            ts,
            count,
            repeat,
            reset: t.reset || t.restart,
            end_of_epoch: t.end_of_epoch,
            signals,
            barrier,
            token_kind: bytes[1],
            token_crc: packet::carried_crc(bytes),
            sort_vector,
        };
        let mut out = Vec::with_capacity(packet::EOP_LEN_MIN + eop.sort_vector.len());
        eop.encode(&mut out);
        self.to_host.push_back(out);
        self.stats.eops_sent += 1;
    }

    /// SIU mode: sends every token the protocol allows (requirements 2-4, 26, 36). After a
    /// token held back by requirement 26 that can be two: the token manager may have sent its
    /// next wave meanwhile (requirement 3).
    fn try_send_token(&mut self, now_us: u64) {
        while self.try_send_one_token(now_us) {}
    }

    /// Sends the next token if the protocol allows; returns whether it did.
    fn try_send_one_token(&mut self, now_us: u64) -> bool {
        if !self.started || self.cfg.mode != Mode::Siu {
            return false;
        }
        // Token w + 1 goes out only after token w arrived (the first one is free).
        if self.recvclock < self.sendclock {
            return false;
        }
        // Requirement 26: while an isochron is open, the sendclock may advance only while
        // sendclock + distance stays within its TS.
        if let Some(open) = self.open
            && self.sendclock + 1 + u64::from(open.distance) > open.ts
        {
            return false;
        }
        let wave = self.sendclock + 1;
        let token = Token {
            seq: seq_of(wave),
            repeat: false,
            reset: false,
            end_of_epoch: self.ends_epoch(wave),
            restart: false,
            barrier: self.barrier_bits_for(wave),
            signals: 0,
            source_port: self.port,
            generation: self.generation,
        };
        let token = self.with_signals(wave, token);
        self.push_net_token(token);
        self.last_two.remember(token);
        self.sendclock = wave;
        self.stats.tokens_sent += 1;
        self.token_deadline_us = Some(now_us + self.cfg.timing.token_timeout_us);
        true
    }

    fn ends_epoch(&self, wave: u64) -> bool {
        wave.is_multiple_of(u64::from(self.cfg.timing.epoch_pulses))
    }

    /// Barrier bits for token `wave`: every barrier the host entered whose token has not gone
    /// out. Never on the first token (the token manager's credit has not arrived).
    fn barrier_bits_for(&mut self, wave: u64) -> u8 {
        if wave < 2 {
            return 0;
        }
        let mut bits = 0;
        for (b, barrier) in self.barriers.iter_mut().enumerate() {
            if barrier.token_pending {
                barrier.token_pending = false;
                barrier.awaiting_round = true;
                bits |= 1 << b;
            }
        }
        bits
    }

    /// Puts raised signals on token `wave` if they can still reach every token manager before
    /// the end of this epoch; otherwise they wait for the next epoch's window.
    fn with_signals(&mut self, wave: u64, mut token: Token) -> Token {
        let epoch = u64::from(self.cfg.timing.epoch_pulses);
        let epoch_end = wave.div_ceil(epoch) * epoch;
        let reach = u64::from(self.cfg.topology.max_distance());
        if wave + reach <= epoch_end {
            token.signals = std::mem::take(&mut self.signals_raised);
            token.reset = std::mem::take(&mut self.reset_signal_raised);
        }
        token
    }

    fn push_net_token(&mut self, t: Token) {
        let mut out = Vec::with_capacity(packet::TOKEN_LEN);
        t.encode(&mut out);
        self.to_net.push_back(Transmit {
            route: Route::Tm,
            bytes: out,
        });
    }

    // ---------------------------------------------------------------------------------------
    // Host mode tokens

    /// Host mode: checks a host token (CRC, early: requirements 7, 8), forwards it in order
    /// (requirement 23) and advances the sendclock for normal tokens (requirement 5).
    fn token_from_host(&mut self, now_us: u64, bytes: &[u8]) -> Result<(), SiuError> {
        let t = Token::decode(bytes).map_err(|e| {
            self.stats.tokens_bad += 1;
            SiuError::Decode {
                side: Side::Host,
                error: e,
            }
        })?;
        if t.restart {
            if generation_newer(t.generation, self.generation) {
                self.restart(now_us, t.generation, None);
            }
            // The host's restart (or its repeat) goes to the network in order (requirement 23).
            self.to_net.push_back(Transmit {
                route: Route::Tm,
                bytes: bytes.to_vec(),
            });
            return Ok(());
        }
        if !self.started || t.generation != self.generation {
            self.stats.tokens_stale += 1;
            return Ok(());
        }
        match classify(self.sendclock, t.seq) {
            // A repeat can be in sequence: the host resends a token this SIU dropped (bad CRC,
            // requirement 7). It is the next token to the network; dropping it would stall.
            Arrival::InSequence => {
                self.sendclock += 1;
                self.stats.tokens_sent += 1;
            }
            Arrival::Duplicate if t.repeat => self.stats.tokens_repeated += 1,
            Arrival::Early => {
                self.stats.tokens_early += 1;
                return Ok(());
            }
            Arrival::Duplicate => {
                self.stats.tokens_duplicate += 1;
                return Ok(());
            }
        }
        self.to_net.push_back(Transmit {
            route: Route::Tm,
            bytes: bytes.to_vec(),
        });
        Ok(())
    }

    // ---------------------------------------------------------------------------------------
    // Isochrons

    /// Requirements 24-29: one TS per isochron, the earliest that is at least
    /// `sendclock + distance + send_delta` and at least the latest logged TS of the same
    /// channel and the other sequence set.
    fn start_isochron(&mut self, now_us: u64, soi: StartOfIsochron) -> Result<(), SiuError> {
        if let Some(open) = self.open {
            return Err(SiuError::IsochronOpen { open: open.iso_id });
        }
        let channels = self.cfg.limits.channels;
        if soi.channel >= channels {
            return Err(SiuError::ChannelOutOfRange {
                channel: soi.channel,
                channels,
            });
        }
        let ch = usize::from(soi.channel);
        let set = usize::from(soi.seqset & 1);
        let earliest = self.sendclock + u64::from(soi.distance) + u64::from(soi.send_delta);
        let ts = earliest.max(self.latest_ts[ch][1 - set]);
        // A destination's receive clock is at most `distance` behind this sendclock when a
        // message arrives, and this SIU's own at most one: a TS this far ahead could land
        // outside their windows (the message refused, the marker uncounted). Refuse it here.
        let window = self.cfg.limits.pulses_ahead_max;
        if ts - self.sendclock + u64::from(soi.distance) >= u64::from(window) {
            return Err(SiuError::BeyondWindow {
                ts,
                sendclock: self.sendclock,
                window,
            });
        }
        if soi.logged {
            let latest = &mut self.latest_ts[ch][set];
            *latest = if soi.host_gap {
                // Requirement 28: the host-supplied gap becomes gap[x][y].
                self.sendclock + u64::from(soi.gap)
            } else {
                (*latest).max(ts)
            };
        }
        // The marker takes the isochron's first sequum and the messages the ones after it, so
        // the marker sorts uniquely, just before its own messages to this host.
        let first_sequum = self.next_sequum;
        self.next_sequum += 1;
        self.open = Some(OpenIsochron {
            iso_id: soi.iso_id,
            ts,
            distance: soi.distance,
            first_sequum,
            messages: 0,
            crc_xor: 0,
            opened_us: now_us,
        });
        self.stats.isochrons += 1;
        *self.outstanding.entry(ts).or_default() += 1;
        Ok(())
    }

    fn message_from_host(&mut self, bytes: &[u8]) -> Result<(), SiuError> {
        let Some(mut open) = self.open else {
            return Err(SiuError::NoIsochron);
        };
        // Checked in full, but only the destination is needed: no decoded copy.
        let dest = IsotachMessage::validate(bytes).map_err(|e| SiuError::Decode {
            side: Side::Host,
            error: e,
        })?;
        let topo = &self.cfg.topology;
        if usize::from(dest) >= topo.host_count() {
            return Err(SiuError::NoSuchHost(dest));
        }
        let needs = topo.distance(self.cfg.host, dest);
        if needs > open.distance {
            return Err(SiuError::DistanceTooShort {
                dest,
                needs,
                declared: open.distance,
            });
        }
        let max = self.cfg.limits.isochron_messages_max;
        if open.messages >= max {
            return Err(SiuError::IsochronTooLong { max });
        }
        let mut out = bytes.to_vec();
        let sequum = self.next_sequum;
        let crc = IsotachMessage::stamp_in_place(&mut out, open.ts, self.port, sequum);
        self.next_sequum += 1;
        open.messages += 1;
        open.crc_xor ^= crc;
        self.open = Some(open);
        self.to_net.push_back(Transmit {
            route: Route::Tm,
            bytes: out,
        });
        self.stats.messages_sent += 1;
        Ok(())
    }

    fn end_isochron(&mut self, now_us: u64, eoi: EndOfIsochron) -> Result<(), SiuError> {
        let Some(open) = self.open else {
            return Err(SiuError::NoIsochron);
        };
        if open.iso_id != eoi.iso_id {
            return Err(SiuError::IsochronMismatch {
                open: open.iso_id,
                got: eoi.iso_id,
            });
        }
        self.close_isochron(now_us, open);
        Ok(())
    }

    /// The isochron's last message has left: return its marker (requirements 30-32) and let
    /// held tokens go.
    fn close_isochron(&mut self, now_us: u64, open: OpenIsochron) {
        self.open = None;
        let marker = IsochronMarker {
            iso_id: open.iso_id,
            source: self.port,
            ts: open.ts,
            sequum: open.first_sequum,
            crc_xor: open.crc_xor,
        };
        // In SIU mode the hold rule (requirement 26) and the window check at the start keep the
        // marker's pulse open. In host mode the host sends the tokens, and a host that lets
        // logical time pass an open isochron's TS gets its marker flagged late.
        if self.pulses.record(open.ts, self.port, open.first_sequum) != Placement::Counted {
            self.stats.messages_late += 1;
        }
        let mut out = Vec::with_capacity(packet::CHR_LEN);
        marker.encode(&mut out);
        self.to_host.push_back(out);
        self.stats.markers_sent += 1;
        // A token held back by requirement 26 may go now.
        self.try_send_token(now_us);
    }

    /// Requirement 36 and the barrier/signal protocol: the marker's barrier bits go out on the
    /// next token (after every isochron the host sent before it), its signals in the next
    /// epoch window.
    fn barrier_signal_marker(
        &mut self,
        now_us: u64,
        m: BarrierSignalMarker,
    ) -> Result<(), SiuError> {
        if self.cfg.mode == Mode::Host {
            return Err(SiuError::WrongMode {
                kind: Kind::BarrierSignalMarker,
                mode: self.cfg.mode,
            });
        }
        for (b, barrier) in self.barriers.iter().enumerate() {
            let busy = barrier.rounds_left > 0 && !barrier.orphaned;
            if m.barrier & (1 << b) != 0 && (busy || m.barrier_count == 0) {
                return Err(SiuError::Barrier {
                    barrier: b as u8,
                    count: m.barrier_count,
                });
            }
        }
        for (b, barrier) in self.barriers.iter_mut().enumerate() {
            if m.barrier & (1 << b) == 0 {
                continue;
            }
            if barrier.orphaned && barrier.rounds_left > 0 {
                // The new application takes over the barrier its predecessor entered: this
                // host is in it already; the EOP that completes it reaches the new one.
                barrier.orphaned = false;
                continue;
            }
            barrier.orphaned = false;
            barrier.rounds_left = m.barrier_count;
            barrier.token_pending = true;
        }
        self.signals_raised |= m.signals;
        self.reset_signal_raised |= m.reset;
        self.try_send_token(now_us);
        Ok(())
    }

    // ---------------------------------------------------------------------------------------
    // Isotach messages from the network

    fn message_from_net(&mut self, bytes: &[u8]) -> Result<(), SiuError> {
        let dest = IsotachMessage::validate(bytes).map_err(|e| SiuError::Decode {
            side: Side::Net,
            error: e,
        })?;
        let (ts, source, sequum) =
            IsotachMessage::peek_stamp(bytes).expect("a valid message has its stamp fields");
        if dest != self.cfg.host {
            self.stats.messages_refused += 1;
            return Err(SiuError::Misrouted {
                dest,
                host: self.cfg.host,
            });
        }
        if !self.started {
            self.stats.messages_refused += 1;
            return Err(SiuError::NotStarted);
        }
        match self.pulses.record(ts, source, sequum) {
            Placement::Counted => {}
            Placement::Late => self.stats.messages_late += 1,
            Placement::TooFarAhead => {
                self.stats.messages_refused += 1;
                return Err(SiuError::TooFarAhead {
                    ts,
                    recvclock: self.recvclock,
                    window: self.cfg.limits.pulses_ahead_max,
                });
            }
        }
        // Requirement 21: FIFO, handed over as they arrive.
        self.host_ts_max = self.host_ts_max.max(ts);
        self.to_host.push_back(bytes.to_vec());
        self.stats.messages_delivered += 1;
        Ok(())
    }
}
