//! The peer table: a peer's state (see [`Peer`]) is made when a request goes to it or comes
//! from it, or FIFO delivery is set for it, up to `max_peers`; one more is refused
//! (`Congestion` to a request from it, `AmError::Resource` to a send). Peers are never
//! removed, so a peer index stays valid and the last lookup is cached. Per peer the sender
//! also chooses FIFO delivery and counts its free request slots (credits).

use std::time::Duration;

use super::{Core, Peer, Reasm, SendSlot, SendState};
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
        let ss = (0..self.cfg.credits)
            .map(|_| SendSlot {
                state: SendState::Free,
                seq: 0,
                next_seq: self.cfg.initial_seq,
                msg: OutMsg::default(),
                dest: EndpointName {
                    node: addr,
                    ep: EpId(0),
                },
                next_retx: Time(0),
                rto: self.cfg.rto_initial,
                give_up_at: Time(0),
                sent_at: Time(0),
                retransmitted: false,
                nack_status: Status::BadArgs,
                reasm: Reasm::default(),
            })
            .collect();
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

    /// Free request slots towards `node`.
    pub fn credits_available(&self, node: NodeAddr) -> usize {
        match self.index.get(&node) {
            Some(&i) => self.peers[i as usize]
                .ss
                .iter()
                .filter(|s| s.state == SendState::Free)
                .count(),
            None => self.cfg.credits,
        }
    }

    /// Requests (and reply-return notices) outstanding towards all peers.
    pub fn outstanding(&self) -> usize {
        self.peers.iter().map(|p| p.busy).sum()
    }
}
