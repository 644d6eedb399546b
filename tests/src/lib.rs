//! The integration-test harness: a real DynamoDB (moto's server, single-threaded, started
//! from `.venv`), a fresh table per test created from `infra/template.yaml`, and fixtures.
//!
//! Clients are built with the production constructor (`aws_config::defaults(..)
//! .endpoint_url(url)`); nothing here sets environment variables.

pub mod fixtures;
pub mod flow;
pub mod iam;
pub mod in_process;
pub mod moto;
pub mod reads;
pub mod recorder;
pub mod table;

pub use moto::Moto;
pub use table::TestTable;
