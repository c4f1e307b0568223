//! Page images of a state transfer: the variables of one page (value, unresolved scheds, the
//! read-modify-writes waiting for them) as entries, and their split into chunks that each
//! fit one [`HostReply::PageImage`](super::HostReply::PageImage). Decoders validate every
//! length and index and never panic.

use super::{IMAGE_CHUNK_BYTES_MAX, be16, be32, be64};
use crate::packet::{DecodeError, RmwOp, SrefOp, Width};

/// Length of one sched in an image entry.
pub const IMAGE_SCHED_LEN: usize = 8 + 2 + 8 + 4 + 4 + 2;
/// Length of one waiting read-modify-write in an image entry.
pub const IMAGE_RMW_LEN: usize = 2 + 1 + 1 + 2 + 8 + 8;
/// Length of an image entry without its scheds and read-modify-writes.
pub const IMAGE_ENTRY_LEN_MIN: usize = 4 + 8 + 2 + 2 + 2;
/// Value of [`ImageEntry::pending`] on the wire when the variable is substantiated.
const NO_PENDING: u16 = u16::MAX;

/// An unresolved sched of a variable in a page image: where it sits in the holder's order
/// (its isochron's timestamp, source, sequum and sub-position, and its position among that
/// isochron's operations) and which host scheduled it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ImageSched {
    /// Pulse.
    pub ts: u64,
    /// Source of the isochron.
    pub source: u16,
    /// Sequum.
    pub sequum: u64,
    /// Place behind an isochron marker.
    pub sub: u32,
    /// Position among the isochron's operations.
    pub pos: u32,
    /// The scheduling host (whose assign resolves it).
    pub host: u16,
}

/// A read-modify-write waiting at the copy for one of the variable's scheds: the copy that
/// takes the image runs it on the assigned value, as every other copy does (the copy that
/// sent the image answers the issuer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageRmw {
    /// Index into the entry's scheds of the sched it waits for.
    pub sched: u16,
    /// What it does.
    pub op: RmwOp,
    /// Its width.
    pub width: Width,
    /// Its argument; fits `width`.
    pub arg: u64,
    /// Its second argument (compare-and-swap's new value, else 0); fits `width`.
    pub arg2: u64,
}

/// One variable of a page image: its slot, value, unresolved scheds and the
/// read-modify-writes waiting for them, in order. Variables that are zero and have no sched
/// are left out of an image.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ImageEntry {
    /// Slot in the page.
    pub slot: u32,
    /// Value.
    pub value: u64,
    /// Index into `scheds` of the sched the variable is unsubstantiated by, if any.
    pub pending: Option<u16>,
    /// Unresolved scheds, oldest first.
    pub scheds: Vec<ImageSched>,
    /// Read-modify-writes waiting for those scheds, in execution order.
    pub rmws: Vec<ImageRmw>,
}

impl ImageEntry {
    /// Encoded length.
    pub fn encoded_len(&self) -> usize {
        IMAGE_ENTRY_LEN_MIN + self.scheds.len() * IMAGE_SCHED_LEN + self.rmws.len() * IMAGE_RMW_LEN
    }

    /// Appends the encoded entry.
    pub fn encode(&self, out: &mut Vec<u8>) {
        debug_assert!(self.scheds.len() < usize::from(u16::MAX));
        debug_assert!(self.rmws.len() <= usize::from(u16::MAX));
        debug_assert!(
            self.rmws
                .iter()
                .all(|r| usize::from(r.sched) < self.scheds.len())
        );
        debug_assert!(
            self.pending
                .is_none_or(|p| usize::from(p) < self.scheds.len())
        );
        out.extend_from_slice(&self.slot.to_be_bytes());
        out.extend_from_slice(&self.value.to_be_bytes());
        out.extend_from_slice(&self.pending.unwrap_or(NO_PENDING).to_be_bytes());
        out.extend_from_slice(&(self.scheds.len() as u16).to_be_bytes());
        out.extend_from_slice(&(self.rmws.len() as u16).to_be_bytes());
        for s in &self.scheds {
            out.extend_from_slice(&s.ts.to_be_bytes());
            out.extend_from_slice(&s.source.to_be_bytes());
            out.extend_from_slice(&s.sequum.to_be_bytes());
            out.extend_from_slice(&s.sub.to_be_bytes());
            out.extend_from_slice(&s.pos.to_be_bytes());
            out.extend_from_slice(&s.host.to_be_bytes());
        }
        for r in &self.rmws {
            out.extend_from_slice(&r.sched.to_be_bytes());
            out.push(r.op.op() as u8);
            out.push(r.width as u8);
            let func = if let RmwOp::Apply(f) = r.op { f } else { 0 };
            out.extend_from_slice(&func.to_be_bytes());
            out.extend_from_slice(&r.arg.to_be_bytes());
            out.extend_from_slice(&r.arg2.to_be_bytes());
        }
    }

    /// One waiting read-modify-write of an entry with `scheds` scheds.
    fn decode_rmw(r: &[u8], scheds: usize) -> Result<ImageRmw, DecodeError> {
        let bad = |field: &'static str, value: u64| DecodeError::OutOfRange { field, value };
        let sched = be16(&r[0..2]);
        if usize::from(sched) >= scheds {
            return Err(bad("image.rmw.sched", u64::from(sched)));
        }
        let width = Width::from_byte(r[3]).ok_or(bad("image.rmw.width", u64::from(r[3])))?;
        let func = be16(&r[4..6]);
        let (arg, arg2) = (be64(&r[6..14]), be64(&r[14..22]));
        let op = match r[2] {
            b if b == SrefOp::Add as u8 && func == 0 && arg2 == 0 => RmwOp::Add,
            b if b == SrefOp::CompareAndSwap as u8 && func == 0 => RmwOp::CompareAndSwap,
            b if b == SrefOp::Apply as u8 && arg2 == 0 => RmwOp::Apply(func),
            b => return Err(bad("image.rmw.op", u64::from(b))),
        };
        if arg.max(arg2) > width.max_value() {
            return Err(bad("image.rmw.arg", arg.max(arg2)));
        }
        Ok(ImageRmw {
            sched,
            op,
            width,
            arg,
            arg2,
        })
    }

    /// Decodes every entry of an image chunk; the bytes must hold whole entries only.
    pub fn decode_all(mut b: &[u8]) -> Result<Vec<Self>, DecodeError> {
        let mut out = Vec::new();
        while !b.is_empty() {
            if b.len() < IMAGE_ENTRY_LEN_MIN {
                return Err(DecodeError::Short {
                    need: IMAGE_ENTRY_LEN_MIN,
                    got: b.len(),
                });
            }
            let n = usize::from(be16(&b[14..16]));
            let m = usize::from(be16(&b[16..18]));
            let scheds_end = IMAGE_ENTRY_LEN_MIN + n * IMAGE_SCHED_LEN;
            let len = scheds_end + m * IMAGE_RMW_LEN;
            if b.len() < len {
                return Err(DecodeError::Short {
                    need: len,
                    got: b.len(),
                });
            }
            let pending = match be16(&b[12..14]) {
                NO_PENDING => None,
                p if usize::from(p) < n => Some(p),
                p => {
                    return Err(DecodeError::OutOfRange {
                        field: "image.pending",
                        value: u64::from(p),
                    });
                }
            };
            let rmws = b[scheds_end..len]
                .chunks_exact(IMAGE_RMW_LEN)
                .map(|r| Self::decode_rmw(r, n))
                .collect::<Result<_, _>>()?;
            let scheds = b[IMAGE_ENTRY_LEN_MIN..scheds_end]
                .chunks_exact(IMAGE_SCHED_LEN)
                .map(|s| ImageSched {
                    ts: be64(&s[0..8]),
                    source: be16(&s[8..10]),
                    sequum: be64(&s[10..18]),
                    sub: be32(&s[18..22]),
                    pos: be32(&s[22..26]),
                    host: be16(&s[26..28]),
                })
                .collect();
            out.push(Self {
                slot: be32(&b[0..4]),
                value: be64(&b[4..12]),
                pending,
                scheds,
                rmws,
            });
            b = &b[len..];
        }
        Ok(out)
    }
}

/// Splits `entries` into chunk bodies of at most [`IMAGE_CHUNK_BYTES_MAX`] bytes, whole
/// entries each; an empty image is one empty chunk. `None` when an entry alone exceeds a
/// chunk (more scheds on one variable than a chunk holds) or there are more than `u16::MAX`
/// chunks.
pub fn image_chunks(entries: &[ImageEntry]) -> Option<Vec<Vec<u8>>> {
    let mut chunks = vec![Vec::new()];
    for e in entries {
        let len = e.encoded_len();
        if len > IMAGE_CHUNK_BYTES_MAX {
            return None;
        }
        let last = chunks.last_mut().expect("at least one chunk");
        if last.len() + len > IMAGE_CHUNK_BYTES_MAX {
            chunks.push(Vec::new());
        }
        e.encode(chunks.last_mut().expect("at least one chunk"));
    }
    (chunks.len() <= usize::from(u16::MAX)).then_some(chunks)
}
