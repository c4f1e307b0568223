//! Idle pacing (`docs/design.md`, "Idle pacing"): decides whether this SIU's next token says
//! BUSY — the SIU has work that needs logical time to advance — and when an SIU whose last
//! token went out idle asks its token manager for speed by resending that token as a BUSY
//! repeat (the wake-up). Only in SIU mode and only with `timing.idle-pace-us` above 0; in host
//! mode the host runs the token protocol and sets BUSY itself.
//!
//! Conservative on purpose: a false BUSY only costs speed (a wave that could have waited goes
//! at once), a false idle costs latency (a wave waits up to a pace). Neither changes which
//! tokens go or in what order, so neither can break the wave, stamp or EOP rule.

use super::Siu;
use crate::{Mode, Side};
use isotach_proto::packet::Token;

/// What the SIU knows about its own work between tokens.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Pacing {
    /// The host sent isotach traffic since the last token went out.
    host_work: bool,
    /// The last normal token went out without BUSY.
    last_idle: bool,
    /// The sendclock when the last wake-up went out (at most one per token sent).
    woken_at: Option<u64>,
    /// Signals went out on a token: busy until the receive clock reaches this wave (their
    /// epoch's last, plus the largest logical distance), so the epoch ends at full speed.
    signals_until: u64,
}

impl Siu {
    /// Idle pacing applies: SIU mode, and the cluster paces idle waves.
    fn paces(&self) -> bool {
        self.cfg.mode == Mode::Siu && self.cfg.timing.idle_pace_us > 0
    }

    /// Does this SIU have work that needs logical time to advance? An isochron open or
    /// stamped for a pulse not yet ended, packets handed to the host for such a pulse
    /// (messages bucketed ahead, isochron markers), a barrier in progress, signals waiting to
    /// go out or on their way to their epoch's end, or isotach traffic from the host since the
    /// last token.
    pub fn busy(&self) -> bool {
        self.pacing.host_work
            || self.open.is_some()
            || !self.outstanding.is_empty()
            || self.pulses.any_pending()
            || self.barriers_in_progress()
            || self.signals_raised != 0
            || self.reset_signal_raised
            || self.recvclock < self.pacing.signals_until
    }

    /// Marks `token`, about to go out as wave `wave`, BUSY if this SIU is busy, and remembers
    /// whether it was.
    pub(super) fn pace_token(&mut self, wave: u64, token: Token) -> Token {
        if !self.paces() {
            return token;
        }
        if token.signals != 0 || token.reset {
            let epoch = u64::from(self.cfg.timing.epoch_pulses);
            let reach = u64::from(self.cfg.topology.max_distance());
            let epoch_end = wave.div_ceil(epoch) * epoch;
            self.pacing.signals_until = self.pacing.signals_until.max(epoch_end + reach);
        }
        let busy = self.busy();
        self.pacing.host_work = false;
        self.pacing.last_idle = !busy;
        if busy {
            self.stats.tokens_busy += 1;
        }
        Token { busy, ..token }
    }

    /// The host sent isotach traffic: the next token says BUSY.
    pub(super) fn host_work(&mut self) {
        self.pacing.host_work = true;
    }

    /// The host's isotach packet was taken. If this SIU's last token went out idle, its token
    /// manager may be pacing the wave it waits for: resend that token marked repeat and BUSY
    /// (a duplicate there, whose flag releases the wave). Once per token sent; skipped when
    /// the network queue is full (traffic is flowing anyway) or when the next token waits
    /// for the host's turn (it goes BUSY when the turn ends).
    pub(super) fn wake(&mut self) {
        if !self.paces()
            || !self.started
            || !self.pacing.last_idle
            || self.pacing.woken_at == Some(self.sendclock)
            || self.host_turn_pending()
        {
            return;
        }
        let Some(last) = self.last_two.newest() else {
            return;
        };
        if last.restart || self.room(Side::Net, 1).is_err() {
            return;
        }
        self.pacing.woken_at = Some(self.sendclock);
        self.stats.tokens_wake += 1;
        self.push_net_token(Token {
            repeat: true,
            busy: true,
            ..last
        });
    }

    /// A restart: nothing of the old generation keeps this SIU busy.
    pub(super) fn reset_pacing(&mut self) {
        self.pacing = Pacing::default();
    }
}
