//! [`EmbeddedSiu`] as the SMM's [`SiuLink`] (feature `daemon`): the host's SIU runs on the
//! application's thread, so a packet between the SMM and its SIU is a queue push, not a
//! datagram. Every blocking wait of [`crate::Smm`] drives the SIU's pass: while the
//! application waits for a read, its SIU takes tokens and messages from the network.
//!
//! When to use it rather than the SIU daemon: `docs/operations.md`, "Embedded SIU".

use crate::driver::{LinkError, SiuLink};
use isotach_am::Transport;
pub use isotach_daemon::embedded::EmbeddedSiu;
use std::time::{Duration, Instant};

/// How long a send whose packet the SIU's full host queue refused waits for room between
/// passes.
const SEND_RETRY: Duration = Duration::from_millis(1);

fn link_err(e: impl std::fmt::Display) -> LinkError {
    LinkError(format!("embedded SIU: {e}"))
}

impl<T: Transport> SiuLink for EmbeddedSiu<T> {
    /// Queues the packet for the SIU's next pass; while the SIU's host queue is full (it
    /// waits for logical time to start, or for back-pressure to clear) the SIU runs until it
    /// takes it.
    fn send(&mut self, packet: Vec<u8>) -> Result<(), LinkError> {
        let mut packet = packet;
        loop {
            match self.offer(packet) {
                Ok(()) => return Ok(()),
                Err(back) => packet = back,
            }
            self.pass().map_err(link_err)?;
            if let Err(back) = self.offer(packet) {
                packet = back;
                let until = self.now().plus(SEND_RETRY);
                self.wait(until).map_err(link_err)?;
            } else {
                return Ok(());
            }
        }
    }

    /// Runs a pass — unless packets for the application still wait: it is in the middle of
    /// taking a pulse's worth, and the pass that follows its last one sends everything it
    /// issued meanwhile in one batch (one datagram to the token manager per pulse, not one
    /// per isochron) — or the application's turn goes on (the SIU holds its token for it):
    /// what it issues in the turn, replies included, leaves with that token in the pass that
    /// ends the turn, when it next waits or polls. A pass here would end the turn before the
    /// application saw what the pulse brought it (a wait that finds its condition already
    /// true returns at once), and its next isochron would be stamped a pulse later.
    fn flush(&mut self) -> Result<(), LinkError> {
        if self.waiting_for_host() > 0 || self.pump().role().siu().host_turn_pending() {
            return Ok(());
        }
        self.pass().map(drop).map_err(link_err)
    }

    fn try_recv(&mut self) -> Option<Vec<u8>> {
        self.take_for_host()
    }

    fn in_host_turn(&self) -> bool {
        self.pump().role().siu().host_turn_pending()
    }

    /// Ends the turn once the application has taken everything its SIU handed it (until then
    /// the turn goes on, as in [`SiuLink::flush`]): the pass sends the application's answer
    /// and the token together.
    fn end_host_turn(&mut self) -> Result<(), LinkError> {
        if self.in_host_turn() && self.waiting_for_host() == 0 {
            self.pass().map_err(link_err)?;
        }
        Ok(())
    }

    fn recycle(&mut self, buf: Vec<u8>) {
        Self::recycle(self, buf);
    }

    fn take_spare(&mut self) -> Option<Vec<u8>> {
        Self::take_spare(self)
    }

    fn recv(&mut self, timeout: Duration) -> Result<Option<Vec<u8>>, LinkError> {
        if let Some(p) = self.take_for_host() {
            return Ok(Some(p));
        }
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            // A pass just before a wait may be skipped when the last one found the socket
            // empty (the wait finds what arrives); with no wait to follow it must run, or an
            // application that only polls would never read the socket again.
            if left.is_zero() {
                self.pass().map_err(link_err)?;
            } else {
                self.pass_if_due().map_err(link_err)?;
            }
            if let Some(p) = self.take_for_host() {
                return Ok(Some(p));
            }
            if left.is_zero() {
                return Ok(None);
            }
            let until = self.now().plus(left);
            self.wait(until).map_err(link_err)?;
        }
    }
}
