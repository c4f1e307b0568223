//! Ways to wait for reads and barriers: a blocking [`Smm`] over any [`SiuLink`], and a
//! runtime-agnostic [`SharedSmm`] whose [`SharedSmm::read`] is a `Future` (works under tokio or
//! any executor) while a pump task moves packets.
//!
//! [`SmmNode::read_value`] is the single-threaded `poll`: it never blocks; a driver calls
//! [`SmmNode::handle_siu`] and [`SmmNode::poll_siu`] between checks.

use crate::{ReadHandle, SmmError, SmmNode};
use isotach_proto::packet::{self, EopMarker, IsochronMarker, IsotachMessage, Kind};
use std::collections::VecDeque;
use std::time::{Duration, Instant};
use thiserror::Error;

mod shared;
pub use shared::SharedSmm;

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
    /// A spare packet buffer the link holds (empty), for the node to build its next packets in:
    /// what the node sends then comes back to it through the link instead of each packet
    /// being a new allocation. `None` by default.
    fn take_spare(&mut self) -> Option<Vec<u8>> {
        None
    }
    /// Why the link to the SIU broke since it was set up (the SIU restarted, or the transport
    /// gave up on it), if it did: logical time does not go on across it. `None` by default.
    fn broken(&mut self) -> Option<String> {
        None
    }
    /// The SIU holds its token until the application has answered what it was just handed
    /// (an SIU on the application's thread: an EOP or a reply started the application's
    /// turn). [`Smm::poll`] returns then, so that what the application issues in answer
    /// leaves with that token. `false` by default.
    fn in_host_turn(&self) -> bool {
        false
    }
    /// The application had its turn: send what it issued and the token held for it. Does
    /// nothing by default (or outside a turn).
    fn end_host_turn(&mut self) -> Result<(), LinkError> {
        Ok(())
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
        let Some(p) = self.held.hold_if_behind(p) else {
            return Ok(!self.held.full());
        };
        if let Some(refused) = self.offer(p)? {
            self.held.push_front(refused);
        }
        Ok(!self.held.full())
    }

    /// The node's verdict: `Some(p)` when it refused `p` for a limit.
    fn offer(&mut self, p: Vec<u8>) -> Result<Option<Vec<u8>>, SmmError> {
        match self.node.handle_siu(&p) {
            Ok(()) | Err(SmmError::BadInput(_)) => {
                // The node builds its next packets in it; what it does not keep, the link
                // receives into.
                if let Some(p) = self.node.buffers().give(p) {
                    self.link.recycle(p);
                }
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
    ///
    /// With an SIU on the application's thread (an embedded SIU) a poll is the application's
    /// turn: it ends the turn the last poll left open — what the application issued since
    /// leaves with the token its SIU held for it — and it stops receiving once the SIU holds
    /// its next token for the application (an EOP or a reply was handed over). So an
    /// application that answers an EOP between two polls has its answer stamped in that
    /// turn, a pulse sooner than after the token (`docs/design.md`, "Host turns"); a poll
    /// that ended the turn itself would leave every answer for the next pulse.
    pub fn poll(&mut self) -> Result<usize, WaitError> {
        self.check_fatal()?;
        self.flush()?;
        self.link.end_host_turn()?;
        let mut handled = 0;
        if self.retry_held()? {
            let mut room = true;
            while room && !self.link.in_host_turn() {
                let Some(p) = self.link.recv(Duration::ZERO)? else {
                    break;
                };
                handled += 1;
                room = self.feed(p)?;
            }
            if room {
                // The rest of what the turn's pass brought, without I/O.
                handled += self.feed_held_by_link()?;
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
            // The node built packets: top its buffers up from the link's spares.
            if let Some(b) = self.node.buffers().refill(|| self.link.take_spare()) {
                self.link.recycle(b);
            }
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
    /// the held input fills. Returns the packets fed.
    fn feed_held_by_link(&mut self) -> Result<usize, SmmError> {
        let mut fed = 0;
        while fed < FEED_BATCH_MAX {
            let Some(p) = self.link.try_recv() else { break };
            fed += 1;
            if !self.feed(p)? {
                break;
            }
        }
        Ok(fed)
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
    /// The lowest pulse held, kept as packets come in so that deciding whether the next one
    /// must wait decodes one packet, not the whole queue (a full queue would otherwise cost
    /// `HELD_MAX`² decodes to fill). `None` after a pop: found again when next asked.
    low: Option<Option<u64>>,
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
    fn low(&mut self) -> Option<u64> {
        *self
            .low
            .get_or_insert_with(|| self.queue.iter().filter_map(|p| Self::pulse(p)).min())
    }

    /// `p` joins the queue: the lowest pulse, if known, stays known.
    fn joins(&mut self, p: &[u8]) {
        if let Some(known) = &mut self.low {
            *known = match (*known, Self::pulse(p)) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
    }

    /// Holds `p` when it must wait behind what is held (the same or a later pulse than
    /// something held); hands it back when it may go to the node.
    pub(crate) fn hold_if_behind(&mut self, p: Vec<u8>) -> Option<Vec<u8>> {
        // Nothing held (the common case): no packet is decoded here.
        if self.queue.is_empty() {
            return Some(p);
        }
        match (self.low(), Self::pulse(&p)) {
            // Not below the lowest pulse held, so the lowest stays what it is.
            (Some(low), Some(t)) if t >= low => {
                self.queue.push_back(p);
                None
            }
            _ => Some(p),
        }
    }

    pub(crate) fn push_front(&mut self, p: Vec<u8>) {
        self.joins(&p);
        self.queue.push_front(p);
    }

    pub(crate) fn pop_front(&mut self) -> Option<Vec<u8>> {
        let p = self.queue.pop_front();
        if p.is_some() {
            // It may have been the lowest.
            self.low = None;
        }
        p
    }

    pub(crate) fn full(&self) -> bool {
        self.queue.len() >= HELD_MAX
    }
}

#[cfg(test)]
mod tests;
