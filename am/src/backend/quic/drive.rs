//! Who runs quinn: the caller's own thread, inside its waits and flushes.
//!
//! quinn is async: its endpoint and connection drivers are tokio tasks. They live on a
//! private *current-thread* runtime that the thread using the transport drives — a wait
//! blocks in that runtime until a datagram reaches the channel (the socket's readiness, the
//! connection's decoding and the hand-over all run on the waiting thread), and a flush lets
//! the connection drivers transmit what was just queued. So a datagram costs no thread hop
//! either way: with a runtime worker of its own, every received datagram woke two threads
//! (the worker, then the waiting caller) and every send one more, which on a daemon's
//! ping-pong of tokens cost more than QUIC's own work (`docs/bench.md`).
//!
//! A blocking call from a multi-thread runtime's thread (a worker, its `block_on`, its
//! blocking pool) drives quinn there too, inside `block_in_place`. Only a caller that must not
//! block its thread — [`Transport::wait_async`](crate::transport::Transport::wait_async), or
//! any call from a current-thread runtime's thread — gets a background thread that drives the
//! runtime instead ([`Driver::background`], started once, on first need, and stopped on
//! drop). quinn's timers
//! (keep-alives, handshakes, idle timeouts) run while some thread drives: a daemon's loop
//! waits at least every 50 ms, an application inside its `Smm` calls.

use std::future::Future;
use std::sync::Arc;
use std::thread::JoinHandle;

use tokio::runtime::{Handle, Runtime, RuntimeFlavor};
use tokio::sync::oneshot;

use crate::AmError;

/// Times a flush yields to the connection drivers: each yield lets every ready driver task
/// run once (transmitting what its connection queued, up to quinn's per-poll budget); what is
/// left goes out in the next wait.
const FLUSH_YIELDS: usize = 3;

/// Where the calling thread stands with respect to tokio.
enum Context {
    /// No runtime entered: block in ours.
    Plain,
    /// A worker of a multi-thread runtime: block in ours inside `block_in_place`.
    MultiThread,
    /// A current-thread runtime's thread: blocking would stall it.
    CurrentThread,
}

fn context() -> Context {
    match Handle::try_current() {
        Err(_) => Context::Plain,
        Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => Context::MultiThread,
        Ok(_) => Context::CurrentThread,
    }
}

/// The runtime quinn lives on, and the background thread that drives it when no caller can.
pub(super) struct Driver {
    /// Shared with the background thread; `None` only while dropping.
    rt: Option<Arc<Runtime>>,
    background: Option<(oneshot::Sender<()>, JoinHandle<()>)>,
}

impl Driver {
    pub(super) fn new() -> std::io::Result<Self> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        Ok(Self {
            rt: Some(Arc::new(rt)),
            background: None,
        })
    }

    fn rt(&self) -> &Arc<Runtime> {
        self.rt.as_ref().expect("the runtime lives until drop")
    }

    /// The runtime's handle (to spawn quinn's tasks and enter it while binding).
    pub(super) fn handle(&self) -> &Handle {
        self.rt().handle()
    }

    /// Is a background thread driving the runtime?
    pub(super) fn in_background(&self) -> bool {
        self.background.is_some()
    }

    /// How this thread may drive the runtime: `None` on a current-thread runtime's thread,
    /// which must not block (the background thread is started to drive it instead).
    fn drivable_here(&mut self) -> Result<Option<Context>, AmError> {
        let ctx = context();
        if matches!(ctx, Context::CurrentThread) {
            self.background()?;
            return Ok(None);
        }
        Ok(Some(ctx))
    }

    /// Runs `fut` to completion on this thread, driving quinn meanwhile (`ctx` from
    /// [`Driver::drivable_here`]).
    fn run_here<F: Future>(&self, ctx: Context, fut: F) -> F::Output {
        let rt = self.rt();
        match ctx {
            Context::MultiThread => tokio::task::block_in_place(|| rt.block_on(fut)),
            Context::Plain | Context::CurrentThread => rt.block_on(fut),
        }
    }

    /// Runs `fut` to completion on this thread, driving quinn meanwhile. `None` when this
    /// thread must not block (a current-thread runtime's): the background thread then drives
    /// quinn and the caller polls.
    pub(super) fn block_on<F: Future>(&mut self, fut: F) -> Result<Option<F::Output>, AmError> {
        Ok(self.drivable_here()?.map(|ctx| self.run_here(ctx, fut)))
    }

    /// Runs `send` (which hands queued datagrams to quinn) inside the runtime where this
    /// thread may drive it — waking a connection's driver from inside costs no system call,
    /// from outside an `eventfd` write — then yields so the drivers transmit. Where it may
    /// not, or a background thread drives, `send` runs here and that thread transmits.
    pub(super) fn flush_with(&mut self, send: impl FnOnce()) -> Result<(), AmError> {
        match self.drivable_here()? {
            Some(ctx) if !self.in_background() => self.run_here(ctx, async move {
                send();
                for _ in 0..FLUSH_YIELDS {
                    tokio::task::yield_now().await;
                }
            }),
            _ => send(),
        }
        Ok(())
    }

    /// On drop: runs `send` (the last datagrams, the close frames) as [`Driver::flush_with`]
    /// does, but never starts a background thread for it.
    pub(super) fn flush_before_drop(&mut self, send: impl FnOnce()) {
        if matches!(context(), Context::CurrentThread) && !self.in_background() {
            send();
        } else {
            let _ = self.flush_with(send);
        }
    }

    /// Starts the background thread that drives the runtime (once).
    pub(super) fn background(&mut self) -> Result<(), AmError> {
        if self.background.is_some() {
            return Ok(());
        }
        let (stop, stopped) = oneshot::channel::<()>();
        let rt = Arc::clone(self.rt());
        let join = std::thread::Builder::new()
            .name("am-quic".into())
            .spawn(move || {
                let _ = rt.block_on(stopped);
            })?;
        self.background = Some((stop, join));
        Ok(())
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        if let Some((stop, join)) = self.background.take() {
            let _ = stop.send(());
            let _ = join.join();
        }
        // Dropping a runtime inside another one panics: let it go in the background.
        if let Some(rt) = self.rt.take().and_then(|rt| Arc::try_unwrap(rt).ok()) {
            rt.shutdown_background();
        }
    }
}
