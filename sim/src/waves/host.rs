//! The host of the waves workload: random isochrons to random destinations, non-isotach
//! messages, barriers, and what it measures (see the parent module).

use super::WavesOptions;
use crate::host::{Host, HostCtx};
use crate::latency::LatencySamples;
use crate::net::RangeUs;
use crate::sim::Tamper;
use crate::unexpected::Unexpected;
use isotach_proto::packet::{
    BARRIERS, BarrierSignalMarker, EndOfIsochron, EopMarker, IsochronMarker, IsotachMessage, Kind,
    PlainMessage, Sref, SrefOp, StartOfIsochron, Width,
};
use isotach_proto::topology::HostId;
use isotach_siu::SiuError;
use std::collections::{BTreeMap, VecDeque};

/// Delay before retrying an isochron the SIU refused because logical time had not started.
const RETRY_US: u64 = 500;
/// Most bytes of a random `msg` payload.
const MSG_PAYLOAD_RANDOM_MAX: u64 = 64;
/// Most extra bytes of a random non-isotach payload (after its 8-byte sequence number).
const PLAIN_PAYLOAD_RANDOM_MAX: u64 = 32;
/// Largest gap between two packets of one isochron.
const PACKET_SPACING_US_MAX: u64 = 3;

/// What a host counts (summed over the hosts for the report).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct HostStats {
    pub(super) plain_sent: u64,
    pub(super) plain_fifo_violations: u64,
    pub(super) plain_lost: u64,
    pub(super) barriers_entered: u64,
    pub(super) refused_after_restart: u64,
}

/// A host of the waves workload.
#[derive(Debug)]
pub struct WavesHost {
    id: HostId,
    hosts: usize,
    messages_max: u32,
    burst: f64,
    plain: f64,
    outstanding_max: u32,
    think_us: RangeUs,
    send_delta_max: u32,
    next_iso_id: u32,
    /// Isochrons this host completed (their markers came back): picks the sequence set.
    isochrons_done: u64,
    /// Isochrons sent whose marker has not come back.
    in_flight: u32,
    /// Those isochrons in send order (the SIU returns markers in that order), each when it
    /// was issued.
    issued: VecDeque<(u32, Issued)>,
    /// Isochrons whose marker came back and whose EOP has not arrived: TS, when issued.
    awaiting_eop: VecDeque<(u64, Issued)>,
    /// Isochron latencies measured: issue to the EOP of its pulse at this host.
    pub(super) latency: LatencySamples,
    /// A wake-up is planned; only the one carrying `wake_seq` counts.
    wake_pending: bool,
    wake_seq: u64,
    /// The isochron the SIU refused at its start; its remaining packets are refused too.
    refused_iso: Option<u32>,
    /// Sequence number of the next non-isotach message to each host sent to (a map: a host
    /// of thousands talks to few).
    plain_next_to: BTreeMap<HostId, u64>,
    /// Sequence number expected next from each host heard from.
    plain_next_from: BTreeMap<HostId, u64>,
    /// Restarts are on: plain messages may be lost (not reordered), isochrons cut short.
    gaps_allowed: bool,
    /// Probability of entering a barrier with an isochron.
    barrier: f64,
    /// Barriers this host entered and has not seen complete.
    in_barrier: u8,
    /// Packets the SIU refused for reasons no correct run has.
    pub(super) unexpected: Unexpected,
    /// [`Tamper::ShortDistance`] and not yet done: the next isochron to a remote host
    /// declares a distance one short.
    short_distance: bool,
    pub(super) stats: HostStats,
}

impl WavesHost {
    pub(super) fn new(id: HostId, hosts: usize, opts: &WavesOptions) -> Self {
        Self {
            id,
            hosts,
            messages_max: opts.load.messages_max,
            burst: opts.load.burst,
            plain: opts.load.plain,
            outstanding_max: opts.load.outstanding_max,
            think_us: opts.load.think_us,
            send_delta_max: opts.load.send_delta_max,
            next_iso_id: 1,
            isochrons_done: 0,
            in_flight: 0,
            issued: VecDeque::new(),
            awaiting_eop: VecDeque::new(),
            latency: LatencySamples::default(),
            wake_pending: false,
            wake_seq: 0,
            refused_iso: None,
            plain_next_to: BTreeMap::new(),
            plain_next_from: BTreeMap::new(),
            gaps_allowed: opts.net.restarts.is_some(),
            barrier: opts.load.barrier,
            in_barrier: 0,
            unexpected: Unexpected::default(),
            short_distance: opts.tamper == Tamper::ShortDistance,
            stats: HostStats::default(),
        }
    }

    fn outstanding(&self) -> u32 {
        self.in_flight + self.awaiting_eop.len() as u32
    }

    /// Plans the next isochron after a think time if the window allows.
    fn plan(&mut self, ctx: &mut HostCtx<'_>) {
        if self.wake_pending || self.outstanding() >= self.outstanding_max {
            return;
        }
        let think = self.think_us.draw(ctx.rng());
        self.wake(ctx, think);
    }

    /// Plans the next send `after_us` from now, replacing any planned one.
    fn wake(&mut self, ctx: &mut HostCtx<'_>, after_us: u64) {
        self.wake_seq += 1;
        self.wake_pending = true;
        ctx.wake_at(ctx.now_us() + after_us, self.wake_seq);
    }

    fn send_isochron(&mut self, ctx: &mut HostCtx<'_>) {
        let rng_hosts = self.hosts as u64;
        let burst = ctx.rng().chance(self.burst);
        let count = if burst {
            ctx.rng().range_inclusive(33, 40)
        } else {
            ctx.rng().range_inclusive(1, u64::from(self.messages_max))
        };
        let burst_dest = ctx.rng().below(rng_hosts) as HostId;
        let dests: Vec<HostId> = (0..count)
            .map(|_| {
                if burst {
                    burst_dest
                } else {
                    ctx.rng().below(rng_hosts) as HostId
                }
            })
            .collect();
        let mut distance = dests
            .iter()
            .map(|&d| ctx.topology().distance(self.id, d))
            .max()
            .unwrap_or(1);
        if self.short_distance && distance > 1 {
            self.short_distance = false;
            distance -= 1;
        }
        let iso_id = self.next_iso_id;
        self.next_iso_id = self.next_iso_id.wrapping_add(1);
        let send_delta = ctx.rng().range_inclusive(0, u64::from(self.send_delta_max)) as u32;
        let soi = StartOfIsochron {
            iso_id,
            channel: 0,
            seqset: (self.isochrons_done % 2) as u8,
            logged: true,
            host_gap: false,
            gap: 0,
            send_delta,
            distance,
        };
        let mut at = ctx.now_us();
        let mut bytes = Vec::new();
        soi.encode(&mut bytes);
        ctx.send_at(at, bytes);
        for dest in dests {
            at += ctx.rng().range_inclusive(0, PACKET_SPACING_US_MAX);
            let m = IsotachMessage::unstamped(dest, random_sref(ctx));
            let mut bytes = Vec::with_capacity(m.encoded_len());
            m.encode(&mut bytes);
            ctx.send_at(at, bytes);
        }
        at += ctx.rng().range_inclusive(0, PACKET_SPACING_US_MAX);
        let mut bytes = Vec::new();
        EndOfIsochron { iso_id }.encode(&mut bytes);
        ctx.send_at(at, bytes);
        self.in_flight += 1;
        let issued = Issued {
            at_us: ctx.now_us(),
            recvclock: ctx.siu_recvclock(),
        };
        self.issued.push_back((iso_id, issued));
    }

    fn send_plain(&mut self, ctx: &mut HostCtx<'_>) {
        if self.hosts < 2 {
            return;
        }
        let mut dest = ctx.rng().below(self.hosts as u64 - 1) as HostId;
        if dest >= self.id {
            dest += 1;
        }
        let seq = self.plain_next_to.entry(dest).or_insert(0);
        let mut payload = seq.to_be_bytes().to_vec();
        *seq += 1;
        let extra = ctx.rng().range_inclusive(0, PLAIN_PAYLOAD_RANDOM_MAX);
        payload.extend((0..extra).map(|i| i as u8));
        let p = PlainMessage {
            source: self.id,
            dest,
            payload,
        };
        let mut bytes = Vec::new();
        p.encode(&mut bytes);
        ctx.send(bytes);
        self.stats.plain_sent += 1;
    }

    /// Enters a barrier this host is not in (barrier markers go between isochrons).
    fn enter_barrier(&mut self, ctx: &mut HostCtx<'_>) {
        let free: Vec<u8> = (0..BARRIERS as u8)
            .filter(|b| self.in_barrier & (1 << b) == 0)
            .collect();
        let Some(&b) = free.get(ctx.rng().below(free.len().max(1) as u64) as usize) else {
            return;
        };
        let marker = BarrierSignalMarker {
            barrier: 1 << b,
            barrier_count: 1,
            signals: 0,
            reset: false,
        };
        let mut bytes = Vec::new();
        marker.encode(&mut bytes);
        // The host→SIU link keeps send order: the marker follows the isochron just sent.
        ctx.send(bytes);
        self.in_barrier |= 1 << b;
        self.stats.barriers_entered += 1;
    }

    fn plain_received(&mut self, bytes: &[u8]) {
        let ok = PlainMessage::decode(bytes).ok().and_then(|p| {
            let seq = u64::from_be_bytes(p.payload.get(..8)?.try_into().ok()?);
            if usize::from(p.source) >= self.hosts {
                return None;
            }
            let next = self.plain_next_from.entry(p.source).or_insert(0);
            // A restart may lose plain messages queued on a broken link (a gap), never
            // reorder or repeat them.
            let gap = seq.saturating_sub(*next);
            let in_order = p.dest == self.id && (seq == *next || (self.gaps_allowed && gap > 0));
            if in_order {
                self.stats.plain_lost += gap;
            }
            *next = seq + 1;
            Some(in_order)
        });
        if ok != Some(true) {
            self.stats.plain_fifo_violations += 1;
        }
    }
}

/// When an isochron was issued: virtual time, and its SIU's receive clock then.
#[derive(Debug, Clone, Copy)]
struct Issued {
    at_us: u64,
    recvclock: u64,
}

impl WavesHost {
    /// EOP `e` arrived at `now_us`: the isochrons of its pulse and before executed (their
    /// latency is measured, unless logical time restarted under them).
    fn eop(&mut self, now_us: u64, e: &EopMarker) {
        let t = e.ts.get();
        // Not in TS order: two isochrons of one sequence set may be stamped out of order (the
        // SIU orders an isochron only after the other set's), so every entry is looked at.
        let latency = &mut self.latency;
        self.awaiting_eop.retain(|&(ts, issued)| {
            if ts > t {
                return true;
            }
            if !e.reset {
                // Pulse `ts` ends when the SIU's clock passes it: the pulses from the one it
                // was in at issue to `ts`, both included.
                let pulses = (ts + 1).saturating_sub(issued.recvclock);
                latency.record(now_us - issued.at_us, pulses);
            }
            false
        });
    }
}

/// A random sref: every operation, both widths, values of the full width, small payloads.
fn random_sref(ctx: &mut HostCtx<'_>) -> Sref {
    let rng = ctx.rng();
    let op = match rng.below(5) {
        0 => SrefOp::Read,
        1 => SrefOp::Write,
        2 => SrefOp::Sched,
        3 => SrefOp::Assign,
        _ => SrefOp::Msg,
    };
    if op == SrefOp::Msg {
        let len = rng.range_inclusive(0, MSG_PAYLOAD_RANDOM_MAX);
        let payload = (0..len).map(|_| rng.next_u64() as u8).collect();
        return Sref::Msg {
            handler: rng.below(8) as u16,
            payload,
        };
    }
    let width = if rng.chance(0.5) {
        Width::W32
    } else {
        Width::W64
    };
    let value = match op {
        SrefOp::Write | SrefOp::Assign => rng.next_u64() & width.max_value(),
        _ => 0,
    };
    Sref::Mem {
        op,
        width,
        addr: rng.below(1 << 20) * 8,
        value,
        ref_id: rng.next_u64() as u32,
    }
}

impl Host for WavesHost {
    fn on_start(&mut self, ctx: &mut HostCtx<'_>) {
        self.plan(ctx);
    }

    fn on_packet(&mut self, ctx: &mut HostCtx<'_>, bytes: &[u8]) {
        match bytes.get(1).map(|&b| Kind::from_byte(b)) {
            Some(Ok(Kind::IsochronMarker)) => {
                if let Ok(m) = IsochronMarker::decode(bytes) {
                    self.in_flight = self.in_flight.saturating_sub(1);
                    self.isochrons_done += 1;
                    // Markers come back in send order; isochrons before this one that the
                    // SIU refused have none.
                    while let Some((id, issued)) = self.issued.pop_front() {
                        if id == m.iso_id {
                            self.awaiting_eop.push_back((m.ts.get(), issued));
                            break;
                        }
                    }
                }
            }
            Some(Ok(Kind::EopMarker)) => {
                if let Ok(e) = EopMarker::decode(bytes) {
                    self.eop(ctx.now_us(), &e);
                    self.in_barrier &= !e.barrier;
                    if e.reset {
                        // A new generation: barriers in progress are gone.
                        self.in_barrier = 0;
                    }
                    if e.reset && !e.end_of_epoch && !e.repeat {
                        // Logical time restarted: the SIU refuses this application's isotach
                        // packets until a new one attaches, as a restarted application would.
                        ctx.attach();
                    }
                }
            }
            Some(Ok(Kind::Plain)) => self.plain_received(bytes),
            _ => {}
        }
        self.plan(ctx);
    }

    fn on_wake(&mut self, ctx: &mut HostCtx<'_>, token: u64) {
        if !self.wake_pending || token != self.wake_seq {
            return; // replaced by a later plan
        }
        self.wake_pending = false;
        if self.outstanding() < self.outstanding_max {
            self.send_isochron(ctx);
            if ctx.rng().chance(self.plain) {
                self.send_plain(ctx);
            }
            if self.barrier > 0.0 && ctx.rng().chance(self.barrier) {
                self.enter_barrier(ctx);
            }
        }
        self.plan(ctx);
    }

    fn on_refused(&mut self, ctx: &mut HostCtx<'_>, bytes: &[u8], error: &SiuError) {
        let kind = bytes.get(1).map(|&b| Kind::from_byte(b));
        let refused_soi = match kind {
            Some(Ok(Kind::StartOfIsochron)) => StartOfIsochron::decode(bytes).ok(),
            _ => None,
        };
        if let Some(soi) = &refused_soi {
            // No marker will come back for it.
            self.issued.retain(|&(id, _)| id != soi.iso_id);
        }
        match (kind.clone(), error) {
            (Some(Ok(Kind::StartOfIsochron)), SiuError::NotStarted) => {
                // Logical time has not reached this SIU yet: try again later.
                self.refused_iso = refused_soi.map(|s| s.iso_id);
                self.in_flight = self.in_flight.saturating_sub(1);
                self.wake(ctx, RETRY_US);
            }
            (Some(Ok(Kind::IsotachMessage)), SiuError::NotStarted | SiuError::NoIsochron)
                if self.refused_iso.is_some() => {}
            (Some(Ok(Kind::EndOfIsochron)), SiuError::NotStarted | SiuError::NoIsochron)
                if self.refused_iso.is_some() =>
            {
                self.refused_iso = None;
            }
            (Some(Ok(Kind::StartOfIsochron)), SiuError::SessionEnded) => {
                // Sent before this host heard of the restart: the restart discards it.
                self.in_flight = self.in_flight.saturating_sub(1);
                self.stats.refused_after_restart += 1;
            }
            (_, SiuError::SessionEnded) => self.stats.refused_after_restart += 1,
            (_, SiuError::NoIsochron | SiuError::IsochronOpen { .. }) if self.gaps_allowed => {
                // The SIU restarted logical time in the middle of this host's isochron: the
                // rest of it is refused (the restart discards it).
                self.stats.refused_after_restart += 1;
            }
            _ => {
                let what = match kind {
                    Some(Ok(k)) => format!("{k:?}"),
                    _ => "an undecodable packet".to_string(),
                };
                let line = format!("host {}: the SIU refused {what}: {error}", self.id);
                self.unexpected.one("host packets the SIU refused", line);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use isotach_proto::Pulse;

    /// Two isochrons of one sequence set may come back stamped out of issue order: the EOP of
    /// the lower TS measures it, and the other waits for its own pulse.
    #[test]
    fn an_eop_measures_every_isochron_of_its_pulse_and_before_in_any_order() {
        let opts = WavesOptions::new(2, 1, 10, 1).expect("options");
        let mut h = WavesHost::new(0, 2, &opts);
        let issued = |at_us| Issued {
            at_us,
            recvclock: 2,
        };
        h.awaiting_eop.push_back((5, issued(100)));
        h.awaiting_eop.push_back((3, issued(110)));
        let eop = |ts| EopMarker {
            ts: Pulse::new(ts),
            ..EopMarker::default()
        };
        h.eop(200, &eop(4));
        assert_eq!(h.latency.len(), 1, "pulse 3's isochron, behind pulse 5's");
        assert_eq!(h.awaiting_eop.len(), 1);
        h.eop(300, &eop(5));
        assert_eq!(h.latency.len(), 2);
        assert!(h.awaiting_eop.is_empty());
    }
}
