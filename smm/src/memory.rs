//! This host's copies of shared pages: values, unsubstantiated variables and the read-pending
//! list.
//!
//! A `sched` makes a variable unsubstantiated *at the sched's order key*. Reads ordered after it
//! wait in the read-pending list, tied to that key, until the scheduling node's `assign`
//! supplies the value. A second `sched` while the first is unresolved does not steal the
//! variable: it opens a second pending version with its own key; each node's `assign` resolves
//! that node's oldest unresolved sched on the variable, so concurrent scheds resolve in
//! logical-time order per node and readers get the value of the version they read.

use crate::{OrderKey, SmmError, map::Addr};

/// Identifies one sched at this copy: its isochron's place in the order and its position among
/// that isochron's operations (one isochron may schedule a variable more than once; a remote
/// copy tells them apart by their messages' sequums, this host's copy by the position).
pub(crate) type SchedId = (OrderKey, u32);
use isotach_proto::packet::Width;
use isotach_proto::reply::{ImageEntry, ImageSched};
use isotach_proto::topology::HostId;
use std::collections::HashMap;

/// One variable slot of a local page.
#[derive(Debug, Clone, Default)]
struct Var {
    value: u64,
    /// The unresolved sched that the latest operation left the variable in, if any.
    pending: Option<SchedId>,
    /// Unresolved scheds on this variable, in order: (key, scheduling host).
    scheds: Vec<(SchedId, HostId)>,
}

/// A read waiting for a sched to be resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PendingRead {
    pub(crate) addr: Addr,
    pub(crate) width: Width,
    pub(crate) waits_on: SchedId,
    pub(crate) requester: HostId,
    pub(crate) ref_id: u32,
}

/// A read released by an assign.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Released {
    pub(crate) requester: HostId,
    pub(crate) ref_id: u32,
    pub(crate) value: u64,
}

/// The outcome of a read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReadOutcome {
    Value(u64),
    Pending,
}

/// Local copies of pages.
#[derive(Debug, Clone)]
pub(crate) struct Memory {
    slots_per_page: u32,
    pages: HashMap<u32, Vec<Var>>,
    read_pending: Vec<PendingRead>,
    read_pending_max: usize,
}

fn narrow(value: u64, width: Width) -> u64 {
    value & width.max_value()
}

impl Memory {
    pub(crate) fn new(pages: impl Iterator<Item = u32>, slots_per_page: u32) -> Self {
        let pages = pages
            .map(|p| (p, vec![Var::default(); slots_per_page as usize]))
            .collect();
        Self {
            slots_per_page,
            pages,
            read_pending: Vec::new(),
            read_pending_max: 0,
        }
    }

    fn var(&mut self, addr: Addr) -> Result<&mut Var, SmmError> {
        if addr.slot() >= self.slots_per_page {
            return Err(SmmError::Unmapped(addr));
        }
        let page = self
            .pages
            .get_mut(&addr.page())
            .ok_or(SmmError::NotACopy(addr))?;
        Ok(&mut page[addr.slot() as usize])
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
                self.read_pending.push(PendingRead {
                    addr,
                    width,
                    waits_on,
                    requester,
                    ref_id,
                });
                self.read_pending_max = self.read_pending_max.max(self.read_pending.len());
                Ok(ReadOutcome::Pending)
            }
        }
    }

    /// The value a handler or a local check sees now (unsubstantiated or not).
    pub(crate) fn peek(&self, addr: Addr) -> Option<u64> {
        let page = self.pages.get(&addr.page())?;
        page.get(addr.slot() as usize).map(|v| v.value)
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
    /// reads it releases.
    pub(crate) fn assign(
        &mut self,
        addr: Addr,
        width: Width,
        value: u64,
        scheduler: HostId,
    ) -> Result<Vec<Released>, SmmError> {
        let value = narrow(value, width);
        let var = self.var(addr)?;
        let Some(i) = var.scheds.iter().position(|&(_, s)| s == scheduler) else {
            return Err(SmmError::AssignWithoutSched(addr));
        };
        let (key, _) = var.scheds.remove(i);
        if var.pending == Some(key) {
            var.value = value;
            var.pending = None;
        }
        let mut released = Vec::new();
        self.read_pending.retain(|r| {
            let hit = r.addr == addr && r.waits_on == key;
            if hit {
                released.push(Released {
                    requester: r.requester,
                    ref_id: r.ref_id,
                    value: narrow(value, r.width),
                });
            }
            !hit
        });
        Ok(released)
    }

    /// The page's variables as a state-transfer image: every variable that is non-zero or
    /// has unresolved scheds. Reads waiting here are not part of it: they were sent to this
    /// copy and this copy answers them.
    pub(crate) fn image(&self, page: u32) -> Vec<ImageEntry> {
        let Some(vars) = self.pages.get(&page) else {
            return Vec::new();
        };
        vars.iter()
            .enumerate()
            .filter(|(_, v)| v.value != 0 || !v.scheds.is_empty())
            .map(|(slot, v)| ImageEntry {
                slot: slot as u32,
                value: v.value,
                pending: v
                    .pending
                    .and_then(|p| v.scheds.iter().position(|&(k, _)| k == p))
                    .map(|i| i as u16),
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
        vars.iter_mut().for_each(|v| *v = Var::default());
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
            let var = &mut vars[e.slot as usize];
            var.value = e.value;
            var.pending = e
                .pending
                .and_then(|p| scheds.get(usize::from(p)))
                .map(|s| s.0);
            var.scheds = scheds;
        }
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
}
