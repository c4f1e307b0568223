//! The driver: one thread, a virtual clock, an event queue ordered by (time, insertion
//! sequence), hosts, pauses and restarts — and the daemons themselves: every TM and SIU is the
//! daemons' [`Pump`](isotach_daemon::Pump) (state machine, daemon rules, links with hello,
//! credit and back-pressure) exchanging AM datagrams over a faulty simulated network.

mod config;
mod daemons;
mod event;
mod faults;
mod hosts;
mod node;
mod run;
mod tamper;
#[cfg(test)]
mod tests;

use crate::hash::Fnv1a64;
use crate::host::{Host, HostAction, Observer};
use crate::net::{Channel, NetStats};
use crate::rng::SimRng;
use crate::unexpected::Unexpected;
pub use config::{NetFaults, Pauses, Restarts, SimConfig, Tamper};
use event::{Event, Scheduled};
use isotach_am_proto::link::Directory;
use isotach_am_proto::{NodeAddr, Time};
use isotach_daemon::pump::Pump;
use isotach_daemon::siu::SiuRole;
use isotach_daemon::tm::TmRole;
use isotach_proto::config::check_bounds;
use isotach_proto::topology::{HostId, SwitchId, Topology};
use isotach_siu::Siu;
use isotach_tm::TokenManager;
use node::{Build, Watched};
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::Arc;

/// Random streams of one run (see [`SimRng::stream`]).
mod stream {
    pub(super) const NET: u64 = 1;
    pub(super) const PAUSE: u64 = 2;
    pub(super) const RESTART: u64 = 3;
    pub(super) const HOST_BASE: u64 = 1_000;
    pub(super) const NODE_BASE: u64 = 1_000_000;
}

/// Nanoseconds per microsecond (the links keep AM time in ns).
const NS_PER_US: u64 = 1_000;
/// The incarnation of every TM's and SIU's first process; each restart counts up from it.
const FIRST_INCARNATION: u64 = 1;

/// A node of the simulated cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NodeId {
    /// A host (the application side).
    Host(HostId),
    /// The SIU of a host.
    Siu(HostId),
    /// The token manager of a switch.
    Tm(SwitchId),
}

impl NodeId {
    fn tag(self) -> [u8; 3] {
        let (kind, id) = match self {
            Self::Host(h) => (1, h),
            Self::Siu(h) => (2, h),
            Self::Tm(s) => (3, s),
        };
        let id = id.to_be_bytes();
        [kind, id[0], id[1]]
    }
}

/// Counters of the driver.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SimStats {
    /// Events processed.
    pub events: u64,
    /// Packets delivered to a node (the trace hash covers each).
    pub deliveries: u64,
    /// Pauses started.
    pub pauses: u64,
    /// TMs and SIUs crashed and restarted.
    pub restarts: u64,
    /// Host packets the SIU's in-process queue was full for (retried: back-pressure).
    pub host_backpressure: u64,
    /// Corrupted tokens their receiver dropped (as it must).
    pub corrupt_tokens_dropped: u64,
    /// Corrupted tokens their receiver accepted (must stay 0).
    pub corrupt_tokens_accepted: u64,
    /// Errors from a TM or an SIU on intact network input (must stay 0 without restarts).
    pub net_errors: u64,
    /// Packets an application sent for later that reached its SIU after it left (dropped).
    pub departed_dropped: u64,
    /// Packets between a host and its SIU on their way when the SIU process crashed: lost
    /// with it (the application is told of the crash and starts over with the new process).
    pub lost_with_siu: u64,
    /// Intact network input refused by a node that restarted or whose peer did (an old
    /// generation's packets; expected after a restart, counted apart).
    pub net_refused_after_restart: u64,
    /// Host turns ended: an SIU waited for its host's answer to a significant pulse
    /// ([`NetFaults::host_turns`]).
    pub host_turns_ended: u64,
    /// Host packets the SIU refused.
    pub host_refusals: u64,
    /// Of those, refused because logical time had not started yet.
    pub host_refusals_not_started: u64,
    /// What the network did.
    pub net: NetStats,
}

/// Why a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunEnd {
    /// The stop condition held.
    Stopped,
    /// No pulse progress (minimum recvclock) for the stall time.
    Stalled,
    /// Nothing left to do.
    Exhausted,
}

/// Pause, crash and timer state of a TM or SIU.
#[derive(Debug, Default)]
struct Runtime {
    paused: bool,
    /// Crashed: datagrams to it are lost, nothing runs, until it is revived.
    down: bool,
    deferred: VecDeque<Event>,
    timer_armed_us: Option<u64>,
    incarnation: u64,
    /// It, or a peer of the cluster, restarted (old packets may be refused from now on).
    restarted: bool,
    /// Its links' `links_lost` as last seen.
    links_lost_seen: u64,
}

impl Runtime {
    /// The first process of a TM or SIU, running.
    fn first() -> Self {
        Self {
            incarnation: FIRST_INCARNATION,
            ..Self::default()
        }
    }
}

#[derive(Debug)]
struct SiuNode {
    pump: Pump<Watched<SiuRole>>,
    rt: Runtime,
    to_host: Channel,
    from_host: Channel,
    /// The host's application is attached (as the SIU was last told).
    attached: bool,
    /// The application left; the SIU learns it after what it sent ([`Event::SiuDetach`]).
    detaching: bool,
    /// Host packets the SIU's in-process queue was full for, in order.
    backlog: VecDeque<Vec<u8>>,
    /// A [`Event::HostTurn`] is on its way for the token this SIU holds for its host.
    turn_asked: bool,
}

#[derive(Debug)]
struct TmNode {
    pump: Pump<Watched<TmRole>>,
    rt: Runtime,
}

#[derive(Debug, Default)]
struct TamperState {
    held: Option<(HostId, u64, Vec<u8>)>,
    done: bool,
}

/// The simulator. `H` is the host behaviour, `O` the god's-eye observer.
#[derive(Debug)]
pub struct Sim<H: Host, O: Observer> {
    cfg: SimConfig,
    topology: Arc<Topology>,
    am: isotach_am_proto::Config,
    /// Every SIU's address: the on-demand peers all SIUs share.
    siu_dir: Arc<Directory>,
    now_us: u64,
    seq: u64,
    queue: BinaryHeap<Scheduled>,
    sius: Vec<SiuNode>,
    tms: Vec<TmNode>,
    hosts: Vec<H>,
    host_rngs: Vec<SimRng>,
    /// One-way base latency of each direction between two nodes, drawn on first use.
    latency: HashMap<(NodeId, NodeId), u64>,
    observer: O,
    net_rng: SimRng,
    pause_rng: SimRng,
    restart_rng: SimRng,
    restarts_left: u32,
    tamper: TamperState,
    hash: Fnv1a64,
    stats: SimStats,
    /// Unexpected errors of the TMs and SIUs (the hosts keep their own).
    unexpected: Unexpected,
    recvclocks: Vec<u64>,
    /// Each SIU's generation as last reported to the observer.
    generations: Vec<u32>,
    /// Links lost so far, all daemons (a change is reported to the observer).
    links_lost: u64,
    min_recvclock: u64,
    progress_at_us: u64,
    actions: Vec<HostAction>,
    /// Hosts whose behaviour or SIU ran since [`Sim::run_until_hosts`] last looked (each
    /// once, flagged in `touched_flag`).
    touched: Vec<HostId>,
    touched_flag: Vec<bool>,
    /// Datagrams a node produced, before the network takes them.
    outbox: Vec<(NodeAddr, Vec<u8>)>,
}

/// Why a simulation cannot be built.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SimError {
    /// One host behaviour per host is needed.
    #[error("{hosts} hosts in the topology but {behaviours} host behaviours")]
    HostCount {
        /// Hosts in the topology.
        hosts: usize,
        /// Behaviours given.
        behaviours: usize,
    },
    /// A fault setting is unusable.
    #[error(transparent)]
    Faults(#[from] crate::net::FaultError),
    /// A timing setting is unusable.
    #[error("{0}")]
    Timing(&'static str),
    /// Timing or limits outside their bounds for the topology (as the config loader checks
    /// them, `isotach_proto::config::check_bounds`).
    #[error("{key}: {why}")]
    Config {
        /// The dotted config key.
        key: &'static str,
        /// What is wrong, and which values work.
        why: String,
    },
}

impl<H: Host, O: Observer> Sim<H, O> {
    /// Builds the cluster and starts it at virtual time 0: every daemon says hello to its
    /// peers (host 0's SIU starts logical time once its TM answers) and every host's
    /// [`Host::on_start`] runs.
    pub fn new(cfg: SimConfig, hosts: Vec<H>, observer: O) -> Result<Self, SimError> {
        cfg.net.faults.validate()?;
        // What the daemons would refuse to start with, the simulator refuses too.
        let c = &cfg.cluster;
        check_bounds(&c.timing, &c.limits, &c.topology)
            .map_err(|(key, why)| SimError::Config { key, why })?;
        if let Some(p) = cfg.net.pauses
            && (p.every_us == 0 || p.duration_us.lo > p.duration_us.hi)
        {
            return Err(SimError::Timing("pauses need every-us >= 1 and lo <= hi"));
        }
        if let Some(r) = cfg.net.restarts
            && (r.every_us == 0 || r.down_us.lo > r.down_us.hi)
        {
            return Err(SimError::Timing("restarts need every-us >= 1 and lo <= hi"));
        }
        let topology = Arc::new(cfg.cluster.topology.clone());
        let n_hosts = topology.host_count();
        if hosts.len() != n_hosts {
            return Err(SimError::HostCount {
                hosts: n_hosts,
                behaviours: hosts.len(),
            });
        }
        let am = node::am_config(cfg.net.faults.rto_us);
        let siu_dir = node::siu_directory(&topology);
        let build = Build::new(&cfg, &topology, &am, &siu_dir);
        let tms = (0..topology.switch_count())
            .map(|s| TmNode {
                pump: node::tm_pump(&build, s as SwitchId, FIRST_INCARNATION),
                rt: Runtime::first(),
            })
            .collect();
        let sius = (0..n_hosts)
            .map(|h| SiuNode {
                pump: node::siu_pump(&build, h as HostId, FIRST_INCARNATION),
                rt: Runtime::first(),
                to_host: Channel::fixed(cfg.net.faults.host_latency_us),
                from_host: Channel::fixed(cfg.net.faults.host_latency_us),
                attached: false,
                detaching: false,
                backlog: VecDeque::new(),
                turn_asked: false,
            })
            .collect();
        let host_rngs = (0..n_hosts)
            .map(|h| SimRng::stream(cfg.seed, stream::HOST_BASE + h as u64))
            .collect();
        let mut sim = Self {
            topology,
            am,
            siu_dir,
            now_us: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            sius,
            tms,
            hosts,
            host_rngs,
            latency: HashMap::new(),
            observer,
            net_rng: SimRng::stream(cfg.seed, stream::NET),
            pause_rng: SimRng::stream(cfg.seed, stream::PAUSE),
            restart_rng: SimRng::stream(cfg.seed, stream::RESTART),
            restarts_left: cfg.net.restarts.map_or(0, |r| r.count),
            tamper: TamperState::default(),
            hash: Fnv1a64::new(),
            stats: SimStats::default(),
            unexpected: Unexpected::default(),
            recvclocks: vec![0; n_hosts],
            generations: vec![0; n_hosts],
            links_lost: 0,
            min_recvclock: 0,
            progress_at_us: 0,
            actions: Vec::new(),
            touched: Vec::new(),
            touched_flag: vec![false; n_hosts],
            outbox: Vec::new(),
            cfg,
        };
        sim.start();
        Ok(sim)
    }

    fn start(&mut self) {
        for s in 0..self.tms.len() {
            self.run_node(NodeId::Tm(s as SwitchId));
        }
        for h in 0..self.hosts.len() {
            let host = h as HostId;
            if self.hosts[h].attached() {
                self.attach(host);
            }
            self.run_node(NodeId::Siu(host));
        }
        for h in 0..self.hosts.len() {
            self.with_host(h as HostId, |host, ctx| host.on_start(ctx));
        }
        if let Some(p) = self.cfg.net.pauses {
            self.schedule(p.every_us, Event::Pause);
        }
        if let Some(r) = self.cfg.net.restarts
            && r.count > 0
        {
            self.schedule(r.every_us, Event::Crash);
        }
    }

    // -----------------------------------------------------------------------------------------
    // Observers

    /// Virtual time now.
    pub fn now_us(&self) -> u64 {
        self.now_us
    }
    /// The configuration.
    pub fn config(&self) -> &SimConfig {
        &self.cfg
    }
    /// The topology.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }
    /// The SIU of `host`.
    pub fn siu(&self, host: HostId) -> &Siu {
        self.sius[usize::from(host)].pump.role().inner.siu()
    }
    /// Every SIU, by host id.
    pub fn sius(&self) -> impl Iterator<Item = &Siu> {
        self.sius.iter().map(|n| n.pump.role().inner.siu())
    }
    /// Every TM, by switch id.
    pub fn tms(&self) -> impl Iterator<Item = &TokenManager> {
        self.tms.iter().map(|n| n.pump.role().inner.tm())
    }
    /// Counters of every daemon's links, SIUs first (by host id), then TMs.
    pub fn link_stats(&self) -> impl Iterator<Item = isotach_am_proto::link::LinkStats> + '_ {
        let sius = self.sius.iter().map(|n| n.pump.links().stats());
        sius.chain(self.tms.iter().map(|n| n.pump.links().stats()))
    }
    /// The host behaviours.
    pub fn hosts(&self) -> &[H] {
        &self.hosts
    }
    /// The observer.
    pub fn observer(&self) -> &O {
        &self.observer
    }
    /// The observer, mutably.
    pub fn observer_mut(&mut self) -> &mut O {
        &mut self.observer
    }
    /// Driver counters.
    pub fn stats(&self) -> SimStats {
        self.stats
    }
    /// Unexpected errors of the TMs and SIUs: refused intact network input, accepted corrupted
    /// tokens, errors of a daemon's pump (each also in [`SimStats`]).
    pub fn unexpected(&self) -> &Unexpected {
        &self.unexpected
    }
    /// FNV-1a 64 over every delivery (time, node, bytes) so far.
    pub fn trace_hash(&self) -> u64 {
        self.hash.finish()
    }
    /// The smallest recvclock over all SIUs: pulses every host has completed.
    pub fn min_recvclock(&self) -> u64 {
        self.min_recvclock
    }
    /// When the smallest recvclock last grew.
    pub fn progress_at_us(&self) -> u64 {
        self.progress_at_us
    }

    // -----------------------------------------------------------------------------------------
    // Events

    fn schedule(&mut self, at_us: u64, event: Event) {
        debug_assert!(at_us >= self.now_us);
        self.seq += 1;
        self.queue.push(Scheduled {
            at_us,
            seq: self.seq,
            event,
        });
    }

    fn runtime(&mut self, node: NodeId) -> &mut Runtime {
        match node {
            NodeId::Siu(h) => &mut self.sius[usize::from(h)].rt,
            NodeId::Tm(s) => &mut self.tms[usize::from(s)].rt,
            NodeId::Host(_) => unreachable!("hosts are never paused"),
        }
    }

    fn dispatch(&mut self, event: Event) {
        if let Some(node) = event.pausable_target() {
            let rt = self.runtime(node);
            if rt.down {
                // A crashed process: what was on its way to it is lost.
                return;
            }
            // A paused node's inputs wait; later inputs queue behind them.
            if rt.paused || !rt.deferred.is_empty() {
                rt.deferred.push_back(event);
                return;
            }
        }
        self.handle(event);
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::Datagram { to, from, bytes } => {
                self.trace(to, &bytes);
                let now = self.now();
                match to {
                    NodeId::Siu(h) => self.sius[usize::from(h)]
                        .pump
                        .handle_datagram(now, from, &bytes),
                    NodeId::Tm(s) => self.tms[usize::from(s)]
                        .pump
                        .handle_datagram(now, from, &bytes),
                    NodeId::Host(_) => unreachable!("datagrams go to daemons"),
                }
                self.run_node(to);
            }
            Event::SiuHost {
                host,
                bytes,
                incarnation,
            } => {
                if self.lost_with_siu(host, incarnation) {
                    return;
                }
                self.trace(NodeId::Siu(host), &bytes);
                let node = &mut self.sius[usize::from(host)];
                if !node.attached {
                    // Sent late (a delayed resend) by an application that has left: gone
                    // with it. Taken, its first packet would attach an application again.
                    self.stats.departed_dropped += 1;
                    return;
                }
                if node.backlog.is_empty() {
                    if let Err(b) = node.pump.local_send(bytes) {
                        node.backlog.push_back(b);
                    }
                } else {
                    node.backlog.push_back(bytes);
                }
                self.run_node(NodeId::Siu(host));
            }
            Event::HostPacket {
                host,
                bytes,
                incarnation,
            } => {
                if !self.lost_with_siu(host, incarnation) {
                    self.host_packet(host, bytes);
                }
            }
            Event::HostTurn {
                host,
                incarnation,
                reacted,
            } => {
                if self.lost_with_siu(host, incarnation) {
                    return;
                }
                if reacted {
                    let at = self.sius[usize::from(host)]
                        .from_host
                        .fixed_transit(self.now_us);
                    self.schedule(at, Event::HostTurnEnd { host, incarnation });
                } else {
                    let again = Event::HostTurn {
                        host,
                        incarnation,
                        reacted: true,
                    };
                    self.schedule(self.now_us, again);
                }
            }
            Event::HostTurnEnd { host, incarnation } => {
                if !self.lost_with_siu(host, incarnation) {
                    self.end_host_turn(host);
                }
            }
            Event::SiuReattach { host } => {
                let now = self.now();
                let n = &mut self.sius[usize::from(host)];
                if n.attached && !n.rt.down {
                    // What the previous application sent and the SIU has not taken is gone
                    // with it (all of it came before this, in the host→SIU order).
                    n.backlog.clear();
                    n.pump.local_replace(now);
                    self.run_node(NodeId::Siu(host));
                }
            }
            Event::SiuDetach { host } => {
                self.sius[usize::from(host)].detaching = false;
                // Unless a new application attached meanwhile (its reattach follows).
                if !self.hosts[usize::from(host)].attached() {
                    self.detach(host);
                }
            }
            Event::HostAbsent { host, bytes } => {
                self.trace(NodeId::Host(host), &bytes);
                self.observer.on_host_packet(self.now_us, host, &bytes);
            }
            Event::HostWake { host, token } => {
                self.with_host(host, |h, ctx| h.on_wake(ctx, token));
            }
            Event::Timer { node, deadline_us } => self.timer(node, deadline_us),
            Event::Pause => self.pause(),
            Event::Resume { node } => self.resume(node),
            Event::Crash => self.crash(),
            Event::Revive { node } => self.revive(node),
        }
    }

    /// Was a packet on host `host`'s link sent to or from SIU process `incarnation`, which
    /// has crashed since? Then it is lost with it (counted): the application was told of the
    /// crash and replaced, and the old one's packets must not reach the new process, nor the
    /// old process's reach the new application.
    fn lost_with_siu(&mut self, host: HostId, incarnation: u64) -> bool {
        let lost = self.sius[usize::from(host)].rt.incarnation != incarnation;
        self.stats.lost_with_siu += u64::from(lost);
        lost
    }

    fn now(&self) -> Time {
        Time(self.now_us * NS_PER_US)
    }

    fn trace(&mut self, node: NodeId, bytes: &[u8]) {
        self.stats.deliveries += 1;
        self.hash.write_u64(self.now_us);
        self.hash.write(&node.tag());
        self.hash.write_u64(bytes.len() as u64);
        self.hash.write(bytes);
    }

    /// Counts one unexpected error of `source`, described with the time.
    fn unexpected_error(&mut self, source: &str, what: String) {
        let line = format!("t={}us {what}", self.now_us);
        self.unexpected.one(source, line);
    }

    fn timer(&mut self, node: NodeId, deadline_us: u64) {
        let rt = self.runtime(node);
        if rt.timer_armed_us != Some(deadline_us) {
            return; // superseded
        }
        rt.timer_armed_us = None;
        if rt.paused || rt.down {
            return; // re-armed on resume
        }
        self.run_node(node);
    }
}

/// The random stream of node `node`'s `incarnation` (token corruption at its input).
fn node_rng(seed: u64, node: NodeId, incarnation: u64) -> SimRng {
    let [kind, a, b] = node.tag();
    let id = u64::from(kind) << 16 | u64::from(a) << 8 | u64::from(b);
    SimRng::stream(seed, stream::NODE_BASE + (id << 20) + incarnation)
}
