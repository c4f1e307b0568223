//! Idle pacing at the SIU: its tokens say BUSY while it has work that needs logical time, and
//! an SIU whose last token went out idle sends one wake-up (that token again, repeat and BUSY)
//! when its host sends isotach traffic.

mod common;

use common::{isochron, restart_token, tm_token};
use isotach_proto::packet::{BarrierSignalMarker, IsotachMessage, Packet, Sref, Token};
use isotach_proto::{Generation, Pulse};
use isotach_siu::{Mode, Siu};

fn siu(idle_pace_us: u64) -> Siu {
    common::siu(Mode::Siu, idle_pace_us, false)
}

fn bytes(p: Packet) -> Vec<u8> {
    p.to_vec()
}

/// The tokens the SIU sent since the last call: (seq, repeat, busy).
fn sent_tokens(s: &mut Siu) -> Vec<(u8, bool, bool)> {
    std::iter::from_fn(|| s.poll_net())
        .filter_map(|t| match Packet::decode(&t.bytes).unwrap() {
            Packet::Token(t) => Some((t.seq.bits(), t.repeat, t.busy)),
            _ => None,
        })
        .collect()
}

/// Started by the TM's restart and its wave 1; token 2 went out idle.
fn started(idle_pace_us: u64) -> Siu {
    let mut s = siu(idle_pace_us);
    s.handle_net(0, &restart_token(1)).unwrap();
    s.handle_net(1, &tm_token(1)).unwrap();
    assert_eq!(
        sent_tokens(&mut s),
        vec![(1, false, false), (2, false, false)]
    );
    while s.poll_host().is_some() {}
    s
}

#[test]
fn tokens_say_busy_while_an_isochron_is_pending_and_one_wake_up_asks_for_speed() {
    let mut s = started(1_000);
    assert!(!s.busy());
    isochron(&mut s, 2, 7);
    // Stamped TS = sendclock 2 + distance 1 = 3: pending until token 4 ends pulse 3.
    assert_eq!(s.outstanding_isochrons(), 1);
    assert!(s.busy());
    // The wake-up: token 2 again, repeat and BUSY (before the isochron's message is fine:
    // it is a duplicate at the TM).
    assert_eq!(sent_tokens(&mut s), vec![(2, true, true)]);
    // A second isochron in the same pulse asks for nothing more.
    isochron(&mut s, 2, 8);
    assert_eq!(sent_tokens(&mut s), vec![]);
    assert_eq!(s.stats().tokens_wake, 1);
    // Tokens 3 and 4 say BUSY (pulse 3 has not ended); after token 4 ended it, 5 is idle.
    s.handle_net(3, &tm_token(2)).unwrap();
    assert_eq!(sent_tokens(&mut s), vec![(3, false, true)]);
    s.handle_net(4, &tm_token(3)).unwrap();
    assert_eq!(sent_tokens(&mut s), vec![(0, false, true)]);
    s.handle_net(5, &tm_token(4)).unwrap();
    assert_eq!(s.outstanding_isochrons(), 0);
    assert!(!s.busy());
    assert_eq!(sent_tokens(&mut s), vec![(1, false, false)]);
    assert_eq!(s.stats().tokens_busy, 2);
    // Idle again: the next isochron wakes the TM again, once.
    isochron(&mut s, 2, 9);
    assert_eq!(sent_tokens(&mut s), vec![(1, true, true)]);
    assert_eq!(s.stats().tokens_wake, 2);
}

#[test]
fn a_message_bucketed_ahead_and_a_barrier_keep_tokens_busy() {
    let mut s = started(1_000);
    // A message from host 0 for pulse 3 arrives early.
    let m = IsotachMessage {
        ts: Pulse::new(3),
        source: 0,
        dest: 1,
        sequum: 0,
        generation: Generation::new(1),
        sref: Sref::Msg {
            handler: 0,
            payload: vec![],
        },
    };
    s.handle_net(2, &bytes(Packet::IsotachMessage(m))).unwrap();
    assert!(s.busy(), "packets handed to the host for a pulse not ended");
    assert_eq!(
        sent_tokens(&mut s),
        vec![],
        "no wake-up for network traffic"
    );
    s.handle_net(3, &tm_token(2)).unwrap();
    assert_eq!(sent_tokens(&mut s), vec![(3, false, true)]);
    s.handle_net(4, &tm_token(3)).unwrap();
    s.handle_net(5, &tm_token(4)).unwrap();
    assert!(!s.busy(), "pulse 3 ended");
    // A barrier keeps the SIU busy until it completes.
    let bsm = BarrierSignalMarker {
        barrier: 1,
        barrier_count: 1,
        ..BarrierSignalMarker::default()
    };
    s.handle_host(6, &bytes(Packet::BarrierSignalMarker(bsm)))
        .unwrap();
    assert!(s.busy());
    sent_tokens(&mut s);
    for wave in 5..8 {
        s.handle_net(7, &tm_token(wave)).unwrap();
        assert!(s.busy(), "no round came back");
        assert!(sent_tokens(&mut s).iter().all(|&(_, _, busy)| busy));
    }
    let round = Token {
        barrier: 1,
        ..Token::decode(&tm_token(8)).unwrap()
    };
    s.handle_net(8, &round.to_bytes()).unwrap();
    assert_eq!(s.stats().barriers_completed, 1);
    assert!(!s.busy());
}

#[test]
fn without_pacing_no_token_says_busy_and_nothing_wakes() {
    let mut s = started(0);
    isochron(&mut s, 2, 1);
    assert_eq!(sent_tokens(&mut s), vec![]);
    s.handle_net(3, &tm_token(2)).unwrap();
    assert_eq!(sent_tokens(&mut s), vec![(3, false, false)]);
    assert_eq!((s.stats().tokens_busy, s.stats().tokens_wake), (0, 0));
}
