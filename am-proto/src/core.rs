//! The sans-IO protocol core: reliability, credits, sequence numbers, the reply cache, FIFO
//! reorder buffers, validation and return-to-sender.
//!
//! [`Core`] owns no socket, clock, thread or random source. Drivers hand it datagrams
//! ([`Core::handle_datagram`]) and the time ([`Core::handle_timeout`]), and take out datagrams
//! to send ([`Core::poll_transmit`]), returned messages ([`Core::poll_returned`]) and the next
//! timer deadline ([`Core::poll_timeout`]). Handlers run synchronously inside
//! `handle_datagram`, through the [`Dispatch`] the driver passes in, so a medium payload is
//! borrowed straight from the datagram.
//!
//! This file holds the public surface ([`Config`], [`Stats`], [`Dispatch`], [`Core`]) and the
//! state a `Core` is made of (endpoints, per-peer request and reply-cache slots, reassembly
//! bitmaps), so their fields stay private to the core. The protocol lives in one file per
//! concept, each adding an `impl Core` block:
//! - `acks`: automatic acknowledgements held back to leave with other traffic;
//! - `endpoints`: the endpoint table (tag, segment, translations) and segment bounds;
//! - `peers`: the peer table, FIFO choice and credits;
//! - `send`: posting a request, the transmit queue, encoding and fragmenting frames;
//! - `receive`: an arriving datagram and, at the responder, its request: incarnation and
//!   epoch filtering, duplicates answered from the reply cache, reassembly, FIFO reorder,
//!   validation, the handler run, and a reply the requester returns;
//! - `reply`: at the requester, the answer to a request: Ack, Nack, a reply (validated,
//!   reassembled, or returned to the replier) and the acknowledgement of that return;
//! - `timers`: retransmission with the estimated timeout, give-up and a peer's new epoch;
//! - `returned`: messages returned to handler 0.

use rustc_hash::FxHashMap;
use std::collections::{BTreeSet, VecDeque};
use std::time::Duration;

use crate::error::AmError;
use crate::frame::{self, Header};
#[cfg(doc)]
use crate::msg::MsgInfo;
use crate::msg::{OutMsg, Reply, ReplySink, Request};
use crate::types::{
    EndpointName, EpId, HandlerId, HandlerKind, MAX_ARGS, MAX_MEDIUM_BYTES, MAX_SLOTS, NodeAddr,
    Status, Tag, Time,
};

/// What a handler is told about a message from `node` to endpoint `ep`: its description
/// ([`MsgInfo`]) and its data (`medium`: a medium message's bytes). `m` is a reply's
/// [`Header`] or a request's stored copy ([`OutMsg`]): the same fields, so one definition.
/// Used by `receive` and `reply`, so it comes before their `mod` lines.
macro_rules! handed {
    ($m:expr, $args:expr, $node:expr, $ep:expr, $request:expr, $medium:expr) => {{
        let m = &$m;
        let info = MsgInfo {
            source: EndpointName {
                node: $node,
                ep: EpId(m.src_ep),
            },
            ep: $ep,
            handler: HandlerId(m.handler),
            tag: Tag(m.tag),
            opcode: m.class.opcode($request),
            args: $args,
            nargs: m.nargs,
        };
        let data = match m.class {
            Class::Short | Class::Get => Data::None,
            Class::Medium => Data::Medium($medium),
            Class::Xfer => Data::Xfer {
                offset: m.dest_offset as usize,
                len: m.total_len as usize,
            },
        };
        (info, data)
    }};
}

mod acks;
mod endpoints;
mod peers;
mod receive;
mod reply;
mod returned;
mod send;
mod timers;

use self::returned::RetEntry;
pub use self::send::SendReq;
use self::send::Tx;

/// Protocol parameters. Every limit has a default; see `docs/am.md`.
#[derive(Clone, Debug)]
pub struct Config {
    /// Outstanding requests allowed per peer (request slots). Default 8, at most
    /// [`MAX_SLOTS`].
    pub credits: usize,
    /// Peers this node keeps state for. A request from one more peer is returned with
    /// [`Status::Congestion`]; a send to one more peer fails with [`AmError::Resource`].
    pub max_peers: usize,
    /// Retransmission timeout before the first round-trip sample of a peer.
    pub rto_initial: Duration,
    /// Floor of the estimated retransmission timeout (`srtt + 4 * rttvar`, Jacobson/Karn).
    pub rto_min: Duration,
    /// Ceiling of the exponential backoff.
    pub rto_max: Duration,
    /// A request unanswered this long is returned with [`Status::Unreachable`], together with
    /// everything else outstanding towards that peer.
    pub give_up: Duration,
    /// First sequence number of every slot (a test hook for sequence wrap).
    pub initial_seq: u32,
    /// Most messages one `poll` handles.
    pub poll_batch: usize,
    /// Largest datagram the transport carries; `None` = the transport's value.
    pub max_datagram: Option<usize>,
    /// Incarnation of this node; must grow across restarts. `None` = the transport's value.
    pub incarnation: Option<u64>,
    /// Most frames waiting in the transmit queue; more are dropped (and recovered by
    /// retransmission).
    pub tx_queue: usize,
    /// How long an automatic acknowledgement may wait for other traffic to its peer: it
    /// leaves with the next frame queued for that peer, with the peer's next automatic
    /// acknowledgement (at most one waits per peer), or when this runs out. Zero = at once.
    /// Below `rto_min`, since the requester's round-trip sample includes the wait.
    pub ack_delay: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            credits: 8,
            max_peers: 256,
            rto_initial: Duration::from_millis(10),
            rto_min: Duration::from_millis(10),
            rto_max: Duration::from_secs(1),
            give_up: Duration::from_secs(10),
            initial_seq: 0,
            poll_batch: 64,
            max_datagram: None,
            incarnation: None,
            tx_queue: 4096,
            ack_delay: Duration::ZERO,
        }
    }
}

impl Config {
    pub(crate) fn validate(&self) -> Result<(), AmError> {
        if self.credits == 0 || self.credits > MAX_SLOTS {
            return Err(AmError::BadArg("credits must be in 1..=MAX_SLOTS"));
        }
        if self.max_peers == 0 || self.max_peers > 1 << 20 {
            return Err(AmError::BadArg("max_peers must be in 1..=2^20"));
        }
        if self.rto_initial.is_zero() || self.rto_min.is_zero() || self.rto_max < self.rto_initial {
            return Err(AmError::BadArg("need 0 < rto_initial <= rto_max"));
        }
        if self.poll_batch == 0 || self.tx_queue == 0 {
            return Err(AmError::BadArg("poll_batch and tx_queue must be positive"));
        }
        if self.ack_delay >= self.rto_min {
            return Err(AmError::BadArg("ack_delay must be below rto_min"));
        }
        Ok(())
    }
}

/// Counters, for tests and benchmarks.
#[derive(Clone, Copy, Debug, Default)]
pub struct Stats {
    /// Datagrams that failed to decode.
    pub bad_frames: u64,
    /// Frames dropped as stale (old incarnation, old epoch, old sequence number).
    pub stale_frames: u64,
    /// Duplicate requests answered from the reply cache.
    pub dup_requests: u64,
    /// Duplicate responses ignored.
    pub dup_responses: u64,
    /// Request handlers run.
    pub requests_handled: u64,
    /// Reply handlers run.
    pub replies_handled: u64,
    /// Automatic acknowledgements produced.
    pub auto_acks: u64,
    /// Automatic acknowledgements held back to leave with other traffic (`ack_delay`).
    pub acks_held: u64,
    /// Held acknowledgements that left alone, when `ack_delay` ran out.
    pub acks_held_expired: u64,
    /// Frames that left in a datagram behind another frame (for the same peer).
    pub frames_coalesced: u64,
    /// Retransmissions (whole messages).
    pub retransmits: u64,
    /// Messages returned to handler 0.
    pub returned: u64,
    /// Frames dropped because the transmit queue was full.
    pub tx_dropped: u64,
    /// FIFO requests parked in a reorder buffer.
    pub fifo_parked: u64,
    /// Requests refused because their tag does not admit the endpoint's (foreign traffic).
    pub bad_tag: u64,
}

/// What the core needs from the handler tables: which kind of handler an index holds, and
/// running one.
pub trait Dispatch {
    /// The kind of handler at `h` of endpoint `ep` (`Unset` if out of range).
    fn handler_kind(&self, ep: EpId, h: HandlerId) -> HandlerKind;
    /// Run the request handler the request names.
    fn on_request(&mut self, req: Request<'_>);
    /// Run the reply handler the reply names.
    fn on_reply(&mut self, rep: Reply<'_>);
}

/// The protocol state machine of one node (one bundle): all its endpoints and peers.
#[derive(Debug)]
pub struct Core {
    cfg: Config,
    max_datagram: usize,
    local: NodeAddr,
    inc: u64,
    eps: Vec<EpState>,
    peers: Vec<Peer>,
    /// Looked up for every datagram received: a cheap hash (FxHash; SipHash was 2 % of an
    /// application's CPU under load). Its keys are bounded by `max_peers`, so chosen source
    /// addresses cannot grow a collision chain past that.
    index: FxHashMap<NodeAddr, u32>,
    last_peer: Option<(NodeAddr, u32)>,
    /// Every waiting slot's next timer (the earlier of retransmit and give-up) as (deadline,
    /// peer, slot): the next deadline and the peers with a due timer are found without
    /// scanning every peer's slots (a token manager has a peer per host on its switch). Kept
    /// in step with the slots by [`SendSlot::rearm`] only.
    timers: BTreeSet<(Time, u32, u16)>,
    /// The deadline of every held acknowledgement ([`Peer::ack_held`]) as (deadline, peer).
    held_acks: BTreeSet<(Time, u32)>,
    /// The time last passed in (`handle_datagram`, `handle_timeout`, `send_request`): when a
    /// held acknowledgement is due.
    now: Time,
    txq: VecDeque<Tx>,
    cur: Option<Tx>,
    returned: VecDeque<RetEntry>,
    scratch: Vec<u8>,
    sink: ReplySink,
    stats: Stats,
}

// The state `Core` is made of. It is defined here rather than beside the code that uses it
// so that its fields stay private to the core: every file in `core/` is a child module and
// sees them.
//
// Towards each peer a node has `credits` request slots (`SendSlot`): a slot is a credit, so
// a free slot is what lets a request go (the send window). Each slot has its own sequence
// number, so a response names the request it answers by slot, sequence number and epoch.
// From each peer it keeps reply-cache slots (`RecvSlot`, one per slot of the sender) that
// hold the last request and its response, to answer duplicates without running a handler
// twice. The sender's incarnation and epoch (bumped when it gave up on us) say which
// sequence space a frame belongs to.

#[derive(Debug)]
struct EpState {
    live: bool,
    tag: Tag,
    seg: Vec<u8>,
    /// The translation table's entries up to the last one ever mapped; the entries after it,
    /// up to `trans_len`, are unbound and take no memory (the simulator runs thousands of
    /// endpoints that map a handful each).
    trans: Vec<Option<(EndpointName, Tag)>>,
    /// The table's size (`AM_SetNumTranslations`).
    trans_len: usize,
}

#[derive(Debug, Default)]
struct Reasm {
    active: bool,
    total: u32,
    chunk: u32,
    nfrags: u32,
    got: u32,
    bits: Vec<u64>,
}

impl Reasm {
    fn start(&mut self, total: u32, chunk: u32) {
        debug_assert!(
            chunk as usize >= frame::MIN_CHUNK,
            "bulk chunk {chunk} below MIN_CHUNK: the decoder refuses such frames"
        );
        self.active = true;
        self.total = total;
        self.chunk = chunk;
        // An empty transfer still travels as one (empty) fragment.
        self.nfrags = total.div_ceil(chunk).max(1);
        self.got = 0;
        self.bits.clear();
        self.bits.resize(self.nfrags.div_ceil(64) as usize, 0);
    }

    /// Mark the fragment at `offset`; true if it was new.
    fn mark(&mut self, offset: u32) -> bool {
        let i = (offset / self.chunk) as usize;
        let (w, b) = (i / 64, i % 64);
        if w >= self.bits.len() || self.bits[w] & (1 << b) != 0 {
            return false;
        }
        self.bits[w] |= 1 << b;
        self.got += 1;
        true
    }

    fn complete(&self) -> bool {
        self.active && self.got == self.nfrags
    }

    fn matches(&self, f: &Header) -> bool {
        self.active && self.total == f.total_len && self.chunk == u32::from(f.frag_chunk)
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum SendState {
    Free,
    AwaitReply,
    AwaitNackAck,
    Returning,
}

#[derive(Debug)]
struct SendSlot {
    state: SendState,
    seq: u32,
    next_seq: u32,
    msg: OutMsg,
    dest: EndpointName,
    next_retx: Time,
    rto: Duration,
    give_up_at: Time,
    sent_at: Time,
    retransmitted: bool,
    nack_status: Status,
    reasm: Reasm,
    /// Its entry in [`Core`]'s timer set, if it waits.
    timer: Option<Time>,
}

impl SendSlot {
    /// Does the slot wait on a timer (for a reply, or for the acknowledgement of a reply it
    /// returned)?
    fn waiting(&self) -> bool {
        matches!(self.state, SendState::AwaitReply | SendState::AwaitNackAck)
    }

    /// Puts the slot's entry in `timers` in step with its state and deadlines: call after
    /// every change of either. `pi` and `si` name the slot.
    fn rearm(&mut self, timers: &mut BTreeSet<(Time, u32, u16)>, pi: u32, si: usize) {
        let due = self.waiting().then(|| self.next_retx.min(self.give_up_at));
        if due == self.timer {
            return;
        }
        let si = si as u16;
        if let Some(old) = self.timer {
            let armed = timers.remove(&(old, pi, si));
            debug_assert!(armed, "slot {pi}/{si}'s timer was not in the timer set");
        }
        if let Some(t) = due {
            timers.insert((t, pi, si));
        }
        self.timer = due;
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum RecvState {
    Empty,
    Assembling,
    Waiting,
    Done,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Resp {
    Reply,
    Ack,
    Nack(Status),
}

#[derive(Debug)]
struct RecvSlot {
    state: RecvState,
    seq: u32,
    req: OutMsg,
    reasm: Reasm,
    resp: Resp,
    resp_msg: OutMsg,
    resp_returned: bool,
}

impl RecvSlot {
    fn new() -> Self {
        Self {
            state: RecvState::Empty,
            seq: 0,
            req: OutMsg::default(),
            reasm: Reasm::default(),
            resp: Resp::Ack,
            resp_msg: OutMsg::default(),
            resp_returned: false,
        }
    }
}

#[derive(Debug)]
struct Peer {
    addr: NodeAddr,
    fifo: bool,
    known_inc: u64,
    epoch: u32,
    fifo_tx: u32,
    srtt: Option<Duration>,
    rttvar: Duration,
    ss: Vec<SendSlot>,
    /// Slots in use (not free).
    busy: usize,
    r_seen: bool,
    r_inc: u64,
    r_epoch: u32,
    fifo_rx: u32,
    rs: Vec<RecvSlot>,
    /// An automatic acknowledgement waiting for other traffic to this peer.
    ack_held: Option<HeldAck>,
}

/// An automatic acknowledgement held back ([`Config::ack_delay`]): of the request in reply
/// cache slot `slot` with sequence number `seq`, due to leave alone at `due`.
#[derive(Clone, Copy, Debug)]
struct HeldAck {
    due: Time,
    slot: u16,
    seq: u32,
}

impl Core {
    /// A core for node `local` with incarnation `inc` (must grow across restarts of a node).
    pub fn new(
        cfg: Config,
        local: NodeAddr,
        inc: u64,
        max_datagram: usize,
    ) -> Result<Self, AmError> {
        cfg.validate()?;
        let max_datagram = cfg.max_datagram.unwrap_or(max_datagram).min(65_507);
        if max_datagram < frame::overhead(MAX_ARGS) + MAX_MEDIUM_BYTES {
            return Err(AmError::BadArg(
                "max_datagram too small for a full medium message",
            ));
        }
        if inc == 0 {
            return Err(AmError::BadArg("incarnation 0 is reserved"));
        }
        Ok(Self {
            cfg,
            max_datagram,
            local,
            inc,
            eps: Vec::new(),
            peers: Vec::new(),
            index: FxHashMap::default(),
            last_peer: None,
            timers: BTreeSet::new(),
            held_acks: BTreeSet::new(),
            now: Time(0),
            txq: VecDeque::new(),
            cur: None,
            returned: VecDeque::new(),
            // Grown by the first datagram of each size: a node that sends only short
            // messages never holds a buffer for the largest.
            scratch: Vec::new(),
            sink: ReplySink::default(),
            stats: Stats::default(),
        })
    }

    /// This node's address.
    pub fn local(&self) -> NodeAddr {
        self.local
    }
    /// This node's incarnation.
    pub fn incarnation(&self) -> u64 {
        self.inc
    }
    /// Counters.
    pub fn stats(&self) -> Stats {
        self.stats
    }
    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }
    /// Largest datagram this core emits.
    pub fn max_datagram(&self) -> usize {
        self.max_datagram
    }
}

#[cfg(test)]
mod tx_tests;
