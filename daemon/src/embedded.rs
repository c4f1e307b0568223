//! An SIU embedded in the application's process (feature `embedded`): the host's SIU pump runs
//! on the application's own thread, its host peer is in-process ([`Pump::with_local`]), and
//! only the network side (its token manager, the other hosts' SIUs) goes over a transport.
//!
//! Why: with a separate SIU daemon every isochron crosses the kernel twice on its own host
//! (application → SIU, SIU → application) and wakes a second thread each way. Embedded, a
//! packet from the SMM is a push onto a queue the same thread drains in its next pass; the
//! pass that took a token from the network hands the EOP to the SMM without a system call.
//! It fits the common case of one application per host; a host with several applications,
//! or an application that restarts often, keeps the SIU daemon (`docs/operations.md`).
//!
//! Run to completion: [`EmbeddedSiu::pass`] reads the clock once, takes what arrived, runs
//! the pump and sends what it has; [`EmbeddedSiu::wait`] blocks in the transport until a
//! datagram or the pump's next deadline. No task, lock or thread hop per packet. It decides
//! nothing itself: the rules are the pump's and the SIU role's, the ones the SIU daemon and
//! the simulator run.

use crate::DaemonError;
use crate::pump::{LocalTurns, Pump};
use crate::siu::{PEER_APP, SiuGauges, SiuPlan, SiuRole};
use isotach_am::port::{links_on, take_arrivals};
use isotach_am::{NodeAddr, Tag, Time, Transport};
use isotach_siu::{Siu, SiuConfig};
use std::sync::Arc;

/// The host's SIU and its transport, driven by the application's thread.
#[derive(Debug)]
pub struct EmbeddedSiu<T: Transport> {
    pump: Pump<SiuRole>,
    transport: T,
    /// The last pass found the socket empty (or ended the application's turn without
    /// reading it), and nothing was offered or waited for since: before a wait, another pass
    /// would only probe the socket ([`EmbeddedSiu::pass_if_due`]).
    drained: bool,
}

impl<T: Transport> EmbeddedSiu<T> {
    /// The SIU of `plan` over `transport` (bound to the plan's SIU address; the plan's
    /// application address is not used: the application is this process), tagged `tag`.
    /// The application counts as attached from the start.
    pub fn new(plan: SiuPlan, transport: T, tag: Tag) -> Result<Self, DaemonError> {
        let queue_max = plan.cfg.limits.queue_packets_max;
        // The application answers an EOP on this thread before the next pass: let the token
        // its pulse allowed wait for that answer (`SiuConfig::host_turns`).
        let cfg = SiuConfig {
            host_turns: true,
            ..plan.cfg
        };
        let role = SiuRole::new(Siu::new(cfg));
        // The links hold every peer but the in-process application, in peer-id order.
        let net_peers: Vec<NodeAddr> = plan
            .peers
            .iter()
            .enumerate()
            .filter(|&(p, _)| p != PEER_APP)
            .map(|(_, &a)| a)
            .collect();
        let links = links_on(&transport, &net_peers, tag)?;
        let mut pump = Pump::with_local(role, links, queue_max, PEER_APP, LocalTurns::EveryPass);
        pump.local_attach(transport.now());
        Ok(Self {
            pump,
            transport,
            drained: false,
        })
    }

    /// Queues a packet from the application; handed back when the SIU's host queue is full
    /// (run [`EmbeddedSiu::pass`] and offer it again). It leaves in the next pass, batched
    /// with whatever else the pass sends.
    pub fn offer(&mut self, packet: Vec<u8>) -> Result<(), Vec<u8>> {
        self.pump.local_send(packet)?;
        self.drained = false;
        Ok(())
    }

    /// The next packet for the application.
    pub fn take_for_host(&mut self) -> Option<Vec<u8>> {
        self.pump.local_recv()
    }

    /// Hands back a packet buffer the application is done with: the SIU's links take the
    /// next packets from the network in it.
    pub fn recycle(&mut self, buf: Vec<u8>) {
        self.pump.recycle(buf);
    }

    /// A spare packet buffer of the SIU's links, for the application to build its next packet
    /// in (what it sends comes back as spares once the links sent it).
    pub fn take_spare(&mut self) -> Option<Vec<u8>> {
        self.pump.take_spare()
    }

    /// Packets for the application it has not taken yet.
    pub fn waiting_for_host(&self) -> usize {
        self.pump.local_waiting()
    }

    /// One pass without blocking: what arrived in, the pump (timers, input, output), and
    /// datagrams out. Returns the datagrams taken.
    ///
    /// A pass that ends the application's turn only sends: the application's answer and the
    /// token held for it go out at once, since every host waits for that token, and the
    /// socket is left for the next pass or wait (nothing can answer that token yet; what came
    /// before it is found there, a wait returning at once). This saves a receive that finds
    /// nothing on every significant pulse.
    pub fn pass(&mut self) -> Result<usize, DaemonError> {
        let now = self.transport.now();
        if self.pump.role().siu().host_turn_pending() {
            // Ends the turn. A token the links already held (input waiting for room) may
            // start the next one in the same run: its EOP then waits for the application.
            self.advance(now)?;
            // Nothing for a wait to miss: it finds whatever is in the socket.
            self.drained = true;
            return Ok(0);
        }
        let pump = &mut self.pump;
        let taken = take_arrivals(&mut self.transport, |from, bytes| {
            pump.handle_datagram(now, from, bytes);
        })?;
        self.advance(now)?;
        self.drained = taken == 0;
        Ok(taken)
    }

    /// Runs the pump at `now` and sends what it has for the network, in one batch.
    fn advance(&mut self, now: Time) -> Result<(), DaemonError> {
        self.pump.advance(now)?;
        while let Some((to, bytes)) = self.pump.poll_transmit(now) {
            self.transport.send(to, bytes)?;
        }
        self.transport.flush()?;
        Ok(())
    }

    /// A pass, unless the last one found the socket empty (or ended the turn) and nothing was
    /// offered or waited for since (a caller about to wait: the wait finds what arrives, and
    /// returns at once for a timer that came due). Saves the empty probe between a pass that
    /// sent and the wait after it.
    pub fn pass_if_due(&mut self) -> Result<usize, DaemonError> {
        if self.drained {
            return Ok(0);
        }
        self.pass()
    }

    /// Blocks until a datagram arrives, the pump's next deadline, or `deadline`, whichever is
    /// first. Returns whether a datagram (or a packet for the application) is waiting.
    ///
    /// An application that waits has had its turn: a token held for it goes first (a pass),
    /// so a wait never holds up logical time.
    pub fn wait(&mut self, deadline: Time) -> Result<bool, DaemonError> {
        self.drained = false;
        if self.pump.role().siu().host_turn_pending() {
            self.pass()?;
            if self.waiting_for_host() > 0 || self.transport.has_pending() {
                return Ok(true);
            }
        }
        let now = self.transport.now();
        let until = self
            .pump
            .poll_timeout(now)
            .map_or(deadline, |t| t.min(deadline));
        if until <= now {
            return Ok(self.transport.has_pending());
        }
        Ok(self.transport.wait_from(now, Some(until))?)
    }

    /// The transport's clock.
    pub fn now(&self) -> Time {
        self.transport.now()
    }

    /// The pump (role, links, counters).
    pub fn pump(&self) -> &Pump<SiuRole> {
        &self.pump
    }

    /// The gauges the SIU updates (its receive clock, whether logical time started).
    pub fn gauges(&self) -> Arc<SiuGauges> {
        self.pump.role().gauges()
    }

    /// The transport.
    pub fn transport(&self) -> &T {
        &self.transport
    }
}
