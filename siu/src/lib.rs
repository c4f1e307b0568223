//! The switch interface unit (SIU): a sans-IO state machine that keeps logical time for one
//! host.
//!
//! The SIU sits between its host (the SMM library) and the network side (one reliable FIFO
//! link to its token manager). It turns tokens around, keeps `sendclock` and `recvclock`,
//! timestamps isochrons, returns isochron markers, emits end-of-pulse (EOP) markers with sort
//! vectors, carries barrier and signal bits, and passes non-isotach traffic through untouched.
//!
//! It owns no sockets, threads, clocks or randomness: time (`now_us`, any monotonic
//! microsecond count) and input bytes go in through [`Siu::handle_host`], [`Siu::handle_net`]
//! and [`Siu::handle_timeout`]; output is polled out through [`Siu::poll_host`],
//! [`Siu::poll_net`] and [`Siu::poll_timeout`]. The simulator and the daemon drive the same
//! code. Requirement numbers in comments refer to section 3.2 of the prototype report.

#![warn(missing_docs)]

mod machine;
mod pulse;

pub use machine::Siu;

use isotach_proto::config::{Limits, Timing};
use isotach_proto::packet::{DecodeError, Kind};
use isotach_proto::topology::{HostId, Topology};
use std::sync::Arc;
use thiserror::Error;

/// Who runs the token protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// The SIU turns tokens around itself and sends EOP markers for significant pulses.
    #[default]
    Siu,
    /// The host runs the token protocol; the SIU checks and forwards its tokens and sends an
    /// EOP marker for every normal or repeat token from the network.
    Host,
}

/// Configuration of one SIU.
#[derive(Debug, Clone)]
pub struct SiuConfig {
    /// The host this SIU serves.
    pub host: HostId,
    /// SIU mode or host mode.
    pub mode: Mode,
    /// The cluster topology (for distances and the token manager's port).
    pub topology: Arc<Topology>,
    /// Token timer and epoch length.
    pub timing: Timing,
    /// Table limits.
    pub limits: Limits,
    /// This SIU starts logical time with a reset token (node 0 in a cluster).
    pub initiates_reset: bool,
    /// The host runs on this SIU's thread and its driver calls [`Siu::end_host_turn`] after
    /// each of the host's turns: a significant pulse's token waits for the host's answer to
    /// its EOP (SIU mode only; `machine/host_turn.rs` says why).
    pub host_turns: bool,
}

/// Which side of the SIU a packet came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The host (SMM library).
    Host,
    /// The network (the token manager link, or a direct peer for non-isotach traffic).
    Net,
}

/// Where a network-side packet goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Over the FIFO link to this SIU's token manager (tokens and isotach messages).
    Tm,
    /// Directly to another host (non-isotach traffic).
    Host(HostId),
}

/// A packet for the network side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    /// Where it goes.
    pub route: Route,
    /// The encoded packet.
    pub bytes: Vec<u8>,
}

/// Why the SIU refused or dropped an input. The SIU stays usable after every error.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SiuError {
    /// The bytes are not a valid packet (a token with a bad CRC lands here: requirement 7).
    #[error("undecodable packet from the {side:?} side: {error}")]
    Decode {
        /// Where it came from.
        side: Side,
        /// Why it did not decode.
        error: DecodeError,
    },
    /// A packet kind that side never sends (e.g. an EOP marker from the host).
    #[error("a {kind:?} packet is not expected from the {side:?} side")]
    UnexpectedKind {
        /// Where it came from.
        side: Side,
        /// Its kind.
        kind: Kind,
    },
    /// Isotach input before logical time started (no reset token yet).
    #[error("logical time has not started (waiting for the reset token)")]
    NotStarted,
    /// Logical time restarted and the host was told (an EOP with the reset bit); isotach
    /// packets from the application that was running then are refused until a new one
    /// attaches ([`Siu::host_attached`]), so nothing it sent before it learned of the restart
    /// is stamped in the new generation.
    #[error(
        "logical time restarted: this application's isotach packets are refused until a new \
         application attaches (shared memory does not survive a restart)"
    )]
    SessionEnded,
    /// An output queue is full; the input was not consumed. Drain output and retry.
    #[error("the {side:?}-bound queue is full ({limit} packets); input not consumed")]
    Backpressure {
        /// The side whose queue is full.
        side: Side,
        /// The limit.
        limit: usize,
    },
    /// A start-of-isochron while another isochron is open.
    #[error("isochron {open} is still open")]
    IsochronOpen {
        /// The open isochron.
        open: u32,
    },
    /// A message or end-of-isochron with no isochron open.
    #[error("no isochron is open")]
    NoIsochron,
    /// An end-of-isochron naming another isochron than the open one.
    #[error("end of isochron {got} while isochron {open} is open")]
    IsochronMismatch {
        /// The open isochron.
        open: u32,
        /// The id in the end-of-isochron packet.
        got: u32,
    },
    /// The isochron names a channel beyond the configured limit.
    #[error("channel {channel} is beyond the {channels} configured channels")]
    ChannelOutOfRange {
        /// The channel.
        channel: u8,
        /// Configured channels.
        channels: u8,
    },
    /// A message to a host that does not exist.
    #[error("destination host {0} does not exist")]
    NoSuchHost(u16),
    /// A message whose destination is further than the isochron distance declared.
    #[error("destination {dest} is {needs} away but the isochron declared distance {declared}")]
    DistanceTooShort {
        /// The destination.
        dest: HostId,
        /// Its distance.
        needs: u16,
        /// The declared isochron distance.
        declared: u16,
    },
    /// An isochron with more messages than the limit.
    #[error("isochron exceeds {max} messages")]
    IsochronTooLong {
        /// The limit.
        max: u32,
    },
    /// An isochron whose TS would be `window` or more pulses ahead of a destination's receive
    /// clock (a large send delta or gap); refused, nothing consumed. Destinations refuse such
    /// messages ([`SiuError::TooFarAhead`]), so stamping it would break the isochron.
    #[error(
        "isochron TS {ts} at sendclock {sendclock} would reach beyond the {window}-pulse window"
    )]
    BeyondWindow {
        /// The TS it would get.
        ts: u64,
        /// The sendclock.
        sendclock: u64,
        /// `limits.pulses_ahead_max`.
        window: u32,
    },
    /// A barrier marker that enters a barrier already in progress, or with a count of zero.
    #[error("barrier {barrier}: already in progress, or count {count} is zero")]
    Barrier {
        /// Which barrier.
        barrier: u8,
        /// The marker's count (rounds to run).
        count: u32,
    },
    /// A packet only the other mode accepts (e.g. a host token in SIU mode).
    #[error("a {kind:?} packet from the host is not accepted in {mode:?} mode")]
    WrongMode {
        /// The packet kind.
        kind: Kind,
        /// The SIU's mode.
        mode: Mode,
    },
    /// A network message whose TS lies beyond the accepted window; dropped.
    #[error("message with TS {ts} is more than {window} pulses ahead of recvclock {recvclock}")]
    TooFarAhead {
        /// Its TS.
        ts: u64,
        /// The receive clock.
        recvclock: u64,
        /// The window.
        window: u32,
    },
    /// A network message for another host; dropped.
    #[error("message for host {dest} reached host {host}")]
    Misrouted {
        /// Its destination.
        dest: HostId,
        /// This host.
        host: HostId,
    },
    /// A token from a source port other than this SIU's token manager; dropped.
    #[error("token from port {0:#06x}, not from this SIU's token manager")]
    ForeignToken(u16),
}

/// Counters, monotonically increasing except the `*_now` gauges.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SiuStats {
    /// Normal tokens sent to the network.
    pub tokens_sent: u64,
    /// Repeat tokens sent by the lost-token algorithm.
    pub tokens_repeated: u64,
    /// Normal tokens sent marked BUSY (idle pacing: this SIU had work needing logical time).
    pub tokens_busy: u64,
    /// Wake-ups: the last token, sent idle, resent as a BUSY repeat because the host sent
    /// isotach traffic (at most one per token sent).
    pub tokens_wake: u64,
    /// Tokens that waited for the host's turn at an EOP or a reply (`SiuConfig::host_turns`).
    pub tokens_held_for_host: u64,
    /// Of those, the tokens held for a reply alone (their pulse held nothing for the host).
    pub tokens_held_for_reply: u64,
    /// Isochrons the host started while a token waited for its turn: stamped a pulse sooner.
    pub isochrons_in_turn: u64,
    /// In-sequence tokens accepted from the network.
    pub tokens_accepted: u64,
    /// Tokens dropped as duplicates.
    pub tokens_duplicate: u64,
    /// Tokens dropped as early (requirements 8, 12).
    pub tokens_early: u64,
    /// Tokens dropped for a bad CRC or other decode error (requirement 7).
    pub tokens_bad: u64,
    /// Tokens dropped for an old or unknown generation.
    pub tokens_stale: u64,
    /// Logical-time restarts (reset tokens of a new generation).
    pub resets: u64,
    /// EOP markers sent to the host.
    pub eops_sent: u64,
    /// Isochrons timestamped.
    pub isochrons: u64,
    /// Isochrons the SIU closed because the host left them open too long.
    pub isochrons_forced_closed: u64,
    /// Isotach messages sent to the network.
    pub messages_sent: u64,
    /// Isotach messages delivered to the host.
    pub messages_delivered: u64,
    /// Messages that arrived, or isochron markers that were closed (host mode), after their
    /// pulse ended (must stay 0).
    pub messages_late: u64,
    /// Messages dropped as too far ahead or misrouted.
    pub messages_refused: u64,
    /// Isotach packets from the host refused after a reset EOP, until a new application
    /// attached ([`SiuError::SessionEnded`]).
    pub host_refused_after_reset: u64,
    /// Isotach messages of an older generation dropped: the token manager forwarded them
    /// before it took the restart this SIU is in (their pulse belongs to a generation that
    /// ended; delivered, they would land in the new one).
    pub messages_stale: u64,
    /// Isochron markers sent to the host.
    pub markers_sent: u64,
    /// Barriers completed.
    pub barriers_completed: u64,
    /// Non-isotach packets passed host to network.
    pub plain_to_net: u64,
    /// Non-isotach packets passed network to host.
    pub plain_to_host: u64,
    /// Inputs refused with an error (all kinds).
    pub errors: u64,
    /// Packets for the host dropped because no application was attached
    /// ([`Siu::host_absent`]).
    pub absent_dropped: u64,
    /// Reads and copy requests answered with an `absent` refusal on the host's behalf.
    pub absent_replies: u64,
}
