use chrono::{Duration, TimeZone};

use super::*;
use crate::domain::events::Whose;
use crate::domain::money::Usd;
use crate::domain::offering::{Product, Segment};
use crate::domain::reservation::{Reservation, ReservationState};
use crate::domain::window::{DrainLead, WindowRecord, windows};

/// The window opens Thursday 2026-12-10 11:30 UTC, ends Saturday 12-12 11:30; with a 15 min
/// drain lead and a block's 30 min forced termination its drain starts 10:45 on the 12th.
fn opens() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 10, 11, 30, 0).unwrap()
}

fn block(bought: DateTime<Utc>) -> Reservation {
    Reservation {
        id: "cr-0abc".into(),
        product: Product::CapacityBlock,
        region: "us-east-1".into(),
        instance_type: "p5.48xlarge".into(),
        instance_count: 2,
        segments: vec![Segment {
            start: opens(),
            end: opens() + Duration::days(2),
            availability_zone: None,
        }],
        upfront_fee: Usd::new(rust_decimal::Decimal::new(166_099, 2)),
        state: ReservationState::Scheduled,
        offering_id: None,
        request_tag: None,
        ultraserver: false,
        bought_at: Some(bought),
        debit_month: None,
        debit_team: None,
        payment_check_at: None,
        extensions: Vec::new(),
        extension_check_at: None,
        deployment_tag: None,
    }
}

fn window(state: WindowState, marks: Option<NoticeMarks>) -> Window {
    let r = block(opens() - Duration::days(3));
    let record = WindowRecord {
        key: crate::domain::window::window_key(&r.id, 0),
        number: 0,
        state,
        next_action_at: Some(opens()),
        updated_at: opens() - Duration::days(3),
        notices: marks,
        relaunch: None,
    };
    windows(
        &[r],
        &[record],
        DrainLead {
            requested_minutes: 0,
            default_minutes: 15,
        },
    )
    .remove(0)
}

fn keys(sent: &[(Lead, bool)]) -> Vec<(String, bool)> {
    sent.iter().map(|(l, late)| (l.key(), *late)).collect()
}

#[test]
fn the_drain_of_the_test_window_starts_45_minutes_before_its_end() {
    let w = window(WindowState::Pending, None);
    assert_eq!(
        w.drain_at,
        opens() + Duration::days(2) - Duration::minutes(45)
    );
}

#[test]
fn each_lead_is_due_at_its_moment_and_sent_once_on_time() {
    let leads = Leads::default();
    let bought = opens() - Duration::days(3);
    // GIVEN a window bought 3 days ahead, looked at just after the purchase
    let w = window(WindowState::Pending, None);
    let first = plan_leads(&w, &leads, bought, bought + Duration::minutes(1));
    // THEN nothing is due yet, and the next is the 24 h Opening notice
    assert!(first.send.is_empty() && first.skipped.is_empty());
    assert_eq!(first.marks.next_at, Some(opens() - Duration::hours(24)));
    // WHEN its moment comes
    let w = window(WindowState::Pending, Some(first.marks));
    let at = opens() - Duration::hours(24);
    let second = plan_leads(&w, &leads, bought, at);
    // THEN it is sent, on time, and the 1 h one is next
    assert_eq!(
        keys(&second.send),
        vec![("opening-1440m".to_string(), false)]
    );
    assert_eq!(second.marks.next_at, Some(opens() - Duration::hours(1)));
    // AND looking again at the same moment sends nothing more
    let w = window(WindowState::Pending, Some(second.marks.clone()));
    let again = plan_leads(&w, &leads, bought, at);
    assert!(again.send.is_empty());
    assert_eq!(again.marks, second.marks);
    assert!(!again.changes(Some(&second.marks)));
}

#[test]
fn the_ending_notices_come_24_h_13_h_and_1_h_before_the_drain_the_last_a_checkpoint() {
    let leads = Leads::default();
    let bought = opens() - Duration::days(3);
    let drain = opens() + Duration::days(2) - Duration::minutes(45);
    let mut marks = Some(NoticeMarks {
        done: vec!["opening-1440m".into(), "opening-60m".into()],
        next_at: None,
        ..NoticeMarks::default()
    });
    let mut sent = Vec::new();
    for lead in [24 * 60, 13 * 60, 60] {
        let w = window(WindowState::Running, marks.clone());
        let at = drain - Duration::minutes(lead);
        let p = plan_leads(&w, &leads, bought, at);
        assert_eq!(p.send.len(), 1, "at the {lead} min moment");
        sent.push(p.send[0].0.key());
        marks = Some(p.marks);
    }
    assert_eq!(sent, ["ending-1440m", "ending-780m", "ending-60m"]);
    assert_eq!(marks.unwrap().next_at, None, "nothing left to send");
    // AND the event of the last says checkpoint, with the times of the drain and the end
    let w = window(WindowState::Running, None);
    let whose = Whose {
        request_id: "r1",
        created_at: bought,
    };
    let ev = lead_event(
        whose,
        "ml-eval",
        &w,
        Lead {
            kind: LeadKind::Ending,
            minutes: 60,
        },
        false,
        Some(60),
        None,
    );
    assert_eq!(ev.detail_type, "Capacity Reservation Ending");
    assert_eq!(ev.detail["checkpoint"], true);
    assert_eq!(ev.detail["extendable"], false);
    assert_eq!(ev.detail["lead_minutes"], 60);
    assert_eq!(ev.detail["drain_at"], "2026-12-12T10:45:00Z");
    assert_eq!(ev.detail["ends_at"], "2026-12-12T11:30:00Z");
    let n = ev.notice.expect("told");
    assert_eq!(n.team.as_deref(), Some("ml-eval"));
    assert!(n.subject.contains("checkpoint now"), "{}", n.subject);
    assert!(n.body.contains("Checkpoint now"), "{}", n.body);
}

#[test]
fn a_lead_whose_moment_came_before_the_purchase_is_not_due_and_produces_nothing() {
    // GIVEN a window opening in 3 hours, bought now
    let bought = opens() - Duration::hours(3);
    let w = window(WindowState::Pending, None);
    let p = plan_leads(&w, &Leads::default(), bought, bought);
    // THEN the 24 h Opening notice is not sent, late or otherwise, nor recorded as skipped
    assert!(p.send.is_empty(), "{:?}", p.send);
    assert!(p.skipped.is_empty(), "{:?}", p.skipped);
    assert!(p.marks.done.contains(&"opening-1440m".to_string()));
    // AND the 1 h one is next
    assert_eq!(p.marks.next_at, Some(opens() - Duration::hours(1)));
}

#[test]
fn a_lead_passed_while_down_is_sent_late_and_only_the_shortest_of_a_kind() {
    let bought = opens() - Duration::days(3);
    // GIVEN the function down from before the 24 h moment until 40 min before the opening
    let w = window(
        WindowState::Pending,
        Some(NoticeMarks {
            done: vec![],
            next_at: Some(opens() - Duration::hours(24)),
            ..NoticeMarks::default()
        }),
    );
    let now = opens() - Duration::minutes(40);
    let p = plan_leads(&w, &Leads::default(), bought, now);
    // THEN the 1 h notice goes, late, and the 24 h one is skipped in its favour, recorded
    assert_eq!(keys(&p.send), vec![("opening-60m".to_string(), true)]);
    assert_eq!(p.skipped.len(), 1);
    assert!(
        p.skipped[0]
            .1
            .contains("the 1 h Window Opening notice of window 0 is sent in its place"),
        "{}",
        p.skipped[0].1
    );
    // AND a notice within LATE_AFTER of its moment is not late
    let p = plan_leads(
        &w,
        &Leads::default(),
        bought,
        opens() - Duration::minutes(55),
    );
    assert_eq!(keys(&p.send), vec![("opening-60m".to_string(), false)]);
}

#[test]
fn a_lead_whose_news_already_happened_is_skipped_and_recorded_not_sent() {
    let bought = opens() - Duration::days(3);
    // GIVEN the window opened (and launched) while the notices were held up
    let w = window(
        WindowState::Running,
        Some(NoticeMarks {
            done: vec![],
            next_at: Some(opens() - Duration::hours(24)),
            ..NoticeMarks::default()
        }),
    );
    let p = plan_leads(
        &w,
        &Leads::default(),
        bought,
        opens() + Duration::minutes(5),
    );
    // THEN no Opening notice is sent; both are recorded as skipped, saying why
    assert!(p.send.is_empty(), "{:?}", p.send);
    assert_eq!(p.skipped.len(), 2);
    assert!(
        p.skipped
            .iter()
            .all(|(_, why)| why.contains("of window 0 was not sent: the window opened at"))
    );
    // AND the Ending notices are still ahead
    assert_eq!(
        p.marks.next_at,
        Some(w.drain_at - Duration::hours(24)),
        "{:?}",
        p.marks
    );
}

#[test]
fn a_window_stopped_early_skips_its_ending_notices_and_an_ended_one_is_never_due() {
    let bought = opens() - Duration::days(3);
    let w = window(
        WindowState::Stopping,
        Some(NoticeMarks {
            done: vec!["opening-1440m".into(), "opening-60m".into()],
            next_at: Some(opens() + Duration::hours(10)),
            ..NoticeMarks::default()
        }),
    );
    let p = plan_leads(&w, &Leads::default(), bought, opens() + Duration::hours(10));
    assert!(p.send.is_empty());
    assert_eq!(p.skipped.len(), 3);
    assert_eq!(p.marks.next_at, None);
    let ended = WindowRecord {
        key: "cr-0abc#0".into(),
        number: 0,
        state: WindowState::Ended,
        next_action_at: None,
        updated_at: opens(),
        notices: None,
        relaunch: None,
    };
    assert_eq!(ended.notice_due(), None);
}

#[test]
fn a_window_never_looked_at_is_due_at_once() {
    let r = WindowRecord {
        key: "cr-0abc#0".into(),
        number: 0,
        state: WindowState::Pending,
        next_action_at: Some(opens()),
        updated_at: opens() - Duration::days(3),
        notices: None,
        relaunch: None,
    };
    assert_eq!(r.notice_due(), Some(opens() - Duration::days(3)));
    assert_eq!(
        crate::domain::window::next_action_at(None, std::slice::from_ref(&r)),
        Some(opens() - Duration::days(3)),
        "the work index holds it then"
    );
    assert_eq!(
        crate::domain::window::window_action_at(std::slice::from_ref(&r)),
        Some(opens()),
        "launch is not woken for a notice"
    );
}

#[test]
fn leads_read_as_whole_minutes_up_to_7_days_longest_first() {
    assert_eq!(Leads::parse_list("60, 1440").unwrap(), vec![1440, 60]);
    assert_eq!(Leads::parse_list("").unwrap(), Vec::<u32>::new());
    assert!(Leads::parse_list("0").is_err());
    assert!(Leads::parse_list("10081").is_err());
    assert!(Leads::parse_list("1h").is_err());
}

#[test]
fn a_subject_is_one_ascii_line_of_at_most_100_characters() {
    let s = subject_line(&format!("r1 \u{2014} window\nopens {}", "x".repeat(200)));
    assert!(s.len() <= MAX_SUBJECT_CHARS, "{}", s.len());
    assert!(s.is_ascii() && !s.contains('\n'));
    assert!(s.ends_with("..."));
    assert_eq!(subject_line("  "), "capacity-pilot notice");
}

#[test]
fn a_notice_carries_the_filter_attributes_and_a_drain_on_time_is_not_told() {
    let drained = |late| crate::domain::events::WorkloadDrained {
        event_key: "r1:drained:v9".into(),
        request_id: "r1".into(),
        reservation_id: "cr-0abc".into(),
        segment: 0,
        resource_ids: vec!["i-1".into()],
        drained_at: opens(),
        forced_termination_at: opens(),
        late,
        reason: "the drain start was reached".into(),
    };
    assert!(announced(Some("ml-eval"), &drained(false)).notice.is_none());
    let n = announced(Some("ml-eval"), &drained(true))
        .notice
        .expect("a late drain is told");
    assert_eq!(
        n.attributes(),
        vec![
            ("team", "ml-eval"),
            ("detail_type", "Capacity Workload Drained"),
            ("request_id", "r1"),
        ]
    );
    assert!(n.body.contains("r1:drained:v9"), "the footer names the key");
}

/// ARCHITECTURE §9.3: when AWS moves the end, the Ending notices count down to the new one
/// under keys of their own; a lead whose moment came before the move is not due (the
/// Extended notice told of the new end), and the Opening marks stand.
#[test]
fn ending_notices_follow_an_end_that_moved_under_keys_that_carry_it() {
    let leads = Leads::default();
    let bought = opens() - Duration::days(3);
    let drain = opens() + Duration::days(2) - Duration::minutes(45);
    let whose = Whose {
        request_id: "r1",
        created_at: bought,
    };
    // GIVEN the 24 h Ending notice was sent for the old end
    let marks = NoticeMarks {
        done: vec![
            "ending-1440m".into(),
            "opening-1440m".into(),
            "opening-60m".into(),
        ],
        next_at: Some(drain - Duration::hours(13)),
        end_moved_at: None,
    };
    let old = window(WindowState::Running, Some(marks.clone()));
    let old_key = lead_key(
        whose,
        &old,
        Lead {
            kind: LeadKind::Ending,
            minutes: 60,
        },
    );
    assert!(
        old_key.ends_with(":ending-60m:ends-20261212T1130Z:c1796643000"),
        "{old_key}"
    );
    // WHEN AWS reports the end 10 h later, 2 h before the old drain
    let moved_at = drain - Duration::hours(2);
    let mut r = block(bought);
    r.segments[0].end += Duration::hours(10);
    let record = WindowRecord {
        key: crate::domain::window::window_key(&r.id, 0),
        number: 0,
        state: WindowState::Running,
        next_action_at: None,
        updated_at: bought,
        notices: Some(marks.end_moved(moved_at)),
        relaunch: None,
    };
    let w = windows(
        &[r],
        &[record],
        DrainLead {
            requested_minutes: 0,
            default_minutes: 15,
        },
    )
    .remove(0);
    let p = plan_leads(&w, &leads, bought, moved_at);
    // THEN the 24 h and 13 h leads of the new end, passed before the move, are not due, and
    // nothing is sent or skipped for them; the 1 h one is next, 1 h before the new drain
    assert!(p.send.is_empty() && p.skipped.is_empty(), "{p:?}");
    assert!(p.marks.done.contains(&"ending-1440m".to_string()));
    assert!(p.marks.done.contains(&"ending-780m".to_string()));
    assert!(p.marks.done.contains(&"opening-60m".to_string()));
    assert_eq!(p.marks.next_at, Some(w.drain_at - Duration::hours(1)));
    assert_eq!(w.drain_at, drain + Duration::hours(10));
    // AND it goes at its moment under a key naming the new end
    let at = w.drain_at - Duration::hours(1);
    let w2 = Window {
        notices: Some(p.marks),
        ..w
    };
    let sent = plan_leads(&w2, &leads, bought, at);
    assert_eq!(keys(&sent.send), vec![("ending-60m".to_string(), false)]);
    let new_key = lead_key(whose, &w2, sent.send[0].0);
    assert!(new_key.contains(":ends-20261212T2130Z:"), "{new_key}");
    assert_ne!(new_key, old_key);
}
