//! The cluster configuration: `ClusterConfig::parse` never panics, and what it accepts
//! renders back to TOML that parses to the same value.

use super::*;

/// A TOML string literal (escaped by the `toml` crate itself).
fn toml_str(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

/// Canonical TOML for an accepted configuration.
pub fn render_config(c: &ClusterConfig) -> String {
    use std::fmt::Write;
    let mut t = String::new();
    if let Some(map) = &c.map_file {
        let _ = writeln!(t, "map = {}\n", toml_str(&map.display().to_string()));
    }
    let kind = match c.transport.kind {
        TransportKind::Udp => "udp",
        TransportKind::Quic => "quic",
    };
    let _ = writeln!(t, "[transport]\nkind = {}", toml_str(kind));
    let _ = writeln!(t, "tag = {}", toml_str(&format!("{:#x}", c.transport.tag)));
    for (key, path) in [("ca", &c.transport.ca), ("certs", &c.transport.certs)] {
        if let Some(p) = path {
            let _ = writeln!(t, "{key} = {}", toml_str(&p.display().to_string()));
        }
    }
    t.push('\n');
    let _ = writeln!(
        t,
        "[timing]\ntoken-timeout-us = {}\nepoch-pulses = {}\nidle-pace-us = {}\n",
        c.timing.token_timeout_us, c.timing.epoch_pulses, c.timing.idle_pace_us
    );
    let l = &c.limits;
    let _ = writeln!(
        t,
        "[limits]\nchannels = {}\nisochron-messages-max = {}\npulses-ahead-max = {}\n\
         queue-packets-max = {}\nisochron-open-us-max = {}\n",
        l.channels,
        l.isochron_messages_max,
        l.pulses_ahead_max,
        l.queue_packets_max,
        l.isochron_open_us_max
    );
    for (i, s) in c.switch_names.iter().enumerate() {
        let _ = writeln!(t, "[[switch]]\nname = {}", toml_str(s));
        if let Some(a) = c.switch_listen.get(i).copied().flatten() {
            let _ = writeln!(t, "listen = {}", toml_str(&a.to_string()));
        }
        if let Some(a) = c.switch_admin.get(i).copied().flatten() {
            let _ = writeln!(t, "admin = {}", toml_str(&a.to_string()));
        }
    }
    for (h, name) in c.host_names.iter().enumerate() {
        let sw = &c.switch_names[usize::from(c.topology.switch_of(h as u16))];
        let _ = writeln!(
            t,
            "[[host]]\nname = {}\nswitch = {}",
            toml_str(name),
            toml_str(sw)
        );
        if let Some(a) = c.host_siu.get(h).copied().flatten() {
            let _ = writeln!(t, "siu = {}", toml_str(&a.to_string()));
        }
        if let Some(a) = c.host_app.get(h).copied().flatten() {
            let _ = writeln!(t, "app = {}", toml_str(&a.to_string()));
        }
        if let Some(a) = c.host_admin.get(h).copied().flatten() {
            let _ = writeln!(t, "admin = {}", toml_str(&a.to_string()));
        }
    }
    for &(a, b) in c.topology.trunks() {
        let (a, b) = (
            &c.switch_names[usize::from(a)],
            &c.switch_names[usize::from(b)],
        );
        let _ = writeln!(t, "[[trunk]]\nbetween = [{}, {}]", toml_str(a), toml_str(b));
    }
    t
}

/// Fuzzes `ClusterConfig::parse` (see the module documentation).
pub fn check_cluster_config(text: &str) {
    match ClusterConfig::parse(text, "fuzz.toml") {
        Ok(c) => {
            assert_eq!(c.switch_names.len(), c.topology.switch_count());
            assert_eq!(c.host_names.len(), c.topology.host_count());
            assert!(c.timing.token_timeout_us >= 1 && c.timing.epoch_pulses >= 2);
            assert!(c.limits.channels >= 1);
            // What the loader accepts, the in-memory check accepts too.
            if let Err((key, why)) = check_bounds(&c.timing, &c.limits, &c.topology) {
                panic!("accepted a config check_bounds refuses: {key} = {why}");
            }
            // Routes and distances exist between every pair of hosts.
            let hosts = c.topology.host_count().min(64) as u16;
            for a in 0..hosts {
                for b in 0..hosts {
                    assert!(c.topology.distance(a, b) >= 1);
                    let _ = c.topology.next_hop(c.topology.switch_of(a), b);
                }
            }
            let _ = c.topology.max_distance();
            let canonical = render_config(&c);
            match ClusterConfig::parse(&canonical, "canonical.toml") {
                Ok(again) => {
                    assert_eq!(again, c, "canonical form parses differently:\n{canonical}")
                }
                Err(e) => panic!("canonical form refused: {e}\n{canonical}"),
            }
        }
        Err(e) => {
            assert_eq!(e.file, "fuzz.toml");
            assert!(e.line >= 1 && e.column >= 1, "{e}");
            assert!(!e.key.is_empty(), "{e}");
        }
    }
}
