//! Deliberate damage to the SIU→host stream (tests only), to prove the oracles can fail.

use super::{Sim, Tamper};
use crate::host::{Host, Observer};
use isotach_proto::packet::{EopMarker, IsotachMessage, Kind};
use isotach_proto::topology::HostId;

impl<H: Host, O: Observer> Sim<H, O> {
    /// Applies [`Tamper`] to one host-bound packet; returns what goes on the link.
    pub(super) fn tamper_host_bound(&mut self, host: HostId, bytes: Vec<u8>) -> Vec<Vec<u8>> {
        if self.tamper.done {
            return vec![bytes];
        }
        let kind = bytes.get(1).copied();
        match self.cfg.tamper {
            Tamper::None | Tamper::ShortDistance => vec![bytes],
            Tamper::HoldBackMessage => {
                if let Some((held_host, ts, _)) = &self.tamper.held {
                    let closes = *held_host == host
                        && kind == Some(Kind::EopMarker as u8)
                        && EopMarker::decode(&bytes).is_ok_and(|e| e.ts.get() >= *ts);
                    if closes {
                        let (_, _, held) = self.tamper.held.take().expect("held");
                        self.tamper.done = true;
                        return vec![bytes, held];
                    }
                    return vec![bytes];
                }
                if kind == Some(Kind::IsotachMessage as u8)
                    && let Some((ts, _, _)) =
                        IsotachMessage::peek_stamp(&bytes).map(|(t, s, q)| (t.get(), s, q))
                    && ts >= 8
                {
                    self.tamper.held = Some((host, ts, bytes));
                    return Vec::new();
                }
                vec![bytes]
            }
            Tamper::SwapSortVector => {
                if kind == Some(Kind::EopMarker as u8)
                    && let Ok(mut eop) = EopMarker::decode(&bytes)
                    && eop.sort_vector.len() >= 3
                {
                    let last = eop.sort_vector.len() - 1;
                    eop.sort_vector.swap(0, last);
                    self.tamper.done = true;
                    let mut out = Vec::new();
                    eop.encode(&mut out);
                    return vec![out];
                }
                vec![bytes]
            }
        }
    }
}
