//! What handlers see: [`Request`] (can reply, at most once, by consuming itself),
//! [`Reply`] (cannot send anything) and [`Returned`] (handler 0).

use crate::error::AmError;
use crate::types::{
    Class, EndpointName, EpId, HandlerId, MAX_ARGS, MAX_LONG_BYTES, MAX_MEDIUM_BYTES, Opcode,
    Status, Tag,
};

/// An outgoing message as the core stores it for (re)transmission.
#[derive(Debug)]
pub(crate) struct OutMsg {
    pub(crate) class: Class,
    pub(crate) handler: u16,
    pub(crate) src_ep: u16,
    pub(crate) dst_ep: u16,
    pub(crate) tag: u64,
    pub(crate) args: [u64; MAX_ARGS],
    pub(crate) nargs: u8,
    pub(crate) total_len: u32,
    pub(crate) dest_offset: u32,
    pub(crate) src_offset: u32,
    pub(crate) fifo: Option<u32>,
    pub(crate) payload: Vec<u8>,
}

impl Default for OutMsg {
    fn default() -> Self {
        Self {
            class: Class::Short,
            handler: 0,
            src_ep: 0,
            dst_ep: 0,
            tag: 0,
            args: [0; MAX_ARGS],
            nargs: 0,
            total_len: 0,
            dest_offset: 0,
            src_offset: 0,
            fifo: None,
            payload: Vec::new(),
        }
    }
}

impl OutMsg {
    pub(crate) fn set_args(&mut self, args: &[u64]) -> Result<(), AmError> {
        if args.len() > MAX_ARGS {
            return Err(AmError::BadArg("more than MAX_ARGS argument words"));
        }
        self.args = [0; MAX_ARGS];
        self.args[..args.len()].copy_from_slice(args);
        self.nargs = args.len() as u8;
        Ok(())
    }

    pub(crate) fn set_payload(&mut self, data: &[u8]) {
        self.payload.clear();
        self.payload.extend_from_slice(data);
        self.total_len = data.len() as u32;
    }
}

/// Where a reply produced by a request handler is recorded.
#[derive(Debug, Default)]
pub(crate) struct ReplySink {
    pub(crate) msg: OutMsg,
    pub(crate) replied: bool,
}

/// Where the data of a delivered message lives.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Data<'a> {
    None,
    Medium(&'a [u8]),
    Xfer { offset: usize, len: usize },
}

/// Facts common to requests and replies.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MsgInfo {
    pub(crate) source: EndpointName,
    pub(crate) ep: EpId,
    pub(crate) handler: HandlerId,
    pub(crate) tag: Tag,
    pub(crate) opcode: Opcode,
    pub(crate) args: [u64; MAX_ARGS],
    pub(crate) nargs: u8,
}

/// A request being handled. Dropping it without replying makes the layer send an automatic
/// acknowledgement. Replying consumes it, so a second reply does not compile:
///
/// ```compile_fail
/// fn handler(req: isotach_am::Request<'_>) {
///     req.reply_short(isotach_am::HandlerId(2), &[1]).unwrap();
///     req.reply_short(isotach_am::HandlerId(2), &[2]).unwrap(); // use of moved value
/// }
/// ```
#[derive(Debug)]
pub struct Request<'a> {
    pub(crate) info: MsgInfo,
    pub(crate) data: Data<'a>,
    pub(crate) seg: &'a mut [u8],
    pub(crate) sink: &'a mut ReplySink,
}

/// A reply being handled. It has no method that sends: reply handlers cannot send.
#[derive(Debug)]
pub struct Reply<'a> {
    pub(crate) info: MsgInfo,
    pub(crate) data: Data<'a>,
    pub(crate) seg: &'a mut [u8],
}

macro_rules! common_accessors {
    () => {
        /// The endpoint that sent the message (`AM_GetSourceEndpoint`).
        pub fn source(&self) -> EndpointName {
            self.info.source
        }
        /// The local endpoint it was delivered to (`AM_GetDestEndpoint`).
        pub fn endpoint(&self) -> EpId {
            self.info.ep
        }
        /// The handler index it named.
        pub fn handler(&self) -> HandlerId {
            self.info.handler
        }
        /// The tag it carried (`AM_GetMsgTag`).
        pub fn tag(&self) -> Tag {
            self.info.tag
        }
        /// Which operation sent it.
        pub fn opcode(&self) -> Opcode {
            self.info.opcode
        }
        /// Its argument words.
        pub fn args(&self) -> &[u64] {
            &self.info.args[..usize::from(self.info.nargs)]
        }
        /// Medium: the payload, valid only during the handler. Bulk: the bytes that landed in
        /// the segment. Short: empty.
        pub fn data(&self) -> &[u8] {
            match self.data {
                Data::None => &[],
                Data::Medium(b) => b,
                Data::Xfer { offset, len } => &self.seg[offset..offset + len],
            }
        }
        /// Bulk: where the data landed in the local segment.
        pub fn xfer_offset(&self) -> Option<usize> {
            match self.data {
                Data::Xfer { offset, .. } => Some(offset),
                _ => None,
            }
        }
        /// The local endpoint's segment.
        pub fn segment(&self) -> &[u8] {
            self.seg
        }
        /// The local endpoint's segment, writable.
        pub fn segment_mut(&mut self) -> &mut [u8] {
            self.seg
        }
    };
}

impl Request<'_> {
    common_accessors!();

    fn prepare(&mut self, class: Class, handler: HandlerId, args: &[u64]) -> Result<(), AmError> {
        let m = &mut self.sink.msg;
        m.set_args(args)?;
        m.class = class;
        m.handler = handler.0;
        m.tag = self.info.tag.0;
        m.src_ep = self.info.ep.0;
        m.dst_ep = self.info.source.ep.0;
        m.dest_offset = 0;
        m.src_offset = 0;
        m.fifo = None;
        m.payload.clear();
        m.total_len = 0;
        Ok(())
    }

    /// Reply with argument words only (`AM_ReplyM`).
    pub fn reply_short(mut self, handler: HandlerId, args: &[u64]) -> Result<(), AmError> {
        self.prepare(Class::Short, handler, args)?;
        self.sink.replied = true;
        Ok(())
    }

    /// Reply with a payload of at most [`MAX_MEDIUM_BYTES`] (`AM_ReplyIM`).
    pub fn reply_medium(
        mut self,
        handler: HandlerId,
        data: &[u8],
        args: &[u64],
    ) -> Result<(), AmError> {
        if data.len() > MAX_MEDIUM_BYTES {
            return Err(AmError::BadArg(
                "medium payload larger than MAX_MEDIUM_BYTES",
            ));
        }
        self.prepare(Class::Medium, handler, args)?;
        self.sink.msg.set_payload(data);
        self.sink.replied = true;
        Ok(())
    }

    /// Reply with a bulk transfer into the requester's segment at `dest_offset`
    /// (`AM_ReplyXferM`).
    pub fn reply_xfer(
        mut self,
        handler: HandlerId,
        dest_offset: u32,
        data: &[u8],
        args: &[u64],
    ) -> Result<(), AmError> {
        if data.len() > MAX_LONG_BYTES {
            return Err(AmError::BadArg("bulk payload larger than MAX_LONG_BYTES"));
        }
        self.prepare(Class::Xfer, handler, args)?;
        self.sink.msg.set_payload(data);
        self.sink.msg.dest_offset = dest_offset;
        self.sink.replied = true;
        Ok(())
    }

    /// Reply with a bulk transfer of a range of the local segment (no intermediate copy by the
    /// caller).
    pub fn reply_xfer_from_segment(
        mut self,
        handler: HandlerId,
        src_offset: usize,
        len: usize,
        dest_offset: u32,
        args: &[u64],
    ) -> Result<(), AmError> {
        let end = src_offset.checked_add(len).filter(|&e| e <= self.seg.len());
        let Some(end) = end else {
            return Err(AmError::BadSegment {
                offset: src_offset as u64,
                len: len as u64,
                seg_len: self.seg.len() as u64,
            });
        };
        if len > MAX_LONG_BYTES {
            return Err(AmError::BadArg("bulk payload larger than MAX_LONG_BYTES"));
        }
        self.prepare(Class::Xfer, handler, args)?;
        let m = &mut self.sink.msg;
        m.payload.clear();
        m.payload.extend_from_slice(&self.seg[src_offset..end]);
        m.total_len = len as u32;
        m.dest_offset = dest_offset;
        self.sink.replied = true;
        Ok(())
    }
}

impl Reply<'_> {
    common_accessors!();
}

/// A message that could not be delivered, handed to handler 0.
#[derive(Clone, Copy, Debug)]
pub struct Returned {
    /// Why it came back.
    pub status: Status,
    /// What it was.
    pub opcode: Opcode,
    /// The local endpoint that sent it (handler 0 of this endpoint runs).
    pub ep: EpId,
    /// Where it was going.
    pub dest: EndpointName,
    /// The handler it named at the destination.
    pub handler: HandlerId,
    /// The tag it carried.
    pub tag: Tag,
    /// Its argument words (first `nargs` meaningful).
    pub args: [u64; MAX_ARGS],
    /// How many argument words it had.
    pub nargs: u8,
    /// Payload bytes (medium, bulk) or bytes requested (get).
    pub len: u32,
    /// Destination offset (bulk, get).
    pub dest_offset: u32,
}

impl Returned {
    /// Its argument words.
    pub fn args(&self) -> &[u64] {
        &self.args[..usize::from(self.nargs)]
    }
}
