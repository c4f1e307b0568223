//! In-memory backend: a deterministic network on a virtual clock, with a seeded fault model
//! (loss, duplication, reordering, delay), node crashes, restarts and partitions.
//!
//! All nodes of a [`MemNet`] share one virtual clock. Time moves only when a driver moves it
//! ([`MemNet::advance_to`], or a transport's `wait`/`sleep_until`), so a run is a pure
//! function of its seed. Use it from one thread (see [`crate::sim::Sim`]).

use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use super::fault;
use crate::AmError;
use crate::rng::Rng;
use crate::transport::Transport;
use crate::{NodeAddr, Time};

/// Most datagrams waiting in one node's inbox; more are dropped, like a full NIC ring.
pub const MEM_INBOX: usize = 8192;
/// Largest datagram on the in-memory network.
pub const MEM_MAX_DATAGRAM: usize = 1500;

/// What the network does to each datagram. Loss and duplication are drawn as every
/// backend's are ([`fault::copies`]); delay and reordering are this network's own.
#[derive(Clone, Debug)]
pub struct FaultModel {
    /// Probability a datagram is lost.
    pub loss: f64,
    /// Probability a datagram is delivered twice.
    pub dup: f64,
    /// Probability a datagram gets `reorder_extra` more delay (so later ones overtake it).
    pub reorder: f64,
    /// Smallest one-way delay.
    pub delay_min: Duration,
    /// Largest one-way delay (uniform between the two).
    pub delay_max: Duration,
    /// Extra delay of a reordered datagram.
    pub reorder_extra: Duration,
}

impl FaultModel {
    /// A perfect network with a fixed 10 µs delay.
    pub fn none() -> Self {
        Self {
            loss: 0.0,
            dup: 0.0,
            reorder: 0.0,
            delay_min: Duration::from_micros(10),
            delay_max: Duration::from_micros(10),
            reorder_extra: Duration::ZERO,
        }
    }
    /// Loss, duplication and reordering each with probability `p`, delay 10–100 µs.
    pub fn lossy(p: f64) -> Self {
        Self {
            loss: p,
            dup: p,
            reorder: p,
            delay_min: Duration::from_micros(10),
            delay_max: Duration::from_micros(100),
            reorder_extra: Duration::from_micros(300),
        }
    }
}

#[derive(Debug)]
struct Flight {
    at: Time,
    seq: u64,
    from: u32,
    to: u32,
    bytes: Vec<u8>,
}

impl PartialEq for Flight {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Flight {}
impl PartialOrd for Flight {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Flight {
    // Reversed: BinaryHeap is a max-heap and we want the earliest first.
    fn cmp(&self, o: &Self) -> Ordering {
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}

#[derive(Debug)]
struct Node {
    inbox: VecDeque<(u32, Vec<u8>)>,
    up: bool,
    inc: u64,
}

#[derive(Debug)]
struct Net {
    now: Time,
    rng: Rng,
    faults: FaultModel,
    seq: u64,
    flight: BinaryHeap<Flight>,
    nodes: Vec<Node>,
    cut: Vec<(u32, u32)>,
    slow: Vec<(u32, u32, Duration)>,
    dropped: u64,
    delivered: u64,
}

impl Net {
    fn deliver_due(&mut self) {
        while self.flight.peek().is_some_and(|f| f.at <= self.now) {
            let Some(f) = self.flight.pop() else { break };
            let node = &mut self.nodes[f.to as usize];
            if !node.up || node.inbox.len() >= MEM_INBOX {
                self.dropped += 1;
                continue;
            }
            self.delivered += 1;
            node.inbox.push_back((f.from, f.bytes));
        }
    }

    fn submit(&mut self, from: u32, to: u32, bytes: &[u8]) {
        let reachable = (to as usize) < self.nodes.len()
            && self.nodes[from as usize].up
            && !self.cut.contains(&(from, to))
            && !self.cut.contains(&(to, from));
        let copies = if reachable {
            fault::copies(&mut self.rng, self.faults.loss, self.faults.dup)
        } else {
            0
        };
        if copies == 0 {
            self.dropped += 1;
            return;
        }
        for _ in 0..copies {
            let lo = self.faults.delay_min.as_nanos() as u64;
            let hi = self.faults.delay_max.as_nanos() as u64;
            let mut d = Duration::from_nanos(self.rng.range(lo, hi));
            if self.rng.chance(self.faults.reorder) {
                d += self.faults.reorder_extra;
            }
            if let Some(&(_, _, extra)) = self.slow.iter().find(|&&(a, b, _)| (a, b) == (from, to))
            {
                d += extra;
            }
            self.seq += 1;
            self.flight.push(Flight {
                at: self.now.plus(d),
                seq: self.seq,
                from,
                to,
                bytes: bytes.to_vec(),
            });
        }
    }

    fn advance_to(&mut self, t: Time) {
        if t > self.now {
            self.now = t;
        }
        self.deliver_due();
    }
}

/// A simulated network. Cloning gives another handle to the same network.
#[derive(Clone, Debug)]
pub struct MemNet {
    inner: Arc<Mutex<Net>>,
}

impl MemNet {
    /// A network whose every random choice comes from `seed`.
    pub fn new(seed: u64, faults: FaultModel) -> Self {
        let net = Net {
            now: Time(0),
            rng: Rng::new(seed),
            faults,
            seq: 0,
            flight: BinaryHeap::new(),
            nodes: Vec::new(),
            cut: Vec::new(),
            slow: Vec::new(),
            dropped: 0,
            delivered: 0,
        };
        Self {
            inner: Arc::new(Mutex::new(net)),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Net> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Attach a new node.
    pub fn node(&self) -> MemTransport {
        let mut n = self.lock();
        n.nodes.push(Node {
            inbox: VecDeque::new(),
            up: true,
            inc: 1,
        });
        MemTransport {
            net: self.clone(),
            id: (n.nodes.len() - 1) as u32,
            inc: 1,
        }
    }

    /// Crash node `id`: it stops sending and receiving, its inbox is lost.
    pub fn crash(&self, id: u32) {
        let mut n = self.lock();
        if let Some(node) = n.nodes.get_mut(id as usize) {
            node.up = false;
            node.inbox.clear();
        }
    }

    /// Restart node `id` at the same address with a higher incarnation: a fresh transport
    /// for a fresh bundle.
    pub fn restart(&self, id: u32) -> MemTransport {
        let mut n = self.lock();
        let node = &mut n.nodes[id as usize];
        node.up = true;
        node.inbox.clear();
        node.inc += 1;
        let inc = node.inc;
        MemTransport {
            net: self.clone(),
            id,
            inc,
        }
    }

    /// Cut (or heal) the link between two nodes.
    pub fn set_link(&self, a: u32, b: u32, up: bool) {
        let mut n = self.lock();
        n.cut.retain(|&(x, y)| (x, y) != (a, b) && (x, y) != (b, a));
        if !up {
            n.cut.push((a, b));
        }
    }

    /// Add `extra` one-way delay to datagrams from `from` to `to` (zero removes it).
    pub fn set_link_delay(&self, from: u32, to: u32, extra: Duration) {
        let mut n = self.lock();
        n.slow.retain(|&(a, b, _)| (a, b) != (from, to));
        if !extra.is_zero() {
            n.slow.push((from, to, extra));
        }
    }

    /// Replace the fault model.
    pub fn set_faults(&self, f: FaultModel) {
        self.lock().faults = f;
    }

    /// The virtual time.
    pub fn now(&self) -> Time {
        self.lock().now
    }

    /// Move the virtual clock forward to `t` and deliver what is due.
    pub fn advance_to(&self, t: Time) {
        self.lock().advance_to(t);
    }

    /// When the next datagram in flight lands.
    pub fn next_delivery(&self) -> Option<Time> {
        self.lock().flight.peek().map(|f| f.at)
    }

    /// Datagrams in flight.
    pub fn in_flight(&self) -> usize {
        self.lock().flight.len()
    }

    /// (delivered, dropped) datagram counts.
    pub fn counts(&self) -> (u64, u64) {
        let n = self.lock();
        (n.delivered, n.dropped)
    }
}

/// One node's attachment to a [`MemNet`].
#[derive(Debug)]
pub struct MemTransport {
    net: MemNet,
    id: u32,
    inc: u64,
}

impl MemTransport {
    /// This node's index on the network.
    pub fn id(&self) -> u32 {
        self.id
    }
    /// The network.
    pub fn net(&self) -> &MemNet {
        &self.net
    }

    fn wait_virtual(&mut self, deadline: Option<Time>) -> bool {
        let mut n = self.net.lock();
        loop {
            n.deliver_due();
            if !n.nodes[self.id as usize].inbox.is_empty() {
                return true;
            }
            let next = n.flight.peek().map(|f| f.at);
            let t = match (next, deadline) {
                (Some(a), Some(b)) => a.min(b),
                (Some(a), None) => a,
                (None, Some(b)) => b,
                (None, None) => return false,
            };
            let reached = deadline.is_some_and(|d| t >= d);
            n.advance_to(t);
            if reached {
                return !n.nodes[self.id as usize].inbox.is_empty();
            }
        }
    }
}

impl Transport for MemTransport {
    fn local_addr(&self) -> NodeAddr {
        NodeAddr::Mem(self.id)
    }
    fn max_datagram(&self) -> usize {
        MEM_MAX_DATAGRAM
    }
    fn incarnation(&self) -> u64 {
        self.inc
    }
    fn now(&self) -> Time {
        self.net.now()
    }
    fn send(&mut self, to: NodeAddr, datagram: &[u8]) -> Result<(), AmError> {
        if let NodeAddr::Mem(to) = to {
            let mut n = self.net.lock();
            if n.nodes[self.id as usize].inc == self.inc {
                n.submit(self.id, to, datagram);
            }
        }
        Ok(())
    }
    fn recv(
        &mut self,
        max: usize,
        sink: &mut dyn FnMut(NodeAddr, &[u8]),
    ) -> Result<usize, AmError> {
        let batch: Vec<(u32, Vec<u8>)> = {
            let mut n = self.net.lock();
            n.deliver_due();
            let node = &mut n.nodes[self.id as usize];
            if !node.up || node.inc != self.inc {
                return Ok(0);
            }
            let k = node.inbox.len().min(max);
            node.inbox.drain(..k).collect()
        };
        for (from, bytes) in &batch {
            sink(NodeAddr::Mem(*from), bytes);
        }
        Ok(batch.len())
    }
    fn has_pending(&mut self) -> bool {
        let mut n = self.net.lock();
        n.deliver_due();
        !n.nodes[self.id as usize].inbox.is_empty()
    }
    fn wait(&mut self, deadline: Option<Time>) -> Result<bool, AmError> {
        Ok(self.wait_virtual(deadline))
    }
    fn sleep_until(&mut self, t: Time) {
        self.net.advance_to(t);
    }
    async fn wait_async(&mut self, deadline: Option<Time>) -> Result<bool, AmError> {
        Ok(self.wait_virtual(deadline))
    }
}
