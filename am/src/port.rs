//! Packet links for the Isotach daemons: a reliable, per-peer FIFO packet service over one
//! bundle, with a hello handshake.
//!
//! A [`PacketPort`] owns one [`Bundle`] with one endpoint and a fixed list of peers (the
//! addresses the cluster configuration names). It carries opaque packets of up to
//! [`PacketPort::PACKET_MAX`] bytes:
//! - every peer has per-peer FIFO delivery on (`set_fifo`), so packets arrive exactly once and
//!   in send order — what the SIU↔TM and TM↔TM links of `docs/design.md` assume;
//! - a packet longer than a medium message travels as consecutive medium fragments (argument
//!   word 0 says "more follows"; word 1 names the stream — how often the link broke — so a
//!   fragment that comes back from an earlier stream does not break the current one); FIFO
//!   delivery makes reassembly a concatenation;
//! - a peer is *up* once it answered our hello. Packets for a peer that is not up wait in the
//!   port (in order) and leave when it is: daemons may start in any order;
//! - a link *breaks* when a data fragment comes back undelivered (the AM layer gave up, or the
//!   peer restarted and refused it), when the peer says hello from a new incarnation (it
//!   restarted and forgot the stream), or when a queue overflowed. The port then reports
//!   [`PortEvent::PeerLost`], drops what it had queued for the peer (the stream has a hole:
//!   sending the rest would pretend it has not), marks the peer down and says hello again;
//!   [`PortEvent::PeerUp`] follows when the peer answers. What a broken stream means above the
//!   port (a new logical-time generation) is the daemons' business;
//! - flow control end to end: a port sends a peer at most a *window* of fragments the peer's
//!   driver has not yet taken with [`PacketPort::recv`]; the receiving port returns credit (a
//!   short message) as its driver takes packets. So a driver that stops reading stops its
//!   peers' ports after one window each, their queues fill, and their drivers see
//!   [`PacketPort::has_room`] turn false: back-pressure reaches the sending state machine
//!   without loss. Hellos and credit bypass the inbox, so a port that is not being read still
//!   answers them;
//! - every send queue is bounded by [`PacketPort::set_queue_max`] fragments per peer (the
//!   window is the same, within [`PacketPort::WINDOW_MIN`]..=[`PacketPort::WINDOW_MAX`]); the
//!   inbox holds at most every peer's largest window. A packet sent anyway to a full queue, or
//!   arriving beyond that (a misbehaving peer), is dropped, counted and breaks the link;
//! - packets from addresses that are not configured peers, and messages with a foreign tag,
//!   are dropped and counted ([`PortStats`]).
//!
//! The port does no I/O of its own beyond the bundle's: a driver calls [`PacketPort::poll`],
//! takes packets with [`PacketPort::recv`], queues packets with [`PacketPort::send`], and
//! blocks in [`PacketPort::wait`] (threads) or [`PacketPort::wait_async`] (tokio).

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::AmError;
use crate::Config;
use crate::bundle::Bundle;
use crate::transport::Transport;
use crate::{EndpointName, EpId, HandlerId, MAX_MEDIUM_BYTES, NodeAddr, Status, Tag, TransIdx};

/// Handler of a data fragment (request, medium; `args[0]` = 1 when more fragments follow).
const H_DATA: HandlerId = HandlerId(1);
/// Handler of a hello (request, short; `args[0]` = the cluster tag).
const H_HELLO: HandlerId = HandlerId(2);
/// Handler of the hello's answer (reply, short).
const H_HELLO_ACK: HandlerId = HandlerId(3);
/// Handler of returned credit (request, short; `args[0]` = fragments the driver took).
const H_CREDIT: HandlerId = HandlerId(4);
/// The endpoint every port uses (the first one a bundle allocates).
const PORT_EP: EpId = EpId(0);
/// The tag of Isotach cluster traffic when the configuration names none.
pub const DEFAULT_TAG: Tag = Tag(0x1507_AC40_0000_0001);

/// Why a link broke (see [`PortEvent::PeerLost`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LossReason {
    /// A data fragment came back undelivered with this status (`Unreachable`: the AM layer
    /// gave up after its give-up time, or the peer restarted and refused it).
    Returned(Status),
    /// The peer said hello from a new incarnation: it restarted.
    Restarted,
    /// Our queue towards the peer was full and a packet was dropped.
    SendOverflow,
    /// Our inbox was full and a packet from the peer was dropped.
    InboxOverflow,
}

/// Something a driver should know about its peers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortEvent {
    /// The peer answered our hello: packets flow (again, after a [`PortEvent::PeerLost`]).
    PeerUp(usize),
    /// The link to the peer broke: the peer is down until it answers a new hello.
    PeerLost {
        /// The peer.
        peer: usize,
        /// Why.
        reason: LossReason,
        /// Fragments that were queued for the peer and are dropped.
        dropped: usize,
    },
    /// A hello to the peer came back unanswered (it is not there yet); the port keeps
    /// trying.
    HelloReturned {
        /// The peer.
        peer: usize,
        /// Why.
        status: Status,
    },
}

/// What [`PacketPort::offer`] did with a packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Offered {
    /// Queued for the peer.
    Sent,
    /// The peer's queue was full and the packet was redundant: dropped.
    Dropped,
    /// The peer's queue was full: the packet is handed back for the driver to hold (and to
    /// offer again before anything after it).
    Held(Vec<u8>),
}

/// Counters of one port.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PortStats {
    /// Packets handed to [`PacketPort::send`].
    pub packets_sent: u64,
    /// Packets received whole.
    pub packets_received: u64,
    /// Messages from addresses that are not configured peers (dropped).
    pub unknown_peer: u64,
    /// Reassembled packets over [`PacketPort::PACKET_MAX`] (dropped).
    pub oversize: u64,
    /// Data fragments returned undelivered (lost).
    pub fragments_lost: u64,
    /// Hellos sent.
    pub hellos: u64,
    /// Times a link broke (see [`PortEvent::PeerLost`]).
    pub links_lost: u64,
    /// Fragments dropped because a link broke or a queue was full.
    pub fragments_dropped: u64,
    /// Packets dropped because the inbox was full.
    pub inbox_overflow: u64,
}

#[derive(Debug, Default)]
struct Inbox {
    /// Whole packets: (peer, bytes, fragments it took).
    packets: VecDeque<(usize, Vec<u8>, usize)>,
    partial: Vec<Vec<u8>>,
    /// Fragments of each peer's partial packet.
    partial_frags: Vec<usize>,
    /// Credit returned by peers (consumed by `poll`).
    credited: Vec<(usize, usize)>,
    events: VecDeque<PortEvent>,
    /// Peers whose hello answer arrived (consumed by `poll`).
    acked: Vec<usize>,
    /// Peers whose hello came back (consumed by `poll`).
    hello_failed: Vec<usize>,
    /// Links broken inside a handler (consumed by `poll`).
    broken: Vec<(usize, LossReason)>,
    /// Each peer's incarnation, from its hellos (0: none seen yet).
    incarnations: Vec<u64>,
    /// Each peer's stream: how often its link broke. Data fragments carry it (argument 1),
    /// so one that comes back from an earlier stream (sent to a previous incarnation) does
    /// not break the current one.
    streams: Vec<u64>,
    /// Most packets the inbox holds.
    packets_max: usize,
    stats: PortStats,
}

impl Inbox {
    /// Records a broken link once per poll.
    fn break_link(&mut self, peer: usize, reason: LossReason) {
        if !self.broken.iter().any(|&(p, _)| p == peer) {
            self.broken.push((peer, reason));
        }
    }
}

/// One peer's state, for status displays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerStatus {
    /// Its address.
    pub addr: NodeAddr,
    /// It answered our last hello and no loss happened since.
    pub up: bool,
    /// Fragments queued towards it.
    pub queued: usize,
    /// Times its link broke.
    pub links_lost: u64,
}

#[derive(Debug)]
struct Peer {
    addr: NodeAddr,
    idx: TransIdx,
    up: bool,
    links_lost: u64,
    hello_outstanding: bool,
    /// Fragments waiting for credit: (bytes, more follows).
    out: VecDeque<(Vec<u8>, bool)>,
    /// Fragments sent that the peer's driver has not taken yet (as far as we know).
    in_flight: usize,
    /// Fragments of this peer's we took and have not credited back yet.
    owed: usize,
}

/// A reliable FIFO packet service to a fixed set of peers. See the module documentation.
#[derive(Debug)]
pub struct PacketPort<T: Transport> {
    bundle: Bundle<T>,
    peers: Vec<Peer>,
    inbox: Arc<Mutex<Inbox>>,
    tag: Tag,
    /// Most fragments queued towards one peer.
    queue_max: usize,
}

fn lock(inbox: &Mutex<Inbox>) -> MutexGuard<'_, Inbox> {
    inbox.lock().unwrap_or_else(|p| p.into_inner())
}

impl<T: Transport> PacketPort<T> {
    /// Largest packet the port carries (a bigger one is refused at [`PacketPort::send`]).
    pub const PACKET_MAX: usize = 64 * 1024;
    /// Default of [`PacketPort::set_queue_max`].
    pub const QUEUE_MAX_DEFAULT: usize = 65_536;
    /// Largest flow-control window (fragments in flight towards one peer).
    pub const WINDOW_MAX: usize = 1024;
    /// Smallest window: the fragments of the largest packet (credit is returned per whole
    /// packet taken, so a smaller window could never complete one).
    pub const WINDOW_MIN: usize = Self::PACKET_MAX / MAX_MEDIUM_BYTES + 1;
    /// Fragments taken before credit goes back (a quarter of [`Self::WINDOW_MIN`]).
    const CREDIT_BATCH: usize = Self::WINDOW_MIN / 4;

    /// AM settings for a port: full credits (64 outstanding fragments per peer), otherwise
    /// the defaults.
    pub fn am_config() -> Config {
        Config {
            credits: crate::MAX_SLOTS,
            ..Config::default()
        }
    }

    /// A port over `transport` talking to `peers` (index = peer id), tagged `tag`.
    pub fn new(transport: T, peers: &[NodeAddr], tag: Tag) -> Result<Self, AmError> {
        let mut bundle = Bundle::new(transport, Self::am_config())?;
        let ep = bundle.alloc_endpoint()?;
        debug_assert_eq!(ep, PORT_EP);
        bundle.set_tag(ep, tag)?;
        if peers.len() + 1 > crate::DEFAULT_TRANSLATIONS {
            bundle.set_num_translations(ep, peers.len() + 1)?;
        }
        let inbox = Arc::new(Mutex::new(Inbox {
            partial: vec![Vec::new(); peers.len()],
            partial_frags: vec![0; peers.len()],
            incarnations: vec![0; peers.len()],
            streams: vec![0; peers.len()],
            packets_max: Self::inbox_max(peers.len()),
            ..Inbox::default()
        }));
        let by_addr: Arc<HashMap<NodeAddr, usize>> =
            Arc::new(peers.iter().enumerate().map(|(i, a)| (*a, i)).collect());
        let (ib, map) = (Arc::clone(&inbox), Arc::clone(&by_addr));
        bundle.set_request_handler(ep, H_DATA, move |req| {
            let mut ib = lock(&ib);
            let Some(&peer) = map.get(&req.source().node) else {
                ib.stats.unknown_peer += 1;
                return;
            };
            let more = req.args().first().copied().unwrap_or(0) != 0;
            let ib = &mut *ib;
            let partial = &mut ib.partial[peer];
            if partial.len() + req.data().len() > Self::PACKET_MAX {
                partial.clear();
                ib.stats.oversize += 1;
                return;
            }
            partial.extend_from_slice(req.data());
            ib.partial_frags[peer] += 1;
            if !more {
                let packet = std::mem::take(partial);
                let frags = std::mem::take(&mut ib.partial_frags[peer]);
                if ib.packets.len() >= ib.packets_max {
                    // More than the peers' windows allow: a misbehaving peer. Drop rather
                    // than grow, and say so.
                    ib.stats.inbox_overflow += 1;
                    ib.break_link(peer, LossReason::InboxOverflow);
                    return;
                }
                ib.packets.push_back((peer, packet, frags));
                ib.stats.packets_received += 1;
            }
        })?;
        let (ib, map) = (Arc::clone(&inbox), Arc::clone(&by_addr));
        bundle.set_request_handler(ep, H_CREDIT, move |req| {
            let mut ib = lock(&ib);
            let Some(&peer) = map.get(&req.source().node) else {
                ib.stats.unknown_peer += 1;
                return;
            };
            let n = req.args().first().copied().unwrap_or(0);
            let n = usize::try_from(n).unwrap_or(usize::MAX);
            ib.credited.push((peer, n));
        })?;
        let (ib, map) = (Arc::clone(&inbox), Arc::clone(&by_addr));
        bundle.set_request_handler(ep, H_HELLO, move |req| {
            let Some(&peer) = map.get(&req.source().node) else {
                lock(&ib).stats.unknown_peer += 1;
                return;
            };
            // args: [tag, incarnation]. A new incarnation means the peer restarted.
            let inc = req.args().get(1).copied().unwrap_or(0);
            {
                let mut ib = lock(&ib);
                let known = ib.incarnations[peer];
                if inc != 0 && known != inc {
                    ib.incarnations[peer] = inc;
                    if known != 0 {
                        ib.break_link(peer, LossReason::Restarted);
                    }
                }
            }
            let _ = req.reply_short(H_HELLO_ACK, &[]);
        })?;
        let (ib, map) = (Arc::clone(&inbox), Arc::clone(&by_addr));
        bundle.set_reply_handler(ep, H_HELLO_ACK, move |rep| {
            if let Some(&peer) = map.get(&rep.source().node) {
                lock(&ib).acked.push(peer);
            }
        })?;
        let (ib, map) = (Arc::clone(&inbox), by_addr);
        bundle.set_return_handler(ep, move |r| {
            let Some(&peer) = map.get(&r.dest.node) else {
                return;
            };
            let mut ib = lock(&ib);
            if r.handler == H_DATA {
                ib.stats.fragments_lost += 1;
                if r.nargs >= 2 && r.args[1] != ib.streams[peer] {
                    // Sent on a stream that already broke: nothing more to lose.
                    return;
                }
                ib.break_link(peer, LossReason::Returned(r.status));
            } else if r.handler == H_CREDIT {
                // The peer is gone; its data will be lost too and break the link.
            } else {
                ib.hello_failed.push(peer);
                ib.events.push_back(PortEvent::HelloReturned {
                    peer,
                    status: r.status,
                });
            }
        })?;
        let mut ps = Vec::with_capacity(peers.len());
        for &addr in peers {
            let idx = bundle.map_any(
                ep,
                EndpointName {
                    node: addr,
                    ep: PORT_EP,
                },
                tag,
            )?;
            bundle.set_fifo(addr, true)?;
            ps.push(Peer {
                addr,
                idx,
                in_flight: 0,
                owed: 0,
                up: false,
                links_lost: 0,
                hello_outstanding: false,
                out: VecDeque::new(),
            });
        }
        Ok(Self {
            bundle,
            peers: ps,
            inbox,
            tag,
            queue_max: Self::QUEUE_MAX_DEFAULT,
        })
    }

    /// Bounds every per-peer send queue to `fragments` (at least 1), and the window to the
    /// same (within [`Self::WINDOW_MIN`]..=[`Self::WINDOW_MAX`]); the cluster config's
    /// `queue-packets-max` is the daemons' value.
    pub fn set_queue_max(&mut self, fragments: usize) {
        self.queue_max = fragments.max(1);
    }

    /// The flow-control window: fragments in flight towards one peer.
    fn window(&self) -> usize {
        self.queue_max.clamp(Self::WINDOW_MIN, Self::WINDOW_MAX)
    }

    /// Whole packets the inbox holds: every peer's largest window, which well-behaved peers
    /// never exceed whatever their own `queue-packets-max`.
    fn inbox_max(peers: usize) -> usize {
        peers.max(1) * Self::WINDOW_MAX + 64
    }

    /// Can `peer` take another packet of up to a medium message without overflowing its
    /// queue? A driver holds its output back while this is false (back-pressure).
    pub fn has_room(&self, peer: usize) -> bool {
        self.peers
            .get(peer)
            .is_some_and(|p| p.out.len() < self.queue_max)
    }

    /// This port's transport address.
    pub fn local_addr(&self) -> NodeAddr {
        self.bundle.local_addr()
    }

    /// The tag of this port's traffic.
    pub fn tag(&self) -> Tag {
        self.tag
    }

    /// The configured peers' addresses, by peer id.
    pub fn peer_addrs(&self) -> impl Iterator<Item = NodeAddr> + '_ {
        self.peers.iter().map(|p| p.addr)
    }

    /// Has the peer answered our hello?
    pub fn is_up(&self, peer: usize) -> bool {
        self.peers.get(peer).is_some_and(|p| p.up)
    }

    /// How many peers are up.
    pub fn peers_up(&self) -> usize {
        self.peers.iter().filter(|p| p.up).count()
    }

    /// Are all peers up?
    pub fn all_up(&self) -> bool {
        self.peers.iter().all(|p| p.up)
    }

    /// Fragments waiting for a peer to come up or for credit, all peers.
    pub fn queued(&self) -> usize {
        self.peers.iter().map(|p| p.out.len()).sum()
    }

    /// Every peer's state, by peer id.
    pub fn peer_status(&self) -> Vec<PeerStatus> {
        self.peers
            .iter()
            .map(|p| PeerStatus {
                addr: p.addr,
                up: p.up,
                queued: p.out.len(),
                links_lost: p.links_lost,
            })
            .collect()
    }

    /// Counters.
    pub fn stats(&self) -> PortStats {
        lock(&self.inbox).stats
    }

    /// The underlying bundle (AM statistics).
    pub fn bundle(&self) -> &Bundle<T> {
        &self.bundle
    }

    /// Queues `packet` for `peer` (in order after everything queued before). It leaves at the
    /// next [`PacketPort::poll`] (or now, if there is credit and the peer is up).
    pub fn send(&mut self, peer: usize, packet: &[u8]) -> Result<(), AmError> {
        if packet.len() > Self::PACKET_MAX {
            return Err(AmError::BadArg("packet over PacketPort::PACKET_MAX"));
        }
        let p = self
            .peers
            .get_mut(peer)
            .ok_or(AmError::BadArg("no such peer"))?;
        let fragments = packet.len().div_ceil(MAX_MEDIUM_BYTES).max(1);
        if p.out.len() + fragments > self.queue_max {
            let mut ib = lock(&self.inbox);
            ib.stats.fragments_dropped += fragments as u64;
            ib.break_link(peer, LossReason::SendOverflow);
            return Ok(());
        }
        let mut chunks = packet.chunks(MAX_MEDIUM_BYTES).peekable();
        if packet.is_empty() {
            p.out.push_back((Vec::new(), false));
        }
        while let Some(c) = chunks.next() {
            p.out.push_back((c.to_vec(), chunks.peek().is_some()));
        }
        lock(&self.inbox).stats.packets_sent += 1;
        Ok(())
    }

    /// Sends `packet` to `peer` if its queue has room. Otherwise the packet is dropped when
    /// `redundant(packet)` says a copy of it is already on its way (a repeat token), or handed
    /// back to be held: the driver's back-pressure.
    pub fn offer(
        &mut self,
        peer: usize,
        packet: Vec<u8>,
        redundant: impl FnOnce(&[u8]) -> bool,
    ) -> Result<Offered, AmError> {
        if self.has_room(peer) {
            self.send(peer, &packet)?;
            Ok(Offered::Sent)
        } else if redundant(&packet) {
            Ok(Offered::Dropped)
        } else {
            Ok(Offered::Held(packet))
        }
    }

    /// The next received packet and the peer it came from.
    pub fn recv(&mut self) -> Option<(usize, Vec<u8>)> {
        self.recv_where(|_| true)
    }

    /// The next received packet from a peer `accept` admits, and that peer. Packets of other
    /// peers stay in the inbox, in order: a driver that cannot take more from one peer (its
    /// application, say) still takes packets from the others. Each peer's packets still come
    /// in order.
    pub fn recv_where(&mut self, accept: impl Fn(usize) -> bool) -> Option<(usize, Vec<u8>)> {
        let (peer, packet, frags) = {
            let mut ib = lock(&self.inbox);
            let i = ib.packets.iter().position(|(p, _, _)| accept(*p))?;
            ib.packets.remove(i)?
        };
        // Credit goes back at the next push.
        self.peers[peer].owed += frags;
        Some((peer, packet))
    }

    /// The next peer event.
    pub fn take_event(&mut self) -> Option<PortEvent> {
        lock(&self.inbox).events.pop_front()
    }

    /// Runs the bundle (timers, arrivals, handlers), sends hellos and queued fragments as
    /// credit allows. Never blocks. Returns the AM messages handled.
    pub fn poll(&mut self) -> Result<usize, AmError> {
        let mut handled = 0;
        for _ in 0..16 {
            let n = self.bundle.poll()?;
            handled += n;
            self.absorb();
            let sent = self.push()?;
            if n == 0 && sent == 0 {
                break;
            }
        }
        Ok(handled)
    }

    /// Takes hello outcomes and broken links out of the inbox.
    fn absorb(&mut self) {
        let (acked, failed, broken, credited) = {
            let mut ib = lock(&self.inbox);
            (
                std::mem::take(&mut ib.acked),
                std::mem::take(&mut ib.hello_failed),
                std::mem::take(&mut ib.broken),
                std::mem::take(&mut ib.credited),
            )
        };
        for (peer, n) in credited {
            let p = &mut self.peers[peer];
            p.in_flight = p.in_flight.saturating_sub(n);
        }
        for peer in failed {
            self.peers[peer].hello_outstanding = false;
        }
        for (peer, reason) in broken {
            self.break_link(peer, reason);
        }
        for peer in acked {
            let p = &mut self.peers[peer];
            p.hello_outstanding = false;
            if !p.up {
                p.up = true;
                lock(&self.inbox).events.push_back(PortEvent::PeerUp(peer));
            }
        }
    }

    /// The link to `peer` broke: drop its queue and half-assembled packet, mark it down (a
    /// new hello goes out at the next push) and tell the driver.
    fn break_link(&mut self, peer: usize, reason: LossReason) {
        let p = &mut self.peers[peer];
        let dropped = p.out.len();
        p.out.clear();
        p.up = false;
        p.links_lost += 1;
        // A new stream starts with a fresh window on both sides.
        p.in_flight = 0;
        p.owed = 0;
        let mut ib = lock(&self.inbox);
        ib.streams[peer] = p.links_lost;
        ib.partial[peer].clear();
        ib.partial_frags[peer] = 0;
        ib.stats.links_lost += 1;
        ib.stats.fragments_dropped += dropped as u64;
        ib.events.push_back(PortEvent::PeerLost {
            peer,
            reason,
            dropped,
        });
    }

    /// Sends hellos and queued fragments; returns the messages sent.
    fn push(&mut self) -> Result<usize, AmError> {
        let mut sent = 0;
        let inc = self.bundle.core().incarnation();
        let window = self.window();
        for p in &mut self.peers {
            if !p.up {
                if !p.hello_outstanding {
                    match self
                        .bundle
                        .try_request_short(PORT_EP, p.idx, H_HELLO, &[self.tag.0, inc])
                    {
                        Ok(()) => {
                            p.hello_outstanding = true;
                            sent += 1;
                            lock(&self.inbox).stats.hellos += 1;
                        }
                        Err(AmError::WouldBlock) => {}
                        Err(e) => return Err(e),
                    }
                }
                continue;
            }
            // Credit in batches of a quarter of the smallest window any sender may use: a
            // sender that used its whole window has sent us at least that much, which our
            // driver takes, so it never waits on us for long; batching keeps credit to one
            // short message per CREDIT_BATCH fragments.
            if p.owed >= Self::CREDIT_BATCH {
                match self
                    .bundle
                    .try_request_short(PORT_EP, p.idx, H_CREDIT, &[p.owed as u64])
                {
                    Ok(()) => {
                        p.owed = 0;
                        sent += 1;
                    }
                    Err(AmError::WouldBlock) => {}
                    Err(e) => return Err(e),
                }
            }
            while let Some((bytes, more)) = p.out.front() {
                if p.in_flight >= window {
                    break;
                }
                match self.bundle.try_request_medium(
                    PORT_EP,
                    p.idx,
                    H_DATA,
                    bytes,
                    &[u64::from(*more), p.links_lost],
                ) {
                    Ok(()) => {
                        p.out.pop_front();
                        p.in_flight += 1;
                        sent += 1;
                    }
                    Err(AmError::WouldBlock) => break,
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(sent)
    }

    /// Blocks until something arrived or `timeout` passed (retransmission timers keep
    /// running). Call [`PacketPort::poll`] next.
    pub fn wait(&mut self, timeout: Duration) -> Result<bool, AmError> {
        if !lock(&self.inbox).packets.is_empty() {
            return Ok(true);
        }
        self.bundle.wait(timeout)
    }

    /// The async form of [`PacketPort::wait`] (tokio readiness for the UDP backend).
    pub async fn wait_async(&mut self, timeout: Duration) -> Result<bool, AmError> {
        if !lock(&self.inbox).packets.is_empty() {
            return Ok(true);
        }
        self.bundle.wait_async(timeout).await
    }

    /// Fragments sent to `peer` that its driver has not taken yet, as far as credit tells.
    pub fn in_flight(&self, peer: usize) -> usize {
        self.peers.get(peer).map_or(0, |p| p.in_flight)
    }
}

/// Why a daemon built around a port could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The configuration lacks something the daemon needs.
    #[error("config: {0}")]
    Config(String),
    /// The transport failed.
    #[error("transport: {0}")]
    Am(#[from] AmError),
}

/// Driver passes between explicit yields to the runtime (a yield per pass costs throughput).
const YIELD_EVERY: u32 = 16;

/// A daemon around one [`PacketPort`], as [`drive`] runs it: a pass that never blocks, how
/// long it may wait, and whether it is waiting on itself rather than on the network.
pub trait Driver {
    /// The port's transport.
    type Transport: Transport;
    /// One pass: arrivals in, timers, output out. Never blocks.
    fn step(&mut self) -> Result<(), DaemonError>;
    /// Longest wait before the next pass (the state machine's next timer).
    fn wait_time(&self) -> Duration;
    /// Is the driver waiting on itself (held input, stalled output) rather than on the
    /// network? Then it sleeps: unread arrivals may already wait in the port, and waiting
    /// for arrivals would return at once, forever.
    fn blocked(&self) -> bool;
    /// The port.
    fn port_mut(&mut self) -> &mut PacketPort<Self::Transport>;
}

/// Runs `driver` until `shutdown` completes: a pass, then a wait for arrivals (or a sleep
/// when blocked), with a yield to the runtime every `YIELD_EVERY` (16) passes so that other
/// tasks on it (the admin service) run even under a steady stream.
pub async fn drive<D: Driver>(
    driver: &mut D,
    shutdown: impl Future<Output = ()>,
) -> Result<(), DaemonError> {
    let mut shutdown = std::pin::pin!(shutdown);
    let mut passes = 0u32;
    loop {
        driver.step()?;
        let timeout = driver.wait_time();
        if driver.blocked() {
            tokio::select! {
                biased;
                () = &mut shutdown => return Ok(()),
                () = tokio::time::sleep(timeout) => {}
            }
        } else {
            tokio::select! {
                biased;
                () = &mut shutdown => return Ok(()),
                r = driver.port_mut().wait_async(timeout) => { r?; }
            }
        }
        passes = passes.wrapping_add(1);
        if passes.is_multiple_of(YIELD_EVERY) {
            tokio::task::yield_now().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::udp::UdpTransport;

    fn pair() -> (PacketPort<UdpTransport>, PacketPort<UdpTransport>) {
        let a = UdpTransport::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let b = UdpTransport::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let (aa, ba) = (a.local_addr(), b.local_addr());
        let a = PacketPort::new(a, &[ba], DEFAULT_TAG).unwrap();
        let b = PacketPort::new(b, &[aa], DEFAULT_TAG).unwrap();
        (a, b)
    }

    #[test]
    fn packets_arrive_whole_and_in_order() {
        let (mut a, mut b) = pair();
        let packets: Vec<Vec<u8>> = (0..200u32)
            .map(|i| {
                let len = (i as usize * 37) % 5000;
                (0..len).map(|j| (i as usize + j) as u8).collect()
            })
            .collect();
        for p in &packets {
            a.send(0, p).unwrap();
        }
        let mut got = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while got.len() < packets.len() {
            assert!(std::time::Instant::now() < deadline, "liveness guard");
            a.poll().unwrap();
            b.poll().unwrap();
            while let Some((peer, p)) = b.recv() {
                assert_eq!(peer, 0);
                got.push(p);
            }
            a.wait(Duration::from_millis(1)).unwrap();
        }
        assert_eq!(got, packets);
        assert!(a.is_up(0));
        assert_eq!(a.take_event(), Some(PortEvent::PeerUp(0)));
        assert_eq!(b.stats().packets_received, 200);
    }

    #[test]
    fn unknown_senders_are_dropped() {
        let (mut a, _b) = pair();
        let c = UdpTransport::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let mut c = PacketPort::new(c, &[a.local_addr()], DEFAULT_TAG).unwrap();
        c.send(0, b"hi").unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while a.stats().unknown_peer == 0 {
            assert!(std::time::Instant::now() < deadline, "liveness guard");
            c.poll().unwrap();
            a.poll().unwrap();
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(!c.is_up(0));
        assert_eq!(a.recv(), None);
    }

    /// Polls both ports until `done` holds (a liveness guard, not a timed assertion).
    fn pump(
        a: &mut PacketPort<UdpTransport>,
        b: &mut PacketPort<UdpTransport>,
        mut done: impl FnMut(&mut PacketPort<UdpTransport>, &mut PacketPort<UdpTransport>) -> bool,
    ) {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !done(a, b) {
            assert!(std::time::Instant::now() < deadline, "liveness guard");
            a.poll().unwrap();
            b.poll().unwrap();
            a.wait(Duration::from_millis(1)).unwrap();
        }
    }

    fn events(p: &mut PacketPort<UdpTransport>) -> Vec<PortEvent> {
        std::iter::from_fn(|| p.take_event()).collect()
    }

    #[test]
    fn a_restarted_peer_breaks_the_link_and_comes_back() {
        let (mut a, mut b) = pair();
        a.send(0, b"before").unwrap();
        pump(&mut a, &mut b, |_, b| b.recv().is_some());
        pump(&mut a, &mut b, |a, b| a.is_up(0) && b.is_up(0));
        events(&mut a);
        // b restarts: a new process on the same address (a new incarnation).
        let b_addr = b.local_addr();
        let NodeAddr::Ip(sock) = b_addr else {
            unreachable!("UDP addresses are IP")
        };
        let a_addr = a.local_addr();
        drop(b);
        let t = UdpTransport::bind(sock).unwrap();
        let mut b = PacketPort::new(t, &[a_addr], DEFAULT_TAG).unwrap();
        let mut seen = Vec::new();
        pump(&mut a, &mut b, |a, _| {
            seen.extend(events(a));
            seen.contains(&PortEvent::PeerUp(0))
        });
        let lost = seen
            .iter()
            .position(|e| {
                matches!(
                    e,
                    PortEvent::PeerLost {
                        peer: 0,
                        reason: LossReason::Restarted,
                        ..
                    }
                )
            })
            .expect("the restart is reported");
        let up = seen
            .iter()
            .position(|e| *e == PortEvent::PeerUp(0))
            .unwrap();
        assert!(lost < up, "{seen:?}");
        assert_eq!(a.stats().links_lost, 1);
        assert_eq!(a.peer_status()[0].links_lost, 1);
        // The stream flows again, from the start.
        a.send(0, b"after").unwrap();
        let mut got = None;
        pump(&mut a, &mut b, |_, b| {
            got = b.recv();
            got.is_some()
        });
        assert_eq!(got, Some((0, b"after".to_vec())));
    }

    #[test]
    fn fragments_returned_from_a_previous_stream_do_not_break_the_new_one() {
        let (mut a, mut b) = pair();
        pump(&mut a, &mut b, |a, b| a.is_up(0) && b.is_up(0));
        events(&mut a);
        // Fragments in flight to b when it restarts come back from its new incarnation.
        for i in 0..64u32 {
            a.send(0, &i.to_be_bytes()).unwrap();
        }
        a.poll().unwrap();
        let NodeAddr::Ip(sock) = b.local_addr() else {
            unreachable!("UDP addresses are IP")
        };
        let a_addr = a.local_addr();
        drop(b);
        let mut b =
            PacketPort::new(UdpTransport::bind(sock).unwrap(), &[a_addr], DEFAULT_TAG).unwrap();
        let mut seen = Vec::new();
        pump(&mut a, &mut b, |a, _| {
            seen.extend(events(a));
            seen.contains(&PortEvent::PeerUp(0))
        });
        // The new stream carries a packet end to end; the old one's returns change nothing.
        a.send(0, b"after").unwrap();
        let mut got = None;
        pump(&mut a, &mut b, |a, b| {
            seen.extend(events(a));
            got = got.take().or_else(|| b.recv());
            got.is_some() && a.stats().fragments_lost > 0
        });
        assert_eq!(got, Some((0, b"after".to_vec())));
        let lost = seen
            .iter()
            .filter(|e| matches!(e, PortEvent::PeerLost { .. }))
            .count();
        assert_eq!(lost, 1, "{seen:?}");
        assert_eq!(a.stats().links_lost, 1);
    }

    #[test]
    fn a_full_queue_drops_and_breaks_the_link() {
        let (mut a, _b) = pair();
        a.set_queue_max(4);
        for _ in 0..4 {
            assert!(a.has_room(0));
            a.send(0, b"x").unwrap();
        }
        assert!(!a.has_room(0), "the peer is not up yet: four wait");
        a.send(0, b"one too many").unwrap();
        a.poll().unwrap();
        let ev = events(&mut a);
        assert!(
            ev.contains(&PortEvent::PeerLost {
                peer: 0,
                reason: LossReason::SendOverflow,
                dropped: 4
            }),
            "{ev:?}"
        );
        let s = a.stats();
        assert_eq!((s.links_lost, s.fragments_dropped), (1, 5));
        assert!(a.has_room(0));
    }

    #[test]
    fn flow_control_holds_the_sender_to_its_window_until_the_receiver_reads() {
        let (mut a, mut b) = pair();
        // The queue and the window: 65 fragments (the window never goes below one largest
        // packet).
        let w = PacketPort::<UdpTransport>::WINDOW_MIN;
        let packets: Vec<Vec<u8>> = (0..2 * w).map(|i| vec![i as u8; 1 + i * 7]).collect();
        a.set_queue_max(w);
        for p in &packets[..w] {
            a.send(0, p).unwrap();
        }
        // b's driver reads nothing: a stops after its window.
        pump(&mut a, &mut b, |a, _| a.in_flight(0) == w);
        assert_eq!(a.queued(), 0);
        for p in &packets[w..] {
            assert!(a.has_room(0));
            a.send(0, p).unwrap();
        }
        for _ in 0..200 {
            a.poll().unwrap();
            b.poll().unwrap();
        }
        assert_eq!(a.in_flight(0), w);
        assert_eq!(
            b.stats().packets_received,
            w as u64,
            "nothing beyond the window"
        );
        assert_eq!(a.queued(), w);
        assert!(
            !a.has_room(0),
            "the queue is full: back-pressure for a's driver"
        );
        // b reads: credit flows back and so does the rest, in order, nothing lost.
        let mut got = Vec::new();
        pump(&mut a, &mut b, |_, b| {
            got.extend(std::iter::from_fn(|| b.recv()).map(|(_, p)| p));
            got.len() == packets.len()
        });
        assert_eq!(got, packets);
        let (sa, sb) = (a.stats(), b.stats());
        assert_eq!((sa.links_lost, sb.links_lost, sb.inbox_overflow), (0, 0, 0));
    }

    #[test]
    fn recv_where_skips_a_peer_and_keeps_each_peers_order() {
        let a = UdpTransport::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let b = UdpTransport::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let c = UdpTransport::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let (aa, ba, ca) = (a.local_addr(), b.local_addr(), c.local_addr());
        let mut a = PacketPort::new(a, &[ba, ca], DEFAULT_TAG).unwrap();
        let mut b = PacketPort::new(b, &[aa], DEFAULT_TAG).unwrap();
        let mut c = PacketPort::new(c, &[aa], DEFAULT_TAG).unwrap();
        for i in 0..5u8 {
            b.send(0, &[b'b', i]).unwrap();
            c.send(0, &[b'c', i]).unwrap();
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while a.stats().packets_received < 10 {
            assert!(std::time::Instant::now() < deadline, "liveness guard");
            for p in [&mut a, &mut b, &mut c] {
                p.poll().unwrap();
            }
            a.wait(Duration::from_millis(1)).unwrap();
        }
        // Only peer 1 (c) is admitted: b's packets stay.
        let from_c: Vec<_> = std::iter::from_fn(|| a.recv_where(|p| p == 1)).collect();
        assert_eq!(
            from_c,
            (0..5u8).map(|i| (1, vec![b'c', i])).collect::<Vec<_>>()
        );
        let rest: Vec<_> = std::iter::from_fn(|| a.recv()).collect();
        assert_eq!(
            rest,
            (0..5u8).map(|i| (0, vec![b'b', i])).collect::<Vec<_>>()
        );
    }

    #[test]
    fn offer_sends_with_room_then_drops_redundant_and_hands_back_the_rest() {
        let (mut a, _b) = pair();
        a.set_queue_max(2);
        assert_eq!(
            a.offer(0, b"one".to_vec(), |_| true).unwrap(),
            Offered::Sent
        );
        assert_eq!(
            a.offer(0, b"two".to_vec(), |_| false).unwrap(),
            Offered::Sent
        );
        // The peer is not up: both wait and the queue (2) is full.
        assert_eq!(
            a.offer(0, b"repeat".to_vec(), |p| p == b"repeat").unwrap(),
            Offered::Dropped
        );
        assert_eq!(
            a.offer(0, b"three".to_vec(), |_| false).unwrap(),
            Offered::Held(b"three".to_vec())
        );
        assert_eq!(a.queued(), 2);
        assert_eq!(a.stats().links_lost, 0, "back-pressure is not a loss");
    }
}
