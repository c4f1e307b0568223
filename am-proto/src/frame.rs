//! The AM frame format: a fixed 72-byte little-endian header, argument words, payload,
//! CRC-32 trailer. See `docs/am.md` for the byte-by-byte layout. A datagram carries one
//! frame or several back to back (frames queued together for one peer leave together); the
//! header says how long its frame is, so the receiver takes them one after the other
//! ([`decode_first`]).
//!
//! [`decode`] and [`decode_first`] validate every field and return [`FrameError`]; they
//! never panic on any input.

use crate::types::{Class, MAX_ARGS, MAX_LONG_BYTES, MAX_MEDIUM_BYTES, Status};

/// `b"AM"` read as a little-endian `u16`.
pub const MAGIC: u16 = u16::from_le_bytes(*b"AM");
/// Frame format version.
pub const VERSION: u8 = 1;
/// Bytes of the fixed header.
pub const HEADER_LEN: usize = 72;
/// Bytes of the CRC-32 trailer.
pub const TRAILER_LEN: usize = 4;
/// Smallest bulk fragment size a sender may use (keeps the reassembly bitmap bounded).
pub const MIN_CHUNK: usize = 256;
/// Bytes of a frame carrying `nargs` arguments and no payload.
pub const fn overhead(nargs: usize) -> usize {
    HEADER_LEN + 8 * nargs + TRAILER_LEN
}

/// Frame kinds.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
pub enum Kind {
    /// A request (one fragment of it, for bulk).
    Request = 1,
    /// A reply sent by a request handler (one fragment of it, for bulk).
    Reply = 2,
    /// The automatic acknowledgement of a request whose handler sent no reply.
    Ack = 3,
    /// The destination returns the request with a status.
    Nack = 4,
    /// The requester returns a reply with a status.
    ReplyNack = 5,
    /// The replier acknowledges a `ReplyNack`.
    ReplyNackAck = 6,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Self::Request,
            2 => Self::Reply,
            3 => Self::Ack,
            4 => Self::Nack,
            5 => Self::ReplyNack,
            6 => Self::ReplyNackAck,
            _ => return None,
        })
    }
}

/// Flag bit: the request belongs to the sender's FIFO stream towards this peer.
pub const FLAG_FIFO: u8 = 1;

/// The fixed header, decoded.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Header {
    /// Frame kind.
    pub kind: Kind,
    /// Size class.
    pub class: Class,
    /// Flag bits ([`FLAG_FIFO`]).
    pub flags: u8,
    /// Number of argument words that follow the header.
    pub nargs: u8,
    /// Return status (only `Nack` and `ReplyNack`).
    pub status: Option<Status>,
    /// Sending endpoint index.
    pub src_ep: u16,
    /// Destination endpoint index.
    pub dst_ep: u16,
    /// Request slot of the requester.
    pub slot: u16,
    /// Handler index at the destination.
    pub handler: u16,
    /// Sequence number of the request in its slot.
    pub seq: u32,
    /// The requester's epoch towards the replier.
    pub epoch: u32,
    /// Incarnation of the sending node.
    pub src_inc: u64,
    /// Incarnation of the receiving node as the sender knows it (0 = unknown).
    pub dst_inc: u64,
    /// Message tag.
    pub tag: u64,
    /// Position in the sender's FIFO stream (if [`FLAG_FIFO`]).
    pub fifo_seq: u32,
    /// Medium: payload length; bulk: whole transfer length; get: bytes to read.
    pub total_len: u32,
    /// Bulk and get: destination offset in the receiving segment.
    pub dest_offset: u32,
    /// Get: offset to read in the replier's segment.
    pub src_offset: u32,
    /// Bulk: where this fragment starts inside the transfer.
    pub frag_offset: u32,
    /// Bytes of payload in this frame.
    pub frag_len: u16,
    /// Bulk: the sender's fragment size (every fragment but the last has this length).
    pub frag_chunk: u16,
}

impl Header {
    /// An all-zero header of the given kind and class.
    pub fn new(kind: Kind, class: Class) -> Self {
        Self {
            kind,
            class,
            flags: 0,
            nargs: 0,
            status: None,
            src_ep: 0,
            dst_ep: 0,
            slot: 0,
            handler: 0,
            seq: 0,
            epoch: 0,
            src_inc: 0,
            dst_inc: 0,
            tag: 0,
            fifo_seq: 0,
            total_len: 0,
            dest_offset: 0,
            src_offset: 0,
            frag_offset: 0,
            frag_len: 0,
            frag_chunk: 0,
        }
    }

    /// Addresses the frame in the slot protocol: its slot and sequence number, the epoch,
    /// and the sender's and receiver's incarnations (`incs`).
    pub(crate) fn route(&mut self, slot: u16, seq: u32, epoch: u32, incs: (u64, u64)) {
        self.slot = slot;
        self.seq = seq;
        self.epoch = epoch;
        (self.src_inc, self.dst_inc) = incs;
    }
}

/// A decoded frame borrowing its payload from the datagram.
#[derive(Clone, Copy, Debug)]
pub struct Frame<'a> {
    /// The header.
    pub h: Header,
    /// Argument words (`h.nargs` of them are meaningful).
    pub args: [u64; MAX_ARGS],
    /// The payload bytes of this frame.
    pub payload: &'a [u8],
}

/// Why a datagram is not a valid frame.
#[derive(Clone, Copy, PartialEq, Eq, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// Fewer bytes than a header and trailer.
    #[error("datagram of {0} bytes is shorter than a frame")]
    TooShort(usize),
    /// The magic number is wrong.
    #[error("bad magic")]
    BadMagic,
    /// The version is not [`VERSION`].
    #[error("unsupported version {0}")]
    BadVersion(u8),
    /// Unknown frame kind.
    #[error("unknown frame kind {0}")]
    BadKind(u8),
    /// Unknown size class, or a class the kind does not allow.
    #[error("bad size class {0}")]
    BadClass(u8),
    /// More argument words than [`MAX_ARGS`].
    #[error("{0} arguments exceed the maximum")]
    TooManyArgs(u8),
    /// Unknown status byte, or a status on a kind that has none (or none where one is needed).
    #[error("bad status byte {0}")]
    BadStatus(u8),
    /// Unknown flag bits.
    #[error("unknown flag bits {0:#x}")]
    BadFlags(u8),
    /// The datagram is shorter than the header says (or, for [`decode`], longer).
    #[error("length mismatch: header says {expected} bytes, datagram has {actual}")]
    LengthMismatch {
        /// Length implied by the header.
        expected: usize,
        /// Length of the datagram.
        actual: usize,
    },
    /// The CRC-32 trailer does not match.
    #[error("CRC mismatch")]
    BadCrc,
    /// Lengths or offsets inconsistent with the size class.
    #[error("inconsistent lengths for the size class")]
    BadGeometry,
}

#[inline(always)]
fn put<const N: usize>(h: &mut [u8; HEADER_LEN], o: usize, v: [u8; N]) {
    h[o..o + N].copy_from_slice(&v);
}

#[inline(always)]
fn get<const N: usize>(h: &[u8; HEADER_LEN], o: usize) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&h[o..o + N]);
    a
}

#[inline]
fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
#[inline]
fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}
#[inline]
fn u64_at(b: &[u8], o: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[o..o + 8]);
    u64::from_le_bytes(a)
}

/// Encode a frame into `out` (cleared first). `args.len()` must equal `h.nargs` and
/// `payload.len()` must equal `h.frag_len`; the caller (the protocol core) guarantees it.
pub fn encode(h: &Header, args: &[u64], payload: &[u8], out: &mut Vec<u8>) {
    out.clear();
    append(h, args, payload, out);
}

/// Encode a frame at the end of `out`, behind the frames already there (one datagram of
/// several frames). The same contract as [`encode`].
pub fn append(h: &Header, args: &[u64], payload: &[u8], out: &mut Vec<u8>) {
    debug_assert_eq!(args.len(), usize::from(h.nargs));
    debug_assert_eq!(payload.len(), usize::from(h.frag_len));
    // The header is built in a fixed array (constant offsets, no per-field capacity checks)
    // and appended in one copy.
    let mut x = [0u8; HEADER_LEN];
    put(&mut x, 0, MAGIC.to_le_bytes());
    x[2] = VERSION;
    x[3] = h.kind as u8;
    x[4] = h.class as u8;
    x[5] = h.flags;
    x[6] = h.nargs;
    x[7] = h.status.map_or(0, |s| s as u8);
    put(&mut x, 8, h.src_ep.to_le_bytes());
    put(&mut x, 10, h.dst_ep.to_le_bytes());
    put(&mut x, 12, h.slot.to_le_bytes());
    put(&mut x, 14, h.handler.to_le_bytes());
    put(&mut x, 16, h.seq.to_le_bytes());
    put(&mut x, 20, h.epoch.to_le_bytes());
    put(&mut x, 24, h.src_inc.to_le_bytes());
    put(&mut x, 32, h.dst_inc.to_le_bytes());
    put(&mut x, 40, h.tag.to_le_bytes());
    put(&mut x, 48, h.fifo_seq.to_le_bytes());
    put(&mut x, 52, h.total_len.to_le_bytes());
    put(&mut x, 56, h.dest_offset.to_le_bytes());
    put(&mut x, 60, h.src_offset.to_le_bytes());
    put(&mut x, 64, h.frag_offset.to_le_bytes());
    put(&mut x, 68, h.frag_len.to_le_bytes());
    put(&mut x, 70, h.frag_chunk.to_le_bytes());
    let start = out.len();
    out.reserve(HEADER_LEN + 8 * args.len() + payload.len() + TRAILER_LEN);
    out.extend_from_slice(&x);
    for a in args {
        out.extend_from_slice(&a.to_le_bytes());
    }
    out.extend_from_slice(payload);
    let crc = crc32fast::hash(&out[start..]);
    out.extend_from_slice(&crc.to_le_bytes());
}

/// Decode and validate a datagram of exactly one frame.
pub fn decode(b: &[u8]) -> Result<Frame<'_>, FrameError> {
    let (f, len) = decode_first(b)?;
    if len != b.len() {
        return Err(FrameError::LengthMismatch {
            expected: len,
            actual: b.len(),
        });
    }
    Ok(f)
}

/// The frames of datagram `b`, in order: each decoded with [`decode_first`], up to and
/// including the first error, after which the iteration ends.
pub fn frames(b: &[u8]) -> impl Iterator<Item = Result<Frame<'_>, FrameError>> {
    let mut rest = Some(b);
    std::iter::from_fn(move || {
        let r = rest?;
        match decode_first(r) {
            Ok((f, len)) => {
                rest = Some(&r[len..]).filter(|r| !r.is_empty());
                Some(Ok(f))
            }
            Err(e) => {
                rest = None;
                Some(Err(e))
            }
        }
    })
}

/// Decode and validate the frame at the start of `b`, which may be followed by more
/// frames; returns it and its length in bytes (where the next frame starts).
pub fn decode_first(b: &[u8]) -> Result<(Frame<'_>, usize), FrameError> {
    if b.len() < HEADER_LEN + TRAILER_LEN {
        return Err(FrameError::TooShort(b.len()));
    }
    if u16_at(b, 0) != MAGIC {
        return Err(FrameError::BadMagic);
    }
    if b[2] != VERSION {
        return Err(FrameError::BadVersion(b[2]));
    }
    let kind = Kind::from_u8(b[3]).ok_or(FrameError::BadKind(b[3]))?;
    let class = Class::from_u8(b[4]).ok_or(FrameError::BadClass(b[4]))?;
    let flags = b[5];
    if flags & !FLAG_FIFO != 0 {
        return Err(FrameError::BadFlags(flags));
    }
    let nargs = b[6];
    if usize::from(nargs) > MAX_ARGS {
        return Err(FrameError::TooManyArgs(nargs));
    }
    let status = match (b[7], matches!(kind, Kind::Nack | Kind::ReplyNack)) {
        (0, false) => None,
        (s, true) => Some(Status::from_u8(s).ok_or(FrameError::BadStatus(s))?),
        (s, false) => return Err(FrameError::BadStatus(s)),
    };
    let Some(x) = b.first_chunk::<HEADER_LEN>() else {
        return Err(FrameError::TooShort(b.len()));
    };
    let h = Header {
        kind,
        class,
        flags,
        nargs,
        status,
        src_ep: u16::from_le_bytes(get(x, 8)),
        dst_ep: u16::from_le_bytes(get(x, 10)),
        slot: u16::from_le_bytes(get(x, 12)),
        handler: u16::from_le_bytes(get(x, 14)),
        seq: u32::from_le_bytes(get(x, 16)),
        epoch: u32::from_le_bytes(get(x, 20)),
        src_inc: u64::from_le_bytes(get(x, 24)),
        dst_inc: u64::from_le_bytes(get(x, 32)),
        tag: u64::from_le_bytes(get(x, 40)),
        fifo_seq: u32::from_le_bytes(get(x, 48)),
        total_len: u32::from_le_bytes(get(x, 52)),
        dest_offset: u32::from_le_bytes(get(x, 56)),
        src_offset: u32::from_le_bytes(get(x, 60)),
        frag_offset: u32::from_le_bytes(get(x, 64)),
        frag_len: u16::from_le_bytes(get(x, 68)),
        frag_chunk: u16::from_le_bytes(get(x, 70)),
    };
    let args_len = 8 * usize::from(nargs);
    let expected = HEADER_LEN + args_len + usize::from(h.frag_len) + TRAILER_LEN;
    if expected > b.len() {
        return Err(FrameError::LengthMismatch {
            expected,
            actual: b.len(),
        });
    }
    let b = &b[..expected];
    let body_end = expected - TRAILER_LEN;
    if crc32fast::hash(&b[..body_end]) != u32_at(b, body_end) {
        return Err(FrameError::BadCrc);
    }
    check_geometry(&h)?;
    let mut args = [0u64; MAX_ARGS];
    for (i, a) in args.iter_mut().take(usize::from(nargs)).enumerate() {
        *a = u64_at(b, HEADER_LEN + 8 * i);
    }
    let f = Frame {
        h,
        args,
        payload: &b[HEADER_LEN + args_len..body_end],
    };
    Ok((f, expected))
}

fn check_geometry(h: &Header) -> Result<(), FrameError> {
    let total = h.total_len as usize;
    let flen = usize::from(h.frag_len);
    let carries_msg = matches!(h.kind, Kind::Request | Kind::Reply);
    if !carries_msg {
        return if flen == 0 {
            Ok(())
        } else {
            Err(FrameError::BadGeometry)
        };
    }
    let ok = match h.class {
        Class::Short => total == 0 && flen == 0 && h.frag_offset == 0,
        Class::Medium => total == flen && total <= MAX_MEDIUM_BYTES && h.frag_offset == 0,
        Class::Get => {
            if h.kind != Kind::Request {
                return Err(FrameError::BadClass(h.class as u8));
            }
            flen == 0 && total <= MAX_LONG_BYTES && h.frag_offset == 0
        }
        Class::Xfer => {
            let chunk = usize::from(h.frag_chunk);
            let off = h.frag_offset as usize;
            total <= MAX_LONG_BYTES
                && chunk >= MIN_CHUNK
                && off.is_multiple_of(chunk)
                && ((total == 0 && off == 0 && flen == 0)
                    || (off < total && flen == chunk.min(total - off)))
        }
    };
    if ok {
        Ok(())
    } else {
        Err(FrameError::BadGeometry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> (Header, Vec<u64>, Vec<u8>) {
        let mut h = Header::new(Kind::Request, Class::Xfer);
        h.nargs = 3;
        h.total_len = 1000;
        h.frag_chunk = 512;
        h.frag_offset = 512;
        h.frag_len = 488;
        h.tag = 0xdead_beef;
        (h, vec![1, 2, u64::MAX], vec![7u8; 488])
    }

    #[test]
    fn roundtrip() {
        let (h, args, payload) = sample();
        let mut out = Vec::new();
        encode(&h, &args, &payload, &mut out);
        let f = decode(&out).unwrap();
        assert_eq!(f.h, h);
        assert_eq!(&f.args[..3], &args[..]);
        assert_eq!(f.payload, &payload[..]);
    }

    #[test]
    fn every_single_bit_flip_is_rejected() {
        let (h, args, payload) = sample();
        let mut out = Vec::new();
        encode(&h, &args, &payload, &mut out);
        for i in 0..out.len() {
            for bit in 0..8 {
                let mut c = out.clone();
                c[i] ^= 1 << bit;
                assert!(decode(&c).is_err(), "flip at byte {i} bit {bit} accepted");
            }
        }
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let _ = decode(&bytes);
        }

        #[test]
        fn mutated_frames_never_panic(idx in 0usize..1100, val in any::<u8>(), fix_crc in any::<bool>()) {
            let (h, args, payload) = sample();
            let mut out = Vec::new();
            encode(&h, &args, &payload, &mut out);
            let i = idx % out.len();
            out[i] = val;
            if fix_crc {
                let n = out.len() - TRAILER_LEN;
                let crc = crc32fast::hash(&out[..n]);
                out[n..].copy_from_slice(&crc.to_le_bytes());
            }
            let _ = decode(&out);
        }
    }
}
