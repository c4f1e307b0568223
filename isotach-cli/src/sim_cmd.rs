//! `isotach sim …`: workloads on the deterministic simulator.

use crate::UsageError;
use clap::{Args, Subcommand};
use isotach_proto::config::{ClusterConfig, Timing, check_bounds};
use isotach_proto::topology::{HOSTS_MAX, SWITCHES_MAX, Shape, ShapeError};
use isotach_sim::philo::{self, PhiloOptions};
use isotach_sim::sc::{self, AppFaults, ScOptions};
use isotach_sim::waves::{self, WavesLoad, WavesOptions};
use isotach_sim::{Faults, NetFaults, Pauses, RangeUs, Restarts, Tamper};
use std::path::PathBuf;
use std::process::ExitCode;

mod progress;
mod report;
mod scale;

use progress::Progress;
use report::{WithMemory, conclude, peak_rss_kb};

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
    /// SMM nodes run random isochrons (reads, writes, sched/assign chains) over hot, replicated
    /// and single-copy pages; the sequential-consistency oracle replays every executed
    /// isochron in (TS, source, sequum) order and checks every read, every isochron's
    /// atomicity, every host's program order and that all copies agree. Exits 0 only when
    /// every count is 0.
    Sc(Box<ScArgs>),
    /// Dining philosophers over the SMM: forks are shared variables taken with one isochron
    /// (read both + sched both) and assigned back. An independent observer checks that no
    /// two neighbours eat at once; the sequential-consistency oracle replays the forks'
    /// history. Exits 0 only with no violation and every philosopher having eaten every meal.
    Philo(Box<PhiloArgs>),
    /// Sweeps the number of hosts (16 → 4096 by default) on each topology (a line and a tree
    /// by default), one `sim waves` run per point in a fresh process, and prints per point the
    /// pulse period, isochron latency p50/p99 (virtual µs and pulses), messages per pulse,
    /// wall time and peak memory. Exits 0 only when every point passed its checks.
    Scale(Box<scale::ScaleArgs>),
}

/// Where the hosts are: a generated tree of switches, or a config file.
#[derive(Debug, Args)]
struct TopologyArgs {
    /// Hosts (one SIU each), spread round-robin over the switches that take hosts.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=HOSTS_MAX as i64))]
    hosts: u16,
    /// Switches (one token manager each), joined as --topology says.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=SWITCHES_MAX as i64))]
    switches: u16,
    /// How the switches are joined: line (hosts on every switch), star, tree:FANOUT (a
    /// balanced tree) or leaf-spine[:SPINES]; hosts go on the leaves (docs/design.md, "Which
    /// switch graphs work"). Epoch and window are sized for its largest logical distance.
    #[arg(long, default_value_t = Shape::Line, value_parser = parse_shape)]
    topology: Shape,
    /// Cluster config file (TOML) instead of a generated topology.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["hosts", "switches", "topology"])]
    config: Option<PathBuf>,
}

impl TopologyArgs {
    fn cluster(&self) -> anyhow::Result<ClusterConfig> {
        if let Some(path) = &self.config {
            return Ok(ClusterConfig::load(path).map_err(|e| UsageError(e.to_string()))?);
        }
        generated(self.topology, self.hosts, self.switches)
    }
}

/// A generated cluster, its timing and limits sized for it.
fn generated(shape: Shape, hosts: u16, switches: u16) -> anyhow::Result<ClusterConfig> {
    ClusterConfig::generate(shape, usize::from(hosts), usize::from(switches)).map_err(|e| {
        UsageError(format!(
            "--topology {shape} with --switches {switches} and {hosts} hosts: {e}"
        ))
        .into()
    })
}

/// The network beneath the links, pauses, and protocol timing.
#[derive(Debug, Args)]
struct NetArgs {
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
    /// Crash a random TM or SIU this many times (a fresh process with a new incarnation
    /// takes its place after --restart-down-us; see docs/operations.md, "Peer loss and
    /// restarts").
    #[arg(long, default_value_t = 0)]
    restarts: u32,
    /// Virtual time between two crashes, µs.
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..))]
    restart_every_us: u64,
    /// How long a crashed TM or SIU stays down, µs (A..B).
    #[arg(long, default_value_t = RangeUs::new(100, 5_000), value_parser = parse_range)]
    restart_down_us: RangeUs,
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
    /// The SIUs wait for their hosts' turns, as an SIU embedded in the application does: a
    /// token after a pulse that brought the host packets waits until the host's answer came
    /// back over the host link (docs/design.md, "Host turns").
    #[arg(long)]
    host_turns: bool,
    /// Token timer of TMs and SIUs, µs (default: the config's).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    token_timeout_us: Option<u64>,
    /// Pulses per signal epoch; must exceed the largest logical distance (default: the
    /// config's, or for a generated topology the larger of 64 and twice that distance).
    #[arg(long, value_parser = clap::value_parser!(u32).range(2..))]
    epoch_pulses: Option<u32>,
    /// Idle pacing of the TMs, µs: an idle wave waits this long (0 = never; default: the
    /// config's, 1000, or half the token timeout if that is shorter).
    #[arg(long, value_parser = clap::value_parser!(u64).range(0..=isotach_proto::config::IDLE_PACE_US_MAX))]
    idle_pace_us: Option<u64>,
}

impl NetArgs {
    fn faults(&self) -> Faults {
        Faults {
            latency_us: self.latency_us,
            jitter_us: self.jitter_us,
            loss: self.loss,
            dup: self.dup,
            reorder: self.reorder,
            reorder_delay_us: self.reorder_delay_us,
            rto_us: self.rto_us,
            token_corrupt: self.token_corrupt,
            host_latency_us: self.host_latency_us,
        }
    }

    /// The network, pauses and crashes: every workload takes them alike.
    fn net_faults(&self) -> NetFaults {
        NetFaults {
            faults: self.faults(),
            pauses: (self.pause_every_us > 0).then_some(Pauses {
                every_us: self.pause_every_us,
                duration_us: self.pause_us,
            }),
            restarts: (self.restarts > 0).then_some(Restarts {
                every_us: self.restart_every_us,
                count: self.restarts,
                down_us: self.restart_down_us,
            }),
            host_turns: self.host_turns,
        }
    }

    /// Applies the timing flags to `cluster` and checks the epoch is long enough.
    fn apply_timing(&self, cluster: &mut ClusterConfig) -> anyhow::Result<()> {
        let token_timeout_us = self
            .token_timeout_us
            .unwrap_or(cluster.timing.token_timeout_us);
        let idle_pace_us = match (self.idle_pace_us, self.token_timeout_us) {
            (Some(pace), _) => pace,
            // A shorter timer given alone keeps the pace below it, as in a config file.
            (None, Some(timeout)) => cluster
                .timing
                .idle_pace_us
                .min(Timing::default_idle_pace_us(timeout)),
            (None, None) => cluster.timing.idle_pace_us,
        };
        let sized_epoch = cluster.timing.epoch_pulses;
        cluster.timing = Timing {
            token_timeout_us,
            epoch_pulses: self.epoch_pulses.unwrap_or(cluster.timing.epoch_pulses),
            idle_pace_us,
        };
        if idle_pace_us > 0 && idle_pace_us > token_timeout_us / 2 {
            return Err(UsageError(format!(
                "--idle-pace-us {idle_pace_us} must be at most half the token timeout \
                 ({token_timeout_us} µs), so the lost-token timer never fires on a paced wave \
                 (0 turns idle pacing off)"
            ))
            .into());
        }
        let reach = u32::from(cluster.topology.max_distance());
        if let Some(epoch) = self.epoch_pulses
            && epoch <= reach
        {
            return Err(UsageError(format!(
                "--epoch-pulses {epoch} must exceed the largest logical distance ({reach}): \
                 give {} or more, or leave it out for {} (sized for this topology)",
                reach + 1,
                sized_epoch
            ))
            .into());
        }
        check_bounds(&cluster.timing, &cluster.limits, &cluster.topology)
            .map_err(|(key, why)| UsageError(format!("{key}: {why}")))?;
        self.faults()
            .validate()
            .map_err(|e| UsageError(e.to_string()))?;
        Ok(())
    }
}

#[derive(Debug, Args)]
struct WavesArgs {
    #[command(flatten)]
    topology: TopologyArgs,
    /// Run until every SIU has completed this many pulses.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    pulses: u64,
    /// Seed of every random choice (decimal or 0x-hex); the same seed replays the same run.
    #[arg(long, env = "ISOTACH_SEED", default_value_t = 1, value_parser = parse_seed)]
    seed: u64,
    #[command(flatten)]
    net: NetArgs,
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
    /// Probability a host also enters a random barrier with an isochron (the oracle checks no
    /// host sees a barrier complete before every host entered it).
    #[arg(long, default_value_t = WavesLoad::default().barrier, value_parser = parse_probability)]
    barrier: f64,
    /// Virtual time without pulse progress that ends the run as stalled, µs (default: derived
    /// from the token timer and pauses, at least one second).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    stall_us: Option<u64>,
    /// Show a progress bar on stderr even when stderr is not a terminal (on a terminal it is
    /// shown anyway; otherwise a line per tenth of the pulses).
    #[arg(long)]
    progress: bool,
    /// Test only: damage the SIU→host stream to prove the oracle fails
    /// (hold-back-message, swap-sort-vector), or have a host declare a distance too short to
    /// prove unexpected errors are reported (short-distance).
    #[arg(long, hide = true, value_parser = parse_tamper)]
    tamper: Option<Tamper>,
    /// Print one JSON object on stdout (progress goes to stderr).
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct ScArgs {
    #[command(flatten)]
    topology: TopologyArgs,
    /// Runs, one per seed: --seed, --seed + 1, …
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    seeds: u64,
    /// Isochrons per run, spread evenly over the hosts.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    isochrons: u64,
    /// First seed (decimal or 0x-hex).
    #[arg(long, env = "ISOTACH_SEED", default_value_t = 1, value_parser = parse_seed)]
    seed: u64,
    #[command(flatten)]
    net: NetArgs,
    /// Pause between a host's isochrons, µs (A..B).
    #[arg(long, default_value_t = RangeUs::new(0, 300), value_parser = parse_range)]
    think_us: RangeUs,
    /// Virtual time without pulse progress that ends a run as stalled, µs.
    #[arg(long, default_value_t = 2_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    stall_us: u64,
    /// Application restarts per host and run: the application drains, exits, stays away
    /// (--absent-us) and a new one joins by state transfer.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=100))]
    app_restarts: u32,
    /// Chance that a host's application joins late (after the start barrier, before its
    /// first isochron).
    #[arg(long, default_value_t = 0.0, value_parser = parse_probability)]
    late_join: f64,
    /// How long an application stays away before the new one attaches, µs (A..B).
    #[arg(long, default_value_t = AppFaults::default().absent_us, value_parser = parse_range)]
    absent_us: RangeUs,
    /// Show a progress bar on stderr even when stderr is not a terminal.
    #[arg(long)]
    progress: bool,
    /// Oracle self-test: rejoining applications skip replaying the operations after their
    /// image; a run with restarts must then fail.
    #[arg(long, hide = true)]
    break_transfer: bool,
    /// Print one JSON object on stdout (progress goes to stderr).
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct PhiloArgs {
    /// Philosophers (one host each), spread round-robin over the switches.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u16).range(2..=HOSTS_MAX as i64))]
    philosophers: u16,
    /// Switches, joined as --topology says.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=SWITCHES_MAX as i64))]
    switches: u16,
    /// How the switches are joined: line, star, tree:FANOUT or leaf-spine[:SPINES].
    #[arg(long, default_value_t = Shape::Line, value_parser = parse_shape)]
    topology: Shape,
    /// Meals each philosopher eats.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    meals: u64,
    /// Seed of every random choice (decimal or 0x-hex).
    #[arg(long, env = "ISOTACH_SEED", default_value_t = 1, value_parser = parse_seed)]
    seed: u64,
    #[command(flatten)]
    net: NetArgs,
    /// Thinking time between meals, µs (A..B).
    #[arg(long, default_value_t = RangeUs::new(0, 400), value_parser = parse_range)]
    think_us: RangeUs,
    /// Eating time, µs (A..B).
    #[arg(long, default_value_t = RangeUs::new(50, 400), value_parser = parse_range)]
    eat_us: RangeUs,
    /// Virtual time without pulse progress that ends the run as stalled, µs.
    #[arg(long, default_value_t = 2_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    stall_us: u64,
    /// Print one JSON object on stdout.
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(args: SimArgs) -> anyhow::Result<ExitCode> {
    match args.workload {
        Workload::Waves(w) => waves_cmd(&w),
        Workload::Sc(a) => sc_cmd(&a),
        Workload::Philo(a) => philo_cmd(&a),
        Workload::Scale(a) => scale::run(&a),
    }
}

fn waves_cmd(a: &WavesArgs) -> anyhow::Result<ExitCode> {
    let opts = waves_options(a)?;
    eprintln!(
        "sim waves: {}, {} pulses, seed {}",
        shape_line(&opts.cluster),
        opts.pulses,
        opts.seed
    );
    let bar = Progress::new("sim waves", opts.pulses, "pulses", a.progress);
    let report = waves::run_with_progress(&opts, &mut |p| {
        bar.set(p.pulses, || format!("at virtual {} us", p.virtual_time_us));
    })
    .map_err(|e| UsageError(e.to_string()));
    bar.finish();
    let report = WithMemory {
        report: report?,
        peak_rss_kb: peak_rss_kb(),
    };
    conclude(&report, a.json)
}

fn waves_options(a: &WavesArgs) -> anyhow::Result<WavesOptions> {
    let mut cluster = a.topology.cluster()?;
    a.net.apply_timing(&mut cluster)?;
    let mut opts = WavesOptions::with_cluster(cluster, a.pulses, a.seed);
    opts.net = a.net.net_faults();
    opts.load = WavesLoad {
        messages_max: a.messages_max,
        burst: a.burst,
        plain: a.plain,
        outstanding_max: a.outstanding_max,
        think_us: a.think_us,
        send_delta_max: a.send_delta_max,
        barrier: a.barrier,
    };
    opts.stall_us = a.stall_us;
    opts.tamper = a.tamper.unwrap_or_default();
    opts.validate().map_err(|e| UsageError(e.to_string()))?;
    Ok(opts)
}

fn sc_cmd(a: &ScArgs) -> anyhow::Result<ExitCode> {
    let mut cluster = a.topology.cluster()?;
    a.net.apply_timing(&mut cluster)?;
    let mut opts = ScOptions::new(cluster, a.seed);
    opts.runs = a.seeds;
    opts.isochrons = a.isochrons;
    opts.net = a.net.net_faults();
    opts.think_us = a.think_us;
    opts.stall_us = a.stall_us;
    opts.apps = AppFaults {
        restarts_per_host: a.app_restarts,
        late_join: a.late_join,
        absent_us: a.absent_us,
        break_transfer: a.break_transfer,
    };
    eprintln!(
        "sim sc: {}, {} runs of {} isochrons from seed {}",
        shape_line(&opts.cluster),
        opts.runs,
        opts.isochrons,
        opts.seed
    );
    let bar = Progress::new("sim sc", opts.runs, "runs", a.progress);
    let report = sc::run_with_progress(&opts, &mut |done, r| {
        bar.set(done, || {
            format!(
                "{} isochrons, {} reads checked, {} failed",
                r.isochrons,
                r.reads_checked,
                r.failed_seeds.len()
            )
        });
    })
    .map_err(|e| UsageError(e.to_string()));
    bar.finish();
    conclude(&report?, a.json)
}

fn philo_cmd(a: &PhiloArgs) -> anyhow::Result<ExitCode> {
    let mut cluster = generated(a.topology, a.philosophers, a.switches)?;
    a.net.apply_timing(&mut cluster)?;
    let mut opts = PhiloOptions::new(cluster, a.meals, a.seed);
    opts.net = a.net.net_faults();
    opts.think_us = a.think_us;
    opts.eat_us = a.eat_us;
    opts.stall_us = a.stall_us;
    eprintln!(
        "sim philo: {} (a philosopher per host), {} meals each, seed {}",
        shape_line(&opts.cluster),
        a.meals,
        a.seed
    );
    let report = philo::run(&opts).map_err(|e| UsageError(e.to_string()))?;
    conclude(&report, a.json)
}

/// Hosts, switches, the largest logical distance and what it sized, for the start line.
fn shape_line(c: &ClusterConfig) -> String {
    let t = &c.topology;
    format!(
        "{} hosts, {} switches, largest logical distance {}, epoch {} pulses, window {} pulses",
        t.host_count(),
        t.switch_count(),
        t.max_distance(),
        c.timing.epoch_pulses,
        c.limits.pulses_ahead_max
    )
}

/// A generated topology's shape.
fn parse_shape(s: &str) -> Result<Shape, String> {
    s.parse().map_err(|e: ShapeError| e.to_string())
}

/// A test-only tamper mode.
fn parse_tamper(s: &str) -> Result<Tamper, String> {
    match s {
        "none" => Ok(Tamper::None),
        "hold-back-message" => Ok(Tamper::HoldBackMessage),
        "swap-sort-vector" => Ok(Tamper::SwapSortVector),
        "short-distance" => Ok(Tamper::ShortDistance),
        _ => Err(format!(
            "`{s}` is not a tamper mode (none, hold-back-message, swap-sort-vector, \
             short-distance)"
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
