//! The sequential-consistency oracle: replays executed isochrons in (TS, source, sequum) order
//! on a plain memory and checks every read, every isochron's atomicity and every host's
//! program order.
//!
//! Replay rules: a `write` stores its value; a `sched` stores the value of the scheduling
//! host's matching `assign` (its next assign of the same variable in program order) — the
//! variable takes that value *at the sched's place in the order*, which is what readers
//! waiting in the read-pending list receive; an `assign` changes nothing at its own place.
//!
//! A read-modify-write makes a new version at its place from the version before it (`add`,
//! `compare_and_swap`, and `apply` with the functions the run registered), and the value it
//! found is checked like a read's.
//!
//! A read that disagrees with the replay is an *atomicity violation* when no single point of
//! the replay explains all reads of its isochron together, and an *SC violation* otherwise
//! (each read is explained by one point, just not the isochron's own).

use crate::rmw::RmwFunctions;
use crate::{Addr, ExecRecord, OrderKey, RecordedOp};
use std::collections::{HashMap, VecDeque};

/// What the oracle found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OracleReport {
    /// Isochrons checked (executed ones).
    pub isochrons: u64,
    /// Reads compared with the replay.
    pub reads_checked: u64,
    /// Isochrons whose reads are explained by one point of the replay, but not their own.
    pub sc_violations: u64,
    /// Isochrons whose reads no single point of the replay explains.
    pub atomicity_violations: u64,
    /// Hosts' isochrons executed out of program order (pairs).
    pub program_order_violations: u64,
    /// Isochrons that never executed.
    pub unexecuted: u64,
    /// Reads that never resolved.
    pub unresolved_reads: u64,
}

impl OracleReport {
    /// No violation of any kind.
    pub fn clean(&self) -> bool {
        self.sc_violations == 0
            && self.atomicity_violations == 0
            && self.program_order_violations == 0
            && self.unexecuted == 0
            && self.unresolved_reads == 0
    }
}

/// Checks a run's execution records (from every host).
pub fn check(records: &[ExecRecord]) -> OracleReport {
    check_explained(records, 0).0
}

/// Like [`check`], and describes up to `explain_max` failing reads (for diagnosis).
pub fn check_explained(records: &[ExecRecord], explain_max: usize) -> (OracleReport, Vec<String>) {
    check_with_functions(records, explain_max, &RmwFunctions::default())
}

/// Like [`check_explained`] for a run whose `apply` read-modify-writes name `functions`.
pub fn check_with_functions(
    records: &[ExecRecord],
    explain_max: usize,
    functions: &RmwFunctions,
) -> (OracleReport, Vec<String>) {
    let mut report = OracleReport::default();
    let mut notes = Vec::new();
    check_program_order(records, &mut report);
    let resolved = resolve_scheds(records);
    let mut executed: Vec<(usize, OrderKey)> = records
        .iter()
        .enumerate()
        .filter_map(|(i, r)| r.key.map(|k| (i, k)))
        .collect();
    executed.sort_unstable_by_key(|&(_, k)| k);
    report.isochrons = executed.len() as u64;
    let history = History::replay(records, &executed, &resolved, functions);
    for (pos, &(i, _)) in executed.iter().enumerate() {
        let mut ctx = Check {
            history: &history,
            resolved: &resolved,
            notes: &mut notes,
            explain_max,
        };
        check_isochron(&records[i], i, pos, &mut ctx, &mut report);
    }
    (report, notes)
}

/// What checking one isochron needs besides the record.
struct Check<'a> {
    history: &'a History,
    resolved: &'a HashMap<(usize, usize), u64>,
    notes: &'a mut Vec<String>,
    explain_max: usize,
}

fn check_program_order(records: &[ExecRecord], report: &mut OracleReport) {
    let mut by_host: HashMap<u16, Vec<&ExecRecord>> = HashMap::new();
    for r in records {
        by_host.entry(r.host).or_default().push(r);
    }
    for list in by_host.values_mut() {
        list.sort_unstable_by_key(|r| r.index);
        let mut last: Option<OrderKey> = None;
        for r in list.iter() {
            let Some(k) = r.key else {
                report.unexecuted += 1;
                continue;
            };
            if last.is_some_and(|l| l >= k) {
                report.program_order_violations += 1;
            }
            last = Some(k);
        }
    }
}

/// `(record, op)` of each sched → the value its host's matching assign supplies.
fn resolve_scheds(records: &[ExecRecord]) -> HashMap<(usize, usize), u64> {
    let mut order: Vec<usize> = (0..records.len()).collect();
    order.sort_unstable_by_key(|&i| (records[i].host, records[i].index));
    let mut open: HashMap<(u16, Addr), VecDeque<(usize, usize)>> = HashMap::new();
    let mut resolved = HashMap::new();
    for i in order {
        let r = &records[i];
        for (j, op) in r.ops.iter().enumerate() {
            match *op {
                RecordedOp::Sched { addr } => {
                    open.entry((r.host, addr)).or_default().push_back((i, j))
                }
                RecordedOp::Assign { addr, value } => {
                    if let Some(s) = open.get_mut(&(r.host, addr)).and_then(VecDeque::pop_front) {
                        resolved.insert(s, value);
                    }
                }
                _ => {}
            }
        }
    }
    resolved
}

/// Every version of every variable in replay order: (position, op index, value). `None` is a
/// sched never assigned: its value is unknown.
struct History {
    versions: HashMap<Addr, Vec<(usize, usize, Option<u64>)>>,
}

impl History {
    fn replay(
        records: &[ExecRecord],
        executed: &[(usize, OrderKey)],
        resolved: &HashMap<(usize, usize), u64>,
        functions: &RmwFunctions,
    ) -> Self {
        let mut versions: HashMap<Addr, Vec<(usize, usize, Option<u64>)>> = HashMap::new();
        for (pos, &(i, _)) in executed.iter().enumerate() {
            for (j, op) in records[i].ops.iter().enumerate() {
                let (addr, value) = match *op {
                    RecordedOp::Write { addr, value } => (addr, Some(value)),
                    RecordedOp::Sched { addr } => (addr, resolved.get(&(i, j)).copied()),
                    RecordedOp::Rmw {
                        addr,
                        op,
                        width,
                        arg,
                        arg2,
                        ..
                    } => {
                        let before = versions
                            .get(&addr)
                            .and_then(|v| v.last())
                            .map_or(Some(0), |&(_, _, v)| v);
                        let after =
                            before.and_then(|b| functions.new_value(op, width, b, arg, arg2));
                        (addr, after)
                    }
                    _ => continue,
                };
                versions.entry(addr).or_default().push((pos, j, value));
            }
        }
        Self { versions }
    }

    /// The value of `addr` just before op `op` of the isochron at `pos` (0 if never written).
    fn value_at(&self, addr: Addr, pos: usize, op: usize) -> Option<u64> {
        let Some(v) = self.versions.get(&addr) else {
            return Some(0);
        };
        let n = v.partition_point(|&(p, j, _)| (p, j) < (pos, op));
        if n == 0 { Some(0) } else { v[n - 1].2 }
    }

    /// Positions `p` (isochron boundaries, "before isochron p") at which `addr` reads `value`,
    /// as half-open intervals.
    fn positions_with(&self, addr: Addr, value: u64, mask: u64) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        let v = self.versions.get(&addr).map_or(&[][..], Vec::as_slice);
        let mut start = 0usize;
        let mut current = Some(0u64);
        for &(p, _, next) in v {
            if current.map(|c| c & mask) == Some(value & mask) && p + 1 > start {
                out.push((start, p + 1));
            }
            start = p + 1;
            current = next;
        }
        if current.map(|c| c & mask) == Some(value & mask) {
            out.push((start, usize::MAX));
        }
        out
    }
}

fn check_isochron(
    r: &ExecRecord,
    i: usize,
    pos: usize,
    ctx: &mut Check<'_>,
    report: &mut OracleReport,
) {
    let history = ctx.history;
    let mut failed = false;
    let mut explain: Option<Vec<(usize, usize)>> = None;
    for (j, op) in r.ops.iter().enumerate() {
        let (addr, mask, value) = match *op {
            RecordedOp::Read { addr, mask, value } => (addr, mask, value),
            // A refused answer: the other copies ran it; the value it found is unknown.
            RecordedOp::Rmw {
                refused_by: Some(_),
                ..
            } => continue,
            RecordedOp::Rmw {
                addr, width, old, ..
            } => (addr, width.max_value(), old),
            _ => continue,
        };
        let Some(value) = value else {
            report.unresolved_reads += 1;
            continue;
        };
        report.reads_checked += 1;
        // A read after this isochron's own write of the same variable sees that write.
        // (A read after its own isochron's sched waits for that sched's assign.)
        let own = r.ops[..j]
            .iter()
            .enumerate()
            .rev()
            .find_map(|(k, o)| match *o {
                RecordedOp::Write { addr: a, value } if a == addr => Some(Some(value)),
                RecordedOp::Sched { addr: a } if a == addr => {
                    Some(ctx.resolved.get(&(i, k)).copied())
                }
                // The version this isochron's own read-modify-write made.
                RecordedOp::Rmw { addr: a, .. } if a == addr => {
                    Some(history.value_at(addr, pos, k + 1))
                }
                _ => None,
            });
        let expected = match own {
            Some(v) => v,
            None => history.value_at(addr, pos, j),
        };
        if expected.map(|e| e & mask) != Some(value & mask) {
            failed = true;
            if ctx.notes.len() < ctx.explain_max {
                ctx.notes.push(format!(
                    "host {} isochron {} at {:?}: read {addr} = {value:#x}, replay has {:?}",
                    r.host, r.index, r.key, expected
                ));
            }
        }
        if own.is_none() {
            let here = history.positions_with(addr, value, mask);
            explain = Some(match explain {
                None => here,
                Some(prev) => intersect(&prev, &here),
            });
        }
    }
    if failed {
        if explain.is_some_and(|e| e.is_empty()) {
            report.atomicity_violations += 1;
        } else {
            report.sc_violations += 1;
        }
    }
}

fn intersect(a: &[(usize, usize)], b: &[(usize, usize)]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for &(a0, a1) in a {
        for &(b0, b1) in b {
            let (lo, hi) = (a0.max(b0), a1.min(b1));
            if lo < hi {
                out.push((lo, hi));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(ts: u64, source: u16) -> Option<OrderKey> {
        Some(OrderKey {
            ts,
            source,
            sequum: 0,
            sub: 0,
        })
    }
    fn rec(host: u16, index: u64, k: Option<OrderKey>, ops: Vec<RecordedOp>) -> ExecRecord {
        ExecRecord {
            host,
            index,
            key: k,
            ops,
        }
    }
    fn w(slot: u32, value: u64) -> RecordedOp {
        RecordedOp::Write {
            addr: Addr::new(0, slot),
            value,
        }
    }
    fn r(slot: u32, value: u64) -> RecordedOp {
        RecordedOp::Read {
            addr: Addr::new(0, slot),
            mask: u64::MAX,
            value: Some(value),
        }
    }

    #[test]
    fn a_correct_history_is_clean() {
        let recs = vec![
            rec(0, 0, key(1, 0), vec![w(0, 5), w(1, 5)]),
            rec(1, 0, key(1, 1), vec![r(0, 5), r(1, 5)]),
            rec(1, 1, key(2, 1), vec![w(0, 6), r(0, 6)]),
        ];
        let rep = check(&recs);
        assert!(rep.clean(), "{rep:?}");
        assert_eq!(rep.reads_checked, 3);
    }

    #[test]
    fn a_stale_read_is_an_sc_violation() {
        let recs = vec![
            rec(0, 0, key(1, 0), vec![w(0, 5)]),
            rec(1, 0, key(2, 1), vec![r(0, 0)]),
        ];
        let rep = check(&recs);
        assert_eq!((rep.sc_violations, rep.atomicity_violations), (1, 0));
    }

    #[test]
    fn a_torn_read_is_an_atomicity_violation() {
        // Host 0 writes both slots twice; host 1 sees slot 0 old and slot 1 new.
        let recs = vec![
            rec(0, 0, key(1, 0), vec![w(0, 1), w(1, 1)]),
            rec(0, 1, key(3, 0), vec![w(0, 2), w(1, 2)]),
            rec(1, 0, key(2, 1), vec![r(0, 1), r(1, 2)]),
        ];
        let rep = check(&recs);
        assert_eq!(
            (rep.sc_violations, rep.atomicity_violations),
            (0, 1),
            "{rep:?}"
        );
    }

    #[test]
    fn program_order_and_unexecuted_are_counted() {
        let recs = vec![
            rec(0, 0, key(5, 0), vec![w(0, 1)]),
            rec(0, 1, key(4, 0), vec![w(0, 2)]),
            rec(0, 2, None, vec![w(0, 3)]),
        ];
        let rep = check(&recs);
        assert_eq!((rep.program_order_violations, rep.unexecuted), (1, 1));
    }

    #[test]
    fn reads_after_a_sched_see_the_assigned_value() {
        let a = Addr::new(0, 0);
        let recs = vec![
            rec(
                0,
                0,
                key(1, 0),
                vec![r(0, 0), RecordedOp::Sched { addr: a }],
            ),
            rec(1, 0, key(2, 1), vec![r(0, 7)]),
            rec(
                0,
                1,
                key(3, 0),
                vec![RecordedOp::Assign { addr: a, value: 7 }],
            ),
            rec(1, 1, key(4, 1), vec![r(0, 7)]),
        ];
        assert!(check(&recs).clean(), "{:?}", check(&recs));
    }
}
