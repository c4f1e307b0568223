//! Barriers and signals. The node sends barrier/signal markers; the SIU carries them on its
//! tokens; the EOP marker of the pulse that completes a barrier or delivers signals says so,
//! at the same pulse on every host.

use super::SmmNode;
use crate::SmmError;
use isotach_proto::packet::{BarrierSignalMarker, EopMarker};

/// Called with the signal bits (or [`SmmNode::RESET_SIGNAL`]) and the pulse.
pub(super) type SignalHandler = Box<dyn FnMut(u8, u64) + Send>;

/// One barrier as this host sees it.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct BarrierState {
    /// Entered; its EOP barrier bit has not come yet.
    in_progress: bool,
    /// Times it completed.
    completed: u64,
}

impl SmmNode {
    /// Registers the handler of delivered signals: called with the signal bits and the pulse,
    /// and, when the reset signal arrives, with [`SmmNode::RESET_SIGNAL`] in place of the bits
    /// (a separate call, before the bits of the same pulse).
    pub fn register_signal_handler(&mut self, f: impl FnMut(u8, u64) + Send + 'static) {
        self.signal_handler = Some(Box::new(f));
    }

    /// Reported to the signal handler in place of the bits when the reset signal arrives.
    pub const RESET_SIGNAL: u8 = 0;

    /// Raises application signals; every host's signal handler sees them at the same pulse.
    pub fn raise_signals(&mut self, signals: u8) {
        self.push_marker(BarrierSignalMarker {
            signals,
            ..BarrierSignalMarker::default()
        });
    }

    /// Raises the reset signal.
    pub fn send_reset_signal(&mut self) {
        self.push_marker(BarrierSignalMarker {
            reset: true,
            ..BarrierSignalMarker::default()
        });
    }

    /// Enters barrier `barrier` (0 or 1) for `count` rounds; it completes when the SIU
    /// delivers an EOP marker with that barrier bit. Every host must use the same count.
    pub fn barrier_start(&mut self, barrier: usize, count: u32) -> Result<(), SmmError> {
        let state = self
            .barriers
            .get_mut(barrier)
            .ok_or(SmmError::Barrier(barrier))?;
        if state.in_progress || count == 0 {
            return Err(SmmError::Barrier(barrier));
        }
        state.in_progress = true;
        self.push_marker(BarrierSignalMarker {
            barrier: 1 << barrier,
            barrier_count: count,
            ..BarrierSignalMarker::default()
        });
        Ok(())
    }

    /// Whether barrier `barrier` is free (never started, or its last round completed).
    pub fn barrier_done(&self, barrier: usize) -> bool {
        self.barriers.get(barrier).is_some_and(|b| !b.in_progress)
    }

    /// Barriers of kind `barrier` completed so far.
    pub fn barriers_completed(&self, barrier: usize) -> u64 {
        self.barriers.get(barrier).map_or(0, |b| b.completed)
    }

    /// The barrier and signal part of an EOP marker, after its bucket drained: completes the
    /// barriers whose bit it carries and calls the signal handler.
    pub(super) fn finish_pulse(&mut self, eop: &EopMarker) {
        for (b, state) in self.barriers.iter_mut().enumerate() {
            if eop.barrier & (1 << b) != 0 && state.in_progress {
                state.in_progress = false;
                state.completed += 1;
                self.stats.barriers_completed += 1;
            }
        }
        if let Some(h) = self.signal_handler.as_mut() {
            if eop.reset {
                h(Self::RESET_SIGNAL, eop.ts.get());
            }
            if eop.signals != 0 {
                h(eop.signals, eop.ts.get());
            }
        }
    }
}
