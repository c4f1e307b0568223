//! Who a set of links talks to: [`PeerList`], the peer ids and addresses, and which peers are
//! linked at once (*eager*: hello at start) or on first use (*on demand*).
//!
//! An SIU's network peers are its token manager — which it needs at once, for logical time to
//! start — and every other host's SIU, for non-isotach traffic that goes host to host directly.
//! Saying hello to every other SIU at start costs a cluster of `n` hosts `n²` hellos and every
//! SIU the AM state of `n` peers, though a host talks to few of them. So those peers are
//! linked on demand: a peer's state is made, and its hello sent, when the first packet is
//! queued for it or anything arrives from it. A node that may have restarted links them all
//! at once instead (`Links::link_every_peer`): the SIU daemon at every start, the simulator
//! for a restarted SIU.
//!
//! The on-demand addresses live in a [`Directory`] that many links in one process may share
//! (the simulator runs thousands of SIUs; a list per SIU would be quadratic). Peer ids: the
//! eager peers first, in the order given, then the directory's entries in order, without the
//! one the node itself holds (`skip`).

use rustc_hash::FxHashMap;
use std::sync::Arc;

use crate::error::AmError;
use crate::types::{MAX_TRANSLATIONS, NodeAddr};

/// Addresses of on-demand peers, in order, with a reverse index. Share one between the links
/// of many nodes with an [`Arc`].
#[derive(Debug)]
pub struct Directory {
    addrs: Vec<NodeAddr>,
    index: FxHashMap<NodeAddr, usize>,
}

impl Directory {
    /// A directory of `addrs`; an address listed twice is refused.
    pub fn new(addrs: Vec<NodeAddr>) -> Result<Arc<Self>, AmError> {
        let mut index = FxHashMap::with_capacity_and_hasher(addrs.len(), Default::default());
        for (i, &a) in addrs.iter().enumerate() {
            if index.insert(a, i).is_some() {
                return Err(AmError::BadArg("a peer address appears twice"));
            }
        }
        Ok(Arc::new(Self { addrs, index }))
    }

    /// Entries.
    pub fn len(&self) -> usize {
        self.addrs.len()
    }

    /// No entries?
    pub fn is_empty(&self) -> bool {
        self.addrs.is_empty()
    }
}

#[derive(Debug, Clone)]
struct OnDemand {
    dir: Arc<Directory>,
    /// The entry that is the node itself (not a peer).
    skip: Option<usize>,
}

impl OnDemand {
    fn len(&self) -> usize {
        self.dir.len() - usize::from(self.skip.is_some())
    }

    /// The directory entry of on-demand peer `j` (0-based among the on-demand peers).
    fn entry(&self, j: usize) -> Option<usize> {
        let k = match self.skip {
            Some(s) if j >= s => j + 1,
            _ => j,
        };
        (k < self.dir.len()).then_some(k)
    }

    /// The on-demand peer (0-based) at directory entry `k`.
    fn peer(&self, k: usize) -> Option<usize> {
        match self.skip {
            Some(s) if k == s => None,
            Some(s) if k > s => Some(k - 1),
            _ => Some(k),
        }
    }
}

/// The peers of a set of links, by peer id. See the module documentation.
#[derive(Debug, Clone)]
pub struct PeerList {
    eager: Vec<NodeAddr>,
    /// Looked up per datagram sent and received (FxHash: cheap; keys come from the config).
    eager_ids: FxHashMap<NodeAddr, usize>,
    on_demand: Option<OnDemand>,
}

impl PeerList {
    /// Peers linked at once, `addrs[i]` being peer `i`; an address listed twice is refused.
    pub fn eager(addrs: &[NodeAddr]) -> Result<Self, AmError> {
        let mut eager_ids = FxHashMap::with_capacity_and_hasher(addrs.len(), Default::default());
        for (i, &a) in addrs.iter().enumerate() {
            if eager_ids.insert(a, i).is_some() {
                return Err(AmError::BadArg("a peer address appears twice"));
            }
        }
        Ok(Self {
            eager: addrs.to_vec(),
            eager_ids,
            on_demand: None,
        })
    }

    /// `eager` peers linked at once, then every entry of `dir` but `skip` (the node itself)
    /// linked on first use. An address listed twice (among the eager peers, or eager and in
    /// the directory) is refused (more peers than a translation table holds is refused when
    /// links are made on the list: `Links::with_peers`).
    pub fn with_on_demand(
        eager: &[NodeAddr],
        dir: Arc<Directory>,
        skip: Option<usize>,
    ) -> Result<Self, AmError> {
        let mut list = Self::eager(eager)?;
        if skip.is_some_and(|s| s >= dir.len()) {
            return Err(AmError::BadArg(
                "the node's own entry is not in the directory",
            ));
        }
        let od = OnDemand { dir, skip };
        for a in eager {
            if od.dir.index.get(a).and_then(|&k| od.peer(k)).is_some() {
                return Err(AmError::BadArg("a peer address appears twice"));
            }
        }
        list.on_demand = Some(od);
        Ok(list)
    }

    /// The peers given as one list, the first `eager` of them linked at once, the rest on
    /// demand (a daemon's plan: its own copy of the directory).
    pub fn split(peers: &[NodeAddr], eager: usize) -> Result<Self, AmError> {
        let eager = eager.min(peers.len());
        let dir = Directory::new(peers[eager..].to_vec())?;
        Self::with_on_demand(&peers[..eager], dir, None)
    }

    /// Peers in all.
    pub fn len(&self) -> usize {
        self.eager.len() + self.on_demand.as_ref().map_or(0, OnDemand::len)
    }

    /// No peers at all?
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Peers linked at once (ids `0..eager_len()`).
    pub fn eager_len(&self) -> usize {
        self.eager.len()
    }

    /// Is `peer` linked on first use?
    pub fn is_on_demand(&self, peer: usize) -> bool {
        peer >= self.eager.len() && peer < self.len()
    }

    /// The address of `peer`.
    pub fn addr(&self, peer: usize) -> Option<NodeAddr> {
        if let Some(&a) = self.eager.get(peer) {
            return Some(a);
        }
        let od = self.on_demand.as_ref()?;
        let k = od.entry(peer - self.eager.len())?;
        Some(od.dir.addrs[k])
    }

    /// The peer at `addr`, if it is one.
    pub fn id_of(&self, addr: NodeAddr) -> Option<usize> {
        if let Some(&i) = self.eager_ids.get(&addr) {
            return Some(i);
        }
        let od = self.on_demand.as_ref()?;
        let &k = od.dir.index.get(&addr)?;
        od.peer(k).map(|j| self.eager.len() + j)
    }

    /// Checks the list fits a translation table (a translation per peer in use, and one
    /// spare, as the links have always kept).
    pub(super) fn check_size(&self) -> Result<(), AmError> {
        if self.len() + 1 > MAX_TRANSLATIONS {
            return Err(AmError::BadArg("more peers than a translation table holds"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mem(ids: impl IntoIterator<Item = u32>) -> Vec<NodeAddr> {
        ids.into_iter().map(NodeAddr::Mem).collect()
    }

    #[test]
    fn ids_run_over_the_eager_peers_then_the_directory_without_the_node_itself() {
        let dir = Directory::new(mem(100..104)).unwrap();
        let list = PeerList::with_on_demand(&mem([7, 8]), Arc::clone(&dir), Some(1)).unwrap();
        assert_eq!(list.len(), 5, "2 eager + 4 entries - the node itself");
        assert_eq!(list.eager_len(), 2);
        let addrs: Vec<_> = (0..list.len()).map(|i| list.addr(i).unwrap()).collect();
        assert_eq!(addrs, mem([7, 8, 100, 102, 103]));
        for (i, a) in addrs.iter().enumerate() {
            assert_eq!(list.id_of(*a), Some(i), "{a:?}");
        }
        assert_eq!(list.id_of(NodeAddr::Mem(101)), None, "the node itself");
        assert_eq!(list.id_of(NodeAddr::Mem(9)), None, "not a peer");
        assert_eq!(list.addr(5), None);
        assert!(!list.is_on_demand(1) && list.is_on_demand(2) && !list.is_on_demand(5));
        // Without a skip, every entry is a peer.
        let all = PeerList::with_on_demand(&mem([7]), dir, None).unwrap();
        assert_eq!(all.len(), 5);
        assert_eq!(all.id_of(NodeAddr::Mem(101)), Some(2));
    }

    #[test]
    fn an_address_twice_or_a_skip_outside_the_directory_is_refused() {
        assert!(Directory::new(mem([1, 2, 1])).is_err());
        assert!(PeerList::eager(&mem([3, 3])).is_err());
        let dir = Directory::new(mem([1, 2])).unwrap();
        assert!(PeerList::with_on_demand(&mem([2]), Arc::clone(&dir), None).is_err());
        assert!(
            PeerList::with_on_demand(&mem([2]), Arc::clone(&dir), Some(1)).is_ok(),
            "the node's own entry is not a peer, so an eager peer may share its address"
        );
        assert!(PeerList::with_on_demand(&mem([]), dir, Some(2)).is_err());
        assert!(PeerList::split(&mem([1, 2, 2]), 1).is_err());
        let split = PeerList::split(&mem([1, 2, 3]), 1).unwrap();
        assert_eq!((split.len(), split.eager_len()), (3, 1));
    }
}
