//! AWS's clock facts as pure functions: when blocks end, how early AWS terminates, when
//! we must start draining, and how long a request can keep searching.

use chrono::{DateTime, Duration, NaiveTime, Utc};

/// Capacity Blocks and training plans end at 11:30 UTC.
pub const BLOCK_END_TIME_UTC: NaiveTime = match NaiveTime::from_hms_opt(11, 30, 0) {
    Some(t) => t,
    None => panic!("valid time"),
};

/// The earliest a reservation can start after we decide to buy it: training plans start
/// 30 min after reservation at the soonest (payment completes 5 min before the start);
/// Capacity Block offerings start 30 min out at the soonest.
pub const PURCHASE_LEAD: Duration = Duration::minutes(30);

/// The longest an invocation of launch-workloads or replace-unhealthy runs: their template
/// `Timeout` (a test reads it). A launch starts only if the invocation would end before the
/// window's drain starts, so nothing it starts can outlive the drain (ARCHITECTURE §8.4).
pub const LAUNCH_FUNCTION_TIMEOUT: Duration = Duration::seconds(60);

/// What a launch keeps of the invocation's remaining time for recording what it launched
/// (the window's write, the outbox's publish): a further RunInstances is begun only while the
/// time left exceeds this plus twice the slowest RunInstances of the invocation so far.
pub const LAUNCH_RESERVE: std::time::Duration = std::time::Duration::from_secs(1);

/// How late after its start a Capacity Block may become active before the delay is
/// reported (`start_delay_minutes` on `Capacity Workload Launched`): ARCHITECTURE §8.10's
/// bound for the activation lag (aws-reference §11.1 "Activation can lag the start").
pub const ACTIVATION_BOUND: Duration = Duration::minutes(15);

/// How long a new reservation may be missing from AWS's Describe* answers, by id as well as
/// by filter (aws-reference §11.3: "a new instance or reservation can be missing for a
/// while"; the emulator's lag defaults to 2 minutes, bounded by 10: ARCHITECTURE §8.10).
/// Until this long after its purchase, a recorded reservation that a Describe does not
/// return is live, never final (§8.5).
pub const LISTING_LAG_BOUND: Duration = Duration::minutes(10);

/// How long a purchase that may have happened is only reconciled (ARCHITECTURE §8.6):
/// longer than the listing-lag bound, so a reservation AWS sold is listed before the debit
/// is given up on; after it, a purchase still not found is released with the reason.
pub const IN_DOUBT_WINDOW: Duration = Duration::hours(1);

/// How often a bought reservation is read again until AWS reports it scheduled or later
/// (payment clears 5 minutes to 12 hours after a purchase: aws-reference §2.1, §11.1).
/// How far past its next action a request may be before it is reported stuck (the
/// operations kit's `RequestOverdueAlarm`): its owner runs every 5 minutes at most, retries a
/// failed invocation twice, and a purchase lease lasts 15 minutes, so a request this late has
/// missed several chances to move on.
pub const OVERDUE_AFTER: Duration = Duration::minutes(30);

pub const PAYMENT_CHECK_EVERY: Duration = Duration::minutes(10);

/// Payment for a training plan must complete this long before its start.
pub const PAYMENT_BEFORE_START: Duration = Duration::minutes(5);

/// The furthest ahead a reservation can start.
pub const MAX_ADVANCE: Duration = Duration::weeks(8);

/// What kind of reserved window, for AWS's forced-termination lead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowKind {
    CapacityBlock,
    UltraServerBlock,
    TrainingJobPlan,
    HyperPodPlan,
    /// AWS documents no lead for endpoints; we assume the training-job lead (UNVERIFIED).
    EndpointPlan,
}

impl WindowKind {
    /// The kind of a window of `product` (an UltraServer block when `ultraserver`).
    pub fn of(product: super::offering::Product, ultraserver: bool) -> WindowKind {
        use super::offering::{Product, TargetResource};
        match product {
            Product::TrainingPlan { target } => match target {
                TargetResource::TrainingJob => WindowKind::TrainingJobPlan,
                TargetResource::HyperpodCluster => WindowKind::HyperPodPlan,
                TargetResource::Endpoint => WindowKind::EndpointPlan,
            },
            _ if ultraserver => WindowKind::UltraServerBlock,
            _ => WindowKind::CapacityBlock,
        }
    }
}

/// How long before a window's end AWS starts terminating instances.
pub fn forced_termination_lead(kind: WindowKind) -> Duration {
    match kind {
        WindowKind::CapacityBlock | WindowKind::TrainingJobPlan | WindowKind::EndpointPlan => {
            Duration::minutes(30)
        }
        WindowKind::UltraServerBlock | WindowKind::HyperPodPlan => Duration::minutes(60),
    }
}

/// When EC2 sends `Capacity Block Expiration Warning`: 10 min before termination starts.
pub fn expiration_warning_lead(kind: WindowKind) -> Duration {
    forced_termination_lead(kind) + Duration::minutes(10)
}

/// When to start draining a window: `end - forced_termination_lead - max(requested, default)`.
pub fn drain_start(
    window_end: DateTime<Utc>,
    kind: WindowKind,
    requested_drain_minutes: u32,
    default_drain_minutes: u32,
) -> DateTime<Utc> {
    let drain = Duration::minutes(i64::from(
        requested_drain_minutes.max(default_drain_minutes),
    ));
    window_end - forced_termination_lead(kind) - drain
}

/// The last moment a feasible reservation can still be bought:
/// `latest_end - duration - purchase lead`.
pub fn search_deadline(latest_end: DateTime<Utc>, duration_hours: u32) -> DateTime<Utc> {
    latest_end - Duration::hours(i64::from(duration_hours)) - PURCHASE_LEAD
}

/// The first 11:30 UTC at or after `t`.
pub fn next_block_end(t: DateTime<Utc>) -> DateTime<Utc> {
    let today = t.date_naive().and_time(BLOCK_END_TIME_UTC).and_utc();
    if today >= t {
        today
    } else {
        today + Duration::days(1)
    }
}

/// Whether `t` is an 11:30 UTC boundary.
pub fn is_block_end(t: DateTime<Utc>) -> bool {
    t.time() == BLOCK_END_TIME_UTC
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at(h: u32, m: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 12, 9, h, m, 0).unwrap()
    }

    #[test]
    fn forced_termination_leads_match_aws() {
        assert_eq!(
            forced_termination_lead(WindowKind::CapacityBlock),
            Duration::minutes(30)
        );
        assert_eq!(
            forced_termination_lead(WindowKind::UltraServerBlock),
            Duration::minutes(60)
        );
        assert_eq!(
            forced_termination_lead(WindowKind::TrainingJobPlan),
            Duration::minutes(30)
        );
        assert_eq!(
            forced_termination_lead(WindowKind::HyperPodPlan),
            Duration::hours(1)
        );
    }

    #[test]
    fn the_expiration_warning_comes_40_minutes_before_a_block_ends() {
        assert_eq!(
            expiration_warning_lead(WindowKind::CapacityBlock),
            Duration::minutes(40)
        );
        assert_eq!(
            expiration_warning_lead(WindowKind::UltraServerBlock),
            Duration::minutes(70)
        );
    }

    #[test]
    fn drain_starts_before_forced_termination_by_the_larger_drain() {
        let end = at(11, 30);
        // 11:30 - 30 min - max(20, 15) = 10:40
        assert_eq!(
            drain_start(end, WindowKind::CapacityBlock, 20, 15),
            at(10, 40)
        );
        // the default wins when the request asks for less: 11:30 - 60 - 15 = 10:15
        assert_eq!(
            drain_start(end, WindowKind::HyperPodPlan, 5, 15),
            at(10, 15)
        );
    }

    #[test]
    fn the_search_deadline_leaves_room_for_the_duration_and_the_purchase_lead() {
        let latest_end = at(11, 30);
        assert_eq!(
            search_deadline(latest_end, 48),
            latest_end - Duration::hours(48) - Duration::minutes(30)
        );
    }

    #[test]
    fn blocks_end_at_half_past_eleven_utc() {
        assert_eq!(next_block_end(at(9, 0)), at(11, 30));
        assert_eq!(next_block_end(at(11, 30)), at(11, 30));
        assert_eq!(next_block_end(at(12, 0)), at(11, 30) + Duration::days(1));
        assert!(is_block_end(at(11, 30)));
        assert!(!is_block_end(at(11, 0)));
    }
}
