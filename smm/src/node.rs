//! The SMM node: one host's shared memory manager, a state machine between the application
//! and its SIU. This file holds the node's state; each concept has its own file:
//!
//! * `isochron.rs`: what the application may put in an isochron, checked as it is added.
//! * `issue.rs`: splitting an isochron between this host's copies and srefs for other hosts,
//!   sched accounting, execution records.
//! * `hit_buffer.rs`: when this host's part of an isochron runs — at its isochron marker, or
//!   at once when purely local and nothing is outstanding.
//! * `drain.rs`: pulse buckets and their drain at the EOP marker, in (source, sequum) order.
//! * `execute.rs`: what one sref does to this host's copy, and message handlers.
//! * `reads.rs`: read handles, their answers and refusals.
//! * `signals.rs`: barriers and signals, delivered with the EOP marker.
//! * `wire.rs`: packets to and from the SIU (decoding input, encoding isochrons, replies).
//! * `stats.rs`: counters, and which counter an error lands in.
//! * `join.rs`: state transfer for a node that attaches while logical time runs.

use crate::map::{Addr, LocalMap};
use crate::memory::Memory;
use crate::{ExecRecord, SmmConfig, SmmStats};
use isotach_proto::packet::{BARRIERS, BufPool, IsotachMessage, SORT_VECTOR_MAX, Sref};
use isotach_proto::topology::HostId;
// Read ids, page numbers and addresses are small integers the node chose or validated: the
// hash needs speed (one lookup per sref and per read), not flooding resistance.
use rustc_hash::FxHashMap;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

mod drain;
mod execute;
mod hit_buffer;
mod isochron;
mod issue;
mod join;
mod reads;
mod signals;
mod stats;
mod wire;

use drain::Bucketed;
use execute::Handler;
pub use execute::HandlerCall;
use hit_buffer::{HitEntry, LocalOp};
pub use isochron::Isochron;
use isochron::Planned;
pub use join::{JoinReport, JoinStatus};
use reads::ReadSlot;
use signals::{BarrierState, SignalHandler};

/// Most lists of local operations kept for reuse ([`SmmNode`]'s `spare_local`): one per
/// isochron the hit buffer holds in steady state is plenty.
const LOCAL_OPS_SPARE_MAX: usize = 64;

/// One host's shared memory manager. See the crate documentation.
pub struct SmmNode {
    cfg: SmmConfig,
    /// Which hosts hold a copy of each page.
    map: LocalMap,
    /// This host's copies.
    memory: Memory,
    // Issue and the hit buffer (`issue.rs`, `hit_buffer.rs`).
    /// Id of the next isochron (echoed by its isochron marker).
    next_iso_id: u32,
    /// Isochrons issued, admissions included: picks each one's sequence set.
    issued: u64,
    /// Purely local isochrons run at once: orders them after everything drained.
    immediate: u64,
    /// This host's part of each issued isochron, waiting for its place in the order.
    hit: VecDeque<HitEntry>,
    /// Isochrons with a remote part whose marker has not been drained.
    markers_outstanding: u64,
    /// This host's unassigned scheds per variable, and their total.
    my_scheds: FxHashMap<Addr, u32>,
    my_scheds_total: usize,
    /// Execution records (when `record` is configured).
    records: Vec<ExecRecord>,
    // Buckets and the drain (`drain.rs`).
    /// Packets waiting for their pulse's EOP marker, by TS.
    buckets: BTreeMap<u64, Vec<Bucketed>>,
    /// Drained buckets, emptied, for the next pulses (at most `drain::SPARE_BUCKETS_MAX`):
    /// a steady stream of pulses allocates no bucket.
    spare_buckets: Vec<Vec<Bucketed>>,
    /// Packets in all buckets together (bounded by `bucket_packets_max`).
    bucket_packets: usize,
    /// The pulse of the last EOP marker drained.
    last_drained: u64,
    // Reads (`reads.rs`).
    /// Every read handle not yet taken.
    reads: FxHashMap<u32, ReadSlot>,
    /// Next read id to try.
    next_ref: u32,
    // Handlers, barriers and signals (`execute.rs`, `signals.rs`).
    handlers: HashMap<u16, Handler>,
    signal_handler: Option<SignalHandler>,
    barriers: [BarrierState; BARRIERS],
    /// A barrier or signal marker was sent: a restart of logical time voids it (`drain.rs`).
    sent_marker: bool,
    // The wire (`wire.rs`).
    /// Encoded packets for the SIU, in order.
    to_siu: VecDeque<Vec<u8>>,
    /// Reused by every drain: the execution order of a bucket (no allocation per sref).
    order: Vec<u32>,
    /// Reused by every reply: its payload, encoded before the packet around it.
    reply_payload: Vec<u8>,
    /// Buffers of packets the driver is done with, for the packets this node builds next
    /// ([`SmmNode::buffers`]).
    pool: BufPool,
    // Reused by every isochron issued (`isochron.rs`, `issue.rs`), so issuing allocates
    // nothing per isochron once they have grown.
    /// The planned operations' list of the last isochron ended, empty.
    spare_ops: Vec<Planned>,
    /// The remote srefs of the isochron being issued.
    remote_scratch: Vec<(HostId, Sref)>,
    /// Lists of local operations the hit buffer ran, empty, at most [`LOCAL_OPS_SPARE_MAX`].
    spare_local: Vec<Vec<LocalOp>>,
    // State transfer (`join.rs`).
    /// Pages not current yet (state transfer, [`SmmNode::join`]).
    joins: BTreeMap<u32, join::PageJoin>,
    /// Operations on catching-up pages after their admission, in order: (page, message).
    join_log: Vec<(u32, IsotachMessage)>,
    join: join::JoinState,
    /// Logical time restarted under this node: every later packet is refused.
    restarted: bool,
    stats: SmmStats,
}

impl std::fmt::Debug for SmmNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmmNode")
            .field("host", &self.cfg.host)
            .field("hit", &self.hit.len())
            .field("buckets", &self.buckets.len())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl SmmNode {
    /// A node for `cfg.host` with zeroed local copies of its pages, current from the start:
    /// for a node that starts together with logical time and every other copy (one process,
    /// the simulator). A node that attaches to running daemons calls [`SmmNode::join`].
    pub fn new(cfg: SmmConfig) -> Self {
        let map = LocalMap::new(Arc::clone(&cfg.map), Arc::clone(&cfg.topology), cfg.host);
        let memory = Memory::new(map.local_pages(), cfg.limits.slots_per_page);
        Self {
            map,
            memory,
            next_iso_id: 0,
            issued: 0,
            immediate: 0,
            hit: VecDeque::new(),
            markers_outstanding: 0,
            buckets: BTreeMap::new(),
            spare_buckets: Vec::new(),
            bucket_packets: 0,
            last_drained: 0,
            reads: FxHashMap::default(),
            next_ref: 0,
            my_scheds: FxHashMap::default(),
            my_scheds_total: 0,
            handlers: HashMap::new(),
            signal_handler: None,
            barriers: [BarrierState::default(); BARRIERS],
            sent_marker: false,
            to_siu: VecDeque::new(),
            records: Vec::new(),
            order: Vec::with_capacity(SORT_VECTOR_MAX),
            reply_payload: Vec::new(),
            pool: BufPool::default(),
            spare_ops: Vec::new(),
            remote_scratch: Vec::new(),
            spare_local: Vec::new(),
            joins: BTreeMap::new(),
            join_log: Vec::new(),
            join: join::JoinState::default(),
            restarted: false,
            stats: SmmStats::default(),
            cfg,
        }
    }

    /// The node's configuration.
    pub fn config(&self) -> &SmmConfig {
        &self.cfg
    }

    /// This host.
    pub fn host(&self) -> HostId {
        self.cfg.host
    }

    /// The pulse of the last EOP marker drained (0 before the first).
    pub fn last_pulse(&self) -> u64 {
        self.last_drained
    }

    /// Nothing is waiting: the hit buffer and the pulse buckets are empty, every read issued
    /// has resolved and nothing is queued for the SIU.
    pub fn is_idle(&self) -> bool {
        self.hit.is_empty()
            && self.joins.is_empty()
            && self.buckets.is_empty()
            && self.to_siu.is_empty()
            && self
                .reads
                .values()
                .all(|r| !matches!(r, ReadSlot::Waiting { .. }))
    }

    /// What keeps the node from being idle ([`SmmNode::is_idle`]), for a stall report: the
    /// tables' sizes, the oldest pulse bucket, the reads still waiting.
    pub fn busy_with(&self) -> String {
        let waiting = self
            .reads
            .values()
            .filter(|r| matches!(r, ReadSlot::Waiting { .. }))
            .count();
        format!(
            "hit {} joins {} buckets {} (oldest pulse {:?}, last drained {}) to_siu {} \
             reads_waiting {}",
            self.hit.len(),
            self.joins.len(),
            self.buckets.len(),
            self.buckets.keys().next(),
            self.last_drained,
            self.to_siu.len(),
            waiting
        )
    }

    /// Execution records (when `record` is configured).
    pub fn records(&self) -> &[ExecRecord] {
        &self.records
    }

    /// This host's copies: every non-zero or unsubstantiated slot as (addr, value, unsub).
    pub fn snapshot(&self) -> Vec<(Addr, u64, bool)> {
        self.memory.snapshot()
    }

    /// The value this host's copy of `addr` holds now, if it holds one.
    pub fn local_value(&self, addr: Addr) -> Option<u64> {
        self.memory.peek(addr)
    }
}

#[cfg(test)]
mod tests;
