//! The memory of an `sc` run: which hosts hold which page.

use isotach_proto::config::ClusterConfig;
use isotach_proto::topology::HostId;
use isotach_smm::MemoryMap;

/// Most copies of the hot page (page 0). A write goes to every copy; thousands of copies per
/// write would measure multicast rather than ordering, and an isochron of four writes would
/// pass the SIU's limit on messages per isochron.
const HOT_COPIES_MAX: usize = 32;

/// The hosts that hold page 0: every host, or [`HOT_COPIES_MAX`] spread evenly over a larger
/// cluster.
fn hot_copies(n: usize) -> Vec<HostId> {
    if n <= HOT_COPIES_MAX {
        return (0..n as HostId).collect();
    }
    (0..HOT_COPIES_MAX)
        .map(|i| (i * n / HOT_COPIES_MAX) as HostId)
        .collect()
}

/// The memory of a run: page 0 on every host (on [`HOT_COPIES_MAX`] of a larger cluster); per
/// host a single-copy page; and as many pages replicated on 2 or 3 random hosts. Returns the
/// map and the pages besides page 0.
pub(super) fn memory(
    cluster: &ClusterConfig,
    rng: &mut crate::SimRng,
    two_copies: bool,
) -> (MemoryMap, Vec<u32>) {
    let n = cluster.topology.host_count();
    let mut map = MemoryMap::default();
    map.insert(0, 0, hot_copies(n)).expect("page 0");
    let mut pages = Vec::new();
    for h in 0..n {
        let page = 1 + h as u32;
        // With application restarts every page keeps a second copy to recover from.
        let mut set = vec![h as HostId];
        if two_copies && n > 1 {
            set.push(((h + 1) % n) as HostId);
        }
        map.insert(page, page, set).expect("single pages");
        pages.push(page);
    }
    for i in 0..n.max(2) {
        let page = 1 + n as u32 + i as u32;
        let copies = (2 + rng.below(2) as usize).min(n);
        let mut set: Vec<HostId> = Vec::new();
        while set.len() < copies {
            let h = rng.below(n as u64) as HostId;
            if !set.contains(&h) {
                set.push(h);
            }
        }
        map.insert(page, page, set).expect("replicated pages");
        pages.push(page);
    }
    (map, pages)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hot_page_is_everywhere_in_a_small_cluster_and_spread_in_a_large_one() {
        assert_eq!(hot_copies(3), [0, 1, 2]);
        assert_eq!(hot_copies(HOT_COPIES_MAX).len(), HOT_COPIES_MAX);
        let big = hot_copies(4096);
        assert_eq!(big.len(), HOT_COPIES_MAX);
        assert_eq!(big[1], 128);
        assert!(
            big.windows(2).all(|w| w[0] < w[1]),
            "distinct hosts: {big:?}"
        );
    }
}
