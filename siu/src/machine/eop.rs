//! The host-bound side of a pulse: decides whether an isotach message from the network is
//! handed to the host (for this host, within the window, counted in its pulse — requirement
//! 21: FIFO, as it arrives) and builds the EOP marker that ends a pulse, with the packet count
//! and the sort vector `crate::pulse` kept for it (requirements 13-19, 33-35, 37-39).

use super::Siu;
use crate::pulse::{Placement, PulseSlot};
use crate::{Mode, Side, SiuError};
use isotach_proto::Input;
use isotach_proto::Pulse;
use isotach_proto::packet::{self, EopMarker, IsotachMessage, Token};

/// Offset of the token kind byte in an encoded token (copied into the EOP marker).
const TOKEN_KIND_OFFSET: usize = 1;

impl Siu {
    /// Builds and queues the EOP marker for pulse `ts` (requirements 13-19, 33-35, 37-39).
    /// `t` is the token that ended it, `bytes` its encoding, `slot` what was counted for the
    /// pulse and `barrier` the barriers it completed.
    pub(super) fn push_eop(
        &mut self,
        ts: u64,
        t: &Token,
        bytes: &[u8],
        mut slot: PulseSlot,
        barrier: u8,
    ) {
        let host_mode = self.cfg.mode == Mode::Host;
        let repeat = host_mode && t.repeat;
        // The sort vector is written over the last EOP's (no allocation per pulse).
        let mut sort_vector = std::mem::take(&mut self.sort_scratch);
        let count = if repeat {
            sort_vector.clear();
            0
        } else {
            slot.sort_vector_into(&mut sort_vector);
            slot.count()
        };
        let signals = if host_mode || t.end_of_epoch {
            t.signals
        } else {
            0
        };
        let eop = EopMarker {
            ts: Pulse::new(ts),
            count,
            repeat,
            reset: t.reset || t.restart,
            end_of_epoch: t.end_of_epoch,
            signals,
            barrier,
            token_kind: bytes[TOKEN_KIND_OFFSET],
            token_crc: packet::carried_crc(bytes),
            sort_vector,
        };
        let mut out = self.pool.take(packet::EOP_LEN_MIN + eop.sort_vector.len());
        eop.encode(&mut out);
        self.to_host.push_back(out);
        self.stats.eops_sent += 1;
        self.sort_scratch = eop.sort_vector;
        self.pulses.recycle(slot);
    }

    /// An isotach message from the network for this host: counted in its pulse and handed to
    /// the host at once, or refused (misrouted, not started, beyond the window).
    pub(super) fn message_from_net(&mut self, inp: Input<'_>) -> Result<(), SiuError> {
        let bytes = inp.bytes();
        let dest = IsotachMessage::validate(bytes).map_err(|e| SiuError::Decode {
            side: Side::Net,
            error: e,
        })?;
        let (ts, source, sequum) =
            IsotachMessage::peek_stamp(bytes).expect("a valid message has its stamp fields");
        // The SIU's clocks count pulses as numbers; the wire's typed pulse stops here.
        let ts = ts.get();
        if dest != self.cfg.host {
            self.stats.messages_refused += 1;
            return Err(SiuError::Misrouted {
                dest,
                host: self.cfg.host,
            });
        }
        if !self.started {
            self.stats.messages_refused += 1;
            return Err(SiuError::NotStarted);
        }
        if IsotachMessage::peek_generation(bytes) != Some(self.generation) {
            // Sent before a restart this SIU took (or, from a faulty peer, after one it has
            // not): delivered, it would land in a pulse of another generation.
            self.stats.messages_stale += 1;
            return Ok(());
        }
        match self.pulses.record(ts, source, sequum) {
            Placement::Counted => {
                debug_assert!(ts >= self.recvclock);
                debug_assert!(ts - self.recvclock < u64::from(self.cfg.limits.pulses_ahead_max));
            }
            Placement::Late => self.stats.messages_late += 1,
            Placement::TooFarAhead => {
                self.stats.messages_refused += 1;
                return Err(SiuError::TooFarAhead {
                    ts,
                    recvclock: self.recvclock,
                    window: self.cfg.limits.pulses_ahead_max,
                });
            }
        }
        // Requirement 21: FIFO, handed over as they arrive.
        self.host_ts_max = self.host_ts_max.max(ts);
        self.to_host.push_back(inp.into_vec());
        self.stats.messages_delivered += 1;
        Ok(())
    }
}
