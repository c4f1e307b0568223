//! Prints one encoded example of every packet kind (the hex dumps in `docs/wire.md` come from
//! here) and, given a directory, writes them as seed corpora for the fuzz targets.
//!
//! ```text
//! cd fuzz
//! cargo run --example wire_examples                 # print the examples
//! cargo run --example wire_examples -- corpus       # also seed corpus/<target>/
//! ```

use isotach_proto::packet::{
    BarrierSignalMarker, EndOfIsochron, EopMarker, IsochronMarker, IsotachMessage, Kind, Packet,
    PlainMessage, Sref, SrefOp, Stamp, StartOfIsochron, Token, Width,
};
use isotach_proto::{Generation, Pulse, WaveSeq};
use std::path::Path;

fn hex(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn examples() -> Vec<(&'static str, Packet)> {
    let token = Token {
        seq: WaveSeq::from_bits(1),
        repeat: false,
        reset: false,
        end_of_epoch: false,
        restart: false,
        busy: false,
        barrier: 0b11,
        signals: 0,
        source_port: 0x8000,
        generation: Generation::new(1),
    };
    let message = IsotachMessage {
        ts: Pulse::new(0),
        source: 0,
        dest: 2,
        sequum: 0,
        generation: Generation::new(0),
        sref: Sref::Mem {
            op: SrefOp::Write,
            width: Width::W32,
            addr: 0x0000_0001_0000_0010,
            value: 42,
            ref_id: 7,
        },
    };
    vec![
        ("token", Packet::Token(token)),
        (
            "start_of_isochron",
            Packet::StartOfIsochron(StartOfIsochron {
                iso_id: 9,
                channel: 0,
                seqset: 0,
                logged: true,
                host_gap: false,
                gap: 0,
                send_delta: 0,
                distance: 2,
            }),
        ),
        ("isotach_message", Packet::IsotachMessage(message)),
        (
            "isotach_message_msg",
            Packet::IsotachMessage(IsotachMessage {
                ts: Pulse::new(0),
                source: 0,
                dest: 1,
                sequum: 0,
                generation: Generation::new(0),
                sref: Sref::Msg {
                    handler: 3,
                    payload: b"hi".to_vec(),
                },
            }),
        ),
        (
            "end_of_isochron",
            Packet::EndOfIsochron(EndOfIsochron { iso_id: 9 }),
        ),
        (
            "isochron_marker",
            Packet::IsochronMarker(IsochronMarker {
                iso_id: 9,
                source: 0,
                ts: Pulse::new(12),
                sequum: 0,
                crc_xor: 0xdead_beef,
            }),
        ),
        (
            "eop_marker",
            Packet::EopMarker(EopMarker {
                ts: Pulse::new(12),
                count: 3,
                repeat: false,
                reset: false,
                end_of_epoch: false,
                signals: 0,
                barrier: 0,
                token_kind: Kind::Token as u8,
                token_crc: 0x0123_4567,
                sort_vector: vec![2, 0, 1],
            }),
        ),
        (
            "barrier_signal_marker",
            Packet::BarrierSignalMarker(BarrierSignalMarker {
                barrier: 0b01,
                barrier_count: 1,
                signals: 0x80,
                reset: false,
            }),
        ),
        (
            "plain",
            Packet::Plain(PlainMessage {
                source: 0,
                dest: 1,
                payload: b"ping".to_vec(),
            }),
        ),
    ]
}

/// The fuzz target a packet example seeds (besides `packet`, which takes them all).
fn target_of(name: &str) -> &str {
    name.strip_suffix("_msg").unwrap_or(name)
}

fn main() {
    let corpus = std::env::args().nth(1);
    for (name, p) in examples() {
        let bytes = p.to_vec();
        println!("{name} ({} bytes):\n  {}", bytes.len(), hex(&bytes));
        if let Some(dir) = &corpus {
            for target in [target_of(name), "packet"] {
                let d = Path::new(dir).join(target);
                std::fs::create_dir_all(&d).expect("create corpus dir");
                std::fs::write(d.join(format!("seed_{name}")), &bytes).expect("write seed");
            }
        }
    }
    // The SIU stamping a host's message in place.
    let (_, Packet::IsotachMessage(m)) = &examples()[2] else {
        unreachable!()
    };
    let mut bytes = Packet::IsotachMessage(m.clone()).to_vec();
    let stamp = Stamp {
        ts: Pulse::new(12),
        source: 0,
        sequum: 5,
        generation: Generation::new(1),
    };
    let crc = IsotachMessage::stamp_in_place(&mut bytes, stamp);
    println!(
        "isotach_message stamped ts=12 source=0 sequum=5 generation=1 (crc {crc:08x}):\n  {}",
        hex(&bytes)
    );
    if let Some(dir) = &corpus {
        let d = Path::new(dir).join("cluster_config");
        std::fs::create_dir_all(&d).expect("create corpus dir");
        std::fs::write(d.join("seed_two_switches.toml"), SEED_CONFIG).expect("write seed");
        for (target, seed) in [("siu_inputs", SEED_SIU), ("tm_inputs", SEED_TM)] {
            let d = Path::new(dir).join(target);
            std::fs::create_dir_all(&d).expect("create corpus dir");
            std::fs::write(d.join("seed_session"), seed).expect("write seed");
        }
    }
}

/// `run_siu` input: SIU mode, starts logical time, 4 hosts on 2 switches, host 0; the TM's
/// token, an isochron of one write to host 1, tokens, a message from the network, a barrier
/// marker, tokens, drain. (Layout: see `fuzz/src/lib.rs`.)
const SEED_SIU: &[u8] = &[
    0x04, 0x03, 0x01, 0x00, 0x01, 0x00, 0x06, // header
    0x05, 0x00, // TM token
    0x08, 0x02, 0x01, 0x00, 0x00, 0x00, 0x02, // start of isochron 1, logged, distance 2
    0x09, 0x01, 0x01, 0x00, 0x10, 0, 0, 0, 0, 0, 0, 0, 0x2a, 0x07, // write 42 to host 1
    0x0a, 0x01, // end of isochron 1
    0x05, 0x00, 0x05, 0x00, 0x05, 0x00, // TM tokens
    0x0c, 0x00, 0x00, 0x00, 0x00, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0x00, 0x01, 0x01,
    0x00, // net read
    0x05, 0x00, 0x05, 0x00, // TM tokens
    0x0b, 0x01, 0x01, // enter barrier 0, round 1
    0x05, 0x00, 0x05, 0x01, 0x05, 0x01, // TM tokens, barrier bits
    0x10, // drain
];

/// `run_tm` input: 4 hosts on 2 switches, TM 0; a reset from link 0, waves, a message, a
/// timer tick, drain.
const SEED_TM: &[u8] = &[
    0x00, 0x03, 0x01, 0x00, 0x01, 0x00, 0x06, // header
    0x06, 0x00, // restart token on link 0
    0x05, 0x00, 0x05, 0x03, // every neighbour replies (twice)
    0x07, 0x00, 0x01, 0x01, 0x00, 0x10, 0, 0, 0, 0, 0, 0, 0, 0x2a, 0x07, 0x05,
    0x00, // message
    0x05, 0x00, // wave
    0x01, 0x01, 0x00, // time passes
    0x0a, // drain
];

const SEED_CONFIG: &str = r#"[timing]
token-timeout-us = 2000
epoch-pulses = 8

[limits]
channels = 2

[[switch]]
name = "tm0"
[[switch]]
name = "tm1"

[[host]]
name = "alpha"
switch = "tm0"
[[host]]
name = "beta"
switch = "tm1"

[[trunk]]
between = ["tm0", "tm1"]
"#;
