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
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::money::MicroUsd;

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
