//! The one trait every backend implements: move datagrams, tell the time, block.

use std::future::Future;

use crate::AmError;
use crate::{NodeAddr, Time};

/// A datagram service plus a clock. Backends are thin drivers: all protocol logic lives in
/// [`crate::Core`]. Datagrams may be lost, duplicated, reordered or delayed; the core copes.
pub trait Transport: Send {
    /// This node's address (what peers put in their translation tables).
    fn local_addr(&self) -> NodeAddr;
    /// Largest datagram the transport carries.
    fn max_datagram(&self) -> usize;
    /// A suggested incarnation for this node (must grow across restarts).
    fn incarnation(&self) -> u64;
    /// The current time on this transport's clock (virtual in the simulator).
    fn now(&self) -> Time;
    /// Send one datagram, best effort: a datagram the network cannot take now is dropped
    /// (and recovered by retransmission). A backend may hold it until [`Transport::flush`].
    /// `Err` only for failures of the transport itself.
    fn send(&mut self, to: NodeAddr, datagram: &[u8]) -> Result<(), AmError>;
    /// Hand datagrams queued by [`Transport::send`] to the network. Backends that batch
    /// sends (UDP with GSO) hold them until this is called; the bundle calls it after every
    /// burst of sends and before it blocks.
    fn flush(&mut self) -> Result<(), AmError> {
        Ok(())
    }
    /// Without blocking, hand up to `max` received datagrams to `sink`; returns how many.
    fn recv(&mut self, max: usize, sink: &mut dyn FnMut(NodeAddr, &[u8]))
    -> Result<usize, AmError>;
    /// Is a received datagram waiting (without blocking)?
    fn has_pending(&mut self) -> bool;
    /// Block until a datagram is waiting or `deadline` passes (`None`: no deadline). Returns
    /// whether a datagram is waiting.
    fn wait(&mut self, deadline: Option<Time>) -> Result<bool, AmError>;
    /// [`Transport::wait`] for a caller that has just read the clock (`now`): a backend may
    /// use `now` instead of reading the clock again.
    fn wait_from(&mut self, now: Time, deadline: Option<Time>) -> Result<bool, AmError> {
        let _ = now;
        self.wait(deadline)
    }
    /// [`Transport::wait_from`] for a caller that expects nothing to arrive before `deadline`
    /// (a token manager holding an idle wave back): a backend that spins before it sleeps
    /// while traffic flows ([`crate::backend::spin`]) sleeps at once.
    fn wait_quiet(&mut self, now: Time, deadline: Option<Time>) -> Result<bool, AmError> {
        self.wait_from(now, deadline)
    }
    /// Let time pass until `t` without watching for datagrams (virtual time: jump).
    fn sleep_until(&mut self, t: Time);
    /// The async form of [`Transport::wait`].
    fn wait_async(
        &mut self,
        deadline: Option<Time>,
    ) -> impl Future<Output = Result<bool, AmError>> + Send;
}
