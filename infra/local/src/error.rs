//! Errors as AWS reports them: a code, a message and an HTTP status. The protocol layer decides
//! the body shape (EC2 XML or awsJson `__type`), so the emulator's logic stays protocol-free.

use thiserror::Error;

/// An error the emulator returns to a client, exactly as AWS would name it.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
#[error("{code}: {message}")]
pub struct ApiError {
    pub status: u16,
    pub code: String,
    pub message: String,
}

impl ApiError {
    pub fn new(status: u16, code: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code: code.to_string(),
            message: message.into(),
        }
    }

    /// An EC2 error (rendered as `<Response><Errors>..`).
    pub fn ec2(status: u16, code: &str, message: impl Into<String>) -> ApiError {
        ApiError::new(status, code, message)
    }

    /// EC2 `InvalidParameterValue`.
    pub fn invalid(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "InvalidParameterValue", message)
    }

    /// SageMaker / EventBridge `ValidationException` (unmodeled; the SDK exposes it via `.code()`).
    pub fn validation(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "ValidationException", message)
    }

    /// SageMaker's modeled `ResourceNotFound`.
    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "ResourceNotFound", message)
    }

    /// SageMaker's modeled `ResourceInUse`.
    pub fn in_use(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "ResourceInUse", message)
    }
}
