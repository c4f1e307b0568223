//! Packet links for the Isotach daemons: a reliable, per-peer FIFO packet service over one
//! bundle, with a hello handshake.
//!
//! A [`PacketPort`] owns one [`Bundle`] with one endpoint and a fixed list of peers (the
//! addresses the cluster configuration names). It carries opaque packets of up to
//! [`PacketPort::PACKET_MAX`] bytes:
//! - every peer has per-peer FIFO delivery on (`set_fifo`), so packets arrive exactly once and
//!   in send order — what the SIU↔TM and TM↔TM links of `docs/design.md` assume;
//! - a packet longer than a medium message travels as consecutive medium fragments (argument
//!   word 0 says "more follows"); FIFO delivery makes reassembly a concatenation;
//! - a peer is *up* once it answered our hello. Packets for a peer that is not up wait in the
//!   port (in order) and leave when it is: daemons may start in any order;
//! - packets from addresses that are not configured peers, and messages with a foreign tag,
//!   are dropped and counted ([`PortStats`]).
//!
//! The port does no I/O of its own beyond the bundle's: a driver calls [`PacketPort::poll`],
//! takes packets with [`PacketPort::recv`], queues packets with [`PacketPort::send`], and
//! blocks in [`PacketPort::wait`] (threads) or [`PacketPort::wait_async`] (tokio).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::bundle::Bundle;
use crate::core::Config;
use crate::error::AmError;
use crate::transport::Transport;
use crate::types::{
    EndpointName, EpId, HandlerId, MAX_MEDIUM_BYTES, NodeAddr, Status, Tag, TransIdx,
};

/// Handler of a data fragment (request, medium; `args[0]` = 1 when more fragments follow).
const H_DATA: HandlerId = HandlerId(1);
/// Handler of a hello (request, short; `args[0]` = the cluster tag).
const H_HELLO: HandlerId = HandlerId(2);
/// Handler of the hello's answer (reply, short).
const H_HELLO_ACK: HandlerId = HandlerId(3);
/// The endpoint every port uses (the first one a bundle allocates).
const PORT_EP: EpId = EpId(0);
/// The tag of Isotach cluster traffic when the configuration names none.
pub const DEFAULT_TAG: Tag = Tag(0x1507_AC40_0000_0001);

/// Something a driver should know about its peers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortEvent {
    /// The peer answered our hello: packets flow.
    PeerUp(usize),
    /// A packet or hello to the peer came back undelivered (`Unreachable` after the AM
    /// give-up time, or another status). Data packets queued after it still go out once the
    /// peer answers a new hello; the returned fragment is lost and counted.
    Returned {
        /// The peer.
        peer: usize,
        /// Why.
        status: Status,
        /// A data fragment (true) or a hello (false).
        data: bool,
    },
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
}

#[derive(Debug, Default)]
struct Inbox {
    packets: VecDeque<(usize, Vec<u8>)>,
    partial: Vec<Vec<u8>>,
    events: VecDeque<PortEvent>,
    /// Peers whose hello answer arrived (consumed by `poll`).
    acked: Vec<usize>,
    /// Peers whose hello came back (consumed by `poll`).
    hello_failed: Vec<usize>,
    stats: PortStats,
}

#[derive(Debug)]
struct Peer {
    addr: NodeAddr,
    idx: TransIdx,
    up: bool,
    hello_outstanding: bool,
    /// Fragments waiting for credit: (bytes, more follows).
    out: VecDeque<(Vec<u8>, bool)>,
}

/// A reliable FIFO packet service to a fixed set of peers. See the module documentation.
#[derive(Debug)]
pub struct PacketPort<T: Transport> {
    bundle: Bundle<T>,
    peers: Vec<Peer>,
    inbox: Arc<Mutex<Inbox>>,
    tag: Tag,
}

fn lock(inbox: &Mutex<Inbox>) -> MutexGuard<'_, Inbox> {
    inbox.lock().unwrap_or_else(|p| p.into_inner())
}

impl<T: Transport> PacketPort<T> {
    /// Largest packet the port carries (a bigger one is refused at [`PacketPort::send`]).
    pub const PACKET_MAX: usize = 64 * 1024;

    /// AM settings for a port: full credits (64 outstanding fragments per peer), otherwise
    /// the defaults.
    pub fn am_config() -> Config {
        Config {
            credits: crate::types::MAX_SLOTS,
            ..Config::default()
        }
    }

    /// A port over `transport` talking to `peers` (index = peer id), tagged `tag`.
    pub fn new(transport: T, peers: &[NodeAddr], tag: Tag) -> Result<Self, AmError> {
        let mut bundle = Bundle::new(transport, Self::am_config())?;
        let ep = bundle.alloc_endpoint()?;
        debug_assert_eq!(ep, PORT_EP);
        bundle.set_tag(ep, tag)?;
        if peers.len() + 1 > crate::types::DEFAULT_TRANSLATIONS {
            bundle.set_num_translations(ep, peers.len() + 1)?;
        }
        let inbox = Arc::new(Mutex::new(Inbox {
            partial: vec![Vec::new(); peers.len()],
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
            if !more {
                let packet = std::mem::take(partial);
                ib.packets.push_back((peer, packet));
                ib.stats.packets_received += 1;
            }
        })?;
        let (ib, map) = (Arc::clone(&inbox), Arc::clone(&by_addr));
        bundle.set_request_handler(ep, H_HELLO, move |req| {
            if !map.contains_key(&req.source().node) {
                lock(&ib).stats.unknown_peer += 1;
                return;
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
            let data = r.handler == H_DATA;
            if data {
                ib.stats.fragments_lost += 1;
            } else {
                ib.hello_failed.push(peer);
            }
            ib.events.push_back(PortEvent::Returned {
                peer,
                status: r.status,
                data,
            });
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
                up: false,
                hello_outstanding: false,
                out: VecDeque::new(),
            });
        }
        Ok(Self {
            bundle,
            peers: ps,
            inbox,
            tag,
        })
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

    /// Are all peers up?
    pub fn all_up(&self) -> bool {
        self.peers.iter().all(|p| p.up)
    }

    /// Fragments waiting for a peer to come up or for credit, all peers.
    pub fn queued(&self) -> usize {
        self.peers.iter().map(|p| p.out.len()).sum()
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

    /// The next received packet and the peer it came from.
    pub fn recv(&mut self) -> Option<(usize, Vec<u8>)> {
        lock(&self.inbox).packets.pop_front()
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

    /// Takes hello outcomes out of the inbox.
    fn absorb(&mut self) {
        let (acked, failed) = {
            let mut ib = lock(&self.inbox);
            (
                std::mem::take(&mut ib.acked),
                std::mem::take(&mut ib.hello_failed),
            )
        };
        for peer in failed {
            self.peers[peer].hello_outstanding = false;
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

    /// Sends hellos and queued fragments; returns the messages sent.
    fn push(&mut self) -> Result<usize, AmError> {
        let mut sent = 0;
        for p in &mut self.peers {
            if !p.up {
                if !p.hello_outstanding {
                    match self
                        .bundle
                        .try_request_short(PORT_EP, p.idx, H_HELLO, &[self.tag.0])
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
            while let Some((bytes, more)) = p.out.front() {
                match self.bundle.try_request_medium(
                    PORT_EP,
                    p.idx,
                    H_DATA,
                    bytes,
                    &[u64::from(*more)],
                ) {
                    Ok(()) => {
                        p.out.pop_front();
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
}
