//! Dining philosophers on the simulator: `isotach sim philo`.
//!
//! Fork `i` lies between philosophers `i` and `i + 1` (mod N); it is a shared variable on page
//! `i`, with a copy at both of them (0 = free, `p + 1` = held by philosopher `p`). A hungry
//! philosopher takes both forks with one isochron — read both, sched both — so nobody else can
//! read them until it assigns them again. If both were free it assigns them to itself and
//! eats; otherwise it assigns back the values it read and tries again after a random back-off.
//! After eating it writes both forks free.
//!
//! Safety is checked by an independent observer: every philosopher reports when it starts and
//! stops eating, and no two neighbours' meals may overlap in time. The memory history is also
//! replayed by the sequential-consistency oracle.

use crate::host::{Host, HostCtx};
use crate::net::{FaultError, RangeUs};
use crate::oracle::PulseOracle;
use crate::sim::{NetFaults, RunEnd, Sim, SimConfig, SimError};
use crate::smm_host::{PortEvent, SmmPort, count_smm_errors, run_to_quiescence};
use isotach_proto::config::ClusterConfig;
use isotach_proto::packet::Width;
use isotach_proto::topology::HostId;
use isotach_siu::SiuError;
use isotach_smm::{Addr, MemoryMap, ReadHandle};
use serde::Serialize;
use std::sync::Arc;

/// Most lines in a report's `problems` (besides one per source of unexpected errors).
const PROBLEMS_MAX: usize = 16;

/// Options of a philo run.
#[derive(Debug, Clone)]
pub struct PhiloOptions {
    /// The seed.
    pub seed: u64,
    /// Topology (one host per philosopher), timing and limits.
    pub cluster: ClusterConfig,
    /// Meals each philosopher eats.
    pub meals: u64,
    /// The network, pauses and crashes.
    pub net: NetFaults,
    /// Thinking time between meals.
    pub think_us: RangeUs,
    /// Eating time.
    pub eat_us: RangeUs,
    /// Back-off after finding a fork taken.
    pub backoff_us: RangeUs,
    /// Virtual time without pulse progress that ends the run as stalled.
    pub stall_us: u64,
}

impl PhiloOptions {
    /// Defaults for `cluster` (at least two hosts).
    pub fn new(cluster: ClusterConfig, meals: u64, seed: u64) -> Self {
        Self {
            seed,
            cluster,
            meals,
            net: NetFaults::default(),
            think_us: RangeUs::new(0, 400),
            eat_us: RangeUs::new(50, 400),
            backoff_us: RangeUs::new(0, 800),
            stall_us: 2_000_000,
        }
    }
}

/// Why a run could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum PhiloError {
    /// Fewer than two philosophers.
    #[error("dining philosophers needs at least 2 philosophers")]
    TooFew,
    /// Bad fault settings.
    #[error(transparent)]
    Faults(#[from] FaultError),
    /// The simulator refused the configuration.
    #[error(transparent)]
    Sim(#[from] SimError),
}

/// The result of a philo run: one JSON object. Keys are documented in `docs/sim.md`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PhiloReport {
    /// The seed.
    pub seed: u64,
    /// Philosophers.
    pub philosophers: usize,
    /// Switches.
    pub switches: usize,
    /// The largest logical distance between two hosts (token managers on the longest route).
    pub max_logical_distance: u16,
    /// Meals asked of each philosopher.
    pub meals_target: u64,
    /// Meals eaten, all philosophers.
    pub meals: u64,
    /// Fewest meals any philosopher ate.
    pub meals_min: u64,
    /// Times two neighbours ate at once (the observer's check; must be 0).
    pub safety_violations: u64,
    /// Attempts that found a fork taken and gave both back.
    pub retries: u64,
    /// Most pulses a philosopher waited from hungry to eating.
    pub max_wait_pulses: u64,
    /// Pulses completed (smallest recvclock at the end).
    pub pulses: u64,
    /// Isochrons checked by the sequential-consistency oracle.
    pub isochrons: u64,
    /// Reads checked by the oracle.
    pub reads_checked: u64,
    /// Oracle violations of every kind (SC, atomicity, program order, unexecuted, unresolved).
    pub sc_violations: u64,
    /// Restarts of logical time the philosophers saw (each ends every philosopher's
    /// application: a meal in progress ends and does not count; forks start free).
    pub logical_restarts: u64,
    /// Generations the oracle checked, each from empty memory.
    pub eras_checked: u64,
    /// Isochrons a restart of logical time discarded (allowed; `docs/sim.md`).
    pub discarded_isochrons: u64,
    /// EOP-rule and sort-vector violations.
    pub eop_violations: u64,
    /// Refusals and bad input (must stay 0).
    pub unexpected_errors: u64,
    /// Every philosopher ate every meal before the run stalled or ended.
    pub completed: bool,
    /// Virtual time at the end.
    pub virtual_time_us: u64,
    /// Wall-clock time.
    pub wall_time_ms: u64,
    /// First problems seen.
    pub problems: Vec<String>,
    /// Completed with no violation of any kind.
    pub ok: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Waiting for the start barrier.
    Starting,
    /// Thinking (a wake-up ends it).
    Thinking,
    /// Sent read+sched; waiting for both reads.
    Taking { left: ReadHandle, right: ReadHandle },
    /// Eating until the wake-up.
    Eating,
    /// Every meal eaten.
    Done,
}

/// One philosopher.
#[derive(Debug)]
struct Philosopher {
    port: SmmPort,
    me: u64,
    left: Addr,
    right: Addr,
    state: State,
    meals: u64,
    meals_target: u64,
    retries: u64,
    hungry_since_pulse: Option<u64>,
    max_wait_pulses: u64,
    /// Meals as (start, end) in virtual µs, for the observer.
    meals_log: Vec<(u64, u64)>,
    opts: Arc<PhiloOptions>,
}

impl Philosopher {
    fn done(&self) -> bool {
        self.state == State::Done && self.port.node.is_idle()
    }

    fn wait(&self, ctx: &mut HostCtx<'_>, range: RangeUs) {
        let at = ctx.now_us() + ctx.rng().range_inclusive(range.lo, range.hi);
        ctx.wake_at(at, 0);
    }

    /// Hungry: read and schedule both forks in one isochron.
    fn take(&mut self, ctx: &mut HostCtx<'_>) {
        self.hungry_since_pulse
            .get_or_insert(self.port.node.last_pulse());
        let mut iso = self.port.node.isochron();
        let left = iso.read(self.left, Width::W32).expect("fork mapped");
        let right = iso.read(self.right, Width::W32).expect("fork mapped");
        iso.sched(self.left).expect("fork mapped");
        iso.sched(self.right).expect("fork mapped");
        iso.end().expect("isochron within limits");
        self.state = State::Taking { left, right };
        self.port.flush(ctx);
    }

    /// Both reads came back: eat if both forks were free, else give them back.
    fn decide(&mut self, ctx: &mut HostCtx<'_>, l: u64, r: u64) {
        let free = l == 0 && r == 0;
        let (lv, rv) = if free {
            (self.me + 1, self.me + 1)
        } else {
            (l, r)
        };
        let mut iso = self.port.node.isochron();
        iso.assign(self.left, Width::W32, lv).expect("own sched");
        iso.assign(self.right, Width::W32, rv).expect("own sched");
        iso.end().expect("isochron within limits");
        self.port.flush(ctx);
        if free {
            let since = self.hungry_since_pulse.take().unwrap_or(0);
            let waited = self.port.node.last_pulse().saturating_sub(since);
            self.max_wait_pulses = self.max_wait_pulses.max(waited);
            self.meals_log.push((ctx.now_us(), u64::MAX));
            self.state = State::Eating;
            self.wait(ctx, self.opts.eat_us);
        } else {
            self.retries += 1;
            self.state = State::Thinking;
            self.wait(ctx, self.opts.backoff_us);
        }
    }

    /// Logical time restarted: this philosopher's application ended (a meal in progress ends
    /// now and does not count) and a new one waits for the new generation's start barrier.
    fn restarted(&mut self, ctx: &mut HostCtx<'_>) {
        if self.state == State::Eating
            && let Some(m) = self.meals_log.last_mut()
        {
            m.1 = ctx.now_us();
        }
        if self.state != State::Done {
            self.state = State::Starting;
        }
        self.hungry_since_pulse = None;
    }

    /// Done eating: put both forks down.
    fn release(&mut self, ctx: &mut HostCtx<'_>) {
        let mut iso = self.port.node.isochron();
        iso.write(self.left, Width::W32, 0).expect("fork mapped");
        iso.write(self.right, Width::W32, 0).expect("fork mapped");
        iso.end().expect("isochron within limits");
        self.port.flush(ctx);
        if let Some(m) = self.meals_log.last_mut() {
            m.1 = ctx.now_us();
        }
        self.meals += 1;
        if self.meals >= self.meals_target {
            self.state = State::Done;
        } else {
            self.state = State::Thinking;
            self.wait(ctx, self.opts.think_us);
        }
    }
}

impl Host for Philosopher {
    fn on_start(&mut self, ctx: &mut HostCtx<'_>) {
        self.port.start(ctx);
    }

    fn on_packet(&mut self, ctx: &mut HostCtx<'_>, bytes: &[u8]) {
        match self.port.packet(ctx, bytes) {
            PortEvent::Started => {
                self.state = State::Thinking;
                self.wait(ctx, self.opts.think_us);
            }
            PortEvent::Restarted => self.restarted(ctx),
            PortEvent::Nothing => {}
        }
        if let State::Taking { left, right } = self.state {
            let node = &mut self.port.node;
            if let (Some(l), Some(r)) = (node.read_value(left), node.read_value(right)) {
                let _ = node.take_read(left);
                let _ = node.take_read(right);
                self.decide(ctx, l, r);
            }
        }
    }

    fn on_wake(&mut self, ctx: &mut HostCtx<'_>, _token: u64) {
        match self.state {
            State::Thinking => self.take(ctx),
            State::Eating => self.release(ctx),
            State::Starting | State::Taking { .. } | State::Done => {}
        }
    }

    fn on_siu_restart(&mut self, ctx: &mut HostCtx<'_>) {
        self.port.siu_restarted(ctx);
        self.restarted(ctx);
    }

    fn on_refused(&mut self, ctx: &mut HostCtx<'_>, bytes: &[u8], error: &SiuError) {
        self.port.refused(ctx, bytes, error);
    }
}

/// Fork `i` on page `i`, held by philosophers `i` and `i + 1` (mod `n`). The real application
/// (`isotach philo`, `isotach demo philo`) lays its forks out the same way, so it takes this map.
pub fn forks(n: usize) -> MemoryMap {
    let mut map = MemoryMap::default();
    for i in 0..n {
        let copies = vec![i as HostId, ((i + 1) % n) as HostId];
        map.insert(i as u32, i as u32, copies)
            .expect("one page per fork");
    }
    map
}

/// Runs dining philosophers and checks safety and sequential consistency.
pub fn run(opts: &PhiloOptions) -> Result<PhiloReport, PhiloError> {
    let n = opts.cluster.topology.host_count();
    if n < 2 {
        return Err(PhiloError::TooFew);
    }
    opts.net.faults.validate()?;
    let wall = std::time::Instant::now();
    let shared = Arc::new(opts.clone());
    let map = Arc::new(forks(n));
    let topology = Arc::new(opts.cluster.topology.clone());
    let hosts = (0..n)
        .map(|p| Philosopher {
            port: SmmPort::new(p as HostId, &topology, Arc::clone(&map)),
            me: p as u64,
            left: Addr::new(p as u32, 0),
            right: Addr::new(((p + n - 1) % n) as u32, 0),
            state: State::Starting,
            meals: 0,
            meals_target: opts.meals,
            retries: 0,
            hungry_since_pulse: None,
            max_wait_pulses: 0,
            meals_log: Vec::new(),
            opts: Arc::clone(&shared),
        })
        .collect();
    let cfg = SimConfig::new(opts.seed, opts.cluster.clone(), opts.net.clone());
    let mut sim = Sim::new(cfg, hosts, PulseOracle::new(n))?;
    // Generous: a clean run needs about twenty pulses per meal.
    let pulses_max = 5_000 + 200 * opts.meals;
    let end = run_to_quiescence(
        &mut sim,
        Philosopher::done,
        |h| &h.port.node,
        opts.stall_us,
        pulses_max,
    );
    let recvclocks: Vec<u64> = sim.sius().map(|s| s.recvclock()).collect();
    sim.observer_mut().finish(&recvclocks);
    let mut r = report(opts, &sim, end);
    r.wall_time_ms = wall.elapsed().as_millis() as u64;
    Ok(r)
}

fn report(opts: &PhiloOptions, sim: &Sim<Philosopher, PulseOracle>, end: RunEnd) -> PhiloReport {
    let phils = sim.hosts();
    let n = phils.len();
    let nodes = phils
        .iter()
        .flat_map(|p| p.port.era_records(p.port.records().collect()))
        .collect();
    let e = crate::eras::check(nodes, 4);
    let o = e.oracle;
    let safety = overlaps(phils);
    let mut others: Vec<String> = safety.1;
    others.extend(e.notes);
    others.extend(sim.observer().violations().iter().cloned());
    let mut u = sim.unexpected().clone();
    for (i, p) in phils.iter().enumerate() {
        // Only an ended application's reads can be answered late.
        let late_ok = !p.port.ended.is_empty();
        for s in p.port.all_stats() {
            count_smm_errors(&mut u, i, &s, late_ok);
        }
        u.merge(&p.port.unexpected);
    }
    let unexpected = u.total();
    let problems = u.problems(others, PROBLEMS_MAX);
    let meals: u64 = phils.iter().map(|p| p.meals).sum();
    let meals_min = phils.iter().map(|p| p.meals).min().unwrap_or(0);
    let completed = end == RunEnd::Stopped && meals_min >= opts.meals;
    let sc = o.sc_violations
        + o.atomicity_violations
        + o.program_order_violations
        + o.unexecuted
        + o.unresolved_reads;
    let pulse = sim.observer().stats();
    let eop = pulse.eop_violations + pulse.order_violations;
    PhiloReport {
        seed: opts.seed,
        philosophers: n,
        switches: opts.cluster.topology.switch_count(),
        max_logical_distance: opts.cluster.topology.max_distance(),
        meals_target: opts.meals,
        meals,
        meals_min,
        safety_violations: safety.0,
        retries: phils.iter().map(|p| p.retries).sum(),
        max_wait_pulses: phils.iter().map(|p| p.max_wait_pulses).max().unwrap_or(0),
        pulses: sim.min_recvclock(),
        isochrons: o.isochrons,
        reads_checked: o.reads_checked,
        sc_violations: sc,
        logical_restarts: phils.iter().map(|p| p.port.ended.len() as u64).sum(),
        eras_checked: e.eras,
        discarded_isochrons: e.discarded_isochrons,
        eop_violations: eop,
        unexpected_errors: unexpected,
        completed,
        virtual_time_us: sim.now_us(),
        wall_time_ms: 0,
        ok: completed && safety.0 == 0 && sc == 0 && eop == 0 && unexpected == 0,
        problems,
    }
}

/// The observer: meals of neighbours (sharing a fork) that overlap in time.
fn overlaps(phils: &[Philosopher]) -> (u64, Vec<String>) {
    let n = phils.len();
    let mut count = 0;
    let mut detail = Vec::new();
    for p in 0..n {
        let q = (p + 1) % n;
        for &(a0, a1) in &phils[p].meals_log {
            for &(b0, b1) in &phils[q].meals_log {
                if a0 < b1 && b0 < a1 {
                    count += 1;
                    if detail.len() < 4 {
                        detail.push(format!(
                            "philosophers {p} and {q} ate at once: {a0}..{a1} and {b0}..{b1} µs"
                        ));
                    }
                }
            }
        }
    }
    (count, detail)
}
