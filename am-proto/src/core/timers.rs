//! Timers: retransmission, give-up, and the round-trip estimate that sets the timeout.
//!
//! A request (or a reply return) unanswered for its timeout is sent again and its timeout
//! doubles, up to `rto_max`; the first timeout of a request comes from the peer's smoothed
//! round-trip time (Jacobson/Karn). Once a request is unanswered past `give_up`, everything
//! outstanding towards that peer is returned as `Unreachable` and a new epoch starts, so a
//! late answer to a returned request is never delivered. `timer_floor` lets a timeout that
//! is not due return without scanning the slots.

use std::time::Duration;

use super::returned::{RetEntry, returned_of};
use super::send::Tx;
use super::{Config, Core};
use super::{Peer, SendSlot, SendState};
use crate::types::{Status, Time};

impl Core {
    /// When the core next needs `handle_timeout`.
    pub fn poll_timeout(&self) -> Option<Time> {
        self.peers
            .iter()
            .filter(|p| p.busy > 0)
            .flat_map(|p| p.ss.iter())
            .filter(|s| matches!(s.state, SendState::AwaitReply | SendState::AwaitNackAck))
            .map(|s| s.next_retx.min(s.give_up_at))
            .min()
    }

    /// Whether any request (or reply-return notice) waits on a timer. When none does, the
    /// core needs no clock reading: requests are handled without one, and a response can only
    /// be stale (its slot is not waiting), so `now` is not consulted.
    pub fn timers_armed(&self) -> bool {
        self.timer_floor != Time(u64::MAX)
    }

    /// Retransmit what is due (doubling its timeout) and give up on peers past the deadline.
    pub fn handle_timeout(&mut self, now: Time) {
        if now < self.timer_floor {
            return;
        }
        for pi in 0..self.peers.len() {
            if self.peers[pi].busy == 0 {
                continue;
            }
            let waiting =
                |s: &SendSlot| matches!(s.state, SendState::AwaitReply | SendState::AwaitNackAck);
            // Nothing due (the common case): no work beyond one scan of the slots.
            let (mut due, mut dead) = (false, false);
            for s in self.peers[pi].ss.iter().filter(|s| waiting(s)) {
                dead |= now >= s.give_up_at;
                due |= now >= s.next_retx;
            }
            if dead {
                self.peer_unreachable(pi);
                continue;
            }
            if !due {
                continue;
            }
            let rto_max = self.cfg.rto_max;
            let (tx_queue, txq, stats) = (self.cfg.tx_queue, &mut self.txq, &mut self.stats);
            for (si, s) in self.peers[pi].ss.iter_mut().enumerate() {
                if !waiting(s) || now < s.next_retx {
                    continue;
                }
                s.retransmitted = true;
                s.rto = (s.rto * 2).min(rto_max);
                s.next_retx = now.plus(s.rto);
                let (peer, slot, seq) = (pi as u32, si as u16, s.seq);
                let t = if s.state == SendState::AwaitReply {
                    Tx::Req {
                        peer,
                        slot,
                        seq,
                        frag: 0,
                    }
                } else {
                    Tx::ReplyNack { peer, slot, seq }
                };
                stats.retransmits += 1;
                if txq.len() >= tx_queue {
                    stats.tx_dropped += 1;
                } else {
                    txq.push_back(t);
                }
            }
        }
        self.timer_floor = self.poll_timeout().unwrap_or(Time(u64::MAX));
    }

    /// Return everything outstanding towards peer `pi` as unreachable and start a new epoch,
    /// so that late replies are rejected and the peer starts a fresh sequence space.
    pub(super) fn peer_unreachable(&mut self, pi: usize) {
        let p = &mut self.peers[pi];
        let mut out = Vec::new();
        for (si, s) in p.ss.iter_mut().enumerate() {
            match s.state {
                SendState::AwaitReply => {
                    s.state = SendState::Returning;
                    out.push(RetEntry {
                        r: returned_of(&s.msg, s.dest, Status::Unreachable, true),
                        slot: Some((pi as u32, si as u16, s.seq)),
                    });
                }
                SendState::AwaitNackAck => {
                    s.state = SendState::Free;
                    p.busy -= 1;
                }
                SendState::Free | SendState::Returning => {}
            }
        }
        p.epoch = p.epoch.wrapping_add(1);
        p.known_inc = 0;
        p.fifo_tx = 0;
        for e in out {
            self.push_returned(e);
        }
    }
}

impl Peer {
    pub(super) fn rto(&self, cfg: &Config) -> Duration {
        match self.srtt {
            None => cfg.rto_initial,
            Some(s) => (s + 4 * self.rttvar).clamp(cfg.rto_min, cfg.rto_max),
        }
    }

    pub(super) fn observe_rtt(&mut self, sample: Duration) {
        match self.srtt {
            None => {
                self.srtt = Some(sample);
                self.rttvar = sample / 2;
            }
            Some(s) => {
                let err = s.abs_diff(sample);
                self.rttvar = (self.rttvar * 3 + err) / 4;
                self.srtt = Some((s * 7 + sample) / 8);
            }
        }
    }
}
