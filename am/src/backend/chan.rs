//! In-process backend on real time: a [`ChanNet`] of nodes in one process, each a
//! [`ChanTransport`] that may live on its own thread or tokio task.
//!
//! Unlike [`crate::backend::mem`] (one thread, virtual clock, a fault model for the
//! simulator), this network runs on the monotonic clock and moves datagrams as soon as they are
//! sent: a send copies the datagram into the destination's inbox and wakes it. What a real
//! network does at its limits it does too:
//! - every inbox is bounded ([`CHAN_INBOX`] datagrams by default); a datagram sent to a full
//!   inbox is dropped and counted, like a full NIC ring, and the AM layer retransmits it;
//! - a datagram to an address with no live node (never made, or dropped) is dropped and counted;
//! - datagrams longer than [`CHAN_MAX_DATAGRAM`] are dropped and counted.
//!
//! [`Transport::wait`] blocks the calling thread on a condition variable until a datagram
//! arrives or the deadline passes; [`Transport::wait_async`] awaits a [`tokio::sync::Notify`]
//! (any tokio runtime, or none: it only needs tokio's timer when a deadline is given, so call
//! it inside a runtime with time enabled). Incarnations are strictly increasing across every
//! node a net makes, starting from the wall clock, so a node made again at an address gets a
//! larger one.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::time::Instant;

use tokio::sync::Notify;

use super::{real_instant, real_now, sleep_until_real, tokio_deadline, wall_incarnation};
use crate::AmError;
use crate::transport::Transport;
use crate::{NodeAddr, Time};

/// Datagrams one node's inbox holds by default; more are dropped.
pub const CHAN_INBOX: usize = 4096;
/// Largest datagram on the network (an Ethernet frame's payload).
pub const CHAN_MAX_DATAGRAM: usize = 1500;
/// Datagrams one [`Transport::recv`] moves out of the inbox per lock.
const RECV_BATCH: usize = 64;

/// One node's inbox and what wakes its owner.
#[derive(Debug)]
struct Slot {
    queue: Mutex<VecDeque<(u32, Vec<u8>)>>,
    ready: Condvar,
    notify: Notify,
}

impl Slot {
    fn lock(&self) -> MutexGuard<'_, VecDeque<(u32, Vec<u8>)>> {
        self.queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Counters of a [`ChanNet`] (all nodes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChanStats {
    /// Datagrams put in an inbox.
    pub delivered: u64,
    /// Datagrams dropped because the destination's inbox was full.
    pub inbox_full: u64,
    /// Datagrams dropped because no live node has the destination address.
    pub no_node: u64,
    /// Datagrams dropped because they were longer than the network carries.
    pub oversize: u64,
}

#[derive(Debug, Default)]
struct Counters {
    delivered: AtomicU64,
    inbox_full: AtomicU64,
    no_node: AtomicU64,
    oversize: AtomicU64,
}

#[derive(Debug)]
struct Net {
    origin: Instant,
    capacity: usize,
    /// Node id → its slot while the node lives.
    nodes: RwLock<Vec<Option<Arc<Slot>>>>,
    next_inc: AtomicU64,
    counters: Counters,
}

impl Net {
    fn nodes(&self) -> std::sync::RwLockReadGuard<'_, Vec<Option<Arc<Slot>>>> {
        self.nodes
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn nodes_mut(&self) -> std::sync::RwLockWriteGuard<'_, Vec<Option<Arc<Slot>>>> {
        self.nodes
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// An in-process network on real time. Cheap to clone (all clones are the same network).
#[derive(Clone, Debug)]
pub struct ChanNet {
    net: Arc<Net>,
}

impl Default for ChanNet {
    fn default() -> Self {
        Self::new()
    }
}

impl ChanNet {
    /// A network whose inboxes hold [`CHAN_INBOX`] datagrams.
    pub fn new() -> Self {
        Self::with_inbox(CHAN_INBOX)
    }

    /// A network whose inboxes hold `capacity` datagrams (at least 1: panics on 0).
    pub fn with_inbox(capacity: usize) -> Self {
        assert!(capacity > 0, "a ChanNet inbox holds at least one datagram");
        Self {
            net: Arc::new(Net {
                origin: Instant::now(),
                capacity,
                nodes: RwLock::new(Vec::new()),
                next_inc: AtomicU64::new(wall_incarnation()),
                counters: Counters::default(),
            }),
        }
    }

    /// A new node at a fresh address (`NodeAddr::Mem(id)`, ids from 0).
    pub fn node(&self) -> ChanTransport {
        let slot = Self::slot();
        let id = {
            let mut nodes = self.net.nodes_mut();
            nodes.push(Some(Arc::clone(&slot)));
            (nodes.len() - 1) as u32
        };
        self.transport(id, slot)
    }

    /// A new node at the address of a node that was dropped (a restart: it gets a larger
    /// incarnation). Fails if `addr` is not an address of this network or its node still lives.
    pub fn rebind(&self, addr: NodeAddr) -> Result<ChanTransport, AmError> {
        let NodeAddr::Mem(id) = addr else {
            return Err(AmError::BadArg("not an in-process address"));
        };
        let slot = Self::slot();
        {
            let mut nodes = self.net.nodes_mut();
            match nodes.get_mut(id as usize) {
                Some(s @ None) => *s = Some(Arc::clone(&slot)),
                Some(Some(_)) => return Err(AmError::BadArg("the node at this address lives")),
                None => return Err(AmError::BadArg("no such address on this network")),
            }
        }
        Ok(self.transport(id, slot))
    }

    fn slot() -> Arc<Slot> {
        Arc::new(Slot {
            queue: Mutex::new(VecDeque::new()),
            ready: Condvar::new(),
            notify: Notify::new(),
        })
    }

    fn transport(&self, id: u32, slot: Arc<Slot>) -> ChanTransport {
        ChanTransport {
            net: Arc::clone(&self.net),
            id,
            slot,
            inc: self.net.next_inc.fetch_add(1, Ordering::Relaxed),
            batch: VecDeque::new(),
        }
    }

    /// Counters of the whole network.
    pub fn stats(&self) -> ChanStats {
        let c = &self.net.counters;
        ChanStats {
            delivered: c.delivered.load(Ordering::Relaxed),
            inbox_full: c.inbox_full.load(Ordering::Relaxed),
            no_node: c.no_node.load(Ordering::Relaxed),
            oversize: c.oversize.load(Ordering::Relaxed),
        }
    }
}

/// One node of a [`ChanNet`]. Dropping it takes the node off the network: datagrams sent to
/// its address are dropped from then on.
#[derive(Debug)]
pub struct ChanTransport {
    net: Arc<Net>,
    id: u32,
    slot: Arc<Slot>,
    inc: u64,
    /// Datagrams taken out of the inbox and not yet handed to a sink.
    batch: VecDeque<(u32, Vec<u8>)>,
}

impl ChanTransport {
    /// Datagrams waiting for this node.
    pub fn queued(&self) -> usize {
        self.batch.len() + self.slot.lock().len()
    }

    fn deliver(&self, to: u32, datagram: &[u8]) {
        let c = &self.net.counters;
        if datagram.len() > CHAN_MAX_DATAGRAM {
            c.oversize.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let Some(slot) = self.net.nodes().get(to as usize).cloned().flatten() else {
            c.no_node.fetch_add(1, Ordering::Relaxed);
            return;
        };
        {
            let mut q = slot.lock();
            if q.len() >= self.net.capacity {
                c.inbox_full.fetch_add(1, Ordering::Relaxed);
                return;
            }
            q.push_back((self.id, datagram.to_vec()));
        }
        c.delivered.fetch_add(1, Ordering::Relaxed);
        slot.ready.notify_all();
        slot.notify.notify_one();
    }
}

impl Drop for ChanTransport {
    fn drop(&mut self) {
        let mut nodes = self.net.nodes_mut();
        if let Some(s) = nodes.get_mut(self.id as usize)
            && s.as_ref().is_some_and(|s| Arc::ptr_eq(s, &self.slot))
        {
            *s = None;
        }
    }
}

impl Transport for ChanTransport {
    fn local_addr(&self) -> NodeAddr {
        NodeAddr::Mem(self.id)
    }
    fn max_datagram(&self) -> usize {
        CHAN_MAX_DATAGRAM
    }
    fn incarnation(&self) -> u64 {
        self.inc
    }
    fn now(&self) -> Time {
        real_now(self.net.origin)
    }
    fn send(&mut self, to: NodeAddr, datagram: &[u8]) -> Result<(), AmError> {
        let NodeAddr::Mem(to) = to else {
            self.net.counters.no_node.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        };
        self.deliver(to, datagram);
        Ok(())
    }
    fn recv(
        &mut self,
        max: usize,
        sink: &mut dyn FnMut(NodeAddr, &[u8]),
    ) -> Result<usize, AmError> {
        let mut n = 0;
        while n < max {
            if self.batch.is_empty() {
                let mut q = self.slot.lock();
                let take = q.len().min(RECV_BATCH);
                self.batch.extend(q.drain(..take));
            }
            let Some((from, bytes)) = self.batch.pop_front() else {
                break;
            };
            // The sink runs without the inbox lock: senders are never blocked by a handler.
            sink(NodeAddr::Mem(from), &bytes);
            n += 1;
        }
        Ok(n)
    }
    fn has_pending(&mut self) -> bool {
        !self.batch.is_empty() || !self.slot.lock().is_empty()
    }
    fn wait(&mut self, deadline: Option<Time>) -> Result<bool, AmError> {
        if !self.batch.is_empty() {
            return Ok(true);
        }
        let until = deadline.map(|t| real_instant(self.net.origin, t));
        let mut q = self.slot.lock();
        loop {
            if !q.is_empty() {
                return Ok(true);
            }
            q = match until {
                None => self
                    .slot
                    .ready
                    .wait(q)
                    .unwrap_or_else(std::sync::PoisonError::into_inner),
                Some(u) => {
                    let left = u.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Ok(false);
                    }
                    self.slot
                        .ready
                        .wait_timeout(q, left)
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .0
                }
            };
        }
    }
    fn sleep_until(&mut self, t: Time) {
        sleep_until_real(self.now(), t);
    }
    async fn wait_async(&mut self, deadline: Option<Time>) -> Result<bool, AmError> {
        let until = deadline.map(|t| tokio_deadline(self.net.origin, t));
        loop {
            // A notification sent between this check and the await is kept as a permit.
            if self.has_pending() {
                return Ok(true);
            }
            match until {
                None => self.slot.notify.notified().await,
                Some(u) => {
                    if tokio::time::Instant::now() >= u {
                        return Ok(false);
                    }
                    let notified = self.slot.notify.notified();
                    if tokio::time::timeout_at(u, notified).await.is_err() {
                        return Ok(self.has_pending());
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn datagrams_arrive_in_order_and_a_full_inbox_drops() {
        let net = ChanNet::with_inbox(4);
        let mut a = net.node();
        let mut b = net.node();
        for i in 0..6u8 {
            a.send(b.local_addr(), &[i]).unwrap();
        }
        let mut got = Vec::new();
        b.recv(usize::MAX, &mut |from, d| {
            assert_eq!(from, NodeAddr::Mem(0));
            got.push(d[0]);
        })
        .unwrap();
        assert_eq!(got, [0, 1, 2, 3]);
        let s = net.stats();
        assert_eq!((s.delivered, s.inbox_full), (4, 2));
        // Oversize datagrams and unknown addresses are dropped and counted.
        a.send(b.local_addr(), &[0; CHAN_MAX_DATAGRAM + 1]).unwrap();
        a.send(NodeAddr::Mem(99), b"x").unwrap();
        let s = net.stats();
        assert_eq!((s.oversize, s.no_node), (1, 1));
        assert!(!b.has_pending());
    }

    #[test]
    fn incarnations_grow_and_a_dropped_node_can_be_rebound() {
        let net = ChanNet::new();
        let a = net.node();
        let b = net.node();
        assert!(b.incarnation() > a.incarnation());
        let addr = b.local_addr();
        assert!(net.rebind(addr).is_err(), "b still lives");
        let old = b.incarnation();
        drop(b);
        let mut sender = net.node();
        sender.send(addr, b"lost").unwrap();
        assert_eq!(net.stats().no_node, 1);
        let mut b2 = net.rebind(addr).unwrap();
        assert!(b2.incarnation() > old);
        sender.send(addr, b"found").unwrap();
        assert!(b2.has_pending());
        assert!(net.rebind(NodeAddr::Mem(50)).is_err());
        drop(a);
    }

    #[test]
    fn wait_blocks_until_a_datagram_arrives_or_the_deadline() {
        let net = ChanNet::new();
        let mut a = net.node();
        let mut b = net.node();
        let to = b.local_addr();
        // Nothing sent: the wait ends at its deadline.
        let d = b.now().plus(Duration::from_millis(5));
        assert!(!b.wait(Some(d)).unwrap());
        assert!(b.now() >= d);
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            a.send(to, b"wake").unwrap();
        });
        assert!(b.wait(None).unwrap());
        t.join().unwrap();
        let mut n = 0;
        b.recv(8, &mut |_, d| {
            assert_eq!(d, b"wake");
            n += 1;
        })
        .unwrap();
        assert_eq!(n, 1);
    }

    #[test]
    fn wait_async_wakes_on_arrival() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let net = ChanNet::new();
        let mut a = net.node();
        let mut b = net.node();
        let to = b.local_addr();
        rt.block_on(async move {
            let d = b.now().plus(Duration::from_millis(5));
            assert!(!b.wait_async(Some(d)).await.unwrap());
            let waiter = tokio::spawn(async move {
                let guard = b.now().plus(Duration::from_secs(60));
                let r = b.wait_async(Some(guard)).await.unwrap();
                (r, b.queued())
            });
            tokio::time::sleep(Duration::from_millis(10)).await;
            a.send(to, b"wake").unwrap();
            assert_eq!(waiter.await.unwrap(), (true, 1));
        });
    }
}
