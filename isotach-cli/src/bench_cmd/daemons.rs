//! `isotach bench tokens`, and what it shares with `isotach bench isochrons`: the real daemons (a token manager and
//! N SIU daemons, the drivers of `isotach tm` / `isotach siu`, started as in `isotach demo
//! philo`) and N SMM applications in this process over loopback UDP, against the raw UDP round
//! trip between two processes measured in the same run (the ping-pong of `isotach bench am`,
//! half its round trips before the daemons start and half after they stopped, so the baseline
//! never competes with them for the CPUs).
//!
//! - `tokens`: the applications only keep their links moving; the pulse rate is host 0's SIU
//!   receive clock over the measurement window. Nothing is pending, so the cluster runs with
//!   idle pacing off (`idle-pace-us = 0`): the bench measures waves at full speed (`isotach
//!   bench idle` measures the paced idle cluster).
//! - `isochrons` (`super::isochrons`): every host issues isochrons continuously; see there.

use super::am::{BenchOptions, RawUdpBaseline};
use crate::demo_cmd::{LoopbackCluster, RunningDaemons, SiuPlacement, start_loopback_cluster_with};
// The replicated map: page `p` at hosts `p` and `p + 1` (mod N), as the philosophers' forks.
use crate::{EXIT_FAILED, UsageError};
use anyhow::Context;
use clap::Args;
use hdrhistogram::Histogram;
use isotach_am::NodeAddr;
use isotach_am::backend::udp::UdpTransport;
use isotach_am::port::{DEFAULT_TAG, PacketPort};
use isotach_proto::config::{SPIN_US_DEFAULT, SPIN_US_MAX, SPIN_US_MIN, Timing};
use isotach_proto::topology::{HostId, Topology};
use isotach_smm::am_link::AmSiuLink;
use isotach_smm::{AmLink, MemoryMap, Smm, SmmConfig, SmmLimits, SmmNode, WaitError};
use serde::Serialize;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How long the daemons may take to start logical time at every SIU.
pub(super) const STARTUP_MAX: Duration = Duration::from_secs(30);

/// A duration flag in seconds, 0.01..=3600 (every daemon bench's `--seconds`).
pub(crate) fn parse_seconds(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("`{s}` is not a number"))?;
    if !(0.01..=3600.0).contains(&v) {
        return Err(format!("{v} is not in 0.01..=3600"));
    }
    Ok(v)
}

/// Options both daemon benchmarks take.
#[derive(Debug, Args)]
pub(crate) struct CommonArgs {
    /// Hosts (one SIU daemon and one SMM application each) under one token manager.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(2..=64))]
    pub(super) hosts: u16,
    /// Length of the measurement window, seconds (after a short warm-up).
    #[arg(long, default_value_t = 3.0, value_parser = parse_seconds)]
    pub(super) seconds: f64,
    /// Raw UDP round trips of the baseline (half before the daemons start, half after).
    #[arg(long, default_value_t = 4000, value_parser = clap::value_parser!(u64).range(20..=10_000_000))]
    rtt_iters: u64,
    /// Run the baseline's peer on a thread of this process instead of a second process.
    #[arg(long)]
    in_process: bool,
    /// Where each host's SIU runs: embedded in its application (on the application's
    /// thread, no kernel hop between them) or as a separate SIU daemon over loopback UDP.
    #[arg(long, value_enum, default_value_t = SiuPlacement::Embedded)]
    pub(super) siu: SiuPlacement,
    /// How long each daemon's and application's wait polls its socket before it sleeps,
    /// while traffic flows, µs (`[transport] spin-us`; 0: every wait sleeps at once).
    #[arg(long, default_value_t = SPIN_US_DEFAULT, value_parser = clap::value_parser!(u64).range(SPIN_US_MIN..=SPIN_US_MAX))]
    pub(super) spin_us: u64,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub(super) json: bool,
}

impl CommonArgs {
    /// `--spin-us` as a duration.
    pub(super) fn spin(&self) -> Duration {
        Duration::from_micros(self.spin_us)
    }
}

/// `isotach bench tokens`.
#[derive(Debug, Args)]
pub(crate) struct TokensArgs {
    #[command(flatten)]
    common: CommonArgs,
}

/// `isotach bench tokens --json` (keys documented in `docs/bench.md`).
#[derive(Debug, Serialize)]
struct TokensReport {
    hosts: usize,
    seconds: f64,
    mode: &'static str,
    /// Where the SIUs ran (`embedded` or `daemon`).
    siu: &'static str,
    /// `--spin-us`.
    spin_us: u64,
    pulses: u64,
    pulses_per_s: f64,
    pulse_period_us: f64,
    pulses_per_s_min_host: f64,
    #[serde(flatten)]
    threads: Threads,
    #[serde(flatten)]
    raw: RawNumbers,
    period_to_raw_rtt_ratio: f64,
    #[serde(flatten)]
    end: Outcome,
}

/// The cores a daemon bench ran on and the threads its window kept busy. With more busy
/// threads than cores every wave waits for the scheduler to switch each thread in (a few µs
/// apiece), so a figure says more about the machine than about the protocol
/// (`docs/bench.md`, "Threads and cores").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(super) struct Threads {
    /// Cores this process may run on.
    cores: usize,
    /// Threads the window keeps busy: the token manager, each host's application (with its
    /// SIU, when embedded) and, with `--siu daemon`, each host's SIU daemon.
    busy_threads: usize,
}

impl Threads {
    /// The threads a run of `c` keeps busy, on this machine's cores.
    pub(super) fn of(c: &CommonArgs) -> Self {
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        Self::new(cores, usize::from(c.hosts), c.siu)
    }

    fn new(cores: usize, hosts: usize, siu: SiuPlacement) -> Self {
        let per_host = match siu {
            SiuPlacement::Embedded => 1,
            SiuPlacement::Daemon => 2,
        };
        Self {
            cores,
            busy_threads: 1 + hosts * per_host,
        }
    }

    /// A line for the run's log when the busy threads outnumber the cores.
    pub(super) fn warning(self) -> Option<String> {
        (self.busy_threads > self.cores).then(|| {
            format!(
                "note: {} busy threads on {} cores; every wave waits for the scheduler to \
                 switch them in, so the figures are the machine's as much as the protocol's \
                 (docs/bench.md, \"Threads and cores\")",
                self.busy_threads, self.cores
            )
        })
    }
}

/// Most problems a report lists.
const PROBLEMS_MAX: usize = 16;

/// How a daemon bench's run ended: the closing keys of its report.
#[derive(Debug, Serialize)]
pub(super) struct Outcome {
    /// From starting the daemons to logical time running everywhere, s.
    startup_s: f64,
    /// The whole command, s.
    elapsed_s: f64,
    /// No problem, and the bench's own checks held (the exit code says the same).
    pub(super) ok: bool,
    /// At most [`PROBLEMS_MAX`].
    problems: Vec<String>,
}

impl Outcome {
    /// The outcome of a run that started at `started`: ok when `problems` is empty and
    /// `checks` held.
    pub(super) fn new(
        startup_s: f64,
        started: Instant,
        checks: bool,
        mut problems: Vec<String>,
    ) -> Self {
        problems.truncate(PROBLEMS_MAX);
        Self {
            startup_s,
            elapsed_s: started.elapsed().as_secs_f64(),
            ok: checks && problems.is_empty(),
            problems,
        }
    }
}

pub(super) fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { 0.0 }
}

pub(super) fn left(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

/// The raw baseline's peer: the AM bench's (this executable again, or a thread).
fn baseline(c: &CommonArgs) -> anyhow::Result<RawUdpBaseline> {
    let opts = BenchOptions {
        peer_args: vec![crate::bench_cmd::AM_PEER_ARG.to_string()],
        in_process: c.in_process,
        ..BenchOptions::default()
    };
    RawUdpBaseline::start(&opts, c.spin()).context("starting the raw UDP baseline's peer")
}

fn half_iters(c: &CommonArgs) -> anyhow::Result<usize> {
    usize::try_from(c.rtt_iters.div_ceil(2)).map_err(|e| UsageError(e.to_string()).into())
}

/// Measures the first half of the raw baseline, then starts the daemons.
pub(super) fn start(c: &CommonArgs) -> anyhow::Result<(RawUdpBaseline, LoopbackCluster)> {
    start_with(c, Timing::default())
}

/// [`start`] with the given protocol timing.
fn start_with(c: &CommonArgs, timing: Timing) -> anyhow::Result<(RawUdpBaseline, LoopbackCluster)> {
    if let Some(note) = Threads::of(c).warning() {
        eprintln!("{note}");
    }
    let mut base = baseline(c)?;
    base.measure(half_iters(c)?)
        .context("raw UDP baseline (before)")?;
    Ok((
        base,
        start_loopback_cluster_with(usize::from(c.hosts), c.siu, timing, c.spin())?,
    ))
}

/// What the raw baseline measured (both halves), under the reports' `raw_udp_*` keys.
#[derive(Debug, Serialize)]
pub(super) struct RawNumbers {
    #[serde(skip)]
    pub(super) mode: &'static str,
    #[serde(rename = "raw_udp_rtt_p50_us")]
    pub(super) p50_us: f64,
    #[serde(rename = "raw_udp_rtt_p99_us")]
    pub(super) p99_us: f64,
    #[serde(rename = "raw_udp_samples")]
    pub(super) samples: u64,
    /// Both sides spinning as the run's waits do (`None` with `--spin-us 0`); the ratios use
    /// it then.
    #[serde(rename = "raw_udp_spin_rtt_p50_us")]
    pub(super) spin_p50_us: Option<f64>,
}

impl RawNumbers {
    /// The round trip the run is compared with: spinning when its waits spin, so a ratio
    /// compares like with like.
    pub(super) fn like_p50_us(&self) -> f64 {
        self.spin_p50_us.unwrap_or(self.p50_us)
    }
}

/// Stops the daemons (their errors go to `problems`), measures the second half of the raw
/// baseline and stops its peer.
pub(super) fn finish(
    c: &CommonArgs,
    mut base: RawUdpBaseline,
    daemons: RunningDaemons,
    problems: &mut Vec<String>,
) -> anyhow::Result<RawNumbers> {
    problems.extend(daemons.stop());
    base.measure(half_iters(c)?)
        .context("raw UDP baseline (after)")?;
    let raw = RawNumbers {
        mode: base.mode(),
        p50_us: base.p50_us(),
        p99_us: base.p99_us(),
        samples: base.samples(),
        spin_p50_us: base.spin_p50_us(),
    };
    base.finish().context("stopping the baseline's peer")?;
    Ok(raw)
}

/// A host's application thread.
pub(super) type App<R> = std::thread::JoinHandle<Result<R, String>>;

/// Starts one application thread per host (`bench-app-H`): it connects to its SIU with the
/// shared `map`, then runs `app`.
pub(super) fn spawn_apps<R, F>(
    lc: &mut LoopbackCluster,
    map: MemoryMap,
    limits: SmmLimits,
    deadline: Instant,
    app: F,
) -> anyhow::Result<Vec<App<R>>>
where
    R: Send + 'static,
    F: Fn(usize, Smm<AmLink>) -> Result<R, String> + Clone + Send + 'static,
{
    let map = Arc::new(map);
    let topology = Arc::new(lc.cluster.topology.clone());
    let mut embedded = std::mem::take(&mut lc.embedded).into_iter();
    let mut apps = Vec::new();
    for (h, t) in std::mem::take(&mut lc.app_ts).into_iter().enumerate() {
        let siu = lc.cluster.host_siu[h].expect("filled by start_loopback_cluster");
        let (map, topology, app) = (Arc::clone(&map), Arc::clone(&topology), app.clone());
        let own_siu = embedded.next();
        apps.push(
            std::thread::Builder::new()
                .name(format!("bench-app-{h}"))
                .spawn(move || {
                    let link = match own_siu {
                        Some(s) => AmLink::EmbeddedUdp(Box::new(s)),
                        None => AmLink::Udp(connect(t, siu, h, deadline)?),
                    };
                    app(h, smm_over(link, h, map, topology, limits))
                })?,
        );
    }
    Ok(apps)
}

/// Joins the application threads: what each returned; errors and panics go to `problems`.
pub(super) fn join_apps<R>(apps: Vec<App<R>>, problems: &mut Vec<String>) -> Vec<R> {
    let mut out = Vec::new();
    for (h, t) in apps.into_iter().enumerate() {
        match t.join() {
            Ok(Ok(r)) => out.push(r),
            Ok(Err(e)) => problems.push(e),
            Err(_) => problems.push(format!("host {h}'s application panicked")),
        }
    }
    out
}

/// Waits until logical time runs everywhere, then until every application returned: what
/// they returned, the startup time (s) and host 0's pulse rate meanwhile (pulses/s).
pub(super) fn run_apps<R>(
    lc: &LoopbackCluster,
    apps: Vec<App<R>>,
    problems: &mut Vec<String>,
) -> (Vec<R>, f64, f64) {
    let t_start = Instant::now();
    let mut startup_s = 0.0;
    let mut clock0 = None;
    if wait_started(lc, problems) {
        startup_s = t_start.elapsed().as_secs_f64();
        clock0 = Some((Instant::now(), clocks(lc)[0]));
    }
    let results = join_apps(apps, problems);
    let pulses_per_s = clock0.map_or(0.0, |(t0, c0)| {
        clocks(lc)[0].saturating_sub(c0) as f64 / t0.elapsed().as_secs_f64().max(1e-6)
    });
    (results, startup_s, pulses_per_s)
}

/// An empty latency histogram, ns (1 ns to 600 s, 3 significant digits).
pub(super) fn latency_hist() -> anyhow::Result<Histogram<u64>> {
    Ok(Histogram::new_with_bounds(1, 600_000_000_000, 3)?)
}

/// Connects host `h`'s application socket to its SIU daemon.
fn connect(
    t: UdpTransport,
    lc_siu: std::net::SocketAddr,
    h: usize,
    deadline: Instant,
) -> Result<AmSiuLink<UdpTransport>, String> {
    let port =
        PacketPort::new(t, &[NodeAddr::Ip(lc_siu)], DEFAULT_TAG).map_err(|e| e.to_string())?;
    AmSiuLink::connect(port, left(deadline))
        .map_err(|e| format!("host {h}: connect to the SIU: {e}"))
}

/// Host `h`'s SMM over `link`.
fn smm_over(
    link: AmLink,
    h: usize,
    map: Arc<MemoryMap>,
    topology: Arc<Topology>,
    limits: SmmLimits,
) -> Smm<AmLink> {
    let node = SmmNode::new(SmmConfig {
        host: h as HostId,
        topology,
        map,
        limits,
        record: false,
    });
    Smm::new(node, link)
}

/// Waits until logical time runs at every SIU (or the startup limit passed).
pub(super) fn wait_started(lc: &LoopbackCluster, problems: &mut Vec<String>) -> bool {
    let limit = Instant::now() + STARTUP_MAX;
    loop {
        if lc
            .gauges
            .iter()
            .all(|g| g.started.load(Ordering::Relaxed) == 1)
        {
            return true;
        }
        if Instant::now() >= limit {
            problems.push(format!(
                "logical time did not start at every SIU within {} s",
                STARTUP_MAX.as_secs()
            ));
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

pub(super) fn clocks(lc: &LoopbackCluster) -> Vec<u64> {
    lc.gauges
        .iter()
        .map(|g| g.recvclock.load(Ordering::Relaxed))
        .collect()
}

pub(super) fn print<T: Serialize>(r: &T, json: bool) -> anyhow::Result<()> {
    let text = if json {
        serde_json::to_string(r)
    } else {
        serde_json::to_string_pretty(r)
    };
    println!("{}", text.context("encoding the report")?);
    Ok(())
}

pub(super) fn exit(ok: bool) -> ExitCode {
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_FAILED)
    }
}

/// `isotach bench tokens`.
pub(crate) fn tokens(a: &TokensArgs) -> anyhow::Result<ExitCode> {
    let c = &a.common;
    crate::admin::logs::init("warn");
    let started = Instant::now();
    let n = usize::from(c.hosts);
    eprintln!(
        "bench tokens: a token manager and {n} SIU daemons over loopback UDP, {} s",
        c.seconds
    );
    // No traffic is pending: idle pacing off, so the waves run at full speed.
    let full_speed = Timing {
        idle_pace_us: 0,
        ..Timing::default()
    };
    let (base, mut lc) = start_with(c, full_speed)?;
    let mut problems = Vec::new();
    let deadline = Instant::now() + STARTUP_MAX + Duration::from_secs_f64(c.seconds * 2.0);
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = Arc::clone(&stop);
    let apps = spawn_apps(
        &mut lc,
        MemoryMap::default(),
        SmmLimits::default(),
        deadline,
        move |h, mut smm| {
            while !stopped.load(Ordering::Relaxed) && Instant::now() < deadline {
                match smm.wait_until(Duration::from_millis(20), |_| false) {
                    Ok(()) | Err(WaitError::TimedOut(_)) => {}
                    Err(e) => return Err(format!("host {h}: {e}")),
                }
            }
            Ok(())
        },
    )?;
    let t_start = Instant::now();
    let mut startup_s = 0.0;
    let (mut pulses, mut pps, mut pps_min) = (0, 0.0, 0.0);
    if wait_started(&lc, &mut problems) {
        startup_s = t_start.elapsed().as_secs_f64();
        std::thread::sleep(Duration::from_secs_f64((c.seconds / 5.0).min(0.2)));
        let (t0, c0) = (Instant::now(), clocks(&lc));
        std::thread::sleep(Duration::from_secs_f64(c.seconds));
        let (t1, c1) = (Instant::now(), clocks(&lc));
        let span = (t1 - t0).as_secs_f64();
        let rates: Vec<f64> = c0
            .iter()
            .zip(&c1)
            .map(|(a, b)| b.saturating_sub(*a) as f64 / span)
            .collect();
        pulses = c1[0].saturating_sub(c0[0]);
        pps = rates[0];
        pps_min = rates.iter().copied().fold(f64::INFINITY, f64::min);
    }
    stop.store(true, Ordering::Relaxed);
    join_apps(apps, &mut problems);
    let raw = finish(c, base, lc.daemons, &mut problems)?;
    if pulses == 0 && problems.is_empty() {
        problems.push("no pulse during the measurement window".into());
    }
    let period = if pps > 0.0 { 1e6 / pps } else { 0.0 };
    let r = TokensReport {
        hosts: n,
        seconds: c.seconds,
        mode: raw.mode,
        siu: c.siu.name(),
        spin_us: c.spin_us,
        pulses,
        pulses_per_s: pps,
        pulse_period_us: period,
        pulses_per_s_min_host: if pps_min.is_finite() { pps_min } else { 0.0 },
        threads: Threads::of(c),
        period_to_raw_rtt_ratio: ratio(period, raw.like_p50_us()),
        raw,
        end: Outcome::new(startup_s, started, true, problems),
    };
    print(&r, c.json)?;
    Ok(exit(r.end.ok))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_is_ok_only_without_problems_and_with_its_checks_held() {
        let started = Instant::now();
        assert!(Outcome::new(0.1, started, true, Vec::new()).ok);
        assert!(
            !Outcome::new(0.1, started, false, Vec::new()).ok,
            "a failed check"
        );
        let many: Vec<String> = (0..40).map(|i| format!("problem {i}")).collect();
        let o = Outcome::new(0.1, started, true, many);
        assert!(!o.ok);
        assert_eq!(o.problems.len(), PROBLEMS_MAX, "the list is bounded");
        assert_eq!(o.problems[0], "problem 0", "the first ones are kept");
    }

    #[test]
    fn busy_threads_count_the_token_manager_the_applications_and_siu_daemons() {
        let embedded = Threads::new(2, 4, SiuPlacement::Embedded);
        assert_eq!(embedded.busy_threads, 5, "a TM and four applications");
        assert_eq!(Threads::new(2, 4, SiuPlacement::Daemon).busy_threads, 9);
        let note = embedded.warning().expect("five threads on two cores");
        assert!(note.contains("5 busy threads on 2 cores"), "{note}");
        // As many busy threads as cores (or fewer): nothing to say.
        assert_eq!(Threads::new(3, 2, SiuPlacement::Embedded).warning(), None);
        assert_eq!(Threads::new(8, 2, SiuPlacement::Daemon).warning(), None);
    }
}
