//! The SIU state machine fed an arbitrary interleaving of raw bytes, well-formed packets,
//! timer ticks and output drains.

use super::*;

fn drain_siu(siu: &mut Siu, hosts: usize) {
    while let Some(b) = siu.poll_host() {
        let p = must_decode(&b, "SIU (to host)");
        assert!(
            matches!(
                p.kind(),
                Kind::IsotachMessage | Kind::IsochronMarker | Kind::EopMarker | Kind::Plain
            ),
            "SIU sent a {:?} to its host",
            p.kind()
        );
    }
    while let Some(t) = siu.poll_net() {
        let p = must_decode(&t.bytes, "SIU (to net)");
        match (t.route, p.kind()) {
            (Route::Tm, Kind::Token | Kind::IsotachMessage) => {}
            (Route::Host(h), Kind::Plain) => assert!(usize::from(h) < hosts),
            (route, kind) => panic!("SIU sent a {kind:?} to {route:?}"),
        }
    }
}

/// Drives one SIU with the fuzz input. Layout: a header (mode and limit flags, hosts,
/// switches, host id, limits, timing), then operations of one opcode byte each followed by
/// their operands; missing bytes read as zero.
pub fn run_siu(data: &[u8]) {
    let mut inp = Input::new(data);
    let cluster = FuzzCluster::read(&mut inp);
    let hosts = cluster.hosts;
    let cfg = cluster.siu_config();
    let (host, mode, initiates_reset) = (cfg.host, cfg.mode, cfg.initiates_reset);
    let tm_port = Topology::switch_port(cfg.topology.switch_of(host));
    let port = Topology::host_port(host);
    let mut siu = Siu::new(cfg);
    let mut now: u64 = 0;
    if initiates_reset {
        siu.start(now);
    }
    while let Some(op) = inp.byte() {
        let corrupt = op & 0x80 != 0;
        match op & 0x7f {
            // Raw bytes from either side (the corrupt bit: in a buffer the SIU may take).
            0 => {
                let b = inp.blob(packet::PACKET_LEN_MAX + 8);
                if corrupt {
                    siu_input_owned(&mut siu, now, Side::Host, b.to_vec());
                } else {
                    let _ = siu.handle_host(now, b);
                }
            }
            1 => {
                let b = inp.blob(packet::PACKET_LEN_MAX + 8);
                if corrupt {
                    siu_input_owned(&mut siu, now, Side::Net, b.to_vec());
                } else {
                    let _ = siu.handle_net(now, b);
                }
            }
            // Time passes; timers run.
            2 | 3 => pass_time(&mut siu, &mut inp, &mut now, op & 0x7f == 3),
            // A token from the network built from fuzz fields.
            4 => {
                let b = fuzz_token_bytes(&mut inp, corrupt, tm_port, siu.generation());
                let _ = siu.handle_net(now, &b);
            }
            // The token manager's next token, as a well-behaved TM would send it.
            5 => {
                let f = inp.u8();
                let t = Token {
                    seq: WaveSeq::of_wave(siu.recvclock().wrapping_add(1)),
                    end_of_epoch: f & 0x04 != 0,
                    barrier: f & 3,
                    signals: if f & 0x08 != 0 { inp.u8() } else { 0 },
                    source_port: tm_port,
                    generation: siu.generation(),
                    ..Token::default()
                };
                let _ = siu.handle_net(now, &t.to_bytes());
            }
            // A token from the host (host mode), built from fuzz fields.
            6 => {
                let b = fuzz_token_bytes(&mut inp, corrupt, port, siu.generation());
                let _ = siu.handle_host(now, &b);
            }
            // The host's next token (host mode).
            7 => {
                let f = inp.u8();
                let t = Token {
                    seq: WaveSeq::of_wave(siu.sendclock().wrapping_add(1)),
                    barrier: f & 3,
                    source_port: port,
                    generation: siu.generation(),
                    ..Token::default()
                };
                let _ = siu.handle_host(now, &t.to_bytes());
            }
            // Isochrons from the host.
            8 => {
                let f = inp.u8();
                let soi = StartOfIsochron {
                    iso_id: u32::from(inp.u8() % 4),
                    channel: inp.u8() % 6,
                    seqset: f & 1,
                    logged: f & 2 != 0,
                    host_gap: f & 4 != 0,
                    gap: if f & 8 != 0 {
                        inp.u32()
                    } else {
                        u32::from(inp.u8())
                    },
                    send_delta: if f & 16 != 0 {
                        inp.u32()
                    } else {
                        u32::from(inp.u8() % 8)
                    },
                    distance: if f & 32 != 0 {
                        inp.u16()
                    } else {
                        u16::from(inp.u8() % 6)
                    },
                };
                let b = encode_maybe_corrupt(&mut inp, corrupt, &Packet::StartOfIsochron(soi));
                let _ = siu.handle_host(now, &b);
            }
            9 => {
                let m = fuzz_message(&mut inp, hosts);
                let b = encode_maybe_corrupt(&mut inp, corrupt, &Packet::IsotachMessage(m));
                siu_input_owned(&mut siu, now, Side::Host, b);
            }
            10 => {
                let eoi = EndOfIsochron {
                    iso_id: u32::from(inp.u8() % 4),
                };
                let _ = siu.handle_host(now, &encode(&Packet::EndOfIsochron(eoi)));
            }
            // Barrier/signal markers from the host.
            11 => {
                let f = inp.u8();
                let m = BarrierSignalMarker {
                    barrier: f & 3,
                    barrier_count: u32::from(inp.u8() % 8),
                    signals: if f & 4 != 0 { inp.u8() } else { 0 },
                    reset: f & 8 != 0,
                };
                let _ = siu.handle_host(now, &encode(&Packet::BarrierSignalMarker(m)));
            }
            // An isotach message from the network, near the receive clock.
            12 => {
                let f = inp.u8();
                let mut m = fuzz_message(&mut inp, hosts);
                if f & 1 == 0 {
                    m.dest = host;
                }
                let delta = i64::from(inp.u8() as i8);
                m.ts = Pulse::new(siu.recvclock().saturating_add_signed(delta % 8));
                if f & 2 != 0 {
                    m.ts = Pulse::new(inp.u64());
                }
                m.source = u16::from(inp.u8() % 8);
                m.sequum = u64::from(inp.u8());
                // Mostly of the SIU's generation (else stale and dropped at once).
                m.generation =
                    Generation::new(siu.generation().get().wrapping_sub(u32::from(f & 4 != 0)));
                let b = encode_maybe_corrupt(&mut inp, corrupt, &Packet::IsotachMessage(m));
                siu_input_owned(&mut siu, now, Side::Net, b);
            }
            // Non-isotach traffic, either way.
            13 => {
                let f = inp.u8();
                let b = fuzz_plain_bytes(&mut inp, corrupt);
                if f & 1 == 0 {
                    let _ = siu.handle_host(now, &b);
                } else {
                    let _ = siu.handle_net(now, &b);
                }
            }
            // Other kinds either way (markers the host must never send, etc.).
            14 => {
                let f = inp.u8();
                let p = match f % 3 {
                    0 => Packet::EopMarker(EopMarker {
                        count: u32::from(inp.u8()),
                        ..EopMarker::default()
                    }),
                    1 => Packet::IsochronMarker(IsochronMarker {
                        iso_id: u32::from(inp.u8()),
                        ..IsochronMarker::default()
                    }),
                    _ => Packet::StartOfIsochron(StartOfIsochron {
                        distance: 1,
                        ..StartOfIsochron::default()
                    }),
                };
                let b = encode(&p);
                if f & 0x80 == 0 {
                    let _ = siu.handle_host(now, &b);
                } else {
                    let _ = siu.handle_net(now, &b);
                }
            }
            15 => siu.start(now),
            // The application goes away: what the SIU holds for the host comes back to it;
            // or a new application attaches.
            16 => {
                while let Some(b) = siu.poll_host() {
                    let _ = siu.host_absent(&b);
                }
                let b = inp.blob(packet::PACKET_LEN_MAX + 8);
                let _ = siu.host_absent(b);
            }
            17 => siu.host_attached(),
            // The in-process host's turn ends (host turns).
            18 => siu.end_host_turn(now),
            _ => drain_siu(&mut siu, hosts),
        }
        if mode == Mode::Siu && siu.started() {
            assert!(
                siu.sendclock() <= siu.recvclock() + 1,
                "SIU mode sent token {} before token {} arrived",
                siu.sendclock(),
                siu.sendclock() - 1
            );
        }
    }
    drain_siu(&mut siu, hosts);
}

/// `Siu::handle_host_owned` / `handle_net_owned` through [`owned_input`].
fn siu_input_owned(siu: &mut Siu, now: u64, side: Side, bytes: Vec<u8>) {
    owned_input(bytes, |buf| match side {
        Side::Host => siu.handle_host_owned(now, buf),
        Side::Net => siu.handle_net_owned(now, buf),
    });
}
