//! Small shared helpers: AWS timestamp formats, the 11:30 UTC day boundary that Capacity Blocks and
//! training plans are built around, stable hashing for the seeded market, and id generation.

use chrono::{DateTime, NaiveTime, TimeDelta, Utc};

/// EC2's XML timestamp format, e.g. `2026-09-03T11:30:00.000Z`.
pub fn ec2_time(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
}

/// Event envelope time, e.g. `2026-09-03T11:30:00Z`.
pub fn event_time(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// awsJson timestamp: epoch seconds as a JSON number.
pub fn epoch(t: DateTime<Utc>) -> serde_json::Value {
    let ms = t.timestamp_millis();
    if ms % 1000 == 0 {
        serde_json::Value::from(ms / 1000)
    } else {
        serde_json::Value::from(ms as f64 / 1000.0)
    }
}

/// 11:30 UTC, when every Capacity Block and training plan ends.
pub fn end_of_day_time() -> NaiveTime {
    NaiveTime::from_hms_opt(11, 30, 0).expect("valid time")
}

/// The market's day index: day `d` runs from 11:30 UTC on calendar day `d` to 11:30 the next day.
pub fn market_day(t: DateTime<Utc>) -> i64 {
    (t - TimeDelta::minutes(11 * 60 + 30))
        .timestamp()
        .div_euclid(86_400)
}

/// The 11:30 UTC instant that starts market day `d`.
pub fn day_start(d: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(d * 86_400 + (11 * 60 + 30) * 60, 0).expect("in range")
}

/// The first 11:30 UTC strictly after `t`.
pub fn next_1130_after(t: DateTime<Utc>) -> DateTime<Utc> {
    day_start(market_day(t) + 1)
}

/// FNV-1a over the parts, so the seeded market is identical on every platform and Rust version.
pub fn stable_hash(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for b in part.as_bytes().iter().chain(std::iter::once(&0x1f)) {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    // final avalanche (splitmix64) so neighbouring keys differ in every bit
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// `prefix` + 17 lowercase hex digits derived from the parts, e.g. `cb-0a1b2c3d4e5f60718`.
pub fn hex_id(prefix: &str, parts: &[&str]) -> String {
    let h = stable_hash(parts);
    let h2 = stable_hash(&[&h.to_string(), "second"]);
    let hex = format!("{h:016x}{h2:016x}");
    format!("{prefix}{}", &hex[..17])
}

/// Rounds a `Duration` down to whole minutes (durations on the wire are hours + minutes).
pub fn minutes(d: TimeDelta) -> i64 {
    d.num_minutes()
}
