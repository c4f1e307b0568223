//! QUIC backend (quinn-proto 0.11, rustls with ring): AM frames travel as QUIC DATAGRAM frames, one
//! connection per node pair in use ([`conns`]: which one after a simultaneous open or a
//! restart), both ends authenticated by certificates a cluster CA issued.
//! A peer without such a certificate fails the TLS handshake, so its traffic never reaches
//! the protocol core (its requests come back `Unreachable` at its own end).
//!
//! QUIC datagrams are unreliable, so the AM reliability layer (sequence numbers, reply cache,
//! retransmission, credits) runs unchanged on top; QUIC adds encryption, authentication and
//! congestion control. Connections are opened lazily on the first send to an address
//! (datagrams queue meanwhile, at most [`CONNECT_QUEUE`]). A quinn endpoint uses one UDP
//! socket for both roles, so a peer's connection comes from the address it listens on, which
//! is its AM node address.
//!
//! quinn-proto is sans-IO, and so is this backend's use of it ([`conns`]): the caller's own
//! thread runs the endpoint in its waits and flushes — it receives from the socket (quinn-udp:
//! `recvmmsg`, GRO), hands the datagrams and the time to quinn, fires due timers, and sends
//! what the connections have to send (GSO) — with no runtime, task, channel or lock between
//! the socket and the bundle. A wait blocks in `poll(2)` until a datagram arrives, the
//! deadline, or the next QUIC timer. Received AM datagrams wait for the bundle in a bounded
//! queue ([`RX_QUEUE`]); this backend allocates per message (quinn takes `Bytes`), unlike the
//! UDP fast path.
//!
//! Every datagram that does not leave or arrive is counted ([`QuicCounters`]): those quinn
//! refuses to send, those this backend drops rather than let quinn silently discard older
//! ones (its send buffer full), those queued for a connection that failed or beyond
//! [`CONNECT_QUEUE`], and received ones dropped because [`RX_QUEUE`] is full.

use super::spin::{SPIN_DEFAULT, SpinPolicy};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use quinn_udp::RecvMeta;

mod conns;
mod pki;
mod setup;
mod socket;
mod wire_loss;
use conns::Conns;
pub use pki::{
    CertAuthority, QuicIdentity, check_identity, identity_from_pem, make_ca, make_node_identity,
};
use setup::{configs, endpoint};
use socket::Socket;
use wire_loss::WireLoss;

use super::{real_instant, real_now, sleep_until_real, wall_incarnation};
use crate::AmError;
use crate::transport::Transport;
use crate::{NodeAddr, Time};

/// TLS server name every node certificate carries (peers are told apart by address and
/// certificate, not by SNI).
pub const SERVER_NAME: &str = "isotach-node";
/// ALPN protocol id.
pub const ALPN: &[u8] = b"isotach-am/1";
/// Datagrams queued per connection while it is being established.
pub const CONNECT_QUEUE: usize = 256;
/// Received datagrams waiting for the bundle.
pub const RX_QUEUE: usize = 8192;
/// Datagrams `send` hands to quinn before a flush transmits them; one more transmits first.
pub const SEND_QUEUE_MAX: usize = 1024;
/// Connections an endpoint holds at most, counting those in their handshake and those
/// closing: a node's peers are its switch's hosts and TMs, far fewer. An incoming one beyond
/// it is refused (`handshakes_refused`), so a flood of handshakes from addresses that will
/// never authenticate cannot grow the endpoint without bound; an outgoing one fails
/// (`connects_failed`).
pub const CONNECTIONS_MAX: usize = 4096;

/// QUIC backend settings.
#[derive(Clone, Debug)]
pub struct QuicConfig {
    /// Address to bind (and to be known by).
    pub bind: SocketAddr,
    /// Certificates.
    pub identity: QuicIdentity,
    /// Largest AM frame per QUIC datagram (default 1350, which fits the default
    /// `initial_mtu` of 1452 with QUIC's overhead).
    pub max_datagram: usize,
    /// QUIC initial MTU, which is also its floor: the network must carry UDP payloads this
    /// large (default 1452: a 1500-byte Ethernet MTU minus IPv4/UDP headers).
    pub initial_mtu: u16,
    /// QUIC idle timeout: a silent peer's connection is closed after this.
    pub idle_timeout: Duration,
    /// Test hook: the probability that a UDP datagram quinn sends is lost below QUIC, where
    /// its congestion control and path-MTU detection see the loss (default 0).
    pub wire_loss: f64,
    /// Seed of the draws behind `wire_loss`.
    pub wire_loss_seed: u64,
    /// How long a blocking wait may poll the socket, yielding the CPU, before it sleeps in
    /// the kernel, while traffic is flowing ([`SpinPolicy`]; default [`SPIN_DEFAULT`], zero:
    /// never). `wait_async` does not spin.
    pub spin: Duration,
}

impl QuicConfig {
    /// Defaults for `bind` and `identity`. (Fault injection for tests: wrap the transport in
    /// [`crate::backend::fault::Faulty`].)
    pub fn new(bind: SocketAddr, identity: QuicIdentity) -> Self {
        Self {
            bind,
            identity,
            max_datagram: 1350,
            initial_mtu: 1452,
            idle_timeout: Duration::from_secs(30),
            wire_loss: 0.0,
            wire_loss_seed: 0,
            spin: SPIN_DEFAULT,
        }
    }

    /// The same with waits that spin up to `spin` ([`QuicConfig::spin`]).
    pub fn with_spin(self, spin: Duration) -> Self {
        Self { spin, ..self }
    }
}

/// Handshake outcomes and lost datagrams, counted by the caller's thread and quinn's tasks.
#[derive(Debug, Default)]
struct Counters {
    refused: AtomicU64,
    connects_failed: AtomicU64,
    last_error: Mutex<Option<String>>,
    send_refused: AtomicU64,
    send_dropped: AtomicU64,
    recv_dropped: AtomicU64,
    send_failed: AtomicU64,
    peer_resets: AtomicU64,
    idle_timeouts: AtomicU64,
}

impl Counters {
    fn failed(&self, counter: &AtomicU64, what: String) {
        counter.fetch_add(1, Ordering::Relaxed);
        *self
            .last_error
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(what);
    }

    fn add(counter: &AtomicU64, n: usize) {
        counter.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// A connection ended with `e`: counted when the peer reset it (its process restarted)
    /// or it idled out (the peer went silent).
    fn ended(&self, e: &quinn_proto::ConnectionError) {
        match e {
            quinn_proto::ConnectionError::Reset => Self::add(&self.peer_resets, 1),
            quinn_proto::ConnectionError::TimedOut => Self::add(&self.idle_timeouts, 1),
            _ => {}
        }
    }
}

/// A handle on a [`QuicTransport`]'s counters of failed handshakes and lost datagrams that
/// outlives moving the transport into a bundle or port (a daemon keeps one to log refused
/// peers and to show the counts on its admin service).
#[derive(Clone, Debug)]
pub struct QuicCounters(Arc<Counters>);

impl QuicCounters {
    /// Incoming connections whose handshake failed: the peer's certificate was not signed by
    /// the cluster CA (or it sent none), or the peer refused ours.
    pub fn refused(&self) -> u64 {
        self.0.refused.load(Ordering::Relaxed)
    }
    /// Outgoing connection attempts that failed: the handshake was refused either way, or the
    /// peer did not answer.
    pub fn connects_failed(&self) -> u64 {
        self.0.connects_failed.load(Ordering::Relaxed)
    }
    /// The last handshake failure: the peer's address and the error.
    pub fn last_error(&self) -> Option<String> {
        self.0
            .last_error
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
    /// Datagrams quinn refused to send: larger than the path or the peer allows, datagrams
    /// not supported or disabled, or the connection lost.
    pub fn send_refused(&self) -> u64 {
        self.0.send_refused.load(Ordering::Relaxed)
    }
    /// Datagrams this backend dropped instead of sending: quinn's send buffer was full (quinn
    /// would have discarded older ones), more than [`CONNECT_QUEUE`] waited for a connection,
    /// the connection they waited for failed, or one to their address had just failed.
    pub fn send_dropped(&self) -> u64 {
        self.0.send_dropped.load(Ordering::Relaxed)
    }
    /// Received datagrams dropped because [`RX_QUEUE`] of them already waited for the bundle.
    pub fn recv_dropped(&self) -> u64 {
        self.0.recv_dropped.load(Ordering::Relaxed)
    }
    /// UDP sends (a QUIC packet, or a GSO batch of them sent as one) the kernel refused: a
    /// full socket send buffer, or an error for the path. Lost; QUIC sees the loss and AM
    /// sends again.
    pub fn send_failed(&self) -> u64 {
        self.0.send_failed.load(Ordering::Relaxed)
    }
}

/// Counters of the QUIC driver.
#[derive(Clone, Copy, Debug, Default)]
pub struct QuicStats {
    /// Datagrams handed to quinn.
    pub sent: u64,
    /// Datagrams quinn refused (see [`QuicCounters::send_refused`]).
    pub send_refused: u64,
    /// Datagrams dropped before quinn (see [`QuicCounters::send_dropped`]).
    pub send_dropped: u64,
    /// UDP sends (a QUIC packet, or a GSO batch of them sent as one) the kernel refused — a
    /// full socket send buffer, or an error for the path: lost (QUIC sees the loss; AM sends
    /// its datagrams again).
    pub send_failed: u64,
    /// Connection attempts started.
    pub connects: u64,
    /// Datagrams received.
    pub received: u64,
    /// Received datagrams dropped (see [`QuicCounters::recv_dropped`]).
    pub recv_dropped: u64,
    /// Incoming handshakes that failed (see [`QuicCounters::refused`]).
    pub handshakes_refused: u64,
    /// Outgoing connection attempts that failed (see [`QuicCounters::connects_failed`]).
    pub connects_failed: u64,
    /// Connections a peer reset: it had restarted (a stateless reset from its new process).
    pub peer_resets: u64,
    /// Connections that idled out: the peer was silent for the idle timeout.
    pub idle_timeouts: u64,
}

/// A QUIC endpoint driving one bundle.
pub struct QuicTransport {
    /// Both boxed: quinn's endpoint and the receive slots' metadata are large, and a
    /// transport moves into bundles and enums.
    socket: Box<Socket>,
    conns: Box<Conns>,
    /// UDP datagrams received from the socket, on their way to quinn (capacity kept).
    arrivals: Vec<(RecvMeta, BytesMut)>,
    local: SocketAddr,
    origin: Instant,
    inc: u64,
    max_datagram: usize,
    /// The last wait emptied the socket: the flush that follows it (the caller's answer to
    /// what the wait brought) skips the receive — the next wait starts with one. Set by every
    /// wait step, taken by the next flush.
    socket_drained: bool,
    spin: SpinPolicy,
    /// The loss below QUIC, when bound with some (a test hook).
    wire_loss: Option<Arc<WireLoss>>,
}

impl std::fmt::Debug for QuicTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuicTransport")
            .field("local", &self.local)
            .field("stats", &self.conns.stats)
            .finish_non_exhaustive()
    }
}

impl QuicTransport {
    /// Bind a QUIC endpoint (server and client) with `cfg`.
    pub fn bind(cfg: QuicConfig) -> Result<Self, AmError> {
        if !(1200..=1452).contains(&cfg.max_datagram)
            || usize::from(cfg.initial_mtu) < cfg.max_datagram
        {
            return Err(AmError::BadArg(
                "QUIC max_datagram must be in 1200..=1452 and below initial_mtu",
            ));
        }
        WireLoss::check(cfg.wire_loss)?;
        let (sc, cc) = configs(&cfg)?;
        let wire_loss = (cfg.wire_loss > 0.0)
            .then(|| Arc::new(WireLoss::new(cfg.wire_loss_seed, cfg.wire_loss)));
        let counters = Arc::new(Counters::default());
        let socket = Box::new(Socket::bind(
            cfg.bind,
            wire_loss.clone(),
            Arc::clone(&counters),
        )?);
        let local = socket.local_addr()?;
        let endpoint = endpoint(sc, &cfg, !socket.may_fragment());
        Ok(Self {
            socket,
            conns: Box::new(Conns::new(endpoint, cc, counters)),
            arrivals: Vec::new(),
            local,
            origin: Instant::now(),
            inc: wall_incarnation(),
            max_datagram: cfg.max_datagram,
            socket_drained: false,
            spin: SpinPolicy::new(cfg.spin),
            wire_loss,
        })
    }

    /// The bound socket address.
    pub fn socket_addr(&self) -> SocketAddr {
        self.local
    }

    /// Driver counters.
    pub fn quic_stats(&self) -> QuicStats {
        let c = self.counters();
        QuicStats {
            send_refused: c.send_refused(),
            send_dropped: c.send_dropped(),
            send_failed: c.send_failed(),
            recv_dropped: c.recv_dropped(),
            handshakes_refused: c.refused(),
            connects_failed: c.connects_failed(),
            peer_resets: c.0.peer_resets.load(Ordering::Relaxed),
            idle_timeouts: c.0.idle_timeouts.load(Ordering::Relaxed),
            ..self.conns.stats
        }
    }

    /// Test hook: from now on lose UDP datagrams the endpoint sends with probability `loss`
    /// (the draws restart from `wire_loss_seed`). Only for a transport bound with some wire
    /// loss.
    pub fn set_wire_loss(&self, loss: f64) -> Result<(), AmError> {
        WireLoss::check(loss)?;
        let w = self.wire_loss.as_ref().ok_or(AmError::BadArg(
            "set_wire_loss needs a transport bound with wire_loss above 0",
        ))?;
        w.set(loss);
        Ok(())
    }

    /// Test hook: hold at most `n` connections instead of [`CONNECTIONS_MAX`].
    #[cfg(test)]
    fn set_connections_max(&mut self, n: usize) {
        self.conns.connections_max = n;
    }

    /// A handle on the counters of failed handshakes and lost datagrams (valid after the
    /// transport moved into a bundle).
    pub fn counters(&self) -> QuicCounters {
        QuicCounters(Arc::clone(&self.conns.counters))
    }

    /// The same handle as [`QuicTransport::counters`] (its handshake counters).
    pub fn handshakes(&self) -> QuicCounters {
        self.counters()
    }

    /// One pass of the endpoint at `now`: what the socket holds goes to quinn (unless
    /// `receive` is false), due timers fire, and every connection with something to do acts
    /// and transmits.
    fn drive(&mut self, now: Instant, receive: bool) -> Result<(), AmError> {
        if receive {
            self.socket.recv_all(&mut self.arrivals)?;
        }
        for (meta, data) in self.arrivals.drain(..) {
            self.conns
                .handle_datagram(now, &meta, data, &mut self.socket);
        }
        self.conns.handle_timeouts(now);
        self.conns.drive(now, &mut self.socket);
        Ok(())
    }

    /// One pass of a wait (until `deadline`): the endpoint driven; done when a datagram
    /// waits or the deadline passed, else how long to block — until the deadline or the next
    /// QUIC timer.
    fn wait_step(&mut self, deadline: Option<Instant>) -> Result<WaitStep, AmError> {
        let now = Instant::now();
        self.drive(now, true)?;
        self.socket_drained = true;
        if !self.conns.received.is_empty() {
            return Ok(WaitStep::Done(true));
        }
        if deadline.is_some_and(|d| now >= d) {
            return Ok(WaitStep::Done(false));
        }
        let until = deadline.into_iter().chain(self.conns.next_timeout()).min();
        Ok(WaitStep::Block(
            until.map(|u| u.saturating_duration_since(now)),
        ))
    }

    /// A blocking wait that spins up to `spin` before it sleeps.
    fn wait_with(&mut self, deadline: Option<Time>, spin: Duration) -> Result<bool, AmError> {
        let deadline = deadline.map(|t| real_instant(self.origin, t));
        let start = Instant::now();
        let spin_until = start + spin;
        loop {
            match self.wait_step(deadline)? {
                WaitStep::Done(found) => {
                    // How soon traffic came decides whether the next wait spins.
                    self.spin.record(found.then(|| start.elapsed()));
                    return Ok(found);
                }
                WaitStep::Block(limit) => {
                    if !self.socket.spin(spin_until, limit)? {
                        self.socket.wait(limit)?;
                    }
                }
            };
        }
    }
}

/// What a wait does after a [`QuicTransport::wait_step`].
enum WaitStep {
    /// Return whether a datagram waits.
    Done(bool),
    /// Block in the socket at most this long (`None`: no limit).
    Block(Option<Duration>),
}

impl Drop for QuicTransport {
    fn drop(&mut self) {
        // The close frames leave now, with anything handed over since the last flush.
        let now = Instant::now();
        self.conns.close_all(now);
        self.conns.drive(now, &mut self.socket);
    }
}

impl Transport for QuicTransport {
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
        real_now(self.origin)
    }
    fn send(&mut self, to: NodeAddr, datagram: &[u8]) -> Result<(), AmError> {
        let NodeAddr::Ip(to) = to else { return Ok(()) };
        if self.conns.unsent >= SEND_QUEUE_MAX {
            self.conns.drive(Instant::now(), &mut self.socket);
        }
        self.conns
            .send(to, Bytes::copy_from_slice(datagram), Instant::now);
        Ok(())
    }
    fn flush(&mut self) -> Result<(), AmError> {
        // A node that only polls (never waits) receives in every flush.
        let receive = !std::mem::take(&mut self.socket_drained);
        self.drive(Instant::now(), receive)
    }
    fn recv(
        &mut self,
        max: usize,
        sink: &mut dyn FnMut(NodeAddr, &[u8]),
    ) -> Result<usize, AmError> {
        let mut n = 0;
        while n < max {
            let Some((from, b)) = self.conns.received.pop_front() else {
                break;
            };
            sink(NodeAddr::Ip(from), &b);
            n += 1;
        }
        self.conns.stats.received += n as u64;
        Ok(n)
    }
    fn has_pending(&mut self) -> bool {
        !self.conns.received.is_empty()
    }
    fn wait(&mut self, deadline: Option<Time>) -> Result<bool, AmError> {
        self.wait_with(deadline, self.spin.spin_for())
    }
    fn wait_quiet(&mut self, _now: Time, deadline: Option<Time>) -> Result<bool, AmError> {
        self.wait_with(deadline, Duration::ZERO)
    }
    fn sleep_until(&mut self, t: Time) {
        let _ = self.flush();
        sleep_until_real(self.now(), t);
    }
    async fn wait_async(&mut self, deadline: Option<Time>) -> Result<bool, AmError> {
        let deadline = deadline.map(|t| real_instant(self.origin, t));
        loop {
            match self.wait_step(deadline)? {
                WaitStep::Done(found) => return Ok(found),
                WaitStep::Block(limit) => self.socket.wait_async(limit).await?,
            };
        }
    }
}

#[cfg(test)]
mod tests;
