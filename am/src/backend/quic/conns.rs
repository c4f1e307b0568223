//! The connections of one endpoint, driven sans-IO (quinn-proto): what arrives is handed in,
//! what to send is taken out, time is passed in. One connection is in use per peer address
//! ([`Link`]), and a rule makes both ends of a pair send on the same one.
//!
//! Which connection carries the datagrams to a peer (a simultaneous open, a restarted peer)
//! is [`links`]'s.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use quinn_proto::{
    ClientConfig, Connection, ConnectionHandle, DatagramEvent, EcnCodepoint, Endpoint, Event,
    Incoming, SendDatagramError,
};

use quinn_udp::RecvMeta;

mod links;

#[cfg(test)]
pub(super) use links::DUPLICATE_GRACE;
use links::Link;

use super::socket::Socket;
use super::{CONNECT_QUEUE, CONNECTIONS_MAX, Counters, QuicStats, RX_QUEUE, SERVER_NAME};

/// How long sends to an address whose connection attempt just failed are dropped at once
/// instead of starting another attempt.
const FAILED_HOLD: Duration = Duration::from_millis(200);
/// One quinn connection and what this node knows of it.
struct Entry {
    conn: Connection,
    /// This node opened it (rather than accepted it).
    ours: bool,
    /// Its handshake completed.
    connected: bool,
    /// Close it then (the loser of a simultaneous open), unless it is in use by then.
    retire_at: Option<Instant>,
    /// Queued in [`Conns::dirty`] (it has events, timers or datagrams to act on).
    dirty: bool,
    /// quinn is done with it: it goes once its last events are taken.
    drained: bool,
}

/// An endpoint and its connections.
pub(super) struct Conns {
    endpoint: Endpoint,
    client: ClientConfig,
    entries: HashMap<ConnectionHandle, Entry>,
    links: HashMap<SocketAddr, Link>,
    /// Connections to act on at the next [`Conns::drive`].
    dirty: Vec<ConnectionHandle>,
    /// Received AM datagrams waiting for the bundle (at most [`RX_QUEUE`]).
    pub(super) received: VecDeque<(SocketAddr, Bytes)>,
    pub(super) counters: Arc<Counters>,
    pub(super) stats: QuicStats,
    /// Datagrams handed to quinn since the last transmit.
    pub(super) unsent: usize,
    /// quinn writes transmits and endpoint responses here.
    buf: Vec<u8>,
    /// [`CONNECTIONS_MAX`] (lower in tests).
    pub(super) connections_max: usize,
}

impl Conns {
    pub(super) fn new(endpoint: Endpoint, client: ClientConfig, counters: Arc<Counters>) -> Self {
        Self {
            endpoint,
            client,
            entries: HashMap::new(),
            links: HashMap::new(),
            dirty: Vec::new(),
            received: VecDeque::new(),
            counters,
            stats: QuicStats::default(),
            unsent: 0,
            buf: Vec::new(),
            connections_max: CONNECTIONS_MAX,
        }
    }

    fn mark(&mut self, ch: ConnectionHandle) {
        if let Some(e) = self.entries.get_mut(&ch) {
            e.mark(ch, &mut self.dirty);
        }
    }

    /// Hands `b` to the connection to `to`, opening one if there is none (`now` is read only
    /// then); it leaves at the next [`Conns::drive`].
    pub(super) fn send(&mut self, to: SocketAddr, b: Bytes, now: impl FnOnce() -> Instant) {
        match self.links.get_mut(&to) {
            Some(Link::Ready { ch, .. }) => {
                let ch = *ch;
                if self.send_on(ch, b) {
                    self.stats.sent += 1;
                    self.unsent += 1;
                }
            }
            Some(Link::Connecting { queue, .. }) => {
                if queue.len() < CONNECT_QUEUE {
                    queue.push_back(b);
                } else {
                    Counters::add(&self.counters.send_dropped, 1);
                }
            }
            Some(Link::Failed(at)) if at.elapsed() < FAILED_HOLD => {
                Counters::add(&self.counters.send_dropped, 1);
            }
            _ => self.connect(to, b, now()),
        }
    }

    /// Opens a connection to `to` with `first` waiting for it.
    fn connect(&mut self, to: SocketAddr, first: Bytes, now: Instant) {
        self.stats.connects += 1;
        if self.entries.len() >= self.connections_max {
            let c = &self.counters;
            let held = self.entries.len();
            c.failed(
                &c.connects_failed,
                format!("connection to {to}: {held} connections held"),
            );
            Counters::add(&c.send_dropped, 1);
            self.links.insert(to, Link::Failed(now));
            return;
        }
        match self
            .endpoint
            .connect(now, self.client.clone(), to, SERVER_NAME)
        {
            Ok((ch, conn)) => {
                self.entries.insert(ch, Entry::new(conn, true));
                self.links.insert(
                    to,
                    Link::Connecting {
                        ch,
                        queue: VecDeque::from([first]),
                    },
                );
                self.mark(ch);
            }
            Err(e) => {
                let c = &self.counters;
                c.failed(&c.connects_failed, format!("connection to {to}: {e}"));
                Counters::add(&c.send_dropped, 1);
                self.links.insert(to, Link::Failed(now));
            }
        }
    }

    /// Hands `b` to quinn on connection `ch`; `false` (and counted) when it is not sent.
    fn send_on(&mut self, ch: ConnectionHandle, b: Bytes) -> bool {
        let Some(e) = self.entries.get_mut(&ch) else {
            Counters::add(&self.counters.send_dropped, 1);
            return false;
        };
        let mut d = e.conn.datagrams();
        // quinn makes room for a datagram by discarding older unsent ones: drop this one
        // instead, so that every loss is counted.
        if b.len() > d.send_buffer_space() {
            Counters::add(&self.counters.send_dropped, 1);
            return false;
        }
        match d.send(b, false) {
            Ok(()) => {
                self.mark(ch);
                true
            }
            Err(SendDatagramError::Blocked(_)) => {
                Counters::add(&self.counters.send_dropped, 1);
                false
            }
            Err(_) => {
                Counters::add(&self.counters.send_refused, 1);
                false
            }
        }
    }

    /// Takes one received UDP datagram (or GRO batch of them, `meta.stride` bytes each).
    pub(super) fn handle_datagram(
        &mut self,
        now: Instant,
        meta: &RecvMeta,
        mut data: BytesMut,
        socket: &mut Socket,
    ) {
        let ecn = meta.ecn.and_then(|e| EcnCodepoint::from_bits(e as u8));
        while !data.is_empty() {
            let one = data.split_to(meta.stride.clamp(1, data.len()));
            self.buf.clear();
            let event = self
                .endpoint
                .handle(now, meta.addr, meta.dst_ip, ecn, one, &mut self.buf);
            match event {
                Some(DatagramEvent::ConnectionEvent(ch, ev)) => {
                    if let Some(e) = self.entries.get_mut(&ch) {
                        e.conn.handle_event(ev);
                        self.mark(ch);
                    }
                }
                Some(DatagramEvent::NewConnection(incoming)) => {
                    self.incoming(incoming, now, socket);
                }
                Some(DatagramEvent::Response(t)) => socket.send(&t, &self.buf[..t.size]),
                None => {}
            }
        }
    }

    /// A peer opens a connection: accepted unless [`CONNECTIONS_MAX`] are held (then refused
    /// at once); a refusal is counted and its answer sent.
    fn incoming(&mut self, incoming: Incoming, now: Instant, socket: &mut Socket) {
        let from = incoming.remote_address();
        self.buf.clear();
        let held = self.entries.len();
        let (t, why) = if held >= self.connections_max {
            let t = self.endpoint.refuse(incoming, &mut self.buf);
            (Some(t), format!("{held} connections held"))
        } else {
            match self.endpoint.accept(incoming, now, &mut self.buf, None) {
                Ok((ch, conn)) => {
                    self.entries.insert(ch, Entry::new(conn, false));
                    self.mark(ch);
                    return;
                }
                Err(e) => (e.response, e.cause.to_string()),
            }
        };
        let c = &self.counters;
        c.failed(&c.refused, format!("handshake from {from}: {why}"));
        if let Some(t) = t {
            socket.send(&t, &self.buf[..t.size]);
        }
    }

    /// The earliest time a connection's timer (or a retirement) is due.
    pub(super) fn next_timeout(&mut self) -> Option<Instant> {
        self.entries
            .values_mut()
            .flat_map(|e| e.conn.poll_timeout().into_iter().chain(e.retire_at))
            .min()
    }

    /// Fires every timer due at `now` (no allocation unless a connection retires).
    pub(super) fn handle_timeouts(&mut self, now: Instant) {
        let mut retiring = Vec::new();
        for (&ch, e) in &mut self.entries {
            let mut due = false;
            if e.conn.poll_timeout().is_some_and(|t| t <= now) {
                e.conn.handle_timeout(now);
                due = true;
            }
            if e.retire_at.is_some_and(|t| t <= now) {
                e.retire_at = None;
                retiring.push(ch);
                due = true;
            }
            if due {
                e.mark(ch, &mut self.dirty);
            }
        }
        for ch in retiring {
            self.retire(ch, now);
        }
    }

    /// Acts on every connection with something to do: its events, then what it has to send.
    pub(super) fn drive(&mut self, now: Instant, socket: &mut Socket) {
        let max_gso = socket.max_gso_segments();
        while let Some(ch) = self.dirty.pop() {
            if let Some(e) = self.entries.get_mut(&ch) {
                e.dirty = false;
            }
            self.drive_one(ch, now, socket, max_gso);
        }
        socket.flush();
        self.unsent = 0;
    }

    fn drive_one(
        &mut self,
        ch: ConnectionHandle,
        now: Instant,
        socket: &mut Socket,
        max_gso: usize,
    ) {
        loop {
            let Some(e) = self.entries.get_mut(&ch) else {
                return;
            };
            let mut busy = false;
            while let Some(ev) = e.conn.poll_endpoint_events() {
                busy = true;
                // Its last events (a reset's `ConnectionLost`) are still to be taken.
                e.drained |= ev.is_drained();
                if let Some(back) = self.endpoint.handle_event(ch, ev) {
                    e.conn.handle_event(back);
                }
            }
            while let Some(t) = {
                self.buf.clear();
                e.conn.poll_transmit(now, max_gso, &mut self.buf)
            } {
                busy = true;
                socket.send(&t, &self.buf[..t.size]);
            }
            match e.conn.poll() {
                Some(Event::Connected) => self.adopt(ch, now),
                Some(Event::ConnectionLost { reason }) => self.lost(ch, &reason, now),
                Some(Event::DatagramReceived) => self.take_datagrams(ch),
                Some(_) => {}
                None if busy => {}
                None => {
                    if e.drained {
                        // Forgotten when lost; again here, so that a handle quinn may reuse
                        // never reaches a link.
                        let addr = e.conn.remote_address();
                        self.entries.remove(&ch);
                        self.forget(addr, ch, now);
                    }
                    return;
                }
            }
        }
    }

    /// Moves what connection `ch` received into [`Conns::received`] (never waiting for the
    /// bundle: quinn would then discard datagrams uncounted).
    fn take_datagrams(&mut self, ch: ConnectionHandle) {
        let Some(e) = self.entries.get_mut(&ch) else {
            return;
        };
        let from = e.conn.remote_address();
        while let Some(b) = e.conn.datagrams().recv() {
            if self.received.len() < RX_QUEUE {
                self.received.push_back((from, b));
            } else {
                Counters::add(&self.counters.recv_dropped, 1);
            }
        }
    }

    /// UDP datagrams quinn has built on every connection (a test hook).
    #[cfg(test)]
    pub(super) fn packets_sent(&self) -> u64 {
        self.entries
            .values()
            .map(|e| e.conn.stats().udp_tx.datagrams)
            .sum()
    }

    /// Closes every connection (their close frames leave at the next drive).
    pub(super) fn close_all(&mut self, now: Instant) {
        for (&ch, e) in &mut self.entries {
            e.conn.close(now, 0u32.into(), Bytes::from_static(b"bye"));
            e.mark(ch, &mut self.dirty);
        }
        self.links.clear();
    }
}

impl Entry {
    fn new(conn: Connection, ours: bool) -> Self {
        Self {
            conn,
            ours,
            connected: false,
            retire_at: None,
            dirty: false,
            drained: false,
        }
    }

    /// Queues it (`ch`) in `dirty` unless it waits there already.
    fn mark(&mut self, ch: ConnectionHandle, dirty: &mut Vec<ConnectionHandle>) {
        if !self.dirty {
            self.dirty = true;
            dirty.push(ch);
        }
    }
}
