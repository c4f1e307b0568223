//! What every part of the links shares: marking a peer ready, the hello timers and breaking
//! a link.
//!
//! A hello timer lives in its peer and in one ordered set, so the next deadline and the due
//! timers are found without scanning every peer; [`State::set_hello_timer`] keeps the two in
//! step. Breaking a link drops what was queued for the peer, marks it down (a new hello goes
//! out next) and tells the driver; a restarted peer's side starts over too.

use super::{LinkEvent, LossReason, Peer, State};
use crate::types::{NodeAddr, Time};

impl State {
    /// Arms `peer`'s hello timer for `at`, or disarms it (`None`).
    pub(super) fn set_hello_timer(&mut self, peer: usize, at: Option<Time>) {
        let p = &mut self.peers[peer];
        if let Some(old) = p.hello_timer {
            let armed = self.hello_timers.remove(&(old, peer));
            debug_assert!(armed, "peer {peer}'s hello timer was not in the timer set");
        }
        p.hello_timer = at;
        if let Some(t) = at {
            self.hello_timers.insert((t, peer));
        }
        debug_assert!(
            self.hello_timers.len() <= self.peers.len(),
            "one hello timer per peer at most"
        );
    }

    /// The earliest armed hello timer.
    pub(super) fn hello_deadline(&self) -> Option<Time> {
        self.hello_timers.first().map(|&(t, _)| t)
    }

    pub(super) fn mark_ready(&mut self, peer: usize) {
        let p = &mut self.peers[peer];
        if !p.ready {
            p.ready = true;
            self.ready.push(peer);
        }
    }

    /// The link to `peer` broke: drop its queue and half-assembled packet, mark it down (a
    /// new hello goes out next) and tell the driver. A new stream starts with a fresh window
    /// on both sides.
    pub(super) fn break_link(&mut self, peer: usize, reason: LossReason) {
        let p = &mut self.peers[peer];
        let dropped = p.queued;
        p.out.clear();
        p.head_sent = 0;
        p.queued = 0;
        p.up = false;
        p.links_lost += 1;
        p.in_flight = 0;
        debug_assert!(p.out.is_empty() && p.head_sent == 0);
        if reason == LossReason::Restarted {
            // The peer's side starts over too: its stream towards us begins anew.
            Self::forget_rx(p);
        }
        self.stats.links_lost += 1;
        self.stats.fragments_dropped += dropped as u64;
        self.events.push_back(LinkEvent::PeerLost {
            peer,
            reason,
            dropped,
        });
        self.mark_ready(peer);
    }

    /// Forgets everything received from a peer that restarted: its partial packet, the
    /// credit we owed its previous incarnation, its stream number.
    pub(super) fn forget_rx(p: &mut Peer) {
        p.partial.clear();
        p.partial_frags = 0;
        p.owed = 0;
        p.rx_stream = 0;
        p.discarding = false;
    }

    pub(super) fn peer_of(&mut self, node: NodeAddr) -> Option<usize> {
        let peer = self.by_addr.get(&node).copied();
        if peer.is_none() {
            self.stats.unknown_peer += 1;
        }
        peer
    }
}
