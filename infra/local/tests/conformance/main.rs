//! Conformance tests: the real AWS SDK clients against an in-process local-cloud, one emulator
//! per test, each with its own simulated clock. One binary, because linking the SDKs dominates.

mod cloudformation_sts;
mod control;
mod ec2_blocks;
mod ec2_instances;
mod ec2_launch_templates;
mod eventbridge;
mod extensions_api;
mod extensions_by_hand;
mod faults;
mod helpers;
mod logs;
mod properties;
mod refusals;
mod sagemaker_endpoints;
mod sagemaker_hyperpod;
mod sagemaker_plans;
mod sagemaker_tags;
mod sns;
