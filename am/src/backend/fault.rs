//! Fault injection, one way for every backend: a datagram is lost with probability `loss`,
//! else sent twice with probability `dup`, drawn from the workspace's seeded [`Rng`] so a
//! faulty run replays from its seed.
//!
//! - [`copies`] is the one draw. [`crate::backend::mem`] makes it inside its simulated
//!   network (with the delays and reordering of its `FaultModel`, from the same generator).
//! - [`Faulty`] wraps any [`Transport`] (UDP, QUIC, the in-process `chan` network, …) and
//!   makes it on every send: the test hook of the real-time backends.

use std::future::Future;
use std::ops::{Deref, DerefMut};

use crate::AmError;
use crate::rng::Rng;
use crate::transport::Transport;
use crate::{NodeAddr, Time};

/// Most copies of one datagram a fault draw makes (a duplicate).
pub const COPIES_MAX: usize = 2;

/// How many copies of one sent datagram the network carries: 0 (lost, probability `loss`),
/// 2 (duplicated, probability `dup` of the rest) or 1. Loss is drawn first and duplication
/// only for a datagram not lost, so a seed gives the same run in every backend.
pub fn copies(rng: &mut Rng, loss: f64, dup: f64) -> usize {
    debug_assert!((0.0..=1.0).contains(&loss), "loss {loss} is a probability");
    debug_assert!((0.0..=1.0).contains(&dup), "dup {dup} is a probability");
    if rng.chance(loss) {
        0
    } else if rng.chance(dup) {
        COPIES_MAX
    } else {
        1
    }
}

/// Seeded loss and duplication of sent datagrams, with counts of what it did.
#[derive(Debug)]
pub struct FaultInjector {
    rng: Rng,
    loss: f64,
    dup: f64,
    dropped: u64,
    duplicated: u64,
}

impl FaultInjector {
    /// Loss with probability `loss`, duplication with probability `dup`, drawn from `seed`.
    pub fn new(seed: u64, loss: f64, dup: f64) -> Self {
        assert!(
            (0.0..=1.0).contains(&loss) && (0.0..=1.0).contains(&dup),
            "fault probabilities are in 0..=1 (loss {loss}, dup {dup})"
        );
        Self {
            rng: Rng::new(seed),
            loss,
            dup,
            dropped: 0,
            duplicated: 0,
        }
    }

    /// Copies of the next sent datagram (see [`copies`]), counted.
    pub fn copies(&mut self) -> usize {
        let n = copies(&mut self.rng, self.loss, self.dup);
        match n {
            0 => self.dropped += 1,
            COPIES_MAX => self.duplicated += 1,
            _ => {}
        }
        n
    }

    /// Datagrams dropped so far.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Datagrams sent twice so far.
    pub fn duplicated(&self) -> u64 {
        self.duplicated
    }
}

/// Any transport with seeded send-side loss and duplication (off until
/// [`Faulty::set_faults`]). Everything else goes straight to the inner transport, which it
/// also dereferences to (its own counters and settings).
#[derive(Debug)]
pub struct Faulty<T: Transport> {
    inner: T,
    faults: Option<FaultInjector>,
    /// Counts of the injectors replaced by [`Faulty::set_faults`].
    dropped_before: u64,
}

impl<T: Transport> Faulty<T> {
    /// `inner` with no faults yet.
    pub fn new(inner: T) -> Self {
        Self {
            inner,
            faults: None,
            dropped_before: 0,
        }
    }

    /// `inner` dropping each sent datagram with probability `loss` and sending it twice with
    /// probability `dup`, drawn from `seed`.
    pub fn with_faults(inner: T, seed: u64, loss: f64, dup: f64) -> Self {
        let mut t = Self::new(inner);
        t.set_faults(seed, loss, dup);
        t
    }

    /// Drop each sent datagram with probability `loss`, send it twice with probability `dup`,
    /// drawn from `seed` (0 and 0 turn injection off).
    pub fn set_faults(&mut self, seed: u64, loss: f64, dup: f64) {
        self.dropped_before = self.dropped();
        self.faults = (loss > 0.0 || dup > 0.0).then(|| FaultInjector::new(seed, loss, dup));
    }

    /// Datagrams the injection dropped so far.
    pub fn dropped(&self) -> u64 {
        self.dropped_before + self.faults.as_ref().map_or(0, FaultInjector::dropped)
    }

    /// The wrapped transport.
    pub fn into_inner(self) -> T {
        self.inner
    }
}

impl<T: Transport> Deref for Faulty<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.inner
    }
}

impl<T: Transport> DerefMut for Faulty<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.inner
    }
}

impl<T: Transport> Transport for Faulty<T> {
    fn local_addr(&self) -> NodeAddr {
        self.inner.local_addr()
    }
    fn max_datagram(&self) -> usize {
        self.inner.max_datagram()
    }
    fn incarnation(&self) -> u64 {
        self.inner.incarnation()
    }
    fn now(&self) -> Time {
        self.inner.now()
    }
    fn send(&mut self, to: NodeAddr, datagram: &[u8]) -> Result<(), AmError> {
        let n = self.faults.as_mut().map_or(1, FaultInjector::copies);
        debug_assert!(n <= COPIES_MAX);
        for _ in 0..n {
            self.inner.send(to, datagram)?;
        }
        Ok(())
    }
    fn flush(&mut self) -> Result<(), AmError> {
        self.inner.flush()
    }
    fn recv(
        &mut self,
        max: usize,
        sink: &mut dyn FnMut(NodeAddr, &[u8]),
    ) -> Result<usize, AmError> {
        self.inner.recv(max, sink)
    }
    fn has_pending(&mut self) -> bool {
        self.inner.has_pending()
    }
    fn wait(&mut self, deadline: Option<Time>) -> Result<bool, AmError> {
        self.inner.wait(deadline)
    }
    fn wait_from(&mut self, now: Time, deadline: Option<Time>) -> Result<bool, AmError> {
        self.inner.wait_from(now, deadline)
    }
    fn wait_quiet(&mut self, now: Time, deadline: Option<Time>) -> Result<bool, AmError> {
        self.inner.wait_quiet(now, deadline)
    }
    fn sleep_until(&mut self, t: Time) {
        self.inner.sleep_until(t);
    }
    fn wait_async(
        &mut self,
        deadline: Option<Time>,
    ) -> impl Future<Output = Result<bool, AmError>> + Send {
        self.inner.wait_async(deadline)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::chan::ChanNet;

    #[test]
    fn the_draw_is_a_function_of_the_seed_and_counted() {
        let draws = |seed| {
            let mut f = FaultInjector::new(seed, 0.3, 0.3);
            let v: Vec<usize> = (0..200).map(|_| f.copies()).collect();
            (v, f.dropped(), f.duplicated())
        };
        let (a, dropped, duplicated) = draws(5);
        assert_eq!(draws(5).0, a, "same seed, same run");
        assert_eq!(a.iter().filter(|&&n| n == 0).count() as u64, dropped);
        assert_eq!(
            a.iter().filter(|&&n| n == COPIES_MAX).count() as u64,
            duplicated
        );
        assert!(dropped > 0 && duplicated > 0 && a.contains(&1));
    }

    #[test]
    fn faulty_drops_and_duplicates_sends_of_any_backend() {
        let net = ChanNet::new();
        let mut a = Faulty::new(net.node());
        let mut b = net.node();
        a.send(b.local_addr(), b"plain").unwrap();
        a.set_faults(1, 1.0, 0.0);
        a.send(b.local_addr(), b"lost").unwrap();
        assert_eq!(a.dropped(), 1);
        a.set_faults(1, 0.0, 1.0);
        a.send(b.local_addr(), b"twice").unwrap();
        assert_eq!(a.dropped(), 1, "counts survive a new setting");
        let mut got = Vec::new();
        b.recv(usize::MAX, &mut |_, d| got.push(d.to_vec()))
            .unwrap();
        assert_eq!(got, [&b"plain"[..], b"twice", b"twice"]);
        assert_eq!(net.stats().delivered, 3);
    }
}
