//! The driver: one thread, a virtual clock, an event queue ordered by (time, insertion
//! sequence), the TM and SIU state machines, the links between them, pauses and hosts.

use crate::hash::Fnv1a64;
use crate::host::{Host, HostAction, HostCtx, Observer};
use crate::net::{self, Channel, Faults, NetStats, RangeUs};
use crate::rng::SimRng;
use isotach_proto::config::ClusterConfig;
use isotach_proto::packet::{EopMarker, IsotachMessage, Kind};
use isotach_proto::topology::{Hop, HostId, SwitchId, Topology};
use isotach_siu::{Mode, Route, Siu, SiuConfig, SiuError};
use isotach_tm::{LinkId, TmConfig, TokenManager};
use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::sync::Arc;

/// Random streams of one run (see [`SimRng::stream`]).
mod stream {
    pub(super) const NET: u64 = 1;
    pub(super) const PAUSE: u64 = 2;
    pub(super) const HOST_BASE: u64 = 1_000;
}

/// Every `every_us`, one TM or SIU chosen at random stops for a while: its inputs wait until it
/// resumes and its timers do not fire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pauses {
    /// Time between two pauses.
    pub every_us: u64,
    /// How long a pause lasts.
    pub duration_us: RangeUs,
}

/// Deliberate damage to the SIU→host stream, used only by tests to prove the oracles can fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Tamper {
    /// No damage.
    #[default]
    None,
    /// Hold one host-bound isotach message back until after the EOP marker of its pulse.
    HoldBackMessage,
    /// Swap the first and last entries of one sort vector (of at least 3 entries).
    SwapSortVector,
}

/// Everything that determines a run.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// The seed every random choice derives from.
    pub seed: u64,
    /// Topology, timing and limits: the same type the daemons load.
    pub cluster: ClusterConfig,
    /// The network beneath the links.
    pub faults: Faults,
    /// Pauses of TMs and SIUs (none when `None`).
    pub pauses: Option<Pauses>,
    /// Test-only damage.
    pub tamper: Tamper,
}

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
    /// Corrupted tokens their receiver dropped (as it must).
    pub corrupt_tokens_dropped: u64,
    /// Corrupted tokens their receiver accepted (must stay 0).
    pub corrupt_tokens_accepted: u64,
    /// Errors from a TM or an SIU on intact network input (must stay 0).
    pub net_errors: u64,
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

/// Most error descriptions kept for the report.
const ERROR_LOG_MAX: usize = 16;

#[derive(Debug)]
enum Event {
    /// Network side of an SIU: a token or message from its TM, or a plain message from a peer.
    SiuNet {
        host: HostId,
        bytes: Vec<u8>,
        corrupted: bool,
    },
    /// Host side of an SIU.
    SiuHost {
        host: HostId,
        bytes: Vec<u8>,
    },
    /// A TM link.
    Tm {
        switch: SwitchId,
        link: LinkId,
        bytes: Vec<u8>,
        corrupted: bool,
    },
    /// A packet from the SIU reaches its host.
    HostPacket {
        host: HostId,
        bytes: Vec<u8>,
    },
    HostWake {
        host: HostId,
        token: u64,
    },
    Timer {
        node: NodeId,
        deadline_us: u64,
    },
    Pause,
    Resume {
        node: NodeId,
    },
}

impl Event {
    /// The TM or SIU whose input this is (pauses delay it).
    fn pausable_target(&self) -> Option<NodeId> {
        match self {
            Self::SiuNet { host, .. } | Self::SiuHost { host, .. } => Some(NodeId::Siu(*host)),
            Self::Tm { switch, .. } => Some(NodeId::Tm(*switch)),
            _ => None,
        }
    }
}

#[derive(Debug)]
struct Scheduled {
    at_us: u64,
    seq: u64,
    event: Event,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        (self.at_us, self.seq) == (other.at_us, other.seq)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    /// Reversed: the heap pops the earliest (time, sequence) first.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at_us, other.seq).cmp(&(self.at_us, self.seq))
    }
}

/// Pause state and timer of a TM or SIU.
#[derive(Debug, Default)]
struct Runtime {
    paused: bool,
    deferred: VecDeque<Event>,
    timer_armed_us: Option<u64>,
}

#[derive(Debug)]
struct SiuNode {
    siu: Siu,
    rt: Runtime,
    /// SIU → TM.
    to_tm: Channel,
    tm_link: LinkId,
    /// SIU → host and host → SIU.
    to_host: Channel,
    from_host: Channel,
}

#[derive(Debug, Clone, Copy)]
enum LinkDest {
    Siu(HostId),
    Tm { switch: SwitchId, link: LinkId },
}

#[derive(Debug)]
struct TmNode {
    tm: TokenManager,
    rt: Runtime,
    out: Vec<(Channel, LinkDest)>,
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
    now_us: u64,
    seq: u64,
    queue: BinaryHeap<Scheduled>,
    sius: Vec<SiuNode>,
    tms: Vec<TmNode>,
    hosts: Vec<H>,
    host_rngs: Vec<SimRng>,
    plain: BTreeMap<(HostId, HostId), Channel>,
    observer: O,
    net_rng: SimRng,
    pause_rng: SimRng,
    tamper: TamperState,
    hash: Fnv1a64,
    stats: SimStats,
    errors: Vec<String>,
    recvclocks: Vec<u64>,
    min_recvclock: u64,
    progress_at_us: u64,
    actions: Vec<HostAction>,
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
    Faults(#[from] net::FaultError),
    /// A timing setting is unusable.
    #[error("{0}")]
    Timing(&'static str),
}

impl<H: Host, O: Observer> Sim<H, O> {
    /// Builds the cluster and starts it at virtual time 0: host 0's SIU sends the reset token
    /// and every host's [`Host::on_start`] runs.
    pub fn new(cfg: SimConfig, hosts: Vec<H>, observer: O) -> Result<Self, SimError> {
        cfg.faults.validate()?;
        if cfg.cluster.timing.token_timeout_us == 0 {
            return Err(SimError::Timing("token-timeout-us must be at least 1"));
        }
        if cfg.cluster.timing.epoch_pulses < 2 {
            return Err(SimError::Timing("epoch-pulses must be at least 2"));
        }
        if let Some(p) = cfg.pauses
            && (p.every_us == 0 || p.duration_us.lo > p.duration_us.hi)
        {
            return Err(SimError::Timing("pauses need every-us >= 1 and lo <= hi"));
        }
        let topology = Arc::new(cfg.cluster.topology.clone());
        let n_hosts = topology.host_count();
        if hosts.len() != n_hosts {
            return Err(SimError::HostCount {
                hosts: n_hosts,
                behaviours: hosts.len(),
            });
        }
        let mut net_rng = SimRng::stream(cfg.seed, stream::NET);
        let tms: Vec<TokenManager> = (0..topology.switch_count())
            .map(|s| {
                TokenManager::new(TmConfig {
                    switch: s as SwitchId,
                    topology: Arc::clone(&topology),
                    timing: cfg.cluster.timing,
                    limits: cfg.cluster.limits,
                })
            })
            .collect();
        let mut tm_nodes = Vec::with_capacity(tms.len());
        for (s, tm) in tms.iter().enumerate() {
            let out = tm
                .links()
                .map(|hop| {
                    let dest = match hop {
                        Hop::Host(h) => LinkDest::Siu(h),
                        Hop::Switch(t) => LinkDest::Tm {
                            switch: t,
                            link: tms[usize::from(t)]
                                .link_to(Hop::Switch(s as SwitchId))
                                .expect("trunks are symmetric"),
                        },
                    };
                    (Channel::new(&cfg.faults, &mut net_rng), dest)
                })
                .collect();
            tm_nodes.push(out);
        }
        let sius = (0..n_hosts)
            .map(|h| {
                let host = h as HostId;
                let switch = topology.switch_of(host);
                let siu = Siu::new(SiuConfig {
                    host,
                    mode: Mode::Siu,
                    topology: Arc::clone(&topology),
                    timing: cfg.cluster.timing,
                    limits: cfg.cluster.limits,
                    initiates_reset: h == 0,
                });
                SiuNode {
                    siu,
                    rt: Runtime::default(),
                    to_tm: Channel::new(&cfg.faults, &mut net_rng),
                    tm_link: tms[usize::from(switch)]
                        .link_to(Hop::Host(host))
                        .expect("every host has a link at its switch"),
                    to_host: Channel::fixed(cfg.faults.host_latency_us),
                    from_host: Channel::fixed(cfg.faults.host_latency_us),
                }
            })
            .collect();
        let tms = tms
            .into_iter()
            .zip(tm_nodes)
            .map(|(tm, out)| TmNode {
                tm,
                rt: Runtime::default(),
                out,
            })
            .collect();
        let host_rngs = (0..n_hosts)
            .map(|h| SimRng::stream(cfg.seed, stream::HOST_BASE + h as u64))
            .collect();
        let mut sim = Self {
            topology,
            now_us: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            sius,
            tms,
            hosts,
            host_rngs,
            plain: BTreeMap::new(),
            observer,
            net_rng,
            pause_rng: SimRng::stream(cfg.seed, stream::PAUSE),
            tamper: TamperState::default(),
            hash: Fnv1a64::new(),
            stats: SimStats::default(),
            errors: Vec::new(),
            recvclocks: vec![0; n_hosts],
            min_recvclock: 0,
            progress_at_us: 0,
            actions: Vec::new(),
            cfg,
        };
        sim.start();
        Ok(sim)
    }

    fn start(&mut self) {
        for (h, node) in self.sius.iter_mut().enumerate() {
            if h == 0 {
                node.siu.start(self.now_us);
            }
        }
        self.drain_siu(0);
        for h in 0..self.hosts.len() {
            self.with_host(h as HostId, |host, ctx| host.on_start(ctx));
        }
        if let Some(p) = self.cfg.pauses {
            self.schedule(p.every_us, Event::Pause);
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
        &self.sius[usize::from(host)].siu
    }
    /// Every SIU, by host id.
    pub fn sius(&self) -> impl Iterator<Item = &Siu> {
        self.sius.iter().map(|n| &n.siu)
    }
    /// Every TM, by switch id.
    pub fn tms(&self) -> impl Iterator<Item = &TokenManager> {
        self.tms.iter().map(|n| &n.tm)
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
    /// The first few unexpected errors, described.
    pub fn errors(&self) -> &[String] {
        &self.errors
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
    // Running

    /// Time of the next event.
    pub fn peek_time_us(&self) -> Option<u64> {
        self.queue.peek().map(|s| s.at_us)
    }

    /// Processes the next event; false when there is none.
    pub fn step(&mut self) -> bool {
        let Some(s) = self.queue.pop() else {
            return false;
        };
        debug_assert!(s.at_us >= self.now_us, "time never runs backwards");
        self.now_us = s.at_us;
        self.stats.events += 1;
        self.dispatch(s.event);
        true
    }

    /// Runs until `stop` holds (checked before every event), nothing is left to do, or the
    /// minimum recvclock has not grown for `stall_us` of virtual time.
    pub fn run_until(&mut self, mut stop: impl FnMut(&Self) -> bool, stall_us: u64) -> RunEnd {
        loop {
            if stop(self) {
                return RunEnd::Stopped;
            }
            let Some(next) = self.peek_time_us() else {
                return RunEnd::Exhausted;
            };
            let stall_at = self.progress_at_us.saturating_add(stall_us);
            if next > stall_at {
                self.now_us = self.now_us.max(stall_at);
                return RunEnd::Stalled;
            }
            self.step();
        }
    }

    /// Runs every event up to `now + duration_us`, then sets the clock there.
    pub fn run_for(&mut self, duration_us: u64) {
        let end = self.now_us.saturating_add(duration_us);
        while self.peek_time_us().is_some_and(|t| t <= end) {
            self.step();
        }
        self.now_us = end;
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
            // A paused node's inputs wait; later inputs queue behind them (FIFO).
            if rt.paused || !rt.deferred.is_empty() {
                rt.deferred.push_back(event);
                return;
            }
        }
        self.handle(event);
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::SiuNet {
                host,
                bytes,
                corrupted,
            } => self.siu_net(host, &bytes, corrupted),
            Event::SiuHost { host, bytes } => self.siu_host(host, &bytes),
            Event::Tm {
                switch,
                link,
                bytes,
                corrupted,
            } => self.tm_input(switch, link, &bytes, corrupted),
            Event::HostPacket { host, bytes } => self.host_packet(host, &bytes),
            Event::HostWake { host, token } => {
                self.with_host(host, |h, ctx| h.on_wake(ctx, token));
            }
            Event::Timer { node, deadline_us } => self.timer(node, deadline_us),
            Event::Pause => self.pause(),
            Event::Resume { node } => self.resume(node),
        }
    }

    fn trace(&mut self, node: NodeId, bytes: &[u8]) {
        self.stats.deliveries += 1;
        self.hash.write_u64(self.now_us);
        self.hash.write(&node.tag());
        self.hash.write_u64(bytes.len() as u64);
        self.hash.write(bytes);
    }

    fn log_error(&mut self, what: String) {
        if self.errors.len() < ERROR_LOG_MAX {
            self.errors.push(format!("t={}us {what}", self.now_us));
        }
    }

    /// Counts the outcome of a network input: corrupted tokens must be dropped with an error,
    /// intact input must be accepted.
    fn net_outcome<E: std::fmt::Display>(&mut self, node: NodeId, r: Result<(), E>, corrupt: bool) {
        match (r, corrupt) {
            (Err(_), true) => self.stats.corrupt_tokens_dropped += 1,
            (Ok(()), true) => {
                self.stats.corrupt_tokens_accepted += 1;
                self.log_error(format!("{node:?} accepted a corrupted token"));
            }
            (Err(e), false) => {
                self.stats.net_errors += 1;
                self.log_error(format!("{node:?} refused network input: {e}"));
            }
            (Ok(()), false) => {}
        }
    }

    fn siu_net(&mut self, host: HostId, bytes: &[u8], corrupted: bool) {
        self.trace(NodeId::Siu(host), bytes);
        let h = usize::from(host);
        let r = self.sius[h].siu.handle_net(self.now_us, bytes);
        self.net_outcome(NodeId::Siu(host), r, corrupted);
        self.drain_siu(host);
        let recv = self.sius[h].siu.recvclock();
        if recv != self.recvclocks[h] {
            let was_min = self.recvclocks[h] == self.min_recvclock;
            self.recvclocks[h] = recv;
            if was_min || recv < self.min_recvclock {
                let min = self.recvclocks.iter().copied().min().unwrap_or(0);
                if min > self.min_recvclock {
                    self.progress_at_us = self.now_us;
                }
                self.min_recvclock = min;
            }
        }
    }

    fn siu_host(&mut self, host: HostId, bytes: &[u8]) {
        self.trace(NodeId::Siu(host), bytes);
        let r = self.sius[usize::from(host)]
            .siu
            .handle_host(self.now_us, bytes);
        self.observer
            .on_siu_host_input(self.now_us, host, bytes, r.as_ref().err());
        if let Err(e) = r {
            self.stats.host_refusals += 1;
            if e == SiuError::NotStarted {
                self.stats.host_refusals_not_started += 1;
            }
            self.with_host(host, |h, ctx| h.on_refused(ctx, bytes, &e));
        }
        self.drain_siu(host);
    }

    fn tm_input(&mut self, switch: SwitchId, link: LinkId, bytes: &[u8], corrupted: bool) {
        self.trace(NodeId::Tm(switch), bytes);
        let r = self.tms[usize::from(switch)]
            .tm
            .handle_input(self.now_us, link, bytes);
        self.net_outcome(NodeId::Tm(switch), r, corrupted);
        self.drain_tm(switch);
    }

    fn host_packet(&mut self, host: HostId, bytes: &[u8]) {
        self.trace(NodeId::Host(host), bytes);
        self.observer.on_host_packet(self.now_us, host, bytes);
        let h = usize::from(host);
        if !self.hosts[h].attached() {
            if let Err(e) = self.sius[h].siu.host_absent(bytes) {
                // Back-pressure on the SIU's network queue: offer it again a little later.
                self.stats.net_errors += 1;
                self.log_error(format!(
                    "SIU {host} refused a packet for its absent host: {e}"
                ));
            }
            self.drain_siu(host);
            return;
        }
        self.with_host(host, |h, ctx| h.on_packet(ctx, bytes));
    }

    fn timer(&mut self, node: NodeId, deadline_us: u64) {
        let now = self.now_us;
        let rt = self.runtime(node);
        if rt.timer_armed_us != Some(deadline_us) {
            return; // superseded
        }
        rt.timer_armed_us = None;
        if rt.paused {
            return; // re-armed on resume
        }
        match node {
            NodeId::Siu(h) => {
                self.sius[usize::from(h)].siu.handle_timeout(now);
                self.drain_siu(h);
            }
            NodeId::Tm(s) => {
                self.tms[usize::from(s)].tm.handle_timeout(now);
                self.drain_tm(s);
            }
            NodeId::Host(_) => {}
        }
    }

    fn pause(&mut self) {
        let Some(p) = self.cfg.pauses else { return };
        self.schedule(self.now_us + p.every_us, Event::Pause);
        let n_sius = self.sius.len() as u64;
        let pick = self.pause_rng.below(n_sius + self.tms.len() as u64);
        let node = if pick < n_sius {
            NodeId::Siu(pick as HostId)
        } else {
            NodeId::Tm((pick - n_sius) as SwitchId)
        };
        let duration = p.duration_us.draw(&mut self.pause_rng);
        let rt = self.runtime(node);
        if rt.paused {
            return;
        }
        rt.paused = true;
        self.stats.pauses += 1;
        self.schedule(self.now_us + duration, Event::Resume { node });
    }

    fn resume(&mut self, node: NodeId) {
        self.runtime(node).paused = false;
        while let Some(ev) = self.runtime(node).deferred.pop_front() {
            self.handle(ev);
        }
        // Timers that came due while paused fire now.
        self.rearm(node);
    }

    // -----------------------------------------------------------------------------------------
    // Output

    fn rearm(&mut self, node: NodeId) {
        let deadline = match node {
            NodeId::Siu(h) => self.sius[usize::from(h)].siu.poll_timeout(),
            NodeId::Tm(s) => self.tms[usize::from(s)].tm.poll_timeout(),
            NodeId::Host(_) => None,
        };
        let now = self.now_us;
        let rt = self.runtime(node);
        if rt.paused || rt.timer_armed_us == deadline {
            return;
        }
        rt.timer_armed_us = deadline;
        if let Some(d) = deadline {
            self.schedule(
                d.max(now),
                Event::Timer {
                    node,
                    deadline_us: d,
                },
            );
        }
    }

    /// Hands every packet an SIU produced to its link.
    fn drain_siu(&mut self, host: HostId) {
        let h = usize::from(host);
        let now = self.now_us;
        while let Some(tx) = self.sius[h].siu.poll_net() {
            self.observer.on_siu_transmit(now, host, &tx);
            let mut bytes = tx.bytes;
            match tx.route {
                Route::Tm => {
                    let corrupted = self.maybe_corrupt(&mut bytes);
                    let node = &mut self.sius[h];
                    let at = node.to_tm.transit(
                        now,
                        &self.cfg.faults,
                        &mut self.net_rng,
                        &mut self.stats.net,
                    );
                    let event = Event::Tm {
                        switch: self.topology.switch_of(host),
                        link: node.tm_link,
                        bytes,
                        corrupted,
                    };
                    self.schedule(at, event);
                }
                Route::Host(dest) => {
                    let faults = &self.cfg.faults;
                    let rng = &mut self.net_rng;
                    let ch = self
                        .plain
                        .entry((host, dest))
                        .or_insert_with(|| Channel::new(faults, rng));
                    let at = ch.transit(now, faults, rng, &mut self.stats.net);
                    let event = Event::SiuNet {
                        host: dest,
                        bytes,
                        corrupted: false,
                    };
                    self.schedule(at, event);
                }
            }
        }
        while let Some(bytes) = self.sius[h].siu.poll_host() {
            for bytes in self.tamper_host_bound(host, bytes) {
                let at = self.sius[h].to_host.fixed_transit(now);
                self.schedule(at, Event::HostPacket { host, bytes });
            }
        }
        self.rearm(NodeId::Siu(host));
    }

    /// Hands every packet a TM produced to its link.
    fn drain_tm(&mut self, switch: SwitchId) {
        let s = usize::from(switch);
        let now = self.now_us;
        while let Some((link, mut bytes)) = self.tms[s].tm.poll_transmit() {
            let corrupted = self.maybe_corrupt(&mut bytes);
            let (ch, dest) = &mut self.tms[s].out[link];
            let at = ch.transit(
                now,
                &self.cfg.faults,
                &mut self.net_rng,
                &mut self.stats.net,
            );
            let event = match *dest {
                LinkDest::Siu(host) => Event::SiuNet {
                    host,
                    bytes,
                    corrupted,
                },
                LinkDest::Tm { switch, link } => Event::Tm {
                    switch,
                    link,
                    bytes,
                    corrupted,
                },
            };
            self.schedule(at, event);
        }
        self.rearm(NodeId::Tm(switch));
    }

    /// With probability `token_corrupt`, flips a byte of a token.
    fn maybe_corrupt(&mut self, bytes: &mut [u8]) -> bool {
        let is_token = bytes.get(1) == Some(&(Kind::Token as u8));
        if is_token && self.net_rng.chance(self.cfg.faults.token_corrupt) {
            net::corrupt(bytes, &mut self.net_rng);
            self.stats.net.tokens_corrupted += 1;
            return true;
        }
        false
    }

    /// Applies [`Tamper`] to one host-bound packet; returns what goes on the link.
    fn tamper_host_bound(&mut self, host: HostId, bytes: Vec<u8>) -> Vec<Vec<u8>> {
        if self.tamper.done {
            return vec![bytes];
        }
        let kind = bytes.get(1).copied();
        match self.cfg.tamper {
            Tamper::None => vec![bytes],
            Tamper::HoldBackMessage => {
                if let Some((held_host, ts, _)) = &self.tamper.held {
                    let closes = *held_host == host
                        && kind == Some(Kind::EopMarker as u8)
                        && EopMarker::decode(&bytes).is_ok_and(|e| e.ts >= *ts);
                    if closes {
                        let (_, _, held) = self.tamper.held.take().expect("held");
                        self.tamper.done = true;
                        return vec![bytes, held];
                    }
                    return vec![bytes];
                }
                if kind == Some(Kind::IsotachMessage as u8)
                    && let Some((ts, _, _)) = IsotachMessage::peek_stamp(&bytes)
                    && ts >= 8
                {
                    self.tamper.held = Some((host, ts, bytes));
                    return Vec::new();
                }
                vec![bytes]
            }
            Tamper::SwapSortVector => {
                if kind == Some(Kind::EopMarker as u8)
                    && let Ok(mut eop) = EopMarker::decode(&bytes)
                    && eop.sort_vector.len() >= 3
                {
                    let last = eop.sort_vector.len() - 1;
                    eop.sort_vector.swap(0, last);
                    self.tamper.done = true;
                    let mut out = Vec::new();
                    eop.encode(&mut out);
                    return vec![out];
                }
                vec![bytes]
            }
        }
    }

    /// Runs a host callback and applies what it asked for.
    fn with_host(&mut self, host: HostId, f: impl FnOnce(&mut H, &mut HostCtx<'_>)) {
        let h = usize::from(host);
        let mut actions = std::mem::take(&mut self.actions);
        {
            let mut ctx = HostCtx {
                now_us: self.now_us,
                host,
                topology: &self.topology,
                rng: &mut self.host_rngs[h],
                actions: &mut actions,
            };
            f(&mut self.hosts[h], &mut ctx);
        }
        for action in actions.drain(..) {
            match action {
                HostAction::Send { at_us, bytes } => {
                    let at = self.sius[h].from_host.fixed_transit(at_us);
                    self.schedule(at, Event::SiuHost { host, bytes });
                }
                HostAction::Wake { at_us, token } => {
                    self.schedule(at_us, Event::HostWake { host, token });
                }
                HostAction::Attach => self.sius[h].siu.host_attached(),
            }
        }
        self.actions = actions;
    }
}
