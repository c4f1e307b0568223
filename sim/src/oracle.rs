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
//! * **barrier violations**: a host sees the k-th completion of barrier b (an EOP with the
//!   barrier's bit) before every host entered b k times (the SIU took k barrier markers for b
//!   from each host). Checked until the first restart or broken link (barrier state restarts
//!   with a generation).
//!
//! Across restarts of logical time (a TM or SIU crashed, or a link broke) the oracle follows
//! generations: it learns each SIU's generation from the simulator
//! ([`Observer::on_siu_generation`]), tags every stamp with its stamping SIU's generation, and
//! checks each host's pulses within one generation: a reset EOP (or a restarted SIU process)
//! starts the host's view afresh. What a restart may discard is exempt and counted apart:
//! stamps of an older generation than the destination's view, and messages delivered after
//! a reset that no SIU stamped in the host's current generation (isotach messages carry no
//! generation, `docs/operations.md`, "Peer loss and restarts"). Before the first restart both
//! are violations, as always.

use crate::host::Observer;
use isotach_proto::packet::{
    BARRIERS, BarrierSignalMarker, EopMarker, IsochronMarker, IsotachMessage, Kind, SORT_VECTOR_MAX,
};
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
    /// A message of an older generation (after a restart): it counts in its pulse at the
    /// host like any other, but nothing says it was stamped for this generation.
    stale: bool,
}

#[derive(Debug, Default)]
struct HostView {
    /// The generation the host's pulses belong to.
    generation: u32,
    /// TS of the latest EOP the host received.
    last_eop: Option<u64>,
    /// Open pulses: what arrived, in arrival order.
    arrivals: BTreeMap<u64, Vec<Arrival>>,
    /// Messages stamped for this host, by (generation, TS), not yet checked.
    expected: BTreeMap<(u32, u64), Vec<Key>>,
}

impl HostView {
    /// Starts generation `g` afresh: stamps of older generations can no longer be checked.
    fn reset(&mut self, g: u32) {
        self.generation = g;
        self.last_eop = None;
        self.arrivals.clear();
        self.expected = self.expected.split_off(&(g, 0));
    }

    /// Expected stamps of the current generation before pulse `t`.
    fn expected_before(&self, t: u64) -> impl Iterator<Item = u64> + '_ {
        let g = self.generation;
        self.expected.range((g, 0)..(g, t)).map(|(&(_, p), _)| p)
    }
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
    /// Stamps for a host whose view had moved to a newer generation (a restart discarded
    /// them).
    pub stale_stamps: u64,
    /// Messages delivered after a restart that no SIU stamped in the host's generation.
    pub stale_deliveries: u64,
    /// Messages and pulses missing in a generation during which a link broke or a daemon
    /// crashed (the restart that follows discards that generation).
    pub discarded: u64,
    /// Barrier completions hosts saw and the oracle checked.
    pub barrier_completions: u64,
    /// See the module documentation.
    pub barrier_violations: u64,
}

/// The pulse oracle. Plug it into [`crate::Sim`] as the observer (or call it from one).
#[derive(Debug)]
pub struct PulseOracle {
    hosts: Vec<HostView>,
    /// Each SIU's generation, as the simulator reported it.
    siu_gen: Vec<u32>,
    /// Logical time restarted at least once.
    restarted: bool,
    /// Generations in which a link broke or a daemon crashed: a restart will replace them,
    /// and what their pulses lost is the restart's to discard.
    doomed: std::collections::BTreeSet<u32>,
    /// Per host and barrier: barrier markers its SIU took.
    entered: Vec<[u64; BARRIERS]>,
    /// Per host and barrier: completions it saw.
    completed: Vec<[u64; BARRIERS]>,
    stats: OracleStats,
    log: Vec<String>,
}

impl PulseOracle {
    /// An oracle for `hosts` hosts.
    pub fn new(hosts: usize) -> Self {
        Self {
            hosts: (0..hosts).map(|_| HostView::default()).collect(),
            siu_gen: vec![0; hosts],
            restarted: false,
            doomed: std::collections::BTreeSet::new(),
            entered: vec![[0; BARRIERS]; hosts],
            completed: vec![[0; BARRIERS]; hosts],
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
            missed.extend(view.expected_before(recv));
            missed.sort_unstable();
            missed.dedup();
            let g = view.generation;
            for t in &missed {
                view.arrivals.remove(t);
                view.expected.remove(&(g, *t));
            }
            if self.doomed.contains(&g) {
                self.stats.discarded += missed.len() as u64;
                continue;
            }
            for t in missed {
                self.eop_violation(1, || {
                    format!("host {h}: pulse {t} ended (recvclock {recv}) without an EOP")
                });
            }
        }
    }

    fn stamped(&mut self, src: usize, bytes: &[u8]) {
        let Ok(m) = IsotachMessage::decode(bytes) else {
            return;
        };
        self.stats.messages_stamped += 1;
        let g = self.siu_gen.get(src).copied().unwrap_or(0);
        let Some(view) = self.hosts.get_mut(usize::from(m.dest)) else {
            return;
        };
        if g < view.generation {
            self.stats.stale_stamps += 1;
            return;
        }
        if g == view.generation && view.last_eop.is_some_and(|last| m.ts.get() <= last) {
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
            .entry((g, m.ts.get()))
            .or_default()
            .push((m.source, m.sequum));
    }

    /// Records a message or marker with TS `ts` at host `h`.
    fn arrival(&mut self, h: usize, ts: u64, arrival: Arrival, what: &str) {
        let Some(view) = self.hosts.get_mut(h) else {
            return;
        };
        let mut arrival = arrival;
        if self.restarted
            && !arrival.marker
            && !view
                .expected
                .get(&(view.generation, ts))
                .is_some_and(|e| e.contains(&arrival.key))
        {
            // Sent in an older generation and delivered in this one: a restart's leftover.
            self.stats.stale_deliveries += 1;
            arrival.stale = true;
        }
        if let Some(last) = view.last_eop
            && ts <= last
        {
            if arrival.stale {
                return;
            }
            let (src, seq) = arrival.key;
            self.eop_violation(1, || {
                format!("host {h}: {what} {src}:{seq} with TS {ts} arrived after EOP {last}")
            });
            return;
        }
        view.arrivals.entry(ts).or_default().push(arrival);
    }

    /// Host `h` saw barriers `bits` complete: every host must have entered each as often.
    fn barriers_completed(&mut self, h: usize, bits: u8) {
        if self.restarted || !self.doomed.is_empty() {
            return;
        }
        for b in (0..BARRIERS).filter(|b| bits & (1 << b) != 0) {
            let Some(k) = self.completed.get_mut(h).map(|c| {
                c[b] += 1;
                c[b]
            }) else {
                return;
            };
            self.stats.barrier_completions += 1;
            let late: Vec<(usize, u64)> = (0..self.entered.len())
                .filter(|&g| self.entered[g][b] < k)
                .map(|g| (g, self.entered[g][b]))
                .collect();
            if !late.is_empty() {
                self.stats.barrier_violations += 1;
                if self.log.len() < LOG_MAX {
                    self.log.push(format!(
                        "barrier: host {h} saw completion {k} of barrier {b} before (host, entries) {late:?} entered"
                    ));
                }
            }
        }
    }

    fn eop(&mut self, h: usize, eop: &EopMarker) {
        self.stats.eops += 1;
        if eop.barrier != 0 {
            self.barriers_completed(h, eop.barrier);
        }
        if eop.count as usize > SORT_VECTOR_MAX {
            self.stats.eops_over_32 += 1;
        }
        let t = eop.ts.get();
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
        // (Pulses that only got an older generation's leftovers prove nothing.)
        let mut skipped: Vec<u64> = view
            .arrivals
            .range(..t)
            .filter(|(_, a)| a.iter().any(|a| !a.stale))
            .map(|(&p, _)| p)
            .collect();
        let leftovers: Vec<u64> = view.arrivals.range(..t).map(|(&p, _)| p).collect();
        skipped.extend(view.expected_before(t));
        skipped.sort_unstable();
        skipped.dedup();
        let g = view.generation;
        for p in skipped.iter().chain(&leftovers) {
            view.arrivals.remove(p);
            view.expected.remove(&(g, *p));
        }
        let arrived = view.arrivals.remove(&t).unwrap_or_default();
        let expected = view.expected.remove(&(g, t)).unwrap_or_default();
        view.last_eop = Some(t);
        if eop.reset {
            self.stats.reset_eops += 1;
            let now = self.siu_gen.get(h).copied().unwrap_or(0);
            view.reset(now);
        }
        let doomed = self.doomed.contains(&g);
        for p in skipped {
            if doomed {
                self.stats.discarded += 1;
                continue;
            }
            self.eop_violation(1, || {
                format!(
                    "host {h}: pulse {p} had packets or stamped messages but no EOP before EOP {t}"
                )
            });
        }
        // A reset EOP cuts its pulse short: what had not arrived yet, the restart discards
        // (as it does everything of a generation in which a link broke).
        let discarding = eop.reset || self.doomed.contains(&g);
        self.check_delivered(h, t, &arrived, expected, discarding);
        self.check_order(h, eop, &arrived);
    }

    /// Every message stamped t for the host arrived before EOP t, and nothing else did.
    fn check_delivered(
        &mut self,
        h: usize,
        t: u64,
        arrived: &[Arrival],
        mut expected: Vec<Key>,
        discarding: bool,
    ) {
        let mut got: Vec<Key> = arrived
            .iter()
            .filter(|a| !a.marker && !a.stale)
            .map(|a| a.key)
            .collect();
        got.sort_unstable();
        expected.sort_unstable();
        let missing: Vec<Key> = expected
            .iter()
            .filter(|k| got.binary_search(k).is_err())
            .copied()
            .collect();
        if !missing.is_empty() && discarding {
            self.stats.discarded += missing.len() as u64;
        } else if !missing.is_empty() {
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
        let t = eop.ts.get();
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
    fn on_siu_transmit(&mut self, _now_us: u64, host: HostId, tx: &Transmit) {
        if tx.route == Route::Tm && tx.bytes.get(1) == Some(&(Kind::IsotachMessage as u8)) {
            self.stamped(usize::from(host), &tx.bytes);
        }
    }

    fn on_siu_host_input(
        &mut self,
        _now_us: u64,
        host: HostId,
        bytes: &[u8],
        refused: Option<&isotach_siu::SiuError>,
    ) {
        if refused.is_none()
            && bytes.get(1) == Some(&(Kind::BarrierSignalMarker as u8))
            && let Ok(m) = BarrierSignalMarker::decode(bytes)
            && let Some(e) = self.entered.get_mut(usize::from(host))
        {
            for (b, n) in e.iter_mut().enumerate() {
                if m.barrier & (1 << b) != 0 {
                    *n += 1;
                }
            }
        }
    }

    fn on_loss(&mut self, _now_us: u64) {
        self.doomed.extend(self.siu_gen.iter().copied());
    }

    fn on_siu_generation(&mut self, _now_us: u64, host: HostId, generation: u32, fresh: bool) {
        let h = usize::from(host);
        let (Some(g), Some(view)) = (self.siu_gen.get_mut(h), self.hosts.get_mut(h)) else {
            return;
        };
        if *g != 0 {
            // A generation after the first, or a new process replacing a started one.
            self.restarted = true;
        }
        *g = generation;
        if fresh {
            // A new SIU process (its host's application starts over), or an SIU that had not
            // started logical time before (no reset EOP will come): the view starts here.
            view.reset(generation);
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
                        stale: false,
                    };
                    self.arrival(h, m.ts.get(), a, "message");
                }
            }
            Some(Ok(Kind::IsochronMarker)) => {
                if let Ok(m) = IsochronMarker::decode(bytes) {
                    self.stats.markers_delivered += 1;
                    let a = Arrival {
                        key: (m.source, m.sequum),
                        marker: true,
                        stale: false,
                    };
                    self.arrival(h, m.ts.get(), a, "isochron marker");
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
mod tests;
