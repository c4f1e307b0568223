//! QUIC backend (quinn 0.11, rustls with ring): AM frames travel as QUIC DATAGRAM frames, one
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
//! quinn runs on a private current-thread tokio runtime that the caller's thread drives in its
//! waits and flushes ([`drive`]: no thread hop per datagram; a background thread only for async
//! callers). Received datagrams reach the transport through a bounded channel ([`RX_QUEUE`]);
//! this backend allocates per message (quinn takes `Bytes`), unlike the UDP fast path.
//!
//! Every datagram that does not leave or arrive is counted ([`QuicCounters`]): those quinn
//! refuses to send, those this backend drops rather than let quinn silently discard older
//! ones (its send buffer full), those queued for a connection that failed or beyond
//! [`CONNECT_QUEUE`], and received ones dropped because [`RX_QUEUE`] is full.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::runtime::Handle;
use tokio::sync::mpsc;

mod conns;
mod drive;
mod pki;
mod setup;
mod wire_loss;
use conns::{Conn, Shared, adopt};
use drive::Driver;
pub use pki::{
    CertAuthority, QuicIdentity, check_identity, identity_from_pem, make_ca, make_node_identity,
};
use setup::{configs, endpoint};
use wire_loss::WireLoss;

use super::{real_now, sleep_until_real, tokio_deadline, wall_incarnation};
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
/// Datagrams `send` queues before a flush hands them to quinn; one more flushes first.
pub const SEND_QUEUE_MAX: usize = 1024;

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
        }
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
    fn ended(&self, e: &quinn::ConnectionError) {
        match e {
            quinn::ConnectionError::Reset => Self::add(&self.peer_resets, 1),
            quinn::ConnectionError::TimedOut => Self::add(&self.idle_timeouts, 1),
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

/// A quinn endpoint driving one bundle.
pub struct QuicTransport {
    driver: Driver,
    out: Outgoing,
    rx: mpsc::Receiver<(SocketAddr, Bytes)>,
    stash: Option<(SocketAddr, Bytes)>,
    local: SocketAddr,
    origin: Instant,
    inc: u64,
    max_datagram: usize,
    /// The loss below QUIC, when bound with some (a test hook).
    wire_loss: Option<Arc<WireLoss>>,
}

impl std::fmt::Debug for QuicTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuicTransport")
            .field("local", &self.local)
            .field("stats", &self.out.stats)
            .finish_non_exhaustive()
    }
}

/// What sending takes, apart from the runtime that drives it: the connections, the endpoint
/// that opens them, the channel their datagrams arrive on, and the datagrams `send` queued.
struct Outgoing {
    shared: Arc<Shared>,
    endpoint: quinn::Endpoint,
    tx: mpsc::Sender<(SocketAddr, Bytes)>,
    /// Queued by [`Transport::send`], handed to quinn by the next flush (inside the runtime,
    /// so waking a connection's driver costs no system call); at most [`SEND_QUEUE_MAX`].
    queued: Vec<(SocketAddr, Bytes)>,
    stats: QuicStats,
}

impl Outgoing {
    /// Hands every queued datagram to quinn, in order, under one lock of the connections
    /// (the buffer is kept).
    fn send_queued(&mut self, rt: &Handle) {
        let counters = &self.shared.counters;
        let mut conns = self.shared.lock();
        for (to, b) in self.queued.drain(..) {
            match conns.get_mut(&to) {
                Some(Conn::Ready(link)) => {
                    if send_ready(counters, &link.conn, b) {
                        self.stats.sent += 1;
                    } else if link.conn.close_reason().is_some() && !link.replace_closed() {
                        conns.remove(&to);
                    }
                }
                Some(Conn::Connecting(q)) => {
                    if q.len() < CONNECT_QUEUE {
                        q.push_back(b);
                    } else {
                        Counters::add(&counters.send_dropped, 1);
                    }
                }
                Some(Conn::Failed(at)) if at.elapsed() < Duration::from_millis(200) => {
                    Counters::add(&counters.send_dropped, 1);
                }
                _ => {
                    conns.insert(to, Conn::Connecting(VecDeque::from([b])));
                    self.stats.connects += 1;
                    connect(rt, &self.endpoint, &self.shared, &self.tx, to);
                }
            }
        }
    }
}

/// Opens a connection to `to` on a task of `rt` (which takes the connections' lock, so it
/// waits for the caller to release it): adopted when up; on failure what waited for it is
/// dropped and counted, and the address marked failed.
fn connect(
    rt: &Handle,
    endpoint: &quinn::Endpoint,
    shared: &Arc<Shared>,
    tx: &mpsc::Sender<(SocketAddr, Bytes)>,
    to: SocketAddr,
) {
    let (ep, shared, tx) = (endpoint.clone(), shared.clone(), tx.clone());
    rt.spawn(async move {
        let conn = match ep.connect(to, SERVER_NAME) {
            Ok(c) => c.await.map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match conn {
            Ok(c) => adopt(&shared, &tx, c, true),
            Err(e) => {
                let h = &shared.counters;
                h.failed(&h.connects_failed, format!("connection to {to}: {e}"));
                let mut conns = shared.lock();
                // What waited for this connection is lost. (If the peer's own connection
                // came up meanwhile, it stays in use.)
                if let Some(Conn::Connecting(q)) = conns.get(&to) {
                    Counters::add(&h.send_dropped, q.len());
                    conns.insert(to, Conn::Failed(Instant::now()));
                }
            }
        }
    });
}

/// Hands `b` to quinn on a ready connection; `false` (and counted) when it is not sent.
fn send_ready(counters: &Counters, conn: &quinn::Connection, b: Bytes) -> bool {
    // quinn makes room for a datagram by discarding older unsent ones: drop this one instead,
    // so that every loss is counted.
    if b.len() > conn.datagram_send_buffer_space() {
        Counters::add(&counters.send_dropped, 1);
        return false;
    }
    match conn.send_datagram(b) {
        Ok(()) => true,
        Err(_) => {
            Counters::add(&counters.send_refused, 1);
            false
        }
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
        let driver = Driver::new()?;
        let (local, mut endpoint) = {
            let _g = driver.handle().enter();
            endpoint(sc, &cfg, wire_loss.clone()).and_then(|e| Ok((e.local_addr()?, e)))?
        };
        endpoint.set_default_client_config(cc);
        let shared = Arc::new(Shared::new());
        let (tx, rx) = mpsc::channel(RX_QUEUE);
        {
            let (ep, shared, tx) = (endpoint.clone(), shared.clone(), tx.clone());
            driver.handle().spawn(async move {
                while let Some(incoming) = ep.accept().await {
                    let (shared, tx) = (shared.clone(), tx.clone());
                    let from = incoming.remote_address();
                    tokio::spawn(async move {
                        // A peer without a certificate from our CA fails here.
                        match incoming.await {
                            Ok(conn) => adopt(&shared, &tx, conn, false),
                            Err(e) => {
                                let h = &shared.counters;
                                h.failed(&h.refused, format!("handshake from {from}: {e}"));
                            }
                        }
                    });
                }
            });
        }
        Ok(Self {
            driver,
            out: Outgoing {
                shared,
                endpoint,
                tx,
                queued: Vec::new(),
                stats: QuicStats::default(),
            },
            rx,
            stash: None,
            local,
            origin: Instant::now(),
            inc: wall_incarnation(),
            max_datagram: cfg.max_datagram,
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
            recv_dropped: c.recv_dropped(),
            handshakes_refused: c.refused(),
            connects_failed: c.connects_failed(),
            peer_resets: c.0.peer_resets.load(Ordering::Relaxed),
            idle_timeouts: c.0.idle_timeouts.load(Ordering::Relaxed),
            ..self.out.stats
        }
    }

    /// Test hook: from now on lose UDP datagrams quinn sends with probability `loss` (the
    /// draws restart from `wire_loss_seed`). Only for a transport bound with some wire loss.
    pub fn set_wire_loss(&self, loss: f64) -> Result<(), AmError> {
        WireLoss::check(loss)?;
        let w = self.wire_loss.as_ref().ok_or(AmError::BadArg(
            "set_wire_loss needs a transport bound with wire_loss above 0",
        ))?;
        w.set(loss);
        Ok(())
    }

    /// A handle on the counters of failed handshakes and lost datagrams (valid after the
    /// transport moved into a bundle).
    pub fn counters(&self) -> QuicCounters {
        QuicCounters(Arc::clone(&self.out.shared.counters))
    }

    /// The same handle as [`QuicTransport::counters`] (its handshake counters).
    pub fn handshakes(&self) -> QuicCounters {
        self.counters()
    }

    fn try_stash(&mut self) -> bool {
        if self.stash.is_none() {
            self.stash = self.rx.try_recv().ok();
        }
        self.stash.is_some()
    }
}

impl Drop for QuicTransport {
    fn drop(&mut self) {
        // What `send` queued, then the close frames, leave before the driver stops its runtime
        // (when it drops next).
        let rt = self.driver.handle().clone();
        let out = &mut self.out;
        self.driver.flush_before_drop(|| {
            out.send_queued(&rt);
            out.endpoint.close(0u32.into(), b"bye");
        });
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
        if self.out.queued.len() >= SEND_QUEUE_MAX {
            self.flush()?;
        }
        self.out.queued.push((to, Bytes::copy_from_slice(datagram)));
        Ok(())
    }
    fn flush(&mut self) -> Result<(), AmError> {
        let rt = self.driver.handle().clone();
        let out = &mut self.out;
        self.driver.flush_with(|| out.send_queued(&rt))
    }
    fn recv(
        &mut self,
        max: usize,
        sink: &mut dyn FnMut(NodeAddr, &[u8]),
    ) -> Result<usize, AmError> {
        let mut n = 0;
        while n < max {
            let item = match self.stash.take() {
                Some(i) => i,
                None => match self.rx.try_recv() {
                    Ok(i) => i,
                    Err(_) => break,
                },
            };
            sink(NodeAddr::Ip(item.0), &item.1);
            n += 1;
        }
        self.out.stats.received += n as u64;
        Ok(n)
    }
    fn has_pending(&mut self) -> bool {
        self.try_stash()
    }
    fn wait(&mut self, deadline: Option<Time>) -> Result<bool, AmError> {
        if !self.out.queued.is_empty() {
            self.flush()?;
        }
        if self.try_stash() {
            return Ok(true);
        }
        let d = deadline.map(|t| tokio_deadline(self.origin, t));
        let rx = &mut self.rx;
        let fut = async move {
            match d {
                Some(d) => tokio::time::timeout_at(d, rx.recv()).await.ok().flatten(),
                None => rx.recv().await,
            }
        };
        if let Some(got) = self.driver.block_on(fut)? {
            self.stash = got;
            return Ok(self.stash.is_some());
        }
        // On a current-thread runtime's thread we cannot block: the background thread drives
        // quinn and this one sleep-polls.
        loop {
            if self.try_stash() {
                return Ok(true);
            }
            if deadline.is_some_and(|d| self.now() >= d) {
                return Ok(false);
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }
    fn sleep_until(&mut self, t: Time) {
        sleep_until_real(self.now(), t);
    }
    async fn wait_async(&mut self, deadline: Option<Time>) -> Result<bool, AmError> {
        // The caller's runtime cannot drive ours: a background thread does.
        self.driver.background()?;
        if !self.out.queued.is_empty() {
            self.flush()?;
        }
        if self.try_stash() {
            return Ok(true);
        }
        let d = deadline.map(|t| tokio_deadline(self.origin, t));
        let got = match d {
            Some(d) => tokio::time::timeout_at(d, self.rx.recv())
                .await
                .ok()
                .flatten(),
            None => self.rx.recv().await,
        };
        self.stash = got;
        Ok(self.stash.is_some())
    }
}

#[cfg(test)]
mod tests;
