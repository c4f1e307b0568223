//! Isochrons from the host: decides an isochron's TS (requirements 24-29), whether each of its
//! messages may go out (destination, distance, length), stamps them with TS, port and sequum,
//! and when the isochron closes — by the host, or by the SIU once it stayed open too long —
//! returns its marker to the host (requirements 30-32). While an isochron is open it holds
//! back tokens that would let `sendclock + distance` pass its TS (requirement 26).

use super::Siu;
use crate::pulse::Placement;
use crate::{Mode, Route, Side, SiuError, Transmit};
use isotach_proto::Input;
use isotach_proto::Pulse;
use isotach_proto::packet::{
    self, EndOfIsochron, IsochronMarker, IsotachMessage, Stamp, StartOfIsochron,
};

/// The isochron the host is sending now.
#[derive(Debug, Clone, Copy)]
pub(super) struct OpenIsochron {
    iso_id: u32,
    ts: u64,
    distance: u16,
    first_sequum: u64,
    messages: u32,
    crc_xor: u32,
    opened_us: u64,
}

impl Siu {
    /// Requirements 24-29: one TS per isochron, the earliest that is at least
    /// `sendclock + distance + send_delta` and at least the latest logged TS of the same
    /// channel and the other sequence set.
    pub(super) fn start_isochron(
        &mut self,
        now_us: u64,
        soi: StartOfIsochron,
    ) -> Result<(), SiuError> {
        if let Some(open) = self.open {
            return Err(SiuError::IsochronOpen { open: open.iso_id });
        }
        let channels = self.cfg.limits.channels;
        if soi.channel >= channels {
            return Err(SiuError::ChannelOutOfRange {
                channel: soi.channel,
                channels,
            });
        }
        let ch = usize::from(soi.channel);
        let set = usize::from(soi.seqset & 1);
        let other_set = 1 - set;
        let earliest = self.sendclock + u64::from(soi.distance) + u64::from(soi.send_delta);
        let ts = earliest.max(self.latest_ts[ch][other_set]);
        // A destination's receive clock is at most `distance` behind this sendclock when a
        // message arrives, and this SIU's own at most one: a TS this far ahead could land
        // outside their windows (the message refused, the marker uncounted). Refuse it here.
        let window = self.cfg.limits.pulses_ahead_max;
        // In SIU mode the wave rule bounds this SIU's own lag.
        debug_assert!(self.cfg.mode == Mode::Host || self.sendclock <= self.recvclock + 1);
        debug_assert!(ts >= self.sendclock);
        if ts - self.sendclock + u64::from(soi.distance) >= u64::from(window) {
            return Err(SiuError::BeyondWindow {
                ts,
                sendclock: self.sendclock,
                window,
            });
        }
        if soi.logged {
            let latest = &mut self.latest_ts[ch][set];
            *latest = if soi.host_gap {
                // Requirement 28: the host-supplied gap becomes gap[x][y].
                self.sendclock + u64::from(soi.gap)
            } else {
                (*latest).max(ts)
            };
        }
        // The marker takes the isochron's first sequum and the messages the ones after it, so
        // the marker sorts uniquely, just before its own messages to this host.
        let first_sequum = self.next_sequum;
        self.next_sequum += 1;
        // The stamp rule (requirement 25): every destination is within `distance`.
        debug_assert!(ts >= self.sendclock + u64::from(soi.distance));
        self.open = Some(OpenIsochron {
            iso_id: soi.iso_id,
            ts,
            distance: soi.distance,
            first_sequum,
            messages: 0,
            crc_xor: 0,
            opened_us: now_us,
        });
        self.stats.isochrons += 1;
        self.stats.isochrons_in_turn += u64::from(self.host_turn_pending());
        *self.outstanding.entry(ts).or_default() += 1;
        Ok(())
    }

    /// Stamps one message of the open isochron and sends it to the token manager.
    pub(super) fn message_from_host(&mut self, inp: Input<'_>) -> Result<(), SiuError> {
        let bytes = inp.bytes();
        let Some(mut open) = self.open else {
            return Err(SiuError::NoIsochron);
        };
        // Checked in full, but only the destination is needed: no decoded copy.
        let dest = IsotachMessage::validate(bytes).map_err(|e| SiuError::Decode {
            side: Side::Host,
            error: e,
        })?;
        let topo = &self.cfg.topology;
        if usize::from(dest) >= topo.host_count() {
            return Err(SiuError::NoSuchHost(dest));
        }
        let needs = topo.distance(self.cfg.host, dest);
        if needs > open.distance {
            return Err(SiuError::DistanceTooShort {
                dest,
                needs,
                declared: open.distance,
            });
        }
        let max = self.cfg.limits.isochron_messages_max;
        if open.messages >= max {
            return Err(SiuError::IsochronTooLong { max });
        }
        // Stamped in the host's own buffer when the driver lent it.
        let mut out = inp.into_vec();
        let sequum = self.next_sequum;
        let stamp = Stamp {
            ts: Pulse::new(open.ts),
            source: self.port,
            sequum,
            generation: self.generation,
        };
        let crc = IsotachMessage::stamp_in_place(&mut out, stamp);
        self.next_sequum += 1;
        open.messages += 1;
        open.crc_xor ^= crc;
        self.open = Some(open);
        self.to_net.push_back(Transmit {
            route: Route::Tm,
            bytes: out,
        });
        self.stats.messages_sent += 1;
        Ok(())
    }

    /// The host ends the open isochron.
    pub(super) fn end_isochron(&mut self, now_us: u64, eoi: EndOfIsochron) -> Result<(), SiuError> {
        let Some(open) = self.open else {
            return Err(SiuError::NoIsochron);
        };
        if open.iso_id != eoi.iso_id {
            return Err(SiuError::IsochronMismatch {
                open: open.iso_id,
                got: eoi.iso_id,
            });
        }
        self.close_isochron(now_us, open);
        Ok(())
    }

    /// When the open isochron reaches its time limit (`limits.isochron_open_us_max`).
    pub(super) fn isochron_deadline_us(&self) -> Option<u64> {
        self.open
            .map(|o| o.opened_us + self.cfg.limits.isochron_open_us_max)
    }

    /// Closes the open isochron on the host's behalf once it reached its time limit.
    pub(super) fn expire_isochron(&mut self, now_us: u64) {
        if let Some(open) = self.open
            && now_us >= open.opened_us + self.cfg.limits.isochron_open_us_max
        {
            self.stats.isochrons_forced_closed += 1;
            self.close_isochron(now_us, open);
        }
    }

    /// Requirement 26: while an isochron is open, the sendclock may advance to `wave` only
    /// while `wave + distance` stays within its TS.
    pub(super) fn isochron_holds(&self, wave: u64) -> bool {
        self.open
            .is_some_and(|open| wave + u64::from(open.distance) > open.ts)
    }

    /// The isochron's last message has left: return its marker (requirements 30-32) and let
    /// held tokens go.
    fn close_isochron(&mut self, now_us: u64, open: OpenIsochron) {
        // In SIU mode the hold rule kept every token that would pass the TS back.
        debug_assert!(
            self.cfg.mode == Mode::Host || self.sendclock + u64::from(open.distance) <= open.ts
        );
        self.open = None;
        let marker = IsochronMarker {
            iso_id: open.iso_id,
            source: self.port,
            ts: Pulse::new(open.ts),
            sequum: open.first_sequum,
            crc_xor: open.crc_xor,
        };
        // In SIU mode the hold rule (requirement 26) and the window check at the start keep the
        // marker's pulse open. In host mode the host sends the tokens, and a host that lets
        // logical time pass an open isochron's TS gets its marker flagged late.
        if self.pulses.record(open.ts, self.port, open.first_sequum) != Placement::Counted {
            self.stats.messages_late += 1;
        }
        let mut out = self.pool.take(packet::CHR_LEN);
        marker.encode(&mut out);
        self.to_host.push_back(out);
        self.stats.markers_sent += 1;
        // A token held back by requirement 26 may go now.
        self.try_send_token(now_us);
    }
}
