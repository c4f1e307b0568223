//! A single-threaded simulation driver: N bundles on one [`MemNet`], virtual time.
//!
//! [`Sim::step`] polls every bundle; when none had anything to do it jumps the virtual clock
//! to the next event (a datagram landing or a protocol timer). Everything is a function of
//! the seed, so a failing run replays exactly.

use std::time::Duration;

use crate::AmError;
use crate::Config;
use crate::Time;
use crate::backend::mem::{FaultModel, MemNet, MemTransport};
use crate::bundle::Bundle;

/// N bundles on a simulated network.
#[derive(Debug)]
pub struct Sim {
    /// The network (fault model, clock, crashes, partitions).
    pub net: MemNet,
    /// The nodes; node `i` has address `NodeAddr::Mem(i)`.
    pub nodes: Vec<Bundle<MemTransport>>,
    /// The seed this run replays from.
    pub seed: u64,
}

impl Sim {
    /// `n` bundles with configuration `cfg` on a network with `faults`, seeded with `seed`.
    pub fn new(seed: u64, faults: FaultModel, n: usize, cfg: &Config) -> Result<Self, AmError> {
        let net = MemNet::new(seed, faults);
        let nodes = (0..n)
            .map(|_| Bundle::new(net.node(), cfg.clone()))
            .collect::<Result<_, _>>()?;
        Ok(Self { net, nodes, seed })
    }

    /// Virtual time.
    pub fn now(&self) -> Time {
        self.net.now()
    }

    /// Poll every node once; if nothing happened, jump the clock to the next event.
    /// Returns false when nothing can ever happen again (no datagram in flight, no timer).
    pub fn step(&mut self) -> Result<bool, AmError> {
        let mut work = 0;
        for b in &mut self.nodes {
            work += b.poll()?;
        }
        if work > 0 {
            return Ok(true);
        }
        let now = self.net.now();
        let next = self
            .nodes
            .iter()
            .filter_map(Bundle::next_deadline)
            .chain(self.net.next_delivery())
            .min();
        match next {
            None => Ok(false),
            Some(t) => {
                self.net.advance_to(t.max(Time(now.0 + 1)));
                Ok(true)
            }
        }
    }

    /// Step until `done` holds (true), the network goes quiet (false), or `limit` of virtual
    /// time passes (false). `done` may also send.
    pub fn run_until(
        &mut self,
        limit: Duration,
        mut done: impl FnMut(&mut Self) -> bool,
    ) -> Result<bool, AmError> {
        let end = self.now().plus(limit);
        loop {
            if done(self) {
                return Ok(true);
            }
            if self.now() > end || !self.step()? {
                return Ok(done(self));
            }
        }
    }
}
