//! In-memory fakes of every port, for handler unit tests (feature `test-util`).
//!
//! Each fake keeps its state behind one `std::sync::Mutex` in an `Arc`, so a clone handed
//! to the handler and the clone the test keeps see the same world. Nothing reads the wall
//! clock or a random source: ids come from counters, time from the values passed in (or a
//! [`ManualClock`]), so every run is the same.
//!
//! Every fake can be scripted to fail: a queue of [`Fault`]s per operation, consumed one per
//! call. [`Fault::Fail`] returns the error with nothing done; [`Fault::ApplyThenFail`] does
//! the work and then returns the error, which is how a lost response ("it was bought, but we
//! never heard") or a crash right after a commit looks to the caller.

mod clock;
mod events;
pub mod fixtures;
mod gate;
mod market;
mod notices;
mod store;
mod workloads;

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Mutex, MutexGuard};

use crate::ports::PortError;

pub use clock::{FixedClock, ManualClock, StepDeadline};
pub use events::RecordingEvents;
pub use gate::Gate;
pub use market::{FakeMarket, MarketCall, MarketOp};
pub use notices::RecordingNotices;
pub use store::{DEFAULT_RETENTION, DueTimes, InMemoryStore, StoreOp};
pub use workloads::{FakeWorkloads, LaunchKind, WorkloadsCall, WorkloadsOp};

/// The tag that marks what capacity-pilot launched or bought.
pub const MANAGED_TAG: &str = "capacity-pilot:managed";
/// The tag naming the request a resource belongs to.
pub const REQUEST_ID_TAG: &str = "capacity-pilot:request-id";

/// One scripted failure of one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Return the error; nothing happens.
    Fail(PortError),
    /// Do the work, then return the error: a lost response, or a crash after the commit.
    ApplyThenFail(PortError),
}

/// Per-operation queues of scripted faults.
#[derive(Debug)]
pub(crate) struct Faults<Op: Ord> {
    queues: BTreeMap<Op, VecDeque<Fault>>,
}

impl<Op: Ord> Default for Faults<Op> {
    fn default() -> Self {
        Faults {
            queues: BTreeMap::new(),
        }
    }
}

impl<Op: Ord + Copy> Faults<Op> {
    pub(crate) fn push(&mut self, op: Op, fault: Fault) {
        self.queues.entry(op).or_default().push_back(fault);
    }

    pub(crate) fn next(&mut self, op: Op) -> Option<Fault> {
        self.queues.get_mut(&op).and_then(VecDeque::pop_front)
    }

    pub(crate) fn clear(&mut self) {
        self.queues.clear();
    }
}

/// Locks a fake's state. A test that panicked while holding the lock must not turn every
/// later assertion into a poison error, so poisoning is ignored.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Ready-made errors in the shapes the AWS adapters produce.
pub mod errors {
    use crate::ports::PortError;

    pub fn throttled(service: &'static str) -> PortError {
        PortError::Throttled {
            service,
            code: "ThrottlingException".into(),
            message: "Rate exceeded (scripted)".into(),
        }
    }

    pub fn transient(service: &'static str) -> PortError {
        PortError::Transient {
            service,
            code: "InternalError".into(),
            message: "scripted transient failure".into(),
        }
    }

    /// The response was lost: the call may have taken effect.
    pub fn outcome_unknown(service: &'static str) -> PortError {
        PortError::OutcomeUnknown {
            service,
            message: "scripted: the response was lost".into(),
        }
    }

    pub fn offering_gone() -> PortError {
        PortError::OfferingGone {
            code: "InvalidCapacityBlockOfferingId.NotFound".into(),
            message: "scripted: the offering has gone".into(),
        }
    }

    pub fn no_capacity() -> PortError {
        PortError::NoCapacity {
            code: "InsufficientInstanceCapacity".into(),
            message: "scripted: there is no capacity".into(),
        }
    }

    pub fn permanent(
        service: &'static str,
        code: impl Into<String>,
        message: impl Into<String>,
    ) -> PortError {
        PortError::Permanent {
            service,
            code: code.into(),
            message: message.into(),
        }
    }
}
