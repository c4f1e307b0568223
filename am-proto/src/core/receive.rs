//! Receiving: an arriving datagram, and at the responder, its request.
//!
//! A request is delivered at most once: a frame from an earlier incarnation of this node is
//! refused, one from an older incarnation or epoch of the sender is stale, and a duplicate of
//! the last request in a slot is answered from the reply cache without running the handler
//! again. A bulk request is reassembled straight into the segment; a FIFO request that
//! arrives early waits in its slot (the reorder buffer) until those before it ran. A complete
//! request is validated against the endpoint as it is at delivery (tag, handler, segment
//! bounds), so a revoked tag or freed endpoint takes effect at once. A reply the requester
//! returns (`ReplyNack`) is handed to handler 0 here, once.

use super::Core;
use super::Dispatch;
use super::EpState;
use super::endpoints::seg_check;
use super::returned::{RetEntry, returned_of};
use super::send::Tx;
use super::{RecvSlot, RecvState, Resp};
use crate::frame::{self, FLAG_FIFO, Frame, Header, Kind};
use crate::msg::{Data, MsgInfo, OutMsg, Request};
use crate::types::{
    Class, EndpointName, EpId, HandlerId, HandlerKind, MAX_SLOTS, NodeAddr, Status, Tag, Time,
};

impl Core {
    /// Process one received datagram, running handlers through `d`: its frames in order,
    /// up to the first that does not decode (counted in `bad_frames`; it and the rest of the
    /// datagram are dropped, and retransmission recovers them).
    pub fn handle_datagram(
        &mut self,
        now: Time,
        from: NodeAddr,
        bytes: &[u8],
        d: &mut dyn Dispatch,
    ) {
        self.pass_time(now);
        let mut rest = bytes;
        loop {
            let Ok((f, len)) = frame::decode_first(rest) else {
                self.stats.bad_frames += 1;
                return;
            };
            self.handle_frame(now, from, &f, d);
            rest = &rest[len..];
            if rest.is_empty() {
                return;
            }
        }
    }

    fn handle_frame(&mut self, now: Time, from: NodeAddr, f: &Frame<'_>, d: &mut dyn Dispatch) {
        match f.h.kind {
            Kind::Request => self.on_request(from, f, d),
            Kind::Reply | Kind::Ack | Kind::Nack => self.on_response(now, from, f, d),
            Kind::ReplyNack => self.on_reply_nack(from, f),
            Kind::ReplyNackAck => self.on_reply_nack_ack(from, f),
        }
    }

    pub(super) fn ctl_answer(
        &mut self,
        to: NodeAddr,
        f: &Header,
        kind: Kind,
        status: Option<Status>,
    ) {
        let mut h = Header::new(kind, f.class);
        h.status = status;
        h.src_ep = f.dst_ep;
        h.dst_ep = f.src_ep;
        h.route(f.slot, f.seq, f.epoch, (self.inc, f.src_inc));
        self.push_tx(Tx::Ctl { to, h });
    }

    fn on_request(&mut self, from: NodeAddr, f: &Frame<'_>, d: &mut dyn Dispatch) {
        let h = f.h;
        if h.dst_inc != 0 && h.dst_inc != self.inc {
            // Meant for an earlier incarnation of this node: never deliver it.
            self.ctl_answer(from, &h, Kind::Nack, Some(Status::Unreachable));
            return;
        }
        if usize::from(h.slot) >= MAX_SLOTS || h.src_inc == 0 {
            self.stats.bad_frames += 1;
            return;
        }
        let Some(pi) = self.peer_index(from) else {
            self.ctl_answer(from, &h, Kind::Nack, Some(Status::Congestion));
            return;
        };
        let p = &mut self.peers[pi as usize];
        let newer =
            !p.r_seen || h.src_inc > p.r_inc || (h.src_inc == p.r_inc && h.epoch > p.r_epoch);
        if newer {
            p.r_seen = true;
            p.r_inc = h.src_inc;
            p.r_epoch = h.epoch;
            p.fifo_rx = 0;
            for rs in &mut p.rs {
                rs.state = RecvState::Empty;
            }
        } else if h.src_inc != p.r_inc || h.epoch != p.r_epoch {
            self.stats.stale_frames += 1;
            return;
        }
        let si = usize::from(h.slot);
        while p.rs.len() <= si {
            p.rs.push(RecvSlot::new());
        }
        let rs = &mut p.rs[si];
        if rs.state != RecvState::Empty {
            if h.seq == rs.seq {
                match rs.state {
                    RecvState::Done => {
                        self.stats.dup_requests += 1;
                        self.push_tx(Tx::Resp {
                            peer: pi,
                            slot: h.slot,
                            seq: h.seq,
                            frag: 0,
                        });
                    }
                    RecvState::Assembling => self.absorb(pi, si, f, d),
                    RecvState::Waiting | RecvState::Empty => {}
                }
                return;
            }
            if h.seq != rs.seq.wrapping_add(1) || rs.state != RecvState::Done {
                self.stats.stale_frames += 1;
                return;
            }
        }
        // A new request in this slot (which implicitly acknowledges the previous reply).
        rs.state = RecvState::Assembling;
        rs.seq = h.seq;
        rs.resp_returned = false;
        let m = &mut rs.req;
        m.class = h.class;
        m.handler = h.handler;
        m.src_ep = h.src_ep;
        m.dst_ep = h.dst_ep;
        m.tag = h.tag;
        m.args = f.args;
        m.nargs = h.nargs;
        m.total_len = h.total_len;
        m.dest_offset = h.dest_offset;
        m.src_offset = h.src_offset;
        m.fifo = (h.flags & FLAG_FIFO != 0).then_some(h.fifo_seq);
        m.payload.clear();
        if h.class == Class::Xfer {
            rs.reasm.start(h.total_len, u32::from(h.frag_chunk));
        }
        self.absorb(pi, si, f, d);
    }

    /// Take in a frame of the request assembling in slot `si` of peer `pi`; deliver when
    /// complete and in turn.
    fn absorb(&mut self, pi: u32, si: usize, f: &Frame<'_>, d: &mut dyn Dispatch) {
        let h = &f.h;
        let p = &mut self.peers[pi as usize];
        let rs = &mut p.rs[si];
        if h.class != rs.req.class {
            self.stats.bad_frames += 1;
            return;
        }
        if h.class == Class::Xfer {
            if !rs.reasm.matches(h) {
                self.stats.bad_frames += 1;
                return;
            }
            if !rs.reasm.mark(h.frag_offset) {
                return;
            }
            // Write the fragment now, but only where the message may write at all.
            let ok = self.eps.get(usize::from(h.dst_ep)).is_some_and(|e| {
                e.live
                    && Tag(h.tag).admits(e.tag)
                    && seg_check(e.seg.len(), h.dest_offset, h.total_len).is_ok()
            });
            if ok {
                let seg = &mut self.eps[usize::from(h.dst_ep)].seg;
                let at = h.dest_offset as usize + h.frag_offset as usize;
                seg[at..at + f.payload.len()].copy_from_slice(f.payload);
            }
            if !rs.reasm.complete() {
                return;
            }
        }
        let in_turn = match rs.req.fifo {
            None => true,
            Some(fs) => fs == p.fifo_rx,
        };
        if !in_turn {
            let ahead = rs.req.fifo.unwrap_or(0).wrapping_sub(p.fifo_rx);
            if ahead as usize > MAX_SLOTS * 4 {
                self.stats.stale_frames += 1;
                rs.state = RecvState::Empty;
                return;
            }
            if h.class == Class::Medium {
                rs.req.payload.clear();
                rs.req.payload.extend_from_slice(f.payload);
            }
            rs.state = RecvState::Waiting;
            self.stats.fifo_parked += 1;
            return;
        }
        self.deliver(pi, si, Some(f.payload), d);
        if self.peers[pi as usize].rs[si].req.fifo.is_some() {
            self.drain_fifo(pi, d);
        }
    }

    fn drain_fifo(&mut self, pi: u32, d: &mut dyn Dispatch) {
        loop {
            let p = &mut self.peers[pi as usize];
            p.fifo_rx = p.fifo_rx.wrapping_add(1);
            let next = p.fifo_rx;
            let Some(si) =
                p.rs.iter()
                    .position(|r| r.state == RecvState::Waiting && r.req.fifo == Some(next))
            else {
                return;
            };
            self.deliver(pi, si, None, d);
        }
    }

    /// Validate a complete request against the destination endpoint as it is now, run its
    /// handler (or serve a get), and record the response in the reply cache.
    fn deliver(&mut self, pi: u32, si: usize, payload: Option<&[u8]>, d: &mut dyn Dispatch) {
        let peer_addr = self.peers[pi as usize].addr;
        let status = validate_request(&self.eps, &self.peers[pi as usize].rs[si].req, &*d);
        if status == Err(Status::BadTag) {
            self.stats.bad_tag += 1;
        }
        let rs = &mut self.peers[pi as usize].rs[si];
        let req = &rs.req;
        let ep = EpId(req.dst_ep);
        let resp = match status {
            Err(s) => Resp::Nack(s),
            Ok(()) if req.class == Class::Get => {
                let seg = &self.eps[usize::from(ep.0)].seg;
                let r = &mut rs.resp_msg;
                r.class = Class::Xfer;
                r.handler = req.handler;
                r.args = req.args;
                r.nargs = req.nargs;
                r.tag = req.tag;
                r.dest_offset = req.dest_offset;
                r.src_offset = 0;
                r.fifo = None;
                let (a, n) = (req.src_offset as usize, req.total_len as usize);
                r.set_payload(&seg[a..a + n]);
                Resp::Reply
            }
            Ok(()) => {
                let mut buf = std::mem::take(&mut rs.req.payload);
                let req = &rs.req;
                let medium = payload.unwrap_or(&buf);
                let (info, data) = handed!(req, req.args, peer_addr, ep, true, medium);
                self.sink.replied = false;
                let seg = &mut self.eps[usize::from(ep.0)].seg;
                d.on_request(Request {
                    info,
                    data,
                    seg,
                    sink: &mut self.sink,
                });
                self.stats.requests_handled += 1;
                buf.clear();
                rs.req.payload = buf;
                if self.sink.replied {
                    std::mem::swap(&mut rs.resp_msg, &mut self.sink.msg);
                    Resp::Reply
                } else {
                    self.stats.auto_acks += 1;
                    Resp::Ack
                }
            }
        };
        rs.resp = resp;
        rs.state = RecvState::Done;
        let seq = rs.seq;
        if resp == Resp::Ack {
            self.hold_ack(pi, si as u16, seq);
        } else {
            self.push_tx(Tx::Resp {
                peer: pi,
                slot: si as u16,
                seq,
                frag: 0,
            });
        }
    }

    fn on_reply_nack(&mut self, from: NodeAddr, f: &Frame<'_>) {
        let h = f.h;
        if h.dst_inc != self.inc {
            self.stats.stale_frames += 1;
            return;
        }
        if let Some(pi) = self.lookup(from) {
            let p = &mut self.peers[pi as usize];
            let current = p.r_seen && h.src_inc == p.r_inc && h.epoch == p.r_epoch;
            if let Some(rs) = p.rs.get_mut(usize::from(h.slot)).filter(|_| current) {
                let fresh = rs.state == RecvState::Done
                    && rs.seq == h.seq
                    && rs.resp == Resp::Reply
                    && !rs.resp_returned;
                if fresh {
                    rs.resp_returned = true;
                    let dest = EndpointName {
                        node: p.addr,
                        ep: EpId(rs.req.src_ep),
                    };
                    let status = h.status.unwrap_or(Status::ReplyRejected);
                    let r = returned_of(&rs.resp_msg, dest, status, false);
                    self.push_returned(RetEntry { r, slot: None });
                }
            }
        }
        self.ctl_answer(from, &h, Kind::ReplyNackAck, None);
    }
}

fn validate_request(eps: &[EpState], req: &OutMsg, d: &dyn Dispatch) -> Result<(), Status> {
    let ep = EpId(req.dst_ep);
    let e = eps
        .get(usize::from(ep.0))
        .filter(|e| e.live)
        .ok_or(Status::BadEndpoint)?;
    if !Tag(req.tag).admits(e.tag) {
        return Err(Status::BadTag);
    }
    match req.class {
        Class::Get => seg_check(e.seg.len(), req.src_offset, req.total_len),
        _ if d.handler_kind(ep, HandlerId(req.handler)) != HandlerKind::Request => {
            Err(Status::BadHandler)
        }
        Class::Xfer => seg_check(e.seg.len(), req.dest_offset, req.total_len),
        _ => Ok(()),
    }
}
