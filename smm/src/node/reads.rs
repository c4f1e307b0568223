//! Reads: a handle per read issued, resolved by this host's copy or by a reply from the copy
//! that executed it, or refused by a copy that was not current. Also the answers this host
//! gives to reads it executed for others.

use super::SmmNode;
use crate::{ReadHandle, RecordedOp, SmmError, Table};
use isotach_proto::reply::HostReply;
use isotach_proto::topology::HostId;

/// State of a read handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ReadSlot {
    /// Issued; value not known yet. `record` locates it in the execution record.
    Waiting {
        record: Option<(usize, usize)>,
    },
    Ready(u64),
    /// The copy asked was not current (joining) or had no application: refused by this host.
    Refused(HostId),
}

impl SmmNode {
    /// The value of a read, if it resolved.
    pub fn read_value(&self, h: ReadHandle) -> Option<u64> {
        match self.reads.get(&h.0) {
            Some(ReadSlot::Ready(v)) => Some(*v),
            _ => None,
        }
    }

    /// Reads (and read-modify-write answers) settled so far: it changes whenever one more
    /// read resolved or was refused, so a waiter on many handles checks one number per
    /// packet and sweeps its handles only when it moved.
    pub fn reads_settled(&self) -> u64 {
        self.stats.reads_settled
    }

    /// The read resolved or was refused: [`SmmNode::take_read`] has its outcome.
    pub fn read_settled(&self, h: ReadHandle) -> bool {
        !matches!(self.reads.get(&h.0), Some(ReadSlot::Waiting { .. }))
    }

    /// Takes a resolved read's value and frees its handle. A read the copy holder refused
    /// (its copy was not current, or no application was attached there) is
    /// [`SmmError::ReadRefused`].
    pub fn take_read(&mut self, h: ReadHandle) -> Result<Option<u64>, SmmError> {
        let outcome = match self.reads.get(&h.0) {
            None => return Err(SmmError::UnknownRead),
            Some(ReadSlot::Waiting { .. }) => return Ok(None),
            Some(&ReadSlot::Ready(v)) => Ok(Some(v)),
            Some(&ReadSlot::Refused(host)) => Err(SmmError::ReadRefused { host }),
        };
        self.reads.remove(&h.0);
        self.stats.reads_outstanding = self.reads.len() as u64;
        outcome
    }

    /// Draws this node's read ids and join ids from `first` on. An application that replaces
    /// an earlier one on the same host (after a restart) starts where no answer to the earlier
    /// one's reads or copy requests can land: answers carry only the read id or join id (an
    /// earlier application's late page image taken as this one's would lack everything
    /// between the two cuts). Call before the first read and the join.
    pub fn start_read_ids_at(&mut self, first: u32) {
        assert!(
            self.reads.is_empty() && self.next_ref == 0,
            "read ids are chosen before the first read"
        );
        self.next_ref = first;
        self.start_join_ids_at(first);
    }

    /// A new read handle, waiting; refused at the table limit.
    pub(super) fn new_read(&mut self) -> Result<u32, SmmError> {
        if self.reads.len() >= self.cfg.limits.reads_max {
            return Err(SmmError::Limit(Table::Reads));
        }
        while self.reads.contains_key(&self.next_ref) {
            self.next_ref = self.next_ref.wrapping_add(1);
        }
        let id = self.next_ref;
        self.next_ref = self.next_ref.wrapping_add(1);
        self.reads.insert(id, ReadSlot::Waiting { record: None });
        let n = self.reads.len() as u64;
        self.stats.reads_outstanding = n;
        self.stats.reads_outstanding_max = self.stats.reads_outstanding_max.max(n);
        Ok(id)
    }

    /// A copy holder refused the read (its copy was not current, or no application there).
    pub(super) fn refuse_read(&mut self, ref_id: u32, host: HostId) -> Result<(), SmmError> {
        self.settle_read(ref_id, ReadSlot::Refused(host))?;
        self.stats.reads_refused += 1;
        Ok(())
    }

    /// The read's value arrived.
    pub(super) fn resolve_read(&mut self, ref_id: u32, value: u64) -> Result<(), SmmError> {
        self.settle_read(ref_id, ReadSlot::Ready(value))
    }

    /// A waiting read gets its outcome (a value or a refusal), in its slot and its record.
    fn settle_read(&mut self, ref_id: u32, outcome: ReadSlot) -> Result<(), SmmError> {
        let Some(slot) = self.reads.get_mut(&ref_id) else {
            self.stats.replies_unknown += 1;
            return Ok(());
        };
        let ReadSlot::Waiting { record } = *slot else {
            return Err(SmmError::BadInput(format!(
                "second answer for read {ref_id}"
            )));
        };
        *slot = outcome;
        self.stats.reads_settled += 1;
        let Some((r, op)) = record else {
            return Ok(());
        };
        match (self.records[r].ops.get_mut(op), outcome) {
            (Some(RecordedOp::Read { value, .. }), ReadSlot::Ready(v)) => *value = Some(v),
            (Some(rec @ RecordedOp::Read { .. }), ReadSlot::Refused(host)) => {
                if let RecordedOp::Read { addr, .. } = *rec {
                    *rec = RecordedOp::ReadRefused { addr, host };
                }
            }
            (Some(RecordedOp::Rmw { old, .. }), ReadSlot::Ready(v)) => *old = Some(v),
            (Some(RecordedOp::Rmw { refused_by, .. }), ReadSlot::Refused(host)) => {
                *refused_by = Some(host);
            }
            _ => {}
        }
        Ok(())
    }

    /// Answers a read: locally, or with a non-isotach message to the requester.
    pub(super) fn reply(&mut self, requester: HostId, ref_id: u32, value: u64) {
        if requester == self.cfg.host {
            let _ = self.resolve_read(ref_id, value);
            return;
        }
        self.send_reply(requester, &HostReply::ReadValue { ref_id, value });
    }
}
