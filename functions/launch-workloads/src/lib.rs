//! The launch-workloads Lambda: its handler, kept in a library so it can be tested
//! without the Lambda runtime.

pub mod handler;
