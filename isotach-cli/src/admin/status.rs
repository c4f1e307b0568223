//! `isotach status`: the admin service's client — one daemon's status, counters and, with
//! `--stats`, its latency histograms, as a table or one JSON object.

use super::SIU_ADMIN_DEFAULT;
use super::pb::admin_client::AdminClient;
use super::pb::{
    Histogram, SetLogLevelRequest, ShutdownRequest, StatsRequest, StatusReply, StatusRequest,
};
use crate::UsageError;
use clap::Args;
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

/// Show a running daemon's status (clocks, pulse rate, peers, queues, counters) and, with
/// `--stats`, its latency histograms, from its admin service.
#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    /// The daemon's admin address (its `--admin`; default: this machine's SIU).
    #[arg(long, value_name = "ADDR", env = "ISOTACH_ADMIN", default_value = SIU_ADMIN_DEFAULT)]
    admin: String,
    /// Print one JSON object on stdout.
    #[arg(long)]
    json: bool,
    /// Also show the latency histograms (key `histograms` in JSON).
    #[arg(long)]
    stats: bool,
    /// Empty the histograms after reading them (implies --stats).
    #[arg(long)]
    reset_stats: bool,
    /// Replace the daemon's log filter (RUST_LOG syntax, e.g. `debug`) before reading.
    #[arg(long, value_name = "FILTER")]
    log_level: Option<String>,
    /// Ask the daemon to shut down gracefully (as SIGTERM) after printing its status.
    #[arg(long)]
    shutdown: bool,
    /// Give up (exit 1) when the daemon does not answer within this many seconds.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=3600))]
    timeout_s: u64,
}

pub(super) fn json(r: &StatusReply, hists: Option<&[Histogram]>) -> serde_json::Value {
    let sorted = |m: &HashMap<String, u64>| m.iter().map(|(k, v)| (k.clone(), *v)).collect();
    let queues: BTreeMap<String, u64> = sorted(&r.queues);
    let counters: BTreeMap<String, u64> = sorted(&r.counters);
    let peers: Vec<_> = r
        .peers
        .iter()
        .map(|p| {
            serde_json::json!({
                "name": p.name, "addr": p.addr, "up": p.up, "idle": p.idle,
                "queued": p.queued, "links_lost": p.links_lost,
            })
        })
        .collect();
    let mut v = serde_json::json!({
        "pulse_rate_per_s": r.pulse_rate_per_s,
        "outstanding_isochrons": r.outstanding_isochrons,
        "peers": peers,
        "role": r.role,
        "name": r.name,
        "started": r.started,
        "generation": r.generation,
        "uptime_ms": r.uptime_ms,
        "waves": r.waves,
        "sendclock": r.sendclock,
        "recvclock": r.recvclock,
        "queues": queues,
        "counters": counters,
    });
    if let Some(hists) = hists {
        let hs: Vec<_> = hists
            .iter()
            .map(|h| {
                serde_json::json!({
                    "name": h.name, "count": h.count, "min_us": h.min_us,
                    "p50_us": h.p50_us, "p90_us": h.p90_us, "p99_us": h.p99_us,
                    "p999_us": h.p999_us, "max_us": h.max_us, "mean_us": h.mean_us,
                })
            })
            .collect();
        v["histograms"] = serde_json::Value::Array(hs);
    }
    v
}

fn table(r: &StatusReply, hists: Option<&[Histogram]>) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let mut row = |k: &str, v: String| {
        let _ = writeln!(out, "{k:<28} {v}");
    };
    row("role", r.role.clone());
    row("name", r.name.clone());
    row("started", r.started.to_string());
    row("generation", r.generation.to_string());
    row("uptime", format!("{:.1} s", r.uptime_ms as f64 / 1000.0));
    if r.role == "tm" {
        row("waves", r.waves.to_string());
        row("wave rate", format!("{:.0} /s", r.pulse_rate_per_s));
    } else {
        row("sendclock", r.sendclock.to_string());
        row("recvclock", r.recvclock.to_string());
        row("pulse rate", format!("{:.0} /s", r.pulse_rate_per_s));
        row("outstanding isochrons", r.outstanding_isochrons.to_string());
    }
    for p in &r.peers {
        let state = match (p.up, p.idle) {
            (true, _) => "up",
            (false, true) => "idle",
            (false, false) => "DOWN",
        };
        row(
            &format!("peer {}", p.name),
            format!(
                "{state} {} (queued {}, links lost {})",
                p.addr, p.queued, p.links_lost
            ),
        );
    }
    let queues: BTreeMap<_, _> = r.queues.iter().collect();
    for (k, v) in queues {
        row(&format!("queue {k}"), v.to_string());
    }
    let counters: BTreeMap<_, _> = r.counters.iter().collect();
    for (k, v) in counters {
        row(k, v.to_string());
    }
    for h in hists.unwrap_or_default() {
        row(
            &h.name,
            format!(
                "n {} p50 {} p90 {} p99 {} p99.9 {} max {} µs",
                h.count, h.p50_us, h.p90_us, h.p99_us, h.p999_us, h.max_us
            ),
        );
    }
    out
}

pub(crate) fn run_status(args: StatusArgs) -> anyhow::Result<ExitCode> {
    let addr: SocketAddr = args
        .admin
        .parse()
        .map_err(|e| UsageError(format!("--admin {}: {e}", args.admin)))?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let timeout = Duration::from_secs(args.timeout_s);
    let work = async move {
        let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
            .connect_timeout(timeout)
            .timeout(timeout);
        let channel = endpoint
            .connect()
            .await
            .map_err(|e| anyhow::anyhow!("admin {addr}: cannot connect: {e}"))?;
        let mut client = AdminClient::new(channel);
        if let Some(filter) = &args.log_level {
            let r = client
                .set_log_level(SetLogLevelRequest {
                    filter: filter.clone(),
                })
                .await
                .map_err(|e| anyhow::anyhow!("admin {addr}: log level: {}", e.message()))?
                .into_inner();
            eprintln!("log filter `{filter}` replaces `{}`", r.previous);
        }
        let reply = client
            .status(StatusRequest {})
            .await
            .map_err(|e| anyhow::anyhow!("admin {addr}: status: {}", e.message()))?
            .into_inner();
        let hists = if args.stats || args.reset_stats {
            let r = client
                .stats(StatsRequest {
                    reset: args.reset_stats,
                })
                .await
                .map_err(|e| anyhow::anyhow!("admin {addr}: stats: {}", e.message()))?;
            Some(r.into_inner().histograms)
        } else {
            None
        };
        if args.json {
            println!("{}", json(&reply, hists.as_deref()));
        } else {
            print!("{}", table(&reply, hists.as_deref()));
        }
        if args.shutdown {
            client
                .shutdown(ShutdownRequest {})
                .await
                .map_err(|e| anyhow::anyhow!("admin {addr}: shutdown: {}", e.message()))?;
            if !args.json {
                println!("shutdown requested");
            }
        }
        anyhow::Ok(ExitCode::SUCCESS)
    };
    // One deadline over the whole exchange: a daemon that accepts the connection but never
    // answers must not hang the caller.
    rt.block_on(async move {
        tokio::time::timeout(timeout, work)
            .await
            .unwrap_or_else(|_| {
                Err(anyhow::anyhow!(
                    "admin {addr}: no answer within {timeout:?}"
                ))
            })
    })
}
