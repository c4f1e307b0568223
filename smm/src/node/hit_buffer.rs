//! The hit buffer: this host's part of each issued isochron, in issue order, waiting for its
//! place in the global order. An isochron with a remote part runs when its isochron marker is
//! drained; purely local isochrons queued behind it run right after it (they take its place);
//! a purely local isochron with nothing outstanding runs at once, after everything drained.

use super::SmmNode;
use crate::OrderKey;
use crate::map::Addr;
use crate::memory::ReadOutcome;
use isotach_proto::packet::{IsochronMarker, RmwSref, Sref, Width};
use isotach_proto::topology::HostId;

/// An operation this host executes itself (its own copy, its own handler, or a join's
/// admission of a page).
#[derive(Debug, Clone)]
pub(super) enum LocalOp {
    Read(Addr, Width, u32),
    Write(Addr, Width, u64),
    Sched(Addr),
    Assign(Addr, Width, u64),
    Message(u16, Vec<u8>),
    /// A read-modify-write of this host's copy (answering here when `answer`).
    Rmw(RmwSref),
    /// A join's admission of a page (state transfer): operations on it are logged from here.
    Admit(u32),
}

/// An issued isochron waiting in the hit buffer.
#[derive(Debug)]
pub(super) struct HitEntry {
    /// The isochron's id, echoed by its isochron marker.
    iso_id: u32,
    /// Has a remote part, so an isochron marker will come back for it.
    remote: bool,
    /// This host's part.
    ops: Vec<LocalOp>,
    /// Its execution record (when `record` is configured).
    record: Option<usize>,
    /// A join's admission isochron (not the application's: not counted in the stats).
    admission: bool,
}

impl SmmNode {
    /// Issues a join's admission isochron (see [`SmmNode::join`]).
    pub(super) fn enqueue_admission(&mut self, local: Vec<LocalOp>, remote: Vec<(HostId, Sref)>) {
        if !local.is_empty() {
            self.enqueue(local, &remote, None, true);
        }
    }

    /// Puts an isochron in the hit buffer (sending its remote part) or runs it at once.
    pub(super) fn enqueue(
        &mut self,
        local: Vec<LocalOp>,
        remote: &[(HostId, Sref)],
        record: Option<usize>,
        admission: bool,
    ) {
        let iso_id = self.next_iso_id;
        self.next_iso_id = self.next_iso_id.wrapping_add(1);
        let index = self.issued;
        self.issued += 1;
        let entry = HitEntry {
            iso_id,
            remote: !remote.is_empty(),
            ops: local,
            record,
            admission,
        };
        if entry.remote {
            self.send_isochron(iso_id, index, remote);
            self.markers_outstanding += 1;
            self.stats.markers_outstanding_max = self
                .stats
                .markers_outstanding_max
                .max(self.markers_outstanding);
            self.hit.push_back(entry);
        } else if self.hit.is_empty() {
            // Purely local and nothing outstanding: run now, after everything drained.
            let key = OrderKey {
                ts: self.last_drained,
                source: OrderKey::IMMEDIATE,
                sequum: self.immediate,
                sub: 0,
            };
            self.immediate += 1;
            if !admission {
                self.stats.isochrons_immediate += 1;
            }
            self.run_local(entry, key);
        } else {
            self.hit.push_back(entry);
        }
    }

    /// An isochron marker: run the isochron it names, then the purely local isochrons queued
    /// behind it, up to the next isochron with a remote part.
    pub(super) fn execute_at_marker(&mut self, ts: u64, k: &IsochronMarker) {
        let front_matches = self
            .hit
            .front()
            .is_some_and(|e| e.remote && e.iso_id == k.iso_id);
        if !front_matches {
            self.stats.bad_input += 1;
            return;
        }
        debug_assert!(
            self.markers_outstanding > 0,
            "a marker matches an isochron sent"
        );
        self.markers_outstanding -= 1;
        let mut key = OrderKey {
            ts,
            source: self.cfg.host,
            sequum: k.sequum,
            sub: 0,
        };
        while let Some(entry) = self.hit.pop_front() {
            self.run_local(entry, key);
            key.sub += 1;
            if self.hit.front().is_none_or(|e| e.remote) {
                break;
            }
        }
    }

    /// Runs this host's part of one isochron at `key`, its place in the order.
    fn run_local(&mut self, entry: HitEntry, key: OrderKey) {
        let me = self.cfg.host;
        let mut ops = entry.ops;
        for (i, op) in ops.drain(..).enumerate() {
            match op {
                LocalOp::Read(addr, width, ref_id) => {
                    match self.memory.read(addr, width, me, ref_id) {
                        Ok(ReadOutcome::Value(v)) => {
                            let _ = self.resolve_read(ref_id, v);
                        }
                        Ok(ReadOutcome::Pending) => {}
                        Err(e) => self.count_exec_error(&e),
                    }
                }
                LocalOp::Write(addr, width, value) => {
                    if let Err(e) = self.memory.write(addr, width, value) {
                        self.count_exec_error(&e);
                    }
                }
                LocalOp::Sched(addr) => {
                    if let Err(e) = self.memory.sched(addr, (key, i as u32), me) {
                        self.count_exec_error(&e);
                    }
                }
                LocalOp::Assign(addr, width, value) => self.assign(addr, width, value, me),
                LocalOp::Message(handler, payload) => self.call(handler, me, key.ts, &payload),
                LocalOp::Rmw(rmw) => self.execute_rmw(rmw, me),
                LocalOp::Admit(page) => self.admit(page, key.ts),
            }
        }
        if let Some(r) = entry.record {
            self.records[r].key = Some(key);
        }
        if !entry.admission {
            self.stats.isochrons_executed += 1;
        }
        self.keep_local_ops(ops);
    }
}
