//! The driver's events and their queue order: earliest time first, then insertion sequence.

use super::NodeId;
use isotach_am_proto::NodeAddr;
use isotach_proto::topology::HostId;
use std::cmp::Ordering;

#[derive(Debug)]
pub(super) enum Event {
    /// A datagram reaches a TM or an SIU.
    Datagram {
        to: NodeId,
        from: NodeAddr,
        bytes: Vec<u8>,
    },
    /// A host's packet reaches its SIU (in-process), sent to incarnation `incarnation` of the
    /// SIU process.
    SiuHost {
        host: HostId,
        bytes: Vec<u8>,
        incarnation: u64,
    },
    /// A new application replaced the one attached to SIU `host` (in the host→SIU order).
    SiuReattach {
        host: HostId,
    },
    /// The application of SIU `host` left (in the host→SIU order: after what it sent).
    SiuDetach {
        host: HostId,
    },
    /// A packet from incarnation `incarnation` of the SIU process reaches its host.
    HostPacket {
        host: HostId,
        bytes: Vec<u8>,
        incarnation: u64,
    },
    /// SIU `host`'s incarnation `incarnation` holds a token for its host's turn: this reaches
    /// the host behind the packets of the turn (host turns). It comes back once at the same
    /// instant (`reacted`), so what the host does at that instant (its wakes, scheduled
    /// while it took the packets) runs first and its answer is part of the turn.
    HostTurn {
        host: HostId,
        incarnation: u64,
        reacted: bool,
    },
    /// The host's answer is in: this reaches the SIU behind what the host sent in its turn.
    HostTurnEnd {
        host: HostId,
        incarnation: u64,
    },
    /// A packet the SIU dropped because no application was attached, in its place in the
    /// host-bound stream (for the observer only).
    HostAbsent {
        host: HostId,
        bytes: Vec<u8>,
    },
    HostWake {
        host: HostId,
        token: u64,
    },
    Timer {
        node: NodeId,
        deadline_us: u64,
    },
    Pause,
    Resume {
        node: NodeId,
    },
    Crash,
    Revive {
        node: NodeId,
    },
}

impl Event {
    /// The TM or SIU whose input this is (pauses delay it). An application's attach and
    /// detach travel the host→SIU link like its packets, so a pause delays them too: otherwise
    /// a new application's hello would overtake the previous one's packets waiting behind the
    /// pause (e.g. two restarts in a row: both hellos, then both start-barrier markers, and
    /// the SIU refuses the second marker as a barrier already in progress).
    pub(super) fn pausable_target(&self) -> Option<NodeId> {
        match self {
            Self::Datagram { to, .. } => Some(*to),
            Self::SiuHost { host, .. }
            | Self::SiuReattach { host }
            | Self::SiuDetach { host }
            | Self::HostTurnEnd { host, .. } => Some(NodeId::Siu(*host)),
            _ => None,
        }
    }
}

#[derive(Debug)]
pub(super) struct Scheduled {
    pub(super) at_us: u64,
    pub(super) seq: u64,
    pub(super) event: Event,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        (self.at_us, self.seq) == (other.at_us, other.seq)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    /// Reversed: the heap pops the earliest (time, sequence) first.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at_us, other.seq).cmp(&(self.at_us, self.seq))
    }
}
