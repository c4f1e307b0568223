use super::*;
use crate::logical::Pulse;
use crate::logical::{Generation, WaveSeq};
use proptest::prelude::*;

fn arb_token() -> impl Strategy<Value = Token> {
    let flags = (
        0u8..4,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    );
    let fields = (0u8..4, any::<u8>(), any::<u16>(), any::<u32>());
    (flags, fields).prop_map(
        |(
            (seq, repeat, reset, end_of_epoch, restart, busy),
            (barrier, signals, source_port, generation),
        )| {
            Token {
                seq: WaveSeq::from_bits(seq),
                repeat,
                reset,
                end_of_epoch,
                restart,
                busy,
                barrier,
                signals,
                source_port,
                generation: Generation::new(generation),
            }
        },
    )
}

fn arb_soi() -> impl Strategy<Value = StartOfIsochron> {
    (
        any::<u32>(),
        any::<u8>(),
        0u8..2,
        any::<bool>(),
        any::<bool>(),
        any::<u32>(),
        any::<u32>(),
        1u16..,
    )
        .prop_map(
            |(iso_id, channel, seqset, logged, host_gap, gap, send_delta, distance)| {
                StartOfIsochron {
                    iso_id,
                    channel,
                    seqset,
                    logged,
                    host_gap,
                    gap,
                    send_delta,
                    distance,
                }
            },
        )
}

fn arb_sref() -> impl Strategy<Value = Sref> {
    let mem = (
        prop_oneof![
            Just(SrefOp::Read),
            Just(SrefOp::Write),
            Just(SrefOp::Sched),
            Just(SrefOp::Assign)
        ],
        any::<bool>(),
        any::<u64>(),
        any::<u64>(),
        any::<u32>(),
    )
        .prop_map(|(op, wide, addr, value, ref_id)| {
            let width = if wide { Width::W64 } else { Width::W32 };
            Sref::Mem {
                op,
                width,
                addr,
                value: value & width.max_value(),
                ref_id,
            }
        });
    let msg = (
        any::<u16>(),
        proptest::collection::vec(any::<u8>(), 0..=MSG_PAYLOAD_MAX),
    )
        .prop_map(|(handler, payload)| Sref::Msg { handler, payload });
    let rmw = (
        prop_oneof![
            Just(RmwOp::Add),
            Just(RmwOp::CompareAndSwap),
            any::<u16>().prop_map(RmwOp::Apply)
        ],
        any::<bool>(),
        any::<u64>(),
        (any::<u64>(), any::<u64>()),
        any::<u32>(),
        any::<bool>(),
    )
        .prop_map(|(op, wide, addr, (arg, arg2), ref_id, answer)| {
            let width = if wide { Width::W64 } else { Width::W32 };
            Sref::Rmw(RmwSref {
                op,
                width,
                addr,
                arg: arg & width.max_value(),
                // Only compare-and-swap has a second argument.
                arg2: if op == RmwOp::CompareAndSwap {
                    arg2 & width.max_value()
                } else {
                    0
                },
                ref_id,
                answer,
            })
        });
    prop_oneof![mem, msg, rmw]
}

fn arb_message() -> impl Strategy<Value = IsotachMessage> {
    (
        any::<u64>(),
        any::<u16>(),
        any::<u16>(),
        any::<u64>(),
        any::<u32>(),
        arb_sref(),
    )
        .prop_map(
            |(ts, source, dest, sequum, generation, sref)| IsotachMessage {
                ts: Pulse::new(ts),
                source,
                dest,
                sequum,
                generation: Generation::new(generation),
                sref,
            },
        )
}

fn arb_eop() -> impl Strategy<Value = EopMarker> {
    (
        any::<u64>(),
        0usize..=SORT_VECTOR_MAX,
        0u32..1000,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<u8>(),
        0u8..4,
        any::<u32>(),
        any::<u64>(),
    )
        .prop_map(
            |(
                ts,
                len,
                extra,
                repeat,
                reset,
                end_of_epoch,
                signals,
                barrier,
                token_crc,
                shuffle,
            )| {
                // A permutation of 0..len derived from `shuffle`.
                let mut sort_vector: Vec<u8> = (0..len as u8).collect();
                let mut s = shuffle;
                for i in (1..sort_vector.len()).rev() {
                    s = s
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    sort_vector.swap(i, (s >> 33) as usize % (i + 1));
                }
                EopMarker {
                    ts: Pulse::new(ts),
                    count: len as u32 + extra,
                    repeat,
                    reset,
                    end_of_epoch,
                    signals,
                    barrier,
                    token_kind: Kind::Token as u8,
                    token_crc,
                    sort_vector,
                }
            },
        )
}

fn arb_packet() -> impl Strategy<Value = Packet> {
    prop_oneof![
        arb_token().prop_map(Packet::Token),
        arb_soi().prop_map(Packet::StartOfIsochron),
        arb_message().prop_map(Packet::IsotachMessage),
        any::<u32>().prop_map(|iso_id| Packet::EndOfIsochron(EndOfIsochron { iso_id })),
        (
            any::<u32>(),
            any::<u16>(),
            any::<u64>(),
            any::<u64>(),
            any::<u32>()
        )
            .prop_map(
                |(iso_id, source, ts, sequum, crc_xor)| Packet::IsochronMarker(IsochronMarker {
                    iso_id,
                    source,
                    ts: Pulse::new(ts),
                    sequum,
                    crc_xor
                })
            ),
        arb_eop().prop_map(Packet::EopMarker),
        (0u8..4, any::<u32>(), any::<u8>(), any::<bool>()).prop_map(
            |(barrier, barrier_count, signals, reset)| {
                Packet::BarrierSignalMarker(BarrierSignalMarker {
                    barrier,
                    barrier_count,
                    signals,
                    reset,
                })
            }
        ),
        (
            any::<u16>(),
            any::<u16>(),
            proptest::collection::vec(any::<u8>(), 0..=PLAIN_PAYLOAD_MAX)
        )
            .prop_map(|(source, dest, payload)| Packet::Plain(PlainMessage {
                source,
                dest,
                payload
            })),
    ]
}

proptest! {
    #[test]
    fn every_kind_round_trips(p in arb_packet()) {
        let bytes = p.to_vec();
        prop_assert_eq!(carried_crc(&bytes), crc32(&bytes[..bytes.len() - CRC_LEN]));
        prop_assert_eq!(Packet::decode(&bytes), Ok(p));
    }

    #[test]
    fn any_single_bit_flip_is_rejected(p in arb_packet(), at in any::<prop::sample::Index>(), bit in 0u8..8) {
        let mut bytes = p.to_vec();
        let i = at.index(bytes.len());
        bytes[i] ^= 1 << bit;
        prop_assert!(Packet::decode(&bytes).is_err());
    }

    #[test]
    fn truncation_and_extension_are_rejected(p in arb_packet(), cut in any::<prop::sample::Index>(), tail in any::<u8>()) {
        let bytes = p.to_vec();
        let n = cut.index(bytes.len());
        prop_assert!(Packet::decode(&bytes[..n]).is_err());
        let mut longer = bytes.clone();
        longer.push(tail);
        prop_assert!(Packet::decode(&longer).is_err());
    }

    #[test]
    fn validate_agrees_with_decode(p in arb_packet(), at in any::<prop::sample::Index>(), bit in 0u8..8, flip in any::<bool>()) {
        let mut bytes = p.to_vec();
        if flip {
            let i = at.index(bytes.len());
            bytes[i] ^= 1 << bit;
        }
        let decoded = IsotachMessage::decode(&bytes);
        prop_assert_eq!(IsotachMessage::validate(&bytes), decoded.map(|m| m.dest));
    }

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..128)) {
        let _ = Packet::decode(&bytes);
    }

    #[test]
    fn stamping_in_place_matches_encoding(m in arb_message(), ts in any::<u64>(), source in any::<u16>(), sequum in any::<u64>(), generation in any::<u32>()) {
        let mut bytes = m.to_packet_bytes();
        let crc = IsotachMessage::stamp_in_place(&mut bytes, Stamp { ts: Pulse::new(ts), source, sequum, generation: Generation::new(generation) });
        let stamped = IsotachMessage { ts: Pulse::new(ts), source, sequum, generation: Generation::new(generation), ..m };
        let mut expect = Vec::new();
        let expect_crc = stamped.encode(&mut expect);
        prop_assert_eq!(crc, expect_crc);
        prop_assert_eq!(&bytes, &expect);
        prop_assert_eq!(IsotachMessage::peek_stamp(&bytes), Some((Pulse::new(ts), source, sequum)));
        prop_assert_eq!(IsotachMessage::peek_dest(&bytes), Some(stamped.dest));
        prop_assert_eq!(IsotachMessage::peek_generation(&bytes), Some(Generation::new(generation)));
    }
}

impl IsotachMessage {
    fn to_packet_bytes(&self) -> Vec<u8> {
        let mut v = Vec::new();
        self.encode(&mut v);
        v
    }
}

/// Re-seals `bytes` after a field was edited, so the decoder reaches the field check.
fn reseal(bytes: &mut [u8]) {
    let at = bytes.len() - CRC_LEN;
    let crc = crc32(&bytes[..at]);
    bytes[at..].copy_from_slice(&crc.to_be_bytes());
}

fn token_bytes() -> Vec<u8> {
    Token {
        seq: WaveSeq::from_bits(1),
        source_port: 3,
        generation: Generation::new(1),
        ..Token::default()
    }
    .to_bytes()
    .to_vec()
}

#[test]
fn a_plain_message_parses_borrowed_as_it_decodes() {
    let m = PlainMessage {
        source: 3,
        dest: 1,
        payload: b"an answer".to_vec(),
    };
    let mut bytes = Vec::new();
    let crc = m.encode(&mut bytes);
    let v = PlainMessage::parse(&bytes).unwrap();
    assert_eq!(v, m.view());
    assert_eq!(PlainMessage::decode(&bytes).unwrap(), m);
    let mut again = Vec::new();
    assert_eq!(v.encode(&mut again), crc);
    assert_eq!(again, bytes);
    // Refused alike: a flipped payload byte fails the CRC either way.
    bytes[8] ^= 1;
    assert!(PlainMessage::parse(&bytes).is_err() && PlainMessage::decode(&bytes).is_err());
}

#[test]
fn short_packet_is_typed() {
    assert_eq!(
        Packet::decode(&[]),
        Err(DecodeError::Short { need: 6, got: 0 })
    );
    let b = token_bytes();
    assert!(matches!(
        Token::decode(&b[..10]),
        Err(DecodeError::Short {
            need: TOKEN_LEN,
            got: 10
        })
    ));
}

#[test]
fn long_packet_is_typed() {
    let mut b = token_bytes();
    b.extend_from_slice(&[0, 0, 0, 0]);
    reseal(&mut b);
    assert!(matches!(
        Token::decode(&b),
        Err(DecodeError::Long {
            max: TOKEN_LEN,
            got: 20
        })
    ));
}

#[test]
fn bad_version_is_typed() {
    let mut b = token_bytes();
    b[0] = 2;
    assert_eq!(Packet::decode(&b), Err(DecodeError::BadVersion(2)));
}

#[test]
fn unknown_and_wrong_kinds_are_typed() {
    let mut b = token_bytes();
    b[1] = 0x7f;
    assert_eq!(Packet::decode(&b), Err(DecodeError::UnknownKind(0x7f)));
    let b = token_bytes();
    assert_eq!(
        EopMarker::decode(&b),
        Err(DecodeError::WrongKind {
            expected: Kind::EopMarker,
            found: Kind::Token
        })
    );
}

#[test]
fn bad_crc_is_typed() {
    let mut b = token_bytes();
    b[5] ^= 0x40;
    assert!(matches!(Token::decode(&b), Err(DecodeError::BadCrc { .. })));
}

#[test]
fn out_of_range_fields_are_typed() {
    let cases: Vec<(Vec<u8>, usize, u8, &str)> = vec![
        (token_bytes(), 2, 0x80, "token.flags"),
        (token_bytes(), 3, 0x04, "token.barrier"),
        (token_bytes(), 7, 0x01, "token.reserved"),
        (
            Packet::StartOfIsochron(StartOfIsochron {
                distance: 1,
                ..Default::default()
            })
            .to_vec(),
            7,
            2,
            "soi.seqset",
        ),
        (
            Packet::StartOfIsochron(StartOfIsochron {
                distance: 1,
                ..Default::default()
            })
            .to_vec(),
            11,
            0,
            "soi.distance",
        ),
        (
            Packet::EndOfIsochron(EndOfIsochron { iso_id: 1 }).to_vec(),
            6,
            1,
            "eoi.reserved",
        ),
        (
            Packet::BarrierSignalMarker(BarrierSignalMarker::default()).to_vec(),
            4,
            2,
            "bsm.flags",
        ),
        (
            Packet::EopMarker(EopMarker::default()).to_vec(),
            5,
            33,
            "eop.sort_len",
        ),
    ];
    for (mut b, at, value, field) in cases {
        b[at] = value;
        reseal(&mut b);
        match Packet::decode(&b) {
            Err(DecodeError::OutOfRange { field: f, .. }) => assert_eq!(f, field),
            other => panic!("{field}: expected OutOfRange, got {other:?}"),
        }
    }
}

#[test]
fn thirty_two_bit_value_must_fit() {
    let m = IsotachMessage {
        ts: Pulse::new(1),
        source: 0,
        dest: 1,
        sequum: 0,
        generation: Generation::new(1),
        sref: Sref::Mem {
            op: SrefOp::Write,
            width: Width::W32,
            addr: 0,
            value: 7,
            ref_id: 0,
        },
    };
    let mut b = m.to_packet_bytes();
    b[36] = 1; // high byte of value
    reseal(&mut b);
    assert!(matches!(
        IsotachMessage::decode(&b),
        Err(DecodeError::OutOfRange {
            field: "message.value",
            ..
        })
    ));
}

#[test]
fn sort_vector_must_be_a_permutation() {
    let eop = EopMarker {
        count: 3,
        sort_vector: vec![0, 1, 2],
        ..Default::default()
    };
    let mut b = Packet::EopMarker(eop).to_vec();
    b[EOP_LEN_MIN - CRC_LEN + 1] = 0; // [0, 0, 2]: duplicate
    reseal(&mut b);
    assert!(matches!(
        EopMarker::decode(&b),
        Err(DecodeError::OutOfRange {
            field: "eop.sort_vector",
            ..
        })
    ));
}

#[test]
fn sort_vector_longer_than_count_is_rejected() {
    let eop = EopMarker {
        count: 1,
        sort_vector: vec![0],
        ..Default::default()
    };
    let mut b = Packet::EopMarker(eop).to_vec();
    b[16..20].copy_from_slice(&0u32.to_be_bytes());
    reseal(&mut b);
    assert!(matches!(
        EopMarker::decode(&b),
        Err(DecodeError::OutOfRange {
            field: "eop.sort_len",
            ..
        })
    ));
}

#[test]
fn token_layout_is_sixteen_bytes_big_endian() {
    let t = Token {
        seq: WaveSeq::from_bits(2),
        repeat: true,
        reset: false,
        end_of_epoch: true,
        restart: false,
        busy: true,
        barrier: 0b11,
        signals: 0xa5,
        source_port: 0x1234,
        generation: Generation::new(0x0102_0304),
    };
    let b = t.to_bytes();
    assert_eq!(
        &b[..12],
        &[1, 0x01, 0b0101_0110, 0b11, 0x12, 0x34, 0xa5, 0, 1, 2, 3, 4]
    );
    assert_eq!(
        u32::from_be_bytes([b[12], b[13], b[14], b[15]]),
        crc32(&b[..12])
    );
}

#[test]
fn is_repeat_reads_the_flag_of_valid_tokens_only() {
    let plain = Token {
        seq: WaveSeq::from_bits(2),
        generation: Generation::new(1),
        ..Token::default()
    };
    let repeat = Token {
        repeat: true,
        ..plain
    };
    assert!(!Token::is_repeat(&plain.to_bytes()));
    assert!(Token::is_repeat(&repeat.to_bytes()));
    let mut corrupt = repeat.to_bytes();
    let last = corrupt.len() - 1;
    corrupt[last] ^= 1;
    assert!(!Token::is_repeat(&corrupt), "a bad CRC is not a repeat");
    assert!(!Token::is_repeat(&[]));
}

#[test]
fn rmw_messages_are_64_bytes_and_their_fields_are_checked() {
    let m = IsotachMessage {
        ts: Pulse::new(3),
        source: 1,
        dest: 2,
        sequum: 9,
        generation: Generation::new(1),
        sref: Sref::Rmw(RmwSref {
            op: RmwOp::Apply(7),
            width: Width::W32,
            addr: 0x0000_0002_0000_0005,
            arg: 11,
            arg2: 0,
            ref_id: 4,
            answer: true,
        }),
    };
    let mut b = Vec::new();
    m.encode(&mut b);
    assert_eq!(b.len(), RMW_MESSAGE_LEN);
    assert_eq!(IsotachMessage::decode(&b).unwrap(), m);
    // Body offsets: addr 28, arg 36, arg2 44, ref_id 52, func 56, flags 58, reserved 59.
    let refused = |at: usize, byte: u8| {
        let mut x = b.clone();
        x[at] = byte;
        let n = x.len() - 4;
        let crc = crc32(&x[..n]);
        x[n..].copy_from_slice(&crc.to_be_bytes());
        IsotachMessage::decode(&x).is_err()
    };
    assert!(refused(58, 0b10), "an unknown flag");
    assert!(refused(59, 1), "the reserved byte");
    assert!(refused(44 + 7, 1), "apply has no second argument");
    assert!(refused(36 + 3, 1), "an argument wider than 32 bits");
    assert!(!refused(58, 0), "not answering is fine");
}

#[test]
fn built_in_rmw_operations() {
    assert_eq!(
        RmwOp::Add.built_in(Width::W32, u64::from(u32::MAX), 2, 0),
        Some(1)
    );
    assert_eq!(RmwOp::Add.built_in(Width::W64, u64::MAX, 1, 0), Some(0));
    assert_eq!(RmwOp::CompareAndSwap.built_in(Width::W64, 5, 5, 9), Some(9));
    assert_eq!(RmwOp::CompareAndSwap.built_in(Width::W64, 6, 5, 9), Some(6));
    assert_eq!(RmwOp::Apply(1).built_in(Width::W64, 6, 5, 0), None);
}

#[test]
fn busy_is_flag_bit_6_and_bit_7_stays_reserved() {
    let idle = Token {
        seq: WaveSeq::from_bits(3),
        generation: Generation::new(1),
        ..Token::default()
    };
    let busy = Token {
        busy: true,
        repeat: true,
        ..idle
    };
    let b = busy.to_bytes();
    assert_eq!(b[2], 0b0100_0111, "seq 3, repeat, busy");
    assert_eq!(Token::decode(&b), Ok(busy));
    assert!(!Token::decode(&idle.to_bytes()).unwrap().busy);
    let mut high = idle.to_bytes();
    high[2] |= 0x80;
    reseal(&mut high);
    assert!(matches!(
        Token::decode(&high),
        Err(DecodeError::OutOfRange {
            field: "token.flags",
            ..
        })
    ));
}
