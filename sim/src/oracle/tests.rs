use super::*;
use isotach_proto::packet::Sref;
use isotach_proto::{Generation, Pulse};

fn msg(ts: u64, source: u16, dest: u16, sequum: u64) -> Vec<u8> {
    let m = IsotachMessage {
        ts: Pulse::new(ts),
        source,
        dest,
        sequum,
        generation: Generation::new(1),
        sref: Sref::Msg {
            handler: 0,
            payload: vec![],
        },
    };
    let mut v = Vec::new();
    m.encode(&mut v);
    v
}

fn eop(ts: u64, count: u32, sort_vector: Vec<u8>) -> Vec<u8> {
    let e = EopMarker {
        ts: Pulse::new(ts),
        count,
        sort_vector,
        ..EopMarker::default()
    };
    let mut v = Vec::new();
    e.encode(&mut v);
    v
}

fn send(o: &mut PulseOracle, bytes: &[u8]) {
    let tx = Transmit {
        route: Route::Tm,
        bytes: bytes.to_vec(),
    };
    o.on_siu_transmit(0, 0, &tx);
}

#[test]
fn a_correct_pulse_passes() {
    let mut o = PulseOracle::new(2);
    let (a, b) = (msg(3, 1, 0, 7), msg(3, 0, 0, 2));
    send(&mut o, &a);
    send(&mut o, &b);
    o.on_host_packet(0, 0, &a);
    o.on_host_packet(0, 0, &b);
    o.on_host_packet(0, 0, &eop(3, 2, vec![1, 0]));
    o.finish(&[4, 4]);
    assert_eq!(o.stats().eop_violations, 0, "{:?}", o.violations());
    assert_eq!(o.stats().order_violations, 0, "{:?}", o.violations());
}

#[test]
fn early_eop_late_message_bad_vector_and_missing_eop_are_caught() {
    let mut o = PulseOracle::new(1);
    let (a, b) = (msg(3, 1, 0, 7), msg(3, 0, 0, 2));
    send(&mut o, &a);
    send(&mut o, &b);
    o.on_host_packet(0, 0, &a);
    o.on_host_packet(0, 0, &eop(3, 1, vec![0]));
    assert_eq!(o.stats().eop_violations, 1, "b missing at EOP 3");
    o.on_host_packet(0, 0, &b);
    assert_eq!(o.stats().eop_violations, 2, "b late");

    let c = msg(5, 0, 0, 3);
    let d = msg(5, 1, 0, 1);
    send(&mut o, &c);
    send(&mut o, &d);
    o.on_host_packet(0, 0, &d);
    o.on_host_packet(0, 0, &c);
    o.on_host_packet(0, 0, &eop(5, 2, vec![0, 1]));
    assert_eq!(o.stats().order_violations, 1, "vector not sorted");
    o.on_host_packet(0, 0, &eop(6, 1, vec![0]));
    assert_eq!(
        o.stats().order_violations,
        3,
        "count 1 but got 0, and a vector entry for a packet that never came"
    );

    let e = msg(8, 0, 0, 4);
    send(&mut o, &e);
    o.finish(&[9]);
    assert_eq!(o.stats().eop_violations, 3, "pulse 8 never closed");
}

fn barrier_marker(bits: u8) -> Vec<u8> {
    let mut v = Vec::new();
    BarrierSignalMarker {
        barrier: bits,
        barrier_count: 1,
        signals: 0,
        reset: false,
    }
    .encode(&mut v);
    v
}

fn barrier_eop(ts: u64, bits: u8) -> Vec<u8> {
    let e = EopMarker {
        ts: Pulse::new(ts),
        barrier: bits,
        ..EopMarker::default()
    };
    let mut v = Vec::new();
    e.encode(&mut v);
    v
}

#[test]
fn a_barrier_seen_complete_before_every_host_entered_is_caught() {
    let mut o = PulseOracle::new(3);
    for h in 0..3 {
        o.on_siu_generation(0, h, 1, true);
    }
    o.on_siu_host_input(0, 0, &barrier_marker(0b01), None);
    o.on_siu_host_input(0, 1, &barrier_marker(0b01), None);
    // Host 2's marker was refused: it did not enter.
    let refused = isotach_siu::SiuError::NotStarted;
    o.on_siu_host_input(0, 2, &barrier_marker(0b01), Some(&refused));
    o.on_host_packet(0, 0, &barrier_eop(3, 0b01));
    assert_eq!(o.stats().barrier_violations, 1, "{:?}", o.violations());
    o.on_siu_host_input(0, 2, &barrier_marker(0b01), None);
    o.on_host_packet(0, 1, &barrier_eop(4, 0b01));
    assert_eq!(o.stats().barrier_violations, 1, "everyone entered once");
    // A second completion of barrier 0 needs second entries.
    o.on_host_packet(0, 1, &barrier_eop(5, 0b01));
    assert_eq!(o.stats().barrier_violations, 2);
    assert_eq!(o.stats().barrier_completions, 3);
}
