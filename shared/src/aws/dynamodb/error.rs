//! SDK failures classified once, here, into `PortError`; and the decoding of a cancelled
//! transaction into which of its conditions failed.

use std::fmt::Debug;

use aws_sdk_dynamodb::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;

use crate::ports::PortError;

const SERVICE: &str = "dynamodb";

/// Whether the failed call could have written something; decides what a timeout means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Call {
    Read,
    Write,
}

pub(super) fn permanent(code: &str, message: impl Into<String>) -> PortError {
    PortError::Permanent {
        service: SERVICE,
        code: code.to_string(),
        message: message.into(),
    }
}

pub(super) fn corrupt(message: impl Into<String>) -> PortError {
    permanent("CorruptItem", message)
}

pub(super) fn transient(code: &str, message: impl Into<String>) -> PortError {
    PortError::Transient {
        service: SERVICE,
        code: code.to_string(),
        message: message.into(),
    }
}

/// Classifies a service error code.
fn from_code(code: &str, message: String, call: Call) -> PortError {
    match code {
        // (A cancelled transaction spells its reasons without "Exception".)
        "ThrottlingException"
        | "ThrottlingError"
        | "ProvisionedThroughputExceededException"
        | "ProvisionedThroughputExceeded"
        | "RequestLimitExceeded" => PortError::Throttled {
            service: SERVICE,
            code: code.to_string(),
            message,
        },
        // Another transaction held the item: nothing was written.
        "TransactionConflictException"
        | "TransactionConflict"
        | "TransactionInProgressException" => transient(code, message),
        "InternalServerError" | "ServiceUnavailable" | "InternalFailure" => match call {
            Call::Read => transient(code, message),
            // A 500 on a write may have committed; every write records its event, so a
            // retry is safe and reports `DuplicateEvent` if it did.
            Call::Write => PortError::OutcomeUnknown {
                service: SERVICE,
                message: format!("{code}: {message}"),
            },
        },
        _ => permanent(code, message),
    }
}

/// Any SDK failure of `op`.
pub(super) fn sdk_error<E, R>(op: &'static str, err: SdkError<E, R>, call: Call) -> PortError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: Debug + Send + Sync + 'static,
{
    let message = format!("{op}: {}", DisplayErrorContext(&err));
    match &err {
        SdkError::ServiceError(se) => {
            let code = se.err().code().unwrap_or("Unknown");
            from_code(code, message, call)
        }
        // Nothing reached the server.
        SdkError::ConstructionFailure(_) => permanent("ConstructionFailure", message),
        SdkError::DispatchFailure(d) if d.is_user() => permanent("DispatchFailure", message),
        SdkError::DispatchFailure(d) if !d.is_timeout() => transient("DispatchFailure", message),
        // A timeout or an unreadable response: the request may have been applied.
        _ => match call {
            Call::Read => transient("Timeout", message),
            Call::Write => PortError::OutcomeUnknown {
                service: SERVICE,
                message,
            },
        },
    }
}

/// What a `TransactWriteItems` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Committed {
    Yes,
    /// Cancelled because these items' conditions failed (indices into the request).
    ConditionsFailed(Vec<usize>),
}

impl Committed {
    pub(super) fn failed(&self, index: usize) -> bool {
        matches!(self, Committed::ConditionsFailed(f) if f.contains(&index))
    }
}

/// Decodes `CancellationReasons`: failed conditions are an outcome, anything else an error.
pub(super) fn transaction_result<R>(
    result: Result<(), SdkError<TransactWriteItemsError, R>>,
) -> Result<Committed, PortError>
where
    R: Debug + Send + Sync + 'static,
{
    let err = match result {
        Ok(()) => return Ok(Committed::Yes),
        Err(err) => err,
    };
    if let SdkError::ServiceError(se) = &err
        && let TransactWriteItemsError::TransactionCanceledException(tc) = se.err()
    {
        let mut failed = Vec::new();
        for (i, reason) in tc.cancellation_reasons().iter().enumerate() {
            match reason.code() {
                None | Some("None") => {}
                Some("ConditionalCheckFailed") => failed.push(i),
                Some(code) => {
                    let message = format!(
                        "TransactWriteItems item {i}: {}",
                        reason.message().unwrap_or_default()
                    );
                    return Err(from_code(code, message, Call::Write));
                }
            }
        }
        if !failed.is_empty() {
            return Ok(Committed::ConditionsFailed(failed));
        }
    }
    Err(sdk_error("TransactWriteItems", err, Call::Write))
}

#[cfg(test)]
mod tests {
    use aws_sdk_dynamodb::config::http::HttpResponse;
    use aws_sdk_dynamodb::error::ErrorMetadata;
    use aws_sdk_dynamodb::types::CancellationReason;
    use aws_sdk_dynamodb::types::error::{ThrottlingException, TransactionCanceledException};
    use aws_smithy_types::body::SdkBody;

    use super::*;

    fn response() -> HttpResponse {
        HttpResponse::new(400.try_into().unwrap(), SdkBody::empty())
    }

    fn cancelled(codes: &[&str]) -> SdkError<TransactWriteItemsError, HttpResponse> {
        let mut b = TransactionCanceledException::builder().message("cancelled");
        for c in codes {
            b = b.cancellation_reasons(CancellationReason::builder().code(*c).build());
        }
        SdkError::service_error(
            TransactWriteItemsError::TransactionCanceledException(b.build()),
            response(),
        )
    }

    #[test]
    fn failed_conditions_are_an_outcome_naming_the_items() {
        let r = transaction_result(Err(cancelled(&[
            "ConditionalCheckFailed",
            "None",
            "ConditionalCheckFailed",
        ])));
        assert_eq!(r, Ok(Committed::ConditionsFailed(vec![0, 2])));
    }

    #[test]
    fn a_conflicting_transaction_is_a_retryable_error_not_a_lost_race() {
        let r = transaction_result(Err(cancelled(&["None", "TransactionConflict"])));
        let err = r.unwrap_err();
        assert!(err.is_retryable(), "{err}");
        assert_eq!(err.code(), Some("TransactionConflict"));
    }

    #[test]
    fn throttling_is_classified_as_throttled() {
        let e = ThrottlingException::builder()
            .message("slow down")
            .meta(
                ErrorMetadata::builder()
                    .code("ThrottlingException")
                    .message("slow down")
                    .build(),
            )
            .build();
        let err =
            SdkError::service_error(TransactWriteItemsError::ThrottlingException(e), response());
        let r = transaction_result(Err(err));
        assert!(matches!(r, Err(PortError::Throttled { .. })), "{r:?}");
    }

    #[test]
    fn a_timeout_leaves_a_write_unknown_and_a_read_retryable() {
        let write: SdkError<TransactWriteItemsError, HttpResponse> =
            SdkError::timeout_error("no response");
        assert!(matches!(
            sdk_error("TransactWriteItems", write, Call::Write),
            PortError::OutcomeUnknown { .. }
        ));
        let read: SdkError<TransactWriteItemsError, HttpResponse> =
            SdkError::timeout_error("no response");
        assert!(sdk_error("GetItem", read, Call::Read).is_retryable());
    }
}
