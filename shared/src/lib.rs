//! capacity-pilot: the domain, ports and adapters shared by the Lambda functions.

pub mod domain;
