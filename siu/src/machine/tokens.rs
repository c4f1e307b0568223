//! Tokens and waves: decides when this SIU's next token may go out (the wave rule, the hold
//! rule of requirement 26), what a token from the network means (in sequence, duplicate,
//! early, stale, a restart), what a host token means in host mode, and when the lost-token
//! timer resends the last two tokens. Keeps `sendclock` (normal tokens sent) and `recvclock`
//! (tokens accepted: the current pulse); accepting token `recvclock + 1` ends a pulse.

use super::barriers::Barrier;
use super::{SEQUENCE_SETS, Siu};
use crate::pulse::{PulseLog, PulseSlot};
use crate::{Mode, Route, Side, SiuError, Transmit};
use isotach_proto::packet::{self, BARRIERS, Token};
use isotach_proto::wave::{Arrival, classify};
use isotach_proto::{Generation, WaveSeq};

/// Tokens the lost-token timer resends at each expiry: the last two sent (requirement 9).
const REPEATS_PER_TIMEOUT_MAX: usize = 2;
/// Barrier bits of an EOP that completes no barrier (a reset, a restart).
const NO_BARRIERS_COMPLETED: u8 = 0;

impl Siu {
    /// Starts logical time: sends a reset token of a new generation, then the first token.
    /// Only the initiating SIU (node 0) calls this; the others start on the reset wave.
    pub fn start(&mut self, now_us: u64) {
        let generation = self.generation.next();
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
            self.push_eop(self.recvclock, &reset, &bytes, slot, NO_BARRIERS_COMPLETED);
            self.host_session_ended = true;
        }
        self.restart(now_us, generation, Some(reset));
    }

    /// The token timer: once it expires, resends the last two tokens, marked repeat
    /// (requirement 9), and re-arms.
    pub(super) fn expire_token_timer(&mut self, now_us: u64) {
        if let Some(deadline) = self.token_deadline_us
            && now_us >= deadline
        {
            // With the network queue full (nobody drains it) the repeats would only pile up:
            // skip this round; the timer re-arms and repeats once there is room.
            if self.room(Side::Net, REPEATS_PER_TIMEOUT_MAX).is_ok() {
                let repeats: Vec<Token> = self.last_two.repeats().collect();
                debug_assert!(repeats.len() <= REPEATS_PER_TIMEOUT_MAX);
                for t in repeats {
                    self.push_net_token(t);
                    self.stats.tokens_repeated += 1;
                }
            }
            self.token_deadline_us = Some(now_us + self.cfg.timing.token_timeout_us);
        }
    }

    /// Restarts logical time in `generation`: clocks to zero, tables cleared, first token out.
    /// `sent_reset` is the reset token this SIU just sent when it initiates the restart.
    pub(super) fn restart(
        &mut self,
        now_us: u64,
        generation: Generation,
        sent_reset: Option<Token>,
    ) {
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
        self.latest_ts
            .iter_mut()
            .for_each(|l| *l = [0; SEQUENCE_SETS]);
        self.host_ts_max = 0;
        self.outstanding.clear();
        self.barriers = [Barrier::default(); BARRIERS];
        self.signals_raised = 0;
        self.reset_signal_raised = false;
        self.reset_pacing();
        self.reset_host_turn();
        self.pulses = PulseLog::new(self.cfg.limits.pulses_ahead_max);
        assert_eq!(self.pulses.base(), self.recvclock);
        if self.cfg.mode == Mode::Siu {
            self.try_send_token(now_us);
        }
    }

    /// Handles a decoded token from the network; `bytes` is its encoding (for the CRC copy).
    pub(super) fn token_from_net(
        &mut self,
        now_us: u64,
        t: Token,
        bytes: &[u8],
    ) -> Result<(), SiuError> {
        if t.source_port != self.tm_port {
            self.stats.tokens_stale += 1;
            return Err(SiuError::ForeignToken(t.source_port));
        }
        if t.restart {
            if t.generation.newer_than(self.generation) {
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
                    let ends = self.duplicate_pulse(t.seq.bits());
                    self.push_eop(ends, &t, bytes, PulseSlot::default(), t.barrier);
                }
            }
            Arrival::Early => self.stats.tokens_early += 1,
        }
        Ok(())
    }

    /// The pulse a duplicate token ended (one of the two before the next).
    fn duplicate_pulse(&self, seq: u8) -> u64 {
        if seq == (WaveSeq::of_wave(self.recvclock)).bits() {
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
            self.push_eop(self.recvclock, &t, bytes, slot, NO_BARRIERS_COMPLETED);
            // In host mode the host runs the token protocol and answers the reset itself.
            self.host_session_ended = self.cfg.mode == Mode::Siu;
        }
        self.restart(now_us, t.generation, None);
        Ok(())
    }

    /// Token `recvclock + 1` arrived: pulse `recvclock` ends.
    fn accept_token(&mut self, now_us: u64, t: Token, bytes: &[u8]) {
        // The pulse log's current pulse is the receive clock.
        debug_assert_eq!(self.pulses.base(), self.recvclock);
        let first = self.recvclock == 0;
        let ended = self.recvclock;
        self.recvclock += 1;
        // Isochrons stamped for pulses before the receive clock are done: drop their counts
        // in place (a new map per pulse would be an allocation per pulse).
        while let Some(e) = self.outstanding.first_entry() {
            if *e.key() >= self.recvclock {
                break;
            }
            e.remove();
        }
        let slot = self.pulses.end_pulse();
        debug_assert_eq!(self.pulses.base(), self.recvclock);
        debug_assert!(
            self.outstanding
                .keys()
                .next()
                .is_none_or(|&ts| ts >= self.recvclock)
        );
        if self.cfg.mode == Mode::Host {
            // Requirements 11, 18, 19, 33, 39: every token, repeat flagged, fields copied.
            self.push_eop(ended, &t, bytes, slot, t.barrier);
            return;
        }
        // The first token's barrier bits are the token manager's initial credit, not a
        // completed barrier.
        let completed = if first {
            NO_BARRIERS_COMPLETED
        } else {
            self.complete_barriers(t.barrier)
        };
        let significant =
            slot.count() > 0 || completed != 0 || t.reset || (t.end_of_epoch && t.signals != 0);
        if significant {
            self.push_eop(ended, &t, bytes, slot, completed);
        }
        if (significant || self.host_fed_plain) && self.await_host_turn() {
            self.stats.tokens_held_for_reply += u64::from(!significant);
            return;
        }
        self.try_send_token(now_us);
    }

    /// SIU mode: sends every token the protocol allows (requirements 2-4, 26, 36). After a
    /// token held back by requirement 26 that can be two: the token manager may have sent its
    /// next wave meanwhile (requirement 3).
    pub(super) fn try_send_token(&mut self, now_us: u64) {
        while self.try_send_one_token(now_us) {}
    }

    /// Sends the next token if the protocol allows; returns whether it did.
    fn try_send_one_token(&mut self, now_us: u64) -> bool {
        if !self.started || self.cfg.mode != Mode::Siu {
            return false;
        }
        // The wave rule, as the last token sent left it.
        debug_assert!(self.sendclock <= self.recvclock + 1);
        // Token w + 1 goes out only after token w arrived (the first one is free).
        if self.recvclock < self.sendclock {
            return false;
        }
        let wave = self.sendclock + 1;
        // Requirement 26: an open isochron may hold the token back; so may the host's turn.
        if self.isochron_holds(wave) || self.host_turn_pending() {
            return false;
        }
        let token = Token {
            seq: WaveSeq::of_wave(wave),
            repeat: false,
            reset: false,
            end_of_epoch: self.ends_epoch(wave),
            restart: false,
            busy: false,
            barrier: self.barrier_bits_for(wave),
            signals: 0,
            source_port: self.port,
            generation: self.generation,
        };
        let token = self.with_signals(wave, token);
        let token = self.pace_token(wave, token);
        self.push_net_token(token);
        self.last_two.remember(token);
        self.sendclock = wave;
        // The wave rule: at most one token ahead of what this SIU accepted.
        debug_assert!(self.sendclock <= self.recvclock + 1);
        self.stats.tokens_sent += 1;
        self.token_deadline_us = Some(now_us + self.cfg.timing.token_timeout_us);
        true
    }

    /// Token `wave` carries the end-of-epoch bit.
    fn ends_epoch(&self, wave: u64) -> bool {
        wave.is_multiple_of(u64::from(self.cfg.timing.epoch_pulses))
    }

    pub(super) fn push_net_token(&mut self, t: Token) {
        let mut out = self.pool.take(packet::TOKEN_LEN);
        t.encode(&mut out);
        self.to_net.push_back(Transmit {
            route: Route::Tm,
            bytes: out,
        });
    }

    /// Host mode: checks a host token (CRC, early: requirements 7, 8), forwards it in order
    /// (requirement 23) and advances the sendclock for normal tokens (requirement 5).
    pub(super) fn token_from_host(&mut self, now_us: u64, bytes: &[u8]) -> Result<(), SiuError> {
        let t = Token::decode(bytes).map_err(|e| {
            self.stats.tokens_bad += 1;
            SiuError::Decode {
                side: Side::Host,
                error: e,
            }
        })?;
        if t.restart {
            if t.generation.newer_than(self.generation) {
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
}
