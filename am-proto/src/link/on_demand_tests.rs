//! On-demand peers: linked on first use, not at start (see [`PeerList`]).

use std::sync::Arc;

use super::*;
use crate::types::Status;

/// Address of host `h`'s node; the hub (every host's eager peer) is `HUB`.
fn host(h: u32) -> NodeAddr {
    NodeAddr::Mem(h)
}
const HUB: NodeAddr = NodeAddr::Mem(1_000);

/// A hub linked at once to `n` hosts, and the hosts, each linked at once to the hub and on
/// demand to each other through one shared directory.
fn cluster(n: u32) -> (Links, Vec<Links>) {
    let hosts: Vec<NodeAddr> = (0..n).map(host).collect();
    let hub = Links::new(Links::am_config(), HUB, 1, 65_507, &hosts, DEFAULT_TAG).unwrap();
    let dir = Directory::new(hosts).unwrap();
    let nodes = (0..n)
        .map(|h| {
            let list = PeerList::with_on_demand(&[HUB], Arc::clone(&dir), Some(h as usize));
            Links::with_peers(
                Links::am_config(),
                host(h),
                1,
                65_507,
                list.unwrap(),
                DEFAULT_TAG,
            )
            .unwrap()
        })
        .collect();
    (hub, nodes)
}

/// Every datagram sent, as (from, to, handler), moved until nothing is left to send.
fn settle(hub: &mut Links, nodes: &mut [Links]) -> Vec<(NodeAddr, NodeAddr, HandlerId)> {
    let mut log = Vec::new();
    for _ in 0..1_000 {
        let mut moved = Vec::new();
        let all = std::iter::once(&mut *hub).chain(nodes.iter_mut());
        for l in all {
            let from = l.core().local();
            while let Some((to, bytes)) = l.poll_transmit(Time(0)) {
                moved.push((from, to, bytes.to_vec()));
            }
        }
        if moved.is_empty() {
            return log;
        }
        for (from, to, bytes) in moved {
            for f in crate::frame::frames(&bytes) {
                let f = f.unwrap();
                if f.h.kind == crate::frame::Kind::Request {
                    log.push((from, to, HandlerId(f.h.handler)));
                }
            }
            let dest = match to {
                HUB => &mut *hub,
                NodeAddr::Mem(h) => &mut nodes[h as usize],
                NodeAddr::Ip(_) => unreachable!(),
            };
            dest.handle_datagram(Time(0), from, &bytes);
        }
    }
    panic!("the links never went quiet");
}

#[test]
fn at_start_only_eager_peers_get_a_hello_and_on_demand_peers_are_idle() {
    let (mut hub, mut nodes) = cluster(4);
    let log = settle(&mut hub, &mut nodes);
    let hellos: Vec<_> = log.iter().filter(|s| s.2 == H_HELLO).collect();
    assert_eq!(
        hellos.len(),
        8,
        "hub→host and host→hub, no host→host: {hellos:?}"
    );
    assert!(hellos.iter().all(|s| s.0 == HUB || s.1 == HUB));
    let n = &nodes[2];
    assert_eq!(n.peer_list().len(), 4, "the hub and three other hosts");
    assert_eq!(n.peers_in_use(), 1);
    assert!(n.all_up(), "every peer in use is up");
    let status = n.peer_status();
    assert_eq!(status.len(), 4);
    assert!(status[0].up && !status[0].idle);
    assert!(status[1..].iter().all(|s| s.idle && !s.up));
    let addrs: Vec<_> = n.peer_addrs().collect();
    assert_eq!(addrs, [HUB, host(0), host(1), host(3)]);
}

#[test]
fn a_packet_to_an_on_demand_peer_links_it_and_both_sides_then_use_the_link() {
    let (mut hub, mut nodes) = cluster(4);
    settle(&mut hub, &mut nodes);
    // Host 1's peer 3 is host 3 (peers: hub, host 0, host 2, host 3).
    let to_host3 = 3;
    assert!(nodes[1].has_room(to_host3) && !nodes[1].is_up(to_host3));
    nodes[1].send(to_host3, b"plain".to_vec()).unwrap();
    let log = settle(&mut hub, &mut nodes);
    let first: Vec<_> = log
        .iter()
        .filter(|s| s.0 == host(1) && s.1 == host(3))
        .map(|s| s.2)
        .collect();
    assert_eq!(first, [H_HELLO, H_DATA], "a hello, then the packet");
    assert!(nodes[1].is_up(to_host3));
    assert_eq!(nodes[1].poll_event(), Some(LinkEvent::PeerUp(0)), "the hub");
    assert_eq!(nodes[1].poll_event(), Some(LinkEvent::PeerUp(to_host3)));
    // Host 3 got it from its peer 1 (host 1) and has that peer in use, not up: it said no
    // hello yet. Answering says one first.
    assert_eq!(nodes[3].recv(), Some((2, b"plain".to_vec())));
    assert_eq!(nodes[3].peers_in_use(), 2);
    assert!(!nodes[3].is_up(2) && !nodes[3].peer_status()[2].idle);
    nodes[3].send(2, b"answer".to_vec()).unwrap();
    let log = settle(&mut hub, &mut nodes);
    let back: Vec<_> = log.iter().filter(|s| s.0 == host(3)).map(|s| s.2).collect();
    assert_eq!(back, [H_HELLO, H_DATA]);
    assert_eq!(nodes[1].recv(), Some((to_host3, b"answer".to_vec())));
    // Nobody else was linked.
    for (h, n) in nodes.iter().enumerate() {
        let want = if h == 1 || h == 3 { 2 } else { 1 };
        assert_eq!(n.peers_in_use(), want, "host {h}");
    }
}

#[test]
fn more_peers_than_a_default_table_holds_are_mapped_as_they_come_into_use() {
    // 300 hosts: more than a default table holds.
    let (mut hub, mut nodes) = cluster(300);
    settle(&mut hub, &mut nodes);
    for peer in 1..300 {
        nodes[0].send(peer, vec![peer as u8]).unwrap();
    }
    settle(&mut hub, &mut nodes);
    assert_eq!(nodes[0].peers_in_use(), 300);
    assert!(nodes[0].all_up());
    assert!(nodes[0].core().num_translations(LINK_EP).unwrap() > DEFAULT_TRANSLATIONS);
    for (h, n) in nodes.iter_mut().enumerate().skip(1) {
        assert_eq!(n.recv(), Some((1, vec![h as u8])), "host {h}");
    }
}

#[test]
fn no_such_peer_is_refused_and_unknown_addresses_are_counted() {
    let (mut hub, mut nodes) = cluster(3);
    settle(&mut hub, &mut nodes);
    assert!(nodes[0].send(3, b"x".to_vec()).is_err(), "peers 0..3 only");
    assert!(!nodes[0].has_room(3));
    // A stranger says hello: nothing comes into use.
    let mut stranger = Links::new(
        Links::am_config(),
        host(77),
        1,
        65_507,
        &[host(0)],
        DEFAULT_TAG,
    )
    .unwrap();
    while let Some((_, bytes)) = stranger.poll_transmit(Time(0)) {
        let bytes = bytes.to_vec();
        nodes[0].handle_datagram(Time(0), host(77), &bytes);
    }
    assert_eq!(nodes[0].stats().unknown_peer, 1);
    assert_eq!(nodes[0].peers_in_use(), 1);
}

/// Host 3 of a 4-host cluster as a fresh process (incarnation 2).
fn host3_restarted() -> Links {
    let dir = Directory::new((0..4).map(host).collect()).unwrap();
    let list = PeerList::with_on_demand(&[HUB], dir, Some(3)).unwrap();
    Links::with_peers(Links::am_config(), host(3), 2, 65_507, list, DEFAULT_TAG).unwrap()
}

/// Host 1 linked to host 3, then host 3 restarts (a fresh process, incarnation 2) and says
/// nothing to host 1.
fn restart_host3_after_a_link() -> (Links, Vec<Links>) {
    let (mut hub, mut nodes) = cluster(4);
    nodes[1].send(3, b"before".to_vec()).unwrap();
    settle(&mut hub, &mut nodes);
    assert_eq!(nodes[3].recv(), Some((2, b"before".to_vec())));
    nodes[3] = host3_restarted();
    settle(&mut hub, &mut nodes);
    while nodes[1].poll_event().is_some() {}
    assert!(nodes[1].is_up(3), "host 1 has not heard of the restart");
    (hub, nodes)
}

#[test]
fn without_a_relink_the_first_packet_to_a_silently_restarted_peer_is_lost() {
    let (mut hub, mut nodes) = restart_host3_after_a_link();
    nodes[1].send(3, b"after".to_vec()).unwrap();
    settle(&mut hub, &mut nodes);
    assert_eq!(
        nodes[3].recv(),
        None,
        "refused: it was meant for the old process"
    );
    assert!(matches!(
        nodes[1].poll_event(),
        Some(LinkEvent::PeerLost {
            peer: 3,
            reason: LossReason::Returned(Status::Unreachable),
            ..
        })
    ));
}

#[test]
fn a_relink_breaks_the_on_demand_links_so_the_next_packet_reaches_the_new_process() {
    let (mut hub, mut nodes) = restart_host3_after_a_link();
    assert_eq!(
        nodes[1].relink_on_demand(),
        1,
        "only the link in use to host 3"
    );
    assert_eq!(
        nodes[1].poll_event(),
        Some(LinkEvent::PeerLost {
            peer: 3,
            reason: LossReason::Relink,
            dropped: 0
        })
    );
    assert!(nodes[1].is_up(0), "the eager link stays");
    nodes[1].send(3, b"after".to_vec()).unwrap();
    settle(&mut hub, &mut nodes);
    assert_eq!(nodes[3].recv(), Some((2, b"after".to_vec())));
    assert!(nodes[1].is_up(3));
    assert_eq!(nodes[1].relink_on_demand(), 1);
    assert_eq!(
        nodes[0].relink_on_demand(),
        0,
        "host 0 uses no on-demand link"
    );
}

/// Host 3 restarts and says hello to every peer at once (`link_every_peer`): host 1, which
/// held a link to the old process, starts over before it sends, so nothing it sends after is
/// lost; the hosts that never linked to host 3 just answer.
#[test]
fn a_restarted_node_that_links_every_peer_makes_the_old_links_start_over() {
    let (mut hub, mut nodes) = cluster(4);
    nodes[1].send(3, b"before".to_vec()).unwrap();
    settle(&mut hub, &mut nodes);
    assert_eq!(nodes[3].recv(), Some((2, b"before".to_vec())));
    nodes[3] = host3_restarted();
    while nodes[1].poll_event().is_some() {}
    assert_eq!(nodes[3].link_every_peer().unwrap(), 3, "hosts 0, 1 and 2");
    assert_eq!(nodes[3].link_every_peer().unwrap(), 0, "all in use already");
    assert_eq!(nodes[3].peers_in_use(), 4);
    settle(&mut hub, &mut nodes);
    assert!(matches!(
        nodes[1].poll_event(),
        Some(LinkEvent::PeerLost {
            peer: 3,
            reason: LossReason::Restarted,
            ..
        })
    ));
    nodes[1].send(3, b"after".to_vec()).unwrap();
    settle(&mut hub, &mut nodes);
    assert_eq!(nodes[3].recv(), Some((2, b"after".to_vec())));
    assert!(
        (0..3).all(|peer| nodes[3].is_up(peer + 1)),
        "hub and three hosts up"
    );
}
