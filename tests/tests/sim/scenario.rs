//! A seed expands into one explicit [`Scenario`]: the requests and what their requesters and
//! approvers do, the market and how it moves, the emulator's harsh settings, and every fault
//! with its time or delivery number. The run draws nothing else at random: what happens is
//! this value plus the system's own deterministic behaviour.

use chrono::{DateTime, TimeDelta, Utc};
use serde_json::{Value, json};

/// When every simulated run starts.
pub fn t0() -> DateTime<Utc> {
    "2026-12-01T09:00:00Z".parse().unwrap()
}

/// Faults stop this long after [`t0`]; the settling period follows.
pub const FAULT_HOURS: i64 = 4 * 24;
/// The fault-free settling period before the end-of-run checks.
pub const SETTLE_HOURS: i64 = 48;

/// SplitMix64 over `capacity_pilot::ids::mix`, the seed's one source of variation.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(capacity_pilot::ids::mix(seed ^ 0x5EED_5EED))
    }
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(1);
        capacity_pilot::ids::mix(self.0)
    }
    /// A number in `lo..=hi`.
    pub fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next() % ((hi - lo + 1) as u64)) as i64
    }
    /// True with probability `pct` percent.
    pub fn chance(&mut self, pct: u64) -> bool {
        self.next() % 100 < pct
    }
    pub fn pick<'a, T>(&mut self, of: &'a [T]) -> &'a T {
        &of[(self.next() % of.len() as u64) as usize]
    }
}

/// What the approver does when a request of this scenario awaits approval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Approver {
    /// Approves the key it was shown, this many minutes later.
    Approves { after_minutes: i64 },
    /// Rejects it.
    Rejects { after_minutes: i64 },
    /// Approves a key it was never shown (stale or made up).
    Stale { after_minutes: i64 },
    /// Someone outside the approver sources approves it.
    Forged { after_minutes: i64 },
    /// Never answers.
    Silent,
}

/// One request and what its requester does.
#[derive(Debug, Clone)]
pub struct PlannedRequest {
    /// Minutes after [`t0`] that it is submitted.
    pub submit_at: i64,
    pub detail: Value,
    /// Whether it was made invalid on purpose (it must be rejected, naming the fields).
    pub invalid: Vec<&'static str>,
    /// Minutes after [`t0`] that its requester cancels it (possibly before submitting).
    pub cancel_at: Option<i64>,
    /// Minutes after [`t0`] that the same id is submitted again, with this detail.
    pub resubmit: Option<(i64, Value)>,
    pub approver: Approver,
    /// Forced payment failures of its next purchases.
    pub payment_failures: u32,
    /// A forced payment failure of a later purchase: after this many have paid (a split's
    /// later block, a replacement, a block kept by a request that has since failed).
    pub payment_failure_after: Option<u32>,
    /// (hours after its first launch, which live instance) to fail or impair.
    pub instance_failures: Vec<(i64, usize, bool)>,
    /// Its requester looked the price up first: just before it submits, its
    /// `max_upfront_usd` is set to the lowest fee AWS quotes for it then, so that the cap
    /// is met exactly (a fee at the cap is within it).
    pub cap_at_quote: bool,
    /// Its cancellation spells its id upper-cased: ids compare ignoring case (review N15).
    pub cancel_upper: bool,
}

/// A stray block for `request` (an index of [`Scenario::requests`]): when a purchase is
/// about to run and the request is `OfferingsFound`, a block tagged for it and for this
/// deployment is bought from an offering that no offering of its plan matches; it serves
/// the request (its type and window and duration, one instance more than its count) or not
/// (another type, or half the duration).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedStray {
    pub request: usize,
    pub serves: bool,
}

/// A team extends the reservation its request `request` runs in, in the console, `after`
/// minutes after its first launch, by `hours`: as the console would (an extension purchase
/// for a block, `ExtendTrainingPlan` for a plan), more than 3 hours before the end, so its
/// payment clears well before any drain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsoleExtension {
    pub request: usize,
    pub after: i64,
    pub hours: i64,
}

/// A team asks for an extension of its request's reservation (`Capacity Extension Requested`,
/// ARCHITECTURE §9.3) `after` minutes after its workload launched, by `hours`; with `twice`,
/// the same ask is put again a minute later (a person pressing twice).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtensionAsk {
    pub request: usize,
    pub after: i64,
    pub hours: i64,
    pub twice: bool,
}

/// A change of the market at a time.
#[derive(Debug, Clone)]
pub struct MarketMove {
    pub at: i64,
    pub instance_type: &'static str,
    /// Block and plan capacity per zone and day.
    pub block_pool: Option<u32>,
    /// The block price, in percent of the list price.
    pub price_pct: Option<u32>,
}

/// An AWS API fault armed at a time: it takes the operation's next `count` calls.
#[derive(Debug, Clone)]
pub struct ApiFault {
    pub at: i64,
    pub operation: &'static str,
    pub kind: ApiFaultKind,
    pub count: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiFaultKind {
    Throttle,
    InternalError,
    /// Performed, then the response is lost.
    LostResponse,
}

/// A store fault armed at a time: it takes the next write.
#[derive(Debug, Clone)]
pub struct StoreFault {
    pub at: i64,
    /// The write commits, and its answer is lost (else it fails, writing nothing).
    pub commits: bool,
}

/// What happens to one event delivery, by its number (0-based) among all deliveries of
/// bus events to functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryFault {
    /// Delivered twice.
    Duplicate,
    /// Delivered this many minutes late (which reorders it behind later events).
    Delay(i64),
    /// Never delivered: EventBridge's retries ran out and it went to the rule's DLQ.
    Drop,
}

/// The functions, as the template names them.
pub const FUNCTIONS: [&str; 5] = [
    "search-offerings",
    "purchase-capacity",
    "launch-workloads",
    "replace-unhealthy",
    "cleanup-expired",
];

/// An invocation that dies at a port call: the `nth` (0-based) invocation of `function` in
/// the fault hours dies at its port call number `at_call` (0-based: before that call takes
/// effect, which is after the one before it did). One with fewer calls dies after its last:
/// all its work done, and Lambda still sees it fail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Crash {
    pub function: &'static str,
    pub nth: u64,
    pub at_call: u32,
}

/// What the `nth` invocation of a function runs at once with, interleaved at port calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RaceWith {
    /// Its schedule's tick, fired at the same moment.
    Tick,
    /// The next delivery queued for the same function (within ten minutes), delivered now.
    NextDelivery,
}

/// Two invocations of one function at once: whose port call goes next is drawn from
/// `order`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Race {
    pub function: &'static str,
    pub nth: u64,
    pub with: RaceWith,
    pub order: u64,
}

/// A function down (every invocation fails, every tick is missed) for `minutes` from
/// `from` minutes after [`t0`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outage {
    pub function: &'static str,
    pub from: i64,
    pub minutes: i64,
    /// Set by the harness across a lead-time notice ([`Scenario::late_notice_outage`]).
    pub late_notice: bool,
}

impl Outage {
    pub fn covers(&self, at: DateTime<Utc>) -> bool {
        let from = t0() + TimeDelta::minutes(self.from);
        from <= at && at < from + TimeDelta::minutes(self.minutes)
    }
}

/// Emulator settings within REALISM.md's bounds, the harsh end included, and for the listing
/// lag a tail past them ([`Scenario::from_seed`]).
#[derive(Debug, Clone)]
pub struct Timings {
    pub listing_lag_seconds: i64,
    pub block_activation_seconds: i64,
    pub instance_listing_lag_seconds: i64,
    pub payment_minutes: i64,
    /// `EXTENSION_PAYMENT_LEAD_MINUTES`: the default 12 h, or, where payments take 6 hours
    /// (no draw), the template's least, one hour: an extension asked late then clears after
    /// the window's drain began, and reopens it (issue 58).
    pub extension_lead_minutes: i64,
}

#[derive(Debug, Clone)]
pub struct Scenario {
    pub seed: u64,
    /// The teams' monthly caps, as `TEAM_BUDGETS_USD` gives them.
    pub team_budgets: Value,
    pub requests: Vec<PlannedRequest>,
    /// On-demand p5.48xlarge capacity per zone at the start.
    pub on_demand_pool: u32,
    pub block_pool: u32,
    /// Days (after [`t0`]'s) on which another buyer has taken every p5 training plan slot in
    /// every zone: a plan must split around them or start after.
    pub crowded_days: Vec<i64>,
    pub market: Vec<MarketMove>,
    pub timings: Timings,
    pub api_faults: Vec<ApiFault>,
    pub store_faults: Vec<StoreFault>,
    /// By delivery number.
    pub deliveries: Vec<(u64, DeliveryFault)>,
    pub crashes: Vec<Crash>,
    pub races: Vec<Race>,
    /// (call, occurrence): the invocation making that occurrence of the call (counted
    /// across invocations in the fault hours) dies right after it took effect.
    pub crash_after: Vec<(&'static str, u32)>,
    /// (purchase call, occurrence): AWS refuses that occurrence of the call (counted in the
    /// fault hours) for good, nothing performed: EC2's `InvalidParameterValue`, SageMaker's
    /// `ValidationException`, HTTP 400.
    pub refused: Vec<(&'static str, u32)>,
    /// AWS refuses so the first `PurchaseCapacityBlock` that is an invocation's second (a
    /// split's later block, bought after its first), once, in the fault hours.
    pub refuse_later_block: bool,
    /// Purchases begun by a release before `doubt` was: in the fault hours, the harness
    /// forgets the doubt a purchase's first lease wrote, after the invocation that wrote it,
    /// so a takeover derives it from the lease (a worker of the old release died holding it,
    /// and the new release takes over).
    pub legacy_doubt: bool,
    /// A requester cancels a request as soon as it holds a paid window while still
    /// cancellable (a split's kept block while its replacement is searched for): the window
    /// is served to its drain all the same (ARCHITECTURE §9.1).
    pub cancel_kept: bool,
    /// The requests (by index) whose requester asks `stop_running: true` as soon as a paid
    /// window of theirs runs: the window is stopped through its ordinary drain, early, and
    /// only then (ARCHITECTURE §9.1).
    pub stop_running: Vec<usize>,
    /// Strays, bought by the harness when their request first waits to be purchased.
    pub strays: Vec<PlannedStray>,
    pub outages: Vec<Outage>,
    /// (from, to), minutes after [`t0`]: an operator's pause of purchases (ARCHITECTURE
    /// §9.7), written at `from` and deleted at `to`.
    pub pauses: Vec<(i64, i64)>,
    /// Teams that extend their block or plan by hand in the console (ARCHITECTURE §9.3):
    /// the drain must follow the new end.
    pub console_extensions: Vec<ConsoleExtension>,
    /// Teams that ask capacity-pilot to extend (ARCHITECTURE §9.3): their requests carry an
    /// `extend` policy (`requested`, or `workload-running`, which extends by itself).
    pub extension_asks: Vec<ExtensionAsk>,
    /// Requests (by index) whose extensions' payments fail (the emulator's one-shot failure,
    /// armed when the workload launches): the reservation keeps its end, the fee goes back.
    pub extension_payment_failures: Vec<usize>,
    /// cleanup-expired goes down for 30 min across the first window's 1 h Opening notice
    /// (the harness adds the outage once it knows when that is): the notice goes late.
    pub late_notice_outage: bool,
    /// Whether an event delivered twice runs its two deliveries at once (interleaved).
    pub concurrent_duplicates: bool,
    /// EC2 refuses the undocumented tag filter on DescribeCapacityReservations (the harsher
    /// reading of aws-reference §11.1): reconciliation must use the documented filters.
    pub refuse_tag_filters: bool,
    /// The account may not launch on demand (`VcpuLimitExceeded`), and on-demand-first
    /// requests are interruptible: their runs are spot runs, which reclaims interrupt
    /// (ARCHITECTURE §9.1: repaired on spot, settled by what ran).
    pub spot_runs: bool,
    /// Reconciliation's reads (DescribeCapacityReservations, ListTrainingPlans) are refused
    /// from the start until the faults end, after a purchase's answer was lost.
    pub reconcile_outage: bool,
    /// Ledgers from before ARCHITECTURE §9.8 lower-cased the team's key: (the team as its
    /// requests spell it, what that ledger holds for t0's month, micro-USD).
    pub legacy_ledgers: Vec<(String, i64)>,
    /// Never generated: a test sets it to show the checks catch what they should.
    pub sabotage: bool,
    /// Never generated: a lead-time notice is announced again under another key.
    pub sabotage_notices: bool,
    /// Never generated: the harness does not write the scenario's pauses, so purchases go
    /// on through them (the checks must catch it).
    pub sabotage_pause: bool,
}

impl Scenario {
    pub fn end(&self) -> DateTime<Utc> {
        t0() + TimeDelta::hours(FAULT_HOURS + SETTLE_HOURS)
    }
    pub fn faults_end(&self) -> DateTime<Utc> {
        t0() + TimeDelta::hours(FAULT_HOURS)
    }
    /// Where the `nth` invocation of `function` dies, if it does.
    pub fn crash(&self, function: &str, nth: u64) -> Option<u32> {
        self.crashes
            .iter()
            .find(|c| c.function == function && c.nth == nth)
            .map(|c| c.at_call)
    }
    pub fn race(&self, function: &str, nth: u64) -> Option<&Race> {
        self.races
            .iter()
            .find(|c| c.function == function && c.nth == nth)
    }
    /// Whether `function` is down at `at`.
    pub fn down(&self, function: &str, at: DateTime<Utc>) -> bool {
        self.outages
            .iter()
            .any(|o| o.function == function && o.covers(at))
    }
    pub fn delivery_fault(&self, n: u64) -> Option<DeliveryFault> {
        self.deliveries
            .iter()
            .find(|(k, _)| *k == n)
            .map(|(_, f)| *f)
    }

    /// The scenario of `seed`.
    pub fn from_seed(seed: u64) -> Scenario {
        let mut r = Rng::new(seed);
        let scarce = r.chance(40);
        let block_pool = if scarce {
            r.range(1, 3)
        } else {
            r.range(8, 24)
        } as u32;
        let on_demand_pool = if r.chance(50) {
            0
        } else {
            r.range(1, 8) as u32
        };
        let cap_a = *r.pick(&["8000", "15000", "30000", "100000"]);
        let team_budgets = json!({"team-a": cap_a, "*": "60000"});
        let timings = Timings {
            listing_lag_seconds: *r.pick(&[0, 120, 600]),
            block_activation_seconds: *r.pick(&[0, 300, 900]),
            instance_listing_lag_seconds: *r.pick(&[0, 120, 600]),
            payment_minutes: *r.pick(&[1, 5, 60, 360]),
            extension_lead_minutes: 720,
        };
        let n = r.range(2, 3) as usize;
        let mut requests = Vec::new();
        for i in 0..n {
            requests.push(request(&mut r, seed, i));
        }
        // Several requests of one id: the second request reuses the first's id.
        if r.chance(10) {
            let id = requests[0].detail["request_id"].clone();
            requests[1].detail["request_id"] = id;
        }
        let mut market = Vec::new();
        for _ in 0..r.range(0, 3) {
            let at = r.range(0, 60 * 48);
            let ty = *r.pick(&["p5.48xlarge", "p4d.24xlarge"]);
            if r.chance(50) {
                // Offerings vanish between a search and its purchase, and come back.
                market.push(MarketMove {
                    at,
                    instance_type: ty,
                    block_pool: Some(0),
                    price_pct: None,
                });
                market.push(MarketMove {
                    at: at + r.range(5, 180),
                    instance_type: ty,
                    block_pool: Some(block_pool),
                    price_pct: None,
                });
            } else {
                market.push(MarketMove {
                    at,
                    instance_type: ty,
                    block_pool: None,
                    price_pct: Some(r.range(70, 140) as u32),
                });
            }
        }
        let ops: &[&'static str] = &[
            "DescribeCapacityBlockOfferings",
            "PurchaseCapacityBlock",
            "SearchTrainingPlanOfferings",
            "CreateTrainingPlan",
            "DescribeCapacityReservations",
            "RunInstances",
            "DescribeInstances",
            "DescribeInstanceStatus",
            "TerminateInstances",
            "CreateTrainingJob",
            "CreateEndpoint",
            "UpdateCluster",
            "PutEvents",
        ];
        let mut api_faults = Vec::new();
        for _ in 0..r.range(0, 8) {
            let kind = *r.pick(&[
                ApiFaultKind::Throttle,
                ApiFaultKind::InternalError,
                ApiFaultKind::LostResponse,
            ]);
            // Half of them where purchases happen: the first hours.
            let at = if r.chance(50) {
                r.range(0, 8 * 60)
            } else {
                r.range(0, 60 * 24 * 4)
            };
            api_faults.push(ApiFault {
                at,
                operation: ops[(r.next() % ops.len() as u64) as usize],
                kind,
                count: r.range(1, 3) as u32,
            });
        }
        // The money faults: the first purchase's answer is lost (it was made), or it fails.
        for op in ["PurchaseCapacityBlock", "CreateTrainingPlan"] {
            if r.chance(35) {
                let kind = if r.chance(70) {
                    ApiFaultKind::LostResponse
                } else {
                    ApiFaultKind::InternalError
                };
                api_faults.push(ApiFault {
                    at: 0,
                    operation: op,
                    kind,
                    count: r.range(1, 2) as u32,
                });
            }
        }
        let mut store_faults = Vec::new();
        for _ in 0..r.range(0, 8) {
            store_faults.push(StoreFault {
                at: if r.chance(50) {
                    r.range(0, 8 * 60)
                } else {
                    r.range(0, 60 * 24 * 4)
                },
                commits: r.chance(60),
            });
        }
        let mut deliveries = Vec::new();
        let rate = *r.pick(&[0, 3, 8, 15, 30]);
        for k in 0..600 {
            if r.chance(rate) {
                let f = match r.range(0, 5) {
                    0 | 1 => DeliveryFault::Duplicate,
                    2 | 3 => DeliveryFault::Delay(*r.pick(&[1, 5, 30, 120])),
                    _ => DeliveryFault::Drop,
                };
                deliveries.push((k, f));
            }
        }
        market.sort_by_key(|m| m.at);
        let crowded_days = if r.chance(35) {
            vec![r.range(1, 3)]
        } else {
            Vec::new()
        };
        // Crash points and interleavings, by each function's invocation number in the fault
        // hours: per seed a rate, per invocation a draw.
        let mut crashes = Vec::new();
        let crash_rate = *r.pick(&[0, 1, 3, 8]);
        let mut races = Vec::new();
        let race_rate = *r.pick(&[0, 2, 6, 15]);
        for function in FUNCTIONS {
            for nth in 0..400 {
                if r.chance(crash_rate) {
                    let most = *r.pick(&[2, 6, 24]);
                    crashes.push(Crash {
                        function,
                        nth,
                        at_call: r.range(0, most) as u32,
                    });
                }
                if r.chance(race_rate) {
                    races.push(Race {
                        function,
                        nth,
                        with: if r.chance(50) {
                            RaceWith::Tick
                        } else {
                            RaceWith::NextDelivery
                        },
                        order: r.next(),
                    });
                }
            }
        }
        // Deaths right after the calls that spend, launch, or commit a decision.
        let mut crash_after = Vec::new();
        for call in [
            "PurchaseCapacityBlock",
            "CreateTrainingPlan",
            "RunInstances",
            "TerminateInstances",
            "CreateTrainingJob",
            "CreateEndpoint",
            "UpdateCluster",
            "PutEvents",
            "BeginPurchase",
            "RecordReservation",
            "Transition",
            "UpdateWindows",
            "PutWorkload",
            "ClaimOutbox",
            "MarkSent",
        ] {
            if r.chance(20) {
                crash_after.push((call, r.range(0, 2) as u32));
            }
        }
        let mut outages = Vec::new();
        if r.chance(30) {
            for _ in 0..r.range(1, 2) {
                outages.push(Outage {
                    function: FUNCTIONS[(r.next() % FUNCTIONS.len() as u64) as usize],
                    from: r.range(0, 60 * (FAULT_HOURS - 1)),
                    minutes: *r.pick(&[60, 180, 480, 1440]),
                    late_notice: false,
                });
            }
        }
        let concurrent_duplicates = r.chance(60);
        // The listing lag's tail, drawn after every other draw (so each seed's other choices
        // stay as they were): longer than the purchase lease (15 min) and within the doubt
        // window (1 h), past ARCHITECTURE 8.10's 10-minute bound. AWS gives no bound (its
        // Describe* calls are eventually consistent), so the harsher reading is modelled: a
        // worker that takes over an expired lease then finds its predecessor's purchase still
        // unlisted, and must neither buy it again nor hand its debit back (the doubt window).
        // Within the 10 minutes the doubt window never decides anything.
        let mut timings = timings;
        if r.chance(15) {
            timings.listing_lag_seconds = 1800;
        }
        if timings.payment_minutes == 360 {
            timings.extension_lead_minutes = 60;
        }
        // The draws below answer the mutation campaign's misses (issue 25,
        // tests/mutants/purchase.md); they too come after every earlier draw.
        // EC2 requests that may split: two blocks of half the duration, so that a plan of
        // several offerings is bought block by block (a recorded block skipped when taking
        // over, a later block refused or gone after the first was bought).
        for req in requests.iter_mut() {
            if req.detail["workload"]["kind"] == "ec2-instances" && r.chance(60) {
                let mut d = split_ec2(&req.detail);
                // (A request made invalid on purpose stays invalid.)
                if req.invalid.contains(&"latest_end") {
                    d["latest_end"] = req.detail["latest_end"].clone();
                }
                req.detail = d;
                if let Some((_, again)) = &mut req.resubmit {
                    *again = split_ec2(again);
                }
            }
        }
        // Purchases AWS refuses for good, by the call's occurrence: with nothing of the plan
        // bought, the request fails with the refusal and its ending announces what it spent;
        // the second call may be a split's second block, bought beside the first.
        let mut refused = Vec::new();
        for op in ["PurchaseCapacityBlock", "CreateTrainingPlan"] {
            if r.chance(20) {
                refused.push((op, r.range(0, 2) as u32));
            }
        }
        // A throttling storm on a purchase, far longer than the purchase's own retries (it
        // takes the first purchases made): the invocation must give up within its timeout,
        // not sleep through it.
        if r.chance(25) {
            api_faults.push(ApiFault {
                at: 0,
                operation: ["PurchaseCapacityBlock", "CreateTrainingPlan"][r.range(0, 1) as usize],
                kind: ApiFaultKind::Throttle,
                count: 700,
            });
        }
        for req in requests.iter_mut() {
            req.cap_at_quote = req.invalid.is_empty() && r.chance(15);
        }
        // Strays: a block tagged for an EC2 request and this deployment that no record
        // holds, bought from another offering than its plan's (a purchase whose record was
        // lost: the table restored from a backup taken before it was recorded, say). One that
        // serves the request reserves it in the plan's place; one that does not is kept
        // beside the plan.
        let mut strays = Vec::new();
        for (i, req) in requests.iter().enumerate() {
            if req.detail["workload"]["kind"] == "ec2-instances" && r.chance(50) {
                strays.push(PlannedStray {
                    request: i,
                    serves: r.chance(60),
                });
            }
        }
        // A split's later block refused for good after its first was bought: the request keeps
        // the block and searches for a replacement segment.
        let refuse_later_block = r.chance(30);
        let legacy_doubt = r.chance(15);
        let cancel_kept = r.chance(50);
        // Drawn last, so the draws above stay what each seed drew before.
        let stop_running = (0..requests.len()).filter(|_| r.chance(20)).collect();
        // (Issue 48, after every earlier draw.)
        let refuse_tag_filters = r.chance(25);
        // (Issue 48, spot runs, after every earlier draw.)
        let spot_runs = r.chance(30);
        if spot_runs {
            for req in requests.iter_mut() {
                if req.detail["workload"]["kind"] == "ec2-instances" && r.chance(40) {
                    req.detail["strategy"] = json!("on-demand-first");
                }
                if req.detail["strategy"] == "on-demand-first" {
                    req.detail["interruptible"] = json!(true);
                    // EC2 reclaims one of its instances, mostly.
                    let hours = req.detail["duration_hours"].as_i64().unwrap_or(24);
                    if r.chance(70) {
                        req.instance_failures
                            .push((r.range(0, (hours - 2).max(1)), 0, false));
                    }
                }
            }
        }
        // (Issue 48, payments and reconciliation, after every earlier draw.) A payment that
        // fails on a later purchase of a request: its split's later block, a replacement, or a
        // block it keeps once it has failed.
        for req in requests.iter_mut() {
            if req.payment_failures == 0 && r.chance(15) {
                req.payment_failure_after = Some(r.range(1, 2) as u32);
            }
        }
        // Reconciliation refused outright for hours after a purchase's answer was lost: the
        // purchase must end in doubt at its deadline and be reconciled hourly after.
        let reconcile_outage = r.chance(20);
        if reconcile_outage {
            let op = *r.pick(&["PurchaseCapacityBlock", "CreateTrainingPlan"]);
            api_faults.push(ApiFault {
                at: 0,
                operation: op,
                kind: ApiFaultKind::LostResponse,
                count: 1,
            });
            let read = if op == "PurchaseCapacityBlock" {
                "DescribeCapacityReservations"
            } else {
                "ListTrainingPlans"
            };
            api_faults.push(ApiFault {
                at: 0,
                operation: read,
                kind: ApiFaultKind::InternalError,
                count: 5000,
            });
        }
        // (Issue 48, spot fall-back, after every earlier draw.) EC2 reclaims a spot run past
        // its repairs: the newest instance every hour, once more than the replacement cap
        // allows, or every instance at once (spot capacity going).
        if spot_runs {
            for req in requests
                .iter_mut()
                .filter(|q| q.detail["strategy"] == "on-demand-first")
            {
                if !r.chance(35) {
                    continue;
                }
                let hours = req.detail["duration_hours"].as_i64().unwrap_or(24);
                let count = req.detail["instance_count"].as_u64().unwrap_or(1) as usize;
                // Early (a reservation for the rest may still fit the window), or any time.
                let at = if r.chance(50) {
                    r.range(0, 4)
                } else {
                    r.range(0, (hours - 8).max(1))
                };
                if r.chance(50) {
                    let cap = i64::from(capacity_pilot::config::DEFAULT_MAX_REPLACEMENTS);
                    for k in 0..=cap {
                        req.instance_failures
                            .push((at + k, count.saturating_sub(1), false));
                    }
                } else {
                    for i in (0..count).rev() {
                        req.instance_failures.push((at, i, false));
                    }
                }
            }
        }
        // (Issue 49, after every earlier draw.) Two requests naming one workload: the second
        // takes the first's endpoint (in upper case half the time: AWS's names ignore case) or
        // HyperPod group, over its own window; the first to be recorded claims it.
        // (Only a SageMaker second request: the EC2 paths' draws above stay as they were.)
        let shared_name = r.chance(60);
        let kind = requests[0].detail["workload"]["kind"].clone();
        let named = |k: &Value| k == "inference-endpoint" || k == "hyperpod-cluster";
        if shared_name
            && named(&kind)
            && (named(&requests[1].detail["workload"]["kind"])
                || requests[1].detail["workload"]["kind"] == "training-job")
        {
            let mut workload = requests[0].detail["workload"].clone();
            if kind == "inference-endpoint" && r.chance(50) {
                let upper = workload["endpoint_name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_uppercase();
                workload["endpoint_name"] = json!(upper);
            }
            let second = &mut requests[1];
            second.detail["workload"] = workload.clone();
            // Half the time after the first's interval: the name is used in turn.
            if r.chance(50) {
                let at = |v: &Value| {
                    v.as_str()
                        .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
                        .map(|t| t.with_timezone(&Utc))
                };
                let first_end = at(&requests[0].detail["latest_end"]);
                let second = &mut requests[1];
                let span = at(&second.detail["latest_end"])
                    .zip(at(&second.detail["earliest_start"]))
                    .map(|(l, e)| l - e);
                if let (Some(from), Some(span)) = (first_end, span) {
                    let from = from + TimeDelta::hours(r.range(0, 12));
                    let iso = |t: DateTime<Utc>| t.format("%Y-%m-%dT%H:%M:%SZ").to_string();
                    second.detail["earliest_start"] = json!(iso(from));
                    second.detail["latest_end"] = json!(iso(from + span));
                }
            }
            let second = &mut requests[1];
            if let Some((_, again)) = &mut second.resubmit {
                again["workload"] = workload;
                again["earliest_start"] = second.detail["earliest_start"].clone();
                again["latest_end"] = second.detail["latest_end"].clone();
            }
        }
        // (Issue 49, after every earlier draw.) Teams spelled in other cases: one team, one
        // cap, one ledger.
        for req in requests.iter_mut() {
            if req.invalid.is_empty() && r.chance(20) {
                let spelled = match req.detail["team"].as_str() {
                    Some("team-a") => *r.pick(&["Team-A", "TEAM-a"]),
                    Some("team-b") => "Team-B",
                    _ => continue,
                };
                req.detail["team"] = json!(spelled);
                if let Some((_, again)) = &mut req.resubmit {
                    again["team"] = json!(spelled);
                }
            }
        }
        // (Issue 49, after every earlier draw.) An approval threshold between a split's half
        // and its whole: each block alone is under it, the two together above.
        for req in requests.iter_mut() {
            let split = req.detail["allow_split"] == true;
            if split && req.detail["budget"]["approval_above_usd"].is_string() && r.chance(60) {
                let hours = req.detail["duration_hours"].as_i64().unwrap_or(48);
                let count = req.detail["instance_count"].as_i64().unwrap_or(1);
                let estimate = 35 * hours * count;
                req.detail["budget"]["approval_above_usd"] = json!((estimate * 3 / 4).to_string());
                if let Some((_, again)) = &mut req.resubmit {
                    again["budget"] = req.detail["budget"].clone();
                }
            }
        }
        // (Issue 49, after every earlier draw.) Ids spelled in other cases (review N15): the
        // second request takes the first's id upper-cased, and cancellations spell theirs so;
        // each is the one id.
        if r.chance(15) && !requests[1].invalid.contains(&"request_id") {
            let upper = requests[0].detail["request_id"]
                .as_str()
                .unwrap_or_default()
                .to_uppercase();
            requests[1].detail["request_id"] = json!(upper);
            if let Some((_, again)) = &mut requests[1].resubmit {
                again["request_id"] = json!(upper);
            }
        }
        for req in requests.iter_mut() {
            req.cancel_upper = req.cancel_at.is_some() && r.chance(30);
        }
        // (Issue 51, after every earlier draw.) A ledger from before §9.8: one team's
        // requests all spell it one way, not lower-case, and the team already spent this month
        // under that spelling's own ledger (its whole cap, or half), as debits did before keys
        // were lower-cased. The month keeps one cap: that spend counts against the team's.
        let mut legacy_ledgers = Vec::new();
        if r.chance(25) {
            let (team, spelled, cap) = if r.chance(50) {
                ("team-a", *r.pick(&["Team-A", "TEAM-a"]), cap_a)
            } else {
                ("team-b", "Team-B", "60000")
            };
            for req in requests.iter_mut() {
                if req.detail["team"]
                    .as_str()
                    .is_some_and(|t| t.eq_ignore_ascii_case(team))
                {
                    req.detail["team"] = json!(spelled);
                    if let Some((_, again)) = &mut req.resubmit {
                        again["team"] = json!(spelled);
                    }
                }
            }
            let cap: i64 = cap.parse().expect("a cap");
            let usd = if r.chance(65) { cap } else { cap / 2 };
            legacy_ledgers.push((spelled.to_string(), usd * 1_000_000));
        }
        // (Issue 56, after every earlier draw.) An operator pauses purchases for a while in
        // the fault hours and resumes: nothing new is bought or held meanwhile, and what
        // waited goes on after.
        let mut pauses = Vec::new();
        if r.chance(30) {
            // (In the first hours, when most purchases are made.)
            let from = r.range(0, 6 * 60);
            pauses.push((from, from + *r.pick(&[20, 90, 360, 720])));
        }
        // (Issue 57, after every earlier draw.) A team extends its block or plan by hand in
        // the console while its window runs.
        let mut console_extensions = Vec::new();
        for (i, req) in requests.iter().enumerate() {
            if req.invalid.is_empty() && r.chance(25) {
                console_extensions.push(ConsoleExtension {
                    request: i,
                    after: r.range(10, 12 * 60),
                    hours: *r.pick(&[24, 48]),
                });
            }
        }
        let late_notice_outage = r.chance(40);
        // (Issue 58, after every earlier draw.) Requests that capacity-pilot may extend:
        // asked by the team while the window runs, or by the policy while the workload runs;
        // some payments fail.
        let mut extension_asks = Vec::new();
        let mut extension_payment_failures = Vec::new();
        for (i, req) in requests.iter_mut().enumerate() {
            let reserves = req.detail.get("products").is_none_or(|ps| {
                ps.as_array().is_some_and(|ps| {
                    ps.iter()
                        .any(|p| p == "capacity-block" || p == "training-plan")
                })
            });
            // A request an approver answers asks, with room to spend: its extension waits
            // for the approver as its purchase did.
            let approved = req.detail["budget"]["approval_above_usd"].is_string()
                && matches!(req.approver, Approver::Approves { .. });
            if !req.invalid.is_empty() || !reserves || !(approved || r.chance(35)) {
                continue;
            }
            let auto = !approved && r.chance(35);
            let max_upfront = if approved {
                "50000"
            } else {
                *r.pick(&["300", "5000", "50000"])
            };
            let policy = json!({
                "when": if auto { "workload-running" } else { "requested" },
                "max_hours": *r.pick(&[24, 48, 96]),
                "max_upfront_usd": max_upfront,
            });
            req.detail["extend"] = policy.clone();
            if let Some((_, again)) = &mut req.resubmit {
                again["extend"] = policy;
            }
            if !auto || r.chance(30) {
                extension_asks.push(ExtensionAsk {
                    request: i,
                    after: if approved {
                        r.range(10, 5 * 60)
                    } else {
                        r.range(10, 12 * 60)
                    },
                    hours: *r.pick(&[24, 48]),
                    twice: r.chance(25),
                });
            }
            if r.chance(25) {
                extension_payment_failures.push(i);
            }
        }
        Scenario {
            seed,
            team_budgets,
            requests,
            on_demand_pool,
            block_pool,
            crowded_days,
            market,
            timings,
            api_faults,
            store_faults,
            deliveries,
            crashes,
            races,
            crash_after,
            legacy_ledgers,
            refused,
            refuse_later_block,
            legacy_doubt,
            cancel_kept,
            stop_running,
            strays,
            outages,
            pauses,
            console_extensions,
            extension_asks,
            extension_payment_failures,
            late_notice_outage,
            concurrent_duplicates,
            refuse_tag_filters,
            spot_runs,
            reconcile_outage,
            sabotage: false,
            sabotage_notices: false,
            sabotage_pause: false,
        }
    }
}

fn iso(minutes: i64) -> String {
    (t0() + TimeDelta::minutes(minutes))
        .format("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

fn request(r: &mut Rng, seed: u64, i: usize) -> PlannedRequest {
    let kind = *r.pick(&[
        "ec2-instances",
        "ec2-instances",
        "training-job",
        "inference-endpoint",
        "hyperpod-cluster",
    ]);
    let id = format!("sim-{seed}-{i}");
    let team = *r.pick(&["team-a", "team-a", "team-b"]);
    let ec2 = kind == "ec2-instances";
    // A split needs a plan of two days or more that no single segment covers.
    let split = !ec2 && r.chance(50);
    let count = if split {
        r.range(1, 2)
    } else {
        r.range(1, if kind == "inference-endpoint" { 2 } else { 4 })
    };
    let hours = if split {
        *r.pick(&[48, 72])
    } else {
        *r.pick(&[24, 24, 48])
    };
    let earliest = r.range(14, 40) * 60;
    let slack = r.range(0, 24) * 60;
    let latest = earliest + hours * 60 + slack;
    let types = if ec2 {
        if r.chance(30) {
            json!(["p5.48xlarge", "p4d.24xlarge"])
        } else {
            json!(["p5.48xlarge"])
        }
    } else {
        json!(["ml.p5.48xlarge"])
    };
    // About the fee of one p5 instance for the hours, scaled.
    let estimate = 35 * hours * count;
    let max = estimate * r.range(6, 30) / 10;
    let mut budget = json!({"max_upfront_usd": max.to_string()});
    let approval = r.chance(25);
    if approval {
        budget["approval_above_usd"] = json!((estimate / 4).to_string());
    }
    let workload = match kind {
        "ec2-instances" => json!({"kind": "ec2-instances",
            "launch_template": {"name": "capacity-pilot-gpu"}, "subnet_ids": "${subnet_ids}"}),
        "training-job" => json!({"kind": "training-job",
            "training_image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/sim:1",
            "output_s3_uri": format!("s3://sim/{id}/"), "volume_size_gb": 100}),
        "inference-endpoint" => json!({"kind": "inference-endpoint",
            "model_name": format!("model-{i}"), "endpoint_name": format!("ep-{seed}-{i}"),
            "variant_name": "primary"}),
        _ => json!({"kind": "hyperpod-cluster", "cluster_name": format!("sim-cluster-{i}"),
            "instance_group_name": "workers",
            "life_cycle_config": {"source_s3_uri": "s3://sim/lifecycle/", "on_create": "on_create.sh"}}),
    };
    let mut detail = json!({
        "schema_version": 1, "request_id": id, "team": team,
        "instance_types": types, "instance_count": count, "duration_hours": hours,
        "earliest_start": iso(earliest), "latest_end": iso(latest),
        "regions": ["us-east-1"], "budget": budget, "workload": workload,
        "drain_minutes": r.range(0, 30),
    });
    if ec2 && r.chance(25) {
        detail["strategy"] = json!("on-demand-first");
    }
    if r.chance(40) {
        detail["prefer"] = json!(*r.pick(&["cheapest", "earliest"]));
    }
    if split {
        detail["allow_split"] = json!(true);
    }
    let mut invalid = Vec::new();
    if r.chance(8) {
        match r.range(0, 2) {
            0 => {
                detail["instance_count"] = json!(0);
                invalid.push("instance_count");
            }
            1 => {
                detail["latest_end"] = json!(iso(earliest - 60));
                invalid.push("latest_end");
            }
            _ => {
                detail["team"] = json!("");
                invalid.push("team");
            }
        }
    }
    let submit_at = r.range(0, 6 * 60);
    let cancel_at = r.chance(20).then(|| submit_at + r.range(-30, 60 * 24 * 3));
    let resubmit = r.chance(10).then(|| {
        let mut again = detail.clone();
        if r.chance(50) {
            again["drain_minutes"] = json!(45);
        }
        (submit_at + r.range(1, 600), again)
    });
    let after = r.range(5, 240);
    let approver = if !approval {
        Approver::Silent
    } else {
        match r.range(0, 5) {
            0 | 1 => Approver::Approves {
                after_minutes: after,
            },
            2 => Approver::Rejects {
                after_minutes: after,
            },
            3 => Approver::Stale {
                after_minutes: after,
            },
            4 => Approver::Forged {
                after_minutes: after,
            },
            _ => Approver::Silent,
        }
    };
    let payment_failures = if r.chance(15) {
        r.range(1, 2) as u32
    } else {
        0
    };
    let mut instance_failures = Vec::new();
    if ec2 && r.chance(40) {
        instance_failures.push((r.range(0, hours - 2), r.range(0, 3) as usize, r.chance(50)));
    }
    PlannedRequest {
        submit_at,
        detail,
        invalid,
        cancel_at,
        resubmit,
        approver,
        payment_failures,
        payment_failure_after: None,
        instance_failures,
        cap_at_quote: false,
        cancel_upper: false,
    }
}

/// `detail` allowed to split, two days long at least: a one-day request becomes two days,
/// its window and its caps doubled to match.
fn split_ec2(detail: &Value) -> Value {
    let mut d = detail.clone();
    d["allow_split"] = json!(true);
    if d["duration_hours"] == 24 {
        d["duration_hours"] = json!(48);
        if let Some(end) = d["latest_end"]
            .as_str()
            .and_then(|e| e.parse::<DateTime<Utc>>().ok())
        {
            d["latest_end"] = json!(
                (end + TimeDelta::hours(24))
                    .format("%Y-%m-%dT%H:%M:%SZ")
                    .to_string()
            );
        }
        for k in ["max_upfront_usd", "approval_above_usd"] {
            if let Some(v) = d["budget"][k].as_str().and_then(|v| v.parse::<i64>().ok()) {
                d["budget"][k] = json!((v * 2).to_string());
            }
        }
    }
    d
}
