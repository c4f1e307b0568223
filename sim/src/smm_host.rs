//! Simulated hosts that run an SMM node: the shared plumbing of the `sc` and `philo` workloads.
//!
//! A host starts with barrier 0 (count 1): its completion proves every SIU started logical
//! time, so no isochron is refused for `NotStarted`. A barrier marker refused before its SIU
//! started is resent a little later (nothing else is sent before the barrier completes, so
//! the host→SIU stream stays in order).

use crate::eras::NodeRecords;
use crate::host::HostCtx;
use crate::sim::{RunEnd, Sim};
use crate::unexpected::Unexpected;
use crate::{Host, Observer};
use isotach_proto::packet::{self, EopMarker, Kind};
use isotach_proto::topology::{HostId, Topology};
use isotach_siu::SiuError;
use isotach_smm::{
    ExecRecord, MemoryMap, RmwFunctions, SmmConfig, SmmError, SmmLimits, SmmNode, SmmStats,
};
use std::sync::Arc;

/// Read ids each node of a host draws from before the next node's range starts.
const READ_IDS_PER_NODE: u32 = 1 << 24;
/// How long a host waits before resending a barrier marker its SIU refused.
const START_RETRY_US: u64 = 200;

/// A node that a restart of logical time ended.
#[derive(Debug)]
pub(crate) struct EndedNode {
    /// The generation its pulses ran in (`None`: it drained no pulse).
    pub(crate) era: Option<u32>,
    /// The first pulse its records prove nothing about: the pulse the reset EOP cut short
    /// (drained in part), or the one after the last drained when its SIU process restarted.
    pub(crate) cut_ts: u64,
    /// What it executed, program order numbered after the host's earlier nodes.
    pub(crate) records: Vec<ExecRecord>,
    /// Its counters.
    pub(crate) stats: SmmStats,
}

/// What a packet from the SIU meant to the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PortEvent {
    /// Nothing for the workload.
    Nothing,
    /// The start barrier completed: logical time runs everywhere.
    Started,
    /// Logical time restarted: the node ended and a fresh one waits for the new start.
    Restarted,
}

/// An SMM node inside a simulated host.
#[derive(Debug)]
pub(crate) struct SmmPort {
    pub(crate) node: SmmNode,
    /// The start barrier completed: logical time runs everywhere.
    pub(crate) running: bool,
    /// Refusals other than the start-up `NotStarted`, failed joins (must stay none).
    pub(crate) unexpected: Unexpected,
    /// The generation the node's pulses run in (`None` until it drained one).
    pub(crate) era: Option<u32>,
    /// Nodes that restarts of logical time ended, oldest first.
    pub(crate) ended: Vec<EndedNode>,
    /// Program-order index of the node's first isochron (after every ended node's).
    pub(crate) index_base: u64,
    /// Nodes this host started after the first.
    nodes_started: u32,
}

/// The `apply` function every simulated application registers (and the oracle replays).
pub(crate) const SIM_RMW_FUNCTION: u16 = 1;

/// [`SIM_RMW_FUNCTION`]: pure, and not commutative with `add`, so an order the copies disagree
/// on shows.
fn triple_plus(old: u64, arg: u64) -> u64 {
    old.wrapping_mul(3).wrapping_add(arg)
}

/// The functions the simulated applications register, for the oracle.
pub(crate) fn rmw_functions() -> RmwFunctions {
    let mut f = RmwFunctions::default();
    f.register(SIM_RMW_FUNCTION, triple_plus);
    f
}

/// A node with the simulated applications' `apply` function registered.
fn new_node(cfg: SmmConfig) -> SmmNode {
    let mut node = SmmNode::new(cfg);
    node.register_rmw(SIM_RMW_FUNCTION, triple_plus);
    node
}

impl SmmPort {
    /// The port of `host`'s node; every node of a run shares `topology` (a copy per host
    /// would hold thousands of copies of its switch-to-switch tables).
    pub(crate) fn new(host: HostId, topology: &Arc<Topology>, map: Arc<MemoryMap>) -> Self {
        let node = new_node(SmmConfig {
            host,
            topology: Arc::clone(topology),
            map,
            limits: SmmLimits::default(),
            record: true,
        });
        Self {
            node,
            running: false,
            unexpected: Unexpected::default(),
            era: None,
            ended: Vec::new(),
            index_base: 0,
            nodes_started: 0,
        }
    }

    /// The node's records, program order numbered after every ended node's.
    pub(crate) fn records(&self) -> impl Iterator<Item = ExecRecord> + '_ {
        let base = self.index_base;
        self.node.records().iter().cloned().map(move |mut r| {
            r.index += base;
            r
        })
    }

    /// Every node's records for the era oracle: the nodes restarts ended, then the running
    /// one with `current` (its records, and those of earlier applications of its era).
    pub(crate) fn era_records(&self, current: Vec<ExecRecord>) -> Vec<NodeRecords> {
        let ended = self.ended.iter().map(|e| NodeRecords {
            era: e.era,
            cut_ts: Some(e.cut_ts),
            records: e.records.clone(),
        });
        ended
            .chain(std::iter::once(NodeRecords {
                era: self.era,
                cut_ts: None,
                records: current,
            }))
            .collect()
    }

    /// Counters of every node this host ran, the current one last.
    pub(crate) fn all_stats(&self) -> impl Iterator<Item = SmmStats> + '_ {
        self.ended
            .iter()
            .map(|e| e.stats)
            .chain(std::iter::once(self.node.stats()))
    }

    /// Logical time restarted under the node: keep what it did as an ended node of its era,
    /// start a fresh node and enter the new generation's start barrier.
    pub(crate) fn end_era(&mut self, ctx: &mut HostCtx<'_>, cut_ts: u64) {
        let records: Vec<ExecRecord> = self.records().collect();
        self.index_base = records
            .iter()
            .map(|r| r.index + 1)
            .max()
            .unwrap_or(self.index_base);
        self.ended.push(EndedNode {
            era: self.era.take(),
            cut_ts,
            records,
            stats: self.node.stats(),
        });
        self.restart(ctx.host());
        self.running = false;
        // A new application: the SIU refuses the old one's packets until it hears of it.
        ctx.attach();
        self.start(ctx);
    }

    /// The host's SIU process restarted: everything it handed over is gone with it, so the
    /// node ends after the last pulse it drained.
    pub(crate) fn siu_restarted(&mut self, ctx: &mut HostCtx<'_>) {
        let cut_ts = self.node.last_pulse() + 1;
        self.end_era(ctx, cut_ts);
    }

    /// A new application on this host: a fresh node, its read ids in a range of their own
    /// (answers to the previous node's reads may still come).
    pub(crate) fn restart(&mut self, host: HostId) {
        let cfg = self.node.config().clone();
        debug_assert_eq!(cfg.host, host);
        self.node = new_node(cfg);
        self.nodes_started += 1;
        self.node
            .start_read_ids_at(self.nodes_started.wrapping_mul(READ_IDS_PER_NODE));
    }

    /// Enters the start barrier.
    pub(crate) fn start(&mut self, ctx: &mut HostCtx<'_>) {
        self.node
            .barrier_start(0, 1)
            .expect("a fresh node has no barrier in progress");
        self.flush(ctx);
    }

    /// Sends everything the node queued for its SIU.
    pub(crate) fn flush(&mut self, ctx: &mut HostCtx<'_>) {
        while let Some(b) = self.node.poll_siu() {
            ctx.send(b);
        }
    }

    /// Hands a packet from the SIU to the node and says what it meant.
    pub(crate) fn packet(&mut self, ctx: &mut HostCtx<'_>, bytes: &[u8]) -> PortEvent {
        match self.node.handle_siu(bytes) {
            Ok(()) => {}
            Err(SmmError::Restarted { drained, .. }) if is_restart_eop(bytes) => {
                // The reset EOP of pulse `drained`: that pulse drained in part. Every node
                // here has entered its start barrier at least, so the node reports it.
                self.end_era(ctx, drained);
                return PortEvent::Restarted;
            }
            Err(e) => self.unexpected.one(
                "SIU inputs an SMM node refused",
                format!("host {}: SMM refused SIU input: {e}", ctx.host()),
            ),
        }
        if self.era.is_none() && self.node.stats().pulses_drained > 0 {
            self.era = Some(ctx.siu_generation());
        }
        self.flush(ctx);
        let started = !self.running && self.node.barrier_done(0);
        self.running |= started;
        if started {
            PortEvent::Started
        } else {
            PortEvent::Nothing
        }
    }

    /// The SIU refused a packet: resend the start barrier later; anything else is a problem.
    pub(crate) fn refused(&mut self, ctx: &mut HostCtx<'_>, bytes: &[u8], error: &SiuError) {
        let marker = packet::peek_kind(bytes) == Ok(Kind::BarrierSignalMarker);
        match error {
            SiuError::NotStarted if !self.running && marker => {
                let at = ctx.now_us() + START_RETRY_US;
                ctx.send_at(at, bytes.to_vec());
                return;
            }
            // Packets sent before the application learned of the restart (the reset EOP may
            // still be on its way): refused by the new generation, or by a fresh SIU process.
            // That is what a restart discards; the SIU counts it (`host_refused_after_reset`).
            SiuError::SessionEnded => return,
            SiuError::NotStarted if !self.ended.is_empty() => return,
            _ => {}
        }
        self.unexpected.one(
            "packets of an SMM node the SIU refused",
            format!("host {}: SIU refused a packet: {error}", ctx.host()),
        );
    }
}

/// Counts the SMM counters no correct run raises, each under its name, for `host`:
/// `late_replies_ok` when an ended application's reads may be answered late.
pub(crate) fn count_smm_errors(
    u: &mut Unexpected,
    host: usize,
    s: &SmmStats,
    late_replies_ok: bool,
) {
    let late = if late_replies_ok {
        0
    } else {
        s.replies_unknown
    };
    for (what, n) in [
        ("bad inputs from the SIU at an SMM node", s.bad_input),
        ("operations at a host holding no copy", s.not_a_copy),
        ("assigns without a sched", s.assigns_without_sched),
        ("EOP count mismatches", s.count_mismatches),
        (
            "applies of an unregistered function",
            s.rmw_unknown_functions,
        ),
        ("answers to reads no application here issued", late),
    ] {
        if n > 0 {
            u.count(what, n);
            u.detail(format!("host {host}: {n} {what}"));
        }
    }
}

/// An EOP marker with the reset bit outside an epoch's end: logical time restarted.
fn is_restart_eop(bytes: &[u8]) -> bool {
    // Every packet from the SIU passes here: decode only EOP markers.
    packet::peek_kind(bytes) == Ok(Kind::EopMarker)
        && EopMarker::decode(bytes).is_ok_and(|e| e.reset && !e.end_of_epoch && !e.repeat)
}

/// Runs `sim` until every host is `done` and every node and SIU has drained everything, then
/// a few pulses more so copies elsewhere drain too. Returns how the run ended: a run whose
/// hosts are not done by `pulses_max` pulses (logical time runs on while hosts are stuck)
/// ends as stalled.
pub(crate) fn run_to_quiescence<H: Host, O: Observer>(
    sim: &mut Sim<H, O>,
    done: impl Fn(&H) -> bool,
    node: impl Fn(&H) -> &SmmNode,
    stall_us: u64,
    pulses_max: u64,
) -> RunEnd {
    let end = sim.run_until_hosts(
        |s, h| done(&s.hosts()[h]),
        |s, all_done| all_done || s.min_recvclock() >= pulses_max,
        stall_us,
    );
    if end != RunEnd::Stopped {
        return end;
    }
    if !sim.hosts().iter().all(&done) {
        return RunEnd::Stalled;
    }
    let grace = u64::from(sim.topology().max_distance()) * 2 + 4;
    let target = sim.min_recvclock() + grace;
    sim.run_until_hosts(
        |s, h| node(&s.hosts()[h]).is_idle() && s.siu(h as HostId).pending_pulse_packets() == 0,
        |s, all_quiet| s.min_recvclock() >= target && all_quiet,
        stall_us,
    )
}
