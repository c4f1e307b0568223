//! Payloads of the non-isotach messages one SMM node (or, for an absent application, its
//! SIU) sends another: read replies, refusals and page images of a state transfer. They ride
//! in a [`PlainMessage`](crate::packet::PlainMessage), which carries the CRC; the layout is
//! in `docs/wire.md`. Decoders validate every length, tag and index and never panic.

use crate::packet::{DecodeError, PLAIN_PAYLOAD_MAX, RmwSref, Sref, SrefOp};

mod image;
pub use image::{
    IMAGE_ENTRY_LEN_MIN, IMAGE_RMW_LEN, IMAGE_SCHED_LEN, ImageEntry, ImageRmw, ImageSched,
    image_chunks,
};

/// Tag of [`HostReply::ReadValue`].
const TAG_READ_VALUE: u8 = 1;
/// Tag of [`HostReply::ReadRefused`].
const TAG_READ_REFUSED: u8 = 2;
/// Tag of [`HostReply::CopyRefused`].
const TAG_COPY_REFUSED: u8 = 3;
/// Tag of [`HostReply::PageImage`].
const TAG_PAGE_IMAGE: u8 = 4;

/// Length of a read value reply.
pub const READ_VALUE_LEN: usize = 1 + 4 + 8;
/// Length of a read refusal.
pub const READ_REFUSED_LEN: usize = 1 + 4 + 1;
/// Length of a copy refusal.
pub const COPY_REFUSED_LEN: usize = 1 + 4 + 4 + 1;
/// Length of a page image chunk's header (entries follow).
pub const IMAGE_HEADER_LEN: usize = 1 + 4 + 4 + 2 + 2;
/// Most entry bytes in one image chunk.
pub const IMAGE_CHUNK_BYTES_MAX: usize = PLAIN_PAYLOAD_MAX - IMAGE_HEADER_LEN;

/// The page of a shared address as srefs carry it (page in the high 32 bits, slot in the low).
pub fn page_of(addr: u64) -> u32 {
    (addr >> 32) as u32
}

/// A reply from one host's SMM (or its SIU, when no application is attached) to another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostReply<'a> {
    /// The value of a read.
    ReadValue {
        /// The requester's read reference.
        ref_id: u32,
        /// The value.
        value: u64,
    },
    /// A read the copy could not answer: it is not current (joining), or no application is
    /// attached at that host (`absent`).
    ReadRefused {
        /// The requester's read reference.
        ref_id: u32,
        /// Sent by the SIU of a host without an application.
        absent: bool,
    },
    /// A copy request the holder could not answer at its place in the order: the holder's
    /// copy was not current there, or no application is attached (`absent`).
    CopyRefused {
        /// The page asked for.
        page: u32,
        /// The joiner's join id.
        join_id: u32,
        /// Sent by the SIU of a host without an application.
        absent: bool,
    },
    /// One chunk of a page image cut at the copy request's place in the order.
    PageImage {
        /// The page.
        page: u32,
        /// The joiner's join id.
        join_id: u32,
        /// This chunk's index (from 0).
        chunk: u16,
        /// Chunks in the image (at least 1).
        chunks: u16,
        /// Encoded [`ImageEntry`]s; decode with [`ImageEntry::decode_all`].
        entries: &'a [u8],
    },
}

impl HostReply<'_> {
    /// The refusal a host that cannot serve `sref` (no application attached: `absent`, or a
    /// copy not current yet) sends its issuer, so nobody waits for an answer that will not
    /// come: a read, or a read-modify-write this copy was to answer, is `ReadRefused`; a copy
    /// request `CopyRefused`. Anything else needs no answer.
    pub fn refusal(sref: &Sref, absent: bool) -> Option<HostReply<'static>> {
        match *sref {
            Sref::Mem {
                op: SrefOp::Read,
                ref_id,
                ..
            }
            | Sref::Rmw(RmwSref {
                ref_id,
                answer: true,
                ..
            }) => Some(HostReply::ReadRefused { ref_id, absent }),
            Sref::Mem {
                op: SrefOp::Copy,
                addr,
                ref_id,
                ..
            } => Some(HostReply::CopyRefused {
                page: page_of(addr),
                join_id: ref_id,
                absent,
            }),
            _ => None,
        }
    }

    /// Appends the encoded payload.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match *self {
            Self::ReadValue { ref_id, value } => {
                out.push(TAG_READ_VALUE);
                out.extend_from_slice(&ref_id.to_be_bytes());
                out.extend_from_slice(&value.to_be_bytes());
            }
            Self::ReadRefused { ref_id, absent } => {
                out.push(TAG_READ_REFUSED);
                out.extend_from_slice(&ref_id.to_be_bytes());
                out.push(u8::from(absent));
            }
            Self::CopyRefused {
                page,
                join_id,
                absent,
            } => {
                out.push(TAG_COPY_REFUSED);
                out.extend_from_slice(&page.to_be_bytes());
                out.extend_from_slice(&join_id.to_be_bytes());
                out.push(u8::from(absent));
            }
            Self::PageImage {
                page,
                join_id,
                chunk,
                chunks,
                entries,
            } => {
                debug_assert!(entries.len() <= IMAGE_CHUNK_BYTES_MAX);
                debug_assert!(chunk < chunks);
                out.push(TAG_PAGE_IMAGE);
                out.extend_from_slice(&page.to_be_bytes());
                out.extend_from_slice(&join_id.to_be_bytes());
                out.extend_from_slice(&chunk.to_be_bytes());
                out.extend_from_slice(&chunks.to_be_bytes());
                out.extend_from_slice(entries);
            }
        }
    }

    /// Decodes a payload. Image entries are only checked for size here; decode them with
    /// [`ImageEntry::decode_all`].
    pub fn decode(b: &[u8]) -> Result<HostReply<'_>, DecodeError> {
        let tag = *b.first().ok_or(DecodeError::Short { need: 1, got: 0 })?;
        let exact = |len: usize| match b.len().cmp(&len) {
            std::cmp::Ordering::Less => Err(DecodeError::Short {
                need: len,
                got: b.len(),
            }),
            std::cmp::Ordering::Greater => Err(DecodeError::Long {
                max: len,
                got: b.len(),
            }),
            std::cmp::Ordering::Equal => Ok(()),
        };
        let flag = |v: u8| match v {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(DecodeError::OutOfRange {
                field: "reply.absent",
                value: u64::from(other),
            }),
        };
        match tag {
            TAG_READ_VALUE => {
                exact(READ_VALUE_LEN)?;
                Ok(HostReply::ReadValue {
                    ref_id: be32(&b[1..5]),
                    value: be64(&b[5..13]),
                })
            }
            TAG_READ_REFUSED => {
                exact(READ_REFUSED_LEN)?;
                Ok(HostReply::ReadRefused {
                    ref_id: be32(&b[1..5]),
                    absent: flag(b[5])?,
                })
            }
            TAG_COPY_REFUSED => {
                exact(COPY_REFUSED_LEN)?;
                Ok(HostReply::CopyRefused {
                    page: be32(&b[1..5]),
                    join_id: be32(&b[5..9]),
                    absent: flag(b[9])?,
                })
            }
            TAG_PAGE_IMAGE => {
                if b.len() < IMAGE_HEADER_LEN {
                    return Err(DecodeError::Short {
                        need: IMAGE_HEADER_LEN,
                        got: b.len(),
                    });
                }
                // A chunk never holds more than a plain message carries: the encoder's bound.
                if b.len() > IMAGE_HEADER_LEN + IMAGE_CHUNK_BYTES_MAX {
                    return Err(DecodeError::Long {
                        max: IMAGE_HEADER_LEN + IMAGE_CHUNK_BYTES_MAX,
                        got: b.len(),
                    });
                }
                let chunk = be16(&b[9..11]);
                let chunks = be16(&b[11..13]);
                if chunks == 0 || chunk >= chunks {
                    return Err(DecodeError::OutOfRange {
                        field: "image.chunk",
                        value: u64::from(chunk),
                    });
                }
                Ok(HostReply::PageImage {
                    page: be32(&b[1..5]),
                    join_id: be32(&b[5..9]),
                    chunk,
                    chunks,
                    entries: &b[IMAGE_HEADER_LEN..],
                })
            }
            other => Err(DecodeError::OutOfRange {
                field: "reply.tag",
                value: u64::from(other),
            }),
        }
    }
}

fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

fn be64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_be_bytes(a)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::{RmwOp, Width};

    fn entry(slot: u32, scheds: usize) -> ImageEntry {
        ImageEntry {
            slot,
            value: u64::from(slot) * 3,
            pending: scheds.checked_sub(1).map(|p| p as u16),
            scheds: (0..scheds)
                .map(|i| ImageSched {
                    ts: i as u64,
                    source: 2,
                    sequum: 9,
                    sub: 1,
                    pos: 0,
                    host: 3,
                })
                .collect(),
            // Every kind of waiting read-modify-write, on the last sched.
            rmws: (0..scheds.min(1) * 3)
                .map(|i| ImageRmw {
                    sched: scheds as u16 - 1,
                    op: [RmwOp::Add, RmwOp::CompareAndSwap, RmwOp::Apply(9)][i],
                    width: Width::W32,
                    arg: 5,
                    arg2: if i == 1 { 6 } else { 0 },
                })
                .collect(),
        }
    }

    #[test]
    fn refusals_answer_what_an_issuer_waits_for_and_nothing_else() {
        let mem = |op| Sref::Mem {
            op,
            width: Width::W64,
            addr: 3 << 32,
            value: 0,
            ref_id: 9,
        };
        let rmw = |answer| {
            Sref::Rmw(RmwSref {
                op: RmwOp::Add,
                width: Width::W64,
                addr: 3 << 32,
                arg: 1,
                arg2: 0,
                ref_id: 9,
                answer,
            })
        };
        let read_refused = Some(HostReply::ReadRefused {
            ref_id: 9,
            absent: true,
        });
        assert_eq!(HostReply::refusal(&mem(SrefOp::Read), true), read_refused);
        assert_eq!(HostReply::refusal(&rmw(true), true), read_refused);
        assert_eq!(
            HostReply::refusal(&rmw(false), true),
            None,
            "another copy answers"
        );
        assert_eq!(
            HostReply::refusal(&mem(SrefOp::Copy), false),
            Some(HostReply::CopyRefused {
                page: 3,
                join_id: 9,
                absent: false
            })
        );
        assert_eq!(HostReply::refusal(&mem(SrefOp::Write), true), None);
    }

    #[test]
    fn an_image_chunk_longer_than_a_plain_message_carries_is_refused() {
        let mut b = vec![TAG_PAGE_IMAGE, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 1];
        b.resize(IMAGE_HEADER_LEN + IMAGE_CHUNK_BYTES_MAX, 0);
        assert!(HostReply::decode(&b).is_ok(), "the largest chunk decodes");
        b.push(0);
        assert_eq!(
            HostReply::decode(&b),
            Err(DecodeError::Long {
                max: IMAGE_HEADER_LEN + IMAGE_CHUNK_BYTES_MAX,
                got: b.len()
            })
        );
    }

    #[test]
    fn waiting_rmws_are_checked_against_their_entry() {
        let e = entry(7, 2);
        let mut b = Vec::new();
        e.encode(&mut b);
        assert_eq!(b.len(), e.encoded_len());
        assert_eq!(ImageEntry::decode_all(&b).unwrap(), vec![e.clone()]);
        let rmw_at = IMAGE_ENTRY_LEN_MIN + 2 * IMAGE_SCHED_LEN;
        let refused = |at: usize, byte: u8| {
            let mut x = b.clone();
            x[at] = byte;
            ImageEntry::decode_all(&x).is_err()
        };
        assert!(refused(rmw_at + 1, 2), "a sched index beyond the entry's");
        assert!(refused(rmw_at + 2, 1), "a read is not a read-modify-write");
        assert!(refused(rmw_at + 3, 3), "no such width");
        assert!(refused(rmw_at + 5, 1), "add names no function");
        assert!(refused(rmw_at + 6 + 3, 1), "an argument wider than 32 bits");
        assert!(!refused(rmw_at + 13, 9), "a 32-bit argument is fine");
    }

    #[test]
    fn replies_round_trip() {
        let entries = [entry(1, 0), entry(7, 2)];
        let mut body = Vec::new();
        for e in &entries {
            e.encode(&mut body);
        }
        for r in [
            HostReply::ReadValue {
                ref_id: 7,
                value: u64::MAX,
            },
            HostReply::ReadRefused {
                ref_id: 1,
                absent: true,
            },
            HostReply::CopyRefused {
                page: 4,
                join_id: 2,
                absent: false,
            },
            HostReply::PageImage {
                page: 4,
                join_id: 2,
                chunk: 1,
                chunks: 3,
                entries: &body,
            },
        ] {
            let mut out = Vec::new();
            r.encode(&mut out);
            assert_eq!(HostReply::decode(&out), Ok(r));
        }
        assert_eq!(ImageEntry::decode_all(&body).unwrap(), entries);
    }

    #[test]
    fn bad_payloads_are_refused() {
        assert!(HostReply::decode(&[]).is_err());
        assert!(HostReply::decode(&[9, 0, 0]).is_err());
        assert!(HostReply::decode(&[TAG_READ_VALUE, 0, 0]).is_err());
        assert!(HostReply::decode(&[TAG_READ_REFUSED, 0, 0, 0, 1, 2]).is_err());
        let mut img = vec![TAG_PAGE_IMAGE, 0, 0, 0, 1, 0, 0, 0, 1, 0, 2, 0, 2];
        assert!(HostReply::decode(&img).is_err(), "chunk beyond chunks");
        img[10] = 1;
        assert!(HostReply::decode(&img).is_ok());
        let mut e = Vec::new();
        entry(3, 1).encode(&mut e);
        assert!(ImageEntry::decode_all(&e[..e.len() - 1]).is_err());
        e[13] = 5; // pending index beyond the scheds
        assert!(ImageEntry::decode_all(&e).is_err());
    }

    #[test]
    fn images_split_into_whole_entry_chunks() {
        assert_eq!(image_chunks(&[]), Some(vec![Vec::new()]));
        let entries: Vec<_> = (0..1000).map(|s| entry(s, s as usize % 3)).collect();
        let chunks = image_chunks(&entries).unwrap();
        assert!(chunks.len() > 1);
        let back: Vec<_> = chunks
            .iter()
            .flat_map(|c| {
                assert!(c.len() <= IMAGE_CHUNK_BYTES_MAX);
                ImageEntry::decode_all(c).unwrap()
            })
            .collect();
        assert_eq!(back, entries);
        assert_eq!(image_chunks(&[entry(0, 200)]), None);
    }
}
