//! The one blocking wait of the drivers ([`crate::Bundle`], [`crate::port::PacketPort`]):
//! keep the protocol's timers running while the caller waits for something to arrive, in a
//! blocking and an async form that differ only in how they block.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use crate::transport::Transport;
use crate::{AmError, Time};

/// What one pass of a wait found, before blocking.
pub(crate) enum Serviced {
    /// Something is waiting for the caller now.
    Waiting,
    /// Nothing is; the protocol's next timer (`None`: no timer armed).
    Idle(Option<Time>),
}

/// A driver of a sans-IO core over one transport.
pub(crate) trait Driver {
    /// The transport it drives.
    type T: Transport;
    /// The transport.
    fn transport_mut(&mut self) -> &mut Self::T;
    /// Is something waiting for the caller (received, returned), without blocking?
    fn waiting(&mut self) -> bool;
    /// Fires the core's due timers at `now` and sends what is due.
    fn service(&mut self, now: Time) -> Result<Serviced, AmError>;
}

/// What to do after one pass.
enum Pass {
    Done(bool),
    Block(Time),
}

fn pass<D: Driver>(d: &mut D, now: Time, deadline: Time) -> Result<Pass, AmError> {
    if d.waiting() {
        return Ok(Pass::Done(true));
    }
    if now >= deadline {
        return Ok(Pass::Done(false));
    }
    Ok(match d.service(now)? {
        Serviced::Waiting => Pass::Done(true),
        Serviced::Idle(timer) => Pass::Block(timer.map_or(deadline, |t| t.min(deadline))),
    })
}

/// The one wait loop: until something waits for the caller or `timeout` passed, service the
/// core's timers and block in `block(transport, now, until)` (true: a datagram may be
/// waiting). One clock read per pass (a read costs ~25 ns on the VM).
async fn wait_with<D: Driver>(
    d: &mut D,
    timeout: Duration,
    mut block: impl AsyncFnMut(&mut D::T, Time, Time) -> Result<bool, AmError>,
) -> Result<bool, AmError> {
    let mut now = d.transport_mut().now();
    let deadline = now.plus(timeout);
    loop {
        match pass(d, now, deadline)? {
            Pass::Done(found) => return Ok(found),
            Pass::Block(until) => {
                if block(d.transport_mut(), now, until).await? {
                    return Ok(true);
                }
            }
        }
        now = d.transport_mut().now();
    }
}

/// Blocks the thread until something waits for the caller or `timeout` passed.
pub(crate) fn wait<D: Driver>(d: &mut D, timeout: Duration) -> Result<bool, AmError> {
    let waiting = wait_with(d, timeout, async |t, now, until| {
        t.wait_from(now, Some(until))
    });
    // It awaits nothing but the blocking call above: one poll runs it to the end.
    match pin!(waiting).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(r) => r,
        Poll::Pending => unreachable!("a blocking wait never pends"),
    }
}

/// The async form of [`wait`].
pub(crate) async fn wait_async<D: Driver>(d: &mut D, timeout: Duration) -> Result<bool, AmError> {
    wait_with(d, timeout, async |t, _, until| {
        t.wait_async(Some(until)).await
    })
    .await
}
