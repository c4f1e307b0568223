//! The token manager daemon's driver (feature `daemon`): a tokio task around the same
//! [`TokenManager`] the simulator drives.
//!
//! The driver only moves bytes and runs the timer: packets from the [`PacketPort`] (one
//! reliable FIFO link per neighbour, peer id = [`LinkId`]) go to
//! [`TokenManager::handle_input`]; [`TokenManager::poll_transmit`] goes back to the port;
//! [`TokenManager::poll_timeout`] becomes the wait's deadline. Input the TM refuses with
//! back-pressure is held (in order) and retried; every other refusal is counted by the TM and
//! logged at debug level.

use crate::{LinkId, TmConfig, TmError, TmStats, TokenManager};
use isotach_am::port::{PacketPort, PortEvent, PortStats};
use isotach_am::{AmError, NodeAddr, Transport};
use isotach_proto::config::ClusterConfig;
use isotach_proto::topology::{Hop, SwitchId};
use std::collections::VecDeque;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use thiserror::Error;
use tokio::sync::watch;

/// Longest single wait of the driver loop (the loop re-checks timers at least this often).
const WAIT_MAX: Duration = Duration::from_millis(50);

/// How often the driver loop publishes its [`TmSnapshot`] at most.
const PUBLISH_EVERY: Duration = Duration::from_millis(5);

/// A running token manager's state, published by the driver loop (read by the admin service).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TmSnapshot {
    /// Logical time has started.
    pub started: bool,
    /// Current generation.
    pub generation: u32,
    /// Waves sent in this generation.
    pub waves: u64,
    /// Packets in the TM's output queue.
    pub queue_depth: usize,
    /// Inputs held by the driver for back-pressure.
    pub held: usize,
    /// Neighbours that answered the hello, of `links`.
    pub peers_up: usize,
    /// Neighbours.
    pub links: usize,
    /// Microseconds since the daemon started.
    pub uptime_us: u64,
    /// The state machine's counters.
    pub stats: TmStats,
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

/// The TM's configuration and its peers' addresses (by link), from a cluster config.
pub fn tm_setup(
    cluster: &ClusterConfig,
    switch: SwitchId,
) -> Result<(TmConfig, SocketAddr, Vec<NodeAddr>), DaemonError> {
    let name = |s: SwitchId| cluster.switch_names[usize::from(s)].clone();
    let listen = cluster
        .switch_listen
        .get(usize::from(switch))
        .copied()
        .flatten()
        .ok_or_else(|| DaemonError::Config(format!("switch `{}` has no listen", name(switch))))?;
    let cfg = TmConfig {
        switch,
        topology: Arc::new(cluster.topology.clone()),
        timing: cluster.timing,
        limits: cluster.limits,
    };
    let probe = TokenManager::new(cfg.clone());
    let mut peers = Vec::new();
    for hop in probe.links() {
        let addr = match hop {
            Hop::Host(h) => cluster.host_siu[usize::from(h)].ok_or_else(|| {
                let host = &cluster.host_names[usize::from(h)];
                DaemonError::Config(format!("host `{host}` has no siu address"))
            })?,
            Hop::Switch(s) => cluster.switch_listen[usize::from(s)].ok_or_else(|| {
                DaemonError::Config(format!("switch `{}` has no listen", name(s)))
            })?,
        };
        peers.push(NodeAddr::Ip(addr));
    }
    Ok((cfg, listen, peers))
}

/// A running token manager: the state machine plus its port.
#[derive(Debug)]
pub struct TmDaemon<T: Transport> {
    tm: TokenManager,
    port: PacketPort<T>,
    held: VecDeque<(LinkId, Vec<u8>)>,
    origin: Instant,
    peers_up: usize,
    snapshot: watch::Sender<TmSnapshot>,
    published: Instant,
}

impl<T: Transport> TmDaemon<T> {
    /// A daemon for `tm` over `port` (peer id = link id).
    pub fn new(tm: TokenManager, port: PacketPort<T>) -> Self {
        Self {
            tm,
            port,
            held: VecDeque::new(),
            origin: Instant::now(),
            peers_up: 0,
            snapshot: watch::Sender::new(TmSnapshot::default()),
            published: Instant::now(),
        }
    }

    /// The state the driver loop publishes (every few milliseconds while it runs).
    pub fn snapshot(&self) -> watch::Receiver<TmSnapshot> {
        self.snapshot.subscribe()
    }

    fn publish(&mut self) {
        self.published = Instant::now();
        let s = TmSnapshot {
            started: self.tm.started(),
            generation: self.tm.generation(),
            waves: self.tm.waves(),
            queue_depth: self.tm.queue_depth(),
            held: self.held.len(),
            peers_up: self.peers_up,
            links: self.tm.links.len(),
            uptime_us: self.now_us(),
            stats: self.tm.stats(),
            port: self.port.stats(),
        };
        self.snapshot.send_replace(s);
    }

    fn now_us(&self) -> u64 {
        self.origin.elapsed().as_micros() as u64
    }

    /// Runs until `shutdown` completes; returns the state machine (for its counters).
    pub async fn run(
        mut self,
        shutdown: impl Future<Output = ()>,
    ) -> Result<TokenManager, DaemonError> {
        let mut shutdown = std::pin::pin!(shutdown);
        tracing::info!(
            switch = self.tm.cfg.switch,
            addr = %self.port.local_addr(),
            links = self.tm.links.len(),
            "token manager up; waiting for neighbours"
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
            waves = self.tm.waves(),
            stats = ?self.tm.stats(),
            port = ?self.port.stats(),
            am = ?self.port.bundle().stats(),
            "token manager stopped"
        );
        Ok(self.tm)
    }

    /// One pass: arrivals in, timers, output out. Never blocks.
    pub fn step(&mut self) -> Result<(), DaemonError> {
        self.port.poll()?;
        self.events();
        let now = self.now_us();
        self.feed(now)?;
        self.tm.handle_timeout(now);
        self.drain()?;
        self.port.poll()?;
        if self.published.elapsed() >= PUBLISH_EVERY {
            self.publish();
        }
        Ok(())
    }

    fn events(&mut self) {
        while let Some(ev) = self.port.take_event() {
            match ev {
                PortEvent::PeerUp(link) => {
                    self.peers_up += 1;
                    tracing::info!(
                        link,
                        peer = ?self.tm.links[link].peer,
                        up = self.peers_up,
                        of = self.tm.links.len(),
                        "neighbour up"
                    );
                }
                PortEvent::Returned { peer, status, data } => tracing::warn!(
                    link = peer,
                    ?status,
                    data,
                    "message to neighbour returned undelivered"
                ),
            }
        }
    }

    fn feed(&mut self, now: u64) -> Result<(), DaemonError> {
        loop {
            let next = match self.held.pop_front() {
                Some(p) => Some(p),
                None => self.port.recv(),
            };
            let Some((link, bytes)) = next else {
                return Ok(());
            };
            match self.tm.handle_input(now, link, &bytes) {
                Ok(()) => {}
                Err(TmError::Backpressure(_)) => {
                    self.held.push_front((link, bytes));
                    return Ok(());
                }
                Err(e) => tracing::debug!(%e, "input refused"),
            }
            self.drain()?;
        }
    }

    fn drain(&mut self) -> Result<(), DaemonError> {
        while let Some((link, bytes)) = self.tm.poll_transmit() {
            self.port.send(link, &bytes)?;
        }
        Ok(())
    }

    fn wait_time(&self) -> Duration {
        if !self.held.is_empty() {
            return Duration::from_millis(1);
        }
        match self.tm.poll_timeout() {
            Some(t) => Duration::from_micros(t.saturating_sub(self.now_us())).min(WAIT_MAX),
            None => WAIT_MAX,
        }
    }
}
