//! Adapters: AWS SDK clients behind the ports. All SDK <-> domain conversion lives here.

pub mod capacity;
pub mod clock;
pub mod dynamodb;
pub mod ec2;
pub mod error;
pub mod eventbridge;
pub mod hyperpod_update;
pub mod ids;
pub mod regional;
pub mod sagemaker;
pub mod sns;
pub mod wiring;

/// The explicit operation timeout of a purchase call (`PurchaseCapacityBlock`,
/// `CreateTrainingPlan`), SDK retries off (ARCHITECTURE §8.11): a call that has not answered
/// by then is an unknown outcome, reconciled by tag. The purchase lease must outlive the
/// function's timeout plus this plus 5 minutes (a test in purchase-capacity reads both).
pub const PURCHASE_OPERATION_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

#[cfg(test)]
mod adapter_tests;
