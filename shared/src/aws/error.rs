//! SDK failures of the EC2, SageMaker and EventBridge adapters classified into `PortError`,
//! once, here. EC2 models no errors and SageMaker answers "not found" with the unmodeled
//! `ValidationException`, so everything is decided on the error code, never the Rust variant.

use std::fmt::Debug;

use aws_sdk_ec2::config::http::HttpResponse;
use aws_sdk_ec2::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use chrono::{DateTime, Utc};

use crate::ports::PortError;
use crate::workload::refusal;

/// What a failed call could have done, which decides what an unanswered call means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    /// A read, or a write that is safe to repeat (idempotent, client token, unique name):
    /// a lost answer is just transient.
    Retryable,
    /// A purchase without an idempotency token: a lost answer may have bought something.
    Purchase,
}

/// Throttling codes of the services we call (the SDK's own retry list, plus EC2's).
const THROTTLING: &[&str] = &[
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "RequestThrottledException",
    "TooManyRequestsException",
    "RequestLimitExceeded",
    "RequestThrottled",
    "BandwidthLimitExceeded",
    "SlowDown",
    "EC2ThrottledException",
    "PriorRequestNotComplete",
];

/// Codes a purchase past the account's limit across Capacity Blocks may answer with: none is
/// published; the emulator's default is listed, and [`names_block_limit`] reads the message.
const BLOCK_LIMIT: &[&str] = &["CapacityBlockLimitExceeded"];

/// Whether an error message names the account's limit of instances across Capacity Blocks
/// ("you can have up to 256 instances across Capacity Blocks", the EC2 model's wording).
fn names_block_limit(message: &str) -> bool {
    message
        .to_ascii_lowercase()
        .contains("instances across capacity blocks")
}

/// EC2's Capacity Block describe limit, its own class (aws-reference §11.1): "You've reached
/// the limit for this account", answered both to an account whose Capacity Block quota is 0
/// and to bursts of searches ("a low, slowly-refilling limit per account per region";
/// botocore does not class it as throttling). Never a throttle, so nothing retries it as one
/// or reports it as throttling: it is `Transient` (the same call may succeed later) with its
/// code kept, and only the search reads it (`search::read_failure`: the quota reading refuses
/// the family in the region, the burst reading backs the region off).
pub const DESCRIBE_LIMITS: &[&str] = &["CapacityBlockDescribeLimitExceeded"];

/// The offering can no longer be bought. Note: no dot in EC2's three offering codes.
const OFFERING_GONE: &[&str] = &[
    "InvalidCapacityBlockOfferingIdNotFound",
    "InvalidCapacityBlockOfferingIdExpired",
    "InvalidCapacityBlockOfferingIdMalformed",
];

/// No capacity to launch into now. A Capacity Block not yet active (its activation can lag
/// its start by minutes, aws-reference §11.1) is capacity not there yet: the launch waits for
/// the next tick instead of failing a paid request.
const NO_CAPACITY: &[&str] = &[
    "InvalidCapacityReservationState.PendingActivation",
    "InsufficientInstanceCapacity",
    "ReservationCapacityExceeded",
    "InsufficientCapacity",
    "InsufficientCapacityError",
];

/// The resource is busy with another change (a HyperPod cluster `Updating` or
/// `SystemUpdating`, aws-reference §11.2): the same call may succeed later.
const BUSY: &[&str] = &["ConflictException"];

/// Server-side failures; the outcome is unknown for a purchase.
const SERVER: &[&str] = &[
    "InternalError",
    "InternalFailure",
    "InternalServerError",
    "InternalException",
    "ServiceUnavailable",
    "ServiceUnavailableException",
    "Unavailable",
    "RequestTimeout",
    "RequestTimeoutException",
];

/// One failed SDK call, reduced to what classification needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The operation, e.g. `PurchaseCapacityBlock`.
    pub op: &'static str,
    /// The service's error code, or the kind of client-side failure.
    pub code: String,
    pub message: String,
    /// The HTTP status, when the service answered.
    pub status: Option<u16>,
    /// The service answered with an error (as opposed to no or an unreadable answer).
    pub answered: bool,
}

impl Failure {
    pub fn from_sdk<E>(op: &'static str, err: SdkError<E, HttpResponse>) -> Failure
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        match &err {
            SdkError::ServiceError(se) => Failure {
                op,
                code: se.err().code().unwrap_or("Unknown").to_string(),
                message: se.err().message().unwrap_or_default().to_string(),
                status: Some(se.raw().status().as_u16()),
                answered: true,
            },
            other => {
                let code = match other {
                    SdkError::ConstructionFailure(_) => "ConstructionFailure",
                    SdkError::TimeoutError(_) => "TimeoutError",
                    SdkError::DispatchFailure(_) => "DispatchFailure",
                    _ => "ResponseError",
                };
                Failure {
                    op,
                    code: code.to_string(),
                    // No code or message from a service here: the cause chain is all there is.
                    message: DisplayErrorContext(other).to_string(),
                    status: None,
                    answered: false,
                }
            }
        }
    }

    /// SageMaker's "no such resource": the modeled `ResourceNotFound`, or the unmodeled
    /// `ValidationException` that `DescribeTrainingJob`, `DescribeEndpoint` and
    /// `DeleteEndpoint(Config)` really return.
    pub fn is_not_found(&self) -> bool {
        match self.code.as_str() {
            "ResourceNotFound" | "ResourceNotFoundException" => true,
            "ValidationException" => {
                let m = self.message.to_ascii_lowercase();
                m.contains("not found")
                    || m.contains("could not find")
                    || m.contains("does not exist")
                    || m.contains("cannot find")
            }
            _ => false,
        }
    }

    /// CreateEndpoint's "Could not find endpoint configuration …": the config named is not
    /// visible to it (yet). SageMaker answers it with `ValidationException` while the config
    /// just created is not in its store (botocore `sagemaker` model, CreateEndpoint).
    pub fn is_endpoint_config_not_found(&self) -> bool {
        self.is_not_found()
            && self
                .message
                .to_ascii_lowercase()
                .contains("endpoint configuration")
    }

    /// SageMaker's "that name is taken" (`ResourceInUse`, or `ValidationException` for
    /// endpoints and endpoint configs).
    pub fn is_already_exists(&self) -> bool {
        match self.code.as_str() {
            "ResourceInUse" | "ResourceInUseException" => true,
            "ValidationException" => {
                let m = self.message.to_ascii_lowercase();
                m.contains("already exist")
            }
            _ => false,
        }
    }

    /// The classification of this failure.
    pub fn into_port(self, service: &'static str, call: Call) -> PortError {
        let name_taken = self.is_already_exists();
        let Failure {
            op,
            code,
            message,
            status,
            answered,
        } = self;
        let message = format!("{op}: {message}");
        let c = code.as_str();
        if THROTTLING.contains(&c) {
            return PortError::Throttled {
                service,
                code,
                message,
            };
        }
        if OFFERING_GONE.contains(&c) {
            return PortError::OfferingGone { code, message };
        }
        if DESCRIBE_LIMITS.contains(&c) {
            // Answered, and nothing was done (it limits describes, not purchases).
            return PortError::Transient {
                service,
                code,
                message,
            };
        }
        if call == Call::Purchase {
            // CreateTrainingPlan: the offering id is unknown or sold out ...
            if matches!(c, "ResourceNotFound" | "ResourceNotFoundException") {
                return PortError::OfferingGone { code, message };
            }
            // ... or the deterministic plan name is taken: an earlier attempt bought it.
            // Only reconciliation can say which plan that is. SageMaker says so with the
            // modeled `ResourceInUse` or, as for endpoints, a `ValidationException … already
            // exists` (aws-reference §9.3): either way it is not "nothing was bought".
            if name_taken {
                return PortError::OutcomeUnknown {
                    service,
                    message: format!("{code}: {message}"),
                };
            }
            // The account's limit of instances across Capacity Blocks (review aws-reality-2
            // #6): its code is unpublished, so a message naming it is read too. It frees up as
            // blocks end: no capacity now, not a refusal of the request.
            if BLOCK_LIMIT.contains(&c) || names_block_limit(&message) {
                return PortError::NoCapacity { code, message };
            }
        }
        // A launch AWS refuses for the account or the zone, not for the request (an account
        // limit, a type the zone does not offer: aws-reference §11.3, §11.2) is no capacity
        // there, so the launcher tries its next placement; `workload::refusal` is the one
        // list. A purchase that hits a limit is refused as before.
        if NO_CAPACITY.contains(&c) || (call == Call::Retryable && refusal::is_listed(c)) {
            return PortError::NoCapacity { code, message };
        }
        if call == Call::Retryable && BUSY.contains(&c) {
            return PortError::Transient {
                service,
                code,
                message,
            };
        }
        if c == "ConstructionFailure" {
            // Nothing was sent.
            return PortError::Permanent {
                service,
                code,
                message,
            };
        }
        let server_side = !answered || SERVER.contains(&c) || status.is_some_and(|s| s >= 500);
        if server_side {
            return match call {
                Call::Retryable => PortError::Transient {
                    service,
                    code,
                    message,
                },
                Call::Purchase => PortError::OutcomeUnknown {
                    service,
                    message: format!("{code}: {message}"),
                },
            };
        }
        PortError::Permanent {
            service,
            code,
            message,
        }
    }
}

/// Classifies any SDK failure of `op`.
pub fn classify<E>(
    service: &'static str,
    op: &'static str,
    call: Call,
    err: SdkError<E, HttpResponse>,
) -> PortError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    Failure::from_sdk(op, err).into_port(service, call)
}

/// A response that parsed but lacks what we need, or carries a value we can't read.
pub fn malformed(service: &'static str, op: &'static str, what: impl Into<String>) -> PortError {
    PortError::Permanent {
        service,
        code: "MalformedResponse".to_string(),
        message: format!("{op}: {}", what.into()),
    }
}

pub(crate) fn to_chrono(t: &aws_smithy_types::DateTime) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp(t.secs(), t.subsec_nanos())
}

pub(crate) fn to_smithy(t: DateTime<Utc>) -> aws_smithy_types::DateTime {
    aws_smithy_types::DateTime::from_secs_and_nanos(t.timestamp(), t.timestamp_subsec_nanos())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(code: &str, status: u16) -> Failure {
        Failure {
            op: "Op",
            code: code.into(),
            message: "m".into(),
            status: Some(status),
            answered: true,
        }
    }

    #[test]
    fn a_plan_name_taken_said_as_a_validation_exception_is_an_unknown_outcome_not_a_refusal() {
        // GIVEN CreateTrainingPlan refused because the plan's name exists, in either wording
        for (code, message) in [
            ("ResourceInUse", "Training plan cp-r1 already exists"),
            (
                "ValidationException",
                "Training plan with name cp-r1 already exists",
            ),
        ] {
            let failure = Failure {
                op: "CreateTrainingPlan",
                code: code.into(),
                message: message.into(),
                status: Some(400),
                answered: true,
            };
            // WHEN it is classified as a purchase's failure
            let e = failure.into_port("sagemaker", Call::Purchase);
            // THEN an earlier attempt may have bought it: reconcile, never release the debit
            assert!(
                matches!(e, PortError::OutcomeUnknown { .. }),
                "{code}: {e:?}"
            );
        }
        // AND any other validation failure of a purchase is still a refusal
        let other = Failure {
            op: "CreateTrainingPlan",
            code: "ValidationException".into(),
            message: "1 validation error detected".into(),
            status: Some(400),
            answered: true,
        };
        assert!(matches!(
            other.into_port("sagemaker", Call::Purchase),
            PortError::Permanent { .. }
        ));
    }

    #[test]
    fn the_classification_table_holds() {
        use Call::*;
        let cases: &[(&str, u16, Call, &str)] = &[
            ("RequestLimitExceeded", 503, Purchase, "Throttled"),
            ("ThrottlingException", 400, Retryable, "Throttled"),
            (
                "InvalidCapacityBlockOfferingIdExpired",
                400,
                Purchase,
                "OfferingGone",
            ),
            (
                "InvalidCapacityBlockOfferingIdNotFound",
                400,
                Purchase,
                "OfferingGone",
            ),
            (
                "InvalidCapacityBlockOfferingIdMalformed",
                400,
                Purchase,
                "OfferingGone",
            ),
            ("InsufficientInstanceCapacity", 500, Retryable, "NoCapacity"),
            ("ReservationCapacityExceeded", 400, Retryable, "NoCapacity"),
            // A block not active yet: wait, never fail the paid request (issue 17).
            (
                "InvalidCapacityReservationState.PendingActivation",
                400,
                Retryable,
                "NoCapacity",
            ),
            ("InternalError", 500, Retryable, "Transient"),
            ("InternalError", 500, Purchase, "OutcomeUnknown"),
            ("Whatever", 503, Purchase, "OutcomeUnknown"),
            ("InvalidParameterValue", 400, Purchase, "Permanent"),
            ("ResourceNotFound", 400, Purchase, "OfferingGone"),
            ("ResourceInUse", 400, Purchase, "OutcomeUnknown"),
            ("ResourceInUse", 400, Retryable, "Permanent"),
            ("ResourceLimitExceeded", 400, Purchase, "Permanent"),
            // Limits and a zone without the type: the launcher's next placement (issue 17).
            ("VcpuLimitExceeded", 400, Retryable, "NoCapacity"),
            ("InstanceLimitExceeded", 400, Retryable, "NoCapacity"),
            ("Unsupported", 400, Retryable, "NoCapacity"),
            ("MaxSpotInstanceCountExceeded", 400, Retryable, "NoCapacity"),
            ("ResourceLimitExceeded", 400, Retryable, "NoCapacity"),
            // A cluster Updating: try again later, never fail the request (issue 18).
            ("ConflictException", 400, Retryable, "Transient"),
            // An account's describe limit, not throttling (issue 50, #10).
            (
                "CapacityBlockDescribeLimitExceeded",
                400,
                Retryable,
                "Transient",
            ),
            (
                "InvalidCapacityReservationId.NotFound",
                400,
                Retryable,
                "Permanent",
            ),
        ];
        for (code, status, call, want) in cases {
            let got = f(code, *status).into_port("ec2", *call);
            let name = format!("{got:?}");
            assert!(
                name.starts_with(want),
                "{code}/{status}/{call:?} -> {got:?}"
            );
            if *want != "OutcomeUnknown" {
                assert_eq!(got.code(), Some(*code));
                assert!(got.to_string().contains("Op: m"), "{got}");
            }
        }
    }

    #[test]
    fn a_purchase_past_the_accounts_limit_across_blocks_is_no_capacity_whatever_its_code() {
        // GIVEN a purchase refused for the limit: by the emulator's code, or by an unknown
        // code whose message names it (AWS's code is unpublished)
        let mut by_message = f("SomeUnpublishedCode", 400);
        by_message.message = "You can have up to 256 instances across Capacity Blocks".into();
        for failure in [f("CapacityBlockLimitExceeded", 400), by_message] {
            // WHEN it is classified
            let e = failure.into_port("ec2", Call::Purchase);
            // THEN it is no capacity now (release, search again), not a refusal
            assert!(matches!(e, PortError::NoCapacity { .. }), "{e:?}");
        }
        // AND another refusal is as before
        let e = f("InvalidParameterValue", 400).into_port("ec2", Call::Purchase);
        assert!(matches!(e, PortError::Permanent { .. }), "{e:?}");
    }

    #[test]
    fn the_capacity_block_describe_limit_is_its_own_class_never_a_throttle() {
        // GIVEN EC2's describe limit, in its quota wording and its burst wording
        for message in [
            "Your existing service limits for this AWS account are not sufficient to use EC2 \
             Capacity Blocks",
            "You've reached the limit for this account.",
        ] {
            for call in [Call::Retryable, Call::Purchase] {
                let mut failure = f("CapacityBlockDescribeLimitExceeded", 400);
                failure.message = message.into();
                // WHEN it is classified, for any call
                let e = failure.into_port("ec2", call);
                // THEN it is no throttle (botocore does not class it so, aws-reference
                // §11.1): nothing retries or reports it as one, and its code is kept for the
                // search, the one reader
                assert!(
                    matches!(&e, PortError::Transient { code, .. } if code == "CapacityBlockDescribeLimitExceeded"),
                    "{call:?}: {e:?}"
                );
                assert!(e.to_string().contains(message), "{e}");
            }
        }
    }

    #[test]
    fn sagemaker_not_found_is_read_from_the_validation_message() {
        let mut v = f("ValidationException", 400);
        v.message = "Requested resource not found.".into();
        assert!(v.is_not_found());
        v.message = "Could not find endpoint \"arn:...\".".into();
        assert!(v.is_not_found());
        v.message = "1 validation error detected".into();
        assert!(!v.is_not_found());
        assert!(f("ResourceNotFound", 400).is_not_found());
        let mut e = f("ValidationException", 400);
        e.message = "Cannot create already existing endpoint \"x\".".into();
        assert!(e.is_already_exists());
    }

    #[test]
    fn an_unanswered_purchase_is_outcome_unknown_and_an_unanswered_read_transient() {
        let lost = Failure {
            op: "PurchaseCapacityBlock",
            code: "TimeoutError".into(),
            message: "timed out".into(),
            status: None,
            answered: false,
        };
        assert!(matches!(
            lost.clone().into_port("ec2", Call::Purchase),
            PortError::OutcomeUnknown { .. }
        ));
        assert!(matches!(
            lost.into_port("ec2", Call::Retryable),
            PortError::Transient { .. }
        ));
    }
}
