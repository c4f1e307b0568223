//! The token manager's role: [`TokenManager`] plus the daemon's rules for its links. One
//! input and one output lane (every link carries tokens). A neighbour whose link breaks is
//! logged and the TM keeps running; when it is back, the TM starts a new logical-time
//! generation unless another node already did ([`Rejoin`]; `docs/operations.md`, "Peer loss
//! and restarts").

use crate::DaemonError;
use crate::pump::{Role, Verdict};
use isotach_am_proto::NodeAddr;
use isotach_am_proto::link::LossReason;
use isotach_proto::Generation;
use isotach_proto::config::ClusterConfig;
use isotach_proto::packet::{BufPool, Kind, Token, peek_kind};
use isotach_proto::topology::{Hop, SwitchId};
use isotach_proto::wave::Rejoin;
use isotach_tm::{TmConfig, TmError, TokenManager};
use std::net::SocketAddr;
use std::sync::Arc;

/// A TM's plan from a cluster config: its configuration, its listen address and its peers'
/// addresses by link id (the TM's links in topology order: hosts' SIUs and neighbour TMs).
#[derive(Debug, Clone)]
pub struct TmPlan {
    /// The state machine's configuration.
    pub cfg: TmConfig,
    /// Where the daemon listens.
    pub listen: SocketAddr,
    /// Peer address of each link, by link id.
    pub peers: Vec<NodeAddr>,
}

/// The plan of switch `switch`'s TM.
pub fn tm_plan(cluster: &ClusterConfig, switch: SwitchId) -> Result<TmPlan, DaemonError> {
    let listen = cluster.switch_addr(switch)?;
    let cfg = TmConfig {
        switch,
        topology: Arc::new(cluster.topology.clone()),
        timing: cluster.timing,
        limits: cluster.limits,
    };
    let peers = TokenManager::new(cfg.clone())
        .links()
        .map(|hop| match hop {
            Hop::Host(h) => cluster.siu_addr(h),
            Hop::Switch(s) => cluster.switch_addr(s),
        })
        .map(|a| a.map(NodeAddr::Ip))
        .collect::<Result<_, _>>()?;
    Ok(TmPlan { cfg, listen, peers })
}

/// The TM and its rejoin rule.
#[derive(Debug)]
pub struct TmRole {
    tm: TokenManager,
    rejoin: Rejoin,
    /// What each link leads to ("SIU of host 2", "TM of switch 1").
    peer_names: Arc<[String]>,
    /// Isotach messages dropped for a broken link.
    messages_doomed: u64,
}

impl TmRole {
    /// The role of `tm`.
    pub fn new(tm: TokenManager) -> Self {
        let peer_names = tm
            .links()
            .map(|peer| match peer {
                Hop::Host(h) => format!("SIU of host {h}"),
                Hop::Switch(s) => format!("TM of switch {s}"),
            })
            .collect();
        Self {
            rejoin: Rejoin::new(tm.link_count()),
            tm,
            peer_names,
            messages_doomed: 0,
        }
    }

    /// The state machine.
    pub fn tm(&self) -> &TokenManager {
        &self.tm
    }

    /// The state machine, to change it.
    pub fn tm_mut(&mut self) -> &mut TokenManager {
        &mut self.tm
    }

    /// Links whose neighbour is gone and not back yet.
    pub fn broken_links(&self) -> usize {
        self.rejoin.pending()
    }

    /// What each link leads to, by link id.
    pub fn peer_names(&self) -> Arc<[String]> {
        Arc::clone(&self.peer_names)
    }

    /// The state machine, for its counters at the end.
    pub fn into_tm(self) -> TokenManager {
        self.tm
    }
}

impl Role for TmRole {
    fn lanes(&self) -> usize {
        1
    }

    fn lane(&self, _peer: usize) -> usize {
        0
    }

    fn out_lanes(&self) -> usize {
        1
    }

    fn handle_packet(&mut self, now_us: u64, peer: usize, bytes: &mut Vec<u8>) -> Verdict {
        // A message forwarded as it came leaves in this very buffer.
        match self.tm.handle_input_owned(now_us, peer, bytes) {
            Ok(()) => Verdict::Consumed,
            Err(TmError::Backpressure(_)) => Verdict::Retry,
            Err(e) => Verdict::Refused(e.into()),
        }
    }

    fn handle_timeout(&mut self, now_us: u64) {
        self.tm.handle_timeout(now_us);
    }

    fn poll_timeout(&self) -> Option<u64> {
        self.tm.poll_timeout()
    }

    /// A token manager has no local peer.
    fn local_turn_ended(&mut self, _now_us: u64) {}
    fn quiet(&self) -> bool {
        // An idle wave waits for its pace timer: the SIUs' tokens are all in.
        self.tm.pacing()
    }
    fn buffers(&mut self) -> Option<&mut BufPool> {
        Some(self.tm.buffers())
    }
    fn local_turn_coming(&self) -> bool {
        false
    }

    fn poll_output(&mut self, _now_us: u64, _lane: usize) -> Option<(usize, Vec<u8>)> {
        loop {
            let (link, bytes) = self.tm.poll_transmit()?;
            if !doomed(&self.rejoin, link, self.tm.generation(), &bytes) {
                return Some((link, bytes));
            }
            self.messages_doomed += 1;
        }
    }

    fn redundant(&self, bytes: &[u8]) -> bool {
        Token::is_repeat(bytes)
    }

    fn link_up(&mut self, now_us: u64, link: usize) {
        let generation = self.tm.generation();
        if self.messages_doomed > 0 {
            tracing::warn!(
                switch = self.tm.config().switch,
                dropped = self.messages_doomed,
                "dropped isotach messages for neighbours whose link was broken: their \
                 generation ends"
            );
            self.messages_doomed = 0;
        }
        tracing::info!(
            switch = self.tm.config().switch,
            link,
            peer = self.peer_names[link],
            "neighbour up"
        );
        if self.rejoin.back(link, generation) && self.tm.started() {
            tracing::warn!(
                switch = self.tm.config().switch,
                link,
                generation = %generation.next(),
                "neighbour back after a broken link: starting a new generation"
            );
            self.tm.begin_restart(now_us);
        }
    }

    fn link_lost(&mut self, _now_us: u64, link: usize, reason: LossReason, dropped: usize) {
        let generation = self.tm.generation();
        tracing::warn!(
            switch = self.tm.config().switch,
            link,
            peer = self.peer_names[link],
            ?reason,
            dropped,
            %generation,
            "lost neighbour: logical time waits until it is back"
        );
        self.rejoin.broken(link, generation);
    }
}

/// An isotach message for a peer whose link broke during the generation in force belongs to a
/// generation that ends: the rejoin rule starts a new one when the peer is back, and queued on
/// the link it would arrive ahead of that restart's token, a leftover the receiver cannot tell
/// from a current message (isotach messages carry no generation). Dropped here. A node that
/// took a newer generation meanwhile (its restart token can arrive before the link is up on
/// this side) sends as usual.
pub(crate) fn doomed(rejoin: &Rejoin, peer: usize, generation: Generation, bytes: &[u8]) -> bool {
    rejoin.broken_during(peer, generation) && peek_kind(bytes) == Ok(Kind::IsotachMessage)
}
#[cfg(test)]
mod tests {
    use super::*;
    use isotach_proto::Pulse;
    use isotach_proto::packet::{IsotachMessage, Sref};

    #[test]
    fn only_isotach_messages_for_a_broken_link_are_doomed() {
        let mut m = Vec::new();
        IsotachMessage {
            ts: Pulse::new(1),
            source: 0,
            dest: 1,
            sequum: 0,
            generation: Generation::new(1),
            sref: Sref::Msg {
                handler: 0,
                payload: vec![],
            },
        }
        .encode(&mut m);
        let t = Token::default().to_bytes();
        let mut r = Rejoin::new(2);
        assert!(!doomed(&r, 1, Generation::new(7), &m), "the link is up");
        r.broken(1, Generation::new(7));
        assert!(doomed(&r, 1, Generation::new(7), &m));
        assert!(
            !doomed(&r, 1, Generation::new(7), &t),
            "tokens go: the receiver checks their generation"
        );
        assert!(!doomed(&r, 0, Generation::new(7), &m), "another link");
        assert!(
            !doomed(&r, 1, Generation::new(8), &m),
            "a newer generation taken before the link is up on this side is current"
        );
        assert!(
            !r.back(1, Generation::new(8)) && !doomed(&r, 1, Generation::new(7), &m),
            "back"
        );
    }
    /// A token from host `port` of wave `wave`, or the reset that starts generation 1.
    fn token(port: u16, wave: u64, restart: bool) -> Vec<u8> {
        Token {
            seq: isotach_proto::WaveSeq::of_wave(wave),
            source_port: port,
            generation: Generation::new(1),
            restart,
            ..Token::default()
        }
        .to_bytes()
        .to_vec()
    }

    #[test]
    fn each_run_of_the_pump_stocks_the_role_from_the_links_spares() {
        use crate::pump::Pump;
        use isotach_am_proto::link::Links;
        use isotach_am_proto::{Tag, Time};
        use isotach_proto::config::{Limits, Timing};
        use isotach_proto::packet::{BUFFER_BYTES_MIN, POOL_BUFFERS_MAX};
        let role = TmRole::new(TokenManager::new(TmConfig {
            switch: 0,
            topology: Arc::new(isotach_proto::topology::Topology::line(2, 1).unwrap()),
            timing: Timing::default(),
            limits: Limits::default(),
        }));
        let mut links = Links::new(
            Links::am_config(),
            NodeAddr::Mem(0),
            1,
            1400,
            &[NodeAddr::Mem(1), NodeAddr::Mem(2)],
            Tag(7),
        )
        .unwrap();
        let spares = POOL_BUFFERS_MAX;
        for _ in 0..spares {
            links.recycle(Vec::with_capacity(BUFFER_BYTES_MIN));
        }
        let mut pump = Pump::new(role, links, 64);
        assert_eq!(pump.role_mut().buffers().unwrap().room(), POOL_BUFFERS_MAX);
        pump.advance(Time(0)).unwrap();
        // Topped up to half of what the role keeps; the rest stay the links'.
        assert_eq!(
            pump.role_mut().buffers().unwrap().room(),
            POOL_BUFFERS_MAX / 2
        );
        let mut left = 0;
        while pump.take_spare().is_some() {
            left += 1;
        }
        assert_eq!(left, spares - POOL_BUFFERS_MAX / 2);
    }

    #[test]
    fn the_role_is_quiet_only_while_its_tm_holds_an_idle_wave() {
        use isotach_proto::config::{Limits, Timing};
        let pace_us = 5_000;
        let mut role = TmRole::new(TokenManager::new(TmConfig {
            switch: 0,
            topology: Arc::new(isotach_proto::topology::Topology::line(2, 1).unwrap()),
            timing: Timing {
                token_timeout_us: 4 * pace_us,
                epoch_pulses: 8,
                idle_pace_us: pace_us,
            },
            limits: Limits::default(),
        }));
        let mut take = |now_us, peer, mut bytes: Vec<u8>| {
            assert_eq!(
                role.handle_packet(now_us, peer, &mut bytes),
                Verdict::Consumed
            );
            while role.poll_output(now_us, 0).is_some() {}
            role.quiet()
        };
        assert!(
            !take(0, 0, token(0, 0, true)),
            "wave 1 went out: tokens are due"
        );
        assert!(
            !take(10, 0, token(0, 1, false)),
            "host 1's token is still due"
        );
        assert!(
            take(10, 1, token(1, 1, false)),
            "wave 2 waits for its pace timer"
        );
        role.handle_timeout(10 + pace_us);
        while role.poll_output(10 + pace_us, 0).is_some() {}
        assert!(!role.quiet(), "wave 2 went out");
    }
}
