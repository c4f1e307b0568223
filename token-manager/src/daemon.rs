//! The token manager daemon's driver (feature `daemon`): a tokio task around the same
//! [`TokenManager`] the simulator drives.
//!
//! The driver only moves bytes and runs the timer: packets from the [`PacketPort`] (one
//! reliable FIFO link per neighbour, peer id = [`LinkId`]) go to
//! [`TokenManager::handle_input`]; [`TokenManager::poll_transmit`] goes back to the port;
//! [`TokenManager::poll_timeout`] becomes the wait's deadline. Input the TM refuses with
//! back-pressure is held (in order) and retried; every other refusal is counted by the TM and
//! logged at debug level. Output waits while the port's queue towards its link is full.
//!
//! A neighbour whose link breaks (it restarted, or the AM layer gave up on it) is logged; the
//! TM keeps running, and when the neighbour is back it starts a new logical-time generation
//! unless another node already did ([`Rejoin`]; `docs/operations.md`, "Peer loss and
//! restarts").

use crate::{LinkId, TmConfig, TmError, TmStats, TokenManager};
pub use isotach_am::port::DaemonError;
use isotach_am::port::{Driver, Offered, PacketPort, PeerStatus, PortEvent, PortStats};
use isotach_am::telemetry::{PeriodMeter, RateMeter, Telemetry};
use isotach_am::{NodeAddr, Transport};
use isotach_proto::config::ClusterConfig;
use isotach_proto::packet::Token;
use isotach_proto::topology::{Hop, SwitchId};
use isotach_proto::wave::Rejoin;
use std::collections::VecDeque;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Longest single wait of the driver loop (the loop re-checks timers at least this often).
const WAIT_MAX: Duration = Duration::from_millis(50);

/// How often the driver loop publishes its [`TmSnapshot`] at most.
const PUBLISH_EVERY: Duration = Duration::from_millis(5);

/// Histogram of the time between waves (µs).
pub const HIST_WAVE_PERIOD: &str = "wave_period_us";
/// Histogram of the duration of driver passes that handled input (µs).
pub const HIST_PASS: &str = "pass_us";

/// A running token manager's state, published by the driver loop (read by the admin service).
#[derive(Debug, Clone, Default, PartialEq)]
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
    /// Microseconds since the daemon started.
    pub uptime_us: u64,
    /// Waves per second over the last full second.
    pub wave_rate_per_s: f64,
    /// Each neighbour's link, by link id.
    pub peers: Vec<PeerStatus>,
    /// What each link leads to, by link id ("SIU of host 2", "TM of switch 1"; fixed for the
    /// daemon's life).
    pub peer_names: Arc<[String]>,
    /// The state machine's counters.
    pub stats: TmStats,
    /// The port's counters.
    pub port: PortStats,
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
    /// What each link leads to, by link id.
    peer_names: Arc<[String]>,
    /// A packet the port had no room for (output waits behind it).
    stalled: Option<(LinkId, Vec<u8>)>,
    origin: Instant,
    rejoin: Rejoin,
    snapshot: watch::Sender<TmSnapshot>,
    published: Instant,
    telemetry: Arc<Telemetry>,
    wave_period: PeriodMeter,
    wave_rate: RateMeter,
    /// Repeat tokens dropped because the link was full (see [`Token::is_repeat`]).
    repeats_dropped: u64,
}

impl<T: Transport> TmDaemon<T> {
    /// A daemon for `tm` over `port` (peer id = link id). The port's queues are bounded by
    /// the config's `queue-packets-max`.
    pub fn new(tm: TokenManager, mut port: PacketPort<T>) -> Self {
        port.set_queue_max(tm.cfg.limits.queue_packets_max);
        let links = tm.links.len();
        let peer_names = tm
            .links
            .iter()
            .map(|l| match l.peer {
                Hop::Host(h) => format!("SIU of host {h}"),
                Hop::Switch(s) => format!("TM of switch {s}"),
            })
            .collect();
        Self {
            tm,
            port,
            held: VecDeque::new(),
            peer_names,
            stalled: None,
            origin: Instant::now(),
            rejoin: Rejoin::new(links),
            snapshot: watch::Sender::new(TmSnapshot::default()),
            published: Instant::now(),
            telemetry: Arc::new(Telemetry::new(&[HIST_WAVE_PERIOD, HIST_PASS])),
            wave_period: PeriodMeter::new(),
            wave_rate: RateMeter::new(0),
            repeats_dropped: 0,
        }
    }

    /// The daemon's latency histograms ([`HIST_WAVE_PERIOD`], [`HIST_PASS`]).
    pub fn telemetry(&self) -> Arc<Telemetry> {
        Arc::clone(&self.telemetry)
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
            held: self.held.len() + usize::from(self.stalled.is_some()),
            uptime_us: self.now_us(),
            wave_rate_per_s: self.wave_rate.observe(self.tm.waves()),
            peers: self.port.peer_status(),
            peer_names: Arc::clone(&self.peer_names),
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
        tracing::info!(
            switch = self.tm.cfg.switch,
            addr = %self.port.local_addr(),
            links = self.tm.links.len(),
            "token manager up; waiting for neighbours"
        );
        isotach_am::port::drive(&mut self, shutdown).await?;
        tracing::info!(
            waves = self.tm.waves(),
            stats = ?self.tm.stats(),
            port = ?self.port.stats(),
            broken_links = self.rejoin.pending(),
            repeats_dropped = self.repeats_dropped,
            am = ?self.port.bundle().stats(),
            "token manager stopped"
        );
        Ok(self.tm)
    }

    fn events(&mut self) {
        while let Some(ev) = self.port.take_event() {
            let generation = self.tm.generation();
            match ev {
                PortEvent::PeerUp(link) => {
                    tracing::info!(
                        link,
                        peer = ?self.tm.links[link].peer,
                        up = self.port.peers_up(),
                        of = self.tm.links.len(),
                        "neighbour up"
                    );
                    if self.rejoin.back(link, generation) && self.tm.started() {
                        tracing::warn!(
                            link,
                            generation = generation.wrapping_add(1),
                            "neighbour back after a broken link: starting a new generation"
                        );
                        self.tm.begin_restart(self.now_us());
                    }
                }
                PortEvent::PeerLost {
                    peer,
                    reason,
                    dropped,
                } => {
                    tracing::warn!(
                        link = peer,
                        neighbour = ?self.tm.links[peer].peer,
                        ?reason,
                        dropped,
                        generation,
                        "lost neighbour: logical time waits until it is back"
                    );
                    self.rejoin.broken(peer, generation);
                }
                PortEvent::HelloReturned { peer, status } => {
                    tracing::debug!(link = peer, ?status, "neighbour not answering yet");
                }
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
        while let Some((link, bytes)) = self.stalled.take().or_else(|| self.tm.poll_transmit()) {
            match self.port.offer(link, bytes, Token::is_repeat)? {
                Offered::Sent => {}
                Offered::Dropped => self.repeats_dropped += 1,
                Offered::Held(bytes) => {
                    // Back-pressure: the TM's own bounded queue fills behind this packet.
                    self.stalled = Some((link, bytes));
                    break;
                }
            }
        }
        Ok(())
    }
}

impl<T: Transport> Driver for TmDaemon<T> {
    type Transport = T;

    fn step(&mut self) -> Result<(), DaemonError> {
        let pass = Instant::now();
        let handled = self.port.poll()?;
        self.events();
        let now = self.now_us();
        self.feed(now)?;
        self.tm.handle_timeout(now);
        self.drain()?;
        self.port.poll()?;
        self.wave_period
            .observe(&self.telemetry, HIST_WAVE_PERIOD, self.tm.waves());
        if handled > 0 {
            self.telemetry
                .record(HIST_PASS, pass.elapsed().as_micros() as u64);
        }
        if self.published.elapsed() >= PUBLISH_EVERY {
            self.publish();
        }
        Ok(())
    }

    fn wait_time(&self) -> Duration {
        if self.blocked() {
            return Duration::from_millis(1);
        }
        match self.tm.poll_timeout() {
            Some(t) => Duration::from_micros(t.saturating_sub(self.now_us())).min(WAIT_MAX),
            None => WAIT_MAX,
        }
    }

    fn blocked(&self) -> bool {
        !self.held.is_empty() || self.stalled.is_some()
    }

    fn port_mut(&mut self) -> &mut PacketPort<T> {
        &mut self.port
    }
}
