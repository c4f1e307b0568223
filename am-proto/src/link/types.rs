//! What the links hand their driver: events ([`LinkEvent`], [`LossReason`]), what became of
//! an offered packet ([`Offered`]), counters ([`LinkStats`]) and a peer's status
//! ([`PeerStatus`]).

#[cfg(doc)]
use super::{BATCH_PACKETS_MAX, HELLO_RETRY, Links, PACKET_MAX, PeerList};
use crate::types::{NodeAddr, Status};

/// Why a link broke (see [`LinkEvent::PeerLost`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LossReason {
    /// A data fragment came back undelivered with this status (`Unreachable`: the AM layer
    /// gave up after its give-up time, or the peer restarted and refused it).
    Returned(Status),
    /// The peer said hello from a new incarnation: it restarted.
    Restarted,
    /// Our queue towards the peer was full and a packet was dropped.
    SendOverflow,
    /// Our inbox was full and a packet from the peer was dropped.
    InboxOverflow,
    /// A batch from the peer could not be read whole (unknown version, a length running past
    /// its end, too many packets) or started inside a fragmented packet: packets of its
    /// stream are lost.
    BadBatch,
    /// An in-process peer (an application embedding its SIU) went away.
    Detached,
    /// The driver broke an on-demand link on purpose: its peer may have restarted without a
    /// word (see [`Links::relink_on_demand`]).
    Relink,
}

/// Something a driver should know about its peers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkEvent {
    /// The peer answered our hello: packets flow (again, after a [`LinkEvent::PeerLost`]).
    PeerUp(usize),
    /// The link to the peer broke: the peer is down until it answers a new hello.
    PeerLost {
        /// The peer.
        peer: usize,
        /// Why.
        reason: LossReason,
        /// Fragments that were queued for the peer and are dropped.
        dropped: usize,
    },
    /// A hello to the peer was delivered but not answered within [`HELLO_RETRY`]: the
    /// peer runs but does not list our address among its peers (check both configs). The
    /// link keeps trying.
    HelloUnanswered(usize),
    /// A hello to the peer came back unanswered (it is not there yet); the link keeps trying.
    HelloReturned {
        /// The peer.
        peer: usize,
        /// Why.
        status: Status,
    },
}

/// What [`Links::offer`] did with a packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Offered {
    /// Queued for the peer.
    Sent,
    /// The peer's queue was full and the packet was redundant: dropped.
    Dropped,
    /// The peer's queue was full: the packet is handed back for the driver to hold (and to
    /// offer again before anything after it).
    Held(Vec<u8>),
}

/// Counters of one set of links.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Packets handed to [`Links::send`].
    pub packets_sent: u64,
    /// Packets received whole.
    pub packets_received: u64,
    /// Link messages from addresses that are not configured peers (dropped).
    pub unknown_peer: u64,
    /// Reassembled packets over [`PACKET_MAX`] (dropped).
    pub oversize: u64,
    /// Data messages (fragments and batches) returned undelivered (lost).
    pub fragments_lost: u64,
    /// Hellos sent.
    pub hellos: u64,
    /// Times a link broke (see [`LinkEvent::PeerLost`]).
    pub links_lost: u64,
    /// Fragments dropped because a link broke or a queue was full.
    pub fragments_dropped: u64,
    /// Packets dropped because the inbox was full.
    pub inbox_overflow: u64,
    /// Hellos delivered but never answered (see [`LinkEvent::HelloUnanswered`]).
    pub hellos_unanswered: u64,
    /// Received fragments discarded: the rest of an oversize packet, or a partial packet
    /// whose sender's stream broke before its last fragment.
    pub fragments_discarded: u64,
    /// Credit messages from an earlier stream of the peer's (ignored).
    pub stale_credit: u64,
    /// Batches sent (each one data message).
    pub batches_sent: u64,
    /// Packets that left in those batches (the rest left as data fragments).
    pub packets_in_batches: u64,
    /// Batches received and read (of a version we know).
    pub batches_received: u64,
    /// Packets taken out of received batches into the inbox.
    pub packets_batched: u64,
    /// Batches of an unknown version, refused whole (the link breaks).
    pub batch_bad_version: u64,
    /// Batches cut short: a length ran past the end, no packet at all, or more than
    /// [`BATCH_PACKETS_MAX`]; the packets before the bad one were delivered, the rest dropped
    /// (the link breaks).
    pub batch_truncated: u64,
    /// Batches that arrived while a fragmented packet was half assembled: the half packet is
    /// dropped (the link breaks).
    pub batch_mid_packet: u64,
}

/// One peer's state, for status displays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerStatus {
    /// Its address.
    pub addr: NodeAddr,
    /// It answered our last hello and no loss happened since.
    pub up: bool,
    /// Fragments queued towards it.
    pub queued: usize,
    /// Times its link broke.
    pub links_lost: u64,
    /// An on-demand peer nothing went to or came from yet: no link, and none needed (see
    /// [`PeerList`]).
    pub idle: bool,
}
