//! This host's copies of shared pages: values, unsubstantiated variables and the read-pending
//! list (reads and read-modify-writes waiting for an assign).
//!
//! A `sched` makes a variable unsubstantiated *at the sched's order key*. Reads ordered after it
//! wait in the read-pending list, tied to that key, until the scheduling node's `assign`
//! supplies the value. A second `sched` while the first is unresolved does not steal the
//! variable: it opens a second pending version with its own key; each node's `assign` resolves
//! that node's oldest unresolved sched on the variable, so concurrent scheds resolve in
//! logical-time order per node and readers get the value of the version they read.

use crate::rmw::RmwFunctions;
use crate::{OrderKey, SmmError, map::Addr};

/// Identifies one sched at this copy: its isochron's place in the order and its position among
/// that isochron's operations (one isochron may schedule a variable more than once; a remote
/// copy tells them apart by their messages' sequums, this host's copy by the position).
pub(crate) type SchedId = (OrderKey, u32);
use isotach_proto::packet::{RmwSref, Width};
use isotach_proto::reply::{ImageEntry, ImageRmw, ImageSched};
use isotach_proto::topology::HostId;
use rustc_hash::FxHashMap;

/// One variable slot of a local page.
#[derive(Debug, Clone, Default)]
struct Var {
    value: u64,
    /// The unresolved sched that the latest operation left the variable in, if any.
    pending: Option<SchedId>,
    /// Unresolved scheds on this variable, in order: (key, scheduling host).
    scheds: Vec<(SchedId, HostId)>,
}

/// What waits for a sched to be resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Waiter {
    /// A read of `width`.
    Read(Width),
    /// A read-modify-write: it runs on the assigned value, in order with the other waiters.
    Rmw(RmwSref),
}

/// An operation waiting for a sched to be resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PendingOp {
    pub(crate) addr: Addr,
    pub(crate) waiter: Waiter,
    pub(crate) waits_on: SchedId,
    pub(crate) requester: HostId,
    pub(crate) ref_id: u32,
}

/// An answer released by an assign (a read's value, or a read-modify-write's old value).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Released {
    pub(crate) requester: HostId,
    pub(crate) ref_id: u32,
    pub(crate) value: u64,
}

/// The outcome of a read, or of a read-modify-write (the value it found).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReadOutcome {
    Value(u64),
    Pending,
}

/// Local copies of pages.
#[derive(Debug, Clone)]
pub(crate) struct Memory {
    slots_per_page: u32,
    /// Each page's variables up to the last one ever written; the rest, up to
    /// `slots_per_page`, hold zero and take no memory (a page of 4096 slots of which an
    /// application uses four, thousands of times over in the simulator).
    pages: FxHashMap<u32, Vec<Var>>,
    /// Waiting operations in execution order (an assign replays its waiters in this order).
    read_pending: Vec<PendingOp>,
    read_pending_max: usize,
    /// The application's `apply` functions.
    functions: RmwFunctions,
    /// `apply`s of a function not registered here (the variable kept its value).
    unknown_functions: u64,
}

fn narrow(value: u64, width: Width) -> u64 {
    value & width.max_value()
}

impl Memory {
    pub(crate) fn new(pages: impl Iterator<Item = u32>, slots_per_page: u32) -> Self {
        let pages = pages.map(|p| (p, Vec::new())).collect();
        Self {
            slots_per_page,
            pages,
            read_pending: Vec::new(),
            read_pending_max: 0,
            functions: RmwFunctions::default(),
            unknown_functions: 0,
        }
    }

    /// The functions `apply` may name.
    pub(crate) fn functions(&self) -> &RmwFunctions {
        &self.functions
    }

    /// The functions `apply` may name, to register one.
    pub(crate) fn functions_mut(&mut self) -> &mut RmwFunctions {
        &mut self.functions
    }

    /// `apply`s of a function not registered here.
    pub(crate) fn unknown_functions(&self) -> u64 {
        self.unknown_functions
    }

    fn wait(&mut self, op: PendingOp) {
        self.read_pending.push(op);
        self.read_pending_max = self.read_pending_max.max(self.read_pending.len());
    }

    fn var(&mut self, addr: Addr) -> Result<&mut Var, SmmError> {
        Self::var_in(&mut self.pages, self.slots_per_page, addr)
    }

    /// [`Memory::var`] borrowing only the pages, so the caller keeps the other fields.
    fn var_in(
        pages: &mut FxHashMap<u32, Vec<Var>>,
        slots_per_page: u32,
        addr: Addr,
    ) -> Result<&mut Var, SmmError> {
        if addr.slot() >= slots_per_page {
            return Err(SmmError::Unmapped(addr));
        }
        let page = pages
            .get_mut(&addr.page())
            .ok_or(SmmError::NotACopy(addr))?;
        let slot = addr.slot() as usize;
        if page.len() <= slot {
            page.resize(slot + 1, Var::default());
        }
        Ok(&mut page[slot])
    }

    /// Reads `addr`; if it is unsubstantiated the read waits (and is remembered).
    pub(crate) fn read(
        &mut self,
        addr: Addr,
        width: Width,
        requester: HostId,
        ref_id: u32,
    ) -> Result<ReadOutcome, SmmError> {
        let var = self.var(addr)?;
        match var.pending {
            None => Ok(ReadOutcome::Value(narrow(var.value, width))),
            Some(waits_on) => {
                self.wait(PendingOp {
                    addr,
                    waiter: Waiter::Read(width),
                    waits_on,
                    requester,
                    ref_id,
                });
                Ok(ReadOutcome::Pending)
            }
        }
    }

    /// Runs a read-modify-write on `addr`: at once when the variable is substantiated (the
    /// outcome is the value it found), else after the assign it waits for.
    pub(crate) fn rmw(&mut self, rmw: RmwSref, requester: HostId) -> Result<ReadOutcome, SmmError> {
        let addr = Addr::from_raw(rmw.addr);
        let var = Self::var_in(&mut self.pages, self.slots_per_page, addr)?;
        let Some(waits_on) = var.pending else {
            let old = narrow(var.value, rmw.width);
            var.value = Self::modified(&self.functions, &mut self.unknown_functions, rmw, old);
            return Ok(ReadOutcome::Value(old));
        };
        self.wait(PendingOp {
            addr,
            waiter: Waiter::Rmw(rmw),
            waits_on,
            requester,
            ref_id: rmw.ref_id,
        });
        Ok(ReadOutcome::Pending)
    }

    /// The value `rmw` leaves after `old`; an unknown function leaves `old` (counted).
    fn modified(functions: &RmwFunctions, unknown: &mut u64, rmw: RmwSref, old: u64) -> u64 {
        functions
            .new_value(rmw.op, rmw.width, old, rmw.arg, rmw.arg2)
            .unwrap_or_else(|| {
                *unknown += 1;
                old
            })
    }

    /// The value a handler or a local check sees now (unsubstantiated or not).
    pub(crate) fn peek(&self, addr: Addr) -> Option<u64> {
        let page = self.pages.get(&addr.page())?;
        if addr.slot() >= self.slots_per_page {
            return None;
        }
        Some(page.get(addr.slot() as usize).map_or(0, |v| v.value))
    }

    pub(crate) fn write(&mut self, addr: Addr, width: Width, value: u64) -> Result<(), SmmError> {
        let var = self.var(addr)?;
        var.value = narrow(value, width);
        var.pending = None;
        Ok(())
    }

    pub(crate) fn sched(
        &mut self,
        addr: Addr,
        key: SchedId,
        scheduler: HostId,
    ) -> Result<(), SmmError> {
        let var = self.var(addr)?;
        var.scheds.push((key, scheduler));
        var.pending = Some(key);
        Ok(())
    }

    /// Resolves `scheduler`'s oldest unresolved sched on `addr` with `value`; returns the
    /// answers it releases. The operations that waited for it run on `value` in their order,
    /// so a read after a read-modify-write sees its result; the variable keeps the outcome
    /// only while this sched is still the version it is in (a later write or sched replaced
    /// it already otherwise, and the outcome is as overwritten as the assigned value).
    pub(crate) fn assign(
        &mut self,
        addr: Addr,
        width: Width,
        value: u64,
        scheduler: HostId,
    ) -> Result<Vec<Released>, SmmError> {
        let var = Self::var_in(&mut self.pages, self.slots_per_page, addr)?;
        let Some(i) = var.scheds.iter().position(|&(_, s)| s == scheduler) else {
            return Err(SmmError::AssignWithoutSched(addr));
        };
        let (key, _) = var.scheds.remove(i);
        let current = var.pending == Some(key);
        let mut released = Vec::new();
        let mut value = narrow(value, width);
        let (functions, unknown) = (&self.functions, &mut self.unknown_functions);
        self.read_pending.retain(|r| {
            let hit = r.addr == addr && r.waits_on == key;
            if hit {
                let (found, answer) = match r.waiter {
                    Waiter::Read(width) => (narrow(value, width), true),
                    Waiter::Rmw(rmw) => {
                        let old = narrow(value, rmw.width);
                        value = Self::modified(functions, unknown, rmw, old);
                        (old, rmw.answer)
                    }
                };
                if answer {
                    released.push(Released {
                        requester: r.requester,
                        ref_id: r.ref_id,
                        value: found,
                    });
                }
            }
            !hit
        });
        if current {
            var.value = value;
            var.pending = None;
        }
        Ok(released)
    }

    /// The page's variables as a state-transfer image: every variable that is non-zero or
    /// has unresolved scheds, with the read-modify-writes waiting for them (the copy that
    /// installs the image runs those too). Reads waiting here are not part of it: they were
    /// sent to this copy and this copy answers them.
    pub(crate) fn image(&self, page: u32) -> Vec<ImageEntry> {
        let Some(vars) = self.pages.get(&page) else {
            return Vec::new();
        };
        vars.iter()
            .enumerate()
            .filter(|(_, v)| v.value != 0 || !v.scheds.is_empty())
            .map(|(slot, v)| {
                let index = |k: SchedId| v.scheds.iter().position(|&(s, _)| s == k);
                let addr = Addr::new(page, slot as u32);
                ImageEntry {
                    slot: slot as u32,
                    value: v.value,
                    pending: v.pending.and_then(index).map(|i| i as u16),
                    scheds: v
                        .scheds
                        .iter()
                        .map(|&((key, pos), host)| ImageSched {
                            ts: key.ts,
                            source: key.source,
                            sequum: key.sequum,
                            sub: key.sub,
                            pos,
                            host,
                        })
                        .collect(),
                    rmws: self
                        .read_pending
                        .iter()
                        .filter(|w| w.addr == addr)
                        .filter_map(|w| match w.waiter {
                            Waiter::Rmw(r) => Some(ImageRmw {
                                sched: index(w.waits_on)? as u16,
                                op: r.op,
                                width: r.width,
                                arg: r.arg,
                                arg2: r.arg2,
                            }),
                            Waiter::Read(_) => None,
                        })
                        .collect(),
                }
            })
            .collect()
    }

    /// Replaces the page with an image (entries for slots beyond the page are refused).
    pub(crate) fn install(&mut self, page: u32, image: &[ImageEntry]) -> Result<(), SmmError> {
        let slots = self.slots_per_page;
        let vars = self
            .pages
            .get_mut(&page)
            .ok_or(SmmError::NotACopy(Addr::new(page, 0)))?;
        if let Some(e) = image.iter().find(|e| e.slot >= slots) {
            return Err(SmmError::Unmapped(Addr::new(page, e.slot)));
        }
        vars.clear();
        for e in image {
            let scheds: Vec<(SchedId, HostId)> = e
                .scheds
                .iter()
                .map(|s| {
                    let key = OrderKey {
                        ts: s.ts,
                        source: s.source,
                        sequum: s.sequum,
                        sub: s.sub,
                    };
                    ((key, s.pos), s.host)
                })
                .collect();
            for r in &e.rmws {
                let Some(&(waits_on, _)) = scheds.get(usize::from(r.sched)) else {
                    continue; // the decoder refused such an index already
                };
                // The copy that sent the image answers the issuer.
                let rmw = RmwSref {
                    op: r.op,
                    width: r.width,
                    addr: Addr::new(page, e.slot).raw(),
                    arg: r.arg,
                    arg2: r.arg2,
                    ref_id: 0,
                    answer: false,
                };
                self.read_pending.push(PendingOp {
                    addr: Addr::new(page, e.slot),
                    waiter: Waiter::Rmw(rmw),
                    waits_on,
                    requester: 0,
                    ref_id: 0,
                });
            }
            let slot = e.slot as usize;
            if vars.len() <= slot {
                vars.resize(slot + 1, Var::default());
            }
            let var = &mut vars[slot];
            var.value = e.value;
            var.pending = e
                .pending
                .and_then(|p| scheds.get(usize::from(p)))
                .map(|s| s.0);
            var.scheds = scheds;
        }
        self.read_pending_max = self.read_pending_max.max(self.read_pending.len());
        Ok(())
    }

    /// Reads waiting now and the most that ever waited.
    pub(crate) fn read_pending(&self) -> (usize, usize) {
        (self.read_pending.len(), self.read_pending_max)
    }

    /// The whole local state, for cross-copy checks: (addr, value, unsubstantiated).
    pub(crate) fn snapshot(&self) -> Vec<(Addr, u64, bool)> {
        let mut out: Vec<_> = self
            .pages
            .iter()
            .flat_map(|(&p, vars)| {
                vars.iter()
                    .enumerate()
                    .filter(|(_, v)| v.value != 0 || v.pending.is_some())
                    .map(move |(s, v)| (Addr::new(p, s as u32), v.value, v.pending.is_some()))
            })
            .collect();
        out.sort_unstable();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(ts: u64, source: u16) -> SchedId {
        let k = OrderKey {
            ts,
            source,
            sequum: 0,
            sub: 0,
        };
        (k, 0)
    }

    #[test]
    fn reads_wait_for_the_sched_they_follow() {
        let mut m = Memory::new(0..1, 4);
        let a = Addr::new(0, 1);
        m.write(a, Width::W64, 5).unwrap();
        m.sched(a, key(1, 0), 0).unwrap();
        assert_eq!(m.read(a, Width::W64, 2, 77), Ok(ReadOutcome::Pending));
        let r = m.assign(a, Width::W64, 9, 0).unwrap();
        assert_eq!(
            r,
            vec![Released {
                requester: 2,
                ref_id: 77,
                value: 9
            }]
        );
        assert_eq!(m.read(a, Width::W64, 2, 78), Ok(ReadOutcome::Value(9)));
    }

    #[test]
    fn a_second_sched_does_not_steal_the_variable() {
        let mut m = Memory::new(0..1, 4);
        let a = Addr::new(0, 0);
        m.sched(a, key(1, 0), 0).unwrap();
        m.read(a, Width::W64, 5, 1).unwrap(); // waits on host 0's sched
        m.sched(a, key(2, 1), 1).unwrap();
        m.read(a, Width::W64, 5, 2).unwrap(); // waits on host 1's sched
        // Host 1 assigns first: only the read after its sched is released.
        let r = m.assign(a, Width::W64, 11, 1).unwrap();
        assert_eq!(
            r.iter().map(|r| (r.ref_id, r.value)).collect::<Vec<_>>(),
            vec![(2, 11)]
        );
        // Host 0's assign releases its reader but leaves the later version's value.
        let r = m.assign(a, Width::W64, 10, 0).unwrap();
        assert_eq!(
            r.iter().map(|r| (r.ref_id, r.value)).collect::<Vec<_>>(),
            vec![(1, 10)]
        );
        assert_eq!(m.peek(a), Some(11));
        assert_eq!(
            m.assign(a, Width::W64, 1, 0),
            Err(SmmError::AssignWithoutSched(a))
        );
    }

    #[test]
    fn a_write_after_a_sched_is_read_but_the_waiters_keep_their_version() {
        let mut m = Memory::new(0..1, 4);
        let a = Addr::new(0, 0);
        m.sched(a, key(1, 0), 0).unwrap();
        m.read(a, Width::W32, 3, 1).unwrap();
        m.write(a, Width::W64, 0x1_0000_0007).unwrap();
        assert_eq!(m.read(a, Width::W32, 3, 2), Ok(ReadOutcome::Value(7)));
        let r = m.assign(a, Width::W64, 4, 0).unwrap();
        assert_eq!(r[0].value, 4);
        assert_eq!(m.peek(a), Some(0x1_0000_0007));
    }

    #[test]
    fn two_scheds_in_one_isochron_are_told_apart() {
        let mut m = Memory::new(0..1, 4);
        let a = Addr::new(0, 0);
        let k = key(1, 0).0;
        m.sched(a, (k, 0), 0).unwrap();
        m.sched(a, (k, 1), 0).unwrap();
        m.assign(a, Width::W64, 1, 0).unwrap();
        assert_eq!(
            m.read(a, Width::W64, 9, 1),
            Ok(ReadOutcome::Pending),
            "second still open"
        );
        m.assign(a, Width::W64, 2, 0).unwrap();
        assert_eq!(m.peek(a), Some(2));
    }

    #[test]
    fn unmapped_and_foreign_addresses_are_errors() {
        let mut m = Memory::new(0..1, 4);
        assert_eq!(
            m.write(Addr::new(0, 4), Width::W32, 1),
            Err(SmmError::Unmapped(Addr::new(0, 4)))
        );
        assert_eq!(
            m.write(Addr::new(3, 0), Width::W32, 1),
            Err(SmmError::NotACopy(Addr::new(3, 0)))
        );
    }

    #[test]
    fn slots_never_written_read_zero_and_take_no_memory() {
        let mut m = Memory::new(0..2, 4096);
        assert_eq!(m.peek(Addr::new(0, 4095)), Some(0));
        assert_eq!(m.peek(Addr::new(0, 4096)), None, "beyond the page");
        assert_eq!(m.peek(Addr::new(2, 0)), None, "not a copy");
        assert!(m.pages.values().all(Vec::is_empty));
        m.write(Addr::new(1, 9), Width::W64, 7).unwrap();
        assert_eq!(m.pages[&1].len(), 10);
        assert_eq!(m.peek(Addr::new(1, 9)), Some(7));
        assert_eq!(m.peek(Addr::new(1, 100)), Some(0));
        // An image of it installs elsewhere as the same page.
        let image = m.image(1);
        let mut other = Memory::new(1..2, 4096);
        other.write(Addr::new(1, 3000), Width::W64, 5).unwrap();
        other.install(1, &image).unwrap();
        assert_eq!(other.snapshot(), m.snapshot());
    }
}
