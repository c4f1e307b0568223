//! What arrives on a link: the link's AM handlers, as the core runs them on [`State`].
//!
//! Data fragments are reassembled by concatenation; a fragment or batch of a newer stream
//! (the sender's link broke) drops the half-built packet of the old one, and an oversize
//! packet is dropped up to its last fragment. A batch's packets go to the inbox one by one,
//! the last one carrying the batch's credit; a batch that cannot be read whole delivers the
//! packets before the bad spot and breaks the link. A hello or hello answer from a newer
//! incarnation means the peer restarted, which breaks the link. Credit opens the window
//! again. Of the messages returned to handler 0, a lost data message (fragment or batch) of
//! the current stream breaks the link and a returned hello is tried again. Messages from
//! addresses that are not configured peers are counted and ignored; the first message from an
//! on-demand peer puts it in use. Handlers work on peer slots; events carry peer ids.

use super::batch;
use super::{
    Arrived, CREDIT_BATCH, H_BATCH, H_CREDIT, H_DATA, H_HELLO, H_HELLO_ACK, HELLO_RETRY, LINK_EP,
    LinkEvent, LossReason, PACKET_MAX, State, WINDOW_MAX,
};
use crate::core::Dispatch;
use crate::msg::{Reply, Request, Returned};
use crate::types::{EpId, HandlerId, HandlerKind, Status, Time};

impl State {
    /// A data message of `stream` arrived from `peer`: if the sender's link broke and a new
    /// stream began, what was half-assembled of the old one will never be completed, and the
    /// credit we owed it is void.
    fn follow_stream(&mut self, peer: usize, stream: u64) {
        let p = &mut self.peers[peer];
        if stream != p.rx_stream {
            self.stats.fragments_discarded += p.partial_frags as u64;
            p.partial.clear();
            p.partial_frags = 0;
            p.owed = 0;
            p.discarding = false;
            p.rx_stream = stream;
        }
    }

    /// Puts a whole packet in the inbox; false when the inbox is full (more than the peers'
    /// windows allow: a misbehaving peer): the packet is dropped rather than the inbox grown,
    /// and the link breaks.
    fn admit(&mut self, a: Arrived) -> bool {
        if self.inbox.len() >= self.inbox_max {
            self.stats.inbox_overflow += 1;
            self.break_link(a.peer, LossReason::InboxOverflow);
            return false;
        }
        self.inbox.push_back(a);
        self.stats.packets_received += 1;
        debug_assert!(self.inbox.len() <= self.inbox_max, "inbox bound overrun");
        true
    }

    fn on_data(&mut self, peer: usize, more: bool, stream: u64, data: &[u8]) {
        self.follow_stream(peer, stream);
        let p = &mut self.peers[peer];
        if p.discarding {
            self.stats.fragments_discarded += 1;
            p.discarding = more;
            return;
        }
        if p.partial.len() + data.len() > PACKET_MAX {
            self.stats.fragments_discarded += p.partial_frags as u64 + 1;
            p.partial.clear();
            p.partial_frags = 0;
            p.discarding = more;
            self.stats.oversize += 1;
            return;
        }
        if !more && p.partial_frags == 0 {
            // A packet in one fragment (the usual case: a token, a lone message) goes straight
            // into a spare buffer; the assembly buffer keeps its capacity for the next.
            let bytes = self.spare.copy_of(data);
            self.admit(Arrived {
                peer,
                bytes,
                fragments: 1,
                stream,
            });
            return;
        }
        p.partial.extend_from_slice(data);
        p.partial_frags += 1;
        if more {
            return;
        }
        let bytes = std::mem::take(&mut p.partial);
        let fragments = std::mem::take(&mut p.partial_frags);
        self.admit(Arrived {
            peer,
            bytes,
            fragments,
            stream,
        });
    }

    /// A batch: its packets go to the inbox in order, the last one carrying the batch's
    /// credit. A batch we cannot read whole leaves a hole in the peer's stream, which the
    /// link does not hide: packets before the bad spot are delivered, the rest dropped, and
    /// the link breaks (`BadBatch`), as a lost fragment breaks it, so the daemons rejoin
    /// instead of running on with packets missing. (A conforming sender never sends such a
    /// batch; the AM layer's CRC already caught corruption on the way.)
    fn on_batch(&mut self, peer: usize, version: u64, stream: u64, payload: &[u8]) {
        self.follow_stream(peer, stream);
        let cut = self.cut_partial(peer);
        if !batch::version_known(version) {
            // Not one packet of it can be read.
            self.stats.batch_bad_version += 1;
            self.credit_batch(peer, 0);
            self.break_link(peer, LossReason::BadBatch);
            return;
        }
        self.stats.batches_received += 1;
        let (mut delivered, mut bad, mut overflow) = (0, false, false);
        for packet in batch::packets(payload) {
            let Ok(bytes) = packet else {
                bad = true;
                break;
            };
            let arrived = Arrived {
                peer,
                bytes: self.spare.copy_of(bytes),
                fragments: 0,
                stream,
            };
            if !self.admit(arrived) {
                overflow = true; // and the link broke
                break;
            }
            delivered += 1;
        }
        debug_assert!(delivered <= batch::BATCH_PACKETS_MAX);
        debug_assert!(!(bad && overflow), "one reason to stop");
        self.stats.packets_batched += delivered as u64;
        self.credit_batch(peer, delivered);
        self.stats.batch_truncated += u64::from(bad);
        if (bad || cut) && !overflow {
            self.break_link(peer, LossReason::BadBatch);
        }
    }

    /// A batch arrived while a fragmented packet was half assembled (or being discarded): a
    /// conforming sender starts batches only between packets, so the half packet is cut off
    /// and dropped. True if there was one.
    fn cut_partial(&mut self, peer: usize) -> bool {
        let p = &mut self.peers[peer];
        if p.partial_frags == 0 && !p.discarding {
            debug_assert!(p.partial.is_empty());
            return false;
        }
        self.stats.fragments_discarded += p.partial_frags as u64;
        self.stats.batch_mid_packet += 1;
        p.partial.clear();
        p.partial_frags = 0;
        p.discarding = false;
        true
    }

    /// A batch's credit (it is one data message of the sender's window) is owed once its
    /// last packet is taken: the last of the `delivered` packets just put in the inbox
    /// carries it; with none, it is owed now.
    fn credit_batch(&mut self, peer: usize, delivered: usize) {
        if delivered > 0 {
            let last = self.inbox.back_mut();
            debug_assert!(
                last.as_ref()
                    .is_some_and(|a| a.peer == peer && a.fragments == 0)
            );
            if let Some(a) = last {
                a.fragments = 1;
            }
            return;
        }
        let p = &mut self.peers[peer];
        p.owed += 1;
        if p.owed >= CREDIT_BATCH {
            self.mark_ready(peer);
        }
    }

    fn on_hello(&mut self, peer: usize, incarnation: u64) {
        let p = &mut self.peers[peer];
        let known = p.incarnation;
        // Incarnations grow across restarts: an older one is a late duplicate, not news.
        if incarnation == 0 || incarnation <= known {
            return;
        }
        p.incarnation = incarnation;
        if known == 0 {
            return;
        }
        if p.up {
            self.break_link(peer, LossReason::Restarted);
        } else {
            // Already broken (its fragments came back first): one loss, not two; only its
            // side starts over.
            Self::forget_rx(p);
        }
    }

    fn on_credit(&mut self, peer: usize, messages: u64, stream: Option<u64>) {
        let p = &mut self.peers[peer];
        if stream.is_some_and(|s| s != p.links_lost) {
            // Credit for messages of a stream that broke: the window restarted at 0.
            self.stats.stale_credit += 1;
            return;
        }
        debug_assert!(p.in_flight <= WINDOW_MAX, "in flight beyond any window");
        // Saturating: the count comes off the network, and a peer crediting more than we have
        // in flight is misbehaving, not a broken invariant here.
        let n = usize::try_from(messages).unwrap_or(usize::MAX);
        p.in_flight = p.in_flight.saturating_sub(n);
        debug_assert!(p.in_flight <= WINDOW_MAX);
        self.mark_ready(peer);
    }

    pub(super) fn on_returned(&mut self, now: Time, r: &Returned) {
        let Some(peer) = self.slot_at(r.dest.node) else {
            return;
        };
        if r.handler == H_DATA || r.handler == H_BATCH {
            self.stats.fragments_lost += 1;
            if r.nargs >= 2 && r.args[1] != self.peers[peer].links_lost {
                // Sent on a stream that already broke: nothing more to lose.
                return;
            }
            self.break_link(peer, LossReason::Returned(r.status));
        } else if r.handler == H_HELLO {
            // Unreachable: it never answered within the give-up time, or it restarted and
            // refused a hello meant for its old incarnation: ask again at once. Refused
            // (another tag, congestion): ask again after a pause, not once per round trip.
            self.peers[peer].hello_outstanding = false;
            let retry = (r.status != Status::Unreachable).then(|| now.plus(HELLO_RETRY));
            self.set_hello_timer(peer, retry);
            self.mark_ready(peer);
            self.events.push_back(LinkEvent::HelloReturned {
                peer: self.peers[peer].id,
                status: r.status,
            });
        }
        // Returned credit: the peer is gone; its data will come back too and break the link.
    }
}

impl Dispatch for State {
    fn handler_kind(&self, ep: EpId, h: HandlerId) -> HandlerKind {
        match (ep, h) {
            (LINK_EP, H_DATA | H_BATCH | H_HELLO | H_CREDIT) => HandlerKind::Request,
            (LINK_EP, H_HELLO_ACK) => HandlerKind::Reply,
            _ => HandlerKind::Unset,
        }
    }

    fn on_request(&mut self, req: Request<'_>) {
        let Some(peer) = self.peer_of(req.source().node) else {
            return;
        };
        let arg = |i: usize| req.args().get(i).copied().unwrap_or(0);
        match req.handler() {
            H_DATA => self.on_data(peer, arg(0) != 0, arg(1), req.data()),
            H_BATCH => self.on_batch(peer, arg(0), arg(1), req.data()),
            H_CREDIT => self.on_credit(peer, arg(0), req.args().get(1).copied()),
            H_HELLO => {
                self.on_hello(peer, arg(1));
                // Answered even while the link is down: the peer's hello completes its side.
                // The reply carries our incarnation, so a peer whose hello we answered knows
                // which process it talks to and sees a later restart of ours as one.
                let _ = req.reply_short(H_HELLO_ACK, &[self.incarnation]);
            }
            _ => {}
        }
    }

    fn on_reply(&mut self, rep: Reply<'_>) {
        let Some(peer) = self.peer_of(rep.source().node) else {
            return;
        };
        if rep.handler() == H_HELLO_ACK {
            if let Some(&incarnation) = rep.args().first() {
                // A peer that answered from another incarnation than it last said restarted.
                self.on_hello(peer, incarnation);
            }
            self.set_hello_timer(peer, None);
            let p = &mut self.peers[peer];
            p.hello_outstanding = false;
            if !p.up {
                p.up = true;
                self.events.push_back(LinkEvent::PeerUp(p.id));
                self.mark_ready(peer);
            }
        }
    }
}
