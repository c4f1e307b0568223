//! The sequential-consistency oracle across restarts of logical time. Shared memory does not
//! survive a restart (`docs/operations.md`, "Peer loss and restarts"): every application ends
//! and a new one starts on empty memory in the new generation. So each *era* — the nodes whose
//! pulses ran in one generation — is replayed on its own, from empty memory.
//!
//! What a restart may discard, and only that, is excused: in an era that a restart ended, the
//! pulse each host's reset cut short and everything after it (the smallest such pulse over the
//! era's hosts: before it every host drained every pulse whole, so the replay of what came
//! before is exact), isochrons issued that never executed before that pulse, and reads that
//! never resolved. Everything else — every read of every isochron executed before the cut,
//! atomicity, program order — is checked as strictly as without restarts, and the era that
//! runs at the end of the run is checked in full.

use isotach_smm::ExecRecord;
use isotach_smm::oracle::{self, OracleReport};
use std::collections::BTreeMap;

/// One node's part in the check.
#[derive(Debug)]
pub(crate) struct NodeRecords {
    /// The generation its pulses ran in (`None`: it drained none).
    pub(crate) era: Option<u32>,
    /// `Some(pulse)` when a restart ended it: its records from that pulse on prove nothing.
    pub(crate) cut_ts: Option<u64>,
    /// What it executed.
    pub(crate) records: Vec<ExecRecord>,
}

/// What the check of every era found.
#[derive(Debug, Default)]
pub(crate) struct EraReport {
    /// Violations and counts, summed over the eras (`unexecuted` and `unresolved_reads` only
    /// where no restart excuses them).
    pub(crate) oracle: OracleReport,
    /// Eras (generations) checked.
    pub(crate) eras: u64,
    /// Isochrons a restart discarded: issued and not executed before their era's cut.
    pub(crate) discarded_isochrons: u64,
    /// Reads a restart left unresolved.
    pub(crate) discarded_reads: u64,
    /// Descriptions of the first failing reads.
    pub(crate) notes: Vec<String>,
}

/// Checks every era of the run on its own.
pub(crate) fn check(nodes: Vec<NodeRecords>, explain_max: usize) -> EraReport {
    let mut report = EraReport::default();
    let mut eras: BTreeMap<Option<u32>, Vec<NodeRecords>> = BTreeMap::new();
    for n in nodes {
        eras.entry(n.era).or_default().push(n);
    }
    for (era, nodes) in eras {
        let cut_ts = nodes.iter().filter_map(|n| n.cut_ts).min();
        let ended = cut_ts.is_some();
        if era.is_none() && nodes.iter().all(|n| n.cut_ts.is_some()) {
            // Nodes that ended before they drained a pulse: everything they issued was
            // discarded with them.
            report.discarded_isochrons += nodes.iter().map(|n| n.records.len() as u64).sum::<u64>();
            continue;
        }
        let mut records: Vec<ExecRecord> = nodes.into_iter().flat_map(|n| n.records).collect();
        if let Some(cut) = cut_ts {
            for r in &mut records {
                if r.key.is_some_and(|k| k.ts >= cut) {
                    r.key = None;
                }
            }
        }
        let (o, notes) =
            oracle::check_with_functions(&records, explain_max, &crate::smm_host::rmw_functions());
        report.eras += 1;
        let sum = &mut report.oracle;
        sum.isochrons += o.isochrons;
        sum.reads_checked += o.reads_checked;
        sum.sc_violations += o.sc_violations;
        sum.atomicity_violations += o.atomicity_violations;
        sum.program_order_violations += o.program_order_violations;
        if ended {
            report.discarded_isochrons += o.unexecuted;
            report.discarded_reads += o.unresolved_reads;
        } else {
            sum.unexecuted += o.unexecuted;
            sum.unresolved_reads += o.unresolved_reads;
        }
        report
            .notes
            .extend(notes.into_iter().map(|n| format!("era {era:?}: {n}")));
    }
    report
}
