//! EventBridge `PutEvents` with AWS's validation: 1-10 entries, Source/DetailType/Detail required,
//! Detail a JSON object, a configurable size limit, no `aws.*` sources, and per-entry failures
//! reported in a 200 response with `FailedEntryCount`. Accepted entries are recorded per bus in
//! the envelope a rule target would receive, so tests can assert what was published.

use serde_json::{Value, json};

use crate::error::ApiError;
use crate::util::event_time;
use crate::world::World;

impl World {
    /// Routes one EventBridge operation.
    pub fn events_call(
        &mut self,
        region: &str,
        op: &str,
        input: &Value,
    ) -> Result<Value, ApiError> {
        self.settle();
        match op {
            "PutEvents" => self.put_events(region, input),
            other => Err(ApiError::new(
                400,
                "UnknownOperationException",
                format!("Operation {other} is not supported by local-cloud"),
            )),
        }
    }

    fn put_events(&mut self, region: &str, input: &Value) -> Result<Value, ApiError> {
        let entries = input
            .get("Entries")
            .and_then(Value::as_array)
            .ok_or_else(|| {
                ApiError::validation(
                    "1 validation error detected: Value null at 'entries' failed to satisfy constraint: Member must not be null",
                )
            })?;
        if entries.is_empty() || entries.len() > 10 {
            return Err(ApiError::validation(format!(
                "1 validation error detected: Value '{}' at 'entries' failed to satisfy constraint: Member must have length between 1 and 10",
                entries.len()
            )));
        }
        let complete = |e: &Value| {
            ["Source", "DetailType", "Detail"].iter().all(|k| {
                e.get(*k)
                    .and_then(Value::as_str)
                    .is_some_and(|s| !s.is_empty())
            })
        };
        if !entries.iter().any(complete) {
            return Err(ApiError::validation(
                "No entry has all of Source, DetailType and Detail",
            ));
        }
        let mut results = Vec::new();
        let mut failed = 0;
        for entry in entries {
            match self.check_entry(entry) {
                Ok(detail) => {
                    let id = self.next_event_id();
                    let (bus_region, bus) = bus_of(region, entry.get("EventBusName"));
                    let time = entry
                        .get("Time")
                        .and_then(Value::as_f64)
                        .and_then(|s| chrono::DateTime::from_timestamp(s as i64, 0))
                        .unwrap_or(self.now);
                    let envelope = json!({
                        "version": "0",
                        "id": id,
                        "detail-type": entry["DetailType"],
                        "source": entry["Source"],
                        "account": self.settings.account_id,
                        "time": event_time(time),
                        "region": region,
                        "resources": entry.get("Resources").cloned().unwrap_or_else(|| json!([])),
                        "detail": detail,
                    });
                    self.record(&bus_region, &bus, envelope);
                    results.push(json!({"EventId": id}));
                }
                Err((code, message)) => {
                    failed += 1;
                    results.push(json!({"ErrorCode": code, "ErrorMessage": message}));
                }
            }
        }
        Ok(json!({"FailedEntryCount": failed, "Entries": results}))
    }

    /// The check of one entry: its Detail as an object, or the per-entry error.
    fn check_entry(&self, e: &Value) -> Result<Value, (&'static str, String)> {
        let field = |k: &str| e.get(k).and_then(Value::as_str).filter(|s| !s.is_empty());
        for k in ["Source", "DetailType", "Detail"] {
            if field(k).is_none() {
                return Err((
                    "InvalidArgument",
                    format!("Parameter {k} is not valid. Reason: {k} is a required argument."),
                ));
            }
        }
        let source = field("Source").expect("checked");
        let detail_type = field("DetailType").expect("checked");
        let detail_s = field("Detail").expect("checked");
        if source.starts_with("aws.") {
            return Err((
                "NotAuthorizedForSourceException",
                format!("Not authorized for the source {source}."),
            ));
        }
        if detail_type.chars().count() > 128 {
            return Err((
                "InvalidArgument",
                "Parameter DetailType is not valid. Reason: DetailType must be at most 128 characters.".to_string(),
            ));
        }
        let size = e.get("Time").map_or(0, |_| 14)
            + source.len()
            + detail_type.len()
            + detail_s.len()
            + e.get("Resources").and_then(Value::as_array).map_or(0, |r| {
                r.iter().filter_map(Value::as_str).map(str::len).sum()
            });
        if size > self.settings.event_max_bytes {
            return Err((
                "InvalidArgument",
                format!(
                    "Total size of the entries in the request is over the limit ({size} > {} bytes).",
                    self.settings.event_max_bytes
                ),
            ));
        }
        match serde_json::from_str::<Value>(detail_s) {
            Ok(v @ Value::Object(_)) => Ok(v),
            _ => Err(("MalformedDetail", "Detail is malformed.".to_string())),
        }
    }
}

/// The (region, name) of the bus an entry's `EventBusName` names: an ARN
/// (`arn:aws:events:<region>:<account>:event-bus/<name>`) names its region, a bare name is the
/// calling region's bus, and none is the calling region's `default`.
pub fn bus_of(call_region: &str, name: Option<&Value>) -> (String, String) {
    let Some(name) = name.and_then(Value::as_str).filter(|n| !n.is_empty()) else {
        return (call_region.to_string(), "default".to_string());
    };
    if let Some(rest) = name.strip_prefix("arn:") {
        // partition:events:region:account:event-bus/name
        let parts: Vec<&str> = rest.splitn(5, ':').collect();
        if let [_, _, region, _, resource] = parts.as_slice() {
            let bus = resource.rsplit('/').next().unwrap_or(resource);
            let region = if region.is_empty() {
                call_region
            } else {
                region
            };
            return (region.to_string(), bus.to_string());
        }
    }
    (
        call_region.to_string(),
        name.rsplit('/').next().unwrap_or(name).to_string(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_event_bus_arn_names_its_region_and_a_bare_name_the_callers() {
        assert_eq!(
            bus_of("us-east-1", None),
            ("us-east-1".into(), "default".into())
        );
        assert_eq!(
            bus_of("us-west-2", Some(&json!("capacity-pilot"))),
            ("us-west-2".into(), "capacity-pilot".into())
        );
        assert_eq!(
            bus_of(
                "us-west-2",
                Some(&json!(
                    "arn:aws:events:us-east-1:123456789012:event-bus/default"
                ))
            ),
            ("us-east-1".into(), "default".into())
        );
        assert_eq!(
            bus_of(
                "us-east-1",
                Some(&json!(
                    "arn:aws:events:eu-west-1:123456789012:event-bus/capacity-pilot"
                ))
            ),
            ("eu-west-1".into(), "capacity-pilot".into())
        );
    }
}
