//! What the run prints: a timeline line per event and decision as it happens, then a summary
//! per request and per function, and the checks.

use std::fmt::Write as _;

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde_json::Value;

use super::checks::{Observed, short, time};
use super::{InvocationRecord, RunResult, bus_label};
use crate::rules::Bus;

/// One line of the timeline.
#[derive(Debug, Clone)]
pub struct Line {
    pub at: DateTime<Utc>,
    /// `scenario`, a bus name, or a function name.
    pub who: String,
    pub what: String,
    pub request_id: Option<String>,
}

/// The timeline, printed as it grows when `print` is set.
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    pub lines: Vec<Line>,
    print: bool,
}

impl Timeline {
    pub fn new(print: bool) -> Timeline {
        Timeline {
            lines: Vec::new(),
            print,
        }
    }

    fn push(&mut self, line: Line) {
        if self.print {
            println!(
                "{}  {:<18} {}",
                line.at.format("%Y-%m-%d %H:%M:%S"),
                line.who,
                line.what
            );
        }
        self.lines.push(line);
    }

    pub fn action(&mut self, at: DateTime<Utc>, what: &str) {
        self.push(Line {
            at,
            who: "scenario".into(),
            what: what.to_string(),
            request_id: None,
        });
    }

    pub fn event(&mut self, at: DateTime<Utc>, bus: Bus, ev: &Value, targets: &[String]) {
        let to = if targets.is_empty() {
            String::new()
        } else {
            format!("  -> {}", targets.join(", "))
        };
        self.push(Line {
            at,
            who: format!("bus:{}", bus_label(bus)),
            what: format!("{}{to}", describe_event(ev)),
            request_id: ev["detail"]["request_id"].as_str().map(str::to_string),
        });
    }

    pub fn invocation(&mut self, inv: &InvocationRecord) {
        if let Some(e) = &inv.error {
            self.push(Line {
                at: inv.at,
                who: inv.function.clone(),
                what: format!("FAILED on {}: {}", inv.trigger, e),
                request_id: None,
            });
        }
        for d in &inv.decisions {
            let id = d["request_id"].as_str().unwrap_or("?");
            self.push(Line {
                at: inv.at,
                who: inv.function.clone(),
                what: format!(
                    "[{}] {id}: {} - {}",
                    inv.trigger,
                    d["action"].as_str().unwrap_or("?"),
                    d["reason"].as_str().unwrap_or("")
                ),
                request_id: Some(id.to_string()),
            });
        }
    }
}

/// One line about an event: its type and the facts that matter, money included.
pub fn describe_event(ev: &Value) -> String {
    let dt = ev["detail-type"].as_str().unwrap_or("?");
    let d = &ev["detail"];
    let s = |k: &str| d[k].as_str().unwrap_or("").to_string();
    let list = |k: &str| {
        d[k].as_array()
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(short)
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .unwrap_or_default()
    };
    let id = s("request_id");
    let facts = match dt {
        "Capacity Request Submitted" => format!(
            "{} x{} {} for {} h, {} ({})",
            d["instance_types"]
                .as_array()
                .map(|a| a
                    .iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join("|"))
                .unwrap_or_default(),
            d["instance_count"],
            d["workload"]["kind"].as_str().unwrap_or("?"),
            d["duration_hours"],
            d["strategy"].as_str().unwrap_or("reserve"),
            ev["source"].as_str().unwrap_or("")
        ),
        "Capacity Reserved" => format!(
            "{} x{} {} {} {} -> {}: fee ${} (on-demand ${}, saving ${})",
            d["product"]["product"].as_str().unwrap_or("?"),
            d["instance_count"],
            s("instance_type"),
            list("reservation_ids"),
            s("start"),
            s("end"),
            s("upfront_fee_usd"),
            s("on_demand_cost_usd"),
            s("saving_usd")
        ),
        "Capacity Offerings Found" => format!(
            "{} plan(s), best fee ${}",
            d["plans"].as_array().map_or(0, Vec::len),
            d["plans"][0]["upfront_fee_usd"].as_str().unwrap_or("?")
        ),
        "Capacity Request Rejected" => format!(
            "fields: {}",
            d["problems"]
                .as_array()
                .map(|a| a
                    .iter()
                    .filter_map(|p| p["field"].as_str())
                    .collect::<Vec<_>>()
                    .join(", "))
                .unwrap_or_default()
        ),
        "Capacity Workload Launched" => format!(
            "{} in {} segment {}",
            list("resource_ids"),
            short(&s("reservation_id")),
            d["segment"]
        ),
        "Capacity Instance Replaced" => format!(
            "{} -> {} ({})",
            s("replaced_instance_id"),
            s("new_instance_id"),
            s("reason")
        ),
        "Capacity Reservation Expiring" => format!(
            "drain from {}, AWS terminates at {}",
            s("drain_starts_at"),
            s("forced_termination_at")
        ),
        "Capacity Workload Drained" => format!(
            "{} (forced at {})",
            list("resource_ids"),
            s("forced_termination_at")
        ),
        "Capacity Reservation Ended" => {
            format!("{} spent ${}", list("reservation_ids"), s("spent_usd"))
        }
        "Capacity Request Failed" => s("reason"),
        "EC2 Instance State-change Notification" => format!("{} {}", s("instance-id"), s("state")),
        _ => {
            let cr = s("capacity-reservation-id");
            if cr.is_empty() { String::new() } else { cr }
        }
    };
    let id = if id.is_empty() {
        String::new()
    } else {
        format!(" {id}")
    };
    format!("{dt}{id}: {facts}")
}

/// One request, summed up from the buses and the emulator.
#[derive(Debug, Clone)]
pub struct RequestSummary {
    pub request_id: String,
    pub team: String,
    pub outcome: String,
    pub bought: String,
    pub fee: Option<Decimal>,
    pub on_demand: Option<Decimal>,
    pub saving: Option<Decimal>,
    pub planned_start: Option<DateTime<Utc>>,
    pub actual_start: Option<DateTime<Utc>>,
    pub replacements: usize,
    pub drained: Option<DateTime<Utc>>,
    pub ended: Option<DateTime<Utc>>,
}

pub fn summarize(o: &Observed) -> Vec<RequestSummary> {
    let mut out = Vec::new();
    for (id, detail) in o.scenario.requests() {
        let first = |dt: &str| o.ours(&id, dt).first().map(|e| (*e).clone());
        let reserved = first("Capacity Reserved");
        let money = |k: &str| {
            reserved
                .as_ref()
                .and_then(|r| r["detail"][k].as_str()?.parse::<Decimal>().ok())
        };
        let last_of = |dt: &str| {
            [
                "Capacity Reservation Ended",
                "Capacity Request Failed",
                "Capacity Request Rejected",
                "Capacity Workload Drained",
                "Capacity Instance Replaced",
                "Capacity Workload Launched",
                "Capacity Reserved",
                "Capacity Not Found",
                "Capacity Offerings Found",
                "Capacity Request Accepted",
            ]
            .into_iter()
            .find(|t| !o.ours(&id, t).is_empty())
            .unwrap_or(dt)
            .trim_start_matches("Capacity ")
            .to_string()
        };
        let bought = reserved
            .as_ref()
            .map(|r| {
                let d = &r["detail"];
                format!(
                    "{} {}x {} {}",
                    d["product"]["product"].as_str().unwrap_or("?"),
                    d["instance_count"],
                    d["instance_type"].as_str().unwrap_or("?"),
                    d["region"].as_str().unwrap_or("")
                )
            })
            .unwrap_or_else(|| "-".into());
        out.push(RequestSummary {
            team: detail["team"].as_str().unwrap_or("?").to_string(),
            outcome: last_of("(nothing)"),
            bought,
            fee: money("upfront_fee_usd"),
            on_demand: money("on_demand_cost_usd"),
            saving: money("saving_usd"),
            planned_start: reserved.as_ref().and_then(|r| time(&r["detail"]["start"])),
            actual_start: first("Capacity Workload Launched").and_then(|l| time(&l["time"])),
            replacements: o.ours(&id, "Capacity Instance Replaced").len(),
            drained: first("Capacity Workload Drained").and_then(|l| time(&l["time"])),
            ended: first("Capacity Reservation Ended").and_then(|l| time(&l["time"])),
            request_id: id,
        });
    }
    out
}

fn t(v: Option<DateTime<Utc>>) -> String {
    v.map_or("-".into(), |t| t.format("%m-%d %H:%M").to_string())
}

fn usd(v: Option<Decimal>) -> String {
    v.map_or("-".into(), |d| format!("${d}"))
}

/// The summary tables and the checks, as text.
pub fn render(r: &RunResult) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "\n== {}: requests ==", r.scenario.name);
    let _ = writeln!(
        s,
        "{:<24} {:<7} {:<17} {:<36} {:>10} {:>10} {:>10} {:>11} {:>11} {:>5} {:>11} {:>11}",
        "request",
        "team",
        "outcome",
        "bought",
        "fee",
        "on-demand",
        "saving",
        "planned",
        "started",
        "repl",
        "drained",
        "ended"
    );
    for q in &r.summary {
        let _ = writeln!(
            s,
            "{:<24} {:<7} {:<17} {:<36} {:>10} {:>10} {:>10} {:>11} {:>11} {:>5} {:>11} {:>11}",
            q.request_id,
            q.team,
            q.outcome,
            q.bought,
            usd(q.fee),
            usd(q.on_demand),
            usd(q.saving),
            t(q.planned_start),
            t(q.actual_start),
            q.replacements,
            t(q.drained),
            t(q.ended)
        );
    }
    let _ = writeln!(s, "\n== functions (real binaries under the Lambda host) ==");
    let _ = writeln!(
        s,
        "{:<18} {:>6} {:>9} {:>8} {:>7} {:>13} {:>10} {:>10}",
        "function", "memory", "init ms", "invokes", "errors", "peak RSS MiB", "max ms", "mean ms"
    );
    for f in &r.functions {
        let mean = if f.invocations > 0 {
            f.total_duration.as_secs_f64() * 1000.0 / f.invocations as f64
        } else {
            0.0
        };
        let _ = writeln!(
            s,
            "{:<18} {:>6} {:>9} {:>8} {:>7} {:>13.1} {:>10} {:>10.1}",
            f.name,
            f.memory_mb,
            f.init.as_millis(),
            f.invocations,
            f.errors,
            f.peak_rss_kb as f64 / 1024.0,
            f.max_duration.as_millis(),
            mean
        );
    }
    let _ = writeln!(
        s,
        "{} invocations, {} clock steps, {:.1} s wall; logs in {}",
        r.invocations.len(),
        r.steps,
        r.wall.as_secs_f64(),
        r.out_dir.join("logs").display()
    );
    let _ = writeln!(s, "\n== checks ==");
    for c in &r.checks {
        let _ = writeln!(
            s,
            "{} {:<48} {:<22} {}",
            if c.passed { "PASS" } else { "FAIL" },
            c.name,
            c.subject,
            c.detail
        );
    }
    let failed = r.checks.iter().filter(|c| !c.passed).count();
    let _ = writeln!(
        s,
        "{} of {} checks passed{}",
        r.checks.len() - failed,
        r.checks.len(),
        if failed > 0 {
            format!("; {failed} FAILED")
        } else {
            String::new()
        }
    );
    s
}
