//! Data-plane packets: fixed big-endian layouts, a version byte and a trailing CRC-32.
//!
//! Every packet starts with `[version, kind]` and ends with the CRC-32 (IEEE) of all bytes
//! before it. Reserved bytes and flag bits must be zero. `docs/wire.md` lists every byte.
//!
//! Decoders check, in this order: the 6-byte minimum, version, kind, the kind's minimum and
//! maximum length, CRC, then every field's range. They return a [`DecodeError`] and never panic.

use thiserror::Error;

/// The wire format version this crate speaks.
pub const VERSION: u8 = 1;
/// Bytes of the trailing CRC.
pub const CRC_LEN: usize = 4;
/// Most entries a sort vector carries (the hardware bucket size).
pub const SORT_VECTOR_MAX: usize = 32;
/// Largest payload of a `msg` sref.
pub const MSG_PAYLOAD_MAX: usize = 1024;
/// Largest payload of a non-isotach message.
pub const PLAIN_PAYLOAD_MAX: usize = 4096;
/// Number of barriers (bits in a barrier field).
pub const BARRIERS: usize = 2;
/// Mask of valid barrier bits.
pub const BARRIER_MASK: u8 = 0b11;
/// Largest encoded packet (a non-isotach message with the largest payload).
pub const PACKET_LEN_MAX: usize = PLAIN_LEN_MIN + PLAIN_PAYLOAD_MAX;

/// Encoded length of a token.
pub const TOKEN_LEN: usize = 16;
/// Encoded length of a start-of-isochron packet.
pub const SOI_LEN: usize = 24;
/// Encoded length of a memory sref message (read, write, sched, assign).
pub const MEM_MESSAGE_LEN: usize = 48;
/// Encoded length of a `msg` sref message without its payload.
pub const MSG_MESSAGE_LEN_MIN: usize = 32;
/// Encoded length of an end-of-isochron packet.
pub const EOI_LEN: usize = 12;
/// Encoded length of an isochron marker.
pub const CHR_LEN: usize = 32;
/// Encoded length of an EOP marker without its sort vector.
pub const EOP_LEN_MIN: usize = 32;
/// Encoded length of a barrier/signal marker.
pub const BSM_LEN: usize = 16;
/// Encoded length of a non-isotach message without its payload.
pub const PLAIN_LEN_MIN: usize = 12;

/// Why bytes are not a valid packet.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DecodeError {
    /// Fewer bytes than the kind needs.
    #[error("packet too short: {got} bytes, need {need}")]
    Short {
        /// Bytes needed.
        need: usize,
        /// Bytes present.
        got: usize,
    },
    /// More bytes than the kind's layout holds.
    #[error("packet too long: {got} bytes, layout holds {max}")]
    Long {
        /// Bytes the layout holds.
        max: usize,
        /// Bytes present.
        got: usize,
    },
    /// The version byte is not [`VERSION`].
    #[error("unsupported wire version {0} (speak {VERSION})")]
    BadVersion(u8),
    /// The kind byte names no packet kind.
    #[error("unknown packet kind 0x{0:02x}")]
    UnknownKind(u8),
    /// The kind byte names another kind than the decoder expects.
    #[error("expected a {expected:?} packet, found {found:?}")]
    WrongKind {
        /// Kind the caller asked for.
        expected: Kind,
        /// Kind in the packet.
        found: Kind,
    },
    /// The trailing CRC does not match the bytes.
    #[error("bad CRC: packet says 0x{found:08x}, bytes give 0x{computed:08x}")]
    BadCrc {
        /// CRC carried by the packet.
        found: u32,
        /// CRC of the bytes.
        computed: u32,
    },
    /// A field holds a value outside its range (including non-zero reserved bits).
    #[error("field `{field}` out of range: {value}")]
    OutOfRange {
        /// The field's name as in `docs/wire.md`.
        field: &'static str,
        /// The offending value.
        value: u64,
    },
}

/// Packet kinds; the second byte of every packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    /// Token: ends a pulse.
    Token = 0x01,
    /// Start of isochron (host to SIU).
    StartOfIsochron = 0x02,
    /// Isotach message carrying one sref.
    IsotachMessage = 0x03,
    /// End of isochron (host to SIU).
    EndOfIsochron = 0x04,
    /// Isochron marker (SIU to host).
    IsochronMarker = 0x05,
    /// End-of-pulse marker (SIU to host).
    EopMarker = 0x06,
    /// Barrier/signal marker (host to SIU).
    BarrierSignalMarker = 0x07,
    /// Non-isotach message, passed through untouched.
    Plain = 0x08,
}

impl Kind {
    /// The kind named by a kind byte.
    pub fn from_byte(byte: u8) -> Result<Self, DecodeError> {
        Ok(match byte {
            0x01 => Self::Token,
            0x02 => Self::StartOfIsochron,
            0x03 => Self::IsotachMessage,
            0x04 => Self::EndOfIsochron,
            0x05 => Self::IsochronMarker,
            0x06 => Self::EopMarker,
            0x07 => Self::BarrierSignalMarker,
            0x08 => Self::Plain,
            other => return Err(DecodeError::UnknownKind(other)),
        })
    }

    /// Smallest encoded length of this kind.
    pub fn len_min(self) -> usize {
        match self {
            Self::Token => TOKEN_LEN,
            Self::StartOfIsochron => SOI_LEN,
            Self::IsotachMessage => MSG_MESSAGE_LEN_MIN,
            Self::EndOfIsochron => EOI_LEN,
            Self::IsochronMarker => CHR_LEN,
            Self::EopMarker => EOP_LEN_MIN,
            Self::BarrierSignalMarker => BSM_LEN,
            Self::Plain => PLAIN_LEN_MIN,
        }
    }
}

/// CRC-32 (IEEE) of `bytes`.
pub fn crc32(bytes: &[u8]) -> u32 {
    crc32fast::hash(bytes)
}

/// The CRC carried in the last four bytes of an encoded packet (0 if too short).
pub fn carried_crc(bytes: &[u8]) -> u32 {
    match bytes.len().checked_sub(CRC_LEN) {
        Some(at) => u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]),
        None => 0,
    }
}

/// Reads the kind of an encoded packet after checking its version, without checking the rest.
pub fn peek_kind(bytes: &[u8]) -> Result<Kind, DecodeError> {
    if bytes.len() < 2 + CRC_LEN {
        return Err(DecodeError::Short {
            need: 2 + CRC_LEN,
            got: bytes.len(),
        });
    }
    if bytes[0] != VERSION {
        return Err(DecodeError::BadVersion(bytes[0]));
    }
    Kind::from_byte(bytes[1])
}

/// Checks version, kind, length bounds and CRC; returns the body (bytes between the kind
/// byte and the CRC).
fn open(bytes: &[u8], kind: Kind, len_max: usize) -> Result<&[u8], DecodeError> {
    let found = peek_kind(bytes)?;
    if found != kind {
        return Err(DecodeError::WrongKind {
            expected: kind,
            found,
        });
    }
    if bytes.len() < kind.len_min() {
        return Err(DecodeError::Short {
            need: kind.len_min(),
            got: bytes.len(),
        });
    }
    if bytes.len() > len_max {
        return Err(DecodeError::Long {
            max: len_max,
            got: bytes.len(),
        });
    }
    let at = bytes.len() - CRC_LEN;
    let computed = crc32(&bytes[..at]);
    let found = carried_crc(bytes);
    if computed != found {
        return Err(DecodeError::BadCrc { found, computed });
    }
    Ok(&bytes[2..at])
}

/// Appends `[VERSION, kind]`; returns the packet's start offset for [`seal`].
fn begin(out: &mut Vec<u8>, kind: Kind) -> usize {
    let start = out.len();
    out.push(VERSION);
    out.push(kind as u8);
    start
}

/// Appends the CRC of everything from `start`; returns it.
fn seal(out: &mut Vec<u8>, start: usize) -> u32 {
    let crc = crc32(&out[start..]);
    out.extend_from_slice(&crc.to_be_bytes());
    crc
}

/// Big-endian field reader over a body whose length was already checked.
struct Fields<'a> {
    body: &'a [u8],
    at: usize,
}

impl<'a> Fields<'a> {
    fn new(body: &'a [u8]) -> Self {
        Self { body, at: 0 }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.body.len());
        let Some(end) = end else {
            return Err(DecodeError::Short {
                need: 2 + self.at + n + CRC_LEN,
                got: 2 + self.body.len() + CRC_LEN,
            });
        };
        let slice = &self.body[self.at..end];
        self.at = end;
        Ok(slice)
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, DecodeError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> Result<u64, DecodeError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }

    /// A reserved field: must be zero.
    fn reserved(&mut self, n: usize, field: &'static str) -> Result<(), DecodeError> {
        let b = self.take(n)?;
        match b.iter().find(|&&x| x != 0) {
            Some(&x) => Err(DecodeError::OutOfRange {
                field,
                value: u64::from(x),
            }),
            None => Ok(()),
        }
    }

    /// Everything must have been read.
    fn finish(&self, len_max: usize) -> Result<(), DecodeError> {
        if self.at != self.body.len() {
            return Err(DecodeError::Long {
                max: len_max.min(2 + self.at + CRC_LEN),
                got: 2 + self.body.len() + CRC_LEN,
            });
        }
        Ok(())
    }
}

fn check_bits(field: &'static str, value: u8, mask: u8) -> Result<u8, DecodeError> {
    if value & !mask != 0 {
        return Err(DecodeError::OutOfRange {
            field,
            value: u64::from(value),
        });
    }
    Ok(value)
}

fn push_u16(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_be_bytes());
}
fn push_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_be_bytes());
}
fn push_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_be_bytes());
}

// ---------------------------------------------------------------------------------------------
// Token

/// Token flag bits (byte 2, above the 2-bit sequence number).
mod token_flags {
    pub(super) const SEQ: u8 = 0b0000_0011;
    pub(super) const REPEAT: u8 = 0b0000_0100;
    pub(super) const RESET: u8 = 0b0000_1000;
    pub(super) const END_OF_EPOCH: u8 = 0b0001_0000;
    pub(super) const RESTART: u8 = 0b0010_0000;
    pub(super) const ALL: u8 = SEQ | REPEAT | RESET | END_OF_EPOCH | RESTART;
}

/// A token: ends a pulse on the link it travels. 16 bytes on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Token {
    /// 2-bit sequence number (`start` = 1; a reply to `r` carries `(r + 1) mod 4`).
    pub seq: u8,
    /// A resend by the lost-token algorithm.
    pub repeat: bool,
    /// The reset signal, gathered and delivered like the other signals (requirement 37).
    pub reset: bool,
    /// The token that ends an epoch; its signal bits are delivered.
    pub end_of_epoch: bool,
    /// A restart token: logical time starts again in `generation` (which must be newer than the
    /// receiver's). Not a wave token: its sequence number is 0 and it ends no pulse.
    pub restart: bool,
    /// Barrier bits (bit b = barrier b).
    pub barrier: u8,
    /// Application signal bits.
    pub signals: u8,
    /// The sender's port: a host id, or `0x8000 | switch id` for a token manager.
    pub source_port: u16,
    /// Logical-time generation (bumped by every restart, compared in serial-number arithmetic);
    /// tokens of another generation are dropped.
    pub generation: u32,
}

impl Token {
    /// Appends the encoded token; returns its CRC.
    pub fn encode(&self, out: &mut Vec<u8>) -> u32 {
        debug_assert!(self.seq <= 3 && self.barrier & !BARRIER_MASK == 0);
        let start = begin(out, Kind::Token);
        let mut flags = self.seq & token_flags::SEQ;
        if self.repeat {
            flags |= token_flags::REPEAT;
        }
        if self.reset {
            flags |= token_flags::RESET;
        }
        if self.end_of_epoch {
            flags |= token_flags::END_OF_EPOCH;
        }
        if self.restart {
            flags |= token_flags::RESTART;
        }
        out.push(flags);
        out.push(self.barrier & BARRIER_MASK);
        push_u16(out, self.source_port);
        out.push(self.signals);
        out.push(0);
        push_u32(out, self.generation);
        seal(out, start)
    }

    /// Encodes into a fixed array.
    pub fn to_bytes(&self) -> [u8; TOKEN_LEN] {
        let mut v = Vec::with_capacity(TOKEN_LEN);
        self.encode(&mut v);
        let mut a = [0u8; TOKEN_LEN];
        a.copy_from_slice(&v);
        a
    }

    /// Is `bytes` a valid token marked repeat? A repeat only re-sends one of the last two
    /// tokens; over a reliable link its original is already on the way, so a driver whose
    /// link is full may drop it (the token timer would otherwise fill every queue with
    /// repeats while logical time waits).
    pub fn is_repeat(bytes: &[u8]) -> bool {
        Self::decode(bytes).is_ok_and(|t| t.repeat)
    }

    /// Decodes a token.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut f = Fields::new(open(bytes, Kind::Token, TOKEN_LEN)?);
        let flags = check_bits("token.flags", f.u8()?, token_flags::ALL)?;
        let barrier = check_bits("token.barrier", f.u8()?, BARRIER_MASK)?;
        let source_port = f.u16()?;
        let signals = f.u8()?;
        f.reserved(1, "token.reserved")?;
        let generation = f.u32()?;
        f.finish(TOKEN_LEN)?;
        Ok(Self {
            seq: flags & token_flags::SEQ,
            repeat: flags & token_flags::REPEAT != 0,
            reset: flags & token_flags::RESET != 0,
            end_of_epoch: flags & token_flags::END_OF_EPOCH != 0,
            restart: flags & token_flags::RESTART != 0,
            barrier,
            signals,
            source_port,
            generation,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Start of isochron

mod soi_flags {
    pub(super) const LOGGED: u8 = 0b01;
    pub(super) const HOST_GAP: u8 = 0b10;
    pub(super) const ALL: u8 = LOGGED | HOST_GAP;
}

/// Start of an isochron, host to SIU. 24 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct StartOfIsochron {
    /// Host-chosen id, echoed in the isochron marker.
    pub iso_id: u32,
    /// Channel (requirement 27).
    pub channel: u8,
    /// Sequence set, 0 or 1 (requirement 27).
    pub seqset: u8,
    /// The TS of this isochron bounds later isochrons of the other set.
    pub logged: bool,
    /// The host supplies `gap` for the logged TS (requirement 28).
    pub host_gap: bool,
    /// Host-supplied gap, used when `host_gap` is set.
    pub gap: u32,
    /// Extra pulses of slack so tokens may flow while the isochron is sent (requirement 25).
    pub send_delta: u32,
    /// Isochron distance: the largest logical distance to any destination (≥ 1).
    pub distance: u16,
}

impl StartOfIsochron {
    /// Appends the encoded packet; returns its CRC.
    pub fn encode(&self, out: &mut Vec<u8>) -> u32 {
        let start = begin(out, Kind::StartOfIsochron);
        push_u32(out, self.iso_id);
        out.push(self.channel);
        out.push(self.seqset);
        let mut flags = 0;
        if self.logged {
            flags |= soi_flags::LOGGED;
        }
        if self.host_gap {
            flags |= soi_flags::HOST_GAP;
        }
        out.push(flags);
        out.push(0);
        push_u16(out, self.distance);
        push_u32(out, self.gap);
        push_u32(out, self.send_delta);
        seal(out, start)
    }

    /// Decodes a start-of-isochron packet.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut f = Fields::new(open(bytes, Kind::StartOfIsochron, SOI_LEN)?);
        let iso_id = f.u32()?;
        let channel = f.u8()?;
        let seqset = check_bits("soi.seqset", f.u8()?, 1)?;
        let flags = check_bits("soi.flags", f.u8()?, soi_flags::ALL)?;
        f.reserved(1, "soi.reserved")?;
        let distance = f.u16()?;
        if distance == 0 {
            return Err(DecodeError::OutOfRange {
                field: "soi.distance",
                value: 0,
            });
        }
        let gap = f.u32()?;
        let send_delta = f.u32()?;
        f.finish(SOI_LEN)?;
        Ok(Self {
            iso_id,
            channel,
            seqset,
            logged: flags & soi_flags::LOGGED != 0,
            host_gap: flags & soi_flags::HOST_GAP != 0,
            gap,
            send_delta,
            distance,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Isotach message and srefs

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
    /// Largest value a variable of this width holds.
    pub fn max_value(self) -> u64 {
        match self {
            Self::W32 => u64::from(u32::MAX),
            Self::W64 => u64::MAX,
        }
    }
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
    /// A message run by handler `handler` at its place in the order.
    Msg {
        /// Handler index at the destination.
        handler: u16,
        /// At most [`MSG_PAYLOAD_MAX`] bytes.
        payload: Vec<u8>,
    },
}

impl Sref {
    /// The operation code.
    pub fn op(&self) -> SrefOp {
        match self {
            Self::Mem { op, .. } => *op,
            Self::Msg { .. } => SrefOp::Msg,
        }
    }
}

/// An isotach message: one sref, timestamped by the source SIU.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IsotachMessage {
    /// Timestamp (the pulse it executes in); the host sends 0 and the SIU stamps it.
    pub ts: u64,
    /// Source host; stamped by the SIU.
    pub source: u16,
    /// Destination host.
    pub dest: u16,
    /// Per-source sequence number; stamped by the SIU; orders messages of one source in a pulse.
    pub sequum: u64,
    /// The reference.
    pub sref: Sref,
}

/// Byte offsets of the fields the SIU stamps in place.
const MSG_TS_AT: usize = 4;
const MSG_SOURCE_AT: usize = 12;
const MSG_DEST_AT: usize = 14;
const MSG_SEQUUM_AT: usize = 16;

impl IsotachMessage {
    /// Encoded length.
    pub fn encoded_len(&self) -> usize {
        match &self.sref {
            Sref::Mem { .. } => MEM_MESSAGE_LEN,
            Sref::Msg { payload, .. } => MSG_MESSAGE_LEN_MIN + payload.len(),
        }
    }

    /// Appends the encoded message; returns its CRC.
    pub fn encode(&self, out: &mut Vec<u8>) -> u32 {
        let start = begin(out, Kind::IsotachMessage);
        out.push(self.sref.op() as u8);
        out.push(match &self.sref {
            Sref::Mem { width, .. } => *width as u8,
            Sref::Msg { .. } => 0,
        });
        push_u64(out, self.ts);
        push_u16(out, self.source);
        push_u16(out, self.dest);
        push_u64(out, self.sequum);
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
        let len_max = MSG_MESSAGE_LEN_MIN + MSG_PAYLOAD_MAX;
        let mut f = Fields::new(open(bytes, Kind::IsotachMessage, len_max)?);
        let op = SrefOp::from_byte(f.u8()?)?;
        let width_byte = f.u8()?;
        let ts = f.u64()?;
        let source = f.u16()?;
        let dest = f.u16()?;
        let sequum = f.u64()?;
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
        } else {
            let width = match width_byte {
                4 => Width::W32,
                8 => Width::W64,
                other => {
                    return Err(DecodeError::OutOfRange {
                        field: "message.width",
                        value: u64::from(other),
                    });
                }
            };
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
            sref,
        };
        Ok((m, payload))
    }

    /// Reads the destination of an encoded message whose CRC was already checked.
    pub fn peek_dest(bytes: &[u8]) -> Option<u16> {
        let b = bytes.get(MSG_DEST_AT..MSG_DEST_AT + 2)?;
        Some(u16::from_be_bytes([b[0], b[1]]))
    }

    /// Reads `(ts, source, sequum)` of an encoded message whose CRC was already checked.
    pub fn peek_stamp(bytes: &[u8]) -> Option<(u64, u16, u64)> {
        let ts = bytes.get(MSG_TS_AT..MSG_TS_AT + 8)?;
        let src = bytes.get(MSG_SOURCE_AT..MSG_SOURCE_AT + 2)?;
        let seq = bytes.get(MSG_SEQUUM_AT..MSG_SEQUUM_AT + 8)?;
        Some((
            u64::from_be_bytes(ts.try_into().ok()?),
            u16::from_be_bytes([src[0], src[1]]),
            u64::from_be_bytes(seq.try_into().ok()?),
        ))
    }

    /// Stamps `ts`, `source` and `sequum` into an encoded, valid message in place and
    /// recomputes its CRC, which it returns. The SIU's hot path: no re-encoding.
    pub fn stamp_in_place(bytes: &mut [u8], ts: u64, source: u16, sequum: u64) -> u32 {
        debug_assert!(bytes.len() >= MSG_MESSAGE_LEN_MIN);
        bytes[MSG_TS_AT..MSG_TS_AT + 8].copy_from_slice(&ts.to_be_bytes());
        bytes[MSG_SOURCE_AT..MSG_SOURCE_AT + 2].copy_from_slice(&source.to_be_bytes());
        bytes[MSG_SEQUUM_AT..MSG_SEQUUM_AT + 8].copy_from_slice(&sequum.to_be_bytes());
        let at = bytes.len() - CRC_LEN;
        let crc = crc32(&bytes[..at]);
        bytes[at..].copy_from_slice(&crc.to_be_bytes());
        crc
    }
}

// ---------------------------------------------------------------------------------------------
// End of isochron

/// End of an isochron, host to SIU. 12 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct EndOfIsochron {
    /// Must match the open isochron's `iso_id`.
    pub iso_id: u32,
}

impl EndOfIsochron {
    /// Appends the encoded packet; returns its CRC.
    pub fn encode(&self, out: &mut Vec<u8>) -> u32 {
        let start = begin(out, Kind::EndOfIsochron);
        push_u32(out, self.iso_id);
        push_u16(out, 0);
        seal(out, start)
    }

    /// Decodes an end-of-isochron packet.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut f = Fields::new(open(bytes, Kind::EndOfIsochron, EOI_LEN)?);
        let iso_id = f.u32()?;
        f.reserved(2, "eoi.reserved")?;
        f.finish(EOI_LEN)?;
        Ok(Self { iso_id })
    }
}

// ---------------------------------------------------------------------------------------------
// Isochron marker

/// Isochron marker, SIU to host: the isochron left the SIU with timestamp `ts`. 32 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct IsochronMarker {
    /// The isochron's id from its start-of-isochron packet.
    pub iso_id: u32,
    /// This host (the isochron's source).
    pub source: u16,
    /// The isochron's timestamp.
    pub ts: u64,
    /// The isochron's first sequum: the marker sorts where the isochron does.
    pub sequum: u64,
    /// XOR of the CRCs of the isochron's messages as they left the SIU.
    pub crc_xor: u32,
}

impl IsochronMarker {
    /// Appends the encoded packet; returns its CRC.
    pub fn encode(&self, out: &mut Vec<u8>) -> u32 {
        let start = begin(out, Kind::IsochronMarker);
        push_u32(out, self.iso_id);
        push_u16(out, self.source);
        push_u64(out, self.ts);
        push_u64(out, self.sequum);
        push_u32(out, self.crc_xor);
        seal(out, start)
    }

    /// Decodes an isochron marker.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut f = Fields::new(open(bytes, Kind::IsochronMarker, CHR_LEN)?);
        let iso_id = f.u32()?;
        let source = f.u16()?;
        let ts = f.u64()?;
        let sequum = f.u64()?;
        let crc_xor = f.u32()?;
        f.finish(CHR_LEN)?;
        Ok(Self {
            iso_id,
            source,
            ts,
            sequum,
            crc_xor,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// EOP marker

mod eop_flags {
    pub(super) const REPEAT: u8 = 0b001;
    pub(super) const RESET: u8 = 0b010;
    pub(super) const END_OF_EPOCH: u8 = 0b100;
    pub(super) const ALL: u8 = REPEAT | RESET | END_OF_EPOCH;
}

/// End-of-pulse marker, SIU to host. 32 bytes plus one byte per sort-vector entry.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct EopMarker {
    /// The pulse this marker ends (don't-care in host mode).
    pub ts: u64,
    /// Isotach messages plus isochron markers the SIU sent the host with TS `ts`; may exceed
    /// the sort vector. 0 on a host-mode repeat.
    pub count: u32,
    /// Host mode: the token that caused this marker was a repeat; count and vector are absent.
    pub repeat: bool,
    /// Reset signal (requirement 37).
    pub reset: bool,
    /// The token that ended the pulse ended an epoch.
    pub end_of_epoch: bool,
    /// Signal bits (requirements 37, 39).
    pub signals: u8,
    /// Barrier bits: barriers completed by this pulse's token (requirements 38, 39).
    pub barrier: u8,
    /// Kind byte copied from token `ts + 1` (requirement 16).
    pub token_kind: u8,
    /// CRC copied from token `ts + 1` (requirement 16).
    pub token_crc: u32,
    /// Arrival indices (from 0, in the order the host received the pulse's packets) listed in
    /// (source, sequum) order; at most [`SORT_VECTOR_MAX`] entries.
    pub sort_vector: Vec<u8>,
}

impl EopMarker {
    /// Appends the encoded packet; returns its CRC.
    pub fn encode(&self, out: &mut Vec<u8>) -> u32 {
        debug_assert!(self.sort_vector.len() <= SORT_VECTOR_MAX);
        let start = begin(out, Kind::EopMarker);
        let mut flags = 0;
        if self.repeat {
            flags |= eop_flags::REPEAT;
        }
        if self.reset {
            flags |= eop_flags::RESET;
        }
        if self.end_of_epoch {
            flags |= eop_flags::END_OF_EPOCH;
        }
        out.push(flags);
        out.push(self.barrier & BARRIER_MASK);
        out.push(self.signals);
        out.push(self.sort_vector.len() as u8);
        push_u16(out, 0);
        push_u64(out, self.ts);
        push_u32(out, self.count);
        push_u32(out, self.token_crc);
        out.push(self.token_kind);
        out.extend_from_slice(&[0, 0, 0]);
        out.extend_from_slice(&self.sort_vector);
        seal(out, start)
    }

    /// Decodes an EOP marker. The sort vector must be a permutation of `0..len` and no
    /// longer than `count`.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let len_max = EOP_LEN_MIN + SORT_VECTOR_MAX;
        let mut f = Fields::new(open(bytes, Kind::EopMarker, len_max)?);
        let flags = check_bits("eop.flags", f.u8()?, eop_flags::ALL)?;
        let barrier = check_bits("eop.barrier", f.u8()?, BARRIER_MASK)?;
        let signals = f.u8()?;
        let sort_len = usize::from(f.u8()?);
        if sort_len > SORT_VECTOR_MAX {
            return Err(DecodeError::OutOfRange {
                field: "eop.sort_len",
                value: sort_len as u64,
            });
        }
        f.reserved(2, "eop.reserved")?;
        let ts = f.u64()?;
        let count = f.u32()?;
        if sort_len as u64 > u64::from(count) {
            return Err(DecodeError::OutOfRange {
                field: "eop.sort_len",
                value: sort_len as u64,
            });
        }
        let token_crc = f.u32()?;
        let token_kind = f.u8()?;
        f.reserved(3, "eop.reserved2")?;
        let sort_vector = f.take(sort_len)?.to_vec();
        let mut seen = 0u64;
        for &e in &sort_vector {
            if usize::from(e) >= sort_len || seen & (1 << e) != 0 {
                return Err(DecodeError::OutOfRange {
                    field: "eop.sort_vector",
                    value: u64::from(e),
                });
            }
            seen |= 1 << e;
        }
        f.finish(len_max)?;
        Ok(Self {
            ts,
            count,
            repeat: flags & eop_flags::REPEAT != 0,
            reset: flags & eop_flags::RESET != 0,
            end_of_epoch: flags & eop_flags::END_OF_EPOCH != 0,
            signals,
            barrier,
            token_kind,
            token_crc,
            sort_vector,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Barrier/signal marker

/// Barrier/signal marker, host to SIU: enter barriers and raise signals. 16 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct BarrierSignalMarker {
    /// Barriers the host enters.
    pub barrier: u8,
    /// Rounds the barriers entered run before they complete (at least 1; every host uses the
    /// same count). The SIU refuses 0 and a barrier already in progress.
    pub barrier_count: u32,
    /// Signal bits the host raises.
    pub signals: u8,
    /// The host asks for a reset signal.
    pub reset: bool,
}

impl BarrierSignalMarker {
    /// Appends the encoded packet; returns its CRC.
    pub fn encode(&self, out: &mut Vec<u8>) -> u32 {
        let start = begin(out, Kind::BarrierSignalMarker);
        out.push(self.barrier & BARRIER_MASK);
        out.push(self.signals);
        out.push(u8::from(self.reset));
        out.extend_from_slice(&[0, 0, 0]);
        push_u32(out, self.barrier_count);
        seal(out, start)
    }

    /// Decodes a barrier/signal marker.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut f = Fields::new(open(bytes, Kind::BarrierSignalMarker, BSM_LEN)?);
        let barrier = check_bits("bsm.barrier", f.u8()?, BARRIER_MASK)?;
        let signals = f.u8()?;
        let reset = check_bits("bsm.flags", f.u8()?, 1)? != 0;
        f.reserved(3, "bsm.reserved")?;
        let barrier_count = f.u32()?;
        f.finish(BSM_LEN)?;
        Ok(Self {
            barrier,
            barrier_count,
            signals,
            reset,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Non-isotach message

/// A non-isotach message: passed through FIFO, never waits on logical time.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct PlainMessage {
    /// Source host.
    pub source: u16,
    /// Destination host.
    pub dest: u16,
    /// At most [`PLAIN_PAYLOAD_MAX`] bytes.
    pub payload: Vec<u8>,
}

impl PlainMessage {
    /// Appends the encoded packet; returns its CRC.
    pub fn encode(&self, out: &mut Vec<u8>) -> u32 {
        debug_assert!(self.payload.len() <= PLAIN_PAYLOAD_MAX);
        let start = begin(out, Kind::Plain);
        push_u16(out, self.source);
        push_u16(out, self.dest);
        push_u16(out, self.payload.len() as u16);
        out.extend_from_slice(&self.payload);
        seal(out, start)
    }

    /// Decodes a non-isotach message.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut f = Fields::new(open(bytes, Kind::Plain, PACKET_LEN_MAX)?);
        let source = f.u16()?;
        let dest = f.u16()?;
        let len = usize::from(f.u16()?);
        if len > PLAIN_PAYLOAD_MAX {
            return Err(DecodeError::OutOfRange {
                field: "plain.len",
                value: len as u64,
            });
        }
        let payload = f.take(len)?.to_vec();
        f.finish(PACKET_LEN_MAX)?;
        Ok(Self {
            source,
            dest,
            payload,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Any packet

/// Any data-plane packet.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Packet {
    /// See [`Token`].
    Token(Token),
    /// See [`StartOfIsochron`].
    StartOfIsochron(StartOfIsochron),
    /// See [`IsotachMessage`].
    IsotachMessage(IsotachMessage),
    /// See [`EndOfIsochron`].
    EndOfIsochron(EndOfIsochron),
    /// See [`IsochronMarker`].
    IsochronMarker(IsochronMarker),
    /// See [`EopMarker`].
    EopMarker(EopMarker),
    /// See [`BarrierSignalMarker`].
    BarrierSignalMarker(BarrierSignalMarker),
    /// See [`PlainMessage`].
    Plain(PlainMessage),
}

impl Packet {
    /// The packet's kind.
    pub fn kind(&self) -> Kind {
        match self {
            Self::Token(_) => Kind::Token,
            Self::StartOfIsochron(_) => Kind::StartOfIsochron,
            Self::IsotachMessage(_) => Kind::IsotachMessage,
            Self::EndOfIsochron(_) => Kind::EndOfIsochron,
            Self::IsochronMarker(_) => Kind::IsochronMarker,
            Self::EopMarker(_) => Kind::EopMarker,
            Self::BarrierSignalMarker(_) => Kind::BarrierSignalMarker,
            Self::Plain(_) => Kind::Plain,
        }
    }

    /// Appends the encoded packet; returns its CRC.
    pub fn encode(&self, out: &mut Vec<u8>) -> u32 {
        match self {
            Self::Token(p) => p.encode(out),
            Self::StartOfIsochron(p) => p.encode(out),
            Self::IsotachMessage(p) => p.encode(out),
            Self::EndOfIsochron(p) => p.encode(out),
            Self::IsochronMarker(p) => p.encode(out),
            Self::EopMarker(p) => p.encode(out),
            Self::BarrierSignalMarker(p) => p.encode(out),
            Self::Plain(p) => p.encode(out),
        }
    }

    /// Encodes into a new buffer.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::new();
        self.encode(&mut v);
        v
    }

    /// Decodes any packet.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        Ok(match peek_kind(bytes)? {
            Kind::Token => Self::Token(Token::decode(bytes)?),
            Kind::StartOfIsochron => Self::StartOfIsochron(StartOfIsochron::decode(bytes)?),
            Kind::IsotachMessage => Self::IsotachMessage(IsotachMessage::decode(bytes)?),
            Kind::EndOfIsochron => Self::EndOfIsochron(EndOfIsochron::decode(bytes)?),
            Kind::IsochronMarker => Self::IsochronMarker(IsochronMarker::decode(bytes)?),
            Kind::EopMarker => Self::EopMarker(EopMarker::decode(bytes)?),
            Kind::BarrierSignalMarker => {
                Self::BarrierSignalMarker(BarrierSignalMarker::decode(bytes)?)
            }
            Kind::Plain => Self::Plain(PlainMessage::decode(bytes)?),
        })
    }
}

#[cfg(test)]
mod tests;
