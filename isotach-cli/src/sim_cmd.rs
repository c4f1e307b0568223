//! `isotach sim …`: workloads on the deterministic simulator.

use crate::{EXIT_FAILED, UsageError};
use anyhow::Context;
use clap::{Args, Subcommand};
use isotach_proto::config::{ClusterConfig, Timing};
use isotach_proto::topology::{HOSTS_MAX, SWITCHES_MAX};
use isotach_sim::waves::{self, WavesLoad, WavesOptions, WavesReport};
use isotach_sim::{Faults, Pauses, RangeUs, Tamper};
use std::path::PathBuf;
use std::process::ExitCode;

/// Run a workload on the simulator. A run is fully determined by its seed and flags.
#[derive(Debug, Args)]
pub(crate) struct SimArgs {
    #[command(subcommand)]
    workload: Workload,
}

#[derive(Debug, Subcommand)]
enum Workload {
    /// Random isochrons to random hosts under token waves; a god's-eye oracle checks that no
    /// EOP marker overtakes a message of its pulse and that every sort vector is right.
    /// Exits 0 only when the run completed with no violation.
    Waves(Box<WavesArgs>),
}

#[derive(Debug, Args)]
struct WavesArgs {
    /// Hosts (one SIU each), spread round-robin over the switches.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=HOSTS_MAX as i64))]
    hosts: u16,
    /// Switches (one token manager each), joined in a line; at most --hosts.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=SWITCHES_MAX as i64))]
    switches: u16,
    /// Cluster config file (TOML) instead of a generated line of --switches switches.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["hosts", "switches"])]
    config: Option<PathBuf>,
    /// Run until every SIU has completed this many pulses.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    pulses: u64,
    /// Seed of every random choice (decimal or 0x-hex); the same seed replays the same run.
    #[arg(long, env = "ISOTACH_SEED", default_value_t = 1, value_parser = parse_seed)]
    seed: u64,
    /// Probability a datagram is lost (the transport retransmits after --rto-us).
    #[arg(long, default_value_t = Faults::default().loss, value_parser = parse_probability)]
    loss: f64,
    /// Probability a datagram is duplicated (the transport absorbs the copy).
    #[arg(long, default_value_t = Faults::default().dup, value_parser = parse_probability)]
    dup: f64,
    /// Probability a datagram is overtaken (later ones wait behind it).
    #[arg(long, default_value_t = Faults::default().reorder, value_parser = parse_probability)]
    reorder: f64,
    /// Probability a token arrives with a flipped byte (dropped for its CRC).
    #[arg(long, default_value_t = Faults::default().token_corrupt, value_parser = parse_probability)]
    token_corrupt: f64,
    /// Pause a random TM or SIU every this many µs of virtual time (0: never).
    #[arg(long, default_value_t = 0)]
    pause_every_us: u64,
    /// How long a pause lasts, µs (A..B).
    #[arg(long, default_value_t = RangeUs::new(100, 20_000), value_parser = parse_range)]
    pause_us: RangeUs,
    /// One-way base latency of each link direction, µs (A..B, drawn per direction).
    #[arg(long, visible_alias = "delay-us", default_value_t = Faults::default().latency_us, value_parser = parse_range)]
    latency_us: RangeUs,
    /// Extra delay of each datagram, µs (A..B).
    #[arg(long, default_value_t = Faults::default().jitter_us, value_parser = parse_range)]
    jitter_us: RangeUs,
    /// How late an overtaken datagram is, µs (A..B).
    #[arg(long, default_value_t = Faults::default().reorder_delay_us, value_parser = parse_range)]
    reorder_delay_us: RangeUs,
    /// Retransmission timeout of the transport under the links, µs.
    #[arg(long, default_value_t = Faults::default().rto_us, value_parser = clap::value_parser!(u64).range(1..))]
    rto_us: u64,
    /// Latency of the host↔SIU links, µs.
    #[arg(long, default_value_t = Faults::default().host_latency_us)]
    host_latency_us: u64,
    /// Token timer of TMs and SIUs, µs (default: the config's).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    token_timeout_us: Option<u64>,
    /// Pulses per signal epoch (default: the config's).
    #[arg(long, value_parser = clap::value_parser!(u32).range(2..))]
    epoch_pulses: Option<u32>,
    /// Most messages in an ordinary isochron.
    #[arg(long, default_value_t = WavesLoad::default().messages_max, value_parser = clap::value_parser!(u32).range(1..=4096))]
    messages_max: u32,
    /// Probability an isochron is a burst of 33..40 messages to one host.
    #[arg(long, default_value_t = WavesLoad::default().burst, value_parser = parse_probability)]
    burst: f64,
    /// Probability a host also sends a non-isotach message with an isochron.
    #[arg(long, default_value_t = WavesLoad::default().plain, value_parser = parse_probability)]
    plain: f64,
    /// Most isochrons a host has in flight.
    #[arg(long, default_value_t = WavesLoad::default().outstanding_max, value_parser = clap::value_parser!(u32).range(1..))]
    outstanding_max: u32,
    /// Pause between a host's isochrons, µs (A..B).
    #[arg(long, default_value_t = WavesLoad::default().think_us, value_parser = parse_range)]
    think_us: RangeUs,
    /// Largest send delta a host asks for.
    #[arg(long, default_value_t = WavesLoad::default().send_delta_max)]
    send_delta_max: u32,
    /// Virtual time without pulse progress that ends the run as stalled, µs (default: derived
    /// from the token timer and pauses, at least one second).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    stall_us: Option<u64>,
    /// Test only: damage the SIU→host stream to prove the oracle fails
    /// (hold-back-message, swap-sort-vector).
    #[arg(long, hide = true, value_parser = parse_tamper)]
    tamper: Option<Tamper>,
    /// Print one JSON object on stdout (progress goes to stderr).
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(args: SimArgs) -> anyhow::Result<ExitCode> {
    match args.workload {
        Workload::Waves(w) => waves_cmd(&w),
    }
}

fn waves_cmd(a: &WavesArgs) -> anyhow::Result<ExitCode> {
    let opts = waves_options(a)?;
    let topo = &opts.cluster.topology;
    eprintln!(
        "sim waves: {} hosts, {} switches, {} pulses, seed {}",
        topo.host_count(),
        topo.switch_count(),
        opts.pulses,
        opts.seed
    );
    let report = waves::run_with_progress(&opts, &mut |p| {
        eprintln!(
            "sim waves: pulse {}/{} at virtual {} us",
            p.pulses, p.pulses_target, p.virtual_time_us
        );
    })
    .map_err(|e| UsageError(e.to_string()))?;
    if a.json {
        println!(
            "{}",
            serde_json::to_string(&report).context("encoding the report")?
        );
    } else {
        print_summary(&report);
    }
    if report.ok {
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!(
        "sim waves: FAILED (completed={}, eop_violations={}, order_violations={}, \
         unexpected_errors={}); replay with --seed {}",
        report.completed,
        report.eop_violations,
        report.order_violations,
        report.unexpected_errors,
        report.seed
    );
    for p in &report.problems {
        eprintln!("  {p}");
    }
    Ok(ExitCode::from(EXIT_FAILED))
}

fn waves_options(a: &WavesArgs) -> anyhow::Result<WavesOptions> {
    let cluster = match &a.config {
        Some(path) => ClusterConfig::load(path).map_err(|e| UsageError(e.to_string()))?,
        None => {
            if a.switches > a.hosts {
                return Err(UsageError(format!(
                    "--switches {} exceeds --hosts {}: every switch needs a host",
                    a.switches, a.hosts
                ))
                .into());
            }
            ClusterConfig::generated(usize::from(a.hosts), usize::from(a.switches))
                .map_err(|e| UsageError(e.to_string()))?
        }
    };
    let mut opts = WavesOptions::with_cluster(cluster, a.pulses, a.seed);
    let timing = Timing {
        token_timeout_us: a
            .token_timeout_us
            .unwrap_or(opts.cluster.timing.token_timeout_us),
        epoch_pulses: a.epoch_pulses.unwrap_or(opts.cluster.timing.epoch_pulses),
    };
    opts.cluster.timing = timing;
    opts.faults = Faults {
        latency_us: a.latency_us,
        jitter_us: a.jitter_us,
        loss: a.loss,
        dup: a.dup,
        reorder: a.reorder,
        reorder_delay_us: a.reorder_delay_us,
        rto_us: a.rto_us,
        token_corrupt: a.token_corrupt,
        host_latency_us: a.host_latency_us,
    };
    opts.pauses = (a.pause_every_us > 0).then_some(Pauses {
        every_us: a.pause_every_us,
        duration_us: a.pause_us,
    });
    opts.load = WavesLoad {
        messages_max: a.messages_max,
        burst: a.burst,
        plain: a.plain,
        outstanding_max: a.outstanding_max,
        think_us: a.think_us,
        send_delta_max: a.send_delta_max,
    };
    opts.stall_us = a.stall_us;
    opts.tamper = a.tamper.unwrap_or_default();
    opts.validate().map_err(|e| UsageError(e.to_string()))?;
    Ok(opts)
}

fn print_summary(r: &WavesReport) {
    let verdict = if r.ok { "ok" } else { "FAILED" };
    println!(
        "sim waves {verdict}: {} hosts, {} switches, seed {}",
        r.hosts, r.switches, r.seed
    );
    println!(
        "  pulses {}/{} completed={}  virtual {} us  wall {} ms  events {}",
        r.pulses, r.pulses_target, r.completed, r.virtual_time_us, r.wall_time_ms, r.events
    );
    println!(
        "  isochrons {}  messages sent {} delivered {}  eops {} (over 32: {})",
        r.isochrons, r.messages_sent, r.messages_delivered, r.eops, r.eops_over_32
    );
    println!(
        "  eop_violations {}  order_violations {}  unexpected_errors {}  plain {}/{} (fifo breaks {})",
        r.eop_violations,
        r.order_violations,
        r.unexpected_errors,
        r.plain_delivered,
        r.plain_sent,
        r.plain_fifo_violations
    );
    println!(
        "  tokens: repeated {} corrupted {} dropped-bad-crc {} duplicate {} early {}",
        r.tokens_repeated,
        r.tokens_corrupted,
        r.tokens_dropped_bad_crc,
        r.tokens_duplicate,
        r.tokens_early
    );
    println!(
        "  network: datagrams {} retransmissions {} reordered {} duplicates absorbed {}  pauses {}",
        r.datagrams, r.retransmissions, r.reordered, r.duplicates_absorbed, r.pauses
    );
    println!("  trace_hash {}", r.trace_hash);
}

/// A test-only tamper mode.
fn parse_tamper(s: &str) -> Result<Tamper, String> {
    match s {
        "none" => Ok(Tamper::None),
        "hold-back-message" => Ok(Tamper::HoldBackMessage),
        "swap-sort-vector" => Ok(Tamper::SwapSortVector),
        _ => Err(format!(
            "`{s}` is not a tamper mode (none, hold-back-message, swap-sort-vector)"
        )),
    }
}

/// A seed: decimal or `0x`-prefixed hex.
fn parse_seed(s: &str) -> Result<u64, String> {
    let r = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse(),
    };
    r.map_err(|e| format!("`{s}` is not a seed (decimal or 0x-hex u64): {e}"))
}

/// A probability in `[0, 1)`.
fn parse_probability(s: &str) -> Result<f64, String> {
    let p: f64 = s
        .parse()
        .map_err(|e| format!("`{s}` is not a number: {e}"))?;
    if !(0.0..1.0).contains(&p) {
        return Err(format!("`{s}` is not a probability in [0, 1)"));
    }
    Ok(p)
}

/// A range of microseconds `A..B` with `A <= B` (a single number `A` means `A..A`).
fn parse_range(s: &str) -> Result<RangeUs, String> {
    let num = |t: &str| {
        t.trim()
            .parse::<u64>()
            .map_err(|e| format!("`{t}` in `{s}` is not a whole number of µs: {e}"))
    };
    let (lo, hi) = match s.split_once("..") {
        Some((a, b)) => (num(a)?, num(b.strip_prefix('=').unwrap_or(b))?),
        None => {
            let v = num(s)?;
            (v, v)
        }
    };
    if lo > hi {
        return Err(format!("range `{s}` is empty: need A <= B in A..B"));
    }
    Ok(RangeUs::new(lo, hi))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parsers_accept_good_and_refuse_bad_values() {
        assert_eq!(parse_seed("0x10"), Ok(16));
        assert_eq!(parse_seed("42"), Ok(42));
        assert!(parse_seed("x").is_err());
        assert_eq!(parse_probability("0.5"), Ok(0.5));
        assert!(parse_probability("1").is_err());
        assert!(parse_probability("-0.1").is_err());
        assert!(parse_probability("NaN").is_err());
        assert_eq!(parse_range("3..9"), Ok(RangeUs::new(3, 9)));
        assert_eq!(parse_range("3..=9"), Ok(RangeUs::new(3, 9)));
        assert_eq!(parse_range("7"), Ok(RangeUs::new(7, 7)));
        assert!(parse_range("9..3").is_err());
        assert!(parse_range("a..3").is_err());
    }
}
