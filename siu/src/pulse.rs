//! Per-pulse bookkeeping on the host side: how many isotach packets (messages and isochron
//! markers) the SIU handed the host with each TS, and the first [`SORT_VECTOR_MAX`] of them for
//! the sort vector.

use isotach_proto::config::{PULSES_AHEAD_MAX_MAX, PULSES_AHEAD_MAX_MIN};
use isotach_proto::packet::SORT_VECTOR_MAX;
use std::collections::VecDeque;

// An arrival index in the sort vector is one byte.
const _: () = assert!(SORT_VECTOR_MAX <= u8::MAX as usize + 1);

/// Most emptied slots' lists a log keeps for the next pulses' slots (two or three pulses are
/// open at a time).
const SPARE_ENTRIES_MAX: usize = 4;

/// One packet of a pulse as the sort needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    source: u16,
    sequum: u64,
    arrival: u8,
}

/// Packets handed to the host for one TS.
#[derive(Debug, Clone, Default)]
pub(crate) struct PulseSlot {
    count: u32,
    entries: Vec<Entry>,
}

impl PulseSlot {
    /// Packets handed to the host with this TS (saturating).
    pub(crate) fn count(&self) -> u32 {
        self.count
    }

    /// Arrival indices of the first [`SORT_VECTOR_MAX`] packets, in (source, sequum) order,
    /// written over `out`.
    pub(crate) fn sort_vector_into(&mut self, out: &mut Vec<u8>) {
        self.entries.sort_unstable_by_key(|e| (e.source, e.sequum));
        out.clear();
        out.extend(self.entries.iter().map(|e| e.arrival));
    }

    /// [`PulseSlot::sort_vector_into`] a new vector.
    #[cfg(test)]
    pub(crate) fn sort_vector(&mut self) -> Vec<u8> {
        let mut v = Vec::new();
        self.sort_vector_into(&mut v);
        v
    }

    fn record(&mut self, source: u16, sequum: u64) {
        // The sort vector lists the first packets counted, no more than SORT_VECTOR_MAX.
        debug_assert!(self.entries.len() <= SORT_VECTOR_MAX);
        debug_assert!(self.entries.len() as u64 <= u64::from(self.count));
        if self.entries.len() < SORT_VECTOR_MAX {
            let arrival = self.entries.len() as u8;
            self.entries.push(Entry {
                source,
                sequum,
                arrival,
            });
        }
        self.count = self.count.saturating_add(1);
        debug_assert!(self.entries.len() <= SORT_VECTOR_MAX);
        debug_assert!(self.entries.len() as u64 <= u64::from(self.count));
    }
}

/// Where a packet's TS falls relative to the open pulses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Placement {
    /// Counted in its pulse.
    Counted,
    /// Its pulse has already ended (an EOP may have gone out): a protocol violation.
    Late,
    /// Further ahead than the window allows.
    TooFarAhead,
}

/// The open pulses from the current receive clock on, at most `window` of them.
#[derive(Debug, Clone)]
pub(crate) struct PulseLog {
    /// TS of `slots[0]`: the current pulse (= receive clock).
    base: u64,
    window: usize,
    slots: VecDeque<PulseSlot>,
    /// Emptied slots' lists ([`PulseLog::recycle`]), for new slots: no allocation per pulse.
    spare: Vec<Vec<Entry>>,
}

impl PulseLog {
    /// A log of `window` open pulses (`limits.pulses-ahead-max`, which the config loader and
    /// `check_bounds` keep within bounds: at least the current pulse and the two a message can
    /// be ahead of it, and few enough that a slot per pulse is cheap).
    pub(crate) fn new(window: u32) -> Self {
        assert!(
            (PULSES_AHEAD_MAX_MIN..=PULSES_AHEAD_MAX_MAX).contains(&window),
            "limits.pulses-ahead-max is {window}, outside \
             {PULSES_AHEAD_MAX_MIN}..={PULSES_AHEAD_MAX_MAX}"
        );
        Self {
            base: 0,
            window: window as usize,
            slots: VecDeque::new(),
            spare: Vec::new(),
        }
    }

    /// Counts a packet with timestamp `ts` from `source` with `sequum`.
    pub(crate) fn record(&mut self, ts: u64, source: u16, sequum: u64) -> Placement {
        debug_assert!(self.slots.len() <= self.window);
        let Some(offset) = ts.checked_sub(self.base) else {
            return Placement::Late;
        };
        if offset >= self.window as u64 {
            return Placement::TooFarAhead;
        }
        let offset = offset as usize;
        if self.slots.len() <= offset {
            let spare = &mut self.spare;
            self.slots.resize_with(offset + 1, || PulseSlot {
                count: 0,
                entries: spare.pop().unwrap_or_default(),
            });
        }
        self.slots[offset].record(source, sequum);
        debug_assert!(self.slots.len() <= self.window);
        Placement::Counted
    }

    /// Ends the current pulse and returns what was counted for it.
    pub(crate) fn end_pulse(&mut self) -> PulseSlot {
        debug_assert!(self.slots.len() <= self.window);
        self.base += 1;
        let slot = self.slots.pop_front().unwrap_or_default();
        // The pulses counted so far all fit the window of the new current pulse.
        debug_assert!(self.slots.len() < self.window);
        slot
    }

    /// Takes back an ended pulse's slot once its EOP marker is built: its list serves a later
    /// pulse (at most [`SPARE_ENTRIES_MAX`] kept).
    pub(crate) fn recycle(&mut self, slot: PulseSlot) {
        let mut entries = slot.entries;
        if self.spare.len() < SPARE_ENTRIES_MAX && entries.capacity() > 0 {
            entries.clear();
            self.spare.push(entries);
        }
        debug_assert!(self.spare.len() <= SPARE_ENTRIES_MAX);
    }

    /// TS of the current pulse (the SIU's receive clock).
    pub(crate) fn base(&self) -> u64 {
        self.base
    }

    /// Takes what was counted for the current pulse without ending it (a reset).
    pub(crate) fn take_current(&mut self) -> PulseSlot {
        self.slots
            .front_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Packets counted for pulses not yet ended.
    pub(crate) fn pending(&self) -> u64 {
        self.slots.iter().map(|s| u64::from(s.count)).sum()
    }

    /// Some packet is counted for a pulse not yet ended.
    pub(crate) fn any_pending(&self) -> bool {
        self.slots.iter().any(|s| s.count > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ended_pulses_list_serves_a_later_pulse() {
        let mut log = PulseLog::new(8);
        for seq in 0..5 {
            assert_eq!(log.record(0, 1, seq), Placement::Counted);
        }
        let slot = log.end_pulse();
        let at = slot.entries.as_ptr();
        log.recycle(slot);
        // The next pulse opens a slot: it takes the kept list instead of a new one.
        assert_eq!(log.record(1, 1, 9), Placement::Counted);
        assert_eq!(log.slots[0].entries.as_ptr(), at);
        assert_eq!(log.slots[0].count(), 1);
        // Bounded: a list that never held anything is not kept.
        log.recycle(PulseSlot::default());
        assert!(log.spare.is_empty());
    }

    #[test]
    fn sort_vector_lists_arrivals_in_source_then_sequum_order() {
        let mut log = PulseLog::new(8);
        for (src, seq) in [(3, 1), (1, 9), (1, 2), (2, 0)] {
            assert_eq!(log.record(0, src, seq), Placement::Counted);
        }
        let mut slot = log.end_pulse();
        assert_eq!(slot.count(), 4);
        assert_eq!(slot.sort_vector(), vec![2, 1, 3, 0]);
    }

    #[test]
    fn count_exceeds_the_vector() {
        let mut log = PulseLog::new(8);
        for i in 0..40 {
            log.record(0, 0, i);
        }
        let mut slot = log.end_pulse();
        assert_eq!(slot.count(), 40);
        assert_eq!(slot.sort_vector().len(), SORT_VECTOR_MAX);
    }

    #[test]
    fn late_and_far_packets_are_refused() {
        let mut log = PulseLog::new(4);
        log.end_pulse();
        assert_eq!(log.record(0, 0, 0), Placement::Late);
        assert_eq!(log.record(5, 0, 0), Placement::TooFarAhead);
        assert_eq!(log.record(4, 0, 0), Placement::Counted);
        assert_eq!(log.pending(), 1);
    }
}
