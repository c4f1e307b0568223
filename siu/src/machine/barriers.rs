//! Barriers and signals: decides which barrier a host's barrier/signal marker enters (or
//! refuses), which barrier bits the next token carries, when a barrier round the token manager
//! sends back completes a barrier, and on which token raised signals may go out so they reach
//! every token manager before their epoch ends (requirements 36-39).

use super::Siu;
use crate::{Mode, SiuError};
use isotach_proto::packet::{BarrierSignalMarker, Kind, Token};

/// The first wave that may carry barrier bits: the token manager's credit has not arrived
/// before token 1 goes out.
const FIRST_BARRIER_WAVE: u64 = 2;

/// State of one barrier at this SIU. A barrier/signal marker with count `c` runs `c` rounds:
/// the SIU sends a barrier token, and each barrier round the token manager sends back answers
/// it; after the `c`-th the barrier completes (requirement 38). With the token manager's
/// spanning-tree rounds one round already spans every host; a longer count keeps every host in
/// the barrier for more rounds (all hosts must use the same count).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Barrier {
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

impl Siu {
    /// Requirement 36 and the barrier/signal protocol: the marker's barrier bits go out on the
    /// next token (after every isochron the host sent before it), its signals in the next
    /// epoch window.
    pub(super) fn barrier_signal_marker(
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

    /// Barrier bits for token `wave`: every barrier the host entered whose token has not gone
    /// out. Never on the first token (the token manager's credit has not arrived).
    pub(super) fn barrier_bits_for(&mut self, wave: u64) -> u8 {
        if wave < FIRST_BARRIER_WAVE {
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
    pub(super) fn with_signals(&mut self, wave: u64, mut token: Token) -> Token {
        let epoch = u64::from(self.cfg.timing.epoch_pulses);
        let epoch_end = wave.div_ceil(epoch) * epoch;
        let reach = u64::from(self.cfg.topology.max_distance());
        if wave + reach <= epoch_end {
            token.signals = std::mem::take(&mut self.signals_raised);
            token.reset = std::mem::take(&mut self.reset_signal_raised);
        }
        token
    }

    /// Marks barriers completed by a token's barrier bits; returns the completed bits.
    pub(super) fn complete_barriers(&mut self, bits: u8) -> u8 {
        let mut completed = 0;
        for (b, barrier) in self.barriers.iter_mut().enumerate() {
            if bits & (1 << b) == 0 || !barrier.awaiting_round {
                continue;
            }
            // A barrier token goes out only while rounds are left.
            debug_assert!(barrier.rounds_left > 0);
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

    /// A barrier the host (still attached) entered has not completed.
    pub(super) fn barriers_in_progress(&self) -> bool {
        self.barriers
            .iter()
            .any(|b| b.rounds_left > 0 && !b.orphaned)
    }

    /// A (new) application attached: a barrier still in progress belongs to the application
    /// that went away, and the new one's marker for it takes it over.
    pub(super) fn orphan_barriers(&mut self) {
        for b in &mut self.barriers {
            b.orphaned = b.rounds_left > 0;
        }
    }
}
