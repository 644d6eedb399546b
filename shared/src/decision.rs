//! What an invocation decided, per request: every function logs these and returns them,
//! and the handler tests assert on them.

use serde::Serialize;
use tracing::info;

use crate::domain::request::RequestId;
use crate::ports::{PortError, WriteOutcome};

/// Why an invocation failed. Lambda retries a failed asynchronous invocation and every
/// function's schedule comes again; either way the table says what is left to do.
#[derive(Debug, thiserror::Error)]
pub enum HandlerError {
    #[error(transparent)]
    Port(#[from] PortError),
    /// Some requests could not be processed; the others were.
    #[error("{failed} request(s) could not be processed; first error: {first}")]
    Partial { failed: usize, first: PortError },
}

impl HandlerError {
    /// The port error behind it (the first, when several requests failed).
    pub fn into_port(self) -> PortError {
        match self {
            HandlerError::Port(e) | HandlerError::Partial { first: e, .. } => e,
        }
    }

    /// Its stable name, what Lambda reports as the invocation's `errorType` (ARCHITECTURE
    /// §8.11): alarms and log queries group by it. That of the first error when several
    /// requests failed.
    pub fn error_type(&self) -> &'static str {
        match self {
            HandlerError::Port(e) | HandlerError::Partial { first: e, .. } => error_type(e),
        }
    }
}

/// Every `errorType` a failed invocation can report ([`error_type`]), with what it means and
/// what to do; a test holds the list to the function, and `make schemas` writes it into
/// docs/operations.md.
pub const ERROR_TYPES: [(&str, &str); 11] = [
    (
        "StoreUnavailable",
        "DynamoDB throttled or failed transiently. The next invocation retries; act only if it \
         persists (check the table's throttling metrics).",
    ),
    (
        "StoreRefused",
        "DynamoDB refused a call (permissions, a missing table or index, an item too large). \
         Retrying will not help: check the function's role and the table.",
    ),
    (
        "EventBusUnavailable",
        "EventBridge throttled or failed transiently; the events stay in the outbox and are \
         sent again.",
    ),
    (
        "EventBusRefused",
        "EventBridge refused to publish (permissions, the bus missing, an entry too large). \
         The events stay in the outbox: fix the bus or the role.",
    ),
    (
        "ClockUnavailable",
        "The function could not read the time it needs; retried on the next invocation.",
    ),
    (
        "AwsThrottled",
        "EC2 or SageMaker throttled the call; retried with backoff. Persistent: raise the API \
         rate quota or lower the request load.",
    ),
    (
        "AwsUnavailable",
        "EC2 or SageMaker failed transiently with nothing done; retried.",
    ),
    (
        "AwsOutcomeUnknown",
        "An EC2 or SageMaker call may or may not have taken effect (a timeout, a lost \
         answer). A purchase in doubt is reconciled by its tags before anything else is tried.",
    ),
    (
        "OfferingGone",
        "The offering sold out or expired before it was bought; the request searches again.",
    ),
    (
        "NoCapacity",
        "EC2 had no capacity for the launch (on demand, spot, or inside a reservation); \
         retried while the window lasts.",
    ),
    (
        "AwsRefused",
        "EC2 or SageMaker refused the call (permissions, a bad launch template, subnet or \
         model). Retrying will not help: the request's reason names the call.",
    ),
];

/// The stable name of a failed call: the store, the event bus, the clock, or AWS's
/// capacity and workload services, by what went wrong.
pub fn error_type(e: &PortError) -> &'static str {
    use PortError::{NoCapacity, OfferingGone, OutcomeUnknown, Permanent, Throttled, Transient};
    let service = match e {
        Throttled { service, .. }
        | Transient { service, .. }
        | OutcomeUnknown { service, .. }
        | Permanent { service, .. } => *service,
        OfferingGone { .. } | NoCapacity { .. } => "market",
    };
    match (service, e) {
        ("dynamodb" | "store", Permanent { .. }) => "StoreRefused",
        ("dynamodb" | "store", _) => "StoreUnavailable",
        ("events", Permanent { .. }) => "EventBusRefused",
        ("events", _) => "EventBusUnavailable",
        ("clock", _) => "ClockUnavailable",
        (_, Throttled { .. }) => "AwsThrottled",
        (_, Transient { .. }) => "AwsUnavailable",
        (_, OutcomeUnknown { .. }) => "AwsOutcomeUnknown",
        (_, OfferingGone { .. }) => "OfferingGone",
        (_, NoCapacity { .. }) => "NoCapacity",
        (_, Permanent { .. }) => "AwsRefused",
    }
}

impl From<HandlerError> for lambda_runtime::Diagnostic {
    fn from(e: HandlerError) -> Self {
        lambda_runtime::Diagnostic {
            error_type: e.error_type().to_string(),
            error_message: e.to_string(),
        }
    }
}

/// `out` when no request failed; otherwise how many failed, and the first error.
pub fn finish<T>(out: T, errors: Vec<PortError>) -> Result<T, HandlerError> {
    let failed = errors.len();
    match errors.into_iter().next() {
        None => Ok(out),
        Some(first) => Err(HandlerError::Partial { failed, first }),
    }
}

/// One decision about one request, with the reason that explains it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Decision {
    pub request_id: String,
    pub action: &'static str,
    pub reason: String,
}

impl Decision {
    pub fn new(id: &RequestId, action: &'static str, reason: impl Into<String>) -> Decision {
        Decision {
            request_id: id.to_string(),
            action,
            reason: reason.into(),
        }
    }

    /// A decision about something other than one request (a region's detector run), named
    /// by `subject` where a request's id would be.
    pub fn about(subject: &str, action: &'static str, reason: impl Into<String>) -> Decision {
        Decision {
            request_id: subject.to_string(),
            action,
            reason: reason.into(),
        }
    }
}

/// Logs each decision, with its reason, as one structured line.
pub fn log(decisions: &[Decision]) {
    for d in decisions {
        info!(request_id = %d.request_id, action = d.action, reason = %d.reason, "decision");
    }
}

/// The action to report for a conditional write: `applied` when it took effect, otherwise
/// why it did not.
pub fn written(w: &WriteOutcome, applied: &'static str) -> &'static str {
    match w {
        WriteOutcome::Applied { .. } => applied,
        WriteOutcome::Conflict => "skipped",
        WriteOutcome::DuplicateEvent => "duplicate",
        WriteOutcome::OverTeamBudget { .. } | WriteOutcome::OverRequestBudget { .. } => {
            "over-budget"
        }
        WriteOutcome::Paused(_) => "paused",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::money::MicroUsd;

    #[test]
    fn error_types_lists_exactly_what_a_failed_call_is_named() {
        let services = ["dynamodb", "store", "events", "clock", "ec2", "sagemaker"];
        let mut named = std::collections::BTreeSet::new();
        for service in services {
            let (code, message) = (String::from("C"), String::from("m"));
            for e in [
                PortError::Throttled {
                    service,
                    code: code.clone(),
                    message: message.clone(),
                },
                PortError::Transient {
                    service,
                    code: code.clone(),
                    message: message.clone(),
                },
                PortError::OutcomeUnknown {
                    service,
                    message: message.clone(),
                },
                PortError::Permanent {
                    service,
                    code: code.clone(),
                    message: message.clone(),
                },
                PortError::OfferingGone {
                    code: code.clone(),
                    message: message.clone(),
                },
                PortError::NoCapacity {
                    code: code.clone(),
                    message: message.clone(),
                },
            ] {
                named.insert(error_type(&e));
            }
        }
        let listed: std::collections::BTreeSet<&str> =
            ERROR_TYPES.iter().map(|(n, _)| *n).collect();
        assert_eq!(named, listed);
    }

    #[test]
    fn a_write_names_what_it_came_to() {
        let cap = MicroUsd(1);
        assert_eq!(
            written(&WriteOutcome::Applied { version: 2 }, "bought"),
            "bought"
        );
        assert_eq!(written(&WriteOutcome::Conflict, "bought"), "skipped");
        assert_eq!(
            written(&WriteOutcome::DuplicateEvent, "bought"),
            "duplicate"
        );
        let over = WriteOutcome::OverTeamBudget { spent: cap, cap };
        assert_eq!(written(&over, "bought"), "over-budget");
    }
}

#[cfg(test)]
mod error_type_tests {
    use super::*;

    #[test]
    fn every_invocation_error_has_a_stable_type_not_a_rust_type_name() {
        let store = PortError::Transient {
            service: "dynamodb",
            code: "InternalServerError".into(),
            message: "x".into(),
        };
        let throttled = PortError::Throttled {
            service: "ec2",
            code: "RequestLimitExceeded".into(),
            message: "x".into(),
        };
        let cases = [
            (HandlerError::Port(store.clone()), "StoreUnavailable"),
            (
                HandlerError::Partial {
                    failed: 3,
                    first: throttled,
                },
                "AwsThrottled",
            ),
        ];
        for (e, want) in cases {
            let message = e.to_string();
            let d = lambda_runtime::Diagnostic::from(e);
            assert_eq!(d.error_type, want);
            assert_eq!(d.error_message, message);
        }
    }
}
