//! Pulse buckets and their drain. Isotach messages and isochron markers wait in the bucket of
//! their timestamp; the EOP marker of a pulse drains its bucket in (source, sequum) order — by
//! the SIU's sort vector when it covers the bucket, the vector merged with a software sort of
//! the excess when the pulse holds more than the vector, all software on a repeat EOP or a
//! count mismatch. Pulses only move forward: one that goes back means logical time restarted.

use super::SmmNode;
use crate::{SmmError, Table};
use isotach_proto::packet::{EopMarker, IsochronMarker, IsotachMessage, SORT_VECTOR_MAX};

/// Bucket indices the SIU's sort vector orders (its first arrivals); the rest are sorted here.
const VECTOR_ORDERED_MAX: u32 = SORT_VECTOR_MAX as u32;

/// A packet in a pulse bucket: what the drain executes in (source, sequum) order.
#[derive(Debug)]
pub(super) enum Bucketed {
    Message(IsotachMessage),
    Marker(IsochronMarker),
}

impl Bucketed {
    /// The order within a pulse: by source host, then by the source's sequum.
    fn sort_key(&self) -> (u16, u64) {
        match self {
            Self::Message(m) => (m.source, m.sequum),
            Self::Marker(k) => (k.source, k.sequum),
        }
    }
}

/// Drained buckets kept for reuse: a few pulses are open at once (the current one and those
/// isochrons were stamped ahead into).
pub(super) const SPARE_BUCKETS_MAX: usize = 4;

impl SmmNode {
    /// Puts a packet in the bucket of pulse `ts`, refusing it at the table limit or when its
    /// pulse was already drained.
    pub(super) fn bucket(&mut self, ts: u64, b: Bucketed) -> Result<(), SmmError> {
        if self.bucket_packets >= self.cfg.limits.bucket_packets_max {
            return Err(SmmError::Limit(Table::Buckets));
        }
        self.check_not_drained(ts)?;
        let spare = &mut self.spare_buckets;
        self.buckets
            .entry(ts)
            .or_insert_with(|| spare.pop().unwrap_or_default())
            .push(b);
        self.bucket_packets += 1;
        debug_assert!(self.bucket_packets <= self.cfg.limits.bucket_packets_max);
        Ok(())
    }

    /// An EOP marker: drains its pulse's bucket. A reset bit outside an epoch's end is a
    /// restart of logical time (the reset *signal* reaches hosts only on an epoch's last
    /// wave): the pulse is drained, then every later packet is refused.
    ///
    /// A node that has drained nothing and sent nothing takes the restart quietly: it has
    /// nothing to lose, drops the old generation's packets unexecuted and runs on in the new
    /// one. Anything it sent went with the old generation, though: a node that only entered a
    /// barrier (the start barrier an application begins with) would wait for a completion the
    /// new generation never delivers, so it is told, like one that drained or issued.
    pub(super) fn end_pulse(&mut self, e: &EopMarker) -> Result<(), SmmError> {
        self.check_not_drained(e.ts.get())?;
        let restart = e.reset && !e.end_of_epoch && !e.repeat;
        // Before the drain: the reset EOP may itself complete the barrier the marker entered.
        let had_state = self.stats.pulses_drained > 0 || self.issued > 0 || self.sent_marker;
        if restart && !had_state {
            // Every packet before the reset EOP is the old generation's; pulses count from
            // the start again (nothing drained: `last_drained` is still 0).
            self.buckets.clear();
            self.bucket_packets = 0;
            self.finish_pulse(e);
            return Ok(());
        }
        self.drain(e);
        if restart {
            self.restarted = true;
            return Err(SmmError::Restarted {
                ts: 0,
                drained: e.ts.get(),
            });
        }
        Ok(())
    }

    /// Pulses only move forward within a generation; one that went back means the SIU
    /// restarted logical time.
    pub(super) fn check_not_drained(&self, ts: u64) -> Result<(), SmmError> {
        if self.restarted || (ts < self.last_drained && self.stats.pulses_drained > 0) {
            return Err(SmmError::Restarted {
                ts,
                drained: self.last_drained,
            });
        }
        Ok(())
    }

    /// Drains the bucket of the EOP's pulse in (source, sequum) order: by the SIU's sort
    /// vector when it covers the bucket, vector merged with a software sort of the excess when
    /// the count exceeds it, all software on a repeat EOP or a count mismatch.
    fn drain(&mut self, eop: &EopMarker) {
        let ts = eop.ts.get();
        debug_assert!(
            self.stats.pulses_drained == 0 || ts >= self.last_drained,
            "pulses drain in order (check_not_drained)"
        );
        let bucket = self.buckets.remove(&ts).unwrap_or_default();
        debug_assert!(
            bucket.len() <= self.bucket_packets,
            "a pulse drains no more packets than were received"
        );
        self.bucket_packets -= bucket.len();
        debug_assert_eq!(
            self.bucket_packets,
            self.buckets.values().map(Vec::len).sum::<usize>(),
            "the packet count covers exactly the buckets left"
        );
        self.order_bucket(eop, &bucket);
        debug_assert!(
            covers_once(&self.order, bucket.len()),
            "every packet received for the pulse executes once"
        );
        let order = std::mem::take(&mut self.order);
        for &i in &order {
            match &bucket[i as usize] {
                Bucketed::Message(m) => self.execute_message(ts, m),
                Bucketed::Marker(k) => self.execute_at_marker(ts, k),
            }
        }
        self.order = order;
        self.keep_bucket(bucket);
        self.last_drained = ts;
        self.stats.pulses_drained += 1;
        self.finish_pulse(eop);
    }

    /// Keeps a drained bucket's allocation for a later pulse.
    fn keep_bucket(&mut self, mut bucket: Vec<Bucketed>) {
        if self.spare_buckets.len() < SPARE_BUCKETS_MAX {
            bucket.clear();
            self.spare_buckets.push(bucket);
        }
        debug_assert!(self.spare_buckets.len() <= SPARE_BUCKETS_MAX);
    }

    /// Fills `self.order` with bucket indices in execution order.
    fn order_bucket(&mut self, eop: &EopMarker, bucket: &[Bucketed]) {
        let partial = self.partial_pulse(eop.ts.get());
        let order = &mut self.order;
        order.clear();
        let n = bucket.len();
        let vector = &eop.sort_vector;
        let usable =
            !eop.repeat && eop.count as usize == n && vector.len() == n.min(SORT_VECTOR_MAX);
        if !eop.repeat && eop.count as usize != n {
            if partial {
                self.stats.partial_pulses += 1;
            } else {
                self.stats.count_mismatches += 1;
            }
        }
        if !usable {
            order.extend(0..n as u32);
            order.sort_unstable_by_key(|&i| bucket[i as usize].sort_key());
            self.stats.sorts_software += 1;
            return;
        }
        order.extend(vector.iter().map(|&i| u32::from(i)));
        if n <= SORT_VECTOR_MAX {
            self.stats.sorts_vector += 1;
            return;
        }
        // Hybrid: the vector orders the first arrivals; sort the rest, then merge.
        order.extend(VECTOR_ORDERED_MAX..n as u32);
        order[SORT_VECTOR_MAX..].sort_unstable_by_key(|&i| bucket[i as usize].sort_key());
        merge_sorted_halves(order, |i| bucket[i as usize].sort_key());
        self.stats.sorts_hybrid += 1;
    }
}

/// Merges `order[..SORT_VECTOR_MAX]` (the vector's order) with `order[SORT_VECTOR_MAX..]`
/// (sorted in software), both sorted by `key`, in place. The front half is copied to a stack
/// buffer; writing position `k` never passes the next unread back element, so one pass suffices
/// and nothing is allocated.
fn merge_sorted_halves<K: Ord>(order: &mut [u32], key: impl Fn(u32) -> K) {
    let mid = SORT_VECTOR_MAX.min(order.len());
    let mut front = [0u32; SORT_VECTOR_MAX];
    front[..mid].copy_from_slice(&order[..mid]);
    let (mut i, mut j, mut k) = (0, mid, 0);
    while i < mid {
        if j < order.len() && key(order[j]) < key(front[i]) {
            order[k] = order[j];
            j += 1;
        } else {
            order[k] = front[i];
            i += 1;
        }
        k += 1;
    }
    debug_assert!(k == j, "the rest of the back half is already in place");
}

/// Cheap check (no allocation: the drain allocates nothing) that `order` lists each of the
/// `n` bucket indices once: the right length, every index in range, and the right sum.
fn covers_once(order: &[u32], n: usize) -> bool {
    let n = n as u64;
    let sum: u64 = order.iter().map(|&i| u64::from(i)).sum();
    order.len() as u64 == n
        && order.iter().all(|&i| u64::from(i) < n)
        && sum == n * n.saturating_sub(1) / 2
}
