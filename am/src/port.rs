//! Packet links for the Isotach daemons over a real transport: [`PacketPort`] drives the
//! sans-IO [`Links`] state machine (`isotach_am_proto::link`, which holds every rule: hello,
//! fragmentation, credit, back-pressure, loss and rejoin) over one [`Transport`]. It moves
//! datagrams between the two, reads the clock once per pass and blocks in the transport; it
//! decides nothing.

use std::time::Duration;

use crate::Transport;
use crate::drive::{self, Driver, Serviced};
use crate::{AmError, NodeAddr, Tag, Time};
pub use isotach_am_proto::link::{
    DEFAULT_TAG, Directory, LinkEvent, LinkStats, Links, LossReason, Offered, PACKET_MAX, PeerList,
    PeerStatus, QUEUE_MAX_DEFAULT, WINDOW_MAX, WINDOW_MIN,
};

/// Most datagrams taken from a transport per receive round.
const RECV_BATCH: usize = 64;
/// Most receive rounds per pass (a steady stream still lets the caller run).
const RECV_ROUNDS_MAX: usize = 16;

/// The link core for a process on `transport`: the daemons' AM settings, the transport's
/// address, incarnation and datagram size; every peer linked at once.
pub fn links_on<T: Transport>(
    transport: &T,
    peers: &[NodeAddr],
    tag: Tag,
) -> Result<Links, AmError> {
    links_with(transport, PeerList::eager(peers)?, tag)
}

/// [`links_on`] for the peers of `peers`, some of them linked on demand.
pub fn links_with<T: Transport>(
    transport: &T,
    peers: PeerList,
    tag: Tag,
) -> Result<Links, AmError> {
    Links::with_peers(
        Links::am_config(),
        transport.local_addr(),
        transport.incarnation(),
        transport.max_datagram(),
        peers,
        tag,
    )
}

/// Most datagrams one [`take_arrivals`] takes. A call that took fewer found the socket
/// empty at its end.
pub const ARRIVALS_MAX: usize = RECV_ROUNDS_MAX * RECV_BATCH;

/// Takes what arrived on `transport` without blocking — up to [`RECV_ROUNDS_MAX`] rounds of
/// [`RECV_BATCH`] datagrams, fewer when a round comes back short — handing each to `handle`.
/// Reads no clock (the caller passes its pass's time along). Returns how many it took.
pub fn take_arrivals<T: Transport>(
    transport: &mut T,
    mut handle: impl FnMut(NodeAddr, &[u8]),
) -> Result<usize, AmError> {
    let mut taken = 0;
    for _ in 0..RECV_ROUNDS_MAX {
        let n = transport.recv(RECV_BATCH, &mut handle)?;
        taken += n;
        if n < RECV_BATCH {
            break;
        }
    }
    Ok(taken)
}

/// A reliable FIFO packet service to a fixed set of peers over one transport: [`Links`] plus
/// the I/O. Peer ids are indexes into the address list given to [`PacketPort::new`].
#[derive(Debug)]
pub struct PacketPort<T: Transport> {
    transport: T,
    links: Links,
}

impl<T: Transport> PacketPort<T> {
    /// A port over `transport` talking to `peers` (index = peer id), tagged `tag`.
    pub fn new(transport: T, peers: &[NodeAddr], tag: Tag) -> Result<Self, AmError> {
        let links = links_on(&transport, peers, tag)?;
        Ok(Self { transport, links })
    }

    /// The link state machine (peer state, counters, the AM core's statistics).
    pub fn links(&self) -> &Links {
        &self.links
    }

    /// The link state machine, to send, receive and take events.
    pub fn links_mut(&mut self) -> &mut Links {
        &mut self.links
    }

    /// This port's transport address.
    pub fn local_addr(&self) -> NodeAddr {
        self.transport.local_addr()
    }

    /// The transport.
    pub fn transport(&self) -> &T {
        &self.transport
    }

    /// Bounds the per-peer queues (see [`Links::set_queue_max`]).
    pub fn set_queue_max(&mut self, fragments: usize) {
        self.links.set_queue_max(fragments);
    }

    /// See [`Links::has_room`].
    pub fn has_room(&self, peer: usize) -> bool {
        self.links.has_room(peer)
    }

    /// See [`Links::is_up`].
    pub fn is_up(&self, peer: usize) -> bool {
        self.links.is_up(peer)
    }

    /// Queues a copy of `packet` for `peer` (see [`Links::send`]).
    pub fn send(&mut self, peer: usize, packet: &[u8]) -> Result<(), AmError> {
        self.links.send(peer, packet.to_vec())
    }

    /// See [`Links::offer`].
    pub fn offer(
        &mut self,
        peer: usize,
        packet: Vec<u8>,
        redundant: impl FnOnce(&[u8]) -> bool,
    ) -> Result<Offered, AmError> {
        self.links.offer(peer, packet, redundant)
    }

    /// See [`Links::recv`].
    pub fn recv(&mut self) -> Option<(usize, Vec<u8>)> {
        self.links.recv()
    }

    /// See [`Links::recv_where`].
    pub fn recv_where(&mut self, accept: impl Fn(usize) -> bool) -> Option<(usize, Vec<u8>)> {
        self.links.recv_where(accept)
    }

    /// See [`Links::poll_event`].
    pub fn take_event(&mut self) -> Option<LinkEvent> {
        self.links.poll_event()
    }

    /// Fires due timers, takes what arrived (up to a bounded number of rounds) and sends what
    /// the links have to send. Never blocks. Returns the datagrams taken.
    pub fn poll(&mut self) -> Result<usize, AmError> {
        let now = self.transport.now();
        self.links.handle_timeout(now);
        let links = &mut self.links;
        let taken = take_arrivals(&mut self.transport, |from, bytes| {
            links.handle_datagram(now, from, bytes)
        })?;
        self.transmit(now)?;
        Ok(taken)
    }

    fn transmit(&mut self, now: Time) -> Result<(), AmError> {
        while let Some((to, bytes)) = self.links.poll_transmit(now) {
            self.transport.send(to, bytes)?;
        }
        self.transport.flush()
    }

    /// Blocks until a datagram or a received packet is waiting, or `timeout` passed; AM
    /// timers keep running meanwhile. Call [`PacketPort::poll`] next.
    pub fn wait(&mut self, timeout: Duration) -> Result<bool, AmError> {
        drive::wait(self, timeout)
    }

    /// The async form of [`PacketPort::wait`] (tokio readiness for the UDP backend).
    pub async fn wait_async(&mut self, timeout: Duration) -> Result<bool, AmError> {
        drive::wait_async(self, timeout).await
    }
}

impl<T: Transport> Driver for PacketPort<T> {
    type T = T;
    fn transport_mut(&mut self) -> &mut T {
        &mut self.transport
    }
    fn waiting(&mut self) -> bool {
        self.links.has_packets() || self.transport.has_pending()
    }
    fn service(&mut self, now: Time) -> Result<Serviced, AmError> {
        self.links.handle_timeout(now);
        self.transmit(now)?;
        Ok(Serviced::Idle(self.links.poll_timeout()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::udp::UdpTransport;
    use isotach_am_proto::link::BATCH_PACKET_MAX;

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
        assert_eq!(a.take_event(), Some(LinkEvent::PeerUp(0)));
        assert_eq!(b.links().stats().packets_received, 200);
    }

    #[test]
    fn unknown_senders_are_dropped() {
        let (mut a, _b) = pair();
        let c = UdpTransport::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let mut c = PacketPort::new(c, &[a.local_addr()], DEFAULT_TAG).unwrap();
        c.send(0, b"hi").unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while a.links().stats().unknown_peer == 0 {
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

    fn events(p: &mut PacketPort<UdpTransport>) -> Vec<LinkEvent> {
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
            seen.contains(&LinkEvent::PeerUp(0))
        });
        let lost = seen
            .iter()
            .position(|e| {
                matches!(
                    e,
                    LinkEvent::PeerLost {
                        peer: 0,
                        reason: LossReason::Restarted,
                        ..
                    }
                )
            })
            .expect("the restart is reported");
        let up = seen
            .iter()
            .position(|e| *e == LinkEvent::PeerUp(0))
            .unwrap();
        assert!(lost < up, "{seen:?}");
        assert_eq!(a.links().stats().links_lost, 1);
        assert_eq!(a.links().peer_status()[0].links_lost, 1);
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
            seen.contains(&LinkEvent::PeerUp(0))
        });
        // The new stream carries a packet end to end; the old one's returns change nothing.
        a.send(0, b"after").unwrap();
        let mut got = None;
        pump(&mut a, &mut b, |a, b| {
            seen.extend(events(a));
            got = got.take().or_else(|| b.recv());
            got.is_some() && a.links().stats().fragments_lost > 0
        });
        assert_eq!(got, Some((0, b"after".to_vec())));
        let lost = seen
            .iter()
            .filter(|e| matches!(e, LinkEvent::PeerLost { .. }))
            .count();
        assert_eq!(lost, 1, "{seen:?}");
        assert_eq!(a.links().stats().links_lost, 1);
    }

    #[test]
    fn flow_control_holds_the_sender_to_its_window_until_the_receiver_reads() {
        let (mut a, mut b) = pair();
        // The queue and the window: 65 fragments (the window never goes below one largest
        // packet). Packets of one fragment too long to share a batch, so that each is one
        // data message of the window (the link core's tests fill the window with batches).
        let w = WINDOW_MIN;
        let packets: Vec<Vec<u8>> = (0..2 * w)
            .map(|i| vec![i as u8; BATCH_PACKET_MAX + 1 + i % 2])
            .collect();
        a.set_queue_max(w);
        for p in &packets[..w] {
            a.send(0, p).unwrap();
        }
        // b's driver reads nothing: a stops after its window.
        pump(&mut a, &mut b, |a, _| a.links().in_flight(0) == w);
        assert_eq!(a.links().queued(), 0);
        for p in &packets[w..] {
            assert!(a.has_room(0));
            a.send(0, p).unwrap();
        }
        for _ in 0..200 {
            a.poll().unwrap();
            b.poll().unwrap();
        }
        assert_eq!(a.links().in_flight(0), w);
        assert_eq!(
            b.links().stats().packets_received,
            w as u64,
            "nothing beyond the window"
        );
        assert_eq!(a.links().queued(), w);
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
        let (sa, sb) = (a.links().stats(), b.links().stats());
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
        while a.links().stats().packets_received < 10 {
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
}
