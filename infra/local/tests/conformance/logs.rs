//! CloudWatch Logs metric-filter patterns (`local_cloud::logs`): the examples of AWS's "Filter
//! and pattern syntax" page (JSON log events), matched and not matched as the page says, and
//! the forms outside the evaluated subset refused
//! (https://docs.aws.amazon.com/AmazonCloudWatch/latest/logs/FilterAndPatternSyntax.html).

use local_cloud::logs::{matches, parse};
use serde_json::{Value, json};

/// The page's first JSON example.
fn trail() -> Value {
    json!({
        "eventType": "UpdateTrail",
        "sourceIPAddress": "111.111.111.111",
        "arrayKey": ["value", "another value"],
        "objectList": [{"name": "a", "id": 1}, {"name": "b", "id": 2}],
        "SomeObject": null,
        "ThisFlag": true
    })
}

/// The page's example for compound conditions.
fn users() -> Value {
    json!({
        "user": {"id": 1, "email": "John.Stiles@example.com"},
        "users": [
            {"id": 2, "email": "John.Doe@example.com"},
            {"id": 3, "email": "Jane.Doe@example.com"}
        ],
        "actions": ["GET", "PUT", "DELETE"],
        "coordinates": [[0, 1, 2], [4, 5, 6], [7, 8, 9]]
    })
}

#[test]
fn the_documented_json_filters_match_the_documented_event() {
    let e = trail();
    for pattern in [
        r#"{ $.eventType = "UpdateTrail" }"#,
        r#"{ $.sourceIPAddress != 123.123.* }"#,
        r#"{ $.arrayKey[0] = "value" }"#,
        r#"{ $.objectList[1].id = 2 }"#,
        r#"{ $.SomeObject IS NULL }"#,
        r#"{ $.SomeOtherObject NOT EXISTS }"#,
        r#"{ $.ThisFlag IS TRUE }"#,
    ] {
        assert!(matches(pattern, &e).unwrap(), "{pattern} should match");
    }
    // "This also works for boolean filters which check for FALSE value."
    assert!(!matches(r#"{ $.ThisFlag IS FALSE }"#, &e).unwrap());
    // "If arrayKey is not an array this will be false."
    assert!(!matches(r#"{ $.eventType[0] = "value" }"#, &e).unwrap());
    assert!(!matches(r#"{ $.SomeObject NOT EXISTS }"#, &e).unwrap());
}

#[test]
fn compound_conditions_follow_the_documented_precedence() {
    let e = users();
    let cases = [
        (
            r#"{ ($.user.id = 1) && ($.users[0].email = "John.Doe@example.com") }"#,
            true,
        ),
        (
            r#"{ ($.user.id = 2 && $.users[0].email = "nonmatch") || $.actions[2] = "GET" }"#,
            false,
        ),
        (
            r#"{ $.user.email = "John.Stiles@example.com" || $.coordinates[0][1] = nonmatch && $.actions[2] = nomatch }"#,
            true,
        ),
        (
            r#"{ ($.user.email = "John.Stiles@example.com" || $.coordinates[0][1] = nonmatch) && $.actions[2] = nomatch }"#,
            false,
        ),
    ];
    for (pattern, want) in cases {
        assert_eq!(matches(pattern, &e).unwrap(), want, "{pattern}");
    }
}

#[test]
fn a_selector_on_an_array_or_object_matches_neither_equal_nor_unequal() {
    // "both {$.users = 1} and {$.users != 1} will fail to match a log event where users is
    // an array"
    let e = json!({"users": [1, 2, 3]});
    assert!(!matches("{ $.users = 1 }", &e).unwrap());
    assert!(!matches("{ $.users != 1 }", &e).unwrap());
}

#[test]
fn numeric_comparisons_take_the_documented_number_forms() {
    let e = json!({"latency": 1500, "numbers": [0.001], "errorCode": 400,
                   "processes": [0, 1, 2, 3, {"averageRuntime": 55.5}]});
    for pattern in [
        "{ $.latency >= 500 }",
        "{ $.numbers[0] < 10e3 }",
        "{ $.numbers[0] < 10e-2 }",
        "{ $.processes[4].averageRuntime <= 55.5 }",
        "{ $.errorCode = 400 }",
        "{ $.errorCode != 500 }",
        "{ $.latency > +1000 }",
    ] {
        assert!(matches(pattern, &e).unwrap(), "{pattern} should match");
    }
    assert!(!matches("{ $.numbers[0] < 10e-4 }", &e).unwrap());
    assert!(!matches("{ $.latency < 500 }", &e).unwrap());
}

#[test]
fn wildcards_match_at_before_or_after_a_term_and_a_star_inside_is_itself() {
    // "*Event will match PutEvent and GetEvent. Event* will match EventId and EventName.
    // Ev*ent will only match the actual string Ev*ent."
    for (value, pattern, want) in [
        ("PutEvent", "*Event", true),
        ("GetEvent", "*Event", true),
        ("EventId", "Event*", true),
        ("EventName", "Event*", true),
        ("Event", "Ev*ent", false),
        ("Ev*ent", "Ev*ent", true),
    ] {
        let e = json!({"eventName": value});
        let p = format!("{{ $.eventName = {pattern} }}");
        assert_eq!(matches(&p, &e).unwrap(), want, "{p} on {value}");
    }
    // `$.latency = *`: any value, as the page's metric-value example extracts latency.
    assert!(matches("{ $.latency = * }", &json!({"latency": 12})).unwrap());
}

#[test]
fn property_selectors_take_hyphens_and_underscores() {
    // "Property selectors are alphanumeric strings that also support '-' and '_' characters."
    let e = json!({"detail-type": "Capacity Reserved", "detail": {"request_id": "r-1"}});
    assert!(matches(r#"{ $.detail-type = "Capacity Reserved" }"#, &e).unwrap());
    assert!(matches(r#"{ $.detail.request_id = "r-1" }"#, &e).unwrap());
    // Metric filters are case sensitive.
    assert!(!matches(r#"{ $.detail-type = "capacity reserved" }"#, &e).unwrap());
}

#[test]
fn forms_outside_the_evaluated_subset_are_refused() {
    for pattern in [
        "ERROR",
        r#""Failed to process the request""#,
        "?ERROR ?WARN",
        "[ip, user, username, timestamp, request, status_code = 4*, bytes]",
        r#"{ $.['detail-type'] = "x" }"#,
        r#"{ $.eventType = %Update.*% }"#,
        r#"{ $.eventType IS true }"#,
    ] {
        assert!(parse(pattern).is_err(), "{pattern} should be refused");
    }
}
