//! Host turns (`SiuConfig::host_turns`): with the host on the SIU's thread, the token a
//! significant pulse's end allows waits until the driver ends the host's turn, so an isochron
//! the host issues in answer to the EOP is stamped against the sendclock before that token.

mod common;

use common::{
    end_of_isochron, isochron, message_to_host_2, open_isochron, restart_token, start_of_isochron,
    tm_token,
};
use isotach_proto::packet::{IsotachMessage, Packet, Sref};
use isotach_proto::{Generation, Pulse};
use isotach_siu::{Mode, Siu};

fn siu(mode: Mode, host_turns: bool) -> Siu {
    common::siu(mode, 0, host_turns)
}

/// What the SIU sent the network since the last call: `Ok(seq)` for a normal token,
/// `Err(ts)` for a stamped message.
fn sent(s: &mut Siu) -> Vec<Result<u8, u64>> {
    std::iter::from_fn(|| s.poll_net())
        .filter_map(|t| match Packet::decode(&t.bytes).unwrap() {
            Packet::Token(t) if !t.repeat => Some(Ok(t.seq.bits())),
            Packet::IsotachMessage(m) => Some(Err(m.ts.get())),
            _ => None,
        })
        .collect()
}

/// Started by the TM's restart and its wave 1: tokens 1 and 2 went out.
fn started(host_turns: bool) -> Siu {
    let mut s = siu(Mode::Siu, host_turns);
    s.handle_net(0, &restart_token(1)).unwrap();
    s.handle_net(1, &tm_token(1)).unwrap();
    assert_eq!(sent(&mut s), vec![Ok(1), Ok(2)]);
    while s.poll_host().is_some() {}
    s
}

/// Runs isochron 7 (stamped 3) to the end of its pulse: tokens 2 and 3 end insignificant
/// pulses and are answered at once; token 4 ends pulse 3, whose EOP goes to the host.
/// Returns the tokens the SIU sent after token 4.
fn to_the_end_of_the_isochrons_pulse(s: &mut Siu) -> Vec<Result<u8, u64>> {
    isochron(s, 2, 7);
    assert_eq!(sent(s), vec![Err(3)], "TS = sendclock 2 + distance 1");
    s.handle_net(3, &tm_token(2)).unwrap();
    s.handle_net(4, &tm_token(3)).unwrap();
    assert_eq!(
        sent(s),
        vec![Ok(3), Ok(0)],
        "insignificant pulses hold nothing"
    );
    assert_eq!(
        s.poll_host().map(|p| Packet::decode(&p).unwrap().kind()),
        Some(isotach_proto::packet::Kind::IsochronMarker)
    );
    s.handle_net(5, &tm_token(4)).unwrap();
    let eop = s.poll_host().expect("pulse 3's EOP");
    assert!(matches!(
        Packet::decode(&eop).unwrap(),
        Packet::EopMarker(_)
    ));
    sent(s)
}

#[test]
fn the_isochron_a_host_answers_with_in_its_turn_is_stamped_a_pulse_sooner() {
    let mut s = started(true);
    assert_eq!(
        to_the_end_of_the_isochrons_pulse(&mut s),
        vec![],
        "token 5 waits"
    );
    assert_eq!(s.sendclock(), 4);
    assert!(
        s.host_turn_pending(),
        "the driver must end the turn before it sleeps"
    );
    // The host answers the EOP with its next isochron, stamped against sendclock 4.
    isochron(&mut s, 6, 8);
    assert_eq!(
        sent(&mut s),
        vec![Err(5)],
        "closing it does not end the turn"
    );
    s.end_host_turn(6);
    assert_eq!(sent(&mut s), vec![Ok(1)], "token 5 goes when the turn ends");
    assert!(!s.host_turn_pending());
    assert_eq!(s.stats().tokens_held_for_host, 1);
    assert_eq!(s.stats().tokens_held_for_reply, 0, "held for the EOP");
    assert_eq!(s.stats().isochrons_in_turn, 1);
    // A turn with nothing held does nothing.
    s.end_host_turn(7);
    assert_eq!(sent(&mut s), vec![]);
}

#[test]
fn without_host_turns_the_token_goes_at_once_and_the_answer_is_stamped_a_pulse_later() {
    let mut s = started(false);
    assert_eq!(to_the_end_of_the_isochrons_pulse(&mut s), vec![Ok(1)]);
    isochron(&mut s, 6, 8);
    assert_eq!(sent(&mut s), vec![Err(6)]);
    assert_eq!(s.stats().tokens_held_for_host, 0);
}

#[test]
fn an_isochron_left_open_at_the_end_of_the_turn_still_holds_the_token_by_requirement_26() {
    let mut s = started(true);
    to_the_end_of_the_isochrons_pulse(&mut s);
    open_isochron(&mut s, 6, 8);
    assert_eq!(sent(&mut s), vec![Err(5)]);
    s.end_host_turn(6);
    assert_eq!(
        sent(&mut s),
        vec![],
        "token 5 would pass TS 5 at distance 1"
    );
    s.handle_host(7, &end_of_isochron(8)).unwrap();
    assert_eq!(sent(&mut s), vec![Ok(1)]);
}

#[test]
fn a_restart_while_a_token_waits_for_the_host_sends_the_new_first_token_at_once() {
    let mut s = started(true);
    to_the_end_of_the_isochrons_pulse(&mut s);
    s.handle_net(6, &restart_token(2)).unwrap();
    let first: Vec<_> = std::iter::from_fn(|| s.poll_net())
        .filter_map(|t| match Packet::decode(&t.bytes).unwrap() {
            Packet::Token(t) => Some((t.generation.get(), t.seq.bits())),
            _ => None,
        })
        .collect();
    assert_eq!(first, vec![(2, 1)]);
    assert_eq!(
        s.poll_timeout(),
        Some(6 + 5_000),
        "only the token timer is armed"
    );
}

#[test]
fn host_mode_ignores_host_turns() {
    let mut s = siu(Mode::Host, true);
    s.handle_net(0, &restart_token(1)).unwrap();
    for wave in 1..4 {
        s.handle_net(wave, &tm_token(wave)).unwrap();
    }
    assert_eq!(s.stats().tokens_held_for_host, 0);
    assert!(!s.host_turn_pending());
}

// An in-process host lends its buffers: a stamped message leaves in the host's own buffer,
// a message for the host arrives in the network's, and a refused packet's buffer is left as
// it was.

#[test]
fn a_message_lent_by_the_host_is_stamped_in_its_own_buffer() {
    let mut s = started(true);
    s.handle_host(2, &start_of_isochron(1)).unwrap();
    let m = message_to_host_2();
    let mut buf = Packet::IsotachMessage(m.clone()).to_vec();
    let at = buf.as_ptr();
    s.handle_host_owned(2, &mut buf).unwrap();
    assert!(buf.is_empty(), "taken");
    let out = s.poll_net().expect("the stamped message");
    assert_eq!(out.bytes.as_ptr(), at, "stamped in place, not copied");
    let Packet::IsotachMessage(stamped) = Packet::decode(&out.bytes).unwrap() else {
        panic!("not a message");
    };
    assert_eq!(stamped.ts.get(), 3);
    // To a host that does not exist: refused, the buffer untouched.
    let bad = IsotachMessage { dest: 9, ..m };
    let mut buf = Packet::IsotachMessage(bad).to_vec();
    let before = buf.clone();
    assert!(s.handle_host_owned(2, &mut buf).is_err());
    assert_eq!(buf, before);
}

#[test]
fn a_message_for_the_host_is_handed_over_in_the_buffer_it_came_in() {
    let mut s = started(true);
    let m = IsotachMessage {
        ts: Pulse::new(2),
        source: 0,
        dest: 1,
        sequum: 5,
        generation: Generation::new(1),
        sref: Sref::Msg {
            handler: 0,
            payload: vec![7],
        },
    };
    let mut buf = Packet::IsotachMessage(m.clone()).to_vec();
    let (at, bytes) = (buf.as_ptr(), buf.clone());
    s.handle_net_owned(2, &mut buf).unwrap();
    assert!(buf.is_empty(), "taken");
    let got = s.poll_host().expect("the message");
    assert_eq!((got.as_ptr(), &got), (at, &bytes));
    // Misrouted: refused, the buffer untouched.
    let mut buf = Packet::IsotachMessage(IsotachMessage { dest: 2, ..m }).to_vec();
    let before = buf.clone();
    assert!(s.handle_net_owned(2, &mut buf).is_err());
    assert_eq!(buf, before);
}

/// A reply for host 0 (a plain packet from host 1), as the token manager forwards it.
fn reply_to_host_0() -> Vec<u8> {
    Packet::Plain(isotach_proto::packet::PlainMessage {
        source: 1,
        dest: 0,
        payload: vec![7; 12],
    })
    .to_vec()
}

/// Started, with waves 2 and 3 answered at once: tokens 3 and 4 went out.
fn two_insignificant_pulses_later(host_turns: bool) -> Siu {
    let mut s = started(host_turns);
    s.handle_net(2, &tm_token(2)).unwrap();
    s.handle_net(3, &tm_token(3)).unwrap();
    assert_eq!(sent(&mut s), vec![Ok(3), Ok(0)]);
    s
}

#[test]
fn a_reply_ahead_of_a_token_makes_the_host_s_turn_even_in_an_insignificant_pulse() {
    let mut s = two_insignificant_pulses_later(true);
    assert!(!s.host_turn_coming());
    // The reply rides just ahead of token 4, whose pulse holds nothing for this host.
    s.handle_net(4, &reply_to_host_0()).unwrap();
    assert!(
        s.host_turn_coming(),
        "the next token will wait for the host"
    );
    s.handle_net(4, &tm_token(4)).unwrap();
    assert_eq!(sent(&mut s), vec![], "token 5 waits for the host's answer");
    assert!(s.host_turn_pending());
    assert!(!s.host_turn_coming(), "the turn came");
    assert!(matches!(
        Packet::decode(&s.poll_host().expect("the reply")).unwrap(),
        Packet::Plain(_)
    ));
    assert!(
        s.poll_host().is_none(),
        "no EOP: the pulse was insignificant"
    );
    // The host answers the reply with its next isochron: stamped against sendclock 4.
    isochron(&mut s, 5, 8);
    assert_eq!(sent(&mut s), vec![Err(5)]);
    s.end_host_turn(6);
    assert_eq!(sent(&mut s), vec![Ok(1)]);
    assert_eq!(s.stats().tokens_held_for_host, 1);
    assert_eq!(s.stats().tokens_held_for_reply, 1);
    assert_eq!(s.stats().isochrons_in_turn, 1);
}

#[test]
fn a_reply_the_host_had_its_turn_at_holds_no_later_token() {
    let mut s = two_insignificant_pulses_later(true);
    s.handle_net(4, &reply_to_host_0()).unwrap();
    // The driver ended the host's turn after the reply, before the next token came.
    s.end_host_turn(5);
    assert!(!s.host_turn_coming(), "the reply was seen in that turn");
    s.handle_net(6, &tm_token(4)).unwrap();
    assert_eq!(sent(&mut s), vec![Ok(1)], "token 5 goes at once");
    assert!(!s.host_turn_pending());
    assert_eq!(s.stats().tokens_held_for_host, 0);
}

#[test]
fn without_host_turns_a_reply_holds_no_token() {
    let mut s = two_insignificant_pulses_later(false);
    s.handle_net(4, &reply_to_host_0()).unwrap();
    assert!(!s.host_turn_coming());
    s.handle_net(4, &tm_token(4)).unwrap();
    assert_eq!(sent(&mut s), vec![Ok(1)]);
    assert!(!s.host_turn_pending());
}

#[test]
fn no_turn_is_awaited_while_an_isochron_is_open() {
    // A driver that kept the host's packets for the coming turn would keep the open
    // isochron's end too, and requirement 26 may need that end before a token can go.
    let mut s = two_insignificant_pulses_later(true);
    open_isochron(&mut s, 4, 8);
    s.handle_net(4, &reply_to_host_0()).unwrap();
    assert!(
        !s.host_turn_coming(),
        "the isochron's end must come in first"
    );
    s.handle_host(5, &end_of_isochron(8)).unwrap();
    assert!(s.host_turn_coming());
}
