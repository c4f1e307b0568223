use super::*;
use isotach_proto::Pulse;
use isotach_proto::packet::{Packet, PlainMessage, Sref, SrefOp, Width};
use isotach_proto::{Generation, WaveSeq};

/// A TM without idle pacing (waves at full speed): the protocol tests.
fn tm(hosts: usize, switches: usize, switch: SwitchId) -> TokenManager {
    paced_tm(hosts, switches, switch, 0)
}

/// A TM whose idle waves wait `idle_pace_us`.
fn paced_tm(hosts: usize, switches: usize, switch: SwitchId, idle_pace_us: u64) -> TokenManager {
    let topology = Arc::new(Topology::line(hosts, switches).unwrap());
    TokenManager::new(TmConfig {
        switch,
        topology,
        timing: Timing {
            token_timeout_us: 100,
            epoch_pulses: 8,
            idle_pace_us,
        },
        limits: Limits::default(),
    })
}

fn token(port: u16, wave: u64) -> Token {
    Token {
        seq: WaveSeq::of_wave(wave),
        source_port: port,
        generation: Generation::new(1),
        ..Token::default()
    }
}

fn reset_token(port: u16) -> Token {
    Token {
        restart: true,
        source_port: port,
        generation: Generation::new(1),
        ..Token::default()
    }
}

fn drain(tm: &mut TokenManager) -> Vec<(LinkId, Packet)> {
    std::iter::from_fn(|| tm.poll_transmit())
        .map(|(l, b)| (l, Packet::decode(&b).unwrap()))
        .collect()
}

fn tokens(out: &[(LinkId, Packet)]) -> Vec<(LinkId, Token)> {
    out.iter()
        .filter_map(|(l, p)| match p {
            Packet::Token(t) => Some((*l, *t)),
            _ => None,
        })
        .collect()
}

/// Starts a single-switch TM over `hosts` hosts; returns it after wave 1.
fn started(hosts: usize) -> TokenManager {
    started_paced(hosts, 0)
}

/// [`started`], with idle waves paced by `idle_pace_us`.
fn started_paced(hosts: usize, idle_pace_us: u64) -> TokenManager {
    let mut t = paced_tm(hosts, 1, 0, idle_pace_us);
    t.handle_input(0, 0, &reset_token(0).to_bytes()).unwrap();
    let out = tokens(&drain(&mut t));
    // A reset to every link, then wave 1 with both barrier bits.
    assert_eq!(out.iter().filter(|(_, t)| t.restart).count(), hosts);
    let wave1: Vec<_> = out.iter().filter(|(_, t)| !t.restart).collect();
    assert_eq!(wave1.len(), hosts);
    assert!(
        wave1
            .iter()
            .all(|(_, t)| t.seq == WaveSeq::from_bits(1) && t.barrier == 0b11)
    );
    t
}

#[test]
fn wave_waits_for_every_neighbour() {
    let mut t = started(3);
    t.handle_input(1, 0, &token(0, 1).to_bytes()).unwrap();
    t.handle_input(1, 1, &token(1, 1).to_bytes()).unwrap();
    assert!(drain(&mut t).is_empty(), "host 2 has not answered");
    t.handle_input(1, 2, &token(2, 1).to_bytes()).unwrap();
    let out = tokens(&drain(&mut t));
    assert_eq!(out.len(), 3);
    assert!(
        out.iter()
            .all(|(_, t)| t.seq == WaveSeq::from_bits(2) && t.barrier == 0)
    );
    assert_eq!(t.waves(), 2);
}

#[test]
fn a_wave_is_built_in_the_buffers_the_driver_handed_in() {
    use isotach_proto::packet::{BUFFER_BYTES_MIN, POOL_BUFFERS_MAX};
    let mut t = started(3);
    let given: Vec<Vec<u8>> = (0..3)
        .map(|_| Vec::with_capacity(BUFFER_BYTES_MIN))
        .collect();
    let at: Vec<*const u8> = given.iter().map(|b| b.as_ptr()).collect();
    for b in given {
        assert!(t.buffers().give(b).is_none());
    }
    assert_eq!(t.buffers().room(), POOL_BUFFERS_MAX - 3);
    for link in 0..3 {
        t.handle_input(1, link, &token(link as u16, 1).to_bytes())
            .unwrap();
    }
    let wave: Vec<Vec<u8>> = std::iter::from_fn(|| t.poll_transmit())
        .map(|(_, b)| b)
        .collect();
    assert_eq!(wave.len(), 3);
    assert!(
        wave.iter().all(|b| at.contains(&b.as_ptr())),
        "every token of wave 2 in a buffer handed in"
    );
    assert_eq!(t.buffers().room(), POOL_BUFFERS_MAX);
}

#[test]
fn an_isotach_message_rides_with_the_next_wave_and_a_plain_one_leaves_at_once() {
    let mut t = started(2);
    t.handle_input(1, 1, &token(1, 1).to_bytes()).unwrap();
    t.handle_input(1, 0, &write_to(1)).unwrap();
    let plain = Packet::Plain(PlainMessage {
        dest: 1,
        ..PlainMessage::default()
    });
    t.handle_input(1, 0, &plain.to_vec()).unwrap();
    let out = drain(&mut t);
    assert_eq!(
        out.iter().map(|(l, p)| (*l, p.kind())).collect::<Vec<_>>(),
        [(1, Kind::Plain)],
        "the isotach message waits for wave 2 (host 0 has not answered wave 1)"
    );
    assert_eq!(t.queue_depth(), 1, "the riding message is queued");
    t.handle_input(2, 0, &token(0, 1).to_bytes()).unwrap();
    assert_eq!(
        kinds_to(&drain(&mut t), 1),
        [Kind::IsotachMessage, Kind::Token]
    );
    assert_eq!(t.queue_depth(), 0);
    assert_eq!(t.stats().messages_forwarded, 2);
}

#[test]
fn messages_riding_when_a_restart_comes_belong_to_the_old_generation() {
    let mut t = started(2);
    t.handle_input(1, 1, &token(1, 1).to_bytes()).unwrap();
    t.handle_input(1, 0, &write_to(1)).unwrap();
    assert_eq!(t.queue_depth(), 1, "riding with wave 2");
    t.begin_restart(2);
    let out = drain(&mut t);
    assert!(out.iter().all(|(_, p)| p.kind() == Kind::Token));
    assert_eq!(t.stats().messages_stale, 1);
    assert_eq!(t.queue_depth(), 0);
}

#[test]
fn messages_are_forwarded_before_the_next_token() {
    let mut t = started(2);
    let mb = write_to(1);
    t.handle_input(1, 0, &token(0, 1).to_bytes()).unwrap();
    t.handle_input(1, 0, &mb).unwrap();
    t.handle_input(1, 1, &token(1, 1).to_bytes()).unwrap();
    assert_eq!(
        kinds_to(&drain(&mut t), 1),
        [Kind::IsotachMessage, Kind::Token]
    );
}

#[test]
fn early_duplicate_bad_and_foreign_tokens_are_dropped() {
    let mut t = started(1);
    t.handle_input(1, 0, &token(0, 2).to_bytes()).unwrap(); // early
    t.handle_input(1, 0, &token(0, 1).to_bytes()).unwrap();
    t.handle_input(1, 0, &token(0, 1).to_bytes()).unwrap(); // duplicate
    let mut bad = token(0, 2).to_bytes();
    bad[6] ^= 1;
    assert!(matches!(
        t.handle_input(1, 0, &bad),
        Err(TmError::Decode { .. })
    ));
    assert!(matches!(
        t.handle_input(1, 0, &token(7, 2).to_bytes()),
        Err(TmError::ForeignToken { .. })
    ));
    let s = t.stats();
    assert_eq!(
        (
            s.tokens_early,
            s.tokens_duplicate,
            s.tokens_accepted,
            s.tokens_dropped
        ),
        (1, 1, 1, 2)
    );
    assert_eq!(t.waves(), 2);
}

#[test]
fn timer_resends_the_last_two_tokens_marked_repeat() {
    let mut t = started(1);
    t.handle_input(10, 0, &token(0, 1).to_bytes()).unwrap();
    drain(&mut t);
    assert_eq!(t.poll_timeout(), Some(110));
    t.handle_timeout(109);
    assert!(drain(&mut t).is_empty());
    t.handle_timeout(110);
    let out = tokens(&drain(&mut t));
    assert_eq!(
        out.iter()
            .map(|(_, t)| (t.seq.bits(), t.repeat))
            .collect::<Vec<_>>(),
        vec![(1, true), (2, true)]
    );
}

#[test]
fn barrier_round_goes_to_hosts_only_when_all_entered() {
    let mut t = started(2);
    let mut w = [token(0, 1), token(1, 1)];
    for (i, tk) in w.iter().enumerate() {
        t.handle_input(1, i, &tk.to_bytes()).unwrap();
    }
    drain(&mut t);
    // Host 0 enters barrier 0 on its token 2; host 1 does not yet.
    w = [
        Token {
            barrier: 1,
            ..token(0, 2)
        },
        token(1, 2),
    ];
    for (i, tk) in w.iter().enumerate() {
        t.handle_input(1, i, &tk.to_bytes()).unwrap();
    }
    assert!(tokens(&drain(&mut t)).iter().all(|(_, t)| t.barrier == 0));
    w = [
        token(0, 3),
        Token {
            barrier: 1,
            ..token(1, 3)
        },
    ];
    for (i, tk) in w.iter().enumerate() {
        t.handle_input(1, i, &tk.to_bytes()).unwrap();
    }
    let out = tokens(&drain(&mut t));
    assert!(
        out.iter()
            .all(|(_, t)| t.barrier == 1 && t.seq == WaveSeq::of_wave(4))
    );
    assert_eq!(t.stats().barrier_rounds, 1);
}

#[test]
fn signals_gathered_in_an_epoch_ride_on_its_last_wave() {
    let mut t = started(1);
    for wave in 1..=8u64 {
        let signals = if wave == 2 { 0b100 } else { 0 };
        t.handle_input(
            1,
            0,
            &Token {
                signals,
                ..token(0, wave)
            }
            .to_bytes(),
        )
        .unwrap();
        let out = tokens(&drain(&mut t));
        let sent = out[0].1;
        let sent_wave = wave + 1;
        assert_eq!(sent.end_of_epoch, sent_wave == 8, "wave {sent_wave}");
        if (3..=8).contains(&sent_wave) {
            assert_eq!(sent.signals, 0b100, "wave {sent_wave}");
        }
        if sent_wave > 8 {
            assert_eq!(sent.signals, 0, "a new epoch starts clean");
        }
    }
}

#[test]
fn reset_echo_is_ignored_and_stale_generations_dropped() {
    // Two switches: the reset from switch 1 echoes back.
    let mut t = tm(2, 2, 0);
    let host = t.link_to(Hop::Host(0)).unwrap();
    let trunk = t.link_to(Hop::Switch(1)).unwrap();
    t.handle_input(0, host, &reset_token(0).to_bytes()).unwrap();
    let first = drain(&mut t).len();
    assert_eq!(first, 4, "reset + wave 1 on both links");
    t.handle_input(0, trunk, &reset_token(Topology::switch_port(1)).to_bytes())
        .unwrap();
    assert!(drain(&mut t).is_empty(), "same generation: not a new reset");
    let old = Token {
        generation: Generation::new(0),
        ..token(0, 1)
    };
    t.handle_input(0, host, &old.to_bytes()).unwrap();
    assert_eq!(t.stats().tokens_dropped, 1);
}

#[test]
fn unknown_destination_and_markers_are_refused() {
    let mut t = started(1);
    let m = IsotachMessage {
        ts: Pulse::new(2),
        source: 0,
        dest: 5,
        sequum: 0,
        generation: Generation::new(1),
        sref: Sref::Msg {
            handler: 1,
            payload: vec![1, 2],
        },
    };
    let mut mb = Vec::new();
    m.encode(&mut mb);
    assert_eq!(t.handle_input(1, 0, &mb), Err(TmError::NoSuchHost(5)));
    let eop = Packet::EopMarker(isotach_proto::EopMarker::default()).to_vec();
    assert!(matches!(
        t.handle_input(1, 0, &eop),
        Err(TmError::UnexpectedKind { .. })
    ));
    assert_eq!(t.handle_input(1, 9, &mb), Err(TmError::NoSuchLink(9)));
}

#[test]
fn a_lost_restart_is_resent_by_the_token_timer() {
    let mut t = tm(1, 1, 0);
    t.handle_input(0, 0, &reset_token(0).to_bytes()).unwrap();
    drain(&mut t); // the restart and wave 1 are lost
    t.handle_timeout(100);
    let out = tokens(&drain(&mut t));
    let got: Vec<_> = out
        .iter()
        .map(|(_, t)| (t.restart, t.seq.bits(), t.repeat))
        .collect();
    assert_eq!(got, vec![(true, 0, true), (false, 1, true)]);
    // A repeat of the restart it already took is not a new generation.
    let again = Token {
        repeat: true,
        ..reset_token(0)
    };
    t.handle_input(100, 0, &again.to_bytes()).unwrap();
    assert!(drain(&mut t).is_empty());
    assert_eq!((t.generation().get(), t.stats().resets), (1, 0));
}

#[test]
fn begin_restart_sends_the_next_generation_to_every_neighbour() {
    let mut fresh = tm(2, 1, 0);
    fresh.begin_restart(0);
    assert!(
        drain(&mut fresh).is_empty(),
        "nothing to restart before the first reset"
    );
    assert_eq!(fresh.generation(), Generation::new(0));

    let mut t = started(2);
    t.handle_input(1, 0, &token(0, 1).to_bytes()).unwrap();
    t.handle_input(1, 1, &token(1, 1).to_bytes()).unwrap();
    drain(&mut t);
    assert_eq!(t.waves(), 2);
    t.begin_restart(5);
    let out = tokens(&drain(&mut t));
    let resets: Vec<_> = out.iter().filter(|(_, t)| t.restart).collect();
    assert_eq!(resets.len(), 2);
    assert!(
        resets
            .iter()
            .all(|(_, t)| t.generation == Generation::new(2))
    );
    assert!(
        out.iter()
            .filter(|(_, t)| !t.restart)
            .all(|(_, t)| t.seq == WaveSeq::from_bits(1) && t.generation == Generation::new(2)),
        "then wave 1 of the new generation"
    );
    assert_eq!(
        (t.generation().get(), t.waves(), t.stats().resets),
        (2, 1, 1)
    );
    // A host's echo of the same generation is not another restart.
    let echo = Token {
        generation: Generation::new(2),
        ..reset_token(0)
    };
    t.handle_input(6, 0, &echo.to_bytes()).unwrap();
    assert_eq!(t.generation(), Generation::new(2));
}

/// An isotach write from host 0 to `dest` stamped in generation 1, encoded.
fn write_to(dest: u16) -> Vec<u8> {
    write_in(1, dest)
}

/// An isotach write from host 0 to `dest` stamped in `generation`, encoded.
fn write_in(generation: u32, dest: u16) -> Vec<u8> {
    let m = IsotachMessage {
        ts: Pulse::new(2),
        source: 0,
        dest,
        sequum: 0,
        generation: Generation::new(generation),
        sref: Sref::Mem {
            op: SrefOp::Write,
            width: Width::W32,
            addr: 4,
            value: 9,
            ref_id: 0,
        },
    };
    let mut b = Vec::new();
    m.encode(&mut b);
    b
}

/// Generation 2 started here (a TM restart) after wave 1 of generation 1 was answered.
fn restarted_to_generation_2() -> TokenManager {
    let mut t = started(2);
    t.handle_input(1, 0, &token(0, 1).to_bytes()).unwrap();
    t.handle_input(1, 1, &token(1, 1).to_bytes()).unwrap();
    drain(&mut t);
    t.begin_restart(2);
    drain(&mut t);
    t
}

/// `t` in generation 2.
fn in_generation_2(t: Token) -> Vec<u8> {
    Token {
        generation: Generation::new(2),
        ..t
    }
    .to_bytes()
    .to_vec()
}

/// The kinds of the packets in `out` towards `link`, in order.
fn kinds_to(out: &[(LinkId, Packet)], link: LinkId) -> Vec<Kind> {
    out.iter()
        .filter(|(l, _)| *l == link)
        .map(|(_, p)| p.kind())
        .collect()
}

/// Isotach messages in `out` towards `link`.
fn messages_to(out: &[(LinkId, Packet)], link: LinkId) -> usize {
    out.iter()
        .filter(|(l, p)| *l == link && p.kind() == Kind::IsotachMessage)
        .count()
}

#[test]
fn messages_of_an_older_generation_are_dropped_not_forwarded() {
    let mut t = restarted_to_generation_2();
    // Host 0 has not taken generation 2 yet: what it sends now, stamped in generation 1,
    // would land in a pulse of generation 2.
    t.handle_input(3, 0, &write_in(1, 1)).unwrap();
    assert!(drain(&mut t).is_empty(), "a stale message is not forwarded");
    assert_eq!(t.stats().messages_stale, 1);
    t.handle_input(4, 0, &in_generation_2(reset_token(0)))
        .unwrap();
    t.handle_input(4, 1, &in_generation_2(token(1, 1))).unwrap();
    t.handle_input(4, 0, &write_in(2, 1)).unwrap();
    assert_eq!(messages_to(&next_wave_from_host_0(&mut t), 1), 1);
    assert_eq!(t.stats().messages_stale, 1);
}

/// Host 0's first token of generation 2 sends wave 2 (host 1 answered wave 1 already),
/// which takes the messages riding with it along; returns what went out.
fn next_wave_from_host_0(t: &mut TokenManager) -> Vec<(LinkId, Packet)> {
    t.handle_input(5, 0, &in_generation_2(token(0, 1))).unwrap();
    let out = drain(t);
    assert_eq!(tokens(&out).len(), 2, "wave 2 went out");
    out
}

#[test]
fn messages_held_when_a_restart_comes_belong_to_the_old_generation() {
    let mut t = started(2);
    // Host 1 has not answered wave 1: a message for it waits.
    t.handle_input(1, 0, &token(0, 1).to_bytes()).unwrap();
    t.handle_input(1, 0, &write_to(1)).unwrap();
    assert_eq!(t.stats().messages_held, 1);
    t.begin_restart(2);
    let out = drain(&mut t);
    assert!(out.iter().all(|(_, p)| p.kind() == Kind::Token));
    assert_eq!(t.stats().messages_stale, 1);
}

#[test]
fn a_corrupted_token_does_not_hide_a_messages_generation() {
    let mut t = restarted_to_generation_2();
    t.handle_input(2, 1, &in_generation_2(token(1, 1))).unwrap();
    // Host 0's last token of generation 1 arrives corrupted (it may have been anything), then
    // a message it sent in generation 1, then, after its echo, one it sent in generation 2.
    let mut last = token(0, 2).to_bytes().to_vec();
    let at = last.len() - 1;
    last[at] ^= 0xff;
    assert!(t.handle_input(3, 0, &last).is_err());
    t.handle_input(3, 0, &write_in(1, 1)).unwrap();
    assert_eq!(messages_to(&drain(&mut t), 1), 0, "stamped in generation 1");
    assert_eq!(t.stats().messages_stale, 1);
    let mut echo = in_generation_2(reset_token(0));
    let at = echo.len() - 1;
    echo[at] ^= 0xff;
    assert!(t.handle_input(4, 0, &echo).is_err());
    t.handle_input(4, 0, &write_in(2, 1)).unwrap();
    assert_eq!(
        messages_to(&next_wave_from_host_0(&mut t), 1),
        1,
        "stamped in generation 2"
    );
    assert_eq!(t.stats().messages_stale, 1);
}

#[test]
fn a_tm_not_started_keeps_only_the_messages_of_the_generation_it_starts() {
    let mut t = tm(2, 1, 0);
    // Neighbours that started before this TM (a restarted process) send what they have.
    t.handle_input(0, 0, &write_in(3, 1)).unwrap();
    t.handle_input(0, 0, &write_in(4, 1)).unwrap();
    assert_eq!(t.stats().messages_held, 2);
    let restart = Token {
        generation: Generation::new(4),
        ..reset_token(0)
    };
    t.handle_input(1, 0, &restart.to_bytes()).unwrap();
    assert_eq!(
        t.stats().messages_stale,
        1,
        "generation 3 ended before this start"
    );
    t.handle_input(
        2,
        1,
        &Token {
            generation: Generation::new(4),
            ..token(1, 1)
        }
        .to_bytes(),
    )
    .unwrap();
    assert_eq!(messages_to(&drain(&mut t), 1), 1, "generation 4 goes");
}

// ------------------------------------------------------------------------------------------
// Idle pacing

/// The pace of the paced tests: below the 100 µs token timer of [`paced_tm`].
const PACE_US: u64 = 40;

fn busy(t: Token) -> Token {
    Token { busy: true, ..t }
}

/// Wave numbers (mod 4) of the tokens in `out`, by link.
fn wave_tokens(out: &[(LinkId, Packet)]) -> Vec<(LinkId, u8, bool)> {
    tokens(out)
        .into_iter()
        .filter(|(_, t)| !t.restart)
        .map(|(l, t)| (l, t.seq.bits(), t.busy))
        .collect()
}

#[test]
fn an_idle_wave_waits_for_the_pace_timer() {
    let mut t = started_paced(2, PACE_US);
    t.handle_input(10, 0, &token(0, 1).to_bytes()).unwrap();
    t.handle_input(10, 1, &token(1, 1).to_bytes()).unwrap();
    assert!(drain(&mut t).is_empty(), "nothing busy: wave 2 is paced");
    assert!(t.pacing());
    assert_eq!(
        t.poll_timeout(),
        Some(10 + PACE_US),
        "the pace timer is first"
    );
    t.handle_timeout(10 + PACE_US - 1);
    assert!(drain(&mut t).is_empty());
    t.handle_timeout(10 + PACE_US);
    let out = wave_tokens(&drain(&mut t));
    assert_eq!(out, vec![(0, 2, false), (1, 2, false)]);
    assert!(!t.pacing());
    assert_eq!((t.stats().waves_paced, t.stats().waves_released), (1, 0));
    // The lost-token timer runs from the wave, as before.
    assert_eq!(t.poll_timeout(), Some(10 + PACE_US + 100));
}

#[test]
fn pace_zero_never_paces() {
    let mut t = started_paced(2, 0);
    t.handle_input(10, 0, &token(0, 1).to_bytes()).unwrap();
    t.handle_input(10, 1, &token(1, 1).to_bytes()).unwrap();
    assert_eq!(wave_tokens(&drain(&mut t)).len(), 2);
    assert_eq!(t.stats().waves_paced, 0);
}

#[test]
fn a_busy_token_sends_the_wave_it_gates_at_once_and_tells_the_others() {
    let mut t = started_paced(3, PACE_US);
    t.handle_input(10, 0, &busy(token(0, 1)).to_bytes())
        .unwrap();
    t.handle_input(10, 1, &token(1, 1).to_bytes()).unwrap();
    t.handle_input(10, 2, &token(2, 1).to_bytes()).unwrap();
    // BUSY towards the others, not back to the host it came from.
    let out = wave_tokens(&drain(&mut t));
    assert_eq!(out, vec![(0, 2, false), (1, 2, true), (2, 2, true)]);
    assert!(!t.pacing());
    // The next wave is idle again.
    for l in 0..3 {
        t.handle_input(20, l, &token(l as u16, 2).to_bytes())
            .unwrap();
    }
    assert!(drain(&mut t).is_empty() && t.pacing());
}

#[test]
fn a_busy_duplicate_releases_a_paced_wave() {
    let mut t = started_paced(2, PACE_US);
    t.handle_input(10, 0, &token(0, 1).to_bytes()).unwrap();
    t.handle_input(10, 1, &token(1, 1).to_bytes()).unwrap();
    assert!(t.pacing());
    // Host 1's SIU got work: it resends its last token, repeat and BUSY.
    let wake = Token {
        repeat: true,
        ..busy(token(1, 1))
    };
    t.handle_input(15, 1, &wake.to_bytes()).unwrap();
    let out = wave_tokens(&drain(&mut t));
    assert_eq!(out, vec![(0, 2, true), (1, 2, false)], "released at once");
    let s = t.stats();
    assert_eq!(
        (s.tokens_duplicate, s.waves_paced, s.waves_released),
        (1, 1, 1)
    );
    assert!(!t.pacing());
}

#[test]
fn a_busy_duplicate_before_the_wave_is_ready_makes_it_unpaced() {
    let mut t = started_paced(2, PACE_US);
    t.handle_input(10, 0, &token(0, 1).to_bytes()).unwrap();
    let wake = Token {
        repeat: true,
        ..busy(token(0, 1))
    };
    t.handle_input(11, 0, &wake.to_bytes()).unwrap();
    assert!(drain(&mut t).is_empty(), "host 1 has not answered");
    t.handle_input(12, 1, &token(1, 1).to_bytes()).unwrap();
    assert_eq!(wave_tokens(&drain(&mut t)).len(), 2, "not paced");
    assert_eq!(t.stats().waves_paced, 0);
}

#[test]
fn a_forwarded_message_releases_a_paced_wave_and_precedes_it() {
    let mut t = started_paced(2, PACE_US);
    t.handle_input(10, 0, &token(0, 1).to_bytes()).unwrap();
    t.handle_input(10, 1, &token(1, 1).to_bytes()).unwrap();
    assert!(t.pacing());
    t.handle_input(12, 0, &write_to(1)).unwrap();
    assert_eq!(
        kinds_to(&drain(&mut t), 1),
        [Kind::IsotachMessage, Kind::Token]
    );
    assert_eq!(t.stats().waves_released, 1);
    assert!(!t.pacing());
}

#[test]
fn busy_spreads_between_tms_over_the_tree_but_never_back() {
    // Line of two switches: each TM has one host (link 0) and the trunk (link 1).
    let mut t = paced_tm(2, 2, 0, PACE_US);
    t.handle_input(0, 0, &reset_token(0).to_bytes()).unwrap();
    drain(&mut t);
    let tm1 = Topology::switch_port(1);
    // News from the host goes to the trunk, not back to the host.
    t.handle_input(10, 0, &busy(token(0, 1)).to_bytes())
        .unwrap();
    t.handle_input(10, 1, &token(tm1, 1).to_bytes()).unwrap();
    assert_eq!(
        wave_tokens(&drain(&mut t)),
        vec![(0, 2, false), (1, 2, true)]
    );
    // News from the other TM goes to the host, not back over the trunk.
    t.handle_input(20, 0, &token(0, 2).to_bytes()).unwrap();
    t.handle_input(20, 1, &busy(token(tm1, 2)).to_bytes())
        .unwrap();
    assert_eq!(
        wave_tokens(&drain(&mut t)),
        vec![(0, 3, true), (1, 3, false)]
    );
    // Nothing busy any more: paced.
    t.handle_input(30, 0, &token(0, 3).to_bytes()).unwrap();
    t.handle_input(30, 1, &token(tm1, 3).to_bytes()).unwrap();
    assert!(drain(&mut t).is_empty() && t.pacing());
}

#[test]
fn a_restart_drops_the_pace_and_sends_wave_1_at_once() {
    let mut t = started_paced(2, PACE_US);
    t.handle_input(10, 0, &token(0, 1).to_bytes()).unwrap();
    t.handle_input(10, 1, &token(1, 1).to_bytes()).unwrap();
    assert!(t.pacing());
    t.begin_restart(11);
    assert!(!t.pacing());
    let out = tokens(&drain(&mut t));
    assert_eq!(out.iter().filter(|(_, t)| !t.restart).count(), 2, "wave 1");
    assert_eq!(
        t.poll_timeout(),
        Some(11 + 100),
        "only the lost-token timer"
    );
}

#[test]
fn a_forwarded_message_keeps_waves_unpaced_until_its_pulse_ends() {
    let mut t = started_paced(2, PACE_US);
    t.handle_input(10, 0, &token(0, 1).to_bytes()).unwrap();
    t.handle_input(10, 1, &token(1, 1).to_bytes()).unwrap();
    assert!(t.pacing());
    // Stamped TS 2: pulse 2 ends with wave 3, so waves 2 and 3 go at once.
    t.handle_input(11, 0, &write_to(1)).unwrap();
    assert_eq!(
        wave_tokens(&drain(&mut t)),
        vec![(0, 2, false), (1, 2, true)]
    );
    for l in 0..2 {
        t.handle_input(12, l, &token(l as u16, 2).to_bytes())
            .unwrap();
    }
    assert_eq!(
        wave_tokens(&drain(&mut t)),
        vec![(0, 3, false), (1, 3, true)]
    );
    for l in 0..2 {
        t.handle_input(13, l, &token(l as u16, 3).to_bytes())
            .unwrap();
    }
    assert!(
        drain(&mut t).is_empty() && t.pacing(),
        "wave 4 is idle again"
    );
}

#[test]
fn a_wake_up_covers_the_wave_its_repeated_token_gates() {
    let mut t = started_paced(2, PACE_US);
    t.handle_input(10, 0, &token(0, 1).to_bytes()).unwrap();
    t.handle_input(10, 1, &token(1, 1).to_bytes()).unwrap();
    // Host 1 is a token ahead (its token 2 went out idle) when its host gets work.
    t.handle_input(11, 1, &token(1, 2).to_bytes()).unwrap();
    assert!(t.pacing());
    let wake = Token {
        repeat: true,
        ..busy(token(1, 2))
    };
    t.handle_input(12, 1, &wake.to_bytes()).unwrap();
    assert_eq!(wave_tokens(&drain(&mut t)).len(), 2, "wave 2 released");
    // Token 2 gates wave 3: it goes as soon as host 0's token 2 is in, unpaced.
    t.handle_input(13, 0, &token(0, 2).to_bytes()).unwrap();
    assert_eq!(
        wave_tokens(&drain(&mut t)),
        vec![(0, 3, true), (1, 3, false)]
    );
    assert_eq!(t.stats().waves_released, 1);
}

#[test]
fn riding_messages_leave_at_once_rather_than_hold_up_a_token() {
    // A queue of 16 packets: with 2 links, 4 are kept for a wave, so 12 messages fit and a
    // 13th is taken while the count before it is within the limit.
    let mut t = TokenManager::new(TmConfig {
        limits: Limits {
            queue_packets_max: 16,
            ..Limits::default()
        },
        ..tm(2, 1, 0).config().clone()
    });
    t.handle_input(0, 0, &reset_token(0).to_bytes()).unwrap();
    drain(&mut t);
    t.handle_input(1, 1, &token(1, 1).to_bytes()).unwrap();
    for _ in 0..13 {
        t.handle_input(1, 0, &write_to(1)).unwrap();
    }
    assert_eq!(t.queue_depth(), 13, "riding with wave 2");
    assert!(drain(&mut t).is_empty());
    // One more would fill the queue: the riders leave now and the input is refused for room
    // (back-pressure), so the token behind it gets in once the output drained.
    assert_eq!(
        t.handle_input(1, 0, &write_to(1)),
        Err(TmError::Backpressure(16))
    );
    assert_eq!(t.stats().riding_released_for_room, 1);
    let out = drain(&mut t);
    assert_eq!(messages_to(&out, 1), 13);
    t.handle_input(1, 0, &write_to(1)).unwrap();
    t.handle_input(1, 0, &token(0, 1).to_bytes()).unwrap();
    assert_eq!(
        kinds_to(&drain(&mut t), 1),
        [Kind::IsotachMessage, Kind::Token]
    );
}

#[test]
fn an_owned_input_forwarded_as_it_came_leaves_in_its_own_buffer() {
    let mut t = started(2);
    t.handle_input(1, 1, &token(1, 1).to_bytes()).unwrap();
    let mut msg = write_to(1);
    let (at, bytes) = (msg.as_ptr(), msg.clone());
    t.handle_input_owned(1, 0, &mut msg).unwrap();
    assert!(msg.is_empty(), "taken");
    t.handle_input(2, 0, &token(0, 1).to_bytes()).unwrap();
    let out: Vec<(LinkId, Vec<u8>)> = std::iter::from_fn(|| t.poll_transmit()).collect();
    // Ahead of wave 2's token on link 1.
    let (_, sent) = out.iter().find(|(l, _)| *l == 1).expect("output to link 1");
    assert_eq!(sent, &bytes);
    assert_eq!(sent.as_ptr(), at, "no copy: the input's own buffer");
    // Refused or not consumed: the buffer stays the driver's, as it was.
    let mut token_in = token(0, 2).to_bytes().to_vec();
    let before = token_in.clone();
    t.handle_input_owned(3, 0, &mut token_in).unwrap();
    assert_eq!(token_in, before, "a token is read, not taken");
    let mut nowhere = write_to(9);
    let before = nowhere.clone();
    assert_eq!(
        t.handle_input_owned(3, 0, &mut nowhere),
        Err(TmError::NoSuchHost(9))
    );
    assert_eq!(nowhere, before);
}
