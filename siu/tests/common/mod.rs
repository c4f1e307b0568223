//! What the SIU's integration tests share: host 1 of three on one switch, its token manager's
//! tokens, and one isochron of one message to host 2 (distance 1), packet by packet.

// Each test file uses its own subset.
#![allow(dead_code)]

use isotach_proto::config::{Limits, Timing};
use isotach_proto::packet::{EndOfIsochron, IsotachMessage, Packet, Sref, StartOfIsochron, Token};
use isotach_proto::topology::Topology;
use isotach_proto::{Generation, Pulse, WaveSeq};
use isotach_siu::{Mode, Siu, SiuConfig};
use std::sync::Arc;

/// The TM of the single switch.
pub(crate) const TM: u16 = 0x8000;

/// Host 1's SIU (5 ms token timer, 64-pulse epochs) in `mode`.
pub(crate) fn siu(mode: Mode, idle_pace_us: u64, host_turns: bool) -> Siu {
    Siu::new(SiuConfig {
        host: 1,
        mode,
        topology: Arc::new(Topology::line(3, 1).unwrap()),
        timing: Timing {
            token_timeout_us: 5_000,
            epoch_pulses: 64,
            idle_pace_us,
        },
        limits: Limits::default(),
        initiates_reset: false,
        host_turns,
    })
}

/// The TM's restart token of `generation`.
pub(crate) fn restart_token(generation: u32) -> Vec<u8> {
    Token {
        restart: true,
        source_port: TM,
        generation: Generation::new(generation),
        ..Token::default()
    }
    .to_bytes()
    .to_vec()
}

/// The TM's token of wave `wave`, generation 1.
pub(crate) fn tm_token(wave: u64) -> Vec<u8> {
    Token {
        seq: WaveSeq::of_wave(wave),
        source_port: TM,
        generation: Generation::new(1),
        ..Token::default()
    }
    .to_bytes()
    .to_vec()
}

/// Start of isochron `iso_id`, distance 1.
pub(crate) fn start_of_isochron(iso_id: u32) -> Vec<u8> {
    let soi = StartOfIsochron {
        iso_id,
        distance: 1,
        ..StartOfIsochron::default()
    };
    Packet::StartOfIsochron(soi).to_vec()
}

/// The isochron's message as the host sends it: to host 2, unstamped.
pub(crate) fn message_to_host_2() -> IsotachMessage {
    IsotachMessage {
        ts: Pulse::new(0),
        source: 1,
        dest: 2,
        sequum: 0,
        generation: Generation::new(1),
        sref: Sref::Msg {
            handler: 0,
            payload: vec![1],
        },
    }
}

/// End of isochron `iso_id`.
pub(crate) fn end_of_isochron(iso_id: u32) -> Vec<u8> {
    Packet::EndOfIsochron(EndOfIsochron { iso_id }).to_vec()
}

/// Opens isochron `iso_id` at `now_us` and sends its message; it stays open.
pub(crate) fn open_isochron(s: &mut Siu, now_us: u64, iso_id: u32) {
    s.handle_host(now_us, &start_of_isochron(iso_id)).unwrap();
    s.handle_host(
        now_us,
        &Packet::IsotachMessage(message_to_host_2()).to_vec(),
    )
    .unwrap();
}

/// One whole isochron at `now_us`.
pub(crate) fn isochron(s: &mut Siu, now_us: u64, iso_id: u32) {
    open_isochron(s, now_us, iso_id);
    s.handle_host(now_us, &end_of_isochron(iso_id)).unwrap();
}
