//! The embedded cluster on loopback: what only a real embedded SIU shows.

use super::{SiuPlacement, start_loopback_cluster_with};
use crate::bench_cmd::isochrons::{Driver, drive};
use isotach_am::backend::udp::UdpTransport;
use isotach_daemon::embedded::EmbeddedSiu;
use isotach_proto::config::Timing;
use isotach_proto::packet::Width;
use isotach_proto::packet::{EndOfIsochron, Packet, PlainMessage, StartOfIsochron};
use isotach_smm::driver::SiuLink;
use isotach_smm::{Addr, AmLink, ReadHandle, Smm, SmmConfig, SmmLimits, SmmNode};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How long the test waits for logical time to start and for each isochron.
const WAIT_MAX: Duration = Duration::from_secs(20);

/// An isochron without messages (it still gets a marker, so its pulse is significant).
fn offer_isochron(siu: &mut EmbeddedSiu<UdpTransport>, iso_id: u32) {
    let soi = StartOfIsochron {
        iso_id,
        distance: 1,
        ..StartOfIsochron::default()
    };
    siu.offer(Packet::StartOfIsochron(soi).to_vec()).unwrap();
    siu.offer(Packet::EndOfIsochron(EndOfIsochron { iso_id }).to_vec())
        .unwrap();
}

/// Runs passes until the host takes the EOP of the pulse the isochron's marker names;
/// returns that pulse. Nothing runs between the pass that hands over the EOP and the return.
fn until_executed(siu: &mut EmbeddedSiu<UdpTransport>, iso_id: u32) -> u64 {
    let deadline = Instant::now() + WAIT_MAX;
    let mut ts = None;
    while Instant::now() < deadline {
        siu.pass().unwrap();
        while let Some(p) = siu.take_for_host() {
            match (Packet::decode(&p).unwrap(), ts) {
                (Packet::IsochronMarker(m), None) if m.iso_id == iso_id => ts = Some(m.ts.get()),
                (Packet::EopMarker(e), Some(t)) if e.ts.get() == t => return t,
                _ => {}
            }
        }
        siu.wait(siu.now().plus(Duration::from_millis(1))).unwrap();
    }
    panic!("isochron {iso_id} did not execute within {WAIT_MAX:?} (marker pulse {ts:?})");
}

/// Does the SIU hold its token for the application's turn?
fn turn_pending(siu: &EmbeddedSiu<UdpTransport>) -> bool {
    siu.pump().role().siu().host_turn_pending()
}

/// Runs isochron 1 to the EOP of its pulse and returns that pulse; the SIU then holds its
/// token for the application's turn.
fn in_the_turn_after_isochron_1(siu: &mut EmbeddedSiu<UdpTransport>) -> u64 {
    offer_isochron(siu, 1);
    let first = until_executed(siu, 1);
    assert!(turn_pending(siu));
    first
}

/// Runs isochron 2, offered in the turn after isochron 1 (pulse `first`), to its end, stops
/// the pair, and checks it was stamped in that turn: a pulse sooner than after the token.
fn answered_in_the_turn(mut pair: Pair, first: u64) {
    let second = until_executed(&mut pair.me, 2);
    pair.stop();
    assert_eq!(second, first + 2, "answered in the turn");
}

/// Two hosts with embedded SIUs on loopback, logical time started: host 0's SIU for the
/// test to drive, host 1's running on a thread of its own until [`Pair::stop`].
struct Pair {
    lc: super::LoopbackCluster,
    me: EmbeddedSiu<UdpTransport>,
    stop: Arc<AtomicBool>,
    other: std::thread::JoinHandle<()>,
    /// Packets host 1's application offers its SIU.
    to_other: std::sync::mpsc::Sender<Vec<u8>>,
}

impl Pair {
    fn start() -> Self {
        let timing = Timing {
            idle_pace_us: 0,
            ..Timing::default()
        };
        let spin = isotach_am::backend::spin::SPIN_DEFAULT;
        let mut lc = start_loopback_cluster_with(2, SiuPlacement::Embedded, timing, spin).unwrap();
        let mut other = lc.embedded.pop().expect("host 1's SIU");
        let mut me = lc.embedded.pop().expect("host 0's SIU");
        let stop = Arc::new(AtomicBool::new(false));
        let other_stop = Arc::clone(&stop);
        let (to_other, other_app) = std::sync::mpsc::channel::<Vec<u8>>();
        let other = std::thread::spawn(move || {
            while !other_stop.load(Ordering::Relaxed) {
                while let Ok(p) = other_app.try_recv() {
                    other.offer(p).unwrap();
                }
                other.pass().unwrap();
                while other.take_for_host().is_some() {}
                let _ = other.wait(other.now().plus(Duration::from_millis(1)));
            }
        });
        let started = Instant::now();
        while !me.pump().role().siu().started() {
            assert!(started.elapsed() < WAIT_MAX, "logical time did not start");
            me.pass().unwrap();
            me.wait(me.now().plus(Duration::from_millis(1))).unwrap();
        }
        Self {
            lc,
            me,
            stop,
            other,
            to_other,
        }
    }

    fn stop(self) -> EmbeddedSiu<UdpTransport> {
        self.stop.store(true, Ordering::Relaxed);
        self.other.join().unwrap();
        let problems = self.lc.daemons.stop();
        assert!(problems.is_empty(), "{problems:?}");
        self.me
    }
}

#[test]
fn an_embedded_host_answering_an_eop_in_its_turn_runs_its_next_isochron_a_pulse_sooner() {
    let mut pair = Pair::start();
    let me = &mut pair.me;
    let first = in_the_turn_after_isochron_1(me);
    // Answered within the turn: stamped against the sendclock of the pulse that just ended
    // (first + 1), so TS = first + 2. Sent only after the token, it would be first + 3.
    offer_isochron(me, 2);
    let second = until_executed(me, 2);
    // An application that waits instead has had its turn: the wait sends the token first,
    // so logical time goes on and an isochron issued after the wait is a pulse later.
    offer_isochron(me, 3);
    let third = until_executed(me, 3);
    assert!(turn_pending(me));
    me.wait(me.now().plus(Duration::from_millis(1))).unwrap();
    assert!(!turn_pending(me));
    offer_isochron(me, 4);
    let fourth = until_executed(me, 4);
    let me = pair.stop();
    assert_eq!(second, first + 2);
    assert_eq!(third, second + 2);
    // At least a pulse later (logical time may go on further while the application waits).
    assert!(fourth >= third + 3, "{third} {fourth}");
    assert!(me.pump().role().siu().stats().tokens_held_for_host >= 1);
}

#[test]
fn a_pass_right_after_one_that_found_the_socket_empty_is_skipped_until_something_happens() {
    let mut pair = Pair::start();
    let me = &mut pair.me;
    // A pass that finds nothing (retried: host 1 and the TM keep sending).
    let deadline = Instant::now() + WAIT_MAX;
    while me.pass().unwrap() > 0 {
        assert!(Instant::now() < deadline, "the socket never went quiet");
    }
    let calls = me.transport().udp_stats().recv_calls;
    assert_eq!(me.pass_if_due().unwrap(), 0);
    assert_eq!(
        me.transport().udp_stats().recv_calls,
        calls,
        "no second probe of a socket just found empty"
    );
    // An application that only polls (no wait to follow) still reads the socket.
    SiuLink::recv(me, Duration::ZERO).unwrap();
    assert!(
        me.transport().udp_stats().recv_calls > calls,
        "a poll must read the socket"
    );
    let calls = me.transport().udp_stats().recv_calls;
    // Offering a packet makes a pass due again.
    offer_isochron(me, 9);
    me.pass_if_due().unwrap();
    assert!(me.transport().udp_stats().recv_calls > calls);
    until_executed(me, 9);
    pair.stop();
}

#[test]
fn the_pass_that_ends_a_turn_sends_the_answer_and_the_token_without_reading_the_socket() {
    let mut pair = Pair::start();
    let me = &mut pair.me;
    let first = in_the_turn_after_isochron_1(me);
    let before = me.transport().udp_stats();
    offer_isochron(me, 2);
    assert_eq!(
        me.pass().unwrap(),
        0,
        "nothing taken: the socket is not read"
    );
    let after = me.transport().udp_stats();
    assert!(!turn_pending(me));
    assert!(
        after.send_calls > before.send_calls,
        "the answer and the token went out"
    );
    assert_eq!(after.recv_calls, before.recv_calls, "{before:?} {after:?}");
    // A wait comes next: the pass before it is not due (the wait reads the socket).
    assert_eq!(me.pass_if_due().unwrap(), 0);
    assert_eq!(me.transport().udp_stats().recv_calls, before.recv_calls);
    answered_in_the_turn(pair, first);
}

#[test]
fn a_flush_in_the_turn_sends_nothing_so_what_the_application_issues_leaves_with_the_token() {
    let mut pair = Pair::start();
    let me = &mut pair.me;
    let first = in_the_turn_after_isochron_1(me);
    let before = me.transport().udp_stats();
    // The SMM flushes after every packet it hands the link; within the turn that sends
    // nothing and keeps the token.
    offer_isochron(me, 2);
    SiuLink::flush(me).unwrap();
    assert!(turn_pending(me), "the turn goes on");
    assert_eq!(me.transport().udp_stats().send_calls, before.send_calls);
    // The application waits: one pass sends the isochron and the token together.
    me.wait(me.now().plus(Duration::from_millis(1))).unwrap();
    assert!(!turn_pending(me));
    assert_eq!(
        me.transport().udp_stats().send_calls,
        before.send_calls + 1,
        "one datagram to the token manager"
    );
    answered_in_the_turn(pair, first);
}

/// Host 1 sends host 0's application a plain packet (a reply); host 0's passes run until its
/// application has it. Whether the token after it had come by then.
fn a_reply_from_host_1(pair: &mut Pair) -> bool {
    let reply = PlainMessage {
        source: 1,
        dest: 0,
        payload: vec![7; 12],
    };
    pair.to_other.send(Packet::Plain(reply).to_vec()).unwrap();
    let me = &mut pair.me;
    let deadline = Instant::now() + WAIT_MAX;
    loop {
        assert!(Instant::now() < deadline, "the reply never arrived");
        me.pass().unwrap();
        let mut got = false;
        while let Some(p) = me.take_for_host() {
            got |= matches!(Packet::decode(&p).unwrap(), Packet::Plain(_));
        }
        if got {
            return turn_pending(me);
        }
        me.wait(me.now().plus(Duration::from_millis(1))).unwrap();
    }
}

#[test]
fn what_an_application_issues_after_a_reply_waits_for_the_turn_the_reply_makes() {
    let mut pair = Pair::start();
    let deadline = Instant::now() + WAIT_MAX;
    // The reply must come between two tokens (not in the pass that brings the next one).
    while a_reply_from_host_1(&mut pair) {
        assert!(
            Instant::now() < deadline,
            "no reply came between two tokens"
        );
        while turn_pending(&pair.me) {
            pair.me.pass().unwrap();
        }
    }
    let me = &mut pair.me;
    assert!(me.pump().role().siu().host_turn_coming());
    let stats = |me: &EmbeddedSiu<UdpTransport>| me.pump().role().siu().stats();
    let before = stats(me);
    // The application answers the reply at once; a pass before the token may not stamp it.
    offer_isochron(me, 5);
    me.pass().unwrap();
    if !turn_pending(me) {
        assert_eq!(stats(me).isochrons, before.isochrons, "kept for the turn");
    }
    until_executed(me, 5);
    let after = stats(me);
    pair.stop();
    assert_eq!(after.isochrons, before.isochrons + 1);
    assert_eq!(
        after.isochrons_in_turn,
        before.isochrons_in_turn + 1,
        "stamped in the turn the reply made, with its token still held"
    );
    assert!(after.tokens_held_for_reply > before.tokens_held_for_reply);
}

/// Host 0's isochron for the polling test: reads its own copy of page 0 and writes page 0
/// (copies at both hosts), so it goes through the SIU and executes at its pulse's EOP.
fn read_and_write(smm: &mut Smm<AmLink>, value: u64) -> ReadHandle {
    let mut iso = smm.node().isochron();
    let read = iso.read(Addr::new(0, 0), Width::W64).unwrap();
    iso.write(Addr::new(0, 1), Width::W64, value).unwrap();
    iso.end().unwrap();
    read
}

/// The polling test's SIU.
fn embedded(smm: &Smm<AmLink>) -> &EmbeddedSiu<UdpTransport> {
    match smm.link() {
        AmLink::EmbeddedUdp(me) => me,
        _ => unreachable!("built embedded"),
    }
}

/// Polls until `read` resolved, as `bench isochrons --driver poll` does.
fn poll_until_read(smm: &mut Smm<AmLink>, read: ReadHandle) {
    let deadline = Instant::now() + WAIT_MAX;
    drive(smm, Driver::Poll, deadline, |n| {
        n.read_value(read).is_some()
    })
    .unwrap();
}

#[test]
fn an_application_that_polls_answers_each_eop_in_the_turn_it_makes() {
    let Pair {
        lc,
        me,
        stop,
        other,
        to_other,
    } = Pair::start();
    let node = SmmNode::new(SmmConfig {
        host: 0,
        topology: Arc::new(lc.cluster.topology.clone()),
        map: Arc::new(crate::philo_app::forks_map(2)),
        limits: SmmLimits::default(),
        record: false,
    });
    // The link `Smm::connect` gives an application whose config embeds its SIU.
    let mut smm = Smm::new(node, AmLink::EmbeddedUdp(Box::new(me)));
    let stats = |smm: &Smm<AmLink>| embedded(smm).pump().role().siu().stats();
    let answers = 8;
    let mut read = read_and_write(&mut smm, 0);
    let before = stats(&smm);
    for value in 1..=answers {
        // The poll that hands over the EOP leaves the turn open; the answer issued now is
        // stamped in it when the next poll ends the turn.
        poll_until_read(&mut smm, read);
        assert!(turn_pending(embedded(&smm)));
        read = read_and_write(&mut smm, value);
    }
    poll_until_read(&mut smm, read);
    let after = stats(&smm);
    let (_, AmLink::EmbeddedUdp(me)) = smm.into_parts() else {
        unreachable!("built embedded")
    };
    let me = *me;
    Pair {
        lc,
        me,
        stop,
        other,
        to_other,
    }
    .stop();
    assert_eq!(after.isochrons, before.isochrons + answers + 1, "{after:?}");
    assert!(
        after.isochrons_in_turn >= before.isochrons_in_turn + answers,
        "every answer stamped in the turn its EOP made: {before:?} {after:?}"
    );
    // So each isochron took two pulses (TS = the last one's + 2), not four.
    assert!(
        after.tokens_sent - before.tokens_sent <= 2 * (answers + 1) + 1,
        "{before:?} {after:?}"
    );
}
