//! The real link core ([`isotach_am_proto::link::Links`]) over a faulty simulated datagram
//! network, in virtual time.
//!
//! Each node is one [`Links`] (what a daemon's port runs); datagrams between nodes are lost,
//! duplicated and delayed (so reordered) by the seeded [`LinkFaults`]. Nodes can be paused
//! (their datagrams wait and their timers do not fire) and restarted (a fresh [`Links`] with
//! a higher incarnation on the same address). Everything the AM layer and the links decide —
//! retransmission, hello, credit, back-pressure, loss detection, rejoin — runs exactly as on
//! the wire; a run is a function of its seed.

use crate::rng::SimRng;
use isotach_am_proto::link::{LinkEvent, Links};
use isotach_am_proto::{NodeAddr, Tag, Time};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

/// Largest datagram of the simulated network (a UDP datagram over loopback).
pub const DATAGRAM_MAX: usize = 65_507;
/// Nanoseconds per microsecond (the simulator's clock is in µs, the AM core's in ns).
const NS_PER_US: u64 = 1_000;

/// What the network does to each datagram.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkFaults {
    /// Probability a datagram is lost.
    pub loss: f64,
    /// Probability a datagram is delivered twice.
    pub duplicate: f64,
    /// One-way delay, drawn per datagram: `delay_us.0..=delay_us.1` (a spread reorders).
    pub delay_us: (u64, u64),
}

impl Default for LinkFaults {
    fn default() -> Self {
        Self {
            loss: 0.0,
            duplicate: 0.0,
            delay_us: (20, 20),
        }
    }
}

/// Counters of the network.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkNetStats {
    /// Datagrams handed to the network.
    pub sent: u64,
    /// Datagrams lost.
    pub lost: u64,
    /// Extra copies delivered.
    pub duplicated: u64,
    /// Datagrams delivered.
    pub delivered: u64,
}

/// A datagram on its way: delivery time (µs), sequence (ties in send order), from, to, bytes.
type InFlight = (u64, u64, usize, usize, Vec<u8>);

#[derive(Debug)]
struct Node {
    links: Links,
    addr: NodeAddr,
    peers: Vec<NodeAddr>,
    paused: bool,
    /// Datagrams that arrived while paused, in arrival order.
    parked: VecDeque<(NodeAddr, Vec<u8>)>,
    incarnation: u64,
    events: Vec<LinkEvent>,
}

/// Nodes running [`Links`] on a simulated network.
#[derive(Debug)]
pub struct LinkNet {
    nodes: Vec<Node>,
    flight: BinaryHeap<Reverse<InFlight>>,
    seq: u64,
    now_us: u64,
    rng: SimRng,
    faults: LinkFaults,
    tag: Tag,
    queue_max: usize,
    stats: LinkNetStats,
}

impl LinkNet {
    /// `n` nodes, fully meshed (node `i`'s peer `j` is node `j` with `i` skipped, as a
    /// daemon lists its peers), on a network with `faults`, seeded by `seed`.
    pub fn full_mesh(n: usize, faults: LinkFaults, seed: u64, queue_max: usize) -> Self {
        let peers = (0..n)
            .map(|i| (0..n).filter(|&j| j != i).collect())
            .collect();
        Self::with_peers(peers, faults, seed, queue_max)
    }

    /// Nodes whose configured peers are `peers[i]` (node ids, in peer-id order): a node may
    /// list a peer that does not list it back (a configuration mistake).
    pub fn with_peers(
        peers: Vec<Vec<usize>>,
        faults: LinkFaults,
        seed: u64,
        queue_max: usize,
    ) -> Self {
        let mut net = Self {
            nodes: Vec::with_capacity(peers.len()),
            flight: BinaryHeap::new(),
            seq: 0,
            now_us: 0,
            rng: SimRng::new(seed),
            faults,
            tag: isotach_am_proto::link::DEFAULT_TAG,
            queue_max,
            stats: LinkNetStats::default(),
        };
        for (i, list) in peers.into_iter().enumerate() {
            let addr = NodeAddr::Mem(i as u32);
            let peers: Vec<NodeAddr> = list.into_iter().map(|j| NodeAddr::Mem(j as u32)).collect();
            let links = net.fresh_links(addr, &peers, 1);
            net.nodes.push(Node {
                links,
                addr,
                peers,
                paused: false,
                parked: VecDeque::new(),
                incarnation: 1,
                events: Vec::new(),
            });
        }
        net
    }

    fn fresh_links(&self, addr: NodeAddr, peers: &[NodeAddr], incarnation: u64) -> Links {
        let mut links = Links::new(
            Links::am_config(),
            addr,
            incarnation,
            DATAGRAM_MAX,
            peers,
            self.tag,
        )
        .expect("link settings are valid");
        links.set_queue_max(self.queue_max);
        links
    }

    /// Peer id of node `to` at node `from`.
    pub fn peer_id(&self, from: usize, to: usize) -> usize {
        assert_ne!(from, to, "a node has no link to itself");
        if to < from { to } else { to - 1 }
    }

    /// Node `i`'s links.
    pub fn links(&mut self, i: usize) -> &mut Links {
        &mut self.nodes[i].links
    }

    /// The virtual time, µs.
    pub fn now_us(&self) -> u64 {
        self.now_us
    }

    /// Counters.
    pub fn stats(&self) -> LinkNetStats {
        self.stats
    }

    /// Takes node `i`'s events so far.
    pub fn take_events(&mut self, i: usize) -> Vec<LinkEvent> {
        std::mem::take(&mut self.nodes[i].events)
    }

    /// Stops node `i`: its arrivals wait and its timers do not fire.
    pub fn pause(&mut self, i: usize) {
        self.nodes[i].paused = true;
    }

    /// Resumes node `i`: what arrived meanwhile is handled now, in order.
    pub fn resume(&mut self, i: usize) {
        self.nodes[i].paused = false;
        let now = self.now();
        while let Some((from, bytes)) = self.nodes[i].parked.pop_front() {
            self.nodes[i].links.handle_datagram(now, from, &bytes);
        }
        self.flush(i);
    }

    /// Replaces node `i` by a fresh process on the same address (a higher incarnation):
    /// everything it had queued, received or half-assembled is gone.
    pub fn restart(&mut self, i: usize) {
        let node = &self.nodes[i];
        let incarnation = node.incarnation + 1;
        let links = self.fresh_links(node.addr, &node.peers.clone(), incarnation);
        let node = &mut self.nodes[i];
        node.links = links;
        node.incarnation = incarnation;
        node.paused = false;
        node.parked.clear();
        self.flush(i);
    }

    fn now(&self) -> Time {
        Time(self.now_us * NS_PER_US)
    }

    /// Sends what node `i`'s links have to send and records its events.
    pub fn flush(&mut self, i: usize) {
        let now = self.now();
        let from = i;
        while let Some((to, bytes)) = self.nodes[i].links.poll_transmit(now) {
            let NodeAddr::Mem(to) = to else {
                unreachable!("simulated nodes have memory addresses")
            };
            let bytes = bytes.to_vec();
            self.transmit(from, to as usize, bytes);
        }
        let node = &mut self.nodes[i];
        while let Some(ev) = node.links.poll_event() {
            node.events.push(ev);
        }
    }

    fn transmit(&mut self, from: usize, to: usize, bytes: Vec<u8>) {
        self.stats.sent += 1;
        if self.rng.chance(self.faults.loss) {
            self.stats.lost += 1;
            return;
        }
        let copies = if self.rng.chance(self.faults.duplicate) {
            self.stats.duplicated += 1;
            2
        } else {
            1
        };
        for _ in 0..copies {
            let (lo, hi) = self.faults.delay_us;
            let at = self.now_us + self.rng.range_inclusive(lo, hi);
            self.seq += 1;
            self.flight
                .push(Reverse((at, self.seq, from, to, bytes.clone())));
        }
    }

    /// Advances virtual time to `until_us`, delivering datagrams and firing timers in time
    /// order; nodes send what they have after each.
    pub fn run_until(&mut self, until_us: u64) {
        for i in 0..self.nodes.len() {
            self.flush(i);
        }
        loop {
            let next_dgram = self.flight.peek().map(|Reverse(d)| d.0);
            let next_timer = self
                .nodes
                .iter()
                .enumerate()
                .filter(|(_, n)| !n.paused)
                .filter_map(|(i, n)| n.links.poll_timeout().map(|t| (t.0.div_ceil(NS_PER_US), i)))
                .min();
            let dgram_first = match (next_dgram, next_timer) {
                (Some(d), Some((t, _))) => d <= t,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (None, None) => break,
            };
            let at = if dgram_first {
                next_dgram.expect("checked")
            } else {
                next_timer.expect("checked").0
            };
            if at > until_us {
                break;
            }
            self.now_us = self.now_us.max(at);
            let now = self.now();
            if dgram_first {
                let Reverse((_, _, from, to, bytes)) = self.flight.pop().expect("peeked");
                let from_addr = self.nodes[from].addr;
                self.stats.delivered += 1;
                let node = &mut self.nodes[to];
                if node.paused {
                    node.parked.push_back((from_addr, bytes));
                    continue;
                }
                node.links.handle_datagram(now, from_addr, &bytes);
                self.flush(to);
            } else {
                let i = next_timer.expect("checked").1;
                self.nodes[i].links.handle_timeout(now);
                self.flush(i);
            }
        }
        self.now_us = self.now_us.max(until_us);
    }
}
