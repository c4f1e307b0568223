//! The runner of `isotach tm` / `isotach siu` (feature `runtime`): a thin loop around a
//! [`Pump`] and a [`Transport`] on a thread of its own ([`Daemon::run_blocking`]). Each pass reads the clock once, takes the datagrams that
//! arrived, runs the pump, sends what it has and waits for the next datagram or deadline. It
//! decides nothing; it measures (telemetry) and publishes a snapshot for the admin service.

use crate::DaemonError;
use crate::pump::{Pump, Role};
use crate::siu::{LANE_HOST, LANE_NET, OUT_HOST, OUT_NET, SiuGauges, SiuPlan, SiuRole};
use crate::telemetry::{PeriodMeter, RateMeter, Telemetry};
use crate::tm::{TmPlan, TmRole};
use isotach_am::link::{LinkStats, PeerList, PeerStatus};
use isotach_am::port::{ARRIVALS_MAX, links_with, take_arrivals};
use isotach_am::{NodeAddr, Tag, Time, Transport};
use isotach_siu::{Siu, SiuStats};
use isotach_tm::{TmStats, TokenManager};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Longest single wait of the loop (it re-checks timers at least this often).
const WAIT_MAX: Duration = Duration::from_millis(50);
/// How often the loop publishes its snapshot at most.
const PUBLISH_EVERY: Duration = Duration::from_millis(5);

/// Histogram of the duration of passes that handled datagrams (µs).
pub const HIST_PASS: &str = "pass_us";
/// Histogram of the time between waves at a TM (µs).
pub const HIST_WAVE_PERIOD: &str = "wave_period_us";
/// Histogram of the time between pulses at an SIU (µs).
pub const HIST_PULSE_PERIOD: &str = "pulse_period_us";
/// Histogram of the time from a token's arrival from the token manager to the SIU's next
/// token to it (µs): how long this SIU holds the wave.
pub const HIST_TOKEN_TURNAROUND: &str = "token_turnaround_us";

/// What the runner needs of a role beyond [`Role`]: its snapshot and what to measure.
pub trait Publish: Role + Sized {
    /// The state published for the admin service.
    type Snapshot: Clone + Default + Send + Sync + 'static;
    /// The histograms the runner keeps.
    const HISTS: &'static [&'static str];
    /// The histogram of the period of [`Publish::progress`].
    const PERIOD_HIST: &'static str;
    /// A counter that advances once per wave or pulse.
    fn progress(&self) -> u64;
    /// The snapshot now.
    fn snapshot(pump: &Pump<Self>, uptime_us: u64, rate_per_s: f64) -> Self::Snapshot;
    /// Samples the role measured itself since the last pass.
    fn record(&mut self, telemetry: &Telemetry) {
        let _ = telemetry;
    }
    /// Logs that the daemon is up.
    fn log_start(&self, addr: NodeAddr);
    /// Logs that the daemon stopped, with its counters.
    fn log_stop(pump: &Pump<Self>);
}

/// A daemon: a role's pump over a transport.
#[derive(Debug)]
pub struct Daemon<R: Publish, T: Transport> {
    pump: Pump<R>,
    transport: T,
    snapshot: watch::Sender<R::Snapshot>,
    published: Instant,
    telemetry: Arc<Telemetry>,
    period: PeriodMeter,
    rate: RateMeter,
}

impl<R: Publish, T: Transport> Daemon<R, T> {
    /// A daemon for `role` over `transport`, linked to `peers` (by peer id) with tag `tag`;
    /// queues are bounded by `queue_max` (the config's `queue-packets-max`).
    pub fn new(
        role: R,
        transport: T,
        peers: PeerList,
        tag: Tag,
        queue_max: usize,
    ) -> Result<Self, DaemonError> {
        let links = links_with(&transport, peers, tag)?;
        Ok(Self {
            pump: Pump::new(role, links, queue_max),
            transport,
            snapshot: watch::Sender::new(R::Snapshot::default()),
            published: Instant::now(),
            telemetry: Arc::new(Telemetry::new(R::HISTS)),
            period: PeriodMeter::new(),
            rate: RateMeter::new(0),
        })
    }

    /// The daemon's latency histograms.
    pub fn telemetry(&self) -> Arc<Telemetry> {
        Arc::clone(&self.telemetry)
    }

    /// The state the loop publishes (every few milliseconds while it runs).
    pub fn snapshot(&self) -> watch::Receiver<R::Snapshot> {
        self.snapshot.subscribe()
    }

    /// The pump (role, links, counters).
    pub fn pump(&self) -> &Pump<R> {
        &self.pump
    }

    /// The transport.
    pub fn transport(&self) -> &T {
        &self.transport
    }

    /// Runs on the calling thread until `stop` is set; returns the role (for its counters).
    /// Each pass reads the clock once, takes what arrived, runs the pump and sends; between
    /// passes it blocks in the transport: no runtime, no task hop or reactor wake-up between
    /// a datagram and the pass that takes it. One thread per role.
    pub fn run_blocking(mut self, stop: &AtomicBool) -> Result<R, DaemonError> {
        self.pump.role().log_start(self.transport.local_addr());
        while !stop.load(Ordering::Relaxed) {
            let (now, taken) = self.pass()?;
            // A pass that took all it may can have left datagrams behind: go again at once.
            // Any other found the socket empty at its end, and the wait comes back at once
            // with whatever arrived since (one system call, where another pass would first
            // probe the socket for nothing).
            if taken >= ARRIVALS_MAX {
                continue;
            }
            let deadline = Some(self.deadline(now));
            if self.pump.role().quiet() {
                self.transport.wait_quiet(now, deadline)?;
            } else {
                self.transport.wait_from(now, deadline)?;
            }
        }
        R::log_stop(&self.pump);
        Ok(self.pump.into_role())
    }

    /// How long the loop may wait after a pass at `now` that took nothing: until the pump's
    /// next deadline, at most [`WAIT_MAX`] (so a stop request is seen).
    fn deadline(&self, now: Time) -> Time {
        let wait_max = now.plus(WAIT_MAX);
        self.pump
            .poll_timeout(now)
            .map_or(wait_max, |t| t.min(wait_max))
    }

    /// One pass: arrivals in, the pump, output out, measurements. Never blocks. Returns the
    /// pass's time and the datagrams it took.
    fn pass(&mut self) -> Result<(Time, usize), DaemonError> {
        let started = Instant::now();
        let now = self.transport.now();
        let pump = &mut self.pump;
        let handled = take_arrivals(&mut self.transport, |from, bytes| {
            pump.handle_datagram(now, from, bytes)
        })?;
        self.pump.advance(now)?;
        while let Some((to, bytes)) = self.pump.poll_transmit(now) {
            self.transport.send(to, bytes)?;
        }
        self.transport.flush()?;
        self.pump.role_mut().record(&self.telemetry);
        let progress = self.pump.role().progress();
        self.period
            .observe(&self.telemetry, R::PERIOD_HIST, progress);
        if handled > 0 {
            self.telemetry
                .record(HIST_PASS, started.elapsed().as_micros() as u64);
        }
        if self.published.elapsed() >= PUBLISH_EVERY {
            self.published = Instant::now();
            let rate = self.rate.observe(progress);
            let uptime_us = now.0 / crate::pump::NS_PER_US;
            self.snapshot
                .send_replace(R::snapshot(&self.pump, uptime_us, rate));
        }
        Ok((now, handled))
    }
}

/// A running token manager.
pub type TmDaemon<T> = Daemon<TmRole, T>;
/// A running SIU.
pub type SiuDaemon<T> = Daemon<SiuRole, T>;

impl<T: Transport> Daemon<TmRole, T> {
    /// A token manager daemon from its plan (the peers may be rewritten, e.g. for in-process
    /// transports), over `transport`, tagged `tag`.
    pub fn tm(plan: TmPlan, transport: T, tag: Tag) -> Result<Self, DaemonError> {
        let queue_max = plan.cfg.limits.queue_packets_max;
        let role = TmRole::new(TokenManager::new(plan.cfg));
        let peers = PeerList::eager(&plan.peers)?;
        Self::new(role, transport, peers, tag, queue_max)
    }
}

impl<T: Transport> Daemon<SiuRole, T> {
    /// An SIU daemon from its plan, over `transport`, tagged `tag`.
    pub fn siu(plan: SiuPlan, transport: T, tag: Tag) -> Result<Self, DaemonError> {
        let queue_max = plan.cfg.limits.queue_packets_max;
        let role = SiuRole::new(Siu::new(plan.cfg));
        let peers = PeerList::split(&plan.peers, crate::siu::EAGER_PEERS)?;
        let mut daemon = Self::new(role, transport, peers, tag, queue_max)?;
        // A daemon cannot tell its first start from a restart, and the other SIUs' links to
        // a previous process of ours must start over before they send to us: a hello to
        // each (n per start, a few bytes each; the simulator, which knows, skips it on a
        // cluster's first start).
        daemon.pump.links_mut().link_every_peer()?;
        Ok(daemon)
    }

    /// The gauges the SIU updates.
    pub fn gauges(&self) -> Arc<SiuGauges> {
        self.pump.role().gauges()
    }
}

/// A running token manager's state (read by the admin service).
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
    /// Inputs held for back-pressure and outputs waiting for room.
    pub held: usize,
    /// Microseconds since the daemon started.
    pub uptime_us: u64,
    /// Waves per second over the last full second.
    pub wave_rate_per_s: f64,
    /// Each neighbour's link, by link id.
    pub peers: Vec<PeerStatus>,
    /// What each link leads to, by link id.
    pub peer_names: Arc<[String]>,
    /// The state machine's counters.
    pub stats: TmStats,
    /// The links' counters.
    pub port: LinkStats,
}

impl Publish for TmRole {
    type Snapshot = TmSnapshot;
    const HISTS: &'static [&'static str] = &[HIST_WAVE_PERIOD, HIST_PASS];
    const PERIOD_HIST: &'static str = HIST_WAVE_PERIOD;

    fn progress(&self) -> u64 {
        self.tm().waves()
    }

    fn snapshot(pump: &Pump<Self>, uptime_us: u64, rate_per_s: f64) -> TmSnapshot {
        let tm = pump.role().tm();
        TmSnapshot {
            started: tm.started(),
            generation: tm.generation().get(),
            waves: tm.waves(),
            queue_depth: tm.queue_depth(),
            held: pump.held() + pump.stalled(),
            uptime_us,
            wave_rate_per_s: rate_per_s,
            peers: pump.links().peer_status(),
            peer_names: pump.role().peer_names(),
            stats: tm.stats(),
            port: pump.links().stats(),
        }
    }

    fn log_start(&self, addr: NodeAddr) {
        tracing::info!(
            switch = self.tm().config().switch,
            %addr,
            links = self.tm().link_count(),
            "token manager up; waiting for neighbours"
        );
    }

    fn log_stop(pump: &Pump<Self>) {
        let tm = pump.role().tm();
        tracing::info!(
            waves = tm.waves(),
            stats = ?tm.stats(),
            links = ?pump.links().stats(),
            pump = ?pump.stats(),
            broken_links = pump.role().broken_links(),
            am = ?pump.links().core().stats(),
            "token manager stopped"
        );
    }
}

/// A running SIU's state (read by the admin service).
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
    /// Host packets held (not started yet, or back-pressure) or waiting for room.
    pub host_held: usize,
    /// Network packets held for back-pressure or waiting for room.
    pub net_held: usize,
    /// Microseconds since the daemon started.
    pub uptime_us: u64,
    /// Pulses per second over the last full second.
    pub pulse_rate_per_s: f64,
    /// This host's isochrons stamped for pulses that have not ended.
    pub outstanding_isochrons: u64,
    /// Isotach packets handed to the host for pulses that have not ended.
    pub pending_pulse_packets: u64,
    /// Each peer's link, by peer id (token manager, application, then the other SIUs).
    pub peers: Vec<PeerStatus>,
    /// Names of the peers, by peer id.
    pub peer_names: Arc<[String]>,
    /// The state machine's counters.
    pub stats: SiuStats,
    /// The links' counters.
    pub port: LinkStats,
}

impl Publish for SiuRole {
    type Snapshot = SiuSnapshot;
    const HISTS: &'static [&'static str] = &[HIST_PULSE_PERIOD, HIST_TOKEN_TURNAROUND, HIST_PASS];
    const PERIOD_HIST: &'static str = HIST_PULSE_PERIOD;

    fn progress(&self) -> u64 {
        self.siu().recvclock()
    }

    fn snapshot(pump: &Pump<Self>, uptime_us: u64, rate_per_s: f64) -> SiuSnapshot {
        let siu = pump.role().siu();
        let (to_host, to_net) = siu.queue_depths();
        SiuSnapshot {
            started: siu.started(),
            generation: siu.generation().get(),
            sendclock: siu.sendclock(),
            recvclock: siu.recvclock(),
            to_host,
            to_net,
            host_held: pump.held_on(LANE_HOST) + usize::from(pump.stalled_on(OUT_HOST)),
            net_held: pump.held_on(LANE_NET) + usize::from(pump.stalled_on(OUT_NET)),
            uptime_us,
            pulse_rate_per_s: rate_per_s,
            outstanding_isochrons: siu.outstanding_isochrons(),
            pending_pulse_packets: siu.pending_pulse_packets(),
            peers: pump.links().peer_status(),
            peer_names: pump.role().peer_names(),
            stats: siu.stats(),
            port: pump.links().stats(),
        }
    }

    fn record(&mut self, telemetry: &Telemetry) {
        for us in self.take_turnarounds_us() {
            telemetry.record(HIST_TOKEN_TURNAROUND, us);
        }
    }

    fn log_start(&self, addr: NodeAddr) {
        tracing::info!(
            host = self.siu().host(),
            %addr,
            "SIU up; waiting for the token manager and the application"
        );
    }

    fn log_stop(pump: &Pump<Self>) {
        let siu = pump.role().siu();
        tracing::info!(
            host = siu.host(),
            recvclock = siu.recvclock(),
            stats = ?siu.stats(),
            links = ?pump.links().stats(),
            pump = ?pump.stats(),
            am = ?pump.links().core().stats(),
            broken_links = pump.role().broken_links(),
            "SIU stopped"
        );
    }
}
