//! UDP backend: one socket (socket2 for buffer sizing), receive with GRO and send with GSO
//! (UDP_SEGMENT) through `nix`.
//!
//! Fast path: the receive buffer, its control-message buffer and the GSO transmit buffer are
//! allocated once, at bind time; sending and receiving a message allocates nothing.
//!
//! System calls: the socket is in blocking mode and every non-blocking operation passes
//! `MSG_DONTWAIT`, so a blocking [`Transport::wait`] is *one* `recvmsg` that sleeps until a
//! datagram arrives and returns it (the same as a raw `recv` ping-pong), instead of an
//! `epoll_wait` followed by a receive. The wait's timeout is `SO_RCVTIMEO`, set only when its
//! power-of-two quantum changes (the kernel rounds it up to whole jiffies, so the quantum
//! stays one 4 ms jiffy below the deadline); waits shorter than [`BLOCKING_RECV_MIN`] use
//! `poll(2)` (millisecond resolution, like `epoll_wait`). No epoll registration is kept (an
//! arrival then wakes only the blocked receiver, without an epoll callback).
//!
//! Sends are gathered until the bundle flushes ([`Transport::flush`]): consecutive
//! equal-size datagrams to one destination leave in one `sendmsg` with `UDP_SEGMENT` (GSO;
//! up to 64 segments), and a receiver with `UDP_GRO` takes such a batch with one `recvmsg`.
//! Without GSO support (or on `EIO`/`EINVAL`) it sends one datagram per call.
//!
//! The async `wait_async` awaits tokio readiness when the transport was built inside a tokio
//! runtime (the socket is registered with that runtime); built outside one, `wait_async`
//! degrades to sleeping polls (100 µs).

use std::io::{self, IoSlice, IoSliceMut};
use std::net::{SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket as StdUdpSocket};
use std::os::fd::{AsFd, AsRawFd};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{
    ControlMessage, ControlMessageOwned, MsgFlags, MultiHeaders, SockaddrStorage, recvmsg,
    sendmmsg, sendto, setsockopt, sockopt,
};
use nix::time::{ClockId, clock_gettime};
use socket2::{Domain, Protocol, Socket, Type};
use tokio::io::Interest;
use tokio::runtime::Handle;

use super::{real_now, sleep_until_real, tokio_deadline, wall_incarnation};
use crate::AmError;
use crate::transport::Transport;
use crate::{NodeAddr, Time};

/// Non-blocking receive calls one [`Transport::recv`] makes at most (each returns one
/// datagram, or one GRO batch of up to 64).
pub const RECV_BATCH: usize = 16;
/// Bytes of the receive buffer (room for a GRO-coalesced batch).
const RECV_BUF: usize = 64 * 1024;
/// Most bytes one GSO send carries (the largest UDP payload over IPv4).
const GSO_MAX_BYTES: usize = 65_507;
/// Most segments one GSO send carries (the kernel's `UDP_MAX_SEGMENTS`).
const GSO_MAX_SEGMENTS: usize = 64;
/// Shortest wait done as a blocking receive; shorter ones use `poll(2)` (ms resolution).
pub const BLOCKING_RECV_MIN: Duration = Duration::from_millis(6);
/// What the kernel may add to `SO_RCVTIMEO` by rounding it up to jiffies (HZ ≥ 250).
const JIFFY: Duration = Duration::from_millis(4);

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
    /// Send equal-size datagrams to one destination in one GSO `sendmsg` (if the kernel
    /// supports `UDP_SEGMENT`; default on).
    pub gso: bool,
}

impl UdpConfig {
    /// Defaults for `bind`: 1472-byte datagrams, 4 MiB socket buffers, GSO. (Fault
    /// injection for tests: wrap the transport in [`crate::backend::fault::Faulty`].)
    pub fn new(bind: SocketAddr) -> Self {
        Self {
            bind,
            max_datagram: 1472,
            recv_buffer_bytes: 4 << 20,
            send_buffer_bytes: 4 << 20,
            gso: true,
        }
    }
}

/// One received datagram, or one GRO batch of equal-size datagrams (`stride` apart).
struct Rx {
    buf: Vec<u8>,
    cmsg: Vec<u8>,
    addr: SocketAddr,
    len: usize,
    stride: usize,
    off: usize,
}

fn std_addr(a: &SockaddrStorage) -> Option<SocketAddr> {
    if let Some(v4) = a.as_sockaddr_in() {
        return Some(SocketAddr::V4(SocketAddrV4::from(*v4)));
    }
    a.as_sockaddr_in6()
        .map(|v6| SocketAddr::V6(SocketAddrV6::from(*v6)))
}

impl Rx {
    fn pending(&self) -> bool {
        self.off < self.len
    }

    /// One `recvmsg` (blocking unless `flags` has `MSG_DONTWAIT`); returns how many
    /// datagrams it brought.
    fn fill(&mut self, sock: &StdUdpSocket, flags: MsgFlags) -> io::Result<usize> {
        let mut iov = [IoSliceMut::new(&mut self.buf)];
        let m = recvmsg::<SockaddrStorage>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut self.cmsg[..]),
            flags,
        )?;
        let Some(addr) = m.address.as_ref().and_then(std_addr) else {
            return Ok(0);
        };
        let len = m.bytes.min(RECV_BUF);
        let mut stride = len;
        if let Ok(cm) = m.cmsgs() {
            for c in cm {
                if let ControlMessageOwned::UdpGroSegments(s) = c {
                    stride = usize::try_from(s).unwrap_or(len).clamp(1, RECV_BUF);
                }
            }
        }
        self.addr = addr;
        self.len = len;
        // Not a clamp of a setting: an empty datagram has `stride` 0 (its length), and the
        // division below and the receive loop need a step of at least one byte.
        self.stride = stride.max(1);
        self.off = 0;
        Ok(len.div_ceil(self.stride))
    }
}

/// Equal-size datagrams to one destination waiting to leave in one (GSO) send.
struct TxBatch {
    buf: Vec<u8>,
    to: Option<SocketAddr>,
    seg: usize,
    n: usize,
    closed: bool,
}

/// Most single datagrams (to different destinations) held for one `sendmmsg`.
const SINGLES_MAX: usize = 64;

/// Single datagrams to different destinations, sent together in one `sendmmsg` at the next
/// flush: a pass that answers every peer (a token manager's wave) wakes them all inside one
/// system call, rather than being preempted by each wake-up in turn.
struct Singles {
    /// The datagrams, back to back.
    buf: Vec<u8>,
    /// Each datagram's destination and end in `buf`, in order.
    msgs: Vec<(SockaddrStorage, usize)>,
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
}

/// A UDP socket driving one bundle.
pub struct UdpTransport {
    sock: StdUdpSocket,
    tokio_sock: Option<tokio::net::UdpSocket>,
    rx: Rx,
    tx: TxBatch,
    singles: Singles,
    /// The last destination, converted for the system call.
    dest: (SocketAddr, SockaddrStorage),
    local: SocketAddr,
    origin: Instant,
    /// `origin` as CLOCK_MONOTONIC nanoseconds (what `Instant` reads on Linux): `now` is one
    /// clock read and a subtraction.
    origin_ns: u64,
    inc: u64,
    max_datagram: usize,
    /// Segments one send may carry: 1 without GSO.
    gso_max: usize,
    /// The socket's current `UDP_SEGMENT` size (0 = off).
    gso_cur: usize,
    /// The socket's current `SO_RCVTIMEO` (`None` = never set; `Some(None)` = infinite).
    rcvtimeo: Option<Option<Duration>>,
    stats: UdpStats,
}

impl std::fmt::Debug for UdpTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UdpTransport")
            .field("local", &self.local)
            .field("gso_max", &self.gso_max)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

/// CLOCK_MONOTONIC in nanoseconds (`None` if the clock cannot be read: never on Linux).
fn mono_ns() -> Option<u64> {
    let t = clock_gettime(ClockId::CLOCK_MONOTONIC).ok()?;
    Some((t.tv_sec() as u64) * 1_000_000_000 + t.tv_nsec() as u64)
}

/// The largest power-of-two number of microseconds not above `d` (at least 1 µs).
fn quantum(d: Duration) -> Duration {
    let us = d.as_micros().clamp(1, u128::from(u64::MAX)) as u64;
    Duration::from_micros(1 << (63 - us.leading_zeros()))
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
        // Coalesced receive (a GSO batch arrives as one buffer with its stride); optional.
        let _ = setsockopt(&sock, sockopt::UdpGroSegment, &true);
        // GSO: the kernel takes UDP_SEGMENT (0 = off) iff it supports it.
        let gso_max = if cfg.gso && setsockopt(&sock, sockopt::UdpGsoSegment, &0).is_ok() {
            GSO_MAX_SEGMENTS
        } else {
            1
        };
        // Registered while non-blocking (tokio checks); readiness works either way and every
        // non-blocking call below passes MSG_DONTWAIT.
        let tokio_sock = match Handle::try_current() {
            Ok(_) => Some(tokio::net::UdpSocket::from_std(sock.try_clone()?)?),
            Err(_) => None,
        };
        sock.set_nonblocking(false)?;
        let local = sock.local_addr()?;
        Ok(Self {
            sock,
            tokio_sock,
            rx: Rx {
                buf: vec![0; RECV_BUF],
                cmsg: nix::cmsg_space!(i32),
                addr: local,
                len: 0,
                stride: 1,
                off: 0,
            },
            tx: TxBatch {
                buf: Vec::with_capacity(GSO_MAX_BYTES),
                to: None,
                seg: 0,
                n: 0,
                closed: false,
            },
            singles: Singles {
                buf: Vec::with_capacity(SINGLES_MAX * 1024),
                msgs: Vec::with_capacity(SINGLES_MAX),
            },
            dest: (local, SockaddrStorage::from(local)),
            local,
            origin: Instant::now(),
            origin_ns: mono_ns().unwrap_or(0),
            inc: wall_incarnation(),
            max_datagram: cfg.max_datagram,
            gso_max,
            gso_cur: 0,
            rcvtimeo: None,
            stats: UdpStats::default(),
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

    /// Whether sends use GSO (`UDP_SEGMENT`).
    pub fn gso(&self) -> bool {
        self.gso_max > 1
    }

    fn set_gso(&mut self, seg: usize) -> bool {
        if self.gso_cur == seg {
            return true;
        }
        let v = i32::try_from(seg).unwrap_or(0);
        if setsockopt(&self.sock, sockopt::UdpGsoSegment, &v).is_ok() {
            self.gso_cur = seg;
            true
        } else {
            false
        }
    }

    fn disable_gso(&mut self) {
        self.gso_max = 1;
        let _ = self.set_gso(0);
    }

    /// Queue one datagram; it leaves with the batch at the next [`Transport::flush`] (or
    /// earlier, when the batch cannot take it).
    fn push(&mut self, to: SocketAddr, d: &[u8]) {
        let t = &self.tx;
        if t.n > 0
            && (t.to != Some(to)
                || t.closed
                || d.len() > t.seg
                || t.n >= self.gso_max
                || t.buf.len() + d.len() > GSO_MAX_BYTES)
        {
            self.send_batch();
        }
        let t = &mut self.tx;
        if t.n == 0 {
            t.to = Some(to);
            t.seg = d.len();
        } else if d.len() < t.seg {
            t.closed = true;
        }
        t.buf.extend_from_slice(d);
        t.n += 1;
    }

    /// Sends everything queued: the open batch and the held single datagrams.
    fn send_all(&mut self) {
        self.send_batch();
        self.send_singles();
    }

    /// Hands the open batch on: a single datagram joins the singles of the next
    /// `sendmmsg`, a GSO batch leaves now (after the singles queued before it).
    fn send_batch(&mut self) {
        let (n, seg) = (self.tx.n, self.tx.seg);
        let Some(to) = self.tx.to.take() else { return };
        if n == 0 {
            return;
        }
        if n == 1 {
            if self.singles.msgs.len() >= SINGLES_MAX {
                self.send_singles();
            }
            let sg = &mut self.singles;
            sg.buf.extend_from_slice(&self.tx.buf);
            sg.msgs.push((SockaddrStorage::from(to), sg.buf.len()));
            debug_assert!(sg.msgs.len() <= SINGLES_MAX);
            let t = &mut self.tx;
            t.buf.clear();
            t.n = 0;
            t.closed = false;
            return;
        }
        self.send_singles();
        if self.dest.0 != to {
            self.dest = (to, SockaddrStorage::from(to));
        }
        let dest = self.dest.1;
        // One datagram must not be cut by a socket GSO size below its length; a batch needs
        // the socket's GSO size equal to its segment size.
        let ok = if n == 1 {
            self.gso_cur == 0 || self.gso_cur >= self.tx.buf.len() || self.set_gso(0)
        } else {
            self.set_gso(seg)
        };
        let r = if ok {
            sendto(
                self.sock.as_raw_fd(),
                &self.tx.buf,
                &dest,
                MsgFlags::MSG_DONTWAIT,
            )
        } else {
            Err(Errno::EINVAL)
        };
        match r {
            Ok(_) => self.stats.sent += n as u64,
            Err(Errno::EAGAIN) => self.stats.send_dropped += n as u64,
            Err(Errno::EIO | Errno::EINVAL) if n > 1 || self.gso_cur != 0 => {
                // No GSO on this path (e.g. no checksum offload): one datagram per call.
                self.disable_gso();
                // `seg` is 0 for a batch of empty datagrams; `chunks` needs at least 1.
                for c in self.tx.buf.chunks(seg.max(1)) {
                    match sendto(self.sock.as_raw_fd(), c, &dest, MsgFlags::MSG_DONTWAIT) {
                        Ok(_) => self.stats.sent += 1,
                        Err(Errno::EAGAIN) => self.stats.send_dropped += 1,
                        Err(_) => self.stats.send_errors += 1,
                    }
                }
            }
            Err(_) => self.stats.send_errors += n as u64,
        }
        let t = &mut self.tx;
        t.buf.clear();
        t.n = 0;
        t.closed = false;
    }

    /// Sends the held single datagrams: one `sendto` for one, one `sendmmsg` for more. What
    /// the kernel does not take (`EAGAIN`) is dropped and counted, as for any send: the AM
    /// core retransmits.
    fn send_singles(&mut self) {
        let n = self.singles.msgs.len();
        if n == 0 {
            return;
        }
        // A datagram must not be cut by the socket's GSO size.
        let ok = self.gso_cur == 0 || self.set_gso(0);
        let sg = &mut self.singles;
        let r = if !ok {
            Err(Errno::EINVAL)
        } else if n == 1 {
            sendto(
                self.sock.as_raw_fd(),
                &sg.buf,
                &sg.msgs[0].0,
                MsgFlags::MSG_DONTWAIT,
            )
            .map(|_| 1)
        } else {
            let mut start = 0;
            let iovs: Vec<[IoSlice<'_>; 1]> = sg
                .msgs
                .iter()
                .map(|&(_, end)| {
                    let iov = [IoSlice::new(&sg.buf[start..end])];
                    start = end;
                    iov
                })
                .collect();
            let addrs: Vec<Option<SockaddrStorage>> =
                sg.msgs.iter().map(|&(a, _)| Some(a)).collect();
            let no_cmsgs: [ControlMessage<'_>; 0] = [];
            // Per flush, not per datagram (the headers hold raw pointers, so they cannot
            // live in a transport that moves between threads).
            let mut headers = MultiHeaders::<SockaddrStorage>::preallocate(n, None);
            sendmmsg(
                self.sock.as_raw_fd(),
                &mut headers,
                &iovs,
                &addrs,
                no_cmsgs,
                MsgFlags::MSG_DONTWAIT,
            )
            .map(Iterator::count)
        };
        match r {
            Ok(sent) => {
                self.stats.sent += sent as u64;
                self.stats.send_dropped += (n - sent) as u64;
            }
            Err(Errno::EAGAIN) => self.stats.send_dropped += n as u64,
            Err(_) => self.stats.send_errors += n as u64,
        }
        let sg = &mut self.singles;
        sg.buf.clear();
        sg.msgs.clear();
    }

    fn fill(&mut self, flags: MsgFlags) -> Result<bool, AmError> {
        match self.rx.fill(&self.sock, flags) {
            Ok(n) => Ok(n > 0),
            // Non-blocking: the socket is empty. Blocking: SO_RCVTIMEO expired.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(false),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionRefused | io::ErrorKind::Interrupted
                ) =>
            {
                Ok(false)
            }
            Err(e) => Err(e.into()),
        }
    }

    fn fill_nonblocking(&mut self) -> Result<bool, AmError> {
        if self.rx.pending() {
            return Ok(true);
        }
        self.fill(MsgFlags::MSG_DONTWAIT)
    }

    /// Sleep in one `recvmsg` for at most about `left` (≥ [`BLOCKING_RECV_MIN`], or `None`).
    fn blocking_fill(&mut self, left: Option<Duration>) -> Result<bool, AmError> {
        // Stay one jiffy below the deadline: the kernel rounds SO_RCVTIMEO up to jiffies.
        let t = left.map(|l| quantum(l.saturating_sub(JIFFY)));
        if self.rcvtimeo != Some(t) {
            self.sock.set_read_timeout(t)?;
            self.rcvtimeo = Some(t);
        }
        self.fill(MsgFlags::empty())
    }

    async fn readable(
        tsock: &tokio::net::UdpSocket,
        sock: &StdUdpSocket,
        rx: &mut Rx,
        deadline: Option<tokio::time::Instant>,
    ) -> io::Result<bool> {
        let fut = async {
            loop {
                tsock.readable().await?;
                match tsock.try_io(Interest::READABLE, || rx.fill(sock, MsgFlags::MSG_DONTWAIT)) {
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

impl Drop for UdpTransport {
    fn drop(&mut self) {
        self.send_all();
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
        match mono_ns() {
            Some(t) => Time(t.saturating_sub(self.origin_ns)),
            None => real_now(self.origin),
        }
    }
    fn send(&mut self, to: NodeAddr, datagram: &[u8]) -> Result<(), AmError> {
        let NodeAddr::Ip(to) = to else { return Ok(()) };
        self.push(to, datagram);
        Ok(())
    }
    fn flush(&mut self) -> Result<(), AmError> {
        self.send_all();
        Ok(())
    }
    fn recv(
        &mut self,
        max: usize,
        sink: &mut dyn FnMut(NodeAddr, &[u8]),
    ) -> Result<usize, AmError> {
        let mut count = 0;
        // What a wait already received is handled without another system call (a reply is
        // sent sooner); otherwise up to RECV_BATCH non-blocking receives.
        let mut calls = if self.rx.pending() { RECV_BATCH } else { 0 };
        while count < max {
            if !self.rx.pending() {
                if calls >= RECV_BATCH || !self.fill(MsgFlags::MSG_DONTWAIT)? {
                    break;
                }
                calls += 1;
            }
            let rx = &mut self.rx;
            while rx.off < rx.len && count < max {
                let end = (rx.off + rx.stride).min(rx.len);
                sink(NodeAddr::Ip(rx.addr), &rx.buf[rx.off..end]);
                count += 1;
                rx.off = end;
            }
        }
        self.stats.received += count as u64;
        Ok(count)
    }
    fn has_pending(&mut self) -> bool {
        // Only what was already received: a datagram still in the socket is found by the
        // next `wait`, which then returns at once (a probe here would cost a system call
        // per round trip).
        self.rx.pending()
    }
    fn wait(&mut self, deadline: Option<Time>) -> Result<bool, AmError> {
        let now = self.now();
        self.wait_from(now, deadline)
    }
    fn wait_from(&mut self, mut now: Time, deadline: Option<Time>) -> Result<bool, AmError> {
        self.send_all();
        loop {
            if self.rx.pending() {
                return Ok(true);
            }
            let left = match deadline {
                Some(d) => {
                    if now >= d {
                        return Ok(false);
                    }
                    Some(d.since(now))
                }
                None => None,
            };
            if left.is_none_or(|l| l >= BLOCKING_RECV_MIN) {
                // One system call: sleep in recvmsg and come back with the datagram.
                if self.blocking_fill(left)? {
                    return Ok(true);
                }
                now = self.now();
                continue;
            }
            // Short waits (SO_RCVTIMEO has jiffy resolution): poll(2), level-triggered, with
            // the timeout rounded up to whole milliseconds, as epoll would.
            let ms = left.map_or(0, |l| l.as_micros().div_ceil(1000));
            let timeout = PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX);
            let mut fds = [PollFd::new(self.sock.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, timeout) {
                Ok(0) | Err(Errno::EINTR) => {}
                Ok(_) => {
                    if self.fill_nonblocking()? {
                        return Ok(true);
                    }
                }
                Err(e) => return Err(io::Error::from(e).into()),
            }
            now = self.now();
        }
    }
    fn sleep_until(&mut self, t: Time) {
        self.send_all();
        sleep_until_real(self.now(), t);
    }
    async fn wait_async(&mut self, deadline: Option<Time>) -> Result<bool, AmError> {
        self.send_all();
        if self.fill_nonblocking()? {
            return Ok(true);
        }
        if self.tokio_sock.is_some() {
            let d = deadline.map(|t| tokio_deadline(self.origin, t));
            let Self {
                tokio_sock,
                sock,
                rx,
                ..
            } = self;
            if let Some(t) = tokio_sock {
                return Ok(Self::readable(t, sock, rx, d).await?);
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
