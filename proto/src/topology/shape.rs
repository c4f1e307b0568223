//! Generated switch trees: `line`, `star`, `tree:FANOUT` and `leaf-spine[:SPINES]`.
//!
//! A shape decides the trunks between `switches` switches and which switches take hosts (the
//! leaves; in a line every switch). Hosts are spread over those round robin by
//! [`Topology::generate`](super::Topology::generate). Every shape is a tree, as the protocol
//! requires (`docs/design.md`, "Which switch graphs work").

use super::SwitchId;
use std::fmt;
use std::str::FromStr;
use thiserror::Error;

/// How a generated topology joins its switches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Shape {
    /// Switches 0-1-2-…, hosts on every switch (the diameter grows with the switches).
    #[default]
    Line,
    /// Switch 0 in the centre, every other switch a leaf joined to it (one switch: it takes
    /// the hosts).
    Star,
    /// A balanced tree: switch 0 is the root and switch `s` the parent of switches
    /// `fanout·s + 1 ..= fanout·s + fanout` (a complete tree, filled level by level); hosts on
    /// the leaves. The diameter grows with the depth, `log_fanout(switches)`.
    Tree {
        /// Children per switch (at least 2).
        fanout: u16,
    },
    /// Two levels: `spines` spine switches (0..spines) and leaf switches (the rest), each leaf
    /// joined to one spine, round robin, and the spines joined to spine 0 (a star: no cycle,
    /// so at most 4 trunk hops between two leaves); hosts on the leaves.
    LeafSpine {
        /// Spine switches (at least 1, fewer than the switches); `None`: the integer square
        /// root of the switches, so spines and leaves per spine are about equal.
        spines: Option<u16>,
    },
}

/// Why a shape cannot be parsed or built.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ShapeError {
    /// Not a shape this module knows.
    #[error("`{0}` is not a topology: line, star, tree:FANOUT or leaf-spine[:SPINES]")]
    Unknown(String),
    /// A tree whose fanout is below 2 (a fanout of 1 is a line).
    #[error("tree:{0}: the fanout must be at least 2 (tree:1 is a line: use line)")]
    Fanout(u16),
    /// A leaf/spine shape without room for a leaf.
    #[error(
        "leaf-spine with {spines} spines needs more than {spines} switches (at least one \
         leaf) and at least one spine, but has {switches} switches"
    )]
    Spines {
        /// Spines asked for.
        spines: usize,
        /// Switches given.
        switches: usize,
    },
}

impl FromStr for Shape {
    type Err = ShapeError;

    fn from_str(s: &str) -> Result<Self, ShapeError> {
        let unknown = || ShapeError::Unknown(s.to_string());
        let (name, arg) = match s.split_once(':') {
            Some((n, a)) => (n, Some(a.parse::<u16>().map_err(|_| unknown())?)),
            None => (s, None),
        };
        match (name, arg) {
            ("line", None) => Ok(Self::Line),
            ("star", None) => Ok(Self::Star),
            ("tree", Some(fanout)) if fanout >= 2 => Ok(Self::Tree { fanout }),
            ("tree", Some(fanout)) => Err(ShapeError::Fanout(fanout)),
            ("leaf-spine", spines) => Ok(Self::LeafSpine { spines }),
            _ => Err(unknown()),
        }
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Line => f.write_str("line"),
            Self::Star => f.write_str("star"),
            Self::Tree { fanout } => write!(f, "tree:{fanout}"),
            Self::LeafSpine { spines: None } => f.write_str("leaf-spine"),
            Self::LeafSpine { spines: Some(p) } => write!(f, "leaf-spine:{p}"),
        }
    }
}

/// Trunks, and the switches that take hosts, in id order.
pub(super) type Built = (Vec<(SwitchId, SwitchId)>, Vec<SwitchId>);

impl Shape {
    /// The trunks among `switches` switches (at least 1, at most
    /// [`SWITCHES_MAX`](super::SWITCHES_MAX)) and the switches that take hosts.
    pub(super) fn build(self, switches: usize) -> Result<Built, ShapeError> {
        let id = |s: usize| s as SwitchId;
        match self {
            Self::Line => {
                let trunks = (1..switches).map(|s| (id(s - 1), id(s))).collect();
                Ok((trunks, (0..switches).map(id).collect()))
            }
            Self::Star if switches == 1 => Ok((Vec::new(), vec![0])),
            Self::Star => {
                let trunks = (1..switches).map(|s| (0, id(s))).collect();
                Ok((trunks, (1..switches).map(id).collect()))
            }
            Self::Tree { fanout } if fanout < 2 => Err(ShapeError::Fanout(fanout)),
            Self::Tree { fanout } => {
                let f = usize::from(fanout);
                let trunks = (1..switches).map(|s| (id((s - 1) / f), id(s))).collect();
                let leaves = (0..switches).filter(|s| f * s + 1 >= switches).map(id);
                Ok((trunks, leaves.collect()))
            }
            Self::LeafSpine { spines } => {
                let p = spines.map_or_else(|| switches.isqrt().max(1), usize::from);
                if p == 0 || p >= switches {
                    return Err(ShapeError::Spines {
                        spines: p,
                        switches,
                    });
                }
                let spine_trunks = (1..p).map(|s| (0, id(s)));
                let leaf_trunks = (p..switches).map(|l| (id((l - p) % p), id(l)));
                let trunks = spine_trunks.chain(leaf_trunks).collect();
                Ok((trunks, (p..switches).map(id).collect()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Hop, Topology, TopologyError};
    use super::*;

    #[test]
    fn shapes_parse_and_print_back() {
        for s in [
            "line",
            "star",
            "tree:2",
            "tree:16",
            "leaf-spine",
            "leaf-spine:4",
        ] {
            assert_eq!(s.parse::<Shape>().unwrap().to_string(), s);
        }
        assert_eq!("tree:1".parse::<Shape>(), Err(ShapeError::Fanout(1)));
        for bad in [
            "",
            "ring",
            "tree",
            "tree:",
            "tree:x",
            "star:3",
            "line:2",
            "tree:70000",
        ] {
            assert_eq!(
                bad.parse::<Shape>(),
                Err(ShapeError::Unknown(bad.to_string())),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_line_keeps_hosts_on_every_switch() {
        let t = Topology::generate(Shape::Line, 6, 3).unwrap();
        assert_eq!(t, Topology::line(6, 3).unwrap());
        assert_eq!(t.hosts_at(1).collect::<Vec<_>>(), vec![1, 4]);
        assert_eq!(t.max_distance(), 3);
    }

    #[test]
    fn a_star_puts_hosts_on_the_leaves_two_hops_apart() {
        let t = Topology::generate(Shape::Star, 8, 5).unwrap();
        assert_eq!(t.trunks(), &[(0, 1), (0, 2), (0, 3), (0, 4)]);
        assert_eq!(t.hosts_at(0).count(), 0, "the centre takes no host");
        assert_eq!(t.hosts_at(1).collect::<Vec<_>>(), vec![0, 4]);
        assert_eq!(t.hosts_at(4).collect::<Vec<_>>(), vec![3, 7]);
        assert_eq!(t.distance(0, 1), 3, "leaf, centre, leaf");
        assert_eq!(t.distance(0, 4), 1, "same leaf");
        assert_eq!(t.max_distance(), 3);
        assert_eq!(t.next_hop(1, 1), Hop::Switch(0));
        assert_eq!(t.next_hop(0, 1), Hop::Switch(2));
        // One switch: it is the only leaf.
        let t = Topology::generate(Shape::Star, 3, 1).unwrap();
        assert_eq!(t.hosts_at(0).count(), 3);
    }

    #[test]
    fn a_balanced_tree_grows_its_diameter_with_depth_not_switches() {
        // 21 switches of fanout 4: root, 4 inner, 16 leaves (depth 2).
        let t = Topology::generate(Shape::Tree { fanout: 4 }, 1024, 21).unwrap();
        let leaves: Vec<SwitchId> = (0..21).filter(|&s| t.hosts_at(s).count() > 0).collect();
        assert_eq!(leaves, (5..21).collect::<Vec<_>>());
        assert!(leaves.iter().all(|&s| t.hosts_at(s).count() == 64));
        assert_eq!(t.switch_neighbours(0), &[1, 2, 3, 4]);
        assert_eq!(t.switch_neighbours(1), &[0, 5, 6, 7, 8]);
        assert_eq!(t.max_distance(), 5, "leaf, inner, root, inner, leaf");
        // 85 switches: depth 3, distance 7; a line of 85 would be 85.
        let t = Topology::generate(Shape::Tree { fanout: 4 }, 4096, 85).unwrap();
        assert_eq!(t.max_distance(), 7);
        // A tree that is not full: 7 switches of fanout 3 — 0; 1 2 3; 4 5 6 under 1.
        let t = Topology::generate(Shape::Tree { fanout: 3 }, 6, 7).unwrap();
        let leaves: Vec<SwitchId> = (0..7).filter(|&s| t.hosts_at(s).count() > 0).collect();
        assert_eq!(leaves, vec![2, 3, 4, 5, 6]);
        assert_eq!(t.distance(4, 1), 4, "switch 6 to switch 2: 6-1-0-2");
    }

    #[test]
    fn leaf_spine_joins_spines_in_a_star_and_bounds_the_diameter() {
        // 16 switches: 4 spines, 12 leaves, 3 per spine.
        let t = Topology::generate(Shape::LeafSpine { spines: None }, 48, 16).unwrap();
        assert_eq!(t.switch_neighbours(0), &[1, 2, 3, 4, 8, 12]);
        assert_eq!(t.switch_neighbours(1), &[0, 5, 9, 13]);
        assert_eq!((0..4).map(|s| t.hosts_at(s).count()).sum::<usize>(), 0);
        assert!((4..16).all(|s| t.hosts_at(s).count() == 4));
        assert_eq!(t.max_distance(), 5, "leaf, spine, spine 0, spine, leaf");
        // However many switches.
        let t = Topology::generate(Shape::LeafSpine { spines: Some(30) }, 1000, 1000).unwrap();
        assert_eq!(t.max_distance(), 5);
        // One spine: a star whose centre is the spine.
        let t = Topology::generate(Shape::LeafSpine { spines: Some(1) }, 4, 5).unwrap();
        assert_eq!(t, Topology::generate(Shape::Star, 4, 5).unwrap());
    }

    #[test]
    fn unusable_shapes_are_refused() {
        let err = |shape, hosts, switches| Topology::generate(shape, hosts, switches).unwrap_err();
        assert_eq!(
            err(Shape::LeafSpine { spines: Some(4) }, 8, 4),
            TopologyError::Shape(ShapeError::Spines {
                spines: 4,
                switches: 4
            })
        );
        assert_eq!(
            err(Shape::LeafSpine { spines: None }, 8, 1),
            TopologyError::Shape(ShapeError::Spines {
                spines: 1,
                switches: 1
            })
        );
        assert_eq!(
            err(Shape::Tree { fanout: 1 }, 8, 4),
            TopologyError::Shape(ShapeError::Fanout(1))
        );
        assert_eq!(
            err(Shape::Tree { fanout: 2 }, 3, 7),
            TopologyError::TooFewHosts {
                hosts: 3,
                leaves: 4
            }
        );
        assert_eq!(err(Shape::Star, 4, 0), TopologyError::NoSwitches);
        assert!(matches!(
            err(Shape::Star, 4, 2000),
            TopologyError::TooMany { .. }
        ));
        assert_eq!(err(Shape::Star, 0, 3), TopologyError::NoHosts);
    }
}
