//! The SMM node: isochron issue, the hit buffer, pulse buckets and their drain.

use crate::map::{Addr, LocalMap};
use crate::memory::{Memory, ReadOutcome, Released};
use crate::{ExecRecord, OrderKey, ReadHandle, RecordedOp, SmmConfig, SmmError, SmmStats, Table};
use isotach_proto::packet::{
    self, BARRIERS, BarrierSignalMarker, EndOfIsochron, EopMarker, IsochronMarker, IsotachMessage,
    Kind, MSG_PAYLOAD_MAX, PlainMessage, SORT_VECTOR_MAX, Sref, SrefOp, StartOfIsochron, Width,
};
use isotach_proto::reply::HostReply;
use isotach_proto::topology::{HostId, Topology};
use std::collections::{BTreeMap, HashMap, VecDeque};

mod join;
pub use join::{JoinReport, JoinStatus};

/// What a message handler is told.
#[derive(Debug)]
pub struct HandlerCall<'a> {
    /// The host that sent the message.
    pub source: HostId,
    /// The pulse it executes in.
    pub ts: u64,
    /// Its payload.
    pub payload: &'a [u8],
}

type Handler = Box<dyn FnMut(&HandlerCall<'_>) + Send>;
type SignalHandler = Box<dyn FnMut(u8, u64) + Send>;

/// An operation as the application asked for it.
#[derive(Debug, Clone)]
enum Planned {
    Read(Addr, Width, u32),
    Write(Addr, Width, u64),
    Sched(Addr),
    Assign(Addr, Width, u64),
    Message(HostId, u16, Vec<u8>),
}

/// An operation this host executes itself.
#[derive(Debug, Clone)]
enum LocalOp {
    Read(Addr, Width, u32),
    Write(Addr, Width, u64),
    Sched(Addr),
    Assign(Addr, Width, u64),
    Message(u16, Vec<u8>),
    /// A join's admission of a page (state transfer): operations on it are logged from here.
    Admit(u32),
}

/// An issued isochron waiting in the hit buffer.
#[derive(Debug)]
struct HitEntry {
    iso_id: u32,
    /// Has a remote part, so an isochron marker will come back for it.
    remote: bool,
    ops: Vec<LocalOp>,
    record: Option<usize>,
    /// A join's admission isochron (not the application's: not counted in the stats).
    admission: bool,
}

/// A packet in a pulse bucket.
#[derive(Debug)]
enum Bucketed {
    Message(IsotachMessage),
    Marker(IsochronMarker),
}

impl Bucketed {
    fn sort_key(&self) -> (u16, u64) {
        match self {
            Self::Message(m) => (m.source, m.sequum),
            Self::Marker(k) => (k.source, k.sequum),
        }
    }
}

/// State of a read handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReadSlot {
    /// Issued; value not known yet. `record` locates it in the execution record.
    Waiting {
        record: Option<(usize, usize)>,
    },
    Ready(u64),
    /// The copy asked was not current (joining) or had no application: refused by this host.
    Refused(HostId),
}

#[derive(Debug, Clone, Copy, Default)]
struct BarrierState {
    in_progress: bool,
    completed: u64,
}

/// One host's shared memory manager. See the crate documentation.
pub struct SmmNode {
    cfg: SmmConfig,
    map: LocalMap,
    memory: Memory,
    next_iso_id: u32,
    issued: u64,
    immediate: u64,
    hit: VecDeque<HitEntry>,
    markers_outstanding: u64,
    buckets: BTreeMap<u64, Vec<Bucketed>>,
    bucket_packets: usize,
    last_drained: u64,
    reads: HashMap<u32, ReadSlot>,
    next_ref: u32,
    my_scheds: HashMap<Addr, u32>,
    my_scheds_total: usize,
    handlers: HashMap<u16, Handler>,
    signal_handler: Option<SignalHandler>,
    barriers: [BarrierState; BARRIERS],
    to_siu: VecDeque<Vec<u8>>,
    records: Vec<ExecRecord>,
    /// Reused by every drain: the execution order of a bucket (no allocation per sref).
    order: Vec<u32>,
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

/// An isochron being built. Operations are checked as they are added; [`Isochron::end`]
/// issues it. Dropping it without `end` abandons it.
#[derive(Debug)]
pub struct Isochron<'a> {
    node: &'a mut SmmNode,
    ops: Vec<Planned>,
    ended: bool,
}

impl SmmNode {
    /// A node for `cfg.host` with zeroed local copies of its pages, current from the start:
    /// for a node that starts together with logical time and every other copy (one process,
    /// the simulator). A node that attaches to running daemons calls [`SmmNode::join`].
    pub fn new(cfg: SmmConfig) -> Self {
        let map = LocalMap::new(&cfg.map, &cfg.topology, cfg.host);
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
            bucket_packets: 0,
            last_drained: 0,
            reads: HashMap::new(),
            next_ref: 0,
            my_scheds: HashMap::new(),
            my_scheds_total: 0,
            handlers: HashMap::new(),
            signal_handler: None,
            barriers: [BarrierState::default(); BARRIERS],
            to_siu: VecDeque::new(),
            records: Vec::new(),
            order: Vec::with_capacity(SORT_VECTOR_MAX),
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

    /// Counters and gauges.
    pub fn stats(&self) -> SmmStats {
        let mut s = self.stats;
        let (now, max) = self.memory.read_pending();
        s.read_pending = now as u64;
        s.read_pending_max = max as u64;
        s.markers_outstanding = self.markers_outstanding;
        s
    }

    /// Starts an isochron.
    pub fn isochron(&mut self) -> Isochron<'_> {
        Isochron {
            node: self,
            ops: Vec::new(),
            ended: false,
        }
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

    /// Packets are waiting for the SIU.
    pub fn has_output(&self) -> bool {
        !self.to_siu.is_empty()
    }

    /// Next packet for the SIU.
    pub fn poll_siu(&mut self) -> Option<Vec<u8>> {
        self.to_siu.pop_front()
    }

    /// The value of a read, if it resolved.
    pub fn read_value(&self, h: ReadHandle) -> Option<u64> {
        match self.reads.get(&h.0) {
            Some(ReadSlot::Ready(v)) => Some(*v),
            _ => None,
        }
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

    /// Registers the handler run by `message` srefs naming `handler`, at their place in the
    /// order.
    pub fn register_handler(
        &mut self,
        handler: u16,
        f: impl FnMut(&HandlerCall<'_>) + Send + 'static,
    ) {
        self.handlers.insert(handler, Box::new(f));
    }

    /// Registers the handler of delivered signals: called with the signal bits (bit 8 set for
    /// the reset signal, i.e. the value is `signals | 0x100` shifted into a u8 pair — see
    /// [`SmmNode::RESET_SIGNAL`]) and the pulse.
    pub fn register_signal_handler(&mut self, f: impl FnMut(u8, u64) + Send + 'static) {
        self.signal_handler = Some(Box::new(f));
    }

    /// Reported to the signal handler in place of the bits when the reset signal arrives.
    pub const RESET_SIGNAL: u8 = 0;

    /// Raises application signals; every host's signal handler sees them at the same pulse.
    pub fn raise_signals(&mut self, signals: u8) {
        self.push_marker(BarrierSignalMarker {
            signals,
            ..BarrierSignalMarker::default()
        });
    }

    /// Raises the reset signal.
    pub fn send_reset_signal(&mut self) {
        self.push_marker(BarrierSignalMarker {
            reset: true,
            ..BarrierSignalMarker::default()
        });
    }

    /// Enters barrier `barrier` (0 or 1) for `count` rounds; it completes when the SIU
    /// delivers an EOP marker with that barrier bit. Every host must use the same count.
    pub fn barrier_start(&mut self, barrier: usize, count: u32) -> Result<(), SmmError> {
        let state = self
            .barriers
            .get_mut(barrier)
            .ok_or(SmmError::Barrier(barrier))?;
        if state.in_progress || count == 0 {
            return Err(SmmError::Barrier(barrier));
        }
        state.in_progress = true;
        self.push_marker(BarrierSignalMarker {
            barrier: 1 << barrier,
            barrier_count: count,
            ..BarrierSignalMarker::default()
        });
        Ok(())
    }

    /// Whether barrier `barrier` is free (never started, or its last round completed).
    pub fn barrier_done(&self, barrier: usize) -> bool {
        self.barriers.get(barrier).is_some_and(|b| !b.in_progress)
    }

    /// Barriers of kind `barrier` completed so far.
    pub fn barriers_completed(&self, barrier: usize) -> u64 {
        self.barriers.get(barrier).map_or(0, |b| b.completed)
    }

    fn push_marker(&mut self, m: BarrierSignalMarker) {
        let mut out = Vec::with_capacity(packet::BSM_LEN);
        m.encode(&mut out);
        self.to_siu.push_back(out);
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

    // ---------------------------------------------------------------------------------------
    // Input from the SIU

    /// Handles one packet from the SIU: an isotach message, an isochron marker, an EOP marker
    /// or a non-isotach message (read replies).
    pub fn handle_siu(&mut self, bytes: &[u8]) -> Result<(), SmmError> {
        let r = self.siu_input(bytes);
        match &r {
            Err(SmmError::BadInput(_)) => self.stats.bad_input += 1,
            Err(SmmError::Limit(_)) => self.stats.refused += 1,
            _ => {}
        }
        r
    }

    fn siu_input(&mut self, bytes: &[u8]) -> Result<(), SmmError> {
        let bad = |e: packet::DecodeError| SmmError::BadInput(e.to_string());
        match packet::peek_kind(bytes).map_err(bad)? {
            Kind::IsotachMessage => {
                let m = IsotachMessage::decode(bytes).map_err(bad)?;
                self.bucket(m.ts, Bucketed::Message(m))
            }
            Kind::IsochronMarker => {
                let k = IsochronMarker::decode(bytes).map_err(bad)?;
                if k.source != self.cfg.host {
                    return Err(SmmError::BadInput(format!("marker from host {}", k.source)));
                }
                self.bucket(k.ts, Bucketed::Marker(k))
            }
            Kind::EopMarker => {
                let e = EopMarker::decode(bytes).map_err(bad)?;
                self.check_not_drained(e.ts)?;
                let had_state = self.stats.pulses_drained > 0 || self.issued > 0;
                self.drain(&e);
                // A reset bit outside an epoch's end is a restart of logical time (the reset
                // *signal* reaches hosts only on an epoch's last wave).
                if e.reset && !e.end_of_epoch && !e.repeat && had_state {
                    self.restarted = true;
                    return Err(SmmError::Restarted {
                        ts: 0,
                        drained: e.ts,
                    });
                }
                Ok(())
            }
            Kind::Plain => {
                let p = PlainMessage::decode(bytes).map_err(bad)?;
                self.plain(&p)
            }
            kind => Err(SmmError::BadInput(format!("{kind:?} from the SIU"))),
        }
    }

    fn bucket(&mut self, ts: u64, b: Bucketed) -> Result<(), SmmError> {
        if self.bucket_packets >= self.cfg.limits.bucket_packets_max {
            return Err(SmmError::Limit(Table::Buckets));
        }
        self.check_not_drained(ts)?;
        self.buckets.entry(ts).or_default().push(b);
        self.bucket_packets += 1;
        Ok(())
    }

    /// Pulses only move forward within a generation; one that went back means the SIU
    /// restarted logical time.
    fn check_not_drained(&self, ts: u64) -> Result<(), SmmError> {
        if self.restarted || (ts < self.last_drained && self.stats.pulses_drained > 0) {
            return Err(SmmError::Restarted {
                ts,
                drained: self.last_drained,
            });
        }
        Ok(())
    }

    fn plain(&mut self, p: &PlainMessage) -> Result<(), SmmError> {
        let r = HostReply::decode(&p.payload)
            .map_err(|e| SmmError::BadInput(format!("non-isotach payload: {e}")))?;
        match r {
            HostReply::ReadValue { ref_id, value } => self.resolve_read(ref_id, value),
            HostReply::ReadRefused { ref_id, .. } => self.refuse_read(ref_id, p.source),
            HostReply::CopyRefused { .. } | HostReply::PageImage { .. } => {
                self.join_reply(p.source, &r)
            }
        }
    }

    fn refuse_read(&mut self, ref_id: u32, host: HostId) -> Result<(), SmmError> {
        self.settle_read(ref_id, ReadSlot::Refused(host))?;
        self.stats.reads_refused += 1;
        Ok(())
    }

    fn resolve_read(&mut self, ref_id: u32, value: u64) -> Result<(), SmmError> {
        self.settle_read(ref_id, ReadSlot::Ready(value))
    }

    /// A waiting read gets its outcome (a value or a refusal), in its slot and its record.
    fn settle_read(&mut self, ref_id: u32, outcome: ReadSlot) -> Result<(), SmmError> {
        let Some(slot) = self.reads.get_mut(&ref_id) else {
            return Err(SmmError::BadInput(format!(
                "answer for unknown read {ref_id}"
            )));
        };
        let ReadSlot::Waiting { record } = *slot else {
            return Err(SmmError::BadInput(format!(
                "second answer for read {ref_id}"
            )));
        };
        *slot = outcome;
        let Some((r, op)) = record else {
            return Ok(());
        };
        if let Some(rec) = self.records[r].ops.get_mut(op)
            && let RecordedOp::Read { addr, value, .. } = rec
        {
            match outcome {
                ReadSlot::Ready(v) => *value = Some(v),
                ReadSlot::Refused(host) => *rec = RecordedOp::ReadRefused { addr: *addr, host },
                ReadSlot::Waiting { .. } => {}
            }
        }
        Ok(())
    }

    // ---------------------------------------------------------------------------------------
    // Drain

    /// Drains the bucket of the EOP's pulse in (source, sequum) order: by the SIU's sort
    /// vector when it covers the bucket, vector merged with a software sort of the excess when
    /// the count exceeds it, all software on a repeat EOP or a count mismatch.
    fn drain(&mut self, eop: &EopMarker) {
        let ts = eop.ts;
        let bucket = self.buckets.remove(&ts).unwrap_or_default();
        self.bucket_packets -= bucket.len();
        self.order_bucket(eop, &bucket);
        let order = std::mem::take(&mut self.order);
        for &i in &order {
            match &bucket[i as usize] {
                Bucketed::Message(m) => self.execute_message(ts, m),
                Bucketed::Marker(k) => self.execute_at_marker(ts, k),
            }
        }
        self.order = order;
        self.last_drained = ts;
        self.stats.pulses_drained += 1;
        self.finish_pulse(eop);
    }

    /// Fills `self.order` with bucket indices in execution order.
    fn order_bucket(&mut self, eop: &EopMarker, bucket: &[Bucketed]) {
        let partial = self.partial_pulse(eop.ts);
        let order = &mut self.order;
        order.clear();
        let n = bucket.len();
        let vector = &eop.sort_vector;
        let usable =
            !eop.repeat && eop.count as usize == n && vector.len() == n.min(SORT_VECTOR_MAX);
        if !eop.repeat && eop.count as usize != n {
            if partial {
                self.stats.partial_pulses += 1;
            } else {
                self.stats.count_mismatches += 1;
            }
        }
        if !usable {
            order.extend(0..n as u32);
            order.sort_unstable_by_key(|&i| bucket[i as usize].sort_key());
            self.stats.sorts_software += 1;
            return;
        }
        order.extend(vector.iter().map(|&i| u32::from(i)));
        if n <= SORT_VECTOR_MAX {
            self.stats.sorts_vector += 1;
            return;
        }
        // Hybrid: the vector orders the first 32 arrivals; sort the rest, then merge.
        order.extend(SORT_VECTOR_MAX as u32..n as u32);
        order[SORT_VECTOR_MAX..].sort_unstable_by_key(|&i| bucket[i as usize].sort_key());
        merge_sorted_halves(order, |i| bucket[i as usize].sort_key());
        self.stats.sorts_hybrid += 1;
    }

    fn finish_pulse(&mut self, eop: &EopMarker) {
        for (b, state) in self.barriers.iter_mut().enumerate() {
            if eop.barrier & (1 << b) != 0 && state.in_progress {
                state.in_progress = false;
                state.completed += 1;
                self.stats.barriers_completed += 1;
            }
        }
        if let Some(h) = self.signal_handler.as_mut() {
            if eop.reset {
                h(Self::RESET_SIGNAL, eop.ts);
            }
            if eop.signals != 0 {
                h(eop.signals, eop.ts);
            }
        }
    }

    /// An isochron marker: run the isochron it names, then the purely local isochrons queued
    /// behind it, up to the next isochron with a remote part.
    fn execute_at_marker(&mut self, ts: u64, k: &IsochronMarker) {
        let front_matches = self
            .hit
            .front()
            .is_some_and(|e| e.remote && e.iso_id == k.iso_id);
        if !front_matches {
            self.stats.bad_input += 1;
            return;
        }
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

    fn run_local(&mut self, entry: HitEntry, key: OrderKey) {
        let me = self.cfg.host;
        for (i, op) in entry.ops.into_iter().enumerate() {
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
                LocalOp::Admit(page) => self.admit(page, key.ts),
            }
        }
        if let Some(r) = entry.record {
            self.records[r].key = Some(key);
        }
        if !entry.admission {
            self.stats.isochrons_executed += 1;
        }
    }

    fn execute_message(&mut self, ts: u64, m: &IsotachMessage) {
        if self.intercept(m) {
            return;
        }
        self.stats.srefs_executed += 1;
        let key = OrderKey {
            ts,
            source: m.source,
            sequum: m.sequum,
            sub: 0,
        };
        match &m.sref {
            Sref::Msg { handler, payload } => self.call(*handler, m.source, ts, payload),
            Sref::Mem {
                op,
                width,
                addr,
                value,
                ref_id,
            } => {
                let addr = Addr::from_raw(*addr);
                let r = match op {
                    SrefOp::Read => self.memory.read(addr, *width, m.source, *ref_id).map(|o| {
                        if let ReadOutcome::Value(v) = o {
                            self.reply(m.source, *ref_id, v);
                        }
                    }),
                    SrefOp::Write => self.memory.write(addr, *width, *value),
                    SrefOp::Sched => self.memory.sched(addr, (key, 0), m.source),
                    SrefOp::Assign => {
                        self.assign(addr, *width, *value, m.source);
                        Ok(())
                    }
                    SrefOp::Copy => {
                        if self
                            .map
                            .copyset(addr.page())
                            .is_some_and(|c| c.contains(&self.cfg.host))
                        {
                            self.send_image(addr.page(), m.source, *ref_id);
                            Ok(())
                        } else {
                            Err(SmmError::NotACopy(addr))
                        }
                    }
                    SrefOp::Msg => Ok(()),
                };
                if let Err(e) = r {
                    self.count_exec_error(&e);
                }
            }
        }
    }

    fn assign(&mut self, addr: Addr, width: Width, value: u64, scheduler: HostId) {
        match self.memory.assign(addr, width, value, scheduler) {
            Ok(released) => {
                for Released {
                    requester,
                    ref_id,
                    value,
                } in released
                {
                    self.reply(requester, ref_id, value);
                }
            }
            Err(e) => self.count_exec_error(&e),
        }
    }

    /// Answers a read: locally, or with a non-isotach message to the requester.
    fn reply(&mut self, requester: HostId, ref_id: u32, value: u64) {
        if requester == self.cfg.host {
            let _ = self.resolve_read(ref_id, value);
            return;
        }
        self.send_reply(requester, &HostReply::ReadValue { ref_id, value });
    }

    fn call(&mut self, handler: u16, source: HostId, ts: u64, payload: &[u8]) {
        match self.handlers.get_mut(&handler) {
            Some(f) => f(&HandlerCall {
                source,
                ts,
                payload,
            }),
            None => self.stats.unhandled_messages += 1,
        }
    }

    fn count_exec_error(&mut self, e: &SmmError) {
        match e {
            SmmError::AssignWithoutSched(_) => self.stats.assigns_without_sched += 1,
            SmmError::NotACopy(_) | SmmError::Unmapped(_) => self.stats.not_a_copy += 1,
            _ => self.stats.bad_input += 1,
        }
    }

    // ---------------------------------------------------------------------------------------
    // Issue

    fn check_addr(&self, addr: Addr) -> Result<&[HostId], SmmError> {
        if addr.slot() >= self.cfg.limits.slots_per_page {
            return Err(SmmError::Unmapped(addr));
        }
        self.map
            .copyset(addr.page())
            .ok_or(SmmError::Unmapped(addr))
    }

    fn new_read(&mut self) -> Result<u32, SmmError> {
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

    /// Splits planned ops into this host's part and the srefs for other hosts.
    fn split(&self, ops: &[Planned]) -> (Vec<LocalOp>, Vec<(HostId, Sref)>) {
        let me = self.cfg.host;
        let mut local = Vec::new();
        let mut remote = Vec::new();
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
                    for &c in self.map.copyset(addr.page()).unwrap_or(&[]) {
                        if c == me {
                            local.push(lop(*addr, *width, *v));
                        } else {
                            remote.push((c, mem(sop, *addr, *width, *v, 0)));
                        }
                    }
                }
                Planned::Sched(addr) => {
                    for &c in self.map.copyset(addr.page()).unwrap_or(&[]) {
                        if c == me {
                            local.push(LocalOp::Sched(*addr));
                        } else {
                            remote.push((c, mem(SrefOp::Sched, *addr, Width::W64, 0, 0)));
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
        (local, remote)
    }

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

    fn issue(&mut self, ops: Vec<Planned>) -> Result<(), SmmError> {
        self.check_not_joining()?;
        if self.hit.len() >= self.cfg.limits.hit_buffer_max {
            return Err(SmmError::Limit(Table::HitBuffer));
        }
        self.account_scheds(&ops)?;
        let (local, remote) = self.split(&ops);
        let record = self.record_for(&ops);
        self.stats.isochrons_issued += 1;
        self.enqueue(local, &remote, record, false);
        Ok(())
    }

    /// Issues a join's admission isochron (see [`SmmNode::join`]).
    fn enqueue_admission(&mut self, local: Vec<LocalOp>, remote: Vec<(HostId, Sref)>) {
        if !local.is_empty() {
            self.enqueue(local, &remote, None, true);
        }
    }

    /// Puts an isochron in the hit buffer (sending its remote part) or runs it at once.
    fn enqueue(
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

    /// Sends the remote part: start, one message per sref, end. The isochron distance is the
    /// largest distance to a destination. Sets alternate per isochron and every isochron is
    /// logged, so each is ordered after the previous one: TS never decreases per host.
    fn send_isochron(&mut self, iso_id: u32, index: u64, remote: &[(HostId, Sref)]) {
        let me = self.cfg.host;
        let topo: &Topology = &self.cfg.topology;
        let distance = remote
            .iter()
            .map(|(d, _)| topo.distance(me, *d))
            .max()
            .unwrap_or(1);
        let soi = StartOfIsochron {
            iso_id,
            channel: 0,
            seqset: (index % 2) as u8,
            logged: true,
            host_gap: false,
            gap: 0,
            send_delta: 0,
            distance,
        };
        let mut out = Vec::with_capacity(packet::SOI_LEN);
        soi.encode(&mut out);
        self.to_siu.push_back(out);
        for (dest, sref) in remote {
            let m = IsotachMessage {
                ts: 0,
                source: me,
                dest: *dest,
                sequum: 0,
                sref: sref.clone(),
            };
            let mut out = Vec::with_capacity(m.encoded_len());
            m.encode(&mut out);
            self.to_siu.push_back(out);
        }
        let mut out = Vec::with_capacity(packet::EOI_LEN);
        EndOfIsochron { iso_id }.encode(&mut out);
        self.to_siu.push_back(out);
    }
}

/// Merges `order[..SORT_VECTOR_MAX]` (the vector's order) with `order[SORT_VECTOR_MAX..]`
/// (sorted in software), both sorted by `key`, in place. The front half is copied to a stack
/// buffer; writing position `k` never passes the next unread back element, so one pass suffices
/// and nothing is allocated.
fn merge_sorted_halves<K: Ord>(order: &mut [u32], key: impl Fn(u32) -> K) {
    let mid = SORT_VECTOR_MAX.min(order.len());
    let mut front = [0u32; SORT_VECTOR_MAX];
    front[..mid].copy_from_slice(&order[..mid]);
    let (mut i, mut j, mut k) = (0, mid, 0);
    while i < mid {
        if j < order.len() && key(order[j]) < key(front[i]) {
            order[k] = order[j];
            j += 1;
        } else {
            order[k] = front[i];
            i += 1;
        }
        k += 1;
    }
    debug_assert!(k == j, "the rest of the back half is already in place");
}

impl Isochron<'_> {
    fn push(&mut self, op: Planned) -> Result<(), SmmError> {
        if self.ops.len() >= self.node.cfg.limits.isochron_ops_max {
            return Err(SmmError::Limit(Table::IsochronOps));
        }
        self.ops.push(op);
        Ok(())
    }

    fn check_value(width: Width, value: u64) -> Result<(), SmmError> {
        if value > width.max_value() {
            return Err(SmmError::ValueTooWide {
                value,
                bits: 8 * width as u32,
            });
        }
        Ok(())
    }

    /// Reads `addr` from the nearest copy; the handle resolves when the isochron executes.
    pub fn read(&mut self, addr: Addr, width: Width) -> Result<ReadHandle, SmmError> {
        self.node.check_addr(addr)?;
        if self.ops.len() >= self.node.cfg.limits.isochron_ops_max {
            return Err(SmmError::Limit(Table::IsochronOps));
        }
        let id = self.node.new_read()?;
        self.ops.push(Planned::Read(addr, width, id));
        Ok(ReadHandle(id))
    }

    /// Writes `value` to every copy of `addr`.
    pub fn write(&mut self, addr: Addr, width: Width, value: u64) -> Result<(), SmmError> {
        self.node.check_addr(addr)?;
        Self::check_value(width, value)?;
        self.push(Planned::Write(addr, width, value))
    }

    /// Makes `addr` unsubstantiated at this isochron's place in the order, until this host's
    /// `assign`.
    pub fn sched(&mut self, addr: Addr) -> Result<(), SmmError> {
        self.node.check_addr(addr)?;
        self.push(Planned::Sched(addr))
    }

    /// Substantiates this host's oldest unassigned sched of `addr` with `value`.
    pub fn assign(&mut self, addr: Addr, width: Width, value: u64) -> Result<(), SmmError> {
        self.node.check_addr(addr)?;
        Self::check_value(width, value)?;
        self.push(Planned::Assign(addr, width, value))
    }

    /// Runs handler `handler` on host `node` with `payload`, at this isochron's place.
    pub fn message(&mut self, node: HostId, handler: u16, payload: &[u8]) -> Result<(), SmmError> {
        if usize::from(node) >= self.node.cfg.topology.host_count() {
            return Err(SmmError::NoSuchHost(node));
        }
        if payload.len() > MSG_PAYLOAD_MAX {
            return Err(SmmError::MessageTooLong {
                len: payload.len(),
                max: MSG_PAYLOAD_MAX,
            });
        }
        self.push(Planned::Message(node, handler, payload.to_vec()))
    }

    /// Issues the isochron. On error nothing was issued and its reads are released.
    pub fn end(mut self) -> Result<(), SmmError> {
        if self.ops.is_empty() {
            return Err(SmmError::EmptyIsochron);
        }
        let ops = std::mem::take(&mut self.ops);
        let reads: Vec<u32> = read_ids(&ops).collect();
        match self.node.issue(ops) {
            Ok(()) => {
                self.ended = true;
                Ok(())
            }
            Err(e) => {
                self.release(&reads);
                self.ended = true;
                Err(e)
            }
        }
    }

    fn release(&mut self, reads: &[u32]) {
        for id in reads {
            self.node.reads.remove(id);
        }
        self.node.stats.reads_outstanding = self.node.reads.len() as u64;
    }
}

fn read_ids(ops: &[Planned]) -> impl Iterator<Item = u32> + '_ {
    ops.iter().filter_map(|op| match op {
        Planned::Read(_, _, id) => Some(*id),
        _ => None,
    })
}

impl Drop for Isochron<'_> {
    fn drop(&mut self) {
        if !self.ended {
            let reads: Vec<u32> = read_ids(&self.ops).collect();
            self.release(&reads);
        }
    }
}

#[cfg(test)]
mod tests;
