//! The simulated daemons: each TM and SIU is the daemons' own [`Pump`] (role plus links),
//! wrapped so the simulator sees what a daemon only logs, and reachable at a memory address on
//! the simulated datagram network.

use crate::rng::SimRng;
use isotach_am_proto::link::LossReason;
use isotach_am_proto::link::{DEFAULT_TAG, Directory, Links, PeerList};
use isotach_am_proto::{Config as AmConfig, NodeAddr};
use isotach_daemon::pump::{LocalTurns, Pump, Role, Verdict};
use isotach_daemon::siu::{PEER_APP, PEER_TM, SiuRole};
use isotach_daemon::tm::TmRole;
use isotach_proto::config::ClusterConfig;
use isotach_proto::packet::{BufPool, Kind};
use isotach_proto::topology::{Hop, HostId, SwitchId, Topology};
use isotach_siu::{Mode, Siu, SiuConfig, SiuError};
use isotach_tm::{TmConfig, TokenManager};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use super::{NodeId, SimConfig, node_rng};

/// Largest datagram of the simulated network.
pub(super) const DATAGRAM_MAX: usize = 65_507;
/// Memory addresses: SIU `h` is `SIU_BASE + h`, TM `s` is `TM_BASE + s`.
const SIU_BASE: u32 = 0x2000_0000;
const TM_BASE: u32 = 0x4000_0000;
/// The AM layer's longest retransmission timeout in the simulator.
const RTO_MAX: Duration = Duration::from_millis(50);

/// A node's address on the simulated network.
pub(super) fn addr(node: NodeId) -> NodeAddr {
    match node {
        NodeId::Siu(h) => NodeAddr::Mem(SIU_BASE + u32::from(h)),
        NodeId::Tm(s) => NodeAddr::Mem(TM_BASE + u32::from(s)),
        NodeId::Host(_) => unreachable!("hosts talk to their SIU in-process"),
    }
}

/// The node at an address (`None` for anything else).
pub(super) fn node_at(a: NodeAddr) -> Option<NodeId> {
    let NodeAddr::Mem(m) = a else { return None };
    match m {
        m if m >= TM_BASE => SwitchId::try_from(m - TM_BASE).ok().map(NodeId::Tm),
        m if m >= SIU_BASE => HostId::try_from(m - SIU_BASE).ok().map(NodeId::Siu),
        _ => None,
    }
}

/// What the simulator learns from a wrapped role during one pump call.
#[derive(Debug)]
pub(super) enum Seen {
    /// A network packet was offered to the state machine.
    NetIn {
        /// The simulator flipped a byte of this token first.
        corrupted: bool,
        verdict: Verdict,
    },
    /// A host packet was offered to the SIU.
    HostIn {
        bytes: Vec<u8>,
        refused: Option<SiuError>,
    },
    /// The SIU put a packet on the network side, in this generation.
    NetOut {
        to_tm: bool,
        bytes: Vec<u8>,
        generation: u32,
    },
}

/// A role as the simulator runs it: token corruption on network input (with probability
/// `corrupt`; the receiver must refuse it), and a log of what happened.
#[derive(Debug)]
pub(super) struct Watched<R> {
    pub(super) inner: R,
    corrupt: f64,
    rng: SimRng,
    pub(super) seen: Vec<Seen>,
    /// Log host input and network output (SIUs; the oracles watch them).
    watch_siu: bool,
    /// The generation each packet in the state machine's network queue was queued in
    /// (a message stamped before a restart may leave after it).
    queued_in: VecDeque<u32>,
}

impl<R> Watched<R> {
    fn new(inner: R, corrupt: f64, rng: SimRng, watch_siu: bool) -> Self {
        Self {
            inner,
            corrupt,
            rng,
            seen: Vec::new(),
            watch_siu,
            queued_in: VecDeque::new(),
        }
    }
}

impl<R: Inspect> Watched<R> {
    /// Runs `f` on the inner role, noting the generation of what it queued for the network.
    fn track<T>(&mut self, f: impl FnOnce(&mut R) -> T) -> T {
        let before = self.inner.net_queued();
        let out = f(&mut self.inner);
        let after = self.inner.net_queued();
        let g = self.inner.generation();
        for _ in before..after {
            self.queued_in.push_back(g);
        }
        out
    }
}

/// Hooks a wrapped role offers beyond [`Role`].
pub(super) trait Inspect {
    /// Is `peer` the host (the SIU's application)?
    fn is_host(&self, peer: usize) -> bool;
    /// Why the last host packet was refused.
    fn host_refusal(&mut self) -> Option<SiuError>;
    /// The logical-time generation now.
    fn generation(&self) -> u32;
    /// Packets in the state machine's network queue.
    fn net_queued(&self) -> usize;
}

impl Inspect for TmRole {
    fn is_host(&self, _peer: usize) -> bool {
        false
    }
    fn host_refusal(&mut self) -> Option<SiuError> {
        None
    }
    fn generation(&self) -> u32 {
        self.tm().generation().get()
    }
    fn net_queued(&self) -> usize {
        0
    }
}

impl Inspect for SiuRole {
    fn is_host(&self, peer: usize) -> bool {
        peer == PEER_APP
    }
    fn host_refusal(&mut self) -> Option<SiuError> {
        self.take_host_refusal()
    }
    fn generation(&self) -> u32 {
        self.siu().generation().get()
    }
    fn net_queued(&self) -> usize {
        self.siu().queue_depths().1
    }
}

impl<R: Role + Inspect> Role for Watched<R> {
    fn lanes(&self) -> usize {
        self.inner.lanes()
    }
    fn lane(&self, peer: usize) -> usize {
        self.inner.lane(peer)
    }
    fn out_lanes(&self) -> usize {
        self.inner.out_lanes()
    }

    fn handle_packet(&mut self, now_us: u64, peer: usize, bytes: &mut Vec<u8>) -> Verdict {
        if self.inner.is_host(peer) {
            // Copied first: the role may take the buffer.
            let seen = self.watch_siu.then(|| bytes.clone());
            let verdict = self.track(|r| r.handle_packet(now_us, peer, bytes));
            if let Some(bytes) = seen.filter(|_| verdict != Verdict::Retry) {
                let refused = self.inner.host_refusal();
                self.seen.push(Seen::HostIn { bytes, refused });
            }
            return verdict;
        }
        let is_token = bytes.get(1) == Some(&(Kind::Token as u8));
        if is_token && self.rng.chance(self.corrupt) {
            let mut bad = bytes.to_vec();
            crate::net::corrupt(&mut bad, &mut self.rng);
            let verdict = self.track(|r| r.handle_packet(now_us, peer, &mut bad));
            if verdict != Verdict::Retry {
                self.seen.push(Seen::NetIn {
                    corrupted: true,
                    verdict: verdict.clone(),
                });
            }
            return verdict;
        }
        let verdict = self.track(|r| r.handle_packet(now_us, peer, bytes));
        if matches!(verdict, Verdict::Refused(_)) {
            self.seen.push(Seen::NetIn {
                corrupted: false,
                verdict: verdict.clone(),
            });
        }
        verdict
    }

    fn handle_timeout(&mut self, now_us: u64) {
        self.track(|r| r.handle_timeout(now_us));
    }
    fn poll_timeout(&self) -> Option<u64> {
        self.inner.poll_timeout()
    }
    fn local_turn_ended(&mut self, now_us: u64) {
        self.track(|r| r.local_turn_ended(now_us));
    }
    fn local_turn_coming(&self) -> bool {
        self.inner.local_turn_coming()
    }

    fn poll_output(&mut self, now_us: u64, lane: usize) -> Option<(usize, Vec<u8>)> {
        let before = self.inner.net_queued();
        let out = self.inner.poll_output(now_us, lane);
        let after = self.inner.net_queued();
        // Network output pops what it sends (and what it could not route); host output may
        // queue answers for an absent host.
        let mut generation = self.inner.generation();
        for _ in after..before {
            generation = self.queued_in.pop_front().unwrap_or(generation);
        }
        let g = self.inner.generation();
        for _ in before..after {
            self.queued_in.push_back(g);
        }
        let out = out?;
        if self.watch_siu && !self.inner.is_host(out.0) {
            self.seen.push(Seen::NetOut {
                to_tm: out.0 == PEER_TM,
                bytes: out.1.clone(),
                generation,
            });
        }
        Some(out)
    }

    fn redundant(&self, bytes: &[u8]) -> bool {
        self.inner.redundant(bytes)
    }
    fn link_up(&mut self, now_us: u64, peer: usize) {
        self.track(|r| r.link_up(now_us, peer));
    }
    fn link_lost(&mut self, now_us: u64, peer: usize, reason: LossReason, dropped: usize) {
        self.track(|r| r.link_lost(now_us, peer, reason, dropped));
    }
    fn undelivered(&mut self, now_us: u64, peer: usize, bytes: Vec<u8>) {
        self.track(|r| r.undelivered(now_us, peer, bytes));
    }
    fn take_relink(&mut self) -> bool {
        self.inner.take_relink()
    }
    fn quiet(&self) -> bool {
        self.inner.quiet()
    }
    fn buffers(&mut self) -> Option<&mut BufPool> {
        self.inner.buffers()
    }
}

/// The AM settings of the simulated links: the daemons' (`Links::am_config`) with the
/// retransmission timeout of the simulated network, and acknowledgements held for at most a
/// quarter of it (as the daemons hold them for under a third of theirs).
pub(super) fn am_config(rto_us: u64) -> AmConfig {
    let rto = Duration::from_micros(rto_us);
    let links = Links::am_config();
    AmConfig {
        rto_initial: rto,
        rto_min: rto,
        rto_max: RTO_MAX.max(rto),
        ack_delay: links.ack_delay.min(rto / 4),
        ..links
    }
}

/// What building a node needs.
pub(super) struct Build<'a> {
    seed: u64,
    cluster: &'a ClusterConfig,
    topology: &'a Arc<Topology>,
    am: &'a AmConfig,
    token_corrupt: f64,
    /// The SIUs wait for their hosts' turns ([`super::NetFaults::host_turns`]).
    host_turns: bool,
    /// Every SIU's address, by host: the on-demand peers every SIU shares.
    sius: Arc<Directory>,
}

impl<'a> Build<'a> {
    /// What `cfg` gives every node: the first processes and each restarted one alike.
    pub(super) fn new(
        cfg: &'a SimConfig,
        topology: &'a Arc<Topology>,
        am: &'a AmConfig,
        sius: &Arc<Directory>,
    ) -> Self {
        Self {
            seed: cfg.seed,
            cluster: &cfg.cluster,
            topology,
            am,
            token_corrupt: cfg.net.faults.token_corrupt,
            host_turns: cfg.net.host_turns,
            sius: Arc::clone(sius),
        }
    }

    /// The links of node `me`'s `incarnation` to `peers`.
    fn links(&self, me: NodeId, incarnation: u64, peers: PeerList) -> Links {
        let am = self.am.clone();
        Links::with_peers(am, addr(me), incarnation, DATAGRAM_MAX, peers, DEFAULT_TAG)
            .expect("simulated link settings are valid")
    }
}

/// Every SIU's address, by host: the directory of on-demand peers all SIUs share.
pub(super) fn siu_directory(topology: &Topology) -> Arc<Directory> {
    let sius = (0..topology.host_count())
        .map(|h| addr(NodeId::Siu(h as HostId)))
        .collect();
    Directory::new(sius).expect("one address per host")
}

/// A fresh token manager for switch `s`, incarnation `incarnation`.
pub(super) fn tm_pump(b: &Build<'_>, s: SwitchId, incarnation: u64) -> Pump<Watched<TmRole>> {
    let tm = TokenManager::new(TmConfig {
        switch: s,
        topology: Arc::clone(b.topology),
        timing: b.cluster.timing,
        limits: b.cluster.limits,
    });
    let peers: Vec<NodeAddr> = tm
        .links()
        .map(|hop| match hop {
            Hop::Host(h) => addr(NodeId::Siu(h)),
            Hop::Switch(t) => addr(NodeId::Tm(t)),
        })
        .collect();
    let peers = PeerList::eager(&peers).expect("a TM's links go to distinct nodes");
    let links = b.links(NodeId::Tm(s), incarnation, peers);
    let rng = node_rng(b.seed, NodeId::Tm(s), incarnation);
    let role = Watched::new(TmRole::new(tm), b.token_corrupt, rng, false);
    Pump::new(role, links, b.cluster.limits.queue_packets_max)
}

/// A fresh SIU for host `h`, incarnation `incarnation`; its application is in-process.
pub(super) fn siu_pump(b: &Build<'_>, h: HostId, incarnation: u64) -> Pump<Watched<SiuRole>> {
    let siu = Siu::new(SiuConfig {
        host: h,
        mode: Mode::Siu,
        topology: Arc::clone(b.topology),
        timing: b.cluster.timing,
        limits: b.cluster.limits,
        initiates_reset: h == 0,
        host_turns: b.host_turns,
    });
    // The daemon's layout (TM, application, other SIUs) without the in-process application:
    // the TM linked at once, the other SIUs on demand, as the daemon links them.
    let tm = [addr(NodeId::Tm(b.topology.switch_of(h)))];
    let peers = PeerList::with_on_demand(&tm, Arc::clone(&b.sius), Some(usize::from(h)))
        .expect("the SIUs' addresses are distinct");
    let mut links = b.links(NodeId::Siu(h), incarnation, peers);
    if incarnation > super::FIRST_INCARNATION {
        // A restarted SIU: the others' links to its previous process must start over
        // before they send to it (`Links::link_every_peer`).
        links
            .link_every_peer()
            .expect("every SIU of the directory can be linked");
    }
    let mut siu = SiuRole::new(siu);
    siu.observe_absent(true);
    let rng = node_rng(b.seed, NodeId::Siu(h), incarnation);
    let role = Watched::new(siu, b.token_corrupt, rng, true);
    Pump::with_local(
        role,
        links,
        b.cluster.limits.queue_packets_max,
        PEER_APP,
        LocalTurns::Driver,
    )
}
