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

use crate::host::{Host, HostCtx};
use crate::net::{FaultError, RangeUs};
use crate::oracle::{OracleStats, PulseOracle};
use crate::sim::{NetFaults, RunEnd, Sim, SimConfig, SimError, Tamper};
use crate::unexpected::Unexpected;
use isotach_proto::Generation;
use isotach_proto::Pulse;
use isotach_proto::config::{ClusterConfig, Timing, check_bounds};
use isotach_proto::packet::{
    BARRIERS, BarrierSignalMarker, EndOfIsochron, EopMarker, IsochronMarker, IsotachMessage, Kind,
    PlainMessage, Sref, SrefOp, StartOfIsochron, Width,
};
use isotach_proto::topology::{HostId, TopologyError};
use isotach_siu::SiuError;
use serde::Serialize;
use std::collections::VecDeque;

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

/// Runs the waves workload, reporting progress about every tenth of the pulses.
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
    let step = (opts.pulses / 10).max(1);
    let mut next_report = step;
    let end = loop {
        let target = opts.pulses.min(next_report);
        let end = sim.run_until(|s| s.min_recvclock() >= target, stall_us);
        if end != RunEnd::Stopped || target >= opts.pulses {
            break end;
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
    sim.run_for(opts.net.faults.host_latency_us + 1);
    sim.observer_mut().finish(&recvclocks);
    let mut r = report(opts, &sim, pulses, completed, wall.elapsed());
    r.problems.extend(stall);
    Ok(r)
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
    for h in sim.hosts() {
        unexpected.merge(&h.unexpected);
    }
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
        wall_time_ms: wall.as_millis() as u64,
        problems,
    }
}

// ---------------------------------------------------------------------------------------------
// The waves host

/// Delay before retrying an isochron the SIU refused because logical time had not started.
const RETRY_US: u64 = 500;
/// Most bytes of a random `msg` payload.
const MSG_PAYLOAD_RANDOM_MAX: u64 = 64;
/// Most extra bytes of a random non-isotach payload (after its 8-byte sequence number).
const PLAIN_PAYLOAD_RANDOM_MAX: u64 = 32;
/// Largest gap between two packets of one isochron.
const PACKET_SPACING_US_MAX: u64 = 3;

#[derive(Debug, Clone, Copy, Default)]
struct HostStats {
    plain_sent: u64,
    plain_fifo_violations: u64,
    plain_lost: u64,
    barriers_entered: u64,
    refused_after_restart: u64,
}

/// Most lines in the report's `problems` (besides one per source of unexpected errors).
const PROBLEMS_MAX: usize = 32;

/// A host of the waves workload.
#[derive(Debug)]
pub struct WavesHost {
    id: HostId,
    hosts: usize,
    messages_max: u32,
    burst: f64,
    plain: f64,
    outstanding_max: u32,
    think_us: RangeUs,
    send_delta_max: u32,
    next_iso_id: u32,
    /// Isochrons this host completed (their markers came back): picks the sequence set.
    isochrons_done: u64,
    /// Isochrons sent whose marker has not come back.
    in_flight: u32,
    /// TS of returned markers whose EOP has not arrived.
    awaiting_eop: VecDeque<u64>,
    /// A wake-up is planned; only the one carrying `wake_seq` counts.
    wake_pending: bool,
    wake_seq: u64,
    /// The isochron the SIU refused at its start; its remaining packets are refused too.
    refused_iso: Option<u32>,
    plain_next_to: Vec<u64>,
    plain_next_from: Vec<u64>,
    /// Restarts are on: plain messages may be lost (not reordered), isochrons cut short.
    gaps_allowed: bool,
    /// Probability of entering a barrier with an isochron.
    barrier: f64,
    /// Barriers this host entered and has not seen complete.
    in_barrier: u8,
    /// Packets the SIU refused for reasons no correct run has.
    unexpected: Unexpected,
    /// [`Tamper::ShortDistance`] and not yet done: the next isochron to a remote host
    /// declares a distance one short.
    short_distance: bool,
    stats: HostStats,
}

impl WavesHost {
    fn new(id: HostId, hosts: usize, opts: &WavesOptions) -> Self {
        Self {
            id,
            hosts,
            messages_max: opts.load.messages_max,
            burst: opts.load.burst,
            plain: opts.load.plain,
            outstanding_max: opts.load.outstanding_max,
            think_us: opts.load.think_us,
            send_delta_max: opts.load.send_delta_max,
            next_iso_id: 1,
            isochrons_done: 0,
            in_flight: 0,
            awaiting_eop: VecDeque::new(),
            wake_pending: false,
            wake_seq: 0,
            refused_iso: None,
            plain_next_to: vec![0; hosts],
            plain_next_from: vec![0; hosts],
            gaps_allowed: opts.net.restarts.is_some(),
            barrier: opts.load.barrier,
            in_barrier: 0,
            unexpected: Unexpected::default(),
            short_distance: opts.tamper == Tamper::ShortDistance,
            stats: HostStats::default(),
        }
    }

    fn outstanding(&self) -> u32 {
        self.in_flight + self.awaiting_eop.len() as u32
    }

    /// Plans the next isochron after a think time if the window allows.
    fn plan(&mut self, ctx: &mut HostCtx<'_>) {
        if self.wake_pending || self.outstanding() >= self.outstanding_max {
            return;
        }
        let think = self.think_us.draw(ctx.rng());
        self.wake(ctx, think);
    }

    /// Plans the next send `after_us` from now, replacing any planned one.
    fn wake(&mut self, ctx: &mut HostCtx<'_>, after_us: u64) {
        self.wake_seq += 1;
        self.wake_pending = true;
        ctx.wake_at(ctx.now_us() + after_us, self.wake_seq);
    }

    fn send_isochron(&mut self, ctx: &mut HostCtx<'_>) {
        let rng_hosts = self.hosts as u64;
        let burst = ctx.rng().chance(self.burst);
        let count = if burst {
            ctx.rng().range_inclusive(33, 40)
        } else {
            ctx.rng().range_inclusive(1, u64::from(self.messages_max))
        };
        let burst_dest = ctx.rng().below(rng_hosts) as HostId;
        let dests: Vec<HostId> = (0..count)
            .map(|_| {
                if burst {
                    burst_dest
                } else {
                    ctx.rng().below(rng_hosts) as HostId
                }
            })
            .collect();
        let mut distance = dests
            .iter()
            .map(|&d| ctx.topology().distance(self.id, d))
            .max()
            .unwrap_or(1);
        if self.short_distance && distance > 1 {
            self.short_distance = false;
            distance -= 1;
        }
        let iso_id = self.next_iso_id;
        self.next_iso_id = self.next_iso_id.wrapping_add(1);
        let send_delta = ctx.rng().range_inclusive(0, u64::from(self.send_delta_max)) as u32;
        let soi = StartOfIsochron {
            iso_id,
            channel: 0,
            seqset: (self.isochrons_done % 2) as u8,
            logged: true,
            host_gap: false,
            gap: 0,
            send_delta,
            distance,
        };
        let mut at = ctx.now_us();
        let mut bytes = Vec::new();
        soi.encode(&mut bytes);
        ctx.send_at(at, bytes);
        for dest in dests {
            at += ctx.rng().range_inclusive(0, PACKET_SPACING_US_MAX);
            let m = IsotachMessage {
                ts: Pulse::new(0),
                source: 0,
                dest,
                sequum: 0,
                generation: Generation::new(0),
                sref: random_sref(ctx),
            };
            let mut bytes = Vec::with_capacity(m.encoded_len());
            m.encode(&mut bytes);
            ctx.send_at(at, bytes);
        }
        at += ctx.rng().range_inclusive(0, PACKET_SPACING_US_MAX);
        let mut bytes = Vec::new();
        EndOfIsochron { iso_id }.encode(&mut bytes);
        ctx.send_at(at, bytes);
        self.in_flight += 1;
    }

    fn send_plain(&mut self, ctx: &mut HostCtx<'_>) {
        if self.hosts < 2 {
            return;
        }
        let mut dest = ctx.rng().below(self.hosts as u64 - 1) as HostId;
        if dest >= self.id {
            dest += 1;
        }
        let seq = &mut self.plain_next_to[usize::from(dest)];
        let mut payload = seq.to_be_bytes().to_vec();
        *seq += 1;
        let extra = ctx.rng().range_inclusive(0, PLAIN_PAYLOAD_RANDOM_MAX);
        payload.extend((0..extra).map(|i| i as u8));
        let p = PlainMessage {
            source: self.id,
            dest,
            payload,
        };
        let mut bytes = Vec::new();
        p.encode(&mut bytes);
        ctx.send(bytes);
        self.stats.plain_sent += 1;
    }

    /// Enters a barrier this host is not in (barrier markers go between isochrons).
    fn enter_barrier(&mut self, ctx: &mut HostCtx<'_>) {
        let free: Vec<u8> = (0..BARRIERS as u8)
            .filter(|b| self.in_barrier & (1 << b) == 0)
            .collect();
        let Some(&b) = free.get(ctx.rng().below(free.len().max(1) as u64) as usize) else {
            return;
        };
        let marker = BarrierSignalMarker {
            barrier: 1 << b,
            barrier_count: 1,
            signals: 0,
            reset: false,
        };
        let mut bytes = Vec::new();
        marker.encode(&mut bytes);
        // The host→SIU link keeps send order: the marker follows the isochron just sent.
        ctx.send(bytes);
        self.in_barrier |= 1 << b;
        self.stats.barriers_entered += 1;
    }

    fn plain_received(&mut self, bytes: &[u8]) {
        let ok = PlainMessage::decode(bytes).ok().and_then(|p| {
            let seq = u64::from_be_bytes(p.payload.get(..8)?.try_into().ok()?);
            let next = self.plain_next_from.get_mut(usize::from(p.source))?;
            // A restart may lose plain messages queued on a broken link (a gap), never
            // reorder or repeat them.
            let gap = seq.saturating_sub(*next);
            let in_order = p.dest == self.id && (seq == *next || (self.gaps_allowed && gap > 0));
            if in_order {
                self.stats.plain_lost += gap;
            }
            *next = seq + 1;
            Some(in_order)
        });
        if ok != Some(true) {
            self.stats.plain_fifo_violations += 1;
        }
    }
}

/// A random sref: every operation, both widths, values of the full width, small payloads.
fn random_sref(ctx: &mut HostCtx<'_>) -> Sref {
    let rng = ctx.rng();
    let op = match rng.below(5) {
        0 => SrefOp::Read,
        1 => SrefOp::Write,
        2 => SrefOp::Sched,
        3 => SrefOp::Assign,
        _ => SrefOp::Msg,
    };
    if op == SrefOp::Msg {
        let len = rng.range_inclusive(0, MSG_PAYLOAD_RANDOM_MAX);
        let payload = (0..len).map(|_| rng.next_u64() as u8).collect();
        return Sref::Msg {
            handler: rng.below(8) as u16,
            payload,
        };
    }
    let width = if rng.chance(0.5) {
        Width::W32
    } else {
        Width::W64
    };
    let value = match op {
        SrefOp::Write | SrefOp::Assign => rng.next_u64() & width.max_value(),
        _ => 0,
    };
    Sref::Mem {
        op,
        width,
        addr: rng.below(1 << 20) * 8,
        value,
        ref_id: rng.next_u64() as u32,
    }
}

impl Host for WavesHost {
    fn on_start(&mut self, ctx: &mut HostCtx<'_>) {
        self.plan(ctx);
    }

    fn on_packet(&mut self, ctx: &mut HostCtx<'_>, bytes: &[u8]) {
        match bytes.get(1).map(|&b| Kind::from_byte(b)) {
            Some(Ok(Kind::IsochronMarker)) => {
                if let Ok(m) = IsochronMarker::decode(bytes) {
                    self.in_flight = self.in_flight.saturating_sub(1);
                    self.isochrons_done += 1;
                    self.awaiting_eop.push_back(m.ts.get());
                }
            }
            Some(Ok(Kind::EopMarker)) => {
                if let Ok(e) = EopMarker::decode(bytes) {
                    self.awaiting_eop.retain(|&ts| ts > e.ts.get());
                    self.in_barrier &= !e.barrier;
                    if e.reset {
                        // A new generation: barriers in progress are gone.
                        self.in_barrier = 0;
                    }
                    if e.reset && !e.end_of_epoch && !e.repeat {
                        // Logical time restarted: the SIU refuses this application's isotach
                        // packets until a new one attaches, as a restarted application would.
                        ctx.attach();
                    }
                }
            }
            Some(Ok(Kind::Plain)) => self.plain_received(bytes),
            _ => {}
        }
        self.plan(ctx);
    }

    fn on_wake(&mut self, ctx: &mut HostCtx<'_>, token: u64) {
        if !self.wake_pending || token != self.wake_seq {
            return; // replaced by a later plan
        }
        self.wake_pending = false;
        if self.outstanding() < self.outstanding_max {
            self.send_isochron(ctx);
            if ctx.rng().chance(self.plain) {
                self.send_plain(ctx);
            }
            if self.barrier > 0.0 && ctx.rng().chance(self.barrier) {
                self.enter_barrier(ctx);
            }
        }
        self.plan(ctx);
    }

    fn on_refused(&mut self, ctx: &mut HostCtx<'_>, bytes: &[u8], error: &SiuError) {
        let kind = bytes.get(1).map(|&b| Kind::from_byte(b));
        match (kind.clone(), error) {
            (Some(Ok(Kind::StartOfIsochron)), SiuError::NotStarted) => {
                // Logical time has not reached this SIU yet: try again later.
                self.refused_iso = StartOfIsochron::decode(bytes).ok().map(|s| s.iso_id);
                self.in_flight = self.in_flight.saturating_sub(1);
                self.wake(ctx, RETRY_US);
            }
            (Some(Ok(Kind::IsotachMessage)), SiuError::NotStarted | SiuError::NoIsochron)
                if self.refused_iso.is_some() => {}
            (Some(Ok(Kind::EndOfIsochron)), SiuError::NotStarted | SiuError::NoIsochron)
                if self.refused_iso.is_some() =>
            {
                self.refused_iso = None;
            }
            (Some(Ok(Kind::StartOfIsochron)), SiuError::SessionEnded) => {
                // Sent before this host heard of the restart: the restart discards it.
                self.in_flight = self.in_flight.saturating_sub(1);
                self.stats.refused_after_restart += 1;
            }
            (_, SiuError::SessionEnded) => self.stats.refused_after_restart += 1,
            (_, SiuError::NoIsochron | SiuError::IsochronOpen { .. }) if self.gaps_allowed => {
                // The SIU restarted logical time in the middle of this host's isochron: the
                // rest of it is refused (the restart discards it).
                self.stats.refused_after_restart += 1;
            }
            _ => {
                let what = match kind {
                    Some(Ok(k)) => format!("{k:?}"),
                    _ => "an undecodable packet".to_string(),
                };
                let line = format!("host {}: the SIU refused {what}: {error}", self.id);
                self.unexpected.one("host packets the SIU refused", line);
            }
        }
    }
}
