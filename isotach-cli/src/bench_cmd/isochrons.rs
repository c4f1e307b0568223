//! `isotach bench isochrons`: every host issues isochrons continuously with at most
//! `--outstanding` in flight, over the real daemons of [`super::daemons`] (the token manager
//! and SIUs of `isotach tm` / `isotach siu`, embedded or as daemons) and N SMM applications in
//! this process, against the raw UDP round trip measured in the same run. Page `p` has copies
//! at hosts `p` and `p + 1` (mod N); host `h`'s isochron reads page `h` (its own copy) and
//! writes pages `h` and `h - 1` (both replicated here and at one neighbour), `--ops`
//! operations in all. Its latency runs from handing it to the SMM (`Isochron` built and ended)
//! until its read resolved at the issuer, which happens when its local part executed.
//! `srefs_per_s` counts the operations of the isochrons completed in the window;
//! `bucket_srefs_executed_per_s` the srefs every SMM executed from its pulse buckets (the
//! copies other hosts' isochrons updated here), summed over hosts.

use super::daemons::{
    CommonArgs, Outcome, RawNumbers, STARTUP_MAX, Threads, exit, finish, latency_hist, left, print,
    ratio, run_apps, spawn_apps, start,
};
use crate::philo_app::forks_map;
use clap::Args;
use hdrhistogram::Histogram;
use isotach_proto::packet::Width;
use isotach_smm::{Addr, AmLink, ReadHandle, Smm, SmmLimits, SmmNode, WaitError};
use serde::Serialize;
use std::collections::VecDeque;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// `isotach bench isochrons`.
#[derive(Debug, Args)]
pub(crate) struct IsochronsArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// Isochrons each host keeps in flight at most.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1024))]
    outstanding: u32,
    /// Operations per isochron: one read of the host's own page plus writes to its two
    /// replicated pages.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    ops: u32,
    /// How each application waits for its oldest isochron: a blocking wait (`Smm::wait_until`)
    /// or an event loop that polls (`Smm::poll`, yielding when a poll found nothing).
    #[arg(long, value_enum, default_value_t = Driver::Wait)]
    driver: Driver,
}

/// How a bench application waits for its reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Driver {
    /// `Smm::wait_until`: blocks in the link.
    Wait,
    /// `Smm::poll` in a loop: never blocks.
    Poll,
}

/// Drives `smm` until `done` holds, as `driver` says; an error when `deadline` passes.
pub(crate) fn drive(
    smm: &mut Smm<AmLink>,
    driver: Driver,
    deadline: Instant,
    done: impl Fn(&SmmNode) -> bool,
) -> Result<(), WaitError> {
    let timeout = left(deadline);
    if driver == Driver::Wait {
        return smm.wait_until(timeout, done);
    }
    loop {
        if done(smm.node()) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(WaitError::TimedOut(timeout));
        }
        // A poll that found nothing leaves the cores to the nodes it waits for.
        if smm.poll()? == 0 {
            std::thread::yield_now();
        }
    }
}

/// `isotach bench isochrons --json` (keys documented in `docs/bench.md`).
#[derive(Debug, Serialize)]
struct IsochronsReport {
    hosts: usize,
    seconds: f64,
    mode: &'static str,
    /// Where the SIUs ran (`embedded` or `daemon`).
    siu: &'static str,
    /// `--spin-us`.
    spin_us: u64,
    /// `--driver`: how the applications waited (`wait` or `poll`).
    driver: Driver,
    outstanding: u32,
    ops_per_isochron: u32,
    isochrons: u64,
    isochrons_per_s: f64,
    srefs: u64,
    srefs_per_s: f64,
    bucket_srefs_executed_per_s: f64,
    isochron_latency_p50_us: f64,
    isochron_latency_p99_us: f64,
    isochron_latency_max_us: f64,
    pulses_per_s: f64,
    #[serde(flatten)]
    threads: Threads,
    #[serde(flatten)]
    raw: RawNumbers,
    latency_to_raw_rtt_ratio: f64,
    #[serde(flatten)]
    end: Outcome,
}

/// What one host's load generator measured.
struct HostLoad {
    lat_ns: Histogram<u64>,
    isochrons: u64,
    srefs: u64,
    window_s: f64,
}

/// Every host's load, as the flags give it.
#[derive(Debug, Clone, Copy)]
struct Load {
    /// Hosts in the cluster.
    hosts: usize,
    /// Isochrons in flight per host at most.
    outstanding: usize,
    ops: u32,
    seconds: f64,
    deadline: Instant,
    driver: Driver,
}

/// One host's load: isochrons with at most `outstanding` in flight for `warm + seconds`, then
/// a drain and an end barrier (nobody leaves while others still write to its copies).
fn host_load(smm: &mut Smm<AmLink>, h: usize, load: Load) -> Result<HostLoad, String> {
    let Load {
        hosts: n,
        outstanding: w,
        ops,
        seconds,
        deadline,
        driver,
    } = load;
    let err = |what: &str, e: &dyn std::fmt::Display| format!("host {h}: {what}: {e}");
    let own = h as u32;
    let left_page = ((h + n - 1) % n) as u32;
    let mut lat = latency_hist().map_err(|e| err("histogram", &e))?;
    smm.barrier(0, 1, left(deadline))
        .map_err(|e| err("start barrier", &e))?;
    let t_begin = Instant::now();
    let warm_end = t_begin + Duration::from_secs_f64((seconds / 5.0).min(0.2));
    let end = warm_end + Duration::from_secs_f64(seconds);
    let mut q: VecDeque<(ReadHandle, Instant)> = VecDeque::new();
    let (mut isochrons, mut stats0, mut value) = (0u64, None, 0u64);
    let mut stats1 = smm.node().stats();
    while Instant::now() < end {
        if stats0.is_none() && Instant::now() >= warm_end {
            stats0 = Some(smm.node().stats());
        }
        while q.len() < w {
            let t0 = Instant::now();
            let mut iso = smm.node().isochron();
            let rh = iso
                .read(Addr::new(own, 0), Width::W32)
                .map_err(|e| err("read", &e))?;
            for i in 1..ops {
                value = (value + 1) & 0xFFFF_FFFF;
                let page = if i % 2 == 1 { own } else { left_page };
                iso.write(Addr::new(page, 1 + h as u32), Width::W32, value)
                    .map_err(|e| err("write", &e))?;
            }
            iso.end().map_err(|e| err("issue", &e))?;
            q.push_back((rh, t0));
        }
        let (front, _) = q[0];
        drive(smm, driver, deadline, |node| {
            node.read_value(front).is_some()
        })
        .map_err(|e| err("isochron", &e))?;
        let now = Instant::now();
        while let Some(&(rh, t0)) = q.front() {
            if smm.node().read_value(rh).is_none() {
                break;
            }
            let _ = smm.node().take_read(rh);
            q.pop_front();
            if t0 >= warm_end && now < end {
                let _ = lat.record((now - t0).as_nanos().max(1) as u64);
                isochrons += 1;
            }
        }
        if now < end {
            stats1 = smm.node().stats();
        }
    }
    let window_s = (end - warm_end).as_secs_f64();
    for (rh, _) in q.drain(..) {
        smm.wait(rh, left(deadline))
            .map_err(|e| err("draining", &e))?;
    }
    smm.barrier(1, 1, left(deadline))
        .map_err(|e| err("end barrier", &e))?;
    let _ = smm.wait_until(left(deadline).min(Duration::from_secs(5)), |node| {
        node.is_idle()
    });
    let s0 = stats0.unwrap_or_default();
    Ok(HostLoad {
        lat_ns: lat,
        isochrons,
        srefs: stats1.srefs_executed.saturating_sub(s0.srefs_executed),
        window_s,
    })
}

/// `isotach bench isochrons`.
pub(crate) fn isochrons(a: &IsochronsArgs) -> anyhow::Result<ExitCode> {
    let c = &a.common;
    crate::admin::logs::init("warn");
    let started = Instant::now();
    let n = usize::from(c.hosts);
    let w = a.outstanding as usize;
    eprintln!(
        "bench isochrons: {n} hosts issuing isochrons of {} ops ({} in flight each) over the \
         daemons on loopback UDP, {} s",
        a.ops, a.outstanding, c.seconds
    );
    let (base, mut lc) = start(c)?;
    let mut problems = Vec::new();
    let deadline = Instant::now() + STARTUP_MAX + Duration::from_secs_f64(c.seconds * 3.0 + 10.0);
    let load = Load {
        hosts: n,
        outstanding: w,
        ops: a.ops,
        seconds: c.seconds,
        deadline,
        driver: a.driver,
    };
    let apps = spawn_apps(
        &mut lc,
        forks_map(n),
        SmmLimits::default(),
        deadline,
        move |h, mut smm| host_load(&mut smm, h, load),
    )?;
    let (loads, startup_s, pulses_per_s) = run_apps(&lc, apps, &mut problems);
    let raw = finish(c, base, lc.daemons, &mut problems)?;

    let mut lat = latency_hist()?;
    let (mut isos, mut bucket_srefs, mut window) = (0u64, 0u64, 0.0f64);
    for l in &loads {
        let _ = lat.add(&l.lat_ns);
        isos += l.isochrons;
        bucket_srefs += l.srefs;
        window = window.max(l.window_s);
    }
    if isos == 0 && problems.is_empty() {
        problems.push("no isochron completed during the measurement window".into());
    }
    let us = |q: f64| {
        if lat.is_empty() {
            0.0
        } else {
            lat.value_at_quantile(q) as f64 / 1000.0
        }
    };
    let window = window.max(1e-6);
    let p50 = us(0.5);
    let srefs = isos * u64::from(a.ops);
    let r = IsochronsReport {
        hosts: n,
        seconds: c.seconds,
        mode: raw.mode,
        siu: c.siu.name(),
        spin_us: c.spin_us,
        driver: a.driver,
        outstanding: a.outstanding,
        ops_per_isochron: a.ops,
        isochrons: isos,
        isochrons_per_s: isos as f64 / window,
        srefs,
        srefs_per_s: srefs as f64 / window,
        bucket_srefs_executed_per_s: bucket_srefs as f64 / window,
        isochron_latency_p50_us: p50,
        isochron_latency_p99_us: us(0.99),
        isochron_latency_max_us: if lat.is_empty() {
            0.0
        } else {
            lat.max() as f64 / 1000.0
        },
        pulses_per_s,
        threads: Threads::of(c),
        latency_to_raw_rtt_ratio: ratio(p50, raw.like_p50_us()),
        raw,
        end: Outcome::new(startup_s, started, true, problems),
    };
    print(&r, c.json)?;
    Ok(exit(r.end.ok))
}
