//! The isotach message: one sref (a memory operation, a copy request or a handler message),
//! timestamped by the source SIU. Also the in-place stamping and peeking the SIU's and the
//! token manager's hot paths use, so they never re-encode a message.

use super::codec::{
    CRC_LEN, Fields, begin, check_bits, crc32, open, push_u16, push_u32, push_u64, seal,
};
use super::{DecodeError, Kind};
use crate::logical::{Generation, Pulse};

/// Largest payload of a `msg` sref.
pub const MSG_PAYLOAD_MAX: usize = 1024;
/// Encoded length of a memory sref message (read, write, sched, assign).
pub const MEM_MESSAGE_LEN: usize = 52;
/// Encoded length of a `msg` sref message without its payload.
pub const MSG_MESSAGE_LEN_MIN: usize = 36;
/// Encoded length of a read-modify-write sref message (add, compare-and-swap, apply).
pub const RMW_MESSAGE_LEN: usize = 64;
/// The flag of an RMW sref whose copy answers the issuer with the old value.
const RMW_FLAG_ANSWER: u8 = 0b0000_0001;

/// Operation codes of srefs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum SrefOp {
    /// Read a shared variable.
    Read = 1,
    /// Write a shared variable.
    Write = 2,
    /// Make a variable unsubstantiated until the scheduling node's assign.
    Sched = 3,
    /// Substantiate a scheduled variable.
    Assign = 4,
    /// Run a registered handler at its place in the order.
    Msg = 5,
    /// Copy request of a joining node (state transfer): the holder answers with an image of
    /// the page of `addr` cut at this place in the order. `ref_id` names the join.
    Copy = 6,
    /// Read-modify-write: add (wrapping at the width).
    Add = 7,
    /// Read-modify-write: compare and swap.
    CompareAndSwap = 8,
    /// Read-modify-write: an application-registered pure function of (old value, argument).
    Apply = 9,
}

impl SrefOp {
    fn from_byte(b: u8) -> Result<Self, DecodeError> {
        Ok(match b {
            1 => Self::Read,
            2 => Self::Write,
            3 => Self::Sched,
            4 => Self::Assign,
            5 => Self::Msg,
            6 => Self::Copy,
            7 => Self::Add,
            8 => Self::CompareAndSwap,
            9 => Self::Apply,
            other => {
                return Err(DecodeError::OutOfRange {
                    field: "message.op",
                    value: u64::from(other),
                });
            }
        })
    }
}

/// Width of a shared variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum Width {
    /// 32-bit variable.
    #[default]
    W32 = 4,
    /// 64-bit variable.
    W64 = 8,
}

impl Width {
    /// The width a width byte names (its size in bytes).
    pub(crate) fn from_byte(b: u8) -> Option<Self> {
        [Self::W32, Self::W64].into_iter().find(|w| *w as u8 == b)
    }

    /// Largest value a variable of this width holds.
    pub fn max_value(self) -> u64 {
        match self {
            Self::W32 => u64::from(u32::MAX),
            Self::W64 => u64::MAX,
        }
    }
}

/// What a read-modify-write sref does to its variable. Every copy executes it at the sref's
/// place in the order, so copies agree without sched/assign; one copy answers the issuer with
/// the value it found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RmwOp {
    /// `old + arg`, wrapping at the variable's width.
    Add,
    /// `new` if `old == expected`, else `old` unchanged (`arg` = expected, `arg2` = new). The
    /// issuer learns whether it swapped by comparing the answer with `expected`.
    CompareAndSwap,
    /// The pure function the application registered as `func` on every host, of
    /// `(old, arg)`; the SMM runs it (see `isotach_smm::SmmNode::register_rmw`).
    Apply(u16),
}

impl RmwOp {
    /// The operation code on the wire.
    pub fn op(self) -> SrefOp {
        match self {
            Self::Add => SrefOp::Add,
            Self::CompareAndSwap => SrefOp::CompareAndSwap,
            Self::Apply(_) => SrefOp::Apply,
        }
    }

    /// The new value of a built-in operation on `old` (`None` for [`RmwOp::Apply`], whose
    /// function only the application knows). Both arguments fit `width`.
    pub fn built_in(self, width: Width, old: u64, arg: u64, arg2: u64) -> Option<u64> {
        match self {
            Self::Add => Some(old.wrapping_add(arg) & width.max_value()),
            Self::CompareAndSwap => Some(if old == arg { arg2 } else { old }),
            Self::Apply(_) => None,
        }
    }
}

/// An atomic read-modify-write of one variable, as one copy receives it: the SMM keeps it in
/// this form from issue to execution (and while it waits for an assign).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RmwSref {
    /// What it does.
    pub op: RmwOp,
    /// Variable width.
    pub width: Width,
    /// Shared address (page and offset).
    pub addr: u64,
    /// The argument (the addend, the expected value, the function's argument); fits `width`.
    pub arg: u64,
    /// The second argument (compare-and-swap's new value, else 0); fits `width`.
    pub arg2: u64,
    /// Requester-local reference, echoed in the answer.
    pub ref_id: u32,
    /// This copy answers the issuer with the old value (exactly one copy does).
    pub answer: bool,
}

/// The shared-memory reference an isotach message carries.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Sref {
    /// read / write / sched / assign of one variable.
    Mem {
        /// Which of the memory operations (never [`SrefOp::Msg`]).
        op: SrefOp,
        /// Variable width.
        width: Width,
        /// Shared address (page and offset).
        addr: u64,
        /// Value written or assigned (0 for read and sched); fits `width`.
        value: u64,
        /// Requester-local reference, echoed in read replies.
        ref_id: u32,
    },
    /// An atomic read-modify-write of one variable at every copy (see [`RmwOp`]).
    Rmw(RmwSref),
    /// A message run by handler `handler` at its place in the order.
    Msg {
        /// Handler index at the destination.
        handler: u16,
        /// At most [`MSG_PAYLOAD_MAX`] bytes.
        payload: Vec<u8>,
    },
}

impl Sref {
    /// The shared address it operates on (memory and read-modify-write srefs).
    pub fn addr(&self) -> Option<u64> {
        match self {
            Self::Mem { addr, .. } | Self::Rmw(RmwSref { addr, .. }) => Some(*addr),
            Self::Msg { .. } => None,
        }
    }

    /// The operation code.
    pub fn op(&self) -> SrefOp {
        match self {
            Self::Mem { op, .. } => *op,
            Self::Rmw(r) => r.op.op(),
            Self::Msg { .. } => SrefOp::Msg,
        }
    }
}

/// An isotach message: one sref, timestamped by the source SIU.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IsotachMessage {
    /// Timestamp (the pulse it executes in); the host sends 0 and the SIU stamps it.
    pub ts: Pulse,
    /// Source host; stamped by the SIU.
    pub source: u16,
    /// Destination host.
    pub dest: u16,
    /// Per-source sequence number; stamped by the SIU; orders messages of one source in a pulse.
    pub sequum: u64,
    /// The generation of logical time it was sent in; stamped by the SIU. A node takes only
    /// messages of its own generation, so nothing sent before a restart lands after it.
    pub generation: Generation,
    /// The reference.
    pub sref: Sref,
}

/// The fields the source SIU stamps into a message (see [`IsotachMessage::stamp_in_place`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    /// The isochron's timestamp.
    pub ts: Pulse,
    /// The SIU's host.
    pub source: u16,
    /// The SIU's next sequence number.
    pub sequum: u64,
    /// The SIU's generation.
    pub generation: Generation,
}

/// Byte offsets of the fields the SIU stamps in place.
const MSG_TS_AT: usize = 4;
const MSG_SOURCE_AT: usize = 12;
const MSG_DEST_AT: usize = 14;
const MSG_SEQUUM_AT: usize = 16;
const MSG_GENERATION_AT: usize = 24;

impl IsotachMessage {
    /// A message to `dest` as a host hands it to its SIU: timestamp, source, sequence number
    /// and generation zero, for the SIU to stamp (`stamp_in_place`).
    pub fn unstamped(dest: u16, sref: Sref) -> Self {
        Self {
            ts: Pulse::new(0),
            source: 0,
            dest,
            sequum: 0,
            generation: Generation::new(0),
            sref,
        }
    }

    /// Encoded length.
    pub fn encoded_len(&self) -> usize {
        match &self.sref {
            Sref::Mem { .. } => MEM_MESSAGE_LEN,
            Sref::Rmw { .. } => RMW_MESSAGE_LEN,
            Sref::Msg { payload, .. } => MSG_MESSAGE_LEN_MIN + payload.len(),
        }
    }

    /// Appends the encoded message; returns its CRC.
    pub fn encode(&self, out: &mut Vec<u8>) -> u32 {
        let start = begin(out, Kind::IsotachMessage);
        debug_assert!(
            !matches!(
                &self.sref,
                Sref::Mem {
                    op: SrefOp::Msg | SrefOp::Add | SrefOp::CompareAndSwap | SrefOp::Apply,
                    ..
                }
            ),
            "a memory sref with another kind's operation"
        );
        out.push(self.sref.op() as u8);
        out.push(match &self.sref {
            Sref::Mem { width, .. } | Sref::Rmw(RmwSref { width, .. }) => *width as u8,
            Sref::Msg { .. } => 0,
        });
        push_u64(out, self.ts.get());
        push_u16(out, self.source);
        push_u16(out, self.dest);
        push_u64(out, self.sequum);
        push_u32(out, self.generation.get());
        match &self.sref {
            Sref::Mem {
                addr,
                value,
                ref_id,
                ..
            } => {
                push_u64(out, *addr);
                push_u64(out, *value);
                push_u32(out, *ref_id);
            }
            Sref::Rmw(r) => {
                debug_assert!(r.arg <= r.width.max_value() && r.arg2 <= r.width.max_value());
                push_u64(out, r.addr);
                push_u64(out, r.arg);
                push_u64(out, r.arg2);
                push_u32(out, r.ref_id);
                push_u16(out, if let RmwOp::Apply(f) = r.op { f } else { 0 });
                out.push(if r.answer { RMW_FLAG_ANSWER } else { 0 });
                out.push(0);
            }
            Sref::Msg { handler, payload } => {
                debug_assert!(payload.len() <= MSG_PAYLOAD_MAX);
                push_u16(out, *handler);
                push_u16(out, payload.len() as u16);
                out.extend_from_slice(payload);
            }
        }
        seal(out, start)
    }

    /// Decodes an isotach message.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let (m, payload) = Self::parse(bytes)?;
        let sref = match (m.sref, payload) {
            (Sref::Msg { handler, .. }, Some(p)) => Sref::Msg {
                handler,
                payload: p.to_vec(),
            },
            (sref, _) => sref,
        };
        Ok(Self { sref, ..m })
    }

    /// Checks an encoded message exactly as [`IsotachMessage::decode`] does, without copying
    /// its payload, and returns its destination: what a token manager needs to forward it.
    pub fn validate(bytes: &[u8]) -> Result<u16, DecodeError> {
        Self::parse(bytes).map(|(m, _)| m.dest)
    }

    /// Parses and checks every field. A `msg` sref comes back with an empty payload and the
    /// payload's bytes beside it, borrowed, so callers choose whether to copy.
    fn parse(bytes: &[u8]) -> Result<(Self, Option<&[u8]>), DecodeError> {
        const LEN_MAX: usize = MSG_MESSAGE_LEN_MIN + MSG_PAYLOAD_MAX;
        const _: () = assert!(RMW_MESSAGE_LEN <= LEN_MAX && MEM_MESSAGE_LEN <= LEN_MAX);
        let len_max = LEN_MAX;
        let mut f = Fields::new(open(bytes, Kind::IsotachMessage, len_max)?);
        let op = SrefOp::from_byte(f.u8()?)?;
        let width_byte = f.u8()?;
        let ts = Pulse::new(f.u64()?);
        let source = f.u16()?;
        let dest = f.u16()?;
        let sequum = f.u64()?;
        let generation = Generation::new(f.u32()?);
        let mut payload = None;
        let sref = if op == SrefOp::Msg {
            if width_byte != 0 {
                return Err(DecodeError::OutOfRange {
                    field: "message.width",
                    value: u64::from(width_byte),
                });
            }
            let handler = f.u16()?;
            let len = usize::from(f.u16()?);
            if len > MSG_PAYLOAD_MAX {
                return Err(DecodeError::OutOfRange {
                    field: "message.len",
                    value: len as u64,
                });
            }
            payload = Some(f.take(len)?);
            Sref::Msg {
                handler,
                payload: Vec::new(),
            }
        } else if matches!(op, SrefOp::Add | SrefOp::CompareAndSwap | SrefOp::Apply) {
            Self::parse_rmw(&mut f, op, width_byte)?
        } else {
            let width = Self::parse_width(width_byte)?;
            let addr = f.u64()?;
            let value = f.u64()?;
            if value > width.max_value() {
                return Err(DecodeError::OutOfRange {
                    field: "message.value",
                    value,
                });
            }
            let ref_id = f.u32()?;
            Sref::Mem {
                op,
                width,
                addr,
                value,
                ref_id,
            }
        };
        f.finish(len_max)?;
        let m = Self {
            ts,
            source,
            dest,
            sequum,
            generation,
            sref,
        };
        Ok((m, payload))
    }

    fn parse_width(width_byte: u8) -> Result<Width, DecodeError> {
        Width::from_byte(width_byte).ok_or(DecodeError::OutOfRange {
            field: "message.width",
            value: u64::from(width_byte),
        })
    }

    /// A value field that must fit the variable's width.
    fn fitting(f: &mut Fields<'_>, width: Width, field: &'static str) -> Result<u64, DecodeError> {
        let value = f.u64()?;
        if value > width.max_value() {
            return Err(DecodeError::OutOfRange { field, value });
        }
        Ok(value)
    }

    /// The body of a read-modify-write sref: addr, arg, arg2, ref_id, func, flags, reserved.
    fn parse_rmw(f: &mut Fields<'_>, op: SrefOp, width_byte: u8) -> Result<Sref, DecodeError> {
        let width = Self::parse_width(width_byte)?;
        let addr = f.u64()?;
        let arg = Self::fitting(f, width, "message.arg")?;
        let arg2 = Self::fitting(f, width, "message.arg2")?;
        let ref_id = f.u32()?;
        let func = f.u16()?;
        let flags = check_bits("message.flags", f.u8()?, RMW_FLAG_ANSWER)?;
        f.reserved(1, "message.reserved")?;
        let op = match op {
            SrefOp::Apply => RmwOp::Apply(func),
            // Only `apply` names a function; only compare-and-swap has a second argument.
            _ if func != 0 => {
                return Err(DecodeError::OutOfRange {
                    field: "message.func",
                    value: u64::from(func),
                });
            }
            SrefOp::Add if arg2 != 0 => {
                return Err(DecodeError::OutOfRange {
                    field: "message.arg2",
                    value: arg2,
                });
            }
            SrefOp::Add => RmwOp::Add,
            _ => RmwOp::CompareAndSwap,
        };
        if matches!(op, RmwOp::Apply(_)) && arg2 != 0 {
            return Err(DecodeError::OutOfRange {
                field: "message.arg2",
                value: arg2,
            });
        }
        Ok(Sref::Rmw(RmwSref {
            op,
            width,
            addr,
            arg,
            arg2,
            ref_id,
            answer: flags & RMW_FLAG_ANSWER != 0,
        }))
    }

    /// Reads the destination of an encoded message whose CRC was already checked.
    pub fn peek_dest(bytes: &[u8]) -> Option<u16> {
        let b = bytes.get(MSG_DEST_AT..MSG_DEST_AT + 2)?;
        Some(u16::from_be_bytes([b[0], b[1]]))
    }

    /// Reads `(ts, source, sequum)` of an encoded message whose CRC was already checked.
    pub fn peek_stamp(bytes: &[u8]) -> Option<(Pulse, u16, u64)> {
        let ts = bytes.get(MSG_TS_AT..MSG_TS_AT + 8)?;
        let src = bytes.get(MSG_SOURCE_AT..MSG_SOURCE_AT + 2)?;
        let seq = bytes.get(MSG_SEQUUM_AT..MSG_SEQUUM_AT + 8)?;
        Some((
            Pulse::new(u64::from_be_bytes(ts.try_into().ok()?)),
            u16::from_be_bytes([src[0], src[1]]),
            u64::from_be_bytes(seq.try_into().ok()?),
        ))
    }

    /// Reads the generation of an encoded message whose CRC was already checked.
    pub fn peek_generation(bytes: &[u8]) -> Option<Generation> {
        let b = bytes.get(MSG_GENERATION_AT..MSG_GENERATION_AT + 4)?;
        Some(Generation::new(u32::from_be_bytes(b.try_into().ok()?)))
    }

    /// Stamps `ts`, `source`, `sequum` and `generation` into an encoded, valid message in
    /// place and recomputes its CRC, which it returns. The SIU's hot path: no re-encoding.
    pub fn stamp_in_place(bytes: &mut [u8], stamp: Stamp) -> u32 {
        debug_assert!(bytes.len() >= MSG_MESSAGE_LEN_MIN);
        let Stamp {
            ts,
            source,
            sequum,
            generation,
        } = stamp;
        bytes[MSG_TS_AT..MSG_TS_AT + 8].copy_from_slice(&ts.get().to_be_bytes());
        bytes[MSG_SOURCE_AT..MSG_SOURCE_AT + 2].copy_from_slice(&source.to_be_bytes());
        bytes[MSG_SEQUUM_AT..MSG_SEQUUM_AT + 8].copy_from_slice(&sequum.to_be_bytes());
        bytes[MSG_GENERATION_AT..MSG_GENERATION_AT + 4]
            .copy_from_slice(&generation.get().to_be_bytes());
        let at = bytes.len() - CRC_LEN;
        let crc = crc32(&bytes[..at]);
        bytes[at..].copy_from_slice(&crc.to_be_bytes());
        crc
    }
}
