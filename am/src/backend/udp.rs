//! UDP backend: one non-blocking socket (socket2 for buffer sizing), batched receive with
//! `recvmmsg`/GRO through `quinn-udp`.
//!
//! Fast path: receive buffers, the `recvmmsg` header arrays and the transmit buffer are
//! allocated once, at bind time; sending and receiving a message allocates nothing.
//!
//! Waiting: the blocking `wait` is a direct `epoll_wait` (mio, edge-triggered, on a clone of
//! the socket) on the caller's thread. The async `wait_async` awaits tokio readiness when the
//! transport was built inside a tokio runtime (the socket is registered with that runtime);
//! built outside one, `wait_async` degrades to sleeping polls (100 µs).

use std::io::{self, IoSliceMut};
use std::net::{SocketAddr, UdpSocket as StdUdpSocket};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use quinn_udp::{RecvMeta, UdpSockRef, UdpSocketState};
use socket2::{Domain, Protocol, Socket, Type};
use tokio::io::Interest;
use tokio::runtime::Handle;

use crate::error::AmError;
use crate::rng::Rng;
use crate::transport::Transport;
use crate::types::{NodeAddr, Time};

/// Datagrams one `recvmmsg` call can return.
pub const RECV_BATCH: usize = 16;
/// Bytes of each receive buffer (room for a GRO-coalesced batch).
const RECV_BUF: usize = 64 * 1024;

/// UDP backend settings.
#[derive(Clone, Debug)]
pub struct UdpConfig {
    /// Address to bind.
    pub bind: SocketAddr,
    /// Largest datagram sent (default 1472: an Ethernet MTU minus IP and UDP headers).
    pub max_datagram: usize,
    /// `SO_RCVBUF` asked for; size it for peers × credits × largest message. The kernel caps
    /// it at `net.core.rmem_max`.
    pub recv_buffer_bytes: usize,
    /// `SO_SNDBUF` asked for.
    pub send_buffer_bytes: usize,
    /// Test hook: probability that a sent datagram is dropped.
    pub loss: f64,
    /// Test hook: probability that a sent datagram is sent twice.
    pub dup: f64,
    /// Seed of the fault hooks.
    pub fault_seed: u64,
}

impl UdpConfig {
    /// Defaults for `bind`: 1472-byte datagrams, 4 MiB socket buffers, no faults.
    pub fn new(bind: SocketAddr) -> Self {
        Self {
            bind,
            max_datagram: 1472,
            recv_buffer_bytes: 4 << 20,
            send_buffer_bytes: 4 << 20,
            loss: 0.0,
            dup: 0.0,
            fault_seed: 0,
        }
    }
}

struct Rx {
    bufs: Vec<u8>,
    meta: [RecvMeta; RECV_BATCH],
    n: usize,
    idx: usize,
    seg_off: usize,
}

impl Rx {
    fn pending(&self) -> bool {
        self.idx < self.n
    }

    /// One non-blocking `recvmmsg`; returns how many buffers were filled.
    fn fill(&mut self, state: &UdpSocketState, sock: &StdUdpSocket) -> io::Result<usize> {
        let mut chunks = self.bufs.chunks_mut(RECV_BUF);
        let mut iovs: [IoSliceMut<'_>; RECV_BATCH] =
            std::array::from_fn(|_| IoSliceMut::new(chunks.next().unwrap_or_default()));
        let n = state.recv(UdpSockRef::from(sock), &mut iovs, &mut self.meta)?;
        self.n = n;
        self.idx = 0;
        self.seg_off = 0;
        Ok(n)
    }
}

/// Counters of the UDP driver.
#[derive(Clone, Copy, Debug, Default)]
pub struct UdpStats {
    /// Datagrams handed to the kernel.
    pub sent: u64,
    /// Datagrams the kernel refused (`EAGAIN`): dropped, recovered by retransmission.
    pub send_dropped: u64,
    /// Other send errors.
    pub send_errors: u64,
    /// Datagrams received.
    pub received: u64,
    /// Datagrams dropped by the fault hooks.
    pub fault_dropped: u64,
}

/// A UDP socket driving one bundle.
pub struct UdpTransport {
    sock: StdUdpSocket,
    poll: mio::Poll,
    events: mio::Events,
    _mio_sock: mio::net::UdpSocket,
    tokio_sock: Option<tokio::net::UdpSocket>,
    state: UdpSocketState,
    rx: Rx,
    local: SocketAddr,
    origin: Instant,
    inc: u64,
    max_datagram: usize,
    faults: Option<(Rng, f64, f64)>,
    stats: UdpStats,
    /// The last receive attempt found the socket empty (so an edge-triggered wait is safe).
    drained: bool,
}

impl std::fmt::Debug for UdpTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UdpTransport")
            .field("local", &self.local)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl UdpTransport {
    /// Bind with default settings.
    pub fn bind(addr: SocketAddr) -> Result<Self, AmError> {
        Self::with_config(UdpConfig::new(addr))
    }

    /// Bind with `cfg`.
    pub fn with_config(cfg: UdpConfig) -> Result<Self, AmError> {
        if !(1200..=65_507).contains(&cfg.max_datagram) {
            return Err(AmError::BadArg("UDP max_datagram must be in 1200..=65507"));
        }
        let s = Socket::new(
            Domain::for_address(cfg.bind),
            Type::DGRAM,
            Some(Protocol::UDP),
        )?;
        // Best effort: the kernel caps these at rmem_max / wmem_max.
        let _ = s.set_recv_buffer_size(cfg.recv_buffer_bytes);
        let _ = s.set_send_buffer_size(cfg.send_buffer_bytes);
        s.set_nonblocking(true)?;
        s.bind(&cfg.bind.into())?;
        let sock: StdUdpSocket = s.into();
        let poll = mio::Poll::new()?;
        let mut mio_sock = mio::net::UdpSocket::from_std(sock.try_clone()?);
        poll.registry()
            .register(&mut mio_sock, mio::Token(0), mio::Interest::READABLE)?;
        let tokio_sock = match Handle::try_current() {
            Ok(_) => Some(tokio::net::UdpSocket::from_std(sock.try_clone()?)?),
            Err(_) => None,
        };
        let state = UdpSocketState::new(UdpSockRef::from(&sock))?;
        let local = sock.local_addr()?;
        let inc = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(1, |d| d.as_micros() as u64)
            .max(1);
        let faults = (cfg.loss > 0.0 || cfg.dup > 0.0)
            .then(|| (Rng::new(cfg.fault_seed), cfg.loss, cfg.dup));
        Ok(Self {
            sock,
            poll,
            events: mio::Events::with_capacity(4),
            _mio_sock: mio_sock,
            tokio_sock,
            state,
            rx: Rx {
                bufs: vec![0; RECV_BUF * RECV_BATCH],
                meta: [RecvMeta::default(); RECV_BATCH],
                n: 0,
                idx: 0,
                seg_off: 0,
            },
            local,
            origin: Instant::now(),
            inc,
            max_datagram: cfg.max_datagram,
            faults,
            stats: UdpStats::default(),
            drained: false,
        })
    }

    /// The bound socket address.
    pub fn socket_addr(&self) -> SocketAddr {
        self.local
    }

    /// Driver counters.
    pub fn udp_stats(&self) -> UdpStats {
        self.stats
    }

    /// Change the fault hooks (tests).
    pub fn set_faults(&mut self, seed: u64, loss: f64, dup: f64) {
        self.faults = (loss > 0.0 || dup > 0.0).then(|| (Rng::new(seed), loss, dup));
    }

    fn send_one(&mut self, to: SocketAddr, datagram: &[u8]) {
        let t = quinn_udp::Transmit {
            destination: to,
            ecn: None,
            contents: datagram,
            segment_size: None,
            src_ip: None,
        };
        match self.state.try_send(UdpSockRef::from(&self.sock), &t) {
            Ok(()) => self.stats.sent += 1,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.stats.send_dropped += 1,
            Err(_) => self.stats.send_errors += 1,
        }
    }

    fn fill_nonblocking(&mut self) -> Result<bool, AmError> {
        if self.rx.pending() {
            return Ok(true);
        }
        match self.rx.fill(&self.state, &self.sock) {
            Ok(n) => {
                // A short batch emptied the receive queue: every later arrival re-arms the
                // edge-triggered epoll registration, so `wait` may sleep without probing.
                self.drained = n < RECV_BATCH;
                Ok(n > 0)
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                self.drained = true;
                Ok(false)
            }
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    fn tokio_deadline(&self, t: Time) -> tokio::time::Instant {
        tokio::time::Instant::from_std(self.origin + Duration::from_nanos(t.0))
    }

    async fn readable(
        tsock: &tokio::net::UdpSocket,
        sock: &StdUdpSocket,
        state: &UdpSocketState,
        rx: &mut Rx,
        deadline: Option<tokio::time::Instant>,
    ) -> io::Result<bool> {
        let fut = async {
            loop {
                tsock.readable().await?;
                match tsock.try_io(Interest::READABLE, || rx.fill(state, sock)) {
                    Ok(n) if n > 0 => return Ok(true),
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {}
                    Err(e) => return Err(e),
                }
            }
        };
        match deadline {
            Some(d) => tokio::time::timeout_at(d, fut).await.unwrap_or(Ok(false)),
            None => fut.await,
        }
    }
}

impl Transport for UdpTransport {
    fn local_addr(&self) -> NodeAddr {
        NodeAddr::Ip(self.local)
    }
    fn max_datagram(&self) -> usize {
        self.max_datagram
    }
    fn incarnation(&self) -> u64 {
        self.inc
    }
    fn now(&self) -> Time {
        Time(self.origin.elapsed().as_nanos() as u64)
    }
    fn send(&mut self, to: NodeAddr, datagram: &[u8]) -> Result<(), AmError> {
        let NodeAddr::Ip(to) = to else { return Ok(()) };
        let copies = match &mut self.faults {
            None => 1,
            Some((rng, loss, dup)) => {
                if rng.chance(*loss) {
                    0
                } else if rng.chance(*dup) {
                    2
                } else {
                    1
                }
            }
        };
        if copies == 0 {
            self.stats.fault_dropped += 1;
        }
        for _ in 0..copies {
            self.send_one(to, datagram);
        }
        Ok(())
    }
    fn recv(
        &mut self,
        max: usize,
        sink: &mut dyn FnMut(NodeAddr, &[u8]),
    ) -> Result<usize, AmError> {
        let mut count = 0;
        // At most one receive system call per call: handle one batch, then let the caller
        // flush what it produced (replies go out sooner).
        let mut filled = self.rx.pending();
        while count < max {
            if !self.rx.pending() {
                if filled || !self.fill_nonblocking()? {
                    break;
                }
                filled = true;
            }
            let rx = &mut self.rx;
            while rx.idx < rx.n && count < max {
                let m = &rx.meta[rx.idx];
                let base = rx.idx * RECV_BUF;
                let len = m.len.min(RECV_BUF);
                let stride = m.stride.clamp(1, RECV_BUF);
                let end = (rx.seg_off + stride).min(len);
                sink(
                    NodeAddr::Ip(m.addr),
                    &rx.bufs[base + rx.seg_off..base + end],
                );
                count += 1;
                rx.seg_off = end;
                if rx.seg_off >= len {
                    rx.idx += 1;
                    rx.seg_off = 0;
                }
            }
        }
        self.stats.received += count as u64;
        Ok(count)
    }
    fn has_pending(&mut self) -> bool {
        // After a drain, arrivals are reported by the edge-triggered `wait`; no probe needed.
        self.rx.pending() || (!self.drained && self.fill_nonblocking().unwrap_or(false))
    }
    fn wait(&mut self, deadline: Option<Time>) -> Result<bool, AmError> {
        loop {
            if self.rx.pending() {
                return Ok(true);
            }
            // If the last attempt drained the socket, any later datagram raised an edge, so
            // epoll can go first; otherwise probe the socket before sleeping.
            if !self.drained && self.fill_nonblocking()? {
                return Ok(true);
            }
            let timeout = match deadline {
                Some(d) => {
                    let now = self.now();
                    if now >= d {
                        return Ok(false);
                    }
                    Some(d.since(now))
                }
                None => None,
            };
            // Edge-triggered: safe because the fill above drained the socket to EAGAIN.
            match self.poll.poll(&mut self.events, timeout) {
                Ok(()) if self.events.is_empty() => return Ok(false),
                Ok(()) => self.drained = false,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    fn sleep_until(&mut self, t: Time) {
        let now = self.now();
        if t > now {
            std::thread::sleep(t.since(now));
        }
    }
    async fn wait_async(&mut self, deadline: Option<Time>) -> Result<bool, AmError> {
        if self.fill_nonblocking()? {
            return Ok(true);
        }
        if self.tokio_sock.is_some() {
            let d = deadline.map(|t| self.tokio_deadline(t));
            let Self {
                tokio_sock,
                sock,
                state,
                rx,
                ..
            } = self;
            if let Some(t) = tokio_sock {
                return Ok(Self::readable(t, sock, state, rx, d).await?);
            }
        }
        loop {
            if self.fill_nonblocking()? {
                return Ok(true);
            }
            if deadline.is_some_and(|d| self.now() >= d) {
                return Ok(false);
            }
            tokio::time::sleep(Duration::from_micros(100)).await;
        }
    }
}
