//! [`SharedSmm`]: an SMM node shared between application tasks and a pump task, its reads
//! awaited as futures (any executor).

use crate::{ReadHandle, SmmError, SmmNode};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

/// An SMM node shared between application tasks and a pump task. Reads are awaited as futures;
/// the pump feeds packets with [`SharedSmm::handle_siu`] and sends what [`SharedSmm::poll_siu`]
/// returns. Works with any executor.
#[derive(Debug, Clone)]
pub struct SharedSmm {
    inner: Arc<Mutex<Shared>>,
}

#[derive(Debug)]
struct Shared {
    node: SmmNode,
    /// Tasks waiting on reads (or on any progress), woken after every input.
    waiting: Vec<Waker>,
    /// Wakes the pump when there is output.
    pump: Option<Waker>,
    /// The error that ended this node's logical time: every read resolves to it.
    fatal: Option<SmmError>,
}

impl SharedSmm {
    /// Shares a node.
    pub fn new(node: SmmNode) -> Self {
        Self {
            inner: Arc::new(Mutex::new(Shared {
                node,
                waiting: Vec::new(),
                pump: None,
                fatal: None,
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Shared> {
        // A panicking application task must not wedge the pump: keep going with the state.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on the node (build isochrons, register handlers) and wakes the pump.
    pub fn with<R>(&self, f: impl FnOnce(&mut SmmNode) -> R) -> R {
        let mut s = self.lock();
        let r = f(&mut s.node);
        if let Some(w) = s.pump.take() {
            w.wake();
        }
        r
    }

    /// Pump side: one packet from the SIU. Wakes every waiting reader. A packet refused
    /// with [`SmmError::Limit`] was not taken: the pump holds it and offers it again before
    /// anything after it. A restart of logical time is kept: every read resolves to it.
    pub fn handle_siu(&self, packet: &[u8]) -> Result<(), SmmError> {
        let mut s = self.lock();
        let r = s.node.handle_siu(packet);
        if let Err(e @ (SmmError::Restarted { .. } | SmmError::SiuRestarted { .. })) = &r {
            s.fatal.get_or_insert_with(|| e.clone());
        }
        for w in s.waiting.drain(..) {
            w.wake();
        }
        r
    }

    /// Pump side: the link to the SIU broke (see [`SiuLink::broken`]); every read resolves
    /// to [`SmmError::SiuRestarted`].
    pub fn link_broken(&self, reason: String) {
        let mut s = self.lock();
        s.fatal.get_or_insert(SmmError::SiuRestarted { reason });
        for w in s.waiting.drain(..) {
            w.wake();
        }
    }

    /// The error that ended this node's logical time, if one did.
    pub fn fatal(&self) -> Option<SmmError> {
        self.lock().fatal.clone()
    }

    /// Pump side: the next packet for the SIU.
    pub fn poll_siu(&self) -> Option<Vec<u8>> {
        self.lock().node.poll_siu()
    }

    /// Pump side: a future that completes when there is output for the SIU.
    pub fn output_ready(&self) -> OutputReady {
        OutputReady { smm: self.clone() }
    }

    /// A future resolving to the read's value (taking it).
    pub fn read(&self, h: ReadHandle) -> ReadFuture {
        ReadFuture {
            smm: self.clone(),
            handle: h,
        }
    }
}

/// Resolves to a read's value. See [`SharedSmm::read`].
#[derive(Debug)]
pub struct ReadFuture {
    smm: SharedSmm,
    handle: ReadHandle,
}

impl Future for ReadFuture {
    type Output = Result<u64, SmmError>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut s = self.smm.lock();
        match s.node.take_read(self.handle) {
            Ok(Some(v)) => Poll::Ready(Ok(v)),
            Ok(None) if s.fatal.is_some() => Poll::Ready(Err(s.fatal.clone().expect("checked"))),
            Ok(None) => {
                s.waiting.push(cx.waker().clone());
                Poll::Pending
            }
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}

/// Completes when the node has output for the SIU. See [`SharedSmm::output_ready`].
#[derive(Debug)]
pub struct OutputReady {
    smm: SharedSmm,
}

impl Future for OutputReady {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut s = self.smm.lock();
        if s.node.has_output() {
            Poll::Ready(())
        } else {
            s.pump = Some(cx.waker().clone());
            Poll::Pending
        }
    }
}
