//! The token manager fed an arbitrary interleaving of raw bytes, well-formed tokens and
//! messages, timer ticks and output drains.

use super::*;

fn drain_tm(tm: &mut TokenManager, links: usize, port: u16) {
    while let Some((link, b)) = tm.poll_transmit() {
        assert!(link < links, "TM sent on link {link} of {links}");
        let p = must_decode(&b, "TM");
        match p {
            Packet::Token(t) => assert_eq!(t.source_port, port, "TM token with a foreign port"),
            Packet::IsotachMessage(_) | Packet::Plain(_) => {}
            other => panic!("TM forwarded a {:?}", other.kind()),
        }
    }
}

/// Drives one token manager with the fuzz input (same layout idea as [`run_siu`]).
pub fn run_tm(data: &[u8]) {
    let mut inp = Input::new(data);
    let cluster = FuzzCluster::read(&mut inp);
    let hosts = cluster.hosts;
    let cfg = cluster.tm_config();
    let switch = cfg.switch;
    let mut tm = TokenManager::new(cfg);
    let port = Topology::switch_port(switch);
    let ports: Vec<u16> = tm.links().map(hop_port).collect();
    let links = ports.len();
    let mut now: u64 = 0;
    // A link index, sometimes one past the last (which the TM must refuse).
    let pick = |inp: &mut Input<'_>| usize::from(inp.u8()) % (links + 1);
    let port_of = |l: usize| ports.get(l).copied().unwrap_or(0x7fff);
    while let Some(op) = inp.byte() {
        let corrupt = op & 0x80 != 0;
        match op & 0x7f {
            0 => {
                let l = pick(&mut inp);
                let b = inp.blob(packet::PACKET_LEN_MAX + 8);
                if corrupt {
                    owned_input(b.to_vec(), |buf| tm.handle_input_owned(now, l, buf));
                } else {
                    let _ = tm.handle_input(now, l, b);
                }
            }
            1 | 2 => pass_time(&mut tm, &mut inp, &mut now, op & 0x7f == 2),
            // A token from fuzz fields on some link.
            3 => {
                let l = pick(&mut inp);
                let b = fuzz_token_bytes(&mut inp, corrupt, port_of(l), tm.generation());
                let _ = tm.handle_input(now, l, &b);
            }
            // A neighbour's reply to the last wave on one link.
            4 => {
                let l = pick(&mut inp);
                let f = inp.u8();
                let t = Token {
                    seq: WaveSeq::of_wave(tm.waves()),
                    barrier: f & 3,
                    signals: if f & 4 != 0 { inp.u8() } else { 0 },
                    source_port: port_of(l),
                    generation: tm.generation(),
                    ..Token::default()
                };
                let _ = tm.handle_input(now, l, &t.to_bytes());
            }
            // Every neighbour replies to the last wave (the next wave goes out).
            5 => {
                let f = inp.u8();
                for (l, &p) in ports.iter().enumerate() {
                    let t = Token {
                        seq: WaveSeq::of_wave(tm.waves()),
                        barrier: (f >> (l % 4)) & 3,
                        source_port: p,
                        generation: tm.generation(),
                        ..Token::default()
                    };
                    let _ = tm.handle_input(now, l, &t.to_bytes());
                }
            }
            // A restart token of a newer generation from some neighbour.
            6 => {
                let l = pick(&mut inp);
                let t = Token {
                    restart: true,
                    source_port: port_of(l),
                    generation: tm.generation().next(),
                    ..Token::default()
                };
                let _ = tm.handle_input(now, l, &t.to_bytes());
            }
            // Isotach and non-isotach messages to forward.
            7 => {
                let l = pick(&mut inp);
                let mut m = fuzz_message(&mut inp, hosts);
                m.ts = Pulse::new(u64::from(inp.u8()));
                m.source = u16::from(inp.u8() % 8);
                // Mostly of the TM's generation (else stale and dropped at once).
                m.generation = Generation::new(
                    tm.generation()
                        .get()
                        .wrapping_sub(u32::from(inp.u8() & 3 == 0)),
                );
                let b = encode_maybe_corrupt(&mut inp, corrupt, &Packet::IsotachMessage(m));
                // The driver's path: the TM may take the buffer.
                owned_input(b, |buf| tm.handle_input_owned(now, l, buf));
            }
            8 => {
                let l = pick(&mut inp);
                let b = fuzz_plain_bytes(&mut inp, corrupt);
                let _ = tm.handle_input(now, l, &b);
            }
            // Kinds a TM never handles.
            9 => {
                let l = pick(&mut inp);
                let p = match inp.u8() % 3 {
                    0 => Packet::EopMarker(EopMarker::default()),
                    1 => Packet::EndOfIsochron(EndOfIsochron { iso_id: 1 }),
                    _ => Packet::BarrierSignalMarker(BarrierSignalMarker::default()),
                };
                let _ = tm.handle_input(now, l, &encode(&p));
            }
            _ => drain_tm(&mut tm, links, port),
        }
    }
    drain_tm(&mut tm, links, port);
}
