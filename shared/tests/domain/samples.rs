//! The sample events under `infra/events/emitted/` are what the functions publish: each is
//! built here as its Rust event type and written by `outbound`, the one place a published
//! detail is written (`producer_version` included), with the envelope EventBridge adds. The
//! rejection's problems are the validator's own for an invalid sample request. `make schemas`
//! writes the files; this test fails when a checked-in copy differs, and a second one when a
//! sample's story contradicts the sample request it answers.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use capacity_pilot::domain::catalog::SupportedInstanceTypes;
use capacity_pilot::domain::events::{
    ApprovalRefused, AwaitingApproval, CONSUMED, CancellationApplied, CancellationRefused,
    EventDetail, ExtensionAwaitingApproval, ExtensionFailed, ExtensionOffered,
    InstanceMaintenanceScheduled, InstanceReplaced, NotFound, OfferingsFound, PRODUCER_VERSION,
    PaymentFailed, PurchaseInDoubt, RequestAccepted, RequestFailed, RequestRejected,
    ReservationEnded, ReservationEnding, ReservationExpiring, ReservationExtended,
    ReservationUnrecorded, Reserved, SOURCE, WindowOpening, WorkloadDrained, WorkloadInterrupted,
    WorkloadLaunched, outbound, schemas,
};
use capacity_pilot::domain::request::{ValidationContext, parse_request};
use capacity_pilot::domain::time_rules::search_deadline;
use capacity_pilot::ports::OutboundEvent;
use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::schemas::canonical;

fn events_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../infra/events")
}

/// A sample request's envelope.
fn request(path: &str) -> Value {
    let path = events_dir().join(path);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path:?}: {e}"))
}

fn time(v: &Value) -> DateTime<Utc> {
    v.as_str().unwrap().parse().unwrap()
}

/// `detail` read as `D` (every field it must have, none it lacks) and published.
fn publish<D: EventDetail + DeserializeOwned>(detail: Value) -> OutboundEvent {
    let typed: D = serde_json::from_value(detail)
        .unwrap_or_else(|e| panic!("{}: the sample does not read: {e}", D::DETAIL_TYPE));
    outbound(&typed)
}

/// The rejection of `requests/invalid/many-fields.json`, as search-offerings answers it:
/// every problem the validator finds, at the time it arrived.
fn rejected() -> OutboundEvent {
    let submitted = request("requests/invalid/many-fields.json");
    let types = SupportedInstanceTypes::default();
    let regions = ["us-east-1", "us-east-2", "us-west-2"].map(String::from);
    let problems = parse_request(
        &submitted["detail"],
        &ValidationContext {
            now: time(&submitted["time"]),
            instance_types: &types,
            allowed_regions: &regions,
        },
    )
    .expect_err("the invalid sample is invalid");
    let event_id = submitted["id"].as_str().unwrap();
    outbound(&RequestRejected {
        event_key: format!("rejected:{event_id}"),
        request_id: submitted["detail"]["request_id"].as_str().map(String::from),
        source: submitted["source"].as_str().unwrap().to_string(),
        event_id: event_id.to_string(),
        problems,
    })
}

/// (file stem, envelope id, envelope time, event) of every sample.
fn samples() -> Vec<(&'static str, &'static str, &'static str, OutboundEvent)> {
    let asked = request("requests/valid/ec2-capacity-block.json")["detail"].clone();
    let deadline = search_deadline(
        time(&asked["latest_end"]),
        asked["duration_hours"].as_u64().unwrap() as u32,
    );
    let approval = asked["budget"]["approval_above_usd"].clone();
    vec![
        (
            "capacity-cancellation-applied",
            "c1b2c3d4-0016-4f00-8000-000000000016",
            "2026-11-30T12:10:00Z",
            publish::<CancellationApplied>(json!({
                "event_key": "team-a-loadtest-2026-12:cancellation-applied:v5:c1796040000",
                "request_id": "team-a-loadtest-2026-12",
                "status_before": "AwaitingApproval",
                "reason": "cancelled by the requester: the load test moved to January",
                "kept_windows": [],
                "stopped_windows": []
            })),
        ),
        (
            "capacity-cancellation-refused",
            "c1b2c3d4-0017-4f00-8000-000000000017",
            "2026-11-30T12:40:00Z",
            publish::<CancellationRefused>(json!({
                "event_key": "team-a-loadtest-2026-12:cancellation-refused:b1b2c3d4-0003-4f00-8000-000000000003",
                "request_id": "team-a-loadtest-2026-12",
                "status": "Reserved",
                "reason": "cancellation refused: the request is Reserved and purchases cannot be undone: nothing is left to search for or buy, and its paid windows run on to their drain (window 1 (cr-0123456789abcdef0, pending) drains at 2026-12-09 10:45 UTC); send the cancellation again with stop_running: true to stop them now",
                "kept_windows": [
                    {
                        "window": 1,
                        "reservation_id": "cr-0123456789abcdef0",
                        "state": "pending",
                        "starts_at": "2026-12-07T11:30:00Z",
                        "drain_at": "2026-12-09T10:45:00Z",
                        "ends_at": "2026-12-09T11:30:00Z"
                    }
                ]
            })),
        ),
        (
            "capacity-instance-maintenance-scheduled",
            "c1b2c3d4-0020-4f00-8000-000000000020",
            "2026-12-08T03:00:05Z",
            publish::<InstanceMaintenanceScheduled>(json!({
                "event_key": "team-a-loadtest-2026-12:maintenance-i-0abc1234def567891:0123456789abcdef",
                "request_id": "team-a-loadtest-2026-12",
                "instance_id": "i-0abc1234def567891",
                "code": "AWS_EC2_INSTANCE_REBOOT_MAINTENANCE_SCHEDULED",
                "starts_at": "2026-12-09T06:00:00Z",
                "ends_at": "2026-12-09T08:00:00Z",
                "reason": "EC2 has scheduled AWS_EC2_INSTANCE_REBOOT_MAINTENANCE_SCHEDULED for i-0abc1234def567891 from 2026-12-09 06:00:00 UTC: a reboot keeps the instance, so it is not replaced; plan for the interruption"
            })),
        ),
        (
            "capacity-instance-replaced",
            "c1b2c3d4-0008-4f00-8000-000000000008",
            "2026-12-08T03:25:00Z",
            publish::<InstanceReplaced>(json!({
                "event_key": "team-a-loadtest-2026-12:replaced-i-0abc1234def567891:v8:c1796040000",
                "request_id": "team-a-loadtest-2026-12",
                "reservation_id": "cr-0123456789abcdef0",
                "replaced_instance_id": "i-0abc1234def567891",
                "new_instance_id": "i-0abc1234def567899",
                "generation": 1,
                "reason": "status checks impaired since 2026-12-08T03:10:00Z; terminated and relaunched into the same reservation"
            })),
        ),
        (
            "capacity-not-found",
            "c1b2c3d4-0004-4f00-8000-000000000004",
            "2026-11-30T12:00:03Z",
            publish::<NotFound>(json!({
                "event_key": "team-a-loadtest-2026-12:not-found:v3:c1796040000",
                "request_id": "team-a-loadtest-2026-12",
                "reason": "no offering of p5.48xlarge x 4 for 48 h fits the window in us-east-1, us-east-2",
                "next_search_at": "2026-11-30T12:05:00Z",
                "search_deadline": deadline,
                "rejections": []
            })),
        ),
        (
            "capacity-offerings-found",
            "c1b2c3d4-0003-4f00-8000-000000000003",
            "2026-11-30T12:00:03Z",
            publish::<OfferingsFound>(json!({
                "event_key": "team-a-loadtest-2026-12:offerings:v3:c1796040000",
                "request_id": "team-a-loadtest-2026-12",
                "plans": [
                    {
                        "offering_ids": [
                            "cb-0123456789abcdef0"
                        ],
                        "product": {
                            "product": "capacity-block"
                        },
                        "region": "us-east-1",
                        "instance_type": "p5.48xlarge",
                        "instance_count": 4,
                        "start": "2026-12-07T11:30:00Z",
                        "end": "2026-12-09T11:30:00Z",
                        "segments": 1,
                        "upfront_fee_usd": "6146.30",
                        "on_demand_cost_usd": "10487.04",
                        "saving_usd": "4340.74",
                        "reason": "cheapest feasible: $6146.30 for 4 x p5.48xlarge from 2026-12-07T11:30:00Z"
                    }
                ],
                "rejections": [
                    {
                        "offering_id": "cb-0fedcba9876543210",
                        "region": "us-east-2",
                        "reason": "$11200.00 upfront exceeds max_upfront_usd $10000.00"
                    }
                ]
            })),
        ),
        (
            "capacity-payment-failed",
            "c1b2c3d4-0013-4f00-8000-000000000013",
            "2026-11-30T12:20:05Z",
            publish::<PaymentFailed>(json!({
                "event_key": "team-a-loadtest-2026-12:payment-failed:v8:c1796040000",
                "request_id": "team-a-loadtest-2026-12",
                "reservation_id": "cr-0123456789abcdef0",
                "product": {
                    "product": "capacity-block"
                },
                "region": "us-east-1",
                "state": "payment-failed",
                "upfront_fee_usd": "6146.30",
                "returned_usd": "6146.30",
                "searching_again": true,
                "reason": format!("AWS reports cr-0123456789abcdef0 payment-failed before it was ever scheduled: the payment was not taken, and its $6146.30 debit is returned to team team-a; searching again until {deadline}")
            })),
        ),
        (
            "capacity-purchase-approval-refused",
            "c1b2c3d4-0014-4f00-8000-000000000014",
            "2026-11-30T12:30:01Z",
            publish::<ApprovalRefused>(json!({
                "event_key": "team-a-loadtest-2026-12:approval-refused:b1b2c3d4-0002-4f00-8000-000000000002",
                "request_id": "team-a-loadtest-2026-12",
                "reason": "approval by jane@example.com refused: it answers team-a-loadtest-2026-12:awaiting-approval:0d2e4b9a77c1f360, but the plan awaiting approval now is team-a-loadtest-2026-12:awaiting-approval:3f9c2a61d04b7e85 (the request searched again since)",
                "current_event_key": "team-a-loadtest-2026-12:awaiting-approval:3f9c2a61d04b7e85"
            })),
        ),
        (
            "capacity-purchase-awaiting-approval",
            "c1b2c3d4-0005-4f00-8000-000000000005",
            "2026-11-30T12:00:04Z",
            publish::<AwaitingApproval>(json!({
                "event_key": "team-a-loadtest-2026-12:awaiting-approval:3f9c2a61d04b7e85:v4:c1796040000",
                "request_id": "team-a-loadtest-2026-12",
                "team": "team-a",
                "kind": "reservation",
                "upfront_fee_usd": "6146.30",
                "approval_above_usd": approval,
                "spent_usd": "0",
                "plan": {
                    "offering_ids": [
                        "cb-0123456789abcdef0"
                    ],
                    "product": {
                        "product": "capacity-block"
                    },
                    "region": "us-east-1",
                    "instance_type": "p5.48xlarge",
                    "instance_count": 4,
                    "start": "2026-12-07T11:30:00Z",
                    "end": "2026-12-09T11:30:00Z",
                    "segments": 1,
                    "upfront_fee_usd": "6146.30",
                    "on_demand_cost_usd": "10487.04",
                    "saving_usd": "4340.74",
                    "reason": "cheapest feasible: $6146.30 for 4 x p5.48xlarge from 2026-12-07T11:30:00Z"
                }
            })),
        ),
        (
            "capacity-purchase-in-doubt",
            "c1b2c3d4-0018-4f00-8000-000000000018",
            "2026-12-06T12:05:02Z",
            publish::<PurchaseInDoubt>(json!({
                "event_key": "team-a-loadtest-2026-12:purchase-in-doubt:v9:c1796040000",
                "request_id": "team-a-loadtest-2026-12",
                "offering_ids": [
                    "cb-0a1b2c3d4e5f60718"
                ],
                "since": "2026-12-06T11:29:40Z",
                "reconciled_until": "2026-12-08T11:30:00Z",
                "kept_usd": "9500.00",
                "reason": "the purchase of cb-0a1b2c3d4e5f60718 called at 2026-12-06 11:29:40 UTC could not be reconciled by the purchase deadline 2026-12-06 12:00:00 UTC (ec2 refused: InvalidParameterValue: The filter 'tag:capacity-pilot:request-id' is invalid): AWS may have sold it, so the request ends in doubt with its debit of $9500.00 kept, and is reconciled hourly until 2026-12-08 11:30:00 UTC; what is found is served as its window"
            })),
        ),
        (
            "capacity-request-accepted",
            "c1b2c3d4-0001-4f00-8000-000000000001",
            "2026-11-30T12:00:01Z",
            publish::<RequestAccepted>(json!({
                "event_key": "team-a-loadtest-2026-12:accepted:v1:c1796040000",
                "request_id": "team-a-loadtest-2026-12",
                "team": "team-a",
                "strategy": "reserve",
                "workload_kind": "ec2-instances",
                "search_deadline": deadline
            })),
        ),
        (
            "capacity-request-failed",
            "c1b2c3d4-0012-4f00-8000-000000000012",
            "2026-12-12T11:00:01Z",
            publish::<RequestFailed>(json!({
                "event_key": "team-a-loadtest-2026-12:failed:v5:c1796040000",
                "request_id": "team-a-loadtest-2026-12",
                "status_before": "NotFound",
                "reason": format!("no feasible offering was found before the search deadline {deadline} (0 offerings seen)"),
                "reservation_ids": [],
                "spent_usd": "0",
                "kept_windows": []
            })),
        ),
        (
            "capacity-request-rejected",
            "c1b2c3d4-0002-4f00-8000-000000000002",
            "2026-11-30T12:00:01Z",
            rejected(),
        ),
        (
            "capacity-reservation-ended",
            "c1b2c3d4-0011-4f00-8000-000000000011",
            "2026-12-09T11:30:01Z",
            publish::<ReservationEnded>(json!({
                "event_key": "team-a-loadtest-2026-12:ended:v10:c1796040000",
                "request_id": "team-a-loadtest-2026-12",
                "reservation_ids": [
                    "cr-0123456789abcdef0"
                ],
                "ended_at": "2026-12-09T11:30:00Z",
                "cleaned_up": [],
                "spent_usd": "6146.30"
            })),
        ),
        (
            "capacity-reservation-expiring",
            "c1b2c3d4-0009-4f00-8000-000000000009",
            "2026-12-09T10:40:01Z",
            publish::<ReservationExpiring>(json!({
                "event_key": "team-a-loadtest-2026-12:expiring:v9:c1796040000",
                "request_id": "team-a-loadtest-2026-12",
                "reservation_ids": [
                    "cr-0123456789abcdef0"
                ],
                "segment": 0,
                "ends_at": "2026-12-09T11:30:00Z",
                "drain_starts_at": "2026-12-09T10:40:00Z",
                "forced_termination_at": "2026-12-09T11:00:00Z"
            })),
        ),
        (
            "capacity-reservation-ending",
            "c1b2c3d4-0023-4f00-8000-000000000023",
            "2026-12-09T09:40:00Z",
            publish::<ReservationEnding>(json!({
                "event_key": "team-a-loadtest-2026-12:window-0:ending-60m:ends-20261209T1130Z:c1796040000",
                "request_id": "team-a-loadtest-2026-12",
                "window": 0,
                "reservation_id": "cr-0123456789abcdef0",
                "product": {
                    "product": "capacity-block"
                },
                "region": "us-east-1",
                "drain_at": "2026-12-09T10:40:00Z",
                "ends_at": "2026-12-09T11:30:00Z",
                "lead_minutes": 60,
                "checkpoint": true,
                "extendable": false
            })),
        ),
        (
            "capacity-reservation-extended",
            "c1b2c3d4-0027-4f00-8000-000000000027",
            "2026-12-09T08:40:00Z",
            publish::<ReservationExtended>(json!({
                "event_key": "team-a-loadtest-2026-12:window-0:extended:ends-20261210T1130Z:c1796040000",
                "request_id": "team-a-loadtest-2026-12",
                "window": 0,
                "reservation_id": "cr-0123456789abcdef0",
                "product": {
                    "product": "capacity-block"
                },
                "region": "us-east-1",
                "previous_ends_at": "2026-12-09T11:30:00Z",
                "ends_at": "2026-12-10T11:30:00Z",
                "drain_at": "2026-12-10T10:40:00Z",
                "external": true
            })),
        ),
        (
            "capacity-extension-offered",
            "c1b2c3d4-0028-4f00-8000-000000000028",
            "2026-12-08T10:00:02Z",
            publish::<ExtensionOffered>(json!({
                "event_key": "team-a-loadtest-2026-12:window-0:extension-1:offered:c1796040000",
                "request_id": "team-a-loadtest-2026-12",
                "extension": 1,
                "reservation_id": "cr-0123456789abcdef0",
                "product": {
                    "product": "capacity-block"
                },
                "region": "us-east-1",
                "window": 0,
                "offering_id": "cbe-0123456789abcdefg",
                "hours": 24,
                "ends_at": "2026-12-09T11:30:00Z",
                "extended_ends_at": "2026-12-10T11:30:00Z",
                "upfront_fee_usd": "1661.18",
                "asked_by": "requested",
                "needs_approval": true,
                "buy_by": "2026-12-08T22:40:00Z"
            })),
        ),
        (
            "capacity-extension-awaiting-approval",
            "c1b2c3d4-0029-4f00-8000-000000000029",
            "2026-12-08T10:00:02Z",
            publish::<ExtensionAwaitingApproval>(json!({
                "event_key": "team-a-loadtest-2026-12:window-0:extension-1:awaiting-approval:c1796040000",
                "request_id": "team-a-loadtest-2026-12",
                "team": "team-a",
                "extension": 1,
                "reservation_id": "cr-0123456789abcdef0",
                "product": {
                    "product": "capacity-block"
                },
                "region": "us-east-1",
                "window": 0,
                "offering_id": "cbe-0123456789abcdefg",
                "hours": 24,
                "ends_at": "2026-12-09T11:30:00Z",
                "extended_ends_at": "2026-12-10T11:30:00Z",
                "upfront_fee_usd": "1661.18",
                "asked_by": "requested",
                "approval_above_usd": "5000",
                "spent_usd": "3800",
                "buy_by": "2026-12-08T22:40:00Z"
            })),
        ),
        (
            "capacity-extension-failed",
            "c1b2c3d4-0030-4f00-8000-000000000030",
            "2026-12-08T12:10:00Z",
            publish::<ExtensionFailed>(json!({
                "event_key": "team-a-loadtest-2026-12:window-0:extension-1:failed:c1796040000",
                "request_id": "team-a-loadtest-2026-12",
                "extension": {
                "extension": 1,
                "reservation_id": "cr-0123456789abcdef0",
                "product": {
                    "product": "capacity-block"
                },
                "region": "us-east-1",
                "window": 0,
                "offering_id": "cbe-0123456789abcdefg",
                "hours": 24,
                "ends_at": "2026-12-09T11:30:00Z",
                "extended_ends_at": "2026-12-10T11:30:00Z",
                "upfront_fee_usd": "1661.18",
                "asked_by": "requested"
                },
                "hours": 24,
                "reason": "AWS did not take the payment (cbe-0123456789abcdefg read back)",
                "returned_usd": "1661.18"
            })),
        ),
        (
            "capacity-reservation-unrecorded",
            "c1b2c3d4-0015-4f00-8000-000000000015",
            "2026-11-30T12:00:03Z",
            publish::<ReservationUnrecorded>(json!({
                "event_key": "team-a-loadtest-2026-12:reservation-unrecorded:cr-0fedcba9876543210",
                "request_id": "team-a-loadtest-2026-12",
                "reservation_id": "cr-0fedcba9876543210",
                "product": {
                    "product": "capacity-block"
                },
                "region": "us-east-1",
                "state": "scheduled",
                "instance_type": "p5.48xlarge",
                "instance_count": 2,
                "start": "2026-12-07T11:30:00Z",
                "end": "2026-12-08T11:30:00Z",
                "reason": "adopted cr-0fedcba9876543210 (2 x p5.48xlarge in us-east-1, 2026-12-07 11:30:00 UTC to 2026-12-08 11:30:00 UTC, scheduled, $9500.00): tagged for request team-a-loadtest-2026-12 of deployment capacity-pilot-prod and recorded nowhere, it is ours and paid for, so its fee is debited; it is kept beside the plan, which is bought as decided; the debit goes past the request's max_upfront_usd of $12000"
            })),
        ),
        (
            "capacity-reserved",
            "c1b2c3d4-0006-4f00-8000-000000000006",
            "2026-11-30T12:00:05Z",
            publish::<Reserved>(json!({
                "event_key": "team-a-loadtest-2026-12:reserved:v6:c1796040000",
                "request_id": "team-a-loadtest-2026-12",
                "reservation_ids": [
                    "cr-0123456789abcdef0"
                ],
                "product": {
                    "product": "capacity-block"
                },
                "region": "us-east-1",
                "instance_type": "p5.48xlarge",
                "instance_count": 4,
                "start": "2026-12-07T11:30:00Z",
                "end": "2026-12-09T11:30:00Z",
                "upfront_fee_usd": "6146.30",
                "on_demand_cost_usd": "10487.04",
                "saving_usd": "4340.74",
                "adopted": false
            })),
        ),
        (
            "capacity-window-opening",
            "c1b2c3d4-0022-4f00-8000-000000000022",
            "2026-12-06T11:30:00Z",
            publish::<WindowOpening>(json!({
                "event_key": "team-a-loadtest-2026-12:window-0:opening-1440m:c1796040000",
                "request_id": "team-a-loadtest-2026-12",
                "window": 0,
                "reservation_id": "cr-0123456789abcdef0",
                "product": {
                    "product": "capacity-block"
                },
                "region": "us-east-1",
                "instance_type": "p5.48xlarge",
                "instance_count": 1,
                "opens_at": "2026-12-07T11:30:00Z",
                "drain_at": "2026-12-09T10:40:00Z",
                "lead_minutes": 1440
            })),
        ),
        (
            "capacity-workload-drained",
            "c1b2c3d4-0010-4f00-8000-000000000010",
            "2026-12-09T10:40:01Z",
            publish::<WorkloadDrained>(json!({
                "event_key": "team-a-loadtest-2026-12:drained:v9:c1796040000",
                "request_id": "team-a-loadtest-2026-12",
                "reservation_id": "cr-0123456789abcdef0",
                "segment": 0,
                "resource_ids": [
                    "instance:i-0abc1234def567890"
                ],
                "drained_at": "2026-12-09T10:40:00Z",
                "forced_termination_at": "2026-12-09T11:00:00Z",
                "late": false,
                "reason": "the drain start was reached: stopped instance:i-0abc1234def567890 ahead of forced termination at 2026-12-09 11:00:00 UTC (segment 0 ends 2026-12-09 11:30:00 UTC)"
            })),
        ),
        (
            "capacity-workload-interrupted",
            "c1b2c3d4-0021-4f00-8000-000000000021",
            "2026-12-08T05:12:00Z",
            publish::<WorkloadInterrupted>(json!({
                "event_key": "team-a-eval-2026-12:interrupted-spot-1:v1:c1796040000",
                "request_id": "team-a-eval-2026-12",
                "reservation_id": "spot",
                "slot": 1,
                "instance_id": "i-0abc1234def567891",
                "interrupted_at": "2026-12-08T05:09:41Z",
                "replacement_instance_id": "i-0abc1234def5678a2",
                "reason": "EC2 reclaimed spot instance i-0abc1234def567891 in slot 1 at 2026-12-08T05:09:41Z; replaced on spot by i-0abc1234def5678a2 (replacement 1 of at most 3); the run is settled by what its instances ran"
            })),
        ),
        (
            "capacity-workload-launched",
            "c1b2c3d4-0007-4f00-8000-000000000007",
            "2026-12-07T11:31:02Z",
            publish::<WorkloadLaunched>(json!({
                "event_key": "team-a-loadtest-2026-12:launched-s0:v7:c1796040000",
                "request_id": "team-a-loadtest-2026-12",
                "reservation_id": "cr-0123456789abcdef0",
                "segment": 0,
                "workload_kind": "ec2-instances",
                "resource_ids": [
                    "i-0abc1234def567890",
                    "i-0abc1234def567891",
                    "i-0abc1234def567892",
                    "i-0abc1234def567893"
                ],
                "planned_start": "2026-12-07T11:30:00Z",
                "launched_at": "2026-12-07T11:31:00Z"
            })),
        ),
    ]
}

/// The event as EventBridge delivers it.
fn envelope(id: &str, time: &str, e: &OutboundEvent) -> Value {
    json!({
        "version": "0",
        "id": id,
        "detail-type": e.detail_type,
        "source": SOURCE,
        "account": "123456789012",
        "time": time,
        "region": "us-east-1",
        "resources": [],
        "detail": e.detail,
    })
}

#[test]
fn generated_emitted_samples_are_what_the_code_publishes() {
    let dir = events_dir().join("emitted");
    let update = std::env::var_os("UPDATE_SCHEMAS").is_some();
    let mut drifted = vec![];
    let mut stems = BTreeSet::new();
    for (stem, id, at, event) in samples() {
        assert_eq!(event.detail["producer_version"], PRODUCER_VERSION);
        let want = canonical(envelope(id, at, &event));
        let path = dir.join(format!("{stem}.json"));
        stems.insert(stem.to_string());
        if update {
            let text = serde_json::to_string_pretty(&want).unwrap() + "\n";
            std::fs::write(&path, text).unwrap();
            continue;
        }
        let have = std::fs::read_to_string(&path)
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok());
        if have.map(canonical) != Some(want) {
            drifted.push(stem);
        }
    }
    assert!(
        drifted.is_empty(),
        "emitted samples differ from what the code publishes: {drifted:?}; run `make schemas` \
         and review the diff"
    );
    // One sample per published event type, named as its schema, and nothing stale.
    let published: BTreeSet<String> = schemas()
        .into_iter()
        .map(|(s, _)| s.to_string())
        .filter(|s| !CONSUMED.contains(&s.as_str()))
        .collect();
    assert_eq!(stems, published, "one sample per published event type");
    for entry in std::fs::read_dir(&dir).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        let stem = name.strip_suffix(".json").unwrap_or(&name);
        assert!(
            stems.contains(stem),
            "{name} is no sample of ours; delete it"
        );
    }
}

#[test]
fn emitted_samples_agree_with_the_requests_they_answer() {
    // Each sample request, by id.
    let mut asked = std::collections::BTreeMap::new();
    for dir in ["requests/valid", "requests/invalid"] {
        for entry in std::fs::read_dir(events_dir().join(dir)).unwrap() {
            let path = entry.unwrap().path();
            let v = request(&format!(
                "{dir}/{}",
                path.file_name().unwrap().to_string_lossy()
            ));
            if let Some(id) = v["detail"]["request_id"].as_str() {
                asked.insert(id.to_string(), v);
            }
        }
    }
    let mut checked = 0;
    for (stem, _, at, event) in samples() {
        let d = &event.detail;
        let id = d["request_id"].as_str().unwrap_or_default();
        let Some(req) = asked.get(id) else { continue };
        let r = &req["detail"];
        checked += 1;
        // Nothing answers a request before it was submitted.
        assert!(
            time(&json!(at)) >= time(&req["time"]),
            "{stem}: before its request"
        );
        if !d["team"].is_null() {
            assert_eq!(d["team"], r["team"], "{stem}");
        }
        let deadline = search_deadline(
            time(&r["latest_end"]),
            r["duration_hours"].as_u64().unwrap() as u32,
        );
        if !d["search_deadline"].is_null() {
            assert_eq!(time(&d["search_deadline"]), deadline, "{stem}");
        }
        for said in ["searching again until ", "before the search deadline "] {
            if let Some(until) = d["reason"].as_str().and_then(|r| r.split_once(said)) {
                assert!(
                    until.1.starts_with(&deadline.to_string()),
                    "{stem}: {until:?}"
                );
            }
        }
        if stem == "capacity-request-failed" && d["status_before"] == "NotFound" {
            assert!(
                time(&json!(at)) >= deadline,
                "{stem}: fails before its deadline"
            );
        }
        if stem == "capacity-not-found" {
            assert!(
                time(&json!(at)) < deadline,
                "{stem}: not found after its deadline"
            );
        }
        if stem == "capacity-purchase-awaiting-approval" {
            // It waits because its fee is above the request's approval threshold.
            assert_eq!(d["approval_above_usd"], r["budget"]["approval_above_usd"]);
            let fee: f64 = d["upfront_fee_usd"].as_str().unwrap().parse().unwrap();
            let above: f64 = d["approval_above_usd"].as_str().unwrap().parse().unwrap();
            assert!(fee > above, "{fee} would not have waited above {above}");
        }
        if stem == "capacity-request-rejected" {
            assert_eq!(d["event_id"], req["id"], "{stem}: the event it rejects");
        }
    }
    assert!(
        checked >= 18,
        "only {checked} samples answer a sample request"
    );
}
