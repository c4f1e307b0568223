//! `isotach cert init|issue|show` through the built binary, and the certificates it issues
//! used by the AM QUIC backend: two nodes of one cluster CA talk; a node whose certificate
//! another CA signed is refused (issue 5, item 8).

mod common;

use common::{Scratch, isotach, scratch};
use isotach_am::backend::quic::{QuicConfig, QuicIdentity, QuicTransport, identity_from_pem};
use isotach_am::{Bundle, Config, EpId, HandlerId, Status, Tag, TransIdx};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Output;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A scratch directory as a command-line argument.
fn arg(dir: &Scratch) -> &str {
    dir.to_str().expect("utf-8 temp path")
}

fn ok(out: &Output) {
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn show_json(file: &Path) -> serde_json::Value {
    let out = isotach(&["cert", "show", file.to_str().unwrap(), "--json"]);
    ok(&out);
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 1, "one JSON object: {stdout}");
    serde_json::from_str(&stdout).expect("stdout is JSON")
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

#[test]
fn init_issue_show_and_refuse_to_overwrite() {
    let dir = scratch("cert-files");
    let d = arg(&dir);
    ok(&isotach(&["cert", "init", "--dir", d, "--name", "testing"]));
    assert_eq!(mode(&dir.join("ca.key")), 0o600);
    let ca = show_json(&dir.join("ca.pem"));
    assert_eq!(ca["is_ca"], true);
    assert!(ca["subject"].as_str().unwrap().contains("testing"), "{ca}");

    ok(&isotach(&[
        "cert",
        "issue",
        "--dir",
        d,
        "--node",
        "alpha",
        "--san",
        "127.0.0.1",
        "--san",
        "alpha.example",
    ]));
    assert_eq!(mode(&dir.join("alpha.key")), 0o600);
    let node = show_json(&dir.join("alpha.pem"));
    assert_eq!(node["is_ca"], false);
    assert_eq!(node["valid_now"], true);
    assert_eq!(node["issuer"], ca["subject"]);
    assert!(node["subject"].as_str().unwrap().contains("CN=alpha"));
    let sans: Vec<&str> = node["sans"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(
        sans,
        [
            "DNS:isotach-node",
            "DNS:alpha",
            "IP:127.0.0.1",
            "DNS:alpha.example"
        ]
    );
    // The readable form names the same things.
    let out = isotach(&["cert", "show", dir.join("alpha.pem").to_str().unwrap()]);
    ok(&out);
    let text = String::from_utf8(out.stdout).unwrap();
    for want in [
        "subject:",
        "issuer:",
        "not before:",
        "not after:",
        "IP:127.0.0.1",
    ] {
        assert!(text.contains(want), "{want} missing in {text}");
    }

    // Existing files are kept unless --force.
    let before = std::fs::read(dir.join("alpha.pem")).unwrap();
    let out = isotach(&["cert", "issue", "--dir", d, "--node", "alpha"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(stderr(&out).contains("--force"), "{}", stderr(&out));
    assert_eq!(std::fs::read(dir.join("alpha.pem")).unwrap(), before);
    let out = isotach(&["cert", "init", "--dir", d]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    ok(&isotach(&[
        "cert", "issue", "--dir", d, "--node", "alpha", "--force",
    ]));
    assert_ne!(std::fs::read(dir.join("alpha.pem")).unwrap(), before);
    assert_eq!(mode(&dir.join("alpha.key")), 0o600);
}

#[test]
fn bad_input_exits_2() {
    let dir = scratch("cert-bad");
    let d = arg(&dir);
    // No CA yet.
    let out = isotach(&["cert", "issue", "--dir", d, "--node", "alpha"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(stderr(&out).contains("ca.pem"), "{}", stderr(&out));
    ok(&isotach(&["cert", "init", "--dir", d]));
    for node in ["", "ca", "a/b", "-x", "spa ce"] {
        let out = isotach(&["cert", "issue", "--dir", d, "--node", node]);
        assert_eq!(out.status.code(), Some(2), "node {node:?}: {out:?}");
    }
    // A key is not a certificate; a missing file is named.
    let out = isotach(&["cert", "show", dir.join("ca.key").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let out = isotach(&["cert", "show", dir.join("nope.pem").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(stderr(&out).contains("nope.pem"), "{}", stderr(&out));
}

fn load(dir: &Path, node: &str) -> QuicIdentity {
    let read = |f: &str| std::fs::read(dir.join(f)).unwrap();
    identity_from_pem(
        &read("ca.pem"),
        &read(&format!("{node}.pem")),
        &read(&format!("{node}.key")),
    )
    .unwrap_or_else(|e| panic!("{node}: {e}"))
}

const TAG: Tag = Tag(0x1507_AC4E);
const EP: EpId = EpId(0);
const ECHO: HandlerId = HandlerId(1);
const REPLY: HandlerId = HandlerId(2);

type Am = Bundle<QuicTransport>;

fn node(id: QuicIdentity) -> Am {
    let cfg = Config {
        rto_initial: Duration::from_millis(2),
        give_up: Duration::from_millis(500),
        ..Config::default()
    };
    let quic = QuicConfig::new("127.0.0.1:0".parse().unwrap(), id);
    let mut b = Bundle::new(QuicTransport::bind(quic).unwrap(), cfg).unwrap();
    assert_eq!(b.alloc_endpoint().unwrap(), EP);
    b.set_tag(EP, TAG).unwrap();
    b
}

/// Polls every node until `done` (a liveness guard of 60 s, not a timing assertion).
fn run(nodes: &mut [&mut Am], what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        let mut work = 0;
        for n in nodes.iter_mut() {
            work += n.poll().unwrap();
        }
        if work == 0 {
            std::thread::sleep(Duration::from_micros(200));
        }
        assert!(start.elapsed() < Duration::from_secs(60), "{what}: stuck");
    }
}

#[test]
fn quic_nodes_of_one_ca_talk_and_a_foreign_ca_is_refused() {
    let cluster = scratch("cert-cluster");
    let rogue_dir = scratch("cert-rogue");
    ok(&isotach(&["cert", "init", "--dir", arg(&cluster)]));
    ok(&isotach(&[
        "cert",
        "init",
        "--dir",
        arg(&rogue_dir),
        "--name",
        "rogue",
    ]));
    for n in ["alpha", "beta"] {
        ok(&isotach(&[
            "cert",
            "issue",
            "--dir",
            arg(&cluster),
            "--node",
            n,
        ]));
    }
    ok(&isotach(&[
        "cert",
        "issue",
        "--dir",
        arg(&rogue_dir),
        "--node",
        "mallory",
    ]));
    // A certificate from one CA does not load against another CA.
    let read = |d: &Scratch, f: &str| std::fs::read(d.join(f)).unwrap();
    let e = identity_from_pem(
        &read(&cluster, "ca.pem"),
        &read(&rogue_dir, "mallory.pem"),
        &read(&rogue_dir, "mallory.key"),
    )
    .unwrap_err();
    assert!(e.to_string().contains("node certificate"), "{e}");

    let mut alpha = node(load(&cluster, "alpha"));
    let mut beta = node(load(&cluster, "beta"));
    let mut mallory = node(load(&rogue_dir, "mallory"));
    let served = Arc::new(AtomicUsize::new(0));
    let s = served.clone();
    beta.set_request_handler(EP, ECHO, move |req| {
        s.fetch_add(1, Ordering::SeqCst);
        let a = req.args().to_vec();
        req.reply_short(REPLY, &a).unwrap();
    })
    .unwrap();
    let replies: Arc<Mutex<Vec<Vec<u64>>>> = Arc::default();
    let r = replies.clone();
    alpha
        .set_reply_handler(EP, REPLY, move |rep| {
            r.lock().unwrap().push(rep.args().to_vec());
        })
        .unwrap();
    let returned: Arc<Mutex<Vec<Status>>> = Arc::default();
    let r = returned.clone();
    mallory
        .set_return_handler(EP, move |ret| r.lock().unwrap().push(ret.status))
        .unwrap();
    let beta_name = beta.name(EP);
    alpha.map(EP, TransIdx(0), beta_name, TAG).unwrap();
    mallory.map(EP, TransIdx(0), beta_name, TAG).unwrap();

    alpha.request_short(EP, TransIdx(0), ECHO, &[7, 8]).unwrap();
    run(&mut [&mut alpha, &mut beta], "same-CA echo", || {
        !replies.lock().unwrap().is_empty()
    });
    assert_eq!(replies.lock().unwrap()[0], [7, 8]);
    assert_eq!(served.load(Ordering::SeqCst), 1);

    mallory.request_short(EP, TransIdx(0), ECHO, &[9]).unwrap();
    run(
        &mut [&mut alpha, &mut beta, &mut mallory],
        "foreign CA refused",
        || !returned.lock().unwrap().is_empty(),
    );
    assert_eq!(returned.lock().unwrap()[0], Status::Unreachable);
    assert_eq!(
        served.load(Ordering::SeqCst),
        1,
        "beta never ran mallory's request"
    );
}
