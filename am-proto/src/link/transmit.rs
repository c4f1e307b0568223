//! Driving the links: datagrams and time go in, datagrams come out.
//!
//! A peer that may have something to send (it came up, credit came back, a packet was queued,
//! its hello timer fired) is marked ready, and the next [`Links::poll_transmit`] pushes its
//! hello, the credit it owes and its queued packets into the AM core, as far as the window
//! and the core's request slots allow. A peer the core had no slot for waits until a datagram
//! from it arrives (which may have freed one). Messages the core returns go to the handlers
//! after every step that may produce them.
//!
//! Queued packets leave in order, one data message at a time: when the head packet is whole
//! and it and at least one packet after it fit one medium payload, as many whole packets as
//! fit go as one batch ([`H_BATCH`]); otherwise the head's next fragment goes ([`H_DATA`]).
//! Either way one message takes one window slot.

use std::collections::VecDeque;

use super::batch::{self, BATCH_PACKETS_MIN, BATCH_VERSION};
use super::spare::Spare;
use super::{CREDIT_BATCH, FRAGMENT_MAX, H_BATCH, H_CREDIT, H_DATA, H_HELLO, HELLO_RETRY};
use super::{LINK_EP, LinkEvent, LinkStats, Links, Peer, State, WINDOW_MAX, fragments};
use crate::core::{Core, SendReq};
use crate::error::AmError;
use crate::types::{NodeAddr, Time, TransIdx};

impl Links {
    /// Process one received datagram (running the link handlers).
    pub fn handle_datagram(&mut self, now: Time, from: NodeAddr, bytes: &[u8]) {
        self.core.handle_datagram(now, from, bytes, &mut self.st);
        if let Err(e) = self.map_new_peers() {
            // Cannot happen: the list fits the largest translation table.
            debug_assert!(false, "mapping a peer in use failed: {e}");
        }
        if let Some(peer) = self.st.slot_at(from)
            && self.st.peers[peer].am_blocked
        {
            // It may have freed an AM slot towards the peer.
            self.st.peers[peer].am_blocked = false;
            self.st.mark_ready(peer);
        }
        self.absorb_returned(now);
    }

    /// Fire due AM timers (retransmission, give-up) and due hello timers.
    pub fn handle_timeout(&mut self, now: Time) {
        self.core.handle_timeout(now);
        self.absorb_returned(now);
        self.fire_hello_timers(now);
    }

    /// Hellos delivered but unanswered go again; refused ones may go again. Visits only the
    /// due timers, earliest first.
    fn fire_hello_timers(&mut self, now: Time) {
        while let Some(&(at, peer)) = self.st.hello_timers.first() {
            if at > now {
                break;
            }
            self.st.set_hello_timer(peer, None);
            let p = &mut self.st.peers[peer];
            if p.hello_outstanding && !p.up {
                p.hello_outstanding = false;
                self.st.stats.hellos_unanswered += 1;
                self.st.events.push_back(LinkEvent::HelloUnanswered(p.id));
            }
            self.st.mark_ready(peer);
        }
    }

    /// The next datagram to send and where: hellos, credit and fragments leave here as AM
    /// credit and the window allow.
    pub fn poll_transmit(&mut self, now: Time) -> Option<(NodeAddr, &[u8])> {
        if !self.st.ready.is_empty() {
            self.push(now);
        }
        self.core.poll_transmit()
    }

    /// When [`Links::handle_timeout`] must run next.
    pub fn poll_timeout(&self) -> Option<Time> {
        [self.core.poll_timeout(), self.st.hello_deadline()]
            .into_iter()
            .flatten()
            .min()
    }

    fn absorb_returned(&mut self, now: Time) {
        while let Some(r) = self.core.poll_returned() {
            self.st.on_returned(now, &r);
        }
    }

    /// Sends hellos, credit and queued fragments of every ready peer.
    fn push(&mut self, now: Time) {
        let inc = self.core.incarnation();
        let window = self.window();
        let mut ready = std::mem::take(&mut self.st.ready);
        for &peer in &ready {
            self.st.peers[peer].ready = false;
            if let Err(AmError::WouldBlock) = self.push_peer(now, peer, inc, window) {
                self.st.peers[peer].am_blocked = true;
            }
        }
        ready.clear();
        // Peers made ready while pushing (none today) keep their place.
        ready.append(&mut self.st.ready);
        self.st.ready = ready;
        self.absorb_returned(now);
    }

    fn push_peer(
        &mut self,
        now: Time,
        peer: usize,
        inc: u64,
        window: usize,
    ) -> Result<(), AmError> {
        let p = &mut self.st.peers[peer];
        let Some(idx) = p.idx else {
            // Mapped by every call that puts a peer in use: cannot happen.
            debug_assert!(false, "peer slot {peer} is in use but not mapped");
            return Ok(());
        };
        if !p.up {
            if !p.hello_outstanding && p.hello_timer.is_none_or(|t| t <= now) {
                self.core.send_request(
                    now,
                    SendReq::short(LINK_EP, idx, H_HELLO, &[self.tag.0, inc]),
                )?;
                p.hello_outstanding = true;
                self.st.stats.hellos += 1;
                self.st.set_hello_timer(peer, Some(now.plus(HELLO_RETRY)));
            }
            return Ok(());
        }
        debug_assert!(p.in_flight <= WINDOW_MAX, "in flight beyond any window");
        debug_assert!(
            p.queued >= p.out.len(),
            "every queued packet has a fragment"
        );
        if p.owed >= CREDIT_BATCH {
            let credit = [p.owed as u64, p.rx_stream];
            self.core
                .send_request(now, SendReq::short(LINK_EP, idx, H_CREDIT, &credit))?;
            p.owed = 0;
        }
        let State {
            peers,
            batch: buf,
            stats,
            spare,
            ..
        } = &mut self.st;
        let p = &mut peers[peer];
        while p.queued > 0 && p.in_flight < window {
            let n = batch_len(&p.out, p.head_sent);
            if n >= BATCH_PACKETS_MIN {
                send_batch(&mut self.core, now, (p, idx), (buf, spare), n, stats)?;
            } else {
                send_fragment(&mut self.core, now, (p, idx), spare)?;
            }
            p.in_flight += 1;
        }
        debug_assert!(
            p.queued == 0 || p.in_flight >= window,
            "stopped with credit left"
        );
        debug_assert!(p.in_flight <= window, "window overrun");
        debug_assert_eq!(
            p.queued == 0,
            p.out.is_empty(),
            "queued fragments vs packets"
        );
        Ok(())
    }
}

/// How many whole packets at the head of `out` fit one batch: 0 while the head is partly
/// sent (a batch never starts inside a packet).
fn batch_len(out: &VecDeque<Vec<u8>>, head_sent: usize) -> usize {
    if head_sent > 0 {
        return 0;
    }
    let (mut used, mut n) = (0, 0);
    for packet in out {
        if !batch::fits(used, n, packet.len()) {
            break;
        }
        used += batch::entry_len(packet.len());
        n += 1;
    }
    debug_assert!(used <= FRAGMENT_MAX && n <= batch::BATCH_PACKETS_MAX);
    n
}

/// Sends the `n` packets at the head of `p`'s queue as one batch, built in `buf`, and takes
/// them off the queue once the core accepted it; their buffers become spares for the packets
/// that arrive next.
fn send_batch(
    core: &mut Core,
    now: Time,
    (p, idx): (&mut Peer, TransIdx),
    (buf, spare): (&mut Vec<u8>, &mut Spare),
    n: usize,
    stats: &mut LinkStats,
) -> Result<(), AmError> {
    debug_assert!(p.head_sent == 0, "a batch starts between packets");
    debug_assert!((BATCH_PACKETS_MIN..=batch::BATCH_PACKETS_MAX).contains(&n));
    buf.clear();
    for packet in p.out.iter().take(n) {
        let pushed = batch::push(buf, packet);
        debug_assert!(pushed, "batch_len said it fits");
        debug_assert_eq!(
            fragments(packet.len()),
            1,
            "a batched packet is one fragment"
        );
    }
    let args = [BATCH_VERSION, p.links_lost];
    core.send_request(now, SendReq::medium(LINK_EP, idx, H_BATCH, buf, &args))?;
    for packet in p.out.drain(..n) {
        drop(spare.give(packet)); // freed when the spares do not keep it
    }
    p.queued -= n;
    stats.batches_sent += 1;
    stats.packets_in_batches += n as u64;
    Ok(())
}

/// Sends the next fragment of the head packet of `p`'s queue, and takes the packet off the
/// queue once its last fragment went.
fn send_fragment(
    core: &mut Core,
    now: Time,
    (p, idx): (&mut Peer, TransIdx),
    spare: &mut Spare,
) -> Result<(), AmError> {
    let head = &p.out[0];
    let end = (p.head_sent + FRAGMENT_MAX).min(head.len());
    let more = end < head.len();
    let args = [u64::from(more), p.links_lost];
    let payload = &head[p.head_sent..end];
    core.send_request(now, SendReq::medium(LINK_EP, idx, H_DATA, payload, &args))?;
    if more {
        p.head_sent = end;
    } else if let Some(sent) = p.out.pop_front() {
        drop(spare.give(sent)); // freed when the spares do not keep it
        p.head_sent = 0;
    }
    p.queued -= 1;
    Ok(())
}
