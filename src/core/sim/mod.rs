//! A deterministic simulation of the engine.
//!
//! Each seed builds a [`World`](world::World): two managers on a simulated server whose replies
//! are delayed, reordered, lost and failed, whose sessions a nemesis ends; callers that acquire,
//! try, nest, take several keys, let go by each of a guard's three exits, call `release_all`, and
//! are cancelled at random moments. It runs on a current-thread runtime with a paused clock and
//! one seeded random source, so a seed is a schedule: the same seed replays the same trace.
//! Between steps the invariants are checked (`invariants.rs`), and at the end `World::settle`.
//!
//! | file | what it holds |
//! | --- | --- |
//! | `mod.rs` | running seeds, and the tests |
//! | `server.rs` | the simulated server, its faults, and the backend the engine runs on |
//! | `world.rs` | a world: managers, callers' beliefs, the nemesis, the end of the world |
//! | `invariants.rs` | what is checked between steps |
//! | `callers.rs` | the callers' random programs |
//! | `plant.rs` | known bugs to plant, to show the simulation finds them |
//! | `rng.rs` | the seeded random source |
//!
//! Replay a seed, printing its trace:
//! `PGLOCK_SIM_SEED=<seed> [PGLOCK_SIM_BUG=<bug>] cargo test -p pglock --lib core::sim::replay -- --nocapture`.
//! Explore more seeds: `PGLOCK_SIM_SEEDS=<count> [PGLOCK_SIM_FIRST=<seed>] cargo test --release -p pglock --lib core::sim::seeded -- --nocapture`.

mod callers;
mod invariants;
mod plant;
mod rng;
mod server;
mod world;

use std::time::Instant as WallClock;

pub(crate) use self::plant::{Bug, is_planted};
pub(crate) use self::server::SimBackend;

/// What one seed did.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Run {
    violation: Option<String>,
    trace_hash: u64,
    steps: u64,
}

/// Runs the world of `seed` (with `bug` planted), keeping its trace's lines if asked.
fn run(seed: u64, bug: Option<Bug>, lines: bool) -> (Run, Vec<String>) {
    let _planted = plant::plant(bug);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime");
    let (violation, world) = runtime.block_on(async {
        let world = world::World::new(seed, lines);
        (world.run().await, world)
    });
    let mut trace = world.trace();
    let run = Run {
        violation,
        trace_hash: trace.hash,
        steps: trace.steps,
    };
    let lines = trace.lines.take().unwrap_or_default();
    drop(trace);
    drop(world);
    drop(runtime);
    (run, lines)
}

fn replay_command(seed: u64, bug: Option<Bug>) -> String {
    let bug = bug.map_or(String::new(), |bug| {
        format!("PGLOCK_SIM_BUG={} ", bug.name())
    });
    format!(
        "{bug}PGLOCK_SIM_SEED={seed} cargo test -p pglock --lib core::sim::replay -- --nocapture"
    )
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|value| {
        value
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value}: not a number"))
    })
}

/// Runs `count` seeds from `first`; panics on the first violation with the command that
/// replays it.
fn explore(first: u64, count: u64) -> u64 {
    let mut steps = 0;
    for seed in first..first + count {
        let (run, _) = run(seed, None, false);
        if let Some(violation) = run.violation {
            panic!(
                "seed {seed}: {violation}\nreplay: {}",
                replay_command(seed, None)
            );
        }
        steps += run.steps;
    }
    steps
}

/// The seeds every CI run explores (more with `PGLOCK_SIM_SEEDS`), and a few random ones,
/// printed so a failure can be replayed.
#[test]
fn seeded_schedules_keep_every_invariant() {
    let count = env_u64("PGLOCK_SIM_SEEDS").unwrap_or(FIXED_SEEDS);
    let first = env_u64("PGLOCK_SIM_FIRST").unwrap_or(0);
    let started = WallClock::now();
    let steps = explore(first, count);
    let random = rand_seed();
    println!(
        "random seeds from {random} (replay one with {})",
        replay_command(random, None)
    );
    let steps = steps + explore(random, RANDOM_SEEDS);
    let took = started.elapsed();
    println!(
        "{} schedules, {steps} steps in {took:.1?}: {:.0} schedules/s",
        count + RANDOM_SEEDS,
        (count + RANDOM_SEEDS) as f64 / took.as_secs_f64()
    );
}

/// How many fixed seeds a plain `cargo test` explores.
const FIXED_SEEDS: u64 = 20_000;
const RANDOM_SEEDS: u64 = 200;

fn rand_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(0);
    hasher.finish() >> 16
}

/// A seed is a schedule: run twice, it gives the same trace.
#[test]
fn a_seed_replays_the_same_trace() {
    for seed in 0..50 {
        let (first, lines) = run(seed, None, true);
        let (second, again) = run(seed, None, true);
        assert_eq!(lines, again, "seed {seed} ran differently the second time");
        assert_eq!(first, second);
        assert!(
            first.steps > 10,
            "seed {seed} did almost nothing: {lines:?}"
        );
    }
}

/// Replays `PGLOCK_SIM_SEED` (with `PGLOCK_SIM_BUG` planted), printing its trace; without
/// it, replays seed 0 and checks it holds.
#[test]
fn replay() {
    let seed = env_u64("PGLOCK_SIM_SEED").unwrap_or(0);
    let bug = std::env::var("PGLOCK_SIM_BUG").ok().map(|name| {
        Bug::from_name(&name).unwrap_or_else(|| panic!("no planted bug is called {name}"))
    });
    let (run, lines) = run(seed, bug, true);
    for line in &lines {
        println!("{line}");
    }
    println!("{} steps, trace {:016x}", run.steps, run.trace_hash);
    assert_eq!(run.violation, None, "seed {seed}");
}

/// Each known bug, planted alone, is found; the seeds it took are printed for the docs.
#[test]
fn every_planted_bug_is_found() {
    let cap = env_u64("PGLOCK_SIM_BUG_SEEDS").unwrap_or(BUG_SEEDS);
    let mut table = Vec::new();
    for bug in Bug::ALL {
        let found = (0..cap).find_map(|seed| {
            let (run, _) = run(seed, Some(bug), false);
            run.violation.map(|violation| (seed, violation))
        });
        let Some((seed, violation)) = found else {
            panic!("{} not found in {cap} seeds", bug.name());
        };
        println!(
            "| {} | {} | {violation} | `{}` |",
            bug.name(),
            seed + 1,
            replay_command(seed, Some(bug))
        );
        table.push((bug, seed));
    }
    assert_eq!(table.len(), Bug::ALL.len());
}

/// Seeds a planted bug may take before it counts as not found.
const BUG_SEEDS: u64 = 2_000;

/// Found by seed 30: `acquire_all` took k2, a `release_all` of the same manager took it away
/// while the set waited for k0, and the set came back with its loss signal silent (it fired
/// only once the set's watcher task first ran).
#[test]
fn scenario_a_set_is_born_lost_when_a_lock_went_while_it_was_taken() {
    let (run, _) = run(30, None, false);
    assert_eq!(run.violation, None, "replay: {}", replay_command(30, None));
}

/// Found by seed 581: a `release_all` of the manager took a set's lock away, and the set's
/// signal fired a task switch later, after the server had let the lock go.
#[test]
fn scenario_release_all_tells_a_set_at_once() {
    let (run, _) = run(581, None, false);
    assert_eq!(run.violation, None, "replay: {}", replay_command(581, None));
}
