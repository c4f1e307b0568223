//! Timers: retransmission, give-up, and the round-trip estimate that sets the timeout.
//!
//! A request (or a reply return) unanswered for its timeout is sent again and its timeout
//! doubles, up to `rto_max`; the first timeout of a request comes from the peer's smoothed
//! round-trip time (Jacobson/Karn). Once a request is unanswered past `give_up`, everything
//! outstanding towards that peer is returned as `Unreachable` and a new epoch starts, so a
//! late answer to a returned request is never delivered. Every waiting slot's next timer is
//! in one ordered set, so a timeout that is not due returns after one look at its first entry.

use std::time::Duration;

use super::returned::{RetEntry, returned_of};
use super::send::Tx;
use super::{Config, Core};
use super::{Peer, SendState};
use crate::types::{Status, Time};

/// Most peers whose slots debug builds scan to check the timer set after every change of
/// the next deadline (beyond it the check is skipped: it would make large simulations
/// quadratic in debug builds).
const TIMER_SCAN_PEERS_MAX: usize = 64;

impl Core {
    /// When the core next needs `handle_timeout`.
    pub fn poll_timeout(&self) -> Option<Time> {
        [self.next_slot_timer(), self.next_ack_due()]
            .into_iter()
            .flatten()
            .min()
    }

    /// The earliest timer of a waiting request slot.
    fn next_slot_timer(&self) -> Option<Time> {
        let next = self.timers.first().map(|&(t, _, _)| t);
        if cfg!(debug_assertions) && self.peers.len() <= TIMER_SCAN_PEERS_MAX {
            assert_eq!(next, self.scan_timeout(), "the timer set is out of step");
        }
        next
    }

    /// The earliest timer of a waiting slot, by scanning every peer's slots: what the timer
    /// set must say (checked in debug builds up to [`TIMER_SCAN_PEERS_MAX`] peers).
    fn scan_timeout(&self) -> Option<Time> {
        self.peers
            .iter()
            .filter(|p| p.busy > 0)
            .flat_map(|p| p.ss.iter())
            .filter(|s| s.waiting())
            .map(|s| s.next_retx.min(s.give_up_at))
            .min()
    }

    /// Whether any request (or reply-return notice) or held acknowledgement waits on a
    /// timer. When none does, the core needs no clock reading: requests are handled without
    /// one (an acknowledgement held from a stale reading only leaves sooner), and a response
    /// can only be stale (its slot is not waiting), so `now` is not consulted.
    pub fn timers_armed(&self) -> bool {
        !self.timers.is_empty() || !self.held_acks.is_empty()
    }

    /// Send the held acknowledgements that are due, retransmit what is due (doubling its
    /// timeout) and give up on peers past the deadline.
    /// Peers are visited in index order, as a scan of every peer would, but only those with
    /// a due timer.
    pub fn handle_timeout(&mut self, now: Time) {
        self.pass_time(now);
        self.release_due_acks(now);
        if self.next_slot_timer().is_none_or(|t| now < t) {
            return;
        }
        let mut due_peers: Vec<u32> = self
            .timers
            .iter()
            .take_while(|&&(t, _, _)| t <= now)
            .map(|&(_, pi, _)| pi)
            .collect();
        due_peers.sort_unstable();
        due_peers.dedup();
        for pi in due_peers {
            self.peer_timeout(now, pi as usize);
        }
    }

    /// Peer `pi` has a due timer: give up on it, or retransmit its due requests.
    fn peer_timeout(&mut self, now: Time, pi: usize) {
        let (mut due, mut dead) = (false, false);
        for s in self.peers[pi].ss.iter().filter(|s| s.waiting()) {
            dead |= now >= s.give_up_at;
            due |= now >= s.next_retx;
        }
        if dead {
            self.peer_unreachable(pi);
            return;
        }
        debug_assert!(due, "a due timer is a retransmission or a give-up");
        let rto_max = self.cfg.rto_max;
        let (tx_queue, txq, stats) = (self.cfg.tx_queue, &mut self.txq, &mut self.stats);
        let timers = &mut self.timers;
        for (si, s) in self.peers[pi].ss.iter_mut().enumerate() {
            if !s.waiting() || now < s.next_retx {
                continue;
            }
            s.retransmitted = true;
            s.rto = (s.rto * 2).min(rto_max);
            s.next_retx = now.plus(s.rto);
            s.rearm(timers, pi as u32, si);
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

    /// Return everything outstanding towards peer `pi` as unreachable and start a new epoch,
    /// so that late replies are rejected and the peer starts a fresh sequence space.
    pub(super) fn peer_unreachable(&mut self, pi: usize) {
        let p = &mut self.peers[pi];
        let mut out = Vec::new();
        for (si, s) in p.ss.iter_mut().enumerate() {
            match s.state {
                SendState::AwaitReply => {
                    s.state = SendState::Returning;
                    s.rearm(&mut self.timers, pi as u32, si);
                    out.push(RetEntry {
                        r: returned_of(&s.msg, s.dest, Status::Unreachable, true),
                        slot: Some((pi as u32, si as u16, s.seq)),
                    });
                }
                SendState::AwaitNackAck => {
                    s.state = SendState::Free;
                    s.rearm(&mut self.timers, pi as u32, si);
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
