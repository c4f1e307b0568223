//! Simulated hosts that run an SMM node: the shared plumbing of the `sc` and `philo` workloads.
//!
//! A host starts with barrier 0 (count 1): its completion proves every SIU started logical
//! time, so no isochron is refused for `NotStarted`. A barrier marker refused before its SIU
//! started is resent a little later (nothing else is sent before the barrier completes, so
//! the host→SIU stream stays in order).

use crate::host::HostCtx;
use crate::sim::{RunEnd, Sim};
use crate::{Host, Observer};
use isotach_proto::config::ClusterConfig;
use isotach_proto::topology::HostId;
use isotach_siu::SiuError;
use isotach_smm::{MemoryMap, SmmConfig, SmmLimits, SmmNode};
use std::sync::Arc;

/// How long a host waits before resending a barrier marker its SIU refused.
const START_RETRY_US: u64 = 200;

/// An SMM node inside a simulated host.
#[derive(Debug)]
pub(crate) struct SmmPort {
    pub(crate) node: SmmNode,
    /// The start barrier completed: logical time runs everywhere.
    pub(crate) running: bool,
    /// Refusals other than the start-up `NotStarted` (must stay empty).
    pub(crate) problems: Vec<String>,
}

impl SmmPort {
    pub(crate) fn new(host: HostId, cluster: &ClusterConfig, map: Arc<MemoryMap>) -> Self {
        let node = SmmNode::new(SmmConfig {
            host,
            topology: Arc::new(cluster.topology.clone()),
            map,
            limits: SmmLimits::default(),
            record: true,
        });
        Self {
            node,
            running: false,
            problems: Vec::new(),
        }
    }

    /// A new application on this host: a fresh node (it joins; logical time already runs).
    pub(crate) fn restart(&mut self, host: HostId) {
        let cfg = self.node.config().clone();
        debug_assert_eq!(cfg.host, host);
        self.node = SmmNode::new(cfg);
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

    /// Hands a packet from the SIU to the node; returns true when this packet completed the
    /// start barrier.
    pub(crate) fn packet(&mut self, ctx: &mut HostCtx<'_>, bytes: &[u8]) -> bool {
        if let Err(e) = self.node.handle_siu(bytes) {
            self.problems
                .push(format!("host {}: SMM refused SIU input: {e}", ctx.host()));
        }
        self.flush(ctx);
        let started = !self.running && self.node.barrier_done(0);
        self.running |= started;
        started
    }

    /// The SIU refused a packet: resend the start barrier later; anything else is a problem.
    pub(crate) fn refused(&mut self, ctx: &mut HostCtx<'_>, bytes: &[u8], error: &SiuError) {
        if !self.running && *error == SiuError::NotStarted {
            let at = ctx.now_us() + START_RETRY_US;
            ctx.send_at(at, bytes.to_vec());
            return;
        }
        self.problems.push(format!(
            "host {}: SIU refused a packet: {error}",
            ctx.host()
        ));
    }
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
    let end = sim.run_until(
        |s| s.hosts().iter().all(&done) || s.min_recvclock() >= pulses_max,
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
    sim.run_until(
        |s| {
            s.min_recvclock() >= target
                && s.hosts().iter().all(|h| node(h).is_idle())
                && s.sius().all(|siu| siu.pending_pulse_packets() == 0)
        },
        stall_us,
    )
}
