//! UDP backend: one socket (socket2 for buffer sizing), receive with GRO and send with GSO
//! (UDP_SEGMENT) through `nix`.
//!
//! Fast path: the receive slots and the outbox are allocated once, at bind time; sending and
//! receiving a datagram allocates nothing (a system call builds its small header array).
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
//! Sends are gathered until the bundle flushes ([`Transport::flush`]); see [`tx`]. Receives
//! take up to [`rx::RECV_SLOTS`] datagrams (each maybe a GRO batch) per `recvmmsg`; see [`rx`].
//!
//! The async `wait_async` awaits tokio readiness when the transport was built inside a tokio
//! runtime (the socket is registered with that runtime); built outside one, `wait_async`
//! degrades to sleeping polls (100 µs).

pub(super) mod rx;
pub(super) mod tx;

use std::io;
use std::net::{SocketAddr, UdpSocket as StdUdpSocket};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use nix::sys::socket::{MsgFlags, setsockopt, sockopt};
use nix::time::{ClockId, clock_gettime};
use socket2::{Domain, Protocol, Socket, Type};
use tokio::io::Interest;
use tokio::runtime::Handle;

use super::spin::{self, SPIN_DEFAULT, SpinPolicy};
use super::{
    poll_readable, real_instant, real_now, sleep_until_real, tokio_deadline, wall_incarnation,
};
use crate::AmError;
use crate::transport::Transport;
use crate::{NodeAddr, Time};
use rx::{RECV_SLOTS, Rx};
use tx::{GSO_MAX_SEGMENTS, Outbox};

/// Non-blocking receive calls one [`Transport::recv`] makes at most (each returns up to
/// [`rx::RECV_SLOTS`] datagrams or GRO batches of up to 64).
pub const RECV_BATCH: usize = 4;
/// Shortest wait done as a blocking receive; shorter ones use `poll(2)` (ms resolution).
/// Just over a jiffy: the waits of a busy daemon (until its token timer, say) are
/// blocking receives, one system call each instead of a poll and a receive.
pub const BLOCKING_RECV_MIN: Duration = Duration::from_micros(4_500);
/// How long a daemon may take between receiving a datagram (which holds an acknowledgement
/// for [`LINK_ACK_DELAY`](crate::link::LINK_ACK_DELAY)) and waiting again, for that wait
/// to remain one blocking receive.
const ACK_WAIT_MARGIN: Duration = Duration::from_micros(500);
const _: () = assert!(
    crate::link::LINK_ACK_DELAY.as_micros()
        >= BLOCKING_RECV_MIN.as_micros() + ACK_WAIT_MARGIN.as_micros(),
    "a wait until a held acknowledgement must be a blocking receive, not a poll"
);
/// What the kernel may add to `SO_RCVTIMEO` by rounding it up to jiffies (HZ ≥ 250).
const JIFFY: Duration = Duration::from_millis(4);
/// `SO_RCVTIMEO` for every wait shorter than two jiffies: the kernel rounds it up to one
/// jiffy, so the receive returns within a jiffy (often sooner, at the next tick: the caller
/// then waits again). One value for all of them keeps the socket option unchanged from one
/// wave to the next, where the deadline moves by microseconds.
const ONE_TICK: Duration = Duration::from_millis(1);

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
    /// How long a wait may poll the socket, yielding the CPU, before it sleeps in the kernel,
    /// while traffic is flowing ([`SpinPolicy`]; default [`SPIN_DEFAULT`], zero: never).
    pub spin: Duration,
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
            spin: SPIN_DEFAULT,
        }
    }

    /// The same with waits that spin up to `spin` ([`UdpConfig::spin`]).
    pub fn with_spin(self, spin: Duration) -> Self {
        Self { spin, ..self }
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
    /// Send system calls made (each carries one datagram, a GSO batch or a `sendmmsg` run).
    pub send_calls: u64,
    /// Receive system calls made by `recv` and `wait`, the empty ones included.
    pub recv_calls: u64,
    /// `poll(2)` calls made by waits too short for a blocking receive.
    pub poll_calls: u64,
    /// Waits that data ended while they spun, without sleeping ([`SpinPolicy`]).
    pub spin_served: u64,
}

/// A UDP socket driving one bundle.
pub struct UdpTransport {
    sock: StdUdpSocket,
    tokio_sock: Option<tokio::net::UdpSocket>,
    rx: Rx,
    tx: Outbox,
    local: SocketAddr,
    origin: Instant,
    /// `origin` as CLOCK_MONOTONIC nanoseconds (what `Instant` reads on Linux): `now` is one
    /// clock read and a subtraction.
    origin_ns: u64,
    inc: u64,
    max_datagram: usize,
    /// The socket's current `SO_RCVTIMEO` (`None` = never set; `Some(None)` = infinite).
    rcvtimeo: Option<Option<Duration>>,
    spin: SpinPolicy,
    stats: UdpStats,
}

impl std::fmt::Debug for UdpTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UdpTransport")
            .field("local", &self.local)
            .field("gso", &self.tx.gso())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

/// CLOCK_MONOTONIC in nanoseconds (`None` if the clock cannot be read: never on Linux).
fn mono_ns() -> Option<u64> {
    let t = clock_gettime(ClockId::CLOCK_MONOTONIC).ok()?;
    Some((t.tv_sec() as u64) * 1_000_000_000 + t.tv_nsec() as u64)
}

/// The receive timeout for a wait of `left` (at least [`BLOCKING_RECV_MIN`]): one jiffy
/// below it, as a power of two, so it changes rarely; [`ONE_TICK`] below two jiffies.
fn rcvtimeo(left: Duration) -> Duration {
    debug_assert!(left >= BLOCKING_RECV_MIN && BLOCKING_RECV_MIN > JIFFY);
    let below = left.saturating_sub(JIFFY);
    if below < JIFFY {
        ONE_TICK
    } else {
        quantum(below)
    }
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
        // GSO: the kernel takes UDP_SEGMENT (0 = off) iff it supports it. The socket keeps 0;
        // each batch carries its segment size in a control message.
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
            rx: Rx::new(local),
            tx: Outbox::new(gso_max),
            local,
            origin: Instant::now(),
            origin_ns: mono_ns().unwrap_or(0),
            inc: wall_incarnation(),
            max_datagram: cfg.max_datagram,
            rcvtimeo: None,
            spin: SpinPolicy::new(cfg.spin),
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
        self.tx.gso()
    }

    /// Sends everything queued.
    fn send_all(&mut self) {
        self.tx.send_all(&self.sock, &mut self.stats);
    }

    /// One receive call; how many slots it filled (0: nothing arrived).
    fn fill(&mut self, flags: MsgFlags) -> Result<usize, AmError> {
        self.stats.recv_calls += 1;
        match self.rx.fill(&self.sock, flags) {
            Ok(n) => Ok(n),
            // Non-blocking: the socket is empty. Blocking: SO_RCVTIMEO expired.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionRefused | io::ErrorKind::Interrupted
                ) =>
            {
                Ok(0)
            }
            Err(e) => Err(e.into()),
        }
    }

    fn fill_nonblocking(&mut self) -> Result<bool, AmError> {
        if self.rx.pending() {
            return Ok(true);
        }
        Ok(self.fill(MsgFlags::MSG_DONTWAIT)? > 0)
    }

    /// Sleep in one `recvmmsg` for at most about `left` (≥ [`BLOCKING_RECV_MIN`], or `None`).
    fn blocking_fill(&mut self, left: Option<Duration>) -> Result<bool, AmError> {
        // Stay one jiffy below the deadline: the kernel rounds SO_RCVTIMEO up to jiffies.
        let t = left.map(rcvtimeo);
        if self.rcvtimeo != Some(t) {
            self.sock.set_read_timeout(t)?;
            self.rcvtimeo = Some(t);
        }
        Ok(self.fill(MsgFlags::empty())? > 0)
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

    /// A wait that spins up to `spin` before it sleeps.
    fn wait_with(
        &mut self,
        now: Time,
        deadline: Option<Time>,
        spin: Duration,
    ) -> Result<bool, AmError> {
        self.send_all();
        if self.rx.pending() {
            return Ok(true);
        }
        let served = if self.spin_until(now, deadline, spin)? {
            self.stats.spin_served += 1;
            true
        } else {
            // After a spin that found nothing, what is left of the wait starts later.
            let now = if spin.is_zero() { now } else { self.now() };
            self.sleep_from(now, deadline)?
        };
        // A clock read per wait: how soon traffic came decides whether the next one spins.
        let waited = self.now().since(now);
        self.spin.record(served.then_some(waited));
        Ok(served)
    }

    /// Spins for up to `budget` (not past `deadline`): `true` once something arrived.
    fn spin_until(
        &mut self,
        now: Time,
        deadline: Option<Time>,
        budget: Duration,
    ) -> Result<bool, AmError> {
        if budget.is_zero() {
            return Ok(false);
        }
        let until = deadline.map_or(now.plus(budget), |d| d.min(now.plus(budget)));
        let until = real_instant(self.origin, until);
        while spin::until_readable(self.sock.as_fd(), until)? {
            if self.fill_nonblocking()? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Sleeps in the kernel until something arrives or `deadline` passes.
    fn sleep_from(&mut self, mut now: Time, deadline: Option<Time>) -> Result<bool, AmError> {
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
            // Short waits (SO_RCVTIMEO has jiffy resolution): poll(2), level-triggered.
            self.stats.poll_calls += 1;
            if poll_readable(self.sock.as_fd(), left)? && self.fill_nonblocking()? {
                return Ok(true);
            }
            now = self.now();
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
        self.tx.push(&self.sock, &mut self.stats, to, datagram);
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
        // sent sooner); otherwise up to RECV_BATCH non-blocking receives, stopping after one
        // that did not fill every slot (the socket was empty then).
        let mut calls = if self.rx.pending() { RECV_BATCH } else { 0 };
        while count < max {
            if !self.rx.pending() {
                if calls >= RECV_BATCH {
                    break;
                }
                let filled = self.fill(MsgFlags::MSG_DONTWAIT)?;
                calls = if filled < RECV_SLOTS {
                    RECV_BATCH
                } else {
                    calls + 1
                };
                if filled == 0 {
                    break;
                }
            }
            while count < max {
                let Some((from, d)) = self.rx.next() else {
                    break;
                };
                sink(NodeAddr::Ip(from), d);
                count += 1;
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
    fn wait_from(&mut self, now: Time, deadline: Option<Time>) -> Result<bool, AmError> {
        self.wait_with(now, deadline, self.spin.spin_for())
    }
    fn wait_quiet(&mut self, now: Time, deadline: Option<Time>) -> Result<bool, AmError> {
        self.wait_with(now, deadline, Duration::ZERO)
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

#[cfg(test)]
mod tests;
