//! Plain value types shared by the API, the frame codec and the protocol core.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use serde::Serialize;

/// Most word arguments a short, medium or bulk message carries (`AM_MaxShort`).
pub const MAX_ARGS: usize = 8;
/// Largest medium payload in bytes (`AM_MaxMedium`); the draft asks for at least 512.
pub const MAX_MEDIUM_BYTES: usize = 1024;
/// Largest bulk transfer in bytes (`AM_MaxLong`); the draft asks for at least 8192.
pub const MAX_LONG_BYTES: usize = 1 << 20;
/// Largest segment an endpoint may expose (`AM_MaxSegLength`).
pub const MAX_SEGMENT_BYTES: usize = 1 << 30;
/// Default and minimum size of the handler table (`AM_GetNumHandlers`).
pub const DEFAULT_HANDLERS: usize = 256;
/// Largest handler table (`AM_MaxNumHandlers`).
pub const MAX_HANDLERS: usize = 4096;
/// Default and minimum size of the translation table.
pub const DEFAULT_TRANSLATIONS: usize = 256;
/// Largest translation table (`AM_MaxNumTranslations`): every index a [`TransIdx`] can hold.
/// The daemons' links map a translation per peer in use, and an SIU's peers are every other
/// host of a cluster of up to 32 767 (`isotach_proto::topology::HOSTS_MAX`).
pub const MAX_TRANSLATIONS: usize = u16::MAX as usize + 1;
/// Most request slots (credits) one peer may use towards another.
pub const MAX_SLOTS: usize = 64;
/// Most endpoints one bundle holds.
pub const MAX_ENDPOINTS: usize = 1024;

/// A 64-bit endpoint tag. [`Tag::NONE`] never matches; an endpoint whose tag is [`Tag::ALL`]
/// accepts every tag except `NONE`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize)]
pub struct Tag(pub u64);

impl Tag {
    /// Matches nothing, in either role. The default tag of a new endpoint.
    pub const NONE: Self = Self(0);
    /// As an endpoint's tag: accept every message whose tag is not `NONE`.
    pub const ALL: Self = Self(u64::MAX);

    /// The draft's protection rule: may a message tagged `self` be delivered to an endpoint
    /// whose tag is `endpoint`?
    pub fn admits(self, endpoint: Self) -> bool {
        self != Self::NONE && endpoint != Self::NONE && (endpoint == Self::ALL || endpoint == self)
    }
}

/// Index into an endpoint's handler table. Handler 0 receives returned messages.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub struct HandlerId(pub u16);

impl HandlerId {
    /// The return-to-sender handler.
    pub const RETURN: Self = Self(0);
}

/// Index into an endpoint's translation table.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub struct TransIdx(pub u16);

/// Index of an endpoint inside its bundle (and on its node).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub struct EpId(pub u16);

/// Network address of a node (one bundle = one transport address).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum NodeAddr {
    /// A node of an in-memory network.
    Mem(u32),
    /// A UDP or QUIC socket address.
    Ip(SocketAddr),
}

impl fmt::Display for NodeAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Mem(n) => write!(f, "mem:{n}"),
            Self::Ip(a) => write!(f, "{a}"),
        }
    }
}

/// Globally unique name of an endpoint: its node and its index there (`en_t`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct EndpointName {
    /// The node (transport address) that owns the endpoint.
    pub node: NodeAddr,
    /// The endpoint's index on that node.
    pub ep: EpId,
}

impl fmt::Display for EndpointName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}#{}", self.node, self.ep.0)
    }
}

/// Why a message came back to handler 0 (the draft's return statuses).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[repr(u8)]
pub enum Status {
    /// `EBADARGS`: the arguments were invalid.
    BadArgs = 1,
    /// `EBADENTRY`: the translation entry was unbound.
    BadEntry = 2,
    /// `EBADTAG`: the message tag did not match the destination endpoint's tag.
    BadTag = 3,
    /// `EBADHANDLER`: the handler index was out of range or unbound at the destination.
    BadHandler = 4,
    /// `EBADSEGOFF`: the offset lies outside the destination segment.
    BadSegOffset = 5,
    /// `EBADLENGTH`: the transfer runs past the end of the segment.
    BadLength = 6,
    /// `EBADENDPOINT`: the destination endpoint does not exist.
    BadEndpoint = 7,
    /// `ECONGESTION`: the destination refused for lack of resources.
    Congestion = 8,
    /// `EUNREACHABLE`: no answer before the give-up deadline (delivered at most once).
    Unreachable = 9,
    /// `EREPLYREJECTED`: the requester had already returned the request as unreachable.
    ReplyRejected = 10,
}

impl Status {
    /// Decode a wire status byte.
    pub fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Self::BadArgs,
            2 => Self::BadEntry,
            3 => Self::BadTag,
            4 => Self::BadHandler,
            5 => Self::BadSegOffset,
            6 => Self::BadLength,
            7 => Self::BadEndpoint,
            8 => Self::Congestion,
            9 => Self::Unreachable,
            10 => Self::ReplyRejected,
            _ => return None,
        })
    }
}

/// Which operation a (returned) message was.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Opcode {
    /// `AM_RequestM`.
    RequestShort,
    /// `AM_RequestIM`.
    RequestMedium,
    /// `AM_RequestXferM` / `AM_RequestXferAsyncM`.
    RequestXfer,
    /// `AM_GetXferM`.
    RequestGet,
    /// `AM_ReplyM`.
    ReplyShort,
    /// `AM_ReplyIM`.
    ReplyMedium,
    /// `AM_ReplyXferM` (also the data leg of a get).
    ReplyXfer,
}

/// Message size class on the wire.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
pub enum Class {
    /// Arguments only.
    Short = 0,
    /// Arguments plus a payload into a temporary buffer.
    Medium = 1,
    /// Arguments plus a payload written into the destination segment.
    Xfer = 2,
    /// A request to read the destination segment (answered with an `Xfer` reply).
    Get = 3,
}

impl Class {
    pub(crate) fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0 => Self::Short,
            1 => Self::Medium,
            2 => Self::Xfer,
            3 => Self::Get,
            _ => return None,
        })
    }

    pub(crate) fn opcode(self, request: bool) -> Opcode {
        match (self, request) {
            (Self::Short, true) => Opcode::RequestShort,
            (Self::Medium, true) => Opcode::RequestMedium,
            (Self::Xfer, true) => Opcode::RequestXfer,
            (Self::Get, _) => Opcode::RequestGet,
            (Self::Short, false) => Opcode::ReplyShort,
            (Self::Medium, false) => Opcode::ReplyMedium,
            (Self::Xfer, false) => Opcode::ReplyXfer,
        }
    }
}

/// A point on the protocol core's clock, in nanoseconds since an origin the driver picks
/// (a virtual clock in the simulator, process start for the socket backends).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
pub struct Time(pub u64);

impl Time {
    /// `self + d`, saturating.
    pub fn plus(self, d: Duration) -> Self {
        Self(
            self.0
                .saturating_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
        )
    }

    /// Time elapsed from `earlier` to `self` (zero if `earlier` is later).
    pub fn since(self, earlier: Self) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

/// What a handler-table entry holds, as far as the protocol needs to know.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum HandlerKind {
    /// Nothing bound: a message naming it comes back with [`Status::BadHandler`].
    Unset,
    /// A request handler.
    Request,
    /// A reply handler.
    Reply,
}

/// Event mask of a bundle (`AM_SetEventMask`).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum EventMask {
    /// `AM_NOEVENTS`: the semaphore is never signalled.
    #[default]
    NoEvents,
    /// `AM_NOTEMPTY`: signal when some endpoint of the bundle has a message waiting.
    NotEmpty,
}
