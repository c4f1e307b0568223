use super::*;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};

/// A CA and a node certificate signed by it, as PEM (what `isotach cert` writes).
fn pem_ca_and_node(ca_name: &str, node: &str) -> (String, String, String) {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params
        .distinguished_name
        .push(DnType::CommonName, ca_name);
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_key = KeyPair::generate().unwrap();
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let params = CertificateParams::new(vec![SERVER_NAME.to_string(), node.to_string()]).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = params
        .signed_by(&key, &Issuer::from_params(&ca_params, &ca_key))
        .unwrap();
    (ca_cert.pem(), cert.pem(), key.serialize_pem())
}

#[test]
fn identity_from_pem_round_trips_and_checks_the_chain() {
    let (ca, cert, key) = pem_ca_and_node("test CA", "alpha");
    let id = identity_from_pem(ca.as_bytes(), cert.as_bytes(), key.as_bytes()).unwrap();
    assert!(!id.ca_der.is_empty() && !id.cert_der.is_empty() && !id.key_der.is_empty());
    let (other_ca, _, _) = pem_ca_and_node("other CA", "beta");
    let e = identity_from_pem(other_ca.as_bytes(), cert.as_bytes(), key.as_bytes())
        .unwrap_err()
        .to_string();
    assert!(e.contains("node certificate"), "{e}");
    let e = identity_from_pem(b"junk", cert.as_bytes(), key.as_bytes())
        .unwrap_err()
        .to_string();
    assert!(e.contains("CA certificate"), "{e}");
    let e = identity_from_pem(ca.as_bytes(), cert.as_bytes(), cert.as_bytes())
        .unwrap_err()
        .to_string();
    assert!(e.contains("node key"), "{e}");
}

#[test]
fn a_certificate_without_the_server_name_is_refused() {
    let ca = make_ca("test CA").unwrap();
    let params = CertificateParams::new(vec!["alpha".to_string()]).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = params
        .signed_by(&key, &Issuer::from_params(&ca.params, &ca.key))
        .unwrap();
    let id = QuicIdentity {
        ca_der: ca.cert_der.clone(),
        cert_der: cert.der().to_vec(),
        key_der: key.serialize_der(),
    };
    assert!(check_identity(&id).is_err());
    check_identity(&make_node_identity(&ca, "alpha").unwrap()).unwrap();
}

/// How long a loop that must end may run before its test fails: a liveness guard for a
/// loaded machine, not a timing assertion.
const GUARD: Duration = Duration::from_secs(60);

/// The end of a loop's [`GUARD`].
struct Guard(Instant);

impl Guard {
    fn new() -> Self {
        Self(Instant::now() + GUARD)
    }

    /// Fails the test with `what` once the guard has run out.
    #[track_caller]
    fn check(&self, what: impl FnOnce() -> String) {
        assert!(Instant::now() < self.0, "{}", what());
    }
}

#[test]
fn refused_and_dropped_datagrams_are_counted() {
    let ca = make_ca("test CA").unwrap();
    let bind = |name| {
        let id = make_node_identity(&ca, name).unwrap();
        QuicTransport::bind(QuicConfig::new("127.0.0.1:0".parse().unwrap(), id)).unwrap()
    };
    let (mut a, mut b) = (bind("alpha"), bind("beta"));
    let counters = a.counters();
    exchange(&mut a, &mut b, wait_briefly);
    assert_eq!((counters.send_refused(), counters.send_dropped()), (0, 0));

    // Larger than a QUIC packet: quinn refuses it.
    a.send(b.local_addr(), &[7; 4000]).unwrap();
    a.flush().unwrap();
    assert_eq!(counters.send_refused(), 1);
    assert_eq!(a.quic_stats().send_refused, 1);

    // To an address that never completes a handshake: the first datagram opens the
    // connection, CONNECT_QUEUE wait for it, the rest are dropped.
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let to = NodeAddr::Ip(silent.local_addr().unwrap());
    for _ in 0..1 + CONNECT_QUEUE + 10 {
        a.send(to, b"x").unwrap();
    }
    a.flush().unwrap();
    assert!(counters.send_dropped() >= 10, "{:?}", a.quic_stats());

    // A storm the receiver does not read: what overflows its queue is dropped, counted.
    // Datagrams may also be lost on the way (a loaded machine's socket buffers), so the
    // storm goes on until the receiver's queue has overflowed. Both drive their endpoints
    // (flushes: the receiver's takes datagrams into its queue without reading it).
    let guard = Guard::new();
    while b.counters().recv_dropped() == 0 {
        guard.check(|| format!("{:?} {:?}", a.quic_stats(), b.quic_stats()));
        for _ in 0..1000 {
            a.send(b.local_addr(), &[1; 64]).unwrap();
        }
        for _ in 0..20 {
            a.flush().unwrap();
            b.flush().unwrap();
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(b.quic_stats().recv_dropped > 0);
    assert_eq!(b.quic_stats().send_refused + b.quic_stats().send_dropped, 0);
}

#[test]
fn a_taken_address_is_an_error_even_inside_a_runtime() {
    let ca = make_ca("test CA").unwrap();
    let id = || make_node_identity(&ca, "alpha").unwrap();
    let first = QuicTransport::bind(QuicConfig::new("127.0.0.1:0".parse().unwrap(), id())).unwrap();
    let taken = first.socket_addr();
    // A daemon binds from async code on its own runtime: the failed bind must not panic.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let r = rt.block_on(async { QuicTransport::bind(QuicConfig::new(taken, id())) });
    assert!(r.is_err(), "the address is taken");
}

#[test]
fn the_path_mtu_never_falls_below_the_frames_it_carries() {
    // quinn falls back to `min_mtu` when loss looks like an MTU black hole; below the frame
    // size every full-size fragment would be refused (see the QUIC wire-loss conformance test).
    let ca = make_ca("test CA").unwrap();
    let mut cfg = QuicConfig::new(
        "127.0.0.1:0".parse().unwrap(),
        make_node_identity(&ca, "alpha").unwrap(),
    );
    for mtu in [1400, 1452] {
        cfg.initial_mtu = mtu;
        let t = format!("{:?}", setup::transport_config(&cfg).unwrap());
        assert!(t.contains(&format!("initial_mtu: {mtu},")), "{t}");
        assert!(t.contains(&format!("min_mtu: {mtu},")), "{t}");
    }
}

#[test]
fn peers_are_asked_for_fewer_acknowledgement_only_packets() {
    let ca = make_ca("test CA").unwrap();
    let cfg = QuicConfig::new(
        "127.0.0.1:0".parse().unwrap(),
        make_node_identity(&ca, "alpha").unwrap(),
    );
    let t = format!("{:?}", setup::transport_config(&cfg).unwrap());
    assert!(
        t.contains("ack_eliciting_threshold: 16") && t.contains("max_ack_delay: Some(5ms)"),
        "{t}"
    );
}

#[test]
fn wire_loss_is_a_probability_and_set_only_where_bound() {
    let ca = make_ca("test CA").unwrap();
    let id = || make_node_identity(&ca, "alpha").unwrap();
    let mut cfg = QuicConfig::new("127.0.0.1:0".parse().unwrap(), id());
    cfg.wire_loss = 1.5;
    assert!(matches!(QuicTransport::bind(cfg), Err(AmError::BadArg(_))));
    let plain = QuicTransport::bind(QuicConfig::new("127.0.0.1:0".parse().unwrap(), id())).unwrap();
    assert!(matches!(plain.set_wire_loss(0.1), Err(AmError::BadArg(_))));
    let mut cfg = QuicConfig::new("127.0.0.1:0".parse().unwrap(), id());
    cfg.wire_loss = 0.5;
    let lossy = QuicTransport::bind(cfg).unwrap();
    lossy.set_wire_loss(0.0).unwrap();
    assert!(matches!(lossy.set_wire_loss(-0.1), Err(AmError::BadArg(_))));
}

fn bind_node(ca: &CertAuthority, name: &str) -> QuicTransport {
    let id = make_node_identity(ca, name).unwrap();
    QuicTransport::bind(QuicConfig::new("127.0.0.1:0".parse().unwrap(), id)).unwrap()
}

/// A blocking wait of at most 50 ms.
fn wait_briefly(t: &mut QuicTransport) {
    let soon = Time(t.now().0 + 50_000_000);
    t.wait(Some(soon)).unwrap();
}

/// Waits on `to` (through `wait`) until the datagram `from` keeps sending arrives.
fn exchange(from: &mut QuicTransport, to: &mut QuicTransport, wait: impl Fn(&mut QuicTransport)) {
    let guard = Guard::new();
    while !to.has_pending() {
        guard.check(|| {
            let (f, t, e) = (
                from.quic_stats(),
                to.quic_stats(),
                from.counters().last_error(),
            );
            format!("nothing arrived: {f:?} {t:?} {e:?}")
        });
        from.send(to.local_addr(), b"hello").unwrap();
        // The caller's thread drives the endpoint: a flush lets the handshake and the hello
        // leave.
        from.flush().unwrap();
        wait(to);
    }
    while to.recv(usize::MAX, &mut |_, _| {}).unwrap() > 0 {}
}

#[test]
fn every_kind_of_caller_drives_the_endpoint_on_its_own_thread() {
    let ca = make_ca("test CA").unwrap();
    let (mut a, mut b) = (bind_node(&ca, "alpha"), bind_node(&ca, "beta"));
    // Plain blocking waits: handshakes, datagrams and their hand-over all run inside the
    // callers' waits and flushes.
    exchange(&mut a, &mut b, wait_briefly);
    exchange(&mut b, &mut a, wait_briefly);
    // A blocking wait on a current-thread runtime's thread blocks that thread in poll(2), as
    // the UDP backend's does.
    let current = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    exchange(&mut a, &mut b, |t| {
        current.block_on(async { wait_briefly(t) });
    });
    // An async wait on a multi-thread runtime (the transport was bound outside it, so the
    // wait polls), and one from its blocking pool (`spawn_blocking`, what `Smm::connect`'s
    // documentation asks).
    let multi = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    exchange(&mut b, &mut a, |t| {
        multi.block_on(async {
            let soon = Time(t.now().0 + 50_000_000);
            t.wait_async(Some(soon)).await.unwrap();
        });
    });
    multi.block_on(async move {
        tokio::task::spawn_blocking(move || {
            exchange(&mut a, &mut b, wait_briefly);
            exchange(&mut b, &mut a, wait_briefly);
        })
        .await
        .unwrap();
    });
}

#[test]
fn an_async_wait_on_a_transport_bound_in_the_runtime_awaits_readiness() {
    let ca = make_ca("test CA").unwrap();
    let mut a = bind_node(&ca, "alpha");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // Bound inside the runtime: the socket is registered with it.
    let mut b = rt.block_on(async { bind_node(&ca, "beta") });
    assert!(b.socket.has_readiness());
    exchange(&mut a, &mut b, |t| {
        rt.block_on(async {
            let soon = Time(t.now().0 + 50_000_000);
            t.wait_async(Some(soon)).await.unwrap();
        });
    });
    exchange(&mut b, &mut a, wait_briefly);
}

#[test]
fn sends_wait_for_the_flush_that_transmits_them() {
    let ca = make_ca("test CA").unwrap();
    let (mut a, mut b) = (bind_node(&ca, "alpha"), bind_node(&ca, "beta"));
    exchange(&mut a, &mut b, wait_briefly);
    let (sent, on_wire) = (a.quic_stats().sent, a.conns.packets_sent());
    // Handed to quinn, not yet on the wire: no packet leaves until the flush, then all
    // arrive, in order.
    for i in 0..3u8 {
        a.send(b.local_addr(), &[i; 8]).unwrap();
    }
    assert_eq!(a.quic_stats().sent, sent + 3);
    assert_eq!(a.conns.unsent, 3);
    assert_eq!(
        a.conns.packets_sent(),
        on_wire,
        "a send left before the flush"
    );
    a.flush().unwrap();
    assert_eq!(a.conns.unsent, 0);
    assert!(a.conns.packets_sent() > on_wire);
    let mut got = Vec::new();
    let guard = Guard::new();
    while got.len() < 3 {
        guard.check(|| format!("got {got:?}"));
        wait_briefly(&mut b);
        b.recv(usize::MAX, &mut |_, d| got.push(d[0])).unwrap();
    }
    assert_eq!(got, [0, 1, 2]);
    // A full batch transmits before it takes one more.
    for _ in 0..SEND_QUEUE_MAX + 1 {
        a.send(b.local_addr(), &[9; 8]).unwrap();
    }
    assert_eq!(a.conns.unsent, 1);
}

/// The choice tag of the connection `t` sends to `to` on, and whether it holds a spare.
fn in_use(t: &QuicTransport, to: SocketAddr) -> Option<([u8; 16], bool)> {
    t.conns.in_use(to)
}

/// Both drive their quinn for `d` (each waits briefly in turn), reading what arrives.
fn drive_both(a: &mut QuicTransport, b: &mut QuicTransport, d: Duration) {
    let end = Instant::now() + d;
    while Instant::now() < end {
        for t in [&mut *a, &mut *b] {
            let soon = Time(t.now().0 + 5_000_000);
            t.wait(Some(soon)).unwrap();
            while t.recv(usize::MAX, &mut |_, _| {}).unwrap() > 0 {}
        }
    }
}

#[test]
fn a_simultaneous_open_settles_on_one_connection() {
    let ca = make_ca("test CA").unwrap();
    let (mut a, mut b) = (bind_node(&ca, "alpha"), bind_node(&ca, "beta"));
    let (to_a, to_b) = (a.socket_addr(), b.socket_addr());
    // Both send before either has heard of the other: each opens a connection.
    a.send(b.local_addr(), b"hello").unwrap();
    b.send(a.local_addr(), b"hello").unwrap();
    a.flush().unwrap();
    b.flush().unwrap();
    exchange(&mut a, &mut b, wait_briefly);
    exchange(&mut b, &mut a, wait_briefly);
    assert_eq!((a.quic_stats().connects, b.quic_stats().connects), (1, 1));
    // Until both ends have both connections (the second handshake may still run).
    let both = |t: &QuicTransport, to| matches!(in_use(t, to), Some((_, true)));
    let guard = Guard::new();
    while !both(&a, to_b) || !both(&b, to_a) {
        guard.check(|| "a connection never completed".into());
        drive_both(&mut a, &mut b, Duration::from_millis(20));
    }
    // Both ends send on the same connection (if each sent on the one the other opened,
    // every acknowledgement would be a packet of its own).
    let (ta, tb) = (in_use(&a, to_b).unwrap(), in_use(&b, to_a).unwrap());
    assert_eq!(ta.0, tb.0, "both ends send on one connection");
    // The loser is closed after the grace, and both ends forget it; datagrams still flow.
    let guard = Guard(Instant::now() + conns::DUPLICATE_GRACE + GUARD);
    while in_use(&a, to_b).unwrap().1 || in_use(&b, to_a).unwrap().1 {
        guard.check(|| "the losing connection stays open".into());
        drive_both(&mut a, &mut b, Duration::from_millis(50));
    }
    assert_eq!(in_use(&a, to_b).unwrap().0, ta.0);
    exchange(&mut a, &mut b, wait_briefly);
    exchange(&mut b, &mut a, wait_briefly);
}

/// A node that can crash: bound with the wire-loss hook (at no loss until it crashes).
fn bind_crashable(id: QuicIdentity) -> QuicTransport {
    let mut cfg = QuicConfig::new("127.0.0.1:0".parse().unwrap(), id);
    cfg.wire_loss = 0.5;
    let t = QuicTransport::bind(cfg).unwrap();
    t.set_wire_loss(0.0).unwrap();
    t
}

/// `old` crashes (nothing it sends on the way out, such as its close frames, leaves) and a
/// node with its identity starts where it was.
fn restart(old: QuicTransport, id: QuicIdentity) -> QuicTransport {
    let at = old.socket_addr();
    old.set_wire_loss(1.0).unwrap();
    drop(old);
    QuicTransport::bind(QuicConfig::new(at, id)).unwrap()
}

/// alpha and beta linked on the connection alpha opened; then beta crashed and restarted.
fn alpha_and_a_restarted_beta() -> (QuicTransport, QuicTransport) {
    let ca = make_ca("test CA").unwrap();
    let id_b = make_node_identity(&ca, "beta").unwrap();
    let mut a = bind_node(&ca, "alpha");
    let mut b = bind_crashable(id_b.clone());
    exchange(&mut a, &mut b, wait_briefly);
    exchange(&mut b, &mut a, wait_briefly);
    (a, restart(b, id_b))
}

#[test]
fn a_connection_to_a_restarted_peer_is_ended_by_its_reset() {
    // beta stays silent: alpha's connection is dead (the idle timeout is 30 s), but the new
    // beta answers its first datagram with a stateless reset alpha accepts (the reset key
    // comes from beta's node key), so alpha opens a new connection.
    let (mut a, mut b) = alpha_and_a_restarted_beta();
    exchange(&mut a, &mut b, wait_briefly);
    let s = a.quic_stats();
    assert_eq!(
        (s.connects, s.peer_resets, s.idle_timeouts),
        (2, 1, 0),
        "{s:?}"
    );
}

#[test]
fn a_restarted_peer_that_speaks_first_hears_back() {
    // The new beta opens a connection; alpha keeps one of the two (the choice tags decide)
    // and its answer arrives either way: on the new one, or on the dead one, which the reset
    // closes so that the new one, kept as the spare, takes over.
    let (mut a, mut b) = alpha_and_a_restarted_beta();
    exchange(&mut b, &mut a, wait_briefly);
    exchange(&mut a, &mut b, wait_briefly);
    let s = a.quic_stats();
    assert_eq!(s.connects, 1, "alpha never needed a new connection: {s:?}");
    assert_eq!(
        s.idle_timeouts, 0,
        "nor waited for the dead one to idle out: {s:?}"
    );
}

#[test]
fn the_reset_key_is_the_node_keys_own() {
    let ca = make_ca("test CA").unwrap();
    let (a, b) = (
        make_node_identity(&ca, "alpha").unwrap(),
        make_node_identity(&ca, "beta").unwrap(),
    );
    let token = |id: &QuicIdentity| {
        let mut t = [0u8; 32];
        setup::reset_key(&id.key_der).sign(b"a connection id", &mut t);
        t
    };
    assert_eq!(token(&a), token(&a.clone()), "the same after a restart");
    assert_ne!(token(&a), token(&b));
}

#[test]
fn full_size_bursts_arrive_whole() {
    // A burst of full-size datagrams leaves in GSO batches (and may arrive in GRO batches): a
    // batch over one UDP payload's size fails to send (`EMSGSIZE`, the whole batch lost; with
    // quinn-udp's 64 segments of 1 329 bytes, a 4 % loss on `bench am`'s bulk phase and a
    // 10 ms AM retransmission per 64 KiB round trip), and then a round never completes here
    // (nothing above QUIC sends again). A receive slot smaller than a GRO batch would lose
    // its tail the same way. Both send paths: the outbox (a socket bound to one address) and
    // quinn-udp's own sends (bound to all addresses).
    let ca = make_ca("test CA").unwrap();
    for sender_bind in ["127.0.0.1:0", "0.0.0.0:0"] {
        let id = make_node_identity(&ca, "alpha").unwrap();
        let mut a = QuicTransport::bind(QuicConfig::new(sender_bind.parse().unwrap(), id)).unwrap();
        let mut b = bind_node(&ca, "beta");
        bursts_arrive_whole(&mut a, &mut b);
    }
}

/// Twenty bursts of 64 full-size datagrams from `a` to `b`, each received whole.
fn bursts_arrive_whole(a: &mut QuicTransport, b: &mut QuicTransport) {
    exchange(a, b, wait_briefly);
    const BURST: usize = 64;
    let guard = Guard::new();
    for round in 0..20u8 {
        for i in 0..BURST {
            a.send(b.local_addr(), &[round.wrapping_add(i as u8); 1300])
                .unwrap();
        }
        a.flush().unwrap();
        let mut got = 0;
        while got < BURST {
            guard.check(|| {
                let (sa, sb) = (a.quic_stats(), b.quic_stats());
                format!("round {round}: {got} of {BURST}; {sa:?} {sb:?}")
            });
            wait_briefly(b);
            got += b
                .recv(usize::MAX, &mut |_, d| assert_eq!(d.len(), 1300))
                .unwrap();
            // The sender takes acknowledgements (its congestion window grows: larger batches).
            a.flush().unwrap();
        }
    }
    assert_eq!(a.quic_stats().send_failed, 0, "{:?}", a.quic_stats());
}

#[test]
fn connections_beyond_the_limit_are_refused_and_counted() {
    let ca = make_ca("test CA").unwrap();
    let (mut a, mut b, mut c) = (
        bind_node(&ca, "alpha"),
        bind_node(&ca, "beta"),
        bind_node(&ca, "gamma"),
    );
    a.set_connections_max(1);
    exchange(&mut b, &mut a, wait_briefly);
    // gamma's handshake is refused at once (not left to time out): alpha holds its one.
    let guard = Guard::new();
    while a.quic_stats().handshakes_refused == 0 || c.quic_stats().connects_failed == 0 {
        guard.check(|| format!("{:?} {:?}", a.quic_stats(), c.quic_stats()));
        c.send(a.local_addr(), b"hello").unwrap();
        c.flush().unwrap();
        wait_briefly(&mut a);
        wait_briefly(&mut c);
    }
    assert!(!a.has_pending(), "nothing of gamma's arrived");
    assert!(
        a.counters()
            .last_error()
            .unwrap()
            .contains("connections held")
    );
    // alpha's own connection attempts beyond the limit fail too; beta stays reachable.
    a.send(c.local_addr(), b"hello").unwrap();
    assert!(a.quic_stats().connects_failed >= 1, "{:?}", a.quic_stats());
    exchange(&mut b, &mut a, wait_briefly);
}
