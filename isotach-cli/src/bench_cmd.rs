//! `isotach bench …`: measurements against a baseline taken in the same run.

use self::am::{BenchOptions, bench_peer_main, run_bench};
use crate::{EXIT_FAILED, UsageError};
use anyhow::Context;
use clap::{Args, Subcommand};
use std::process::ExitCode;

pub(crate) mod am;
mod cpu;
mod daemons;
mod idle;
pub(crate) mod isochrons;
mod pulses;
mod redis;
pub(crate) mod transfers;
mod unordered;

pub(crate) use daemons::parse_seconds;

/// The hidden argument that makes this executable the AM benchmark's peer process.
pub(crate) const AM_PEER_ARG: &str = "__am-bench-peer";

/// Measure; every benchmark reports its baseline from the same run and the ratio.
#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    #[command(subcommand)]
    what: What,
}

#[derive(Debug, Subcommand)]
enum What {
    /// Active Messages over UDP and QUIC against raw UDP and TCP_NODELAY ping-pong and raw UDP
    /// streaming between the same two processes: round trips (p50, p99), message rate and
    /// bulk bandwidth, with the ratios.
    Am(AmArgs),
    /// Pulse rate of the real daemons (a token manager and N SIU daemons, 4 by default) over
    /// loopback UDP, against the raw UDP round trip between two processes. Idle pacing is off
    /// (`idle-pace-us = 0`): the waves run at full speed.
    Tokens(daemons::TokensArgs),
    /// Isochron latency (issue to local part executed at the issuer) and sref rate of the real
    /// daemons with every host issuing continuously, against the raw UDP round trip between
    /// two processes.
    Isochrons(isochrons::IsochronsArgs),
    /// The bank workload: atomic transfers between random accounts replicated on two hosts,
    /// over the real daemons, with the total checked at the end; against the raw UDP round
    /// trip, the same messages sent unordered, and Redis (`EVAL` transfers) when
    /// redis-server and redis-benchmark are on PATH — all in the same run.
    Transfers(transfers::TransfersArgs),
    /// What an idle cluster costs: each daemon's CPU share of one core (TM and SIUs as
    /// separate processes, `/proc/PID/stat`) with no traffic, and the latency of the first
    /// isochron after a quiet spell — with idle pacing off (full speed) and on
    /// (`--idle-pace-us`), in the same run.
    Idle(idle::IdleArgs),
}

#[derive(Debug, Args)]
struct AmArgs {
    /// Round trips per small-message series.
    #[arg(long, default_value_t = BenchOptions::default().rtt_iters as u64, value_parser = clap::value_parser!(u64).range(10..=10_000_000))]
    rtt_iters: u64,
    /// Requests in the message-rate run.
    #[arg(long, default_value_t = BenchOptions::default().rate_msgs as u64, value_parser = clap::value_parser!(u64).range(10..=100_000_000))]
    rate_msgs: u64,
    /// 64 KiB transfers in the bandwidth run.
    #[arg(long, default_value_t = BenchOptions::default().bulk_msgs as u64, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    bulk_msgs: u64,
    /// Skip the QUIC series.
    #[arg(long)]
    no_quic: bool,
    /// Run the peer on a thread of this process instead of a second process.
    #[arg(long)]
    in_process: bool,
    /// Print one JSON object on stdout.
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(args: BenchArgs) -> anyhow::Result<ExitCode> {
    match args.what {
        What::Am(a) => am(&a),
        What::Tokens(a) => daemons::tokens(&a),
        What::Isochrons(a) => isochrons::isochrons(&a),
        What::Transfers(a) => transfers::transfers(&a),
        What::Idle(a) => idle::idle(&a),
    }
}

fn am(a: &AmArgs) -> anyhow::Result<ExitCode> {
    let opts = BenchOptions {
        peer_args: vec![AM_PEER_ARG.to_string()],
        in_process: a.in_process,
        rtt_iters: usize::try_from(a.rtt_iters).map_err(|e| UsageError(e.to_string()))?,
        rate_msgs: usize::try_from(a.rate_msgs).map_err(|e| UsageError(e.to_string()))?,
        bulk_msgs: usize::try_from(a.bulk_msgs).map_err(|e| UsageError(e.to_string()))?,
        quic: !a.no_quic,
        ..BenchOptions::default()
    };
    eprintln!("bench am: two processes over loopback (this takes well under a minute)");
    let report = match run_bench(opts) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("bench am: {e}");
            return Ok(ExitCode::from(EXIT_FAILED));
        }
    };
    let text = if a.json {
        serde_json::to_string(&report)
    } else {
        serde_json::to_string_pretty(&report)
    };
    println!("{}", text.context("encoding the report")?);
    Ok(ExitCode::SUCCESS)
}

/// Runs the benchmark's peer side (the hidden subcommand).
pub(crate) fn am_peer(args: &[String]) -> ExitCode {
    match bench_peer_main(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench peer: {e}");
            ExitCode::from(EXIT_FAILED)
        }
    }
}
