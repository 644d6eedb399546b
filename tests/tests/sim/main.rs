//! The deterministic simulation (ARCHITECTURE §8.15, issue 22): seeded scenarios of requests,
//! markets and event-level faults played through the whole system, with its promises checked
//! after every moment and at the end. `seeds.txt` lists the seeds `make test` runs;
//! `make soak` runs any range under its own release profile.
//!
//! A failing seed replays alone, printing its trace:
//! `SIM_SEED=<seed> cargo test -p integration-tests --test sim -- --ignored --exact replay --nocapture`.

mod checks;
mod harness;
mod scenario;

use std::path::PathBuf;

use harness::Sim;
use scenario::Scenario;

/// What one seed's run came to.
pub struct Outcome {
    pub seed: u64,
    pub violations: Vec<String>,
    pub trace: Vec<String>,
    pub invocations: u64,
}

pub fn run_seed(seed: u64) -> Outcome {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let mut sim = Sim::new(Scenario::from_seed(seed)).await;
        sim.run().await;
        Outcome {
            seed,
            violations: std::mem::take(&mut sim.violations),
            trace: std::mem::take(&mut sim.trace),
            invocations: sim.invocations,
        }
    })
}

fn replay_command(seed: u64) -> String {
    format!(
        "SIM_SEED={seed} cargo test -p integration-tests --test sim -- --ignored --exact replay --nocapture"
    )
}

/// The seeds file: (range, regression seeds, known failures).
struct Seeds {
    range: (u64, u64),
    regression: Vec<u64>,
    known: Vec<u64>,
}

fn seeds() -> Seeds {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/sim/seeds.txt");
    let text = std::fs::read_to_string(&path).expect("tests/sim/seeds.txt");
    let mut s = Seeds {
        range: (1, 0),
        regression: Vec::new(),
        known: Vec::new(),
    };
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        let words: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| -> u64 {
            words
                .get(i)
                .and_then(|w| w.parse().ok())
                .unwrap_or_else(|| panic!("seeds.txt: a seed expected in {line:?}"))
        };
        match words.first() {
            None => {}
            Some(&"range") => s.range = (num(1), num(2)),
            Some(&"regression") => s.regression.push(num(1)),
            Some(&"known-failure") => s.known.push(num(1)),
            Some(other) => panic!("seeds.txt: unknown entry {other:?}"),
        }
    }
    s
}

/// Runs `seeds`, returning each failing seed with its first violations.
fn run_all(seeds: impl Iterator<Item = u64>) -> Vec<(u64, Vec<String>)> {
    seeds
        .map(run_seed)
        .filter(|o| !o.violations.is_empty())
        .map(|o| (o.seed, o.violations))
        .collect()
}

fn report(failed: &[(u64, Vec<String>)]) -> String {
    failed
        .iter()
        .map(|(seed, v)| format!("seed {seed}: {}\n  replay: {}", v.join("; "), replay_command(*seed)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The make-test range in four shards, so the two cores share them.
fn shard(k: u64) {
    let s = seeds();
    let (first, last) = s.range;
    let mine = (first..=last)
        .filter(|n| n % 4 == k)
        .filter(|n| !s.known.contains(n));
    let failed = run_all(mine);
    assert!(failed.is_empty(), "{}", report(&failed));
}

#[test]
fn seeds_of_the_range_shard_0() {
    shard(0);
}
#[test]
fn seeds_of_the_range_shard_1() {
    shard(1);
}
#[test]
fn seeds_of_the_range_shard_2() {
    shard(2);
}
#[test]
fn seeds_of_the_range_shard_3() {
    shard(3);
}

#[test]
fn regression_seeds_hold() {
    let s = seeds();
    let failed = run_all(s.regression.into_iter());
    assert!(failed.is_empty(), "{}", report(&failed));
}

#[test]
fn known_failures_still_fail() {
    let s = seeds();
    for seed in s.known {
        let o = run_seed(seed);
        assert!(
            !o.violations.is_empty(),
            "known failure seed {seed} passes now: move it to `regression` in seeds.txt"
        );
    }
}

/// Two runs of a seed give byte-identical traces (and so the same decisions and events).
#[test]
fn a_seed_replays_to_a_byte_identical_trace() {
    for seed in [3, 17] {
        let a = run_seed(seed);
        let b = run_seed(seed);
        assert!(a.trace.len() > 20, "seed {seed}: a trace of {} lines", a.trace.len());
        assert_eq!(a.trace.join("\n"), b.trace.join("\n"), "seed {seed}");
    }
}

/// `SIM_SEED=<seed>`: one seed, its scenario and whole trace printed.
#[test]
#[ignore = "run by hand: SIM_SEED=<seed>"]
fn replay() {
    let seed: u64 = std::env::var("SIM_SEED")
        .expect("SIM_SEED")
        .parse()
        .expect("a seed");
    println!("{:#?}", Scenario::from_seed(seed));
    let o = run_seed(seed);
    for line in &o.trace {
        println!("{line}");
    }
    println!("{} invocations, {} violations", o.invocations, o.violations.len());
    assert!(o.violations.is_empty(), "{}", o.violations.join("\n"));
}

/// `make soak SEEDS=N FIRST=K`: seeds K..K+N-1; ends with `N seeds, V violations`.
#[test]
#[ignore = "run by make soak"]
fn soak() {
    let n: u64 = std::env::var("SEEDS").ok().and_then(|v| v.parse().ok()).unwrap_or(2000);
    let first: u64 = std::env::var("FIRST").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    let known = seeds().known;
    let started = std::time::Instant::now();
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()) as u64;
    let failed: Vec<(u64, Vec<String>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                scope.spawn(move || {
                    run_all((first..first + n).filter(|s| s % threads == t))
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().expect("a soak thread")).collect()
    });
    let mut violations = 0;
    for (seed, v) in &failed {
        let known = known.contains(seed);
        println!(
            "seed {seed}{}: {}\n  replay: {}",
            if known { " (known failure)" } else { "" },
            v.join("; "),
            replay_command(*seed)
        );
        if !known {
            violations += 1;
        }
    }
    let secs = started.elapsed().as_secs_f64();
    println!("{:.1} seeds/s over {threads} threads", n as f64 / secs);
    println!("{n} seeds, {violations} violations");
    assert_eq!(violations, 0, "{violations} seeds violated a promise");
}
