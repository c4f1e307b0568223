//! One dining philosopher as a real SMM application (blocking [`Smm`] over any [`SiuLink`]):
//! the fork logic of `isotach sim philo` (sim/src/philo.rs) in real time.
//!
//! Fork `i` is the variable at page `i`, slot 0, with copies at philosophers `i` and `i + 1`
//! (mod N); 0 = free, `p + 1` = held by `p`. Hungry: one isochron reads and scheds both forks;
//! when both were free the philosopher assigns them to itself and eats, otherwise it assigns
//! back what it read and backs off. Done eating: one isochron writes both forks free.

use isotach_proto::packet::Width;
use isotach_rng::Rng;
use isotach_smm::{Addr, SiuLink, Smm, WaitError};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// (p50, p99, max) of latency samples, via an HDR histogram (3 significant digits).
pub(crate) fn latency_summary(samples: &[u64]) -> (u64, u64, u64) {
    let Ok(mut h) = hdrhistogram::Histogram::<u64>::new(3) else {
        return (0, 0, 0);
    };
    for &s in samples {
        let _ = h.record(s.max(1));
    }
    if h.is_empty() {
        return (0, 0, 0);
    }
    (h.value_at_quantile(0.5), h.value_at_quantile(0.99), h.max())
}

/// The fork map: page `i` held by hosts `i` and `i + 1` (mod `n`), the simulator's own, so the
/// real application and `isotach sim philo` share one layout.
pub(crate) use isotach_sim::philo::forks as forks_map;

/// What one philosopher is asked to do.
#[derive(Debug, Clone)]
pub(crate) struct PhiloParams {
    pub(crate) me: usize,
    pub(crate) n: usize,
    pub(crate) meals: u64,
    /// Every wait ends by this instant (the global deadline).
    pub(crate) deadline: Instant,
    /// Incremented at every meal (progress display).
    pub(crate) progress: Arc<AtomicU64>,
}

/// What one philosopher did.
#[derive(Debug, Default)]
pub(crate) struct PhiloOutcome {
    pub(crate) meals: u64,
    pub(crate) retries: u64,
    /// Meals as (start, end): start when both forks were seen free, end before putting them
    /// down. For the observer.
    pub(crate) meals_log: Vec<(Instant, Instant)>,
    /// Isochron latency: from issuing the take isochron to both its reads resolved here.
    pub(crate) latencies_us: Vec<u64>,
}

/// Seed of the think/eat/back-off times; each philosopher draws its own stream of it.
const JITTER_SEED: u64 = 0;

/// Think/eat/back-off times (not security relevant).
struct Jitter(Rng);

impl Jitter {
    /// A duration of `0..=hi_us` microseconds.
    fn below_us(&mut self, hi_us: u64) -> Duration {
        Duration::from_micros(self.0.range_inclusive(0, hi_us))
    }
}

fn left(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

/// Keeps the link moving for `d` (the application "thinks" or "eats" meanwhile).
fn pump_for<L: SiuLink>(smm: &mut Smm<L>, d: Duration) -> Result<(), String> {
    match smm.wait_until(d, |_| false) {
        Err(WaitError::TimedOut(_)) | Ok(()) => Ok(()),
        Err(e) => Err(e.to_string()),
    }
}

/// Runs one philosopher: a start barrier, `meals` meals, an end barrier (every philosopher
/// finished, so nobody still needs this host's fork copies), then a short drain.
pub(crate) fn run_philosopher<L: SiuLink>(
    smm: &mut Smm<L>,
    p: &PhiloParams,
) -> Result<PhiloOutcome, String> {
    let (me, n) = (p.me, p.n);
    let lf = Addr::new(me as u32, 0);
    let rf = Addr::new(((me + n - 1) % n) as u32, 0);
    let mut rng = Jitter(Rng::stream(JITTER_SEED, me as u64));
    let mut out = PhiloOutcome::default();
    let err = |what: &str, e: &dyn std::fmt::Display| format!("philosopher {me}: {what}: {e}");
    smm.barrier(0, 1, left(p.deadline))
        .map_err(|e| err("start barrier", &e))?;
    while out.meals < p.meals {
        pump_for(smm, rng.below_us(200))?;
        loop {
            let t0 = Instant::now();
            let mut iso = smm.node().isochron();
            let hl = iso.read(lf, Width::W32).map_err(|e| err("read", &e))?;
            let hr = iso.read(rf, Width::W32).map_err(|e| err("read", &e))?;
            iso.sched(lf).map_err(|e| err("sched", &e))?;
            iso.sched(rf).map_err(|e| err("sched", &e))?;
            iso.end().map_err(|e| err("take", &e))?;
            let l = smm
                .wait(hl, left(p.deadline))
                .map_err(|e| err("left fork", &e))?;
            let r = smm
                .wait(hr, left(p.deadline))
                .map_err(|e| err("right fork", &e))?;
            out.latencies_us.push(t0.elapsed().as_micros() as u64);
            let free = l == 0 && r == 0;
            let (lv, rv) = if free {
                (me as u64 + 1, me as u64 + 1)
            } else {
                (l, r)
            };
            let mut iso = smm.node().isochron();
            iso.assign(lf, Width::W32, lv)
                .map_err(|e| err("assign", &e))?;
            iso.assign(rf, Width::W32, rv)
                .map_err(|e| err("assign", &e))?;
            iso.end().map_err(|e| err("assign", &e))?;
            if free {
                let start = Instant::now();
                pump_for(smm, rng.below_us(200))?;
                out.meals_log.push((start, Instant::now()));
                let mut iso = smm.node().isochron();
                iso.write(lf, Width::W32, 0)
                    .map_err(|e| err("release", &e))?;
                iso.write(rf, Width::W32, 0)
                    .map_err(|e| err("release", &e))?;
                iso.end().map_err(|e| err("release", &e))?;
                out.meals += 1;
                p.progress.fetch_add(1, Ordering::Relaxed);
                break;
            }
            out.retries += 1;
            pump_for(smm, rng.below_us(400))?;
        }
        if Instant::now() >= p.deadline {
            return Err(err("deadline", &"passed before every meal was eaten"));
        }
    }
    smm.barrier(1, 1, left(p.deadline))
        .map_err(|e| err("end barrier", &e))?;
    // Let the last releases execute here before the link goes away.
    let _ = smm.wait_until(left(p.deadline).min(Duration::from_secs(5)), |node| {
        node.is_idle()
    });
    pump_for(smm, Duration::from_millis(20))?;
    Ok(out)
}

/// The observer: meals of neighbours (they share a fork) that overlap in time.
pub(crate) fn overlaps(logs: &[Vec<(Instant, Instant)>]) -> (u64, Vec<String>) {
    let n = logs.len();
    let mut count = 0;
    let mut detail = Vec::new();
    for p in 0..n {
        let q = (p + 1) % n;
        if q == p {
            continue;
        }
        for &(a0, a1) in &logs[p] {
            for &(b0, b1) in &logs[q] {
                if a0 < b1 && b0 < a1 {
                    count += 1;
                    if detail.len() < 4 {
                        detail.push(format!("philosophers {p} and {q} ate at once"));
                    }
                }
            }
        }
    }
    (count, detail)
}
