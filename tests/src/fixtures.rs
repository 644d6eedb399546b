//! Requests, plans, reservations and the write requests the store tests send, built from
//! domain types with fixed times: nothing here reads the clock.

use std::collections::BTreeMap;

use capacity_pilot::domain::money::{MicroUsd, Usd};
use capacity_pilot::domain::offering::{Product, Segment};
use capacity_pilot::domain::planner::Plan;
use capacity_pilot::domain::request::{
    Budget, CapacityRequest, RequestId, Strategy, Team, Window, WorkloadDetail,
};
use capacity_pilot::domain::reservation::{Reservation, ReservationState};
use capacity_pilot::domain::status::RequestStatus;
use capacity_pilot::ports::{
    BeginPurchase, BudgetMonth, Cause, Debit, Lease, NewRequest, OutboundEvent, RecordReservation,
    ReleaseUnbought, Transition,
};
use chrono::{DateTime, Duration, TimeZone, Utc};

use crate::flow::SOURCE;
use rust_decimal::Decimal;

/// The fixed "now" of the tests.
pub fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 1, 9, 0, 0).unwrap()
}

pub fn usd(s: &str) -> Usd {
    Usd::parse(s).unwrap()
}

pub fn request_id(s: &str) -> RequestId {
    RequestId::parse(s).unwrap()
}

pub fn team(s: &str) -> Team {
    Team::parse(s).unwrap()
}

pub fn capacity_request(id: &str, team_name: &str, max_upfront: &str) -> CapacityRequest {
    CapacityRequest {
        id: request_id(id),
        team: team(team_name),
        instance_types: vec!["p5.48xlarge".into()],
        instance_count: 2,
        duration_hours: 48,
        window: Window {
            earliest_start: t0() + Duration::days(2),
            latest_end: t0() + Duration::days(20),
        },
        regions: vec!["us-east-1".into()],
        allow_split: false,
        strategy: Strategy::Reserve,
        prefer: None,
        interruptible: false,
        products: vec![Product::CapacityBlock],
        budget: Budget {
            max_upfront: usd(max_upfront),
            approval_above: None,
        },
        workload: WorkloadDetail::Ec2Instances {
            launch_template: None,
            subnet_ids: vec![],
            instance_platform: None,
        },
        drain_minutes: 30,
        tags: BTreeMap::from([("project".to_string(), "llm".to_string())]),
        mode: Default::default(),
        extend: None,
    }
}

pub fn event(key: &str) -> OutboundEvent {
    OutboundEvent {
        event_key: key.to_string(),
        detail_type: "Capacity Request Accepted".into(),
        detail: serde_json::json!({ "event_key": key }),
        notice: None,
    }
}

pub fn new_request(id: &str, team_name: &str, next_action_at: Option<DateTime<Utc>>) -> NewRequest {
    NewRequest {
        request: capacity_request(id, team_name, "50000.00"),
        source: SOURCE.into(),
        cancelled: None,
        reason: "accepted".into(),
        next_action_at,
        at: t0(),
        caused_by: Cause::new(format!("submit-{id}")),
        outbox: vec![event(&format!("{id}-accepted"))],
        claims: vec![],
    }
}

pub fn plan(fee: &str) -> Plan {
    let start = t0() + Duration::days(3);
    Plan {
        offerings: vec![],
        product: Product::CapacityBlock,
        region: "us-east-1".into(),
        instance_type: "p5.48xlarge".into(),
        instance_count: 2,
        upfront_fee: usd(fee),
        start,
        end: start + Duration::hours(48),
        segments: 1,
        covered_hours: Decimal::new(48, 0),
        on_demand_cost: Some(usd("9446.40")),
        saving: Some(usd("9446.40") - usd(fee)),
        reason: "cheapest feasible block".into(),
    }
}

pub fn reservation(id: &str, fee: &str) -> Reservation {
    let start = t0() + Duration::days(3);
    Reservation {
        id: id.to_string(),
        product: Product::CapacityBlock,
        region: "us-east-1".into(),
        instance_type: "p5.48xlarge".into(),
        instance_count: 2,
        segments: vec![Segment {
            start,
            end: start + Duration::hours(48),
            availability_zone: Some("us-east-1a".into()),
        }],
        upfront_fee: usd(fee),
        state: ReservationState::PaymentPending,
        offering_id: Some("cb-0123456789".into()),
        request_tag: None,
        ultraserver: false,
        bought_at: None,
        debit_month: None,
        debit_team: None,
        payment_check_at: None,
        extensions: Vec::new(),
        extension_check_at: None,
        deployment_tag: None,
    }
}

pub fn transition(
    id: &str,
    expected_version: u64,
    from: RequestStatus,
    to: RequestStatus,
    event_id: &str,
) -> Transition {
    Transition {
        request_id: request_id(id),
        expected_version,
        from,
        to,
        reason: format!("{from} -> {to}"),
        next_action_at: None,
        at: t0(),
        caused_by: Cause::new(event_id),
        outbox: vec![],
        candidates: None,
        windows: None,
        debit: None,
        hold: false,
        settle: None,
        run: None,
        search: None,
        cancel: None,
        reservations: vec![],
        refund: None,
        resolve_doubt: false,
        unpaused: false,
    }
}

pub fn debit(team_name: &str, amount: MicroUsd, team_cap: MicroUsd) -> Debit {
    Debit {
        team: team(team_name),
        month: BudgetMonth::of(t0()),
        amount,
        team_cap,
        request_cap: usd("50000.00").to_micros_ceil(),
    }
}

pub fn begin_purchase(
    id: &str,
    expected_version: u64,
    from: RequestStatus,
    token: &str,
    at: DateTime<Utc>,
    debit: Option<Debit>,
) -> BeginPurchase {
    BeginPurchase {
        request_id: request_id(id),
        expected_version,
        from,
        lease: Lease {
            token: token.to_string(),
            expires_at: at + Duration::minutes(20),
        },
        debit,
        doubt: None,
        reason: format!("buying, lease {token}"),
        at,
        caused_by: Cause::new(format!("purchase-{id}-{token}")),
        outbox: vec![],
    }
}

pub fn record_reservation(
    id: &str,
    token: &str,
    r: Reservation,
    at: DateTime<Utc>,
) -> RecordReservation {
    RecordReservation {
        request_id: request_id(id),
        lease_token: token.to_string(),
        reservation: r,
        to: RequestStatus::Reserved,
        reason: format!("bought by {token}"),
        next_action_at: None,
        at,
        caused_by: Cause::new(format!("record-{id}-{token}")),
        outbox: vec![],
        uncapped: None,
    }
}

pub fn release_unbought(id: &str, token: &str, at: DateTime<Utc>) -> ReleaseUnbought {
    ReleaseUnbought {
        request_id: request_id(id),
        lease_token: token.to_string(),
        to: RequestStatus::Searching,
        reason: "reconciled: no reservation exists".into(),
        next_action_at: Some(at),
        at,
        caused_by: Cause::new(format!("release-{id}-{token}")),
        outbox: vec![],
    }
}
