//! Unit tests of the link state machine that need no network (the simulator's
//! `sim/tests/links.rs` drives it over a faulty one).

use super::*;
use crate::core::SendReq;
use crate::types::Status;
use isotach_bufpool::{BUFFER_BYTES_MAX, BUFFER_BYTES_MIN};

/// Links of in-memory node `me` to the nodes `peers`.
fn links_of(me: u32, peers: &[u32]) -> Result<Links, AmError> {
    let addrs: Vec<NodeAddr> = peers.iter().copied().map(NodeAddr::Mem).collect();
    Links::new(
        Links::am_config(),
        NodeAddr::Mem(me),
        1,
        65_507,
        &addrs,
        DEFAULT_TAG,
    )
}

/// Node 0's links to nodes 1..=peers.
fn links(peers: usize) -> Links {
    let peers: Vec<u32> = (1..=peers as u32).collect();
    links_of(0, &peers).unwrap()
}

#[test]
fn fragment_counts() {
    assert_eq!(fragments(0), 1);
    assert_eq!(fragments(1), 1);
    assert_eq!(fragments(FRAGMENT_MAX), 1);
    assert_eq!(fragments(FRAGMENT_MAX + 1), 2);
    assert_eq!(fragments(PACKET_MAX), WINDOW_MIN - 1);
}

#[test]
fn a_full_queue_drops_and_breaks_the_link() {
    let mut l = links(1);
    l.set_queue_max(4);
    for _ in 0..4 {
        assert!(l.has_room(0));
        l.send(0, b"x".to_vec()).unwrap();
    }
    assert!(!l.has_room(0), "the peer is not up yet: four wait");
    l.send(0, b"one too many".to_vec()).unwrap();
    assert_eq!(
        l.poll_event(),
        Some(LinkEvent::PeerLost {
            peer: 0,
            reason: LossReason::SendOverflow,
            dropped: 4
        })
    );
    let s = l.stats();
    assert_eq!((s.links_lost, s.fragments_dropped), (1, 5));
    assert!(l.has_room(0));
}

#[test]
fn offer_sends_with_room_then_drops_redundant_and_hands_back_the_rest() {
    let mut l = links(1);
    l.set_queue_max(2);
    assert_eq!(
        l.offer(0, b"one".to_vec(), |_| true).unwrap(),
        Offered::Sent
    );
    assert_eq!(
        l.offer(0, b"two".to_vec(), |_| false).unwrap(),
        Offered::Sent
    );
    assert_eq!(
        l.offer(0, b"repeat".to_vec(), |p| p == b"repeat").unwrap(),
        Offered::Dropped
    );
    assert_eq!(
        l.offer(0, b"three".to_vec(), |_| false).unwrap(),
        Offered::Held(b"three".to_vec())
    );
    assert_eq!(l.queued(), 2);
    assert_eq!(l.stats().links_lost, 0, "back-pressure is not a loss");
}

#[test]
fn hellos_go_to_every_peer_first_and_only_once() {
    let mut l = links(3);
    let mut to = Vec::new();
    while let Some((addr, bytes)) = l.poll_transmit(Time(0)) {
        let f = crate::frame::decode(bytes).expect("one hello per datagram");
        assert_eq!(f.h.handler, H_HELLO.0);
        to.push(addr);
    }
    assert_eq!(to, [1, 2, 3].map(NodeAddr::Mem));
    assert_eq!(l.stats().hellos, 3);
    assert_eq!(
        l.poll_transmit(Time(1)),
        None,
        "one hello outstanding per peer"
    );
}

#[test]
fn oversized_packets_and_unknown_peers_are_refused() {
    let mut l = links(1);
    assert!(l.send(0, vec![0; PACKET_MAX + 1]).is_err());
    assert!(l.send(1, vec![0; 1]).is_err());
    assert!(links_of(0, &[1, 1]).is_err(), "a peer listed twice");
}

#[test]
fn the_deadline_follows_hello_timers_armed_and_disarmed_on_several_peers() {
    let mut l = links(5);
    // Nothing sent yet: the AM core has no timer, so the deadline is the hello timers'.
    assert_eq!(l.poll_timeout(), None, "no timer armed");
    let t = |ms: u64| Time(ms * 1_000_000);
    l.st.set_hello_timer(3, Some(t(30)));
    l.st.set_hello_timer(1, Some(t(10)));
    l.st.set_hello_timer(4, Some(t(20)));
    assert_eq!(l.poll_timeout(), Some(t(10)));
    // Re-arming replaces the peer's timer (a later one, then an earlier one).
    l.st.set_hello_timer(1, Some(t(40)));
    assert_eq!(l.poll_timeout(), Some(t(20)));
    l.st.set_hello_timer(3, Some(t(5)));
    assert_eq!(l.poll_timeout(), Some(t(5)));
    // Two peers due at the same time both count.
    l.st.set_hello_timer(0, Some(t(5)));
    l.st.set_hello_timer(3, None);
    assert_eq!(l.poll_timeout(), Some(t(5)), "peer 0 is still due then");
    l.st.set_hello_timer(0, None);
    assert_eq!(l.poll_timeout(), Some(t(20)));
    // Disarming a peer with no timer changes nothing.
    l.st.set_hello_timer(2, None);
    assert_eq!(l.poll_timeout(), Some(t(20)));
    // Firing takes exactly the due timers; the deadline moves to the next one.
    l.handle_timeout(t(25));
    assert_eq!(l.poll_timeout(), Some(t(40)));
    assert_eq!(l.st.peers[4].hello_timer, None);
    assert_eq!(l.st.peers[1].hello_timer, Some(t(40)));
    l.handle_timeout(t(40));
    assert_eq!(l.poll_timeout(), None, "every timer fired");
    assert!(l.st.hello_timers.is_empty());
    assert!(l.st.peers.iter().all(|p| p.hello_timer.is_none()));
}

#[test]
fn a_hello_arms_the_retry_timer_and_its_answer_disarms_it() {
    // Two link cores wired back to back; datagrams move by hand.
    let mut a = links(2);
    let mut b = links_of(1, &[0]).unwrap();
    let now = Time(0);
    let mut to_b = Vec::new();
    while let Some((to, bytes)) = a.poll_transmit(now) {
        if to == NodeAddr::Mem(1) {
            to_b.push(bytes.to_vec());
        }
    }
    // Both hellos went (peer 2 never answers): one retry timer per peer.
    assert_eq!(a.st.hello_timers.len(), 2);
    assert_eq!(a.st.hello_deadline(), Some(now.plus(HELLO_RETRY)));
    for d in to_b {
        b.handle_datagram(now, NodeAddr::Mem(0), &d);
    }
    let mut to_a = Vec::new();
    while let Some((to, bytes)) = b.poll_transmit(now) {
        assert_eq!(to, NodeAddr::Mem(0));
        to_a.push(bytes.to_vec());
    }
    for d in to_a {
        a.handle_datagram(now, NodeAddr::Mem(1), &d);
    }
    assert!(a.is_up(0));
    assert_eq!(a.st.peers[0].hello_timer, None, "the answer disarmed it");
    assert_eq!(a.st.hello_timers.len(), 1, "peer 2's timer is still armed");
    assert_eq!(a.st.hello_deadline(), Some(now.plus(HELLO_RETRY)));
}

// ---------------------------------------------------------------------------------------------
// Batching: two link cores back to back, every datagram moved by hand and logged.
// ---------------------------------------------------------------------------------------------

/// A request one side sent the other: its handler and arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Sent {
    handler: HandlerId,
    args: Vec<u64>,
    payload: Vec<u8>,
}

/// `a` (node 0) and `b` (node 1), each the other's only peer, and the requests each sent
/// (AM retransmissions cannot happen: nothing is lost and time stands still).
struct Pair {
    a: Links,
    b: Links,
    now: Time,
    a_sent: Vec<Sent>,
    b_sent: Vec<Sent>,
}

impl Pair {
    fn new() -> Self {
        let b = links_of(1, &[0]).unwrap();
        let mut pair = Self {
            a: links(1),
            b,
            now: Time(0),
            a_sent: Vec::new(),
            b_sent: Vec::new(),
        };
        pair.settle();
        assert!(pair.a.is_up(0) && pair.b.is_up(0));
        assert_eq!(pair.a.poll_event(), Some(LinkEvent::PeerUp(0)));
        assert_eq!(pair.b.poll_event(), Some(LinkEvent::PeerUp(0)));
        pair
    }

    /// Moves what `from` has to send to `to`; returns how many datagrams moved.
    fn step(from: &mut Links, to: &mut Links, now: Time, log: &mut Vec<Sent>) -> usize {
        let mut moved = Vec::new();
        while let Some((_, bytes)) = from.poll_transmit(now) {
            moved.push(bytes.to_vec());
        }
        let from_addr = from.core.local();
        for d in &moved {
            for f in crate::frame::frames(d) {
                let f = f.unwrap();
                if f.h.kind == crate::frame::Kind::Request {
                    log.push(Sent {
                        handler: HandlerId(f.h.handler),
                        args: f.args[..usize::from(f.h.nargs)].to_vec(),
                        payload: f.payload.to_vec(),
                    });
                }
            }
            to.handle_datagram(now, from_addr, d);
        }
        moved.len()
    }

    /// Moves datagrams both ways until neither side has anything to send.
    fn settle(&mut self) {
        for _ in 0..10_000 {
            let n = Self::step(&mut self.a, &mut self.b, self.now, &mut self.a_sent)
                + Self::step(&mut self.b, &mut self.a, self.now, &mut self.b_sent);
            self.check_window();
            if n == 0 {
                return;
            }
        }
        panic!("the links never went quiet");
    }

    /// Data messages a sent b, and the credit b returned: a never has more than its window
    /// of messages out, whatever they carry.
    fn check_window(&self) {
        let data = self.data_messages_a_sent();
        let credited: u64 = self
            .b_sent
            .iter()
            .filter(|s| s.handler == H_CREDIT)
            .map(|s| s.args[0])
            .sum();
        assert!(credited <= data as u64, "credit for messages never sent");
        assert!(
            data - credited as usize <= self.a.window(),
            "{data} data messages, {credited} credited: beyond the window"
        );
        assert_eq!(self.a.in_flight(0), data - credited as usize);
    }

    fn data_messages_a_sent(&self) -> usize {
        self.a_sent
            .iter()
            .filter(|s| s.handler == H_DATA || s.handler == H_BATCH)
            .count()
    }

    /// Everything b's driver can take now.
    fn drain_b(&mut self) -> Vec<Vec<u8>> {
        std::iter::from_fn(|| self.b.recv())
            .map(|(peer, p)| {
                assert_eq!(peer, 0);
                p
            })
            .collect()
    }

    /// b sends a raw batch message (a hostile or broken sender) on its current stream.
    fn b_sends_batch(&mut self, version: u64, payload: &[u8]) {
        let (idx, stream) = (
            self.b.st.peers[0].idx.unwrap(),
            self.b.st.peers[0].links_lost,
        );
        let args = [version, stream];
        self.b
            .core
            .send_request(
                self.now,
                SendReq::medium(LINK_EP, idx, H_BATCH, payload, &args),
            )
            .unwrap();
        self.settle();
    }
}

fn small(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|j| (i * 7 + j) as u8).collect()
}

/// A batch payload of `packets`, as a conforming sender writes it.
fn batch_of(packets: &[&[u8]]) -> Vec<u8> {
    let mut buf = Vec::new();
    for p in packets {
        assert!(batch::push(&mut buf, p));
    }
    buf
}

#[test]
fn many_small_packets_travel_in_few_batches_in_order_and_credit_comes_back() {
    let mut t = Pair::new();
    // 14-byte packets: 64 of them (16 bytes each with the prefix) fill a batch exactly.
    let packets: Vec<Vec<u8>> = (0..16 * BATCH_PACKETS_MAX).map(|i| small(i, 14)).collect();
    for p in &packets {
        t.a.send(0, p.clone()).unwrap();
    }
    t.settle();
    let batches: Vec<&Sent> = t.a_sent.iter().filter(|s| s.handler == H_BATCH).collect();
    assert_eq!(batches.len(), 16, "one full batch per 64 packets");
    assert_eq!(t.data_messages_a_sent(), 16, "and nothing else");
    for b in &batches {
        assert_eq!(b.args, [BATCH_VERSION, 0], "version and stream");
        assert_eq!(b.payload.len(), FRAGMENT_MAX);
    }
    let s = t.a.stats();
    assert_eq!((s.batches_sent, s.packets_in_batches), (16, 1024));
    assert_eq!(t.a.queued(), 0);
    // The window counts messages: 16 out, though b holds 1024 packets.
    assert_eq!(t.a.in_flight(0), 16);
    let r = t.b.stats();
    assert_eq!(
        (r.batches_received, r.packets_batched, r.packets_received),
        (16, 1024, 1024)
    );
    // b's driver takes half: credit is owed per batch finished, 8 (< CREDIT_BATCH) held.
    let mut got: Vec<Vec<u8>> = (0..512).map(|_| t.b.recv().unwrap().1).collect();
    t.settle();
    assert_eq!(t.b.st.peers[0].owed, 8);
    assert_eq!(t.a.in_flight(0), 16, "no credit yet");
    got.extend(t.drain_b());
    t.settle();
    assert_eq!(got, packets, "every packet, in order");
    assert_eq!(t.b.st.peers[0].owed, 0);
    assert_eq!(t.a.in_flight(0), 0, "16 batches taken, 16 credited");
    let credit: Vec<&Sent> = t.b_sent.iter().filter(|s| s.handler == H_CREDIT).collect();
    assert_eq!(credit.len(), 1);
    assert_eq!(credit[0].args, [16, 0]);
    assert_eq!(t.a.stats().links_lost + t.b.stats().links_lost, 0);
}

#[test]
fn a_single_packet_goes_as_a_data_fragment() {
    let mut t = Pair::new();
    t.a.send(0, b"alone".to_vec()).unwrap();
    t.settle();
    let data: Vec<&Sent> = t
        .a_sent
        .iter()
        .filter(|s| s.handler == H_DATA || s.handler == H_BATCH)
        .collect();
    assert_eq!(data.len(), 1);
    assert_eq!(
        (data[0].handler, data[0].payload.as_slice()),
        (H_DATA, &b"alone"[..])
    );
    assert_eq!(t.a.stats().batches_sent, 0);
    assert_eq!(t.drain_b(), [b"alone".to_vec()]);
}

#[test]
fn fragmented_and_small_packets_keep_their_order() {
    let mut t = Pair::new();
    let lens = [
        16,
        3000,
        16,
        52,
        0,
        BATCH_PACKET_MAX,
        BATCH_PACKET_MAX + 1,
        FRAGMENT_MAX,
        64,
        16,
        PACKET_MAX,
        0,
        16,
        1,
        FRAGMENT_MAX + 1,
        16,
    ];
    let packets: Vec<Vec<u8>> = (0..20)
        .flat_map(|round| {
            lens.iter()
                .enumerate()
                .map(move |(i, &l)| (round * 31 + i, l))
        })
        .map(|(i, l)| small(i, l))
        .collect();
    let mut got = Vec::new();
    for (i, p) in packets.iter().enumerate() {
        t.a.send(0, p.clone()).unwrap();
        // Push now and then, so batches start at different places.
        if i % 7 == 3 {
            t.settle();
            got.extend(t.drain_b());
        }
    }
    t.settle();
    got.extend(t.drain_b());
    t.settle();
    assert_eq!(got.len(), packets.len());
    assert!(got == packets, "every packet whole, in order");
    let s = t.a.stats();
    assert!(s.batches_sent > 0 && s.packets_in_batches < packets.len() as u64);
    // Every fragment and batch of the stream, in the order sent, rebuilds the packets.
    let mut rebuilt = Vec::new();
    let mut partial = Vec::new();
    for m in &t.a_sent {
        if m.handler == H_DATA {
            partial.extend_from_slice(&m.payload);
            if m.args[0] == 0 {
                rebuilt.push(std::mem::take(&mut partial));
            }
        } else if m.handler == H_BATCH {
            assert!(partial.is_empty(), "a batch starts between packets");
            rebuilt.extend(batch::packets(&m.payload).map(|p| p.unwrap().to_vec()));
        }
    }
    assert!(rebuilt == packets);
    assert_eq!(
        t.a.in_flight(0),
        t.b.st.peers[0].owed,
        "what is owed is in flight"
    );
    assert!(t.b.st.peers[0].owed < CREDIT_BATCH);
}

#[test]
fn the_window_counts_batches_and_holds_while_the_receiver_reads_nothing() {
    let mut t = Pair::new();
    t.a.set_queue_max(WINDOW_MIN);
    let w = t.a.window();
    assert_eq!(w, WINDOW_MIN);
    let mut sent = Vec::new();
    // b reads nothing: a fills its window with batches, then its queue.
    let mut i = 0;
    while t.a.in_flight(0) < w || t.a.has_room(0) {
        while t.a.has_room(0) {
            let p = small(i, 16 + i % 200);
            sent.push(p.clone());
            t.a.send(0, p).unwrap();
            i += 1;
        }
        t.settle();
        assert!(i < 100_000, "the window never filled");
    }
    assert_eq!(t.a.in_flight(0), w);
    assert_eq!(t.a.queued(), WINDOW_MIN, "the queue is full: back-pressure");
    let received = t.b.stats().packets_received as usize;
    assert_eq!(received, sent.len() - WINDOW_MIN);
    assert!(
        received > w,
        "a window of batches carries more than a window of packets"
    );
    // b reads: everything follows, in order, nothing lost.
    let mut got = Vec::new();
    for _ in 0..1_000 {
        got.extend(t.drain_b());
        t.settle();
        if got.len() == sent.len() {
            break;
        }
    }
    assert!(got == sent);
    let (sa, sb) = (t.a.stats(), t.b.stats());
    assert_eq!((sa.links_lost, sb.links_lost, sb.inbox_overflow), (0, 0, 0));
}

fn lost_by_bad_batch(l: &mut Links) -> bool {
    std::iter::from_fn(|| l.poll_event()).any(|e| {
        matches!(
            e,
            LinkEvent::PeerLost {
                peer: 0,
                reason: LossReason::BadBatch,
                ..
            }
        )
    })
}

#[test]
fn a_truncated_batch_delivers_what_precedes_the_bad_length_and_breaks_the_link() {
    let mut t = Pair::new();
    let mut payload = batch_of(&[b"one", b"two"]);
    payload.extend_from_slice(&[9, 0, b'x']); // announces 9 bytes, holds 1
    t.b_sends_batch(BATCH_VERSION, &payload);
    let s = t.a.stats();
    assert_eq!(
        (s.batches_received, s.packets_batched, s.batch_truncated),
        (1, 2, 1)
    );
    assert!(lost_by_bad_batch(&mut t.a));
    assert_eq!(t.a.recv(), Some((0, b"one".to_vec())));
    assert_eq!(t.a.st.peers[0].owed, 0, "credit comes with the last packet");
    assert_eq!(t.a.recv(), Some((0, b"two".to_vec())));
    assert_eq!(t.a.st.peers[0].owed, 1, "one message");
    // The link comes back (a says hello again) and b's stream goes on.
    t.settle();
    assert!(t.a.is_up(0));
    t.b.send(0, b"after".to_vec()).unwrap();
    t.settle();
    assert_eq!(t.a.recv(), Some((0, b"after".to_vec())));
}

#[test]
fn a_batch_of_an_unknown_version_is_refused_whole_and_breaks_the_link() {
    let mut t = Pair::new();
    t.b_sends_batch(BATCH_VERSION + 1, &batch_of(&[b"one", b"two"]));
    let s = t.a.stats();
    assert_eq!((s.batch_bad_version, s.batches_received), (1, 0));
    assert_eq!(s.packets_received, 0);
    assert!(t.a.recv().is_none());
    assert!(lost_by_bad_batch(&mut t.a));
    assert_eq!(
        t.a.st.peers[0].owed, 1,
        "its window slot is credited at once"
    );
}

#[test]
fn empty_overfull_and_mid_packet_batches_are_refused_without_panic() {
    let mut t = Pair::new();
    t.b_sends_batch(BATCH_VERSION, &[]);
    assert_eq!(t.a.stats().batch_truncated, 1);
    assert!(lost_by_bad_batch(&mut t.a));
    // One empty packet more than a batch may hold: the first BATCH_PACKETS_MAX come.
    t.b_sends_batch(BATCH_VERSION, &[0; 2 * (BATCH_PACKETS_MAX + 1)]);
    assert_eq!(t.a.stats().batch_truncated, 2);
    assert_eq!(t.a.stats().packets_batched, BATCH_PACKETS_MAX as u64);
    assert!(lost_by_bad_batch(&mut t.a));
    assert_eq!(std::iter::from_fn(|| t.a.recv()).count(), BATCH_PACKETS_MAX);
    // A first fragment (more follows), then a batch: the half packet is dropped.
    let (idx, stream) = (t.b.st.peers[0].idx.unwrap(), t.b.st.peers[0].links_lost);
    t.b.core
        .send_request(
            t.now,
            SendReq::medium(LINK_EP, idx, H_DATA, b"half", &[1, stream]),
        )
        .unwrap();
    t.b_sends_batch(BATCH_VERSION, &batch_of(&[b"x", b"y"]));
    let s = t.a.stats();
    assert_eq!((s.batch_mid_packet, s.fragments_discarded), (1, 1));
    assert!(lost_by_bad_batch(&mut t.a));
    let got: Vec<_> = std::iter::from_fn(|| t.a.recv()).map(|(_, p)| p).collect();
    assert_eq!(got, [b"x".to_vec(), b"y".to_vec()]);
    assert_eq!(t.a.stats().links_lost, 3);
}

#[test]
fn a_batch_returned_undelivered_breaks_the_link() {
    let mut t = Pair::new();
    t.a.send(0, b"one".to_vec()).unwrap();
    t.a.send(0, b"two".to_vec()).unwrap();
    // The batch leaves but b never hears of it; the AM layer gives up after 10 s.
    while t.a.poll_transmit(t.now).is_some() {}
    assert_eq!(t.a.stats().batches_sent, 1);
    t.a.handle_timeout(Time(t.now.0 + 11_000_000_000));
    let s = t.a.stats();
    assert_eq!((s.fragments_lost, s.links_lost), (1, 1));
    assert!(std::iter::from_fn(|| t.a.poll_event()).any(|e| matches!(
        e,
        LinkEvent::PeerLost {
            reason: LossReason::Returned(Status::Unreachable),
            ..
        }
    )));
}

#[test]
fn the_inbox_holds_a_window_of_full_batches_per_peer() {
    assert_eq!(inbox_max(0), INBOX_SLACK);
    assert_eq!(
        inbox_max(3),
        3 * WINDOW_MAX * BATCH_PACKETS_MAX + INBOX_SLACK
    );
    assert_eq!(inbox_max(usize::MAX), usize::MAX, "saturates");
    assert_eq!(links(2).st.inbox_max, inbox_max(2));
}

#[test]
fn recycled_buffers_carry_the_next_batched_packets() {
    let mut t = Pair::new();
    let first: Vec<Vec<u8>> = (0..8).map(|i| small(i, 20)).collect();
    for p in &first {
        t.a.send(0, p.clone()).unwrap();
    }
    t.settle();
    let got = t.drain_b();
    assert_eq!(got, first);
    let kept: Vec<*const u8> = got.iter().map(|b| b.as_ptr()).collect();
    for b in got {
        t.b.recycle(b);
    }
    assert_eq!(spares_kept(&t.b), 8);
    let second: Vec<Vec<u8>> = (100..108).map(|i| small(i, 20)).collect();
    for p in &second {
        t.a.send(0, p.clone()).unwrap();
    }
    t.settle();
    let got = t.drain_b();
    assert_eq!(got, second, "the new packets, whole and in order");
    assert_eq!(spares_kept(&t.b), 0, "every spare buffer used");
    assert!(got.iter().all(|b| kept.contains(&b.as_ptr())));
}

#[test]
fn a_packet_in_one_fragment_arrives_in_a_recycled_buffer_too() {
    let mut t = Pair::new();
    t.a.send(0, small(1, 20)).unwrap();
    t.settle();
    let got = t.drain_b();
    assert_eq!(got, vec![small(1, 20)]);
    let kept = got[0].as_ptr();
    t.b.recycle(got.into_iter().next().unwrap());
    assert_eq!(spares_kept(&t.b), 1);
    // A lone packet goes as one data fragment, not a batch.
    t.a.send(0, small(2, 20)).unwrap();
    t.settle();
    let got = t.drain_b();
    assert_eq!(got, vec![small(2, 20)]);
    assert_eq!(got[0].as_ptr(), kept, "the recycled buffer carries it");
    assert_eq!(spares_kept(&t.b), 0);
}

/// Spare buffers the links keep.
fn spares_kept(l: &Links) -> usize {
    spare::SPARE_PACKETS_MAX - l.st.spare.room()
}

#[test]
fn a_sent_packets_buffer_is_a_spare_a_builder_can_take() {
    let mut t = Pair::new();
    // In a buffer the spares keep.
    let mut p = Vec::with_capacity(BUFFER_BYTES_MIN);
    p.extend_from_slice(&small(7, 20));
    let at = p.as_ptr();
    t.a.send(0, p).unwrap();
    t.settle();
    assert_eq!(t.drain_b(), vec![small(7, 20)]);
    // Once framed, the packet's buffer is a spare of the sender's links, empty.
    let spare = t.a.take_spare().expect("the sent buffer");
    assert_eq!(spare.as_ptr(), at);
    assert!(spare.is_empty());
    assert!(t.a.take_spare().is_none(), "one buffer was sent");
}

#[test]
fn the_spare_pool_is_bounded_and_frees_small_and_large_buffers() {
    let mut l = links(1);
    l.recycle(Vec::with_capacity(BUFFER_BYTES_MAX + 1));
    assert_eq!(spares_kept(&l), 0, "a large buffer is freed");
    l.recycle(Vec::with_capacity(BUFFER_BYTES_MIN - 1));
    assert_eq!(spares_kept(&l), 0, "a small buffer is freed: it would grow");
    for _ in 0..spare::SPARE_PACKETS_MAX + 10 {
        l.recycle(Vec::with_capacity(BUFFER_BYTES_MIN));
    }
    assert_eq!(spares_kept(&l), spare::SPARE_PACKETS_MAX);
}

#[test]
fn a_sent_packet_s_buffer_becomes_a_spare_for_the_packets_that_arrive_next() {
    let mut t = Pair::new();
    let in_spare_size = |p: Vec<u8>| {
        let mut b = Vec::with_capacity(BUFFER_BYTES_MIN);
        b.extend_from_slice(&p);
        b
    };
    for i in 0..4 {
        t.a.send(0, in_spare_size(small(i, 20))).unwrap();
    }
    t.settle();
    assert_eq!(t.drain_b().len(), 4);
    assert_eq!(spares_kept(&t.a), 4, "sent in one batch");
    t.a.send(0, in_spare_size(small(9, 20))).unwrap();
    t.settle();
    assert_eq!(t.drain_b().len(), 1);
    assert_eq!(spares_kept(&t.a), 5, "sent alone in one fragment");
}
