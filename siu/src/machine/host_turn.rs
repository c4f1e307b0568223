//! Host turns (`SiuConfig::host_turns`): with the host on the SIU's own thread — an SIU
//! embedded in the application (the simulator models it with `--host-turns`) — the token that a
//! significant pulse's end allows waits until the host has had its turn at that pulse's EOP
//! marker. The driver ends the turn ([`Siu::end_host_turn`]) once the host's packets of the
//! turn were handed in, and always before it sleeps ([`Siu::host_turn_pending`]).
//!
//! Why: a host typically answers an EOP with its next isochron (the one the EOP executed was
//! what it waited for). Stamped before the token goes out, that isochron gets
//! `TS = sendclock + distance` one pulse lower than after it, so a host that keeps one
//! isochron in flight sees it execute a pulse sooner.
//!
//! A reply counts too: a plain packet handed to the host since its last turn (the old value
//! a read or read-modify-write on another host's copy answered) is what a host waits for as
//! often as an EOP, and it rides just ahead of a token, usually one whose pulse is
//! insignificant here. That token waits for the host's turn as well, so the isochron the
//! reply lets the host issue leaves with it (when the two token chains travel in phase, as
//! they usually do, its TS is the same either way: `docs/design.md`, "Host turns").
//!
//! Safe: the wave rule says only when a token may go at the earliest, and the stamp rule
//! reads the sendclock at the moment of stamping, so a later token changes no argument in
//! `docs/design.md`. Requirement 3 (send every token the protocol allows) is relaxed by at
//! most one host turn, only where the host answers in-process, and only when the host has
//! something to answer (an EOP of a significant pulse, or a reply).

use super::Siu;
use crate::Mode;

impl Siu {
    /// Does a pulse that just ended with an EOP for the host (or after a reply reached it)
    /// hold its token for the host's turn? (SIU mode only: in host mode the host sends the
    /// tokens, and `accept_token` returns before asking.)
    pub(super) fn await_host_turn(&mut self) -> bool {
        debug_assert_eq!(self.cfg.mode, Mode::Siu);
        if !self.cfg.host_turns {
            return false;
        }
        self.token_awaits_host = true;
        self.stats.tokens_held_for_host += 1;
        true
    }

    /// Is the next token waiting for the host's turn to end? A driver must end the turn
    /// before it sleeps: the wait is not a timer.
    pub fn host_turn_pending(&self) -> bool {
        self.token_awaits_host
    }

    /// Will the next token wait for a host turn that has not started yet? A plain packet
    /// (a reply) reached the host since its last turn, so the token after it waits for the
    /// host ([`Siu::accept_token`]'s rule). An embedded driver keeps what the host sends
    /// meanwhile for that turn: stamped with the token still held, it leaves in the token's
    /// datagram (its TS is the one it would get at once when the two token chains travel in
    /// phase, as they usually do).
    ///
    /// Never while an isochron is open: its end must come in, or requirement 26 could hold
    /// back the token the awaited one depends on.
    pub fn host_turn_coming(&self) -> bool {
        self.host_fed_plain && !self.token_awaits_host && self.open.is_none()
    }

    /// The host had its turn: what it sent in answer to the EOP is stamped, so the token
    /// its pulse's end allowed may go (with any the protocol allows after it).
    pub fn end_host_turn(&mut self, now_us: u64) {
        // Whatever reached the host before its turn ended was seen in that turn.
        self.host_fed_plain = false;
        if std::mem::take(&mut self.token_awaits_host) {
            self.try_send_token(now_us);
        }
    }

    /// A restart: the new generation's first token goes at once.
    pub(super) fn reset_host_turn(&mut self) {
        self.token_awaits_host = false;
        self.host_fed_plain = false;
    }
}
