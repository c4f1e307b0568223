//! The shared memory manager (SMM): the library applications link to run isochrons —
//! atomic groups of `read`, `write`, `sched`, `assign` and `message` operations on shared
//! variables — in one sequentially consistent order, over an SIU that keeps logical time.
//!
//! [`SmmNode`] is a sans-IO state machine, like the SIU and the token manager: the bytes its
//! SIU hands the host go in through [`SmmNode::handle_siu`], the bytes for the SIU come out of
//! [`SmmNode::poll_siu`]. It keeps the page table (copysets nearest first), the hit buffer of
//! isochrons awaiting their isochron marker, pulse buckets drained in sort-vector order at each
//! EOP marker, the read-pending list for unsubstantiated variables, barriers and signals.
//! `docs/smm.md` describes the map file, the sched/assign rule and the limits.

#![warn(missing_docs)]

#[cfg(feature = "daemon")]
pub mod am_link;
#[cfg(feature = "daemon")]
pub mod connect;
pub mod driver;
#[cfg(feature = "daemon")]
pub mod embedded;
pub mod map;
mod memory;
mod node;
pub mod oracle;
pub mod rmw;
pub mod testkit;

#[cfg(feature = "daemon")]
pub use connect::{AmLink, ConnectError, ConnectOptions, Pump, connect_shared};
pub use driver::{LinkError, SharedSmm, SiuLink, Smm, WaitError};
/// Read-modify-write operations (re-exported).
pub use isotach_proto::packet::RmwOp;
/// Variable widths (re-exported: an application needs nothing from the proto crate).
pub use isotach_proto::packet::Width;
/// Host ids (re-exported).
pub use isotach_proto::topology::HostId;
pub use map::{Addr, LocalMap, MapError, MemoryMap};
pub use node::{HandlerCall, Isochron, JoinReport, JoinStatus, SmmNode};
pub use rmw::{RmwFn, RmwFunctions};

use isotach_proto::topology::Topology;
use std::sync::Arc;
use thiserror::Error;

/// Where an operation sits in the global order: the isochron's timestamp, its source host, its
/// sequum, and for isochrons executed at another isochron's marker their place behind it.
/// Purely local isochrons executed at once use the source [`OrderKey::IMMEDIATE`], which sorts
/// after every host at the same timestamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct OrderKey {
    /// Pulse.
    pub ts: u64,
    /// Source host (or [`OrderKey::IMMEDIATE`]).
    pub source: u16,
    /// Sequum of the isochron's first message (or a per-host counter for immediate ones).
    pub sequum: u64,
    /// 0 for the isochron the marker names, 1, 2, … for local isochrons queued behind it.
    pub sub: u32,
}

impl OrderKey {
    /// Source of purely local isochrons that ran at once.
    pub const IMMEDIATE: u16 = u16::MAX;
}

/// Table limits of one SMM node. At a limit the caller gets [`SmmError::Limit`]; nothing
/// already accepted is dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SmmLimits {
    /// Variable slots per page.
    pub slots_per_page: u32,
    /// Operations in one isochron.
    pub isochron_ops_max: usize,
    /// Isochrons waiting in the hit buffer (issued, not yet executed).
    pub hit_buffer_max: usize,
    /// Reads issued and not yet taken by the application.
    pub reads_max: usize,
    /// This node's scheds not yet assigned.
    pub scheds_max: usize,
    /// Packets held in pulse buckets.
    pub bucket_packets_max: usize,
    /// Operations logged for pages catching up after a join (state transfer), all pages.
    pub join_log_max: usize,
}

impl Default for SmmLimits {
    fn default() -> Self {
        Self {
            slots_per_page: 1024,
            isochron_ops_max: 1024,
            hit_buffer_max: 4096,
            reads_max: 65_536,
            scheds_max: 4096,
            bucket_packets_max: 1 << 20,
            join_log_max: 1 << 18,
        }
    }
}

/// Configuration of one SMM node.
#[derive(Debug, Clone)]
pub struct SmmConfig {
    /// This host.
    pub host: HostId,
    /// Cluster topology (distances order copysets).
    pub topology: Arc<Topology>,
    /// Pages and copysets.
    pub map: Arc<MemoryMap>,
    /// Table limits.
    pub limits: SmmLimits,
    /// Keep an execution record of every isochron for the sequential-consistency oracle.
    pub record: bool,
}

/// Which table hit its limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Table {
    /// Operations in one isochron.
    IsochronOps,
    /// The hit buffer.
    HitBuffer,
    /// Outstanding reads.
    Reads,
    /// Unassigned scheds.
    Scheds,
    /// Pulse buckets.
    Buckets,
    /// Operations logged while pages catch up after a join.
    JoinLog,
}

/// Errors of the SMM API and of input from the SIU.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SmmError {
    /// No page of the map holds this address (or the slot is beyond the page).
    #[error("address {0} is not mapped")]
    Unmapped(Addr),
    /// An operation reached a host that holds no copy of the page (a stale copyset).
    #[error("this host holds no copy of the page of {0}")]
    NotACopy(Addr),
    /// An assign with no earlier unassigned sched of the same variable by the same host.
    #[error("assign to {0} without a matching sched")]
    AssignWithoutSched(Addr),
    /// A value wider than the variable.
    #[error("value {value:#x} does not fit a {bits}-bit variable")]
    ValueTooWide {
        /// The value.
        value: u64,
        /// The variable's width in bits.
        bits: u32,
    },
    /// A message payload over the wire limit.
    #[error("message payload of {len} bytes exceeds {max}")]
    MessageTooLong {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A message to a host outside the topology.
    #[error("host {0} does not exist")]
    NoSuchHost(HostId),
    /// A table is full: back-pressure; retry after draining.
    #[error("{0:?} limit reached")]
    Limit(Table),
    /// An empty isochron.
    #[error("an isochron needs at least one operation")]
    EmptyIsochron,
    /// A packet or EOP for a pulse already drained, or the SIU's reset EOP marker (the reset
    /// bit outside an epoch's end) after the node drained a pulse, issued an isochron or sent
    /// a barrier or signal marker: the SIU restarted logical time (a new generation;
    /// `docs/operations.md`, "Peer loss and restarts"). Shared memory does not survive a
    /// restart: restart the application. Every later packet is refused with it.
    #[error(
        "logical time restarted: pulse {ts} arrived after pulse {drained} was drained; \
         shared memory does not survive a restart, restart the application"
    )]
    Restarted {
        /// The pulse that arrived; 0 for the reset EOP itself (no pulse of the new generation
        /// has arrived yet).
        ts: u64,
        /// The last pulse drained: for the reset EOP, its own pulse (drained in part).
        drained: u64,
    },
    /// The link to the SIU broke (the SIU restarted, or the transport gave up on it): logical
    /// time restarts with it, and shared memory does not survive that.
    #[error(
        "logical time restarted: the link to the SIU broke ({reason}); shared memory does not \
         survive a restart, restart the application"
    )]
    SiuRestarted {
        /// What the link reported.
        reason: String,
    },
    /// A read handle that is unknown or already taken.
    #[error("unknown read handle")]
    UnknownRead,
    /// `apply` of a function this node has not registered ([`SmmNode::register_rmw`]).
    #[error("no read-modify-write function {0} is registered")]
    UnknownRmwFunction(u16),
    /// A barrier already in progress, or a count of zero.
    #[error("barrier {0}: already in progress or zero count")]
    Barrier(usize),
    /// The node is still getting current copies of its pages (state transfer after
    /// [`SmmNode::join`]), or its transfer failed ([`SmmNode::join_status`]); or `join` was
    /// called on a node that already issued isochrons or joined.
    #[error("this node's copies are not current yet (joining); wait for the join to finish")]
    Joining,
    /// The copy a read went to could not answer: that host's copy was not current (it is
    /// joining), or no application was attached there.
    #[error("host {host} refused the read: its copy is not current or no application is attached")]
    ReadRefused {
        /// The host asked.
        host: HostId,
    },
    /// Bytes from the SIU that do not decode or make no sense here.
    #[error("bad input from the SIU: {0}")]
    BadInput(String),
}

/// Counters and gauges of one node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SmmStats {
    /// Isochrons issued.
    pub isochrons_issued: u64,
    /// Isochrons whose local part ran (at their marker or at once).
    pub isochrons_executed: u64,
    /// Purely local isochrons that ran at once.
    pub isochrons_immediate: u64,
    /// Pulses drained (EOP markers handled).
    pub pulses_drained: u64,
    /// Drains ordered entirely by the SIU's sort vector.
    pub sorts_vector: u64,
    /// Drains with more packets than the vector: vector merged with a software sort.
    pub sorts_hybrid: u64,
    /// Drains sorted entirely in software (repeat EOPs, count mismatches).
    pub sorts_software: u64,
    /// Srefs executed from pulse buckets.
    pub srefs_executed: u64,
    /// Reads outstanding now.
    pub reads_outstanding: u64,
    /// Most reads outstanding at once.
    pub reads_outstanding_max: u64,
    /// Isochron markers outstanding now.
    pub markers_outstanding: u64,
    /// Most markers outstanding at once.
    pub markers_outstanding_max: u64,
    /// Reads waiting on unsubstantiated variables now / at most.
    pub read_pending: u64,
    /// Most reads ever waiting on unsubstantiated variables.
    pub read_pending_max: u64,
    /// Assigns with no matching sched (counted where they execute).
    pub assigns_without_sched: u64,
    /// Operations that reached a host holding no copy.
    pub not_a_copy: u64,
    /// EOP counts that disagreed with the bucket.
    pub count_mismatches: u64,
    /// Message srefs with no registered handler.
    pub unhandled_messages: u64,
    /// `apply` read-modify-writes of a function not registered at this copy (the variable
    /// kept its value; functions must be registered alike on every host).
    pub rmw_unknown_functions: u64,
    /// Other bad input from the SIU.
    pub bad_input: u64,
    /// Answers for reads this node has no open read for (ignored): replies carry no
    /// generation, so an answer to an earlier application's read — one that logical time's
    /// restart or the application's own restart ended — can arrive after it. Each node draws
    /// its read ids from its own range ([`SmmNode::start_read_ids_at`]) so such an answer
    /// never resolves a newer read.
    pub replies_unknown: u64,
    /// Barriers completed.
    pub barriers_completed: u64,
    /// Packets `handle_siu` refused for a table limit (the driver holds and retries them).
    pub refused: u64,
    /// Reads the copy holder refused (not current there, or no application attached).
    pub reads_refused: u64,
    /// Reads and read-modify-write answers that got their outcome (a value or a refusal):
    /// a waiter polls this to learn that something settled without checking every handle.
    pub reads_settled: u64,
    /// Reads, copy requests and other operations that reached a copy not yet current here
    /// (before this node's admission): refused or discarded.
    pub refused_not_current: u64,
    /// Page images sent to joining nodes.
    pub images_sent: u64,
    /// Times this node asked again for pages whose answers did not all come
    /// ([`SmmNode::retry_join`]).
    pub join_retries: u64,
    /// Answers to an admission that was asked again since (ignored).
    pub stale_replies: u64,
    /// EOPs of pulses before this node's admission whose bucket was incomplete (the node
    /// attached mid-pulse; not a count mismatch).
    pub partial_pulses: u64,
}

/// Handle of a read issued in an isochron; resolves to the value read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReadHandle(u32);

/// One operation of an executed isochron, as the oracle sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordedOp {
    /// A read and the value it returned (`None` until it resolves).
    Read {
        /// Address.
        addr: Addr,
        /// Mask of the width read.
        mask: u64,
        /// Value returned.
        value: Option<u64>,
    },
    /// A write.
    Write {
        /// Address.
        addr: Addr,
        /// Value stored (narrowed to the width).
        value: u64,
    },
    /// A sched.
    Sched {
        /// Address.
        addr: Addr,
    },
    /// A read the copy holder refused (see [`SmmError::ReadRefused`]).
    ReadRefused {
        /// Address.
        addr: Addr,
        /// The host that refused.
        host: HostId,
    },
    /// An assign.
    Assign {
        /// Address.
        addr: Addr,
        /// Value assigned (narrowed to the width).
        value: u64,
    },
    /// A read-modify-write and the value it found (`None` until it is answered).
    Rmw {
        /// Address.
        addr: Addr,
        /// What it does.
        op: RmwOp,
        /// Its width.
        width: Width,
        /// Its argument.
        arg: u64,
        /// Its second argument (compare-and-swap's new value).
        arg2: u64,
        /// The value it found.
        old: Option<u64>,
        /// The host that refused to answer (no application was attached there): the other
        /// copies ran it, but the value it found is unknown.
        refused_by: Option<HostId>,
    },
}

/// An isochron as executed, for the sequential-consistency oracle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecRecord {
    /// Issuing host.
    pub host: HostId,
    /// Position in the host's program order (0, 1, 2, …).
    pub index: u64,
    /// Where it executed in the global order (`None` until its local part ran).
    pub key: Option<OrderKey>,
    /// Its memory operations in program order.
    pub ops: Vec<RecordedOp>,
}
