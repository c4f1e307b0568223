//! What arrives on a link: the link's AM handlers, as the core runs them on [`State`].
//!
//! Data fragments are reassembled by concatenation; a fragment of a newer stream (the sender's
//! link broke) drops the half-built packet of the old one, and an oversize packet is dropped
//! up to its last fragment. A hello or hello answer from a newer incarnation means the peer
//! restarted, which breaks the link. Credit opens the window again. Of the messages returned
//! to handler 0, a lost data fragment of the current stream breaks the link and a returned
//! hello is tried again. Messages from addresses that are not configured peers are counted
//! and ignored.

use super::{
    Arrived, H_CREDIT, H_DATA, H_HELLO, H_HELLO_ACK, HELLO_RETRY, LINK_EP, LinkEvent, LossReason,
    PACKET_MAX, State, WINDOW_MAX,
};
use crate::core::Dispatch;
use crate::msg::{Reply, Request, Returned};
use crate::types::{EpId, HandlerId, HandlerKind, Status, Time};

impl State {
    fn on_data(&mut self, peer: usize, more: bool, stream: u64, data: &[u8]) {
        let p = &mut self.peers[peer];
        if stream != p.rx_stream {
            // The sender's link broke and a new stream began: what was half-assembled of the
            // old one will never be completed, and the credit we owed it is void.
            self.stats.fragments_discarded += p.partial_frags as u64;
            p.partial.clear();
            p.partial_frags = 0;
            p.owed = 0;
            p.discarding = false;
            p.rx_stream = stream;
        }
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
        p.partial.extend_from_slice(data);
        p.partial_frags += 1;
        if more {
            return;
        }
        let bytes = std::mem::take(&mut p.partial);
        let fragments = std::mem::take(&mut p.partial_frags);
        if self.inbox.len() >= self.inbox_max {
            // More than the peers' windows allow: a misbehaving peer. Drop rather than grow.
            self.stats.inbox_overflow += 1;
            self.break_link(peer, LossReason::InboxOverflow);
            return;
        }
        self.inbox.push_back(Arrived {
            peer,
            bytes,
            fragments,
            stream,
        });
        self.stats.packets_received += 1;
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

    fn on_credit(&mut self, peer: usize, fragments: u64, stream: Option<u64>) {
        let p = &mut self.peers[peer];
        if stream.is_some_and(|s| s != p.links_lost) {
            // Credit for fragments of a stream that broke: the window restarted at 0.
            self.stats.stale_credit += 1;
            return;
        }
        debug_assert!(p.in_flight <= WINDOW_MAX, "in flight beyond any window");
        // Saturating: the count comes off the network, and a peer crediting more than we have
        // in flight is misbehaving, not a broken invariant here.
        let n = usize::try_from(fragments).unwrap_or(usize::MAX);
        p.in_flight = p.in_flight.saturating_sub(n);
        debug_assert!(p.in_flight <= WINDOW_MAX);
        self.mark_ready(peer);
    }

    pub(super) fn on_returned(&mut self, now: Time, r: &Returned) {
        let Some(&peer) = self.by_addr.get(&r.dest.node) else {
            return;
        };
        if r.handler == H_DATA {
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
                peer,
                status: r.status,
            });
        }
        // Returned credit: the peer is gone; its data will come back too and break the link.
    }
}

impl Dispatch for State {
    fn handler_kind(&self, ep: EpId, h: HandlerId) -> HandlerKind {
        match (ep, h) {
            (LINK_EP, H_DATA | H_HELLO | H_CREDIT) => HandlerKind::Request,
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
                self.events.push_back(LinkEvent::PeerUp(peer));
                self.mark_ready(peer);
            }
        }
    }
}
