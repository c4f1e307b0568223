//! The simulator drives the real link core (`isotach_am_proto::link::Links`) over a faulty
//! network: order and exactly-once under loss, duplication and reordering; back-pressure and
//! credit exhaustion are not errors; a peer paused past the AM give-up time is declared lost
//! and rejoins; a restarted peer breaks the stream and comes back.

use isotach_am_proto::Status;
use isotach_am_proto::link::{LinkEvent, LossReason, QUEUE_MAX_DEFAULT, WINDOW_MIN};
use isotach_sim::linknet::{LinkFaults, LinkNet};

const SEEDS: u64 = 20;
/// One virtual second, µs.
const SECOND_US: u64 = 1_000_000;

fn lossy() -> LinkFaults {
    LinkFaults {
        loss: 0.05,
        duplicate: 0.02,
        delay_us: (10, 400),
    }
}

/// A packet of a length that exercises fragmentation (0 to ~5 fragments).
fn packet(i: usize) -> Vec<u8> {
    let len = (i * 613) % 5_200;
    (0..len).map(|j| (i + j) as u8).collect()
}

/// Two nodes on a lossy net, run until each has the other up.
fn pair_up(seed: u64) -> LinkNet {
    let mut net = LinkNet::full_mesh(2, lossy(), seed, QUEUE_MAX_DEFAULT);
    run(&mut net, 1_000, 60 * SECOND_US, |net| {
        net.links(0).is_up(0) && net.links(1).is_up(0)
    });
    net
}

/// Node 0 sends "after" to node 1; returns what node 1 received once it got something.
fn send_after(net: &mut LinkNet) -> Vec<(usize, Vec<u8>)> {
    net.links(0).send(0, b"after".to_vec()).unwrap();
    let mut got = Vec::new();
    run(net, 1_000, 120 * SECOND_US, |net| {
        drain(net, 1, &mut got);
        !got.is_empty()
    });
    got
}

/// Runs the net in steps until `done` holds; a liveness guard, not a timed assertion.
fn run(net: &mut LinkNet, step_us: u64, limit_us: u64, mut done: impl FnMut(&mut LinkNet) -> bool) {
    while !done(net) {
        let next = net.now_us() + step_us;
        assert!(
            next <= limit_us,
            "no progress by {limit_us} µs of virtual time"
        );
        net.run_until(next);
    }
}

fn drain(net: &mut LinkNet, node: usize, got: &mut Vec<(usize, Vec<u8>)>) {
    while let Some(p) = net.links(node).recv() {
        got.push(p);
    }
}

#[test]
fn packets_arrive_whole_in_order_exactly_once_under_faults() {
    // Datagrams lost and duplicated over all seeds (few datagrams carry many frames, so one
    // seed may see no duplicate).
    let (mut lost, mut duplicated) = (0, 0);
    for seed in 0..SEEDS {
        let mut net = LinkNet::full_mesh(3, lossy(), seed, QUEUE_MAX_DEFAULT);
        let sent: Vec<Vec<u8>> = (0..300).map(packet).collect();
        for p in &sent {
            net.links(0).send(0, p.clone()).unwrap();
            let to_1 = net.peer_id(2, 1);
            net.links(2)
                .send(to_1, p.iter().rev().copied().collect())
                .unwrap();
        }
        let mut got = Vec::new();
        run(&mut net, 1_000, 60 * SECOND_US, |net| {
            drain(net, 1, &mut got);
            got.len() == 2 * sent.len()
        });
        let from0: Vec<_> = got
            .iter()
            .filter(|(p, _)| *p == 0)
            .map(|(_, b)| b.clone())
            .collect();
        let from2: Vec<_> = got
            .iter()
            .filter(|(p, _)| *p == 1)
            .map(|(_, b)| b.clone())
            .collect();
        assert_eq!(from0, sent, "seed {seed}");
        let rev: Vec<Vec<u8>> = sent
            .iter()
            .map(|p| p.iter().rev().copied().collect())
            .collect();
        assert_eq!(from2, rev, "seed {seed}");
        let s = net.stats();
        (lost, duplicated) = (lost + s.lost, duplicated + s.duplicated);
        for n in 0..3 {
            assert_eq!(net.links(n).stats().links_lost, 0, "seed {seed} node {n}");
        }
    }
    assert!(
        lost > 0 && duplicated > 0,
        "the faults happened: {lost} lost, {duplicated} duplicated"
    );
}

#[test]
fn credit_exhaustion_is_back_pressure_not_loss() {
    for seed in 0..SEEDS {
        let w = WINDOW_MIN;
        let mut net = LinkNet::full_mesh(2, lossy(), seed, w);
        // Small packets share batches: a window of 65 data messages carries more than 65.
        let sent: Vec<Vec<u8>> = (0..10 * w).map(|i| vec![i as u8; 1 + i % 900]).collect();
        let mut queued = 0;
        // Node 1 reads nothing: node 0 fills its window, then its queue.
        run(&mut net, 1_000, 60 * SECOND_US, |net| {
            while queued < sent.len() && net.links(0).has_room(0) {
                net.links(0).send(0, sent[queued].clone()).unwrap();
                queued += 1;
            }
            net.links(0).in_flight(0) == w && !net.links(0).has_room(0)
        });
        net.run_until(net.now_us() + 5 * SECOND_US);
        assert_eq!(
            net.links(0).in_flight(0),
            w,
            "seed {seed}: the window holds"
        );
        assert!(!net.links(0).has_room(0), "seed {seed}: back-pressure");
        // Everything not queued arrived: the window's messages, whatever they carried.
        let received = net.links(1).stats().packets_received;
        assert_eq!(
            received,
            (queued - net.links(0).queued()) as u64,
            "seed {seed}"
        );
        assert!(received > w as u64, "seed {seed}: batches filled");
        // Node 1 reads: credit flows back, the rest follows in order, nothing lost.
        let mut got = Vec::new();
        run(&mut net, 1_000, 120 * SECOND_US, |net| {
            while queued < sent.len() && net.links(0).has_room(0) {
                net.links(0).send(0, sent[queued].clone()).unwrap();
                queued += 1;
            }
            drain(net, 1, &mut got);
            got.len() == sent.len()
        });
        let got: Vec<Vec<u8>> = got.into_iter().map(|(_, b)| b).collect();
        assert_eq!(got, sent, "seed {seed}");
        for n in 0..2 {
            let s = net.links(n).stats();
            assert_eq!(
                (s.links_lost, s.inbox_overflow),
                (0, 0),
                "seed {seed} node {n}"
            );
            assert!(
                net.take_events(n)
                    .iter()
                    .all(|e| matches!(e, LinkEvent::PeerUp(_)))
            );
        }
    }
}

#[test]
fn a_peer_paused_past_the_give_up_time_is_lost_and_rejoins() {
    for seed in 0..SEEDS {
        let mut net = pair_up(seed);
        net.take_events(0);
        net.pause(1);
        net.links(0).send(0, b"into the void".to_vec()).unwrap();
        // The AM layer gives up after 10 s: the fragment comes back and breaks the link.
        run(&mut net, 100_000, 60 * SECOND_US, |net| {
            !net.links(0).is_up(0)
        });
        let ev = net.take_events(0);
        assert!(
            ev.iter().any(|e| matches!(
                e,
                LinkEvent::PeerLost {
                    peer: 0,
                    reason: LossReason::Returned(Status::Unreachable),
                    ..
                }
            )),
            "seed {seed}: {ev:?}"
        );
        net.resume(1);
        run(&mut net, 1_000, 120 * SECOND_US, |net| {
            net.links(0).is_up(0)
        });
        assert!(
            net.take_events(0).contains(&LinkEvent::PeerUp(0)),
            "seed {seed}"
        );
        net.links(0).send(0, b"after".to_vec()).unwrap();
        let mut got = Vec::new();
        run(&mut net, 1_000, 180 * SECOND_US, |net| {
            drain(net, 1, &mut got);
            got.iter().any(|(_, b)| b == b"after")
        });
        assert_eq!(
            got.last().map(|(p, b)| (*p, b.as_slice())),
            Some((0, &b"after"[..]))
        );
    }
}

#[test]
fn a_restarted_peer_breaks_the_stream_and_comes_back() {
    for seed in 0..SEEDS {
        let mut net = LinkNet::full_mesh(2, lossy(), seed, QUEUE_MAX_DEFAULT);
        net.links(0).send(0, b"before".to_vec()).unwrap();
        let mut got = Vec::new();
        run(&mut net, 1_000, 60 * SECOND_US, |net| {
            drain(net, 1, &mut got);
            !got.is_empty() && net.links(0).is_up(0) && net.links(1).is_up(0)
        });
        net.take_events(0);
        net.restart(1);
        run(&mut net, 1_000, 60 * SECOND_US, |net| {
            net.links(0).is_up(0) && net.links(1).is_up(0)
        });
        net.run_until(net.now_us() + SECOND_US);
        let ev = net.take_events(0);
        let lost = ev.iter().position(|e| {
            matches!(
                e,
                LinkEvent::PeerLost {
                    peer: 0,
                    reason: LossReason::Restarted,
                    ..
                }
            )
        });
        let up = ev.iter().rposition(|e| *e == LinkEvent::PeerUp(0));
        assert!(
            matches!((lost, up), (Some(l), Some(u)) if l < u),
            "seed {seed}: {ev:?}"
        );
        assert_eq!(net.links(0).stats().links_lost, 1, "seed {seed}");
        assert_eq!(
            send_after(&mut net),
            vec![(0, b"after".to_vec())],
            "seed {seed}"
        );
    }
}

#[test]
fn a_peer_that_does_not_know_us_is_reported_and_asked_again() {
    // Node 0 lists node 1; node 1 lists nobody: node 1 acknowledges 0's hello (the AM layer
    // does) but never answers it.
    let mut net = LinkNet::with_peers(vec![vec![1], vec![]], lossy(), 7, QUEUE_MAX_DEFAULT);
    net.run_until(5 * SECOND_US);
    let s = net.links(0).stats();
    assert!(s.hellos_unanswered >= 3, "{s:?}");
    assert!(
        s.hellos > s.hellos_unanswered,
        "asked again each time: {s:?}"
    );
    assert!(
        s.hellos < 10,
        "about one hello a second, not a storm: {s:?}"
    );
    assert!(net.take_events(0).contains(&LinkEvent::HelloUnanswered(0)));
    assert!(net.links(1).stats().unknown_peer >= 1);
    assert!(!net.links(0).is_up(0));
}

#[test]
fn a_packet_cut_by_the_senders_broken_stream_does_not_corrupt_the_next() {
    for seed in 0..SEEDS {
        // Window and queue: 65 fragments. Two 64-fragment packets: the window holds the first
        // and one fragment of the second, which the receiver starts to assemble.
        let w = WINDOW_MIN;
        let mut net = LinkNet::full_mesh(2, lossy(), seed, w);
        let big = |b: u8| vec![b; isotach_am_proto::link::PACKET_MAX];
        net.links(0).send(0, big(1)).unwrap();
        run(&mut net, 1_000, 60 * SECOND_US, |net| {
            net.links(0).queued() == 0
        });
        net.links(0).send(0, big(2)).unwrap();
        run(&mut net, 1_000, 60 * SECOND_US, |net| {
            net.links(0).in_flight(0) == w
        });
        net.run_until(net.now_us() + SECOND_US);
        // A third big packet overflows the queue: the sender's stream breaks mid-packet.
        net.links(0).send(0, big(3)).unwrap();
        assert!(!net.links(0).is_up(0));
        net.links(0).send(0, b"after".to_vec()).unwrap();
        let mut got = Vec::new();
        run(&mut net, 1_000, 120 * SECOND_US, |net| {
            drain(net, 1, &mut got);
            got.iter().any(|(_, b)| b == b"after")
        });
        let got: Vec<Vec<u8>> = got.into_iter().map(|(_, b)| b).collect();
        assert_eq!(got, vec![big(1), b"after".to_vec()], "seed {seed}");
        let s = net.links(1).stats();
        assert!(s.fragments_discarded >= 1, "seed {seed}: {s:?}");
        assert_eq!(s.oversize, 0, "seed {seed}");
    }
}

/// A peer we only said hello to (its own hello to us not yet in) must still be known by its
/// incarnation, from the hello reply: when its next process says hello, that is a restart,
/// not a first hello, or our link stays up on the dead process's stream and what we send
/// next is lost (`sim sc` with restarts lost a read reply so).
#[test]
fn a_peer_known_only_from_its_hello_reply_is_seen_to_restart() {
    for seed in 0..SEEDS {
        let mut net = pair_up(seed);
        // Node 0 restarts and says hello; node 1 dies again as soon as node 0 is up, before
        // node 1's own hello to node 0's new process may have arrived.
        net.restart(0);
        run(&mut net, 10, 60 * SECOND_US, |net| net.links(0).is_up(0));
        net.restart(1);
        net.run_until(net.now_us() + 2 * SECOND_US);
        assert_eq!(
            send_after(&mut net),
            vec![(0, b"after".to_vec())],
            "seed {seed}"
        );
    }
}
