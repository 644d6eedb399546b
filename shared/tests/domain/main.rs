//! The domain's behaviour, tested from the outside: request validation, the planner
//! against a brute-force oracle, and the example events under `infra/events/`.

mod examples;
mod generated;
mod planner_oracle;
mod samples;
mod schemas;
mod validation;
mod windows;
