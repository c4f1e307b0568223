//! AM conformance suite. Every test is named `conf_…`; scenarios that apply to several
//! backends run on each (`_mem` on the deterministic simulator with virtual time, `_chan` on
//! the in-process real-time network, `_udp` and `_quic` over loopback). No test asserts on
//! elapsed time.

mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{EP, H, TAG, chan, mem, quic, reply_recorder, seed, udp, udp_cfg};
use isotach_am::backend::fault::Faulty;
use isotach_am::backend::mem::FaultModel;
use isotach_am::backend::quic::QuicTransport;
use isotach_am::{
    AmError, Bundle, Config, DEFAULT_HANDLERS, DEFAULT_TRANSLATIONS, EndpointName, EpId, EventMask,
    HandlerId, MAX_ARGS, MAX_HANDLERS, MAX_LONG_BYTES, MAX_MEDIUM_BYTES, MAX_TRANSLATIONS, Opcode,
    Request, Status, Tag, TransIdx, Transport,
};

const ECHO: HandlerId = HandlerId(1);
const REPLY: HandlerId = HandlerId(2);
const FETCH_ADD: HandlerId = HandlerId(3);
const SILENT: HandlerId = HandlerId(4);
const MEDIUM_SUM: HandlerId = HandlerId(5);
const XFER_SUM: HandlerId = HandlerId(6);
const GOT: HandlerId = HandlerId(7);

fn fnv(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
        (h ^ u64::from(x)).wrapping_mul(0x100_0000_01b3)
    })
}

fn bind_echo<T: Transport>(b: &mut Bundle<T>) {
    b.set_request_handler(EP, ECHO, |req| {
        let a = req.args().to_vec();
        req.reply_short(REPLY, &a).unwrap();
    })
    .unwrap();
}

/// The log of the replies a node received: the arguments of each.
type Replies = Arc<Mutex<Vec<Vec<u64>>>>;

/// Node 0 sends node 1 an echo request with argument `arg`, then the network steps until `got`
/// holds `replies` replies.
fn echo_and_wait<T: Transport>(h: &mut H<T>, what: &str, arg: u64, got: &Replies, replies: usize) {
    h.nodes[0].request_short(EP, t(1), ECHO, &[arg]).unwrap();
    h.run(what, |_| got.lock().unwrap().len() == replies);
}

/// Sets every node up ([`H::setup`], segments of `seg` bytes), binds the echo handler at node 1
/// and returns the log of the replies node 0 receives.
fn node_1_echoes<T: Transport>(h: &mut H<T>, seg: usize) -> Replies {
    h.setup(seg);
    bind_echo(&mut h.nodes[1]);
    reply_recorder(&mut h.nodes[0], REPLY)
}

/// Binds request handler `handler` of endpoint `ep` at `b` to `then`, counting its runs.
fn counting_handler<T: Transport>(
    b: &mut Bundle<T>,
    ep: EpId,
    handler: HandlerId,
    mut then: impl FnMut(Request<'_>) + Send + 'static,
) -> Arc<AtomicUsize> {
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    b.set_request_handler(ep, handler, move |req| {
        r.fetch_add(1, Ordering::SeqCst);
        then(req);
    })
    .unwrap();
    runs
}

/// Whether a `try_*` send went out: false when it would block; any other error fails the
/// test.
#[track_caller]
fn went_out(r: Result<(), AmError>) -> bool {
    match r {
        Ok(()) => true,
        Err(AmError::WouldBlock) => false,
        Err(e) => panic!("{e}"),
    }
}

/// `v` in ascending order.
fn sorted<T: Ord>(mut v: Vec<T>) -> Vec<T> {
    v.sort();
    v
}

/// `(first argument, status, opcode)` of every message returned to node `i`, by first
/// argument.
fn returned_by_arg<T: Transport>(h: &H<T>, i: usize) -> Vec<(u64, Status, Opcode)> {
    let mut r: Vec<(u64, Status, Opcode)> = h
        .returned(i)
        .iter()
        .map(|r| (r.args()[0], r.status, r.opcode))
        .collect();
    r.sort_by_key(|r| r.0);
    r
}

fn t(i: usize) -> TransIdx {
    TransIdx(i as u16)
}

fn mem_cfg() -> Config {
    Config::default()
}

/// Fault-free networks of `n` nodes, one builder per backend, each with its backend's test
/// configuration and seeded with `seed(s)`.
mod clean {
    use super::common::{self, H, seed, udp_cfg};
    use isotach_am::backend::chan::ChanTransport;
    use isotach_am::backend::fault::Faulty;
    use isotach_am::backend::mem::{FaultModel, MemTransport};
    use isotach_am::backend::quic::QuicTransport;
    use isotach_am::backend::udp::UdpTransport;

    pub(crate) fn mem(n: usize, s: u64) -> H<MemTransport> {
        common::mem(n, FaultModel::none(), &super::mem_cfg(), seed(s))
    }
    pub(crate) fn udp(n: usize, s: u64) -> H<Faulty<UdpTransport>> {
        common::udp(n, &udp_cfg(), 0.0, 0.0, seed(s))
    }
    pub(crate) fn quic(n: usize, s: u64) -> H<Faulty<QuicTransport>> {
        common::quic(n, &udp_cfg(), 0.0, 0.0, seed(s))
    }
    pub(crate) fn chan(n: usize, s: u64) -> H<Faulty<ChanTransport>> {
        common::chan(n, &udp_cfg(), 0.0, 0.0, seed(s))
    }
}

/// One `#[test]` per `name => (args)` entry, each calling `scenario(args)`: the tests of one
/// scenario, on one backend each.
macro_rules! backend_tests {
    ($scenario:ident: $($name:ident => ($($arg:expr),+ $(,)?)),+ $(,)?) => {
        $(
            #[test]
            fn $name() {
                $scenario($($arg),+);
            }
        )+
    };
}

// ------------------------------------------------------------------ short messages

fn short_args<T: Transport>(mut h: H<T>) {
    let got = node_1_echoes(&mut h, 0);
    let patterns = [
        0u64,
        u64::MAX,
        0xAAAA_AAAA_AAAA_AAAA,
        0x5555_5555_5555_5555,
        1,
        1 << 63,
    ];
    let mut sent = Vec::new();
    for n in 0..=MAX_ARGS {
        for p in patterns {
            let args: Vec<u64> = (0..n as u64).map(|i| p ^ i.rotate_left(17)).collect();
            sent.push(args);
        }
    }
    let total = sent.len();
    let mut queue = sent.clone();
    h.run("short args", |h| {
        while let Some(a) = queue.last()
            && went_out(h.nodes[0].try_request_short(EP, t(1), ECHO, a))
        {
            queue.pop();
        }
        got.lock().unwrap().len() == total
    });
    assert_eq!(sorted(got.lock().unwrap().clone()), sorted(sent));
    assert_eq!(
        h.nodes[0]
            .try_request_short(EP, t(1), ECHO, &[0; MAX_ARGS + 1])
            .unwrap_err()
            .to_string(),
        AmError::BadArg("more than MAX_ARGS argument words").to_string()
    );
}

backend_tests! { short_args:
    conf_short_roundtrip_all_arg_patterns_mem => (clean::mem(2, 1)),
    conf_short_roundtrip_all_arg_patterns_udp => (clean::udp(2, 1)),
    conf_short_roundtrip_all_arg_patterns_quic => (clean::quic(2, 1)),
    conf_short_roundtrip_all_arg_patterns_chan => (clean::chan(2, 1)),
}

// ------------------------------------------------------------------ medium messages

fn medium_sizes<T: Transport>(mut h: H<T>) {
    h.setup(0);
    h.nodes[1]
        .set_request_handler(EP, MEDIUM_SUM, |req| {
            let d = req.data();
            let r = [d.len() as u64, fnv(d)];
            req.reply_short(REPLY, &r).unwrap();
        })
        .unwrap();
    let got = reply_recorder(&mut h.nodes[0], REPLY);
    let sizes = [0usize, 1, 7, 512, MAX_MEDIUM_BYTES];
    let payloads: Vec<Vec<u8>> = sizes
        .iter()
        .map(|&n| (0..n).map(|i| (i * 31 + n) as u8).collect())
        .collect();
    for p in &payloads {
        h.nodes[0]
            .request_medium(EP, t(1), MEDIUM_SUM, p, &[9])
            .unwrap();
    }
    let n = payloads.len();
    h.run("medium", |_| got.lock().unwrap().len() == n);
    let want: Vec<Vec<u64>> = payloads
        .iter()
        .map(|p| vec![p.len() as u64, fnv(p)])
        .collect();
    assert_eq!(sorted(got.lock().unwrap().clone()), sorted(want));
    let too_big = vec![0u8; MAX_MEDIUM_BYTES + 1];
    assert!(matches!(
        h.nodes[0].try_request_medium(EP, t(1), MEDIUM_SUM, &too_big, &[]),
        Err(AmError::BadArg(_))
    ));
}

backend_tests! { medium_sizes:
    conf_medium_sizes_and_max_plus_one_rejected_mem => (clean::mem(2, 2)),
    conf_medium_sizes_and_max_plus_one_rejected_udp => (clean::udp(2, 2)),
    conf_medium_sizes_and_max_plus_one_rejected_quic => (clean::quic(2, 2)),
    conf_medium_sizes_and_max_plus_one_rejected_chan => (clean::chan(2, 2)),
}

// ------------------------------------------------------------------ bulk transfers

const SEG: usize = 96 * 1024;

fn bulk_edges<T: Transport>(mut h: H<T>) {
    h.setup(SEG);
    h.nodes[1]
        .set_request_handler(EP, XFER_SUM, |req| {
            // The copy is complete before the handler runs.
            let r = [
                req.xfer_offset().unwrap() as u64,
                req.data().len() as u64,
                fnv(req.data()),
            ];
            req.reply_short(REPLY, &r).unwrap();
        })
        .unwrap();
    let got = reply_recorder(&mut h.nodes[0], REPLY);
    let good: Vec<(usize, usize)> = vec![
        (0, 64 * 1024),
        (SEG - 1, 1),
        (SEG, 0),
        (7, 3001),
        (SEG - 5000, 5000),
        (65_531, 1),
    ];
    let bad: Vec<(usize, usize, Status)> = vec![
        (SEG - 100, 101, Status::BadLength),
        (SEG + 1, 0, Status::BadSegOffset),
        (SEG, 1, Status::BadSegOffset),
        (SEG * 2, 10, Status::BadSegOffset),
    ];
    let mut want = Vec::new();
    let mut expect_seg = vec![0u8; SEG];
    for (k, &(off, len)) in good.iter().enumerate() {
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + k * 13 + 1) as u8).collect();
        want.push(vec![off as u64, len as u64, fnv(&data)]);
        expect_seg[off..off + len].copy_from_slice(&data);
        h.nodes[0]
            .request_xfer(EP, t(1), off as u32, XFER_SUM, &data, &[k as u64])
            .unwrap();
        let n = want.len();
        h.run("bulk", |_| got.lock().unwrap().len() == n);
    }
    for &(off, len, _) in &bad {
        let data = vec![0xEEu8; len];
        h.nodes[0]
            .request_xfer(EP, t(1), off as u32, XFER_SUM, &data, &[off as u64])
            .unwrap();
    }
    let nbad = bad.len();
    h.run("bulk errors", |h| h.returned(0).len() == nbad);
    assert_eq!(*got.lock().unwrap(), want);
    assert_eq!(
        h.nodes[1].segment(EP).unwrap(),
        &expect_seg[..],
        "bad transfers must not write"
    );
    let statuses = returned_by_arg(&h, 0);
    let mut exp: Vec<(u64, Status, Opcode)> = bad
        .iter()
        .map(|&(o, _, s)| (o as u64, s, Opcode::RequestXfer))
        .collect();
    exp.sort_by_key(|s| s.0);
    assert_eq!(statuses, exp);
    assert!(matches!(
        h.nodes[0]
            .try_request_short(EP, t(1), ECHO, &[])
            .and_then(|()| {
                let big = vec![0u8; MAX_LONG_BYTES + 1];
                h.nodes[0].request_xfer_async(EP, t(1), 0, XFER_SUM, &big, &[])
            }),
        Err(AmError::BadArg(_))
    ));
}

backend_tests! { bulk_edges:
    conf_bulk_at_segment_edges_mem => (clean::mem(2, 3)),
    conf_bulk_at_segment_edges_udp => (clean::udp(2, 3)),
    conf_bulk_at_segment_edges_quic => (clean::quic(2, 3)),
    conf_bulk_at_segment_edges_chan => (clean::chan(2, 3)),
}

/// Node 1 answers each bulk transfer to `XFER_SUM` with its checksum (counting the runs),
/// node 0 records the answers; 64 KiB of test data to send.
fn bulk_checksums<T: Transport>(h: &mut H<T>) -> (Arc<AtomicUsize>, Replies, Vec<u8>) {
    h.setup(SEG);
    let hits = counting_handler(&mut h.nodes[1], EP, XFER_SUM, |req| {
        let r = [fnv(req.data())];
        req.reply_short(REPLY, &r).unwrap();
    });
    let got = reply_recorder(&mut h.nodes[0], REPLY);
    let data: Vec<u8> = (0..64 * 1024).map(|i| (i % 251) as u8).collect();
    (hits, got, data)
}

#[test]
fn conf_bulk_under_loss_lands_intact_mem() {
    let mut h = mem(2, FaultModel::lossy(0.1), &mem_cfg(), seed(31));
    let (hits, got, data) = bulk_checksums(&mut h);
    let part = 12 * 1024;
    for k in 0..8u32 {
        h.nodes[0]
            .request_xfer_async(EP, t(1), k * part as u32, XFER_SUM, &data[..part], &[])
            .unwrap();
    }
    h.run("lossy bulk", |_| got.lock().unwrap().len() == 8);
    assert_eq!(
        hits.load(Ordering::SeqCst),
        8,
        "each bulk handler ran exactly once"
    );
    assert!(
        got.lock()
            .unwrap()
            .iter()
            .all(|r| r[0] == fnv(&data[..part]))
    );
    assert!(matches!(
        h.nodes[0].request_xfer_async(EP, t(1), 0, XFER_SUM, &data, &[]),
        Ok(())
    ));
}

/// Real loss under QUIC: bursts of lost full-size packets look to QUIC's path-MTU detection
/// like a black hole. A phase of heavy loss, then a clean one: the path must keep carrying
/// full-size AM frames (a bulk message's fragments are all full-size but its last, so none
/// would complete again), and every bulk message lands whole, none returned.
#[test]
fn conf_bulk_across_a_phase_of_wire_loss_quic() {
    let lossy = Duration::from_millis(3000);
    let mut h = common::quic_wire_loss(2, &udp_cfg(), 0.0, 0.0, 0.2, seed(37));
    let (hits, got, data) = bulk_checksums(&mut h);
    let refused = |h: &H<Faulty<QuicTransport>>| -> u64 {
        h.nodes
            .iter()
            .map(|b| b.transport().counters().send_refused())
            .sum()
    };
    let mut sent = 0;
    let flood = |h: &mut H<Faulty<QuicTransport>>, sent: &mut usize, upto: usize| {
        while *sent < upto
            && went_out(h.nodes[0].request_xfer_async(EP, t(1), 0, XFER_SUM, &data, &[]))
        {
            *sent += 1;
        }
    };
    let start = std::time::Instant::now();
    h.run("lossy phase", |h| {
        flood(h, &mut sent, usize::MAX);
        start.elapsed() > lossy || refused(h) > 0 || !h.returned(0).is_empty()
    });
    for b in &h.nodes {
        b.transport().set_wire_loss(0.0).unwrap();
    }
    let want = sent + 16;
    h.run("clean phase", |h| {
        flood(h, &mut sent, want);
        got.lock().unwrap().len() == want || refused(h) > 0 || !h.returned(0).is_empty()
    });
    assert_eq!(
        refused(&h),
        0,
        "quinn refused full-size datagrams (seed {})",
        h.seed
    );
    let returned = h.returned(0);
    assert!(
        returned.is_empty(),
        "returned {returned:?} (seed {})",
        h.seed
    );
    assert_eq!(
        hits.load(Ordering::SeqCst),
        want,
        "each bulk handler ran once"
    );
    assert!(got.lock().unwrap().iter().all(|r| r[0] == fnv(&data)));
}

// ------------------------------------------------------------------ get transfers

fn get_xfer<T: Transport>(mut h: H<T>) {
    h.setup(SEG);
    for (i, b) in h.nodes[1].segment_mut(EP).unwrap().iter_mut().enumerate() {
        *b = (i * 11 % 256) as u8;
    }
    type Done = Vec<(usize, usize, Vec<u64>)>;
    let done: Arc<Mutex<Done>> = Arc::default();
    let d = done.clone();
    h.nodes[0]
        .set_reply_handler(EP, GOT, move |r| {
            d.lock()
                .unwrap()
                .push((r.xfer_offset().unwrap(), r.data().len(), r.args().to_vec()));
        })
        .unwrap();
    h.nodes[0]
        .get_xfer(EP, t(1), 100, GOT, 10, 5000, &[42])
        .unwrap();
    h.nodes[0]
        .get_xfer(EP, t(1), 0, GOT, 20_000, 64 * 1024, &[43])
        .unwrap();
    h.run("get", |_| done.lock().unwrap().len() == 2);
    let remote = h.nodes[1].segment(EP).unwrap().to_vec();
    let local = h.nodes[0].segment(EP).unwrap();
    assert_eq!(&local[10..5010], &remote[100..5100]);
    assert_eq!(&local[20_000..20_000 + 65_536], &remote[..65_536]);
    assert_eq!(
        h.nodes[1].stats().requests_handled,
        0,
        "no handler runs at the replier"
    );
    assert_eq!(
        sorted(done.lock().unwrap().clone()),
        vec![(10, 5000, vec![42]), (20_000, 65_536, vec![43])]
    );
    // Out of range at the remote end comes back; at the local end fails at the call.
    h.nodes[0]
        .get_xfer(EP, t(1), (SEG - 10) as u32, GOT, 0, 11, &[44])
        .unwrap();
    h.run("get error", |h| h.returned(0).len() == 1);
    let r = h.returned(0)[0];
    assert_eq!(
        (r.status, r.opcode, r.args()),
        (Status::BadLength, Opcode::RequestGet, &[44][..])
    );
    assert!(matches!(
        h.nodes[0].get_xfer(EP, t(1), 0, GOT, (SEG - 1) as u32, 2, &[]),
        Err(AmError::BadSegment { .. })
    ));
    assert!(matches!(
        h.nodes[0].get_xfer(EP, t(1), 0, ECHO, 0, 2, &[]),
        Err(AmError::BadHandler(_))
    ));
}

backend_tests! { get_xfer:
    conf_get_xfer_runs_handler_only_at_requester_mem => (clean::mem(2, 4)),
    conf_get_xfer_runs_handler_only_at_requester_udp => (clean::udp(2, 4)),
    conf_get_xfer_runs_handler_only_at_requester_chan => (clean::chan(2, 4)),
}

// ------------------------------------------------------------------ exactly once

fn fetch_add<T: Transport>(mut h: H<T>, per_client: u64) {
    h.setup(8);
    h.nodes[0]
        .set_request_handler(EP, FETCH_ADD, |mut req| {
            let add = req.args()[0];
            let seg = req.segment_mut();
            let old = u64::from_le_bytes(seg[..8].try_into().unwrap());
            seg[..8].copy_from_slice(&(old + add).to_le_bytes());
            req.reply_short(REPLY, &[old]).unwrap();
        })
        .unwrap();
    let clients = h.nodes.len() - 1;
    let logs: Vec<_> = (1..=clients)
        .map(|i| reply_recorder(&mut h.nodes[i], REPLY))
        .collect();
    let mut left = vec![per_client; clients + 1];
    let total = per_client * clients as u64;
    h.run("fetch-and-add", |h| {
        for (i, l) in left.iter_mut().enumerate().skip(1) {
            while *l > 0 && went_out(h.nodes[i].try_request_short(EP, t(0), FETCH_ADD, &[1])) {
                *l -= 1;
            }
        }
        logs.iter()
            .map(|l| l.lock().unwrap().len() as u64)
            .sum::<u64>()
            == total
    });
    let counter = u64::from_le_bytes(h.nodes[0].segment(EP).unwrap()[..8].try_into().unwrap());
    assert_eq!(counter, total, "counter exact (seed {})", h.seed);
    let olds: Vec<u64> = logs
        .iter()
        .flat_map(|l| l.lock().unwrap().iter().map(|r| r[0]).collect::<Vec<_>>())
        .collect();
    assert_eq!(
        sorted(olds),
        (0..total).collect::<Vec<_>>(),
        "every old value seen once (seed {})",
        h.seed
    );
    assert!(h.returned.iter().all(|r| r.lock().unwrap().is_empty()));
}

#[test]
fn conf_fetch_add_exact_under_loss_dup_reorder_mem() {
    let s = seed(5);
    let mut h = mem(4, FaultModel::lossy(0.1), &mem_cfg(), s);
    h.nodes.iter_mut().for_each(|_| {});
    fetch_add(h, 300);
}
#[test]
fn conf_fetch_add_exact_under_loss_dup_many_seeds_mem() {
    for k in 0..8 {
        let s = seed(100 + k);
        fetch_add(mem(3, FaultModel::lossy(0.1), &mem_cfg(), s), 60);
    }
}
backend_tests! { fetch_add:
    conf_fetch_add_exact_under_loss_dup_udp => (udp(3, &udp_cfg(), 0.1, 0.1, seed(6)), 150),
    conf_fetch_add_exact_under_loss_dup_quic => (quic(3, &udp_cfg(), 0.1, 0.1, seed(7)), 100),
    conf_fetch_add_exact_under_loss_dup_chan => (chan(3, &udp_cfg(), 0.1, 0.1, seed(6)), 150),
}

#[test]
fn conf_duplicate_request_replays_cached_reply_mem() {
    let f = FaultModel {
        dup: 1.0,
        ..FaultModel::none()
    };
    let mut h = mem(2, f, &mem_cfg(), seed(8));
    h.setup(0);
    let runs = counting_handler(&mut h.nodes[1], EP, ECHO, |req| {
        req.reply_short(REPLY, &[7]).unwrap();
    });
    let got = reply_recorder(&mut h.nodes[0], REPLY);
    let mut sent = 0;
    h.run("dups", |h| {
        while sent < 20 && h.nodes[0].try_request_short(EP, t(1), ECHO, &[]).is_ok() {
            sent += 1;
        }
        got.lock().unwrap().len() == 20 && h.net.as_ref().unwrap().in_flight() == 0
    });
    assert_eq!(runs.load(Ordering::SeqCst), 20, "handler never reruns");
    assert_eq!(
        got.lock().unwrap().len(),
        20,
        "reply handler runs once per request"
    );
    assert!(
        h.nodes[1].stats().dup_requests >= 20,
        "duplicates answered from the reply cache"
    );
    assert!(
        h.nodes[0].stats().dup_responses >= 20,
        "duplicate replies dropped"
    );
}

/// `cfg` with one credit and a sequence number that wraps after six requests.
fn wrapping_one_slot(cfg: Config) -> Config {
    Config {
        credits: 1,
        initial_seq: u32::MAX - 5,
        ..cfg
    }
}

backend_tests! { fetch_add_single:
    conf_sequence_wrap_mem =>
        (mem(2, FaultModel::lossy(0.1), &wrapping_one_slot(mem_cfg()), seed(9)), 40),
    conf_sequence_wrap_udp => (udp(2, &wrapping_one_slot(udp_cfg()), 0.05, 0.05, seed(10)), 40),
}

fn fetch_add_single<T: Transport>(mut h: H<T>, n: u64) {
    h.setup(8);
    let runs = Arc::new(AtomicU64::new(0));
    let r = runs.clone();
    h.nodes[1]
        .set_request_handler(EP, FETCH_ADD, move |req| {
            let old = r.fetch_add(1, Ordering::SeqCst);
            req.reply_short(REPLY, &[old]).unwrap();
        })
        .unwrap();
    let got = reply_recorder(&mut h.nodes[0], REPLY);
    let mut sent = 0;
    h.run("wrap", |h| {
        if sent < n
            && h.nodes[0]
                .try_request_short(EP, t(1), FETCH_ADD, &[])
                .is_ok()
        {
            sent += 1;
        }
        got.lock().unwrap().len() as u64 == n
    });
    assert_eq!(runs.load(Ordering::SeqCst), n);
    let olds: Vec<u64> = got.lock().unwrap().iter().map(|r| r[0]).collect();
    assert_eq!(
        olds,
        (0..n).collect::<Vec<_>>(),
        "one slot: in order, each exactly once"
    );
}

// ------------------------------------------------------------------ credits and storms

fn storm<T: Transport>(mut h: H<T>, per_pair: usize) {
    h.setup(0);
    let n = h.nodes.len();
    let logs: Vec<_> = (0..n)
        .map(|i| {
            bind_echo(&mut h.nodes[i]);
            reply_recorder(&mut h.nodes[i], REPLY)
        })
        .collect();
    let mut left: Vec<Vec<usize>> = vec![vec![per_pair; n]; n];
    let want = per_pair * (n - 1);
    #[allow(clippy::needless_range_loop)]
    h.run("storm", |h| {
        for i in 0..n {
            for j in 0..n {
                if i == j {
                    continue;
                }
                while left[i][j] > 0
                    && went_out(h.nodes[i].try_request_short(EP, t(j), ECHO, &[i as u64, j as u64]))
                {
                    left[i][j] -= 1;
                }
            }
        }
        logs.iter().all(|l| l.lock().unwrap().len() == want)
    });
    for (i, l) in logs.iter().enumerate() {
        assert!(l.lock().unwrap().iter().all(|a| a[0] == i as u64));
    }
}

backend_tests! { storm:
    conf_all_to_all_storm_full_credits_mem =>
        (mem(6, FaultModel::lossy(0.05), &mem_cfg(), seed(11)), 100),
    conf_all_to_all_storm_full_credits_udp => (clean::udp(4, 12), 200),
    conf_all_to_all_storm_full_credits_chan => (clean::chan(4, 12), 200),
}

/// Each node on its own thread with blocking sends: a blocked send services incoming
/// requests, so mutual floods through one credit cannot deadlock.
#[test]
fn conf_all_to_all_storm_blocking_threads_udp() {
    let n = 4;
    let per_pair = 300u64;
    let cfg = Config {
        credits: 1,
        ..udp_cfg()
    };
    let h = udp(n, &cfg, 0.0, 0.0, seed(13));
    let mut h = h;
    h.setup(0);
    let done = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = h
        .nodes
        .drain(..)
        .enumerate()
        .map(|(i, mut b)| {
            let done = done.clone();
            std::thread::spawn(move || {
                bind_echo(&mut b);
                let got = reply_recorder(&mut b, REPLY);
                for k in 0..per_pair {
                    for j in 0..n {
                        if j != i {
                            b.request_short(EP, t(j), ECHO, &[k]).unwrap();
                        }
                    }
                }
                let want = per_pair as usize * (n - 1);
                while got.lock().unwrap().len() < want {
                    b.poll().unwrap();
                    b.wait(Duration::from_millis(5)).unwrap();
                }
                done.fetch_add(1, Ordering::SeqCst);
                // Keep answering until everyone is done.
                while done.load(Ordering::SeqCst) < n {
                    b.poll().unwrap();
                    b.wait(Duration::from_millis(1)).unwrap();
                }
                b.outstanding()
            })
        })
        .collect();
    for th in threads {
        assert_eq!(th.join().unwrap(), 0);
    }
}

fn credits_bounded<T: Transport>(mut h: H<T>) {
    let got = node_1_echoes(&mut h, 0);
    let credits = h.nodes[0].core().config().credits;
    for _ in 0..credits {
        h.nodes[0].try_request_short(EP, t(1), ECHO, &[1]).unwrap();
    }
    assert!(matches!(
        h.nodes[0].try_request_short(EP, t(1), ECHO, &[1]),
        Err(AmError::WouldBlock)
    ));
    assert_eq!(h.nodes[0].outstanding(), credits);
    assert_eq!(h.nodes[0].credits_available(h.addr(1)), 0);
    // Other peers are unaffected.
    assert!(h.nodes[0].try_request_short(EP, t(2), ECHO, &[2]).is_ok());
    bind_echo(&mut h.nodes[2]);
    h.run("credits", |_| got.lock().unwrap().len() == credits + 1);
    assert_eq!(h.nodes[0].credits_available(h.addr(1)), credits);
}

/// `cfg` with `credits` credits per peer.
fn with_credits(credits: usize, cfg: Config) -> Config {
    Config { credits, ..cfg }
}

backend_tests! { credits_bounded:
    conf_credits_bounded_try_would_block_mem =>
        (mem(3, FaultModel::none(), &with_credits(3, mem_cfg()), seed(14))),
    conf_credits_bounded_try_would_block_udp =>
        (udp(3, &with_credits(8, udp_cfg()), 0.0, 0.0, seed(14))),
    conf_credits_bounded_try_would_block_chan =>
        (chan(3, &with_credits(8, udp_cfg()), 0.0, 0.0, seed(14))),
}

// ------------------------------------------------------------------ tags and protection

fn tag_mismatch<T: Transport>(mut h: H<T>) {
    let _got = node_1_echoes(&mut h, 0);
    let wrong = h.nodes[1].name(EP);
    h.nodes[0].map(EP, t(9), wrong, Tag(0xBAD)).unwrap();
    h.nodes[0].request_short(EP, t(9), ECHO, &[5, 6]).unwrap();
    h.run("bad tag", |h| h.returned(0).len() == 1);
    let r = h.returned(0)[0];
    assert_eq!(r.status, Status::BadTag);
    assert_eq!(r.opcode, Opcode::RequestShort);
    assert_eq!(r.args(), &[5, 6]);
    assert_eq!(r.dest, wrong);
    assert_eq!(r.handler, ECHO);
    assert_eq!(
        h.nodes[1].stats().requests_handled,
        0,
        "no event at the destination"
    );
    assert_eq!(
        h.nodes[1].stats().bad_tag,
        1,
        "the destination counts the foreign request"
    );
}

backend_tests! { tag_mismatch:
    conf_tag_mismatch_returns_to_sender_mem => (clean::mem(2, 15)),
    conf_tag_mismatch_returns_to_sender_udp => (clean::udp(2, 15)),
    conf_tag_mismatch_returns_to_sender_quic => (clean::quic(2, 15)),
    conf_tag_mismatch_returns_to_sender_chan => (clean::chan(3, 15)),
}

#[test]
fn conf_tag_matrix_all_none_mem() {
    // (destination endpoint tag, message tag, delivered?)
    let cases = [
        (Tag(7), Tag(7), true),
        (Tag(7), Tag(8), false),
        (Tag::ALL, Tag(8), true),
        (Tag::ALL, Tag::ALL, true),
        (Tag::ALL, Tag::NONE, false),
        (Tag::NONE, Tag::NONE, false),
        (Tag::NONE, Tag(7), false),
        (Tag(7), Tag::NONE, false),
        (Tag(7), Tag::ALL, false),
    ];
    for (k, &(dst, msg, ok)) in cases.iter().enumerate() {
        assert_eq!(msg.admits(dst), ok, "case {k}");
        let mut h = clean::mem(2, 16);
        let got = node_1_echoes(&mut h, 0);
        h.nodes[1].set_tag(EP, dst).unwrap();
        let name = h.nodes[1].name(EP);
        h.nodes[0].map(EP, t(50), name, msg).unwrap();
        h.nodes[0]
            .request_short(EP, t(50), ECHO, &[k as u64])
            .unwrap();
        h.run("tag matrix", |h| {
            got.lock().unwrap().len() + h.returned(0).len() == 1
        });
        if ok {
            assert_eq!(got.lock().unwrap().len(), 1, "case {k}");
        } else {
            assert_eq!(h.returned(0)[0].status, Status::BadTag, "case {k}");
        }
    }
}

#[test]
fn conf_set_tag_revokes_old_tag_mem() {
    let mut h = clean::mem(2, 17);
    let got = node_1_echoes(&mut h, 0);
    echo_and_wait(&mut h, "before", 1, &got, 1);
    h.nodes[1].set_tag(EP, Tag(99)).unwrap();
    h.nodes[0].request_short(EP, t(1), ECHO, &[2]).unwrap();
    h.run("after", |h| h.returned(0).len() == 1);
    assert_eq!(h.returned(0)[0].status, Status::BadTag);
    assert_eq!(got.lock().unwrap().len(), 1);
    assert_eq!(h.nodes[1].tag(EP).unwrap(), Tag(99));
}

// ------------------------------------------------------------------ handlers, endpoints, tables

#[test]
fn conf_bad_handler_and_bad_endpoint_return_mem() {
    let mut h = clean::mem(2, 18);
    h.setup(0);
    bind_echo(&mut h.nodes[1]);
    let _ = reply_recorder(&mut h.nodes[1], REPLY); // a reply handler: wrong kind for requests
    let _ = reply_recorder(&mut h.nodes[0], REPLY);
    h.nodes[0]
        .request_short(EP, t(1), HandlerId(200), &[1])
        .unwrap(); // unset
    h.nodes[0]
        .request_short(EP, t(1), HandlerId(300), &[2])
        .unwrap(); // out of range
    h.nodes[0].request_short(EP, t(1), REPLY, &[3]).unwrap(); // reply handler
    h.nodes[0]
        .request_short(EP, t(1), HandlerId(0), &[4])
        .unwrap(); // handler 0
    let ghost = EndpointName {
        node: h.addr(1),
        ep: EpId(9),
    };
    h.nodes[0].map(EP, t(20), ghost, TAG).unwrap();
    h.nodes[0]
        .request_medium(EP, t(20), ECHO, b"hi", &[5])
        .unwrap();
    h.run("bad handlers", |h| h.returned(0).len() == 5);
    use Status::*;
    assert_eq!(
        returned_by_arg(&h, 0),
        vec![
            (1, BadHandler, Opcode::RequestShort),
            (2, BadHandler, Opcode::RequestShort),
            (3, BadHandler, Opcode::RequestShort),
            (4, BadHandler, Opcode::RequestShort),
            (5, BadEndpoint, Opcode::RequestMedium),
        ]
    );
    assert_eq!(h.nodes[1].stats().requests_handled, 0);
    // A freed endpoint answers BadEndpoint too.
    let e2 = h.nodes[1].alloc_endpoint().unwrap();
    h.nodes[1].free_endpoint(e2).unwrap();
    let freed = h.nodes[1].name(e2);
    h.nodes[0].map(EP, t(21), freed, TAG).unwrap();
    h.nodes[0].request_short(EP, t(21), ECHO, &[6]).unwrap();
    h.run("freed", |h| h.returned(0).len() == 6);
    assert_eq!(h.returned(0)[5].status, BadEndpoint);
}

#[test]
fn conf_tables_defaults_limits_and_resize_mem() {
    const { assert!(MAX_ARGS >= 8 && MAX_MEDIUM_BYTES >= 512 && MAX_LONG_BYTES >= 8192) };
    const { assert!(DEFAULT_HANDLERS >= 256 && DEFAULT_TRANSLATIONS >= 256) };
    let mut h = clean::mem(2, 19);
    let b = &mut h.nodes[0];
    let ep = b.alloc_endpoint().unwrap();
    assert_eq!(b.tag(ep).unwrap(), Tag::NONE);
    assert_eq!(b.num_handlers(ep).unwrap(), 256);
    assert_eq!(b.num_translations(ep).unwrap(), 256);
    assert!(b.segment(ep).unwrap().is_empty());
    assert_eq!(b.event_mask(), EventMask::NoEvents);
    assert!(b.set_num_handlers(ep, 255).is_err());
    assert!(b.set_num_handlers(ep, MAX_HANDLERS + 1).is_err());
    assert!(b.set_num_translations(ep, MAX_TRANSLATIONS + 1).is_err());
    b.set_num_handlers(ep, 1000).unwrap();
    b.set_request_handler(ep, HandlerId(999), |_req| {})
        .unwrap();
    assert!(matches!(
        b.set_request_handler(ep, HandlerId(1000), |_req| {}),
        Err(AmError::BadHandler(_))
    ));
    assert!(matches!(
        b.set_request_handler(ep, HandlerId(0), |_req| {}),
        Err(AmError::BadHandler(_))
    ));
    // Translation table: map, in-use, unmap, map_any, unbound index.
    let name = EndpointName {
        node: h.addr(1),
        ep: EpId(0),
    };
    let b = &mut h.nodes[0];
    b.map(ep, t(3), name, TAG).unwrap();
    assert!(matches!(b.map(ep, t(3), name, TAG), Err(AmError::InUse)));
    assert_eq!(b.translation(ep, t(3)).unwrap(), (name, TAG));
    b.unmap(ep, t(3)).unwrap();
    b.map(ep, t(3), name, Tag(5)).unwrap();
    assert_eq!(b.map_any(ep, name, TAG).unwrap(), t(0));
    assert!(matches!(
        b.try_request_short(ep, t(4), ECHO, &[]),
        Err(AmError::BadEntry(_))
    ));
    assert!(matches!(
        b.try_request_short(ep, t(4000), ECHO, &[]),
        Err(AmError::BadEntry(_))
    ));
    assert!(matches!(
        b.try_request_short(EpId(77), t(0), ECHO, &[]),
        Err(AmError::BadEndpoint(_))
    ));

    // Shrinking leaves stale indices that come back BadHandler.
    let mut h = clean::mem(2, 19);
    h.setup(0);
    h.nodes[1].set_num_handlers(EP, 600).unwrap();
    h.nodes[1]
        .set_request_handler(EP, HandlerId(500), |r| r.reply_short(REPLY, &[]).unwrap())
        .unwrap();
    h.nodes[1].set_num_handlers(EP, 256).unwrap();
    h.nodes[0]
        .request_short(EP, t(1), HandlerId(500), &[])
        .unwrap();
    h.run("stale", |h| h.returned(0).len() == 1);
    assert_eq!(h.returned(0)[0].status, Status::BadHandler);
}

#[test]
fn conf_self_map_loopback_mem() {
    let mut h = mem(1, FaultModel::none(), &mem_cfg(), seed(20));
    h.setup(SEG);
    bind_echo(&mut h.nodes[0]);
    let got = reply_recorder(&mut h.nodes[0], REPLY);
    h.nodes[0]
        .request_short(EP, t(0), ECHO, &[1, 2, 3])
        .unwrap();
    h.nodes[0]
        .request_xfer(EP, t(0), 100, ECHO, &[9; 5000], &[4])
        .unwrap();
    h.run("self", |_| got.lock().unwrap().len() == 2);
    assert_eq!(&h.nodes[0].segment(EP).unwrap()[100..5100], &[9; 5000][..]);
}

#[test]
fn conf_auto_ack_when_handler_does_not_reply_mem() {
    let mut h = mem(2, FaultModel::lossy(0.1), &mem_cfg(), seed(21));
    h.setup(0);
    let runs = counting_handler(&mut h.nodes[1], EP, SILENT, |_req| {});
    let got = reply_recorder(&mut h.nodes[0], REPLY);
    let mut sent = 0;
    h.run("auto ack", |h| {
        while sent < 50 && h.nodes[0].try_request_short(EP, t(1), SILENT, &[]).is_ok() {
            sent += 1;
        }
        sent == 50 && h.nodes[0].outstanding() == 0
    });
    assert_eq!(runs.load(Ordering::SeqCst), 50);
    assert!(
        got.lock().unwrap().is_empty(),
        "an automatic ack runs no reply handler"
    );
    assert_eq!(h.nodes[1].stats().auto_acks, 50);
    assert!(h.returned(0).is_empty());
}

/// Replying twice does not compile (`Request::reply_*` consume the request; see the
/// `compile_fail` doc test on `Request`), and a reply context has no send method at all.
/// At run time the reply handler therefore runs once per request even when the network
/// duplicates everything.
#[test]
fn conf_reply_at_most_once_enforced_by_type_mem() {
    let f = FaultModel {
        dup: 0.5,
        ..FaultModel::lossy(0.1)
    };
    let mut h = mem(2, f, &mem_cfg(), seed(22));
    let got = node_1_echoes(&mut h, 0);
    let mut k = 0;
    h.run("once", |h| {
        while k < 30 && h.nodes[0].try_request_short(EP, t(1), ECHO, &[k]).is_ok() {
            k += 1;
        }
        got.lock().unwrap().len() == 30 && h.nodes[0].outstanding() == 0
    });
    h.run_for(Duration::from_secs(1));
    let g: Vec<u64> = got.lock().unwrap().iter().map(|a| a[0]).collect();
    assert_eq!(sorted(g), (0..30).collect::<Vec<_>>());
}

#[test]
fn conf_bad_reply_handler_returns_reply_to_replier_mem() {
    let mut h = mem(2, FaultModel::lossy(0.1), &mem_cfg(), seed(23));
    h.setup(0);
    h.nodes[1]
        .set_request_handler(EP, ECHO, |req| {
            req.reply_short(HandlerId(77), &[11]).unwrap()
        })
        .unwrap();
    h.nodes[0].request_short(EP, t(1), ECHO, &[]).unwrap();
    h.run("reply returned", |h| {
        h.returned(1).len() == 1 && h.nodes[0].outstanding() == 0
    });
    h.run_for(Duration::from_secs(2));
    let r = h.returned(1);
    assert_eq!(r.len(), 1, "returned exactly once");
    assert_eq!(
        (r[0].status, r[0].opcode, r[0].args()),
        (Status::BadHandler, Opcode::ReplyShort, &[11][..])
    );
    assert!(h.returned(0).is_empty(), "the request itself was delivered");
}

// ------------------------------------------------------------------ unreachable, epochs

fn unreachable<T: Transport>(mut h: H<T>, kill: impl FnOnce(&mut H<T>)) {
    let got = node_1_echoes(&mut h, SEG);
    kill(&mut h);
    h.nodes[0].try_request_short(EP, t(1), ECHO, &[1]).unwrap();
    h.nodes[0]
        .try_request_medium(EP, t(1), ECHO, b"x", &[2])
        .unwrap();
    h.nodes[0]
        .request_xfer_async(EP, t(1), 0, ECHO, &[0; 3000], &[3])
        .unwrap();
    h.run("unreachable", |h| h.returned(0).len() == 3);
    let r: Vec<(u64, Status)> = returned_by_arg(&h, 0)
        .into_iter()
        .map(|(arg, status, _)| (arg, status))
        .collect();
    assert_eq!(
        r,
        vec![
            (1, Status::Unreachable),
            (2, Status::Unreachable),
            (3, Status::Unreachable)
        ]
    );
    assert!(got.lock().unwrap().is_empty());
    assert_eq!(h.nodes[0].outstanding(), 0, "credits come back");
}

fn short_deadline(mut c: Config) -> Config {
    c.give_up = Duration::from_millis(500);
    c
}

#[test]
fn conf_unreachable_after_deadline_mem() {
    let h = mem(2, FaultModel::none(), &short_deadline(mem_cfg()), seed(24));
    unreachable(h, |h| h.net.as_ref().unwrap().crash(1));
}
#[test]
fn conf_unreachable_after_deadline_udp() {
    let h = udp(2, &short_deadline(udp_cfg()), 0.0, 0.0, seed(24));
    unreachable(h, |h| {
        h.nodes[1].transport_mut().set_faults(1, 1.0, 0.0);
        let _ = h.nodes.pop();
    });
}
#[test]
fn conf_unreachable_after_deadline_quic() {
    let h = quic(2, &short_deadline(udp_cfg()), 0.0, 0.0, seed(24));
    unreachable(h, |h| {
        let _ = h.nodes.pop();
    });
}
#[test]
fn conf_unreachable_after_deadline_chan() {
    let h = chan(2, &short_deadline(udp_cfg()), 0.0, 0.0, seed(24));
    // Dropping a node takes it off the network.
    unreachable(h, |h| {
        let _ = h.nodes.pop();
    });
}

#[test]
fn conf_late_reply_rejected_after_unreachable_mem() {
    let cfg = short_deadline(mem_cfg());
    let mut h = mem(2, FaultModel::none(), &cfg, seed(25));
    let got = node_1_echoes(&mut h, 0);
    // Replies from 1 to 0 take 5 s; the requester gives up after 0.5 s.
    h.net
        .as_ref()
        .unwrap()
        .set_link_delay(1, 0, Duration::from_secs(5));
    h.nodes[0].request_short(EP, t(1), ECHO, &[77]).unwrap();
    h.run("late reply", |h| h.returned(1).len() == 1);
    assert_eq!(h.returned(0).len(), 1);
    assert_eq!(h.returned(0)[0].status, Status::Unreachable);
    assert_eq!(
        h.nodes[1].stats().requests_handled,
        1,
        "delivered at most once"
    );
    assert!(
        got.lock().unwrap().is_empty(),
        "the requester never sees the late reply"
    );
    let r = h.returned(1)[0];
    assert_eq!(
        (r.status, r.opcode, r.args()),
        (Status::ReplyRejected, Opcode::ReplyShort, &[77][..])
    );
    // After the epoch change the pair works again.
    h.net.as_ref().unwrap().set_link_delay(1, 0, Duration::ZERO);
    echo_and_wait(&mut h, "recovered", 78, &got, 1);
}

#[test]
fn conf_restarted_peer_never_gets_old_epoch_messages_mem() {
    let mut h = clean::mem(2, 26);
    let got = node_1_echoes(&mut h, 0);
    echo_and_wait(&mut h, "first", 1, &got, 1);
    // Node 1 crashes; requests wait; node 1 restarts with a new incarnation.
    let net = h.net.clone().unwrap();
    net.crash(1);
    h.nodes[0].request_short(EP, t(1), ECHO, &[2]).unwrap();
    h.run_for(Duration::from_millis(50));
    let mut fresh = Bundle::new(net.restart(1), mem_cfg()).unwrap();
    let ep = fresh.alloc_endpoint().unwrap();
    fresh.set_tag(ep, TAG).unwrap();
    let runs = counting_handler(&mut fresh, ep, ECHO, |req| {
        let a = req.args().to_vec();
        req.reply_short(REPLY, &a).unwrap();
    });
    fresh
        .set_return_handler(ep, |r| panic!("unexpected return {r:?}"))
        .unwrap();
    h.nodes[1] = fresh;
    h.run("old epoch refused", |h| h.returned(0).len() == 1);
    assert_eq!(h.returned(0)[0].status, Status::Unreachable);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "old-epoch request never ran on the new incarnation"
    );
    echo_and_wait(&mut h, "new epoch", 3, &got, 2);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[test]
fn conf_congestion_when_peer_table_full_mem() {
    let cfg = Config {
        max_peers: 2,
        ..Config::default()
    };
    let mut h = mem(3, FaultModel::none(), &cfg, seed(27));
    h.setup(0);
    bind_echo(&mut h.nodes[0]);
    let g1 = reply_recorder(&mut h.nodes[1], REPLY);
    let _g2 = reply_recorder(&mut h.nodes[2], REPLY);
    h.nodes[1].request_short(EP, t(0), ECHO, &[1]).unwrap();
    h.run("first peer", |_| g1.lock().unwrap().len() == 1);
    // Node 0 knows itself? No: it knows node 1 only, plus room for one more.
    h.nodes[0].request_short(EP, t(0), ECHO, &[0]).unwrap(); // self uses the second entry
    h.nodes[2].request_short(EP, t(0), ECHO, &[2]).unwrap();
    h.run("congestion", |h| h.returned(2).len() == 1);
    assert_eq!(h.returned(2)[0].status, Status::Congestion);
}

// ------------------------------------------------------------------ FIFO

fn fifo<T: Transport>(mut h: H<T>, n: u64) -> u64 {
    h.setup(SEG);
    let seen: Arc<Mutex<Vec<u64>>> = Arc::default();
    let s = seen.clone();
    h.nodes[1]
        .set_request_handler(EP, ECHO, move |req| {
            s.lock().unwrap().push(req.args()[0]);
        })
        .unwrap();
    let a1 = h.addr(1);
    h.nodes[0].set_fifo(a1, true).unwrap();
    let mut k = 0;
    h.run("fifo", |h| {
        while k < n {
            let r = match k % 3 {
                0 => h.nodes[0].try_request_short(EP, t(1), ECHO, &[k]),
                1 => h.nodes[0].try_request_medium(EP, t(1), ECHO, &[k as u8; 100], &[k]),
                _ => h.nodes[0].request_xfer_async(EP, t(1), 0, ECHO, &[k as u8; 4000], &[k]),
            };
            if !went_out(r) {
                break;
            }
            k += 1;
        }
        seen.lock().unwrap().len() as u64 == n && h.nodes[0].outstanding() == 0
    });
    assert_eq!(
        *seen.lock().unwrap(),
        (0..n).collect::<Vec<_>>(),
        "FIFO order (seed {})",
        h.seed
    );
    h.nodes[1].stats().fifo_parked
}

#[test]
fn conf_fifo_reorder_buffer_under_reordering_mem() {
    let parked = fifo(mem(2, FaultModel::lossy(0.1), &mem_cfg(), seed(28)), 300);
    assert!(
        parked > 0,
        "early requests were parked in the reorder buffer, not dropped"
    );
}
backend_tests! { fifo:
    conf_fifo_order_under_loss_udp => (udp(2, &udp_cfg(), 0.1, 0.1, seed(29)), 300),
    conf_fifo_order_under_loss_chan => (chan(2, &udp_cfg(), 0.1, 0.1, seed(29)), 300),
}

// ------------------------------------------------------------------ polling and events

#[test]
fn conf_poll_is_bounded_per_call_mem() {
    let cfg = Config {
        poll_batch: 4,
        credits: 32,
        ..Config::default()
    };
    let mut h = mem(2, FaultModel::none(), &cfg, seed(30));
    h.setup(0);
    h.nodes[1].set_request_handler(EP, SILENT, |_r| {}).unwrap();
    for _ in 0..32 {
        h.nodes[0].try_request_short(EP, t(1), SILENT, &[]).unwrap();
    }
    h.net
        .as_ref()
        .unwrap()
        .advance_to(isotach_am::Time(1_000_000));
    let mut calls = Vec::new();
    loop {
        let n = h.nodes[1].poll().unwrap();
        if n == 0 {
            break;
        }
        calls.push(n);
    }
    assert!(calls.iter().all(|&n| n <= 4), "{calls:?}");
    assert_eq!(calls.iter().sum::<usize>(), 32);
}

#[test]
fn conf_event_mask_and_binary_semaphore_mem() {
    let mut h = clean::mem(2, 32);
    h.setup(0);
    h.nodes[1].set_request_handler(EP, SILENT, |_r| {}).unwrap();
    // No mask: times out (virtual time).
    assert!(!h.nodes[1].wait_sema(Duration::from_millis(10)).unwrap());
    h.nodes[0].request_short(EP, t(1), SILENT, &[]).unwrap();
    h.nodes[0].request_short(EP, t(1), SILENT, &[]).unwrap();
    // Pool non-empty, still no mask: no event.
    assert!(!h.nodes[1].wait_sema(Duration::from_millis(10)).unwrap());
    // Enabling NOTEMPTY on a non-empty pool fires at once and clears the mask.
    h.nodes[1].set_event_mask(EventMask::NotEmpty);
    assert!(h.nodes[1].wait_sema(Duration::from_millis(10)).unwrap());
    assert_eq!(h.nodes[1].event_mask(), EventMask::NoEvents);
    // Binary: a second wait does not see a second count.
    assert!(!h.nodes[1].wait_sema(Duration::from_millis(10)).unwrap());
    assert_eq!(h.nodes[1].poll().unwrap(), 2);
}

#[test]
fn conf_returned_message_raises_notempty_mem() {
    let cfg = short_deadline(mem_cfg());
    let mut h = mem(2, FaultModel::none(), &cfg, seed(33));
    h.setup(0);
    h.net.as_ref().unwrap().crash(1);
    h.nodes[0].request_short(EP, t(1), ECHO, &[1]).unwrap();
    h.nodes[0].set_event_mask(EventMask::NotEmpty);
    // The wait keeps retransmitting and gives up; the returned message is an event.
    assert!(h.nodes[0].wait_sema(Duration::from_secs(5)).unwrap());
    assert!(h.returned(0).is_empty(), "handlers only run in poll");
    h.nodes[0].poll().unwrap();
    assert_eq!(h.returned(0)[0].status, Status::Unreachable);
}

fn wait_blocks<T: Transport + 'static>(mut h: H<T>) {
    h.setup(0);
    let mut b1 = h.nodes.pop().unwrap();
    bind_echo(&mut b1);
    let stop = Arc::new(AtomicUsize::new(0));
    let st = stop.clone();
    let server = std::thread::spawn(move || {
        while st.load(Ordering::SeqCst) == 0 {
            if b1.wait(Duration::from_millis(20)).unwrap() {
                b1.poll().unwrap();
            }
        }
    });
    let got = reply_recorder(&mut h.nodes[0], REPLY);
    for k in 0..100 {
        h.nodes[0].request_short(EP, t(1), ECHO, &[k]).unwrap();
        while got.lock().unwrap().len() <= k as usize {
            h.nodes[0].wait(Duration::from_millis(50)).unwrap();
            h.nodes[0].poll().unwrap();
        }
    }
    stop.store(1, Ordering::SeqCst);
    server.join().unwrap();
    assert_eq!(got.lock().unwrap().len(), 100);
}

backend_tests! { wait_blocks:
    conf_wait_blocks_until_arrival_udp => (clean::udp(2, 34)),
    conf_wait_blocks_until_arrival_chan => (clean::chan(2, 34)),
}

fn async_request<T: Transport + 'static>(make: impl FnOnce() -> H<T>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        // Built inside the runtime: sockets register with it and wait_async is a real wait.
        let mut h = make();
        h.setup(0);
        let mut b1 = h.nodes.pop().unwrap();
        let mut b0 = h.nodes.pop().unwrap();
        bind_echo(&mut b1);
        let got = reply_recorder(&mut b0, REPLY);
        let server = tokio::spawn(async move {
            loop {
                if b1.wait_async(Duration::from_millis(20)).await.unwrap() {
                    b1.poll().unwrap();
                }
                if b1.stats().requests_handled == 50 {
                    // Linger so retransmitted duplicates are answered.
                    for _ in 0..10 {
                        b1.wait_async(Duration::from_millis(5)).await.unwrap();
                        b1.poll().unwrap();
                    }
                    return;
                }
            }
        });
        for k in 0..50u64 {
            b0.request_short_async(EP, t(1), ECHO, &[k]).await.unwrap();
        }
        while got.lock().unwrap().len() < 50 {
            b0.wait_async(Duration::from_millis(20)).await.unwrap();
            b0.poll().unwrap();
        }
        server.await.unwrap();
    });
}

backend_tests! { async_request:
    conf_async_request_and_wait_udp => (|| clean::udp(2, 35)),
    conf_async_request_and_wait_chan => (|| clean::chan(2, 35)),
}

#[test]
fn conf_async_request_and_wait_mem() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut h = mem(2, FaultModel::lossy(0.1), &mem_cfg(), seed(36));
    let got = node_1_echoes(&mut h, 0);
    // Within the credit window (one thread drives both nodes, so a send must not block).
    rt.block_on(async {
        for k in 0..8u64 {
            h.nodes[0]
                .request_short_async(EP, t(1), ECHO, &[k])
                .await
                .unwrap();
        }
        while got.lock().unwrap().len() < 8 {
            h.nodes[1].poll().unwrap();
            h.nodes[0]
                .wait_async(Duration::from_millis(1))
                .await
                .unwrap();
            h.nodes[0].poll().unwrap();
        }
    });
    assert_eq!(got.lock().unwrap().len(), 8);
}

// ------------------------------------------------------------------ hostile input, security

#[test]
fn conf_hostile_datagrams_are_ignored_udp() {
    let mut h = udp(2, &udp_cfg(), 0.0, 0.0, seed(37));
    let got = node_1_echoes(&mut h, 0);
    let target = match h.addr(1) {
        isotach_am::NodeAddr::Ip(a) => a,
        isotach_am::NodeAddr::Mem(_) => unreachable!(),
    };
    let junk = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut rng = isotach_am::rng::Rng::new(h.seed);
    for i in 0..500 {
        let len = rng.range(0, 1500) as usize;
        let mut d: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        if i % 2 == 0 && d.len() > 4 {
            d[0] = b'A';
            d[1] = b'M';
            d[2] = 1;
        }
        junk.send_to(&d, target).unwrap();
    }
    echo_and_wait(&mut h, "after junk", 1, &got, 1);
    h.run("junk counted", |h| h.nodes[1].stats().bad_frames >= 400);
}

#[test]
fn conf_quic_unknown_peer_refused() {
    let mut h = quic(1, &short_deadline(udp_cfg()), 0.0, 0.0, seed(38));
    h.setup(0);
    let runs = counting_handler(&mut h.nodes[0], EP, ECHO, |_req| {});
    // A stranger with a certificate from another CA.
    let other = isotach_am::backend::quic::make_ca("rogue CA").unwrap();
    let id = isotach_am::backend::quic::make_node_identity(&other, "rogue").unwrap();
    let q = isotach_am::backend::quic::QuicConfig::new("127.0.0.1:0".parse().unwrap(), id);
    let mut rogue = Bundle::new(
        Faulty::new(QuicTransport::bind(q).unwrap()),
        short_deadline(udp_cfg()),
    )
    .unwrap();
    let ep = rogue.alloc_endpoint().unwrap();
    let log: common::Log = Arc::default();
    let l = log.clone();
    rogue
        .set_return_handler(ep, move |r| l.lock().unwrap().push(*r))
        .unwrap();
    let name = h.nodes[0].name(EP);
    rogue.map(ep, t(0), name, TAG).unwrap();
    rogue.request_short(ep, t(0), ECHO, &[1]).unwrap();
    h.nodes.push(rogue);
    h.returned.push(log);
    h.run("rogue refused", |h| h.returned(1).len() == 1);
    assert_eq!(h.returned(1)[0].status, Status::Unreachable);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    let seen: HashSet<u64> = h.returned(1).iter().map(|r| r.args()[0]).collect();
    assert_eq!(seen, HashSet::from([1]));
    // Both ends count the failed handshakes: the node refused an incoming one, the rogue's
    // connection attempts failed.
    h.run("refusals counted", |h| {
        h.nodes[0].transport().quic_stats().handshakes_refused >= 1
            && h.nodes[1].transport().quic_stats().connects_failed >= 1
    });
    let last = h.nodes[0].transport().handshakes().last_error();
    assert!(last.is_some_and(|e| e.contains("handshake from")));
    assert_eq!(h.nodes[0].transport().quic_stats().connects_failed, 0);
}

#[test]
fn conf_chan_full_inbox_drops_and_am_recovers() {
    // Inboxes of 4 datagrams: a burst of 64 requests overflows them (dropped like a full NIC
    // ring) and retransmission still delivers every one exactly once.
    let net = isotach_am::backend::chan::ChanNet::with_inbox(4);
    let cfg = udp_cfg();
    let mut h = H {
        nodes: (0..2)
            .map(|_| Bundle::new(net.node(), cfg.clone()).unwrap())
            .collect(),
        net: None,
        seed: seed(39),
        returned: Vec::new(),
    };
    let got = node_1_echoes(&mut h, 0);
    let mut sent = 0u64;
    h.run("overflowed burst", |h| {
        while sent < 64 && went_out(h.nodes[0].try_request_short(EP, t(1), ECHO, &[sent])) {
            sent += 1;
        }
        got.lock().unwrap().len() == 64
    });
    let args: Vec<u64> = got.lock().unwrap().iter().map(|a| a[0]).collect();
    assert_eq!(sorted(args), (0..64).collect::<Vec<_>>());
    assert!(net.stats().inbox_full > 0, "the burst overflowed an inbox");
    assert!(h.nodes[0].stats().retransmits > 0);
}
