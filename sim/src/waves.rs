//! The `waves` workload: hosts send random isochrons to random destinations while token
//! waves run, and the [`PulseOracle`] checks every EOP marker. `isotach sim waves` is a thin
//! wrapper around [`run`].
//!
//! Each host keeps at most `outstanding_max` isochrons whose EOP it has not seen (so the load
//! follows logical time, not wall time), thinks for a random while between isochrons, and
//! spreads each isochron's packets over a few microseconds so tokens interleave with it.
//! Isochrons carry 1..=`messages_max` messages to random hosts (its own included, remote
//! switches included) with random srefs (read, write, sched, assign with 32- and 64-bit
//! values; msg with small payloads); with probability `burst` an isochron carries 33..=40
//! messages to one host, so EOP counts exceed the 32-entry sort vector. With probability
//! `plain` a host also sends a non-isotach message to a random peer; receivers check that
//! those arrive complete and FIFO per sender.

use crate::latency::{LatencySamples, LatencySummary};
use crate::net::{FaultError, RangeUs};
use crate::oracle::{OracleStats, PulseOracle};
use crate::sim::{NetFaults, RunEnd, Sim, SimConfig, SimError, Tamper};
use isotach_proto::config::{ClusterConfig, Timing, check_bounds};
use isotach_proto::topology::{HostId, TopologyError};
use serde::Serialize;

mod host;

use host::HostStats;
pub use host::WavesHost;

/// Options of a waves run. [`WavesOptions::new`] gives the defaults.
#[derive(Debug, Clone)]
pub struct WavesOptions {
    /// The seed.
    pub seed: u64,
    /// Topology, timing and limits (generated or loaded from a file).
    pub cluster: ClusterConfig,
    /// Run until every SIU's recvclock reaches this.
    pub pulses: u64,
    /// The network, pauses and crashes.
    pub net: NetFaults,
    /// What the hosts send.
    pub load: WavesLoad,
    /// No pulse progress for this long ends the run as stalled (`None`: derived).
    pub stall_us: Option<u64>,
    /// Test-only damage to prove the oracle can fail.
    pub tamper: Tamper,
}

/// What the hosts of a waves run send.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WavesLoad {
    /// Most messages in an ordinary isochron (at least 1).
    pub messages_max: u32,
    /// Probability an isochron is a burst of 33..=40 messages to one host.
    pub burst: f64,
    /// Probability a host also sends a non-isotach message when it sends an isochron.
    pub plain: f64,
    /// Most isochrons a host has in flight (sent, EOP for its TS not yet seen).
    pub outstanding_max: u32,
    /// Pause between a host's isochrons.
    pub think_us: RangeUs,
    /// Largest send delta a host asks for.
    pub send_delta_max: u32,
    /// Probability a host also enters a barrier (one it is not in already, chosen at random)
    /// when it sends an isochron.
    pub barrier: f64,
}

impl Default for WavesLoad {
    fn default() -> Self {
        Self {
            messages_max: 8,
            burst: 0.01,
            plain: 0.05,
            outstanding_max: 2,
            think_us: RangeUs::new(0, 200),
            send_delta_max: 2,
            barrier: 0.0,
        }
    }
}

/// Why options are unusable.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WavesError {
    /// The generated topology is invalid.
    #[error("topology: {0}")]
    Topology(#[from] TopologyError),
    /// A fault setting is invalid.
    #[error(transparent)]
    Faults(#[from] FaultError),
    /// Another setting is invalid.
    #[error("{0}")]
    Invalid(String),
    /// The simulator refused the configuration.
    #[error(transparent)]
    Sim(#[from] SimError),
}

impl WavesOptions {
    /// Defaults for a generated cluster of `hosts` hosts over `switches` switches in a line.
    pub fn new(hosts: usize, switches: usize, pulses: u64, seed: u64) -> Result<Self, WavesError> {
        Ok(Self::with_cluster(
            ClusterConfig::generated(hosts, switches)?,
            pulses,
            seed,
        ))
    }

    /// Defaults for a given cluster.
    pub fn with_cluster(cluster: ClusterConfig, pulses: u64, seed: u64) -> Self {
        Self {
            seed,
            cluster,
            pulses,
            net: NetFaults::default(),
            load: WavesLoad::default(),
            stall_us: None,
            tamper: Tamper::None,
        }
    }

    /// Sets the token timer, and keeps the idle pace at most half of it, as a config file
    /// that gives only the timer does ([`Timing::default_idle_pace_us`]).
    pub fn token_timeout_us(mut self, us: u64) -> Self {
        let t = &mut self.cluster.timing;
        t.token_timeout_us = us;
        t.idle_pace_us = t.idle_pace_us.min(Timing::default_idle_pace_us(us));
        self
    }

    /// Sets the epoch length.
    pub fn epoch_pulses(mut self, pulses: u32) -> Self {
        self.cluster.timing.epoch_pulses = pulses;
        self
    }

    /// Checks every setting.
    pub fn validate(&self) -> Result<(), WavesError> {
        self.net.faults.validate()?;
        let bad = |m: &str| Err(WavesError::Invalid(m.to_string()));
        if self.pulses == 0 {
            return bad("pulses must be at least 1");
        }
        let load = &self.load;
        if load.messages_max == 0 {
            return bad("messages-max must be at least 1");
        }
        if load.outstanding_max == 0 {
            return bad("outstanding-max must be at least 1");
        }
        if !(0.0..1.0).contains(&load.burst)
            || !(0.0..1.0).contains(&load.plain)
            || !(0.0..1.0).contains(&load.barrier)
        {
            return bad("burst, plain and barrier must be probabilities in [0, 1)");
        }
        if load.think_us.lo > load.think_us.hi {
            return bad("think-us range is empty");
        }
        let c = &self.cluster;
        check_bounds(&c.timing, &c.limits, &c.topology)
            .map_err(|(key, why)| WavesError::Invalid(format!("{key}: {why}")))?;
        if let Some(p) = self.net.pauses
            && (p.every_us == 0 || p.duration_us.lo > p.duration_us.hi)
        {
            return bad("pause-every-us must be at least 1 and pause-us lo <= hi");
        }
        // An isochron to the farthest host is stamped up to D + send delta ahead of its
        // sender's sendclock (its own or, through the other sequence set, its predecessor's),
        // and a receiver may be D behind that sendclock: the SIU refuses it unless the window
        // holds both (`SiuError::BeyondWindow`).
        let reach = u32::from(c.topology.max_distance());
        let window = c.limits.pulses_ahead_max;
        if 2 * reach + load.send_delta_max >= window {
            return Err(WavesError::Invalid(format!(
                "send-delta-max {} does not fit the window: an isochron to the farthest host \
                 (logical distance {reach}) may reach 2·{reach} + send-delta-max pulses past a \
                 receiver's clock, and limits.pulses-ahead-max is {window}; use \
                 send-delta-max {} at most, or a larger window",
                load.send_delta_max,
                window.saturating_sub(2 * reach + 1)
            )));
        }
        if self.stall_us == Some(0) {
            return bad("stall-us must be at least 1");
        }
        Ok(())
    }

    /// The stall time: explicit, or long enough for many token timeouts and the longest pause.
    pub fn effective_stall_us(&self) -> u64 {
        self.stall_us.unwrap_or_else(|| {
            let pause = self.net.pauses.map_or(0, |p| p.duration_us.hi);
            let timeout = self.cluster.timing.token_timeout_us;
            (1_000_000u64)
                .max(timeout.saturating_mul(50))
                .max(pause.saturating_mul(4))
        })
    }
}

/// The result of a waves run: one JSON object. Keys are documented in `docs/sim.md`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WavesReport {
    /// The seed (replays the run).
    pub seed: u64,
    /// Hosts (SIUs).
    pub hosts: usize,
    /// Switches (TMs).
    pub switches: usize,
    /// The largest logical distance between two hosts (token managers on the longest route).
    pub max_logical_distance: u16,
    /// Pulses asked for.
    pub pulses_target: u64,
    /// Pulses every SIU completed: the smallest recvclock at the end.
    pub pulses: u64,
    /// Every SIU reached `pulses_target` (no stall).
    pub completed: bool,
    /// Zero violations, zero unexpected errors, completed.
    pub ok: bool,
    /// Isochrons the SIUs timestamped.
    pub isochrons: u64,
    /// Isotach messages the SIUs stamped and sent.
    pub messages_sent: u64,
    /// Isotach messages hosts received.
    pub messages_delivered: u64,
    /// EOP markers hosts received.
    pub eops: u64,
    /// EOP markers whose count exceeded the 32-entry sort vector.
    pub eops_over_32: u64,
    /// EOP rule violations (see `docs/sim.md`).
    pub eop_violations: u64,
    /// Count and sort-vector violations (see `docs/sim.md`).
    pub order_violations: u64,
    /// Messages an SIU received after their pulse ended (SIU counter; 0 when correct).
    pub messages_late: u64,
    /// Errors no correct run produces: refused intact network input, accepted corrupted
    /// tokens, host packets refused for reasons other than start-up.
    pub unexpected_errors: u64,
    /// Non-isotach messages sent and received, and FIFO breaks among them.
    pub plain_sent: u64,
    /// See `plain_sent`.
    pub plain_delivered: u64,
    /// See `plain_sent`.
    pub plain_fifo_violations: u64,
    /// Repeat tokens sent by the lost-token algorithm (SIUs and TMs).
    pub tokens_repeated: u64,
    /// Tokens the network corrupted.
    pub tokens_corrupted: u64,
    /// Corrupted tokens dropped by their receiver (bad CRC or undecodable).
    pub tokens_dropped_bad_crc: u64,
    /// Duplicate tokens ignored by receivers.
    pub tokens_duplicate: u64,
    /// Early tokens dropped by receivers.
    pub tokens_early: u64,
    /// Datagrams sent over reliable channels.
    pub datagrams: u64,
    /// Lost transmissions the transport repeated.
    pub retransmissions: u64,
    /// Datagrams overtaken (held back, head-of-line delay).
    pub reordered: u64,
    /// Duplicate datagrams absorbed by the transport.
    pub duplicates_absorbed: u64,
    /// Pauses of TMs and SIUs.
    pub pauses: u64,
    /// TMs and SIUs crashed and restarted.
    pub restarts: u64,
    /// Reset EOP markers hosts received (a new generation of logical time).
    pub reset_eops: u64,
    /// Messages a restart discarded: stamped for a host already in a newer generation.
    pub stale_stamps: u64,
    /// Messages of an older generation delivered after a restart (no generation on the wire).
    pub stale_deliveries: u64,
    /// Messages and pulses missing from a generation a broken link or crash doomed.
    pub discarded: u64,
    /// Plain messages lost to broken links (restarts only).
    pub plain_lost: u64,
    /// Barrier markers hosts sent (`--barrier`).
    pub barriers_entered: u64,
    /// Barrier completions hosts saw and the oracle checked.
    pub barrier_completions: u64,
    /// A host saw barrier b complete for the k-th time before every host entered it k times.
    pub barrier_violations: u64,
    /// Intact network input refused after a restart (old-generation packets).
    pub refused_after_restart: u64,
    /// Times a daemon's link broke (links of every TM and SIU).
    pub links_lost: u64,
    /// Events the simulator processed.
    pub events: u64,
    /// FNV-1a 64 over every delivery (time, node, bytes), 16 hex digits.
    pub trace_hash: String,
    /// Virtual time at the end.
    pub virtual_time_us: u64,
    /// Virtual time per pulse once running: from the pulse a tenth of the way to the end, per
    /// pulse in between; over the whole run when it is that short.
    pub pulse_period_us: f64,
    /// Isotach messages stamped per pulse.
    pub messages_per_pulse: f64,
    /// Datagrams on the network (tokens, messages, acknowledgements, credit, hellos) per
    /// pulse.
    pub datagrams_per_pulse: f64,
    /// Isochron latency: issue to the EOP of its pulse at the issuer (`sim::latency`).
    #[serde(flatten)]
    pub latency: LatencySummary,
    /// Wall-clock time of the run (not part of the trace).
    pub wall_time_ms: u64,
    /// The first violations and unexpected errors, described.
    pub problems: Vec<String>,
}

/// Progress of a running waves simulation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Smallest recvclock.
    pub pulses: u64,
    /// Target.
    pub pulses_target: u64,
    /// Virtual time.
    pub virtual_time_us: u64,
}

/// Runs the waves workload.
pub fn run(opts: &WavesOptions) -> Result<WavesReport, WavesError> {
    run_with_progress(opts, &mut |_| {})
}

/// Runs the waves workload, reporting progress about every hundredth of the pulses.
pub fn run_with_progress(
    opts: &WavesOptions,
    progress: &mut dyn FnMut(&Progress),
) -> Result<WavesReport, WavesError> {
    opts.validate()?;
    let wall = std::time::Instant::now();
    let n_hosts = opts.cluster.topology.host_count();
    let hosts = (0..n_hosts)
        .map(|h| WavesHost::new(h as HostId, n_hosts, opts))
        .collect();
    let cfg = SimConfig {
        tamper: opts.tamper,
        ..SimConfig::new(opts.seed, opts.cluster.clone(), opts.net.clone())
    };
    let mut sim = Sim::new(cfg, hosts, PulseOracle::new(n_hosts))?;
    let stall_us = opts.effective_stall_us();
    let step = (opts.pulses / 100).max(1);
    let mut next_report = step;
    // Where the pulse period is measured from: (pulse, virtual time) once a tenth of the
    // pulses ran (start-up, hellos and the first waves, is not the steady state).
    let warm = (opts.pulses / 10).max(1);
    let mut period_from = (0, 0);
    let end = loop {
        let target = opts.pulses.min(next_report);
        let end = sim.run_until(|s| s.min_recvclock() >= target, stall_us);
        if end != RunEnd::Stopped || target >= opts.pulses {
            break end;
        }
        if period_from == (0, 0) && sim.min_recvclock() >= warm {
            period_from = (sim.min_recvclock(), sim.now_us());
        }
        next_report += step;
        progress(&Progress {
            pulses: sim.min_recvclock(),
            pulses_target: opts.pulses,
            virtual_time_us: sim.now_us(),
        });
    };
    let completed = end == RunEnd::Stopped;
    let stall = (!completed).then(|| diagnose_stall(&sim, end));
    // Let every EOP already queued reach its host, then check the pulses that ended.
    let recvclocks: Vec<u64> = sim.sius().map(|s| s.recvclock()).collect();
    let pulses = sim.min_recvclock();
    // The period from the warm-up to now: pulses and time read at the same moment.
    let period_us = pulse_period_us(period_from, (pulses, sim.now_us()));
    sim.run_for(opts.net.faults.host_latency_us + 1);
    sim.observer_mut().finish(&recvclocks);
    let mut r = report(opts, &sim, pulses, period_us, completed, wall.elapsed());
    r.problems.extend(stall);
    Ok(r)
}

/// Virtual µs per pulse between `from` and `to`, each (pulse, virtual time); from the start
/// when `from` is no earlier pulse.
fn pulse_period_us(from: (u64, u64), to: (u64, u64)) -> f64 {
    let from = if from.0 < to.0 { from } else { (0, 0) };
    if to.0 == from.0 {
        return 0.0;
    }
    (to.1 - from.1) as f64 / (to.0 - from.0) as f64
}

/// Describes where a run that did not complete got stuck.
fn diagnose_stall(sim: &Sim<WavesHost, PulseOracle>, end: RunEnd) -> String {
    let min = sim.min_recvclock();
    let sius_not_started = ids(sim.sius(), |s| !s.started());
    let tms_not_started = ids(sim.tms(), |t| !t.started());
    let behind = ids(sim.sius(), |s| s.recvclock() == min);
    let waves: Vec<u64> = sim.tms().map(|t| t.waves()).collect();
    format!(
        "{end:?} at t={}us: pulse {min} since t={}us; SIUs at pulse {min}: {behind:?}; \
         SIUs not started: {sius_not_started:?}; TMs not started: {tms_not_started:?}; \
         TM waves: {waves:?}",
        sim.now_us(),
        sim.progress_at_us()
    )
}

/// The ids (positions) of the SIUs or TMs in `nodes` that `pick` chooses.
fn ids<T>(nodes: impl Iterator<Item = T>, pick: impl Fn(&T) -> bool) -> Vec<usize> {
    nodes
        .enumerate()
        .filter(|(_, n)| pick(n))
        .map(|(id, _)| id)
        .collect()
}

fn report(
    opts: &WavesOptions,
    sim: &Sim<WavesHost, PulseOracle>,
    pulses: u64,
    pulse_period_us: f64,
    completed: bool,
    wall: std::time::Duration,
) -> WavesReport {
    let o: OracleStats = sim.observer().stats();
    let st = sim.stats();
    let mut siu = isotach_siu::SiuStats::default();
    for s in sim.sius().map(|s| s.stats()) {
        siu.isochrons += s.isochrons;
        siu.tokens_repeated += s.tokens_repeated;
        siu.tokens_duplicate += s.tokens_duplicate;
        siu.tokens_early += s.tokens_early;
        siu.messages_late += s.messages_late;
    }
    let mut tm = isotach_tm::TmStats::default();
    for t in sim.tms().map(|t| t.stats()) {
        tm.tokens_repeated += t.tokens_repeated;
        tm.tokens_duplicate += t.tokens_duplicate;
        tm.tokens_early += t.tokens_early;
    }
    let mut host = HostStats::default();
    for h in sim.hosts() {
        host.plain_sent += h.stats.plain_sent;
        host.plain_fifo_violations += h.stats.plain_fifo_violations;
        host.plain_lost += h.stats.plain_lost;
        host.barriers_entered += h.stats.barriers_entered;
        host.refused_after_restart += h.stats.refused_after_restart;
    }
    let mut unexpected = sim.unexpected().clone();
    let mut latency = LatencySamples::default();
    for h in sim.hosts() {
        unexpected.merge(&h.unexpected);
        latency.merge(&h.latency);
    }
    let per_pulse = |n: u64| {
        if pulses == 0 {
            0.0
        } else {
            n as f64 / pulses as f64
        }
    };
    let unexpected_errors = unexpected.total();
    let others = sim.observer().violations().iter().cloned();
    let problems = unexpected.problems(others, PROBLEMS_MAX);
    let ok = completed
        && o.eop_violations == 0
        && o.order_violations == 0
        && o.barrier_violations == 0
        && unexpected_errors == 0
        && host.plain_fifo_violations == 0;
    WavesReport {
        seed: opts.seed,
        hosts: opts.cluster.topology.host_count(),
        switches: opts.cluster.topology.switch_count(),
        max_logical_distance: opts.cluster.topology.max_distance(),
        pulses_target: opts.pulses,
        pulses,
        completed,
        ok,
        isochrons: siu.isochrons,
        messages_sent: o.messages_stamped,
        messages_delivered: o.messages_delivered,
        eops: o.eops,
        eops_over_32: o.eops_over_32,
        eop_violations: o.eop_violations,
        order_violations: o.order_violations,
        messages_late: siu.messages_late,
        unexpected_errors,
        plain_sent: host.plain_sent,
        plain_delivered: o.plain_delivered,
        plain_fifo_violations: host.plain_fifo_violations,
        tokens_repeated: siu.tokens_repeated + tm.tokens_repeated,
        tokens_corrupted: st.net.tokens_corrupted,
        tokens_dropped_bad_crc: st.corrupt_tokens_dropped,
        tokens_duplicate: siu.tokens_duplicate + tm.tokens_duplicate,
        tokens_early: siu.tokens_early + tm.tokens_early,
        datagrams: st.net.datagrams,
        retransmissions: st.net.retransmissions,
        reordered: st.net.reordered,
        duplicates_absorbed: st.net.duplicates_absorbed,
        pauses: st.pauses,
        restarts: st.restarts,
        reset_eops: o.reset_eops,
        stale_stamps: o.stale_stamps,
        stale_deliveries: o.stale_deliveries,
        discarded: o.discarded,
        plain_lost: host.plain_lost,
        barriers_entered: host.barriers_entered,
        barrier_completions: o.barrier_completions,
        barrier_violations: o.barrier_violations,
        refused_after_restart: st.net_refused_after_restart + host.refused_after_restart,
        links_lost: sim.link_stats().map(|l| l.links_lost).sum(),
        events: st.events,
        trace_hash: format!("{:016x}", sim.trace_hash()),
        virtual_time_us: sim.now_us(),
        pulse_period_us,
        messages_per_pulse: per_pulse(o.messages_stamped),
        datagrams_per_pulse: per_pulse(st.net.datagrams),
        latency: latency.summary(),
        wall_time_ms: wall.as_millis() as u64,
        problems,
    }
}

/// Most lines in the report's `problems` (besides one per source of unexpected errors).
const PROBLEMS_MAX: usize = 32;
