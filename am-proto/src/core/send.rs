//! Sending: posting a request into a free slot, the bounded transmit queue, and encoding what
//! leaves (requests, responses from the reply cache, reply returns, control answers), bulk
//! messages as fragments.
//!
//! The queue holds references to slots ([`Tx`]), not encoded frames: a frame is encoded when
//! the driver polls for it, from the slot as it is then, so a request answered or returned
//! meanwhile is skipped instead of sent stale, and a retransmission costs no copy. A full
//! queue drops the frame; retransmission recovers it.

use super::Core;
use super::endpoints::seg_check;
use super::{RecvState, Resp, SendSlot, SendState};
use crate::error::AmError;
use crate::frame::{self, FLAG_FIFO, Header, Kind};
use crate::msg::OutMsg;
use crate::types::{
    Class, EpId, HandlerId, MAX_ARGS, MAX_LONG_BYTES, MAX_MEDIUM_BYTES, NodeAddr, Time, TransIdx,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Tx {
    Req {
        peer: u32,
        slot: u16,
        seq: u32,
        frag: u32,
    },
    Resp {
        peer: u32,
        slot: u16,
        seq: u32,
        frag: u32,
    },
    ReplyNack {
        peer: u32,
        slot: u16,
        seq: u32,
    },
    Ctl {
        to: NodeAddr,
        h: Header,
    },
}

impl Tx {
    /// The same message's next fragment (a bulk request or reply that did not fit one frame).
    fn next_fragment(mut self) -> Self {
        if let Self::Req { frag, .. } | Self::Resp { frag, .. } = &mut self {
            *frag += 1;
        }
        self
    }
}

/// A request to send, as the API layer hands it to the core.
#[derive(Clone, Copy, Debug)]
pub struct SendReq<'a> {
    /// Sending endpoint.
    pub ep: EpId,
    /// Translation entry naming the destination.
    pub idx: TransIdx,
    /// Size class.
    pub class: Class,
    /// Handler at the destination (for a get: the reply handler here).
    pub handler: HandlerId,
    /// Argument words.
    pub args: &'a [u64],
    /// Medium or bulk payload.
    pub payload: &'a [u8],
    /// Bulk: destination offset there; get: destination offset here.
    pub dest_offset: u32,
    /// Get: source offset there.
    pub src_offset: u32,
    /// Get: bytes to read.
    pub len: u32,
}

impl<'a> SendReq<'a> {
    /// A short request: `args` only (the other classes start from this one with struct
    /// update syntax).
    pub fn short(ep: EpId, idx: TransIdx, handler: HandlerId, args: &'a [u64]) -> Self {
        Self {
            ep,
            idx,
            class: Class::Short,
            handler,
            args,
            payload: &[],
            dest_offset: 0,
            src_offset: 0,
            len: 0,
        }
    }

    /// A medium request: `args` and `payload` (at most `MAX_MEDIUM_BYTES`).
    pub fn medium(
        ep: EpId,
        idx: TransIdx,
        handler: HandlerId,
        payload: &'a [u8],
        args: &'a [u64],
    ) -> Self {
        Self {
            class: Class::Medium,
            payload,
            ..Self::short(ep, idx, handler, args)
        }
    }
}

impl Core {
    /// Post a request. Synchronous errors (bad arguments, unbound entry, no credit) come back
    /// here; everything found later comes back to handler 0.
    pub fn send_request(&mut self, now: Time, r: SendReq<'_>) -> Result<(), AmError> {
        self.pass_time(now);
        if r.args.len() > MAX_ARGS {
            return Err(AmError::BadArg("more than MAX_ARGS argument words"));
        }
        match r.class {
            Class::Short => {}
            Class::Medium if r.payload.len() > MAX_MEDIUM_BYTES => {
                return Err(AmError::BadArg(
                    "medium payload larger than MAX_MEDIUM_BYTES",
                ));
            }
            Class::Medium => {}
            Class::Xfer if r.payload.len() > MAX_LONG_BYTES => {
                return Err(AmError::BadArg("bulk payload larger than MAX_LONG_BYTES"));
            }
            Class::Xfer => {}
            Class::Get => {
                if r.len as usize > MAX_LONG_BYTES {
                    return Err(AmError::BadArg("get larger than MAX_LONG_BYTES"));
                }
                let seg_len = self.ep(r.ep)?.seg.len();
                if seg_check(seg_len, r.dest_offset, r.len).is_err() {
                    return Err(AmError::BadSegment {
                        offset: u64::from(r.dest_offset),
                        len: u64::from(r.len),
                        seg_len: seg_len as u64,
                    });
                }
            }
        }
        let e = self.ep(r.ep)?;
        let (dest, tag) = e
            .trans
            .get(usize::from(r.idx.0))
            .copied()
            .flatten()
            .ok_or(AmError::BadEntry(r.idx))?;
        let pi = self
            .peer_index(dest.node)
            .ok_or(AmError::Resource("peers"))?;
        let p = &mut self.peers[pi as usize];
        let si = match p.ss.iter().position(|s| s.state == SendState::Free) {
            Some(si) => si,
            None if p.ss.len() < self.cfg.credits => {
                p.ss.push(SendSlot::fresh(&self.cfg, p.addr));
                p.ss.len() - 1
            }
            None => return Err(AmError::WouldBlock),
        };
        let fifo = if p.fifo {
            let f = p.fifo_tx;
            p.fifo_tx = p.fifo_tx.wrapping_add(1);
            Some(f)
        } else {
            None
        };
        let rto = p.rto(&self.cfg);
        let s = &mut p.ss[si];
        let m = &mut s.msg;
        m.set_args(r.args)?;
        m.class = r.class;
        m.handler = r.handler.0;
        m.src_ep = r.ep.0;
        m.dst_ep = dest.ep.0;
        m.tag = tag.0;
        m.dest_offset = r.dest_offset;
        m.src_offset = r.src_offset;
        m.fifo = fifo;
        m.set_payload(r.payload);
        if r.class == Class::Get {
            m.total_len = r.len;
        }
        s.dest = dest;
        s.seq = s.next_seq;
        s.next_seq = s.next_seq.wrapping_add(1);
        s.state = SendState::AwaitReply;
        s.rto = rto;
        s.sent_at = now;
        s.retransmitted = false;
        s.next_retx = now.plus(s.rto);
        s.give_up_at = now.plus(self.cfg.give_up);
        s.rearm(&mut self.timers, pi, si);
        s.reasm.active = false;
        let seq = s.seq;
        p.busy += 1;
        self.push_tx(Tx::Req {
            peer: pi,
            slot: si as u16,
            seq,
            frag: 0,
        });
        Ok(())
    }

    /// Queue `t`, after the acknowledgement held for its peer, if any (it rides along; when
    /// `t` is that same acknowledgement, answering a duplicate, it goes once).
    pub(super) fn push_tx(&mut self, t: Tx) {
        if let Tx::Req { peer, .. } | Tx::Resp { peer, .. } | Tx::ReplyNack { peer, .. } = t
            && self.release_ack(peer) == Some(t)
        {
            return;
        }
        self.enqueue_tx(t);
    }

    /// Queue `t` as it is (a full queue drops it).
    pub(super) fn enqueue_tx(&mut self, t: Tx) {
        if self.txq.len() >= self.cfg.tx_queue {
            self.stats.tx_dropped += 1;
            return;
        }
        self.txq.push_back(t);
    }

    fn chunk_for(&self, nargs: u8) -> usize {
        (self.max_datagram - frame::overhead(usize::from(nargs))).min(usize::from(u16::MAX)) & !7
    }

    /// The next datagram to send, encoded into an internal buffer: the next frame and the
    /// frames queued right behind it for the same peer, as many as fit one datagram (a
    /// token and the acknowledgement it carries along, a batch and the credit beside it).
    pub fn poll_transmit(&mut self) -> Option<(NodeAddr, &[u8])> {
        self.scratch.clear();
        let to = loop {
            let t = match self.cur.take() {
                Some(t) => t,
                None => self.txq.pop_front()?,
            };
            if let Some(to) = self.encode_tx(t) {
                break to;
            }
        };
        self.coalesce(to);
        Some((to, &self.scratch))
    }

    /// Appends to the datagram in `scratch` the frames at the head of the queue that go to
    /// `to`, while they fit. Stops at a frame for another peer (the queue's order is kept)
    /// and after a message's fragment (its next one fills a datagram of its own).
    fn coalesce(&mut self, to: NodeAddr) {
        while self.cur.is_none() {
            let Some(&next) = self.txq.front() else {
                return;
            };
            if self.tx_addr(next) != to {
                return;
            }
            self.txq.pop_front();
            let end = self.scratch.len();
            if self.encode_tx(next).is_none() {
                continue;
            }
            if self.scratch.len() > self.max_datagram {
                // It did not fit: out again, to lead the next datagram.
                self.scratch.truncate(end);
                self.cur = None;
                self.txq.push_front(next);
                return;
            }
            self.stats.frames_coalesced += 1;
        }
    }

    /// Where `t` goes.
    fn tx_addr(&self, t: Tx) -> NodeAddr {
        match t {
            Tx::Ctl { to, .. } => to,
            Tx::Req { peer, .. } | Tx::Resp { peer, .. } | Tx::ReplyNack { peer, .. } => {
                self.peers[peer as usize].addr
            }
        }
    }

    /// Encode `t` (or its next fragment) at the end of `scratch`; `None` (and nothing
    /// appended) if it went stale.
    fn encode_tx(&mut self, t: Tx) -> Option<NodeAddr> {
        match t {
            Tx::Ctl { to, h } => {
                frame::append(&h, &[], &[], &mut self.scratch);
                Some(to)
            }
            Tx::Req {
                peer,
                slot,
                seq,
                frag,
            } => {
                let p = &self.peers[peer as usize];
                let s = &p.ss[usize::from(slot)];
                if s.state != SendState::AwaitReply || s.seq != seq {
                    return None;
                }
                let mut h = msg_header(Kind::Request, &s.msg);
                h.route(slot, seq, p.epoch, (self.inc, p.known_inc));
                if self.encode_msg(h, peer, slot, frag, true) {
                    self.cur = Some(t.next_fragment());
                }
                Some(self.peers[peer as usize].addr)
            }
            Tx::Resp {
                peer,
                slot,
                seq,
                frag,
            } => {
                let p = &self.peers[peer as usize];
                let rs = p.rs.get(usize::from(slot))?;
                if rs.state != RecvState::Done || rs.seq != seq {
                    return None;
                }
                let (kind, status) = match rs.resp {
                    Resp::Reply => (Kind::Reply, None),
                    Resp::Ack => (Kind::Ack, None),
                    Resp::Nack(s) => (Kind::Nack, Some(s)),
                };
                let mut h = if kind == Kind::Reply {
                    msg_header(Kind::Reply, &rs.resp_msg)
                } else {
                    Header::new(kind, rs.req.class)
                };
                h.status = status;
                h.src_ep = rs.req.dst_ep;
                h.dst_ep = rs.req.src_ep;
                h.route(slot, seq, p.r_epoch, (self.inc, p.r_inc));
                if kind == Kind::Reply {
                    if self.encode_msg(h, peer, slot, frag, false) {
                        self.cur = Some(t.next_fragment());
                    }
                } else {
                    frame::append(&h, &[], &[], &mut self.scratch);
                }
                Some(self.peers[peer as usize].addr)
            }
            Tx::ReplyNack { peer, slot, seq } => {
                let p = &self.peers[peer as usize];
                let s = &p.ss[usize::from(slot)];
                if s.state != SendState::AwaitNackAck || s.seq != seq {
                    return None;
                }
                let mut h = Header::new(Kind::ReplyNack, Class::Short);
                h.status = Some(s.nack_status);
                h.src_ep = s.msg.src_ep;
                h.dst_ep = s.msg.dst_ep;
                h.route(slot, seq, p.epoch, (self.inc, p.known_inc));
                frame::append(&h, &[], &[], &mut self.scratch);
                Some(p.addr)
            }
        }
    }

    /// Encode fragment `frag` of a stored message; true if more fragments follow.
    fn encode_msg(
        &mut self,
        mut h: Header,
        peer: u32,
        slot: u16,
        frag: u32,
        request: bool,
    ) -> bool {
        let chunk = self.chunk_for(h.nargs);
        let p = &self.peers[peer as usize];
        let m = if request {
            &p.ss[usize::from(slot)].msg
        } else {
            &p.rs[usize::from(slot)].resp_msg
        };
        let args = &m.args[..usize::from(m.nargs)];
        if m.class != Class::Xfer {
            h.frag_len = m.payload.len() as u16;
            frame::append(&h, args, &m.payload, &mut self.scratch);
            return false;
        }
        let total = m.payload.len();
        let off = (frag as usize * chunk).min(total);
        let len = chunk.min(total - off);
        h.frag_chunk = chunk as u16;
        h.frag_offset = off as u32;
        h.frag_len = len as u16;
        frame::append(&h, args, &m.payload[off..off + len], &mut self.scratch);
        off + len < total
    }
}

fn msg_header(kind: Kind, m: &OutMsg) -> Header {
    let mut h = Header::new(kind, m.class);
    h.handler = m.handler;
    h.src_ep = m.src_ep;
    h.dst_ep = m.dst_ep;
    h.tag = m.tag;
    h.nargs = m.nargs;
    h.total_len = m.total_len;
    h.dest_offset = m.dest_offset;
    h.src_offset = m.src_offset;
    if let Some(fs) = m.fifo {
        h.flags |= FLAG_FIFO;
        h.fifo_seq = fs;
    }
    h
}
