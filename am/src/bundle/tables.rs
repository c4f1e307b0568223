//! A bundle's handler tables: per endpoint, the request and reply handler of each index and
//! the return handler, and the [`Dispatch`] the core calls them through.

use crate::AmError;
use crate::{Dispatch, EpId, HandlerId, HandlerKind, Reply, Request, Returned};

pub(super) type ReqFn = Box<dyn FnMut(Request<'_>) + Send>;
pub(super) type RepFn = Box<dyn FnMut(Reply<'_>) + Send>;
pub(super) type RetFn = Box<dyn FnMut(&Returned) + Send>;

pub(super) enum Entry {
    Unset,
    Request(ReqFn),
    Reply(RepFn),
}

pub(super) struct Table {
    pub(super) entries: Vec<Entry>,
    pub(super) ret: Option<RetFn>,
}

pub(super) struct Tables(pub(super) Vec<Option<Table>>);

impl Tables {
    pub(super) fn table(&self, ep: EpId) -> Option<&Table> {
        self.0.get(usize::from(ep.0)).and_then(Option::as_ref)
    }
    pub(super) fn table_mut(&mut self, ep: EpId) -> Result<&mut Table, AmError> {
        self.0
            .get_mut(usize::from(ep.0))
            .and_then(Option::as_mut)
            .ok_or(AmError::BadEndpoint(ep))
    }
}

impl Dispatch for Tables {
    fn handler_kind(&self, ep: EpId, h: HandlerId) -> HandlerKind {
        match self.table(ep).and_then(|t| t.entries.get(usize::from(h.0))) {
            Some(Entry::Request(_)) => HandlerKind::Request,
            Some(Entry::Reply(_)) => HandlerKind::Reply,
            _ => HandlerKind::Unset,
        }
    }
    fn on_request(&mut self, req: Request<'_>) {
        let (ep, h) = (req.endpoint(), req.handler());
        if let Ok(t) = self.table_mut(ep)
            && let Some(Entry::Request(f)) = t.entries.get_mut(usize::from(h.0))
        {
            f(req);
        }
    }
    fn on_reply(&mut self, rep: Reply<'_>) {
        let (ep, h) = (rep.endpoint(), rep.handler());
        if let Ok(t) = self.table_mut(ep)
            && let Some(Entry::Reply(f)) = t.entries.get_mut(usize::from(h.0))
        {
            f(rep);
        }
    }
}
