//! Decoders: every packet kind's decoder and the SMM's host replies never panic, agree with
//! their input and re-encode to it.

use super::*;

/// A packet type with a kind-specific decoder.
pub trait Wire: Sized + std::fmt::Debug + PartialEq {
    /// The kind byte this decoder accepts.
    const KIND: Kind;
    /// The kind-specific decoder.
    fn decode(bytes: &[u8]) -> Result<Self, DecodeError>;
    /// Appends the encoding; returns its CRC.
    fn encode(&self, out: &mut Vec<u8>) -> u32;
    /// Wraps the value as a [`Packet`].
    fn into_packet(self) -> Packet;
    /// Extra properties of a value that decoded from `bytes`.
    fn extra_checks(&self, _bytes: &[u8]) {}
}

/// No properties beyond the shared ones.
fn no_extra_checks<T>(_: &T, _: &[u8]) {}

macro_rules! wire {
    ($ty:ident, $kind:ident) => {
        wire!($ty, $kind, no_extra_checks);
    };
    ($ty:ident, $kind:ident, $extra:path) => {
        impl Wire for $ty {
            const KIND: Kind = Kind::$kind;
            fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
                $ty::decode(bytes)
            }
            fn encode(&self, out: &mut Vec<u8>) -> u32 {
                $ty::encode(self, out)
            }
            fn into_packet(self) -> Packet {
                Packet::$kind(self)
            }
            fn extra_checks(&self, bytes: &[u8]) {
                $extra(self, bytes)
            }
        }
    };
}

wire!(Token, Token, token_checks);
wire!(StartOfIsochron, StartOfIsochron);
wire!(IsotachMessage, IsotachMessage, message_checks);
wire!(EndOfIsochron, EndOfIsochron);
wire!(IsochronMarker, IsochronMarker);
wire!(EopMarker, EopMarker, eop_checks);
wire!(BarrierSignalMarker, BarrierSignalMarker);
wire!(PlainMessage, Plain, plain_checks);

fn token_checks(t: &Token, bytes: &[u8]) {
    assert!(
        t.seq.bits() <= 3 && t.barrier <= packet::BARRIER_MASK,
        "{t:?}"
    );
    assert_eq!(
        t.to_bytes().as_slice(),
        bytes,
        "to_bytes differs from encode"
    );
}

fn eop_checks(e: &EopMarker, _bytes: &[u8]) {
    let n = e.sort_vector.len();
    assert!(
        n <= packet::SORT_VECTOR_MAX && n as u64 <= u64::from(e.count),
        "{e:?}"
    );
    let mut sorted = e.sort_vector.clone();
    sorted.sort_unstable();
    assert!(
        sorted.iter().copied().eq(0..n as u8),
        "not a permutation: {e:?}"
    );
}

fn plain_checks(m: &PlainMessage, bytes: &[u8]) {
    assert!(m.payload.len() <= packet::PLAIN_PAYLOAD_MAX);
    assert!(bytes.len() <= packet::PACKET_LEN_MAX);
    // The hot path's borrowed parse reads what decode copies out.
    assert_eq!(PlainMessage::parse(bytes), Ok(m.view()));
}

/// The SIU's hot path: stamping a valid message in place keeps it valid, changes exactly the
/// stamped fields, and the peek helpers read what was stamped.
fn message_checks(m: &IsotachMessage, bytes: &[u8]) {
    assert_eq!(m.encoded_len(), bytes.len());
    assert_eq!(IsotachMessage::peek_dest(bytes), Some(m.dest));
    assert_eq!(
        IsotachMessage::peek_stamp(bytes),
        Some((m.ts, m.source, m.sequum))
    );
    assert_eq!(IsotachMessage::peek_generation(bytes), Some(m.generation));
    if let Sref::Mem { width, value, .. } = &m.sref {
        assert!(*value <= width.max_value());
    }
    // Stamp values derived from the input so they vary with it.
    let h = u64::from(packet::crc32(bytes));
    let (ts, source, sequum) = (
        Pulse::new(h.rotate_left(17) ^ m.sequum),
        (h >> 7) as u16,
        !m.ts.get() ^ h,
    );
    let generation = Generation::new((h >> 3) as u32 ^ m.generation.get());
    let mut stamped = bytes.to_vec();
    let stamp = packet::Stamp {
        ts,
        source,
        sequum,
        generation,
    };
    let crc = IsotachMessage::stamp_in_place(&mut stamped, stamp);
    assert_eq!(crc, packet::carried_crc(&stamped));
    let back = IsotachMessage::decode(&stamped).expect("a stamped valid message must decode");
    assert_eq!(
        back,
        IsotachMessage {
            ts,
            source,
            sequum,
            generation,
            ..m.clone()
        }
    );
    let mut re = Vec::new();
    back.encode(&mut re);
    assert_eq!(re, stamped, "stamp_in_place differs from re-encoding");
}

/// The bytes with the last four replaced by the CRC-32 of the rest (`None` if too short).
pub fn with_fixed_crc(data: &[u8]) -> Option<Vec<u8>> {
    let at = data.len().checked_sub(packet::CRC_LEN)?;
    let mut v = data.to_vec();
    let crc = packet::crc32(&v[..at]);
    v[at..].copy_from_slice(&crc.to_be_bytes());
    Some(v)
}

/// Properties every decoder error must have with respect to its input.
fn check_error(bytes: &[u8], e: &DecodeError) {
    let len = bytes.len();
    match *e {
        DecodeError::Short { need, got } => {
            assert_eq!(got, len, "{e}");
            assert!(need > got, "{e}");
        }
        DecodeError::Long { max, got } => {
            assert_eq!(got, len, "{e}");
            assert!(max < got, "{e}");
        }
        DecodeError::BadVersion(v) => {
            assert_eq!(v, bytes[0], "{e}");
            assert_ne!(v, packet::VERSION, "{e}");
        }
        DecodeError::UnknownKind(k) => {
            assert_eq!(k, bytes[1], "{e}");
            assert!(Kind::from_byte(k).is_err(), "{e}");
        }
        DecodeError::WrongKind { expected, found } => {
            assert_ne!(expected, found, "{e}");
            assert_eq!(found as u8, bytes[1], "{e}");
        }
        DecodeError::BadCrc { found, computed } => {
            assert_ne!(found, computed, "{e}");
            assert_eq!(found, packet::carried_crc(bytes), "{e}");
            assert_eq!(
                computed,
                packet::crc32(&bytes[..len - packet::CRC_LEN]),
                "{e}"
            );
        }
        DecodeError::OutOfRange { field, .. } => assert!(!field.is_empty()),
    }
}

fn check_decoder_once<T: Wire>(bytes: &[u8]) -> Result<(), DecodeError> {
    let decoded = T::decode(bytes);
    let any = Packet::decode(bytes);
    match decoded {
        Ok(v) => {
            let mut out = Vec::new();
            let crc = v.encode(&mut out);
            assert_eq!(out, bytes, "decode → encode changed the bytes of {v:?}");
            assert_eq!(crc, packet::carried_crc(bytes));
            assert_eq!(bytes[1], T::KIND as u8);
            v.extra_checks(bytes);
            assert_eq!(any, Ok(v.into_packet()), "Packet::decode disagrees");
            Ok(())
        }
        Err(e) => {
            check_error(bytes, &e);
            // On bytes of this decoder's kind, Packet::decode must fail the same way.
            if bytes.len() >= 2 && bytes[1] == T::KIND as u8 {
                assert_eq!(any, Err(e.clone()), "Packet::decode disagrees");
            }
            Err(e)
        }
    }
}

/// Fuzzes one kind-specific decoder (see the module documentation).
pub fn check_decoder<T: Wire>(data: &[u8]) {
    let _ = check_decoder_once::<T>(data);
    if let Some(fixed) = with_fixed_crc(data)
        && let Err(e) = check_decoder_once::<T>(&fixed)
    {
        assert!(
            !matches!(e, DecodeError::BadCrc { .. }),
            "a repaired CRC was refused: {e}"
        );
    }
}

fn check_packet_once(bytes: &[u8]) {
    let any = Packet::decode(bytes);
    match &any {
        Ok(p) => {
            assert_eq!(
                p.to_vec(),
                bytes,
                "decode → encode changed the bytes of {p:?}"
            );
            assert_eq!(p.kind() as u8, bytes[1]);
            assert_eq!(packet::peek_kind(bytes), Ok(p.kind()));
        }
        Err(e) => check_error(bytes, e),
    }
    // The dispatcher and the kind's own decoder agree.
    let own = match packet::peek_kind(bytes) {
        Err(e) => Err(e),
        Ok(Kind::Token) => Token::decode(bytes).map(Packet::Token),
        Ok(Kind::StartOfIsochron) => StartOfIsochron::decode(bytes).map(Packet::StartOfIsochron),
        Ok(Kind::IsotachMessage) => IsotachMessage::decode(bytes).map(Packet::IsotachMessage),
        Ok(Kind::EndOfIsochron) => EndOfIsochron::decode(bytes).map(Packet::EndOfIsochron),
        Ok(Kind::IsochronMarker) => IsochronMarker::decode(bytes).map(Packet::IsochronMarker),
        Ok(Kind::EopMarker) => EopMarker::decode(bytes).map(Packet::EopMarker),
        Ok(Kind::BarrierSignalMarker) => {
            BarrierSignalMarker::decode(bytes).map(Packet::BarrierSignalMarker)
        }
        Ok(Kind::Plain) => PlainMessage::decode(bytes).map(Packet::Plain),
    };
    assert_eq!(any, own);
}

/// Fuzzes `Packet::decode` (see the module documentation).
pub fn check_packet(data: &[u8]) {
    check_packet_once(data);
    if let Some(fixed) = with_fixed_crc(data) {
        check_packet_once(&fixed);
    }
}

// ---------------------------------------------------------------------------------------------
// SMM replies (non-isotach payloads)

/// Fuzzes `HostReply::decode` and `ImageEntry::decode_all`: never panics; whatever decodes
/// re-encodes to exactly the input bytes; an image chunk's entries re-encode to its body.
pub fn check_host_reply(data: &[u8]) {
    use isotach_proto::reply::{HostReply, ImageEntry};
    if let Ok(r) = HostReply::decode(data) {
        let mut out = Vec::new();
        r.encode(&mut out);
        assert_eq!(out, data, "decode → encode changed the bytes of {r:?}");
        if let HostReply::PageImage { entries, .. } = r
            && let Ok(list) = ImageEntry::decode_all(entries)
        {
            let mut body = Vec::new();
            for e in &list {
                assert!(e.pending.is_none_or(|p| usize::from(p) < e.scheds.len()));
                e.encode(&mut body);
            }
            assert_eq!(body, entries, "image entries changed on re-encoding");
        }
    }
    if let Ok(list) = ImageEntry::decode_all(data) {
        let len: usize = list.iter().map(ImageEntry::encoded_len).sum();
        assert_eq!(len, data.len());
    }
}
