//! `isotach bench transfers`: the bank workload a user would otherwise give Redis.
//!
//! H hosts (a token manager, H SIU daemons and H SMM applications over loopback UDP, as in
//! `bench isochrons`) share A accounts. Account `a` is slot `a / H` of page `a % H`, and page
//! `p` has copies at hosts `p` and `p + 1` (mod H). Each host's application keeps `--clients`
//! transfers in flight (one application per host, so a host's clients are its concurrent
//! transfers); a transfer moves a random amount between two random accounts atomically:
//!
//! - `--idiom sched-assign`: one isochron reads both balances and scheds both; when both reads
//!   resolved the application decides the new balances and assigns both in the next isochron.
//!   The transfer's latency runs from issuing the first isochron to the decision (both reads
//!   resolved; the assign follows at once and nobody can read the accounts before it lands).
//! - `--idiom add`: one isochron of two read-modify-write `add`s (the debit adds the amount's
//!   two's complement); every copy runs them, and the transfer's latency runs to both old
//!   values answered. No overdraft check: an `add` cannot look at the balance first.
//!
//! Balances are 64-bit and start at [`INITIAL_BALANCE`]; memory starts zeroed, so a slot holds
//! the balance minus the initial one (wrapping). After the window every host drains, host 0
//! reads every account in one isochron and the run fails (exit 1) unless the total is
//! conserved — the slots sum to zero.
//!
//! Measured in the same run: the raw UDP round trip (as every daemon bench), the same
//! messages sent as plain unordered AM packets between the same number of processes'
//! sockets (`ordered_to_unordered_ratio`), and Redis on the same workload when
//! `redis-server` and `redis-benchmark` are on PATH (`redis.rs`).

use super::cpu::{CpuSpan, CpuWindow};
use super::daemons::{
    CommonArgs, Outcome, RawNumbers, Threads, exit, finish, latency_hist, left, print, ratio,
    run_apps, spawn_apps, start,
};
use super::pulses::{PulseClock, Pulses};
use super::redis::{RedisNumbers, redis_transfers};
use super::unordered::{UnorderedParams, unordered_transfers};
use crate::UsageError;
use crate::philo_app::forks_map;
use clap::{Args, ValueEnum};
use hdrhistogram::Histogram;
use isotach_proto::packet::Width;
use isotach_rng::Rng;
use isotach_smm::{Addr, ReadHandle, SiuLink, Smm, SmmLimits, SmmNode};
use serde::Serialize;
use std::collections::VecDeque;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Every account's balance before the first transfer (memory holds the difference to it).
pub(crate) const INITIAL_BALANCE: u64 = 1_000_000_000;
/// Largest amount one transfer moves.
pub(crate) const AMOUNT_MAX: u64 = 100;
/// Seed of the account and amount choices; host `h` draws stream `h` of it.
const WORKLOAD_SEED: u64 = 0x7EA5;
/// Most accounts: the audit reads them all in one isochron.
pub(crate) const ACCOUNTS_MAX: u32 = 4096;

/// How a transfer is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Idiom {
    /// Read and sched both accounts in one isochron, assign both in the next.
    SchedAssign,
    /// One isochron of two atomic `add`s.
    Add,
}

/// `isotach bench transfers`.
#[derive(Debug, Args)]
pub(crate) struct TransfersArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// Transfers each host keeps in flight (its clients).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=256))]
    clients: u32,
    /// Accounts, spread over the hosts' pages (page p has copies at hosts p and p + 1).
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(2..=ACCOUNTS_MAX as i64))]
    accounts: u32,
    /// How a transfer is written.
    #[arg(long, value_enum, default_value_t = Idiom::SchedAssign)]
    idiom: Idiom,
    /// Skip the Redis comparison even when redis-server and redis-benchmark are on PATH.
    #[arg(long)]
    no_redis: bool,
    /// Requests in each redis-benchmark run.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1000..=100_000_000))]
    redis_requests: u64,
}

/// `isotach bench transfers --json` (keys documented in `docs/bench.md`).
#[derive(Debug, Serialize)]
struct TransfersReport {
    hosts: usize,
    clients_per_host: u32,
    /// Transfers kept in flight in all: hosts × clients. A closed loop's rate is what is in
    /// flight over the latency, so this is what to match when comparing with Redis.
    transfers_in_flight: u64,
    accounts: u32,
    idiom: Idiom,
    seconds: f64,
    mode: &'static str,
    /// Where the SIUs ran (`embedded` or `daemon`).
    siu: &'static str,
    /// `--spin-us`.
    spin_us: u64,
    transfers: u64,
    transfers_per_s: f64,
    transfer_latency_p50_us: f64,
    transfer_latency_p99_us: f64,
    pulses_per_s: f64,
    /// The process's CPU time over host 0's window per transfer counted in it, µs (the TM,
    /// the SIUs and the applications are its threads); null where the clock cannot be read.
    cpu_us_per_transfer: Option<f64>,
    /// Cores the process kept busy on average over that window.
    cpu_cores_busy: Option<f64>,
    #[serde(flatten)]
    threads: Threads,
    total_conserved: bool,
    #[serde(flatten)]
    raw: RawNumbers,
    latency_to_raw_rtt_ratio: f64,
    unordered_transfers_per_s: f64,
    unordered_latency_p50_us: f64,
    /// The same for the unordered baseline (its hosts are threads of this process too).
    unordered_cpu_us_per_transfer: Option<f64>,
    ordered_to_unordered_ratio: f64,
    redis: Option<RedisNumbers>,
    redis_skipped: Option<String>,
    redis_transfers_per_s: Option<f64>,
    redis_pipelined_transfers_per_s: Option<f64>,
    /// Redis's transfers in flight in each run: its clients, and clients × pipeline depth.
    redis_transfers_in_flight: Option<u64>,
    redis_pipelined_transfers_in_flight: Option<u64>,
    ratio_vs_redis: Option<f64>,
    ratio_vs_redis_pipelined: Option<f64>,
    #[serde(flatten)]
    end: Outcome,
}

/// Where the accounts live.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bank {
    pub(crate) hosts: usize,
    pub(crate) accounts: u32,
}

impl Bank {
    /// Account `a`: slot `a / hosts` of page `a % hosts`.
    pub(crate) fn addr(self, account: u32) -> Addr {
        let hosts = self.hosts as u32;
        Addr::new(account % hosts, account / hosts)
    }

    /// Two distinct random accounts and an amount of 1..=AMOUNT_MAX.
    pub(crate) fn draw(self, rng: &mut Rng) -> (u32, u32, u64) {
        let n = u64::from(self.accounts);
        let from = rng.below(n);
        // Distinct: an offset of 1..n from `from`, wrapping.
        let to = (from + 1 + rng.below(n - 1)) % n;
        (from as u32, to as u32, rng.range_inclusive(1, AMOUNT_MAX))
    }
}

/// The new slot values of a transfer of `amount` between slots holding `from` and `to`
/// (balances minus [`INITIAL_BALANCE`], wrapping). An account never goes below zero: it
/// moves what it has.
fn moved(from: u64, to: u64, amount: u64) -> (u64, u64) {
    let balance = INITIAL_BALANCE.wrapping_add(from);
    let amount = amount.min(balance);
    (from.wrapping_sub(amount), to.wrapping_add(amount))
}

/// A transfer whose first isochron is in flight.
struct Pending {
    from: Addr,
    to: Addr,
    amount: u64,
    read_from: ReadHandle,
    read_to: ReadHandle,
    issued: Instant,
}

/// What one host measured.
pub(crate) struct HostTransfers {
    /// Latency of the transfers issued in the window, ns.
    pub(crate) lat_ns: Histogram<u64>,
    /// Transfers issued in the window and settled.
    pub(crate) transfers: u64,
    /// The window's length, s.
    pub(crate) window_s: f64,
    /// Pulses this host's SMM drained during the window, and the window they were counted
    /// over (s): the pulse period the workload saw.
    pub(crate) pulses: Pulses,
    /// Host 0 only: the accounts' slots summed (wrapping) after every host drained.
    pub(crate) audit_sum: Option<u64>,
    /// Host 0 only: the process's CPU time over its window.
    pub(crate) cpu: Option<CpuSpan>,
}

/// The transfer workload of one host.
pub(crate) struct Load {
    pub(crate) bank: Bank,
    pub(crate) idiom: Idiom,
    /// Transfers in flight.
    pub(crate) clients: usize,
    /// The measurement window, s (after a warm-up of a fifth of it, at most 0.2 s).
    pub(crate) seconds: f64,
    /// Every wait ends by then.
    pub(crate) deadline: Instant,
}

/// Issues a transfer's (first) isochron.
fn issue<L: SiuLink>(
    smm: &mut Smm<L>,
    bank: Bank,
    idiom: Idiom,
    rng: &mut Rng,
) -> Result<Pending, String> {
    let (a, b, amount) = bank.draw(rng);
    let (from, to) = (bank.addr(a), bank.addr(b));
    let issued = Instant::now();
    let mut iso = smm.node().isochron();
    let e = |e: isotach_smm::SmmError| e.to_string();
    let (read_from, read_to) = match idiom {
        Idiom::SchedAssign => {
            let handles = (
                iso.read(from, Width::W64).map_err(e)?,
                iso.read(to, Width::W64).map_err(e)?,
            );
            iso.sched(from).map_err(e)?;
            iso.sched(to).map_err(e)?;
            handles
        }
        Idiom::Add => (
            iso.add(from, Width::W64, amount.wrapping_neg())
                .map_err(e)?,
            iso.add(to, Width::W64, amount).map_err(e)?,
        ),
    };
    iso.end().map_err(e)?;
    Ok(Pending {
        from,
        to,
        amount,
        read_from,
        read_to,
        issued,
    })
}

/// Both reads (or adds) settled: take them (a refused one is an error) and, for sched-assign,
/// assign the new balances. Returns the latency.
fn settle<L: SiuLink>(smm: &mut Smm<L>, p: &Pending, idiom: Idiom) -> Result<Duration, String> {
    let node = smm.node();
    let f = node.take_read(p.read_from).map_err(|e| e.to_string())?;
    let t = node.take_read(p.read_to).map_err(|e| e.to_string())?;
    let (Some(f), Some(t)) = (f, t) else {
        return Err("settled a transfer whose reads had not resolved".into());
    };
    let decided = p.issued.elapsed();
    if idiom == Idiom::Add {
        return Ok(decided);
    }
    let (f, t) = moved(f, t, p.amount);
    let mut iso = node.isochron();
    iso.assign(p.from, Width::W64, f)
        .map_err(|e| e.to_string())?;
    iso.assign(p.to, Width::W64, t).map_err(|e| e.to_string())?;
    iso.end().map_err(|e| e.to_string())?;
    Ok(decided)
}

/// Both of a transfer's reads (or adds) have their outcome.
fn settled(node: &SmmNode, p: &Pending) -> bool {
    node.read_settled(p.read_from) && node.read_settled(p.read_to)
}

/// One host's clients for the window, then a drain, the audit (host 0) and the end barriers.
pub(crate) fn host_transfers<L: SiuLink>(
    smm: &mut Smm<L>,
    h: usize,
    load: &Load,
) -> Result<HostTransfers, String> {
    let err = |what: &str, e: &dyn std::fmt::Display| format!("host {h}: {what}: {e}");
    let mut rng = Rng::stream(WORKLOAD_SEED, h as u64);
    let mut lat = latency_hist().map_err(|e| err("histogram", &e))?;
    smm.barrier(0, 1, left(load.deadline))
        .map_err(|e| err("start barrier", &e))?;
    let warm_end = Instant::now() + Duration::from_secs_f64((load.seconds / 5.0).min(0.2));
    let end = warm_end + Duration::from_secs_f64(load.seconds);
    let mut q: VecDeque<Pending> = VecDeque::with_capacity(load.clients);
    let mut transfers = 0;
    let mut pulses = PulseClock::default();
    let mut cpu = CpuWindow::default();
    loop {
        let now = Instant::now();
        pulses.observe(now, smm.node().last_pulse(), warm_end, end);
        if h == 0 {
            cpu.observe(now, warm_end, end);
        }
        while now < end && q.len() < load.clients {
            let p = issue(smm, load.bank, load.idiom, &mut rng);
            q.push_back(p.map_err(|e| err("transfer", &e))?);
        }
        if q.is_empty() {
            break;
        }
        // One number per packet, not every client's handles: the sweep below runs when a
        // read settled.
        let seen = smm.node().reads_settled();
        smm.wait_until(left(load.deadline), |node| node.reads_settled() != seen)
            .map_err(|e| err("transfer", &e))?;
        let mut i = 0;
        while i < q.len() {
            if !settled(smm.node(), &q[i]) {
                i += 1;
                continue;
            }
            let p = q.remove(i).expect("index checked");
            let took = settle(smm, &p, load.idiom).map_err(|e| err("settle", &e))?;
            if p.issued >= warm_end && p.issued < end {
                let _ = lat.record(took.as_nanos().max(1) as u64);
                transfers += 1;
            }
        }
    }
    smm.barrier(1, 1, left(load.deadline))
        .map_err(|e| err("end barrier", &e))?;
    let audit_sum = if h == 0 {
        Some(audit(smm, load).map_err(|e| err("audit", &e))?)
    } else {
        None
    };
    // Nobody leaves while host 0 still reads their copies.
    smm.barrier(1, 1, left(load.deadline))
        .map_err(|e| err("audit barrier", &e))?;
    Ok(HostTransfers {
        lat_ns: lat,
        transfers,
        window_s: (end - warm_end).as_secs_f64(),
        pulses: pulses.closed.unwrap_or_default(),
        audit_sum,
        cpu: cpu.span(),
    })
}

/// Reads every account in one isochron; the slots' wrapping sum (zero when conserved).
fn audit<L: SiuLink>(smm: &mut Smm<L>, load: &Load) -> Result<u64, String> {
    let mut iso = smm.node().isochron();
    let mut reads = Vec::with_capacity(load.bank.accounts as usize);
    for a in 0..load.bank.accounts {
        reads.push(
            iso.read(load.bank.addr(a), Width::W64)
                .map_err(|e| e.to_string())?,
        );
    }
    iso.end().map_err(|e| e.to_string())?;
    let mut sum = 0u64;
    for r in reads {
        sum = sum.wrapping_add(
            smm.wait(r, left(load.deadline))
                .map_err(|e| e.to_string())?,
        );
    }
    Ok(sum)
}

/// `accounts` fit the pages of `hosts` hosts (one page per host); else a usage error ending
/// with `hint`.
pub(crate) fn check_accounts(accounts: u32, hosts: usize, hint: &str) -> Result<(), UsageError> {
    let per_page = accounts.div_ceil(hosts.max(1) as u32);
    let slots = SmmLimits::default().slots_per_page;
    if per_page > slots {
        return Err(UsageError(format!(
            "--accounts {accounts}: {per_page} accounts per page exceed the {slots} slots of a \
             page; {hint}"
        )));
    }
    Ok(())
}

/// SMM limits that let the audit read every account in one isochron.
pub(crate) fn limits(accounts: u32) -> SmmLimits {
    let d = SmmLimits::default();
    SmmLimits {
        isochron_ops_max: d.isochron_ops_max.max(accounts as usize),
        ..d
    }
}

/// `isotach bench transfers`.
pub(crate) fn transfers(a: &TransfersArgs) -> anyhow::Result<ExitCode> {
    let c = &a.common;
    crate::admin::logs::init("warn");
    let started = Instant::now();
    let n = usize::from(c.hosts);
    let bank = Bank {
        hosts: n,
        accounts: a.accounts,
    };
    check_accounts(a.accounts, n, "use more --hosts or fewer accounts")?;
    eprintln!(
        "bench transfers: {n} hosts x {} clients over {} accounts ({:?}), {} s; then the same \
         messages unordered, then Redis",
        a.clients, a.accounts, a.idiom, c.seconds
    );
    let (base, mut lc) = start(c)?;
    let mut problems = Vec::new();
    let deadline = Instant::now() + Duration::from_secs_f64(c.seconds * 3.0 + 40.0);
    let load = std::sync::Arc::new(Load {
        bank,
        idiom: a.idiom,
        clients: a.clients as usize,
        seconds: c.seconds,
        deadline,
    });
    let apps = {
        let load = std::sync::Arc::clone(&load);
        spawn_apps(
            &mut lc,
            forks_map(n),
            limits(a.accounts),
            deadline,
            move |h, mut smm| host_transfers(&mut smm, h, &load),
        )?
    };
    let (hosts, startup_s, pulses_per_s) = run_apps(&lc, apps, &mut problems);
    let raw = finish(c, base, lc.daemons, &mut problems)?;

    let mut lat = latency_hist()?;
    let (mut count, mut window) = (0u64, 0.0f64);
    let mut audit_sum = None;
    let mut cpu = None;
    for r in &hosts {
        let _ = lat.add(&r.lat_ns);
        count += r.transfers;
        window = window.max(r.window_s);
        audit_sum = audit_sum.or(r.audit_sum);
        cpu = cpu.or(r.cpu);
    }
    let total_conserved = audit_sum == Some(0);
    match audit_sum {
        Some(0) => {}
        Some(s) => problems.push(format!(
            "the total is not conserved: the accounts sum to {} more than they started with",
            s as i64
        )),
        None if problems.is_empty() => problems.push("host 0 did not audit the accounts".into()),
        None => {}
    }
    if count == 0 && problems.is_empty() {
        problems.push("no transfer completed during the measurement window".into());
    }
    let window = window.max(1e-6);
    let us = |h: &Histogram<u64>, q: f64| {
        if h.is_empty() {
            0.0
        } else {
            h.value_at_quantile(q) as f64 / 1000.0
        }
    };
    let per_s = count as f64 / window;

    eprintln!("bench transfers: the same messages as plain unordered AM packets");
    let unordered = unordered_transfers(&UnorderedParams {
        bank,
        clients: a.clients as usize,
        seconds: c.seconds,
        assign_round: a.idiom == Idiom::SchedAssign,
        spin: c.spin(),
    });
    let (unordered_per_s, unordered_p50, unordered_cpu_us) = match &unordered {
        Ok(u) => (u.transfers_per_s, u.latency_p50_us, u.cpu_us_per_transfer),
        Err(e) => {
            problems.push(format!("unordered baseline: {e}"));
            (0.0, 0.0, None)
        }
    };

    let (redis, redis_skipped) = if a.no_redis {
        (None, Some("--no-redis".to_string()))
    } else {
        eprintln!("bench transfers: Redis on the same workload");
        match redis_transfers(a.accounts, a.redis_requests) {
            Ok(r) => (Some(r), None),
            Err(why) => (None, Some(why)),
        }
    };
    if let Some(why) = &redis_skipped {
        eprintln!("bench transfers: Redis comparison skipped: {why}");
    }
    let p50 = us(&lat, 0.5);
    let r = TransfersReport {
        hosts: n,
        clients_per_host: a.clients,
        transfers_in_flight: n as u64 * u64::from(a.clients),
        accounts: a.accounts,
        idiom: a.idiom,
        seconds: c.seconds,
        mode: raw.mode,
        siu: c.siu.name(),
        spin_us: c.spin_us,
        transfers: count,
        transfers_per_s: per_s,
        transfer_latency_p50_us: p50,
        transfer_latency_p99_us: us(&lat, 0.99),
        pulses_per_s,
        cpu_us_per_transfer: cpu.and_then(|c| c.us_per(count)),
        cpu_cores_busy: cpu.map(CpuSpan::cores_busy),
        threads: Threads::of(c),
        total_conserved,
        latency_to_raw_rtt_ratio: ratio(p50, raw.like_p50_us()),
        raw,
        unordered_transfers_per_s: unordered_per_s,
        unordered_latency_p50_us: unordered_p50,
        unordered_cpu_us_per_transfer: unordered_cpu_us,
        ordered_to_unordered_ratio: ratio(per_s, unordered_per_s),
        redis_transfers_per_s: redis.as_ref().map(|r| r.transfers_per_s),
        redis_pipelined_transfers_per_s: redis.as_ref().map(|r| r.pipelined_transfers_per_s),
        redis_transfers_in_flight: redis.as_ref().map(|r| u64::from(r.clients)),
        redis_pipelined_transfers_in_flight: redis
            .as_ref()
            .map(|r| u64::from(r.clients) * u64::from(r.pipeline)),
        ratio_vs_redis: redis.as_ref().map(|r| ratio(per_s, r.transfers_per_s)),
        ratio_vs_redis_pipelined: redis
            .as_ref()
            .map(|r| ratio(per_s, r.pipelined_transfers_per_s)),
        redis,
        redis_skipped,
        end: Outcome::new(startup_s, started, total_conserved, problems),
    };
    print(&r, c.json)?;
    Ok(exit(r.end.ok))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accounts_spread_over_every_page_and_draws_are_distinct() {
        let bank = Bank {
            hosts: 4,
            accounts: 10,
        };
        assert_eq!(bank.addr(0), Addr::new(0, 0));
        assert_eq!(bank.addr(5), Addr::new(1, 1));
        assert_eq!(bank.addr(9), Addr::new(1, 2));
        let mut rng = Rng::stream(WORKLOAD_SEED, 0);
        for _ in 0..10_000 {
            let (a, b, amount) = bank.draw(&mut rng);
            assert!(a != b && a < 10 && b < 10, "{a} {b}");
            assert!((1..=AMOUNT_MAX).contains(&amount));
        }
    }

    #[test]
    fn a_transfer_conserves_the_total_and_never_overdraws() {
        let (f, t) = moved(0, 0, 7);
        assert_eq!(f.wrapping_add(t), 0);
        assert_eq!(INITIAL_BALANCE.wrapping_add(f), INITIAL_BALANCE - 7);
        // An account holding 3 in all moves 3, not 7.
        let empty_but_3 = 3u64.wrapping_sub(INITIAL_BALANCE);
        let (f, t) = moved(empty_but_3, 0, 7);
        assert_eq!(INITIAL_BALANCE.wrapping_add(f), 0);
        assert_eq!(t, 3);
    }
}
