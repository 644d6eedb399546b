//! The pure core: requests, offerings, the planner, the life cycle, money and time.
//! Nothing here performs I/O, reads the clock or names an AWS SDK type.

pub mod catalog;
pub mod events;
pub mod extension;
pub mod money;
pub mod naming;
pub mod notices;
pub mod offering;
pub mod planner;
pub mod request;
pub mod reservation;
pub mod status;
pub mod time_rules;
pub mod window;
