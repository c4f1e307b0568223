//! The pulse oracle: a god's-eye check of the rule every SIU must keep — **the EOP marker for
//! pulse t reaches a host only after every isotach message stamped t for that host** — and of
//! every EOP marker's count and sort vector.
//!
//! It learns what to expect by sniffing every message an SIU stamps (the SIU's network
//! output) and checks what each host receives:
//!
//! * **eop violations**: a message stamped t for the host not yet delivered when EOP t
//!   arrives; a message or isochron marker with TS t arriving after the host got an EOP for t
//!   or later (its pulse already closed); a pulse that had packets (or messages stamped for it)
//!   but never got an EOP although the host's SIU moved past it; EOP timestamps that do not
//!   increase; a delivered message no SIU stamped for this host.
//! * **order violations**: an EOP whose count differs from the packets (messages and own
//!   isochron markers) the host got with that TS, or whose sort vector is not the arrival
//!   indices of the first `min(count, 32)` of them in strictly increasing (source, sequum)
//!   order (keys are unique: an isochron marker takes a sequum of its own).
//!
//! The oracle assumes one logical-time generation after start-up (no resets mid-run); a
//! reset EOP is counted and clears the host's state.

use crate::host::Observer;
use isotach_proto::packet::{EopMarker, IsochronMarker, IsotachMessage, Kind, SORT_VECTOR_MAX};
use isotach_proto::topology::HostId;
use isotach_siu::{Route, Transmit};
use std::collections::BTreeMap;

/// Most violation descriptions kept.
const LOG_MAX: usize = 32;

/// A (source, sequum) sort key.
type Key = (u16, u64);

/// What one host received with one TS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Arrival {
    key: Key,
    marker: bool,
}

#[derive(Debug, Default)]
struct HostView {
    /// TS of the latest EOP the host received.
    last_eop: Option<u64>,
    /// Open pulses: what arrived, in arrival order.
    arrivals: BTreeMap<u64, Vec<Arrival>>,
    /// Messages stamped for this host, by TS, not yet checked.
    expected: BTreeMap<u64, Vec<Key>>,
}

/// Counters of the oracle.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OracleStats {
    /// Isotach messages the SIUs stamped and sent.
    pub messages_stamped: u64,
    /// Isotach messages hosts received.
    pub messages_delivered: u64,
    /// Isochron markers hosts received.
    pub markers_delivered: u64,
    /// EOP markers hosts received.
    pub eops: u64,
    /// EOP markers with a count above the sort vector's 32 entries.
    pub eops_over_32: u64,
    /// EOP markers with the reset bit.
    pub reset_eops: u64,
    /// Non-isotach messages hosts received.
    pub plain_delivered: u64,
    /// See the module documentation.
    pub eop_violations: u64,
    /// See the module documentation.
    pub order_violations: u64,
}

/// The pulse oracle. Plug it into [`crate::Sim`] as the observer (or call it from one).
#[derive(Debug)]
pub struct PulseOracle {
    hosts: Vec<HostView>,
    stats: OracleStats,
    log: Vec<String>,
}

impl PulseOracle {
    /// An oracle for `hosts` hosts.
    pub fn new(hosts: usize) -> Self {
        Self {
            hosts: (0..hosts).map(|_| HostView::default()).collect(),
            stats: OracleStats::default(),
            log: Vec::new(),
        }
    }

    /// Counters so far.
    pub fn stats(&self) -> OracleStats {
        self.stats
    }

    /// The first violations, described.
    pub fn violations(&self) -> &[String] {
        &self.log
    }

    fn eop_violation(&mut self, n: u64, what: impl FnOnce() -> String) {
        self.stats.eop_violations += n;
        if self.log.len() < LOG_MAX {
            self.log.push(format!("eop: {}", what()));
        }
    }

    fn order_violation(&mut self, what: impl FnOnce() -> String) {
        self.stats.order_violations += 1;
        if self.log.len() < LOG_MAX {
            self.log.push(format!("order: {}", what()));
        }
    }

    /// Final check once every SIU's pulses below `recvclocks[h]` have ended and their EOP
    /// markers had time to reach the hosts: any such pulse with packets or stamped messages
    /// and no EOP is a violation.
    pub fn finish(&mut self, recvclocks: &[u64]) {
        for (h, &recv) in recvclocks.iter().enumerate() {
            let Some(view) = self.hosts.get_mut(h) else {
                continue;
            };
            let mut missed: Vec<u64> = view.arrivals.range(..recv).map(|(&t, _)| t).collect();
            missed.extend(view.expected.range(..recv).map(|(&t, _)| t));
            missed.sort_unstable();
            missed.dedup();
            for t in &missed {
                view.arrivals.remove(t);
                view.expected.remove(t);
            }
            for t in missed {
                self.eop_violation(1, || {
                    format!("host {h}: pulse {t} ended (recvclock {recv}) without an EOP")
                });
            }
        }
    }

    fn stamped(&mut self, bytes: &[u8]) {
        let Ok(m) = IsotachMessage::decode(bytes) else {
            return;
        };
        self.stats.messages_stamped += 1;
        let Some(view) = self.hosts.get_mut(usize::from(m.dest)) else {
            return;
        };
        if view.last_eop.is_some_and(|last| m.ts <= last) {
            let last = view.last_eop;
            self.eop_violation(1, || {
                format!(
                    "message {}:{} stamped TS {} for host {}, which already got EOP {last:?}",
                    m.source, m.sequum, m.ts, m.dest
                )
            });
            return;
        }
        view.expected
            .entry(m.ts)
            .or_default()
            .push((m.source, m.sequum));
    }

    /// Records a message or marker with TS `ts` at host `h`.
    fn arrival(&mut self, h: usize, ts: u64, arrival: Arrival, what: &str) {
        let Some(view) = self.hosts.get_mut(h) else {
            return;
        };
        if let Some(last) = view.last_eop
            && ts <= last
        {
            let (src, seq) = arrival.key;
            self.eop_violation(1, || {
                format!("host {h}: {what} {src}:{seq} with TS {ts} arrived after EOP {last}")
            });
            return;
        }
        view.arrivals.entry(ts).or_default().push(arrival);
    }

    fn eop(&mut self, h: usize, eop: &EopMarker) {
        self.stats.eops += 1;
        if eop.count as usize > SORT_VECTOR_MAX {
            self.stats.eops_over_32 += 1;
        }
        let t = eop.ts;
        let Some(view) = self.hosts.get_mut(h) else {
            return;
        };
        if let Some(last) = view.last_eop
            && t <= last
        {
            self.eop_violation(1, || format!("host {h}: EOP {t} after EOP {last}"));
            return;
        }
        // Pulses before t that had packets or stamped messages but got no EOP.
        let mut skipped: Vec<u64> = view.arrivals.range(..t).map(|(&p, _)| p).collect();
        skipped.extend(view.expected.range(..t).map(|(&p, _)| p));
        skipped.sort_unstable();
        skipped.dedup();
        for p in &skipped {
            view.arrivals.remove(p);
            view.expected.remove(p);
        }
        let arrived = view.arrivals.remove(&t).unwrap_or_default();
        let expected = view.expected.remove(&t).unwrap_or_default();
        view.last_eop = Some(t);
        if eop.reset {
            self.stats.reset_eops += 1;
            *view = HostView::default();
        }
        for p in skipped {
            self.eop_violation(1, || {
                format!(
                    "host {h}: pulse {p} had packets or stamped messages but no EOP before EOP {t}"
                )
            });
        }
        self.check_delivered(h, t, &arrived, expected);
        self.check_order(h, eop, &arrived);
    }

    /// Every message stamped t for the host arrived before EOP t, and nothing else did.
    fn check_delivered(&mut self, h: usize, t: u64, arrived: &[Arrival], mut expected: Vec<Key>) {
        let mut got: Vec<Key> = arrived
            .iter()
            .filter(|a| !a.marker)
            .map(|a| a.key)
            .collect();
        got.sort_unstable();
        expected.sort_unstable();
        let missing: Vec<Key> = expected
            .iter()
            .filter(|k| got.binary_search(k).is_err())
            .copied()
            .collect();
        if !missing.is_empty() {
            self.eop_violation(missing.len() as u64, || {
                format!("host {h}: EOP {t} before message(s) {missing:?} stamped {t}")
            });
        }
        let unknown = got
            .iter()
            .filter(|k| expected.binary_search(k).is_err())
            .count();
        if unknown > 0 {
            self.eop_violation(unknown as u64, || {
                format!("host {h}: {unknown} message(s) with TS {t} no SIU stamped for it")
            });
        }
    }

    /// The count and the sort vector describe exactly what the host got.
    fn check_order(&mut self, h: usize, eop: &EopMarker, arrived: &[Arrival]) {
        let t = eop.ts;
        if eop.count as usize != arrived.len() {
            let (count, got) = (eop.count, arrived.len());
            self.order_violation(|| format!("host {h}: EOP {t} count {count}, host got {got}"));
        }
        let n = arrived.len().min(SORT_VECTOR_MAX);
        let v = &eop.sort_vector;
        let mut seen = [false; SORT_VECTOR_MAX];
        let permutation = v.len() == n
            && v.iter().all(|&i| {
                let i = usize::from(i);
                i < n && !std::mem::replace(&mut seen[i], true)
            });
        if !permutation {
            self.order_violation(|| {
                format!("host {h}: EOP {t} sort vector {v:?} is not a permutation of 0..{n}")
            });
            return;
        }
        // Keys are unique (an isochron marker takes a sequum of its own), so the order is
        // strict; a tie would leave the hosts' order undefined.
        let keys: Vec<Key> = v.iter().map(|&i| arrived[usize::from(i)].key).collect();
        if keys.windows(2).any(|w| w[0] >= w[1]) {
            self.order_violation(|| {
                format!("host {h}: EOP {t} sort vector {v:?} lists keys out of order: {keys:?}")
            });
        }
    }
}

impl Observer for PulseOracle {
    fn on_siu_transmit(&mut self, _now_us: u64, _host: HostId, tx: &Transmit) {
        if tx.route == Route::Tm && tx.bytes.get(1) == Some(&(Kind::IsotachMessage as u8)) {
            self.stamped(&tx.bytes);
        }
    }

    fn on_host_packet(&mut self, _now_us: u64, host: HostId, bytes: &[u8]) {
        let h = usize::from(host);
        match bytes.get(1).map(|&b| Kind::from_byte(b)) {
            Some(Ok(Kind::IsotachMessage)) => {
                if let Ok(m) = IsotachMessage::decode(bytes) {
                    self.stats.messages_delivered += 1;
                    let a = Arrival {
                        key: (m.source, m.sequum),
                        marker: false,
                    };
                    self.arrival(h, m.ts, a, "message");
                }
            }
            Some(Ok(Kind::IsochronMarker)) => {
                if let Ok(m) = IsochronMarker::decode(bytes) {
                    self.stats.markers_delivered += 1;
                    let a = Arrival {
                        key: (m.source, m.sequum),
                        marker: true,
                    };
                    self.arrival(h, m.ts, a, "isochron marker");
                }
            }
            Some(Ok(Kind::EopMarker)) => {
                if let Ok(e) = EopMarker::decode(bytes) {
                    self.eop(h, &e);
                }
            }
            Some(Ok(Kind::Plain)) => self.stats.plain_delivered += 1,
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use isotach_proto::packet::Sref;

    fn msg(ts: u64, source: u16, dest: u16, sequum: u64) -> Vec<u8> {
        let m = IsotachMessage {
            ts,
            source,
            dest,
            sequum,
            sref: Sref::Msg {
                handler: 0,
                payload: vec![],
            },
        };
        let mut v = Vec::new();
        m.encode(&mut v);
        v
    }

    fn eop(ts: u64, count: u32, sort_vector: Vec<u8>) -> Vec<u8> {
        let e = EopMarker {
            ts,
            count,
            sort_vector,
            ..EopMarker::default()
        };
        let mut v = Vec::new();
        e.encode(&mut v);
        v
    }

    fn send(o: &mut PulseOracle, bytes: &[u8]) {
        let tx = Transmit {
            route: Route::Tm,
            bytes: bytes.to_vec(),
        };
        o.on_siu_transmit(0, 0, &tx);
    }

    #[test]
    fn a_correct_pulse_passes() {
        let mut o = PulseOracle::new(2);
        let (a, b) = (msg(3, 1, 0, 7), msg(3, 0, 0, 2));
        send(&mut o, &a);
        send(&mut o, &b);
        o.on_host_packet(0, 0, &a);
        o.on_host_packet(0, 0, &b);
        o.on_host_packet(0, 0, &eop(3, 2, vec![1, 0]));
        o.finish(&[4, 4]);
        assert_eq!(o.stats().eop_violations, 0, "{:?}", o.violations());
        assert_eq!(o.stats().order_violations, 0, "{:?}", o.violations());
    }

    #[test]
    fn early_eop_late_message_bad_vector_and_missing_eop_are_caught() {
        let mut o = PulseOracle::new(1);
        let (a, b) = (msg(3, 1, 0, 7), msg(3, 0, 0, 2));
        send(&mut o, &a);
        send(&mut o, &b);
        o.on_host_packet(0, 0, &a);
        o.on_host_packet(0, 0, &eop(3, 1, vec![0]));
        assert_eq!(o.stats().eop_violations, 1, "b missing at EOP 3");
        o.on_host_packet(0, 0, &b);
        assert_eq!(o.stats().eop_violations, 2, "b late");

        let c = msg(5, 0, 0, 3);
        let d = msg(5, 1, 0, 1);
        send(&mut o, &c);
        send(&mut o, &d);
        o.on_host_packet(0, 0, &d);
        o.on_host_packet(0, 0, &c);
        o.on_host_packet(0, 0, &eop(5, 2, vec![0, 1]));
        assert_eq!(o.stats().order_violations, 1, "vector not sorted");
        o.on_host_packet(0, 0, &eop(6, 1, vec![0]));
        assert_eq!(
            o.stats().order_violations,
            3,
            "count 1 but got 0, and a vector entry for a packet that never came"
        );

        let e = msg(8, 0, 0, 4);
        send(&mut o, &e);
        o.finish(&[9]);
        assert_eq!(o.stats().eop_violations, 3, "pulse 8 never closed");
    }
}
