//! `isotach`: one binary for the daemons, the demo, the simulator, benchmarks and tools.
//!
//! Every subcommand group lives in its own module and returns an exit code; a
//! [`UsageError`] (bad flag, bad config) exits with 2, any other error with 1.

use clap::{Parser, Subcommand};
use std::process::ExitCode;

mod admin;
mod bench_cmd;
mod cert_cmd;
mod cluster_io;
mod config_cmd;
mod daemon_cmd;
mod demo_cmd;
mod philo_app;
mod sim_cmd;
mod tool_cmd;
mod transfers_app;

/// Exit code of a run whose checks failed.
const EXIT_FAILED: u8 = 1;
/// Exit code of a usage or configuration error.
const EXIT_USAGE: u8 = 2;

/// A usage or configuration error: printed as is, exit code 2.
#[derive(Debug)]
pub(crate) struct UsageError(pub(crate) String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// Isotach over commodity networks: logical time, isochrons and shared memory.
#[derive(Debug, Parser)]
#[command(name = "isotach", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the deterministic simulator (virtual clock, seeded network faults).
    Sim(sim_cmd::SimArgs),
    /// Benchmarks, each against a baseline measured in the same run.
    Bench(bench_cmd::BenchArgs),
    /// Validate a cluster config and its shared-memory map; errors exit 2.
    CheckConfig(config_cmd::CheckConfigArgs),
    /// The cluster CA and node certificates for QUIC links (mutual TLS).
    Cert(cert_cmd::CertArgs),
    /// Run a token manager daemon (one per switch) until SIGINT/SIGTERM.
    Tm(daemon_cmd::TmArgs),
    /// Run an SIU daemon (one per host) until SIGINT/SIGTERM.
    Siu(daemon_cmd::SiuArgs),
    /// Show a running daemon's status from its admin service (`--admin`).
    Status(admin::StatusArgs),
    /// Run one dining philosopher on this host over its SIU daemon.
    Philo(daemon_cmd::PhiloArgs),
    /// Run the bank transfer workload on this host over its SIU daemon (every host runs
    /// one; host 0 checks that the total is conserved).
    Transfers(transfers_app::TransfersArgs),
    /// Embedded demos: the whole system in one process over loopback.
    Demo(demo_cmd::DemoArgs),
    /// SIU test tools on the real wire: token bouncer, byte generator, receiver.
    Tool(tool_cmd::ToolArgs),
}

fn main() -> ExitCode {
    // The AM benchmark starts this executable again as its peer process.
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some(bench_cmd::AM_PEER_ARG) {
        return bench_cmd::am_peer(&args[1..]);
    }
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Sim(args) => sim_cmd::run(args),
        Command::Bench(args) => bench_cmd::run(args),
        Command::CheckConfig(args) => config_cmd::run(args),
        Command::Cert(args) => cert_cmd::run(args),
        Command::Tm(args) => daemon_cmd::run_tm(args),
        Command::Siu(args) => daemon_cmd::run_siu(args),
        Command::Status(args) => admin::run_status(args),
        Command::Philo(args) => daemon_cmd::run_philo(args),
        Command::Transfers(args) => transfers_app::run(args),
        Command::Demo(args) => demo_cmd::run(args),
        Command::Tool(args) => tool_cmd::run(args),
    };
    match result {
        Ok(code) => code,
        Err(e) if e.is::<UsageError>() => {
            eprintln!("error: {e}");
            ExitCode::from(EXIT_USAGE)
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(EXIT_FAILED)
        }
    }
}
