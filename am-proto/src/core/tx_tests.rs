//! What leaves when, and together, between two cores wired by hand: held acknowledgements
//! ([`Config::ack_delay`]) — when an automatic acknowledgement waits, what takes it along,
//! when it leaves alone — and several frames for one peer in one datagram.

use std::time::Duration;

use super::*;
use crate::frame::Kind;
use crate::link::DEFAULT_TAG;
use crate::types::TransIdx;

const A: NodeAddr = NodeAddr::Mem(1);
const B: NodeAddr = NodeAddr::Mem(2);
const EP: EpId = EpId(0);
/// A request handler that never replies (so its request is acknowledged automatically).
const H_QUIET: HandlerId = HandlerId(1);
/// A request handler that replies.
const H_ECHO: HandlerId = HandlerId(2);
/// The reply handler.
const H_REPLY: HandlerId = HandlerId(3);
const DELAY: Duration = Duration::from_millis(3);

/// Counts what it runs; `H_ECHO` replies on `H_REPLY`.
#[derive(Default)]
struct Handlers {
    requests: usize,
    replies: usize,
}

impl Dispatch for Handlers {
    fn handler_kind(&self, _: EpId, h: HandlerId) -> HandlerKind {
        match h {
            H_QUIET | H_ECHO => HandlerKind::Request,
            H_REPLY => HandlerKind::Reply,
            _ => HandlerKind::Unset,
        }
    }
    fn on_request(&mut self, req: Request<'_>) {
        self.requests += 1;
        if req.handler() == H_ECHO {
            req.reply_short(H_REPLY, &[]).unwrap();
        }
    }
    fn on_reply(&mut self, _: Reply<'_>) {
        self.replies += 1;
    }
}

/// A node: its core, handlers and translation 0 naming the other node.
struct Node {
    core: Core,
    d: Handlers,
    to: TransIdx,
}

/// Nodes A and B, each mapped to the other, holding acknowledgements `ack_delay`.
fn pair(ack_delay: Duration) -> (Node, Node) {
    pair_with(ack_delay, 65_507)
}

/// [`pair`] over datagrams of at most `datagram` bytes.
fn pair_with(ack_delay: Duration, datagram: usize) -> (Node, Node) {
    (
        node_with(A, B, ack_delay, datagram),
        node_with(B, A, ack_delay, datagram),
    )
}

fn node_with(local: NodeAddr, other: NodeAddr, ack_delay: Duration, datagram: usize) -> Node {
    let cfg = Config {
        ack_delay,
        ..Config::default()
    };
    let mut core = Core::new(cfg, local, 1, datagram).unwrap();
    let ep = core.alloc_endpoint().unwrap();
    assert_eq!(ep, EP);
    core.set_tag(ep, DEFAULT_TAG).unwrap();
    let to = core
        .map_any(ep, EndpointName { node: other, ep }, DEFAULT_TAG)
        .unwrap();
    Node {
        core,
        d: Handlers::default(),
        to,
    }
}

impl Node {
    fn send(&mut self, now: Time, h: HandlerId) {
        self.core
            .send_request(now, SendReq::short(EP, self.to, h, &[]))
            .unwrap();
    }

    /// Sends one request on `h` to `to`, which takes it.
    fn request(&mut self, now: Time, h: HandlerId, to: &mut Self) {
        self.send(now, h);
        let datagrams = self.transmit();
        to.deliver(now, self.core.local(), &datagrams);
    }

    fn send_medium(&mut self, now: Time, payload: &[u8]) {
        let r = SendReq::medium(EP, self.to, H_QUIET, payload, &[]);
        self.core.send_request(now, r).unwrap();
    }

    /// The datagrams it would send now.
    fn transmit(&mut self) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        while let Some((_, bytes)) = self.core.poll_transmit() {
            out.push(bytes.to_vec());
        }
        out
    }

    fn deliver(&mut self, now: Time, from: NodeAddr, datagrams: &[Vec<u8>]) {
        for bytes in datagrams {
            self.core.handle_datagram(now, from, bytes, &mut self.d);
        }
    }
}

/// The kinds of the frames in each datagram.
fn kinds(datagrams: &[Vec<u8>]) -> Vec<Vec<Kind>> {
    datagrams
        .iter()
        .map(|d| frame::frames(d).map(|f| f.unwrap().h.kind).collect())
        .collect()
}

fn ms(n: u64) -> Time {
    Time(n * 1_000_000)
}

#[test]
fn a_lone_acknowledgement_waits_its_delay_then_leaves_alone() {
    let (mut a, mut b) = pair(DELAY);
    a.request(ms(0), H_QUIET, &mut b);
    assert_eq!(b.d.requests, 1);
    assert!(b.transmit().is_empty(), "the acknowledgement waits");
    assert!(
        b.core.timers_armed(),
        "a held acknowledgement needs the clock"
    );
    assert_eq!(b.core.poll_timeout(), Some(ms(3)));
    b.core.handle_timeout(Time(ms(3).0 - 1));
    assert!(b.transmit().is_empty(), "not before its delay");
    b.core.handle_timeout(ms(3));
    let ack = b.transmit();
    assert_eq!(kinds(&ack), [[Kind::Ack]]);
    assert_eq!(
        (b.core.stats().acks_held, b.core.stats().acks_held_expired),
        (1, 1)
    );
    assert_eq!(b.core.poll_timeout(), None);
    assert!(!b.core.timers_armed());
    a.deliver(ms(3), B, &ack);
    assert_eq!(
        a.core.outstanding(),
        0,
        "the acknowledgement freed the slot"
    );
}

#[test]
fn a_request_to_the_peer_takes_the_held_acknowledgement_along() {
    let (mut a, mut b) = pair(DELAY);
    a.request(ms(0), H_QUIET, &mut b);
    b.send(ms(1), H_QUIET);
    let out = b.transmit();
    assert_eq!(
        kinds(&out),
        [[Kind::Ack, Kind::Request]],
        "the ack leaves first, in the request's datagram"
    );
    assert_eq!(b.core.stats().frames_coalesced, 1);
    assert_eq!(
        b.core.poll_timeout(),
        Some(ms(1).plus(b.core.cfg.rto_initial))
    );
    assert_eq!(b.core.stats().acks_held_expired, 0);
    a.deliver(ms(1), B, &out);
    assert_eq!(a.core.outstanding(), 0);
    assert_eq!(a.d.requests, 1);
}

#[test]
fn a_second_acknowledgement_to_the_same_peer_sends_both() {
    let (mut a, mut b) = pair(DELAY);
    a.send(ms(0), H_QUIET);
    a.send(ms(0), H_QUIET);
    let reqs = a.transmit();
    assert_eq!(kinds(&reqs), [[Kind::Request, Kind::Request]]);
    b.deliver(ms(0), A, &reqs);
    let acks = b.transmit();
    assert_eq!(kinds(&acks), [[Kind::Ack, Kind::Ack]]);
    assert_eq!(b.core.poll_timeout(), None, "nothing is left held");
    a.deliver(ms(0), B, &acks);
    assert_eq!(a.core.outstanding(), 0);
}

#[test]
fn replies_are_never_held_and_take_a_held_acknowledgement_along() {
    let (mut a, mut b) = pair(DELAY);
    a.request(ms(0), H_QUIET, &mut b);
    a.request(ms(0), H_ECHO, &mut b);
    assert_eq!(kinds(&b.transmit()), [[Kind::Ack, Kind::Reply]]);
    assert_eq!(b.core.stats().acks_held, 1);
}

#[test]
fn without_a_delay_every_acknowledgement_leaves_at_once() {
    let (mut a, mut b) = pair(Duration::ZERO);
    a.request(ms(0), H_QUIET, &mut b);
    assert_eq!(kinds(&b.transmit()), [[Kind::Ack]]);
    assert_eq!(b.core.stats().acks_held, 0);
    assert!(!b.core.timers_armed());
}

#[test]
fn a_duplicate_request_sends_its_held_acknowledgement_once() {
    // The requester retransmits before the held acknowledgement leaves: the duplicate is
    // answered from the reply cache, and the held acknowledgement goes with that answer.
    let (mut a, mut b) = pair(DELAY);
    a.send(ms(0), H_QUIET);
    let req = a.transmit();
    b.deliver(ms(0), A, &req);
    b.deliver(ms(1), A, &req);
    assert_eq!(b.d.requests, 1, "the duplicate runs no handler");
    assert_eq!(kinds(&b.transmit()), [[Kind::Ack]]);
    assert_eq!(b.core.poll_timeout(), None);
}

#[test]
fn an_ack_delay_at_or_above_the_retransmission_floor_is_refused() {
    let cfg = Config {
        ack_delay: Config::default().rto_min,
        ..Config::default()
    };
    assert!(matches!(
        Core::new(cfg, A, 1, 65_507),
        Err(AmError::BadArg(_))
    ));
}

#[test]
fn frames_for_one_peer_share_datagrams_as_far_as_they_fit() {
    const DATAGRAM: usize = 1_472;
    let (mut a, mut b) = pair_with(Duration::ZERO, DATAGRAM);
    for _ in 0..6 {
        a.send(ms(0), H_QUIET);
    }
    let shorts = a.transmit();
    assert_eq!(kinds(&shorts), [vec![Kind::Request; 6]]);
    assert_eq!(a.core.stats().frames_coalesced, 5);
    b.deliver(ms(0), A, &shorts);
    assert_eq!(b.d.requests, 6);
    assert_eq!(kinds(&b.transmit()), [vec![Kind::Ack; 6]]);
    // A medium frame of 600 bytes is 676 bytes long: two fit 1 472, a third does not.
    let (mut a, mut b) = pair_with(Duration::ZERO, DATAGRAM);
    for _ in 0..5 {
        a.send_medium(ms(1), &[7; 600]);
    }
    let mediums = a.transmit();
    let sizes: Vec<usize> = mediums.iter().map(Vec::len).collect();
    assert_eq!(sizes, [1_352, 1_352, 676]);
    assert!(sizes.iter().all(|&n| n <= DATAGRAM));
    b.deliver(ms(1), A, &mediums);
    assert_eq!(b.d.requests, 5);
}

#[test]
fn frames_for_different_peers_never_share_a_datagram() {
    const C: NodeAddr = NodeAddr::Mem(3);
    let (mut a, _) = pair(Duration::ZERO);
    let to_c = a
        .core
        .map_any(EP, EndpointName { node: C, ep: EP }, DEFAULT_TAG)
        .unwrap();
    for _ in 0..2 {
        a.send(ms(0), H_QUIET);
        let r = SendReq::short(EP, to_c, H_QUIET, &[]);
        a.core.send_request(ms(0), r).unwrap();
    }
    let mut to = Vec::new();
    while let Some((addr, bytes)) = a.core.poll_transmit() {
        to.push((addr, frame::decode(bytes).is_ok()));
    }
    assert_eq!(to, [(B, true), (C, true), (B, true), (C, true)]);
}

#[test]
fn a_garbled_frame_drops_the_rest_of_its_datagram_and_retransmission_recovers_it() {
    let (mut a, mut b) = pair(Duration::ZERO);
    for _ in 0..3 {
        a.send(ms(0), H_QUIET);
    }
    let mut d = a.transmit().pop().unwrap();
    let (_, first) = frame::decode_first(&d).unwrap();
    d[first + 20] ^= 0xff; // the second frame's epoch: its CRC no longer matches
    b.deliver(ms(0), A, &[d]);
    assert_eq!(b.d.requests, 1, "the frame before the bad one is handled");
    assert_eq!(
        b.core.stats().bad_frames,
        1,
        "one bad datagram, counted once"
    );
    a.deliver(ms(0), B, &b.transmit());
    assert_eq!(a.core.outstanding(), 2);
    a.core.handle_timeout(ms(20));
    b.deliver(ms(20), A, &a.transmit());
    assert_eq!(b.d.requests, 3, "the two behind it came again");
    a.deliver(ms(20), B, &b.transmit());
    assert_eq!(a.core.outstanding(), 0);
}

#[test]
fn a_datagram_cut_inside_its_last_frame_keeps_the_frames_before_it() {
    let (mut a, mut b) = pair(Duration::ZERO);
    a.send(ms(0), H_QUIET);
    a.send(ms(0), H_QUIET);
    let mut d = a.transmit().pop().unwrap();
    d.truncate(d.len() - 1);
    b.deliver(ms(0), A, &[d]);
    assert_eq!((b.d.requests, b.core.stats().bad_frames), (1, 1));
}
