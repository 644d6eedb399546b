//! How a command fails: ARCHITECTURE §8.13's exit codes, each failure with what to do.

use std::fmt;

use capacity_pilot::domain::request::FieldError;
use capacity_pilot::ports::PortError;

/// §8.13: 0 ok, 2 usage, 3 invalid request, 4 not found, 5 AWS error, 6 refused by policy.
#[derive(Debug)]
pub enum Fail {
    /// The command line cannot be carried out as given (2).
    Usage(String),
    /// The request file is not a valid request: every field at fault (3).
    Invalid {
        file: String,
        problems: Vec<FieldError>,
    },
    /// The stack, request or month asked about does not exist (4).
    NotFound(String),
    /// AWS answered with an error, or could not be reached (5).
    Aws(String),
    /// A policy refused it: IAM, the bus policy, or the plan changed under an approval (6).
    Refused(String),
}

impl Fail {
    pub fn code(&self) -> u8 {
        match self {
            Fail::Usage(_) => 2,
            Fail::Invalid { .. } => 3,
            Fail::NotFound(_) => 4,
            Fail::Aws(_) => 5,
            Fail::Refused(_) => 6,
        }
    }

    /// A store read that failed, as the CLI says it.
    pub fn store(e: PortError) -> Fail {
        let text = e.to_string();
        if text.contains("ResourceNotFoundException") {
            Fail::NotFound(format!(
                "the state table does not exist: {text}\n  check --stack, or --table"
            ))
        } else if text.contains("AccessDenied") || text.contains("UnauthorizedOperation") {
            Fail::Refused(format!(
                "not allowed to read the state table: {text}\n  use a role with one of the \
                 stack's RequesterPolicy, ApproverPolicy or OperatorPolicy"
            ))
        } else {
            Fail::Aws(format!(
                "reading the state table failed: {text}\n  check your credentials and region, \
                 then try again"
            ))
        }
    }
}

impl fmt::Display for Fail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fail::Invalid { file, problems } => {
                writeln!(
                    f,
                    "{file} is not a valid request ({} problem{}):",
                    problems.len(),
                    if problems.len() == 1 { "" } else { "s" }
                )?;
                for p in problems {
                    writeln!(f, "  {}: {}", p.field, p.message)?;
                }
                write!(f, "  fix each field and submit again; nothing was sent")
            }
            Fail::Usage(m) | Fail::NotFound(m) | Fail::Aws(m) | Fail::Refused(m) => {
                write!(f, "{m}")
            }
        }
    }
}

pub type Result<T> = std::result::Result<T, Fail>;
