//! Every file under `deploy/` parses and has the structure its tool expects, so none rots
//! silently: cluster configs load with the daemons' own loader (also the one embedded in the
//! Kubernetes ConfigMap), YAML files parse (compose and Kubernetes structure checked and
//! cross-checked against their configs), systemd units have their sections, command line and
//! hardening, the Dockerfile builds in one stage and runs `isotach` from another, and the netns
//! script is valid shell. A file under `deploy/` that no check knows fails the walk.

use isotach_proto::config::{ClusterConfig, TransportKind};
use serde_norway::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        // Certificates made by `isotach cert` next to a config (as the example's header
        // says) are secrets of one deployment, never part of the repository.
        if p.is_dir() && p.file_name().is_some_and(|n| n == "pki") {
            continue;
        }
        if p.is_dir() {
            walk(&p, out);
        } else {
            out.push(p);
        }
    }
}

fn all_files() -> Vec<PathBuf> {
    let mut v = Vec::new();
    walk(&deploy(), &mut v);
    v
}

fn rel(p: &Path) -> String {
    p.strip_prefix(deploy()).unwrap().display().to_string()
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn with_ext<'a>(files: &'a [PathBuf], exts: &[&str]) -> Vec<&'a PathBuf> {
    files
        .iter()
        .filter(|p| p.extension().is_some_and(|e| exts.iter().any(|x| e == *x)))
        .collect()
}

/// Every document of a YAML file, with `<<` merge keys applied.
fn yaml_docs(p: &Path) -> Vec<Value> {
    let text = read(p);
    serde_norway::Deserializer::from_str(&text)
        .map(|d| {
            let mut v = <Value as serde::Deserialize>::deserialize(d)
                .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            v.apply_merge()
                .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            v
        })
        .filter(|v| !v.is_null())
        .collect()
}

fn strs(v: &Value) -> Vec<String> {
    v.as_sequence()
        .map(|s| {
            s.iter()
                .map(|x| x.as_str().unwrap_or_default().to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// The value following `flag` in an argument list.
fn flag(args: &[String], flag: &str) -> Option<String> {
    let i = args.iter().position(|a| a == flag)?;
    args.get(i + 1).cloned()
}

#[test]
fn every_deploy_file_is_covered_by_a_check() {
    let known_ext = ["toml", "yaml", "yml", "service", "sh", "md", "dockerignore"];
    for p in all_files() {
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        let known = name == "Dockerfile"
            || p.extension()
                .is_some_and(|e| known_ext.iter().any(|x| e == *x));
        assert!(
            known,
            "deploy/{}: no test checks this kind of file (add one to isotach-cli/tests/deploy_files.rs)",
            rel(&p)
        );
    }
}

#[test]
fn every_cluster_config_loads() {
    let files = all_files();
    let tomls = with_ext(&files, &["toml"]);
    assert!(tomls.len() >= 2, "expected the example and compose configs");
    for p in tomls {
        let c = ClusterConfig::load(p).unwrap_or_else(|e| panic!("{e}"));
        assert!(c.topology.host_count() >= 2, "deploy/{}", rel(p));
        // Deploy configs are for the daemons: every address they need is given.
        assert!(
            c.switch_listen.iter().all(Option::is_some),
            "deploy/{}",
            rel(p)
        );
        assert!(c.host_siu.iter().all(Option::is_some), "deploy/{}", rel(p));
        assert!(c.host_app.iter().all(Option::is_some), "deploy/{}", rel(p));
        // The transport is chosen explicitly; QUIC configs name their certificates.
        let text = read(p);
        assert!(
            text.lines().any(|l| l.trim_start().starts_with("kind = ")),
            "deploy/{}: say [transport] kind",
            rel(p)
        );
        if c.transport.kind == TransportKind::Quic {
            assert!(
                c.transport.ca.is_some() && c.transport.certs.is_some(),
                "deploy/{}: quic needs ca and certs",
                rel(p)
            );
        }
    }
}

#[test]
fn compose_runs_one_tm_and_three_sius_matching_its_config() {
    let dir = deploy().join("compose");
    let docs = yaml_docs(&dir.join("compose.yaml"));
    assert_eq!(docs.len(), 1);
    let services = docs[0]["services"]
        .as_mapping()
        .expect("compose.yaml: services");
    let cfg = ClusterConfig::load(&dir.join("cluster.toml")).unwrap_or_else(|e| panic!("{e}"));
    let mut roles: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, svc) in services {
        let name = name.as_str().unwrap().to_string();
        let cmd = strs(&svc["command"]);
        assert!(!cmd.is_empty(), "service {name}: no command");
        assert_eq!(
            svc["image"].as_str(),
            Some("isotach:local"),
            "service {name}"
        );
        assert_eq!(
            svc["build"]["dockerfile"].as_str(),
            Some("deploy/compose/Dockerfile"),
            "service {name}"
        );
        assert_eq!(
            flag(&cmd, "--config").as_deref(),
            Some("/etc/isotach/cluster.toml"),
            "service {name}: {cmd:?}"
        );
        let volumes = strs(&svc["volumes"]);
        assert!(
            volumes.contains(&"./cluster.toml:/etc/isotach/cluster.toml:ro".to_string()),
            "service {name}: {volumes:?}"
        );
        // The address the container gets: its own fixed IPv4, or its SIU's namespace.
        let ip = match svc["network_mode"].as_str() {
            Some(m) => {
                let owner = m
                    .strip_prefix("service:")
                    .expect("network_mode: service:NAME");
                services[owner]["networks"]["isotach"]["ipv4_address"].as_str()
            }
            None => svc["networks"]["isotach"]["ipv4_address"].as_str(),
        }
        .unwrap_or_else(|| panic!("service {name}: no fixed IPv4 address"));
        let ip: std::net::IpAddr = ip.parse().unwrap();
        let expect: Option<SocketAddr> = match cmd[0].as_str() {
            "tm" => {
                let s = cfg.switch_id(&flag(&cmd, "--name").unwrap()).unwrap();
                cfg.switch_listen[usize::from(s)]
            }
            "siu" | "philo" => {
                let h = cfg.host_id(&flag(&cmd, "--host").unwrap()).unwrap();
                let h = usize::from(h);
                if cmd[0] == "siu" {
                    cfg.host_siu[h]
                } else {
                    cfg.host_app[h]
                }
            }
            other => panic!("service {name}: unexpected command {other}"),
        };
        assert_eq!(expect.map(|a| a.ip()), Some(ip), "service {name}");
        roles.entry(cmd[0].clone()).or_default().push(name);
    }
    assert!(services.contains_key("tm"), "compose.yaml: no service `tm`");
    assert_eq!(roles["tm"], ["tm"]);
    assert_eq!(roles["siu"].len(), 3, "{roles:?}");
    assert_eq!(cfg.topology.host_count(), 3);
    // The subnet holds every fixed address.
    let subnet = docs[0]["networks"]["isotach"]["ipam"]["config"][0]["subnet"]
        .as_str()
        .expect("networks.isotach.ipam.config[0].subnet");
    assert_eq!(subnet, "172.30.77.0/24");
}

#[test]
fn kubernetes_manifests_are_well_formed_and_consistent() {
    let dir = deploy().join("k8s");
    let mut files = Vec::new();
    walk(&dir, &mut files);
    let mut kinds: BTreeMap<String, Value> = BTreeMap::new();
    let mut listed = BTreeSet::new();
    for p in with_ext(&files, &["yaml", "yml"]) {
        for doc in yaml_docs(p) {
            let file = rel(p);
            let kind = doc["kind"]
                .as_str()
                .unwrap_or_else(|| panic!("{file}: kind"));
            assert!(doc["apiVersion"].as_str().is_some(), "{file}: apiVersion");
            if kind == "Kustomization" {
                for r in strs(&doc["resources"]) {
                    assert!(dir.join(&r).is_file(), "{file}: resource {r} is missing");
                    listed.insert(r);
                }
                continue;
            }
            let name = doc["metadata"]["name"].as_str();
            assert!(name.is_some(), "{file}: metadata.name");
            if kind != "Namespace" {
                assert_eq!(
                    doc["metadata"]["namespace"].as_str(),
                    Some("isotach"),
                    "{file}"
                );
            }
            assert!(
                kinds.insert(kind.to_string(), doc.clone()).is_none(),
                "{file}: second {kind}"
            );
        }
    }
    for p in with_ext(&files, &["yaml"]) {
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        if name != "kustomization.yaml" {
            assert!(listed.contains(&name), "kustomization.yaml omits {name}");
        }
    }
    for k in [
        "Namespace",
        "ConfigMap",
        "Service",
        "StatefulSet",
        "DaemonSet",
    ] {
        assert!(kinds.contains_key(k), "deploy/k8s: no {k}");
    }
    // The ConfigMap's config loads.
    let cm = &kinds["ConfigMap"];
    let toml = cm["data"]["cluster.toml"]
        .as_str()
        .expect("ConfigMap data.cluster.toml");
    let cfg = ClusterConfig::parse(toml, "deploy/k8s/configmap.yaml:cluster.toml")
        .unwrap_or_else(|e| panic!("{e}"));
    let cm_name = cm["metadata"]["name"].as_str().unwrap();

    let sts = &kinds["StatefulSet"];
    assert_eq!(sts["spec"]["replicas"].as_u64(), Some(1));
    assert_eq!(
        sts["spec"]["serviceName"].as_str(),
        kinds["Service"]["metadata"]["name"].as_str(),
        "StatefulSet.spec.serviceName must name the Service"
    );
    let ds = &kinds["DaemonSet"];
    for (w, role) in [(sts, "tm"), (ds, "siu")] {
        let spec = &w["spec"]["template"]["spec"];
        assert_eq!(
            spec["hostNetwork"].as_bool(),
            Some(true),
            "{role}: hostNetwork"
        );
        let labels = &w["spec"]["template"]["metadata"]["labels"];
        let selector = &w["spec"]["selector"]["matchLabels"];
        for (k, v) in selector.as_mapping().expect("selector.matchLabels") {
            assert_eq!(
                &labels[k.as_str().unwrap()],
                v,
                "{role}: selector vs labels"
            );
        }
        let c = &spec["containers"][0];
        assert!(c["image"].as_str().is_some(), "{role}: image");
        let args = strs(&c["args"]);
        assert_eq!(
            args.first().map(String::as_str),
            Some(role),
            "{role}: {args:?}"
        );
        let config = flag(&args, "--config").expect("--config");
        let mount = c["volumeMounts"][0]["mountPath"].as_str().unwrap();
        assert_eq!(config, format!("{mount}/cluster.toml"), "{role}");
        assert_eq!(
            spec["volumes"][0]["configMap"]["name"].as_str(),
            Some(cm_name),
            "{role}: the config volume"
        );
        assert_eq!(
            c["securityContext"]["allowPrivilegeEscalation"].as_bool(),
            Some(false)
        );
        if role == "tm" {
            let name = flag(&args, "--name").unwrap();
            assert!(cfg.switch_id(&name).is_some(), "tm --name {name}");
        } else {
            // --host is the node name, from the downward API.
            assert_eq!(flag(&args, "--host").as_deref(), Some("$(ISOTACH_HOST)"));
            assert_eq!(
                c["env"][0]["valueFrom"]["fieldRef"]["fieldPath"].as_str(),
                Some("spec.nodeName")
            );
        }
    }
    // The Service selects the TM pods.
    let svc_sel = kinds["Service"]["spec"]["selector"].clone();
    assert_eq!(svc_sel, sts["spec"]["template"]["metadata"]["labels"]);
}

/// `[Section]` → key → values (a key may repeat).
fn unit_sections(text: &str) -> BTreeMap<String, BTreeMap<String, Vec<String>>> {
    let mut out: BTreeMap<String, BTreeMap<String, Vec<String>>> = BTreeMap::new();
    let mut section = None;
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(s) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = Some(s.to_string());
            out.entry(s.to_string()).or_default();
            continue;
        }
        let s = section
            .clone()
            .unwrap_or_else(|| panic!("line {}: key outside a section", n + 1));
        let (k, v) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("line {}: not KEY=VALUE: {line}", n + 1));
        out.entry(s)
            .or_default()
            .entry(k.trim().to_string())
            .or_default()
            .push(v.trim().to_string());
    }
    out
}

#[test]
fn systemd_units_run_isotach_hardened() {
    let dir = deploy().join("systemd");
    for role in ["tm", "siu"] {
        let p = dir.join(format!("isotach-{role}@.service"));
        let u = unit_sections(&read(&p));
        for s in ["Unit", "Service", "Install"] {
            assert!(u.contains_key(s), "{}: no [{s}]", p.display());
        }
        let svc = &u["Service"];
        let one = |k: &str| -> String {
            let v = svc
                .get(k)
                .unwrap_or_else(|| panic!("{}: no {k}=", p.display()));
            v.last().unwrap().clone()
        };
        let exec: Vec<String> = one("ExecStart")
            .split_whitespace()
            .map(str::to_string)
            .collect();
        assert!(exec[0].ends_with("/isotach"), "ExecStart: {exec:?}");
        assert_eq!(exec[1], role, "ExecStart: {exec:?}");
        assert!(flag(&exec, "--config").is_some(), "ExecStart: {exec:?}");
        let name_flag = if role == "tm" { "--name" } else { "--host" };
        assert_eq!(flag(&exec, name_flag).as_deref(), Some("%i"), "{exec:?}");
        assert_eq!(one("Restart"), "on-failure");
        assert_eq!(one("RestartPreventExitStatus"), "2");
        for (k, v) in [
            ("NoNewPrivileges", "yes"),
            ("ProtectSystem", "strict"),
            ("ProtectHome", "yes"),
            ("PrivateTmp", "yes"),
            ("CapabilityBoundingSet", ""),
            ("RestrictAddressFamilies", "AF_INET AF_INET6 AF_UNIX"),
        ] {
            assert_eq!(one(k), v, "{}: {k}", p.display());
        }
        assert!(
            svc.get("DynamicUser").is_some_and(|v| v[0] == "yes") || svc.contains_key("User"),
            "{}: DynamicUser=yes or User=",
            p.display()
        );
        assert!(
            !svc.contains_key("PrivateNetwork"),
            "the daemons need the host network"
        );
        assert_eq!(u["Install"]["WantedBy"], ["multi-user.target"]);
    }
}

#[test]
fn dockerfile_builds_then_runs_isotach() {
    let text = read(&deploy().join("compose/Dockerfile"));
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    let froms: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.starts_with("FROM "))
        .collect();
    assert!(froms.len() >= 2, "multi-stage: {froms:?}");
    assert!(
        froms[0].starts_with("FROM rust:") && froms[0].ends_with(" AS build"),
        "{froms:?}"
    );
    // The build image's Rust is at least the workspace's rust-version.
    let image_rust = froms[0]["FROM rust:".len()..]
        .split(['-', ' '])
        .next()
        .unwrap();
    let ws = read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml"));
    let msrv = ws
        .lines()
        .find_map(|l| l.strip_prefix("rust-version = "))
        .unwrap()
        .trim_matches('"');
    let parse = |v: &str| -> (u32, u32) {
        let mut it = v.split('.').map(|x| x.parse::<u32>().unwrap());
        (it.next().unwrap(), it.next().unwrap())
    };
    assert!(parse(image_rust) >= parse(msrv), "{image_rust} < {msrv}");
    assert!(
        lines.iter().any(|l| l.contains("cargo build --release")
            && l.contains("--locked")
            && l.contains("isotach-cli")),
        "no cargo build of isotach-cli"
    );
    assert!(lines.iter().any(|l| l.starts_with("COPY --from=build ")));
    let run = lines
        .iter()
        .rev()
        .find(|l| l.starts_with("ENTRYPOINT ") || l.starts_with("CMD "))
        .expect("ENTRYPOINT or CMD");
    let entry = lines
        .iter()
        .find(|l| l.starts_with("ENTRYPOINT "))
        .unwrap_or(run);
    assert!(entry.contains("isotach"), "{entry}");
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("USER ") && !l.contains("root")),
        "runs as an unprivileged user"
    );
}

#[test]
fn netns_scripts_are_valid_shell_and_refuse_bad_usage() {
    let bad_usage: [(&str, &[&[&str]]); 3] = [
        ("cluster.sh", &[&[], &["1"], &["3", "zero"]]),
        (
            "bench.sh",
            &[
                &["--hosts", "1"],
                &["--hosts", "4", "--leaves", "5"],
                &["--seconds", "fast"],
                &["--idiom", "swap"],
                &["--loss-pct", "100"],
                &["--unshaped", "--delay-us", "20"],
                &["--pings"],
                &["--token-timeout-us", "5"],
                &["--token-timeout-us"],
                &["--frobnicate"],
            ],
        ),
        (
            "vm.sh",
            &[
                &[],
                &["--"],
                &["true"],
                &["--cpus", "0", "--", "true"],
                &["--memory", "lots", "--", "true"],
                &["--accel", "xen", "--", "true"],
                &["--timeout", "5", "--", "true"],
                &["--env", "not a name", "--", "true"],
                &["--kernel"],
            ],
        ),
    ];
    // The library both scripts source: valid shell too (it is never run on its own).
    let lib = deploy().join("netns/lib.sh");
    if let Ok(out) = Command::new("bash").arg("-n").arg(&lib).output() {
        assert!(
            out.status.success(),
            "bash -n lib.sh: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for (name, bad) in bad_usage {
        let script = deploy().join("netns").join(name);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&script).unwrap().permissions().mode();
            assert!(mode & 0o111 != 0, "{name} is not executable");
        }
        let Ok(out) = Command::new("bash").arg("-n").arg(&script).output() else {
            eprintln!("skipped: no bash to check deploy/netns/{name}");
            return;
        };
        assert!(
            out.status.success(),
            "bash -n {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // Usage errors come before anything privileged, so this runs anywhere.
        for args in bad {
            let out = Command::new("bash")
                .arg(&script)
                .args(*args)
                .output()
                .unwrap();
            assert_eq!(out.status.code(), Some(2), "{name} {args:?}");
            assert!(
                String::from_utf8_lossy(&out.stderr).contains("usage"),
                "{name} {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}
