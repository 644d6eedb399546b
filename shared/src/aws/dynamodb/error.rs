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
        "ThrottlingException"
        | "ProvisionedThroughputExceededException"
        | "RequestLimitExceeded" => PortError::Throttled {
            service: SERVICE,
            code: code.to_string(),
            message,
        },
        // Another transaction held the item: nothing was written.
        "TransactionConflictException" | "TransactionInProgressException" => {
            transient(code, message)
        }
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
