//! `isotach cert init|issue|show`: the cluster certificate authority and node certificates
//! that QUIC links authenticate with (mutual TLS, see `isotach_am::backend::quic`).
//!
//! Files in `--dir`: `ca.pem` and `ca.key` (the CA), `NAME.pem` and `NAME.key` per node. Every
//! key is PKCS#8 PEM written with mode 0600; certificates are PEM. A node certificate carries
//! the SANs `isotach-node` (the TLS server name every node presents), the node name and any
//! `--san` given; it is valid for both TLS server and client authentication.

use crate::UsageError;
use clap::{Args, Subcommand};
use isotach_am::backend::quic::{SERVER_NAME, identity_from_pem};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;
use x509_parser::extensions::GeneralName;
use x509_parser::time::ASN1Time;

/// CA certificate file in `--dir`.
const CA_CERT: &str = "ca.pem";
/// CA private key file in `--dir`.
const CA_KEY: &str = "ca.key";
/// Certificates are valid from this long before they are made (clock skew between hosts).
const BACKDATE: Duration = Duration::from_secs(3600);
const DAY: u64 = 86_400;

/// Make the cluster CA, issue node certificates, show a certificate.
#[derive(Debug, Args)]
pub(crate) struct CertArgs {
    #[command(subcommand)]
    command: CertCommand,
}

#[derive(Debug, Subcommand)]
enum CertCommand {
    /// Make a cluster CA: DIR/ca.pem (certificate) and DIR/ca.key (private key, mode 0600).
    Init(InitArgs),
    /// Issue a node certificate signed by the CA in DIR: DIR/NODE.pem and DIR/NODE.key (0600).
    Issue(IssueArgs),
    /// Print a certificate's subject, issuer, validity and SANs.
    Show(ShowArgs),
}

#[derive(Debug, Args)]
struct InitArgs {
    /// Directory for the CA files (created if missing, mode 0700).
    #[arg(long, value_name = "DIR")]
    dir: PathBuf,
    /// Cluster name, in the CA's common name.
    #[arg(long, value_name = "CLUSTER", default_value = "isotach")]
    name: String,
    /// Days the CA certificate is valid.
    #[arg(long, default_value_t = 3650, value_parser = clap::value_parser!(u32).range(1..=36500))]
    days: u32,
    /// Overwrite existing files.
    #[arg(long)]
    force: bool,
}

#[derive(Debug, Args)]
struct IssueArgs {
    /// Directory holding ca.pem and ca.key; the node's files are written there.
    #[arg(long, value_name = "DIR")]
    dir: PathBuf,
    /// Node name (a switch or host name from the cluster config): letters, digits, `-`,
    /// `_` and `.`.
    #[arg(long, value_name = "NAME")]
    node: String,
    /// Extra subject alternative names: IP addresses or DNS names (repeatable).
    #[arg(long = "san", value_name = "ADDR", num_args = 1..)]
    sans: Vec<String>,
    /// Days the certificate is valid.
    #[arg(long, default_value_t = 825, value_parser = clap::value_parser!(u32).range(1..=36500))]
    days: u32,
    /// Overwrite existing files.
    #[arg(long)]
    force: bool,
}

#[derive(Debug, Args)]
struct ShowArgs {
    /// A PEM certificate file.
    #[arg(value_name = "FILE")]
    file: PathBuf,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(args: CertArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        CertCommand::Init(a) => init(&a),
        CertCommand::Issue(a) => issue(&a),
        CertCommand::Show(a) => show(&a),
    }?;
    Ok(ExitCode::SUCCESS)
}

fn usage(msg: impl Into<String>) -> anyhow::Error {
    UsageError(msg.into()).into()
}

/// `not_before` and `not_after` for a certificate valid `days` from now.
fn validity(params: &mut CertificateParams, days: u32) {
    let now = ASN1Time::now().to_datetime();
    params.not_before = now - BACKDATE;
    params.not_after = now + Duration::from_secs(u64::from(days) * DAY);
}

fn init(a: &InitArgs) -> anyhow::Result<()> {
    if a.name.trim().is_empty() {
        return Err(usage("--name must not be empty"));
    }
    let (cert_path, key_path) = (a.dir.join(CA_CERT), a.dir.join(CA_KEY));
    make_dir(&a.dir)?;
    refuse_overwrite(&[&cert_path, &key_path], a.force)?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(DnType::CommonName, format!("{} cluster CA", a.name));
    params
        .distinguished_name
        .push(DnType::OrganizationName, "isotach");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    validity(&mut params, a.days);
    let key = KeyPair::generate()?;
    let cert = params.self_signed(&key)?;
    write_file(&key_path, key.serialize_pem().as_bytes(), 0o600, a.force)?;
    write_file(&cert_path, cert.pem().as_bytes(), 0o644, a.force)?;
    println!("wrote {} and {}", cert_path.display(), key_path.display());
    Ok(())
}

fn issue(a: &IssueArgs) -> anyhow::Result<()> {
    check_node_name(&a.node)?;
    let (ca_cert_path, ca_key_path) = (a.dir.join(CA_CERT), a.dir.join(CA_KEY));
    let ca_cert_pem = read_text(&ca_cert_path)?;
    let ca_key_pem = read_text(&ca_key_path)?;
    let ca_key = KeyPair::from_pem(&ca_key_pem)
        .map_err(|e| usage(format!("{}: not a private key: {e}", ca_key_path.display())))?;
    let issuer = Issuer::from_ca_cert_pem(&ca_cert_pem, ca_key).map_err(|e| {
        usage(format!(
            "{}: not a CA certificate: {e}",
            ca_cert_path.display()
        ))
    })?;
    let mut sans = vec![SERVER_NAME.to_string(), a.node.clone()];
    for s in &a.sans {
        if s.is_empty() || !s.is_ascii() || s.contains(char::is_whitespace) {
            return Err(usage(format!(
                "--san `{s}` is not an IP address or DNS name"
            )));
        }
        if !sans.contains(s) {
            sans.push(s.clone());
        }
    }
    let cert_path = a.dir.join(format!("{}.pem", a.node));
    let key_path = a.dir.join(format!("{}.key", a.node));
    refuse_overwrite(&[&cert_path, &key_path], a.force)?;
    let mut params = CertificateParams::new(sans)
        .map_err(|e| usage(format!("bad subject alternative name: {e}")))?;
    params
        .distinguished_name
        .push(DnType::CommonName, a.node.as_str());
    params
        .distinguished_name
        .push(DnType::OrganizationName, "isotach");
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params.use_authority_key_identifier_extension = true;
    validity(&mut params, a.days);
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    let (cert_pem, key_pem) = (cert.pem(), key.serialize_pem());
    // What every peer will check: the certificate chains to the CA and names SERVER_NAME.
    identity_from_pem(
        ca_cert_pem.as_bytes(),
        cert_pem.as_bytes(),
        key_pem.as_bytes(),
    )
    .map_err(|e| usage(format!("{}: {e}", ca_cert_path.display())))?;
    write_file(&key_path, key_pem.as_bytes(), 0o600, a.force)?;
    write_file(&cert_path, cert_pem.as_bytes(), 0o644, a.force)?;
    println!("wrote {} and {}", cert_path.display(), key_path.display());
    Ok(())
}

/// What `cert show --json` prints.
#[derive(Debug, serde::Serialize)]
struct CertSummary {
    file: String,
    subject: String,
    issuer: String,
    serial: String,
    not_before: String,
    not_after: String,
    not_before_unix_s: i64,
    not_after_unix_s: i64,
    valid_now: bool,
    is_ca: bool,
    sans: Vec<String>,
}

fn show(a: &ShowArgs) -> anyhow::Result<()> {
    let file = a.file.display().to_string();
    let bytes = std::fs::read(&a.file).map_err(|e| usage(format!("{file}: cannot read: {e}")))?;
    let (_, pem) = x509_parser::pem::parse_x509_pem(&bytes)
        .map_err(|e| usage(format!("{file}: not a PEM file: {e}")))?;
    if pem.label != "CERTIFICATE" {
        return Err(usage(format!(
            "{file}: holds a {}, not a CERTIFICATE",
            pem.label
        )));
    }
    let cert = pem
        .parse_x509()
        .map_err(|e| usage(format!("{file}: not an X.509 certificate: {e}")))?;
    let sans = match cert.subject_alternative_name() {
        Ok(Some(ext)) => ext.value.general_names.iter().map(general_name).collect(),
        Ok(None) => Vec::new(),
        Err(e) => return Err(usage(format!("{file}: bad SAN extension: {e}"))),
    };
    let v = cert.validity();
    let s = CertSummary {
        file,
        subject: cert.subject().to_string(),
        issuer: cert.issuer().to_string(),
        serial: cert.raw_serial_as_string(),
        not_before: v.not_before.to_string(),
        not_after: v.not_after.to_string(),
        not_before_unix_s: v.not_before.timestamp(),
        not_after_unix_s: v.not_after.timestamp(),
        valid_now: v.is_valid(),
        is_ca: cert.is_ca(),
        sans,
    };
    if a.json {
        println!("{}", serde_json::to_string(&s)?);
        return Ok(());
    }
    println!("{}", s.file);
    println!("  subject:    {}", s.subject);
    println!("  issuer:     {}", s.issuer);
    println!("  serial:     {}", s.serial);
    let state = if s.valid_now {
        "valid now"
    } else {
        "NOT valid now"
    };
    println!("  not before: {}", s.not_before);
    println!("  not after:  {} ({state})", s.not_after);
    println!("  ca:         {}", if s.is_ca { "yes" } else { "no" });
    let sans = if s.sans.is_empty() {
        "none".to_string()
    } else {
        s.sans.join(", ")
    };
    println!("  sans:       {sans}");
    Ok(())
}

fn general_name(n: &GeneralName<'_>) -> String {
    match n {
        GeneralName::DNSName(d) => format!("DNS:{d}"),
        GeneralName::IPAddress(b) => match b.len() {
            4 => format!(
                "IP:{}",
                std::net::Ipv4Addr::from(<[u8; 4]>::try_from(*b).unwrap_or_default())
            ),
            16 => format!(
                "IP:{}",
                std::net::Ipv6Addr::from(<[u8; 16]>::try_from(*b).unwrap_or_default())
            ),
            _ => format!("IP:{b:02x?}"),
        },
        other => other.to_string(),
    }
}

fn check_node_name(name: &str) -> anyhow::Result<()> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.chars().all(ok_char)
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name != "ca";
    if ok {
        Ok(())
    } else {
        Err(usage(format!(
            "--node `{name}`: a node name is 1 to 63 letters, digits, `-`, `_` or `.`, \
             starts with a letter or digit and is not `ca`"
        )))
    }
}

fn read_text(path: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path).map_err(|e| {
        usage(format!(
            "{}: cannot read: {e} (run `isotach cert init --dir {}` first)",
            path.display(),
            path.parent().unwrap_or(Path::new(".")).display()
        ))
    })
}

fn make_dir(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    if dir.is_dir() {
        return Ok(());
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| usage(format!("{}: cannot create: {e}", dir.display())))
}

fn refuse_overwrite(paths: &[&Path], force: bool) -> anyhow::Result<()> {
    if force {
        return Ok(());
    }
    if let Some(p) = paths.iter().find(|p| p.exists()) {
        return Err(usage(format!(
            "{}: exists; refusing to overwrite it (use --force)",
            p.display()
        )));
    }
    Ok(())
}

/// Writes a new file with `mode` (an existing one is replaced only with `force`, and then
/// gets `mode` too).
fn write_file(path: &Path, bytes: &[u8], mode: u32, force: bool) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let fail = |e: std::io::Error| usage(format!("{}: cannot write: {e}", path.display()));
    if force {
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(fail(e)),
            _ => {}
        }
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(fail)?;
    f.write_all(bytes).map_err(fail)?;
    f.sync_all().map_err(fail)?;
    Ok(())
}
