//! The sans-IO protocol core: reliability, credits, sequence numbers, the reply cache, FIFO
//! reorder buffers, validation and return-to-sender.
//!
//! [`Core`] owns no socket, clock, thread or random source. Drivers hand it datagrams
//! ([`Core::handle_datagram`]) and the time ([`Core::handle_timeout`]), and take out datagrams
//! to send ([`Core::poll_transmit`]), returned messages ([`Core::poll_returned`]) and the next
//! timer deadline ([`Core::poll_timeout`]). Handlers run synchronously inside
//! `handle_datagram`, through the [`Dispatch`] the driver passes in, so a medium payload is
//! borrowed straight from the datagram.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use crate::error::AmError;
use crate::frame::{self, FLAG_FIFO, Frame, Header, Kind};
use crate::msg::{Data, MsgInfo, OutMsg, Reply, ReplySink, Request, Returned};
use crate::types::{
    Class, DEFAULT_TRANSLATIONS, EndpointName, EpId, HandlerId, HandlerKind, MAX_ARGS,
    MAX_ENDPOINTS, MAX_LONG_BYTES, MAX_MEDIUM_BYTES, MAX_SEGMENT_BYTES, MAX_SLOTS,
    MAX_TRANSLATIONS, NodeAddr, Opcode, Status, Tag, Time, TransIdx,
};

/// What a handler is told about a message from `node` to endpoint `ep`: its description
/// ([`MsgInfo`]) and its data (`medium`: a medium message's bytes). `m` is a reply's
/// [`Header`] or a request's stored copy ([`OutMsg`]): the same fields, so one definition.
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

#[derive(Debug)]
struct EpState {
    live: bool,
    tag: Tag,
    seg: Vec<u8>,
    trans: Vec<Option<(EndpointName, Tag)>>,
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
    busy: usize,
    r_seen: bool,
    r_inc: u64,
    r_epoch: u32,
    fifo_rx: u32,
    rs: Vec<RecvSlot>,
}

#[derive(Clone, Copy, Debug)]
enum Tx {
    Req {
        peer: u32,
        slot: u16,
        seq: u32,
        frag: u32,
    },
    Resp {
        peer: u32,
        slot: u16,
        seq: u32,
        frag: u32,
    },
    ReplyNack {
        peer: u32,
        slot: u16,
        seq: u32,
    },
    Ctl {
        to: NodeAddr,
        h: Header,
    },
}

#[derive(Clone, Copy, Debug)]
struct RetEntry {
    r: Returned,
    slot: Option<(u32, u16, u32)>,
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
    index: HashMap<NodeAddr, u32>,
    last_peer: Option<(NodeAddr, u32)>,
    /// A lower bound on every waiting slot's next timer (retransmit or give-up): before it,
    /// `handle_timeout` has nothing to do and returns without scanning.
    timer_floor: Time,
    txq: VecDeque<Tx>,
    cur: Option<Tx>,
    returned: VecDeque<RetEntry>,
    scratch: Vec<u8>,
    sink: ReplySink,
    stats: Stats,
}

/// A request to send, as the API layer hands it to the core.
#[derive(Clone, Copy, Debug)]
pub struct SendReq<'a> {
    /// Sending endpoint.
    pub ep: EpId,
    /// Translation entry naming the destination.
    pub idx: TransIdx,
    /// Size class.
    pub class: Class,
    /// Handler at the destination (for a get: the reply handler here).
    pub handler: HandlerId,
    /// Argument words.
    pub args: &'a [u64],
    /// Medium or bulk payload.
    pub payload: &'a [u8],
    /// Bulk: destination offset there; get: destination offset here.
    pub dest_offset: u32,
    /// Get: source offset there.
    pub src_offset: u32,
    /// Get: bytes to read.
    pub len: u32,
}

impl<'a> SendReq<'a> {
    /// A short request: `args` only (the other classes start from this one with struct
    /// update syntax).
    pub fn short(ep: EpId, idx: TransIdx, handler: HandlerId, args: &'a [u64]) -> Self {
        Self {
            ep,
            idx,
            class: Class::Short,
            handler,
            args,
            payload: &[],
            dest_offset: 0,
            src_offset: 0,
            len: 0,
        }
    }

    /// A medium request: `args` and `payload` (at most `MAX_MEDIUM_BYTES`).
    pub fn medium(
        ep: EpId,
        idx: TransIdx,
        handler: HandlerId,
        payload: &'a [u8],
        args: &'a [u64],
    ) -> Self {
        Self {
            class: Class::Medium,
            payload,
            ..Self::short(ep, idx, handler, args)
        }
    }
}

fn seg_check(seg_len: usize, offset: u32, len: u32) -> Result<(), Status> {
    let (off, len) = (offset as usize, len as usize);
    if off > seg_len || (off == seg_len && len > 0) {
        Err(Status::BadSegOffset)
    } else if off + len > seg_len {
        Err(Status::BadLength)
    } else {
        Ok(())
    }
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
            index: HashMap::new(),
            last_peer: None,
            timer_floor: Time(u64::MAX),
            txq: VecDeque::new(),
            cur: None,
            returned: VecDeque::new(),
            scratch: Vec::with_capacity(max_datagram),
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

    // ---------------------------------------------------------------- endpoints

    /// Allocate an endpoint: tag NONE, empty segment, 256 unbound translations.
    pub fn alloc_endpoint(&mut self) -> Result<EpId, AmError> {
        let fresh = || EpState {
            live: true,
            tag: Tag::NONE,
            seg: Vec::new(),
            trans: vec![None; DEFAULT_TRANSLATIONS],
        };
        if let Some(i) = self.eps.iter().position(|e| !e.live) {
            self.eps[i] = fresh();
            return Ok(EpId(i as u16));
        }
        if self.eps.len() >= MAX_ENDPOINTS {
            return Err(AmError::Resource("endpoints"));
        }
        self.eps.push(fresh());
        Ok(EpId((self.eps.len() - 1) as u16))
    }

    /// Free an endpoint; later arrivals for it are returned with `BadEndpoint`.
    pub fn free_endpoint(&mut self, ep: EpId) -> Result<(), AmError> {
        let e = self.ep_mut(ep)?;
        e.live = false;
        e.seg = Vec::new();
        e.trans = Vec::new();
        Ok(())
    }

    fn ep(&self, ep: EpId) -> Result<&EpState, AmError> {
        self.eps
            .get(usize::from(ep.0))
            .filter(|e| e.live)
            .ok_or(AmError::BadEndpoint(ep))
    }
    fn ep_mut(&mut self, ep: EpId) -> Result<&mut EpState, AmError> {
        self.eps
            .get_mut(usize::from(ep.0))
            .filter(|e| e.live)
            .ok_or(AmError::BadEndpoint(ep))
    }

    /// Is `ep` allocated?
    pub fn endpoint_live(&self, ep: EpId) -> bool {
        self.ep(ep).is_ok()
    }
    /// Set the endpoint's tag; takes effect for every later delivery (atomic revocation).
    pub fn set_tag(&mut self, ep: EpId, tag: Tag) -> Result<(), AmError> {
        self.ep_mut(ep)?.tag = tag;
        Ok(())
    }
    /// The endpoint's tag.
    pub fn tag(&self, ep: EpId) -> Result<Tag, AmError> {
        Ok(self.ep(ep)?.tag)
    }
    /// Give the endpoint a zeroed segment of `len` bytes (replacing the old one).
    pub fn set_segment(&mut self, ep: EpId, len: usize) -> Result<(), AmError> {
        if len > MAX_SEGMENT_BYTES {
            return Err(AmError::BadArg("segment larger than MAX_SEGMENT_BYTES"));
        }
        self.ep_mut(ep)?.seg = vec![0; len];
        Ok(())
    }
    /// The endpoint's segment.
    pub fn segment(&self, ep: EpId) -> Result<&[u8], AmError> {
        Ok(&self.ep(ep)?.seg)
    }
    /// The endpoint's segment, writable.
    pub fn segment_mut(&mut self, ep: EpId) -> Result<&mut [u8], AmError> {
        Ok(&mut self.ep_mut(ep)?.seg)
    }
    /// Resize the translation table (`AM_SetNumTranslations`): `DEFAULT..=MAX`.
    pub fn set_num_translations(&mut self, ep: EpId, n: usize) -> Result<(), AmError> {
        if !(DEFAULT_TRANSLATIONS..=MAX_TRANSLATIONS).contains(&n) {
            return Err(AmError::BadArg("translation table size out of range"));
        }
        self.ep_mut(ep)?.trans.resize(n, None);
        Ok(())
    }
    /// Size of the translation table.
    pub fn num_translations(&self, ep: EpId) -> Result<usize, AmError> {
        Ok(self.ep(ep)?.trans.len())
    }
    /// Bind translation `idx` (`AM_Map`); an active entry must be unmapped first.
    pub fn map(
        &mut self,
        ep: EpId,
        idx: TransIdx,
        name: EndpointName,
        tag: Tag,
    ) -> Result<(), AmError> {
        let e = self.ep_mut(ep)?;
        let slot = e
            .trans
            .get_mut(usize::from(idx.0))
            .ok_or(AmError::BadEntry(idx))?;
        if slot.is_some() {
            return Err(AmError::InUse);
        }
        *slot = Some((name, tag));
        Ok(())
    }
    /// Bind the first free translation (`AM_MapAny`).
    pub fn map_any(&mut self, ep: EpId, name: EndpointName, tag: Tag) -> Result<TransIdx, AmError> {
        let e = self.ep_mut(ep)?;
        let i = e
            .trans
            .iter()
            .position(Option::is_none)
            .ok_or(AmError::Resource("translations"))?;
        e.trans[i] = Some((name, tag));
        Ok(TransIdx(i as u16))
    }
    /// Unbind a translation (`AM_Unmap`).
    pub fn unmap(&mut self, ep: EpId, idx: TransIdx) -> Result<(), AmError> {
        let e = self.ep_mut(ep)?;
        let slot = e
            .trans
            .get_mut(usize::from(idx.0))
            .ok_or(AmError::BadEntry(idx))?;
        if slot.take().is_none() {
            return Err(AmError::BadEntry(idx));
        }
        Ok(())
    }
    /// A translation (`AM_GetTranslationName` / `Tag`).
    pub fn translation(&self, ep: EpId, idx: TransIdx) -> Result<(EndpointName, Tag), AmError> {
        self.ep(ep)?
            .trans
            .get(usize::from(idx.0))
            .copied()
            .flatten()
            .ok_or(AmError::BadEntry(idx))
    }

    // ---------------------------------------------------------------- peers

    /// The index of a known peer (no insertion).
    fn lookup(&self, addr: NodeAddr) -> Option<u32> {
        match self.last_peer {
            Some((a, i)) if a == addr => Some(i),
            _ => self.index.get(&addr).copied(),
        }
    }

    fn peer_index(&mut self, addr: NodeAddr) -> Option<u32> {
        // Peers are never removed, so the last hit stays valid; it saves a SipHash of the
        // address per datagram in the common one-peer-at-a-time case.
        if let Some(&(a, i)) = self.last_peer.as_ref()
            && a == addr
        {
            return Some(i);
        }
        if let Some(&i) = self.index.get(&addr) {
            self.last_peer = Some((addr, i));
            return Some(i);
        }
        if self.peers.len() >= self.cfg.max_peers {
            return None;
        }
        let ss = (0..self.cfg.credits)
            .map(|_| SendSlot {
                state: SendState::Free,
                seq: 0,
                next_seq: self.cfg.initial_seq,
                msg: OutMsg::default(),
                dest: EndpointName {
                    node: addr,
                    ep: EpId(0),
                },
                next_retx: Time(0),
                rto: self.cfg.rto_initial,
                give_up_at: Time(0),
                sent_at: Time(0),
                retransmitted: false,
                nack_status: Status::BadArgs,
                reasm: Reasm::default(),
            })
            .collect();
        self.peers.push(Peer {
            addr,
            fifo: false,
            known_inc: 0,
            epoch: 0,
            fifo_tx: 0,
            srtt: None,
            rttvar: Duration::ZERO,
            ss,
            busy: 0,
            r_seen: false,
            r_inc: 0,
            r_epoch: 0,
            fifo_rx: 0,
            rs: Vec::new(),
        });
        let i = (self.peers.len() - 1) as u32;
        self.index.insert(addr, i);
        self.last_peer = Some((addr, i));
        Some(i)
    }

    /// Ask for per-peer FIFO delivery of requests sent from here to `node` (the receiver
    /// reorders them in a bounded reorder buffer; nothing is dropped for being early).
    pub fn set_fifo(&mut self, node: NodeAddr, on: bool) -> Result<(), AmError> {
        let i = self.peer_index(node).ok_or(AmError::Resource("peers"))?;
        self.peers[i as usize].fifo = on;
        Ok(())
    }

    /// Free request slots towards `node`.
    pub fn credits_available(&self, node: NodeAddr) -> usize {
        match self.index.get(&node) {
            Some(&i) => self.peers[i as usize]
                .ss
                .iter()
                .filter(|s| s.state == SendState::Free)
                .count(),
            None => self.cfg.credits,
        }
    }

    /// Requests (and reply-return notices) outstanding towards all peers.
    pub fn outstanding(&self) -> usize {
        self.peers.iter().map(|p| p.busy).sum()
    }

    // ---------------------------------------------------------------- sending

    /// Post a request. Synchronous errors (bad arguments, unbound entry, no credit) come back
    /// here; everything found later comes back to handler 0.
    pub fn send_request(&mut self, now: Time, r: SendReq<'_>) -> Result<(), AmError> {
        if r.args.len() > MAX_ARGS {
            return Err(AmError::BadArg("more than MAX_ARGS argument words"));
        }
        match r.class {
            Class::Short => {}
            Class::Medium if r.payload.len() > MAX_MEDIUM_BYTES => {
                return Err(AmError::BadArg(
                    "medium payload larger than MAX_MEDIUM_BYTES",
                ));
            }
            Class::Medium => {}
            Class::Xfer if r.payload.len() > MAX_LONG_BYTES => {
                return Err(AmError::BadArg("bulk payload larger than MAX_LONG_BYTES"));
            }
            Class::Xfer => {}
            Class::Get => {
                if r.len as usize > MAX_LONG_BYTES {
                    return Err(AmError::BadArg("get larger than MAX_LONG_BYTES"));
                }
                let seg_len = self.ep(r.ep)?.seg.len();
                if seg_check(seg_len, r.dest_offset, r.len).is_err() {
                    return Err(AmError::BadSegment {
                        offset: u64::from(r.dest_offset),
                        len: u64::from(r.len),
                        seg_len: seg_len as u64,
                    });
                }
            }
        }
        let e = self.ep(r.ep)?;
        let (dest, tag) = e
            .trans
            .get(usize::from(r.idx.0))
            .copied()
            .flatten()
            .ok_or(AmError::BadEntry(r.idx))?;
        let pi = self
            .peer_index(dest.node)
            .ok_or(AmError::Resource("peers"))?;
        let p = &mut self.peers[pi as usize];
        let si =
            p.ss.iter()
                .position(|s| s.state == SendState::Free)
                .ok_or(AmError::WouldBlock)?;
        let fifo = if p.fifo {
            let f = p.fifo_tx;
            p.fifo_tx = p.fifo_tx.wrapping_add(1);
            Some(f)
        } else {
            None
        };
        let rto = p.rto(&self.cfg);
        let s = &mut p.ss[si];
        let m = &mut s.msg;
        m.set_args(r.args)?;
        m.class = r.class;
        m.handler = r.handler.0;
        m.src_ep = r.ep.0;
        m.dst_ep = dest.ep.0;
        m.tag = tag.0;
        m.dest_offset = r.dest_offset;
        m.src_offset = r.src_offset;
        m.fifo = fifo;
        m.set_payload(r.payload);
        if r.class == Class::Get {
            m.total_len = r.len;
        }
        s.dest = dest;
        s.seq = s.next_seq;
        s.next_seq = s.next_seq.wrapping_add(1);
        s.state = SendState::AwaitReply;
        s.rto = rto;
        s.sent_at = now;
        s.retransmitted = false;
        s.next_retx = now.plus(s.rto);
        s.give_up_at = now.plus(self.cfg.give_up);
        self.timer_floor = self.timer_floor.min(s.next_retx.min(s.give_up_at));
        s.reasm.active = false;
        let seq = s.seq;
        p.busy += 1;
        self.push_tx(Tx::Req {
            peer: pi,
            slot: si as u16,
            seq,
            frag: 0,
        });
        Ok(())
    }

    fn push_tx(&mut self, t: Tx) {
        if self.txq.len() >= self.cfg.tx_queue {
            self.stats.tx_dropped += 1;
            return;
        }
        self.txq.push_back(t);
    }

    fn chunk_for(&self, nargs: u8) -> usize {
        (self.max_datagram - frame::overhead(usize::from(nargs))).min(usize::from(u16::MAX)) & !7
    }

    /// The next datagram to send, encoded into an internal buffer.
    pub fn poll_transmit(&mut self) -> Option<(NodeAddr, &[u8])> {
        loop {
            let t = match self.cur.take() {
                Some(t) => t,
                None => self.txq.pop_front()?,
            };
            if let Some(to) = self.encode_tx(t) {
                return Some((to, &self.scratch));
            }
        }
    }

    /// Encode `t` (or its next fragment) into `scratch`; `None` if it went stale.
    fn encode_tx(&mut self, t: Tx) -> Option<NodeAddr> {
        match t {
            Tx::Ctl { to, h } => {
                frame::encode(&h, &[], &[], &mut self.scratch);
                Some(to)
            }
            Tx::Req {
                peer,
                slot,
                seq,
                frag,
            } => {
                let p = &self.peers[peer as usize];
                let s = &p.ss[usize::from(slot)];
                if s.state != SendState::AwaitReply || s.seq != seq {
                    return None;
                }
                let mut h = msg_header(Kind::Request, &s.msg);
                h.route(slot, seq, p.epoch, (self.inc, p.known_inc));
                let more = self.encode_msg(h, peer, slot, frag, true);
                if more {
                    self.cur = Some(Tx::Req {
                        peer,
                        slot,
                        seq,
                        frag: frag + 1,
                    });
                }
                Some(self.peers[peer as usize].addr)
            }
            Tx::Resp {
                peer,
                slot,
                seq,
                frag,
            } => {
                let p = &self.peers[peer as usize];
                let rs = p.rs.get(usize::from(slot))?;
                if rs.state != RecvState::Done || rs.seq != seq {
                    return None;
                }
                let (kind, status) = match rs.resp {
                    Resp::Reply => (Kind::Reply, None),
                    Resp::Ack => (Kind::Ack, None),
                    Resp::Nack(s) => (Kind::Nack, Some(s)),
                };
                let mut h = if kind == Kind::Reply {
                    msg_header(Kind::Reply, &rs.resp_msg)
                } else {
                    Header::new(kind, rs.req.class)
                };
                h.status = status;
                h.src_ep = rs.req.dst_ep;
                h.dst_ep = rs.req.src_ep;
                h.route(slot, seq, p.r_epoch, (self.inc, p.r_inc));
                if kind == Kind::Reply {
                    if self.encode_msg(h, peer, slot, frag, false) {
                        self.cur = Some(Tx::Resp {
                            peer,
                            slot,
                            seq,
                            frag: frag + 1,
                        });
                    }
                } else {
                    frame::encode(&h, &[], &[], &mut self.scratch);
                }
                Some(self.peers[peer as usize].addr)
            }
            Tx::ReplyNack { peer, slot, seq } => {
                let p = &self.peers[peer as usize];
                let s = &p.ss[usize::from(slot)];
                if s.state != SendState::AwaitNackAck || s.seq != seq {
                    return None;
                }
                let mut h = Header::new(Kind::ReplyNack, Class::Short);
                h.status = Some(s.nack_status);
                h.src_ep = s.msg.src_ep;
                h.dst_ep = s.msg.dst_ep;
                h.route(slot, seq, p.epoch, (self.inc, p.known_inc));
                frame::encode(&h, &[], &[], &mut self.scratch);
                Some(p.addr)
            }
        }
    }

    /// Encode fragment `frag` of a stored message; true if more fragments follow.
    fn encode_msg(
        &mut self,
        mut h: Header,
        peer: u32,
        slot: u16,
        frag: u32,
        request: bool,
    ) -> bool {
        let chunk = self.chunk_for(h.nargs);
        let p = &self.peers[peer as usize];
        let m = if request {
            &p.ss[usize::from(slot)].msg
        } else {
            &p.rs[usize::from(slot)].resp_msg
        };
        let args = &m.args[..usize::from(m.nargs)];
        if m.class != Class::Xfer {
            h.frag_len = m.payload.len() as u16;
            frame::encode(&h, args, &m.payload, &mut self.scratch);
            return false;
        }
        let total = m.payload.len();
        let off = (frag as usize * chunk).min(total);
        let len = chunk.min(total - off);
        h.frag_chunk = chunk as u16;
        h.frag_offset = off as u32;
        h.frag_len = len as u16;
        frame::encode(&h, args, &m.payload[off..off + len], &mut self.scratch);
        off + len < total
    }

    // ---------------------------------------------------------------- timers

    /// When the core next needs `handle_timeout`.
    pub fn poll_timeout(&self) -> Option<Time> {
        self.peers
            .iter()
            .filter(|p| p.busy > 0)
            .flat_map(|p| p.ss.iter())
            .filter(|s| matches!(s.state, SendState::AwaitReply | SendState::AwaitNackAck))
            .map(|s| s.next_retx.min(s.give_up_at))
            .min()
    }

    /// Whether any request (or reply-return notice) waits on a timer. When none does, the
    /// core needs no clock reading: requests are handled without one, and a response can only
    /// be stale (its slot is not waiting), so `now` is not consulted.
    pub fn timers_armed(&self) -> bool {
        self.timer_floor != Time(u64::MAX)
    }

    /// Retransmit what is due (doubling its timeout) and give up on peers past the deadline.
    pub fn handle_timeout(&mut self, now: Time) {
        if now < self.timer_floor {
            return;
        }
        for pi in 0..self.peers.len() {
            if self.peers[pi].busy == 0 {
                continue;
            }
            let waiting =
                |s: &SendSlot| matches!(s.state, SendState::AwaitReply | SendState::AwaitNackAck);
            // Nothing due (the common case): no work beyond one scan of the slots.
            let (mut due, mut dead) = (false, false);
            for s in self.peers[pi].ss.iter().filter(|s| waiting(s)) {
                dead |= now >= s.give_up_at;
                due |= now >= s.next_retx;
            }
            if dead {
                self.peer_unreachable(pi);
                continue;
            }
            if !due {
                continue;
            }
            let rto_max = self.cfg.rto_max;
            let (tx_queue, txq, stats) = (self.cfg.tx_queue, &mut self.txq, &mut self.stats);
            for (si, s) in self.peers[pi].ss.iter_mut().enumerate() {
                if !waiting(s) || now < s.next_retx {
                    continue;
                }
                s.retransmitted = true;
                s.rto = (s.rto * 2).min(rto_max);
                s.next_retx = now.plus(s.rto);
                let (peer, slot, seq) = (pi as u32, si as u16, s.seq);
                let t = if s.state == SendState::AwaitReply {
                    Tx::Req {
                        peer,
                        slot,
                        seq,
                        frag: 0,
                    }
                } else {
                    Tx::ReplyNack { peer, slot, seq }
                };
                stats.retransmits += 1;
                if txq.len() >= tx_queue {
                    stats.tx_dropped += 1;
                } else {
                    txq.push_back(t);
                }
            }
        }
        self.timer_floor = self.poll_timeout().unwrap_or(Time(u64::MAX));
    }

    /// Return everything outstanding towards peer `pi` as unreachable and start a new epoch,
    /// so that late replies are rejected and the peer starts a fresh sequence space.
    fn peer_unreachable(&mut self, pi: usize) {
        let p = &mut self.peers[pi];
        let mut out = Vec::new();
        for (si, s) in p.ss.iter_mut().enumerate() {
            match s.state {
                SendState::AwaitReply => {
                    s.state = SendState::Returning;
                    out.push(RetEntry {
                        r: returned_of(&s.msg, s.dest, Status::Unreachable, true),
                        slot: Some((pi as u32, si as u16, s.seq)),
                    });
                }
                SendState::AwaitNackAck => {
                    s.state = SendState::Free;
                    p.busy -= 1;
                }
                SendState::Free | SendState::Returning => {}
            }
        }
        p.epoch = p.epoch.wrapping_add(1);
        p.known_inc = 0;
        p.fifo_tx = 0;
        for e in out {
            self.push_returned(e);
        }
    }

    fn push_returned(&mut self, e: RetEntry) {
        self.stats.returned += 1;
        self.returned.push_back(e);
    }

    /// The next returned message for handler 0. Taking it frees its request slot.
    pub fn poll_returned(&mut self) -> Option<Returned> {
        let e = self.returned.pop_front()?;
        if let Some((pi, si, seq)) = e.slot {
            let p = &mut self.peers[pi as usize];
            let s = &mut p.ss[usize::from(si)];
            if s.state == SendState::Returning && s.seq == seq {
                s.state = SendState::Free;
                p.busy -= 1;
            }
        }
        Some(e.r)
    }

    /// Are returned messages waiting?
    pub fn has_returned(&self) -> bool {
        !self.returned.is_empty()
    }

    // ---------------------------------------------------------------- receiving

    /// Process one received datagram, running handlers through `d`.
    pub fn handle_datagram(
        &mut self,
        now: Time,
        from: NodeAddr,
        bytes: &[u8],
        d: &mut dyn Dispatch,
    ) {
        let Ok(f) = frame::decode(bytes) else {
            self.stats.bad_frames += 1;
            return;
        };
        match f.h.kind {
            Kind::Request => self.on_request(from, &f, d),
            Kind::Reply | Kind::Ack | Kind::Nack => self.on_response(now, from, &f, d),
            Kind::ReplyNack => self.on_reply_nack(from, &f),
            Kind::ReplyNackAck => self.on_reply_nack_ack(from, &f),
        }
    }

    fn ctl_answer(&mut self, to: NodeAddr, f: &Header, kind: Kind, status: Option<Status>) {
        let mut h = Header::new(kind, f.class);
        h.status = status;
        h.src_ep = f.dst_ep;
        h.dst_ep = f.src_ep;
        h.route(f.slot, f.seq, f.epoch, (self.inc, f.src_inc));
        self.push_tx(Tx::Ctl { to, h });
    }

    fn on_request(&mut self, from: NodeAddr, f: &Frame<'_>, d: &mut dyn Dispatch) {
        let h = f.h;
        if h.dst_inc != 0 && h.dst_inc != self.inc {
            // Meant for an earlier incarnation of this node: never deliver it.
            self.ctl_answer(from, &h, Kind::Nack, Some(Status::Unreachable));
            return;
        }
        if usize::from(h.slot) >= MAX_SLOTS || h.src_inc == 0 {
            self.stats.bad_frames += 1;
            return;
        }
        let Some(pi) = self.peer_index(from) else {
            self.ctl_answer(from, &h, Kind::Nack, Some(Status::Congestion));
            return;
        };
        let p = &mut self.peers[pi as usize];
        let newer =
            !p.r_seen || h.src_inc > p.r_inc || (h.src_inc == p.r_inc && h.epoch > p.r_epoch);
        if newer {
            p.r_seen = true;
            p.r_inc = h.src_inc;
            p.r_epoch = h.epoch;
            p.fifo_rx = 0;
            for rs in &mut p.rs {
                rs.state = RecvState::Empty;
            }
        } else if h.src_inc != p.r_inc || h.epoch != p.r_epoch {
            self.stats.stale_frames += 1;
            return;
        }
        let si = usize::from(h.slot);
        while p.rs.len() <= si {
            p.rs.push(RecvSlot::new());
        }
        let rs = &mut p.rs[si];
        if rs.state != RecvState::Empty {
            if h.seq == rs.seq {
                match rs.state {
                    RecvState::Done => {
                        self.stats.dup_requests += 1;
                        self.push_tx(Tx::Resp {
                            peer: pi,
                            slot: h.slot,
                            seq: h.seq,
                            frag: 0,
                        });
                    }
                    RecvState::Assembling => self.absorb(pi, si, f, d),
                    RecvState::Waiting | RecvState::Empty => {}
                }
                return;
            }
            if h.seq != rs.seq.wrapping_add(1) || rs.state != RecvState::Done {
                self.stats.stale_frames += 1;
                return;
            }
        }
        // A new request in this slot (which implicitly acknowledges the previous reply).
        rs.state = RecvState::Assembling;
        rs.seq = h.seq;
        rs.resp_returned = false;
        let m = &mut rs.req;
        m.class = h.class;
        m.handler = h.handler;
        m.src_ep = h.src_ep;
        m.dst_ep = h.dst_ep;
        m.tag = h.tag;
        m.args = f.args;
        m.nargs = h.nargs;
        m.total_len = h.total_len;
        m.dest_offset = h.dest_offset;
        m.src_offset = h.src_offset;
        m.fifo = (h.flags & FLAG_FIFO != 0).then_some(h.fifo_seq);
        m.payload.clear();
        if h.class == Class::Xfer {
            rs.reasm.start(h.total_len, u32::from(h.frag_chunk));
        }
        self.absorb(pi, si, f, d);
    }

    /// Take in a frame of the request assembling in slot `si` of peer `pi`; deliver when
    /// complete and in turn.
    fn absorb(&mut self, pi: u32, si: usize, f: &Frame<'_>, d: &mut dyn Dispatch) {
        let h = &f.h;
        let p = &mut self.peers[pi as usize];
        let rs = &mut p.rs[si];
        if h.class != rs.req.class {
            self.stats.bad_frames += 1;
            return;
        }
        if h.class == Class::Xfer {
            if !rs.reasm.matches(h) {
                self.stats.bad_frames += 1;
                return;
            }
            if !rs.reasm.mark(h.frag_offset) {
                return;
            }
            // Write the fragment now, but only where the message may write at all.
            let ok = self.eps.get(usize::from(h.dst_ep)).is_some_and(|e| {
                e.live
                    && Tag(h.tag).admits(e.tag)
                    && seg_check(e.seg.len(), h.dest_offset, h.total_len).is_ok()
            });
            if ok {
                let seg = &mut self.eps[usize::from(h.dst_ep)].seg;
                let at = h.dest_offset as usize + h.frag_offset as usize;
                seg[at..at + f.payload.len()].copy_from_slice(f.payload);
            }
            if !rs.reasm.complete() {
                return;
            }
        }
        let in_turn = match rs.req.fifo {
            None => true,
            Some(fs) => fs == p.fifo_rx,
        };
        if !in_turn {
            let ahead = rs.req.fifo.unwrap_or(0).wrapping_sub(p.fifo_rx);
            if ahead as usize > MAX_SLOTS * 4 {
                self.stats.stale_frames += 1;
                rs.state = RecvState::Empty;
                return;
            }
            if h.class == Class::Medium {
                rs.req.payload.clear();
                rs.req.payload.extend_from_slice(f.payload);
            }
            rs.state = RecvState::Waiting;
            self.stats.fifo_parked += 1;
            return;
        }
        self.deliver(pi, si, Some(f.payload), d);
        if self.peers[pi as usize].rs[si].req.fifo.is_some() {
            self.drain_fifo(pi, d);
        }
    }

    fn drain_fifo(&mut self, pi: u32, d: &mut dyn Dispatch) {
        loop {
            let p = &mut self.peers[pi as usize];
            p.fifo_rx = p.fifo_rx.wrapping_add(1);
            let next = p.fifo_rx;
            let Some(si) =
                p.rs.iter()
                    .position(|r| r.state == RecvState::Waiting && r.req.fifo == Some(next))
            else {
                return;
            };
            self.deliver(pi, si, None, d);
        }
    }

    /// Validate a complete request against the destination endpoint as it is now, run its
    /// handler (or serve a get), and record the response in the reply cache.
    fn deliver(&mut self, pi: u32, si: usize, payload: Option<&[u8]>, d: &mut dyn Dispatch) {
        let peer_addr = self.peers[pi as usize].addr;
        let status = validate_request(&self.eps, &self.peers[pi as usize].rs[si].req, &*d);
        if status == Err(Status::BadTag) {
            self.stats.bad_tag += 1;
        }
        let rs = &mut self.peers[pi as usize].rs[si];
        let req = &rs.req;
        let ep = EpId(req.dst_ep);
        let resp = match status {
            Err(s) => Resp::Nack(s),
            Ok(()) if req.class == Class::Get => {
                let seg = &self.eps[usize::from(ep.0)].seg;
                let r = &mut rs.resp_msg;
                r.class = Class::Xfer;
                r.handler = req.handler;
                r.args = req.args;
                r.nargs = req.nargs;
                r.tag = req.tag;
                r.dest_offset = req.dest_offset;
                r.src_offset = 0;
                r.fifo = None;
                let (a, n) = (req.src_offset as usize, req.total_len as usize);
                r.set_payload(&seg[a..a + n]);
                Resp::Reply
            }
            Ok(()) => {
                let mut buf = std::mem::take(&mut rs.req.payload);
                let req = &rs.req;
                let medium = payload.unwrap_or(&buf);
                let (info, data) = handed!(req, req.args, peer_addr, ep, true, medium);
                self.sink.replied = false;
                let seg = &mut self.eps[usize::from(ep.0)].seg;
                d.on_request(Request {
                    info,
                    data,
                    seg,
                    sink: &mut self.sink,
                });
                self.stats.requests_handled += 1;
                buf.clear();
                rs.req.payload = buf;
                if self.sink.replied {
                    std::mem::swap(&mut rs.resp_msg, &mut self.sink.msg);
                    Resp::Reply
                } else {
                    self.stats.auto_acks += 1;
                    Resp::Ack
                }
            }
        };
        rs.resp = resp;
        rs.state = RecvState::Done;
        let seq = rs.seq;
        self.push_tx(Tx::Resp {
            peer: pi,
            slot: si as u16,
            seq,
            frag: 0,
        });
    }

    fn on_response(&mut self, now: Time, from: NodeAddr, f: &Frame<'_>, d: &mut dyn Dispatch) {
        let h = f.h;
        let Some(pi) = self.lookup(from) else {
            self.stats.stale_frames += 1;
            return;
        };
        if h.dst_inc != self.inc {
            self.stats.stale_frames += 1;
            return;
        }
        let p = &mut self.peers[pi as usize];
        let si = usize::from(h.slot);
        if h.epoch != p.epoch {
            // An answer to a request already returned as unreachable: never deliver it.
            self.stats.stale_frames += 1;
            if h.kind == Kind::Reply {
                self.ctl_answer(from, &h, Kind::ReplyNack, Some(Status::ReplyRejected));
            }
            return;
        }
        let Some(s) =
            p.ss.get(si)
                .filter(|s| s.state == SendState::AwaitReply && s.seq == h.seq)
        else {
            self.stats.dup_responses += 1;
            return;
        };
        // Karn: only unretransmitted requests give round-trip samples.
        if !s.retransmitted && !s.reasm.active {
            let sample = now.since(s.sent_at);
            p.observe_rtt(sample);
        }
        p.known_inc = h.src_inc;
        let s = &mut p.ss[si];
        match h.kind {
            Kind::Ack => self.free_slot(pi, si),
            Kind::Nack if h.status == Some(Status::Unreachable) => {
                // The peer restarted: everything outstanding towards it may or may not have
                // run on the old incarnation.
                self.peer_unreachable(pi as usize);
            }
            Kind::Nack => {
                let status = h.status.unwrap_or(Status::BadArgs);
                s.state = SendState::Returning;
                let e = RetEntry {
                    r: returned_of(&s.msg, s.dest, status, true),
                    slot: Some((pi, si as u16, s.seq)),
                };
                self.push_returned(e);
            }
            _ => self.on_reply(now, pi, si, f, d),
        }
    }

    fn free_slot(&mut self, pi: u32, si: usize) {
        let p = &mut self.peers[pi as usize];
        p.ss[si].state = SendState::Free;
        p.busy -= 1;
    }

    fn on_reply(&mut self, now: Time, pi: u32, si: usize, f: &Frame<'_>, d: &mut dyn Dispatch) {
        let h = f.h;
        let ep = EpId(h.dst_ep);
        let addr = self.peers[pi as usize].addr;
        let s = &mut self.peers[pi as usize].ss[si];
        let mut status = if h.dst_ep != s.msg.src_ep {
            Err(Status::BadEndpoint)
        } else {
            match self.eps.get(usize::from(ep.0)).filter(|e| e.live) {
                None => Err(Status::BadEndpoint),
                Some(_) if d.handler_kind(ep, HandlerId(h.handler)) != HandlerKind::Reply => {
                    Err(Status::BadHandler)
                }
                Some(e) if h.class == Class::Xfer => {
                    seg_check(e.seg.len(), h.dest_offset, h.total_len)
                }
                Some(_) => Ok(()),
            }
        };
        if status.is_ok() && h.class == Class::Xfer {
            if !s.reasm.active {
                s.reasm.start(h.total_len, u32::from(h.frag_chunk));
            }
            if !s.reasm.matches(&h) {
                status = Err(Status::BadArgs);
            } else if s.reasm.mark(h.frag_offset) {
                let seg = &mut self.eps[usize::from(ep.0)].seg;
                let at = h.dest_offset as usize + h.frag_offset as usize;
                seg[at..at + f.payload.len()].copy_from_slice(f.payload);
            }
            if status.is_ok() && !s.reasm.complete() {
                return;
            }
        }
        if let Err(st) = status {
            // Return the reply to the replier, reliably: keep the slot until it acknowledges.
            s.state = SendState::AwaitNackAck;
            s.nack_status = st;
            s.rto = self.cfg.rto_initial;
            s.next_retx = now.plus(s.rto);
            s.give_up_at = now.plus(self.cfg.give_up);
            self.timer_floor = self.timer_floor.min(s.next_retx.min(s.give_up_at));
            let seq = s.seq;
            self.push_tx(Tx::ReplyNack {
                peer: pi,
                slot: si as u16,
                seq,
            });
            return;
        }
        let (info, data) = handed!(h, f.args, addr, ep, false, f.payload);
        let seg = &mut self.eps[usize::from(ep.0)].seg;
        d.on_reply(Reply { info, data, seg });
        self.stats.replies_handled += 1;
        self.free_slot(pi, si);
    }

    fn on_reply_nack(&mut self, from: NodeAddr, f: &Frame<'_>) {
        let h = f.h;
        if h.dst_inc != self.inc {
            self.stats.stale_frames += 1;
            return;
        }
        if let Some(pi) = self.lookup(from) {
            let p = &mut self.peers[pi as usize];
            let current = p.r_seen && h.src_inc == p.r_inc && h.epoch == p.r_epoch;
            if let Some(rs) = p.rs.get_mut(usize::from(h.slot)).filter(|_| current) {
                let fresh = rs.state == RecvState::Done
                    && rs.seq == h.seq
                    && rs.resp == Resp::Reply
                    && !rs.resp_returned;
                if fresh {
                    rs.resp_returned = true;
                    let dest = EndpointName {
                        node: p.addr,
                        ep: EpId(rs.req.src_ep),
                    };
                    let status = h.status.unwrap_or(Status::ReplyRejected);
                    let r = returned_of(&rs.resp_msg, dest, status, false);
                    self.push_returned(RetEntry { r, slot: None });
                }
            }
        }
        self.ctl_answer(from, &h, Kind::ReplyNackAck, None);
    }

    fn on_reply_nack_ack(&mut self, from: NodeAddr, f: &Frame<'_>) {
        let h = f.h;
        let Some(pi) = self.lookup(from) else {
            return;
        };
        let p = &self.peers[pi as usize];
        let si = usize::from(h.slot);
        let ok = h.dst_inc == self.inc
            && h.epoch == p.epoch
            && p.ss
                .get(si)
                .is_some_and(|s| s.state == SendState::AwaitNackAck && s.seq == h.seq);
        if ok {
            self.free_slot(pi, si);
        } else {
            self.stats.dup_responses += 1;
        }
    }
}

impl Peer {
    fn rto(&self, cfg: &Config) -> Duration {
        match self.srtt {
            None => cfg.rto_initial,
            Some(s) => (s + 4 * self.rttvar).clamp(cfg.rto_min, cfg.rto_max),
        }
    }

    fn observe_rtt(&mut self, sample: Duration) {
        match self.srtt {
            None => {
                self.srtt = Some(sample);
                self.rttvar = sample / 2;
            }
            Some(s) => {
                let err = s.abs_diff(sample);
                self.rttvar = (self.rttvar * 3 + err) / 4;
                self.srtt = Some((s * 7 + sample) / 8);
            }
        }
    }
}

fn validate_request(eps: &[EpState], req: &OutMsg, d: &dyn Dispatch) -> Result<(), Status> {
    let ep = EpId(req.dst_ep);
    let e = eps
        .get(usize::from(ep.0))
        .filter(|e| e.live)
        .ok_or(Status::BadEndpoint)?;
    if !Tag(req.tag).admits(e.tag) {
        return Err(Status::BadTag);
    }
    match req.class {
        Class::Get => seg_check(e.seg.len(), req.src_offset, req.total_len),
        _ if d.handler_kind(ep, HandlerId(req.handler)) != HandlerKind::Request => {
            Err(Status::BadHandler)
        }
        Class::Xfer => seg_check(e.seg.len(), req.dest_offset, req.total_len),
        _ => Ok(()),
    }
}

fn msg_header(kind: Kind, m: &OutMsg) -> Header {
    let mut h = Header::new(kind, m.class);
    h.handler = m.handler;
    h.src_ep = m.src_ep;
    h.dst_ep = m.dst_ep;
    h.tag = m.tag;
    h.nargs = m.nargs;
    h.total_len = m.total_len;
    h.dest_offset = m.dest_offset;
    h.src_offset = m.src_offset;
    if let Some(fs) = m.fifo {
        h.flags |= FLAG_FIFO;
        h.fifo_seq = fs;
    }
    h
}

fn returned_of(m: &OutMsg, dest: EndpointName, status: Status, request: bool) -> Returned {
    let opcode: Opcode = m.class.opcode(request);
    Returned {
        status,
        opcode,
        ep: EpId(m.src_ep),
        dest,
        handler: HandlerId(m.handler),
        tag: Tag(m.tag),
        args: m.args,
        nargs: m.nargs,
        len: m.total_len,
        dest_offset: m.dest_offset,
    }
}
