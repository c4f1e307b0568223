//! Switches (token managers), hosts (SIUs) and the links between them; routes and logical
//! distances by shortest path.
//!
//! Every host hangs off exactly one switch; switches connect by trunks. The logical distance
//! between two hosts is the number of token managers a message traverses: switch hops + 1.
//! Routes are shortest paths with ties broken towards the lower switch id, so every node
//! computes the same routes.

use std::collections::VecDeque;
use thiserror::Error;

/// Index of a host (an SIU, one per SMM node).
pub type HostId = u16;
/// Index of a switch (a token manager).
pub type SwitchId = u16;

/// Most hosts a topology holds: host ports use the low 15 bits of a source port.
pub const HOSTS_MAX: usize = 0x7fff;
/// Most switches a topology holds.
pub const SWITCHES_MAX: usize = 1024;
/// Source-port bit that marks a token manager.
pub const SWITCH_PORT_BIT: u16 = 0x8000;

/// The next hop of a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Hop {
    /// Deliver to this host's SIU.
    Host(HostId),
    /// Forward to this neighbouring switch.
    Switch(SwitchId),
}

/// Why a topology is not usable.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TopologyError {
    /// No switches.
    #[error("a topology needs at least one switch")]
    NoSwitches,
    /// No hosts.
    #[error("a topology needs at least one host")]
    NoHosts,
    /// Too many nodes of one kind.
    #[error("too many {what}: {count} (at most {max})")]
    TooMany {
        /// "hosts" or "switches".
        what: &'static str,
        /// How many were given.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// A host names a switch that does not exist.
    #[error("host {host} is attached to switch {switch}, which does not exist")]
    UnknownSwitch {
        /// The host.
        host: HostId,
        /// The missing switch.
        switch: SwitchId,
    },
    /// A trunk names a switch that does not exist or joins a switch to itself.
    #[error("trunk {a}-{b} is invalid")]
    BadTrunk {
        /// One end.
        a: SwitchId,
        /// Other end.
        b: SwitchId,
    },
    /// The same trunk twice.
    #[error("trunk {a}-{b} is listed twice")]
    DuplicateTrunk {
        /// One end.
        a: SwitchId,
        /// Other end.
        b: SwitchId,
    },
    /// Some switch cannot reach switch 0.
    #[error("switch {0} is not connected to switch 0")]
    Disconnected(SwitchId),
}

/// A validated topology with precomputed routes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    switches: usize,
    host_switch: Vec<SwitchId>,
    trunks: Vec<(SwitchId, SwitchId)>,
    switch_adj: Vec<Vec<SwitchId>>,
    /// `switch_hops[a][b]`: trunk hops from switch a to switch b.
    switch_hops: Vec<Vec<u16>>,
    /// `next_switch[a][b]`: the neighbour of a on the route to b (a itself when a == b).
    next_switch: Vec<Vec<SwitchId>>,
    /// Trunks of the barrier spanning tree (BFS from switch 0), as adjacency.
    barrier_tree: Vec<Vec<SwitchId>>,
}

impl Topology {
    /// Builds a topology of `switches` switches, hosts attached as `host_switch[h]`, and trunks.
    pub fn new(
        switches: usize,
        host_switch: Vec<SwitchId>,
        trunks: Vec<(SwitchId, SwitchId)>,
    ) -> Result<Self, TopologyError> {
        validate(switches, &host_switch, &trunks)?;
        let mut switch_adj = vec![Vec::new(); switches];
        for &(a, b) in &trunks {
            switch_adj[usize::from(a)].push(b);
            switch_adj[usize::from(b)].push(a);
        }
        for adj in &mut switch_adj {
            adj.sort_unstable();
        }
        let mut switch_hops = Vec::with_capacity(switches);
        let mut next_switch = Vec::with_capacity(switches);
        for from in 0..switches {
            let (hops, next) = bfs(&switch_adj, from as SwitchId);
            if let Some(s) = hops.iter().position(|&h| h == u16::MAX) {
                return Err(TopologyError::Disconnected(s as SwitchId));
            }
            switch_hops.push(hops);
            next_switch.push(next);
        }
        let barrier_tree = spanning_tree(&switch_adj);
        Ok(Self {
            switches,
            host_switch,
            trunks,
            switch_adj,
            switch_hops,
            next_switch,
            barrier_tree,
        })
    }

    /// `hosts` hosts spread round-robin over `switches` switches joined in a line.
    pub fn line(hosts: usize, switches: usize) -> Result<Self, TopologyError> {
        let switches_nonzero = switches.max(1);
        let host_switch = (0..hosts)
            .map(|h| (h % switches_nonzero) as SwitchId)
            .collect();
        let trunks = (1..switches)
            .map(|s| ((s - 1) as SwitchId, s as SwitchId))
            .collect();
        Self::new(switches, host_switch, trunks)
    }

    /// Number of switches.
    pub fn switch_count(&self) -> usize {
        self.switches
    }

    /// Number of hosts.
    pub fn host_count(&self) -> usize {
        self.host_switch.len()
    }

    /// The switch a host hangs off.
    pub fn switch_of(&self, host: HostId) -> SwitchId {
        self.host_switch[usize::from(host)]
    }

    /// Trunks as given.
    pub fn trunks(&self) -> &[(SwitchId, SwitchId)] {
        &self.trunks
    }

    /// Hosts attached to `switch`, in id order.
    pub fn hosts_at(&self, switch: SwitchId) -> impl Iterator<Item = HostId> + '_ {
        self.host_switch
            .iter()
            .enumerate()
            .filter(move |(_, s)| **s == switch)
            .map(|(h, _)| h as HostId)
    }

    /// Switches joined to `switch` by a trunk, in id order.
    pub fn switch_neighbours(&self, switch: SwitchId) -> &[SwitchId] {
        &self.switch_adj[usize::from(switch)]
    }

    /// Trunk neighbours of `switch` in the barrier spanning tree (BFS from switch 0).
    pub fn barrier_tree_neighbours(&self, switch: SwitchId) -> &[SwitchId] {
        &self.barrier_tree[usize::from(switch)]
    }

    /// Logical distance from host `from` to host `to`: token managers traversed (≥ 1).
    pub fn distance(&self, from: HostId, to: HostId) -> u16 {
        let a = usize::from(self.switch_of(from));
        let b = usize::from(self.switch_of(to));
        self.switch_hops[a][b] + 1
    }

    /// Largest logical distance between any two hosts.
    pub fn max_distance(&self) -> u16 {
        let mut max = 1;
        for (a, row) in self.switch_hops.iter().enumerate() {
            if self.hosts_at(a as SwitchId).next().is_none() {
                continue;
            }
            for (b, &hops) in row.iter().enumerate() {
                if self.hosts_at(b as SwitchId).next().is_some() {
                    max = max.max(hops + 1);
                }
            }
        }
        max
    }

    /// Largest distance in hops between any two nodes (hosts and switches) of the graph.
    pub fn diameter_hops(&self) -> u16 {
        // Host to host: switch hops + 2 (host-switch links at both ends).
        self.max_distance() + 1
    }

    /// Next hop from switch `at` towards host `to`.
    pub fn next_hop(&self, at: SwitchId, to: HostId) -> Hop {
        let target = self.switch_of(to);
        if target == at {
            Hop::Host(to)
        } else {
            Hop::Switch(self.next_switch[usize::from(at)][usize::from(target)])
        }
    }

    /// Token source port of a host.
    pub fn host_port(host: HostId) -> u16 {
        host & !SWITCH_PORT_BIT
    }

    /// Token source port of a switch.
    pub fn switch_port(switch: SwitchId) -> u16 {
        switch | SWITCH_PORT_BIT
    }
}

fn validate(
    switches: usize,
    host_switch: &[SwitchId],
    trunks: &[(SwitchId, SwitchId)],
) -> Result<(), TopologyError> {
    if switches == 0 {
        return Err(TopologyError::NoSwitches);
    }
    if host_switch.is_empty() {
        return Err(TopologyError::NoHosts);
    }
    if switches > SWITCHES_MAX {
        return Err(TopologyError::TooMany {
            what: "switches",
            count: switches,
            max: SWITCHES_MAX,
        });
    }
    if host_switch.len() > HOSTS_MAX {
        return Err(TopologyError::TooMany {
            what: "hosts",
            count: host_switch.len(),
            max: HOSTS_MAX,
        });
    }
    for (h, &s) in host_switch.iter().enumerate() {
        if usize::from(s) >= switches {
            return Err(TopologyError::UnknownSwitch {
                host: h as HostId,
                switch: s,
            });
        }
    }
    let mut seen = std::collections::HashSet::new();
    for &(a, b) in trunks {
        if a == b || usize::from(a) >= switches || usize::from(b) >= switches {
            return Err(TopologyError::BadTrunk { a, b });
        }
        if !seen.insert((a.min(b), a.max(b))) {
            return Err(TopologyError::DuplicateTrunk { a, b });
        }
    }
    Ok(())
}

/// Hops from `from` to every switch (u16::MAX if unreachable) and the first hop towards each.
fn bfs(adj: &[Vec<SwitchId>], from: SwitchId) -> (Vec<u16>, Vec<SwitchId>) {
    let n = adj.len();
    let mut hops = vec![u16::MAX; n];
    let mut first = vec![from; n];
    let mut queue = VecDeque::new();
    hops[usize::from(from)] = 0;
    queue.push_back(from);
    while let Some(s) = queue.pop_front() {
        for &t in &adj[usize::from(s)] {
            if hops[usize::from(t)] == u16::MAX {
                hops[usize::from(t)] = hops[usize::from(s)] + 1;
                first[usize::from(t)] = if s == from { t } else { first[usize::from(s)] };
                queue.push_back(t);
            }
        }
    }
    (hops, first)
}

/// BFS spanning tree from switch 0 (lowest-id parent wins), as adjacency lists.
fn spanning_tree(adj: &[Vec<SwitchId>]) -> Vec<Vec<SwitchId>> {
    let n = adj.len();
    let mut tree = vec![Vec::new(); n];
    let mut seen = vec![false; n];
    let mut queue = VecDeque::from([0 as SwitchId]);
    seen[0] = true;
    while let Some(s) = queue.pop_front() {
        for &t in &adj[usize::from(s)] {
            if !seen[usize::from(t)] {
                seen[usize::from(t)] = true;
                tree[usize::from(s)].push(t);
                tree[usize::from(t)].push(s);
                queue.push_back(t);
            }
        }
    }
    for list in &mut tree {
        list.sort_unstable();
    }
    tree
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_distances_and_routes() {
        // switches 0-1-2, hosts 0..6 round robin
        let t = Topology::line(6, 3).unwrap();
        assert_eq!(t.switch_of(4), 1);
        assert_eq!(t.distance(0, 3), 1);
        assert_eq!(t.distance(0, 1), 2);
        assert_eq!(t.distance(0, 2), 3);
        assert_eq!(t.max_distance(), 3);
        assert_eq!(t.next_hop(0, 2), Hop::Switch(1));
        assert_eq!(t.next_hop(1, 2), Hop::Switch(2));
        assert_eq!(t.next_hop(2, 2), Hop::Host(2));
        assert_eq!(t.hosts_at(1).collect::<Vec<_>>(), vec![1, 4]);
    }

    #[test]
    fn cycle_routes_take_the_shortest_path_and_the_tree_drops_one_trunk() {
        // square 0-1-2-3-0
        let t = Topology::new(4, vec![0, 1, 2, 3], vec![(0, 1), (1, 2), (2, 3), (3, 0)]).unwrap();
        assert_eq!(t.distance(0, 2), 3);
        assert_eq!(
            t.next_hop(0, 2),
            Hop::Switch(1),
            "tie broken to the lower id"
        );
        assert_eq!(t.next_hop(0, 3), Hop::Switch(3));
        let tree_edges: usize = (0..4).map(|s| t.barrier_tree_neighbours(s).len()).sum();
        assert_eq!(tree_edges, 2 * 3, "a spanning tree of 4 nodes has 3 edges");
    }

    #[test]
    fn invalid_topologies_are_refused() {
        assert_eq!(
            Topology::new(0, vec![0], vec![]),
            Err(TopologyError::NoSwitches)
        );
        assert_eq!(
            Topology::new(1, vec![], vec![]),
            Err(TopologyError::NoHosts)
        );
        assert_eq!(
            Topology::new(1, vec![1], vec![]),
            Err(TopologyError::UnknownSwitch { host: 0, switch: 1 })
        );
        assert_eq!(
            Topology::new(2, vec![0], vec![]),
            Err(TopologyError::Disconnected(1))
        );
        assert_eq!(
            Topology::new(2, vec![0], vec![(0, 0)]),
            Err(TopologyError::BadTrunk { a: 0, b: 0 })
        );
        assert_eq!(
            Topology::new(2, vec![0], vec![(0, 1), (1, 0)]),
            Err(TopologyError::DuplicateTrunk { a: 1, b: 0 })
        );
    }

    #[test]
    fn ports_separate_hosts_from_switches() {
        assert_eq!(Topology::host_port(5), 5);
        assert_eq!(Topology::switch_port(5), 0x8005);
    }
}
