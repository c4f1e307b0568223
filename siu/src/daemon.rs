//! The SIU daemon's driver (feature `daemon`): a tokio task around the same [`Siu`] the
//! simulator drives.
//!
//! Peers of its [`PacketPort`] (all reliable, per-peer FIFO): [`PEER_TM`] (its token manager:
//! tokens and isotach messages), [`PEER_APP`] (the host's SMM application: the host side),
//! then the other hosts' SIUs (non-isotach traffic goes host to host directly).
//!
//! The driver only moves bytes and runs timers. Two rules keep the host's stream intact
//! without protocol logic here: host packets the SIU refuses with `NotStarted` (before the
//! reset wave arrived) or with back-pressure are held in order and retried (everything after
//! a held packet waits behind it); network packets refused with back-pressure likewise. The
//! initiating SIU (host 0) calls [`Siu::start`] once its token manager answered the hello.

use crate::{Route, Siu, SiuConfig, SiuError, SiuStats};
use isotach_am::port::{PacketPort, PortEvent, PortStats};
use isotach_am::{AmError, NodeAddr, Transport};
use isotach_proto::config::ClusterConfig;
use isotach_proto::topology::HostId;
use std::collections::VecDeque;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use thiserror::Error;
use tokio::sync::watch;

/// Peer id of the token manager.
pub const PEER_TM: usize = 0;
/// Peer id of the host's SMM application.
pub const PEER_APP: usize = 1;
/// Longest single wait of the driver loop.
const WAIT_MAX: Duration = Duration::from_millis(50);
/// Wait while held input is pending (it is retried after this).
const RETRY: Duration = Duration::from_millis(1);

/// How often the driver loop publishes its [`SiuSnapshot`] at most.
const PUBLISH_EVERY: Duration = Duration::from_millis(5);

/// A running SIU's state, published by the driver loop (read by the admin service).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SiuSnapshot {
    /// Logical time has started.
    pub started: bool,
    /// Current generation.
    pub generation: u32,
    /// Normal tokens sent in this generation.
    pub sendclock: u64,
    /// The current pulse.
    pub recvclock: u64,
    /// Packets queued for the host.
    pub to_host: usize,
    /// Packets queued for the network.
    pub to_net: usize,
    /// Host packets held by the driver (not started yet, or back-pressure).
    pub host_held: usize,
    /// Network packets held by the driver for back-pressure.
    pub net_held: usize,
    /// Microseconds since the daemon started.
    pub uptime_us: u64,
    /// The state machine's counters.
    pub stats: SiuStats,
    /// The port's counters.
    pub port: PortStats,
}

/// Why a daemon could not start or stopped with an error.
#[derive(Debug, Error)]
pub enum DaemonError {
    /// The configuration lacks something the daemon needs.
    #[error("config: {0}")]
    Config(String),
    /// The transport failed.
    #[error("transport: {0}")]
    Am(#[from] AmError),
}

/// The SIU's configuration, its listen address and its peers (see the module documentation),
/// from a cluster config. Host 0 initiates the reset.
pub fn siu_setup(
    cluster: &ClusterConfig,
    host: HostId,
) -> Result<(SiuConfig, SocketAddr, Vec<NodeAddr>), DaemonError> {
    let h = usize::from(host);
    let name = &cluster.host_names[h];
    let listen = cluster.host_siu[h]
        .ok_or_else(|| DaemonError::Config(format!("host `{name}` has no siu address")))?;
    let switch = cluster.topology.switch_of(host);
    let tm = cluster.switch_listen[usize::from(switch)].ok_or_else(|| {
        let s = &cluster.switch_names[usize::from(switch)];
        DaemonError::Config(format!("switch `{s}` has no listen address"))
    })?;
    let app = cluster.host_app[h]
        .ok_or_else(|| DaemonError::Config(format!("host `{name}` has no app address")))?;
    let mut peers = vec![NodeAddr::Ip(tm), NodeAddr::Ip(app)];
    for (other, addr) in cluster.host_siu.iter().enumerate() {
        if other != h {
            let addr = addr.ok_or_else(|| {
                let o = &cluster.host_names[other];
                DaemonError::Config(format!("host `{o}` has no siu address"))
            })?;
            peers.push(NodeAddr::Ip(addr));
        }
    }
    let cfg = SiuConfig {
        host,
        mode: crate::Mode::Siu,
        topology: Arc::new(cluster.topology.clone()),
        timing: cluster.timing,
        limits: cluster.limits,
        initiates_reset: host == 0,
    };
    Ok((cfg, listen, peers))
}

/// Gauges a running SIU daemon publishes (read by the embedded demo and status).
#[derive(Debug, Default)]
pub struct SiuGauges {
    /// The SIU's receive clock (the current pulse).
    pub recvclock: AtomicU64,
    /// Logical time started here (0 or 1).
    pub started: AtomicU64,
}

/// A running SIU: the state machine plus its port.
#[derive(Debug)]
pub struct SiuDaemon<T: Transport> {
    siu: Siu,
    port: PacketPort<T>,
    /// Peer id of each host's SIU (`None` for this host).
    siu_peer: Vec<Option<usize>>,
    host_held: VecDeque<Vec<u8>>,
    net_held: VecDeque<Vec<u8>>,
    start_pending: bool,
    origin: Instant,
    gauges: Arc<SiuGauges>,
    snapshot: watch::Sender<SiuSnapshot>,
    published: Instant,
}

impl<T: Transport> SiuDaemon<T> {
    /// A daemon for `siu` over `port`, whose peers are laid out as [`siu_setup`] returns them.
    pub fn new(siu: Siu, port: PacketPort<T>) -> Self {
        let me = usize::from(siu.host());
        let hosts = siu.config().topology.host_count();
        let siu_peer = (0..hosts)
            .map(|h| match h.cmp(&me) {
                std::cmp::Ordering::Less => Some(2 + h),
                std::cmp::Ordering::Equal => None,
                std::cmp::Ordering::Greater => Some(1 + h),
            })
            .collect();
        Self {
            start_pending: siu.config().initiates_reset,
            siu,
            port,
            siu_peer,
            host_held: VecDeque::new(),
            net_held: VecDeque::new(),
            origin: Instant::now(),
            gauges: Arc::new(SiuGauges::default()),
            snapshot: watch::Sender::new(SiuSnapshot::default()),
            published: Instant::now(),
        }
    }

    /// The state the driver loop publishes (every few milliseconds while it runs).
    pub fn snapshot(&self) -> watch::Receiver<SiuSnapshot> {
        self.snapshot.subscribe()
    }

    fn publish(&mut self) {
        self.published = Instant::now();
        let (to_host, to_net) = self.siu.queue_depths();
        let s = SiuSnapshot {
            started: self.siu.started(),
            generation: self.siu.generation(),
            sendclock: self.siu.sendclock(),
            recvclock: self.siu.recvclock(),
            to_host,
            to_net,
            host_held: self.host_held.len(),
            net_held: self.net_held.len(),
            uptime_us: self.now_us(),
            stats: self.siu.stats(),
            port: self.port.stats(),
        };
        self.snapshot.send_replace(s);
    }

    /// The gauges this daemon updates.
    pub fn gauges(&self) -> Arc<SiuGauges> {
        Arc::clone(&self.gauges)
    }

    fn now_us(&self) -> u64 {
        self.origin.elapsed().as_micros() as u64
    }

    /// Runs until `shutdown` completes; returns the state machine (for its counters).
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) -> Result<Siu, DaemonError> {
        let mut shutdown = std::pin::pin!(shutdown);
        tracing::info!(
            host = self.siu.host(),
            addr = %self.port.local_addr(),
            "SIU up; waiting for the token manager and the application"
        );
        loop {
            self.step()?;
            let timeout = self.wait_time();
            tokio::select! {
                biased;
                () = &mut shutdown => break,
                r = self.port.wait_async(timeout) => { r?; }
            }
        }
        tracing::info!(
            host = self.siu.host(),
            recvclock = self.siu.recvclock(),
            stats = ?self.siu.stats(),
            port = ?self.port.stats(),
            am = ?self.port.bundle().stats(),
            "SIU stopped"
        );
        Ok(self.siu)
    }

    /// One pass: arrivals in, timers, output out. Never blocks.
    pub fn step(&mut self) -> Result<(), DaemonError> {
        self.port.poll()?;
        self.events();
        let now = self.now_us();
        if self.start_pending && self.port.is_up(PEER_TM) {
            self.start_pending = false;
            tracing::info!(
                host = self.siu.host(),
                "token manager up: starting logical time"
            );
            self.siu.start(now);
        }
        self.feed(now)?;
        self.siu.handle_timeout(now);
        self.drain()?;
        self.port.poll()?;
        self.gauges
            .recvclock
            .store(self.siu.recvclock(), Ordering::Relaxed);
        self.gauges
            .started
            .store(u64::from(self.siu.started()), Ordering::Relaxed);
        if self.published.elapsed() >= PUBLISH_EVERY {
            self.publish();
        }
        Ok(())
    }

    fn events(&mut self) {
        while let Some(ev) = self.port.take_event() {
            match ev {
                PortEvent::PeerUp(peer) => {
                    tracing::info!(
                        host = self.siu.host(),
                        peer = self.peer_name(peer),
                        "peer up"
                    )
                }
                PortEvent::Returned { peer, status, data } => tracing::warn!(
                    host = self.siu.host(),
                    peer = self.peer_name(peer),
                    ?status,
                    data,
                    "message returned undelivered"
                ),
            }
        }
    }

    fn peer_name(&self, peer: usize) -> String {
        match peer {
            PEER_TM => "token manager".into(),
            PEER_APP => "application".into(),
            p => {
                let h = self.siu_peer.iter().position(|&x| x == Some(p));
                format!("SIU of host {}", h.unwrap_or(usize::MAX))
            }
        }
    }

    fn feed(&mut self, now: u64) -> Result<(), DaemonError> {
        // Held input first, in order.
        while let Some(b) = self.net_held.pop_front() {
            if !self.net_input(now, b)? {
                break;
            }
        }
        while let Some(b) = self.host_held.pop_front() {
            if !self.host_input(now, b)? {
                break;
            }
        }
        while let Some((peer, bytes)) = self.port.recv() {
            if peer == PEER_APP {
                if self.host_held.is_empty() {
                    self.host_input(now, bytes)?;
                } else {
                    self.host_held.push_back(bytes);
                }
            } else if self.net_held.is_empty() {
                self.net_input(now, bytes)?;
            } else {
                self.net_held.push_back(bytes);
            }
        }
        Ok(())
    }

    /// Returns false when the packet was held (it is back at the head of the held queue).
    fn host_input(&mut self, now: u64, bytes: Vec<u8>) -> Result<bool, DaemonError> {
        match self.siu.handle_host(now, &bytes) {
            Ok(()) => {}
            Err(SiuError::NotStarted | SiuError::Backpressure { .. }) => {
                self.host_held.push_front(bytes);
                return Ok(false);
            }
            Err(e) => tracing::warn!(host = self.siu.host(), %e, "host packet refused"),
        }
        self.drain()?;
        Ok(true)
    }

    fn net_input(&mut self, now: u64, bytes: Vec<u8>) -> Result<bool, DaemonError> {
        match self.siu.handle_net(now, &bytes) {
            Ok(()) => {}
            Err(SiuError::Backpressure { .. }) => {
                self.net_held.push_front(bytes);
                return Ok(false);
            }
            Err(e) => tracing::debug!(host = self.siu.host(), %e, "network packet refused"),
        }
        self.drain()?;
        Ok(true)
    }

    fn drain(&mut self) -> Result<(), DaemonError> {
        while let Some(tx) = self.siu.poll_net() {
            let peer = match tx.route {
                Route::Tm => Some(PEER_TM),
                Route::Host(h) => self.siu_peer.get(usize::from(h)).copied().flatten(),
            };
            match peer {
                Some(p) => self.port.send(p, &tx.bytes)?,
                None => tracing::warn!(route = ?tx.route, "no peer for a network packet"),
            }
        }
        while let Some(b) = self.siu.poll_host() {
            self.port.send(PEER_APP, &b)?;
        }
        Ok(())
    }

    fn wait_time(&self) -> Duration {
        if !self.host_held.is_empty() || !self.net_held.is_empty() || self.start_pending {
            return RETRY;
        }
        match self.siu.poll_timeout() {
            Some(t) => Duration::from_micros(t.saturating_sub(self.now_us())).min(WAIT_MAX),
            None => WAIT_MAX,
        }
    }
}
