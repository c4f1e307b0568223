//! The unordered baseline of `bench transfers`: the messages of the same transfers sent as
//! plain AM packets (the daemons' reliable FIFO links over loopback UDP) straight between the
//! hosts, with no SIU, token manager or logical time — what the same traffic costs without
//! ordering. One thread and one socket per host.
//!
//! A transfer between accounts on pages `pf` and `pt` sends what its isochrons would: a read
//! of each account to its first copy (none when this host holds one), a sched of each to
//! every other host holding a copy, and, once both reads were answered, an assign of each to
//! the same copies. For `--idiom add` there is no second round: the read stands for the add
//! the nearest copy answers, the update for the add every other copy runs. Its latency runs
//! from sending the first packet to both reads answered, as in the ordered run.

use super::cpu::{CpuSpan, CpuWindow};
use super::daemons::latency_hist;
use super::transfers::Bank;
use isotach_am::NodeAddr;
use isotach_am::Transport;
use isotach_am::backend::udp::{UdpConfig, UdpTransport};
use isotach_am::port::{DEFAULT_TAG, PacketPort};
use isotach_proto::packet::MEM_MESSAGE_LEN;
use isotach_rng::Rng;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// A read request: answer with [`READ_REPLY`].
const READ: u8 = 1;
/// The answer to a [`READ`].
const READ_REPLY: u8 = 2;
/// A sched or assign of a copy: nothing to answer.
const UPDATE: u8 = 3;
/// Seed of the account and amount choices (not the ordered run's: only the shape matters).
const WORKLOAD_SEED: u64 = 0x0DE5;
/// How long a host keeps answering after every host finished, for the last replies.
const LINGER: Duration = Duration::from_millis(50);
/// Fragments a host may have queued on its links (all peers) and still issue transfers: its
/// back-pressure, far below the links' own bound (`link::QUEUE_MAX_DEFAULT` per peer), whose
/// overflow would drop packets and break the link.
const BACKLOG_MAX: usize = 4_096;

/// What the baseline runs.
pub(crate) struct UnorderedParams {
    pub(crate) bank: Bank,
    pub(crate) clients: usize,
    pub(crate) seconds: f64,
    /// The assigns go out once the reads are answered (sched-assign); `add` has one round.
    pub(crate) assign_round: bool,
    /// How long a wait polls before it sleeps (the ordered run's `--spin-us`).
    pub(crate) spin: Duration,
}

/// What it measured.
pub(crate) struct UnorderedNumbers {
    pub(crate) transfers_per_s: f64,
    pub(crate) latency_p50_us: f64,
    /// The process's CPU time over host 0's window per transfer counted in it, µs.
    pub(crate) cpu_us_per_transfer: Option<f64>,
}

/// The hosts holding page `p` (page `p` at hosts `p` and `p + 1`, as `forks_map`).
fn copies(bank: Bank, page: u32) -> [usize; 2] {
    let p = page as usize % bank.hosts;
    [p, (p + 1) % bank.hosts]
}

/// A packet of an isotach message's size: kind, transfer id, padding.
fn packet(kind: u8, id: u64) -> [u8; MEM_MESSAGE_LEN] {
    let mut b = [0u8; MEM_MESSAGE_LEN];
    b[0] = kind;
    b[1..9].copy_from_slice(&id.to_le_bytes());
    b
}

fn id_of(p: &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(p.get(1..9)?.try_into().ok()?))
}

/// One host's socket and its peers (every other host, in host order).
struct Host {
    me: usize,
    port: PacketPort<UdpTransport>,
}

impl Host {
    fn peer(&self, host: usize) -> usize {
        debug_assert_ne!(host, self.me);
        if host < self.me { host } else { host - 1 }
    }

    fn host(&self, peer: usize) -> usize {
        if peer < self.me { peer } else { peer + 1 }
    }

    fn send(&mut self, host: usize, kind: u8, id: u64) -> Result<(), String> {
        let peer = self.peer(host);
        self.port
            .send(peer, &packet(kind, id))
            .map_err(|e| format!("host {}: send to {host}: {e}", self.me))
    }

    /// Sends the updates of one account (every remote copy).
    fn update(&mut self, bank: Bank, page: u32, id: u64) -> Result<(), String> {
        for c in copies(bank, page) {
            if c != self.me {
                self.send(c, UPDATE, id)?;
            }
        }
        Ok(())
    }

    /// Fails when a link dropped a packet (a full queue, an inbox overflow or a broken link):
    /// the numbers would not count the same messages as the ordered run's.
    fn check_nothing_lost(&self) -> Result<(), String> {
        let s = self.port.links().stats();
        if s.links_lost + s.fragments_dropped + s.inbox_overflow > 0 {
            return Err(format!(
                "host {}: the baseline lost packets (links lost {}, fragments dropped {}, \
                 inbox overflows {})",
                self.me, s.links_lost, s.fragments_dropped, s.inbox_overflow
            ));
        }
        Ok(())
    }

    /// Sends a read of `page` unless this host holds a copy; whether it did.
    fn read(&mut self, bank: Bank, page: u32, id: u64) -> Result<bool, String> {
        let cs = copies(bank, page);
        if cs.contains(&self.me) {
            return Ok(false);
        }
        self.send(cs[0], READ, id)?;
        Ok(true)
    }
}

/// A transfer waiting for its reads.
struct Waiting {
    pages: [u32; 2],
    sent: Instant,
    reads_left: u8,
}

struct HostResult {
    lat_ns: hdrhistogram::Histogram<u64>,
    transfers: u64,
    window_s: f64,
    /// Host 0 only: the process's CPU time over its window.
    cpu: Option<CpuSpan>,
}

fn run_host(
    mut host: Host,
    p: &UnorderedParams,
    done: &AtomicUsize,
    deadline: Instant,
) -> Result<HostResult, String> {
    let me = host.me;
    let bank = p.bank;
    let mut rng = Rng::stream(WORKLOAD_SEED, me as u64);
    let warm_end = Instant::now() + Duration::from_secs_f64((p.seconds / 5.0).min(0.2));
    let end = warm_end + Duration::from_secs_f64(p.seconds);
    let mut window = Window {
        bank,
        assign_round: p.assign_round,
        warm_end,
        end,
        lat: latency_hist().map_err(|e| e.to_string())?,
        transfers: 0,
    };
    let mut waiting: HashMap<u64, Waiting> = HashMap::with_capacity(p.clients);
    let (mut next_id, mut finished) = (0u64, None);
    let mut cpu = CpuWindow::default();
    loop {
        let now = Instant::now();
        if me == 0 {
            cpu.observe(now, warm_end, end);
        }
        if now >= deadline {
            return Err(format!("host {me}: unordered baseline passed its deadline"));
        }
        // At most one transfer per client and pass: a transfer with no remote read settles at
        // once, and when every copy is local (two hosts) the clients would otherwise issue
        // forever without sending, receiving or reading the clock.
        let mut issued = 0;
        while now < end
            && waiting.len() < p.clients
            && issued < p.clients
            && host.port.links().queued() < BACKLOG_MAX
        {
            issued += 1;
            let (a, b, _) = bank.draw(&mut rng);
            let pages = [bank.addr(a).page(), bank.addr(b).page()];
            let id = next_id;
            next_id += 1;
            let mut reads_left = 0;
            for &page in &pages {
                reads_left += u8::from(host.read(bank, page, id)?);
            }
            for &page in &pages {
                host.update(bank, page, id)?;
            }
            let w = Waiting {
                pages,
                sent: now,
                reads_left,
            };
            if reads_left == 0 {
                window.decide(&mut host, id, &w)?;
            } else {
                waiting.insert(id, w);
            }
        }
        if now >= end && waiting.is_empty() && finished.is_none() {
            done.fetch_add(1, Ordering::AcqRel);
            finished = Some(now);
        }
        if finished.is_some_and(|t| done.load(Ordering::Acquire) == bank.hosts && now - t >= LINGER)
        {
            break;
        }
        // Send what this round issued before waiting (the port transmits only in `poll`;
        // waiting first left every new transfer queued until the wait timed out).
        host.port.poll().map_err(|e| format!("host {me}: {e}"))?;
        host.check_nothing_lost()?;
        // Clients left idle by the cap above (not by back-pressure) issue in the next pass
        // without waiting.
        let idle_clients =
            now < end && waiting.len() < p.clients && host.port.links().queued() < BACKLOG_MAX;
        if !idle_clients && !host.port.links().has_packets() {
            host.port
                .wait(Duration::from_millis(1))
                .map_err(|e| format!("host {me}: {e}"))?;
            host.port.poll().map_err(|e| format!("host {me}: {e}"))?;
        }
        while let Some((peer, bytes)) = host.port.recv() {
            let (Some(&kind), Some(id)) = (bytes.first(), id_of(&bytes)) else {
                return Err(format!("host {me}: a malformed baseline packet"));
            };
            match kind {
                READ => host.send(host.host(peer), READ_REPLY, id)?,
                READ_REPLY => {
                    let Some(w) = waiting.get_mut(&id) else {
                        return Err(format!("host {me}: a reply to an unknown transfer {id}"));
                    };
                    w.reads_left -= 1;
                    if w.reads_left == 0 {
                        let w = waiting.remove(&id).expect("just found");
                        window.decide(&mut host, id, &w)?;
                    }
                }
                _ => {}
            }
        }
    }
    Ok(HostResult {
        lat_ns: window.lat,
        transfers: window.transfers,
        window_s: (end - warm_end).as_secs_f64(),
        cpu: cpu.span(),
    })
}

/// The measurement window of one host: what counts and what was counted.
struct Window {
    bank: Bank,
    assign_round: bool,
    warm_end: Instant,
    end: Instant,
    lat: hdrhistogram::Histogram<u64>,
    transfers: u64,
}

impl Window {
    /// Both reads answered: the assigns go out (sched-assign), the latency is recorded when
    /// in the window.
    fn decide(&mut self, host: &mut Host, id: u64, w: &Waiting) -> Result<(), String> {
        if self.assign_round {
            for &page in &w.pages {
                host.update(self.bank, page, id)?;
            }
        }
        if w.sent >= self.warm_end && w.sent < self.end {
            let _ = self.lat.record(w.sent.elapsed().as_nanos().max(1) as u64);
            self.transfers += 1;
        }
        Ok(())
    }
}

/// Runs the baseline: one thread and one loopback UDP socket per host.
pub(crate) fn unordered_transfers(p: &UnorderedParams) -> Result<UnorderedNumbers, String> {
    let n = p.bank.hosts;
    let mut sockets = Vec::with_capacity(n);
    for _ in 0..n {
        let cfg = UdpConfig::new(SocketAddr::from(([127, 0, 0, 1], 0))).with_spin(p.spin);
        let t = UdpTransport::with_config(cfg)
            .map_err(|e| format!("binding a loopback socket: {e}"))?;
        sockets.push(t);
    }
    let addrs: Vec<NodeAddr> = sockets.iter().map(Transport::local_addr).collect();
    let deadline = Instant::now() + Duration::from_secs_f64(p.seconds * 3.0 + 30.0);
    let done = Arc::new(AtomicUsize::new(0));
    let results = std::thread::scope(|s| {
        let mut threads = Vec::with_capacity(n);
        for (me, t) in sockets.into_iter().enumerate() {
            let peers: Vec<NodeAddr> = (0..n).filter(|&h| h != me).map(|h| addrs[h]).collect();
            let port =
                PacketPort::new(t, &peers, DEFAULT_TAG).map_err(|e| format!("host {me}: {e}"))?;
            let done = Arc::clone(&done);
            threads.push(s.spawn(move || run_host(Host { me, port }, p, &done, deadline)));
        }
        threads
            .into_iter()
            .map(|t| {
                t.join()
                    .unwrap_or_else(|_| Err("a baseline host panicked".into()))
            })
            .collect::<Result<Vec<_>, String>>()
    })?;
    let mut lat = latency_hist().map_err(|e| e.to_string())?;
    let (mut transfers, mut window) = (0u64, 0.0f64);
    let mut cpu = None;
    for r in &results {
        let _ = lat.add(&r.lat_ns);
        transfers += r.transfers;
        window = window.max(r.window_s);
        cpu = cpu.or(r.cpu);
    }
    Ok(UnorderedNumbers {
        transfers_per_s: transfers as f64 / window.max(1e-6),
        cpu_us_per_transfer: cpu.and_then(|c| c.us_per(transfers)),
        latency_p50_us: if lat.is_empty() {
            0.0
        } else {
            lat.value_at_quantile(0.5) as f64 / 1000.0
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_baseline_moves_transfers_and_every_read_is_answered() {
        let n = unordered_transfers(&UnorderedParams {
            bank: Bank {
                hosts: 3,
                accounts: 30,
            },
            clients: 2,
            seconds: 0.2,
            assign_round: true,
            spin: Duration::from_micros(50),
        })
        .unwrap();
        assert!(n.transfers_per_s > 0.0 && n.latency_p50_us > 0.0);
    }

    /// With two hosts every account has a copy on each, so no transfer waits for a reply: the
    /// clients used to issue forever within one pass and the baseline never ended.
    #[test]
    fn the_baseline_ends_when_every_copy_is_local() {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(unordered_transfers(&UnorderedParams {
                bank: Bank {
                    hosts: 2,
                    accounts: 16,
                },
                clients: 4,
                seconds: 0.2,
                assign_round: false,
                spin: Duration::ZERO,
            }));
        });
        let n = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the baseline ended")
            .unwrap();
        assert!(n.transfers_per_s > 0.0);
    }

    #[test]
    fn pages_have_two_copies_and_ids_round_trip() {
        let bank = Bank {
            hosts: 4,
            accounts: 8,
        };
        assert_eq!(copies(bank, 3), [3, 0]);
        assert_eq!(id_of(&packet(READ, 0xABCD)), Some(0xABCD));
        assert_eq!(id_of(&[1, 2]), None);
    }
}
