//! No application attached: decides what happens to a packet for a host nobody reads (dropped,
//! a read, a read-modify-write it was to answer or a copy request refused on the host's
//! behalf, marked `absent`) and where the next
//! application's first isochron may be stamped — after every pulse answered or handed over
//! before it attached (`docs/design.md`, "Joining late").

use super::Siu;
use crate::{Route, Side, SiuError, Transmit};
use isotach_proto::packet::{self, IsotachMessage, Kind, PlainMessage};
use isotach_proto::reply::{self, HostReply};

impl Siu {
    /// Consumes a packet for the host that no application will read (none is attached): the
    /// driver hands it here instead of to the host. The packet is counted as dropped; a read or
    /// a copy request (state transfer) is answered with a refusal marked `absent`, so the
    /// requester is not left waiting; and the host's next isochron is stamped after the
    /// packet's pulse, so an application that attaches later orders its admission after every
    /// request answered on its behalf (`docs/design.md`, "Joining late"). Refused with
    /// back-pressure, not consumed, when the network queue has no room for the refusal.
    pub fn host_absent(&mut self, bytes: &[u8]) -> Result<(), SiuError> {
        self.room(Side::Net, 1)?;
        self.stats.absent_dropped += 1;
        if packet::peek_kind(bytes) != Ok(Kind::IsotachMessage) {
            return Ok(());
        }
        let Ok(m) = IsotachMessage::decode(bytes) else {
            return Ok(());
        };
        // Only pulses this SIU could have handed the host (within its window) move the floor.
        let window = u64::from(self.cfg.limits.pulses_ahead_max);
        let ts = m.ts.get();
        if ts <= self.recvclock.saturating_add(window) {
            self.raise_ts_floor(ts.saturating_add(1));
        }
        if usize::from(m.source) >= self.cfg.topology.host_count() {
            return Ok(());
        }
        let Some(answer) = HostReply::refusal(&m.sref, true) else {
            return Ok(());
        };
        let mut payload = Vec::with_capacity(reply::COPY_REFUSED_LEN);
        answer.encode(&mut payload);
        let plain = PlainMessage {
            source: self.cfg.host,
            dest: m.source,
            payload,
        };
        let mut out = Vec::with_capacity(packet::PLAIN_LEN_MIN + reply::COPY_REFUSED_LEN);
        plain.encode(&mut out);
        self.stats.absent_replies += 1;
        self.to_net.push_back(Transmit {
            route: Route::Host(m.source),
            bytes: out,
        });
        Ok(())
    }

    /// A (new) application attached to the host: its first isochron is stamped after every
    /// isotach message handed to the host before, so whatever a previous application received
    /// and lost is ordered before the new one's admission (`docs/design.md`, "Joining late").
    pub fn host_attached(&mut self) {
        self.host_session_ended = false;
        self.raise_ts_floor(self.host_ts_max.saturating_add(1));
        self.orphan_barriers();
    }

    /// Every later isochron of this host gets a TS of at least `ts` (both sequence sets of
    /// every channel: the next isochron is ordered after it whatever its set).
    fn raise_ts_floor(&mut self, ts: u64) {
        for sets in &mut self.latest_ts {
            for latest in sets.iter_mut() {
                *latest = (*latest).max(ts);
            }
        }
    }
}
