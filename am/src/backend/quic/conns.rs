//! The connections of one endpoint, driven sans-IO (quinn-proto): what arrives is handed in,
//! what to send is taken out, time is passed in. One connection is in use per peer address
//! ([`Link`]), and a rule makes both ends of a pair send on the same one.
//!
//! Two nodes that start together both open a connection to each other (a simultaneous open).
//! If each end sent on the connection the other opened, every connection would carry
//! datagrams one way only, so none of QUIC's acknowledgements could ride in a datagram going
//! back: each would be a packet of its own and a wake-up of the peer's thread. So when a node
//! holds one connection it opened and one it accepted, both ends keep the one with the
//! smaller *choice tag* — a TLS exporter value, the same at both ends of a connection — and
//! the node that opened the other closes it after [`DUPLICATE_GRACE`].
//!
//! A peer that restarted opens a new connection while we may still send on a dead one. If we
//! had accepted the dead one, the new one (the peer's again) replaces it at once. If we had
//! opened it, the tags decide as above; if the dead one wins, the first datagram we send on it
//! draws a stateless reset from the restarted peer (its reset key is derived from its node
//! key, so it survives the restart: see `setup::reset_key`), the dead connection closes, and
//! the new one, kept as the spare, takes over.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use quinn_proto::{
    ClientConfig, Connection, ConnectionError, ConnectionHandle, DatagramEvent, EcnCodepoint,
    Endpoint, Event, SendDatagramError,
};

use quinn_udp::RecvMeta;

use super::socket::Socket;
use super::{CONNECT_QUEUE, CONNECTIONS_MAX, Counters, QuicStats, RX_QUEUE, SERVER_NAME};

/// How long the losing connection of a simultaneous open stays open, so that what was sent on
/// it before both ends chose still arrives.
pub(super) const DUPLICATE_GRACE: Duration = Duration::from_secs(1);
/// How long sends to an address whose connection attempt just failed are dropped at once
/// instead of starting another attempt.
const FAILED_HOLD: Duration = Duration::from_millis(200);
/// TLS exporter label of the choice tag.
const CHOICE_LABEL: &[u8] = b"isotach-am/1 connection choice";

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

/// Where datagrams to one peer address go.
enum Link {
    /// Our connection `ch` is being established; datagrams wait (at most [`CONNECT_QUEUE`]).
    Connecting {
        ch: ConnectionHandle,
        queue: VecDeque<Bytes>,
    },
    /// On connection `ch`; `spare` is the other one of a simultaneous open, or the peer's
    /// newer one that lost to a connection we opened: it takes over if `ch` closes.
    Ready {
        ch: ConnectionHandle,
        spare: Option<ConnectionHandle>,
    },
    /// The last attempt failed then.
    Failed(Instant),
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
        if let Some(e) = self.entries.get_mut(&ch)
            && !e.dirty
        {
            e.dirty = true;
            self.dirty.push(ch);
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
        let from = meta.addr;
        let ecn = meta.ecn.and_then(|e| EcnCodepoint::from_bits(e as u8));
        let stride = meta.stride;
        let local_ip = meta.dst_ip;
        while !data.is_empty() {
            let one = data.split_to(stride.clamp(1, data.len()));
            self.buf.clear();
            let event = self
                .endpoint
                .handle(now, from, local_ip, ecn, one, &mut self.buf);
            match event {
                Some(DatagramEvent::ConnectionEvent(ch, ev)) => {
                    if let Some(e) = self.entries.get_mut(&ch) {
                        e.conn.handle_event(ev);
                        self.mark(ch);
                    }
                }
                Some(DatagramEvent::NewConnection(incoming)) => {
                    self.buf.clear();
                    if self.entries.len() >= self.connections_max {
                        let t = self.endpoint.refuse(incoming, &mut self.buf);
                        let c = &self.counters;
                        c.failed(
                            &c.refused,
                            format!(
                                "handshake from {from}: {} connections held",
                                self.entries.len()
                            ),
                        );
                        socket.send(
                            t.destination,
                            t.ecn,
                            t.segment_size,
                            t.src_ip,
                            &self.buf[..t.size],
                        );
                        continue;
                    }
                    match self.endpoint.accept(incoming, now, &mut self.buf, None) {
                        Ok((ch, conn)) => {
                            self.entries.insert(ch, Entry::new(conn, false));
                            self.mark(ch);
                        }
                        Err(e) => {
                            let c = &self.counters;
                            c.failed(&c.refused, format!("handshake from {from}: {}", e.cause));
                            if let Some(t) = e.response {
                                socket.send(
                                    t.destination,
                                    t.ecn,
                                    t.segment_size,
                                    t.src_ip,
                                    &self.buf[..t.size],
                                );
                            }
                        }
                    }
                }
                Some(DatagramEvent::Response(t)) => {
                    socket.send(
                        t.destination,
                        t.ecn,
                        t.segment_size,
                        t.src_ip,
                        &self.buf[..t.size],
                    );
                }
                None => {}
            }
        }
    }

    /// The earliest time a connection's timer (or a retirement) is due.
    pub(super) fn next_timeout(&mut self) -> Option<Instant> {
        self.entries
            .values_mut()
            .filter_map(|e| match (e.conn.poll_timeout(), e.retire_at) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            })
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
            if due && !e.dirty {
                e.dirty = true;
                self.dirty.push(ch);
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
                socket.send(
                    t.destination,
                    t.ecn,
                    t.segment_size,
                    t.src_ip,
                    &self.buf[..t.size],
                );
            }
            match e.conn.poll() {
                Some(Event::Connected) => self.adopt(ch, now),
                Some(Event::ConnectionLost { reason }) => self.lost(ch, &reason, now),
                Some(Event::DatagramReceived) => self.take_datagrams(ch),
                Some(_) => {}
                None if busy => {}
                None => {
                    if e.drained {
                        self.entries.remove(&ch);
                        self.unlink(ch, now);
                    }
                    return;
                }
            }
        }
    }

    /// Connection `ch` is gone: no link may name it (it was forgotten when lost; this keeps
    /// a handle quinn may reuse from ever reaching a link).
    fn unlink(&mut self, ch: ConnectionHandle, now: Instant) {
        for link in self.links.values_mut() {
            match link {
                Link::Connecting { ch: c, queue } if *c == ch => {
                    Counters::add(&self.counters.send_dropped, queue.len());
                    *link = Link::Failed(now);
                }
                Link::Ready { ch: c, spare } if *c == ch => match spare.take() {
                    Some(s) => *c = s,
                    None => *link = Link::Failed(now),
                },
                Link::Ready { spare, .. } if *spare == Some(ch) => *spare = None,
                _ => {}
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

    /// Connection `ch` completed its handshake: it carries the datagrams to its peer, unless
    /// a simultaneous open's other connection wins the tags.
    fn adopt(&mut self, ch: ConnectionHandle, now: Instant) {
        let Some(e) = self.entries.get_mut(&ch) else {
            return;
        };
        e.connected = true;
        let (addr, ours) = (e.conn.remote_address(), e.ours);
        let link = match self.links.remove(&addr) {
            Some(Link::Ready { ch: cur, .. })
                if cur != ch && self.is_open(cur) && self.ours(cur) != ours =>
            {
                // One connection opened by each end: both keep the one with the smaller tag;
                // the other is the spare, closed after the grace by the end that opened it.
                let (keep, spare) = if self.smaller_tag(ch, cur) {
                    (ch, cur)
                } else {
                    (cur, ch)
                };
                if let Some(s) = self.entries.get_mut(&spare)
                    && s.ours
                {
                    s.retire_at = Some(now + DUPLICATE_GRACE);
                }
                Link::Ready {
                    ch: keep,
                    spare: Some(spare),
                }
            }
            Some(Link::Connecting { queue, .. }) => {
                for b in queue {
                    if self.send_on(ch, b) {
                        self.stats.sent += 1;
                    }
                }
                Link::Ready { ch, spare: None }
            }
            // None, one that failed, or the peer's previous one (it opened another: it
            // restarted, and the old one is dead).
            _ => Link::Ready { ch, spare: None },
        };
        self.links.insert(addr, link);
    }

    /// Connection `ch` was lost (`reason`): counted, and forgotten.
    fn lost(&mut self, ch: ConnectionHandle, reason: &ConnectionError, now: Instant) {
        let Some(e) = self.entries.get(&ch) else {
            return;
        };
        let (addr, ours, connected) = (e.conn.remote_address(), e.ours, e.connected);
        let c = &self.counters;
        c.ended(reason);
        if !connected && ours {
            c.failed(
                &c.connects_failed,
                format!("connection to {addr}: {reason}"),
            );
            // What waited for this connection is lost. (If the peer's own connection came up
            // meanwhile, it stays in use.)
            if let Some(Link::Connecting { ch: c_ch, queue }) = self.links.get(&addr)
                && *c_ch == ch
            {
                Counters::add(&c.send_dropped, queue.len());
                self.links.insert(addr, Link::Failed(now));
            }
        } else if !connected {
            c.failed(&c.refused, format!("handshake from {addr}: {reason}"));
        }
        self.forget(addr, ch);
    }

    /// `ch`, to `addr`, is closed: if it was in use its spare takes over (or the link goes);
    /// if it was the spare, there is none.
    fn forget(&mut self, addr: SocketAddr, ch: ConnectionHandle) {
        let Some(Link::Ready { ch: cur, spare }) = self.links.get(&addr) else {
            return;
        };
        let (cur, spare) = (*cur, *spare);
        if spare == Some(ch) {
            self.links.insert(
                addr,
                Link::Ready {
                    ch: cur,
                    spare: None,
                },
            );
        } else if cur == ch {
            match spare.filter(|&s| self.is_open(s)) {
                Some(s) => self.links.insert(addr, Link::Ready { ch: s, spare: None }),
                None => self.links.remove(&addr),
            };
        }
    }

    /// Closes `ch`, a connection we opened that lost a simultaneous open — unless it took
    /// over meanwhile (the winner closed).
    fn retire(&mut self, ch: ConnectionHandle, now: Instant) {
        let Some(e) = self.entries.get_mut(&ch) else {
            return;
        };
        let addr = e.conn.remote_address();
        let in_use =
            matches!(self.links.get(&addr), Some(Link::Ready { ch: cur, .. }) if *cur == ch);
        if !in_use {
            e.conn.close(
                now,
                0u32.into(),
                Bytes::from_static(b"duplicate connection"),
            );
            self.forget(addr, ch);
        }
    }

    /// Closes every connection (their close frames leave at the next drive).
    pub(super) fn close_all(&mut self, now: Instant) {
        let all: Vec<ConnectionHandle> = self.entries.keys().copied().collect();
        for ch in all {
            if let Some(e) = self.entries.get_mut(&ch) {
                e.conn.close(now, 0u32.into(), Bytes::from_static(b"bye"));
            }
            self.mark(ch);
        }
        self.links.clear();
    }

    fn is_open(&self, ch: ConnectionHandle) -> bool {
        self.entries.get(&ch).is_some_and(|e| !e.conn.is_closed())
    }

    fn ours(&self, ch: ConnectionHandle) -> bool {
        self.entries.get(&ch).is_some_and(|e| e.ours)
    }

    fn choice_tag(&self, ch: ConnectionHandle) -> Option<[u8; 16]> {
        choice_tag(&self.entries.get(&ch)?.conn)
    }

    /// Of two connections to one peer, one opened by each end, does `a` have the smaller
    /// choice tag? Both ends answer alike. (Without tags, which a connection that completed
    /// its handshake always has, the one the peer opened.)
    fn smaller_tag(&self, a: ConnectionHandle, b: ConnectionHandle) -> bool {
        match (self.choice_tag(a), self.choice_tag(b)) {
            (Some(a), Some(b)) => a < b,
            _ => !self.ours(a),
        }
    }

    /// The choice tag of the connection datagrams to `addr` go on, and whether a spare is
    /// held (a test hook: both ends of a pair must report the same tag).
    #[cfg(test)]
    pub(super) fn in_use(&self, addr: SocketAddr) -> Option<([u8; 16], bool)> {
        match self.links.get(&addr) {
            Some(Link::Ready { ch, spare }) => Some((self.choice_tag(*ch)?, spare.is_some())),
            _ => None,
        }
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
}

/// The choice tag of `conn` (`None` if its handshake keys cannot give one, which a connection
/// that completed its handshake always can).
fn choice_tag(conn: &Connection) -> Option<[u8; 16]> {
    let mut tag = [0u8; 16];
    conn.crypto_session()
        .export_keying_material(&mut tag, CHOICE_LABEL, b"")
        .ok()
        .map(|()| tag)
}
