//! capacity-pilot: the domain, ports and adapters shared by the Lambda functions.

pub mod aws;
pub mod config;
pub mod decision;
pub mod domain;
pub mod ids;
pub mod lambda;
pub mod outbox;
pub mod ports;
pub mod purchase;
pub mod search;
pub mod workload;

#[cfg(feature = "test-util")]
pub mod fakes;
