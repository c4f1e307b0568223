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
    let mut b = Links::new(
        Links::am_config(),
        NodeAddr::Mem(1),
        1,
        65_507,
        &[NodeAddr::Mem(0)],
        DEFAULT_TAG,
    )
    .unwrap();
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
