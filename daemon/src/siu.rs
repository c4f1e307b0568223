//! The SIU's role: [`Siu`] plus the daemon's rules for its peers.
//!
//! Peers, by id: [`PEER_TM`] (its token manager: tokens and isotach messages), [`PEER_APP`]
//! (the host's SMM application), then the other hosts' SIUs in host order (non-isotach
//! traffic goes host to host directly). Two input lanes — the network ([`LANE_NET`]) and the
//! host ([`LANE_HOST`]) — so a host whose packets wait for logical time to start cannot
//! stop the reset wave that starts it; two output lanes likewise, so tokens never wait
//! behind host output.
//!
//! Rules: host input refused with `NotStarted` or back-pressure, and network input refused
//! with back-pressure, is held and retried (the pump). The initiating SIU starts logical
//! time once its token manager answered the hello. When the TM's link broke and it is back,
//! the SIU starts a new generation unless another node already did ([`Rejoin`]). An
//! application is *attached* from its hello or first packet until its link breaks; while
//! none is, packets for the host go to [`Siu::host_absent`] (counted; reads and copy
//! requests answered as absent) and the first one to attach is ordered after them
//! ([`Siu::host_attached`]).

use crate::DaemonError;
use crate::pump::{Role, Verdict};
use isotach_am_proto::NodeAddr;
use isotach_am_proto::link::LossReason;
use isotach_proto::Generation;
use isotach_proto::config::ClusterConfig;
use isotach_proto::packet::{BufPool, Kind, Token, peek_kind};
use isotach_proto::topology::HostId;
use isotach_proto::wave::Rejoin;
use isotach_siu::{Mode, Route, Siu, SiuConfig, SiuError};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

/// Peer id of the token manager.
pub const PEER_TM: usize = 0;
/// Peer id of the host's SMM application.
pub const PEER_APP: usize = 1;
/// Peers the SIU needs linked before logical time starts (the token manager and the
/// application); the other hosts' SIUs are on-demand peers ([`isotach_am_proto::link::PeerList`]),
/// which the daemon says hello to at start anyway (it may be a restart:
/// `Links::link_every_peer`) and relinks when logical time restarts.
pub const EAGER_PEERS: usize = 2;
/// Input lane of the network side (the TM and other SIUs).
pub const LANE_NET: usize = 0;
/// Input lane of the host side (the application).
pub const LANE_HOST: usize = 1;
/// Output lane towards the network.
pub const OUT_NET: usize = 0;
/// Output lane towards the host.
pub const OUT_HOST: usize = 1;

/// An SIU's plan from a cluster config: its configuration, its listen address and its peers'
/// addresses laid out as the module documentation says. Host 0 initiates the reset.
#[derive(Debug, Clone)]
pub struct SiuPlan {
    /// The state machine's configuration.
    pub cfg: SiuConfig,
    /// Where the daemon listens.
    pub listen: SocketAddr,
    /// Peer addresses by peer id.
    pub peers: Vec<NodeAddr>,
}

/// The plan of host `host`'s SIU.
pub fn siu_plan(cluster: &ClusterConfig, host: HostId) -> Result<SiuPlan, DaemonError> {
    let listen = cluster.siu_addr(host)?;
    let tm = cluster.switch_addr(cluster.topology.switch_of(host))?;
    let mut peers = vec![NodeAddr::Ip(tm), NodeAddr::Ip(cluster.app_addr(host)?)];
    for other in (0..cluster.topology.host_count()).filter(|&h| h != usize::from(host)) {
        let other = HostId::try_from(other).expect("host ids fit");
        peers.push(NodeAddr::Ip(cluster.siu_addr(other)?));
    }
    let cfg = SiuConfig {
        host,
        mode: Mode::Siu,
        topology: Arc::new(cluster.topology.clone()),
        timing: cluster.timing,
        limits: cluster.limits,
        initiates_reset: host == 0,
        host_turns: false,
    };
    Ok(SiuPlan { cfg, listen, peers })
}

/// Peer id of host `h`'s SIU at host `me` (`None` for `me` and for hosts beyond `hosts`), as
/// [`siu_plan`] lays them out.
fn siu_peer(me: usize, hosts: usize, h: usize) -> Option<usize> {
    match h.cmp(&me) {
        _ if h >= hosts => None,
        std::cmp::Ordering::Less => Some(2 + h),
        std::cmp::Ordering::Equal => None,
        std::cmp::Ordering::Greater => Some(1 + h),
    }
}

/// The host whose SIU is peer `peer` at host `me` (the inverse of [`siu_peer`]).
fn siu_host(me: usize, peer: usize) -> Option<usize> {
    let h = peer.checked_sub(2)?;
    Some(if h >= me { h + 1 } else { h })
}

/// Gauges a running SIU publishes (read by the embedded demo and status).
#[derive(Debug, Default)]
pub struct SiuGauges {
    /// The SIU's receive clock (the current pulse).
    pub recvclock: AtomicU64,
    /// Logical time started here (0 or 1).
    pub started: AtomicU64,
}

/// The SIU and its daemon rules.
#[derive(Debug)]
pub struct SiuRole {
    siu: Siu,
    /// Isotach messages dropped because the link to the TM was broken.
    messages_doomed: u64,
    /// Hosts in the cluster (peers: the TM, the application, the other hosts' SIUs).
    hosts: usize,
    /// Each peer's name ("token manager", "application", "SIU of host 2"), made when first
    /// asked for (status displays; a simulation of thousands of SIUs never asks).
    peer_names: OnceLock<Arc<[String]>>,
    start_pending: bool,
    rejoin: Rejoin,
    /// The generation the on-demand links (other SIUs) were last linked in: when logical
    /// time restarts, any of those SIUs may have restarted without a word, so they are linked
    /// anew ([`Role::take_relink`]).
    linked_generation: Generation,
    app_attached: bool,
    /// Packets for the host dropped since the application was last attached.
    absent_dropped: u64,
    /// Host packets [`Siu::host_absent`] could not take yet (host output waits behind them;
    /// at most one per output lane stall plus one).
    absent_stalled: VecDeque<Vec<u8>>,
    /// Keep a copy of every host packet dropped because no application is attached (the
    /// simulator's oracles must see the whole host-bound stream).
    observe_absent: bool,
    absent_seen: Vec<Vec<u8>>,
    /// The last host packet the SIU refused and why (the simulator tells its host; a daemon
    /// only logs it).
    last_host_refusal: Option<SiuError>,
    /// When the last token from the TM arrived (cleared by our next token to it), µs.
    token_in_us: Option<u64>,
    /// Token turnarounds measured and not taken yet, µs (the runner records them).
    turnarounds_us: Vec<u64>,
    gauges: Arc<SiuGauges>,
}

/// Most token turnarounds kept for the runner between two passes.
const TURNAROUNDS_MAX: usize = 64;

impl SiuRole {
    /// The role of `siu`, whose peers are laid out as [`siu_plan`] returns them.
    pub fn new(siu: Siu) -> Self {
        let hosts = siu.config().topology.host_count();
        Self {
            start_pending: siu.config().initiates_reset,
            // Only the token manager's link matters to logical time.
            rejoin: Rejoin::new(PEER_TM + 1),
            linked_generation: Generation::new(0),
            messages_doomed: 0,
            siu,
            hosts,
            peer_names: OnceLock::new(),
            app_attached: false,
            absent_dropped: 0,
            absent_stalled: VecDeque::new(),
            observe_absent: false,
            absent_seen: Vec::new(),
            last_host_refusal: None,
            token_in_us: None,
            turnarounds_us: Vec::new(),
            gauges: Arc::new(SiuGauges::default()),
        }
    }

    /// The state machine.
    pub fn siu(&self) -> &Siu {
        &self.siu
    }

    /// The state machine, to change it.
    pub fn siu_mut(&mut self) -> &mut Siu {
        &mut self.siu
    }

    /// The state machine, for its counters at the end.
    pub fn into_siu(self) -> Siu {
        self.siu
    }

    /// The gauges this role updates.
    pub fn gauges(&self) -> Arc<SiuGauges> {
        Arc::clone(&self.gauges)
    }

    /// Each peer's name, by peer id.
    pub fn peer_names(&self) -> Arc<[String]> {
        let names = self
            .peer_names
            .get_or_init(|| (0..self.hosts + 1).map(|p| self.peer_name(p)).collect());
        Arc::clone(names)
    }

    /// Is an application attached?
    pub fn app_attached(&self) -> bool {
        self.app_attached
    }

    /// Links whose peer is gone and not back yet (only the TM's counts).
    pub fn broken_links(&self) -> usize {
        self.rejoin.pending()
    }

    /// Is the SIU still waiting to start logical time (its TM has not answered)?
    pub fn start_pending(&self) -> bool {
        self.start_pending
    }

    /// Token turnarounds (a token from the TM to our next token to it) measured since the
    /// last call, µs.
    pub fn take_turnarounds_us(&mut self) -> impl Iterator<Item = u64> + '_ {
        self.turnarounds_us.drain(..)
    }

    /// Keep copies of the host packets dropped while no application is attached, for
    /// [`SiuRole::take_absent_seen`] (the simulator's oracles).
    pub fn observe_absent(&mut self, on: bool) {
        self.observe_absent = on;
    }

    /// The host packets dropped for an absent application since the last call, in order.
    pub fn take_absent_seen(&mut self) -> std::vec::Drain<'_, Vec<u8>> {
        self.absent_seen.drain(..)
    }

    /// Why the last refused host packet was refused (taken once).
    pub fn take_host_refusal(&mut self) -> Option<SiuError> {
        self.last_host_refusal.take()
    }

    fn peer_name(&self, peer: usize) -> String {
        let me = usize::from(self.siu.host());
        match peer {
            PEER_TM => "token manager".to_string(),
            PEER_APP => "application".to_string(),
            p => match siu_host(me, p).filter(|&h| h < self.hosts) {
                Some(h) => format!("SIU of host {h}"),
                None => "unknown peer".to_string(),
            },
        }
    }

    /// An application attached (first sign of it since its link last broke): the SIU orders
    /// its first isochron after everything handed to the host before.
    fn app_attach(&mut self) {
        if self.app_attached {
            return;
        }
        self.app_attached = true;
        self.siu.host_attached();
        if self.absent_dropped > 0 {
            tracing::warn!(
                host = self.siu.host(),
                dropped = self.absent_dropped,
                "application attached: dropped {} packets for the host while none was attached \
                 (reads and copy requests were answered as absent)",
                self.absent_dropped
            );
            self.absent_dropped = 0;
        }
    }

    /// Hands a host packet nobody would read to the SIU; false when it could not take it yet
    /// (it waits, first in line).
    fn absent(&mut self, bytes: Vec<u8>) -> bool {
        if self.siu.host_absent(&bytes).is_err() {
            self.absent_stalled.push_front(bytes);
            return false;
        }
        self.absent_dropped += 1;
        true
    }

    fn next_net(&mut self, now_us: u64) -> Option<(usize, Vec<u8>)> {
        loop {
            let tx = self.siu.poll_net()?;
            let me = usize::from(self.siu.host());
            let peer = match tx.route {
                Route::Tm => Some(PEER_TM),
                Route::Host(h) => siu_peer(me, self.hosts, usize::from(h)),
            };
            let Some(peer) = peer else {
                tracing::warn!(route = ?tx.route, "no peer for a network packet");
                continue;
            };
            if crate::tm::doomed(&self.rejoin, peer, self.siu.generation(), &tx.bytes) {
                self.messages_doomed += 1;
                continue;
            }
            if peer == PEER_TM
                && peek_kind(&tx.bytes) == Ok(Kind::Token)
                && let Some(at) = self.token_in_us.take()
                && self.turnarounds_us.len() < TURNAROUNDS_MAX
            {
                self.turnarounds_us.push(now_us.saturating_sub(at));
            }
            return Some((peer, tx.bytes));
        }
    }

    fn next_host(&mut self) -> Option<(usize, Vec<u8>)> {
        while let Some(b) = self.absent_stalled.pop_front() {
            if !self.absent(b) {
                return None;
            }
        }
        loop {
            let b = self.siu.poll_host()?;
            if self.app_attached {
                return Some((PEER_APP, b));
            }
            if self.observe_absent {
                self.absent_seen.push(b.clone());
            }
            if !self.absent(b) {
                return None;
            }
        }
    }
}

impl Role for SiuRole {
    fn lanes(&self) -> usize {
        2
    }

    fn lane(&self, peer: usize) -> usize {
        if peer == PEER_APP {
            LANE_HOST
        } else {
            LANE_NET
        }
    }

    fn out_lanes(&self) -> usize {
        2
    }

    /// A stamped message leaves, and a message for the host arrives there, in the buffer it
    /// came in.
    fn handle_packet(&mut self, now_us: u64, peer: usize, bytes: &mut Vec<u8>) -> Verdict {
        if peer == PEER_APP {
            self.app_attach();
            return match self.siu.handle_host_owned(now_us, bytes) {
                Ok(()) => Verdict::Consumed,
                Err(SiuError::NotStarted | SiuError::Backpressure { .. }) => Verdict::Retry,
                Err(e) => {
                    tracing::warn!(host = self.siu.host(), %e, "host packet refused");
                    self.last_host_refusal = Some(e.clone());
                    Verdict::Refused(e.into())
                }
            };
        }
        if peer == PEER_TM && peek_kind(bytes) == Ok(Kind::Token) {
            self.token_in_us.get_or_insert(now_us);
        }
        match self.siu.handle_net_owned(now_us, bytes) {
            Ok(()) => Verdict::Consumed,
            Err(SiuError::Backpressure { .. }) => Verdict::Retry,
            Err(e) => Verdict::Refused(e.into()),
        }
    }

    fn handle_timeout(&mut self, now_us: u64) {
        self.siu.handle_timeout(now_us);
        let g = &self.gauges;
        g.recvclock.store(self.siu.recvclock(), Ordering::Relaxed);
        g.started
            .store(u64::from(self.siu.started()), Ordering::Relaxed);
    }

    fn poll_timeout(&self) -> Option<u64> {
        self.siu.poll_timeout()
    }

    fn local_turn_ended(&mut self, now_us: u64) {
        self.siu.end_host_turn(now_us);
    }

    /// A reply reached the in-process host since its last turn and the token that will wait
    /// for its answer has not come: what the host issues meanwhile is stamped in that turn,
    /// with the token still held, and leaves in the token's datagram.
    fn local_turn_coming(&self) -> bool {
        self.siu.host_turn_coming()
    }

    fn poll_output(&mut self, now_us: u64, lane: usize) -> Option<(usize, Vec<u8>)> {
        if lane == OUT_NET {
            self.next_net(now_us)
        } else {
            self.next_host()
        }
    }

    fn redundant(&self, bytes: &[u8]) -> bool {
        Token::is_repeat(bytes)
    }

    fn link_up(&mut self, now_us: u64, peer: usize) {
        if peer == PEER_TM && self.messages_doomed > 0 {
            tracing::warn!(
                host = self.siu.host(),
                dropped = self.messages_doomed,
                "dropped isotach messages for the token manager while its link was broken: \
                 their generation ends"
            );
            self.messages_doomed = 0;
        }
        tracing::info!(
            host = self.siu.host(),
            peer = self.peer_name(peer),
            "peer up"
        );
        if peer == PEER_APP {
            self.app_attach();
        }
        let generation = self.siu.generation();
        if self.rejoin.back(peer, generation) && self.siu.started() {
            tracing::warn!(
                host = self.siu.host(),
                generation = %generation.next(),
                "token manager back after a broken link: starting a new generation"
            );
            self.token_in_us = None;
            self.siu.start(now_us);
        }
        if peer == PEER_TM && self.start_pending {
            self.start_pending = false;
            tracing::info!(
                host = self.siu.host(),
                "token manager up: starting logical time"
            );
            self.siu.start(now_us);
        }
    }

    fn link_lost(&mut self, _now_us: u64, peer: usize, reason: LossReason, dropped: usize) {
        let generation = self.siu.generation();
        tracing::warn!(
            host = self.siu.host(),
            peer = self.peer_name(peer),
            ?reason,
            dropped,
            %generation,
            "lost peer"
        );
        if peer == PEER_TM {
            // Only the token path matters to logical time.
            self.rejoin.broken(peer, generation);
        }
        if peer == PEER_APP {
            self.app_attached = false;
        }
    }

    fn buffers(&mut self) -> Option<&mut BufPool> {
        Some(self.siu.buffers())
    }

    fn take_relink(&mut self) -> bool {
        let g = self.siu.generation();
        if g == self.linked_generation {
            return false;
        }
        self.linked_generation = g;
        true
    }

    fn undelivered(&mut self, _now_us: u64, peer: usize, bytes: Vec<u8>) {
        if peer == PEER_APP {
            // The application left with this packet waiting for room: nobody will read it.
            self.absent_stalled.push_back(bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn siu_peer_ids_skip_this_host_and_map_back() {
        // Host 2 of 5: peers TM, app, then hosts 0, 1, 3, 4.
        let ids: Vec<_> = (0..6).map(|h| siu_peer(2, 5, h)).collect();
        assert_eq!(ids, [Some(2), Some(3), None, Some(4), Some(5), None]);
        for h in [0, 1, 3, 4] {
            assert_eq!(siu_host(2, siu_peer(2, 5, h).unwrap()), Some(h));
        }
        assert_eq!(siu_host(2, PEER_TM), None);
        assert_eq!(siu_host(2, PEER_APP), None);
    }
}
