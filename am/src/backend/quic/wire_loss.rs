//! Loss below QUIC, for tests: a socket that drops UDP datagrams quinn sends, with a seeded
//! probability, before they reach the kernel.
//!
//! [`crate::backend::fault::Faulty`] drops AM datagrams *above* QUIC, which QUIC never sees.
//! Real loss is seen by QUIC: its congestion control slows down, and its path-MTU black-hole
//! detection may shrink the datagrams it can carry. Only this hook exercises those paths.

use std::fmt;
use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use quinn::udp::{RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, UdpPoller};

use crate::AmError;
use crate::backend::fault::FaultInjector;

/// The loss draws a [`WireLossSocket`] makes, shared with its transport so that a test can
/// change the probability as it goes (a lossy phase, then a clean one).
#[derive(Debug)]
pub(super) struct WireLoss {
    seed: u64,
    /// Behind a lock: quinn sends through `&self` from its driver task (one task per endpoint,
    /// so the lock is contended only when a test changes the probability).
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

    fn lock(&self) -> std::sync::MutexGuard<'_, FaultInjector> {
        self.faults
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// `inner` losing each transmit (one datagram, or one GSO batch as a whole: a burst) as
/// [`WireLoss`] draws. Never duplicates.
pub(super) struct WireLossSocket {
    inner: Arc<dyn AsyncUdpSocket>,
    loss: Arc<WireLoss>,
}

impl WireLossSocket {
    pub(super) fn new(inner: Arc<dyn AsyncUdpSocket>, loss: Arc<WireLoss>) -> Self {
        Self { inner, loss }
    }
}

impl fmt::Debug for WireLossSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WireLossSocket")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl AsyncUdpSocket for WireLossSocket {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        self.inner.clone().create_io_poller()
    }

    fn try_send(&self, transmit: &Transmit<'_>) -> io::Result<()> {
        if self.loss.lock().copies() == 0 {
            // Lost on the wire: the sender believes it went.
            return Ok(());
        }
        self.inner.try_send(transmit)
    }
    fn poll_recv(
        &self,
        cx: &mut Context<'_>,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        self.inner.poll_recv(cx, bufs, meta)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    fn max_transmit_segments(&self) -> usize {
        self.inner.max_transmit_segments()
    }

    fn max_receive_segments(&self) -> usize {
        self.inner.max_receive_segments()
    }

    fn may_fragment(&self) -> bool {
        self.inner.may_fragment()
    }
}
