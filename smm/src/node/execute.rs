//! What one sref does at its place in the order: a memory operation on this host's copy
//! (read, write, sched, assign), a copy request of a joining node, or a registered message
//! handler. Errors are counted, never returned: the order has already been decided.

use super::SmmNode;
use crate::map::Addr;
use crate::memory::{ReadOutcome, Released};
use crate::rmw::RmwFn;
use crate::{OrderKey, SmmError};
use isotach_proto::packet::{IsotachMessage, RmwSref, Sref, SrefOp, Width};
use isotach_proto::topology::HostId;

/// What a message handler is told.
#[derive(Debug)]
pub struct HandlerCall<'a> {
    /// The host that sent the message.
    pub source: HostId,
    /// The pulse it executes in.
    pub ts: u64,
    /// Its payload.
    pub payload: &'a [u8],
}

/// A registered message handler.
pub(super) type Handler = Box<dyn FnMut(&HandlerCall<'_>) + Send>;

impl SmmNode {
    /// Registers `f` as read-modify-write function `func`, which `apply` names. It must be
    /// pure and registered under the same number on every host (every copy runs it). False
    /// when [`crate::rmw::RMW_FUNCTIONS_MAX`] others are registered already.
    pub fn register_rmw(&mut self, func: u16, f: RmwFn) -> bool {
        self.memory.functions_mut().register(func, f)
    }

    /// Registers the handler run by `message` srefs naming `handler`, at their place in the
    /// order.
    pub fn register_handler(
        &mut self,
        handler: u16,
        f: impl FnMut(&HandlerCall<'_>) + Send + 'static,
    ) {
        self.handlers.insert(handler, Box::new(f));
    }

    /// Executes one isotach message at its place in pulse `ts` (or logs or refuses it when
    /// its page is not current, see `join.rs`).
    pub(super) fn execute_message(&mut self, ts: u64, m: &IsotachMessage) {
        if self.intercept(m) {
            return;
        }
        self.stats.srefs_executed += 1;
        let key = OrderKey {
            ts,
            source: m.source,
            sequum: m.sequum,
            sub: 0,
        };
        match &m.sref {
            Sref::Msg { handler, payload } => self.call(*handler, m.source, ts, payload),
            Sref::Rmw(rmw) => self.execute_rmw(*rmw, m.source),
            Sref::Mem {
                op,
                width,
                addr,
                value,
                ref_id,
            } => {
                let addr = Addr::from_raw(*addr);
                let r = match op {
                    SrefOp::Read => self.memory.read(addr, *width, m.source, *ref_id).map(|o| {
                        if let ReadOutcome::Value(v) = o {
                            self.reply(m.source, *ref_id, v);
                        }
                    }),
                    SrefOp::Write => self.memory.write(addr, *width, *value),
                    SrefOp::Sched => self.memory.sched(addr, (key, 0), m.source),
                    SrefOp::Assign => {
                        self.assign(addr, *width, *value, m.source);
                        Ok(())
                    }
                    SrefOp::Copy => {
                        if self
                            .map
                            .copyset(addr.page())
                            .is_some_and(|c| c.contains(&self.cfg.host))
                        {
                            self.send_image(addr.page(), m.source, *ref_id);
                            Ok(())
                        } else {
                            Err(SmmError::NotACopy(addr))
                        }
                    }
                    // Carried by the other sref kinds (the decoder never builds these).
                    SrefOp::Msg | SrefOp::Add | SrefOp::CompareAndSwap | SrefOp::Apply => Ok(()),
                };
                if let Err(e) = r {
                    self.count_exec_error(&e);
                }
            }
        }
    }

    /// Runs a read-modify-write on this host's copy; the copy the issuer named answers with
    /// the value it found (now, or when the assign it waits for comes).
    pub(super) fn execute_rmw(&mut self, rmw: RmwSref, issuer: HostId) {
        match self.memory.rmw(rmw, issuer) {
            Ok(ReadOutcome::Value(old)) if rmw.answer => self.reply(issuer, rmw.ref_id, old),
            Ok(_) => {}
            Err(e) => self.count_exec_error(&e),
        }
    }

    /// Substantiates a sched of `scheduler` and answers the reads it released.
    pub(super) fn assign(&mut self, addr: Addr, width: Width, value: u64, scheduler: HostId) {
        match self.memory.assign(addr, width, value, scheduler) {
            Ok(released) => {
                for Released {
                    requester,
                    ref_id,
                    value,
                } in released
                {
                    self.reply(requester, ref_id, value);
                }
            }
            Err(e) => self.count_exec_error(&e),
        }
    }

    /// Runs handler `handler`; a message for no registered handler is counted.
    pub(super) fn call(&mut self, handler: u16, source: HostId, ts: u64, payload: &[u8]) {
        match self.handlers.get_mut(&handler) {
            Some(f) => f(&HandlerCall {
                source,
                ts,
                payload,
            }),
            None => self.stats.unhandled_messages += 1,
        }
    }
}
