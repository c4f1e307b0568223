//! Switches (token managers), hosts (SIUs) and the links between them; routes and logical
//! distances from the graph.
//!
//! Every host hangs off exactly one switch; switches connect by trunks, and the trunks must
//! form a tree: connected, no cycle (`docs/design.md`, "Which switch graphs work"). So there is
//! exactly one path between two switches; a route follows it, and the logical distance between
//! two hosts is the number of token managers on it: switch hops + 1 (breadth-first search from
//! every switch). [`Shape`] generates the usual trees (line, star, balanced tree, leaf/spine).

use std::collections::VecDeque;
use thiserror::Error;

mod shape;
pub use shape::{Shape, ShapeError};

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
        /// Position of the trunk in the list given.
        trunk: usize,
        /// One end.
        a: SwitchId,
        /// Other end.
        b: SwitchId,
    },
    /// The same trunk twice.
    #[error("trunk {a}-{b} is listed twice")]
    DuplicateTrunk {
        /// Position of the second one in the list given.
        trunk: usize,
        /// One end.
        a: SwitchId,
        /// Other end.
        b: SwitchId,
    },
    /// A trunk joins two switches that the trunks before it already connect: a cycle.
    #[error(
        "trunk {a}-{b} closes a cycle of switches {cycle:?}: the trunks must form a tree \
         (one path between two switches)"
    )]
    Cycle {
        /// Position of the trunk that closes the cycle in the list given.
        trunk: usize,
        /// One end.
        a: SwitchId,
        /// Other end.
        b: SwitchId,
        /// The cycle, from `a` along the earlier trunks to `b` (then back to `a` by this trunk).
        cycle: Vec<SwitchId>,
    },
    /// Some switch cannot reach switch 0 (nor can the hosts attached to it).
    #[error("switch {0} is not connected to switch 0")]
    Disconnected(SwitchId),
    /// A generated topology has more leaf switches than hosts.
    #[error(
        "only {hosts} hosts for the {leaves} switches that take hosts (every switch of a line, \
         the leaves of a tree): every switch needs a host; give fewer switches or more hosts"
    )]
    TooFewHosts {
        /// Hosts asked for.
        hosts: usize,
        /// Leaf switches the shape has.
        leaves: usize,
    },
    /// A generated shape is not usable with this many switches.
    #[error(transparent)]
    Shape(#[from] ShapeError),
}

/// A validated topology with precomputed routes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    switches: usize,
    host_switch: Vec<SwitchId>,
    /// `switch_hosts[s]`: the hosts attached to switch s, in id order.
    switch_hosts: Vec<Vec<HostId>>,
    trunks: Vec<(SwitchId, SwitchId)>,
    switch_adj: Vec<Vec<SwitchId>>,
    /// `switch_hops[a][b]`: trunk hops from switch a to switch b.
    switch_hops: Vec<Vec<u16>>,
    /// `next_switch[a][b]`: the neighbour of a on the route to b (a itself when a == b).
    next_switch: Vec<Vec<SwitchId>>,
    /// Largest logical distance between two hosts (computed once: SIUs read it every token).
    max_distance: u16,
}

impl Topology {
    /// Builds a topology of `switches` switches, hosts attached as `host_switch[h]`, and
    /// trunks, which must form a tree (connected, no cycle).
    pub fn new(
        switches: usize,
        host_switch: Vec<SwitchId>,
        trunks: Vec<(SwitchId, SwitchId)>,
    ) -> Result<Self, TopologyError> {
        validate(switches, &host_switch, &trunks)?;
        check_acyclic(switches, &trunks)?;
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
        let mut switch_hosts = vec![Vec::new(); switches];
        for (h, &s) in host_switch.iter().enumerate() {
            switch_hosts[usize::from(s)].push(h as HostId);
        }
        let max_distance = max_distance(&switch_hops, &switch_hosts);
        Ok(Self {
            switches,
            host_switch,
            switch_hosts,
            trunks,
            switch_adj,
            switch_hops,
            next_switch,
            max_distance,
        })
    }

    /// `hosts` hosts spread round-robin over `switches` switches joined in a line.
    pub fn line(hosts: usize, switches: usize) -> Result<Self, TopologyError> {
        Self::generate(Shape::Line, hosts, switches)
    }

    /// `hosts` hosts over `switches` switches joined as `shape` says (see [`Shape`]).
    pub fn generate(shape: Shape, hosts: usize, switches: usize) -> Result<Self, TopologyError> {
        check_switch_count(switches)?;
        let (trunks, leaves) = shape.build(switches)?;
        if hosts < leaves.len() && hosts > 0 {
            return Err(TopologyError::TooFewHosts {
                hosts,
                leaves: leaves.len(),
            });
        }
        let host_switch = (0..hosts).map(|h| leaves[h % leaves.len()]).collect();
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
        self.switch_hosts[usize::from(switch)].iter().copied()
    }

    /// Switches joined to `switch` by a trunk, in id order.
    pub fn switch_neighbours(&self, switch: SwitchId) -> &[SwitchId] {
        &self.switch_adj[usize::from(switch)]
    }

    /// Logical distance from host `from` to host `to`: token managers traversed (≥ 1).
    pub fn distance(&self, from: HostId, to: HostId) -> u16 {
        let a = usize::from(self.switch_of(from));
        let b = usize::from(self.switch_of(to));
        self.switch_hops[a][b] + 1
    }

    /// Largest logical distance between any two hosts.
    pub fn max_distance(&self) -> u16 {
        self.max_distance
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

/// At least one switch and at most [`SWITCHES_MAX`].
fn check_switch_count(switches: usize) -> Result<(), TopologyError> {
    if switches == 0 {
        return Err(TopologyError::NoSwitches);
    }
    if switches > SWITCHES_MAX {
        return Err(TopologyError::TooMany {
            what: "switches",
            count: switches,
            max: SWITCHES_MAX,
        });
    }
    Ok(())
}

fn validate(
    switches: usize,
    host_switch: &[SwitchId],
    trunks: &[(SwitchId, SwitchId)],
) -> Result<(), TopologyError> {
    check_switch_count(switches)?;
    if host_switch.is_empty() {
        return Err(TopologyError::NoHosts);
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
    for (trunk, &(a, b)) in trunks.iter().enumerate() {
        if a == b || usize::from(a) >= switches || usize::from(b) >= switches {
            return Err(TopologyError::BadTrunk { trunk, a, b });
        }
        if !seen.insert((a.min(b), a.max(b))) {
            return Err(TopologyError::DuplicateTrunk { trunk, a, b });
        }
    }
    Ok(())
}

/// Refuses the first trunk (in the order given) that joins two switches the trunks before it
/// already connect, naming the cycle it closes. Trunks are valid ([`validate`]).
fn check_acyclic(switches: usize, trunks: &[(SwitchId, SwitchId)]) -> Result<(), TopologyError> {
    let mut adj: Vec<Vec<SwitchId>> = vec![Vec::new(); switches];
    let mut component: Vec<usize> = (0..switches).collect();
    for (trunk, &(a, b)) in trunks.iter().enumerate() {
        let (ca, cb) = (find(&mut component, a), find(&mut component, b));
        if ca == cb {
            let cycle = path(&adj, a, b);
            return Err(TopologyError::Cycle { trunk, a, b, cycle });
        }
        component[ca] = cb;
        adj[usize::from(a)].push(b);
        adj[usize::from(b)].push(a);
    }
    Ok(())
}

/// The representative of `s`'s component (union-find with path halving).
fn find(component: &mut [usize], s: SwitchId) -> usize {
    let mut i = usize::from(s);
    while component[i] != i {
        component[i] = component[component[i]];
        i = component[i];
    }
    i
}

/// The path from `a` to `b` in the forest `adj` (they are connected in it).
fn path(adj: &[Vec<SwitchId>], a: SwitchId, b: SwitchId) -> Vec<SwitchId> {
    let mut parent = vec![None; adj.len()];
    parent[usize::from(a)] = Some(a);
    let mut queue = VecDeque::from([a]);
    while let Some(s) = queue.pop_front() {
        for &t in &adj[usize::from(s)] {
            if parent[usize::from(t)].is_none() {
                parent[usize::from(t)] = Some(s);
                queue.push_back(t);
            }
        }
    }
    let mut path = vec![b];
    let mut at = b;
    while at != a {
        at = parent[usize::from(at)].expect("a and b are connected");
        path.push(at);
    }
    path.reverse();
    path
}

/// Largest logical distance between two hosts: switch hops + 1 over switches with hosts.
fn max_distance(switch_hops: &[Vec<u16>], switch_hosts: &[Vec<HostId>]) -> u16 {
    let with_hosts: Vec<usize> = (0..switch_hosts.len())
        .filter(|&s| !switch_hosts[s].is_empty())
        .collect();
    let mut max = 1;
    for &a in &with_hosts {
        for &b in &with_hosts {
            max = max.max(switch_hops[a][b] + 1);
        }
    }
    max
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
    fn cycles_are_refused_naming_the_trunk_that_closes_one_and_the_cycle() {
        // square 0-1-2-3-0: the fourth trunk closes it.
        let e = Topology::new(4, vec![0, 1, 2, 3], vec![(0, 1), (1, 2), (2, 3), (3, 0)]);
        assert_eq!(
            e,
            Err(TopologyError::Cycle {
                trunk: 3,
                a: 3,
                b: 0,
                cycle: vec![3, 2, 1, 0]
            })
        );
        // A triangle hanging off a tree, trunks in another order.
        let e = Topology::new(5, vec![0], vec![(0, 1), (2, 3), (1, 2), (3, 4), (4, 2)]);
        assert_eq!(
            e,
            Err(TopologyError::Cycle {
                trunk: 4,
                a: 4,
                b: 2,
                cycle: vec![4, 3, 2]
            })
        );
        let msg = e.unwrap_err().to_string();
        assert!(
            msg.contains("closes a cycle of switches [4, 3, 2]"),
            "{msg}"
        );
        // The same switches as a tree are fine.
        let t = Topology::new(4, vec![0, 1, 2, 3], vec![(0, 1), (1, 2), (2, 3)]).unwrap();
        let tree_edges: usize = (0..4).map(|s| t.switch_neighbours(s).len()).sum();
        assert_eq!(tree_edges, 2 * 3);
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
            Err(TopologyError::BadTrunk {
                trunk: 0,
                a: 0,
                b: 0
            })
        );
        assert_eq!(
            Topology::new(2, vec![0], vec![(0, 1), (1, 0)]),
            Err(TopologyError::DuplicateTrunk {
                trunk: 1,
                a: 1,
                b: 0
            })
        );
        assert_eq!(
            Topology::line(2, 3),
            Err(TopologyError::TooFewHosts {
                hosts: 2,
                leaves: 3
            })
        );
    }

    #[test]
    fn max_distance_counts_only_switches_with_hosts() {
        // 0-1-2-3, hosts on 1 and 2 only: the ends carry no host.
        let t = Topology::new(4, vec![1, 2, 2], vec![(0, 1), (1, 2), (2, 3)]).unwrap();
        assert_eq!(t.max_distance(), 2);
        assert_eq!(t.hosts_at(2).collect::<Vec<_>>(), vec![1, 2]);
    }

    #[test]
    fn ports_separate_hosts_from_switches() {
        assert_eq!(Topology::host_port(5), 5);
        assert_eq!(Topology::switch_port(5), 0x8005);
    }
}
