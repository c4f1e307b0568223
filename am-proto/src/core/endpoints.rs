//! The endpoint table: each endpoint's tag, segment and translation table (`AM_Map` and
//! friends), and the one segment bounds check every segment access goes through.
//!
//! Endpoints are slots reused once freed, so an `EpId` is a plain index. Freeing an endpoint
//! drops its segment and translations; until the slot is reused, arrivals for it are
//! returned with `BadEndpoint`.

use super::{Core, EpState};
use crate::error::AmError;
use crate::types::{
    DEFAULT_TRANSLATIONS, EndpointName, EpId, MAX_ENDPOINTS, MAX_SEGMENT_BYTES, MAX_TRANSLATIONS,
    Status, Tag, TransIdx,
};

/// Is `len` bytes at `offset` inside a segment of `seg_len` bytes? The status says which
/// bound a message broke.
pub(super) fn seg_check(seg_len: usize, offset: u32, len: u32) -> Result<(), Status> {
    let (off, len) = (offset as usize, len as usize);
    if off > seg_len || (off == seg_len && len > 0) {
        Err(Status::BadSegOffset)
    } else if off + len > seg_len {
        Err(Status::BadLength)
    } else {
        Ok(())
    }
}

impl Core {
    /// Allocate an endpoint: tag NONE, empty segment, 256 unbound translations.
    pub fn alloc_endpoint(&mut self) -> Result<EpId, AmError> {
        let fresh = || EpState {
            live: true,
            tag: Tag::NONE,
            seg: Vec::new(),
            trans: Vec::new(),
            trans_len: DEFAULT_TRANSLATIONS,
        };
        if let Some(i) = self.eps.iter().position(|e| !e.live) {
            self.eps[i] = fresh();
            return Ok(EpId(i as u16));
        }
        if self.eps.len() >= MAX_ENDPOINTS {
            return Err(AmError::Resource("endpoints"));
        }
        self.eps.push(fresh());
        Ok(EpId((self.eps.len() - 1) as u16))
    }

    /// Free an endpoint; later arrivals for it are returned with `BadEndpoint`.
    pub fn free_endpoint(&mut self, ep: EpId) -> Result<(), AmError> {
        let e = self.ep_mut(ep)?;
        e.live = false;
        e.seg = Vec::new();
        e.trans = Vec::new();
        Ok(())
    }

    pub(super) fn ep(&self, ep: EpId) -> Result<&EpState, AmError> {
        self.eps
            .get(usize::from(ep.0))
            .filter(|e| e.live)
            .ok_or(AmError::BadEndpoint(ep))
    }
    pub(super) fn ep_mut(&mut self, ep: EpId) -> Result<&mut EpState, AmError> {
        self.eps
            .get_mut(usize::from(ep.0))
            .filter(|e| e.live)
            .ok_or(AmError::BadEndpoint(ep))
    }

    /// Is `ep` allocated?
    pub fn endpoint_live(&self, ep: EpId) -> bool {
        self.ep(ep).is_ok()
    }
    /// Set the endpoint's tag; takes effect for every later delivery (atomic revocation).
    pub fn set_tag(&mut self, ep: EpId, tag: Tag) -> Result<(), AmError> {
        self.ep_mut(ep)?.tag = tag;
        Ok(())
    }
    /// The endpoint's tag.
    pub fn tag(&self, ep: EpId) -> Result<Tag, AmError> {
        Ok(self.ep(ep)?.tag)
    }
    /// Give the endpoint a zeroed segment of `len` bytes (replacing the old one).
    pub fn set_segment(&mut self, ep: EpId, len: usize) -> Result<(), AmError> {
        if len > MAX_SEGMENT_BYTES {
            return Err(AmError::BadArg("segment larger than MAX_SEGMENT_BYTES"));
        }
        self.ep_mut(ep)?.seg = vec![0; len];
        Ok(())
    }
    /// The endpoint's segment.
    pub fn segment(&self, ep: EpId) -> Result<&[u8], AmError> {
        Ok(&self.ep(ep)?.seg)
    }
    /// The endpoint's segment, writable.
    pub fn segment_mut(&mut self, ep: EpId) -> Result<&mut [u8], AmError> {
        Ok(&mut self.ep_mut(ep)?.seg)
    }
    /// Resize the translation table (`AM_SetNumTranslations`): `DEFAULT..=MAX`.
    pub fn set_num_translations(&mut self, ep: EpId, n: usize) -> Result<(), AmError> {
        if !(DEFAULT_TRANSLATIONS..=MAX_TRANSLATIONS).contains(&n) {
            return Err(AmError::BadArg("translation table size out of range"));
        }
        let e = self.ep_mut(ep)?;
        e.trans.truncate(n);
        e.trans_len = n;
        Ok(())
    }
    /// Size of the translation table.
    pub fn num_translations(&self, ep: EpId) -> Result<usize, AmError> {
        Ok(self.ep(ep)?.trans_len)
    }
    /// Bind translation `idx` (`AM_Map`); an active entry must be unmapped first.
    pub fn map(
        &mut self,
        ep: EpId,
        idx: TransIdx,
        name: EndpointName,
        tag: Tag,
    ) -> Result<(), AmError> {
        let e = self.ep_mut(ep)?;
        let i = usize::from(idx.0);
        if i >= e.trans_len {
            return Err(AmError::BadEntry(idx));
        }
        if e.trans.len() <= i {
            e.trans.resize(i + 1, None);
        }
        let slot = &mut e.trans[i];
        if slot.is_some() {
            return Err(AmError::InUse);
        }
        *slot = Some((name, tag));
        Ok(())
    }
    /// Bind the first free translation (`AM_MapAny`).
    pub fn map_any(&mut self, ep: EpId, name: EndpointName, tag: Tag) -> Result<TransIdx, AmError> {
        let e = self.ep_mut(ep)?;
        let i = match e.trans.iter().position(Option::is_none) {
            Some(i) => i,
            None if e.trans.len() < e.trans_len => {
                e.trans.push(None);
                e.trans.len() - 1
            }
            None => return Err(AmError::Resource("translations")),
        };
        e.trans[i] = Some((name, tag));
        Ok(TransIdx(i as u16))
    }
    /// Unbind a translation (`AM_Unmap`).
    pub fn unmap(&mut self, ep: EpId, idx: TransIdx) -> Result<(), AmError> {
        let e = self.ep_mut(ep)?;
        let slot = e
            .trans
            .get_mut(usize::from(idx.0))
            .ok_or(AmError::BadEntry(idx))?;
        if slot.take().is_none() {
            return Err(AmError::BadEntry(idx));
        }
        Ok(())
    }
    /// A translation (`AM_GetTranslationName` / `Tag`).
    pub fn translation(&self, ep: EpId, idx: TransIdx) -> Result<(EndpointName, Tag), AmError> {
        self.ep(ep)?
            .trans
            .get(usize::from(idx.0))
            .copied()
            .flatten()
            .ok_or(AmError::BadEntry(idx))
    }
}
