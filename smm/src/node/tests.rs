//! SMM nodes over real SIU and TM state machines, wired with lossless FIFO queues.

use super::*;
use crate::oracle;
use crate::{MemoryMap, SmmConfig, SmmError, SmmLimits, Table};
use isotach_proto::Generation;
use isotach_proto::Pulse;
use isotach_proto::config::{Limits, Timing};
use isotach_proto::packet::{self, EopMarker, Kind, Sref, SrefOp, Width};
use isotach_proto::topology::Hop;
use isotach_proto::topology::Topology;
use isotach_siu::{Route, Siu, SiuConfig};
use isotach_tm::{TmConfig, TokenManager};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

enum To {
    Tm(usize, usize),
    SiuNet(usize),
    SiuHost(usize),
    Node(usize),
}

struct Cluster {
    topo: Arc<Topology>,
    tms: Vec<TokenManager>,
    sius: Vec<Siu>,
    nodes: Vec<SmmNode>,
    /// Hosts with no application attached (their SIU answers for them).
    absent: Vec<bool>,
    queue: VecDeque<(To, Vec<u8>)>,
}

impl Cluster {
    fn new(hosts: usize, switches: usize, map: MemoryMap) -> Self {
        let topo = Arc::new(Topology::line(hosts, switches).unwrap());
        let timing = Timing {
            token_timeout_us: 1_000_000,
            epoch_pulses: 16,
            // This cluster never runs timers: idle waves must not wait for a pace timer.
            idle_pace_us: 0,
        };
        let map = Arc::new(map);
        let tms = (0..switches)
            .map(|s| {
                TokenManager::new(TmConfig {
                    switch: s as u16,
                    topology: topo.clone(),
                    timing,
                    limits: Limits::default(),
                })
            })
            .collect();
        let sius = (0..hosts)
            .map(|h| {
                Siu::new(SiuConfig {
                    host: h as u16,
                    mode: isotach_siu::Mode::Siu,
                    topology: topo.clone(),
                    timing,
                    limits: Limits::default(),
                    initiates_reset: h == 0,
                    host_turns: false,
                })
            })
            .collect();
        let nodes = (0..hosts).map(|h| Self::node(h, &topo, &map)).collect();
        let mut c = Self {
            topo,
            tms,
            sius,
            nodes,
            absent: vec![false; hosts],
            queue: VecDeque::new(),
        };
        c.sius[0].start(0);
        c.collect();
        c.run_until(|c| c.sius.iter().all(Siu::started));
        c
    }

    fn node(h: usize, topo: &Arc<Topology>, map: &Arc<MemoryMap>) -> SmmNode {
        SmmNode::new(SmmConfig {
            host: h as u16,
            topology: topo.clone(),
            map: map.clone(),
            limits: SmmLimits {
                slots_per_page: 16,
                ..SmmLimits::default()
            },
            record: true,
        })
    }

    /// Host `h`'s application goes away: its SIU answers for it from now on.
    fn detach(&mut self, h: usize) {
        self.absent[h] = true;
    }

    /// A new application attaches at host `h` and joins.
    fn attach_and_join(&mut self, h: usize) {
        let map = self.nodes[h].cfg.map.clone();
        self.nodes[h] = Self::node(h, &self.topo, &map);
        self.absent[h] = false;
        self.sius[h].host_attached();
        self.nodes[h].join().unwrap();
        self.collect();
    }

    /// Hosts holding a copy of `page`.
    fn holders(&self, page: u32) -> Vec<usize> {
        let me = |h: usize| h as u16;
        (0..self.nodes.len())
            .filter(|&h| {
                self.nodes[h]
                    .map
                    .copyset(page)
                    .is_some_and(|s| s.contains(&me(h)))
            })
            .collect()
    }

    /// Moves every output into the queue.
    fn collect(&mut self) {
        for s in 0..self.tms.len() {
            while let Some((link, bytes)) = self.tms[s].poll_transmit() {
                let peer = self.tms[s].links().nth(link).unwrap();
                let to = match peer {
                    Hop::Host(h) => To::SiuNet(usize::from(h)),
                    Hop::Switch(t) => {
                        let back = self.tms[usize::from(t)]
                            .link_to(Hop::Switch(s as u16))
                            .unwrap();
                        To::Tm(usize::from(t), back)
                    }
                };
                self.queue.push_back((to, bytes));
            }
        }
        for h in 0..self.sius.len() {
            while let Some(t) = self.sius[h].poll_net() {
                let to = match t.route {
                    Route::Tm => {
                        let s = self.topo.switch_of(h as u16);
                        let link = self.tms[usize::from(s)]
                            .link_to(Hop::Host(h as u16))
                            .unwrap();
                        To::Tm(usize::from(s), link)
                    }
                    Route::Host(d) => To::SiuNet(usize::from(d)),
                };
                self.queue.push_back((to, t.bytes));
            }
            while let Some(b) = self.sius[h].poll_host() {
                self.queue.push_back((To::Node(h), b));
            }
            while let Some(b) = self.nodes[h].poll_siu() {
                self.queue.push_back((To::SiuHost(h), b));
            }
        }
    }

    fn step(&mut self) {
        let Some((to, bytes)) = self.queue.pop_front() else {
            return;
        };
        match to {
            To::Tm(s, link) => self.tms[s].handle_input(0, link, &bytes).unwrap(),
            To::SiuNet(h) => self.sius[h].handle_net(0, &bytes).unwrap(),
            To::SiuHost(h) => self.sius[h].handle_host(0, &bytes).unwrap(),
            To::Node(h) if self.absent[h] => self.sius[h].host_absent(&bytes).unwrap(),
            To::Node(h) => self.nodes[h].handle_siu(&bytes).unwrap(),
        }
        self.collect();
    }

    /// Runs until `done` holds (checked every step); panics after a step budget.
    fn run_until(&mut self, mut done: impl FnMut(&Self) -> bool) {
        for _ in 0..200_000 {
            if done(self) {
                return;
            }
            self.step();
        }
        panic!("cluster did not reach the condition");
    }

    /// Runs until nothing but tokens is in flight and every node has drained everything.
    fn quiesce(&mut self) {
        self.run_until(|c| {
            let nodes_idle = c.nodes.iter().all(|n| {
                n.hit.is_empty()
                    && n.buckets.is_empty()
                    && n.reads.values().all(|r| matches!(r, ReadSlot::Ready(_)))
            });
            let sius_idle = c.sius.iter().all(|s| s.pending_pulse_packets() == 0);
            let only_tokens = c
                .queue
                .iter()
                .all(|(_, b)| packet::peek_kind(b) == Ok(Kind::Token));
            nodes_idle && sius_idle && only_tokens
        });
    }

    fn records(&self) -> Vec<ExecRecord> {
        self.nodes
            .iter()
            .flat_map(|n| n.records().iter().cloned())
            .collect()
    }
}

fn map(text: &str, hosts: usize) -> MemoryMap {
    let names: Vec<String> = (0..hosts).map(|h| h.to_string()).collect();
    MemoryMap::parse(text, "test", &names).unwrap()
}

#[test]
fn remote_write_then_read_from_the_nearest_copy() {
    // Page 0 on host 1 only; page 1 replicated on 0 and 1.
    let mut c = Cluster::new(2, 1, map("0 1\n1 0 1\n", 2));
    let a = Addr::new(0, 3);
    let b = Addr::new(1, 2);
    let mut iso = c.nodes[0].isochron();
    iso.write(a, Width::W64, 0xdead_beef_0000_0001).unwrap();
    iso.write(b, Width::W32, 42).unwrap();
    iso.end().unwrap();
    c.quiesce();
    assert_eq!(c.nodes[1].local_value(a), Some(0xdead_beef_0000_0001));
    assert_eq!(c.nodes[0].local_value(b), Some(42));
    assert_eq!(c.nodes[1].local_value(b), Some(42));
    let mut iso = c.nodes[0].isochron();
    let ra = iso.read(a, Width::W64).unwrap();
    let rb = iso.read(b, Width::W32).unwrap();
    iso.end().unwrap();
    c.quiesce();
    assert_eq!(c.nodes[0].take_read(ra), Ok(Some(0xdead_beef_0000_0001)));
    assert_eq!(c.nodes[0].take_read(rb), Ok(Some(42)));
    assert_eq!(c.nodes[0].take_read(rb), Err(SmmError::UnknownRead));
    assert!(oracle::check(&c.records()).clean());
}

#[test]
fn busy_with_names_what_keeps_a_node_from_idle() {
    let mut c = Cluster::new(2, 1, map("0 1\n", 2));
    assert!(c.nodes[0].is_idle());
    assert!(c.nodes[0].busy_with().ends_with("to_siu 0 reads_waiting 0"));
    let mut iso = c.nodes[0].isochron();
    let r = iso.read(Addr::new(0, 3), Width::W64).unwrap();
    iso.end().unwrap();
    // In the hit buffer until its pulse, its start, read and end queued for the SIU, the read
    // waiting for host 1's answer.
    assert!(!c.nodes[0].is_idle());
    assert_eq!(
        c.nodes[0].busy_with(),
        "hit 1 joins 0 buckets 0 (oldest pulse None, last drained 0) to_siu 3 reads_waiting 1"
    );
    c.quiesce();
    assert_eq!(c.nodes[0].take_read(r), Ok(Some(0)));
    assert!(c.nodes[0].busy_with().ends_with("to_siu 0 reads_waiting 0"));
}

#[test]
fn purely_local_isochron_runs_at_once_when_nothing_is_outstanding() {
    let mut c = Cluster::new(2, 1, map("0 0\n1 1\n", 2));
    let a = Addr::new(0, 0);
    let mut iso = c.nodes[0].isochron();
    iso.write(a, Width::W64, 9).unwrap();
    let r = iso.read(a, Width::W64).unwrap();
    iso.end().unwrap();
    assert_eq!(
        c.nodes[0].read_value(r),
        Some(9),
        "ran without any logical time"
    );
    assert_eq!(c.nodes[0].stats().isochrons_immediate, 1);
    // With a remote isochron outstanding, a local one waits its turn in the hit buffer.
    let mut iso = c.nodes[0].isochron();
    iso.write(Addr::new(1, 0), Width::W64, 1).unwrap();
    iso.end().unwrap();
    let mut iso = c.nodes[0].isochron();
    let r2 = iso.read(a, Width::W64).unwrap();
    iso.end().unwrap();
    assert_eq!(c.nodes[0].read_value(r2), None);
    c.quiesce();
    assert_eq!(c.nodes[0].read_value(r2), Some(9));
    let rep = oracle::check(&c.records());
    assert!(rep.clean(), "{rep:?}");
}

#[test]
fn sched_blocks_readers_until_the_schedulers_assign() {
    let mut c = Cluster::new(3, 1, map("0 0 1 2\n", 3));
    let fork = Addr::new(0, 1);
    // Host 1 reads and schedules the fork.
    let mut iso = c.nodes[1].isochron();
    let before = iso.read(fork, Width::W32).unwrap();
    iso.sched(fork).unwrap();
    iso.end().unwrap();
    c.quiesce();
    assert_eq!(c.nodes[1].take_read(before), Ok(Some(0)));
    // Host 2 reads it: the read waits in read-pending.
    let mut iso = c.nodes[2].isochron();
    let waiting = iso.read(fork, Width::W32).unwrap();
    iso.end().unwrap();
    c.run_until(|c| c.nodes[2].hit.is_empty());
    assert_eq!(c.nodes[2].read_value(waiting), None);
    assert!(c.nodes[2].stats().read_pending >= 1);
    // Host 0 cannot assign a sched it does not own.
    let mut iso = c.nodes[0].isochron();
    iso.assign(fork, Width::W32, 5).unwrap();
    assert_eq!(iso.end(), Err(SmmError::AssignWithoutSched(fork)));
    // Host 1 assigns: the reader gets the assigned value.
    let mut iso = c.nodes[1].isochron();
    iso.assign(fork, Width::W32, 7).unwrap();
    iso.end().unwrap();
    c.quiesce();
    assert_eq!(c.nodes[2].read_value(waiting), Some(7));
    let rep = oracle::check(&c.records());
    assert!(rep.clean(), "{rep:?}");
}

#[test]
fn messages_run_their_handler_in_order() {
    let mut c = Cluster::new(2, 1, map("0 0 1\n", 2));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    c.nodes[1].register_handler(3, move |call| {
        s.lock().unwrap().push((call.source, call.payload.to_vec()))
    });
    for i in 0..3u8 {
        let mut iso = c.nodes[0].isochron();
        iso.message(1, 3, &[i]).unwrap();
        iso.end().unwrap();
    }
    let mut iso = c.nodes[0].isochron();
    iso.message(1, 9, b"nobody").unwrap();
    iso.end().unwrap();
    c.quiesce();
    assert_eq!(
        *seen.lock().unwrap(),
        vec![(0, vec![0]), (0, vec![1]), (0, vec![2])]
    );
    assert_eq!(c.nodes[1].stats().unhandled_messages, 1);
}

#[test]
fn errors_at_the_caller() {
    let mut c = Cluster::new(2, 1, map("0 0 1\n", 2));
    let n = &mut c.nodes[0];
    let mut iso = n.isochron();
    assert_eq!(
        iso.read(Addr::new(5, 0), Width::W32),
        Err(SmmError::Unmapped(Addr::new(5, 0)))
    );
    assert_eq!(
        iso.write(Addr::new(0, 16), Width::W32, 1),
        Err(SmmError::Unmapped(Addr::new(0, 16)))
    );
    assert_eq!(
        iso.write(Addr::new(0, 0), Width::W32, 1 << 32),
        Err(SmmError::ValueTooWide {
            value: 1 << 32,
            bits: 32
        })
    );
    assert!(matches!(
        iso.message(0, 1, &[0; 2000]),
        Err(SmmError::MessageTooLong { .. })
    ));
    assert_eq!(iso.message(9, 1, &[]), Err(SmmError::NoSuchHost(9)));
    drop(iso);
    assert_eq!(n.isochron().end(), Err(SmmError::EmptyIsochron));
    let mut iso = n.isochron();
    let _ = iso.read(Addr::new(0, 0), Width::W32).unwrap();
    drop(iso);
    assert_eq!(
        n.stats().reads_outstanding,
        0,
        "an abandoned isochron releases its reads"
    );
}

#[test]
fn read_limit_is_back_pressure() {
    let topo = Arc::new(Topology::line(1, 1).unwrap());
    let mut n = SmmNode::new(SmmConfig {
        host: 0,
        topology: topo,
        map: Arc::new(map("0 0\n", 1)),
        limits: SmmLimits {
            reads_max: 2,
            ..SmmLimits::default()
        },
        record: false,
    });
    let mut iso = n.isochron();
    iso.read(Addr::new(0, 0), Width::W32).unwrap();
    iso.read(Addr::new(0, 1), Width::W32).unwrap();
    assert_eq!(
        iso.read(Addr::new(0, 2), Width::W32),
        Err(SmmError::Limit(Table::Reads))
    );
}

#[test]
fn hot_variable_shared_by_all_hosts_across_switches_stays_consistent() {
    // Four hosts on two switches, one replicated page written and read by everyone.
    let mut c = Cluster::new(4, 2, map("0 0 1 2 3\n1 1 3\n", 4));
    let hot = Addr::new(0, 0);
    let cold = Addr::new(1, 5);
    for round in 0..6u64 {
        for h in 0..4 {
            let mut iso = c.nodes[h].isochron();
            let _ = iso.read(hot, Width::W64).unwrap();
            iso.write(hot, Width::W64, round * 10 + h as u64).unwrap();
            let _ = iso.read(cold, Width::W64).unwrap();
            iso.write(cold, Width::W64, round).unwrap();
            iso.end().unwrap();
        }
        for _ in 0..50 {
            c.step();
        }
    }
    c.quiesce();
    let rep = oracle::check(&c.records());
    assert!(rep.clean(), "{rep:?}");
    assert_eq!(rep.reads_checked, 48);
    let copies: Vec<_> = c.nodes.iter().map(|n| n.local_value(hot)).collect();
    assert!(
        copies.windows(2).all(|w| w[0] == w[1]),
        "copies diverged: {copies:?}"
    );
}

#[test]
fn hybrid_drain_orders_more_than_the_vector_holds() {
    // 40 writes from two hosts in one pulse to one host's page: count exceeds 32.
    let mut c = Cluster::new(3, 1, map("0 2\n", 3));
    for h in 0..2 {
        let mut iso = c.nodes[h].isochron();
        for i in 0..20 {
            iso.write(
                Addr::new(0, i % 16),
                Width::W64,
                (h * 100 + i as usize) as u64,
            )
            .unwrap();
        }
        iso.end().unwrap();
    }
    c.quiesce();
    let s = c.nodes[2].stats();
    assert_eq!(s.sorts_hybrid, 1, "{s:?}");
    // Host 1 sorts after host 0 at the same TS; within a host, program order.
    assert_eq!(c.nodes[2].local_value(Addr::new(0, 3)), Some(119));
    assert!(oracle::check(&c.records()).clean());
}

#[test]
fn signals_reach_every_host_at_the_same_pulse() {
    let mut c = Cluster::new(3, 2, map("0 0 1 2\n", 3));
    let seen = Arc::new(Mutex::new(Vec::new()));
    for h in 0..3 {
        let s = seen.clone();
        c.nodes[h].register_signal_handler(move |bits, ts| s.lock().unwrap().push((h, bits, ts)));
    }
    c.nodes[0].raise_signals(0b101);
    c.nodes[2].raise_signals(0b010);
    c.nodes[1].send_reset_signal();
    c.run_until(|_| seen.lock().unwrap().len() >= 6);
    let got = seen.lock().unwrap().clone();
    // Every host sees the OR of the raised signals and the reset signal, at one pulse.
    for h in 0..3 {
        let mine: Vec<_> = got
            .iter()
            .filter(|(x, ..)| *x == h)
            .map(|&(_, b, t)| (b, t))
            .collect();
        assert_eq!(mine.len(), 2, "host {h}: {got:?}");
        assert!(mine.contains(&(0b111, mine[0].1)), "host {h}: {got:?}");
        assert!(
            mine.contains(&(SmmNode::RESET_SIGNAL, mine[0].1)),
            "host {h}: {got:?}"
        );
    }
    let pulses: Vec<u64> = got.iter().map(|&(.., t)| t).collect();
    assert!(
        pulses.windows(2).all(|w| w[0] == w[1]),
        "one pulse for all: {got:?}"
    );
    assert_eq!(
        (pulses[0] + 1) % 16,
        0,
        "delivered at the end of an epoch: {got:?}"
    );
}

#[test]
fn hit_buffer_and_sched_limits_are_back_pressure() {
    let topo = Arc::new(Topology::line(2, 1).unwrap());
    let mut n = SmmNode::new(SmmConfig {
        host: 0,
        topology: topo,
        map: Arc::new(map("0 0\n1 1\n", 2)),
        limits: SmmLimits {
            hit_buffer_max: 2,
            scheds_max: 1,
            ..SmmLimits::default()
        },
        record: false,
    });
    for _ in 0..2 {
        let mut iso = n.isochron();
        iso.write(Addr::new(1, 0), Width::W32, 1).unwrap();
        iso.end().unwrap();
    }
    let mut iso = n.isochron();
    iso.write(Addr::new(1, 0), Width::W32, 1).unwrap();
    assert_eq!(iso.end(), Err(SmmError::Limit(Table::HitBuffer)));
    let mut n = SmmNode::new(SmmConfig {
        host: 0,
        topology: Arc::new(Topology::line(1, 1).unwrap()),
        map: Arc::new(map("0 0\n", 1)),
        limits: SmmLimits {
            scheds_max: 1,
            ..SmmLimits::default()
        },
        record: false,
    });
    let mut iso = n.isochron();
    iso.sched(Addr::new(0, 0)).unwrap();
    iso.sched(Addr::new(0, 1)).unwrap();
    assert_eq!(iso.end(), Err(SmmError::Limit(Table::Scheds)));
    assert_eq!(
        n.stats().isochrons_issued,
        0,
        "a refused isochron is not issued"
    );
}

/// An empty EOP marker for pulse `ts`.
fn eop(ts: u64) -> Vec<u8> {
    eop_with(EopMarker {
        ts: Pulse::new(ts),
        token_kind: Kind::Token as u8,
        ..EopMarker::default()
    })
}

/// The SIU's reset EOP marker for pulse `ts`: the reset bit outside an epoch's end.
fn restart_eop(ts: u64) -> Vec<u8> {
    eop_with(EopMarker {
        ts: Pulse::new(ts),
        reset: true,
        token_kind: Kind::Token as u8,
        ..EopMarker::default()
    })
}

fn eop_with(e: EopMarker) -> Vec<u8> {
    let mut out = Vec::new();
    e.encode(&mut out);
    out
}

#[test]
fn pulses_going_back_report_a_restart_of_logical_time() {
    let (mut node, first) = crate::testkit::pulse(3, crate::testkit::SortKind::Vector);
    node.handle_siu(&first).unwrap();
    for ts in 2..=5 {
        node.handle_siu(&eop(ts)).unwrap();
    }
    // A new generation: pulses count from the start again.
    let e = node.handle_siu(&eop(1)).unwrap_err();
    assert_eq!(e, SmmError::Restarted { ts: 1, drained: 5 });
    assert!(e.to_string().contains("restart the application"), "{e}");
    let mut m = Vec::new();
    IsotachMessage {
        ts: Pulse::new(2),
        source: 1,
        dest: 0,
        sequum: 0,
        generation: Generation::new(2),
        sref: Sref::Mem {
            op: SrefOp::Write,
            width: Width::W64,
            addr: 0,
            value: 1,
            ref_id: 0,
        },
    }
    .encode(&mut m);
    assert_eq!(
        node.handle_siu(&m).unwrap_err(),
        SmmError::Restarted { ts: 2, drained: 5 }
    );
    assert_eq!(node.stats().bad_input, 0, "a restart is not bad input");
}

/// A node for host 0 of two on one switch, holding page 0.
fn lone_node() -> SmmNode {
    SmmNode::new(SmmConfig {
        host: 0,
        topology: Arc::new(Topology::line(2, 1).unwrap()),
        map: Arc::new(map("0 0\n", 2)),
        limits: SmmLimits::default(),
        record: false,
    })
}

#[test]
fn a_node_in_its_start_barrier_reports_a_restart_of_logical_time() {
    let mut node = lone_node();
    node.barrier_start(0, 1).unwrap();
    assert!(
        node.poll_siu().is_some(),
        "the barrier marker went to the SIU"
    );
    // The marker went with the old generation: the barrier can never complete.
    let restarted = SmmError::Restarted { ts: 0, drained: 7 };
    assert_eq!(node.handle_siu(&restart_eop(7)), Err(restarted.clone()));
    assert_eq!(
        node.last_pulse(),
        7,
        "the reset EOP's pulse is the last drained"
    );
    // Sticky: the new generation's pulses and a second reset are refused too.
    assert_eq!(
        node.handle_siu(&eop(1)),
        Err(SmmError::Restarted { ts: 1, drained: 7 })
    );
    assert_eq!(
        node.handle_siu(&restart_eop(9)),
        Err(SmmError::Restarted { ts: 9, drained: 7 })
    );
    assert!(
        !node.barrier_done(0),
        "the old generation's barrier never completes"
    );
    assert_eq!(node.stats().bad_input, 0, "a restart is not bad input");
}

#[test]
fn a_node_that_sent_nothing_takes_a_restart_of_logical_time_quietly() {
    let mut node = lone_node();
    // A write of the old generation, for the pulse the reset cuts short.
    let mut m = Vec::new();
    IsotachMessage {
        ts: Pulse::new(7),
        source: 1,
        dest: 0,
        sequum: 0,
        generation: Generation::new(1),
        sref: Sref::Mem {
            op: SrefOp::Write,
            width: Width::W64,
            addr: 0,
            value: 5,
            ref_id: 0,
        },
    }
    .encode(&mut m);
    node.handle_siu(&m).unwrap();
    assert_eq!(node.handle_siu(&restart_eop(7)), Ok(()));
    assert_eq!(
        node.local_value(Addr::new(0, 0)),
        Some(0),
        "nothing of the old generation runs"
    );
    assert!(node.is_idle());
    // Nothing was lost: the node runs on in the new generation.
    assert_eq!(node.handle_siu(&eop(1)), Ok(()));
    node.barrier_start(0, 1).unwrap();
    let done = eop_with(EopMarker {
        ts: Pulse::new(2),
        barrier: 1,
        token_kind: Kind::Token as u8,
        ..EopMarker::default()
    });
    assert_eq!(node.handle_siu(&done), Ok(()));
    assert!(node.barrier_done(0));
}

fn write_all(c: &mut Cluster, from: usize, page: u32, base: u64) {
    let mut iso = c.nodes[from].isochron();
    for slot in 0..4 {
        iso.write(Addr::new(page, slot), Width::W64, base + u64::from(slot))
            .unwrap();
    }
    iso.end().unwrap();
}

#[test]
fn a_restarted_node_gets_an_image_and_every_later_operation() {
    let mut c = Cluster::new(3, 1, map("0 0 1 2\n", 3));
    write_all(&mut c, 0, 0, 100);
    // Host 2 schedules slot 3: the sched travels in the image, its assign after the join.
    let mut iso = c.nodes[2].isochron();
    iso.sched(Addr::new(0, 3)).unwrap();
    iso.end().unwrap();
    c.quiesce();
    c.detach(1);
    write_all(&mut c, 0, 0, 200); // while host 1 has no application
    c.attach_and_join(1);
    assert_eq!(
        c.nodes[1].isochron().end(),
        Err(SmmError::EmptyIsochron),
        "empty isochrons are refused first"
    );
    let mut iso = c.nodes[1].isochron();
    iso.write(Addr::new(0, 0), Width::W64, 1).unwrap();
    assert_eq!(iso.end(), Err(SmmError::Joining));
    write_all(&mut c, 2, 0, 300); // during the join
    c.run_until(|c| c.nodes[1].join_status() == JoinStatus::Current);
    let mut iso = c.nodes[2].isochron();
    iso.assign(Addr::new(0, 3), Width::W64, 7).unwrap();
    iso.end().unwrap();
    c.quiesce();
    let report = c.nodes[1].join_report().unwrap();
    assert_eq!(report.pages_recovered, vec![0]);
    assert!(report.pages_started_empty.is_empty());
    for slot in 0..3 {
        let a = Addr::new(0, slot);
        assert_eq!(c.nodes[1].local_value(a), Some(300 + u64::from(slot)));
        assert_eq!(c.nodes[1].local_value(a), c.nodes[0].local_value(a));
    }
    assert_eq!(c.nodes[1].snapshot(), c.nodes[0].snapshot());
    assert_eq!(c.nodes[1].local_value(Addr::new(0, 3)), Some(303));
    // The rejoined copy serves reads and runs isochrons.
    let mut iso = c.nodes[1].isochron();
    let r = iso.read(Addr::new(0, 1), Width::W64).unwrap();
    iso.end().unwrap();
    c.quiesce();
    assert_eq!(c.nodes[1].take_read(r), Ok(Some(301)));
    assert!(
        c.nodes[1].stats().images_sent == 0
            && c.nodes[0].stats().images_sent + c.nodes[2].stats().images_sent >= 1
    );
}

#[test]
fn a_page_without_a_live_copy_starts_empty_and_is_reported() {
    let mut c = Cluster::new(3, 1, map("0 1 2\n1 0 1\n", 3));
    write_all(&mut c, 0, 0, 10);
    write_all(&mut c, 0, 1, 20);
    c.quiesce();
    c.detach(2);
    c.detach(1);
    c.attach_and_join(1);
    c.run_until(|c| c.nodes[1].join_status() == JoinStatus::Current);
    let report = c.nodes[1].join_report().unwrap().clone();
    assert_eq!(
        report.pages_started_empty,
        vec![0],
        "host 2 had no application"
    );
    assert_eq!(report.pages_recovered, vec![1], "host 0 holds page 1");
    assert_eq!(c.nodes[1].local_value(Addr::new(0, 1)), Some(0));
    assert_eq!(c.nodes[1].local_value(Addr::new(1, 1)), Some(21));
    assert!(c.sius[2].stats().absent_replies >= 1);
    // A read sent to the absent host is refused, not left waiting.
    c.nodes[0] = Cluster::node(0, &c.topo, &Arc::new(map("0 2\n1 0 1\n", 3)));
    let mut iso = c.nodes[0].isochron();
    let r = iso.read(Addr::new(0, 0), Width::W64).unwrap();
    iso.end().unwrap();
    c.run_until(|c| c.nodes[0].read_settled(r));
    assert_eq!(
        c.nodes[0].take_read(r),
        Err(SmmError::ReadRefused { host: 2 })
    );
}

#[test]
fn applications_joining_together_agree_on_who_starts_each_page() {
    // Every application of a cluster attaches at once (a rerun against running daemons):
    // the earliest admission of each page starts it empty; every later one gets its image.
    let mut c = Cluster::new(4, 2, map("0 0 1\n1 1 2\n2 2 3\n3 3 0\n4 0 1 2 3\n", 4));
    for h in 0..4 {
        c.detach(h);
    }
    for h in 0..4 {
        c.attach_and_join(h);
    }
    c.run_until(|c| {
        c.nodes
            .iter()
            .all(|n| n.join_status() == JoinStatus::Current)
    });
    for page in 0..5 {
        let holders = c.holders(page);
        let empty = holders
            .iter()
            .filter(|&&h| {
                c.nodes[h]
                    .join_report()
                    .unwrap()
                    .pages_started_empty
                    .contains(&page)
            })
            .count();
        assert_eq!(empty, 1, "page {page}: exactly one holder starts it");
    }
    for h in 0..4 {
        write_all(&mut c, h, 4, 10 * h as u64);
        write_all(&mut c, h, h as u32, 100 + h as u64);
    }
    c.quiesce();
    for page in 0..5u32 {
        let holders = c.holders(page);
        for w in holders.windows(2) {
            for slot in 0..4 {
                let a = Addr::new(page, slot);
                assert_eq!(
                    c.nodes[w[0]].local_value(a),
                    c.nodes[w[1]].local_value(a),
                    "{a}"
                );
            }
        }
    }
    assert!(oracle::check(&c.records()).clean());
}

/// `apply` function 1 of the read-modify-write tests (registered on every host).
fn triple_plus(old: u64, arg: u64) -> u64 {
    old.wrapping_mul(3).wrapping_add(arg)
}

fn rmw_functions() -> crate::RmwFunctions {
    let mut f = crate::RmwFunctions::default();
    f.register(1, triple_plus);
    f
}

#[test]
fn read_modify_writes_run_at_every_copy_and_answer_the_old_value() {
    let mut c = Cluster::new(3, 1, map("0 0 1 2\n", 3));
    for n in &mut c.nodes {
        assert!(n.register_rmw(1, triple_plus));
    }
    let a = Addr::new(0, 2);
    let mut answers = Vec::new();
    for h in [2, 0, 1, 2] {
        let mut iso = c.nodes[h].isochron();
        answers.push((h, iso.add(a, Width::W32, 5).unwrap()));
        iso.end().unwrap();
    }
    c.quiesce();
    let mut found: Vec<u64> = answers
        .iter()
        .map(|&(h, r)| c.nodes[h].take_read(r).unwrap().unwrap())
        .collect();
    found.sort_unstable();
    assert_eq!(found, vec![0, 5, 10, 15], "each add saw the one before");
    // Compare-and-swap: only the one expecting the current value swaps.
    let mut iso = c.nodes[1].isochron();
    let miss = iso.compare_and_swap(a, Width::W32, 19, 100).unwrap();
    let hit = iso.compare_and_swap(a, Width::W32, 20, 7).unwrap();
    let applied = iso.apply(a, Width::W32, 1, 1).unwrap();
    // 32-bit wrap.
    let wrap = iso.add(a, Width::W32, u64::from(u32::MAX)).unwrap();
    iso.end().unwrap();
    c.quiesce();
    assert_eq!(c.nodes[1].take_read(miss), Ok(Some(20)));
    assert_eq!(c.nodes[1].take_read(hit), Ok(Some(20)));
    assert_eq!(c.nodes[1].take_read(applied), Ok(Some(7)));
    assert_eq!(c.nodes[1].take_read(wrap), Ok(Some(22)));
    for h in 0..3 {
        assert_eq!(c.nodes[h].local_value(a), Some(21), "host {h}'s copy");
    }
    let (rep, notes) = oracle::check_with_functions(&c.records(), 4, &rmw_functions());
    assert!(rep.clean() && rep.reads_checked == 8, "{rep:?} {notes:?}");
    // Without the function, the oracle cannot replay `apply`: what follows is unexplained.
    let (rep, _) = oracle::check_with_functions(&c.records(), 0, &crate::RmwFunctions::default());
    assert!(!rep.clean(), "{rep:?}");
    // An unregistered function is refused at the issuer.
    let mut iso = c.nodes[0].isochron();
    assert_eq!(
        iso.apply(a, Width::W32, 9, 0),
        Err(SmmError::UnknownRmwFunction(9))
    );
    assert_eq!(
        iso.add(a, Width::W32, 1 << 32),
        Err(SmmError::ValueTooWide {
            value: 1 << 32,
            bits: 32
        })
    );
}

#[test]
fn a_read_modify_write_of_a_scheduled_variable_waits_for_the_assign() {
    let mut c = Cluster::new(3, 1, map("0 0 1 2\n", 3));
    let a = Addr::new(0, 1);
    let mut iso = c.nodes[1].isochron();
    iso.sched(a).unwrap();
    iso.end().unwrap();
    c.quiesce();
    // Host 2 adds, then reads in a later isochron: both wait for host 1's assign.
    let mut iso = c.nodes[2].isochron();
    let added = iso.add(a, Width::W64, 3).unwrap();
    iso.end().unwrap();
    let mut iso = c.nodes[2].isochron();
    let read = iso.read(a, Width::W64).unwrap();
    iso.end().unwrap();
    c.run_until(|c| c.nodes[2].hit.is_empty());
    assert_eq!(c.nodes[2].read_value(added), None);
    let mut iso = c.nodes[1].isochron();
    iso.assign(a, Width::W64, 10).unwrap();
    iso.end().unwrap();
    c.quiesce();
    assert_eq!(c.nodes[2].take_read(added), Ok(Some(10)));
    assert_eq!(
        c.nodes[2].take_read(read),
        Ok(Some(13)),
        "the read sees the add"
    );
    for h in 0..3 {
        assert_eq!(c.nodes[h].local_value(a), Some(13), "host {h}'s copy");
    }
    let rep = oracle::check(&c.records());
    assert!(rep.clean(), "{rep:?}");
}

#[test]
fn a_waiting_read_modify_write_travels_in_a_joiners_image() {
    let mut c = Cluster::new(3, 1, map("0 0 1 2\n", 3));
    let a = Addr::new(0, 0);
    let mut iso = c.nodes[2].isochron();
    iso.sched(a).unwrap();
    iso.end().unwrap();
    c.quiesce();
    let mut iso = c.nodes[0].isochron();
    let added = iso.add(a, Width::W64, 4).unwrap();
    iso.end().unwrap();
    c.run_until(|c| c.nodes[0].hit.is_empty());
    c.detach(1);
    c.attach_and_join(1);
    c.run_until(|c| c.nodes[1].join_status() == JoinStatus::Current);
    let mut iso = c.nodes[2].isochron();
    iso.assign(a, Width::W64, 10).unwrap();
    iso.end().unwrap();
    c.quiesce();
    assert_eq!(c.nodes[0].take_read(added), Ok(Some(10)));
    for h in 0..3 {
        assert_eq!(c.nodes[h].local_value(a), Some(14), "host {h}'s copy");
    }
}

#[test]
fn an_absent_answering_copy_refuses_and_the_others_still_run_it() {
    // Page 0 at hosts 1 and 2: host 1, the nearest, answers host 0's add.
    let mut c = Cluster::new(3, 1, map("0 1 2\n", 3));
    let a = Addr::new(0, 0);
    c.detach(1);
    let mut iso = c.nodes[0].isochron();
    let added = iso.add(a, Width::W64, 6).unwrap();
    iso.end().unwrap();
    c.run_until(|c| c.nodes[0].read_settled(added) && c.nodes[2].local_value(a) == Some(6));
    assert!(matches!(
        c.nodes[0].take_read(added),
        Err(SmmError::ReadRefused { host: 1, .. })
    ));
    assert_eq!(c.nodes[2].local_value(a), Some(6));
    let rep = oracle::check(&c.records());
    assert!(rep.clean(), "{rep:?}");
}

#[test]
fn a_replacing_application_draws_join_ids_where_no_earlier_answer_lands() {
    let c = Cluster::new(3, 1, map("0 0 1 2\n", 3));
    let mut n = Cluster::node(1, &c.topo, &c.nodes[1].cfg.map);
    n.start_read_ids_at(5000);
    n.join().unwrap();
    let mut join_ids = Vec::new();
    while let Some(b) = n.poll_siu() {
        if let Ok(packet::Packet::IsotachMessage(m)) = packet::Packet::decode(&b)
            && let Sref::Mem {
                op: SrefOp::Copy,
                ref_id,
                ..
            } = m.sref
        {
            join_ids.push(ref_id);
        }
    }
    // Page 0's other holders (hosts 0 and 2) are asked under a join id past 5000, so a late
    // image for the previous application's join (ids from 1) is not taken as this one's.
    assert_eq!(join_ids, vec![5001, 5001]);
}
