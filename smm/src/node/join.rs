//! State transfer in logical time: how a node that starts while logical time runs gets a
//! current copy of every page it holds (`docs/design.md`, "Joining late or after a restart").
//!
//! [`SmmNode::join`] issues admission isochrons: one copy request per page and other holder.
//! Until a page's admission executes here (its isochron marker), the copy is *waiting*:
//! operations on it are discarded (the image will contain them) and reads and copy requests
//! sent to it are refused. From the admission on the page is *catching up*: its operations are
//! logged, not executed. Each holder answers the copy request at its place in the order: with
//! an image cut there (current copy), by logging it (catching up itself, answered by replay)
//! or with a refusal (waiting, or no application attached — the SIU answers then). The first
//! complete image is installed and the log replayed on top; when every holder refused, no
//! current copy existed at the admission and the page starts empty — reported, never hidden.

use super::SmmNode;
use super::hit_buffer::LocalOp;
use crate::map::Addr;
use crate::{SmmError, Table};
use isotach_proto::packet::{IsotachMessage, Sref, SrefOp, Width};
use isotach_proto::reply::{self, HostReply, ImageEntry};
use isotach_proto::topology::HostId;

/// Where a node's state transfer stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JoinStatus {
    /// Every page this node holds is current.
    Current,
    /// Pages are still waiting for their image.
    Joining {
        /// Pages not yet current.
        pages_waiting: usize,
    },
    /// The transfer failed; the waiting pages never become current. Restart the application.
    Failed(SmmError),
}

/// What a finished state transfer found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JoinReport {
    /// Pages installed from another holder's image.
    pub pages_recovered: Vec<u32>,
    /// Pages no other holder had a current copy of at the admission: they start empty. On a
    /// fresh cluster that is every page of the first application to join; after applications
    /// restarted it means their contents were lost with the last copy.
    pub pages_started_empty: Vec<u32>,
}

/// One page's transfer.
#[derive(Debug, Default)]
pub(super) struct PageJoin {
    /// The admission round the page's copy requests carry (answers name it).
    join_id: u32,
    /// Our admission executed: operations from here on are logged, not discarded.
    admitted: bool,
    /// Other holders that have not answered yet.
    holders_left: Vec<HostId>,
    /// The image being received, from the first holder that sent one.
    image: Option<Assembly>,
}

/// Chunks of one holder's image.
#[derive(Debug)]
struct Assembly {
    from: HostId,
    chunks: Vec<Option<Vec<ImageEntry>>>,
    received: usize,
}

impl Assembly {
    fn complete(&self) -> bool {
        self.received == self.chunks.len()
    }
}

/// The node's transfer: its id (echoed by holders) and what it found so far.
#[derive(Debug, Default)]
pub(super) struct JoinState {
    id: u32,
    /// Started and not finished.
    active: bool,
    /// The pulse of the first admission marker executed (pulses before it may reach a new
    /// node only in part: their EOP counts are not compared).
    admitted_ts: Option<u64>,
    report: Option<JoinReport>,
    failed: Option<SmmError>,
    /// Oracle self-test: install images without replaying the log (must be caught).
    skip_replay: bool,
}

impl SmmNode {
    /// Starts the state transfer of a node that starts while logical time runs: admission
    /// isochrons with one copy request per page and other holder. Until it completes
    /// ([`SmmNode::join_status`]) isochrons are refused with [`SmmError::Joining`]. Only a
    /// node that has issued nothing may join.
    pub fn join(&mut self) -> Result<(), SmmError> {
        if self.join.active || self.issued > 0 || self.join.report.is_some() {
            return Err(SmmError::Joining);
        }
        self.join.active = true;
        self.join.report = Some(JoinReport::default());
        let pages: Vec<u32> = self.map.local_pages().collect();
        self.admit_pages(pages);
        Ok(())
    }

    /// Asks again for the pages whose admission ran but whose answers have not all come: an
    /// answer can be lost with an application that went away before the SIU noticed. Their
    /// logs are dropped (a new admission cuts a new image, which contains everything logged),
    /// and the copy requests and reads logged for them are refused now: under the new
    /// admission this copy was not current at their places. Returns the pages asked again.
    /// [`crate::Smm::join`] calls it when a join makes no progress for a while.
    pub fn retry_join(&mut self) -> usize {
        if self.join.failed.is_some() {
            return 0;
        }
        let stuck: Vec<u32> = self
            .joins
            .iter()
            .filter(|(_, j)| j.admitted)
            .map(|(&p, _)| p)
            .collect();
        if stuck.is_empty() {
            return 0;
        }
        let log = std::mem::take(&mut self.join_log);
        let (dropped, kept): (Vec<_>, Vec<_>) =
            log.into_iter().partition(|(p, _)| stuck.contains(p));
        self.join_log = kept;
        for (_, m) in dropped {
            self.refuse_not_current(&m);
        }
        for p in &stuck {
            self.joins.remove(p);
        }
        self.stats.join_retries += 1;
        let n = stuck.len();
        self.admit_pages(stuck);
        n
    }

    /// Join ids continue from `first` (see [`SmmNode::start_read_ids_at`]).
    pub(super) fn start_join_ids_at(&mut self, first: u32) {
        assert!(self.joins.is_empty(), "join ids are chosen before the join");
        self.join.id = first;
    }

    /// Issues admission isochrons for `pages` under a new join id.
    fn admit_pages(&mut self, pages: Vec<u32>) {
        self.join.id = self.join.id.wrapping_add(1);
        let me = self.cfg.host;
        let ops_max = self.cfg.limits.isochron_ops_max.max(1);
        let mut local = Vec::new();
        let mut remote: Vec<(HostId, Sref)> = Vec::new();
        for page in pages {
            let others: Vec<HostId> = self
                .map
                .copyset(page)
                .as_deref()
                .unwrap_or(&[])
                .iter()
                .copied()
                .filter(|&h| h != me)
                .collect();
            if !remote.is_empty() && remote.len() + others.len() > ops_max {
                self.enqueue_admission(std::mem::take(&mut local), std::mem::take(&mut remote));
            }
            for &h in &others {
                remote.push((h, self.copy_request(page)));
            }
            self.joins.insert(
                page,
                PageJoin {
                    join_id: self.join.id,
                    holders_left: others,
                    ..PageJoin::default()
                },
            );
            local.push(LocalOp::Admit(page));
        }
        self.enqueue_admission(local, remote);
        self.finish_join_if_done();
    }

    /// Where the state transfer stands.
    pub fn join_status(&self) -> JoinStatus {
        if let Some(e) = &self.join.failed {
            return JoinStatus::Failed(e.clone());
        }
        if self.joins.is_empty() {
            JoinStatus::Current
        } else {
            JoinStatus::Joining {
                pages_waiting: self.joins.len(),
            }
        }
    }

    /// What the finished (or running) state transfer found; `None` if the node never joined.
    pub fn join_report(&self) -> Option<&JoinReport> {
        self.join.report.as_ref()
    }

    /// Oracle self-test only: install images without replaying the operations logged after
    /// the admission. The simulator's `--break-transfer` uses it to show the oracle catches a
    /// broken transfer; never use it otherwise.
    #[doc(hidden)]
    pub fn break_transfer_skip_replay(&mut self) {
        self.join.skip_replay = true;
    }

    /// Isochrons are refused while pages are not current.
    pub(super) fn check_not_joining(&self) -> Result<(), SmmError> {
        if self.join.failed.is_some() || !self.joins.is_empty() {
            return Err(SmmError::Joining);
        }
        Ok(())
    }

    /// Whether an EOP for pulse `ts` may find its bucket incomplete: the node attached in the
    /// middle of logical time and the pulse precedes its admission.
    pub(super) fn partial_pulse(&self, ts: u64) -> bool {
        self.join.report.is_some() && self.join.admitted_ts.is_none_or(|a| ts < a)
    }

    fn copy_request(&self, page: u32) -> Sref {
        Sref::Mem {
            op: SrefOp::Copy,
            width: Width::W64,
            addr: Addr::new(page, 0).raw(),
            value: 0,
            ref_id: self.join.id,
        }
    }

    /// Our admission executed at `ts`: the page's operations are logged from here on.
    pub(super) fn admit(&mut self, page: u32, ts: u64) {
        self.join.admitted_ts.get_or_insert(ts);
        if let Some(j) = self.joins.get_mut(&page) {
            j.admitted = true;
        }
        self.try_complete(page);
    }

    /// An operation on a page that is not current. Returns false when the page is current
    /// (execute the operation normally).
    pub(super) fn intercept(&mut self, m: &IsotachMessage) -> bool {
        // Every page current (the common case): one branch on the drain's hot path.
        if self.joins.is_empty() {
            return false;
        }
        let Some(addr) = m.sref.addr() else {
            return false;
        };
        let page = Addr::from_raw(addr).page();
        let Some(j) = self.joins.get(&page) else {
            return false;
        };
        if j.admitted && self.join.failed.is_none() {
            if self.join_log.len() >= self.cfg.limits.join_log_max {
                self.fail_join(SmmError::Limit(Table::JoinLog));
            } else {
                self.join_log.push((page, m.clone()));
                return true;
            }
        }
        self.refuse_not_current(m);
        true
    }

    /// Answers a read, a read-modify-write it was to answer or a copy request that reached
    /// this copy where it is not current with a refusal; other operations are dropped (an
    /// image will contain them).
    fn refuse_not_current(&mut self, m: &IsotachMessage) {
        if m.sref.addr().is_none() {
            return; // a handler message: nothing of a page
        }
        self.stats.refused_not_current += 1;
        if let Some(answer) = HostReply::refusal(&m.sref, false) {
            self.send_reply(m.source, &answer);
        }
    }

    fn fail_join(&mut self, e: SmmError) {
        self.join.failed.get_or_insert(e);
        self.join_log.clear();
    }

    /// A holder's answer to our copy request.
    pub(super) fn join_reply(&mut self, source: HostId, r: &HostReply<'_>) -> Result<(), SmmError> {
        let (HostReply::CopyRefused { page, join_id, .. }
        | HostReply::PageImage { page, join_id, .. }) = *r
        else {
            return Ok(());
        };
        let Some(j) = self.joins.get_mut(&page) else {
            // Answers after the page completed (a second holder's image): nothing to do.
            return Ok(());
        };
        if join_id != j.join_id {
            // An answer to an admission asked again since: the new one's answers count.
            self.stats.stale_replies += 1;
            return Ok(());
        }
        j.holders_left.retain(|&h| h != source);
        if let HostReply::PageImage {
            chunk,
            chunks,
            entries,
            ..
        } = *r
        {
            let entries = ImageEntry::decode_all(entries)
                .map_err(|e| SmmError::BadInput(format!("page {page} image: {e}")))?;
            let a = j.image.get_or_insert_with(|| Assembly {
                from: source,
                chunks: vec![None; usize::from(chunks)],
                received: 0,
            });
            if a.from == source
                && a.chunks.len() == usize::from(chunks)
                && let Some(slot) = a.chunks.get_mut(usize::from(chunk))
                && slot.is_none()
            {
                *slot = Some(entries);
                a.received += 1;
            }
        }
        self.try_complete(page);
        Ok(())
    }

    /// Installs the page once admitted and either an image is complete or every holder
    /// refused, replays its log and reports it.
    fn try_complete(&mut self, page: u32) {
        let Some(j) = self.joins.get(&page) else {
            return;
        };
        let image_ready = j.image.as_ref().is_some_and(Assembly::complete);
        let none_current = j.image.is_none() && j.holders_left.is_empty();
        if !j.admitted || self.join.failed.is_some() || !(image_ready || none_current) {
            return;
        }
        let j = self.joins.remove(&page).expect("checked above");
        let entries: Vec<ImageEntry> = j
            .image
            .map(|a| a.chunks.into_iter().flatten().flatten().collect())
            .unwrap_or_default();
        if let Err(e) = self.memory.install(page, &entries) {
            self.fail_join(e);
            return;
        }
        if let Some(report) = self.join.report.as_mut() {
            if image_ready {
                report.pages_recovered.push(page);
            } else {
                report.pages_started_empty.push(page);
            }
        }
        let log = std::mem::take(&mut self.join_log);
        let (mine, rest): (Vec<_>, Vec<_>) = log.into_iter().partition(|(p, _)| *p == page);
        self.join_log = rest;
        if !self.join.skip_replay {
            for (_, m) in mine {
                self.execute_message(m.ts.get(), &m);
            }
        }
        self.finish_join_if_done();
    }

    fn finish_join_if_done(&mut self) {
        if self.joins.is_empty() && self.join.active {
            self.join.active = false;
            debug_assert!(self.join_log.is_empty(), "every logged op replayed");
        }
    }

    /// Answers a copy request at its place in the order with this (current) copy's image.
    pub(super) fn send_image(&mut self, page: u32, requester: HostId, join_id: u32) {
        let image = self.memory.image(page);
        let Some(chunks) = reply::image_chunks(&image) else {
            // More scheds on one variable than a chunk holds: the joiner times out.
            self.stats.bad_input += 1;
            return;
        };
        let n = chunks.len() as u16;
        for (i, body) in chunks.iter().enumerate() {
            let r = HostReply::PageImage {
                page,
                join_id,
                chunk: i as u16,
                chunks: n,
                entries: body,
            };
            self.send_reply(requester, &r);
        }
        self.stats.images_sent += 1;
    }
}
