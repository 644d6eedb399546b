//! A request's search round (ARCHITECTURE §8.8): what each of its queries came to, kept on
//! the request across ticks until it decides.
//!
//! A query is answered, refused (permanently: an unsupported type in a region, an account
//! without Capacity Block quota for a family there), or failing (throttled, unavailable,
//! deferred by pacing). A request decides once every query has an answer or a refusal, or
//! has failed for [`FAILING_TICKS`] ticks, or when its search deadline is within
//! [`DECIDE_BEFORE_DEADLINE`]: it never waits on one query for ever. A round ends with the
//! decision; the next round asks everything again except what was refused.

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};

use std::future::Future;

use crate::config::Config;
use crate::domain::catalog::PriceTable;
use crate::domain::offering::{Offering, Product};
use crate::domain::planner::{Planning, plan, within_block_limit};
use crate::domain::request::CapacityRequest;
use crate::domain::reservation::Reservation;
use crate::domain::time_rules::PURCHASE_LEAD;
use crate::ports::{OfferingQuery, PortError, Workloads};
use crate::workload::preflight::{Depth, preflight};

/// How many of the ranked plans a request keeps as candidates.
pub const CANDIDATES_KEPT: usize = 5;

/// The searches a request needs: each reservation product, region and type, for the
/// duration, within the window; with `allow_split`, also Capacity Blocks of half the
/// duration, which the planner may pair.
pub fn queries_for(req: &CapacityRequest, now: DateTime<Utc>) -> Vec<OfferingQuery> {
    let start_from = req.window.earliest_start.max(now + PURCHASE_LEAD);
    let mut out = Vec::new();
    for product in req.reservation_products() {
        let mut durations = vec![req.duration_hours];
        if req.allow_split && product == Product::CapacityBlock {
            let half_days = (req.duration_hours / 24).div_ceil(2);
            if half_days >= 1 && (half_days <= 14 || half_days.is_multiple_of(7)) {
                durations.push(half_days * 24);
            }
        }
        for region in &req.regions {
            for instance_type in &req.instance_types {
                for &duration_hours in &durations {
                    out.push(OfferingQuery {
                        product,
                        region: region.clone(),
                        instance_type: instance_type.clone(),
                        instance_count: req.instance_count,
                        duration_hours,
                        start_from,
                        end_by: req.window.latest_end,
                    });
                }
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// What a request's offerings come to (the search function's decision and `capacity-pilot
/// plan` both come here): those its workload can use and that pass the pre-flight at `depth`
/// ([`crate::workload::preflight`]) are planned; when a kept candidate would buy a Capacity
/// Block, the account's limit across blocks is applied over `live_blocks` (listed only then)
/// and the rest planned again; every other offering has its reason. The second value says
/// what the planning went without: the live blocks, when they could not be listed (AWS then
/// refuses a purchase past the limit, which is searched again), and each pre-flight check
/// that could not be made.
#[allow(clippy::too_many_arguments)]
pub async fn plan_offerings<W, F, Fut>(
    workloads: &W,
    req: &CapacityRequest,
    offerings: &[Offering],
    prices: &PriceTable,
    max_block_instances: u32,
    (config, depth): (Option<&Config>, Depth),
    now: DateTime<Utc>,
    live_blocks: F,
) -> Result<(Planning, Vec<String>), PortError>
where
    W: Workloads,
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<Vec<Reservation>, PortError>>,
{
    let (usable, mut unusable) = crate::workload::usable(workloads, req, offerings).await?;
    // Boxed: its state would otherwise sit inside every search invocation's future.
    let checked = Box::pin(preflight(workloads, config, req, &usable, depth)).await;
    unusable.extend(checked.rejections);
    let usable = checked.passed;
    let mut planning = plan(req, &usable, prices, now);
    let mut missed = checked.unverified;
    // The count is a pre-check: AWS refuses a purchase past the limit, and that refusal is
    // read as no capacity (searched again), so an unreadable count costs at most a refused
    // purchase, while failing here would stop every purchase for as long as the listing fails.
    if planning
        .plans
        .iter()
        .take(CANDIDATES_KEPT)
        .any(|p| p.product == Product::CapacityBlock)
    {
        match live_blocks().await {
            Ok(live) => {
                let (within, over) = within_block_limit(&usable, &live, max_block_instances);
                if !over.is_empty() {
                    planning = plan(req, &within, prices, now);
                    planning.rejections.extend(over);
                }
            }
            Err(e) => {
                missed.push(format!(
                    "the account's live Capacity Blocks, unlisted ({e}): a purchase past the \
                     limit across blocks is refused by AWS and searched again"
                ));
            }
        }
    }
    planning.rejections.extend(unusable);
    Ok((planning, missed))
}

/// At most this many queries per request per tick; the rest wait their turn.
pub const MAX_QUERIES_PER_REQUEST_TICK: usize = 8;
/// A query failing this many ticks in a row no longer holds the decision back.
pub const FAILING_TICKS: u32 = 3;
/// From this long before the search deadline, a request decides on what it has.
pub const DECIDE_BEFORE_DEADLINE: Duration = Duration::hours(2);
/// At most this many offerings of one answer are kept on the request (AWS answers a
/// Capacity Block search with at most a handful).
pub const OFFERINGS_KEPT_PER_QUERY: usize = 12;
/// EC2's code for the describe limit, and the words of its account-limit reading.
pub const DESCRIBE_LIMIT: &str = "CapacityBlockDescribeLimitExceeded";
const ACCOUNT_LIMIT_WORDS: &str = "limits for this AWS account are not sufficient";
/// SageMaker's code for an account limit: the one error botocore's `sagemaker` model gives
/// `SearchTrainingPlanOfferings`.
pub const PLAN_LIMIT: &str = "ResourceLimitExceeded";

/// How long a region backs off after answering with its rate limit: one search tick.
pub const RATE_BACK_OFF: Duration = Duration::minutes(5);

/// The pace a region's Capacity Block searches are kept to (ARCHITECTURE §8.8, §8.10): a
/// bucket of `burst` calls refilling one every `refill`. AWS does not publish the limit;
/// this is the low reading the emulator models too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pace {
    pub burst: u32,
    pub refill: Duration,
}

pub const DESCRIBE_PACE: Pace = Pace {
    burst: 5,
    refill: Duration::minutes(1),
};

/// A region's allowance of Capacity Block searches, as the pacing store keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allowance {
    pub tokens: u32,
    /// When the tokens were last counted.
    pub at: DateTime<Utc>,
    /// No calls before this (the region answered with its rate limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<DateTime<Utc>>,
}

impl Allowance {
    /// A region never paced: a full bucket.
    pub fn fresh(pace: Pace, now: DateTime<Utc>) -> Allowance {
        Allowance {
            tokens: pace.burst,
            at: now,
            until: None,
        }
    }

    /// Takes up to `wanted` calls at `now`: the allowance after, and how many may be made.
    pub fn take(self, pace: Pace, wanted: u32, now: DateTime<Utc>) -> (Allowance, u32) {
        let every = pace.refill.num_seconds().max(1);
        let refills = (now - self.at).num_seconds().max(0) / every;
        let mut a = self;
        if refills > 0 {
            a.tokens = pace.burst.min(
                a.tokens
                    .saturating_add(u32::try_from(refills).unwrap_or(u32::MAX)),
            );
            a.at += Duration::seconds(refills * every);
        }
        if a.until.is_some_and(|u| now < u) {
            return (a, 0);
        }
        let granted = wanted.min(a.tokens);
        a.tokens -= granted;
        (a, granted)
    }

    /// After a rate-limit answer: nothing left, and no calls until `until`.
    pub fn backed_off(self, until: DateTime<Utc>) -> Allowance {
        Allowance {
            tokens: 0,
            until: Some(self.until.map_or(until, |u| u.max(until))),
            ..self
        }
    }
}

/// What one query came to in the current round.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "kebab-case")]
pub enum QueryOutcome {
    Answered {
        at: DateTime<Utc>,
        offerings: Vec<Offering>,
    },
    /// Asking again cannot help, in this round or the next.
    Refused { reason: String },
    /// Failed (or deferred) `ticks` ticks in a row; `error` is the last.
    Failing { ticks: u32, error: String },
}

/// A request's round: each query's outcome, by [`key`].
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SearchRound {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub outcomes: BTreeMap<String, QueryOutcome>,
    /// The gist ([`not_found_gist`]) of the `Capacity Not Found` last announced: another is
    /// announced, and its notice sent, only when the reason or the alternatives change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub announced: Option<String>,
}

/// What a `Capacity Not Found` says, short of its times and counts: the distinct reasons the
/// offerings were rejected for and what the search could not check, with numbers masked, so
/// a market that moves by a day or an offering does not make it news.
pub fn not_found_gist(rejections: &[crate::domain::planner::Rejection], missing: &str) -> String {
    use sha2::{Digest, Sha256};
    let mask = |s: &str| -> String {
        let mut out = String::new();
        let mut digits = false;
        for c in s.chars() {
            if c.is_ascii_digit() {
                if !digits {
                    out.push('#');
                }
                digits = true;
            } else {
                digits = false;
                out.push(c);
            }
        }
        out
    };
    let reasons: std::collections::BTreeSet<String> =
        rejections.iter().map(|r| mask(&r.reason)).collect();
    let mut h = Sha256::new();
    for r in &reasons {
        h.update(r.as_bytes());
        h.update([0]);
    }
    h.update(mask(missing).as_bytes());
    hex::encode(h.finalize())[..16].to_string()
}

/// A query's identity within a round: its product, region, type, count and duration (its
/// date range follows the clock, so it is not part of it).
pub fn key(q: &OfferingQuery) -> String {
    format!(
        "{}/{}/{}/{}x/{}h",
        q.product, q.region, q.instance_type, q.instance_count, q.duration_hours
    )
}

/// An instance type's family, as EC2's per-family quotas count it: `p5` of `p5.48xlarge`.
pub fn family(instance_type: &str) -> &str {
    instance_type.split('.').next().unwrap_or(instance_type)
}

/// How a failed query reads (ARCHITECTURE §8.8).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// Dropped for the request, with the reason.
    Refused(String),
    /// The account has no Capacity Block quota for this family in this region: every
    /// query of the family there is refused for the request.
    NoQuota(String),
    /// SageMaker's account limit (`ResourceLimitExceeded`, the one error the model gives
    /// `SearchTrainingPlanOfferings`): every plan query of the type in the region is refused
    /// for the request, with the reason, instead of being asked again as no capacity.
    PlanLimit(String),
    /// A rate limit: the region backs off, and the query counts as failing.
    RateLimited(String),
    /// Anything else worth asking again.
    Transient(String),
}

/// The reading of `e` for a search query.
pub fn read_failure(e: &PortError) -> Failure {
    match e {
        // The describe limit is its own class, read here only (`aws::error::DESCRIBE_LIMITS`):
        // never a throttle, so it comes as `Transient` with its code.
        PortError::Transient { code, message, .. } if code == DESCRIBE_LIMIT => {
            if message.contains(ACCOUNT_LIMIT_WORDS) {
                Failure::NoQuota(format!("{code}: {message}"))
            } else {
                Failure::RateLimited(format!("{code}: {message}"))
            }
        }
        PortError::Throttled { .. } => Failure::RateLimited(e.to_string()),
        PortError::Permanent { .. } | PortError::OfferingGone { .. } => {
            Failure::Refused(e.to_string())
        }
        // A launch reads an account limit as no capacity there (`workload::refusal`); a plan
        // search over it cannot succeed by asking again (review aws-reality-2, Task 3 #8).
        PortError::NoCapacity { code, .. } if code == PLAN_LIMIT => {
            Failure::PlanLimit(e.to_string())
        }
        PortError::NoCapacity { .. }
        | PortError::Transient { .. }
        | PortError::OutcomeUnknown { .. } => Failure::Transient(e.to_string()),
    }
}

impl SearchRound {
    /// The round as it applies to `queries`: outcomes of queries no longer asked are gone.
    pub fn for_queries(mut self, queries: &[OfferingQuery]) -> SearchRound {
        let keys: Vec<String> = queries.iter().map(key).collect();
        self.outcomes.retain(|k, _| keys.contains(k));
        self
    }

    /// The queries to ask this tick: those without an answer or a refusal, failing ones
    /// first by fewest failed ticks (so none waits behind the others for ever), at most
    /// [`MAX_QUERIES_PER_REQUEST_TICK`].
    pub fn to_ask(&self, queries: &[OfferingQuery]) -> Vec<OfferingQuery> {
        let mut open: Vec<(u32, &OfferingQuery)> = queries
            .iter()
            .filter_map(|q| match self.outcomes.get(&key(q)) {
                None => Some((0, q)),
                Some(QueryOutcome::Failing { ticks, .. }) => Some((*ticks, q)),
                Some(_) => None,
            })
            .collect();
        // Never asked first, then the least failed; stable within each.
        open.sort_by_key(|(ticks, _)| *ticks);
        open.into_iter()
            .take(MAX_QUERIES_PER_REQUEST_TICK)
            .map(|(_, q)| q.clone())
            .collect()
    }

    /// Records what asking `q` came to at `now`.
    pub fn record(
        &mut self,
        queries: &[OfferingQuery],
        q: &OfferingQuery,
        result: &Result<Vec<Offering>, PortError>,
        now: DateTime<Utc>,
    ) {
        self.started_at.get_or_insert(now);
        match result {
            Ok(offerings) => {
                let mut kept = offerings.clone();
                kept.truncate(OFFERINGS_KEPT_PER_QUERY);
                self.outcomes.insert(
                    key(q),
                    QueryOutcome::Answered {
                        at: now,
                        offerings: kept,
                    },
                );
            }
            Err(e) => match read_failure(e) {
                Failure::Refused(reason) => {
                    self.outcomes
                        .insert(key(q), QueryOutcome::Refused { reason });
                }
                Failure::NoQuota(why) => {
                    let reason = format!(
                        "the account has no Capacity Block quota for {} in {} ({why})",
                        family(&q.instance_type),
                        q.region
                    );
                    for other in queries.iter().filter(|o| {
                        o.product == Product::CapacityBlock
                            && o.region == q.region
                            && family(&o.instance_type) == family(&q.instance_type)
                    }) {
                        self.outcomes.insert(
                            key(other),
                            QueryOutcome::Refused {
                                reason: reason.clone(),
                            },
                        );
                    }
                }
                Failure::PlanLimit(why) => {
                    let reason = format!(
                        "the account has reached a SageMaker limit for {} training plans in {} \
                         ({why})",
                        q.instance_type, q.region
                    );
                    for other in queries.iter().filter(|o| {
                        o.product == q.product
                            && o.region == q.region
                            && o.instance_type == q.instance_type
                    }) {
                        self.outcomes.insert(
                            key(other),
                            QueryOutcome::Refused {
                                reason: reason.clone(),
                            },
                        );
                    }
                }
                Failure::RateLimited(error) | Failure::Transient(error) => {
                    self.failed(q, error, now);
                }
            },
        }
    }

    /// Records that `q` failed (or was deferred) this tick.
    pub fn failed(&mut self, q: &OfferingQuery, error: String, now: DateTime<Utc>) {
        self.started_at.get_or_insert(now);
        let ticks = match self.outcomes.get(&key(q)) {
            Some(QueryOutcome::Failing { ticks, .. }) => ticks + 1,
            _ => 1,
        };
        self.outcomes
            .insert(key(q), QueryOutcome::Failing { ticks, error });
    }

    /// Whether the request decides now: every query answered, refused or failing for
    /// [`FAILING_TICKS`], or its deadline near.
    pub fn decides(
        &self,
        queries: &[OfferingQuery],
        now: DateTime<Utc>,
        deadline: DateTime<Utc>,
    ) -> bool {
        now >= deadline - DECIDE_BEFORE_DEADLINE
            || queries.iter().all(|q| match self.outcomes.get(&key(q)) {
                None => false,
                Some(QueryOutcome::Failing { ticks, .. }) => *ticks >= FAILING_TICKS,
                Some(_) => true,
            })
    }

    /// Every offering answered in the round.
    pub fn offerings(&self) -> Vec<Offering> {
        self.outcomes
            .values()
            .filter_map(|o| match o {
                QueryOutcome::Answered { offerings, .. } => Some(offerings.iter().cloned()),
                _ => None,
            })
            .flatten()
            .collect()
    }

    /// Whether every query was refused: asking again cannot find anything.
    pub fn all_refused(&self, queries: &[OfferingQuery]) -> bool {
        !queries.is_empty()
            && queries.iter().all(|q| {
                matches!(
                    self.outcomes.get(&key(q)),
                    Some(QueryOutcome::Refused { .. })
                )
            })
    }

    /// What the decision lacks, in words: each refused query with its reason, each failing
    /// or unasked one with its last error. Empty when every query was answered.
    pub fn gaps(&self, queries: &[OfferingQuery]) -> Vec<String> {
        queries
            .iter()
            .filter_map(|q| {
                let k = key(q);
                match self.outcomes.get(&k) {
                    Some(QueryOutcome::Answered { .. }) => None,
                    Some(QueryOutcome::Refused { reason }) => {
                        Some(format!("{k} refused: {reason}"))
                    }
                    Some(QueryOutcome::Failing { ticks, error }) => {
                        Some(format!("{k} failing for {ticks} tick(s): {error}"))
                    }
                    None => Some(format!("{k} not asked in time")),
                }
            })
            .collect()
    }

    /// The round after a decision: answers and failures are asked again, refusals stand
    /// (a refused query is dropped for the request).
    pub fn next_round(&self) -> SearchRound {
        SearchRound {
            started_at: None,
            announced: self.announced.clone(),
            outcomes: self
                .outcomes
                .iter()
                .filter(|(_, o)| matches!(o, QueryOutcome::Refused { .. }))
                .map(|(k, o)| (k.clone(), o.clone()))
                .collect(),
        }
    }

    /// How many queries have an answer or a refusal.
    pub fn settled(&self, queries: &[OfferingQuery]) -> usize {
        queries
            .iter()
            .filter(|q| {
                matches!(
                    self.outcomes.get(&key(q)),
                    Some(QueryOutcome::Answered { .. } | QueryOutcome::Refused { .. })
                )
            })
            .count()
    }
}

#[cfg(test)]
mod tests;
