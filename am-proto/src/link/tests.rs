//! Unit tests of the link state machine that need no network (the simulator's
//! `sim/tests/links.rs` drives it over a faulty one).

use super::*;

fn links(peers: usize) -> Links {
    let addrs: Vec<NodeAddr> = (1..=peers as u32).map(NodeAddr::Mem).collect();
    Links::new(
        Links::am_config(),
        NodeAddr::Mem(0),
        1,
        65_507,
        &addrs,
        DEFAULT_TAG,
    )
    .unwrap()
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
        let f = crate::frame::decode(bytes).unwrap();
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
    assert!(
        Links::new(
            Links::am_config(),
            NodeAddr::Mem(0),
            1,
            65_507,
            &[NodeAddr::Mem(1), NodeAddr::Mem(1)],
            DEFAULT_TAG
        )
        .is_err(),
        "a peer listed twice"
    );
}
