//! Adapters: AWS SDK clients behind the ports. All SDK <-> domain conversion lives here.

pub mod capacity;
pub mod clock;
pub mod dynamodb;
pub mod ec2;
pub mod error;
pub mod eventbridge;
pub mod regional;
pub mod sagemaker;
pub mod wiring;

#[cfg(test)]
mod adapter_tests;
