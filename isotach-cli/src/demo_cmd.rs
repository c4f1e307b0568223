//! `isotach demo philo`: the embedded default. One process runs a token manager, N SIU
//! daemons (a thread each, the same drivers as `isotach tm` / `isotach siu`) and N SMM
//! applications (threads, the same code as `isotach philo`), all through the AM transport:
//! over loopback UDP sockets (`--transport udp`, the default), loopback QUIC with mutual TLS
//! (`quic`, certificates from an ephemeral in-process CA) or an in-process real-time network
//! (`mem`). An independent observer checks that no two neighbours ate at once.

mod cluster;

pub(crate) use cluster::{
    LoopbackCluster, RunningDaemons, SiuPlacement, start_loopback_cluster,
    start_loopback_cluster_with,
};
use cluster::{start_chan_cluster, start_quic_cluster};

use crate::EXIT_FAILED;
use crate::philo_app::{
    PhiloOutcome, PhiloParams, forks_map, latency_summary, overlaps, run_philosopher,
};
use clap::{Args, Subcommand, ValueEnum};
use isotach_am::Transport;
use isotach_am::port::{DEFAULT_TAG, PacketPort};
use isotach_smm::am_link::AmSiuLink;
use isotach_smm::{Smm, SmmConfig, SmmLimits, SmmNode};
use serde::Serialize;
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
    /// Active Messages over loopback QUIC with mutual TLS (an ephemeral cluster CA made in
    /// the process issues every node's certificate).
    Quic,
    /// Active Messages over an in-process real-time network (no sockets).
    Mem,
}

impl DemoTransport {
    fn describe(self) -> &'static str {
        match self {
            Self::Udp => "AM over loopback UDP",
            Self::Quic => "AM over loopback QUIC, mutual TLS",
            Self::Mem => "AM over in-process channels",
        }
    }
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

/// A loopback UDP socket whose waits spin up to `spin` while traffic flows.
fn philo(args: PhiloDemoArgs) -> anyhow::Result<ExitCode> {
    crate::admin::logs::init("warn");
    let n = usize::from(args.philosophers);
    let started = Instant::now();
    match args.transport {
        DemoTransport::Udp => philo_over(start_loopback_cluster(n)?, &args, started),
        DemoTransport::Quic => philo_over(start_quic_cluster(n)?, &args, started),
        DemoTransport::Mem => philo_over(start_chan_cluster(n)?, &args, started),
    }
}

/// Runs the philosophers over a started cluster and reports.
fn philo_over<A: Transport + 'static>(
    lc: LoopbackCluster<A>,
    args: &PhiloDemoArgs,
    started: Instant,
) -> anyhow::Result<ExitCode> {
    let n = usize::from(args.philosophers);
    let deadline = started + Duration::from_secs(args.timeout_s);
    let LoopbackCluster {
        cluster,
        gauges,
        app_ts,
        siu_addrs,
        daemons,
        ..
    } = lc;
    let progress = Arc::new(AtomicU64::new(0));
    let map = Arc::new(forks_map(n));
    let topology = Arc::new(cluster.topology.clone());
    let mut threads = Vec::new();
    for (h, t) in app_ts.into_iter().enumerate() {
        let siu = siu_addrs[h];
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
        "dining philosophers: {} philosophers over a token manager and {} SIUs ({})",
        r.philosophers,
        r.philosophers,
        r.transport.describe()
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

#[cfg(test)]
mod tests;
