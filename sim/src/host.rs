//! Pluggable host behaviour and god's-eye observers.
//!
//! A simulated host is anything that implements [`Host`]: it receives the packets its SIU
//! hands it (messages, isochron markers, EOP markers, non-isotach messages) and sends packets
//! to its SIU at times it chooses. The waves workload is one such host; the SMM hosts of a
//! later issue are another. An [`Observer`] sees what no single node sees — every packet an
//! SIU transmits and every packet a host receives — and is where global oracles live.

use crate::rng::SimRng;
use isotach_proto::topology::{HostId, Topology};
use isotach_siu::{SiuError, Transmit};

/// Something a host asked the driver to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HostAction {
    /// Hand `bytes` to the SIU at `at_us` (the host↔SIU link is FIFO in send order).
    Send { at_us: u64, bytes: Vec<u8> },
    /// Call [`Host::on_wake`] with `token` at `at_us`.
    Wake { at_us: u64, token: u64 },
    /// A (new) application attached: tell the SIU ([`isotach_siu::Siu::host_attached`]).
    Attach,
}

/// What a host sees of the simulation while it runs a callback.
#[derive(Debug)]
pub struct HostCtx<'a> {
    pub(crate) now_us: u64,
    pub(crate) host: HostId,
    pub(crate) topology: &'a Topology,
    pub(crate) rng: &'a mut SimRng,
    pub(crate) actions: &'a mut Vec<HostAction>,
    pub(crate) siu_generation: u32,
    pub(crate) siu_recvclock: u64,
}

impl HostCtx<'_> {
    /// Virtual time now.
    pub fn now_us(&self) -> u64 {
        self.now_us
    }

    /// This host's id.
    pub fn host(&self) -> HostId {
        self.host
    }

    /// The logical-time generation this host's SIU is in now (0: not started, or down).
    pub fn siu_generation(&self) -> u32 {
        self.siu_generation
    }

    /// The receive clock of this host's SIU as last seen (the pulse it is in), for
    /// measurements: a host's behaviour must not depend on it.
    pub fn siu_recvclock(&self) -> u64 {
        self.siu_recvclock
    }

    /// The cluster topology.
    pub fn topology(&self) -> &Topology {
        self.topology
    }

    /// This host's own random stream.
    pub fn rng(&mut self) -> &mut SimRng {
        self.rng
    }

    /// Sends an encoded packet to the SIU now.
    pub fn send(&mut self, bytes: Vec<u8>) {
        let at_us = self.now_us;
        self.send_at(at_us, bytes);
    }

    /// Sends an encoded packet to the SIU at `at_us` (now if earlier). Packets reach the SIU
    /// in the order they were sent, whatever times they name.
    pub fn send_at(&mut self, at_us: u64, bytes: Vec<u8>) {
        let at_us = at_us.max(self.now_us);
        self.actions.push(HostAction::Send { at_us, bytes });
    }

    /// A new application attached to this host (after [`Host::attached`] was false): the SIU
    /// orders its first isochron after everything it handed the host before. Call it before
    /// sending the new application's first packet.
    pub fn attach(&mut self) {
        self.actions.push(HostAction::Attach);
    }

    /// Asks for [`Host::on_wake`] with `token` at `at_us` (now if earlier).
    pub fn wake_at(&mut self, at_us: u64, token: u64) {
        let at_us = at_us.max(self.now_us);
        self.actions.push(HostAction::Wake { at_us, token });
    }
}

/// A scripted host. Every callback may send packets and ask for wake-ups through the context.
pub trait Host {
    /// Called once at virtual time 0.
    fn on_start(&mut self, ctx: &mut HostCtx<'_>) {
        let _ = ctx;
    }

    /// An application is attached. While it is not, the SIU gets the packets for the host
    /// back ([`isotach_siu::Siu::host_absent`]) as a daemon's SIU does when none is attached.
    fn attached(&self) -> bool {
        true
    }

    /// The SIU handed the host a packet.
    fn on_packet(&mut self, ctx: &mut HostCtx<'_>, bytes: &[u8]);

    /// A wake-up asked for with [`HostCtx::wake_at`].
    fn on_wake(&mut self, ctx: &mut HostCtx<'_>, token: u64) {
        let _ = (ctx, token);
    }

    /// The host's SIU crashed and a new process took its place: the application lost its
    /// link and everything in flight on it (a daemon's application gets
    /// `SmmError::SiuRestarted` and is restarted). Called before the new SIU runs.
    fn on_siu_restart(&mut self, ctx: &mut HostCtx<'_>) {
        let _ = ctx;
    }

    /// The SIU refused a packet this host sent (a daemon returns such errors to its local
    /// endpoint).
    fn on_refused(&mut self, ctx: &mut HostCtx<'_>, bytes: &[u8], error: &SiuError) {
        let _ = (ctx, bytes, error);
    }
}

/// A god's-eye view of the run, for global oracles. Every method defaults to doing nothing.
pub trait Observer {
    /// SIU `host` put a packet on the network side (before the network touches it).
    fn on_siu_transmit(&mut self, now_us: u64, host: HostId, tx: &Transmit) {
        let _ = (now_us, host, tx);
    }

    /// SIU `host` took a packet from its host; `refused` holds the error if it refused it.
    fn on_siu_host_input(
        &mut self,
        now_us: u64,
        host: HostId,
        bytes: &[u8],
        refused: Option<&SiuError>,
    ) {
        let _ = (now_us, host, bytes, refused);
    }

    /// SIU `host` is in logical-time generation `generation` now. `fresh`: its host starts
    /// afresh without a reset EOP — the SIU is a new process (the previous one crashed), or it
    /// had not started logical time before this generation.
    fn on_siu_generation(&mut self, now_us: u64, host: HostId, generation: u32, fresh: bool) {
        let _ = (now_us, host, generation, fresh);
    }

    /// A daemon's link broke or a daemon crashed: the generation in force will be replaced.
    fn on_loss(&mut self, now_us: u64) {
        let _ = now_us;
    }

    /// Host `host` received a packet from its SIU.
    fn on_host_packet(&mut self, now_us: u64, host: HostId, bytes: &[u8]) {
        let _ = (now_us, host, bytes);
    }
}

/// The observer that watches nothing.
impl Observer for () {}
