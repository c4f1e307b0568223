//! Dining philosophers over the SMM on the simulator.

use isotach_proto::config::ClusterConfig;
use isotach_sim::philo::{self, PhiloError, PhiloOptions};
use isotach_sim::{Faults, RangeUs};

fn options(n: usize, switches: usize, meals: u64, seed: u64) -> PhiloOptions {
    PhiloOptions::new(ClusterConfig::generated(n, switches).unwrap(), meals, seed)
}

#[test]
fn every_philosopher_eats_and_neighbours_never_eat_together() {
    let r = philo::run(&options(8, 2, 10, 3)).unwrap();
    assert!(r.ok, "{r:#?}");
    assert_eq!(r.meals, 80);
    assert_eq!(r.meals_min, 10);
    assert!(
        r.reads_checked >= 160,
        "every attempt reads both forks: {r:?}"
    );
}

#[test]
fn under_faults_and_across_three_switches() {
    let mut o = options(9, 3, 8, 5);
    o.net.faults = Faults {
        loss: 0.05,
        dup: 0.02,
        reorder: 0.1,
        token_corrupt: 0.01,
        jitter_us: RangeUs::new(0, 40),
        ..Faults::default()
    };
    let r = philo::run(&o).unwrap();
    assert!(r.ok, "{r:#?}");
    assert_eq!(r.meals, 72);
}

#[test]
fn two_philosophers_share_both_forks() {
    let r = philo::run(&options(2, 1, 20, 1)).unwrap();
    assert!(r.ok, "{r:#?}");
    assert!(r.retries > 0, "two philosophers must contend: {r:?}");
}

#[test]
fn one_philosopher_is_refused() {
    assert!(matches!(
        philo::run(&options(1, 1, 1, 1)),
        Err(PhiloError::TooFew)
    ));
}

/// Crashes of TMs and SIUs: a restart of logical time ends every philosopher's application
/// (a meal in progress ends then), forks start free in the new generation, and no two
/// neighbours ever eat at once across it.
#[test]
fn neighbours_never_eat_together_across_restarts_of_logical_time() {
    for seed in 1..=3 {
        let mut o = options(5, 2, 20, seed);
        o.net.restarts = Some(isotach_sim::Restarts {
            every_us: 4_000,
            count: 3,
            down_us: RangeUs::new(100, 3_000),
        });
        let r = philo::run(&o).unwrap();
        assert!(r.ok, "seed {seed}: {r:#?}");
        assert!(r.logical_restarts > 0, "seed {seed}: {r:?}");
        assert_eq!(r.meals, 100, "seed {seed}");
    }
}
