//! `isotach demo philo`: the embedded default. One process runs a token manager, N SIU
//! daemons (tokio tasks, the same drivers as `isotach tm` / `isotach siu`) and N SMM
//! applications (threads, the same code as `isotach philo`), all over real loopback UDP
//! sockets through the AM transport. An independent observer checks that no two neighbours
//! ate at once.

use crate::philo_app::{PhiloOutcome, PhiloParams, forks_map, overlaps, run_philosopher};
use crate::{EXIT_FAILED, UsageError};
use clap::{Args, Subcommand, ValueEnum};
use hdrhistogram::Histogram;
use isotach_am::NodeAddr;
use isotach_am::backend::udp::UdpTransport;
use isotach_am::port::{DEFAULT_TAG, PacketPort};
use isotach_proto::config::ClusterConfig;
use isotach_siu::Siu;
use isotach_siu::daemon::{SiuDaemon, SiuGauges, siu_setup};
use isotach_smm::am_link::AmSiuLink;
use isotach_smm::{Smm, SmmConfig, SmmLimits, SmmNode};
use isotach_tm::TokenManager;
use isotach_tm::daemon::{TmDaemon, tm_setup};
use serde::Serialize;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Embedded demos: the whole system in one process over loopback.
#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    #[command(subcommand)]
    demo: Demo,
}

#[derive(Debug, Subcommand)]
enum Demo {
    /// Dining philosophers: a token manager, N SIUs and N SMM nodes in one process over real
    /// loopback sockets. Prints meals, meals/s, pulses/s, isochron latency and the safety
    /// check; exits 0 only when no two neighbours ate at once and every philosopher ate every
    /// meal.
    Philo(PhiloDemoArgs),
}

/// Transport of the embedded demo.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
enum DemoTransport {
    /// Active Messages over loopback UDP (reliable, per-peer FIFO).
    Udp,
}

#[derive(Debug, Args)]
struct PhiloDemoArgs {
    /// Philosophers (hosts, one SIU and one SMM node each).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u16).range(2..=64))]
    philosophers: u16,
    /// Meals each philosopher eats.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    meals: u64,
    /// Transport between the parts.
    #[arg(long, value_enum, default_value_t = DemoTransport::Udp)]
    transport: DemoTransport,
    /// Global deadline: give up (exit 1, with an error) after this many seconds.
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    timeout_s: u64,
    /// Print one JSON object on stdout (progress still goes to stderr).
    #[arg(long)]
    json: bool,
}

/// The summary (`--json` keys, documented in `docs/operations.md`).
#[derive(Debug, Serialize)]
struct PhiloDemoReport {
    philosophers: usize,
    transport: DemoTransport,
    meals_target: u64,
    meals: u64,
    meals_min: u64,
    retries: u64,
    elapsed_s: f64,
    meals_per_s: f64,
    pulses: u64,
    pulses_per_s: f64,
    isochrons_measured: u64,
    isochron_latency_p50_us: u64,
    isochron_latency_p99_us: u64,
    isochron_latency_max_us: u64,
    safety_violations: u64,
    completed: bool,
    ok: bool,
    problems: Vec<String>,
}

pub(crate) fn run(args: DemoArgs) -> anyhow::Result<ExitCode> {
    match args.demo {
        Demo::Philo(a) => philo(a),
    }
}

/// (p50, p99, max) of latency samples, via an HDR histogram (3 significant digits).
pub(crate) fn latency_summary(samples: &[u64]) -> (u64, u64, u64) {
    let Ok(mut h) = Histogram::<u64>::new(3) else {
        return (0, 0, 0);
    };
    for &s in samples {
        let _ = h.record(s.max(1));
    }
    if h.is_empty() {
        return (0, 0, 0);
    }
    (h.value_at_quantile(0.5), h.value_at_quantile(0.99), h.max())
}

fn bind() -> anyhow::Result<UdpTransport> {
    let any: SocketAddr = "127.0.0.1:0".parse()?;
    UdpTransport::bind(any).map_err(|e| anyhow::anyhow!("bind a loopback UDP socket: {e}"))
}

/// A token manager and N SIU daemons running on their own tokio runtime over loopback UDP,
/// plus the N (not yet used) loopback sockets of the hosts' applications.
pub(crate) struct LoopbackCluster {
    /// The generated cluster config, with every address filled in.
    pub(crate) cluster: ClusterConfig,
    /// Each SIU daemon's gauges, by host.
    pub(crate) gauges: Vec<Arc<SiuGauges>>,
    /// Each host's application socket (blocking; for [`AmSiuLink`]), by host.
    pub(crate) app_ts: Vec<UdpTransport>,
    /// The running daemon tasks.
    pub(crate) daemons: RunningDaemons,
}

/// The daemon tasks of a [`LoopbackCluster`] and their runtime.
pub(crate) struct RunningDaemons {
    rt: tokio::runtime::Runtime,
    stop_tx: tokio::sync::watch::Sender<bool>,
    tm_task: tokio::task::JoinHandle<Result<TokenManager, isotach_tm::daemon::DaemonError>>,
    siu_tasks: Vec<tokio::task::JoinHandle<Result<Siu, isotach_siu::daemon::DaemonError>>>,
}

/// Starts a token manager and `n` SIU daemons (the same drivers as `isotach tm` / `isotach
/// siu`) on a two-worker tokio runtime, over fresh loopback UDP sockets.
pub(crate) fn start_loopback_cluster(n: usize) -> anyhow::Result<LoopbackCluster> {
    let mut cluster = ClusterConfig::generated(n, 1).map_err(|e| UsageError(e.to_string()))?;
    // The daemons' sockets are registered with the runtime (async waits); the applications'
    // are plain blocking sockets on their own threads.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let (tm_t, siu_ts) = {
        let _guard = rt.enter();
        let tm = bind()?;
        let sius = (0..n).map(|_| bind()).collect::<anyhow::Result<Vec<_>>>()?;
        (tm, sius)
    };
    let app_ts = (0..n).map(|_| bind()).collect::<anyhow::Result<Vec<_>>>()?;
    cluster.switch_listen[0] = Some(tm_t.socket_addr());
    for h in 0..n {
        cluster.host_siu[h] = Some(siu_ts[h].socket_addr());
        cluster.host_app[h] = Some(app_ts[h].socket_addr());
    }
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stop = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    let mut gauges: Vec<Arc<SiuGauges>> = Vec::new();
    let (tm_task, siu_tasks) = {
        let _guard = rt.enter();
        let (cfg, _, peers) = tm_setup(&cluster, 0)?;
        let port = PacketPort::new(tm_t, &peers, DEFAULT_TAG)?;
        let tm_task = rt.spawn(TmDaemon::new(TokenManager::new(cfg), port).run(stop()));
        let mut siu_tasks = Vec::new();
        for (h, t) in siu_ts.into_iter().enumerate() {
            let (cfg, _, peers) = siu_setup(&cluster, h as u16)?;
            let port = PacketPort::new(t, &peers, DEFAULT_TAG)?;
            let d = SiuDaemon::new(Siu::new(cfg), port);
            gauges.push(d.gauges());
            siu_tasks.push(rt.spawn(d.run(stop())));
        }
        (tm_task, siu_tasks)
    };
    Ok(LoopbackCluster {
        cluster,
        gauges,
        app_ts,
        daemons: RunningDaemons {
            rt,
            stop_tx,
            tm_task,
            siu_tasks,
        },
    })
}

impl RunningDaemons {
    /// Tells every daemon task to stop and waits for them (at most 10 s); returns the
    /// daemons' errors and a note when they did not stop in time.
    pub(crate) fn stop(self) -> Vec<String> {
        let Self {
            rt,
            stop_tx,
            tm_task,
            siu_tasks,
        } = self;
        let mut problems = Vec::new();
        let _ = stop_tx.send(true);
        let joined = rt.block_on(async {
            let all = async {
                let mut errors = Vec::new();
                if let Ok(Err(e)) = tm_task.await {
                    errors.push(format!("token manager: {e}"));
                }
                for (h, t) in siu_tasks.into_iter().enumerate() {
                    if let Ok(Err(e)) = t.await {
                        errors.push(format!("SIU {h}: {e}"));
                    }
                }
                errors
            };
            tokio::time::timeout(Duration::from_secs(10), all).await
        });
        match joined {
            Ok(errors) => problems.extend(errors),
            Err(_) => problems.push("daemon tasks did not stop within 10 s".into()),
        }
        rt.shutdown_timeout(Duration::from_secs(1));
        problems
    }
}

fn philo(args: PhiloDemoArgs) -> anyhow::Result<ExitCode> {
    crate::daemon_cmd::init_logs("warn");
    let n = usize::from(args.philosophers);
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.timeout_s);
    let LoopbackCluster {
        cluster,
        gauges,
        app_ts,
        daemons,
    } = start_loopback_cluster(n)?;
    let progress = Arc::new(AtomicU64::new(0));
    let map = Arc::new(forks_map(n));
    let topology = Arc::new(cluster.topology.clone());
    let mut threads = Vec::new();
    for (h, t) in app_ts.into_iter().enumerate() {
        let siu = NodeAddr::Ip(cluster.host_siu[h].expect("filled above"));
        let params = PhiloParams {
            me: h,
            n,
            meals: args.meals,
            deadline,
            progress: Arc::clone(&progress),
        };
        let (map, topology) = (Arc::clone(&map), Arc::clone(&topology));
        let th = std::thread::Builder::new()
            .name(format!("philosopher-{h}"))
            .spawn(move || -> Result<PhiloOutcome, String> {
                let port = PacketPort::new(t, &[siu], DEFAULT_TAG).map_err(|e| e.to_string())?;
                let left = deadline.saturating_duration_since(Instant::now());
                let link = AmSiuLink::connect(port, left).map_err(|e| e.to_string())?;
                let node = SmmNode::new(SmmConfig {
                    host: h as u16,
                    topology,
                    map,
                    limits: SmmLimits::default(),
                    record: false,
                });
                run_philosopher(&mut Smm::new(node, link), &params)
            })?;
        threads.push(th);
    }
    // Progress on stderr until every philosopher returned (each returns by the deadline).
    let target = args.meals * n as u64;
    let mut last_print = Instant::now();
    let mut run_started: Option<Instant> = None;
    while threads.iter().any(|t| !t.is_finished()) {
        std::thread::sleep(Duration::from_millis(20));
        if run_started.is_none()
            && gauges
                .iter()
                .all(|g| g.started.load(Ordering::Relaxed) == 1)
        {
            run_started = Some(Instant::now());
        }
        if last_print.elapsed() >= Duration::from_millis(500) {
            last_print = Instant::now();
            eprintln!(
                "demo philo: {}/{} meals, pulse {}",
                progress.load(Ordering::Relaxed),
                target,
                gauges[0].recvclock.load(Ordering::Relaxed)
            );
        }
    }
    let elapsed = run_started
        .unwrap_or(started)
        .elapsed()
        .as_secs_f64()
        .max(1e-6);
    let pulses = gauges[0].recvclock.load(Ordering::Relaxed);
    let mut problems = Vec::new();
    let mut outcomes = Vec::new();
    for (h, t) in threads.into_iter().enumerate() {
        match t.join() {
            Ok(Ok(o)) => outcomes.push(o),
            Ok(Err(e)) => {
                problems.push(e);
                outcomes.push(PhiloOutcome::default());
            }
            Err(_) => {
                problems.push(format!("philosopher {h} panicked"));
                outcomes.push(PhiloOutcome::default());
            }
        }
    }
    // Stop every daemon task and wait for them (bounded).
    problems.extend(daemons.stop());
    if Instant::now() >= deadline {
        problems.insert(
            0,
            format!(
                "global deadline of {} s passed before the demo finished",
                args.timeout_s
            ),
        );
    }

    let logs: Vec<_> = outcomes.iter().map(|o| o.meals_log.clone()).collect();
    let (violations, detail) = overlaps(&logs);
    problems.extend(detail);
    let lat: Vec<u64> = outcomes
        .iter()
        .flat_map(|o| o.latencies_us.iter().copied())
        .collect();
    let (p50, p99, max) = latency_summary(&lat);
    let meals: u64 = outcomes.iter().map(|o| o.meals).sum();
    let meals_min = outcomes.iter().map(|o| o.meals).min().unwrap_or(0);
    let completed = meals_min >= args.meals;
    problems.truncate(16);
    let r = PhiloDemoReport {
        philosophers: n,
        transport: args.transport,
        meals_target: args.meals,
        meals,
        meals_min,
        retries: outcomes.iter().map(|o| o.retries).sum(),
        elapsed_s: elapsed,
        meals_per_s: meals as f64 / elapsed,
        pulses,
        pulses_per_s: pulses as f64 / elapsed,
        isochrons_measured: lat.len() as u64,
        isochron_latency_p50_us: p50,
        isochron_latency_p99_us: p99,
        isochron_latency_max_us: max,
        safety_violations: violations,
        completed,
        ok: completed && violations == 0 && problems.is_empty(),
        problems,
    };
    if args.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        print_summary(&r);
    }
    Ok(if r.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_FAILED)
    })
}

fn print_summary(r: &PhiloDemoReport) {
    println!(
        "dining philosophers: {} philosophers over a token manager and {} SIUs ({:?}, loopback)",
        r.philosophers, r.philosophers, r.transport
    );
    println!(
        "  meals             {} of {} ({} per philosopher; fewest {})",
        r.meals,
        r.meals_target * r.philosophers as u64,
        r.meals_target,
        r.meals_min
    );
    println!("  time              {:.2} s", r.elapsed_s);
    println!("  meals/s           {:.0}", r.meals_per_s);
    println!(
        "  pulses            {} ({:.0} pulses/s)",
        r.pulses, r.pulses_per_s
    );
    println!(
        "  isochron latency  p50 {} µs, p99 {} µs, max {} µs ({} take isochrons)",
        r.isochron_latency_p50_us,
        r.isochron_latency_p99_us,
        r.isochron_latency_max_us,
        r.isochrons_measured
    );
    println!("  retries           {}", r.retries);
    println!(
        "  safety            {}",
        if r.safety_violations == 0 {
            "held: no two neighbours ate at once".to_string()
        } else {
            format!("VIOLATED {} times", r.safety_violations)
        }
    );
    for p in &r.problems {
        println!("  problem: {p}");
    }
    println!("  result            {}", if r.ok { "ok" } else { "FAILED" });
}
