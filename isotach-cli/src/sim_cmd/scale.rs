//! `isotach sim scale`: how the pulse period, isochron latency, traffic, wall time and memory
//! grow with the number of hosts, on each topology.
//!
//! Each point is one `isotach sim waves --json` run in a fresh child process of this binary,
//! so its peak memory (`peak_rss_kb`) is its own. The switch count of a point follows from the
//! hosts: `--hosts-per-leaf` hosts per switch that takes hosts; a tree grows as deep as its
//! leaves need (`tree:4`: 1, 5, 21, 85, 341 switches), a line as long as that but at most
//! `--line-switches-max` switches (a line's largest logical distance is its length, and its
//! epoch and window grow with it: past 64 switches the points say little more than that).

use super::progress::Progress;
use super::{parse_probability, parse_seed, parse_shape};
use crate::{EXIT_FAILED, UsageError};
use anyhow::Context;
use clap::Args;
use isotach_proto::topology::{HOSTS_MAX, SWITCHES_MAX, Shape};
use serde::Serialize;
use serde_json::Value;
use std::process::{Command, ExitCode, Stdio};

/// Most points a sweep runs (hosts × topologies).
const POINTS_MAX: usize = 64;

/// Sweep the hosts on each topology (see the module documentation).
#[derive(Debug, Args)]
pub(crate) struct ScaleArgs {
    /// Hosts of the first point.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=HOSTS_MAX as i64))]
    hosts_from: u16,
    /// Hosts of the last point (at most).
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u16).range(1..=HOSTS_MAX as i64))]
    hosts_to: u16,
    /// Each point has this many times the hosts of the one before.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(2..=16))]
    factor: u16,
    /// Topologies, comma-separated: line, star, tree:FANOUT, leaf-spine[:SPINES].
    #[arg(long, value_delimiter = ',', default_value = "line,tree:4", value_parser = parse_shape)]
    topology: Vec<Shape>,
    /// Hosts on each switch that takes hosts: sets each point's switch count.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..))]
    hosts_per_leaf: u16,
    /// Most switches of a line.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u16).range(1..=SWITCHES_MAX as i64))]
    line_switches_max: u16,
    /// Pulses each point runs.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(10..))]
    pulses: u64,
    /// Seed of every point (decimal or 0x-hex).
    #[arg(long, env = "ISOTACH_SEED", default_value_t = 1, value_parser = parse_seed)]
    seed: u64,
    /// Probability a datagram is lost (passed to every point).
    #[arg(long, default_value_t = 0.0, value_parser = parse_probability)]
    loss: f64,
    /// Probability a datagram is duplicated.
    #[arg(long, default_value_t = 0.0, value_parser = parse_probability)]
    dup: f64,
    /// Probability a datagram is overtaken.
    #[arg(long, default_value_t = 0.0, value_parser = parse_probability)]
    reorder: f64,
    /// Probability a token arrives corrupted.
    #[arg(long, default_value_t = 0.0, value_parser = parse_probability)]
    token_corrupt: f64,
    /// Show a progress bar on stderr even when stderr is not a terminal.
    #[arg(long)]
    progress: bool,
    /// Print one JSON object on stdout.
    #[arg(long)]
    json: bool,
}

/// One point of the sweep. Keys are documented in `docs/sim.md`.
#[derive(Debug, Clone, Serialize)]
struct Point {
    topology: String,
    hosts: u64,
    switches: u64,
    max_logical_distance: u64,
    pulses: u64,
    ok: bool,
    pulse_period_us: f64,
    isochron_latency_p50_us: u64,
    isochron_latency_p99_us: u64,
    isochron_latency_p50_pulses: u64,
    isochron_latency_p99_pulses: u64,
    isochron_latency_samples: u64,
    messages_per_pulse: f64,
    datagrams_per_pulse: f64,
    events: u64,
    wall_time_ms: u64,
    peak_rss_kb: u64,
    rss_per_host_kb: f64,
    trace_hash: String,
}

/// The sweep's result.
#[derive(Debug, Serialize)]
struct Sweep {
    ok: bool,
    seed: u64,
    pulses: u64,
    hosts_per_leaf: u16,
    line_switches_max: u16,
    loss: f64,
    dup: f64,
    reorder: f64,
    token_corrupt: f64,
    points: Vec<Point>,
}

/// What one point runs.
#[derive(Debug, Clone, Copy)]
struct Plan {
    shape: Shape,
    hosts: u16,
    switches: u16,
}

pub(super) fn run(a: &ScaleArgs) -> anyhow::Result<ExitCode> {
    let plans = plans(a)?;
    let exe = std::env::current_exe().context("finding this program to run the points")?;
    let bar = Progress::new("sim scale", plans.len() as u64, "points", a.progress);
    let mut points = Vec::with_capacity(plans.len());
    for (i, p) in plans.iter().enumerate() {
        bar.set(i as u64, || {
            format!("{} {} hosts, {} switches", p.shape, p.hosts, p.switches)
        });
        let point = run_point(&exe, a, p);
        let point = match point {
            Ok(point) => point,
            Err(e) => {
                bar.finish();
                return Err(e);
            }
        };
        if !a.json {
            eprintln!("sim scale: {}", row(&point));
        }
        points.push(point);
    }
    bar.set(plans.len() as u64, String::new);
    bar.finish();
    let sweep = Sweep {
        ok: points.iter().all(|p| p.ok),
        seed: a.seed,
        pulses: a.pulses,
        hosts_per_leaf: a.hosts_per_leaf,
        line_switches_max: a.line_switches_max,
        loss: a.loss,
        dup: a.dup,
        reorder: a.reorder,
        token_corrupt: a.token_corrupt,
        points,
    };
    if a.json {
        println!(
            "{}",
            serde_json::to_string(&sweep).context("encoding the sweep")?
        );
    } else {
        print_table(&sweep);
    }
    if sweep.ok {
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!(
            "sim scale: FAILED: a point failed its checks (ok false); rerun it with sim waves"
        );
        Ok(ExitCode::from(EXIT_FAILED))
    }
}

/// Every point: each topology over the hosts `hosts_from`, ×factor, … up to `hosts_to`.
fn plans(a: &ScaleArgs) -> anyhow::Result<Vec<Plan>> {
    if a.hosts_from > a.hosts_to {
        return Err(UsageError(format!(
            "--hosts-from {} is above --hosts-to {}",
            a.hosts_from, a.hosts_to
        ))
        .into());
    }
    let mut hosts = Vec::new();
    let mut h = u32::from(a.hosts_from);
    while h <= u32::from(a.hosts_to) {
        hosts.push(h as u16);
        h *= u32::from(a.factor);
    }
    let mut plans = Vec::new();
    for &shape in &a.topology {
        for &h in &hosts {
            let switches = switches_for(shape, h, a.hosts_per_leaf, a.line_switches_max);
            plans.push(Plan {
                shape,
                hosts: h,
                switches,
            });
        }
    }
    if plans.len() > POINTS_MAX {
        return Err(UsageError(format!(
            "{} points ({} topologies × {} host counts) is more than {POINTS_MAX}: use fewer \
             topologies or a larger --factor",
            plans.len(),
            a.topology.len(),
            hosts.len()
        ))
        .into());
    }
    Ok(plans)
}

/// The switches of a point of `hosts` hosts on `shape`, about `per_leaf` hosts on each switch
/// that takes hosts.
fn switches_for(shape: Shape, hosts: u16, per_leaf: u16, line_max: u16) -> u16 {
    let leaves = hosts.div_ceil(per_leaf).max(1);
    let n = match shape {
        Shape::Line => leaves.min(line_max),
        Shape::Star if leaves == 1 => 1,
        // The centre and the leaves.
        Shape::Star => leaves.saturating_add(1),
        Shape::Tree { fanout } => {
            // A complete tree deep enough for the leaves: 1 + f + f² + … + f^depth switches.
            let f = u32::from(fanout);
            let (mut level, mut total) = (1u32, 1u32);
            while level < u32::from(leaves) {
                level *= f;
                total += level;
            }
            u16::try_from(total).unwrap_or(u16::MAX)
        }
        Shape::LeafSpine { spines } => {
            let p = spines.unwrap_or_else(|| leaves.isqrt().max(1));
            leaves.saturating_add(p)
        }
    };
    n.clamp(1, SWITCHES_MAX as u16)
}

/// Runs one point in a child process and reads its report.
fn run_point(exe: &std::path::Path, a: &ScaleArgs, p: &Plan) -> anyhow::Result<Point> {
    let mut cmd = Command::new(exe);
    cmd.args(["sim", "waves", "--json"])
        .args(["--hosts", &p.hosts.to_string()])
        .args(["--switches", &p.switches.to_string()])
        .args(["--topology", &p.shape.to_string()])
        .args(["--pulses", &a.pulses.to_string()])
        .args(["--seed", &a.seed.to_string()])
        .args(["--loss", &a.loss.to_string()])
        .args(["--dup", &a.dup.to_string()])
        .args(["--reorder", &a.reorder.to_string()])
        .args(["--token-corrupt", &a.token_corrupt.to_string()])
        .stdin(Stdio::null());
    let out = cmd
        .output()
        .with_context(|| format!("running the point {} with {} hosts", p.shape, p.hosts))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let code = out.status.code();
    if code != Some(0) && code != Some(i32::from(EXIT_FAILED)) {
        return Err(UsageError(format!(
            "the point {} with {} hosts and {} switches could not run ({}): {}",
            p.shape,
            p.hosts,
            p.switches,
            out.status,
            stderr.lines().last().unwrap_or("")
        ))
        .into());
    }
    let v: Value = serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "reading the report of the point {} with {} hosts",
            p.shape, p.hosts
        )
    })?;
    point(p, &v).with_context(|| format!("the report of {} with {} hosts", p.shape, p.hosts))
}

/// The point's fields from a `sim waves` report.
fn point(p: &Plan, v: &Value) -> anyhow::Result<Point> {
    let u = |k: &str| {
        v[k].as_u64()
            .with_context(|| format!("no whole number `{k}` in the report"))
    };
    let f = |k: &str| {
        v[k].as_f64()
            .with_context(|| format!("no number `{k}` in the report"))
    };
    let hosts = u("hosts")?;
    let peak_rss_kb = u("peak_rss_kb")?;
    Ok(Point {
        topology: p.shape.to_string(),
        hosts,
        switches: u("switches")?,
        max_logical_distance: u("max_logical_distance")?,
        pulses: u("pulses")?,
        ok: v["ok"].as_bool().context("no `ok` in the report")?,
        pulse_period_us: f("pulse_period_us")?,
        isochron_latency_p50_us: u("isochron_latency_p50_us")?,
        isochron_latency_p99_us: u("isochron_latency_p99_us")?,
        isochron_latency_p50_pulses: u("isochron_latency_p50_pulses")?,
        isochron_latency_p99_pulses: u("isochron_latency_p99_pulses")?,
        isochron_latency_samples: u("isochron_latency_samples")?,
        messages_per_pulse: f("messages_per_pulse")?,
        datagrams_per_pulse: f("datagrams_per_pulse")?,
        events: u("events")?,
        wall_time_ms: u("wall_time_ms")?,
        peak_rss_kb,
        rss_per_host_kb: peak_rss_kb as f64 / hosts.max(1) as f64,
        trace_hash: v["trace_hash"].as_str().unwrap_or_default().to_string(),
    })
}

const HEADER: &str = "topology     hosts switches  D  period_us  lat_p50_us lat_p99_us  \
                      p50_pulses p99_pulses  msgs/pulse dgrams/pulse  wall_ms  rss_MiB \
                      kiB/host  ok";

/// One line of the table.
fn row(p: &Point) -> String {
    format!(
        "{:<11} {:>6} {:>8} {:>2} {:>10.1} {:>11} {:>10} {:>11} {:>10} {:>11.1} {:>12.1} {:>8} \
         {:>8} {:>8.1}  {}",
        p.topology,
        p.hosts,
        p.switches,
        p.max_logical_distance,
        p.pulse_period_us,
        p.isochron_latency_p50_us,
        p.isochron_latency_p99_us,
        p.isochron_latency_p50_pulses,
        p.isochron_latency_p99_pulses,
        p.messages_per_pulse,
        p.datagrams_per_pulse,
        p.wall_time_ms,
        p.peak_rss_kb / 1024,
        p.rss_per_host_kb,
        if p.ok { "ok" } else { "FAILED" }
    )
}

fn print_table(s: &Sweep) {
    println!(
        "sim scale: {} pulses a point, seed {}, {} hosts per leaf, lines of at most {} switches \
         (D: largest logical distance)",
        s.pulses, s.seed, s.hosts_per_leaf, s.line_switches_max
    );
    println!("{HEADER}");
    for p in &s.points {
        println!("{}", row(p));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn switches_follow_the_hosts_and_a_line_stops_at_its_cap() {
        let tree = Shape::Tree { fanout: 4 };
        let got: Vec<u16> = [16, 64, 256, 1024, 4096]
            .iter()
            .map(|&h| switches_for(tree, h, 16, 64))
            .collect();
        assert_eq!(got, [1, 5, 21, 85, 341]);
        let line: Vec<u16> = [16, 64, 256, 1024, 4096]
            .iter()
            .map(|&h| switches_for(Shape::Line, h, 16, 64))
            .collect();
        assert_eq!(line, [1, 4, 16, 64, 64]);
        assert_eq!(switches_for(Shape::Star, 100, 16, 64), 8);
        assert_eq!(switches_for(Shape::Star, 10, 16, 64), 1);
        let ls = Shape::LeafSpine { spines: None };
        assert_eq!(switches_for(ls, 1024, 16, 64), 72);
    }
}
