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

use std::collections::BTreeMap;
use std::path::PathBuf;

use harness::Sim;
use scenario::Scenario;

/// What one seed's run came to.
pub struct Outcome {
    pub seed: u64,
    pub violations: Vec<String>,
    pub trace: Vec<String>,
    pub invocations: u64,
    pub reached: std::collections::BTreeSet<String>,
    /// Invocations per (function, trigger).
    pub by_function: BTreeMap<(String, String), u64>,
}

pub fn run_seed(seed: u64) -> Outcome {
    play(Scenario::from_seed(seed))
}

/// Plays `scenario` to its end on a runtime of its own.
fn play(scenario: Scenario) -> Outcome {
    let seed = scenario.seed;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let mut sim = Sim::new(scenario).await;
        sim.run().await;
        Outcome {
            seed,
            violations: std::mem::take(&mut sim.violations),
            trace: std::mem::take(&mut sim.trace),
            invocations: sim.invocations,
            reached: std::mem::take(&mut sim.reached),
            by_function: std::mem::take(&mut sim.by_function),
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

/// What a batch of seeds came to.
#[derive(Default)]
struct Campaign {
    failed: Vec<(u64, Vec<String>)>,
    /// How many seeds reached each outcome.
    reach: BTreeMap<String, u64>,
    invocations: u64,
    seeds: u64,
}

/// Runs `seeds` on `threads` threads (seed `s` on thread `s % threads`). With
/// `stop_at_first`, every thread stops once a seed not among `known` failures has failed (the
/// mutation campaign needs one failure, not all).
fn campaign(seeds: &[u64], threads: u64, stop_at_first: bool, known: &[u64]) -> Campaign {
    let stop = std::sync::atomic::AtomicBool::new(false);
    let stop = &stop;
    let parts: Vec<Campaign> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                scope.spawn(move || {
                    let mut c = Campaign::default();
                    for &seed in seeds.iter().filter(|s| *s % threads == t) {
                        if stop.load(std::sync::atomic::Ordering::Relaxed) {
                            break;
                        }
                        let o = run_seed(seed);
                        if stop_at_first && !o.violations.is_empty() && !known.contains(&seed) {
                            stop.store(true, std::sync::atomic::Ordering::Relaxed);
                        }
                        c.seeds += 1;
                        c.invocations += o.invocations;
                        for r in o.reached {
                            *c.reach.entry(r).or_default() += 1;
                        }
                        if !o.violations.is_empty() {
                            c.failed.push((seed, o.violations));
                        }
                    }
                    c
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a campaign thread"))
            .collect()
    });
    let mut all = Campaign::default();
    for p in parts {
        all.failed.extend(p.failed);
        all.invocations += p.invocations;
        all.seeds += p.seeds;
        for (k, v) in p.reach {
            *all.reach.entry(k).or_default() += v;
        }
    }
    all.failed.sort();
    all
}

fn report(failed: &[(u64, Vec<String>)]) -> String {
    failed
        .iter()
        .map(|(seed, v)| {
            format!(
                "seed {seed}: {}\n  replay: {}",
                v.join("; "),
                replay_command(*seed)
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The outcomes the make-test range must reach: a generator that stops reaching one of
/// them leaves that part of the system unexercised, and this test says so.
const MUST_REACH: &[&str] = &[
    "a ledger from before §9.8 held a purchase back",
    "a purchase was held back by a pause",
    "a reservation was extended in the console",
    "Capacity Extension Offered",
    "Capacity Extension Awaiting Approval",
    "Capacity Extension Failed",
    "an extension was bought",
    "an extension was bought because the workload ran",
    "an extension's payment failed",
    "a drained window was launched again after its extension was paid",
    "Capacity Reservation Extended",
    "Capacity Reserved",
    "Capacity Payment Failed",
    "Capacity Workload Launched",
    "Capacity Instance Replaced",
    "Capacity Workload Drained",
    "Capacity Purchase Awaiting Approval",
    "Capacity Purchase Approval Refused",
    "Capacity Request Rejected",
    "Capacity Cancellation Applied",
    "Capacity Not Found",
    "a block was bought",
    "a plan was bought",
    "an EC2 instance ran (OnDemand)",
    "an on-demand run was charged its hours",
    "an EC2 instance ran (Spot)",
    "a spot instance was reclaimed",
    "Capacity Workload Interrupted",
    "a spot run fell back to a reservation",
    "a spot run's fall-back bought a reservation",
    "an EC2 instance ran (CapacityBlock)",
    "SageMaker Endpoint State Change",
    "a HyperPod group was created",
    "a HyperPod group was removed",
    "a submission was refused for a name another request claims",
    "two requests naming one workload were both recorded",
    "a submission was refused for an id another spelling holds",
    "a cancellation spelling its id in another case was applied",
    "an event was delivered twice",
    "an event was delayed",
    "an event was dropped",
    "an invocation failed",
    "delivered: Capacity Purchase Approved from com.example.approvals",
    "delivered: Capacity Request Cancelled from com.example.ml-platform",
    "LostResponse struck PurchaseCapacityBlock",
    "LostResponse struck CreateTrainingPlan",
    "a taken-over purchase was in doubt",
    "a taken-over legacy purchase record was in doubt",
    "a purchase was refused for good",
    "a split's later block was refused for good",
    "an EC2 split was bought",
    "a plan was bought again after its payment failed",
    "a stray was bought",
    "a purchase spent its throttle retries",
    "a stray reserved its request in its plan's place",
    "a stray was kept beside its plan",
    "a reservation was bought at exactly its request's cap",
    "an invocation died at a port call",
    "an invocation died right after PurchaseCapacityBlock",
    "an invocation died right after CreateTrainingPlan",
    "an invocation died right after RunInstances",
    "an invocation died right after BeginPurchase",
    "an invocation died right after RecordReservation",
    "an invocation died after its last call",
    "two deliveries ran at once",
    "a tick raced an invocation",
    "cleanup-expired was down",
    "purchase-capacity was down",
    // ARCHITECTURE §9.1: a request over (failed, rejected, cancelled) still served its window
    "a request holding a paid window was cancelled",
    "a window of a request over was launched",
    "a window of a request over was drained",
    // ARCHITECTURE §9.1: stopping paid workloads early is an explicit ask
    "stop_running was asked of a running window",
    "stop_running stopped a paid window",
    // ARCHITECTURE §9.2: lead-time notices, on time, late and skipped
    "Capacity Window Opening",
    "Capacity Reservation Ending",
    "a lead-time notice was published late",
    "a lead-time notice's skip was recorded",
];

/// `make test`'s seeds: the range of seeds.txt, on both cores, every promise kept, every
/// outcome of [`MUST_REACH`] reached.
#[test]
fn the_seeds_of_make_test_keep_every_promise() {
    let s = seeds();
    let (first, last) = s.range;
    let mine: Vec<u64> = (first..=last).filter(|n| !s.known.contains(n)).collect();
    let c = campaign(&mine, 2, false, &[]);
    assert!(c.failed.is_empty(), "{}", report(&c.failed));
    let missed: Vec<&&str> = MUST_REACH
        .iter()
        .filter(|r| !c.reach.contains_key(**r))
        .collect();
    assert!(
        missed.is_empty(),
        "seeds {first}..={last} never reached {missed:?}; reached: {:?}",
        c.reach
    );
}

#[test]
fn regression_seeds_hold() {
    let s = seeds();
    let c = campaign(&s.regression, 1, false, &[]);
    assert!(c.failed.is_empty(), "{}", report(&c.failed));
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

/// The checks catch what they should: a block bought again for a request behind the
/// system's back is a second reservation for one window, and a fee the ledger never holds.
#[test]
fn the_checks_catch_a_second_block_bought_for_one_window() {
    let seed = (1..=200)
        .find(|s| run_seed(*s).reached.contains("a block was bought"))
        .expect("a seed that buys a block");
    let mut scenario = Scenario::from_seed(seed);
    scenario.sabotage = true;
    let o = play(scenario);
    let sabotage: Vec<&String> = o.trace.iter().filter(|l| l.contains("sabotage")).collect();
    let violations = o.violations;
    let all = format!("{}\n{sabotage:?}", violations.join("\n"));
    assert!(
        all.contains("one reservation per window"),
        "seed {seed}: {all}"
    );
    assert!(all.contains("ledger bounded"), "seed {seed}: {all}");
}

/// The lead-time notice check can fail: a producer announcing a Window Opening again under
/// another key (the harness's sabotage) is caught (ARCHITECTURE §9.2).
#[test]
fn the_checks_catch_a_lead_time_notice_published_under_two_keys() {
    let seed = (1..=200)
        .find(|s| run_seed(*s).reached.contains("Capacity Window Opening"))
        .expect("a seed that announces a window opening");
    let mut scenario = Scenario::from_seed(seed);
    scenario.sabotage_notices = true;
    let o = play(scenario);
    let all = o.violations.join("\n");
    let sabotage: Vec<&String> = o.trace.iter().filter(|l| l.contains("sabotage")).collect();
    assert!(
        all.contains("a lead-time notice is published under one key"),
        "seed {seed}: {all}\n{sabotage:?}"
    );
}

/// ARCHITECTURE §9.7: a pause over the whole fault period holds every purchase back, and the
/// checks catch a lease taken through it (the harness not writing it).
#[test]
fn a_pause_holds_every_purchase_back_and_the_checks_catch_one_taken_through_it() {
    let seed = (1..=200)
        .find(|s| run_seed(*s).reached.contains("a block was bought"))
        .expect("a seed that buys a block");
    let mut scenario = Scenario::from_seed(seed);
    scenario.pauses = vec![(0, scenario::FAULT_HOURS * 60)];
    let held = play(scenario.clone());
    assert!(
        held.violations.is_empty(),
        "seed {seed}: {:?}",
        held.violations
    );
    assert!(
        held.reached.contains("a purchase was held back by a pause"),
        "seed {seed}: {:?}",
        held.reached
    );
    scenario.sabotage_pause = true;
    let o = play(scenario);
    let all = o.violations.join("\n");
    assert!(
        all.contains("while purchases were paused"),
        "seed {seed}: {all}"
    );
}

/// Two runs of a seed give byte-identical traces (and so the same decisions and events).
#[test]
fn a_seed_replays_to_a_byte_identical_trace() {
    for seed in [3, 17] {
        let a = run_seed(seed);
        let b = run_seed(seed);
        assert!(
            a.trace.len() > 20,
            "seed {seed}: a trace of {} lines",
            a.trace.len()
        );
        assert_eq!(a.trace.join("\n"), b.trace.join("\n"), "seed {seed}");
    }
}

/// A violation's kind: its text up to the first colon ("drains first", "ledger exact", ...).
fn kind(violation: &str) -> &str {
    violation.split(':').next().unwrap_or(violation)
}

/// The same kinds of parts with some taken out: all, either half, then (for a few) each one.
fn cuts<T: Clone>(v: &[T]) -> Vec<Vec<T>> {
    let mut out = Vec::new();
    if v.is_empty() {
        return out;
    }
    out.push(Vec::new());
    if v.len() > 2 {
        let h = v.len() / 2;
        out.push(v[h..].to_vec());
        out.push(v[..h].to_vec());
    }
    if v.len() <= 8 {
        for i in 0..v.len() {
            let mut w = v.to_vec();
            w.remove(i);
            out.push(w);
        }
    }
    out
}

/// Scenarios smaller than `s` by one step, the biggest cuts first.
fn smaller(s: &Scenario) -> Vec<Scenario> {
    let mut out = Vec::new();
    macro_rules! cut {
        ($($field:ident),*) => {$(
            for v in cuts(&s.$field) {
                let mut c = s.clone();
                c.$field = v;
                out.push(c);
            }
        )*};
    }
    cut!(
        crashes,
        crash_after,
        races,
        outages,
        pauses,
        deliveries,
        api_faults,
        store_faults,
        market,
        crowded_days,
        refused,
        strays,
        console_extensions,
        extension_asks
    );
    if !s.extension_payment_failures.is_empty() {
        let mut c = s.clone();
        c.extension_payment_failures.clear();
        out.push(c);
    }
    if s.late_notice_outage {
        let mut c = s.clone();
        c.late_notice_outage = false;
        out.push(c);
    }
    if s.refuse_later_block {
        let mut c = s.clone();
        c.refuse_later_block = false;
        out.push(c);
    }
    if s.requests.len() > 1 {
        for i in 0..s.requests.len() {
            let mut c = s.clone();
            c.requests.remove(i);
            c.strays.retain(|t| t.request != i);
            for t in &mut c.strays {
                if t.request > i {
                    t.request -= 1;
                }
            }
            c.console_extensions.retain(|x| x.request != i);
            for x in &mut c.console_extensions {
                if x.request > i {
                    x.request -= 1;
                }
            }
            c.extension_asks.retain(|x| x.request != i);
            for x in &mut c.extension_asks {
                if x.request > i {
                    x.request -= 1;
                }
            }
            c.extension_payment_failures.retain(|x| *x != i);
            for x in &mut c.extension_payment_failures {
                if *x > i {
                    *x -= 1;
                }
            }
            out.push(c);
        }
    }
    for i in 0..s.requests.len() {
        let r = &s.requests[i];
        let mut simpler = Vec::new();
        if r.cancel_at.is_some() {
            let mut c = r.clone();
            c.cancel_at = None;
            simpler.push(c);
        }
        if r.resubmit.is_some() {
            let mut c = r.clone();
            c.resubmit = None;
            simpler.push(c);
        }
        if r.payment_failures > 0 {
            let mut c = r.clone();
            c.payment_failures = 0;
            simpler.push(c);
        }
        if r.cap_at_quote {
            let mut c = r.clone();
            c.cap_at_quote = false;
            simpler.push(c);
        }
        for v in cuts(&r.instance_failures) {
            let mut c = r.clone();
            c.instance_failures = v;
            simpler.push(c);
        }
        for r in simpler {
            let mut c = s.clone();
            c.requests[i] = r;
            out.push(c);
        }
    }
    // The emulator's mildest settings, one at a time.
    let t = &s.timings;
    let mut mild = Vec::new();
    if t.listing_lag_seconds != 0 {
        mild.push(scenario::Timings {
            listing_lag_seconds: 0,
            ..t.clone()
        });
    }
    if t.block_activation_seconds != 0 {
        mild.push(scenario::Timings {
            block_activation_seconds: 0,
            ..t.clone()
        });
    }
    if t.instance_listing_lag_seconds != 0 {
        mild.push(scenario::Timings {
            instance_listing_lag_seconds: 0,
            ..t.clone()
        });
    }
    if t.payment_minutes != 1 {
        mild.push(scenario::Timings {
            payment_minutes: 1,
            ..t.clone()
        });
    }
    if t.extension_lead_minutes != 720 {
        mild.push(scenario::Timings {
            extension_lead_minutes: 720,
            ..t.clone()
        });
    }
    if s.concurrent_duplicates {
        out.push(Scenario {
            concurrent_duplicates: false,
            ..s.clone()
        });
    }
    for timings in mild {
        out.push(Scenario {
            timings,
            ..s.clone()
        });
    }
    out
}

/// Shrinks `scenario`, which fails with a violation of kind `k`, proptest-style: takes the
/// first one-step-smaller scenario that still fails so, until none does or `budget` runs
/// are spent. Returns the smallest found and the runs it took.
fn shrink(scenario: Scenario, k: &str, budget: usize) -> (Scenario, usize) {
    let mut best = scenario;
    let mut runs = 0;
    'smaller: loop {
        for c in smaller(&best) {
            if runs >= budget {
                break 'smaller;
            }
            runs += 1;
            if play(c.clone()).violations.iter().any(|v| kind(v) == k) {
                best = c;
                continue 'smaller;
            }
        }
        break;
    }
    (best, runs)
}

/// A failing scenario shrinks to a smaller one that fails the same way.
#[test]
fn a_failing_scenario_shrinks_to_a_smaller_one_that_fails_alike() {
    let seed = (1..=200)
        .find(|s| run_seed(*s).reached.contains("a block was bought"))
        .expect("a seed that buys a block");
    let mut scenario = Scenario::from_seed(seed);
    scenario.sabotage = true;
    let k = "one reservation per window";
    let size = |s: &Scenario| {
        s.crashes.len()
            + s.crash_after.len()
            + s.races.len()
            + s.outages.len()
            + s.deliveries.len()
            + s.api_faults.len()
            + s.store_faults.len()
            + s.market.len()
            + s.requests.len()
    };
    let before = size(&scenario);
    let (small, runs) = shrink(scenario, k, 12);
    assert!(runs > 0);
    assert!(
        size(&small) < before,
        "seed {seed}: nothing was cut in {runs} runs"
    );
    let o = play(small);
    assert!(
        o.violations.iter().any(|v| kind(v) == k),
        "seed {seed}: the shrunk scenario passes: {:?}",
        o.violations
    );
}

/// `SIM_SEED=<seed>`: one seed, its scenario and whole trace printed; a failing one is then
/// shrunk (`SHRINK_RUNS`, 400 unless set), and the smallest failing scenario and its trace
/// are printed. `SIM_LOG=<filter>` (`info`, `launch_workloads=info`, ...) prints the
/// functions' own log lines as they run, before the trace.
#[test]
#[ignore = "run by hand: SIM_SEED=<seed>"]
fn replay() {
    if let Ok(filter) = std::env::var("SIM_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .without_time()
            .with_target(false)
            .init();
    }
    let seed: u64 = std::env::var("SIM_SEED")
        .expect("SIM_SEED")
        .parse()
        .expect("a seed");
    println!("{:#?}", Scenario::from_seed(seed));
    let mut o = run_seed(seed);
    if let Some(first) = o.violations.first().cloned() {
        for line in &o.trace {
            println!("{line}");
        }
        let budget = std::env::var("SHRINK_RUNS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(400);
        let k = kind(&first).to_string();
        let (small, runs) = shrink(Scenario::from_seed(seed), &k, budget);
        println!("\n==== shrunk in {runs} runs; the smallest scenario failing with {k:?}:");
        println!("{small:#?}");
        o = play(small);
    }
    for line in &o.trace {
        println!("{line}");
    }
    for ((f, trigger), n) in &o.by_function {
        println!("{n:>6} {f} <- {trigger}");
    }
    println!(
        "{} invocations, {} violations",
        o.invocations,
        o.violations.len()
    );
    assert!(o.violations.is_empty(), "{}", o.violations.join("\n"));
}

/// `make soak SEEDS=N FIRST=K`: seeds K..K+N-1; ends with `N seeds, V violations`. With
/// `SOAK_REACH=1` (the mutation campaign's test) it also fails when the seeds never reached
/// an outcome of [`MUST_REACH`]: a change that makes the system refuse everything breaks
/// no safety promise, and must still fail. With `SOAK_STOP=1` (also the campaign's) it stops
/// at the first seed that fails: a mutant caught needs one seed, not all of them.
#[test]
#[ignore = "run by make soak"]
fn soak() {
    let n: u64 = std::env::var("SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let first: u64 = std::env::var("FIRST")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let known = seeds().known;
    let started = std::time::Instant::now();
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()) as u64;
    let all: Vec<u64> = (first..first + n).collect();
    // `SOAK_STOP=1` (the mutation campaign's test): stop at the first seed that fails.
    let stop_at_first = std::env::var("SOAK_STOP").is_ok_and(|v| v == "1");
    let c = campaign(&all, threads, stop_at_first, &known);
    let mut violations = 0;
    for (seed, v) in &c.failed {
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
    println!("reached (seeds):");
    for (k, v) in &c.reach {
        println!("  {v:>6}  {k}");
    }
    println!(
        "{:.2} seeds/s, {:.0} invocations/s, over {threads} threads",
        c.seeds as f64 / secs,
        c.invocations as f64 / secs
    );
    println!("{} of {n} seeds run, {violations} violations", c.seeds);
    assert_eq!(violations, 0, "{violations} seeds violated a promise");
    if std::env::var("SOAK_REACH").is_ok_and(|v| v == "1") {
        let missed: Vec<&&str> = MUST_REACH
            .iter()
            .filter(|r| !c.reach.contains_key(**r))
            .collect();
        assert!(missed.is_empty(), "the seeds never reached {missed:?}");
    }
}
