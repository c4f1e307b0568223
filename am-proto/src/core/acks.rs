//! Held acknowledgements ([`Config::ack_delay`](super::Config::ack_delay)): a request whose
//! handler did not reply is acknowledged automatically, and that acknowledgement may wait a
//! little for other traffic to the same peer, so the two leave together and the peer wakes
//! once. A token manager that paces idle waves is the case in point: without the wait, every
//! SIU's token is acknowledged at once and the next wave follows a pace later, two wake-ups
//! per SIU per wave instead of one.
//!
//! The rules, TCP's delayed acknowledgement in miniature:
//! - at most one acknowledgement waits per peer; the peer's next one sends both, so a
//!   requester streaming requests gets every second one answered at once and holds at most
//!   one request slot the longer;
//! - anything else queued for the peer (a request, a reply, a reply return) takes the held
//!   acknowledgement along, ahead of it;
//! - one left alone goes when `ack_delay` runs out ([`Core::handle_timeout`]).
//!
//! A held acknowledgement names its reply-cache slot and sequence number, like every queued
//! response, so one that went stale meanwhile (the peer restarted, the slot took a new
//! request) is skipped when it would be encoded.

use super::send::Tx;
use super::{Core, HeldAck};
use crate::types::Time;

impl Core {
    /// Time passes in: the clock held acknowledgements are timed by. Never goes back (a
    /// driver may pass a stale reading when no timer is armed).
    pub(super) fn pass_time(&mut self, now: Time) {
        self.now = self.now.max(now);
    }

    /// The automatic acknowledgement of peer `pi`'s request in slot `slot` (`seq`): held, or
    /// queued at once when acknowledgements are not held or one already waits for the peer.
    pub(super) fn hold_ack(&mut self, pi: u32, slot: u16, seq: u32) {
        let ack = Tx::Resp {
            peer: pi,
            slot,
            seq,
            frag: 0,
        };
        if self.cfg.ack_delay.is_zero() || self.peers[pi as usize].ack_held.is_some() {
            self.push_tx(ack);
            return;
        }
        let due = self.now.plus(self.cfg.ack_delay);
        self.peers[pi as usize].ack_held = Some(HeldAck { due, slot, seq });
        let fresh = self.held_acks.insert((due, pi));
        debug_assert!(fresh, "peer {pi} held two acknowledgements");
        self.stats.acks_held += 1;
    }

    /// Queue peer `pi`'s held acknowledgement, if it has one; returns what it queued.
    pub(super) fn release_ack(&mut self, pi: u32) -> Option<Tx> {
        let h = self.peers[pi as usize].ack_held.take()?;
        let armed = self.held_acks.remove(&(h.due, pi));
        debug_assert!(armed, "peer {pi}'s held acknowledgement had no deadline");
        let ack = Tx::Resp {
            peer: pi,
            slot: h.slot,
            seq: h.seq,
            frag: 0,
        };
        self.enqueue_tx(ack);
        Some(ack)
    }

    /// Send the held acknowledgements due by `now`, each alone.
    pub(super) fn release_due_acks(&mut self, now: Time) {
        while let Some(&(due, pi)) = self.held_acks.first() {
            if due > now {
                break;
            }
            self.stats.acks_held_expired += 1;
            self.release_ack(pi);
        }
    }

    /// When the first held acknowledgement is due.
    pub(super) fn next_ack_due(&self) -> Option<Time> {
        self.held_acks.first().map(|&(t, _)| t)
    }
}
