//! Property tests of the window model (ARCHITECTURE §8.4): plan-like reservations (a split's
//! blocks, a multi-segment plan, a replacement block bought later and possibly starting
//! first), with whatever states were stored, at whatever time it is.
//!
//! The expectations are written from the model's documentation, not from its code: which
//! reservations hold windows, when a window is due in each state, when it may be launched
//! into, and how its cleanup goes.

use std::collections::BTreeSet;

use capacity_pilot::domain::money::Usd;
use capacity_pilot::domain::offering::{Product, Segment, TargetResource};
use capacity_pilot::domain::reservation::{Reservation, ReservationState};
use capacity_pilot::domain::status::RequestStatus;
use capacity_pilot::domain::time_rules::{WindowKind, forced_termination_lead};
use capacity_pilot::domain::window::{
    self, DrainLead, Window, WindowRecord, WindowState, window_key,
};
use chrono::{DateTime, Duration, TimeZone, Utc};
use proptest::prelude::*;

/// Day 0 of the generated timeline: every segment starts and ends at 11:30 UTC.
fn day0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 1, 11, 30, 0).unwrap()
}

/// When the records were written (before any segment starts).
fn recorded_at() -> DateTime<Utc> {
    day0() - Duration::hours(6)
}

const STATES: [WindowState; 6] = WindowState::ALL;

const UNDRAINED: [WindowState; 3] = [
    WindowState::Pending,
    WindowState::Launching,
    WindowState::Running,
];

/// AWS's states that leave a reservation without capacity (the model's "unusable").
fn unusable(s: ReservationState) -> bool {
    matches!(
        s,
        ReservationState::PaymentFailed
            | ReservationState::Failed
            | ReservationState::Cancelled
            | ReservationState::Unavailable
    )
}

fn kind_of(product: Product, ultraserver: bool) -> WindowKind {
    match product {
        Product::TrainingPlan {
            target: TargetResource::TrainingJob,
        } => WindowKind::TrainingJobPlan,
        Product::TrainingPlan {
            target: TargetResource::HyperpodCluster,
        } => WindowKind::HyperPodPlan,
        Product::TrainingPlan {
            target: TargetResource::Endpoint,
        } => WindowKind::EndpointPlan,
        _ if ultraserver => WindowKind::UltraServerBlock,
        _ => WindowKind::CapacityBlock,
    }
}

fn product_strategy() -> impl Strategy<Value = (Product, bool)> {
    prop_oneof![
        3 => Just((Product::CapacityBlock, false)),
        1 => Just((Product::CapacityBlock, true)),
        1 => Just((Product::TrainingPlan { target: TargetResource::TrainingJob }, false)),
        1 => Just((Product::TrainingPlan { target: TargetResource::HyperpodCluster }, false)),
        1 => Just((Product::TrainingPlan { target: TargetResource::Endpoint }, false)),
    ]
}

fn reservation_state_strategy() -> impl Strategy<Value = ReservationState> {
    prop_oneof![
        3 => Just(ReservationState::Scheduled),
        2 => Just(ReservationState::Active),
        2 => Just(ReservationState::PaymentPending),
        1 => Just(ReservationState::Expired),
        1 => Just(ReservationState::Unknown),
        1 => Just(ReservationState::PaymentFailed),
        1 => Just(ReservationState::Failed),
        1 => Just(ReservationState::Cancelled),
        1 => Just(ReservationState::Unavailable),
    ]
}

fn window_state_strategy() -> impl Strategy<Value = WindowState> {
    proptest::sample::select(STATES.to_vec())
}

fn drain_strategy() -> impl Strategy<Value = DrainLead> {
    (0u32..=120, 0u32..=60).prop_map(|(requested_minutes, default_minutes)| DrainLead {
        requested_minutes,
        default_minutes,
    })
}

/// 1–4 Capacity Block or training-plan reservations whose segments are whole days ending
/// 11:30 UTC and never overlap. The segments are laid out along one timeline (gaps of 0–3
/// days, so some touch), then dealt to the reservations in a random order: a plan's
/// segments may be interleaved with other blocks, and any reservation may start first.
fn reservations_strategy() -> impl Strategy<Value = Vec<Reservation>> {
    proptest::collection::vec(
        (product_strategy(), 1usize..=3, reservation_state_strategy()),
        1..=4,
    )
    .prop_flat_map(|specs| {
        let counts: Vec<usize> = specs
            .iter()
            .map(|((p, _), n, _)| match p {
                Product::CapacityBlock => 1,
                _ => *n,
            })
            .collect();
        let total: usize = counts.iter().sum();
        (
            Just(specs),
            Just(counts),
            proptest::collection::vec((0i64..=3, 1i64..=3), total),
            Just((0..total).collect::<Vec<usize>>()).prop_shuffle(),
        )
    })
    .prop_map(|(specs, counts, slots, order)| {
        let mut segments = Vec::new();
        let mut t = day0();
        for (gap, len) in slots {
            let start = t + Duration::days(gap);
            let end = start + Duration::days(len);
            segments.push(Segment {
                start,
                end,
                availability_zone: None,
            });
            t = end;
        }
        let mut dealt = 0;
        specs
            .into_iter()
            .zip(counts)
            .enumerate()
            .map(|(i, (((product, ultraserver), _, state), count))| {
                let mut segs: Vec<Segment> = order[dealt..dealt + count]
                    .iter()
                    .map(|&k| segments[k].clone())
                    .collect();
                dealt += count;
                segs.sort_by_key(|s| s.start);
                let id = match product {
                    Product::CapacityBlock => format!("cr-{i:017}"),
                    _ => format!("arn:aws:sagemaker:us-east-1:123456789012:training-plan/tp-{i}"),
                };
                Reservation {
                    id,
                    product,
                    region: "us-east-1".into(),
                    instance_type: "p5.48xlarge".into(),
                    instance_count: 2,
                    segments: segs,
                    upfront_fee: Usd::new(rust_decimal::Decimal::new(100 + i as i64, 0)),
                    state,
                    offering_id: None,
                    request_tag: None,
                    ultraserver,
                    bought_at: None,
                    debit_month: None,
                    debit_team: None,
                    payment_check_at: None,
                    extensions: Vec::new(),
                    extension_check_at: None,
                    deployment_tag: None,
                }
            })
            .collect()
    })
}

/// The records a store holds after recording the first `recorded` reservations one by one
/// (as `record_reservation` does, each just bought, so payment-pending: AWS may report
/// another state later, a failed payment say), each window then moved to the state
/// `states` gives it.
fn stored_records(
    reservations: &[Reservation],
    recorded: usize,
    states: &[WindowState],
    drain: DrainLead,
) -> Vec<WindowRecord> {
    let recorded = recorded.min(reservations.len());
    let reservations: Vec<Reservation> = reservations
        .iter()
        .map(|r| Reservation {
            state: ReservationState::PaymentPending,
            ..r.clone()
        })
        .collect();
    let mut records = Vec::new();
    for j in 0..recorded {
        records = window::all_records(&reservations[..=j], &records, recorded_at());
    }
    let keys: Vec<String> = records.iter().map(|r| r.key.clone()).collect();
    for (k, key) in keys.iter().enumerate() {
        let ws = window::windows(&reservations[..recorded], &records, drain);
        let state = states[k % states.len()];
        records = window::records_with(&records, &ws, key, state, recorded_at());
    }
    records
}

/// Reservations, how many of them have been recorded, the stored window states, a drain
/// lead and a "now" anywhere from before the first segment to after the last.
#[derive(Debug, Clone)]
struct Case {
    reservations: Vec<Reservation>,
    records: Vec<WindowRecord>,
    drain: DrainLead,
    now: DateTime<Utc>,
}

fn case_strategy() -> impl Strategy<Value = Case> {
    (
        reservations_strategy(),
        0usize..=4,
        proptest::collection::vec(window_state_strategy(), 12),
        drain_strategy(),
        -2 * 24 * 60i64..=40 * 24 * 60,
    )
        .prop_map(|(reservations, recorded, states, drain, minutes)| Case {
            records: stored_records(&reservations, recorded, &states, drain),
            reservations,
            drain,
            now: day0() + Duration::minutes(minutes),
        })
}

fn time_strategy() -> impl Strategy<Value = DateTime<Utc>> {
    (0i64..=60 * 24 * 60).prop_map(|m| day0() + Duration::minutes(m))
}

/// Records as anything may have stored them: any state, any next action.
fn arbitrary_records() -> impl Strategy<Value = Vec<WindowRecord>> {
    proptest::collection::vec(
        (
            window_state_strategy(),
            proptest::option::weighted(0.7, time_strategy()),
        ),
        0..=8,
    )
    .prop_map(|v| {
        v.into_iter()
            .enumerate()
            .map(|(i, (state, next_action_at))| WindowRecord {
                key: format!("cr-{i}#0"),
                number: i as u32,
                state,
                next_action_at,
                updated_at: recorded_at(),
                notices: None,
                relaunch: None,
            })
            .collect()
    })
}

fn find<'a>(ws: &'a [Window], key: &str) -> Option<&'a Window> {
    ws.iter().find(|w| w.key == key)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, .. ProptestConfig::default() })]

    #[test]
    fn windows_come_out_in_start_order_without_overlap_one_per_segment_of_a_usable_reservation_with_unique_numbers(
        case in case_strategy()
    ) {
        let ws = window::windows(&case.reservations, &case.records, case.drain);

        // In start order, and never overlapping.
        for pair in ws.windows(2) {
            prop_assert!(pair[0].start() <= pair[1].start(), "{:?} before {:?}", pair[0].key, pair[1].key);
            prop_assert!(pair[0].end() <= pair[1].start(), "{:?} overlaps {:?}", pair[0].key, pair[1].key);
        }

        // One per segment of every usable reservation, and of an unusable one only while a
        // recorded window of it is still under way.
        let mut expected = BTreeSet::new();
        for r in &case.reservations {
            for i in 0..r.segments.len() {
                let key = window_key(&r.id, i);
                let under_way = case
                    .records
                    .iter()
                    .any(|w| w.key == key && w.state != WindowState::Ended);
                if !unusable(r.state) || under_way {
                    expected.insert(key);
                }
            }
        }
        let got: BTreeSet<String> = ws.iter().map(|w| w.key.clone()).collect();
        prop_assert_eq!(got.len(), ws.len(), "a key twice");
        prop_assert_eq!(&got, &expected);

        // Each window is its reservation's segment, with the recorded state and number.
        for w in &ws {
            prop_assert_eq!(&w.segment, &w.reservation.segments[w.segment_index]);
            prop_assert_eq!(&w.key, &window_key(&w.reservation.id, w.segment_index));
            prop_assert_eq!(w.last_of_reservation, w.segment_index + 1 == w.reservation.segments.len());
            let kind = kind_of(w.reservation.product, w.reservation.ultraserver);
            let lead = forced_termination_lead(kind);
            let drain = Duration::minutes(i64::from(
                case.drain.requested_minutes.max(case.drain.default_minutes),
            ));
            prop_assert_eq!(w.forced_at, w.end() - lead);
            prop_assert_eq!(w.drain_at, w.end() - lead - drain);
            match case.records.iter().find(|r| r.key == w.key) {
                Some(r) => {
                    prop_assert_eq!(w.number, r.number);
                    prop_assert_eq!(w.state, r.state);
                }
                None => prop_assert_eq!(w.state, WindowState::Pending),
            }
        }

        // Numbers unique among the windows and every number ever given (a dropped
        // reservation's ended windows keep theirs).
        let mut numbers: Vec<u32> = ws.iter().map(|w| w.number).collect();
        numbers.extend(
            case.records
                .iter()
                .filter(|r| find(&ws, &r.key).is_none())
                .map(|r| r.number),
        );
        let unique: BTreeSet<u32> = numbers.iter().copied().collect();
        prop_assert_eq!(unique.len(), numbers.len(), "numbers {:?}", numbers);
    }

    #[test]
    fn a_replacement_never_renumbers_the_windows_recorded_before_it_and_its_own_come_after_them(
        reservations in reservations_strategy(),
        pick in any::<proptest::sample::Index>(),
        states in proptest::collection::vec(window_state_strategy(), 12),
        drain in drain_strategy(),
    ) {
        // GIVEN every reservation but one recorded, in any states; the one left out (which
        // may start before, between or after the others) is the replacement
        let idx = pick.index(reservations.len());
        let replacement = reservations[idx].clone();
        let mut held: Vec<Reservation> = reservations
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != idx)
            .map(|(_, r)| r.clone())
            .collect();
        let before = stored_records(&held, held.len(), &states, drain);

        // WHEN it is recorded, as the store does (appended to what the request holds)
        held.push(replacement.clone());
        let after = window::all_records(&held, &before, recorded_at() + Duration::hours(1));

        // THEN every earlier record is unchanged, number and state
        for old in &before {
            let now = after.iter().find(|r| r.key == old.key);
            prop_assert_eq!(now, Some(old), "{} changed", &old.key);
        }
        // and the replacement's windows are numbered above all of them, in start order
        let floor = before.iter().map(|r| r.number + 1).max().unwrap_or(0);
        let new: Vec<&WindowRecord> = after
            .iter()
            .filter(|r| !before.iter().any(|o| o.key == r.key))
            .collect();
        let expected_new = if unusable(replacement.state) { 0 } else { replacement.segments.len() };
        prop_assert_eq!(new.len(), expected_new);
        for r in &new {
            prop_assert!(r.key.starts_with(&format!("{}#", replacement.id)), "{}", &r.key);
            prop_assert!(r.number >= floor, "{} numbered {} below {}", &r.key, r.number, floor);
            prop_assert_eq!(r.state, WindowState::Pending);
        }
        let mut by_start: Vec<(DateTime<Utc>, u32)> = new
            .iter()
            .map(|r| {
                let i: usize = r.key.rsplit('#').next().unwrap().parse().unwrap();
                (replacement.segments[i].start, r.number)
            })
            .collect();
        by_start.sort();
        prop_assert!(by_start.windows(2).all(|p| p[0].1 < p[1].1), "{:?}", by_start);
        let all: BTreeSet<u32> = after.iter().map(|r| r.number).collect();
        prop_assert_eq!(all.len(), after.len(), "a number given twice");

        // and the derived windows carry exactly these numbers
        let ws = window::windows(&held, &after, drain);
        for w in &ws {
            let r = after.iter().find(|r| r.key == w.key);
            prop_assert_eq!(r.map(|r| r.number), Some(w.number), "{}", &w.key);
        }
    }

    #[test]
    fn a_request_is_due_at_the_earliest_of_its_own_next_action_and_its_windows(
        own in proptest::option::of(time_strategy()),
        records in arbitrary_records(),
    ) {
        let got = window::next_action_at(own, &records);

        let mut expected = own;
        for r in &records {
            // A window's lead-time notices are due beside its own action (ARCHITECTURE §9.2).
            for t in [r.next_action_at, r.notice_due()].into_iter().flatten() {
                expected = Some(match expected {
                    Some(e) if e <= t => e,
                    _ => t,
                });
            }
        }
        prop_assert_eq!(got, expected);
        let all_none = own.is_none()
            && records.iter().all(|r| r.next_action_at.is_none() && r.notice_due().is_none());
        prop_assert_eq!(got.is_none(), all_none);
        if let Some(g) = got {
            prop_assert!(own.is_none_or(|o| g <= o));
            prop_assert!(records.iter().filter_map(|r| r.next_action_at).all(|t| g <= t));
        }
        // What launch and cleanup act on is the windows' own actions alone.
        prop_assert_eq!(
            window::window_action_at(&records),
            records.iter().filter_map(|r| r.next_action_at).min()
        );
    }

    #[test]
    fn a_windows_record_is_due_at_its_start_its_drain_start_its_end_or_never_by_state(
        case in case_strategy()
    ) {
        let ws = window::windows(&case.reservations, &case.records, case.drain);
        for w in &ws {
            for state in STATES {
                let r = w.record(state, case.now);
                let expected = match state {
                    WindowState::Pending | WindowState::Launching => Some(w.start()),
                    WindowState::Running => Some(w.drain_at),
                    // A drain begun and not finished is owed at once.
                    WindowState::Stopping => Some(w.start()),
                    WindowState::Draining => Some(w.end()),
                    WindowState::Ended => None,
                };
                prop_assert_eq!(r.next_action_at, expected, "{} {}", &w.key, state);
                prop_assert_eq!(
                    (&r.key, r.number, r.state, r.updated_at),
                    (&w.key, w.number, state, case.now)
                );
            }
        }
        // The request built from these records is due at their earliest next action.
        let records: Vec<WindowRecord> = ws.iter().map(|w| w.record(w.state, case.now)).collect();
        let earliest = ws.iter().filter_map(|w| w.next_action_in(w.state)).min();
        prop_assert_eq!(window::window_action_at(&records), earliest);
        // (and with their lead-time notices, never looked at here, due at once)
        let notices = records.iter().filter_map(WindowRecord::notice_due).min();
        prop_assert_eq!(
            window::next_action_at(None, &records),
            earliest.into_iter().chain(notices).min()
        );
    }

    #[test]
    fn a_window_is_never_launchable_before_its_start_or_once_its_drain_has_started(
        case in case_strategy()
    ) {
        let ws = window::windows(&case.reservations, &case.records, case.drain);
        for w in &ws {
            let launchable = w.is_launchable(case.now);
            if case.now >= w.drain_at {
                prop_assert!(!launchable, "{} launchable at {} past its drain {}", &w.key, case.now, w.drain_at);
            }
            if case.now < w.start() {
                prop_assert!(!launchable, "{} launchable at {} before its start", &w.key, case.now);
            }
            // ... and never into a reservation that cannot be used (its payment failed).
            prop_assert_eq!(
                launchable,
                !unusable(w.reservation.state)
                    && matches!(w.state, WindowState::Pending | WindowState::Launching)
                    && w.start() <= case.now
                    && case.now < w.drain_at,
                "{} {}", &w.key, w.state
            );
            // A window past its end is never launchable, whatever it was stored as.
            for state in STATES {
                let mut past = w.clone();
                past.state = state;
                prop_assert!(!past.is_launchable(w.end()));
                prop_assert!(!past.is_launchable(w.drain_at));
                prop_assert!(!past.is_launchable(w.start() - Duration::minutes(1)));
            }
        }
    }

    #[test]
    fn a_windows_cleanup_runs_exactly_once_drain_then_end_whatever_undrained_state_it_was_left_in(
        case in case_strategy(),
        pick in any::<proptest::sample::Index>(),
        from in proptest::sample::select(UNDRAINED.to_vec()),
        late_minutes in 0i64..=10 * 24 * 60,
        warned in any::<bool>(),
    ) {
        let ws = window::windows(&case.reservations, &case.records, case.drain);
        prop_assume!(!ws.is_empty());
        let w0 = &ws[pick.index(ws.len())];
        let key = w0.key.clone();
        let number = w0.number;
        let now = w0.end() + Duration::minutes(late_minutes);

        // GIVEN the window left undrained (a crash, a missed tick), and its request's records
        let mut records = window::records_with(&case.records, &ws, &key, from, recorded_at());
        let mut ws = window::windows(&case.reservations, &records, case.drain);
        prop_assert_eq!(find(&ws, &key).map(|w| w.state), Some(from));

        // WHEN cleanup steps run until none applies (bounded, so a loop shows as a failure)
        let mut steps = Vec::new();
        while steps.len() < 5 {
            let Some(w) = find(&ws, &key) else { break };
            let to = if w.needs_drain(now, warned) {
                WindowState::Draining
            } else if w.needs_end(now) {
                WindowState::Ended
            } else {
                break;
            };
            steps.push(to);
            records = window::records_with(&records, &ws, &key, to, now);
            ws = window::windows(&case.reservations, &records, case.drain);
        }

        // THEN it took exactly the drain and the end, kept its number, and nothing is left
        // to do for it, now or ever after, warned or not
        prop_assert_eq!(&steps, &vec![WindowState::Draining, WindowState::Ended]);
        let rec = records.iter().find(|r| r.key == key).unwrap();
        prop_assert_eq!((rec.state, rec.number, rec.next_action_at), (WindowState::Ended, number, None));
        if let Some(w) = find(&ws, &key) {
            prop_assert_eq!(w.number, number);
            for later in [now, now + Duration::days(1), now + Duration::days(30)] {
                for warned in [false, true] {
                    prop_assert!(!w.needs_drain(later, warned));
                }
                prop_assert!(!w.needs_end(later));
                prop_assert!(!w.is_launchable(later));
            }
        } else {
            // Only an unusable reservation's ended window is dropped.
            let r = case.reservations.iter().find(|r| key.starts_with(&format!("{}#", r.id))).unwrap();
            prop_assert!(unusable(r.state), "{} vanished", &key);
        }
        // The other windows' records are untouched by its cleanup.
        for r in &case.records {
            if r.key != key {
                prop_assert_eq!(records.iter().find(|x| x.key == r.key), Some(r));
            }
        }
    }

    #[test]
    fn the_summary_is_active_iff_a_window_runs_and_ended_iff_all_have_ended(
        states in proptest::collection::vec(window_state_strategy(), 0..=8),
    ) {
        let records: Vec<WindowRecord> = states
            .iter()
            .enumerate()
            .map(|(i, &state)| WindowRecord {
                key: format!("cr-{i}#0"),
                number: i as u32,
                state,
                next_action_at: None,
                updated_at: recorded_at(),
                notices: None,
                relaunch: None,
            })
            .collect();
        let s = window::summary(&records);
        let running = states.contains(&WindowState::Running);
        let all_ended = !states.is_empty() && states.iter().all(|&x| x == WindowState::Ended);

        prop_assert_eq!(s == Some(RequestStatus::Active), running, "{:?} -> {:?}", &states, s);
        prop_assert_eq!(s == Some(RequestStatus::Ended), all_ended, "{:?} -> {:?}", &states, s);
        prop_assert_eq!(s.is_none(), states.is_empty());
        if let Some(s) = s {
            prop_assert!(
                window::FOLLOWS_WINDOWS.contains(&s) || s == RequestStatus::Ended,
                "{:?} -> {:?}", &states, s
            );
        }
    }
}
