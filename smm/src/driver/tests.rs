use super::*;
use crate::{Addr, MemoryMap, SmmConfig, SmmLimits};
use isotach_proto::config::{Limits, Timing};
use isotach_proto::packet::{Packet, PlainMessage, Width};
use isotach_proto::topology::{Hop, Topology};
use isotach_proto::{Generation, Pulse};
use isotach_siu::{Siu, SiuConfig};
use isotach_tm::{TmConfig, TokenManager};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::thread::JoinHandle;

/// A one-host cluster (TM + SIU) on its own thread, reached over channels.
struct Cluster {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

struct ChannelLink {
    to_siu: Sender<Vec<u8>>,
    from_siu: Receiver<Vec<u8>>,
}

impl SiuLink for ChannelLink {
    fn send(&mut self, packet: Vec<u8>) -> Result<(), LinkError> {
        self.to_siu
            .send(packet)
            .map_err(|e| LinkError(e.to_string()))
    }
    fn recv(&mut self, timeout: Duration) -> Result<Option<Vec<u8>>, LinkError> {
        match self.from_siu.recv_timeout(timeout) {
            Ok(p) => Ok(Some(p)),
            Err(RecvTimeoutError::Timeout) => Ok(None),
            Err(e) => Err(LinkError(e.to_string())),
        }
    }
}

fn node(topo: &Arc<Topology>) -> SmmNode {
    let names = vec!["0".to_string()];
    SmmNode::new(SmmConfig {
        host: 0,
        topology: topo.clone(),
        map: Arc::new(MemoryMap::parse("0 0\n", "m", &names).unwrap()),
        limits: SmmLimits::default(),
        record: false,
    })
}

fn cluster(topo: &Arc<Topology>) -> (Cluster, ChannelLink) {
    let (to_siu, siu_in) = channel::<Vec<u8>>();
    let (siu_out, from_siu) = channel();
    let stop = Arc::new(AtomicBool::new(false));
    let timing = Timing::default();
    let mut tm = TokenManager::new(TmConfig {
        switch: 0,
        topology: topo.clone(),
        timing,
        limits: Limits::default(),
    });
    let mut siu = Siu::new(SiuConfig {
        host: 0,
        mode: isotach_siu::Mode::Siu,
        topology: topo.clone(),
        timing,
        limits: Limits::default(),
        initiates_reset: true,
        host_turns: false,
    });
    let link = tm.link_to(Hop::Host(0)).unwrap();
    let halt = stop.clone();
    let thread = std::thread::spawn(move || {
        siu.start(0);
        while !halt.load(Ordering::Relaxed) {
            while let Ok(p) = siu_in.try_recv() {
                siu.handle_host(0, &p).unwrap();
            }
            while let Some(t) = siu.poll_net() {
                tm.handle_input(0, link, &t.bytes).unwrap();
            }
            while let Some((_, b)) = tm.poll_transmit() {
                siu.handle_net(0, &b).unwrap();
            }
            while let Some(b) = siu.poll_host() {
                let _ = siu_out.send(b);
            }
            std::thread::yield_now();
        }
    });
    (
        Cluster {
            stop,
            thread: Some(thread),
        },
        ChannelLink { to_siu, from_siu },
    )
}

#[test]
fn blocking_wait_resolves_a_read_through_a_running_siu() {
    let topo = Arc::new(Topology::line(1, 1).unwrap());
    let (_cluster, link) = cluster(&topo);
    let mut smm = Smm::new(node(&topo), link);
    // Page 0 is local and nothing is outstanding: this one runs at once.
    let mut iso = smm.node().isochron();
    iso.write(Addr::new(0, 1), Width::W64, 77).unwrap();
    iso.end().unwrap();
    // A barrier round trip goes through logical time.
    smm.barrier(0, 1, Duration::from_secs(30)).unwrap();
    assert_eq!(smm.node().barriers_completed(0), 1);
    let mut iso = smm.node().isochron();
    let r = iso.read(Addr::new(0, 1), Width::W64).unwrap();
    iso.end().unwrap();
    assert_eq!(smm.wait(r, Duration::from_secs(30)), Ok(77));
    assert_eq!(smm.poll().map(|_| ()), Ok(()));
}

#[test]
fn wait_times_out_on_a_dead_link() {
    let topo = Arc::new(Topology::line(1, 1).unwrap());
    let (to_siu, _siu_in) = channel();
    let (_siu_out, from_siu) = channel();
    let mut smm = Smm::new(node(&topo), ChannelLink { to_siu, from_siu });
    assert_eq!(
        smm.barrier(0, 1, Duration::from_millis(20)),
        Err(WaitError::TimedOut(Duration::from_millis(20)))
    );
}

/// A link that hands out scripted packets and swallows what is sent.
struct Script(VecDeque<Vec<u8>>);

impl SiuLink for Script {
    fn send(&mut self, _: Vec<u8>) -> Result<(), LinkError> {
        Ok(())
    }
    fn recv(&mut self, _: Duration) -> Result<Option<Vec<u8>>, LinkError> {
        Ok(self.0.pop_front())
    }
}

/// A scripted link that hands over what it holds in batches, as a real link does.
struct BatchScript(VecDeque<Vec<u8>>);

impl SiuLink for BatchScript {
    fn send(&mut self, _: Vec<u8>) -> Result<(), LinkError> {
        Ok(())
    }
    fn recv(&mut self, _: Duration) -> Result<Option<Vec<u8>>, LinkError> {
        Ok(self.0.pop_front())
    }
    fn try_recv(&mut self) -> Option<Vec<u8>> {
        self.0.pop_front()
    }
}

#[test]
fn a_wait_checks_its_condition_once_per_batch_not_per_packet() {
    let topo = Arc::new(Topology::line(1, 1).unwrap());
    let script: VecDeque<Vec<u8>> = (1..=40)
        .flat_map(|ts| [write_at(ts, 1), eop(ts, 1)])
        .collect();
    let mut smm = Smm::new(node(&topo), BatchScript(script));
    let mut checks = 0;
    smm.wait_until(Duration::from_secs(5), |n| {
        checks += 1;
        n.stats().pulses_drained == 40
    })
    .unwrap();
    // Once before the first receive, once after the batch.
    assert_eq!(checks, 2);
    assert_eq!(smm.node().local_value(Addr::new(0, 1)), Some(40));
}

#[test]
fn a_batch_stops_at_held_input_and_loses_nothing() {
    let topo = Arc::new(Topology::line(1, 1).unwrap());
    let mut cfg = node(&topo).config().clone();
    cfg.limits.bucket_packets_max = 1;
    let n = SmmNode::new(cfg);
    let script = [write_at(5, 1), write_at(6, 2), eop(5, 1), eop(6, 1)];
    let mut smm = Smm::new(n, BatchScript(script.into_iter().collect()));
    smm.wait_until(Duration::from_secs(5), |n| n.stats().pulses_drained == 2)
        .unwrap();
    let s = smm.node().stats();
    assert!(s.refused >= 1, "{s:?}");
    assert_eq!(smm.node().local_value(Addr::new(0, 1)), Some(5));
    assert_eq!(smm.node().local_value(Addr::new(0, 2)), Some(6));
    assert_eq!(s.count_mismatches + s.bad_input, 0, "{s:?}");
}

fn write_at(ts: u64, slot: u32) -> Vec<u8> {
    let m = IsotachMessage {
        ts: Pulse::new(ts),
        source: 0,
        dest: 0,
        sequum: ts,
        generation: Generation::new(1),
        sref: packet::Sref::Mem {
            op: packet::SrefOp::Write,
            width: Width::W64,
            addr: Addr::new(0, slot).raw(),
            value: ts,
            ref_id: 0,
        },
    };
    let mut b = Vec::new();
    m.encode(&mut b);
    b
}

fn eop(ts: u64, count: u32) -> Vec<u8> {
    let e = EopMarker {
        ts: Pulse::new(ts),
        count,
        sort_vector: (0..count as u8).collect(),
        ..Default::default()
    };
    let mut b = Vec::new();
    e.encode(&mut b);
    b
}

#[test]
fn a_packet_refused_for_the_bucket_limit_is_held_and_nothing_is_lost() {
    let topo = Arc::new(Topology::line(1, 1).unwrap());
    let mut cfg = node(&topo).config().clone();
    cfg.limits.bucket_packets_max = 1;
    let n = SmmNode::new(cfg);
    // Pulse 6's write is refused while pulse 5's fills the buckets; pulse 5's EOP passes
    // it, drains, and the held write goes in before pulse 6's EOP.
    let script = [write_at(5, 1), write_at(6, 2), eop(5, 1), eop(6, 1)];
    let mut smm = Smm::new(n, Script(script.into_iter().collect()));
    smm.poll().unwrap();
    let s = smm.node().stats();
    assert!(s.refused >= 1, "{s:?}");
    assert_eq!((s.srefs_executed, s.pulses_drained), (2, 2), "{s:?}");
    assert_eq!(smm.node().local_value(Addr::new(0, 1)), Some(5));
    assert_eq!(smm.node().local_value(Addr::new(0, 2)), Some(6));
    assert_eq!(s.count_mismatches + s.bad_input, 0, "{s:?}");
}

#[test]
fn a_restart_of_logical_time_reaches_every_later_wait() {
    let topo = Arc::new(Topology::line(1, 1).unwrap());
    let script = [write_at(5, 1), eop(5, 1), write_at(2, 1)];
    let mut smm = Smm::new(node(&topo), Script(script.into_iter().collect()));
    let restarted = |e: &WaitError| matches!(e, WaitError::Smm(SmmError::Restarted { .. }));
    let e = smm.poll().unwrap_err();
    assert!(restarted(&e), "{e}");
    let e = smm.barrier(0, 1, Duration::from_secs(5)).unwrap_err();
    assert!(restarted(&e), "{e}");
    assert!(smm.fatal().is_some());
}

#[test]
fn a_restart_during_the_start_barrier_is_fatal() {
    let topo = Arc::new(Topology::line(1, 1).unwrap());
    let mut reset = Vec::new();
    EopMarker {
        ts: Pulse::new(3),
        reset: true,
        ..Default::default()
    }
    .encode(&mut reset);
    let mut smm = Smm::new(node(&topo), Script([reset].into_iter().collect()));
    // The barrier's marker went with the old generation: it would never complete.
    let e = smm.barrier(0, 1, Duration::from_secs(5)).unwrap_err();
    let restarted = SmmError::Restarted { ts: 0, drained: 3 };
    assert_eq!(e, WaitError::Smm(restarted.clone()));
    assert_eq!(smm.fatal(), Some(&restarted));
}

use crate::testkit::block_on;

#[test]
fn async_read_resolves_while_a_pump_moves_packets() {
    let topo = Arc::new(Topology::line(1, 1).unwrap());
    let (_cluster, mut link) = cluster(&topo);
    let smm = SharedSmm::new(node(&topo));
    // The barrier needs the pump to reach the SIU and back; the local read resolves at once.
    let r = smm.with(|n| {
        n.barrier_start(1, 1).unwrap();
        let mut iso = n.isochron();
        iso.write(Addr::new(0, 2), Width::W32, 5).unwrap();
        let r = iso.read(Addr::new(0, 2), Width::W32).unwrap();
        iso.end().unwrap();
        r
    });
    let pump_smm = smm.clone();
    let done = Arc::new(AtomicBool::new(false));
    let pump_done = done.clone();
    let pump = std::thread::spawn(move || {
        while !pump_done.load(Ordering::Relaxed) {
            while let Some(p) = pump_smm.poll_siu() {
                link.send(p).unwrap();
            }
            if let Some(p) = link.recv(Duration::from_millis(5)).unwrap() {
                let _ = pump_smm.handle_siu(&p);
            }
        }
    });
    assert_eq!(block_on(smm.read(r)), Ok(5));
    while !smm.with(|n| n.barrier_done(1)) {
        std::thread::sleep(Duration::from_millis(1));
    }
    done.store(true, Ordering::Relaxed);
    pump.join().unwrap();
    assert_eq!(block_on(smm.read(r)), Err(SmmError::UnknownRead));
}

#[test]
fn a_poll_stops_reading_when_the_held_input_is_full() {
    let topo = Arc::new(Topology::line(1, 1).unwrap());
    let mut cfg = node(&topo).config().clone();
    cfg.limits.bucket_packets_max = 1;
    // Pulse 5's second write is refused (its bucket is full and no EOP comes), so every
    // later packet for pulse 5 must wait behind it, until the held input is full.
    let extra = 50;
    let script: VecDeque<Vec<u8>> = (0..HELD_MAX + 2 + extra)
        .map(|i| write_at(5, 1 + (i % 8) as u32))
        .collect();
    let mut smm = Smm::new(SmmNode::new(cfg), BatchScript(script));
    let handled = smm.poll().unwrap();
    assert_eq!(handled, 1 + HELD_MAX, "one accepted, the rest held");
    assert_eq!(smm.held.queue.len(), HELD_MAX, "bounded");
    assert_eq!(smm.link.0.len(), extra + 1, "the rest stays in the link");
}

#[test]
fn the_held_input_knows_its_lowest_pulse_through_pushes_and_pops() {
    let mut held = HeldInput::default();
    let brute = |h: &HeldInput| h.queue.iter().filter_map(|p| HeldInput::pulse(p)).min();
    let mut rng = isotach_rng::Rng::stream(0x4e1d, 0);
    for step in 0..2_000 {
        match rng.below(4) {
            0 => held.push_front(write_at(1 + rng.below(20), 1)),
            1 => {
                let _ = held.pop_front();
            }
            // A packet with no pulse (a plain message) must not disturb the minimum.
            2 if rng.below(4) == 0 => held.push_front(
                Packet::Plain(PlainMessage {
                    source: 0,
                    dest: 0,
                    payload: vec![1],
                })
                .to_vec(),
            ),
            // Held when not below the lowest pulse, handed back otherwise.
            _ => {
                let _ = held.hold_if_behind(write_at(1 + rng.below(20), 1));
            }
        }
        assert_eq!(held.low(), brute(&held), "step {step}");
    }
}
