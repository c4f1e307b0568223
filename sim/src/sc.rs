//! The `sc` workload: SMM nodes issue random isochrons over shared memory while the network
//! misbehaves, and the sequential-consistency oracle replays every executed isochron in
//! (TS, source, sequum) order. `isotach sim sc` is a thin wrapper around [`run`].
//!
//! The memory: a *hot* page every host holds a copy of and everyone reads and writes, pages
//! replicated on two or three hosts (across switches), and one single-copy page per host.
//! Isochrons carry 1..=4 operations: reads (nearest copy), writes (every copy, 32- and 64-bit),
//! read-modify-writes (`add`, `compare_and_swap`, `apply`; every copy runs them and the oracle
//! checks the value each found), and sched/assign chains — a host schedules a variable and assigns it in a later isochron, so
//! other hosts' reads wait in the read-pending list in between. Each host keeps at most two
//! isochrons not yet executed. After its last isochron a host assigns every sched it still
//! holds, so no read waits forever.

use crate::net::{FaultError, RangeUs};
use crate::oracle::PulseOracle;
use crate::sim::{NetFaults, RunEnd, Sim, SimConfig, SimError};
use crate::smm_host::{SmmPort, count_smm_errors, run_to_quiescence};
use crate::unexpected::Unexpected;
use isotach_proto::config::ClusterConfig;
use isotach_proto::topology::HostId;
use isotach_smm::{Addr, MemoryMap};
use serde::Serialize;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

mod host;
mod memory;
mod restarts;
use host::ScHost;
use memory::memory;
pub use restarts::AppFaults;
use restarts::life;

/// Slots used on every page.
const SLOTS: u32 = 4;

/// Options of an `sc` run.
#[derive(Debug, Clone)]
pub struct ScOptions {
    /// Seed of the first run; run `i` uses `seed + i`.
    pub seed: u64,
    /// Runs (seeds).
    pub runs: u64,
    /// Topology, timing and limits.
    pub cluster: ClusterConfig,
    /// Isochrons per run, spread evenly over the hosts.
    pub isochrons: u64,
    /// The network, pauses and crashes.
    pub net: NetFaults,
    /// Pause between a host's isochrons.
    pub think_us: RangeUs,
    /// Virtual time without pulse progress that ends a run as stalled.
    pub stall_us: u64,
    /// Application restarts and late joins.
    pub apps: AppFaults,
}

impl ScOptions {
    /// Defaults for `cluster`: one run of 500 isochrons, default faults.
    pub fn new(cluster: ClusterConfig, seed: u64) -> Self {
        Self {
            seed,
            runs: 1,
            cluster,
            isochrons: 500,
            net: NetFaults::default(),
            think_us: RangeUs::new(0, 300),
            stall_us: 2_000_000,
            apps: AppFaults::default(),
        }
    }
}

/// Why a run could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ScError {
    /// Bad fault settings.
    #[error(transparent)]
    Faults(#[from] FaultError),
    /// The simulator refused the configuration.
    #[error(transparent)]
    Sim(#[from] SimError),
    /// TM/SIU restarts together with application restarts or late joins.
    #[error(
        "restarts of TMs and SIUs cannot be combined with application restarts or late joins \
         in one `sim sc` run: a restart of logical time ends every application, so an \
         application that is away or joining has no copy to recover from; run them apart"
    )]
    RestartsWithAppFaults,
}

/// The result of all runs: one JSON object. Keys are documented in `docs/sim.md`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ScReport {
    /// Runs made.
    pub runs: u64,
    /// First seed.
    pub seed: u64,
    /// Hosts per run.
    pub hosts: usize,
    /// Switches per run.
    pub switches: usize,
    /// The largest logical distance between two hosts (token managers on the longest route).
    pub max_logical_distance: u16,
    /// Isochrons executed and checked, all runs.
    pub isochrons: u64,
    /// Reads compared with the replay.
    pub reads_checked: u64,
    /// Isochrons whose reads one point of the replay explains, but not their own.
    pub sc_violations: u64,
    /// Isochrons whose reads no single point of the replay explains.
    pub atomicity_violations: u64,
    /// A host's isochrons executed out of program order (pairs).
    pub program_order_violations: u64,
    /// Isochrons issued that never executed.
    pub unexecuted: u64,
    /// Reads that never resolved.
    pub unresolved_reads: u64,
    /// Variables whose copies disagree at the end of a run.
    pub copies_diverged: u64,
    /// EOP-rule and sort-vector violations (the waves oracle, watching the same runs).
    pub eop_violations: u64,
    /// See `eop_violations`.
    pub order_violations: u64,
    /// Runs that stalled before every isochron executed.
    pub stalled_runs: u64,
    /// Refusals and bad input the hosts saw (must stay 0).
    pub unexpected_errors: u64,
    /// Reads that waited on an unsubstantiated variable (most at once, any host).
    pub read_pending_max: u64,
    /// Application restarts made (late joins included).
    pub app_restarts: u64,
    /// Pages rejoined applications installed from another copy's image.
    pub pages_recovered: u64,
    /// Pages rejoined applications started empty (no current copy left; must stay 0 here,
    /// where one application is away at a time).
    pub pages_started_empty: u64,
    /// Reads refused because their copy was away or catching up (allowed; not checked).
    pub reads_refused: u64,
    /// Restarts of logical time the applications saw (each ends every application; a new
    /// one starts on empty memory in the new generation).
    pub logical_restarts: u64,
    /// Generations checked by the oracle, each from empty memory (all runs).
    pub eras_checked: u64,
    /// Isochrons a restart of logical time discarded: issued and not executed before the
    /// pulse the restart cut short (allowed; `docs/sim.md`).
    pub discarded_isochrons: u64,
    /// Reads a restart of logical time left unresolved (allowed).
    pub discarded_reads: u64,
    /// Read answers that reached a newer application than the one that asked (ignored;
    /// allowed only on a host whose application restarted).
    pub replies_ignored: u64,
    /// Packets an application sent for later (a delayed resend) that reached its SIU after
    /// it left: dropped with it (allowed).
    pub departed_dropped: u64,
    /// Host turns ended (`--host-turns`): tokens an SIU held for its host's answer.
    pub host_turns_ended: u64,
    /// Isochrons stamped while their SIU's token waited for the host's turn (a pulse sooner).
    pub isochrons_in_turn: u64,
    /// Tokens that waited for a host's turn at a reply alone (an insignificant pulse).
    pub tokens_held_for_reply: u64,
    /// Seeds of failing runs (first few).
    pub failed_seeds: Vec<u64>,
    /// First problems seen: a line per source of unexpected errors (`unexpected: N …`), then
    /// the first unexpected errors and other problems described.
    pub problems: Vec<String>,
    /// Unexpected errors by source, all runs (`problems` shows them).
    #[serde(skip)]
    unexpected: Unexpected,
    /// Problems other than unexpected errors, all runs (the first few).
    #[serde(skip)]
    other_problems: Vec<String>,
    /// Wall-clock time of all runs.
    pub wall_time_ms: u64,
    /// Every count of violations is 0 and no run stalled.
    pub ok: bool,
}

/// Runs `opts.runs` seeds and checks each with the oracle.
pub fn run(opts: &ScOptions) -> Result<ScReport, ScError> {
    run_with_progress(opts, &mut |_, _| {})
}

/// Runs `opts.runs` seeds, calling `progress(done, report so far)` after each.
pub fn run_with_progress(
    opts: &ScOptions,
    progress: &mut dyn FnMut(u64, &ScReport),
) -> Result<ScReport, ScError> {
    opts.net.faults.validate()?;
    if opts.net.restarts.is_some() && opts.apps.active() {
        return Err(ScError::RestartsWithAppFaults);
    }
    let wall = std::time::Instant::now();
    let mut report = ScReport {
        seed: opts.seed,
        hosts: opts.cluster.topology.host_count(),
        switches: opts.cluster.topology.switch_count(),
        max_logical_distance: opts.cluster.topology.max_distance(),
        ..ScReport::default()
    };
    for i in 0..opts.runs {
        run_one(opts, opts.seed.wrapping_add(i), &mut report)?;
        progress(i + 1, &report);
    }
    report.wall_time_ms = wall.elapsed().as_millis() as u64;
    report.ok = violations(&report) == 0;
    Ok(report)
}

/// Every count that must stay zero, summed.
fn violations(r: &ScReport) -> u64 {
    r.sc_violations
        + r.atomicity_violations
        + r.program_order_violations
        + r.unexecuted
        + r.unresolved_reads
        + r.copies_diverged
        + r.eop_violations
        + r.order_violations
        + r.stalled_runs
        + r.unexpected_errors
        + r.pages_started_empty
}

const PROBLEMS_MAX: usize = 16;

fn run_one(opts: &ScOptions, seed: u64, report: &mut ScReport) -> Result<(), ScError> {
    let n = opts.cluster.topology.host_count();
    let mut rng = crate::SimRng::stream(seed, 0x5c);
    let (map, pages) = memory(&opts.cluster, &mut rng, opts.apps.active());
    let map = Arc::new(map);
    let pages = Arc::new(pages);
    let topology = Arc::new(opts.cluster.topology.clone());
    let per_host = opts.isochrons.div_ceil(n as u64).max(1);
    let token = Arc::new(AtomicBool::new(false));
    let mut life_rng = crate::SimRng::stream(seed, 0x5d);
    let hosts = (0..n)
        .map(|h| ScHost {
            port: SmmPort::new(h as HostId, &topology, Arc::clone(&map)),
            left: per_host,
            scheds: VecDeque::new(),
            pages: Arc::clone(&pages),
            think_us: opts.think_us,
            waking: false,
            life: life(&opts.apps, per_host, &token, &mut life_rng),
        })
        .collect();
    let cfg = SimConfig::new(seed, opts.cluster.clone(), opts.net.clone());
    let mut sim = Sim::new(cfg, hosts, PulseOracle::new(n))?;
    // Generous: a clean run needs a few pulses per isochron.
    let pulses_max = 5_000 + 50 * per_host;
    let end = run_to_quiescence(
        &mut sim,
        ScHost::done,
        |h| &h.port.node,
        opts.stall_us,
        pulses_max,
    );
    let recvclocks: Vec<u64> = sim.sius().map(|s| s.recvclock()).collect();
    sim.observer_mut().finish(&recvclocks);
    let before = violations(report);
    tally(&sim, end, &map, report);
    if violations(report) != before && report.failed_seeds.len() < PROBLEMS_MAX {
        report.failed_seeds.push(seed);
    }
    report.runs += 1;
    Ok(())
}

fn tally(sim: &Sim<ScHost, PulseOracle>, end: RunEnd, map: &MemoryMap, report: &mut ScReport) {
    let nodes = sim.hosts().iter().flat_map(ScHost::era_records).collect();
    let e = crate::eras::check(nodes, 4);
    let o = e.oracle;
    report.eras_checked += e.eras;
    report.discarded_isochrons += e.discarded_isochrons;
    report.discarded_reads += e.discarded_reads;
    report.isochrons += o.isochrons;
    report.reads_checked += o.reads_checked;
    report.sc_violations += o.sc_violations;
    report.atomicity_violations += o.atomicity_violations;
    report.program_order_violations += o.program_order_violations;
    report.unexecuted += o.unexecuted;
    report.unresolved_reads += o.unresolved_reads;
    let (count, detail) = diverged(sim, map);
    report.copies_diverged += count;
    let p = sim.observer().stats();
    report.eop_violations += p.eop_violations;
    report.order_violations += p.order_violations;
    let mut problems: Vec<String> = e.notes;
    if end != RunEnd::Stopped {
        report.stalled_runs += 1;
        problems.extend(
            sim.hosts()
                .iter()
                .enumerate()
                .filter(|(_, h)| !h.done())
                .map(|(i, h)| format!("stalled: host {i} {}", h.describe())),
        );
    }
    problems.extend(detail);
    let mut unexpected = sim.unexpected().clone();
    for (i, h) in sim.hosts().iter().enumerate() {
        for s in h.all_stats() {
            report.read_pending_max = report.read_pending_max.max(s.read_pending_max);
            // Only an ended application's reads can be answered late.
            let late_ok = !(h.port.ended.is_empty() && h.life.restarts == 0);
            count_smm_errors(&mut unexpected, i, &s, late_ok);
            report.replies_ignored += s.replies_unknown;
            report.reads_refused += s.reads_refused;
        }
        unexpected.merge(&h.port.unexpected);
        report.app_restarts += h.life.restarts;
        report.logical_restarts += h.port.ended.len() as u64;
        report.pages_recovered += h.life.pages_recovered;
        report.pages_started_empty += h.life.pages_started_empty;
    }
    report.departed_dropped += sim.stats().departed_dropped;
    report.host_turns_ended += sim.stats().host_turns_ended;
    report.isochrons_in_turn += sim.sius().map(|s| s.stats().isochrons_in_turn).sum::<u64>();
    report.tokens_held_for_reply += sim
        .sius()
        .map(|s| s.stats().tokens_held_for_reply)
        .sum::<u64>();
    problems.extend(sim.observer().violations().iter().cloned());
    report.unexpected.merge(&unexpected);
    report.unexpected_errors = report.unexpected.total();
    for p in problems {
        if report.other_problems.len() < PROBLEMS_MAX {
            report.other_problems.push(p);
        }
    }
    report.problems = report
        .unexpected
        .problems(report.other_problems.iter().cloned(), PROBLEMS_MAX);
}

/// Variables whose copies disagree at the end of a run, and the first few of them.
fn diverged(sim: &Sim<ScHost, PulseOracle>, map: &MemoryMap) -> (u64, Vec<String>) {
    let mut count = 0;
    let mut detail = Vec::new();
    for (first, last, copyset) in map.ranges() {
        for page in first..=last {
            for slot in 0..SLOTS {
                let addr = Addr::new(page, slot);
                let values: Vec<Option<u64>> = copyset
                    .iter()
                    .map(|&h| sim.hosts()[usize::from(h)].port.node.local_value(addr))
                    .collect();
                if values.windows(2).any(|w| w[0] != w[1]) {
                    count += 1;
                    if detail.len() < 4 {
                        detail.push(format!(
                            "copies of {addr} on {copyset:?} differ: {values:x?}"
                        ));
                    }
                }
            }
        }
    }
    (count, detail)
}
