//! Packet links for the Isotach daemons, sans-IO: a reliable, per-peer FIFO packet service to
//! a fixed list of peers over one AM [`Core`], with a hello handshake, fragmentation, an
//! end-to-end credit window, back-pressure, peer-loss detection and rejoin. Peers are linked
//! at once or on first use ([`PeerList`]).
//!
//! [`Links`] is a state machine in the style of `quinn-proto`: time is passed in, datagrams go
//! in through [`Links::handle_datagram`] and out through [`Links::poll_transmit`], timers
//! through [`Links::handle_timeout`] / [`Links::poll_timeout`]; packets go in with
//! [`Links::send`] and out with [`Links::recv`]; [`Links::poll_event`] says when a peer came
//! up or was lost. No sockets, clocks, locks or closures. `isotach-am`'s `PacketPort` drives
//! it over a socket; the simulator drives it over its faulty network.
//!
//! The rules (the wire is specified in `docs/wire.md`, "Link layer"):
//! - every peer has per-peer FIFO delivery on, so packets arrive exactly once and in order;
//! - a packet longer than [`FRAGMENT_MAX`] travels as consecutive medium fragments on
//!   [`H_DATA`] (argument 0: more follows; argument 1: the sender's *stream*, how often its
//!   link to the peer broke, so a fragment returned from an earlier stream does not break
//!   the current one); reassembly is a concatenation;
//! - small packets queued together travel as one *batch* on [`H_BATCH`] (argument 0: the
//!   format's [`BATCH_VERSION`]; argument 1: the stream): whole packets, each after its
//!   length, as many as fit one medium payload ([`batch`]). A batch starts only between
//!   packets, so the peer's FIFO order is the packets' order whatever mix of fragments and
//!   batches carries them. A batch the receiver cannot read whole (unknown version, a length
//!   running past its end) loses packets: the link breaks ([`LossReason::BadBatch`]), as for
//!   any other hole in the stream;
//! - a peer is *up* once it answered our hello ([`H_HELLO`] answered by a reply on
//!   [`H_HELLO_ACK`]). Packets for a peer that is not up wait (in order) and leave when it is;
//! - a link *breaks* when a data fragment comes back undelivered, when the peer says hello
//!   from a new incarnation (it restarted and forgot the stream), or when a queue
//!   overflowed: [`LinkEvent::PeerLost`], the queue towards it is dropped (the stream has a
//!   hole), the peer is down and a new hello goes out; [`LinkEvent::PeerUp`] follows;
//! - flow control: at most a *window* of data messages (fragments and batches) the peer's
//!   driver has not finished yet are in flight; the receiver returns credit ([`H_CREDIT`]) in
//!   lots of [`CREDIT_BATCH`] messages as its driver takes packets (a batch once its last
//!   packet is taken). A driver that stops reading stops its peers after one window, their
//!   queues fill and [`Links::has_room`] turns false: back-pressure without loss;
//! - every queue is bounded: [`Links::set_queue_max`] fragments per peer (each packet counts
//!   the fragments it would take on its own, one for a small packet, whether it leaves in a
//!   batch or not); the inbox holds at most every peer's largest window of the fullest
//!   batches. Beyond that a packet is dropped, counted and the link breaks;
//! - messages from addresses that are not configured peers, or with a foreign tag, are
//!   dropped and counted.
//!
//! The code: this file holds the limits, the links' state and the [`Links`] API for packets
//! and status; `types` the events, outcomes and counters it hands out; `state` the bookkeeping every part shares (ready
//! peers, hello timers, breaking a link); `handlers` what arrives (the AM handlers the core
//! runs); `transmit` datagrams and time in and out, and pushing hellos, credit, fragments and
//! batches into the core; `batch` the batch payload's encoding and decoding.

use rustc_hash::FxHashMap;
use std::collections::{BTreeSet, VecDeque};
use std::time::Duration;

#[cfg(doc)]
use crate::core::Dispatch;
use crate::core::{Config, Core};
use crate::error::AmError;
use crate::types::{
    DEFAULT_TRANSLATIONS, EndpointName, EpId, HandlerId, MAX_MEDIUM_BYTES, MAX_SLOTS, NodeAddr,
    Tag, Time, TransIdx,
};

pub mod batch;
mod handlers;
mod peers;
mod spare;
mod state;
mod transmit;
mod types;

pub use batch::{BATCH_PACKET_MAX, BATCH_PACKETS_MAX, BATCH_VERSION};
pub use peers::{Directory, PeerList};
pub use types::{LinkEvent, LinkStats, LossReason, Offered, PeerStatus};

/// How long links hold an automatic acknowledgement for other traffic to its peer
/// ([`Config::ack_delay`]): on a busy link it nearly always leaves with the next datagram.
/// Well below the default retransmission floor (10 ms), which the requester's round-trip
/// sample (it includes the hold) must stay under. (An idle wave's acknowledgements mostly
/// leave alone at the default 5 ms pace; 8 ms changed no idle CPU figure.) And half a millisecond over the UDP backend's shortest blocking receive
/// (4.5 ms, `BLOCKING_RECV_MIN`, checked there): a busy daemon holds an acknowledgement after
/// almost every datagram, so its next wait ends at that deadline, and at 4 ms every such
/// wait took a `poll` and a receive (two system calls) instead of one blocking receive.
pub const LINK_ACK_DELAY: Duration = Duration::from_millis(5);

/// Handler of a data fragment (request, medium; args: more follows, stream).
pub const H_DATA: HandlerId = HandlerId(1);
/// Handler of a hello (request, short; args: cluster tag, incarnation).
pub const H_HELLO: HandlerId = HandlerId(2);
/// Handler of the hello's answer (reply, short, no args).
pub const H_HELLO_ACK: HandlerId = HandlerId(3);
/// Handler of returned credit (request, short; args: data messages the driver finished,
/// stream).
pub const H_CREDIT: HandlerId = HandlerId(4);
/// Handler of a batch of whole packets (request, medium; args: format version, stream).
pub const H_BATCH: HandlerId = HandlerId(5);
/// The endpoint every link uses (the first one a core allocates).
pub const LINK_EP: EpId = EpId(0);
/// The tag of Isotach cluster traffic when the configuration names none.
pub const DEFAULT_TAG: Tag = Tag(0x1507_AC40_0000_0001);
/// Largest packet a link carries.
pub const PACKET_MAX: usize = 64 * 1024;
/// Largest fragment (a medium message's payload).
pub const FRAGMENT_MAX: usize = MAX_MEDIUM_BYTES;
/// Default of [`Links::set_queue_max`] (fragments per peer).
pub const QUEUE_MAX_DEFAULT: usize = 65_536;
/// Largest flow-control window (data messages, fragments or batches, in flight towards one
/// peer).
pub const WINDOW_MAX: usize = 1024;
/// Smallest window: the fragments of the largest packet (credit is returned per whole packet
/// taken, so a smaller window could never complete one).
pub const WINDOW_MIN: usize = PACKET_MAX / FRAGMENT_MAX + 1;
/// Data messages finished before credit goes back: a quarter of the smallest window any
/// sender may use, so a sender that used its whole window has sent at least that much and
/// never waits on us for long, while credit costs one short message per this many messages.
pub const CREDIT_BATCH: usize = WINDOW_MIN / 4;
/// Whole packets the inbox holds beyond every peer's largest window of full batches.
const INBOX_SLACK: usize = 64;
/// A hello the peer acknowledged but did not answer (it does not know our address) is sent
/// again after this long; a hello that came back refused waits this long before the next.
pub const HELLO_RETRY: Duration = Duration::from_secs(1);

/// Fragments a packet of `len` bytes travels as (an empty packet is one empty fragment).
pub fn fragments(len: usize) -> usize {
    // Not a clamp: `div_ceil` says 0 for an empty packet, which still travels as one fragment.
    len.div_ceil(FRAGMENT_MAX).max(1)
}

/// Smallest queue bound [`Links::set_queue_max`] takes (the cluster config's lower bound,
/// `QUEUE_PACKETS_MAX_MIN`, is above it).
pub const QUEUE_MAX_MIN: usize = 1;

// The limits agree with each other: the largest packet fits the smallest window, credit goes
// back before a smallest window is used up, and the defaults are in range.
const _: () = {
    assert!(WINDOW_MIN > PACKET_MAX.div_ceil(FRAGMENT_MAX));
    assert!(WINDOW_MIN <= WINDOW_MAX);
    assert!(CREDIT_BATCH >= 1 && CREDIT_BATCH < WINDOW_MIN);
    assert!(QUEUE_MAX_MIN <= QUEUE_MAX_DEFAULT);
    assert!(BATCH_PACKET_MAX < FRAGMENT_MAX);
};

/// Most whole packets the inbox holds for `peers` peers: each has at most a window of data
/// messages in flight towards us (credit for a message goes back only once its last packet
/// left the inbox), each message at most [`BATCH_PACKETS_MAX`] packets. Saturating: a
/// bound this large is never reached before memory is.
fn inbox_max(peers: usize) -> usize {
    peers
        .saturating_mul(WINDOW_MAX * BATCH_PACKETS_MAX)
        .saturating_add(INBOX_SLACK)
}

// The links' private state. It is defined here rather than beside the code that uses it so
// that its fields stay private to the links (the files in `link/` are child modules and see
// them). `State` is the `Dispatch` the AM core runs the link handlers on, so it holds
// everything a handler touches and nothing of the core, which borrows it while a handler
// runs.

/// A received packet waiting for the driver.
#[derive(Debug)]
struct Arrived {
    /// The peer's slot (see [`State::peers`]).
    peer: usize,
    bytes: Vec<u8>,
    /// Data messages whose credit taking it completes: the fragments of a fragmented packet,
    /// 1 for the last packet of a batch, 0 for the others.
    fragments: usize,
    /// The sender's stream it came on (credit for it is only owed on the same stream).
    stream: u64,
}

#[derive(Debug)]
struct Peer {
    /// Its peer id (see [`PeerList`]).
    id: usize,
    addr: NodeAddr,
    /// Its entry in the AM translation table; `None` for an on-demand peer that appeared
    /// while the core ran a handler, until [`Links::map_new_peers`] maps it.
    idx: Option<TransIdx>,
    up: bool,
    hello_outstanding: bool,
    /// Times the link broke: the stream number data fragments carry.
    links_lost: u64,
    /// The peer's incarnation, from its hellos (0: none seen yet).
    incarnation: u64,
    /// Whole packets waiting for the peer or for credit; the head may be partly sent.
    out: VecDeque<Vec<u8>>,
    /// Bytes of `out[0]` already sent.
    head_sent: usize,
    /// Fragments in `out` not sent yet: every packet counts the fragments it takes on its own
    /// ([`fragments`]), even when it leaves in a batch (one message for many of them).
    queued: usize,
    /// Data messages (fragments and batches) sent that the peer's driver has not finished
    /// yet (as far as credit tells).
    in_flight: usize,
    /// Data messages of the peer's our driver finished and we have not credited back yet.
    owed: usize,
    /// The packet being reassembled and its fragments so far.
    partial: Vec<u8>,
    partial_frags: usize,
    /// The peer's stream towards us, from its last data fragment (its own break count).
    rx_stream: u64,
    /// Dropping fragments until the current packet's last one (it was oversize).
    discarding: bool,
    /// Hello retry or backoff deadline (see [`HELLO_RETRY`]); also in
    /// [`State::hello_timers`]: change it only with [`State::set_hello_timer`].
    hello_timer: Option<Time>,
    /// The AM core had no slot for us: retry when the peer answers something.
    am_blocked: bool,
    /// In [`State::ready`].
    ready: bool,
}

impl Peer {
    /// A peer in state `ready` (an eager peer starts ready: its hello goes first).
    fn new(id: usize, addr: NodeAddr, idx: Option<TransIdx>, ready: bool) -> Self {
        Self {
            id,
            addr,
            idx,
            up: false,
            hello_outstanding: false,
            links_lost: 0,
            incarnation: 0,
            out: VecDeque::new(),
            head_sent: 0,
            queued: 0,
            in_flight: 0,
            owed: 0,
            partial: Vec::new(),
            partial_frags: 0,
            rx_stream: 0,
            discarding: false,
            hello_timer: None,
            am_blocked: false,
            ready,
        }
    }
}

/// Everything the handlers touch (the [`Dispatch`] the core runs them on).
#[derive(Debug)]
struct State {
    /// Who the peers are, by id.
    list: PeerList,
    /// The state of every peer in use, by *slot*: the eager peers at slots equal to their
    /// ids, then on-demand peers in the order they were first used. Everything inside the
    /// links works on slots; the API speaks peer ids.
    peers: Vec<Peer>,
    /// The slot of each on-demand peer in use.
    slot_of: FxHashMap<usize, usize>,
    /// On-demand peers that appeared while the core ran a handler, to map.
    unmapped: Vec<usize>,
    inbox: VecDeque<Arrived>,
    inbox_max: usize,
    /// Buffers drivers handed back, for the next batched packets.
    spare: spare::Spare,
    events: VecDeque<LinkEvent>,
    /// Peers that may have something to send (hello, credit, fragments, batches).
    ready: Vec<usize>,
    /// The batch being built (one medium payload, reused for every batch: no allocation
    /// per packet).
    batch: Vec<u8>,
    /// Every armed hello timer as (deadline, peer), earliest first: at most one per peer, so
    /// finding the next deadline or the due timers never scans the peers (thousands of them).
    hello_timers: BTreeSet<(Time, usize)>,
    /// This process's incarnation: hellos and their replies carry it.
    incarnation: u64,
    stats: LinkStats,
}

/// Reliable FIFO packet links to a fixed set of peers. See the module documentation.
#[derive(Debug)]
pub struct Links {
    core: Core,
    st: State,
    tag: Tag,
    /// Most fragments queued towards one peer.
    queue_max: usize,
}

impl Links {
    /// AM settings for links: full credits (every slot), acknowledgements held for
    /// [`LINK_ACK_DELAY`], otherwise the defaults.
    pub fn am_config() -> Config {
        Config {
            credits: MAX_SLOTS,
            ack_delay: LINK_ACK_DELAY,
            ..Config::default()
        }
    }

    /// Links from `local` (incarnation `incarnation`, must grow across restarts) to `peers`
    /// (index = peer id), all linked at once, tagged `tag`, over datagrams of at most
    /// `max_datagram` bytes.
    pub fn new(
        cfg: Config,
        local: NodeAddr,
        incarnation: u64,
        max_datagram: usize,
        peers: &[NodeAddr],
        tag: Tag,
    ) -> Result<Self, AmError> {
        let list = PeerList::eager(peers)?;
        Self::with_peers(cfg, local, incarnation, max_datagram, list, tag)
    }

    /// Links as [`Links::new`] makes them, to the peers of `list`: its eager peers are
    /// linked at once, its on-demand peers on first use. The AM core keeps state for up to
    /// every listed peer (`cfg.max_peers` is raised to the list's length if below).
    pub fn with_peers(
        mut cfg: Config,
        local: NodeAddr,
        incarnation: u64,
        max_datagram: usize,
        list: PeerList,
        tag: Tag,
    ) -> Result<Self, AmError> {
        list.check_size()?;
        cfg.max_peers = cfg.max_peers.max(list.len());
        let mut core = Core::new(cfg, local, incarnation, max_datagram)?;
        let ep = core.alloc_endpoint()?;
        debug_assert_eq!(ep, LINK_EP);
        core.set_tag(ep, tag)?;
        // Room for every listed peer (and one spare) from the start: the table takes memory
        // only for the entries mapped, so on-demand peers cost nothing until used.
        core.set_num_translations(ep, (list.len() + 1).max(DEFAULT_TRANSLATIONS))?;
        let eager = list.eager_len();
        let mut ps = Vec::with_capacity(eager);
        for i in 0..eager {
            let addr = list.addr(i).expect("an eager peer");
            let idx = map_peer(&mut core, addr, tag)?;
            ps.push(Peer::new(i, addr, Some(idx), true));
        }
        let peers = list.len();
        Ok(Self {
            core,
            st: State {
                ready: (0..eager).collect(),
                peers: ps,
                slot_of: FxHashMap::default(),
                unmapped: Vec::new(),
                list,
                inbox: VecDeque::new(),
                inbox_max: inbox_max(peers),
                spare: spare::Spare::default(),
                events: VecDeque::new(),
                batch: Vec::with_capacity(FRAGMENT_MAX),
                hello_timers: BTreeSet::new(),
                incarnation,
                stats: LinkStats::default(),
            },
            tag,
            queue_max: QUEUE_MAX_DEFAULT,
        })
    }

    /// Bounds every per-peer send queue to `fragments` (at least [`QUEUE_MAX_MIN`]: panics
    /// below), and the window to the same within [`WINDOW_MIN`]..=[`WINDOW_MAX`]; the
    /// cluster config's `queue-packets-max` (validated, never 0) is the daemons' value. A
    /// packet counts the fragments it takes on its own — one for a packet of up to
    /// [`FRAGMENT_MAX`] bytes — whether it then leaves in a batch or not, so the bound is in
    /// packets for small packets and in bytes for large ones.
    pub fn set_queue_max(&mut self, fragments: usize) {
        assert!(
            fragments >= QUEUE_MAX_MIN,
            "a link queue holds at least {QUEUE_MAX_MIN} fragment (asked for {fragments})"
        );
        self.queue_max = fragments;
    }

    /// The flow-control window: data messages (fragments or batches) in flight towards one
    /// peer. Not a silent clamp:
    /// the window is the queue bound kept within [`WINDOW_MIN`] (the largest packet must fit)
    /// and [`WINDOW_MAX`].
    pub fn window(&self) -> usize {
        let w = self.queue_max.clamp(WINDOW_MIN, WINDOW_MAX);
        debug_assert!((WINDOW_MIN..=WINDOW_MAX).contains(&w));
        w
    }

    /// Can `peer` take another packet of up to one fragment without overflowing its queue? A
    /// driver holds its output back while this is false (back-pressure).
    pub fn has_room(&self, peer: usize) -> bool {
        match self.st.slot(peer) {
            Some(slot) => self.st.peers[slot].queued < self.queue_max,
            // An on-demand peer not in use yet has an empty queue.
            None => peer < self.st.list.len(),
        }
    }

    /// Queues `packet` for `peer` (in order after everything queued before). A packet that
    /// does not fit the queue is dropped and breaks the link ([`LossReason::SendOverflow`]):
    /// drivers check [`Links::has_room`] first, or use [`Links::offer`].
    pub fn send(&mut self, peer: usize, packet: Vec<u8>) -> Result<(), AmError> {
        if packet.len() > PACKET_MAX {
            return Err(AmError::BadArg("packet over link::PACKET_MAX"));
        }
        let queue_max = self.queue_max;
        let slot = self.use_peer(peer)?;
        let p = &mut self.st.peers[slot];
        let n = fragments(packet.len());
        if p.queued + n > queue_max {
            self.st.stats.fragments_dropped += n as u64;
            self.st.break_link(slot, LossReason::SendOverflow);
            return Ok(());
        }
        p.out.push_back(packet);
        p.queued += n;
        debug_assert!(p.queued <= queue_max, "queue bound overrun");
        self.st.stats.packets_sent += 1;
        self.st.mark_ready(slot);
        Ok(())
    }

    /// Sends `packet` to `peer` if its queue has room. Otherwise the packet is dropped when
    /// `redundant(packet)` says a copy of it is already on its way (a repeat token), or handed
    /// back to be held: the driver's back-pressure.
    pub fn offer(
        &mut self,
        peer: usize,
        packet: Vec<u8>,
        redundant: impl FnOnce(&[u8]) -> bool,
    ) -> Result<Offered, AmError> {
        if self.has_room(peer) {
            self.send(peer, packet)?;
            Ok(Offered::Sent)
        } else if redundant(&packet) {
            Ok(Offered::Dropped)
        } else {
            Ok(Offered::Held(packet))
        }
    }

    /// The next received packet and the peer it came from.
    pub fn recv(&mut self) -> Option<(usize, Vec<u8>)> {
        self.recv_where(|_| true)
    }

    /// Hands back a packet's buffer once the driver is done with it: the next batched
    /// packets arrive in it instead of in a new allocation (or it is freed, when the spares
    /// are full or it is out of bounds). Optional.
    pub fn recycle(&mut self, buf: Vec<u8>) {
        drop(self.st.spare.give(buf));
    }

    /// A spare buffer (empty; packets sent alone or taken from batches left it), for a caller
    /// that builds packets to build the next one in: buffers then circulate between what a
    /// node sends and what it receives instead of being allocated per packet.
    pub fn take_spare(&mut self) -> Option<Vec<u8>> {
        self.st.spare.take_kept()
    }

    /// The next received packet from a peer `accept` admits, and that peer. Packets of other
    /// peers stay, in order: a driver that cannot take more from one peer still takes packets
    /// from the others. Each peer's packets come in order.
    pub fn recv_where(&mut self, accept: impl Fn(usize) -> bool) -> Option<(usize, Vec<u8>)> {
        let peers = &self.st.peers;
        let i = self
            .st
            .inbox
            .iter()
            .position(|a| accept(peers[a.peer].id))?;
        let a = self.st.inbox.remove(i)?;
        let p = &mut self.st.peers[a.peer];
        if a.stream == p.rx_stream {
            p.owed += a.fragments;
        }
        let id = p.id;
        if p.owed >= CREDIT_BATCH {
            self.st.mark_ready(a.peer);
        }
        Some((id, a.bytes))
    }

    /// Are received packets waiting?
    pub fn has_packets(&self) -> bool {
        !self.st.inbox.is_empty()
    }

    /// The next peer event.
    pub fn poll_event(&mut self) -> Option<LinkEvent> {
        self.st.events.pop_front()
    }

    /// The tag of the links' traffic.
    pub fn tag(&self) -> Tag {
        self.tag
    }

    /// The AM core (statistics, outstanding requests).
    pub fn core(&self) -> &Core {
        &self.core
    }

    /// The configured peers' addresses, by peer id.
    pub fn peer_addrs(&self) -> impl Iterator<Item = NodeAddr> + '_ {
        let list = &self.st.list;
        (0..list.len()).filter_map(|i| list.addr(i))
    }

    /// Who the peers are.
    pub fn peer_list(&self) -> &PeerList {
        &self.st.list
    }

    /// Has the peer answered our hello (and no loss happened since)?
    pub fn is_up(&self, peer: usize) -> bool {
        self.st.slot(peer).is_some_and(|s| self.st.peers[s].up)
    }

    /// How many peers are up.
    pub fn peers_up(&self) -> usize {
        self.st.peers.iter().filter(|p| p.up).count()
    }

    /// Peers in use: the eager ones and the on-demand ones used so far.
    pub fn peers_in_use(&self) -> usize {
        self.st.peers.len()
    }

    /// Are all peers in use up (on-demand peers count once used)?
    pub fn all_up(&self) -> bool {
        self.st.peers.iter().all(|p| p.up)
    }

    /// Fragments waiting for a peer to come up or for credit, all peers (as
    /// [`Links::set_queue_max`] counts them).
    pub fn queued(&self) -> usize {
        self.st.peers.iter().map(|p| p.queued).sum()
    }

    /// Data messages (fragments and batches) sent to `peer` that its driver has not finished
    /// yet, as far as credit tells.
    pub fn in_flight(&self, peer: usize) -> usize {
        self.st.slot(peer).map_or(0, |s| self.st.peers[s].in_flight)
    }

    /// Every peer's state, by peer id.
    pub fn peer_status(&self) -> Vec<PeerStatus> {
        let list = &self.st.list;
        (0..list.len())
            .filter_map(|id| {
                let status = match self.st.slot(id) {
                    Some(s) => {
                        let p = &self.st.peers[s];
                        PeerStatus {
                            addr: p.addr,
                            up: p.up,
                            queued: p.queued,
                            links_lost: p.links_lost,
                            idle: false,
                        }
                    }
                    None => PeerStatus {
                        addr: list.addr(id)?,
                        up: false,
                        queued: 0,
                        links_lost: 0,
                        idle: true,
                    },
                };
                Some(status)
            })
            .collect()
    }

    /// Counters.
    pub fn stats(&self) -> LinkStats {
        self.st.stats
    }

    /// Breaks every on-demand link that is up, as a restart of its peer would: its queue is
    /// dropped and a new hello goes out before anything sent from now on; the driver sees
    /// [`LinkEvent::PeerLost`] with [`LossReason::Relink`].
    ///
    /// An on-demand peer that restarts says hello to nobody until it has something to send,
    /// so a link to it stays up on our side, and the first packet we send would reach the
    /// new process on the old stream, be refused and lost. A node calls this when it learns
    /// that peers may have restarted (an SIU: logical time restarted), so what it sends after
    /// is queued behind a new hello and reaches whichever process answers it. Returns the
    /// links broken.
    pub fn relink_on_demand(&mut self) -> usize {
        let eager = self.st.list.eager_len();
        let mut broken = 0;
        for slot in eager..self.st.peers.len() {
            if self.st.peers[slot].up {
                self.st.break_link(slot, LossReason::Relink);
                broken += 1;
            }
        }
        broken
    }

    /// Puts every on-demand peer in use and says hello to each, as a node that may have
    /// restarted must before it sends anything. A peer that linked to our previous
    /// incarnation holds a link that looks up to it; only a hello from us (a newer
    /// incarnation) makes it start over before it next sends to us, instead of sending on
    /// the old stream, which our AM layer refuses and the peer loses. Costs a hello and the
    /// link state of every peer: a node calls it when it restarts, not when a cluster
    /// starts for the first time. Returns the peers put in use now.
    pub fn link_every_peer(&mut self) -> Result<usize, AmError> {
        let mut added = 0;
        for peer in self.st.list.eager_len()..self.st.list.len() {
            if self.st.slot(peer).is_some() {
                continue;
            }
            let slot = self.use_peer(peer)?;
            self.st.mark_ready(slot);
            added += 1;
        }
        debug_assert_eq!(self.st.peers.len(), self.st.list.len(), "every peer in use");
        Ok(added)
    }

    /// The slot of `peer`, put in use (state made, translation mapped) if it is an on-demand
    /// peer not used before.
    fn use_peer(&mut self, peer: usize) -> Result<usize, AmError> {
        let slot = self
            .st
            .slot_or_add(peer)
            .ok_or(AmError::BadArg("no such peer"))?;
        self.map_new_peers()?;
        Ok(slot)
    }

    /// Maps the on-demand peers that came into use while the core ran a handler (it holds
    /// the translation table the handlers cannot reach; the table was sized for every listed
    /// peer).
    fn map_new_peers(&mut self) -> Result<(), AmError> {
        while let Some(&slot) = self.st.unmapped.last() {
            let p = &mut self.st.peers[slot];
            p.idx = Some(map_peer(&mut self.core, p.addr, self.tag)?);
            self.st.unmapped.pop();
        }
        Ok(())
    }
}

/// Maps `addr`'s link endpoint in `core`'s translation table and turns FIFO delivery on
/// towards it (before anything is sent to it).
fn map_peer(core: &mut Core, addr: NodeAddr, tag: Tag) -> Result<TransIdx, AmError> {
    let name = EndpointName {
        node: addr,
        ep: LINK_EP,
    };
    let idx = core.map_any(LINK_EP, name, tag)?;
    core.set_fifo(addr, true)?;
    Ok(idx)
}

#[cfg(test)]
mod on_demand_tests;
#[cfg(test)]
mod tests;
