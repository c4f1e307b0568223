//! At the requester: the answer to a request. An Ack frees the slot; a Nack returns the
//! request to handler 0 (a Nack saying `Unreachable` means the peer restarted, so everything
//! outstanding towards it is returned); a reply is validated against the requesting endpoint
//! and run, or, if it cannot be delivered, returned to the replier with a `ReplyNack` that is
//! retransmitted until the replier acknowledges it, so neither side loses a reply silently.
//!
//! Only an answer of the current epoch to the request now in its slot counts: anything else is
//! a duplicate or stale, and a reply to a request already returned as unreachable is refused
//! so the replier learns it was never delivered. Unretransmitted answers feed the round-trip
//! estimate (Karn).

use super::Core;
use super::Dispatch;
use super::SendState;
use super::endpoints::seg_check;
use super::returned::{RetEntry, returned_of};
use super::send::Tx;
use crate::frame::{Frame, Kind};
use crate::msg::{Data, MsgInfo, Reply};
use crate::types::{
    Class, EndpointName, EpId, HandlerId, HandlerKind, NodeAddr, Status, Tag, Time,
};

impl Core {
    pub(super) fn on_response(
        &mut self,
        now: Time,
        from: NodeAddr,
        f: &Frame<'_>,
        d: &mut dyn Dispatch,
    ) {
        let h = f.h;
        let Some(pi) = self.lookup(from) else {
            self.stats.stale_frames += 1;
            return;
        };
        if h.dst_inc != self.inc {
            self.stats.stale_frames += 1;
            return;
        }
        let p = &mut self.peers[pi as usize];
        let si = usize::from(h.slot);
        if h.epoch != p.epoch {
            // An answer to a request already returned as unreachable: never deliver it.
            self.stats.stale_frames += 1;
            if h.kind == Kind::Reply {
                self.ctl_answer(from, &h, Kind::ReplyNack, Some(Status::ReplyRejected));
            }
            return;
        }
        let Some(s) =
            p.ss.get(si)
                .filter(|s| s.state == SendState::AwaitReply && s.seq == h.seq)
        else {
            self.stats.dup_responses += 1;
            return;
        };
        // Karn: only unretransmitted requests give round-trip samples.
        if !s.retransmitted && !s.reasm.active {
            let sample = now.since(s.sent_at);
            p.observe_rtt(sample);
        }
        p.known_inc = h.src_inc;
        let s = &mut p.ss[si];
        match h.kind {
            Kind::Ack => self.free_slot(pi, si),
            Kind::Nack if h.status == Some(Status::Unreachable) => {
                // The peer restarted: everything outstanding towards it may or may not have
                // run on the old incarnation.
                self.peer_unreachable(pi as usize);
            }
            Kind::Nack => {
                let status = h.status.unwrap_or(Status::BadArgs);
                s.state = SendState::Returning;
                s.rearm(&mut self.timers, pi, si);
                let e = RetEntry {
                    r: returned_of(&s.msg, s.dest, status, true),
                    slot: Some((pi, si as u16, s.seq)),
                };
                self.push_returned(e);
            }
            _ => self.on_reply(now, pi, si, f, d),
        }
    }

    fn free_slot(&mut self, pi: u32, si: usize) {
        let p = &mut self.peers[pi as usize];
        p.ss[si].state = SendState::Free;
        p.ss[si].rearm(&mut self.timers, pi, si);
        p.busy -= 1;
    }

    fn on_reply(&mut self, now: Time, pi: u32, si: usize, f: &Frame<'_>, d: &mut dyn Dispatch) {
        let h = f.h;
        let ep = EpId(h.dst_ep);
        let addr = self.peers[pi as usize].addr;
        let s = &mut self.peers[pi as usize].ss[si];
        let mut status = if h.dst_ep != s.msg.src_ep {
            Err(Status::BadEndpoint)
        } else {
            match self.eps.get(usize::from(ep.0)).filter(|e| e.live) {
                None => Err(Status::BadEndpoint),
                Some(_) if d.handler_kind(ep, HandlerId(h.handler)) != HandlerKind::Reply => {
                    Err(Status::BadHandler)
                }
                Some(e) if h.class == Class::Xfer => {
                    seg_check(e.seg.len(), h.dest_offset, h.total_len)
                }
                Some(_) => Ok(()),
            }
        };
        if status.is_ok() && h.class == Class::Xfer {
            if !s.reasm.active {
                s.reasm.start(h.total_len, u32::from(h.frag_chunk));
            }
            if !s.reasm.matches(&h) {
                status = Err(Status::BadArgs);
            } else if s.reasm.mark(h.frag_offset) {
                let seg = &mut self.eps[usize::from(ep.0)].seg;
                let at = h.dest_offset as usize + h.frag_offset as usize;
                seg[at..at + f.payload.len()].copy_from_slice(f.payload);
            }
            if status.is_ok() && !s.reasm.complete() {
                return;
            }
        }
        if let Err(st) = status {
            // Return the reply to the replier, reliably: keep the slot until it acknowledges.
            s.state = SendState::AwaitNackAck;
            s.nack_status = st;
            s.rto = self.cfg.rto_initial;
            s.next_retx = now.plus(s.rto);
            s.give_up_at = now.plus(self.cfg.give_up);
            s.rearm(&mut self.timers, pi, si);
            let seq = s.seq;
            self.push_tx(Tx::ReplyNack {
                peer: pi,
                slot: si as u16,
                seq,
            });
            return;
        }
        let (info, data) = handed!(h, f.args, addr, ep, false, f.payload);
        let seg = &mut self.eps[usize::from(ep.0)].seg;
        d.on_reply(Reply { info, data, seg });
        self.stats.replies_handled += 1;
        self.free_slot(pi, si);
    }

    pub(super) fn on_reply_nack_ack(&mut self, from: NodeAddr, f: &Frame<'_>) {
        let h = f.h;
        let Some(pi) = self.lookup(from) else {
            return;
        };
        let p = &self.peers[pi as usize];
        let si = usize::from(h.slot);
        let ok = h.dst_inc == self.inc
            && h.epoch == p.epoch
            && p.ss
                .get(si)
                .is_some_and(|s| s.state == SendState::AwaitNackAck && s.seq == h.seq);
        if ok {
            self.free_slot(pi, si);
        } else {
            self.stats.dup_responses += 1;
        }
    }
}
