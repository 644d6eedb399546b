//! The sample events under `infra/events/emitted/` are exactly what the functions publish:
//! each one's detail reads into its Rust event type and writes back unchanged, and every
//! event type we publish has a sample. (The routing tests and `cargo lambda invoke` use them.)

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use capacity_pilot::domain::events::{
    ApprovalRefused, AwaitingApproval, CancellationApplied, CancellationRefused, EventDetail,
    InstanceMaintenanceScheduled, InstanceReplaced, NotFound, OfferingsFound, PaymentFailed,
    PurchaseInDoubt, RequestAccepted, RequestFailed, RequestRejected, ReservationEnded,
    ReservationExpiring, ReservationUnrecorded, Reserved, WorkloadDrained, WorkloadInterrupted,
    WorkloadLaunched,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

fn emitted_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../infra/events/emitted")
}

/// The detail read as `D` and written back; `None` when it does not read.
fn round_trip<D: EventDetail + DeserializeOwned + Serialize>(detail: &Value) -> Option<Value> {
    let typed: D = serde_json::from_value(detail.clone()).ok()?;
    serde_json::to_value(&typed).ok()
}

fn check(detail_type: &str, detail: &Value) -> Result<Value, String> {
    let back = match detail_type {
        RequestAccepted::DETAIL_TYPE => round_trip::<RequestAccepted>(detail),
        RequestRejected::DETAIL_TYPE => round_trip::<RequestRejected>(detail),
        OfferingsFound::DETAIL_TYPE => round_trip::<OfferingsFound>(detail),
        NotFound::DETAIL_TYPE => round_trip::<NotFound>(detail),
        AwaitingApproval::DETAIL_TYPE => round_trip::<AwaitingApproval>(detail),
        Reserved::DETAIL_TYPE => round_trip::<Reserved>(detail),
        PaymentFailed::DETAIL_TYPE => round_trip::<PaymentFailed>(detail),
        ApprovalRefused::DETAIL_TYPE => round_trip::<ApprovalRefused>(detail),
        ReservationUnrecorded::DETAIL_TYPE => round_trip::<ReservationUnrecorded>(detail),
        PurchaseInDoubt::DETAIL_TYPE => round_trip::<PurchaseInDoubt>(detail),
        CancellationApplied::DETAIL_TYPE => round_trip::<CancellationApplied>(detail),
        CancellationRefused::DETAIL_TYPE => round_trip::<CancellationRefused>(detail),
        WorkloadLaunched::DETAIL_TYPE => round_trip::<WorkloadLaunched>(detail),
        InstanceReplaced::DETAIL_TYPE => round_trip::<InstanceReplaced>(detail),
        InstanceMaintenanceScheduled::DETAIL_TYPE => {
            round_trip::<InstanceMaintenanceScheduled>(detail)
        }
        WorkloadInterrupted::DETAIL_TYPE => round_trip::<WorkloadInterrupted>(detail),
        ReservationExpiring::DETAIL_TYPE => round_trip::<ReservationExpiring>(detail),
        WorkloadDrained::DETAIL_TYPE => round_trip::<WorkloadDrained>(detail),
        ReservationEnded::DETAIL_TYPE => round_trip::<ReservationEnded>(detail),
        RequestFailed::DETAIL_TYPE => round_trip::<RequestFailed>(detail),
        other => return Err(format!("{other:?} is not an event we publish")),
    };
    back.ok_or_else(|| "the detail does not read as its event type".to_string())
}

#[test]
fn every_emitted_sample_is_exactly_an_event_we_publish() {
    let mut seen = BTreeSet::new();
    let mut wrong = Vec::new();
    for entry in std::fs::read_dir(emitted_dir()).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let ev: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path:?}: {e}"));
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if ev["source"] != "capacity-pilot" {
            wrong.push(format!(
                "{name}: source {} is not capacity-pilot",
                ev["source"]
            ));
        }
        let detail_type = ev["detail-type"].as_str().unwrap_or_default().to_string();
        match check(&detail_type, &ev["detail"]) {
            Ok(back) if back == ev["detail"] => {}
            Ok(back) => wrong.push(format!("{name}: written back as {back}")),
            Err(why) => wrong.push(format!("{name}: {why}")),
        }
        seen.insert(detail_type);
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
    let published: BTreeSet<String> = [
        RequestAccepted::DETAIL_TYPE,
        RequestRejected::DETAIL_TYPE,
        OfferingsFound::DETAIL_TYPE,
        NotFound::DETAIL_TYPE,
        AwaitingApproval::DETAIL_TYPE,
        Reserved::DETAIL_TYPE,
        PaymentFailed::DETAIL_TYPE,
        ApprovalRefused::DETAIL_TYPE,
        ReservationUnrecorded::DETAIL_TYPE,
        PurchaseInDoubt::DETAIL_TYPE,
        CancellationApplied::DETAIL_TYPE,
        CancellationRefused::DETAIL_TYPE,
        WorkloadLaunched::DETAIL_TYPE,
        InstanceReplaced::DETAIL_TYPE,
        InstanceMaintenanceScheduled::DETAIL_TYPE,
        WorkloadInterrupted::DETAIL_TYPE,
        ReservationExpiring::DETAIL_TYPE,
        WorkloadDrained::DETAIL_TYPE,
        ReservationEnded::DETAIL_TYPE,
        RequestFailed::DETAIL_TYPE,
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(seen, published, "one sample per published event type");
}
