//! What every part of the links shares: peer slots (on-demand peers come into use here),
//! marking a peer ready, the hello timers and breaking a link.
//!
//! A hello timer lives in its peer and in one ordered set, so the next deadline and the due
//! timers are found without scanning every peer; [`State::set_hello_timer`] keeps the two in
//! step. Breaking a link drops what was queued for the peer, marks it down (a new hello goes
//! out next) and tells the driver; a restarted peer's side starts over too.

use super::{LinkEvent, LossReason, Peer, State};
use crate::types::{NodeAddr, Time};

impl State {
    /// The slot of `peer` if it is in use.
    pub(super) fn slot(&self, peer: usize) -> Option<usize> {
        if peer < self.list.eager_len() {
            return Some(peer);
        }
        self.slot_of.get(&peer).copied()
    }

    /// The slot of `peer`, putting an on-demand peer in use (unmapped: see
    /// `Links::map_new_peers`) the first time; `None` if it is no peer.
    pub(super) fn slot_or_add(&mut self, peer: usize) -> Option<usize> {
        if let Some(slot) = self.slot(peer) {
            return Some(slot);
        }
        let addr = self.list.addr(peer)?;
        debug_assert!(self.list.is_on_demand(peer));
        let slot = self.peers.len();
        self.peers.push(Peer::new(peer, addr, None, false));
        self.slot_of.insert(peer, slot);
        self.unmapped.push(slot);
        debug_assert!(
            self.peers.len() <= self.list.len(),
            "a slot per peer at most"
        );
        Some(slot)
    }

    /// The slot of the peer at `node` if it is in use (nothing is put in use).
    pub(super) fn slot_at(&self, node: NodeAddr) -> Option<usize> {
        self.slot(self.list.id_of(node)?)
    }

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
            peer: p.id,
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

    /// The slot of the peer at `node`, which comes into use if it was not (something
    /// arrived from it); `None`, counted, for an address that is no peer.
    pub(super) fn peer_of(&mut self, node: NodeAddr) -> Option<usize> {
        let slot = self
            .list
            .id_of(node)
            .and_then(|peer| self.slot_or_add(peer));
        if slot.is_none() {
            self.stats.unknown_peer += 1;
        }
        slot
    }
}
