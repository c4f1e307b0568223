//! An in-memory rig: one SIU between a [`ByteGenerator`]/[`Receiver`] host and a
//! [`TokenBouncer`] token manager (the report's "setup B").

use crate::{ByteGenerator, Receiver, TokenBouncer};
use isotach_proto::config::{Limits, Timing};
use isotach_proto::packet::Packet;
use isotach_proto::topology::{HostId, Topology};
use isotach_siu::{Mode, Route, Siu, SiuConfig, SiuError, Transmit};
use std::sync::Arc;

/// The topology the suite uses: 4 hosts on 2 switches joined by a trunk. Hosts 0 and 2 hang off
/// switch 0, hosts 1 and 3 off switch 1; distance 1 within a switch, 2 across.
pub fn test_topology() -> Arc<Topology> {
    Arc::new(Topology::line(4, 2).expect("valid topology"))
}

/// An SIU configuration for `host` of [`test_topology`]: token timeout 1000 µs, epochs of 8
/// pulses, no idle pacing (the suite checks the report's SIU packet by packet; BUSY tokens and
/// wake-ups have their own tests in `siu/tests/idle_pacing.rs`), default limits, not the reset
/// initiator.
pub fn siu_config(host: HostId, mode: Mode) -> SiuConfig {
    SiuConfig {
        host,
        mode,
        topology: test_topology(),
        timing: Timing {
            token_timeout_us: 1_000,
            epoch_pulses: 8,
            idle_pace_us: 0,
        },
        limits: Limits::default(),
        initiates_reset: false,
        host_turns: false,
    }
}

/// One packet on the SIU's link to its token manager, in the order it crossed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wire {
    /// SIU to token manager.
    ToTm(Vec<u8>),
    /// Token manager to SIU.
    FromTm(Vec<u8>),
}

/// One SIU wired to the three harness roles, with a virtual clock.
///
/// [`Rig::pump`] moves packets until nothing moves: SIU network output to the bouncer (or to
/// [`Rig::direct`] for packets routed straight to another host), SIU host output to the receiver,
/// bouncer output to the SIU one packet at a time (draining the SIU after each), so
/// [`Rig::trace`] records a causal order of the link. The bouncer starts paused after wave 1;
/// [`Rig::run_pulses`] lets logical time advance.
#[derive(Debug)]
pub struct Rig {
    /// The SIU under test.
    pub siu: Siu,
    /// The token manager role.
    pub bouncer: TokenBouncer,
    /// The host's sending role.
    pub host: ByteGenerator,
    /// The host's receiving role.
    pub receiver: Receiver,
    /// Virtual time in microseconds.
    pub now_us: u64,
    /// Every packet on the TM link, in order.
    pub trace: Vec<Wire>,
    /// Network packets routed directly to other hosts (non-isotach traffic).
    pub direct: Vec<Transmit>,
    /// Errors the SIU returned for network input.
    pub net_errors: Vec<SiuError>,
    initiates_reset: bool,
}

impl Rig {
    /// A rig around a new SIU; logical time has not started.
    pub fn new(cfg: SiuConfig) -> Self {
        let switch = cfg.topology.switch_of(cfg.host);
        let host = cfg.host;
        let initiates_reset = cfg.initiates_reset;
        let mut bouncer = TokenBouncer::new(switch);
        bouncer.pause_after(1);
        Self {
            siu: Siu::new(cfg),
            bouncer,
            host: ByteGenerator::new(host),
            receiver: Receiver::new(),
            now_us: 0,
            trace: Vec::new(),
            direct: Vec::new(),
            net_errors: Vec::new(),
            initiates_reset,
        }
    }

    /// A rig for `host` of [`test_topology`] in `mode`, started.
    pub fn started(host: HostId, mode: Mode) -> Self {
        let mut rig = Self::new(siu_config(host, mode));
        rig.start();
        rig
    }

    /// Starts logical time: the SIU initiates the reset if configured to, else the bouncer does.
    /// In host mode the generator adopts the new generation.
    pub fn start(&mut self) {
        if self.initiates_reset {
            self.siu.start(self.now_us);
        } else {
            let generation = self.bouncer.generation().next();
            self.bouncer.start(generation);
        }
        self.pump();
        self.host.adopt_generation(self.siu.generation());
    }

    /// Hands the SIU one host packet, then pumps.
    pub fn host_send(&mut self, bytes: &[u8]) -> Result<(), SiuError> {
        let r = self.siu.handle_host(self.now_us, bytes);
        self.pump();
        r
    }

    /// Hands the SIU every packet, pumping after each; panics on the first refusal.
    pub fn host_send_all(&mut self, packets: &[Vec<u8>]) {
        for (i, p) in packets.iter().enumerate() {
            if let Err(e) = self.host_send(p) {
                panic!("host packet {i} refused: {e}");
            }
        }
    }

    /// Moves the SIU's queued output to the bouncer, [`Rig::direct`] and the receiver.
    pub fn drain_siu(&mut self) {
        while let Some(t) = self.siu.poll_net() {
            match t.route {
                Route::Tm => {
                    self.bouncer.handle(&t.bytes);
                    self.trace.push(Wire::ToTm(t.bytes));
                }
                Route::Host(_) => self.direct.push(t),
            }
        }
        while let Some(b) = self.siu.poll_host() {
            self.receiver.push(&b);
        }
    }

    /// Delivers one bouncer packet to the SIU and drains the SIU; false if none was queued.
    pub fn deliver_one(&mut self) -> bool {
        self.drain_siu();
        let Some(bytes) = self.bouncer.poll() else {
            return false;
        };
        if let Err(e) = self.siu.handle_net(self.now_us, &bytes) {
            self.net_errors.push(e);
        }
        self.trace.push(Wire::FromTm(bytes));
        self.drain_siu();
        true
    }

    /// Moves packets until nothing moves.
    pub fn pump(&mut self) {
        let mut steps = 0u32;
        while self.deliver_one() {
            steps += 1;
            assert!(steps < 1_000_000, "the rig does not settle");
        }
    }

    /// Lets the bouncer send `n` more waves and pumps.
    pub fn run_pulses(&mut self, n: u64) {
        self.bouncer.release(n);
        self.pump();
    }

    /// Advances the clock by `us`, runs the SIU's timers if due, and pumps.
    pub fn advance_us(&mut self, us: u64) {
        self.now_us += us;
        if self.siu.poll_timeout().is_some_and(|t| t <= self.now_us) {
            self.siu.handle_timeout(self.now_us);
        }
        self.pump();
    }

    /// The SIU's sendclock as the wire shows it: its tokens the bouncer accepted.
    pub fn sendclock_on_wire(&self) -> u64 {
        self.bouncer.accepted()
    }

    /// The packets the SIU sent its token manager, decoded, in order.
    pub fn to_tm(&self) -> Vec<Packet> {
        self.trace
            .iter()
            .filter_map(|w| match w {
                Wire::ToTm(b) => Some(Packet::decode(b).expect("the SIU sends valid packets")),
                Wire::FromTm(_) => None,
            })
            .collect()
    }
}
