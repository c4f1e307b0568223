//! The daemon core both roles share, sans-IO: a [`Role`] (the TM or SIU state machine with
//! its daemon rules) plus its [`Links`], and the policy between them held once: input a role
//! refuses for back-pressure is held in order and retried; output waits while a link has no
//! room; a full held queue stops reading its lane only; link events reach the role.
//!
//! The tokio daemons ([`crate::run`]) and the simulator drive the same [`Pump`]: datagrams in
//! with [`Pump::handle_datagram`], everything due at a time with [`Pump::advance`], datagrams
//! out with [`Pump::poll_transmit`], the next deadline from [`Pump::poll_timeout`].

use isotach_am_proto::link::{LinkEvent, Links, LossReason, Offered};
use isotach_am_proto::{AmError, NodeAddr, Time};
use isotach_proto::config::{QUEUE_PACKETS_MAX_MAX, QUEUE_PACKETS_MAX_MIN};
use isotach_proto::packet::BufPool;
use isotach_siu::SiuError;
use isotach_tm::TmError;
use std::collections::VecDeque;

mod local;

use local::LocalPeer;
pub use local::LocalTurns;

/// Nanoseconds per microsecond (links keep AM time in ns, the state machines in µs).
pub const NS_PER_US: u64 = 1_000;
/// How soon held input or stalled output is retried when nothing else happens, µs.
pub const RETRY_US: u64 = 1_000;
/// Most input lanes a role has.
pub const LANES_MAX: usize = 4;

/// What a role did with an input packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Taken.
    Consumed,
    /// Not consumed (back-pressure, or not ready yet): hold it and everything after it on its
    /// lane, and offer it again later.
    Retry,
    /// Refused for good (counted by the state machine); the reason is for the log.
    Refused(Refusal),
}

/// Why a role refused an input for good: the state machine's own error value, formatted only
/// when it is logged (refusing an input allocates nothing).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The token manager's reason.
    #[error(transparent)]
    Tm(#[from] TmError),
    /// The SIU's reason.
    #[error(transparent)]
    Siu(#[from] SiuError),
}

/// A TM or SIU as the pump sees it: its state machine plus the daemon's rules for its peers.
pub trait Role {
    /// Input lanes: peers whose input is held independently (a full lane stops reading its
    /// own peers only). At most [`LANES_MAX`].
    fn lanes(&self) -> usize;
    /// The lane of `peer`'s input.
    fn lane(&self, peer: usize) -> usize;
    /// Output lanes: streams that stall independently (tokens must not wait behind host
    /// output). At most [`LANES_MAX`].
    fn out_lanes(&self) -> usize;
    /// A packet from `peer`, in a buffer the role may take (`std::mem::take`) when it
    /// consumes the packet and sends it on as it came — no copy. On [`Verdict::Retry`] the
    /// buffer must be left as it was (the pump holds it and offers it again).
    fn handle_packet(&mut self, now_us: u64, peer: usize, bytes: &mut Vec<u8>) -> Verdict;
    /// Timers.
    fn handle_timeout(&mut self, now_us: u64);
    /// The state machine's next timer, µs.
    fn poll_timeout(&self) -> Option<u64>;
    /// The next packet of output lane `lane` and its peer.
    fn poll_output(&mut self, now_us: u64, lane: usize) -> Option<(usize, Vec<u8>)>;
    /// A packet the link had no room for that may be dropped (a copy is on its way: a repeat
    /// token) instead of held.
    fn redundant(&self, bytes: &[u8]) -> bool;
    /// `peer` answered our hello (first time, or back after a loss).
    fn link_up(&mut self, now_us: u64, peer: usize);
    /// The link to `peer` broke.
    fn link_lost(&mut self, now_us: u64, peer: usize, reason: LossReason, dropped: usize);
    /// An output for `peer` that waited for room when its link broke (after
    /// [`Role::link_lost`]). By default it is dropped: the broken stream has a hole anyway.
    fn undelivered(&mut self, now_us: u64, peer: usize, bytes: Vec<u8>) {
        let _ = (now_us, peer, bytes);
    }
    /// The local peer's packets of this pass were offered (called once per
    /// [`Pump::advance`] of a pump with a local peer, after them and before network input):
    /// its turn ended. No default, so a wrapping role cannot forget to pass it on: a role that
    /// holds output for the turn would otherwise hold it for good.
    fn local_turn_ended(&mut self, now_us: u64);
    /// Does the role expect a turn of the local peer that has not started (an SIU whose
    /// host a reply reached since its last turn: the next token waits for it)? With
    /// [`LocalTurns::EveryPass`] a pass is then no turn of the peer's: its packets stay
    /// queued for that turn, which the pass does not end. No default, for the reason above.
    fn local_turn_coming(&self) -> bool;
    /// Should the on-demand links be broken and linked anew before the next output
    /// ([`Links::relink_on_demand`])? Asked before every output pass; true once per
    /// occasion. By default never.
    fn take_relink(&mut self) -> bool {
        false
    }
    /// Is nothing expected to arrive before the role's own next timer (a token manager
    /// holding an idle wave back)? Then the loop's wait sleeps at once instead of spinning
    /// ([`isotach_am::Transport::wait_quiet`]). By default traffic may come any time.
    fn quiet(&self) -> bool {
        false
    }
    /// The buffers the role builds its own packets in (tokens, markers), which the pump tops
    /// up from the links' spares before each run. None by default.
    fn buffers(&mut self) -> Option<&mut BufPool> {
        None
    }
}

/// Counters of the pump.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PumpStats {
    /// Inputs held for back-pressure (each time one was held).
    pub held: u64,
    /// Inputs refused for good.
    pub refused: u64,
    /// Outputs that waited for room on their link.
    pub stalled: u64,
    /// Redundant outputs dropped for lack of room.
    pub redundant_dropped: u64,
}

/// A role, its links and the held/stalled queues between them. See the module documentation.
#[derive(Debug)]
pub struct Pump<R: Role> {
    role: R,
    links: Links,
    local: Option<LocalPeer>,
    /// Per input lane: packets the role did not take yet, in order.
    held: Vec<VecDeque<(usize, Vec<u8>)>>,
    /// Most packets held per lane before the lane stops being read.
    held_max: usize,
    /// Per output lane: a packet its link had no room for (the lane waits behind it).
    stalled: Vec<Option<(usize, Vec<u8>)>>,
    stats: PumpStats,
}

impl<R: Role> Pump<R> {
    /// A pump for `role` over `links`; each lane holds at most `held_max` packets (the
    /// config's `queue-packets-max`, which also bounds the links' queues; the config loader
    /// and `check_bounds` keep it within [`QUEUE_PACKETS_MAX_MIN`]..=[`QUEUE_PACKETS_MAX_MAX`]).
    pub fn new(role: R, mut links: Links, held_max: usize) -> Self {
        assert!(
            (QUEUE_PACKETS_MAX_MIN..=QUEUE_PACKETS_MAX_MAX).contains(&held_max),
            "queue-packets-max is {held_max}, outside \
             {QUEUE_PACKETS_MAX_MIN}..={QUEUE_PACKETS_MAX_MAX}"
        );
        links.set_queue_max(held_max);
        let (lanes, out_lanes) = (role.lanes(), role.out_lanes());
        assert!(
            (1..=LANES_MAX).contains(&lanes) && (1..=LANES_MAX).contains(&out_lanes),
            "a role has 1..={LANES_MAX} lanes each way"
        );
        Self {
            role,
            links,
            local: None,
            held: (0..lanes).map(|_| VecDeque::new()).collect(),
            held_max,
            stalled: vec![None; out_lanes],
            stats: PumpStats::default(),
        }
    }

    /// The role peer id of link `link`.
    fn peer_of_link(&self, link: usize) -> usize {
        match &self.local {
            Some(l) if link >= l.peer => link + 1,
            _ => link,
        }
    }

    /// The link id of role peer `peer` (`None` for the local peer).
    fn link_of_peer(&self, peer: usize) -> Option<usize> {
        match &self.local {
            Some(l) if peer == l.peer => None,
            Some(l) if peer > l.peer => Some(peer - 1),
            _ => Some(peer),
        }
    }

    /// The role.
    pub fn role(&self) -> &R {
        &self.role
    }

    /// The role, to change it (a restart, a test).
    pub fn role_mut(&mut self) -> &mut R {
        &mut self.role
    }

    /// The role, for its counters at the end.
    pub fn into_role(self) -> R {
        self.role
    }

    /// The links.
    pub fn links(&self) -> &Links {
        &self.links
    }

    /// The links, to change (say hello to every peer at start: [`Links::link_every_peer`]).
    pub fn links_mut(&mut self) -> &mut Links {
        &mut self.links
    }

    /// Hands back a packet buffer the caller is done with (see [`Links::recycle`]).
    pub fn recycle(&mut self, buf: Vec<u8>) {
        self.links.recycle(buf);
    }

    /// A spare packet buffer of the links' (see [`Links::take_spare`]).
    pub fn take_spare(&mut self) -> Option<Vec<u8>> {
        self.links.take_spare()
    }

    /// The pump's counters.
    pub fn stats(&self) -> PumpStats {
        self.stats
    }

    /// Inputs held now, all lanes.
    pub fn held(&self) -> usize {
        self.held.iter().map(VecDeque::len).sum()
    }

    /// Inputs held on `lane`.
    pub fn held_on(&self, lane: usize) -> usize {
        self.held.get(lane).map_or(0, VecDeque::len)
    }

    /// Outputs waiting for room, all lanes.
    pub fn stalled(&self) -> usize {
        self.stalled.iter().filter(|s| s.is_some()).count()
    }

    /// Outputs waiting for room on `lane`.
    pub fn stalled_on(&self, lane: usize) -> bool {
        self.stalled.get(lane).is_some_and(Option::is_some)
    }

    /// Is the pump waiting on itself (held input, stalled output) rather than the network?
    pub fn blocked(&self) -> bool {
        self.held() > 0 || self.stalled() > 0
    }

    /// Process one received datagram (the links only; [`Pump::advance`] hands what arrived
    /// to the role).
    pub fn handle_datagram(&mut self, now: Time, from: NodeAddr, bytes: &[u8]) {
        self.links.handle_datagram(now, from, bytes);
    }

    /// Runs everything due at `now`: link timers and events, held and arrived input, the
    /// role's timers, and output as the links have room.
    pub fn advance(&mut self, now: Time) -> Result<(), AmError> {
        let now_us = now.0 / NS_PER_US;
        self.stock_role();
        self.links.handle_timeout(now);
        self.events(now_us);
        self.feed(now_us)?;
        self.role.handle_timeout(now_us);
        self.drain(now_us)
    }

    /// Tops the role's packet buffers up from the links' spares (to half of what it keeps at
    /// most): the buffers of the packets it sent and of those it handled come back to it, so
    /// its tokens and markers cost no allocation once buffers circulate.
    fn stock_role(&mut self) {
        let links = &mut self.links;
        if let Some(pool) = self.role.buffers()
            && let Some(b) = pool.refill(|| links.take_spare())
        {
            links.recycle(b);
        }
    }

    /// The next datagram to send and where.
    pub fn poll_transmit(&mut self, now: Time) -> Option<(NodeAddr, &[u8])> {
        self.links.poll_transmit(now)
    }

    /// When [`Pump::advance`] must run next (without new datagrams).
    pub fn poll_timeout(&self, now: Time) -> Option<Time> {
        let role = self.role.poll_timeout().map(|us| Time(us * NS_PER_US));
        let retry = self.blocked().then(|| Time(now.0 + RETRY_US * NS_PER_US));
        [self.links.poll_timeout(), role, retry]
            .into_iter()
            .flatten()
            .min()
    }

    fn events(&mut self, now_us: u64) {
        while let Some(ev) = self.links.poll_event() {
            match ev {
                LinkEvent::PeerUp(link) => {
                    let peer = self.peer_of_link(link);
                    self.role.link_up(now_us, peer);
                }
                LinkEvent::PeerLost {
                    peer: link,
                    reason,
                    dropped,
                } => {
                    let peer = self.peer_of_link(link);
                    self.role.link_lost(now_us, peer, reason, dropped);
                    for lane in 0..self.stalled.len() {
                        if self.stalled[lane].as_ref().is_some_and(|(p, _)| *p == peer) {
                            let (_, bytes) = self.stalled[lane].take().expect("checked");
                            self.role.undelivered(now_us, peer, bytes);
                        }
                    }
                }
                LinkEvent::HelloReturned { peer, status } => {
                    tracing::debug!(peer, ?status, "peer not answering yet");
                }
                LinkEvent::HelloUnanswered(link) => {
                    tracing::warn!(
                        peer = self.peer_of_link(link),
                        addr = ?self.links.peer_addrs().nth(link),
                        "peer got our hello but does not answer: is our address among its \
                         configured peers?"
                    );
                }
            }
        }
    }

    /// Held input first, in order, then the local peer's packets (then the role hears its
    /// turn ended, as [`LocalTurns`] says), then what arrived from the links; a lane whose
    /// held queue is full is not read (its peers wait in the links, whose credit stops them).
    fn feed(&mut self, now_us: u64) -> Result<(), AmError> {
        for lane in 0..self.held.len() {
            while let Some((peer, bytes)) = self.held[lane].pop_front() {
                if !self.offer_input(now_us, lane, peer, bytes)? {
                    break;
                }
            }
        }
        if !self.local_turn_awaited() {
            while let Some((peer, bytes)) = self.take_local() {
                self.take_input(now_us, peer, bytes)?;
            }
            if self.take_turn_over() {
                self.role.local_turn_ended(now_us);
                self.drain(now_us)?;
            }
        }
        while let Some((peer, bytes)) = self.take_arrived() {
            self.take_input(now_us, peer, bytes)?;
        }
        Ok(())
    }

    /// Which input lanes have room to be read.
    fn open_lanes(&self) -> [bool; LANES_MAX] {
        let mut open = [false; LANES_MAX];
        for (lane, q) in self.held.iter().enumerate() {
            open[lane] = q.len() < self.held_max;
        }
        open
    }

    /// The local peer's next packet, if its lane has room.
    fn take_local(&mut self) -> Option<(usize, Vec<u8>)> {
        let open = self.open_lanes();
        let l = self.local.as_mut()?;
        if l.inbox.is_empty() || !open[self.role.lane(l.peer)] {
            return None;
        }
        Some((l.peer, l.inbox.pop_front()?))
    }

    /// The next packet the links delivered on a lane with room.
    fn take_arrived(&mut self) -> Option<(usize, Vec<u8>)> {
        let open = self.open_lanes();
        let local_peer = self.local.as_ref().map(|l| l.peer);
        let to_peer = |link: usize| match local_peer {
            Some(lp) if link >= lp => link + 1,
            _ => link,
        };
        let role = &self.role;
        let (link, bytes) = self.links.recv_where(|l| open[role.lane(to_peer(l))])?;
        Some((to_peer(link), bytes))
    }

    /// Offers an input at once, or holds it behind its lane's held input.
    fn take_input(&mut self, now_us: u64, peer: usize, bytes: Vec<u8>) -> Result<(), AmError> {
        let lane = self.role.lane(peer);
        // Read only from a lane with room.
        debug_assert!(self.held[lane].len() < self.held_max);
        if self.held[lane].is_empty() {
            self.offer_input(now_us, lane, peer, bytes)?;
        } else {
            self.held[lane].push_back((peer, bytes));
        }
        debug_assert!(self.held[lane].len() <= self.held_max);
        Ok(())
    }

    /// Offers one input to the role; false when it was held (back at the head of its lane).
    fn offer_input(
        &mut self,
        now_us: u64,
        lane: usize,
        peer: usize,
        mut bytes: Vec<u8>,
    ) -> Result<bool, AmError> {
        match self.role.handle_packet(now_us, peer, &mut bytes) {
            Verdict::Consumed => {}
            Verdict::Retry => {
                // Back where it came from: the head of a lane it was taken from, or an empty
                // lane.
                debug_assert!(!bytes.is_empty(), "a role took an input it did not consume");
                debug_assert!(self.held[lane].len() < self.held_max);
                self.stats.held += 1;
                self.held[lane].push_front((peer, bytes));
                debug_assert!(self.held[lane].len() <= self.held_max);
                return Ok(false);
            }
            Verdict::Refused(why) => {
                self.stats.refused += 1;
                tracing::debug!(peer, %why, "input refused");
            }
        }
        self.links.recycle(bytes);
        self.drain(now_us)?;
        Ok(true)
    }

    /// Output lane by lane until each is empty or stalls on a full link (after relinking the
    /// on-demand links if the role asks).
    fn drain(&mut self, now_us: u64) -> Result<(), AmError> {
        if self.role.take_relink() {
            self.links.relink_on_demand();
            self.events(now_us);
        }
        for lane in 0..self.stalled.len() {
            loop {
                let next = match self.stalled[lane].take() {
                    Some(s) => Some(s),
                    None => self.role.poll_output(now_us, lane),
                };
                let Some((peer, bytes)) = next else {
                    break;
                };
                let Some(link) = self.link_of_peer(peer) else {
                    let held_max = self.held_max;
                    let l = self.local.as_mut().expect("a local peer id");
                    if l.outbox.len() < held_max {
                        l.outbox.push_back(bytes);
                        debug_assert!(l.outbox.len() <= held_max);
                    } else {
                        // One stalled output per lane: the lane waits behind it.
                        debug_assert!(self.stalled[lane].is_none());
                        self.stats.stalled += 1;
                        self.stalled[lane] = Some((peer, bytes));
                        break;
                    }
                    continue;
                };
                let role = &self.role;
                match self.links.offer(link, bytes, |b| role.redundant(b))? {
                    Offered::Sent => {}
                    Offered::Dropped => self.stats.redundant_dropped += 1,
                    Offered::Held(bytes) => {
                        debug_assert!(self.stalled[lane].is_none());
                        self.stats.stalled += 1;
                        self.stalled[lane] = Some((peer, bytes));
                        break;
                    }
                }
            }
        }
        Ok(())
    }
}
