//! `isotach check-config FILE [--map MAPFILE] [--json]`: validate a cluster config, its QUIC
//! certificates and its shared-memory map without starting anything.

use crate::UsageError;
use clap::Args;
use isotach_am::backend::quic::{QuicIdentity, identity_from_pem};
use isotach_proto::config::{ClusterConfig, ConfigError, ConfigWarning, TransportKind};
use isotach_smm::map::MemoryMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Validate a cluster config (its QUIC certificates, and its shared-memory map file) and print
/// a summary. Any error is printed as one line naming the file, the line and the key, and
/// exits 2. Warnings (an address that would listen on every interface) go to stderr, one line
/// each, and do not change the exit code.
#[derive(Debug, Args)]
pub(crate) struct CheckConfigArgs {
    /// The cluster config (TOML).
    #[arg(value_name = "FILE")]
    file: PathBuf,
    /// The shared-memory map file; overrides the config's `map` key.
    #[arg(long, value_name = "MAPFILE")]
    map: Option<PathBuf>,
    /// Print one JSON object instead of the summary.
    #[arg(long)]
    json: bool,
}

/// What a map file holds.
#[derive(Debug, serde::Serialize)]
struct MapSummary {
    file: String,
    ranges: usize,
    pages: u64,
}

/// A warning as `--json` prints it.
#[derive(Debug, serde::Serialize)]
struct Warning {
    file: String,
    line: usize,
    column: usize,
    key: String,
    node: String,
    addr: String,
    message: String,
}

impl From<ConfigWarning> for Warning {
    fn from(w: ConfigWarning) -> Self {
        Self {
            file: w.file,
            line: w.line,
            column: w.column,
            key: w.key,
            node: w.node,
            addr: w.addr.to_string(),
            message: w.message,
        }
    }
}

/// The summary `--json` prints.
#[derive(Debug, serde::Serialize)]
struct Summary {
    file: String,
    switches: usize,
    hosts: usize,
    trunks: usize,
    max_logical_distance: u16,
    epoch_pulses: u32,
    pulses_ahead_max: u32,
    token_timeout_us: u64,
    idle_pace_us: u64,
    switch_names: Vec<String>,
    host_names: Vec<String>,
    transport: &'static str,
    tag: String,
    /// `[transport] spin-us`: how long a wait polls before it sleeps while traffic flows.
    spin_us: u64,
    certificates_checked: usize,
    map: Option<MapSummary>,
    warnings: Vec<Warning>,
}

pub(crate) fn run(args: CheckConfigArgs) -> anyhow::Result<ExitCode> {
    let summary = check(&args.file, args.map.as_deref())?;
    for w in &summary.warnings {
        eprintln!(
            "warning: {}:{}:{}: {}: {}",
            w.file, w.line, w.column, w.key, w.message
        );
    }
    if args.json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        print_summary(&summary);
    }
    Ok(ExitCode::SUCCESS)
}

/// Loads and validates the config and the map (from `map`, else the config's `map` key).
fn check(file: &Path, map: Option<&Path>) -> Result<Summary, UsageError> {
    let (config, warnings) =
        ClusterConfig::load_checked(file).map_err(|e| UsageError(locate(e, file).to_string()))?;
    let map_path = map
        .map(Path::to_path_buf)
        .or_else(|| config.map_file.clone());
    let map = match map_path {
        None => None,
        Some(path) => Some(check_map(&path, &config)?),
    };
    // Every node's certificate chains to the CA, as the daemons will check at startup.
    let mut certificates_checked = 0;
    if config.transport.kind == TransportKind::Quic {
        for name in config.switch_names.iter().chain(&config.host_names) {
            node_identity(&config, file, name).map_err(|e| UsageError(e.to_string()))?;
            certificates_checked += 1;
        }
    }
    let topology = &config.topology;
    Ok(Summary {
        file: file.display().to_string(),
        switches: topology.switch_count(),
        hosts: topology.host_count(),
        trunks: topology.trunks().len(),
        max_logical_distance: topology.max_distance(),
        epoch_pulses: config.timing.epoch_pulses,
        pulses_ahead_max: config.limits.pulses_ahead_max,
        token_timeout_us: config.timing.token_timeout_us,
        idle_pace_us: config.timing.idle_pace_us,
        switch_names: config.switch_names,
        host_names: config.host_names,
        transport: match config.transport.kind {
            TransportKind::Quic => "quic",
            TransportKind::Udp => "udp",
        },
        spin_us: config.transport.spin_us,
        tag: format!("{:#018x}", config.transport.tag),
        certificates_checked,
        map,
        warnings: warnings.into_iter().map(Warning::from).collect(),
    })
}

/// The QUIC identity node `name` (a switch or host of `config`, read from `file`) presents:
/// `[transport] ca` plus `CERTS/NAME.pem` and `CERTS/NAME.key`, read and checked with
/// [`identity_from_pem`] (signed by the CA, valid now, the `isotach-node` SAN). Errors name
/// the config file, the line and the key (`transport.ca` or `transport.certs`).
pub(crate) fn node_identity(
    config: &ClusterConfig,
    file: &Path,
    name: &str,
) -> Result<QuicIdentity, ConfigError> {
    let err = |key: &str, message: String| {
        let e = ConfigError {
            file: file.display().to_string(),
            line: 1,
            column: 1,
            key: key.to_string(),
            message,
        };
        locate(e, file)
    };
    let files = config
        .quic_files(name)
        .map_err(|(key, msg)| err(key, msg))?;
    let read = |path: &Path, key: &str, what: &str| {
        std::fs::read(path).map_err(|e| {
            let hint = if key == "transport.certs" {
                format!(" (make it with `isotach cert issue --dir DIR --node {name}`)")
            } else {
                " (make it with `isotach cert init --dir DIR`)".to_string()
            };
            err(
                key,
                format!("{}: cannot read {what}{hint}: {e}", path.display()),
            )
        })
    };
    let ca = read(&files.ca, "transport.ca", "the cluster CA certificate")?;
    let cert = read(
        &files.cert,
        "transport.certs",
        &format!("the certificate of `{name}`"),
    )?;
    let key = read(
        &files.key,
        "transport.certs",
        &format!("the key of `{name}`"),
    )?;
    identity_from_pem(&ca, &cert, &key).map_err(|e| {
        let e = e.to_string();
        if e.contains("CA certificate") {
            err("transport.ca", format!("{}: {e}", files.ca.display()))
        } else {
            let at = if e.contains("node key") {
                &files.key
            } else {
                &files.cert
            };
            err(
                "transport.certs",
                format!("{}: {e} (CA {})", at.display(), files.ca.display()),
            )
        }
    })
}

/// Value checks report line 1 column 1 (the value has no span): point at the key's line
/// instead when the key is written in the file.
pub(crate) fn locate(mut e: ConfigError, file: &Path) -> ConfigError {
    if (e.line, e.column) != (1, 1) || e.key == "-" {
        return e;
    }
    let Ok(text) = std::fs::read_to_string(file) else {
        return e;
    };
    if let Some((line, column)) = key_position(&text, &e.key) {
        (e.line, e.column) = (line, column);
    }
    e
}

/// 1-based line and column of `key` (`table.key`, `table` or a top-level `key`) in TOML
/// text: the key's assignment inside its table, else the table header.
fn key_position(text: &str, key: &str) -> Option<(usize, usize)> {
    let (table, name) = match key.split_once('.') {
        Some((t, n)) => (Some(t), Some(n)),
        None if text.lines().any(|l| l.trim() == format!("[{key}]")) => (Some(key), None),
        None => (None, Some(key)),
    };
    let mut current: Option<&str> = None;
    let mut header = None;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let column = line.len() - trimmed.len() + 1;
        if let Some(rest) = trimmed.strip_prefix('[') {
            let t = rest
                .trim_start_matches('[')
                .split(']')
                .next()
                .unwrap_or("")
                .trim();
            current = Some(t);
            if Some(t) == table && header.is_none() {
                header = Some((i + 1, column));
            }
            continue;
        }
        let assigned = trimmed.split('=').next().map(str::trim);
        if current == table && name.is_some() && assigned == name && trimmed.contains('=') {
            return Some((i + 1, column));
        }
    }
    header
}

fn check_map(path: &Path, config: &ClusterConfig) -> Result<MapSummary, UsageError> {
    let file = path.display().to_string();
    let map = MemoryMap::load(path, &config.host_names).map_err(|e| UsageError(e.to_string()))?;
    map.check_hosts(&config.topology)
        .map_err(|e| UsageError(format!("{file}: {e}")))?;
    let (mut ranges, mut pages) = (0, 0u64);
    for (first, last, _) in map.ranges() {
        ranges += 1;
        pages += u64::from(last - first) + 1;
    }
    Ok(MapSummary {
        file,
        ranges,
        pages,
    })
}

fn print_summary(s: &Summary) {
    println!("{}: ok", s.file);
    println!(
        "  switches:             {} ({})",
        s.switches,
        s.switch_names.join(", ")
    );
    println!(
        "  hosts:                {} ({})",
        s.hosts,
        s.host_names.join(", ")
    );
    println!("  trunks:               {}", s.trunks);
    println!("  max logical distance: {}", s.max_logical_distance);
    println!("  epoch:                {} pulses", s.epoch_pulses);
    println!(
        "  window:               {} pulses (how far ahead a message may be stamped)",
        s.pulses_ahead_max
    );
    println!("  token timeout:        {} us", s.token_timeout_us);
    if s.idle_pace_us == 0 {
        println!("  idle pace:            off (waves at full speed always)");
    } else {
        println!("  idle pace:            {} us", s.idle_pace_us);
    }
    match s.transport {
        "quic" => println!(
            "  transport:            quic (mutual TLS), tag {}; {} node certificates ok",
            s.tag, s.certificates_checked
        ),
        _ => println!(
            "  transport:            udp (no authentication: trusted LAN only), tag {}",
            s.tag
        ),
    }
    if s.spin_us == 0 {
        println!("  spin:                 off (every wait sleeps at once)");
    } else {
        println!(
            "  spin:                 {} us (while traffic flows, before a wait sleeps)",
            s.spin_us
        );
    }
    match &s.map {
        Some(m) => println!(
            "  map:                  {}: ok, {} ranges, {} pages",
            m.file, m.ranges, m.pages
        ),
        None => println!("  map:                  none"),
    }
}
