//! What is wrong with the switch graph a config file describes, said with the names and the
//! line of the entry at fault: a cycle of trunks, a switch no trunk path reaches, too many
//! nodes.

use super::{RawConfig, Span};
use crate::topology::{SwitchId, TopologyError};

/// Where (the entry at fault, if one is), which key, and what is wrong, for a topology the
/// config file describes and [`Topology::new`](crate::topology::Topology::new) refused.
pub(super) fn topology_error(
    raw: &RawConfig,
    e: &TopologyError,
) -> (Option<Span>, &'static str, String) {
    let switch = |s: SwitchId| {
        raw.switches
            .get(usize::from(s))
            .map_or_else(|| format!("#{s}"), |e| e.name.get_ref().clone())
    };
    let trunk_span = |t: usize| raw.trunks.get(t).map(|t| t.between.span());
    match e {
        TopologyError::NoSwitches => (
            None,
            "switch",
            "no [[switch]]: a cluster needs a switch (a token manager) at least".into(),
        ),
        TopologyError::NoHosts => (
            None,
            "host",
            "no [[host]]: a cluster needs a host (an SIU) at least".into(),
        ),
        TopologyError::TooMany { what, count, max } => {
            let (span, key) = if *what == "hosts" {
                (raw.hosts.get(*max).map(|h| h.name.span()), "host.name")
            } else {
                (raw.switches.get(*max).map(|s| s.name.span()), "switch.name")
            };
            let msg = format!("{count} {what}, at most {max}: this is one too many");
            (span, key, msg)
        }
        TopologyError::BadTrunk { trunk, a, .. } => (
            trunk_span(*trunk),
            "trunk.between",
            format!("a trunk joins two switches, not `{}` to itself", switch(*a)),
        ),
        TopologyError::DuplicateTrunk { trunk, a, b } => {
            let msg = format!(
                "the trunk between `{}` and `{}` is listed twice (two trunks between the same \
                 switches would be a cycle)",
                switch(*a),
                switch(*b)
            );
            (trunk_span(*trunk), "trunk.between", msg)
        }
        TopologyError::Cycle {
            trunk, a, cycle, ..
        } => {
            let mut path: Vec<String> = cycle.iter().map(|&s| format!("`{}`", switch(s))).collect();
            path.push(format!("`{}`", switch(*a)));
            let msg = format!(
                "this trunk closes the cycle {}: the trunks before it already join its ends. \
                 The trunks must form a tree, one path between two switches (docs/design.md, \
                 \"Which switch graphs work\"): remove a trunk of the cycle",
                path.join(" - ")
            );
            (trunk_span(*trunk), "trunk.between", msg)
        }
        TopologyError::Disconnected(s) => {
            let hosts: Vec<String> = raw
                .hosts
                .iter()
                .filter(|h| h.switch.get_ref() == &switch(*s))
                .map(|h| format!("`{}`", h.name.get_ref()))
                .collect();
            let stranded = if hosts.is_empty() {
                String::new()
            } else {
                format!(" and its hosts {}", hosts.join(", "))
            };
            let msg = format!(
                "switch `{}`{stranded} cannot be reached: no path of trunks joins it to `{}`; \
                 add a [[trunk]] between it and a switch of the rest",
                switch(*s),
                switch(0)
            );
            let span = raw.switches.get(usize::from(*s)).map(|e| e.name.span());
            (span, "switch.name", msg)
        }
        // Not produced for a file (names are resolved first; shapes are generated).
        other => (None, "-", other.to_string()),
    }
}
