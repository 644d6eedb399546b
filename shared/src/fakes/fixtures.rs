//! Small builders for the values the fakes store, so a handler test states only what it
//! is about.

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, TimeZone, Utc};

use crate::domain::money::{MicroUsd, Usd};
use crate::domain::offering::{Product, Segment};
use crate::domain::request::{
    Budget, CapacityRequest, LaunchTemplateRef, RequestId, Strategy, Team, Window, WorkloadDetail,
};
use crate::domain::reservation::{Reservation, ReservationState};
use crate::domain::status::RequestStatus;
use crate::ports::{OutboundEvent, RequestRecord};

/// A fixed instant the fixtures measure from: 2026-12-01 09:00 UTC.
pub fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 1, 9, 0, 0)
        .single()
        .expect("a valid date")
}

/// `request`'s record as a test seeds it: in `status`, version 1, holding and spending
/// nothing, with no next action, written at [`t0`]. A test sets what it is about with
/// `RequestRecord { field, ..record(request, status) }`.
pub fn record(request: CapacityRequest, status: RequestStatus) -> RequestRecord {
    RequestRecord {
        request_id: request.id.clone(),
        team: request.team.clone(),
        request,
        status,
        version: 1,
        reason: "seeded".into(),
        next_action_at: None,
        windows: vec![],
        lease: None,
        doubt: None,
        purchase_call: None,
        cancel: None,
        open_debit: None,
        run: None,
        search: None,
        spent: MicroUsd(0),
        candidates: vec![],
        created_at: t0(),
        updated_at: t0(),
    }
}

/// A valid request id; panics on an invalid one (fixtures are written by tests).
pub fn request_id(id: &str) -> RequestId {
    RequestId::parse(id).unwrap_or_else(|e| panic!("fixture request id {id:?}: {e}"))
}

pub fn team(name: &str) -> Team {
    Team::parse(name).unwrap_or_else(|e| panic!("fixture team {name:?}: {e}"))
}

/// A one-instance, one-day Capacity Block `cr-1` starting at `start`, in `state`, with no fee
/// and nothing else recorded.
pub fn block_starting(start: DateTime<Utc>, state: ReservationState) -> Reservation {
    Reservation {
        id: "cr-1".into(),
        product: Product::CapacityBlock,
        region: "us-east-1".into(),
        instance_type: "p5.48xlarge".into(),
        instance_count: 1,
        segments: vec![Segment {
            start,
            end: start + Duration::hours(24),
            availability_zone: None,
        }],
        upfront_fee: Usd::ZERO,
        state,
        offering_id: None,
        request_tag: None,
        deployment_tag: None,
        ultraserver: false,
        bought_at: None,
        debit_month: None,
        debit_team: None,
        payment_check_at: None,
        extensions: Vec::new(),
        extension_check_at: None,
    }
}

/// `r` extended by capacity-pilot's extension `n` ($1), paid, to `end`: its last segment now
/// ends there.
pub fn extended_by_us(mut r: Reservation, n: u32, end: DateTime<Utc>) -> Reservation {
    use crate::domain::extension::{Asked, Extension, ExtensionOffer, ExtensionState};
    let fee = Usd::new(rust_decimal::Decimal::ONE);
    r.extensions.push(Extension {
        number: n,
        asked: Asked::WorkloadRunning,
        asked_at: r.start(),
        offer: ExtensionOffer {
            offering_id: format!("cbe-{n}"),
            hours: u32::try_from((end - r.end()).num_hours()).unwrap_or(0),
            starts_at: r.end(),
            ends_at: end,
            fee,
        },
        state: ExtensionState::Succeeded,
        reason: String::new(),
        buy_by: r.start(),
        check_at: None,
        lease_token: None,
        lease_until: None,
        called_at: None,
        doubt_since: None,
        approval_key: None,
        approved_by: None,
        debited: fee.to_micros_ceil(),
        debit_team: None,
        debit_month: None,
    });
    if let Some(last) = r.segments.last_mut() {
        last.end = end;
    }
    r
}

/// A two-instance, one-day Capacity Block request for EC2 instances in us-east-1, any time
/// in the week after [`t0`], that may spend `max_upfront_usd` up front.
pub fn request(id: &str, team_name: &str, max_upfront_usd: &str) -> CapacityRequest {
    CapacityRequest {
        id: request_id(id),
        team: team(team_name),
        instance_types: vec!["p5.48xlarge".into()],
        instance_count: 2,
        duration_hours: 24,
        window: Window {
            earliest_start: t0() + Duration::hours(2),
            latest_end: t0() + Duration::days(7),
        },
        regions: vec!["us-east-1".into()],
        allow_split: false,
        strategy: Strategy::Reserve,
        prefer: None,
        interruptible: false,
        products: vec![Product::CapacityBlock],
        budget: Budget {
            max_upfront: Usd::parse(max_upfront_usd)
                .unwrap_or_else(|e| panic!("fixture budget {max_upfront_usd:?}: {e}")),
            approval_above: None,
        },
        workload: WorkloadDetail::Ec2Instances {
            launch_template: Some(LaunchTemplateRef {
                id: Some("lt-0123456789abcdef0".into()),
                name: None,
                version: None,
            }),
            subnet_ids: vec!["subnet-a".into()],
            instance_platform: None,
        },
        drain_minutes: 0,
        tags: BTreeMap::new(),
        mode: Default::default(),
        extend: None,
    }
}

/// An outbound event whose detail carries its key and request id.
pub fn event(event_key: &str, detail_type: &str, request_id: &str) -> OutboundEvent {
    OutboundEvent {
        event_key: event_key.into(),
        detail_type: detail_type.into(),
        detail: serde_json::json!({ "event_key": event_key, "request_id": request_id }),
        notice: None,
    }
}

/// An operator's pause (ARCHITECTURE §9.7), since `t0`.
pub fn pause() -> crate::ports::Pause {
    crate::ports::Pause {
        by: "arn:aws:sts::123456789012:assumed-role/ops/dana".into(),
        reason: "budget review".into(),
        since: t0(),
    }
}
