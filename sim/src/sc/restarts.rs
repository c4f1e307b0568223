//! Application restarts and late joins in the `sc` workload: a host's application drains,
//! exits, stays away while its SIU answers for it, and a new one joins by state transfer
//! (`docs/design.md`, "Joining late or after a restart").

use super::host::{LEAVE_RETRY_US, ScHost, WAKE_LEAVE, WAKE_RETURN};
use crate::eras::NodeRecords;
use crate::host::HostCtx;
use crate::net::RangeUs;
use isotach_smm::{ExecRecord, JoinStatus, SmmStats};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Application restarts and late joins: a host's application exits (after assigning its
/// scheds and draining), stays away, and a new one attaches and joins by state transfer.
/// One application is away or catching up at a time, so every page keeps a current copy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AppFaults {
    /// Restarts per host and run, each at a random point of its isochrons.
    pub restarts_per_host: u32,
    /// Chance that a host's application joins late: it exits right after the start barrier,
    /// before its first isochron, and joins later.
    pub late_join: f64,
    /// How long an application stays away.
    pub absent_us: RangeUs,
    /// Oracle self-test: rejoining nodes install images without replaying what came after
    /// the cut. A run with restarts must then fail.
    pub break_transfer: bool,
}

impl Default for AppFaults {
    fn default() -> Self {
        Self {
            restarts_per_host: 0,
            late_join: 0.0,
            absent_us: RangeUs::new(200, 3_000),
            break_transfer: false,
        }
    }
}

impl AppFaults {
    /// Whether any application leaves during a run.
    pub fn active(&self) -> bool {
        self.restarts_per_host > 0 || self.late_join > 0.0
    }
}

/// Application restarts of one host.
#[derive(Debug)]
pub(super) struct Life {
    pub(super) faults: AppFaults,
    /// Values of `left` at which the application restarts, smallest last.
    pub(super) restart_at: Vec<u64>,
    /// Leave right after the start barrier.
    pub(super) late: bool,
    /// Leaving: issue nothing more, drain, then go.
    pub(super) leaving: bool,
    /// No application attached.
    pub(super) away: bool,
    /// Rejoined and not current yet (holds `token`).
    pub(super) rejoining: bool,
    /// Taken by the one host that is away or catching up.
    pub(super) token: Arc<AtomicBool>,
    /// A retry of leaving is scheduled (at most one: `try_leave` runs on every event, and a
    /// retry per event multiplied while another host was away for long — millions of
    /// wake-ups under pauses).
    pub(super) leave_retry_armed: bool,
    /// Execution records of earlier applications, program order continued.
    pub(super) retired: Vec<ExecRecord>,
    /// Program-order index of the current application's first isochron.
    pub(super) index_base: u64,
    /// Counters of earlier applications.
    pub(super) retired_stats: Vec<SmmStats>,
    pub(super) restarts: u64,
    pub(super) pages_recovered: u64,
    pub(super) pages_started_empty: u64,
}

impl ScHost {
    /// Every application's records, program order numbered across restarts.
    pub(super) fn records(&self) -> Vec<ExecRecord> {
        let mut all = self.life.retired.clone();
        all.extend(self.port.records().map(|mut r| {
            r.index += self.life.index_base;
            r
        }));
        all
    }

    /// Every node's records for the oracle, by era.
    pub(super) fn era_records(&self) -> Vec<NodeRecords> {
        self.port.era_records(self.records())
    }

    /// Counters of every application this host ran.
    pub(super) fn all_stats(&self) -> impl Iterator<Item = SmmStats> + '_ {
        self.life
            .retired_stats
            .iter()
            .copied()
            .chain(self.port.all_stats())
    }

    /// Busy with a restart: issue nothing.
    pub(super) fn restarting(&self) -> bool {
        self.life.leaving || self.life.away || self.life.rejoining
    }

    /// Leaving: assign what is scheduled, wait until nothing here is pending, take the token
    /// and go.
    pub(super) fn try_leave(&mut self, ctx: &mut HostCtx<'_>) {
        if !self.life.leaving || self.life.away {
            return;
        }
        if !self.scheds.is_empty() {
            if self.outstanding() == 0 {
                let mut iso = self.port.node.isochron();
                for a in self.scheds.drain(..) {
                    let w = Self::width(a);
                    let v = ctx.rng().next_u64() & w.max_value();
                    iso.assign(a, w, v).expect("assign of an own sched");
                }
                iso.end().expect("an isochron within limits");
                self.port.flush(ctx);
            }
            return;
        }
        let s = self.port.node.stats();
        if !self.port.node.is_idle() || s.read_pending > 0 {
            return;
        }
        if self
            .life
            .token
            .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            if !self.life.leave_retry_armed {
                self.life.leave_retry_armed = true;
                ctx.wake_at(ctx.now_us() + LEAVE_RETRY_US, WAKE_LEAVE);
            }
            return;
        }
        let records = self.records();
        self.life.index_base = records.iter().map(|r| r.index + 1).max().unwrap_or(0);
        self.life.retired = records;
        self.life.retired_stats.push(s);
        self.life.leaving = false;
        self.life.away = true;
        self.life.restarts += 1;
        let away = self.life.faults.absent_us;
        let back_us = ctx.now_us() + ctx.rng().range_inclusive(away.lo, away.hi);
        ctx.wake_at(back_us, WAKE_RETURN);
    }

    /// A new application attaches and joins.
    pub(super) fn come_back(&mut self, ctx: &mut HostCtx<'_>) {
        let cfg_host = ctx.host();
        self.port.restart(cfg_host);
        if self.life.faults.break_transfer {
            self.port.node.break_transfer_skip_replay();
        }
        self.life.away = false;
        self.life.rejoining = true;
        ctx.attach();
        self.port.node.join().expect("a fresh node joins");
        self.port.flush(ctx);
    }

    /// After a rejoin: current again, give the token back.
    pub(super) fn check_rejoined(&mut self) {
        if !self.life.rejoining {
            return;
        }
        match self.port.node.join_status() {
            JoinStatus::Joining { .. } => {}
            status => {
                if let JoinStatus::Failed(e) = status {
                    let what = format!("host {}: join failed: {e}", self.port.node.host());
                    self.port.unexpected.one("joins that failed", what);
                }
                let r = self.port.node.join_report().cloned().unwrap_or_default();
                self.life.pages_recovered += r.pages_recovered.len() as u64;
                self.life.pages_started_empty += r.pages_started_empty.len() as u64;
                self.life.rejoining = false;
                self.life.token.store(false, Ordering::SeqCst);
            }
        }
    }
}

/// A host's restart plan: restart points spread over its isochrons, and whether it joins late.
pub(super) fn life(
    apps: &AppFaults,
    per_host: u64,
    token: &Arc<AtomicBool>,
    rng: &mut crate::SimRng,
) -> Life {
    let mut restart_at: Vec<u64> = Vec::new();
    if per_host > 1 {
        for _ in 0..apps.restarts_per_host {
            let at = 1 + rng.below(per_host - 1);
            if !restart_at.contains(&at) {
                restart_at.push(at);
            }
        }
    }
    restart_at.sort_unstable();
    Life {
        faults: *apps,
        restart_at,
        late: apps.late_join > 0.0 && rng.chance(apps.late_join),
        leaving: false,
        away: false,
        rejoining: false,
        token: Arc::clone(token),
        leave_retry_armed: false,
        retired: Vec::new(),
        index_base: 0,
        retired_stats: Vec::new(),
        restarts: 0,
        pages_recovered: 0,
        pages_started_empty: 0,
    }
}
