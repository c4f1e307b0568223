//! Ways to wait for reads and barriers: a blocking [`Smm`] over any [`SiuLink`], and a
//! runtime-agnostic [`SharedSmm`] whose [`SharedSmm::read`] is a `Future` (works under tokio or
//! any executor) while a pump task moves packets.
//!
//! [`SmmNode::read_value`] is the single-threaded `poll`: it never blocks; a driver calls
//! [`SmmNode::handle_siu`] and [`SmmNode::poll_siu`] between checks.

use crate::{ReadHandle, SmmError, SmmNode};
use isotach_proto::packet::{self, EopMarker, IsochronMarker, IsotachMessage, Kind};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};
use thiserror::Error;

/// The packet link between an SMM node and its SIU, as a driver provides it.
pub trait SiuLink {
    /// Sends one packet to the SIU.
    fn send(&mut self, packet: Vec<u8>) -> Result<(), LinkError>;
    /// Hands the packets [`SiuLink::send`] queued to the SIU now. A link may hold sent
    /// packets until this (or [`SiuLink::recv`]) runs, so that a burst — an isochron's start,
    /// srefs and end — leaves together, batched. Does nothing by default.
    fn flush(&mut self) -> Result<(), LinkError> {
        Ok(())
    }
    /// Receives one packet from the SIU, waiting at most `timeout`; `Ok(None)` on timeout.
    fn recv(&mut self, timeout: Duration) -> Result<Option<Vec<u8>>, LinkError>;
    /// A packet the link already holds, taken without any I/O, clock read or wait (the rest
    /// of a batch [`SiuLink::recv`] brought). `None` by default.
    fn try_recv(&mut self) -> Option<Vec<u8>> {
        None
    }
    /// Takes back a received packet's buffer once the node handled it, for the link to
    /// receive into again. Drops it by default.
    fn recycle(&mut self, _buf: Vec<u8>) {}
    /// Why the link to the SIU broke since it was set up (the SIU restarted, or the transport
    /// gave up on it), if it did: logical time does not go on across it. `None` by default.
    fn broken(&mut self) -> Option<String> {
        None
    }
}

/// The link to the SIU failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("SIU link: {0}")]
pub struct LinkError(pub String);

/// Why a wait ended without a value.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum WaitError {
    /// The deadline passed first.
    #[error("timed out after {0:?}")]
    TimedOut(Duration),
    /// The link failed.
    #[error(transparent)]
    Link(#[from] LinkError),
    /// The SMM refused something.
    #[error(transparent)]
    Smm(#[from] SmmError),
}

/// An SMM node plus its link: blocking waits for single-threaded applications.
///
/// Errors from the SIU side reach the caller of every wait: a restart of logical time
/// ([`SmmError::Restarted`], [`SmmError::SiuRestarted`]) is sticky — every later wait returns
/// it. Input the node refuses as [`SmmError::BadInput`] is counted in its stats and skipped
/// (hostile input must not stop the application). A packet refused for a table limit
/// ([`SmmError::Limit`]) is held and offered again before anything after it, never dropped.
#[derive(Debug)]
pub struct Smm<L> {
    node: SmmNode,
    link: L,
    /// Input held after the node refused a packet for a limit.
    held: HeldInput,
    /// The error that ended this node's logical time.
    fatal: Option<SmmError>,
}

/// How long one receive waits inside a blocking wait before re-checking the deadline.
const RECV_SLICE: Duration = Duration::from_millis(5);
/// Packets a blocking wait handles, of those the link already holds, before it checks its
/// condition and its deadline again (a pulse's worth arrives together: one check, one clock
/// read per batch, not per packet).
const FEED_BATCH_MAX: usize = 256;
/// A join with no progress for this long asks again for the pages still waiting.
pub const JOIN_RETRY_AFTER: Duration = Duration::from_millis(500);

impl<L: SiuLink> Smm<L> {
    /// Wraps a node and its link.
    pub fn new(node: SmmNode, link: L) -> Self {
        Self {
            node,
            link,
            held: HeldInput::default(),
            fatal: None,
        }
    }

    /// The node and its link, for another driver (e.g. [`SharedSmm`] and a pump).
    pub fn into_parts(self) -> (SmmNode, L) {
        (self.node, self.link)
    }

    /// The error that ended this node's logical time, if one did.
    pub fn fatal(&self) -> Option<&SmmError> {
        self.fatal.as_ref()
    }

    /// The link (statistics).
    pub fn link(&self) -> &L {
        &self.link
    }

    /// Hands one packet to the node, or holds it behind a refused one. `Ok(false)`: the
    /// held input is full, stop reading. A fatal error is kept and returned.
    fn feed(&mut self, p: Vec<u8>) -> Result<bool, SmmError> {
        if self.held.must_wait(&p) {
            self.held.push_back(p);
            return Ok(!self.held.full());
        }
        if let Some(refused) = self.offer(p)? {
            self.held.push_front(refused);
        }
        Ok(!self.held.full())
    }

    /// The node's verdict: `Some(p)` when it refused `p` for a limit.
    fn offer(&mut self, p: Vec<u8>) -> Result<Option<Vec<u8>>, SmmError> {
        match self.node.handle_siu(&p) {
            Ok(()) | Err(SmmError::BadInput(_)) => {
                self.link.recycle(p);
                Ok(None)
            }
            Err(SmmError::Limit(_)) => Ok(Some(p)),
            Err(e) => {
                self.fatal = Some(e.clone());
                Err(e)
            }
        }
    }

    /// Offers held input again, in order; `Ok(true)` when the link may be read.
    fn retry_held(&mut self) -> Result<bool, SmmError> {
        while let Some(p) = self.held.pop_front() {
            if let Some(refused) = self.offer(p)? {
                self.held.push_front(refused);
                break;
            }
        }
        Ok(!self.held.full())
    }

    /// Fails with the fatal error, if there is one (or the link says it broke).
    fn check_fatal(&mut self) -> Result<(), SmmError> {
        if self.fatal.is_none()
            && let Some(reason) = self.link.broken()
        {
            self.fatal = Some(SmmError::SiuRestarted { reason });
        }
        match &self.fatal {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// The node, to build isochrons and register handlers.
    pub fn node(&mut self) -> &mut SmmNode {
        &mut self.node
    }

    /// Sends everything queued for the SIU and handles every packet already received; never
    /// waits. Returns the packets handled. Bad packets are counted in the node's stats; a
    /// restart of logical time is returned (and every later call returns it too).
    pub fn poll(&mut self) -> Result<usize, WaitError> {
        self.check_fatal()?;
        self.flush()?;
        let mut handled = 0;
        if self.retry_held()? {
            while let Some(p) = self.link.recv(Duration::ZERO)? {
                handled += 1;
                if !self.feed(p)? {
                    break;
                }
            }
        }
        self.retry_held()?;
        self.flush()?;
        self.check_fatal()?;
        Ok(handled)
    }

    fn flush(&mut self) -> Result<(), LinkError> {
        let mut sent = false;
        while let Some(p) = self.node.poll_siu() {
            self.link.send(p)?;
            sent = true;
        }
        if sent {
            self.link.flush()?;
        }
        Ok(())
    }

    /// Drives the link until `done` holds or `timeout` passes.
    pub fn wait_until(
        &mut self,
        timeout: Duration,
        mut done: impl FnMut(&SmmNode) -> bool,
    ) -> Result<(), WaitError> {
        let deadline = Instant::now() + timeout;
        loop {
            self.check_fatal()?;
            self.flush()?;
            if done(&self.node) {
                return Ok(());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(WaitError::TimedOut(timeout));
            }
            if !self.retry_held()? {
                // Held input is full and the node's buckets too: wait for them to drain.
                std::thread::sleep(left.min(RECV_SLICE));
                continue;
            }
            if let Some(p) = self.link.recv(left.min(RECV_SLICE))?
                && self.feed(p)?
            {
                self.feed_held_by_link()?;
            }
        }
    }

    /// Feeds what the link already holds, up to [`FEED_BATCH_MAX`] packets, stopping when
    /// the held input fills.
    fn feed_held_by_link(&mut self) -> Result<(), SmmError> {
        for _ in 0..FEED_BATCH_MAX {
            let Some(p) = self.link.try_recv() else { break };
            if !self.feed(p)? {
                break;
            }
        }
        Ok(())
    }

    /// Blocks until the read resolves; takes its value. A read its copy holder refused is
    /// [`SmmError::ReadRefused`].
    pub fn wait(&mut self, h: ReadHandle, timeout: Duration) -> Result<u64, WaitError> {
        self.wait_until(timeout, |n| n.read_settled(h))?;
        Ok(self.node.take_read(h)?.unwrap_or_default())
    }

    /// Starts the node's state transfer ([`SmmNode::join`]) and blocks until every page it
    /// holds is current; returns what the transfer found.
    ///
    /// An answer can be lost with an application that went away before its SIU noticed: when
    /// the transfer makes no progress for [`JOIN_RETRY_AFTER`], the pages still waiting are
    /// asked for again ([`SmmNode::retry_join`]).
    pub fn join(&mut self, timeout: Duration) -> Result<crate::JoinReport, WaitError> {
        let deadline = Instant::now() + timeout;
        self.node.join()?;
        let joining = |n: &SmmNode| matches!(n.join_status(), crate::JoinStatus::Joining { .. });
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let waiting = self.node.join_status();
            match self.wait_until(left.min(JOIN_RETRY_AFTER), |n| {
                !joining(n) || n.join_status() != waiting
            }) {
                Ok(()) if !joining(&self.node) => break,
                Ok(()) => {}
                Err(WaitError::TimedOut(_)) if !left.is_zero() => {
                    self.node.retry_join();
                }
                Err(WaitError::TimedOut(_)) => return Err(WaitError::TimedOut(timeout)),
                Err(e) => return Err(e),
            }
        }
        if let crate::JoinStatus::Failed(e) = self.node.join_status() {
            return Err(e.into());
        }
        Ok(self.node.join_report().cloned().unwrap_or_default())
    }

    /// Enters barrier `barrier` for `count` rounds and blocks until it completes.
    pub fn barrier(
        &mut self,
        barrier: usize,
        count: u32,
        timeout: Duration,
    ) -> Result<(), WaitError> {
        self.node.barrier_start(barrier, count)?;
        self.wait_until(timeout, |n| n.barrier_done(barrier))
    }
}

/// Most packets held behind one the node refused for a limit before the driver stops reading.
const HELD_MAX: usize = 4096;

/// Input held after the node refused a packet for a table limit ([`SmmError::Limit`]): the
/// refused packet and every later packet for its pulse or a later one wait, in order, and are
/// offered again first. Packets for earlier pulses (whose EOPs drain the buckets) and
/// non-isotach packets pass — they belong to other buckets, so each bucket keeps the SIU's
/// arrival order its sort vector indexes. Nothing is dropped.
#[derive(Debug, Default)]
pub(crate) struct HeldInput {
    queue: VecDeque<Vec<u8>>,
}

impl HeldInput {
    /// The pulse a packet is bucketed in (isotach messages, isochron and EOP markers).
    fn pulse(p: &[u8]) -> Option<u64> {
        match packet::peek_kind(p).ok()? {
            Kind::IsotachMessage => IsotachMessage::peek_stamp(p).map(|(ts, _, _)| ts.get()),
            Kind::IsochronMarker => IsochronMarker::decode(p).ok().map(|m| m.ts.get()),
            Kind::EopMarker => EopMarker::decode(p).ok().map(|e| e.ts.get()),
            _ => None,
        }
    }

    /// The lowest pulse held.
    fn low(&self) -> Option<u64> {
        self.queue.iter().filter_map(|p| Self::pulse(p)).min()
    }

    /// `p` must wait behind what is held (same or later pulse than something held).
    pub(crate) fn must_wait(&self, p: &[u8]) -> bool {
        // Nothing held (the common case): no packet is decoded here.
        if self.queue.is_empty() {
            return false;
        }
        match (self.low(), Self::pulse(p)) {
            (Some(low), Some(t)) => t >= low,
            _ => false,
        }
    }

    pub(crate) fn push_back(&mut self, p: Vec<u8>) {
        self.queue.push_back(p);
    }

    pub(crate) fn push_front(&mut self, p: Vec<u8>) {
        self.queue.push_front(p);
    }

    pub(crate) fn pop_front(&mut self) -> Option<Vec<u8>> {
        self.queue.pop_front()
    }

    pub(crate) fn full(&self) -> bool {
        self.queue.len() >= HELD_MAX
    }
}

/// An SMM node shared between application tasks and a pump task. Reads are awaited as futures;
/// the pump feeds packets with [`SharedSmm::handle_siu`] and sends what [`SharedSmm::poll_siu`]
/// returns. Works with any executor.
#[derive(Debug, Clone)]
pub struct SharedSmm {
    inner: Arc<Mutex<Shared>>,
}

#[derive(Debug)]
struct Shared {
    node: SmmNode,
    /// Tasks waiting on reads (or on any progress), woken after every input.
    waiting: Vec<Waker>,
    /// Wakes the pump when there is output.
    pump: Option<Waker>,
    /// The error that ended this node's logical time: every read resolves to it.
    fatal: Option<SmmError>,
}

impl SharedSmm {
    /// Shares a node.
    pub fn new(node: SmmNode) -> Self {
        Self {
            inner: Arc::new(Mutex::new(Shared {
                node,
                waiting: Vec::new(),
                pump: None,
                fatal: None,
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Shared> {
        // A panicking application task must not wedge the pump: keep going with the state.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on the node (build isochrons, register handlers) and wakes the pump.
    pub fn with<R>(&self, f: impl FnOnce(&mut SmmNode) -> R) -> R {
        let mut s = self.lock();
        let r = f(&mut s.node);
        if let Some(w) = s.pump.take() {
            w.wake();
        }
        r
    }

    /// Pump side: one packet from the SIU. Wakes every waiting reader. A packet refused
    /// with [`SmmError::Limit`] was not taken: the pump holds it and offers it again before
    /// anything after it. A restart of logical time is kept: every read resolves to it.
    pub fn handle_siu(&self, packet: &[u8]) -> Result<(), SmmError> {
        let mut s = self.lock();
        let r = s.node.handle_siu(packet);
        if let Err(e @ (SmmError::Restarted { .. } | SmmError::SiuRestarted { .. })) = &r {
            s.fatal.get_or_insert_with(|| e.clone());
        }
        for w in s.waiting.drain(..) {
            w.wake();
        }
        r
    }

    /// Pump side: the link to the SIU broke (see [`SiuLink::broken`]); every read resolves
    /// to [`SmmError::SiuRestarted`].
    pub fn link_broken(&self, reason: String) {
        let mut s = self.lock();
        s.fatal.get_or_insert(SmmError::SiuRestarted { reason });
        for w in s.waiting.drain(..) {
            w.wake();
        }
    }

    /// The error that ended this node's logical time, if one did.
    pub fn fatal(&self) -> Option<SmmError> {
        self.lock().fatal.clone()
    }

    /// Pump side: the next packet for the SIU.
    pub fn poll_siu(&self) -> Option<Vec<u8>> {
        self.lock().node.poll_siu()
    }

    /// Pump side: a future that completes when there is output for the SIU.
    pub fn output_ready(&self) -> OutputReady {
        OutputReady { smm: self.clone() }
    }

    /// A future resolving to the read's value (taking it).
    pub fn read(&self, h: ReadHandle) -> ReadFuture {
        ReadFuture {
            smm: self.clone(),
            handle: h,
        }
    }
}

/// Resolves to a read's value. See [`SharedSmm::read`].
#[derive(Debug)]
pub struct ReadFuture {
    smm: SharedSmm,
    handle: ReadHandle,
}

impl Future for ReadFuture {
    type Output = Result<u64, SmmError>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut s = self.smm.lock();
        match s.node.take_read(self.handle) {
            Ok(Some(v)) => Poll::Ready(Ok(v)),
            Ok(None) if s.fatal.is_some() => Poll::Ready(Err(s.fatal.clone().expect("checked"))),
            Ok(None) => {
                s.waiting.push(cx.waker().clone());
                Poll::Pending
            }
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}

/// Completes when the node has output for the SIU. See [`SharedSmm::output_ready`].
#[derive(Debug)]
pub struct OutputReady {
    smm: SharedSmm,
}

impl Future for OutputReady {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut s = self.smm.lock();
        if s.node.has_output() {
            Poll::Ready(())
        } else {
            s.pump = Some(cx.waker().clone());
            Poll::Pending
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Addr, MemoryMap, SmmConfig, SmmLimits};
    use isotach_proto::config::{Limits, Timing};
    use isotach_proto::packet::Width;
    use isotach_proto::topology::{Hop, Topology};
    use isotach_proto::{Generation, Pulse};
    use isotach_siu::{Siu, SiuConfig};
    use isotach_tm::{TmConfig, TokenManager};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
    use std::thread::JoinHandle;

    /// A one-host cluster (TM + SIU) on its own thread, reached over channels.
    struct Cluster {
        stop: Arc<AtomicBool>,
        thread: Option<JoinHandle<()>>,
    }

    impl Drop for Cluster {
        fn drop(&mut self) {
            self.stop.store(true, Ordering::Relaxed);
            if let Some(t) = self.thread.take() {
                t.join().unwrap();
            }
        }
    }

    struct ChannelLink {
        to_siu: Sender<Vec<u8>>,
        from_siu: Receiver<Vec<u8>>,
    }

    impl SiuLink for ChannelLink {
        fn send(&mut self, packet: Vec<u8>) -> Result<(), LinkError> {
            self.to_siu
                .send(packet)
                .map_err(|e| LinkError(e.to_string()))
        }
        fn recv(&mut self, timeout: Duration) -> Result<Option<Vec<u8>>, LinkError> {
            match self.from_siu.recv_timeout(timeout) {
                Ok(p) => Ok(Some(p)),
                Err(RecvTimeoutError::Timeout) => Ok(None),
                Err(e) => Err(LinkError(e.to_string())),
            }
        }
    }

    fn node(topo: &Arc<Topology>) -> SmmNode {
        let names = vec!["0".to_string()];
        SmmNode::new(SmmConfig {
            host: 0,
            topology: topo.clone(),
            map: Arc::new(MemoryMap::parse("0 0\n", "m", &names).unwrap()),
            limits: SmmLimits::default(),
            record: false,
        })
    }

    fn cluster(topo: &Arc<Topology>) -> (Cluster, ChannelLink) {
        let (to_siu, siu_in) = channel::<Vec<u8>>();
        let (siu_out, from_siu) = channel();
        let stop = Arc::new(AtomicBool::new(false));
        let timing = Timing::default();
        let mut tm = TokenManager::new(TmConfig {
            switch: 0,
            topology: topo.clone(),
            timing,
            limits: Limits::default(),
        });
        let mut siu = Siu::new(SiuConfig {
            host: 0,
            mode: isotach_siu::Mode::Siu,
            topology: topo.clone(),
            timing,
            limits: Limits::default(),
            initiates_reset: true,
            host_turns: false,
        });
        let link = tm.link_to(Hop::Host(0)).unwrap();
        let halt = stop.clone();
        let thread = std::thread::spawn(move || {
            siu.start(0);
            while !halt.load(Ordering::Relaxed) {
                while let Ok(p) = siu_in.try_recv() {
                    siu.handle_host(0, &p).unwrap();
                }
                while let Some(t) = siu.poll_net() {
                    tm.handle_input(0, link, &t.bytes).unwrap();
                }
                while let Some((_, b)) = tm.poll_transmit() {
                    siu.handle_net(0, &b).unwrap();
                }
                while let Some(b) = siu.poll_host() {
                    let _ = siu_out.send(b);
                }
                std::thread::yield_now();
            }
        });
        (
            Cluster {
                stop,
                thread: Some(thread),
            },
            ChannelLink { to_siu, from_siu },
        )
    }

    #[test]
    fn blocking_wait_resolves_a_read_through_a_running_siu() {
        let topo = Arc::new(Topology::line(1, 1).unwrap());
        let (_cluster, link) = cluster(&topo);
        let mut smm = Smm::new(node(&topo), link);
        // Page 0 is local and nothing is outstanding: this one runs at once.
        let mut iso = smm.node().isochron();
        iso.write(Addr::new(0, 1), Width::W64, 77).unwrap();
        iso.end().unwrap();
        // A barrier round trip goes through logical time.
        smm.barrier(0, 1, Duration::from_secs(30)).unwrap();
        assert_eq!(smm.node().barriers_completed(0), 1);
        let mut iso = smm.node().isochron();
        let r = iso.read(Addr::new(0, 1), Width::W64).unwrap();
        iso.end().unwrap();
        assert_eq!(smm.wait(r, Duration::from_secs(30)), Ok(77));
        assert_eq!(smm.poll().map(|_| ()), Ok(()));
    }

    #[test]
    fn wait_times_out_on_a_dead_link() {
        let topo = Arc::new(Topology::line(1, 1).unwrap());
        let (to_siu, _siu_in) = channel();
        let (_siu_out, from_siu) = channel();
        let mut smm = Smm::new(node(&topo), ChannelLink { to_siu, from_siu });
        assert_eq!(
            smm.barrier(0, 1, Duration::from_millis(20)),
            Err(WaitError::TimedOut(Duration::from_millis(20)))
        );
    }

    /// A link that hands out scripted packets and swallows what is sent.
    struct Script(VecDeque<Vec<u8>>);

    impl SiuLink for Script {
        fn send(&mut self, _: Vec<u8>) -> Result<(), LinkError> {
            Ok(())
        }
        fn recv(&mut self, _: Duration) -> Result<Option<Vec<u8>>, LinkError> {
            Ok(self.0.pop_front())
        }
    }

    /// A scripted link that hands over what it holds in batches, as a real link does.
    struct BatchScript(VecDeque<Vec<u8>>);

    impl SiuLink for BatchScript {
        fn send(&mut self, _: Vec<u8>) -> Result<(), LinkError> {
            Ok(())
        }
        fn recv(&mut self, _: Duration) -> Result<Option<Vec<u8>>, LinkError> {
            Ok(self.0.pop_front())
        }
        fn try_recv(&mut self) -> Option<Vec<u8>> {
            self.0.pop_front()
        }
    }

    #[test]
    fn a_wait_checks_its_condition_once_per_batch_not_per_packet() {
        let topo = Arc::new(Topology::line(1, 1).unwrap());
        let script: VecDeque<Vec<u8>> = (1..=40)
            .flat_map(|ts| [write_at(ts, 1), eop(ts, 1)])
            .collect();
        let mut smm = Smm::new(node(&topo), BatchScript(script));
        let mut checks = 0;
        smm.wait_until(Duration::from_secs(5), |n| {
            checks += 1;
            n.stats().pulses_drained == 40
        })
        .unwrap();
        // Once before the first receive, once after the batch.
        assert_eq!(checks, 2);
        assert_eq!(smm.node().local_value(Addr::new(0, 1)), Some(40));
    }

    #[test]
    fn a_batch_stops_at_held_input_and_loses_nothing() {
        let topo = Arc::new(Topology::line(1, 1).unwrap());
        let mut cfg = node(&topo).config().clone();
        cfg.limits.bucket_packets_max = 1;
        let n = SmmNode::new(cfg);
        let script = [write_at(5, 1), write_at(6, 2), eop(5, 1), eop(6, 1)];
        let mut smm = Smm::new(n, BatchScript(script.into_iter().collect()));
        smm.wait_until(Duration::from_secs(5), |n| n.stats().pulses_drained == 2)
            .unwrap();
        let s = smm.node().stats();
        assert!(s.refused >= 1, "{s:?}");
        assert_eq!(smm.node().local_value(Addr::new(0, 1)), Some(5));
        assert_eq!(smm.node().local_value(Addr::new(0, 2)), Some(6));
        assert_eq!(s.count_mismatches + s.bad_input, 0, "{s:?}");
    }

    fn write_at(ts: u64, slot: u32) -> Vec<u8> {
        let m = IsotachMessage {
            ts: Pulse::new(ts),
            source: 0,
            dest: 0,
            sequum: ts,
            generation: Generation::new(1),
            sref: packet::Sref::Mem {
                op: packet::SrefOp::Write,
                width: Width::W64,
                addr: Addr::new(0, slot).raw(),
                value: ts,
                ref_id: 0,
            },
        };
        let mut b = Vec::new();
        m.encode(&mut b);
        b
    }

    fn eop(ts: u64, count: u32) -> Vec<u8> {
        let e = EopMarker {
            ts: Pulse::new(ts),
            count,
            sort_vector: (0..count as u8).collect(),
            ..Default::default()
        };
        let mut b = Vec::new();
        e.encode(&mut b);
        b
    }

    #[test]
    fn a_packet_refused_for_the_bucket_limit_is_held_and_nothing_is_lost() {
        let topo = Arc::new(Topology::line(1, 1).unwrap());
        let mut cfg = node(&topo).config().clone();
        cfg.limits.bucket_packets_max = 1;
        let n = SmmNode::new(cfg);
        // Pulse 6's write is refused while pulse 5's fills the buckets; pulse 5's EOP passes
        // it, drains, and the held write goes in before pulse 6's EOP.
        let script = [write_at(5, 1), write_at(6, 2), eop(5, 1), eop(6, 1)];
        let mut smm = Smm::new(n, Script(script.into_iter().collect()));
        smm.poll().unwrap();
        let s = smm.node().stats();
        assert!(s.refused >= 1, "{s:?}");
        assert_eq!((s.srefs_executed, s.pulses_drained), (2, 2), "{s:?}");
        assert_eq!(smm.node().local_value(Addr::new(0, 1)), Some(5));
        assert_eq!(smm.node().local_value(Addr::new(0, 2)), Some(6));
        assert_eq!(s.count_mismatches + s.bad_input, 0, "{s:?}");
    }

    #[test]
    fn a_restart_of_logical_time_reaches_every_later_wait() {
        let topo = Arc::new(Topology::line(1, 1).unwrap());
        let script = [write_at(5, 1), eop(5, 1), write_at(2, 1)];
        let mut smm = Smm::new(node(&topo), Script(script.into_iter().collect()));
        let restarted = |e: &WaitError| matches!(e, WaitError::Smm(SmmError::Restarted { .. }));
        let e = smm.poll().unwrap_err();
        assert!(restarted(&e), "{e}");
        let e = smm.barrier(0, 1, Duration::from_secs(5)).unwrap_err();
        assert!(restarted(&e), "{e}");
        assert!(smm.fatal().is_some());
    }

    #[test]
    fn a_restart_during_the_start_barrier_is_fatal() {
        let topo = Arc::new(Topology::line(1, 1).unwrap());
        let mut reset = Vec::new();
        EopMarker {
            ts: Pulse::new(3),
            reset: true,
            ..Default::default()
        }
        .encode(&mut reset);
        let mut smm = Smm::new(node(&topo), Script([reset].into_iter().collect()));
        // The barrier's marker went with the old generation: it would never complete.
        let e = smm.barrier(0, 1, Duration::from_secs(5)).unwrap_err();
        let restarted = SmmError::Restarted { ts: 0, drained: 3 };
        assert_eq!(e, WaitError::Smm(restarted.clone()));
        assert_eq!(smm.fatal(), Some(&restarted));
    }

    use crate::testkit::block_on;

    #[test]
    fn async_read_resolves_while_a_pump_moves_packets() {
        let topo = Arc::new(Topology::line(1, 1).unwrap());
        let (_cluster, mut link) = cluster(&topo);
        let smm = SharedSmm::new(node(&topo));
        // The barrier needs the pump to reach the SIU and back; the local read resolves at once.
        let r = smm.with(|n| {
            n.barrier_start(1, 1).unwrap();
            let mut iso = n.isochron();
            iso.write(Addr::new(0, 2), Width::W32, 5).unwrap();
            let r = iso.read(Addr::new(0, 2), Width::W32).unwrap();
            iso.end().unwrap();
            r
        });
        let pump_smm = smm.clone();
        let done = Arc::new(AtomicBool::new(false));
        let pump_done = done.clone();
        let pump = std::thread::spawn(move || {
            while !pump_done.load(Ordering::Relaxed) {
                while let Some(p) = pump_smm.poll_siu() {
                    link.send(p).unwrap();
                }
                if let Some(p) = link.recv(Duration::from_millis(5)).unwrap() {
                    let _ = pump_smm.handle_siu(&p);
                }
            }
        });
        assert_eq!(block_on(smm.read(r)), Ok(5));
        while !smm.with(|n| n.barrier_done(1)) {
            std::thread::sleep(Duration::from_millis(1));
        }
        done.store(true, Ordering::Relaxed);
        pump.join().unwrap();
        assert_eq!(block_on(smm.read(r)), Err(SmmError::UnknownRead));
    }
}
