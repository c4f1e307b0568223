//! The API's error type: problems found synchronously, at the call.
//!
//! Problems found later (at the destination, or by the retransmission timer) never show up
//! here: the message comes back to handler 0 with a [`crate::Status`].

use crate::types::{EpId, HandlerId, TransIdx};

/// Everything a call of this crate's transport API can report synchronously.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AmError {
    /// No credit towards the destination peer: every request slot is outstanding. Only the
    /// `try_` variants (and the draft's asynchronous bulk post) return it; retry after a poll.
    #[error("no credit towards the destination: all request slots are outstanding")]
    WouldBlock,
    /// An argument was out of range (too many words, payload too large, bad table size, …).
    #[error("bad argument: {0}")]
    BadArg(&'static str),
    /// The local endpoint does not exist (never allocated, or freed).
    #[error("no such local endpoint {0:?}")]
    BadEndpoint(EpId),
    /// The translation-table index is out of range or unbound (`EBADENTRY` at the call).
    #[error("translation entry {0:?} is out of range or unbound")]
    BadEntry(TransIdx),
    /// The handler index is out of range, or not bound to the right kind of handler.
    #[error("handler {0:?} is out of range or bound to the wrong kind of handler")]
    BadHandler(HandlerId),
    /// A segment range given at the call lies outside the local segment.
    #[error("segment range {offset}+{len} lies outside the local segment of {seg_len} bytes")]
    BadSegment {
        /// Start of the range.
        offset: u64,
        /// Length of the range.
        len: u64,
        /// Length of the segment.
        seg_len: u64,
    },
    /// The table entry is already in use (`AM_ERR_IN_USE`).
    #[error("table entry is already in use")]
    InUse,
    /// A fixed resource limit was reached (peers, endpoints, queue entries).
    #[error("resource limit reached: {0}")]
    Resource(&'static str),
    /// The socket or runtime failed.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// The backend could not be set up (TLS, certificates, runtime mode).
    #[error("backend error: {0}")]
    Backend(String),
}
