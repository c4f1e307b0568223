//! The pump's peer in the same process — an application embedding its SIU, or the
//! simulator's host: its packets skip the links and wait in two bounded queues, and its
//! *turns* (`docs/design.md`, "Host turns") end as [`LocalTurns`] says.

use super::{NS_PER_US, Pump, Role};
use isotach_am_proto::Time;
use isotach_am_proto::link::{Links, LossReason};
use std::collections::VecDeque;

/// Who ends the local peer's turn ([`Role::local_turn_ended`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalTurns {
    /// Every [`Pump::advance`], once the local peer's packets were taken: the peer runs on
    /// the pump's own thread between two passes (the embedded SIU), so a pass means its turn
    /// is over.
    EveryPass,
    /// The driver, with [`Pump::end_local_turn`]: the peer answers from elsewhere (the
    /// simulator's host, whose answer travels its host link).
    Driver,
}

/// A peer in the same process (an application embedding its SIU, or the simulator's host):
/// its packets skip the links and wait in two bounded queues instead.
#[derive(Debug)]
pub(super) struct LocalPeer {
    /// Its role peer id (it has no link id: link ids skip it).
    pub(super) peer: usize,
    pub(super) attached: bool,
    /// From it, not yet taken by the role.
    pub(super) inbox: VecDeque<Vec<u8>>,
    /// To it, not yet taken by it.
    pub(super) outbox: VecDeque<Vec<u8>>,
    /// Who ends its turns.
    pub(super) turns: LocalTurns,
    /// [`LocalTurns::Driver`]: the driver ended its turn since the role last heard.
    pub(super) turn_over: bool,
}

impl<R: Role> Pump<R> {
    /// A pump whose role peer `local` lives in this process (see [`Pump::local_send`]): the
    /// links hold the other peers, in role peer-id order with `local` left out.
    pub fn with_local(
        role: R,
        links: Links,
        held_max: usize,
        local: usize,
        turns: LocalTurns,
    ) -> Self {
        let mut pump = Self::new(role, links, held_max);
        pump.local = Some(LocalPeer {
            peer: local,
            attached: false,
            inbox: VecDeque::new(),
            outbox: VecDeque::new(),
            turns,
            turn_over: false,
        });
        pump
    }

    /// The local peer attached (its first sign of life): the role sees it come up.
    pub fn local_attach(&mut self, now: Time) {
        let Some(l) = self.local.as_mut().filter(|l| !l.attached) else {
            return;
        };
        l.attached = true;
        let peer = l.peer;
        self.role.link_up(now.0 / NS_PER_US, peer);
    }

    /// The local peer went away: the role sees it lost, and what waited for it goes back to
    /// the role ([`Role::undelivered`]), in order.
    pub fn local_detach(&mut self, now: Time) {
        let Some(l) = self.local.as_mut().filter(|l| l.attached) else {
            return;
        };
        l.attached = false;
        l.inbox.clear();
        // Nobody is left to answer.
        l.turn_over = true;
        let peer = l.peer;
        let waiting: Vec<Vec<u8>> = l.outbox.drain(..).collect();
        self.drop_held_from(peer);
        let now_us = now.0 / NS_PER_US;
        self.role
            .link_lost(now_us, peer, LossReason::Detached, waiting.len());
        for bytes in waiting {
            self.role.undelivered(now_us, peer, bytes);
        }
        for lane in 0..self.stalled.len() {
            if self.stalled[lane].as_ref().is_some_and(|(p, _)| *p == peer) {
                let (_, bytes) = self.stalled[lane].take().expect("checked");
                self.role.undelivered(now_us, peer, bytes);
            }
        }
    }

    /// A new application replaced the local peer while the in-process link stayed up (it
    /// restarted after logical time's restart): what the previous one sent and the role has
    /// not taken yet is dropped — it is gone, and its packets must not be taken for the new
    /// one's — then the role sees the old one leave and the new one come. What waits for the
    /// host stays: it was produced after the reset the previous one saw. Returns the packets
    /// dropped.
    pub fn local_replace(&mut self, now: Time) -> usize {
        let Some(l) = self.local.as_mut().filter(|l| l.attached) else {
            return 0;
        };
        let peer = l.peer;
        let dropped = l.inbox.len() + self.drop_held_from(peer);
        if let Some(l) = self.local.as_mut() {
            l.inbox.clear();
        }
        let now_us = now.0 / NS_PER_US;
        self.role.link_lost(now_us, peer, LossReason::Detached, 0);
        self.role.link_up(now_us, peer);
        dropped
    }

    /// Drops input held from `peer` (it is gone); returns how many.
    fn drop_held_from(&mut self, peer: usize) -> usize {
        let mut n = 0;
        for lane in &mut self.held {
            let before = lane.len();
            lane.retain(|(p, _)| *p != peer);
            n += before - lane.len();
        }
        n
    }

    /// A packet from the local peer; handed back when its queue is full (back-pressure: the
    /// local peer waits and offers it again). Call [`Pump::advance`] after.
    pub fn local_send(&mut self, bytes: Vec<u8>) -> Result<(), Vec<u8>> {
        let held_max = self.held_max;
        match self.local.as_mut() {
            Some(l) if l.inbox.len() < held_max => {
                l.inbox.push_back(bytes);
                debug_assert!(l.inbox.len() <= held_max);
                Ok(())
            }
            _ => Err(bytes),
        }
    }

    /// The next packet for the local peer.
    pub fn local_recv(&mut self) -> Option<Vec<u8>> {
        self.local.as_mut()?.outbox.pop_front()
    }

    /// Packets waiting for the local peer to take them.
    pub fn local_waiting(&self) -> usize {
        self.local.as_ref().map_or(0, |l| l.outbox.len())
    }

    /// [`LocalTurns::Driver`]: the local peer's turn is over (it answered, or had its chance
    /// to); the role hears it in the next [`Pump::advance`], after what the peer sent before.
    pub fn end_local_turn(&mut self) {
        if let Some(l) = self.local.as_mut() {
            l.turn_over = true;
        }
    }

    /// Is this pass no turn of the local peer's, because the role awaits one that has not
    /// started ([`Role::local_turn_coming`])? Only an in-thread peer's passes are its turns
    /// ([`LocalTurns::EveryPass`]); a driver ends the others' turns itself.
    pub(super) fn local_turn_awaited(&self) -> bool {
        self.local
            .as_ref()
            .is_some_and(|l| l.turns == LocalTurns::EveryPass)
            && self.role.local_turn_coming()
    }

    /// Should the role hear that the local peer's turn ended, now that its packets of this
    /// pass were taken? Consumes a driver's [`Pump::end_local_turn`].
    pub(super) fn take_turn_over(&mut self) -> bool {
        self.local.as_mut().is_some_and(|l| match l.turns {
            LocalTurns::EveryPass => true,
            LocalTurns::Driver => std::mem::take(&mut l.turn_over),
        })
    }
}
