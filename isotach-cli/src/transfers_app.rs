//! `isotach transfers`: the bank workload of `isotach bench transfers` as one application
//! process on one host, over its SIU daemon or, with `--embedded-siu`, over an SIU in this
//! process (every host of the config runs one; see `deploy/netns/bench.sh`).
//!
//! The accounts, the idioms and the window are those of `bench transfers`
//! (`bench_cmd/transfers.rs`): page `p` holds accounts `p, p + H, …` with copies at hosts `p`
//! and `p + 1`; every host keeps `--clients` transfers in flight for `--seconds` after a short
//! warm-up; then every host drains, host 0 reads every account in one isochron and the total
//! must be conserved. Each process prints its own figures (one JSON line with `--json`) and,
//! with `--latency-file`, its latency histogram so a driver can merge the hosts' quantiles.

use crate::EXIT_FAILED;
use crate::UsageError;
use crate::bench_cmd::parse_seconds;
use crate::bench_cmd::transfers::{
    Bank, HostTransfers, Idiom, Load, check_accounts, host_transfers, limits,
};
use crate::cluster_io::{Link, load};
use crate::daemon_cmd::{Bound, app_host, bind};
use crate::philo_app::forks_map;
use clap::Args;
use hdrhistogram::Histogram;
use isotach_am::Tag;
use isotach_daemon::siu::siu_plan;
use isotach_proto::config::ClusterConfig;
use isotach_smm::am_link::AmSiuLink;
use isotach_smm::embedded::EmbeddedSiu;
use isotach_smm::{SiuLink, Smm, SmmConfig, SmmNode};
use serde::Serialize;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Run the bank transfer workload on this host over its SIU (a daemon, or embedded). Every host
/// of the config runs one; host 0 checks at the end that the total is conserved. Exits 0 when
/// this host's transfers all settled (and, on host 0, the total is conserved).
#[derive(Debug, Args)]
pub(crate) struct TransfersArgs {
    /// Cluster config (TOML).
    #[arg(long, value_name = "FILE", env = "ISOTACH_CONFIG")]
    config: PathBuf,
    /// This host's name (`[[host]] name`).
    #[arg(long, env = "ISOTACH_HOST")]
    host: String,
    /// Length of the measurement window, seconds (after a warm-up of a fifth of it, at most
    /// 0.2 s).
    #[arg(long, default_value_t = 3.0, value_parser = parse_seconds)]
    seconds: f64,
    /// Transfers this host keeps in flight.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=256))]
    clients: u32,
    /// Accounts, spread over the hosts' pages (page p has copies at hosts p and p + 1). Every
    /// host must be given the same number.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(2..=4096))]
    accounts: u32,
    /// How a transfer is written.
    #[arg(long, value_enum, default_value_t = Idiom::SchedAssign)]
    idiom: Idiom,
    /// Give up (exit 1) after this many seconds.
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    timeout_s: u64,
    /// Write the transfer latency histogram here: one `NANOSECONDS COUNT` line per recorded
    /// value (3 significant digits), for merging the hosts' quantiles.
    #[arg(long, value_name = "FILE")]
    latency_file: Option<PathBuf>,
    /// Run this host's SIU inside this process, bound to the host's `siu` address (start no
    /// `isotach siu` for this host): no kernel hop between the application and its SIU. See
    /// docs/operations.md, "Embedded SIU".
    #[arg(long)]
    embedded_siu: bool,
    /// Print one JSON object on stdout.
    #[arg(long)]
    json: bool,
}

/// `isotach transfers --json` (keys documented in `docs/bench.md`, "Real hosts").
#[derive(Debug, Serialize)]
struct HostReport {
    host: String,
    /// Where this host's SIU ran: `embedded` (`--embedded-siu`) or `daemon`.
    siu: &'static str,
    idiom: Idiom,
    clients: u32,
    accounts: u32,
    window_s: f64,
    transfers: u64,
    transfers_per_s: f64,
    transfer_latency_p50_us: f64,
    transfer_latency_p99_us: f64,
    pulses: u64,
    pulse_period_us: f64,
    /// Host 0 only: whether the audit found the total conserved.
    total_conserved: Option<bool>,
    ok: bool,
}

pub(crate) fn run(args: TransfersArgs) -> anyhow::Result<ExitCode> {
    let cluster = load(&args.config)?;
    let (host, app, siu) = app_host(&cluster, &args.config, &args.host, "the bank")?;
    let hosts = cluster.topology.host_count();
    check_accounts(args.accounts, hosts, "use fewer accounts")?;
    let link = Link::of(&cluster, &args.config, &args.host)?;
    let tag = Tag(cluster.transport.tag);
    crate::admin::logs::init("warn");
    let timeout = Duration::from_secs(args.timeout_s);
    let spin = cluster.transport.spin();
    let deadline = Instant::now() + timeout;
    let out = if args.embedded_siu {
        let plan = siu_plan(&cluster, host)
            .map_err(|e| UsageError(format!("{}: {e}", args.config.display())))?;
        let listen = plan.listen;
        match bind(link, listen, spin)? {
            Bound::Udp(t) => over(EmbeddedSiu::new(plan, t, tag)?, &args, &cluster, deadline),
            Bound::Quic(t, _) => over(EmbeddedSiu::new(plan, t, tag)?, &args, &cluster, deadline),
        }
    } else {
        match link {
            Link::Udp => over(
                AmSiuLink::connect_udp(app, siu, tag, timeout, spin)?,
                &args,
                &cluster,
                deadline,
            ),
            Link::Quic(identity) => over(
                AmSiuLink::connect_quic(app, siu, identity, tag, timeout, spin)?,
                &args,
                &cluster,
                deadline,
            ),
        }
    };
    let out = match out {
        Ok(o) => o,
        Err(e) => {
            eprintln!("error: transfers {}: {e}", args.host);
            return Ok(ExitCode::from(EXIT_FAILED));
        }
    };
    if let Some(path) = &args.latency_file {
        write_histogram(path, &out.lat_ns)
            .map_err(|e| UsageError(format!("--latency-file {}: {e}", path.display())))?;
    }
    let r = report(&args, host == 0, &out);
    print(&r, args.json)?;
    Ok(if r.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_FAILED)
    })
}

/// Runs this host's workload over its connected link.
fn over<L: SiuLink>(
    link: L,
    args: &TransfersArgs,
    cluster: &ClusterConfig,
    deadline: Instant,
) -> Result<HostTransfers, String> {
    let host = cluster
        .host_id(&args.host)
        .ok_or_else(|| format!("no host named `{}`", args.host))?;
    let hosts = cluster.topology.host_count();
    let node = SmmNode::new(SmmConfig {
        host,
        topology: Arc::new(cluster.topology.clone()),
        map: Arc::new(forks_map(hosts)),
        limits: limits(args.accounts),
        record: false,
    });
    let mut smm = Smm::new(node, link);
    let load = Load {
        bank: Bank {
            hosts,
            accounts: args.accounts,
        },
        idiom: args.idiom,
        clients: args.clients as usize,
        seconds: args.seconds,
        deadline,
    };
    host_transfers(&mut smm, usize::from(host), &load)
}

fn report(args: &TransfersArgs, auditor: bool, out: &HostTransfers) -> HostReport {
    let us = |q: f64| {
        if out.lat_ns.is_empty() {
            0.0
        } else {
            out.lat_ns.value_at_quantile(q) as f64 / 1000.0
        }
    };
    let total_conserved = auditor.then_some(out.audit_sum == Some(0));
    HostReport {
        host: args.host.clone(),
        siu: if args.embedded_siu {
            "embedded"
        } else {
            "daemon"
        },
        idiom: args.idiom,
        clients: args.clients,
        accounts: args.accounts,
        window_s: out.window_s,
        transfers: out.transfers,
        transfers_per_s: out.transfers as f64 / out.window_s.max(1e-6),
        transfer_latency_p50_us: us(0.5),
        transfer_latency_p99_us: us(0.99),
        pulses: out.pulses.count,
        pulse_period_us: out.pulses.period_us(),
        total_conserved,
        ok: out.transfers > 0 && total_conserved != Some(false),
    }
}

fn print(r: &HostReport, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string(r)?);
        return Ok(());
    }
    let audit = match r.total_conserved {
        Some(true) => "; total conserved",
        Some(false) => "; TOTAL NOT CONSERVED",
        None => "",
    };
    println!(
        "transfers {}: {} in {:.2} s ({:.0}/s); latency p50 {:.0} µs, p99 {:.0} µs; pulse \
         period {:.0} µs{audit}",
        r.host,
        r.transfers,
        r.window_s,
        r.transfers_per_s,
        r.transfer_latency_p50_us,
        r.transfer_latency_p99_us,
        r.pulse_period_us
    );
    Ok(())
}

/// One `NANOSECONDS COUNT` line per recorded value of `h`.
fn write_histogram(path: &Path, h: &Histogram<u64>) -> std::io::Result<()> {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    for v in h.iter_recorded() {
        writeln!(f, "{} {}", v.value_iterated_to(), v.count_at_value())?;
    }
    f.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_histogram_file_holds_every_sample_once() {
        let mut h = Histogram::<u64>::new_with_bounds(1, 600_000_000_000, 3).unwrap();
        for v in [1_000, 1_000, 250_000, 7_000_000] {
            h.record(v).unwrap();
        }
        let path = std::env::temp_dir().join(format!("isotach-hist-{}", std::process::id()));
        write_histogram(&path, &h).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        let lines: Vec<(u64, u64)> = text
            .lines()
            .map(|l| {
                let (v, c) = l.split_once(' ').unwrap();
                (v.parse().unwrap(), c.parse().unwrap())
            })
            .collect();
        assert_eq!(lines.iter().map(|l| l.1).sum::<u64>(), 4, "{text}");
        assert_eq!(lines.len(), 3, "{text}");
        assert!(h.equivalent(lines[0].0, 1_000) && lines[0].1 == 2, "{text}");
        assert!(h.equivalent(lines[2].0, 7_000_000), "{text}");
    }
}
