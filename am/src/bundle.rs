//! The user-facing API: a [`Bundle`] of endpoints polled together, driving one [`Core`] over
//! one [`Transport`].

use std::collections::VecDeque;
use std::fmt;
use std::time::Duration;

use crate::AmError;
use crate::drive::{self, Driver, Serviced};
use crate::transport::Transport;
use crate::{
    Class, DEFAULT_HANDLERS, EndpointName, EpId, EventMask, HandlerId, HandlerKind, MAX_HANDLERS,
    NodeAddr, Tag, TransIdx,
};
use crate::{Config, Core, Dispatch, SendReq, Stats};
use crate::{Reply, Request, Returned};

mod tables;
use tables::{Entry, Table, Tables};

/// Most self-addressed (loopback) datagrams waiting; more are dropped and retransmitted.
const LOOP_QUEUE: usize = 1024;

/// A bundle: endpoints that are polled together, over one transport. Handlers run only
/// inside calls on the bundle (`poll`, the blocking sends, `wait*`), on the caller's thread,
/// so handlers of one bundle are atomic with respect to each other.
pub struct Bundle<T: Transport> {
    core: Core,
    tables: Tables,
    transport: T,
    local: NodeAddr,
    loopq: VecDeque<Vec<u8>>,
    loop_free: Vec<Vec<u8>>,
    mask: EventMask,
    sema: bool,
    batch: usize,
    /// The last clock reading (used by `poll` when no timer is armed).
    last_now: crate::Time,
}

impl<T: Transport> fmt::Debug for Bundle<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Bundle")
            .field("local", &self.local)
            .field("incarnation", &self.core.incarnation())
            .field("outstanding", &self.core.outstanding())
            .field("stats", &self.core.stats())
            .finish_non_exhaustive()
    }
}

impl<T: Transport> Bundle<T> {
    /// A bundle over `transport` (`AM_AllocateBundle`).
    pub fn new(transport: T, cfg: Config) -> Result<Self, AmError> {
        let inc = cfg.incarnation.unwrap_or_else(|| transport.incarnation());
        let local = transport.local_addr();
        let batch = cfg.poll_batch;
        let core = Core::new(cfg, local, inc, transport.max_datagram())?;
        Ok(Self {
            core,
            tables: Tables(Vec::new()),
            transport,
            local,
            loopq: VecDeque::new(),
            loop_free: Vec::new(),
            mask: EventMask::NoEvents,
            sema: false,
            batch,
            last_now: crate::Time(0),
        })
    }

    /// This bundle's node address.
    pub fn local_addr(&self) -> NodeAddr {
        self.local
    }
    /// Global name of a local endpoint.
    pub fn name(&self, ep: EpId) -> EndpointName {
        EndpointName {
            node: self.local,
            ep,
        }
    }
    /// Protocol counters.
    pub fn stats(&self) -> Stats {
        self.core.stats()
    }
    /// The protocol core (read-only).
    pub fn core(&self) -> &Core {
        &self.core
    }
    /// The transport.
    pub fn transport(&self) -> &T {
        &self.transport
    }
    /// The transport, mutably (e.g. to inject faults in tests).
    pub fn transport_mut(&mut self) -> &mut T {
        &mut self.transport
    }
    /// When the protocol next needs the bundle polled even if nothing arrives.
    pub fn next_deadline(&self) -> Option<crate::Time> {
        self.core.poll_timeout()
    }
    /// Requests outstanding towards all peers.
    pub fn outstanding(&self) -> usize {
        self.core.outstanding()
    }
    /// Free request slots towards `node`.
    pub fn credits_available(&self, node: NodeAddr) -> usize {
        self.core.credits_available(node)
    }

    // ------------------------------------------------------------ endpoints

    /// Allocate an endpoint (`AM_AllocateEndpoint`): tag NONE, no segment, 256 unset handlers,
    /// 256 unbound translations, no handler 0.
    pub fn alloc_endpoint(&mut self) -> Result<EpId, AmError> {
        let ep = self.core.alloc_endpoint()?;
        let i = usize::from(ep.0);
        if self.tables.0.len() <= i {
            self.tables.0.resize_with(i + 1, || None);
        }
        let entries = (0..DEFAULT_HANDLERS).map(|_| Entry::Unset).collect();
        self.tables.0[i] = Some(Table { entries, ret: None });
        Ok(ep)
    }

    /// Free an endpoint (`AM_FreeEndpoint`); later arrivals come back with `BadEndpoint`.
    pub fn free_endpoint(&mut self, ep: EpId) -> Result<(), AmError> {
        self.core.free_endpoint(ep)?;
        self.tables.0[usize::from(ep.0)] = None;
        Ok(())
    }

    /// Set the endpoint tag (`AM_SetTag`), effective for every later delivery.
    pub fn set_tag(&mut self, ep: EpId, tag: Tag) -> Result<(), AmError> {
        self.core.set_tag(ep, tag)
    }
    /// The endpoint tag (`AM_GetTag`).
    pub fn tag(&self, ep: EpId) -> Result<Tag, AmError> {
        self.core.tag(ep)
    }
    /// Give the endpoint a zeroed segment of `len` bytes (`AM_SetSeg`).
    pub fn set_segment(&mut self, ep: EpId, len: usize) -> Result<(), AmError> {
        self.core.set_segment(ep, len)
    }
    /// The endpoint segment (`AM_GetSeg`).
    pub fn segment(&self, ep: EpId) -> Result<&[u8], AmError> {
        self.core.segment(ep)
    }
    /// The endpoint segment, writable.
    pub fn segment_mut(&mut self, ep: EpId) -> Result<&mut [u8], AmError> {
        self.core.segment_mut(ep)
    }

    /// Resize the handler table (`AM_SetNumHandlers`): `256..=MAX_HANDLERS`. Entries past
    /// the new end are dropped; messages naming them come back with `BadHandler`.
    pub fn set_num_handlers(&mut self, ep: EpId, n: usize) -> Result<(), AmError> {
        if !(DEFAULT_HANDLERS..=MAX_HANDLERS).contains(&n) {
            return Err(AmError::BadArg("handler table size out of range"));
        }
        self.tables
            .table_mut(ep)?
            .entries
            .resize_with(n, || Entry::Unset);
        Ok(())
    }
    /// Size of the handler table.
    pub fn num_handlers(&self, ep: EpId) -> Result<usize, AmError> {
        self.tables
            .table(ep)
            .map(|t| t.entries.len())
            .ok_or(AmError::BadEndpoint(ep))
    }
    /// Resize the translation table (`AM_SetNumTranslations`).
    pub fn set_num_translations(&mut self, ep: EpId, n: usize) -> Result<(), AmError> {
        self.core.set_num_translations(ep, n)
    }
    /// Size of the translation table.
    pub fn num_translations(&self, ep: EpId) -> Result<usize, AmError> {
        self.core.num_translations(ep)
    }

    fn set_entry(&mut self, ep: EpId, h: HandlerId, e: Entry) -> Result<(), AmError> {
        let t = self.tables.table_mut(ep)?;
        if h == HandlerId::RETURN {
            return Err(AmError::BadHandler(h));
        }
        let slot = t
            .entries
            .get_mut(usize::from(h.0))
            .ok_or(AmError::BadHandler(h))?;
        *slot = e;
        Ok(())
    }

    /// Bind a request handler (`AM_SetHandler`). Index 0 is reserved for handler 0.
    pub fn set_request_handler(
        &mut self,
        ep: EpId,
        h: HandlerId,
        f: impl FnMut(Request<'_>) + Send + 'static,
    ) -> Result<(), AmError> {
        self.set_entry(ep, h, Entry::Request(Box::new(f)))
    }
    /// Bind a reply handler.
    pub fn set_reply_handler(
        &mut self,
        ep: EpId,
        h: HandlerId,
        f: impl FnMut(Reply<'_>) + Send + 'static,
    ) -> Result<(), AmError> {
        self.set_entry(ep, h, Entry::Reply(Box::new(f)))
    }
    /// Unbind a handler.
    pub fn clear_handler(&mut self, ep: EpId, h: HandlerId) -> Result<(), AmError> {
        self.set_entry(ep, h, Entry::Unset)
    }
    /// Bind handler 0, which receives every returned message of this endpoint. Like the
    /// draft's default (`abort()`), a returned message with no handler 0 bound panics.
    pub fn set_return_handler(
        &mut self,
        ep: EpId,
        f: impl FnMut(&Returned) + Send + 'static,
    ) -> Result<(), AmError> {
        self.tables.table_mut(ep)?.ret = Some(Box::new(f));
        Ok(())
    }

    /// Bind a translation (`AM_Map`); mapping our own endpoints (loopback) is allowed.
    pub fn map(
        &mut self,
        ep: EpId,
        idx: TransIdx,
        name: EndpointName,
        tag: Tag,
    ) -> Result<(), AmError> {
        self.core.map(ep, idx, name, tag)
    }
    /// Bind the first free translation (`AM_MapAny`).
    pub fn map_any(&mut self, ep: EpId, name: EndpointName, tag: Tag) -> Result<TransIdx, AmError> {
        self.core.map_any(ep, name, tag)
    }
    /// Unbind a translation (`AM_Unmap`).
    pub fn unmap(&mut self, ep: EpId, idx: TransIdx) -> Result<(), AmError> {
        self.core.unmap(ep, idx)
    }
    /// A translation (`AM_GetTranslationName` / `AM_GetTranslationTag`).
    pub fn translation(&self, ep: EpId, idx: TransIdx) -> Result<(EndpointName, Tag), AmError> {
        self.core.translation(ep, idx)
    }
    /// Deliver requests sent from this node to `node` in send order (see `docs/am.md`).
    pub fn set_fifo(&mut self, node: NodeAddr, on: bool) -> Result<(), AmError> {
        self.core.set_fifo(node, on)
    }

    // ------------------------------------------------------------ sending

    fn try_send(&mut self, r: SendReq<'_>) -> Result<(), AmError> {
        let now = self.transport.now();
        self.core.send_request(now, r)?;
        self.flush()
    }

    fn send_blocking(&mut self, r: SendReq<'_>) -> Result<(), AmError> {
        loop {
            match self.try_send(r) {
                Err(AmError::WouldBlock) => {}
                other => return other,
            }
            if self.poll()? == 0 {
                self.wait_step()?;
            }
        }
    }

    async fn send_async(&mut self, r: SendReq<'_>) -> Result<(), AmError> {
        loop {
            match self.try_send(r) {
                Err(AmError::WouldBlock) => {}
                other => return other,
            }
            if self.poll()? == 0 && !self.pool_nonempty() {
                let deadline = self.core.poll_timeout();
                self.transport.wait_async(deadline).await?;
            }
        }
    }

    /// Send a short request (`AM_RequestM`), polling (and so running handlers) while there
    /// is no credit towards the destination.
    pub fn request_short(
        &mut self,
        ep: EpId,
        idx: TransIdx,
        h: HandlerId,
        args: &[u64],
    ) -> Result<(), AmError> {
        self.send_blocking(SendReq::short(ep, idx, h, args))
    }
    /// Send a short request, or fail with [`AmError::WouldBlock`] if there is no credit.
    pub fn try_request_short(
        &mut self,
        ep: EpId,
        idx: TransIdx,
        h: HandlerId,
        args: &[u64],
    ) -> Result<(), AmError> {
        self.try_send(SendReq::short(ep, idx, h, args))
    }
    /// The async form of [`Bundle::request_short`].
    pub async fn request_short_async(
        &mut self,
        ep: EpId,
        idx: TransIdx,
        h: HandlerId,
        args: &[u64],
    ) -> Result<(), AmError> {
        self.send_async(SendReq::short(ep, idx, h, args)).await
    }

    /// Send a medium request (`AM_RequestIM`): `data` (at most `MAX_MEDIUM_BYTES`) reaches
    /// the handler in a temporary buffer valid during the handler.
    pub fn request_medium(
        &mut self,
        ep: EpId,
        idx: TransIdx,
        h: HandlerId,
        data: &[u8],
        args: &[u64],
    ) -> Result<(), AmError> {
        self.send_blocking(SendReq::medium(ep, idx, h, data, args))
    }
    /// Medium request, or [`AmError::WouldBlock`].
    pub fn try_request_medium(
        &mut self,
        ep: EpId,
        idx: TransIdx,
        h: HandlerId,
        data: &[u8],
        args: &[u64],
    ) -> Result<(), AmError> {
        self.try_send(SendReq::medium(ep, idx, h, data, args))
    }

    fn xfer<'a>(
        ep: EpId,
        idx: TransIdx,
        dest_offset: u32,
        h: HandlerId,
        data: &'a [u8],
        args: &'a [u64],
    ) -> SendReq<'a> {
        SendReq {
            class: Class::Xfer,
            payload: data,
            dest_offset,
            ..SendReq::short(ep, idx, h, args)
        }
    }

    /// Bulk transfer (`AM_RequestXferM`): `data` is written into the destination segment at
    /// `dest_offset`, then the handler runs. The data is copied at the call, so the caller's
    /// buffer is reusable as soon as this returns.
    pub fn request_xfer(
        &mut self,
        ep: EpId,
        idx: TransIdx,
        dest_offset: u32,
        h: HandlerId,
        data: &[u8],
        args: &[u64],
    ) -> Result<(), AmError> {
        self.send_blocking(Self::xfer(ep, idx, dest_offset, h, data, args))
    }
    /// Asynchronous bulk transfer (`AM_RequestXferAsyncM`): posts and returns at once; with
    /// no credit it fails with [`AmError::WouldBlock`] ("on error, retry"). Completion is the
    /// reply handler (or the automatic acknowledgement).
    pub fn request_xfer_async(
        &mut self,
        ep: EpId,
        idx: TransIdx,
        dest_offset: u32,
        h: HandlerId,
        data: &[u8],
        args: &[u64],
    ) -> Result<(), AmError> {
        self.try_send(Self::xfer(ep, idx, dest_offset, h, data, args))
    }

    /// Get transfer (`AM_GetXferM`): copy `nbytes` at `src_offset` of the remote segment into
    /// the local segment at `dest_offset`; then reply handler `h` runs here. No handler runs
    /// at the remote end. Posts like the asynchronous bulk form ([`AmError::WouldBlock`]).
    #[allow(clippy::too_many_arguments)]
    pub fn get_xfer(
        &mut self,
        ep: EpId,
        idx: TransIdx,
        src_offset: u32,
        h: HandlerId,
        dest_offset: u32,
        nbytes: u32,
        args: &[u64],
    ) -> Result<(), AmError> {
        if self.tables.handler_kind(ep, h) != HandlerKind::Reply {
            return Err(AmError::BadHandler(h));
        }
        let r = SendReq {
            class: Class::Get,
            src_offset,
            dest_offset,
            len: nbytes,
            ..SendReq::short(ep, idx, h, args)
        };
        self.try_send(r)
    }

    // ------------------------------------------------------------ polling and waiting

    /// Service every endpoint of the bundle (`AM_Poll`): fire due timers, handle up to
    /// `poll_batch` arrived messages (running their handlers), run handler 0 for returned
    /// messages, and send what is due. Returns how many messages were handled.
    pub fn poll(&mut self) -> Result<usize, AmError> {
        // Nothing outstanding (a pure server): skip the clock read (~25 ns on the VM, on the
        // path from a request's arrival to its reply); `now` would not be consulted.
        let now = if self.core.timers_armed() {
            self.last_now = self.transport.now();
            self.last_now
        } else {
            self.last_now
        };
        self.core.handle_timeout(now);
        let mut n = 0;
        while n < self.batch {
            let Some(buf) = self.loopq.pop_front() else {
                break;
            };
            self.core
                .handle_datagram(now, self.local, &buf, &mut self.tables);
            self.loop_free.push(buf);
            n += 1;
        }
        if n < self.batch {
            let core = &mut self.core;
            let tables = &mut self.tables;
            n += self.transport.recv(self.batch - n, &mut |from, bytes| {
                core.handle_datagram(now, from, bytes, tables)
            })?;
        }
        n += self.run_returned();
        self.flush()?;
        Ok(n)
    }

    fn run_returned(&mut self) -> usize {
        let mut n = 0;
        while let Some(r) = self.core.poll_returned() {
            n += 1;
            let live = self.core.endpoint_live(r.ep);
            match self
                .tables
                .table_mut(r.ep)
                .ok()
                .and_then(|t| t.ret.as_mut())
            {
                Some(f) => f(&r),
                None if live => panic!(
                    "message returned to endpoint {:?} with no handler 0 bound: {r:?}",
                    r.ep
                ),
                // The endpoint was freed: its pool is destroyed with it.
                None => {}
            }
        }
        n
    }

    fn flush(&mut self) -> Result<(), AmError> {
        while let Some((to, bytes)) = self.core.poll_transmit() {
            if to == self.local {
                if self.loopq.len() < LOOP_QUEUE {
                    let mut b = self.loop_free.pop().unwrap_or_default();
                    b.clear();
                    b.extend_from_slice(bytes);
                    self.loopq.push_back(b);
                }
            } else {
                self.transport.send(to, bytes)?;
            }
        }
        self.transport.flush()
    }

    fn pool_nonempty(&mut self) -> bool {
        !self.loopq.is_empty() || self.core.has_returned() || self.transport.has_pending()
    }

    /// Block until a timer fires or something may have arrived, without running handlers.
    fn wait_step(&mut self) -> Result<(), AmError> {
        if self.pool_nonempty() {
            return Ok(());
        }
        let deadline = self.core.poll_timeout();
        self.transport.wait(deadline)?;
        Ok(())
    }

    /// Block until some endpoint of the bundle has a message waiting (or a returned
    /// message), or `timeout` passes; retransmission timers keep running meanwhile. Runs no
    /// handlers: call [`Bundle::poll`] next. Returns whether something is waiting.
    pub fn wait(&mut self, timeout: Duration) -> Result<bool, AmError> {
        drive::wait(self, timeout)
    }

    /// The async form of [`Bundle::wait`].
    pub async fn wait_async(&mut self, timeout: Duration) -> Result<bool, AmError> {
        drive::wait_async(self, timeout).await
    }

    /// Set the event mask (`AM_SetEventMask`). If the enabled condition already holds, the
    /// event fires at the next [`Bundle::wait_sema`].
    pub fn set_event_mask(&mut self, mask: EventMask) {
        self.mask = mask;
    }
    /// The event mask (`AM_GetEventMask`); firing an event clears it to `NoEvents`.
    pub fn event_mask(&self) -> EventMask {
        self.mask
    }

    fn check_event(&mut self) {
        if self.mask == EventMask::NotEmpty && self.pool_nonempty() {
            self.sema = true;
            self.mask = EventMask::NoEvents;
        }
    }

    /// Wait on the bundle's binary semaphore (`AM_WaitSema`): true when an enabled event
    /// fired (and the semaphore was taken), false after `timeout`.
    pub fn wait_sema(&mut self, timeout: Duration) -> Result<bool, AmError> {
        let deadline = self.transport.now().plus(timeout);
        loop {
            self.check_event();
            if self.sema {
                self.sema = false;
                return Ok(true);
            }
            let now = self.transport.now();
            if now >= deadline {
                return Ok(false);
            }
            self.core.handle_timeout(now);
            self.flush()?;
            let until = self
                .core
                .poll_timeout()
                .map_or(deadline, |t| t.min(deadline));
            if self.mask == EventMask::NoEvents || self.pool_nonempty() {
                self.transport.sleep_until(until);
            } else {
                self.transport.wait(Some(until))?;
            }
        }
    }
}

impl<T: Transport> Driver for Bundle<T> {
    type T = T;
    fn transport_mut(&mut self) -> &mut T {
        &mut self.transport
    }
    fn waiting(&mut self) -> bool {
        self.pool_nonempty()
    }
    fn service(&mut self, now: crate::Time) -> Result<Serviced, AmError> {
        self.core.handle_timeout(now);
        self.flush()?;
        Ok(if self.core.has_returned() {
            Serviced::Waiting
        } else {
            Serviced::Idle(self.core.poll_timeout())
        })
    }
}
