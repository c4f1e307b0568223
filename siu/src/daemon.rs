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
//! Held queues and the port's queues are bounded by the config's `queue-packets-max`; output
//! waits while the port has no room towards its peer (back-pressure reaches the state
//! machine's own bounded queues, which then refuse input).
//!
//! A lost peer is logged and the daemon keeps running. When the token manager's link broke
//! (it restarted, or the AM layer gave up on it) and it is back, the SIU starts a new
//! logical-time generation unless another node already did ([`Rejoin`]; `docs/operations.md`,
//! "Peer loss and restarts"). A lost application or other SIU does not touch logical time.

use crate::{Route, Siu, SiuConfig, SiuError, SiuStats};
pub use isotach_am::port::DaemonError;
use isotach_am::port::{Driver, Offered, PacketPort, PeerStatus, PortEvent, PortStats};
use isotach_am::telemetry::{PeriodMeter, RateMeter, Telemetry};
use isotach_am::{NodeAddr, Transport};
use isotach_proto::config::ClusterConfig;
use isotach_proto::packet::{Kind, Token, peek_kind};
use isotach_proto::topology::HostId;
use isotach_proto::wave::Rejoin;
use std::collections::VecDeque;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
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

/// Histogram of the time between pulses (µs).
pub const HIST_PULSE_PERIOD: &str = "pulse_period_us";
/// Histogram of the time from a token's arrival from the token manager to the SIU's next
/// token to it (µs): how long this SIU holds the wave.
pub const HIST_TOKEN_TURNAROUND: &str = "token_turnaround_us";
/// Histogram of the duration of driver passes that handled input (µs).
pub const HIST_PASS: &str = "pass_us";

/// A running SIU's state, published by the driver loop (read by the admin service).
#[derive(Debug, Clone, Default, PartialEq)]
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
    /// Pulses per second over the last full second.
    pub pulse_rate_per_s: f64,
    /// This host's isochrons stamped for pulses that have not ended.
    pub outstanding_isochrons: u64,
    /// Isotach packets handed to the host for pulses that have not ended.
    pub pending_pulse_packets: u64,
    /// Each peer's link, by peer id ([`PEER_TM`], [`PEER_APP`], then the other SIUs).
    pub peers: Vec<PeerStatus>,
    /// Names of the peers, by peer id (fixed for the daemon's life).
    pub peer_names: Arc<[String]>,
    /// The state machine's counters.
    pub stats: SiuStats,
    /// The port's counters.
    pub port: PortStats,
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
    /// Each peer's name, by peer id ("token manager", "application", "SIU of host 2").
    peer_names: Arc<[String]>,
    host_held: VecDeque<Vec<u8>>,
    net_held: VecDeque<Vec<u8>>,
    /// Most packets held (per direction) before the driver stops reading the port.
    held_max: usize,
    /// A network packet the port had no room for (network output waits behind it).
    net_stalled: Option<(usize, Vec<u8>)>,
    /// A host packet the port had no room for (host output waits behind it).
    host_stalled: Option<Vec<u8>>,
    start_pending: bool,
    rejoin: Rejoin,
    origin: Instant,
    gauges: Arc<SiuGauges>,
    snapshot: watch::Sender<SiuSnapshot>,
    published: Instant,
    telemetry: Arc<Telemetry>,
    pulse_period: PeriodMeter,
    pulse_rate: RateMeter,
    /// When the last token from the token manager arrived (cleared by our next token).
    token_in_at: Option<Instant>,
    /// Repeat tokens dropped because the link was full (see [`Token::is_repeat`]).
    repeats_dropped: u64,
    /// Packets for the host dropped since the application was last up (none attached).
    absent_dropped: u64,
    /// An application is attached: it answered our hello or sent us something since its link
    /// last broke. Packets for the host go to the port (which queues them until the hello is
    /// answered); otherwise to [`Siu::host_absent`].
    app_attached: bool,
}

impl<T: Transport> SiuDaemon<T> {
    /// A daemon for `siu` over `port`, whose peers are laid out as [`siu_setup`] returns them.
    /// The port's queues are bounded by the config's `queue-packets-max`.
    pub fn new(siu: Siu, mut port: PacketPort<T>) -> Self {
        let held_max = siu.config().limits.queue_packets_max.max(1);
        port.set_queue_max(held_max);
        let peers = port.peer_addrs().count();
        let me = usize::from(siu.host());
        let hosts = siu.config().topology.host_count();
        let siu_peer: Vec<Option<usize>> = (0..hosts)
            .map(|h| match h.cmp(&me) {
                std::cmp::Ordering::Less => Some(2 + h),
                std::cmp::Ordering::Equal => None,
                std::cmp::Ordering::Greater => Some(1 + h),
            })
            .collect();
        let peer_names = (0..peers)
            .map(|p| match p {
                PEER_TM => "token manager".to_string(),
                PEER_APP => "application".to_string(),
                p => {
                    let h = siu_peer.iter().position(|&x| x == Some(p));
                    format!("SIU of host {}", h.unwrap_or(usize::MAX))
                }
            })
            .collect();
        Self {
            start_pending: siu.config().initiates_reset,
            siu,
            port,
            siu_peer,
            peer_names,
            host_held: VecDeque::new(),
            net_held: VecDeque::new(),
            held_max,
            net_stalled: None,
            host_stalled: None,
            rejoin: Rejoin::new(peers),
            origin: Instant::now(),
            gauges: Arc::new(SiuGauges::default()),
            snapshot: watch::Sender::new(SiuSnapshot::default()),
            published: Instant::now(),
            telemetry: Arc::new(Telemetry::new(&[
                HIST_PULSE_PERIOD,
                HIST_TOKEN_TURNAROUND,
                HIST_PASS,
            ])),
            pulse_period: PeriodMeter::new(),
            pulse_rate: RateMeter::new(0),
            token_in_at: None,
            repeats_dropped: 0,
            absent_dropped: 0,
            app_attached: false,
        }
    }

    /// The daemon's latency histograms ([`HIST_PULSE_PERIOD`], [`HIST_TOKEN_TURNAROUND`],
    /// [`HIST_PASS`]).
    pub fn telemetry(&self) -> Arc<Telemetry> {
        Arc::clone(&self.telemetry)
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
            host_held: self.host_held.len() + usize::from(self.host_stalled.is_some()),
            net_held: self.net_held.len() + usize::from(self.net_stalled.is_some()),
            uptime_us: self.now_us(),
            pulse_rate_per_s: self.pulse_rate.observe(self.siu.recvclock()),
            outstanding_isochrons: self.siu.outstanding_isochrons(),
            pending_pulse_packets: self.siu.pending_pulse_packets(),
            peers: self.port.peer_status(),
            peer_names: Arc::clone(&self.peer_names),
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
        tracing::info!(
            host = self.siu.host(),
            addr = %self.port.local_addr(),
            "SIU up; waiting for the token manager and the application"
        );
        isotach_am::port::drive(&mut self, shutdown).await?;
        tracing::info!(
            host = self.siu.host(),
            recvclock = self.siu.recvclock(),
            stats = ?self.siu.stats(),
            port = ?self.port.stats(),
            am = ?self.port.bundle().stats(),
            broken_links = self.rejoin.pending(),
            repeats_dropped = self.repeats_dropped,
            "SIU stopped"
        );
        Ok(self.siu)
    }

    fn events(&mut self) {
        while let Some(ev) = self.port.take_event() {
            let generation = self.siu.generation();
            match ev {
                PortEvent::PeerUp(peer) => {
                    tracing::info!(
                        host = self.siu.host(),
                        peer = self.peer_name(peer),
                        "peer up"
                    );
                    if peer == PEER_APP {
                        self.app_attach();
                    }
                    if self.rejoin.back(peer, generation) && self.siu.started() {
                        tracing::warn!(
                            host = self.siu.host(),
                            generation = generation.wrapping_add(1),
                            "token manager back after a broken link: starting a new generation"
                        );
                        self.token_in_at = None;
                        self.siu.start(self.now_us());
                    }
                }
                PortEvent::PeerLost {
                    peer,
                    reason,
                    dropped,
                } => {
                    tracing::warn!(
                        host = self.siu.host(),
                        peer = self.peer_name(peer),
                        ?reason,
                        dropped,
                        generation,
                        "lost peer"
                    );
                    if peer == PEER_TM {
                        // Only the token path matters to logical time.
                        self.rejoin.broken(peer, generation);
                    }
                    if peer == PEER_APP {
                        self.app_attached = false;
                    }
                }
                PortEvent::HelloReturned { peer, status } => tracing::debug!(
                    host = self.siu.host(),
                    peer = self.peer_name(peer),
                    ?status,
                    "peer not answering yet"
                ),
            }
        }
    }

    /// An application attached (first sign of it since its link last broke): the SIU orders
    /// its first isochron after everything handed to the host before, and the packets dropped
    /// while none was attached are logged.
    fn app_attach(&mut self) {
        if self.app_attached {
            return;
        }
        self.app_attached = true;
        self.siu.host_attached();
        if self.absent_dropped > 0 {
            tracing::warn!(
                host = self.siu.host(),
                dropped = self.absent_dropped,
                "application attached: dropped {} packets for the host while none was attached \
                 (reads and copy requests were answered as absent)",
                self.absent_dropped
            );
            self.absent_dropped = 0;
        }
    }

    fn peer_name(&self, peer: usize) -> &str {
        self.peer_names
            .get(peer)
            .map_or("unknown peer", String::as_str)
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
        // A full held queue stops reading from its side only; the rest of that side waits in
        // the port (whose flow control stops the sender). The other side keeps flowing: the
        // reset wave must reach an SIU whose application's packets wait for it.
        loop {
            let host_open = self.host_held.len() < self.held_max;
            let net_open = self.net_held.len() < self.held_max;
            let Some((peer, bytes)) = self
                .port
                .recv_where(|p| if p == PEER_APP { host_open } else { net_open })
            else {
                break;
            };
            if peer == PEER_TM && peek_kind(&bytes) == Ok(Kind::Token) {
                self.token_in_at.get_or_insert_with(Instant::now);
            }
            if peer == PEER_APP {
                self.app_attach();
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
        while let Some((peer, bytes)) = self.net_stalled.take().or_else(|| self.next_net()) {
            let token_to_tm = peer == PEER_TM && peek_kind(&bytes) == Ok(Kind::Token);
            match self.port.offer(peer, bytes, Token::is_repeat)? {
                Offered::Sent => {
                    if token_to_tm && let Some(at) = self.token_in_at.take() {
                        self.telemetry
                            .record(HIST_TOKEN_TURNAROUND, at.elapsed().as_micros() as u64);
                    }
                }
                Offered::Dropped => self.repeats_dropped += 1,
                Offered::Held(bytes) => {
                    self.net_stalled = Some((peer, bytes));
                    break;
                }
            }
        }
        while let Some(b) = self.host_stalled.take().or_else(|| self.siu.poll_host()) {
            if !self.app_attached {
                // Nobody would read it: the SIU counts it and answers requests for the host.
                if self.siu.host_absent(&b).is_err() {
                    self.host_stalled = Some(b);
                    break;
                }
                self.absent_dropped += 1;
                continue;
            }
            if let Offered::Held(b) = self.port.offer(PEER_APP, b, |_| false)? {
                self.host_stalled = Some(b);
                break;
            }
        }
        Ok(())
    }

    /// The state machine's next network packet and the peer it goes to.
    fn next_net(&mut self) -> Option<(usize, Vec<u8>)> {
        loop {
            let tx = self.siu.poll_net()?;
            let peer = match tx.route {
                Route::Tm => Some(PEER_TM),
                Route::Host(h) => self.siu_peer.get(usize::from(h)).copied().flatten(),
            };
            match peer {
                Some(p) => return Some((p, tx.bytes)),
                None => tracing::warn!(route = ?tx.route, "no peer for a network packet"),
            }
        }
    }
}

impl<T: Transport> Driver for SiuDaemon<T> {
    type Transport = T;

    fn step(&mut self) -> Result<(), DaemonError> {
        let pass = Instant::now();
        let handled = self.port.poll()?;
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
        self.pulse_period
            .observe(&self.telemetry, HIST_PULSE_PERIOD, self.siu.recvclock());
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
            return RETRY;
        }
        match self.siu.poll_timeout() {
            Some(t) => Duration::from_micros(t.saturating_sub(self.now_us())).min(WAIT_MAX),
            None => WAIT_MAX,
        }
    }

    fn blocked(&self) -> bool {
        !self.host_held.is_empty()
            || !self.net_held.is_empty()
            || self.start_pending
            || self.net_stalled.is_some()
            || self.host_stalled.is_some()
    }

    fn port_mut(&mut self) -> &mut PacketPort<T> {
        &mut self.port
    }
}
