//! A gate every port call of a simulated invocation passes (the in-memory store's calls, and
//! each HTTP request an SDK client sends through the simulation's in-process connector). The
//! simulation uses it for two faults no port-level fault can express:
//!
//! - **A crash.** An invocation dies at its `n`th call: the call and everything after it never
//!   happen, and the invocation's future is dropped where it stands. Dying *after* call
//!   `n - 1` took effect is the same thing, because nothing but port calls has effects; dying
//!   after the last call is an invocation that did all its work and still failed.
//! - **An interleaving.** Several invocations run at once, and each call first yields, so the
//!   driver (which sets [`Gate::enter`] before polling one) chooses whose call goes next.
//!
//! Nothing here reads a clock or a random source: the driver's choices are the schedule.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

#[derive(Debug, Default)]
struct Slot {
    calls: u32,
    crash_at: Option<u32>,
    /// The call it died at, once it has.
    crashed: Option<String>,
}

#[derive(Debug, Default)]
struct State {
    current: usize,
    slots: Vec<Slot>,
    yielding: bool,
    /// (call name, occurrence): the invocation making that occurrence of the call dies
    /// right after it took effect.
    after: Vec<(String, u32)>,
    /// Occurrences so far of each call named in `after`, across invocations.
    seen: std::collections::BTreeMap<String, u32>,
    /// The last call each slot made.
    last: Vec<Option<String>>,
}

/// Shared by the store and the connectors of one simulated system; clones share it.
#[derive(Debug, Clone, Default)]
pub struct Gate {
    state: Arc<Mutex<State>>,
}

/// A future that is pending once (waking itself), then ready.
struct YieldOnce(bool);

impl Future for YieldOnce {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            Poll::Ready(())
        } else {
            self.0 = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }
}

impl Gate {
    pub fn new() -> Gate {
        Gate::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Arms the gate for invocations run together: invocation `i` dies at its call number
    /// `crash_at[i]` (0-based), if any; with `yielding`, every call yields first.
    pub fn arm(&self, crash_at: &[Option<u32>], yielding: bool) {
        let mut s = self.lock();
        s.current = 0;
        s.yielding = yielding;
        s.slots = crash_at
            .iter()
            .map(|c| Slot {
                crash_at: *c,
                ..Slot::default()
            })
            .collect();
        s.last = vec![None; crash_at.len()];
    }

    /// The invocation making occurrence `nth` (0-based, counted across invocations from now)
    /// of call `what` dies right after that call took effect, before its next one.
    pub fn die_after(&self, what: &str, nth: u32) {
        self.lock().after.push((what.to_string(), nth));
    }

    /// Forgets every [`Gate::die_after`].
    pub fn clear_targets(&self) {
        let mut s = self.lock();
        s.after.clear();
        s.seen.clear();
    }

    /// Disarms it: calls pass freely until the next [`Gate::arm`].
    pub fn disarm(&self) {
        let mut s = self.lock();
        s.slots.clear();
        s.yielding = false;
    }

    /// The driver is about to poll invocation `i`.
    pub fn enter(&self, i: usize) {
        self.lock().current = i;
    }

    /// The invocation being polled: whose call passes now.
    pub fn current(&self) -> usize {
        self.lock().current
    }

    /// The calls invocation `i` has made (not counting the one it died at).
    pub fn calls(&self, i: usize) -> u32 {
        self.lock().slots.get(i).map_or(0, |s| s.calls)
    }

    /// Where invocation `i` died, if it has.
    pub fn crashed(&self, i: usize) -> Option<String> {
        self.lock().slots.get(i).and_then(|s| s.crashed.clone())
    }

    /// The last call invocation `i` made.
    pub fn last(&self, i: usize) -> Option<String> {
        self.lock().last.get(i).cloned().flatten()
    }

    /// Where invocation `i` is set to die, if anywhere.
    pub fn crash_at(&self, i: usize) -> Option<u32> {
        self.lock().slots.get(i).and_then(|s| s.crash_at)
    }

    /// Passed before each port call; `what` names the call.
    pub async fn point(&self, what: &str) {
        if self.lock().yielding {
            YieldOnce(false).await;
        }
        let dies = {
            let mut s = self.lock();
            let s = &mut *s;
            let current = s.current;
            let last = s.last.get(current).cloned().flatten();
            match s.slots.get_mut(current) {
                None => false,
                Some(slot) if slot.crashed.is_some() => true,
                Some(slot) if slot.crash_at == Some(slot.calls) => {
                    slot.crashed = Some(match last {
                        Some(l) => format!("call {} ({what}), right after {l}", slot.calls),
                        None => format!("call {} ({what})", slot.calls),
                    });
                    true
                }
                Some(slot) => {
                    slot.calls += 1;
                    if s.after.iter().any(|(w, _)| w == what) {
                        let n = s.seen.entry(what.to_string()).or_default();
                        if s.after.iter().any(|(w, k)| w == what && k == n) {
                            slot.crash_at = Some(slot.calls);
                        }
                        *n += 1;
                    }
                    if let Some(l) = s.last.get_mut(current) {
                        *l = Some(what.to_string());
                    }
                    false
                }
            }
        };
        if dies {
            std::future::pending::<()>().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_invocation_dies_at_its_call_and_makes_none_after() {
        let gate = Gate::new();
        gate.arm(&[Some(2)], false);
        let g = gate.clone();
        let mut made = Vec::new();
        let run = async {
            for k in 0..5 {
                g.point(&format!("op{k}")).await;
                made.push(k);
            }
        };
        let finished = tokio::time::timeout(std::time::Duration::from_millis(50), run)
            .await
            .is_ok();
        assert!(!finished);
        assert_eq!(made, vec![0, 1]);
        assert_eq!(
            gate.crashed(0).as_deref(),
            Some("call 2 (op2), right after op1")
        );
        assert_eq!(gate.calls(0), 2);
    }

    #[tokio::test]
    async fn an_invocation_making_a_targeted_call_dies_right_after_it() {
        let gate = Gate::new();
        gate.die_after("Buy", 1);
        for (n, dies) in [(0, false), (1, true)] {
            gate.arm(&[None], false);
            let g = gate.clone();
            let run = async {
                g.point("Read").await;
                g.point("Buy").await;
                g.point("Write").await;
            };
            let finished = tokio::time::timeout(std::time::Duration::from_millis(50), run)
                .await
                .is_ok();
            assert_eq!(finished, !dies, "occurrence {n}");
        }
        assert_eq!(
            gate.crashed(0).as_deref(),
            Some("call 2 (Write), right after Buy")
        );
    }

    #[tokio::test]
    async fn a_disarmed_gate_passes_every_call() {
        let gate = Gate::new();
        gate.arm(&[Some(0)], true);
        gate.disarm();
        gate.point("op").await;
        assert_eq!(gate.crashed(0), None);
    }
}
