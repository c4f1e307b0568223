//! The UDP driver's batching: what leaves in how many system calls, and that every datagram
//! arrives whole, in order per sender.

use super::*;
use crate::transport::Transport;

/// A loopback transport that never spins: what these tests count is which system calls a
/// wait makes, and a spinning wait polls instead (tested apart).
fn bind(gso: bool) -> UdpTransport {
    bind_spinning(gso, Duration::ZERO)
}

fn bind_spinning(gso: bool, spin: Duration) -> UdpTransport {
    let mut cfg = UdpConfig::new("127.0.0.1:0".parse().expect("address")).with_spin(spin);
    cfg.gso = gso;
    UdpTransport::with_config(cfg).expect("bind a loopback socket")
}

fn addr(t: &UdpTransport) -> NodeAddr {
    NodeAddr::Ip(t.socket_addr())
}

/// Datagram `i` of a test stream: `len` bytes that name `i`.
fn datagram(i: u32, len: usize) -> Vec<u8> {
    let mut d = vec![(i % 251) as u8; len];
    d[..4].copy_from_slice(&i.to_le_bytes());
    d
}

/// What one transport received: each datagram with its sender.
type Received = Vec<(NodeAddr, Vec<u8>)>;

/// Everything `t` receives until `want` datagrams came (or 2 s passed).
fn drain(t: &mut UdpTransport, want: usize) -> Received {
    let mut got = Vec::new();
    let deadline = t.now().plus(Duration::from_secs(2));
    while got.len() < want && t.now() < deadline {
        t.recv(64, &mut |from, d| got.push((from, d.to_vec())))
            .expect("recv");
        if got.len() < want {
            t.wait(Some(deadline)).expect("wait");
        }
    }
    got
}

/// Twenty equal datagrams, a shorter one and another long one to A, then one datagram each to
/// B, C and D: one flush, received whole and in order.
fn mixed_flush(gso: bool) -> (UdpStats, Vec<Received>) {
    let mut tx = bind(gso);
    let mut peers: Vec<UdpTransport> = (0..4).map(|_| bind(gso)).collect();
    for i in 0..20 {
        tx.send(addr(&peers[0]), &datagram(i, 300)).expect("send");
    }
    tx.send(addr(&peers[0]), &datagram(20, 100)).expect("send");
    // After a shorter datagram the batch is closed: this one starts the next message.
    tx.send(addr(&peers[0]), &datagram(21, 300)).expect("send");
    for (i, p) in peers.iter().enumerate().skip(1) {
        tx.send(addr(p), &datagram(100 + i as u32, 50))
            .expect("send");
    }
    tx.flush().expect("flush");
    let got = peers
        .iter_mut()
        .enumerate()
        .map(|(i, p)| drain(p, if i == 0 { 22 } else { 1 }))
        .collect();
    (tx.udp_stats(), got)
}

/// A datagram as (id, length, whether its bytes are the ones [`datagram`] made): short to print.
fn summary(d: &[u8]) -> (u32, usize, bool) {
    let id = u32::from_le_bytes(d[..4].try_into().expect("4 bytes"));
    (id, d.len(), d == datagram(id, d.len()))
}

fn check_mixed(got: &[Received]) {
    let a: Vec<_> = got[0].iter().map(|(_, d)| summary(d)).collect();
    let want: Vec<_> = (0..20)
        .map(|i| (i, 300, true))
        .chain([(20, 100, true), (21, 300, true)])
        .collect();
    assert_eq!(a, want, "A gets every datagram whole and in order");
    for (i, g) in got.iter().enumerate().skip(1) {
        assert_eq!(g.len(), 1, "peer {i}");
        assert_eq!(summary(&g[0].1), (100 + i as u32, 50, true), "peer {i}");
    }
}

#[test]
fn a_flush_sends_a_batch_and_a_run_of_singles_in_two_calls() {
    let (stats, got) = mixed_flush(true);
    check_mixed(&got);
    assert_eq!(stats.sent, 25);
    if stats.send_errors == 0 && stats.send_calls == 2 {
        return; // GSO: one sendmsg for A's first 21, one sendmmsg for A's last, B, C and D.
    }
    // A kernel path without GSO falls back to one call per datagram of the batch.
    assert_eq!(stats.send_calls, 1 + 21 + 1, "{stats:?}");
}

#[test]
fn without_gso_every_datagram_of_a_batch_is_its_own_message() {
    let (stats, got) = mixed_flush(false);
    check_mixed(&got);
    assert_eq!(stats.sent, 25);
    // 22 datagrams to A, then B, C and D: one sendmmsg for the whole run of singles.
    assert_eq!(stats.send_calls, 1, "{stats:?}");
}

#[test]
fn one_receive_call_takes_datagrams_from_several_senders() {
    let mut rx = bind(true);
    let mut senders: Vec<UdpTransport> = (0..5).map(|_| bind(true)).collect();
    for (i, s) in senders.iter_mut().enumerate() {
        s.send(addr(&rx), &datagram(i as u32, 64)).expect("send");
        s.flush().expect("flush");
    }
    // Loopback delivers within the send (unless the kernel defers its softirq work under
    // load): all five wait in the socket now, normally.
    let got = drain(&mut rx, 5);
    assert_eq!(got.len(), 5);
    for (i, s) in senders.iter().enumerate() {
        let from_s: Vec<&Vec<u8>> = got
            .iter()
            .filter(|(f, _)| *f == addr(s))
            .map(|(_, d)| d)
            .collect();
        assert!(from_s == vec![&datagram(i as u32, 64)], "sender {i}");
    }
    // One call takes them all when they are all there; fewer calls than datagrams however
    // the deliveries were split (a receive per datagram would take five).
    let calls = rx.udp_stats().recv_calls;
    assert!(calls < 5, "{calls} receive calls for 5 datagrams");
}

#[test]
fn a_full_outbox_sends_before_it_takes_more() {
    let mut tx = bind(false);
    let mut rx = bind(false);
    // Alternate two sizes so no datagram joins the one before: one message each.
    let n = tx::OUTBOX_MSGS_MAX as u32 * 3;
    for i in 0..n {
        let len = if i % 2 == 0 { 40 } else { 41 };
        tx.send(addr(&rx), &datagram(i, len)).expect("send");
    }
    // Two full outboxes left on their own before the flush.
    assert_eq!(tx.udp_stats().send_calls, 2, "{:?}", tx.udp_stats());
    tx.flush().expect("flush");
    let got = drain(&mut rx, n as usize);
    let ids: Vec<u32> = got.iter().map(|(_, d)| summary(d).0).collect();
    assert_eq!(ids, (0..n).collect::<Vec<_>>());
}

#[test]
fn a_wait_just_over_a_jiffy_sets_one_receive_timeout_that_ends_before_its_deadline() {
    // Every wait from BLOCKING_RECV_MIN up to two jiffies gets the same timeout (the deadline
    // moves by microseconds from one wave to the next; the socket option must not), and the
    // kernel's rounding of it (up to one jiffy) stays below the wait.
    let mut us = BLOCKING_RECV_MIN.as_micros() as u64;
    while us < 2 * JIFFY.as_micros() as u64 {
        let left = Duration::from_micros(us);
        assert_eq!(rcvtimeo(left), ONE_TICK, "{left:?}");
        assert!(ONE_TICK <= JIFFY && JIFFY < left);
        us += 37;
    }
    // Longer waits: a power of two a jiffy below.
    for ms in [8u64, 9, 20, 50, 1_000] {
        let left = Duration::from_millis(ms);
        let t = rcvtimeo(left);
        assert!(
            t + JIFFY <= left && t.as_micros().is_power_of_two(),
            "{left:?}: {t:?}"
        );
    }
}

#[test]
fn a_five_millisecond_wait_is_one_blocking_receive_not_a_poll() {
    let mut a = bind(true);
    let mut b = bind(true);
    // Sent before the wait, so the wait finds it however the machine is scheduled: what is
    // checked is which system call the wait makes, not when a datagram arrives.
    a.send(addr(&b), &datagram(7, 100)).expect("send");
    a.flush().expect("flush");
    let now = b.now();
    let got = b
        .wait_from(now, Some(now.plus(Duration::from_millis(5))))
        .expect("wait");
    assert!(got, "the datagram was sent before the wait");
    let stats = b.udp_stats();
    assert_eq!(
        (stats.poll_calls, stats.recv_calls),
        (0, 1),
        "one blocking receive, no poll: {stats:?}"
    );
    assert_eq!(drain(&mut b, 1).len(), 1);
    // A busy link's wait ends at its held acknowledgement, a little less than
    // LINK_ACK_DELAY away: one blocking receive too.
    a.send(addr(&b), &datagram(8, 100)).expect("send");
    a.flush().expect("flush");
    let now = b.now();
    let until_ack = crate::link::LINK_ACK_DELAY - ACK_WAIT_MARGIN;
    assert!(b.wait_from(now, Some(now.plus(until_ack))).expect("wait"));
    let stats = b.udp_stats();
    assert_eq!((stats.poll_calls, stats.recv_calls), (0, 2), "{stats:?}");
    assert_eq!(drain(&mut b, 1).len(), 1);
    // A wait under BLOCKING_RECV_MIN polls (SO_RCVTIMEO cannot time it).
    let now = b.now();
    let _ = b
        .wait_from(now, Some(now.plus(Duration::from_millis(2))))
        .expect("short wait");
    assert!(b.udp_stats().poll_calls >= 1);
}

/// Sends one datagram from `a` to `b` and waits at `b` (the datagram is in `b`'s socket before
/// the wait starts, so what the wait does is not a matter of scheduling); `b`'s stats after.
fn served_wait(a: &mut UdpTransport, b: &mut UdpTransport, i: u32, quiet: bool) -> UdpStats {
    a.send(addr(b), &datagram(i, 100)).expect("send");
    a.flush().expect("flush");
    let now = b.now();
    let deadline = Some(now.plus(Duration::from_millis(100)));
    let got = if quiet {
        b.wait_quiet(now, deadline)
    } else {
        b.wait_from(now, deadline)
    };
    assert!(got.expect("wait"), "datagram {i} was sent before the wait");
    assert_eq!(drain(b, 1).len(), 1);
    b.udp_stats()
}

#[test]
fn waits_spin_only_while_traffic_flows_and_never_when_told_it_is_quiet() {
    let mut a = bind(true);
    let mut b = bind_spinning(true, Duration::from_millis(1));
    // Cold: the first wait sleeps in the kernel (it finds the datagram at once).
    assert_eq!(served_wait(&mut a, &mut b, 1, false).spin_served, 0);
    // That wait was served at once: traffic flows, so the next one spins and is served so.
    assert_eq!(served_wait(&mut a, &mut b, 2, false).spin_served, 1);
    assert_eq!(served_wait(&mut a, &mut b, 3, false).spin_served, 2);
    // A caller that expects nothing (an idle token manager) does not spin.
    assert_eq!(served_wait(&mut a, &mut b, 4, true).spin_served, 2);
    // A wait that ends at its deadline with nothing cools the policy down.
    let now = b.now();
    assert!(
        !b.wait_from(now, Some(now.plus(Duration::from_micros(200))))
            .expect("wait")
    );
    assert_eq!(served_wait(&mut a, &mut b, 5, false).spin_served, 2);
    assert_eq!(served_wait(&mut a, &mut b, 6, false).spin_served, 3);
}

#[test]
fn a_transport_bound_without_a_spin_budget_never_spins() {
    let mut a = bind(true);
    let mut b = bind(true);
    for i in 0..4 {
        assert_eq!(served_wait(&mut a, &mut b, i, false).spin_served, 0);
    }
}
