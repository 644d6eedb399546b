//! The local EventBridge: the emulator records every event (AWS's own on the default bus of the
//! region where it happens, the functions' `PutEvents` on the custom bus); this forwards the
//! events of each other allowed region's default bus that `infra/region-forwarder.yaml`'s
//! rules match to the home region's default bus (ARCHITECTURE §8.9), hands each new event of
//! the home region's buses to the functions whose rules in the template match it, and builds
//! the `Scheduled Event`s of the template's `Schedule` rules on the simulated clock. It also
//! says which of the template's log groups a rule writes each event to (the event log). The
//! wiring is `crate::rules` (no second copy).

use chrono::{DateTime, TimeDelta, Utc};
use serde_json::{Value, json};

use crate::LocalCloud;
use crate::rules::{Bus, Rules};
use crate::util::event_time;

/// A new event on a bus, the functions its rules reach and the log groups (logical ids) its
/// rules write it to.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub bus: Bus,
    pub event: Value,
    pub targets: Vec<String>,
    pub log_groups: Vec<String>,
}

/// One other region's default bus, forwarded by the forwarder's rules.
struct Remote {
    region: String,
    seen: usize,
    forwarded: usize,
}

pub struct LocalBus {
    pub rules: Rules,
    /// The custom bus's name (what `EVENT_BUS_NAME` says).
    pub custom: String,
    /// The home region: where the functions run and their buses are.
    pub region: String,
    pub account_id: String,
    /// The region forwarder's rules (`infra/region-forwarder.yaml`), deployed to each region
    /// of `remotes`.
    forwarder: Option<Rules>,
    remotes: Vec<Remote>,
    seen_default: usize,
    seen_custom: usize,
    ticks: u64,
}

impl LocalBus {
    pub fn new(rules: Rules, custom: &str, region: &str, account_id: &str) -> LocalBus {
        LocalBus {
            rules,
            custom: custom.to_string(),
            region: region.to_string(),
            account_id: account_id.to_string(),
            forwarder: None,
            remotes: Vec::new(),
            seen_default: 0,
            seen_custom: 0,
            ticks: 0,
        }
    }

    /// Deploys the region forwarder's `rules` to each of `regions` (the home region is
    /// skipped: its events would arrive twice).
    pub fn with_forwarder(mut self, rules: Rules, regions: &[String]) -> LocalBus {
        self.remotes = regions
            .iter()
            .filter(|r| **r != self.region)
            .map(|r| Remote {
                region: r.clone(),
                seen: 0,
                forwarded: 0,
            })
            .collect();
        self.forwarder = Some(rules);
        self
    }

    /// Each region the forwarder is deployed to: (region, events seen on its default bus,
    /// events forwarded from it).
    pub fn forwarded_counts(&self) -> Vec<(String, usize, usize)> {
        self.remotes
            .iter()
            .map(|r| (r.region.clone(), r.seen, r.forwarded))
            .collect()
    }

    /// Puts every new event of each forwarded region's default bus that a forwarder rule
    /// matches on the home region's default bus, unchanged (its `region` stays its own);
    /// returns how many. An event no rule matches stays where it is.
    pub fn forward(&mut self, cloud: &LocalCloud) -> usize {
        let Some(forwarder) = &self.forwarder else {
            return 0;
        };
        let home = self.region.clone();
        let mut n = 0;
        for remote in &mut self.remotes {
            let events = events_since(cloud, &remote.region, "default", remote.seen);
            remote.seen += events.len();
            let matched: Vec<Value> = events
                .into_iter()
                .filter(|e| !forwarder.forwarding(Bus::Default, e).is_empty())
                .collect();
            n += matched.len();
            remote.forwarded += matched.len();
            if !matched.is_empty() {
                cloud.with_world(|w| {
                    for e in matched {
                        w.record(&home, "default", e);
                    }
                });
            }
        }
        n
    }

    /// Every event recorded on either home bus since the last call (other regions' forwarded
    /// first), AWS's first, each with the functions it reaches (possibly none).
    pub fn take_new(&mut self, cloud: &LocalCloud) -> Vec<Delivery> {
        self.forward(cloud);
        let default = events_since(cloud, &self.region, "default", self.seen_default);
        let custom = events_since(cloud, &self.region, &self.custom, self.seen_custom);
        let mut out = Vec::new();
        for (bus, events, seen) in [
            (Bus::Default, default, &mut self.seen_default),
            (Bus::Custom, custom, &mut self.seen_custom),
        ] {
            for event in events {
                *seen += 1;
                let targets = self.rules.functions_for(bus, &event);
                let log_groups = self.rules.log_groups_for(bus, &event);
                out.push(Delivery {
                    bus,
                    event,
                    targets,
                    log_groups,
                });
            }
        }
        out
    }

    /// Each schedule: (function, rate).
    pub fn schedules(&self) -> Vec<(String, TimeDelta)> {
        self.rules
            .schedules()
            .into_iter()
            .map(|(f, every)| (f.to_string(), every))
            .collect()
    }

    /// The standard `Scheduled Event` envelope a schedule rule delivers at `at`.
    pub fn scheduled_event(&mut self, function: &str, at: DateTime<Utc>) -> Value {
        self.ticks += 1;
        json!({
            "version": "0",
            "id": uuid::Uuid::new_v4().to_string(),
            "detail-type": "Scheduled Event",
            "source": "aws.events",
            "account": self.account_id,
            "time": event_time(at),
            "region": self.region,
            "resources": [format!("arn:aws:events:{}:{}:rule/{function}-schedule", self.region, self.account_id)],
            "detail": {}
        })
    }
}

/// The events recorded on `bus` of `region` after the first `seen` (a copy of those only).
pub fn events_since(cloud: &LocalCloud, region: &str, bus: &str, seen: usize) -> Vec<Value> {
    cloud.with_world(|w| {
        w.events(region, bus)
            .get(seen..)
            .map(<[Value]>::to_vec)
            .unwrap_or_default()
    })
}

/// How many events `bus` of `region` has recorded.
pub fn event_count(cloud: &LocalCloud, region: &str, bus: &str) -> usize {
    cloud.with_world(|w| w.events(region, bus).len())
}

/// The first tick of a `every` schedule strictly after `after` (ticks sit on multiples of
/// `every` since the epoch, as `rate()` rules tick at a fixed phase).
pub fn next_tick(after: DateTime<Utc>, every: TimeDelta) -> DateTime<Utc> {
    let step = every.num_seconds().max(1);
    let t = after.timestamp();
    let next = (t.div_euclid(step) + 1) * step;
    DateTime::from_timestamp(next, 0).unwrap_or(after)
}

/// The first tick at or after `at`.
pub fn tick_at_or_after(at: DateTime<Utc>, every: TimeDelta) -> DateTime<Utc> {
    next_tick(at - TimeDelta::nanoseconds(1), every)
}

/// Whether `at` is a tick of an `every` schedule.
pub fn is_tick(at: DateTime<Utc>, every: TimeDelta) -> bool {
    at.timestamp_subsec_nanos() == 0 && at.timestamp().rem_euclid(every.num_seconds().max(1)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    #[test]
    fn ticks_sit_on_the_schedule_grid() {
        let five = TimeDelta::minutes(5);
        assert_eq!(
            next_tick(t("2026-12-01T09:00:00Z"), five),
            t("2026-12-01T09:05:00Z")
        );
        assert_eq!(
            next_tick(t("2026-12-01T09:03:10Z"), five),
            t("2026-12-01T09:05:00Z")
        );
        assert_eq!(
            tick_at_or_after(t("2026-12-01T09:05:00Z"), five),
            t("2026-12-01T09:05:00Z")
        );
        assert_eq!(
            tick_at_or_after(t("2026-12-01T09:05:01Z"), five),
            t("2026-12-01T09:10:00Z")
        );
        assert!(is_tick(t("2026-12-01T09:05:00Z"), five));
        assert!(!is_tick(t("2026-12-01T09:06:00Z"), five));
        assert!(is_tick(t("2026-12-01T09:06:00Z"), TimeDelta::minutes(1)));
    }
}
