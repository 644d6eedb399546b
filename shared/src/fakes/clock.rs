//! Clocks a test controls: a time that never moves, and one the test sets and steps.

use std::sync::{Arc, Mutex};

use chrono::{DateTime, Duration, Utc};

use super::lock;
use crate::ports::{Clock, Deadline, PortError};

/// Always the same instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedClock(pub DateTime<Utc>);

impl FixedClock {
    pub fn at(t: DateTime<Utc>) -> FixedClock {
        FixedClock(t)
    }
}

impl Clock for FixedClock {
    async fn now(&self) -> Result<DateTime<Utc>, PortError> {
        Ok(self.0)
    }
}

#[derive(Debug)]
struct ManualState {
    now: DateTime<Utc>,
    /// Added after every read, so successive reads are strictly ordered when wanted.
    step: Duration,
}

/// A time the test sets and advances; clones share it.
#[derive(Debug, Clone)]
pub struct ManualClock {
    state: Arc<Mutex<ManualState>>,
}

impl ManualClock {
    pub fn new(start: DateTime<Utc>) -> ManualClock {
        ManualClock {
            state: Arc::new(Mutex::new(ManualState {
                now: start,
                step: Duration::zero(),
            })),
        }
    }

    /// Every `now()` returns the current time and then moves it on by `step`.
    pub fn with_step(self, step: Duration) -> ManualClock {
        lock(&self.state).step = step;
        self
    }

    /// The current time, without stepping.
    pub fn get(&self) -> DateTime<Utc> {
        lock(&self.state).now
    }

    pub fn set(&self, t: DateTime<Utc>) {
        lock(&self.state).now = t;
    }

    /// Moves the time on (or back, with a negative duration) and returns the new time.
    pub fn advance(&self, by: Duration) -> DateTime<Utc> {
        let mut s = lock(&self.state);
        s.now += by;
        s.now
    }
}

impl Clock for ManualClock {
    async fn now(&self) -> Result<DateTime<Utc>, PortError> {
        let mut s = lock(&self.state);
        let (now, step) = (s.now, s.step);
        s.now += step;
        Ok(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn t0() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 12, 1, 9, 0, 0).unwrap()
    }

    #[tokio::test]
    async fn a_fixed_clock_never_moves() {
        let clock = FixedClock::at(t0());
        assert_eq!(clock.now().await.unwrap(), t0());
        assert_eq!(clock.now().await.unwrap(), t0());
    }

    #[tokio::test]
    async fn a_manual_clock_moves_only_when_told_and_its_clones_see_the_same_time() {
        // GIVEN a manual clock and a clone of it
        let clock = ManualClock::new(t0());
        let seen_by_handler = clock.clone();
        assert_eq!(seen_by_handler.now().await.unwrap(), t0());

        // WHEN the test advances and then sets it
        clock.advance(Duration::minutes(5));
        // THEN the clone sees the new time
        assert_eq!(
            seen_by_handler.now().await.unwrap(),
            t0() + Duration::minutes(5)
        );
        clock.set(t0() + Duration::days(1));
        assert_eq!(seen_by_handler.get(), t0() + Duration::days(1));
    }

    #[tokio::test]
    async fn a_stepping_clock_advances_after_every_read() {
        let clock = ManualClock::new(t0()).with_step(Duration::seconds(1));
        assert_eq!(clock.now().await.unwrap(), t0());
        assert_eq!(clock.now().await.unwrap(), t0() + Duration::seconds(1));
        assert_eq!(clock.get(), t0() + Duration::seconds(2));
    }
}

/// A deadline that loses `step` at every look, so the time a call takes (measured by looking
/// before and after it) is `step`, without a wall clock; clones share it.
#[derive(Debug, Clone)]
pub struct StepDeadline {
    left: Arc<Mutex<std::time::Duration>>,
    step: std::time::Duration,
}

impl StepDeadline {
    pub fn new(left: std::time::Duration, step: std::time::Duration) -> StepDeadline {
        StepDeadline {
            left: Arc::new(Mutex::new(left)),
            step,
        }
    }

    /// Plenty of time: one hour, losing nothing.
    pub fn plenty() -> StepDeadline {
        StepDeadline::new(
            std::time::Duration::from_secs(3600),
            std::time::Duration::ZERO,
        )
    }
}

impl Deadline for StepDeadline {
    fn remaining(&self) -> std::time::Duration {
        let mut left = lock(&self.left);
        let now = *left;
        *left = left.saturating_sub(self.step);
        now
    }
}
