//! How a simulator run reports: a summary for people, one JSON object with `--json`, the exit
//! code (1 when the run failed, with the seed to replay it), and the process's peak memory.

use crate::EXIT_FAILED;
use anyhow::Context;
use isotach_sim::philo::PhiloReport;
use isotach_sim::sc::ScReport;
use isotach_sim::waves::WavesReport;
use serde::Serialize;
use std::process::ExitCode;

/// The peak resident memory of this process so far (`VmHWM` of `/proc/self/status`), KiB; 0
/// where the kernel does not say.
pub(super) fn peak_rss_kb() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// A report with the process's peak memory, which the simulator cannot know.
#[derive(Debug, Serialize)]
pub(super) struct WithMemory<R> {
    #[serde(flatten)]
    pub(super) report: R,
    /// Peak resident memory of the process, KiB ([`peak_rss_kb`]).
    pub(super) peak_rss_kb: u64,
}

impl<R: Outcome> Outcome for WithMemory<R> {
    fn verdict(&self) -> (bool, &[String]) {
        self.report.verdict()
    }

    fn print_summary(&self, verdict: &str) {
        self.report.print_summary(verdict);
        println!("  peak memory {} MiB", self.peak_rss_kb / 1024);
    }

    fn failure(&self) -> String {
        self.report.failure()
    }
}

/// What the command needs of every workload's report besides its JSON: the verdict, a human
/// summary, and on failure a line that says how to replay it.
pub(super) trait Outcome: Serialize {
    /// Every check passed; and the first problems seen.
    fn verdict(&self) -> (bool, &[String]);
    /// Prints the human summary on stdout, headed by `verdict` ("ok" or "FAILED").
    fn print_summary(&self, verdict: &str);
    /// The stderr line of a failed run: what failed, and how to replay it.
    fn failure(&self) -> String;
}

/// Prints `report` (one JSON object with `--json`, else its summary) and turns its verdict into
/// the exit code; a failed run also names its failure and first problems on stderr.
pub(super) fn conclude(report: &impl Outcome, json: bool) -> anyhow::Result<ExitCode> {
    let (ok, problems) = report.verdict();
    if json {
        println!(
            "{}",
            serde_json::to_string(report).context("encoding the report")?
        );
    } else {
        report.print_summary(if ok { "ok" } else { "FAILED" });
    }
    if ok {
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!("{}", report.failure());
    for p in problems {
        eprintln!("  {p}");
    }
    Ok(ExitCode::from(EXIT_FAILED))
}

impl Outcome for WavesReport {
    fn verdict(&self) -> (bool, &[String]) {
        (self.ok, &self.problems)
    }

    fn print_summary(&self, verdict: &str) {
        println!(
            "sim waves {verdict}: {} hosts, {} switches, seed {}",
            self.hosts, self.switches, self.seed
        );
        if self.restarts > 0 || self.links_lost > 0 {
            println!(
                "  restarts {}  links lost {}  reset EOPs {}  discarded by restarts: messages {} stamps {} deliveries {} refused inputs {}",
                self.restarts,
                self.links_lost,
                self.reset_eops,
                self.discarded,
                self.stale_stamps,
                self.stale_deliveries,
                self.refused_after_restart
            );
        }
        println!(
            "  pulses {}/{} completed={}  virtual {} us  wall {} ms  events {}",
            self.pulses,
            self.pulses_target,
            self.completed,
            self.virtual_time_us,
            self.wall_time_ms,
            self.events
        );
        let l = &self.latency;
        println!(
            "  pulse period {:.1} us  isochron latency p50 {} us ({} pulses) p99 {} us ({} \
             pulses) over {} isochrons  messages/pulse {:.1}  datagrams/pulse {:.1}",
            self.pulse_period_us,
            l.isochron_latency_p50_us,
            l.isochron_latency_p50_pulses,
            l.isochron_latency_p99_us,
            l.isochron_latency_p99_pulses,
            l.isochron_latency_samples,
            self.messages_per_pulse,
            self.datagrams_per_pulse
        );
        println!(
            "  isochrons {}  messages sent {} delivered {}  eops {} (over 32: {})",
            self.isochrons,
            self.messages_sent,
            self.messages_delivered,
            self.eops,
            self.eops_over_32
        );
        println!(
            "  eop_violations {}  order_violations {}  unexpected_errors {}  plain {}/{} (fifo breaks {})",
            self.eop_violations,
            self.order_violations,
            self.unexpected_errors,
            self.plain_delivered,
            self.plain_sent,
            self.plain_fifo_violations
        );
        println!(
            "  tokens: repeated {} corrupted {} dropped-bad-crc {} duplicate {} early {}",
            self.tokens_repeated,
            self.tokens_corrupted,
            self.tokens_dropped_bad_crc,
            self.tokens_duplicate,
            self.tokens_early
        );
        println!(
            "  network: datagrams {} retransmissions {} reordered {} duplicates absorbed {}  pauses {}",
            self.datagrams,
            self.retransmissions,
            self.reordered,
            self.duplicates_absorbed,
            self.pauses
        );
        println!("  trace_hash {}", self.trace_hash);
    }

    fn failure(&self) -> String {
        format!(
            "sim waves: FAILED (completed={}, eop_violations={}, order_violations={}, \
             unexpected_errors={}); replay with --seed {}",
            self.completed,
            self.eop_violations,
            self.order_violations,
            self.unexpected_errors,
            self.seed
        )
    }
}

impl Outcome for ScReport {
    fn verdict(&self) -> (bool, &[String]) {
        (self.ok, &self.problems)
    }

    fn print_summary(&self, verdict: &str) {
        println!(
            "sim sc {}: {} runs, {} isochrons, {} reads checked; sc {} atomicity {} program-order {} \
             unexecuted {} unresolved {} diverged {} eop {} order {} stalled {} errors {}; \
             app restarts {} (pages recovered {}, started empty {}, reads refused {}); \
             logical-time restarts {} ({} generations checked; discarded {} isochrons, {} reads)",
            verdict,
            self.runs,
            self.isochrons,
            self.reads_checked,
            self.sc_violations,
            self.atomicity_violations,
            self.program_order_violations,
            self.unexecuted,
            self.unresolved_reads,
            self.copies_diverged,
            self.eop_violations,
            self.order_violations,
            self.stalled_runs,
            self.unexpected_errors,
            self.app_restarts,
            self.pages_recovered,
            self.pages_started_empty,
            self.reads_refused,
            self.logical_restarts,
            self.eras_checked,
            self.discarded_isochrons,
            self.discarded_reads
        );
    }

    fn failure(&self) -> String {
        format!(
            "sim sc: FAILED; replay a failing run with --seeds 1 --seed N, N in {:?}",
            self.failed_seeds
        )
    }
}

impl Outcome for PhiloReport {
    fn verdict(&self) -> (bool, &[String]) {
        (self.ok, &self.problems)
    }

    fn print_summary(&self, verdict: &str) {
        println!(
            "sim philo {}: {} meals of {} (fewest {}), safety violations {}, retries {}, \
             max wait {} pulses, {} pulses, oracle: {} isochrons {} reads, {} violations; \
             logical-time restarts {} ({} generations checked, {} isochrons discarded)",
            verdict,
            self.meals,
            self.meals_target * self.philosophers as u64,
            self.meals_min,
            self.safety_violations,
            self.retries,
            self.max_wait_pulses,
            self.pulses,
            self.isochrons,
            self.reads_checked,
            self.sc_violations,
            self.logical_restarts,
            self.eras_checked,
            self.discarded_isochrons
        );
    }

    fn failure(&self) -> String {
        format!(
            "sim philo: FAILED (completed={}); replay with --seed {}",
            self.completed, self.seed
        )
    }
}
