//! Tokens and waves: what a token from a neighbour means (in sequence, duplicate, early,
//! foreign, a restart), the wave rule (wave `k + 1` once every neighbour's token `k`
//! arrived), the signals gathered per epoch, the barrier bits each wave carries, and
//! restarts (a reset wave of a newer generation).

use super::{EpochSignals, LinkId, TmError, TokenManager};
use isotach_proto::Generation;
use isotach_proto::WaveSeq;
use isotach_proto::packet::{self, BARRIERS, Token};
use isotach_proto::topology::Hop;
use isotach_proto::wave::{Arrival, classify};

impl TokenManager {
    pub(super) fn token(&mut self, now_us: u64, link: LinkId, t: Token) -> Result<(), TmError> {
        let expected = self.links[link].port;
        if t.source_port != expected {
            self.stats.tokens_dropped += 1;
            return Err(TmError::ForeignToken {
                link,
                port: t.source_port,
                expected,
            });
        }
        if t.restart {
            if t.generation.newer_than(self.generation) {
                self.restart(now_us, t.generation);
            } else {
                // An echo of our own reset wave, or a repeat of a restart already taken.
                self.stats.tokens_duplicate += 1;
            }
            return Ok(());
        }
        if !self.started || t.generation != self.generation {
            self.stats.tokens_dropped += 1;
            return Ok(());
        }
        match classify(self.links[link].accepted, t.seq) {
            Arrival::InSequence => return self.accept(now_us, link, t),
            Arrival::Duplicate => self.stats.tokens_duplicate += 1,
            Arrival::Early => self.stats.tokens_early += 1,
        }
        // A duplicate or early token is dropped, but its BUSY flag still counts: an idle SIU
        // that gets work resends its last token marked BUSY to ask for speed. Read as the
        // token it repeats, it gates the wave after the link's last accepted one.
        if t.busy {
            let gates = self.links[link].accepted + 1;
            self.busy_news(now_us, link, gates);
        }
        Ok(())
    }

    pub(super) fn accept(&mut self, now_us: u64, link: LinkId, t: Token) -> Result<(), TmError> {
        debug_assert!(self.started && t.generation == self.generation && !t.restart);
        // The wave rule: wave `waves` went out once every link's token `waves - 1` arrived.
        debug_assert!(self.links[link].accepted + 1 >= self.waves);
        self.stats.tokens_accepted += 1;
        let l = &mut self.links[link];
        let wave = l.accepted + 1;
        l.accepted = wave;
        if wave == 1 && !l.held.is_empty() {
            // Before any wave this token may trigger.
            self.release_held(link);
        }
        let l = &mut self.links[link];
        // The first token's barrier bits are a neighbour TM's initial credit, not a round.
        if wave > 1 {
            for (b, recv) in l.barrier_recv.iter_mut().enumerate() {
                if t.barrier & (1 << b) != 0 {
                    *recv = recv.saturating_add(1);
                }
            }
        }
        if t.signals != 0 || t.reset {
            let epoch = self.epoch_of(wave);
            let slot = self.epoch_slot(epoch);
            slot.signals |= t.signals;
            slot.reset |= t.reset;
        }
        if t.busy {
            // Token `wave` gates wave `wave + 1`: that one goes at once.
            self.note_busy(link, wave + 1);
        }
        self.try_send_waves(now_us);
        Ok(())
    }

    pub(super) fn epoch_of(&self, wave: u64) -> u64 {
        debug_assert!(wave >= 1, "waves count from 1");
        (wave - 1) / u64::from(self.cfg.timing.epoch_pulses)
    }

    /// The signal accumulator of `epoch` (current or next).
    pub(super) fn epoch_slot(&mut self, epoch: u64) -> &mut EpochSignals {
        let i = (epoch % 2) as usize;
        if self.epoch_signals[i].epoch != epoch {
            self.epoch_signals[i] = EpochSignals {
                epoch,
                ..EpochSignals::default()
            };
        }
        &mut self.epoch_signals[i]
    }

    /// Sends every wave the protocol allows: wave `k + 1` once every neighbour's token `k`
    /// arrived (wave 1 is free) — at once if it is busy, else when its pace timer fired.
    pub(super) fn try_send_waves(&mut self, now_us: u64) {
        while self.started && self.links.iter().all(|l| l.accepted >= self.waves) {
            let wave = self.waves + 1;
            if self.paces(wave) {
                match self.pace_deadline_us {
                    Some(due) if now_us >= due => {}
                    Some(_) => return,
                    None => {
                        self.pace_deadline_us =
                            Some(now_us.saturating_add(self.cfg.timing.idle_pace_us));
                        self.stats.waves_paced += 1;
                        return;
                    }
                }
            } else if self.pace_deadline_us.is_some() {
                self.stats.waves_released += 1;
            }
            self.pace_deadline_us = None;
            self.send_wave(now_us);
        }
        // Stopped at a link that has not answered the last wave (or before logical time).
        debug_assert!(!self.started || self.links.iter().any(|l| l.accepted < self.waves));
        debug_assert!(self.pace_deadline_us.is_none());
    }

    pub(super) fn send_wave(&mut self, now_us: u64) {
        // The wave rule: wave `k + 1` only after token `k` arrived on every link.
        assert!(self.started);
        assert!(self.links.iter().all(|l| l.accepted >= self.waves));
        let wave = self.waves + 1;
        let epoch = self.epoch_of(wave);
        let end_of_epoch = wave.is_multiple_of(u64::from(self.cfg.timing.epoch_pulses));
        let signals = *self.epoch_slot(epoch);
        let mut barrier_wave = false;
        for link in 0..self.links.len() {
            // Wave 1 carries both barrier bits: every neighbour's credit for round 1.
            let barrier = if wave == 1 {
                packet::BARRIER_MASK
            } else {
                self.barrier_bits(link)
            };
            let to_switch = matches!(self.links[link].peer, Hop::Switch(_));
            barrier_wave |= barrier != 0 && !to_switch;
            let busy = self.busy_towards(link, wave);
            let t = Token {
                seq: WaveSeq::of_wave(wave),
                repeat: false,
                // An SIU delivers a token's reset bit at once (requirement 37), so hosts see the
                // gathered reset signal only on the epoch's last wave, like the other signals;
                // neighbouring TMs get it on every wave so it spreads in time.
                reset: signals.reset && (end_of_epoch || to_switch),
                end_of_epoch,
                restart: false,
                busy,
                barrier,
                signals: signals.signals,
                source_port: self.port,
                generation: self.generation,
            };
            self.release_riding(link);
            self.push_token(link, t);
            self.links[link].last_two.remember(t);
        }
        if barrier_wave && wave > 1 {
            self.stats.barrier_rounds += 1;
        }
        self.waves = wave;
        self.stats.waves += 1;
        assert!(
            self.waves <= self.stats.waves,
            "waves of this generation are counted"
        );
        self.token_deadline_us = Some(now_us + self.cfg.timing.token_timeout_us);
    }

    /// Barrier bits for the next token on `link` (see the crate documentation).
    pub(super) fn barrier_bits(&mut self, link: LinkId) -> u8 {
        let to_host = matches!(self.links[link].peer, Hop::Host(_));
        let mut bits = 0;
        for b in 0..BARRIERS {
            let round = self.links[link].barrier_sent[b] + 1;
            let ready = self
                .links
                .iter()
                .enumerate()
                .all(|(i, l)| (i == link && !to_host) || l.barrier_recv[b] >= round);
            if ready {
                self.links[link].barrier_sent[b] = round;
                bits |= 1 << b;
            }
        }
        bits
    }

    pub(super) fn push_token(&mut self, link: LinkId, t: Token) {
        let mut v = self.pool.take(packet::TOKEN_LEN);
        t.encode(&mut v);
        self.out.push_back((link, v));
    }

    /// Starts the next generation from here (a reset wave to every neighbour), after a broken
    /// link came back (see `isotach_proto::wave::Rejoin`). Does nothing before logical time
    /// started: the first reset comes from host 0's SIU.
    pub fn begin_restart(&mut self, now_us: u64) {
        if self.started {
            self.restart(now_us, self.generation.next());
        }
    }

    /// A reset of a newer generation: forget everything, pass the reset wave on to every
    /// neighbour (each ignores the echo: its generation is no longer newer), start wave 1.
    pub(super) fn restart(&mut self, now_us: u64, generation: Generation) {
        if self.started {
            self.stats.resets += 1;
        }
        self.drop_riding();
        self.started = true;
        self.generation = generation;
        self.drop_held_of_other_generations();
        self.waves = 0;
        self.epoch_signals = [EpochSignals::default(); 2];
        self.pace_deadline_us = None;
        for l in &mut self.links {
            l.accepted = 0;
            l.busy_until_wave = 0;
            l.last_two.clear();
            l.barrier_recv = [0; BARRIERS];
            l.barrier_sent = [0; BARRIERS];
        }
        let reset = Token {
            restart: true,
            source_port: self.port,
            generation,
            ..Token::default()
        };
        for link in 0..self.links.len() {
            self.push_token(link, reset);
            // Until wave 2 goes out the restart is one of the last two tokens on the link, so
            // the token timer resends a lost restart too.
            self.links[link].last_two.remember(reset);
        }
        self.try_send_waves(now_us);
    }
}
