//! Loss below QUIC, for tests: UDP datagrams the endpoint sends are dropped with a seeded
//! probability before they reach the kernel.
//!
//! [`crate::backend::fault::Faulty`] drops AM datagrams *above* QUIC, which QUIC never sees.
//! Real loss is seen by QUIC: its congestion control slows down, and its path-MTU black-hole
//! detection may shrink the datagrams it can carry. Only this hook exercises those paths.

use std::sync::Mutex;

use crate::AmError;
use crate::backend::fault::FaultInjector;

/// The loss draws of one endpoint's socket, shared with its transport so that a test can
/// change the probability as it goes (a lossy phase, then a clean one).
#[derive(Debug)]
pub(super) struct WireLoss {
    seed: u64,
    /// Behind a lock because [`super::QuicTransport::set_wire_loss`] takes `&self`; only the
    /// transport's own thread takes it, so it is never contended.
    faults: Mutex<FaultInjector>,
}

impl WireLoss {
    pub(super) fn new(seed: u64, loss: f64) -> Self {
        Self {
            seed,
            faults: Mutex::new(FaultInjector::new(seed, loss, 0.0)),
        }
    }

    /// `loss` is a probability, as [`FaultInjector`] needs.
    pub(super) fn check(loss: f64) -> Result<(), AmError> {
        if (0.0..=1.0).contains(&loss) {
            Ok(())
        } else {
            Err(AmError::BadArg(
                "QUIC wire_loss must be a probability (0..=1)",
            ))
        }
    }

    /// From now on lose with probability `loss` (the draws restart from the seed).
    pub(super) fn set(&self, loss: f64) {
        *self.lock() = FaultInjector::new(self.seed, loss, 0.0);
    }

    /// Is the next transmit (one datagram, or one GSO batch as a whole: a burst) lost on the
    /// wire? The sender believes it went. Never duplicates.
    pub(super) fn lose(&self) -> bool {
        self.lock().copies() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FaultInjector> {
        self.faults
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
