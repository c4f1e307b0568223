//! Return to sender: a message that cannot be delivered goes back to its sender's handler 0
//! as a [`Returned`] record, in the order the failures were found. A returned request keeps
//! its slot, and so its credit, until the driver takes the record ([`Core::poll_returned`]).

use super::Core;
use super::SendState;
use crate::msg::{OutMsg, Returned};
use crate::types::{EndpointName, EpId, HandlerId, Opcode, Status, Tag};

#[derive(Clone, Copy, Debug)]
pub(super) struct RetEntry {
    pub(super) r: Returned,
    pub(super) slot: Option<(u32, u16, u32)>,
}

impl Core {
    pub(super) fn push_returned(&mut self, e: RetEntry) {
        self.stats.returned += 1;
        self.returned.push_back(e);
    }

    /// The next returned message for handler 0. Taking it frees its request slot.
    pub fn poll_returned(&mut self) -> Option<Returned> {
        let e = self.returned.pop_front()?;
        if let Some((pi, si, seq)) = e.slot {
            let p = &mut self.peers[pi as usize];
            let s = &mut p.ss[usize::from(si)];
            if s.state == SendState::Returning && s.seq == seq {
                s.state = SendState::Free;
                s.rearm(&mut self.timers, pi, usize::from(si));
                p.busy -= 1;
            }
        }
        Some(e.r)
    }

    /// Are returned messages waiting?
    pub fn has_returned(&self) -> bool {
        !self.returned.is_empty()
    }
}

pub(super) fn returned_of(
    m: &OutMsg,
    dest: EndpointName,
    status: Status,
    request: bool,
) -> Returned {
    let opcode: Opcode = m.class.opcode(request);
    Returned {
        status,
        opcode,
        ep: EpId(m.src_ep),
        dest,
        handler: HandlerId(m.handler),
        tag: Tag(m.tag),
        args: m.args,
        nargs: m.nargs,
        len: m.total_len,
        dest_offset: m.dest_offset,
    }
}
