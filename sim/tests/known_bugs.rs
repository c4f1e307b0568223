//! Reproductions of bugs found by the simulator in the TM and SIU state machines, written
//! against the state machines directly (so they do not depend on a trace) and kept as
//! regression tests once fixed. All are fixed now; a new open bug would be added `#[ignore]`d
//! and run with `cargo test -p isotach-sim --test known_bugs -- --ignored`. The `--seed`s quoted
//! below found the bugs with the simulator's earlier hand-rolled generator; with `isotach-rng`
//! the same seeds make other runs.

use isotach_proto::Generation;
use isotach_proto::Pulse;
use isotach_proto::config::{ClusterConfig, Limits, Timing};
use isotach_proto::packet::{EndOfIsochron, IsotachMessage, Kind, Sref, StartOfIsochron, Token};
use isotach_proto::topology::{Hop, HostId, Topology};
use isotach_sim::philo::{self, PhiloOptions};
use isotach_sim::waves::{self, WavesOptions};
use isotach_sim::{Faults, Pauses, RangeUs, Restarts};
use isotach_siu::{Mode, Siu, SiuConfig};
use isotach_tm::{TmConfig, TokenManager};
use std::sync::Arc;

const TIMEOUT_US: u64 = 100;
/// Delivery rounds per [`Mini::pump`]: each lets a token wave advance by about one.
const PUMP_ROUNDS: usize = 4;

/// Where a packet is going in [`Mini`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dir {
    ToTm(HostId),
    ToSiu(HostId),
}

/// One switch, its TM and `hosts` SIUs, with instant delivery and a drop filter.
struct Mini {
    sius: Vec<Siu>,
    tm: TokenManager,
    now_us: u64,
    /// Everything each SIU handed its host.
    to_host: Vec<Vec<Vec<u8>>>,
}

impl Mini {
    fn new(hosts: usize) -> Self {
        let topology = Arc::new(Topology::line(hosts, 1).unwrap());
        let timing = Timing {
            token_timeout_us: TIMEOUT_US,
            epoch_pulses: 8,
            // These runs replay old bugs at full speed.
            idle_pace_us: 0,
        };
        let sius = (0..hosts)
            .map(|h| {
                Siu::new(SiuConfig {
                    host: h as HostId,
                    mode: Mode::Siu,
                    topology: Arc::clone(&topology),
                    timing,
                    limits: Limits::default(),
                    initiates_reset: h == 0,
                    host_turns: false,
                })
            })
            .collect();
        let tm = TokenManager::new(TmConfig {
            switch: 0,
            topology,
            timing,
            limits: Limits::default(),
        });
        Self {
            sius,
            tm,
            now_us: 0,
            to_host: vec![Vec::new(); hosts],
        }
    }

    /// Delivers what is queued (instantly, FIFO) except what `drop` refuses, for a few
    /// rounds (with instant delivery, token waves would otherwise run forever).
    fn pump(&mut self, drop: &mut dyn FnMut(Dir, &[u8]) -> bool) {
        for _ in 0..PUMP_ROUNDS {
            let mut moved = false;
            for h in 0..self.sius.len() {
                while let Some(tx) = self.sius[h].poll_net() {
                    moved = true;
                    if !drop(Dir::ToTm(h as HostId), &tx.bytes) {
                        let link = self.tm.link_to(Hop::Host(h as HostId)).unwrap();
                        let _ = self.tm.handle_input(self.now_us, link, &tx.bytes);
                    }
                }
                while let Some(b) = self.sius[h].poll_host() {
                    self.to_host[h].push(b);
                }
            }
            while let Some((link, bytes)) = self.tm.poll_transmit() {
                moved = true;
                let Some(Hop::Host(h)) = self.tm.links().nth(link) else {
                    unreachable!("one switch: every link is a host")
                };
                if !drop(Dir::ToSiu(h), &bytes) {
                    let _ = self.sius[usize::from(h)].handle_net(self.now_us, &bytes);
                }
            }
            if !moved {
                return;
            }
        }
    }

    /// Lets `timeouts` token timeouts pass with nothing lost.
    fn run_timeouts(&mut self, timeouts: u64) {
        for _ in 0..timeouts * 2 {
            self.now_us += TIMEOUT_US / 2;
            for s in &mut self.sius {
                s.handle_timeout(self.now_us);
            }
            self.tm.handle_timeout(self.now_us);
            self.pump(&mut |_, _| false);
        }
    }
}

fn is_reset(bytes: &[u8]) -> bool {
    Token::decode(bytes).is_ok_and(|t| t.restart)
}

/// Drops the first reset token going `dir`.
fn drop_first_reset(dir: Dir) -> impl FnMut(Dir, &[u8]) -> bool {
    let mut dropped = false;
    move |d, b| {
        let hit = !dropped && d == dir && is_reset(b);
        dropped |= hit;
        hit
    }
}

/// Fixed in 1a2e87b (the initiating SIU keeps its restart among its last two tokens): a
/// restart token lost between the initiating SIU and its TM is repeated by the SIU's timer.
#[test]
fn a_reset_lost_on_the_way_to_the_tm_is_repeated() {
    let mut m = Mini::new(1);
    m.sius[0].start(0);
    m.pump(&mut drop_first_reset(Dir::ToTm(0)));
    assert!(!m.tm.started());
    m.run_timeouts(20);
    assert!(m.tm.started(), "the TM never hears of logical time");
    assert!(m.sius[0].recvclock() > 0);
}

/// Fixed in 6ece516 (the TM remembers its restart among each link's last two tokens): an SIU
/// (or a neighbouring TM) that missed the TM's restart token gets it again. Before the fix,
/// logical time stalled at pulse 0 for good, e.g. in `isotach sim waves --hosts 16 --switches
/// 3 --pulses 2000 --seed 8 --loss 0.05 --dup 0.02 --reorder 0.1 --token-corrupt 0.01`.
#[test]
fn a_reset_lost_on_the_way_from_the_tm_to_an_siu_is_repeated() {
    let mut m = Mini::new(2);
    m.sius[0].start(0);
    m.pump(&mut drop_first_reset(Dir::ToSiu(1)));
    assert!(m.tm.started() && !m.sius[1].started());
    m.run_timeouts(20);
    assert!(m.sius[1].started(), "SIU 1 never starts");
    assert!(
        m.sius.iter().all(|s| s.recvclock() > 2),
        "logical time stalls"
    );
}

/// FIXED (the TM holds isotach messages for a neighbour until its first token arrives): an
/// isotach message could overtake the start of logical time and is then lost. The
/// initiating SIU starts at once and timestamps its host's isochrons; while its restart token
/// is lost, its TM (not started) still forwards the messages, and the receiving SIU (not
/// started) refuses them with `NotStarted` — the message is gone, and once the repeated
/// restart starts everyone, the receiver ends the message's pulse without it (an EOP-rule
/// violation). Seen in `isotach sim waves --hosts 2 --switches 1 --pulses 50 --token-corrupt
/// 0.3 --seed 7`.
#[test]
fn a_message_sent_before_the_tm_started_is_not_lost() {
    let mut m = Mini::new(2);
    m.sius[0].start(0);
    m.pump(&mut drop_first_reset(Dir::ToTm(0)));
    assert!(!m.tm.started() && m.sius[0].started());
    assert_isochron_reaches_host_1(&mut m);
}

/// FIXED, the same bug one hop later: the TM's restart token to SIU 1 is lost; the TM (started)
/// forwards host 0's message to SIU 1 (not started), which refuses it; the repeated restart
/// starts SIU 1 and it ends the message's pulse without it. Seen in `isotach sim waves
/// --hosts 16 --switches 3 --pulses 2000 --seed 9 --loss 0.05 --dup 0.02 --reorder 0.1
/// --token-corrupt 0.01` (SIU 6).
#[test]
fn a_message_to_an_siu_that_missed_the_restart_is_not_lost() {
    let mut m = Mini::new(2);
    m.sius[0].start(0);
    m.pump(&mut drop_first_reset(Dir::ToSiu(1)));
    assert!(m.tm.started() && m.sius[0].started() && !m.sius[1].started());
    assert_isochron_reaches_host_1(&mut m);
}

/// Host 0 sends an isochron to host 1 once a restart token is lost: the repeated restart
/// must start everyone without losing the message, and host 1's pulse must end with it.
fn assert_isochron_reaches_host_1(m: &mut Mini) {
    send_isochron_to_host_1(m);
    m.pump(&mut |_, _| false);
    m.run_timeouts(20);
    assert!(
        m.sius[1].recvclock() > 2,
        "the message's pulse ended at host 1"
    );
    let delivered = m.to_host[1]
        .iter()
        .any(|b| b.get(1) == Some(&(Kind::IsotachMessage as u8)));
    assert!(delivered, "the message to host 1 was dropped");
}

/// Host 0 hands its SIU a one-message isochron for host 1.
fn send_isochron_to_host_1(m: &mut Mini) {
    let soi = StartOfIsochron {
        iso_id: 1,
        distance: 1,
        logged: true,
        ..StartOfIsochron::default()
    };
    let msg = IsotachMessage {
        ts: Pulse::new(0),
        source: 0,
        dest: 1,
        sequum: 0,
        generation: Generation::new(1),
        sref: Sref::Msg {
            handler: 0,
            payload: vec![],
        },
    };
    let mut packets = vec![Vec::new(), Vec::new(), Vec::new()];
    soi.encode(&mut packets[0]);
    msg.encode(&mut packets[1]);
    EndOfIsochron { iso_id: 1 }.encode(&mut packets[2]);
    for p in packets {
        m.sius[0]
            .handle_host(m.now_us, &p)
            .expect("the SIU takes it");
    }
}

/// FIXED (the bug above, through the simulator): token corruption hits a restart token while
/// hosts already send isochrons (with `isotach-rng`, 16 of these 20 seeds corrupt a restart
/// token, on the way to the TM or to an SIU).
#[test]
fn reset_token_corruption_never_breaks_a_run() {
    for seed in 1..=20 {
        let mut o = WavesOptions::new(2, 1, 50, seed).unwrap();
        o.net.faults.token_corrupt = 0.3;
        let r = waves::run(&o).unwrap();
        assert!(r.ok, "seed {seed}: {:?}", r.problems);
    }
}

/// FIXED (the simulator paused an SIU's host packets but not its application's attaches): two
/// restarts of logical time reached host 0 at once while its SIU was paused; each started a
/// new application (attach, then the start barrier's marker). Both attaches skipped the pause
/// and overtook the first marker, so the SIU took the first application's marker for the
/// second's and refused the second marker: `host 0: SIU refused a packet: barrier 0: already
/// in progress`. Not an SIU or TM bug: in a daemon an application's hello follows the previous
/// one's packets on the same link. Found with idle pacing (2500 µs), whose timing made the two
/// restarts coincide with a pause; `sim::tests` has the focused reproduction.
#[test]
fn philo_seed_321_two_restarts_during_a_pause() {
    let mut cluster = ClusterConfig::generated(6, 2).unwrap();
    cluster.timing.idle_pace_us = 2_500;
    let mut o = PhiloOptions::new(cluster, 20, 321);
    o.net.faults = Faults {
        loss: 0.02,
        dup: 0.02,
        reorder: 0.05,
        token_corrupt: 0.01,
        ..Faults::default()
    };
    o.net.pauses = Some(Pauses {
        every_us: 5_000,
        duration_us: RangeUs::new(100, 20_000),
    });
    o.net.restarts = Some(Restarts {
        every_us: 4_000,
        count: 3,
        down_us: RangeUs::new(100, 5_000),
    });
    let r = philo::run(&o).unwrap();
    assert!(r.logical_restarts > 0, "{r:?}");
    assert!(r.ok, "{r:#?}");
}
