//! One host of the `sc` workload: issues random isochrons (reads, writes, read-modify-writes,
//! sched/assign chains) with at most [`OUTSTANDING_MAX`] not yet executed, leaves and returns
//! when the run restarts applications, and assigns every sched it still holds at the end.

use super::SLOTS;
use super::restarts::Life;
use crate::host::{Host, HostCtx};
use crate::net::RangeUs;
use crate::smm_host::{PortEvent, SIM_RMW_FUNCTION, SmmPort};
use isotach_proto::packet::Width;
use isotach_siu::SiuError;
use isotach_smm::{Addr, Isochron, SmmError};
use std::collections::VecDeque;
use std::sync::Arc;

/// Isochrons a host may have issued and not yet executed.
const OUTSTANDING_MAX: u64 = 2;
/// Wake-up tokens of a host.
const WAKE_ISSUE: u64 = 0;
pub(super) const WAKE_LEAVE: u64 = 1;
pub(super) const WAKE_RETURN: u64 = 2;
/// How long a host that wants to leave waits before trying again.
pub(super) const LEAVE_RETRY_US: u64 = 500;

/// One host of the `sc` workload.
#[derive(Debug)]
pub(super) struct ScHost {
    pub(super) port: SmmPort,
    /// Isochrons this host still issues.
    pub(super) left: u64,
    /// Variables this host scheduled and has not assigned yet, oldest first.
    pub(super) scheds: VecDeque<Addr>,
    /// Pages this host may touch.
    pub(super) pages: Arc<Vec<u32>>,
    pub(super) think_us: RangeUs,
    /// A wake-up is pending.
    pub(super) waking: bool,
    pub(super) life: Life,
}

impl ScHost {
    pub(super) fn done(&self) -> bool {
        self.port.running
            && self.left == 0
            && self.scheds.is_empty()
            && self.port.node.is_idle()
            && !self.life.away
            && !self.life.leaving
            && !self.life.rejoining
    }

    /// Why the host is not done (for stalled runs).
    pub(super) fn describe(&self) -> String {
        let s = self.port.node.stats();
        format!(
            "left {} scheds {} outstanding {} leaving {} away {} rejoining {} join {:?} \
             idle {} read_pending {} reads_outstanding {} busy with: {}",
            self.left,
            self.scheds.len(),
            self.outstanding(),
            self.life.leaving,
            self.life.away,
            self.life.rejoining,
            self.port.node.join_status(),
            self.port.node.is_idle(),
            s.read_pending,
            s.reads_outstanding,
            self.port.node.busy_with()
        )
    }

    pub(super) fn outstanding(&self) -> u64 {
        let s = self.port.node.stats();
        s.isochrons_issued - s.isochrons_executed
    }

    /// Slot 0 of every page is 32-bit, the others 64-bit.
    pub(super) fn width(addr: Addr) -> Width {
        if addr.slot() == 0 {
            Width::W32
        } else {
            Width::W64
        }
    }

    /// A random read-modify-write: half `add`, a quarter `compare_and_swap` (expecting 0 or
    /// `value`, so some swap), a quarter `apply`.
    fn rmw(
        iso: &mut Isochron<'_>,
        ctx: &mut HostCtx<'_>,
        addr: Addr,
        width: Width,
        value: u64,
    ) -> Result<(), SmmError> {
        let r = match ctx.rng().below(4) {
            0 | 1 => iso.add(addr, width, value),
            2 => {
                let expected = if ctx.rng().below(2) == 0 { 0 } else { value };
                iso.compare_and_swap(addr, width, expected, value ^ 1)
            }
            _ => iso.apply(addr, width, SIM_RMW_FUNCTION, value),
        };
        r.map(|_| ())
    }

    fn issue(&mut self, ctx: &mut HostCtx<'_>) {
        let last = self.left == 1;
        let ops = 1 + ctx.rng().below(4);
        let pages = Arc::clone(&self.pages);
        let held = self.scheds.len();
        let mut iso = self.port.node.isochron();
        let mut scheds = Vec::new();
        let mut assigns = 0;
        for _ in 0..ops {
            let addr = random_addr(ctx, &pages);
            let width = Self::width(addr);
            let value = ctx.rng().next_u64() & width.max_value();
            let roll = ctx.rng().below(100);
            let r = if roll < 35 {
                iso.read(addr, width).map(|_| ())
            } else if roll < 63 {
                iso.write(addr, width, value)
            } else if roll < 75 {
                Self::rmw(&mut iso, ctx, addr, width, value)
            } else if roll < 88 && held + scheds.len() < 4 {
                scheds.push(addr);
                iso.sched(addr)
            } else if let Some(&a) = self.scheds.get(assigns) {
                assigns += 1;
                let w = Self::width(a);
                iso.assign(a, w, value & w.max_value())
            } else {
                iso.read(addr, width).map(|_| ())
            };
            r.expect("ops on mapped addresses within limits");
        }
        if last {
            // Assign everything still scheduled, this isochron's scheds included.
            let pending: Vec<Addr> = self
                .scheds
                .iter()
                .skip(assigns)
                .chain(&scheds)
                .copied()
                .collect();
            for a in pending {
                let w = Self::width(a);
                let v = ctx.rng().next_u64() & w.max_value();
                iso.assign(a, w, v).expect("assign of an own sched");
            }
        }
        iso.end().expect("an isochron within limits");
        if last {
            self.scheds.clear();
        } else {
            self.scheds.drain(..assigns);
            self.scheds.extend(scheds);
        }
        self.left -= 1;
        if self.life.restart_at.last() == Some(&self.left) {
            self.life.restart_at.pop();
            self.life.leaving = true;
        }
        self.port.flush(ctx);
    }

    fn maybe_issue(&mut self, ctx: &mut HostCtx<'_>) {
        if self.restarting() {
            self.try_leave(ctx);
            return;
        }
        if !self.port.running || self.left == 0 || self.waking {
            return;
        }
        if self.outstanding() >= OUTSTANDING_MAX {
            return;
        }
        let think = self.think_us;
        let at = ctx.now_us() + ctx.rng().range_inclusive(think.lo, think.hi);
        self.waking = true;
        ctx.wake_at(at, WAKE_ISSUE);
    }
}

/// A random variable: the hot page (page 0) takes about a third of all accesses.
fn random_addr(ctx: &mut HostCtx<'_>, pages: &[u32]) -> Addr {
    let page = if ctx.rng().chance(0.35) {
        0
    } else {
        pages[ctx.rng().below(pages.len() as u64) as usize]
    };
    Addr::new(page, ctx.rng().below(u64::from(SLOTS)) as u32)
}

impl Host for ScHost {
    fn on_start(&mut self, ctx: &mut HostCtx<'_>) {
        self.port.start(ctx);
    }

    fn attached(&self) -> bool {
        !self.life.away
    }

    fn on_packet(&mut self, ctx: &mut HostCtx<'_>, bytes: &[u8]) {
        match self.port.packet(ctx, bytes) {
            PortEvent::Started if self.life.late => {
                self.life.late = false;
                self.life.leaving = true;
            }
            PortEvent::Restarted => self.scheds.clear(),
            _ => {}
        }
        self.check_rejoined();
        self.maybe_issue(ctx);
    }

    fn on_siu_restart(&mut self, ctx: &mut HostCtx<'_>) {
        self.port.siu_restarted(ctx);
        self.scheds.clear();
    }

    fn on_wake(&mut self, ctx: &mut HostCtx<'_>, token: u64) {
        match token {
            WAKE_LEAVE => {
                self.life.leave_retry_armed = false;
                self.try_leave(ctx);
            }
            WAKE_RETURN => self.come_back(ctx),
            _ => {
                self.waking = false;
                if self.port.running
                    && !self.restarting()
                    && self.left > 0
                    && self.outstanding() < OUTSTANDING_MAX
                {
                    self.issue(ctx);
                }
            }
        }
        self.maybe_issue(ctx);
    }

    fn on_refused(&mut self, ctx: &mut HostCtx<'_>, bytes: &[u8], error: &SiuError) {
        self.port.refused(ctx, bytes, error);
    }
}
