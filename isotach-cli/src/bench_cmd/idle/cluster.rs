//! The daemons of one `bench idle` phase: loopback ports, the generated cluster config (and
//! its QUIC certificates, made by `isotach cert`), the TM and SIU processes, host 0's identity.

use super::IdleTransport;
use crate::cluster_io::{Link, load};
use anyhow::Context;
use isotach_proto::config::Timing;
use std::fmt::Write as _;
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// The daemon processes of one phase; killed when dropped.
pub(super) struct Cluster {
    pub(super) dir: PathBuf,
    /// `tm0` first, then the SIUs by host.
    pub(super) children: Vec<(String, Child)>,
    pub(super) metrics: SocketAddr,
    pub(super) siu0: SocketAddr,
    pub(super) app0: SocketAddr,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for (_, c) in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Loopback ports the kernel hands out, held until every one is chosen (so no two are the
/// same) and free again when this returns (unless something else takes one first).
pub(super) struct Ports {
    udp: Vec<UdpSocket>,
    tcp: Vec<TcpListener>,
}

impl Ports {
    fn udp(&mut self) -> anyhow::Result<SocketAddr> {
        let s = UdpSocket::bind("127.0.0.1:0")?;
        let a = s.local_addr()?;
        self.udp.push(s);
        Ok(a)
    }

    fn tcp(&mut self) -> anyhow::Result<SocketAddr> {
        let s = TcpListener::bind("127.0.0.1:0")?;
        let a = s.local_addr()?;
        self.tcp.push(s);
        Ok(a)
    }
}

/// The token timeout of a cluster paced at `idle_pace_us`: the default, or twice the pace when
/// that is longer (a pace may be at most half the timeout).
pub(super) fn token_timeout_for(idle_pace_us: u64) -> u64 {
    Timing::default()
        .token_timeout_us
        .max(idle_pace_us.saturating_mul(2))
}

/// The generated config, in the phase's directory.
const CONFIG_FILE: &str = "cluster.toml";
/// Where the generated config's QUIC certificates are, relative to it.
pub(super) const PKI_DIR: &str = "pki";

/// The cluster config: `transport` (QUIC certificates in [`PKI_DIR`]), one switch `tm0`,
/// hosts `h0`.. with SIU and application addresses, `[timing] idle-pace-us`.
pub(super) fn config_text(
    transport: IdleTransport,
    tm: SocketAddr,
    hosts: &[(SocketAddr, SocketAddr)],
    idle_pace_us: u64,
) -> String {
    let transport = match transport {
        IdleTransport::Udp => "kind = \"udp\"".to_string(),
        IdleTransport::Quic => {
            format!("kind = \"quic\"\nca = \"{PKI_DIR}/ca.pem\"\ncerts = \"{PKI_DIR}\"")
        }
    };
    let token_timeout_us = token_timeout_for(idle_pace_us);
    let mut t = format!(
        "[transport]\n{transport}\n\n[timing]\nidle-pace-us = {idle_pace_us}\n\
         token-timeout-us = {token_timeout_us}\n\n\
         [[switch]]\nname = \"tm0\"\nlisten = \"{tm}\"\n"
    );
    for (h, (siu, app)) in hosts.iter().enumerate() {
        let _ = write!(
            t,
            "\n[[host]]\nname = \"h{h}\"\nswitch = \"tm0\"\nsiu = \"{siu}\"\napp = \"{app}\"\n"
        );
    }
    t
}

/// Starts `isotach ARGS` with its output in `DIR/LABEL.log`.
pub(super) fn spawn(dir: &Path, label: &str, args: &[&str]) -> anyhow::Result<(String, Child)> {
    let exe = std::env::current_exe().context("locating this executable")?;
    let log = std::fs::File::create(dir.join(format!("{label}.log")))?;
    let child = Command::new(exe)
        .args(args)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {label}"))?;
    Ok((label.to_string(), child))
}

/// Runs `isotach ARGS` to its end (output in `DIR/LABEL.log`); an error unless it succeeded.
pub(super) fn run_to_end(dir: &Path, label: &str, args: &[&str]) -> anyhow::Result<()> {
    let (_, mut child) = spawn(dir, label, args)?;
    let status = child
        .wait()
        .with_context(|| format!("waiting for {label}"))?;
    anyhow::ensure!(status.success(), "{label}: {status} (see its log)");
    Ok(())
}

/// The cluster CA and a certificate for `tm0` and each host in `DIR/`[`PKI_DIR`], made by
/// `isotach cert` as a user would.
pub(super) fn make_certs(dir: &Path, hosts: usize) -> anyhow::Result<()> {
    let pki = dir.join(PKI_DIR);
    let pki = pki.to_str().context("temporary path is not UTF-8")?;
    run_to_end(dir, "cert-init", &["cert", "init", "--dir", pki])?;
    let nodes = std::iter::once("tm0".to_string()).chain((0..hosts).map(|h| format!("h{h}")));
    for node in nodes {
        run_to_end(
            dir,
            &format!("cert-{node}"),
            &["cert", "issue", "--dir", pki, "--node", &node],
        )?;
    }
    Ok(())
}

/// Writes the config (and certificates) and starts the TM and every SIU as processes.
pub(super) fn start_cluster(
    transport: IdleTransport,
    hosts: usize,
    idle_pace_us: u64,
    phase: &str,
) -> anyhow::Result<Cluster> {
    let dir =
        std::env::temp_dir().join(format!("isotach-bench-idle-{}-{phase}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut ports = Ports {
        udp: Vec::new(),
        tcp: Vec::new(),
    };
    let tm = ports.udp()?;
    let metrics = ports.tcp()?;
    let addrs = (0..hosts)
        .map(|_| Ok((ports.udp()?, ports.udp()?)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    drop(ports);
    let cfg = dir.join(CONFIG_FILE);
    std::fs::write(&cfg, config_text(transport, tm, &addrs, idle_pace_us))?;
    if transport == IdleTransport::Quic {
        make_certs(&dir, hosts)?;
    }
    let cfg = cfg
        .to_str()
        .context("temporary path is not UTF-8")?
        .to_string();
    let mut cluster = Cluster {
        dir: dir.clone(),
        children: Vec::new(),
        metrics,
        siu0: addrs[0].0,
        app0: addrs[0].1,
    };
    let metrics = metrics.to_string();
    cluster.children.push(spawn(
        &dir,
        "tm0",
        &[
            "tm",
            "--config",
            &cfg,
            "--name",
            "tm0",
            "--no-admin",
            "--metrics",
            &metrics,
        ],
    )?);
    for h in 0..hosts {
        let host = format!("h{h}");
        cluster.children.push(spawn(
            &dir,
            &format!("siu-{host}"),
            &["siu", "--config", &cfg, "--host", &host, "--no-admin"],
        )?);
    }
    Ok(cluster)
}

/// Host 0's link as the config says — read the way `isotach philo` reads it (for QUIC, the
/// certificates [`make_certs`] made, checked).
pub(super) fn host0_link(c: &Cluster) -> anyhow::Result<Link> {
    let cfg = c.dir.join(CONFIG_FILE);
    Ok(Link::of(&load(&cfg)?, &cfg, "h0")?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generated_config_parses_with_its_pace() {
        let a = |p: u16| SocketAddr::from(([127, 0, 0, 1], p));
        for transport in [IdleTransport::Udp, IdleTransport::Quic] {
            let text = config_text(transport, a(1), &[(a(2), a(3)), (a(4), a(5))], 1000);
            let c = isotach_proto::config::ClusterConfig::parse(&text, "idle.toml").unwrap();
            assert_eq!(c.timing.idle_pace_us, 1000);
            assert_eq!(c.host_id("h1"), Some(1));
            assert_eq!(c.host_app[0], Some(a(3)));
            let quic = matches!(c.transport.kind, isotach_proto::config::TransportKind::Quic);
            assert_eq!(quic, transport == IdleTransport::Quic, "{text}");
        }
        // A pace over half the default token timer gets a timer twice as long, so it parses.
        let text = config_text(IdleTransport::Udp, a(1), &[(a(2), a(3))], 20_000);
        let c = isotach_proto::config::ClusterConfig::parse(&text, "idle.toml").unwrap();
        assert_eq!(
            (c.timing.idle_pace_us, c.timing.token_timeout_us),
            (20_000, 40_000)
        );
    }
}
