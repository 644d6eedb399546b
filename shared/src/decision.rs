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

/// One `errorType` a failed invocation can report, with its runbook entry: what it means,
/// whether the next tick heals it, what a person does, and the command to look with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorType {
    pub name: &'static str,
    pub meaning: &'static str,
    /// Whether the next invocation or tick heals it, and how.
    pub heals: &'static str,
    pub action: &'static str,
    /// A command (the `capacity-pilot` CLI or the AWS CLI) that shows what to look at.
    pub look: &'static str,
}

/// Every `errorType` a failed invocation can report ([`error_type`]), with its runbook entry;
/// a test holds the list to the function, and `make schemas` writes it into
/// docs/operations.md. SNS errors (the notices topic) are named like EC2's and SageMaker's.
pub const ERROR_TYPES: [ErrorType; 11] = [
    ErrorType {
        name: "StoreUnavailable",
        meaning: "DynamoDB throttled the call or failed transiently; nothing was written.",
        heals: "Yes: Lambda retries the invocation, and the next tick resumes from what the \
                table says.",
        action: "Nothing while it is brief. If it lasts, look at the table's throttling and \
                 system errors and at the AWS Health Dashboard.",
        look: "capacity-pilot list --live",
    },
    ErrorType {
        name: "StoreRefused",
        meaning: "DynamoDB refused a call: permissions, a missing table or index, an item too \
                  large.",
        heals: "No: every retry is refused the same way.",
        action: "Read the message in the function's log. Check the function's role, and that the \
                 table and its `work` index exist (a stack update still running, a table \
                 deleted by hand).",
        look: "aws dynamodb describe-table --table-name \"$TABLE\"",
    },
    ErrorType {
        name: "EventBusUnavailable",
        meaning: "EventBridge throttled PutEvents or failed transiently.",
        heals: "Yes: the events stay in the outbox and the next tick publishes them again.",
        action: "Nothing while it is brief. If it lasts, check the account's PutEvents quota \
                 (Service Quotas) and the AWS Health Dashboard.",
        look: "aws service-quotas list-service-quotas --service-code events",
    },
    ErrorType {
        name: "EventBusRefused",
        meaning: "EventBridge refused to publish: permissions, the bus missing, an entry too \
                  large.",
        heals: "No, but nothing is lost: the events stay in the outbox until they can be sent.",
        action: "Fix the bus or the role (the message in the function's log names the entry \
                 and the error); the next tick sends what waited.",
        look: "aws events describe-event-bus --name \"$BUS\"",
    },
    ErrorType {
        name: "ClockUnavailable",
        meaning: "The function could not read the time it needs (only a local run reads a \
                  clock over the network).",
        heals: "Yes: the next invocation reads it again.",
        action: "In AWS, nothing: the clock is the system's. Locally, check that the emulator \
                 is running.",
        look: "capacity-pilot list --live",
    },
    ErrorType {
        name: "AwsThrottled",
        meaning: "An AWS service (EC2, SageMaker, SNS) throttled the call.",
        heals: "Yes: retried with backoff, then at the next tick.",
        action: "If it lasts, raise the API's rate quota or spread the requests; EC2's \
                 Capacity Block searches have their own low limit per account and region.",
        look: "aws service-quotas list-service-quotas --service-code ec2",
    },
    ErrorType {
        name: "AwsUnavailable",
        meaning: "An AWS service (EC2, SageMaker, SNS) failed transiently with nothing done.",
        heals: "Yes: the next tick tries again.",
        action: "Nothing while it is brief; if it lasts, the AWS Health Dashboard for the \
                 service and region.",
        look: "aws health describe-events --filter services=EC2,SAGEMAKER",
    },
    ErrorType {
        name: "AwsOutcomeUnknown",
        meaning: "A call to an AWS service (EC2, SageMaker, SNS) may or may not have taken \
                  effect: a timeout, a lost answer.",
        heals: "Yes: a purchase in doubt is reconciled by its tags before anything else is \
                tried, a notice is sent again under the same key, a launch looks for what it \
                started.",
        action: "Nothing unless the request ends in doubt (PurchaseInDoubtAlarm); then follow \
                 that entry.",
        look: "capacity-pilot status <request-id>",
    },
    ErrorType {
        name: "OfferingGone",
        meaning: "The offering sold out or expired before it was bought.",
        heals: "Yes: the request searches again until its deadline.",
        action: "Nothing; a request that keeps losing offerings fails at its search deadline \
                 with the reason.",
        look: "capacity-pilot history <request-id>",
    },
    ErrorType {
        name: "NoCapacity",
        meaning: "EC2 had no capacity for the launch (on demand, spot, or inside a reservation).",
        heals: "Yes: retried at each tick while the window lasts.",
        action: "Nothing for a reservation's window (AWS delivers it late at worst); for on \
                 demand, the request falls back to a reservation as its strategy says.",
        look: "capacity-pilot status <request-id>",
    },
    ErrorType {
        name: "AwsRefused",
        meaning: "An AWS service (EC2, SageMaker, SNS) refused the call: permissions, a bad \
                  launch template, subnet or model, a topic gone.",
        heals: "No: the request's reason names the call and the refusal.",
        action: "Fix what the reason names (the role, the launch template, the subnets, the \
                 model); a request that failed must be submitted again.",
        look: "capacity-pilot history <request-id>",
    },
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
        let listed: std::collections::BTreeSet<&str> = ERROR_TYPES.iter().map(|t| t.name).collect();
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
