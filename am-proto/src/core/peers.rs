//! The peer table: a peer's state (see [`Peer`]) is made when a request goes to it or comes
//! from it, or FIFO delivery is set for it, up to `max_peers`; one more is refused
//! (`Congestion` to a request from it, `AmError::Resource` to a send). Peers are never
//! removed, so a peer index stays valid and the last lookup is cached. Per peer the sender
//! also chooses FIFO delivery and counts its free request slots (credits), made as needed.

use std::time::Duration;

use super::{Config, Core, Peer, Reasm, SendSlot, SendState};
use crate::error::AmError;
use crate::msg::OutMsg;
use crate::types::{EndpointName, EpId, NodeAddr, Status, Time};

impl Core {
    /// The index of a known peer (no insertion).
    pub(super) fn lookup(&self, addr: NodeAddr) -> Option<u32> {
        match self.last_peer {
            Some((a, i)) if a == addr => Some(i),
            _ => self.index.get(&addr).copied(),
        }
    }

    pub(super) fn peer_index(&mut self, addr: NodeAddr) -> Option<u32> {
        // Peers are never removed, so the last hit stays valid; it saves a SipHash of the
        // address per datagram in the common one-peer-at-a-time case.
        if let Some(&(a, i)) = self.last_peer.as_ref()
            && a == addr
        {
            return Some(i);
        }
        if let Some(&i) = self.index.get(&addr) {
            self.last_peer = Some((addr, i));
            return Some(i);
        }
        if self.peers.len() >= self.cfg.max_peers {
            return None;
        }
        // Request slots are made as they are first needed (see `SendSlot::fresh`).
        let ss = Vec::new();
        self.peers.push(Peer {
            addr,
            fifo: false,
            known_inc: 0,
            epoch: 0,
            fifo_tx: 0,
            srtt: None,
            rttvar: Duration::ZERO,
            ss,
            busy: 0,
            r_seen: false,
            r_inc: 0,
            r_epoch: 0,
            fifo_rx: 0,
            rs: Vec::new(),
            ack_held: None,
        });
        let i = (self.peers.len() - 1) as u32;
        self.index.insert(addr, i);
        self.last_peer = Some((addr, i));
        Some(i)
    }

    /// Ask for per-peer FIFO delivery of requests sent from here to `node` (the receiver
    /// reorders them in a bounded reorder buffer; nothing is dropped for being early).
    pub fn set_fifo(&mut self, node: NodeAddr, on: bool) -> Result<(), AmError> {
        let i = self.peer_index(node).ok_or(AmError::Resource("peers"))?;
        self.peers[i as usize].fifo = on;
        Ok(())
    }

    /// Free request slots towards `node` (slots not made yet are free).
    pub fn credits_available(&self, node: NodeAddr) -> usize {
        match self.index.get(&node) {
            Some(&i) => {
                let ss = &self.peers[i as usize].ss;
                let free = ss.iter().filter(|s| s.state == SendState::Free).count();
                free + (self.cfg.credits - ss.len())
            }
            None => self.cfg.credits,
        }
    }
}

impl SendSlot {
    /// A free request slot towards `addr`, as every slot starts. A peer's slots are made
    /// one by one when every slot made so far is busy, up to `credits`: a peer that never
    /// has more than a few requests outstanding holds only those few (the simulator's
    /// thousands of links), and the slot a request takes — the lowest free one — is the
    /// same as if all had been made at once.
    pub(super) fn fresh(cfg: &Config, addr: NodeAddr) -> Self {
        Self {
            state: SendState::Free,
            seq: 0,
            next_seq: cfg.initial_seq,
            msg: OutMsg::default(),
            dest: EndpointName {
                node: addr,
                ep: EpId(0),
            },
            next_retx: Time(0),
            rto: cfg.rto_initial,
            give_up_at: Time(0),
            sent_at: Time(0),
            retransmitted: false,
            nack_status: Status::BadArgs,
            reasm: Reasm::default(),
            timer: None,
        }
    }
}

impl Core {
    /// Requests (and reply-return notices) outstanding towards all peers.
    pub fn outstanding(&self) -> usize {
        self.peers.iter().map(|p| p.busy).sum()
    }
}
