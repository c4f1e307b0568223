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

/// Says hello from `from` to `to` until `to` receives something (the connection is up).
fn connect(from: &mut QuicTransport, to: &mut QuicTransport) {
    let guard = Instant::now() + Duration::from_secs(60);
    while !to.has_pending() {
        assert!(Instant::now() < guard, "no connection within the guard");
        from.send(to.local_addr(), b"hello").unwrap();
        // The caller's thread drives quinn: a flush lets the handshake and the hello leave.
        from.flush().unwrap();
        let soon = Time(to.now().0 + 50_000_000);
        to.wait(Some(soon)).unwrap();
    }
    to.recv(usize::MAX, &mut |_, _| {}).unwrap();
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
    connect(&mut a, &mut b);
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
    // storm goes on until the receiver's queue has overflowed. Both threads drive their
    // quinn (flushes: the receiver's takes datagrams into its queue without reading it).
    let guard = Instant::now() + Duration::from_secs(60);
    while b.counters().recv_dropped() == 0 {
        let (sa, sb) = (a.quic_stats(), b.quic_stats());
        assert!(Instant::now() < guard, "{sa:?} {sb:?}");
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
    let guard = Instant::now() + Duration::from_secs(60);
    while !to.has_pending() {
        assert!(Instant::now() < guard, "nothing arrived within the guard");
        from.send(to.local_addr(), b"hello").unwrap();
        from.flush().unwrap();
        wait(to);
    }
    while to.recv(usize::MAX, &mut |_, _| {}).unwrap() > 0 {}
}

#[test]
fn blocking_callers_drive_quinn_on_their_own_thread() {
    let ca = make_ca("test CA").unwrap();
    let (mut a, mut b) = (bind_node(&ca, "alpha"), bind_node(&ca, "beta"));
    exchange(&mut a, &mut b, wait_briefly);
    exchange(&mut b, &mut a, wait_briefly);
    // Handshakes, datagrams and their hand-over all ran inside the callers' waits and
    // flushes: no thread of quinn's own, so no thread hop per datagram.
    assert!(!a.driver.in_background() && !b.driver.in_background());
}

#[test]
fn async_and_current_thread_callers_get_a_background_driver() {
    let ca = make_ca("test CA").unwrap();
    let (mut a, mut b) = (bind_node(&ca, "alpha"), bind_node(&ca, "beta"));
    // A blocking wait on a current-thread runtime's thread cannot block in quinn's runtime:
    // a background thread drives it and the wait polls.
    let current = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    exchange(&mut a, &mut b, |t| {
        current.block_on(async {
            let soon = Time(t.now().0 + 50_000_000);
            t.wait(Some(soon)).unwrap();
        });
    });
    assert!(b.driver.in_background() && !a.driver.in_background());
    // An async wait on a multi-thread runtime: the caller's runtime cannot drive quinn's.
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
    assert!(a.driver.in_background());
}

#[test]
fn blocking_waits_inside_a_multi_thread_runtime_drive_quinn_there() {
    let ca = make_ca("test CA").unwrap();
    let (mut a, b) = (bind_node(&ca, "alpha"), bind_node(&ca, "beta"));
    let multi = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    // A blocking wait from async code on a multi-thread runtime (block_in_place), and one
    // from its blocking pool (`spawn_blocking`, what `Smm::connect`'s documentation asks).
    let mut b = multi.block_on(async move {
        let mut b = b;
        exchange(&mut a, &mut b, wait_briefly);
        tokio::task::spawn_blocking(move || {
            let mut a = a;
            exchange(&mut b, &mut a, wait_briefly);
            assert!(!a.driver.in_background() && !b.driver.in_background());
            b
        })
        .await
        .unwrap()
    });
    // Both drove quinn on the threads that waited and flushed.
    assert!(!b.driver.in_background());
    b.flush().unwrap();
}

#[test]
fn sends_wait_for_the_flush_that_hands_them_to_quinn() {
    let ca = make_ca("test CA").unwrap();
    let (mut a, mut b) = (bind_node(&ca, "alpha"), bind_node(&ca, "beta"));
    exchange(&mut a, &mut b, wait_briefly);
    // Queued, not yet quinn's: the flush hands them over inside the runtime, in order.
    for i in 0..3u8 {
        a.send(b.local_addr(), &[i; 8]).unwrap();
    }
    assert_eq!(a.out.queued.len(), 3);
    a.flush().unwrap();
    assert!(a.out.queued.is_empty());
    let mut got = Vec::new();
    let guard = Instant::now() + Duration::from_secs(60);
    while got.len() < 3 {
        assert!(Instant::now() < guard, "got {got:?}");
        wait_briefly(&mut b);
        b.recv(usize::MAX, &mut |_, d| got.push(d[0])).unwrap();
    }
    assert_eq!(got, [0, 1, 2]);
    // A full queue flushes before it takes one more.
    for _ in 0..SEND_QUEUE_MAX + 1 {
        a.send(b.local_addr(), &[9; 8]).unwrap();
    }
    assert_eq!(a.out.queued.len(), 1);
}
