//! Issue: an isochron the application ended becomes this host's part (local operations) and
//! one sref per remote copy. Decides which copies an operation reaches (a read goes to the
//! nearest copy, a write, sched, assign or read-modify-write to every copy, the nearest of
//! which answers the read-modify-write), checks assigns against this host's
//! unassigned scheds in program order, and starts the execution record.

use super::SmmNode;
use super::hit_buffer::LocalOp;
use super::isochron::Planned;
use super::reads::ReadSlot;
use crate::map::Addr;
use crate::{ExecRecord, RecordedOp, SmmError, Table};
use isotach_proto::packet::{RmwSref, Sref, SrefOp, Width};
use isotach_proto::topology::HostId;
use std::collections::HashMap;

impl SmmNode {
    /// Issues an ended isochron: refused while joining, at the hit buffer's limit or on an
    /// assign without a sched; otherwise split, recorded and enqueued.
    pub(super) fn issue(&mut self, ops: &[Planned]) -> Result<(), SmmError> {
        self.check_not_joining()?;
        if self.hit.len() >= self.cfg.limits.hit_buffer_max {
            return Err(SmmError::Limit(Table::HitBuffer));
        }
        self.account_scheds(ops)?;
        // Lists kept from earlier isochrons: no allocation per isochron once grown.
        let mut local = self.spare_local.pop().unwrap_or_default();
        let mut remote = std::mem::take(&mut self.remote_scratch);
        debug_assert!(local.is_empty() && remote.is_empty());
        self.split(ops, &mut local, &mut remote);
        let record = self.record_for(ops);
        self.stats.isochrons_issued += 1;
        self.enqueue(local, &remote, record, false);
        remote.clear();
        self.remote_scratch = remote;
        Ok(())
    }

    /// Keeps an emptied list of local operations for a later isochron (up to
    /// [`super::LOCAL_OPS_SPARE_MAX`]).
    pub(super) fn keep_local_ops(&mut self, mut ops: Vec<LocalOp>) {
        if self.spare_local.len() < super::LOCAL_OPS_SPARE_MAX && ops.capacity() > 0 {
            ops.clear();
            self.spare_local.push(ops);
        }
    }

    /// Splits planned ops into this host's part (`local`) and the srefs for other hosts
    /// (`remote`).
    fn split(&self, ops: &[Planned], local: &mut Vec<LocalOp>, remote: &mut Vec<(HostId, Sref)>) {
        let me = self.cfg.host;
        let mem = |op: SrefOp, addr: Addr, width: Width, value: u64, ref_id: u32| Sref::Mem {
            op,
            width,
            addr: addr.raw(),
            value,
            ref_id,
        };
        for op in ops {
            match op {
                Planned::Read(addr, width, ref_id) => {
                    let nearest = self.map.copyset(addr.page()).map_or(me, |c| c[0]);
                    if nearest == me {
                        local.push(LocalOp::Read(*addr, *width, *ref_id));
                    } else {
                        remote.push((nearest, mem(SrefOp::Read, *addr, *width, 0, *ref_id)));
                    }
                }
                Planned::Write(addr, width, v) | Planned::Assign(addr, width, v) => {
                    let (sop, lop): (SrefOp, fn(Addr, Width, u64) -> LocalOp) =
                        if matches!(op, Planned::Write(..)) {
                            (SrefOp::Write, LocalOp::Write)
                        } else {
                            (SrefOp::Assign, LocalOp::Assign)
                        };
                    for &c in self.map.copyset(addr.page()).as_deref().unwrap_or(&[]) {
                        if c == me {
                            local.push(lop(*addr, *width, *v));
                        } else {
                            remote.push((c, mem(sop, *addr, *width, *v, 0)));
                        }
                    }
                }
                Planned::Sched(addr) => {
                    for &c in self.map.copyset(addr.page()).as_deref().unwrap_or(&[]) {
                        if c == me {
                            local.push(LocalOp::Sched(*addr));
                        } else {
                            remote.push((c, mem(SrefOp::Sched, *addr, Width::W64, 0, 0)));
                        }
                    }
                }
                Planned::Rmw(rmw) => {
                    // Every copy runs it; the nearest answers, as it would a read.
                    let page = Addr::from_raw(rmw.addr).page();
                    let copies = self.map.copyset(page);
                    let copies = copies.as_deref().unwrap_or(&[]);
                    let answering = copies.first().copied().unwrap_or(me);
                    for &c in copies {
                        let rmw = RmwSref {
                            answer: c == answering,
                            ..*rmw
                        };
                        if c == me {
                            local.push(LocalOp::Rmw(rmw));
                        } else {
                            remote.push((c, Sref::Rmw(rmw)));
                        }
                    }
                }
                Planned::Message(node, handler, payload) => {
                    if *node == me {
                        local.push(LocalOp::Message(*handler, payload.clone()));
                    } else {
                        let sref = Sref::Msg {
                            handler: *handler,
                            payload: payload.clone(),
                        };
                        remote.push((*node, sref));
                    }
                }
            }
        }
    }

    /// Starts the execution record of an isochron (when `record` is configured).
    fn record_for(&mut self, ops: &[Planned]) -> Option<usize> {
        if !self.cfg.record {
            return None;
        }
        let r = self.records.len();
        let mut recorded = Vec::new();
        for op in ops {
            let rec = match *op {
                Planned::Read(addr, width, ref_id) => {
                    if let Some(ReadSlot::Waiting { record }) = self.reads.get_mut(&ref_id) {
                        *record = Some((r, recorded.len()));
                    }
                    RecordedOp::Read {
                        addr,
                        mask: width.max_value(),
                        value: None,
                    }
                }
                Planned::Write(addr, width, value) => RecordedOp::Write {
                    addr,
                    value: value & width.max_value(),
                },
                Planned::Sched(addr) => RecordedOp::Sched { addr },
                Planned::Assign(addr, width, value) => RecordedOp::Assign {
                    addr,
                    value: value & width.max_value(),
                },
                Planned::Rmw(rmw) => {
                    if let Some(ReadSlot::Waiting { record }) = self.reads.get_mut(&rmw.ref_id) {
                        *record = Some((r, recorded.len()));
                    }
                    RecordedOp::Rmw {
                        addr: Addr::from_raw(rmw.addr),
                        op: rmw.op,
                        width: rmw.width,
                        arg: rmw.arg,
                        arg2: rmw.arg2,
                        old: None,
                        refused_by: None,
                    }
                }
                Planned::Message(..) => continue,
            };
            recorded.push(rec);
        }
        self.records.push(ExecRecord {
            host: self.cfg.host,
            index: self.issued,
            key: None,
            ops: recorded,
        });
        Some(r)
    }

    /// Checks assigns against this host's unassigned scheds (in program order) and commits
    /// the new counts.
    fn account_scheds(&mut self, ops: &[Planned]) -> Result<(), SmmError> {
        let mut delta: HashMap<Addr, i64> = HashMap::new();
        let mut total = self.my_scheds_total as i64;
        for op in ops {
            match op {
                Planned::Sched(a) => {
                    *delta.entry(*a).or_default() += 1;
                    total += 1;
                }
                Planned::Assign(a, ..) => {
                    let have = i64::from(self.my_scheds.get(a).copied().unwrap_or(0));
                    let d = delta.entry(*a).or_default();
                    if have + *d <= 0 {
                        return Err(SmmError::AssignWithoutSched(*a));
                    }
                    *d -= 1;
                    total -= 1;
                }
                _ => {}
            }
        }
        if total as usize > self.cfg.limits.scheds_max {
            return Err(SmmError::Limit(Table::Scheds));
        }
        for (a, d) in delta {
            let n = self.my_scheds.entry(a).or_default();
            *n = (i64::from(*n) + d) as u32;
            if *n == 0 {
                self.my_scheds.remove(&a);
            }
        }
        self.my_scheds_total = total as usize;
        Ok(())
    }
}
