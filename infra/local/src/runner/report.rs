//! What the run prints: a timeline line per event and decision as it happens, then a summary
//! per request and per function, and the checks.

use std::fmt::Write as _;

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde_json::Value;

use super::checks::{Observed, REQUEST_TAG, short, time};
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

    /// An event on a home bus; `forwarded_from` names the region whose default bus the region
    /// forwarder took it from.
    pub fn event(
        &mut self,
        at: DateTime<Utc>,
        bus: Bus,
        ev: &Value,
        targets: &[String],
        forwarded_from: Option<&str>,
    ) {
        let to = if targets.is_empty() {
            String::new()
        } else {
            format!("  -> {}", targets.join(", "))
        };
        let from = forwarded_from.map_or(String::new(), |r| format!(" (forwarded from {r})"));
        self.push(Line {
            at,
            who: format!("bus:{}", bus_label(bus)),
            what: format!("{}{from}{to}", describe_event(ev)),
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
    /// The reserved windows (start, end), from the emulator.
    pub windows: Vec<(DateTime<Utc>, DateTime<Utc>)>,
    /// (time, detail-type) of each of our events about it, for the chart.
    pub marks: Vec<(DateTime<Utc>, String)>,
    /// Its instances (EC2, from the emulator) and SageMaker workloads (from our events).
    pub instances: Vec<InstanceSpan>,
}

/// One instance of a request (or one SageMaker workload), for the chart.
#[derive(Debug, Clone, PartialEq)]
pub struct InstanceSpan {
    pub id: String,
    pub start: DateTime<Utc>,
    /// When it terminated (or was drained); `None`: still up when the scenario ended.
    pub end: Option<DateTime<Utc>>,
    /// The instance that replaced it (a `Capacity Instance Replaced` event).
    pub replaced_by: Option<String>,
    /// The instance it replaced.
    pub replaces: Option<String>,
}

/// The instances of request `id`: the EC2 instances tagged for it in the emulator (launched,
/// terminated), and the SageMaker workloads our `Workload Launched` events name, up to the
/// `Workload Drained` event that names them; replacements from `Instance Replaced` events.
pub fn instances(o: &Observed, id: &str) -> Vec<InstanceSpan> {
    let replaced: Vec<(String, String)> = o
        .ours(id, "Capacity Instance Replaced")
        .iter()
        .filter_map(|e| {
            let d = &e["detail"];
            Some((
                d["replaced_instance_id"].as_str()?.to_string(),
                d["new_instance_id"].as_str()?.to_string(),
            ))
        })
        .collect();
    let mut out: Vec<InstanceSpan> = o.cloud.with_world(|w| {
        w.ec2
            .instances
            .values()
            .filter(|i| i.tags.get(REQUEST_TAG).map(String::as_str) == Some(id))
            .map(|i| InstanceSpan {
                id: i.id.clone(),
                start: i.launch_time,
                end: i.terminated_at,
                replaced_by: None,
                replaces: None,
            })
            .collect()
    });
    let drained: Vec<(DateTime<Utc>, Vec<String>)> = o
        .ours(id, "Capacity Workload Drained")
        .iter()
        .filter_map(|e| {
            let names = e["detail"]["resource_ids"]
                .as_array()?
                .iter()
                .filter_map(Value::as_str)
                .map(|r| r.rsplit(':').next().unwrap_or(r).to_string())
                .collect();
            Some((time(&e["time"])?, names))
        })
        .collect();
    for e in o.ours(id, "Capacity Workload Launched") {
        let Some(at) = time(&e["time"]) else { continue };
        for r in e["detail"]["resource_ids"].as_array().into_iter().flatten() {
            let Some(r) = r.as_str() else { continue };
            if out.iter().any(|i| i.id == r) {
                continue;
            }
            let end = drained
                .iter()
                .find(|(t, names)| *t >= at && names.iter().any(|n| n == r))
                .map(|(t, _)| *t);
            out.push(InstanceSpan {
                id: r.to_string(),
                start: at,
                end,
                replaced_by: None,
                replaces: None,
            });
        }
    }
    for i in &mut out {
        i.replaced_by = replaced
            .iter()
            .find(|(old, _)| *old == i.id)
            .map(|(_, new)| new.clone());
        i.replaces = replaced
            .iter()
            .find(|(_, new)| *new == i.id)
            .map(|(old, _)| old.clone());
    }
    out.sort_by(|a, b| (a.start, &a.id).cmp(&(b.start, &b.id)));
    out
}

pub fn summarize(o: &Observed) -> Vec<RequestSummary> {
    let mut out = Vec::new();
    for (id, detail) in o.requests() {
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
                // A cancellation's answer before the Failed event that ends the request
                // with it: the request was cancelled, not failed.
                "Capacity Cancellation Applied",
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
            windows: o.windows(&id).iter().map(|w| (w.start, w.end)).collect(),
            marks: o
                .custom_events
                .iter()
                .filter(|e| e["detail"]["request_id"] == id.as_str())
                .filter_map(|e| {
                    Some((
                        time(&e["time"])?,
                        e["detail-type"]
                            .as_str()?
                            .trim_start_matches("Capacity ")
                            .to_string(),
                    ))
                })
                .collect(),
            instances: instances(o, &id),
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
    let _ = writeln!(
        s,
        "\n== notices (what the notices topic received, by request; bodies in notices.txt) =="
    );
    for q in &r.summary {
        let mine: Vec<&Value> = r
            .notices
            .iter()
            .filter(|m| m["attributes"]["request_id"] == q.request_id.as_str())
            .collect();
        if mine.is_empty() {
            continue;
        }
        let _ = writeln!(s, "{} (team {}):", q.request_id, q.team);
        for m in mine {
            let _ = writeln!(
                s,
                "  {}  {:<40} {}",
                time(&m["at"]).map_or("-".into(), |t| t.format("%m-%d %H:%M").to_string()),
                m["attributes"]["detail_type"].as_str().unwrap_or("?"),
                m["subject"].as_str().unwrap_or("")
            );
        }
    }
    let _ = writeln!(s, "\n== functions (real binaries under the Lambda host) ==");
    let _ = writeln!(
        s,
        "{:<18} {:>6} {:>9} {:>8} {:>6} {:>7} {:>13} {:>10} {:>10} {:>10} {:>11} {:>12} {:>8} {:>9} {:>8}",
        "function",
        "memory",
        "init ms",
        "invokes",
        "quiet",
        "errors",
        "peak RSS MiB",
        "max ms",
        "mean ms",
        "max cpu ms",
        "mean cpu ms",
        "recommend MB",
        "ddb/inv",
        "ddb/quiet",
        "aws/inv"
    );
    for f in &r.functions {
        let mean = if f.invocations > 0 {
            f.total_duration.as_secs_f64() * 1000.0 / f.invocations as f64
        } else {
            0.0
        };
        let mean_cpu = if f.invocations > 0 {
            f.total_cpu.as_secs_f64() * 1000.0 / f.invocations as f64
        } else {
            0.0
        };
        let calls = calls_of(r, &f.name);
        let _ = writeln!(
            s,
            "{:<18} {:>6} {:>9} {:>8} {:>6} {:>7} {:>13.1} {:>10} {:>10.1} {:>10.1} {:>11.2} {:>12} {:>8.1} {:>9} {:>8.1}",
            f.name,
            f.memory_mb,
            f.init.as_millis(),
            f.invocations,
            calls.quiet,
            f.errors,
            f.peak_rss_kb as f64 / 1024.0,
            f.max_duration.as_millis(),
            mean,
            f.max_cpu.as_secs_f64() * 1000.0,
            mean_cpu,
            recommended_memory_mb(f.peak_rss_kb, f.max_cpu),
            calls.dynamodb_mean,
            calls.quiet_dynamodb_max,
            calls.other_mean
        );
    }
    let release = r.bin_dir.ends_with("release");
    let _ = writeln!(
        s,
        "recommended MemorySize: peak RSS x 1.5, and enough CPU share (1,769 MB = 1 vCPU) to run the heaviest invocation's CPU time within 1 s, rounded up to 64 MB, at least 128 MB; {}",
        if release {
            "from a release build: the figures to put in infra/template.yaml"
        } else {
            "from a debug build, so indicative only (make run PROFILE=release measures the binaries Lambda runs)"
        }
    );
    let _ = writeln!(
        s,
        "{} invocations, {} clock steps, {:.1} s wall; logs in {}",
        r.invocations.len(),
        r.steps,
        r.wall.as_secs_f64(),
        r.out_dir.join("logs").display()
    );
    for (region, seen, forwarded) in &r.forwarded {
        let _ = writeln!(
            s,
            "region forwarder in {region}: {forwarded} of the {seen} events on its default bus forwarded to the home region's"
        );
    }
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

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The colour of a mark on the chart, by the event's detail-type.
fn colour(kind: &str) -> &'static str {
    match kind {
        "Reserved" => "#2b6cb0",
        "Workload Launched" => "#2f855a",
        "Instance Replaced" => "#dd6b20",
        "Reservation Expiring" | "Workload Drained" => "#805ad5",
        "Reservation Ended" => "#4a5568",
        "Request Rejected" | "Request Failed" => "#c53030",
        _ => "#a0aec0",
    }
}

/// The height of a request's row on the chart: its reserved windows and events on top, then
/// one line per instance.
fn row_height(q: &RequestSummary) -> f64 {
    28.0 + INSTANCE_PITCH * q.instances.len() as f64
}

/// The vertical distance between two instance lines on the chart.
const INSTANCE_PITCH: f64 = 8.0;

/// The SVG timeline chart: a row per request, its reserved windows as bars, its events as
/// marks, and under them a line per instance from its launch to its termination (a replaced
/// one in orange, dashed over to the instance that replaced it).
pub fn svg(r: &RunResult) -> String {
    let (t0, t1) = (r.scenario.start, r.scenario.end);
    let span = (t1 - t0).num_seconds().max(1) as f64;
    let (left, width) = (170.0, 1000.0);
    let x =
        |t: DateTime<Utc>| left + width * ((t - t0).num_seconds() as f64 / span).clamp(0.0, 1.0);
    let height = 40.0 + r.summary.iter().map(row_height).sum::<f64>();
    let mut svg = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{height}" font-family="sans-serif" font-size="11">"#,
        left + width + 20.0
    );
    // day grid
    let mut day = t0
        .date_naive()
        .and_hms_opt(0, 0, 0)
        .map(|d| d.and_utc())
        .unwrap_or(t0);
    while day <= t1 {
        if day >= t0 {
            let _ = write!(
                svg,
                r##"<line x1="{0:.1}" y1="20" x2="{0:.1}" y2="{1}" stroke="#e2e8f0"/><text x="{0:.1}" y="14" fill="#718096">{2}</text>"##,
                x(day),
                height,
                day.format("%d %b")
            );
        }
        day += chrono::TimeDelta::days(1);
    }
    let mut y = 26.0;
    for q in &r.summary {
        let _ = write!(
            svg,
            r#"<text x="4" y="{:.1}">{}</text>"#,
            y + 15.0,
            esc(&q.request_id)
        );
        for (s, e) in &q.windows {
            let _ = write!(
                svg,
                r##"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="18" fill="#bee3f8" stroke="#2b6cb0"><title>reserved {} to {}</title></rect>"##,
                x(*s),
                y + 2.0,
                (x(*e) - x(*s)).max(1.5),
                s.format("%m-%d %H:%M"),
                e.format("%m-%d %H:%M")
            );
        }
        // A line per instance, under the windows.
        let line_y = |k: usize| y + 24.0 + INSTANCE_PITCH * k as f64;
        for (k, i) in q.instances.iter().enumerate() {
            let (x0, x1) = (x(i.start), x(i.end.unwrap_or(t1)));
            let fill = if i.replaced_by.is_some() {
                "#dd6b20"
            } else {
                "#48bb78"
            };
            let mut tip = format!(
                "{} up {} to {}",
                i.id,
                i.start.format("%m-%d %H:%M"),
                i.end
                    .map_or("the end".into(), |e| e.format("%m-%d %H:%M").to_string())
            );
            if let Some(new) = &i.replaced_by {
                let _ = write!(tip, "; replaced by {new}");
            }
            if let Some(old) = &i.replaces {
                let _ = write!(tip, "; replaces {old}");
            }
            let _ = write!(
                svg,
                r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="5" fill="{fill}"><title>{}</title></rect>"#,
                x0,
                line_y(k),
                (x1 - x0).max(1.5),
                esc(&tip)
            );
            if let Some(new) = &i.replaced_by {
                // The termination as a cross, and a dashed link to the replacement.
                let (cx, cy) = (x1, line_y(k) + 2.5);
                let _ = write!(
                    svg,
                    r##"<path d="M{:.1} {:.1}L{:.1} {:.1}M{:.1} {:.1}L{:.1} {:.1}" stroke="#c53030" stroke-width="1.5"/>"##,
                    cx - 3.0,
                    cy - 3.0,
                    cx + 3.0,
                    cy + 3.0,
                    cx - 3.0,
                    cy + 3.0,
                    cx + 3.0,
                    cy - 3.0
                );
                if let Some((n, next)) = q.instances.iter().enumerate().find(|(_, j)| j.id == *new)
                {
                    let _ = write!(
                        svg,
                        r##"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#dd6b20" stroke-dasharray="2,2"/>"##,
                        cx,
                        cy,
                        x(next.start),
                        line_y(n) + 2.5
                    );
                }
                let _ = write!(
                    svg,
                    r##"<text x="{:.1}" y="{:.1}" font-size="9" fill="#c05621">{} replaced</text>"##,
                    cx + 6.0,
                    cy + 3.0,
                    esc(short(&i.id))
                );
            }
        }
        for (t, kind) in &q.marks {
            let _ = write!(
                svg,
                r#"<circle cx="{:.1}" cy="{:.1}" r="4" fill="{}"><title>{} {}</title></circle>"#,
                x(*t),
                y + 11.0,
                colour(kind),
                t.format("%m-%d %H:%M:%S"),
                esc(kind)
            );
        }
        y += row_height(q);
    }
    svg.push_str("</svg>");
    svg
}

/// The HTML report: the SVG timeline chart ([`svg`]), the summary, the functions' figures,
/// the checks and the timeline.
pub fn html(r: &RunResult) -> String {
    let (t0, t1) = (r.scenario.start, r.scenario.end);
    let svg = svg(r);
    let mut h = String::new();
    let _ = write!(
        h,
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>capacity-pilot: {name}</title>\
         <style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse;font-size:13px}}\
         td,th{{border:1px solid #cbd5e0;padding:3px 8px;text-align:left}}.pass{{color:#2f855a}}.fail{{color:#c53030;font-weight:bold}}\
         pre{{font-size:12px}}</style></head><body><h1>capacity-pilot: scenario {name}</h1><p>{desc}</p>\
         <p>Simulated {t0} to {t1}; seed {seed}; {inv} invocations of the real binaries, {wall:.1} s wall.</p>\
         <h2>Timeline</h2>{svg}<p>Bars: reserved windows (emulator). Thin lines under them: the request's instances \
         (EC2, from launch to termination) and SageMaker workloads (from launched to drained); \
         <span style=\"color:#dd6b20\">orange</span>: an instance that was replaced, crossed where it \
         ended and dashed to its replacement. Marks: our events \
         (<span style=\"color:#2b6cb0\">reserved</span>, <span style=\"color:#2f855a\">launched</span>, \
         <span style=\"color:#dd6b20\">replaced</span>, <span style=\"color:#805ad5\">expiring/drained</span>, \
         <span style=\"color:#4a5568\">ended</span>, <span style=\"color:#c53030\">rejected/failed</span>).</p>",
        name = esc(&r.scenario.name),
        desc = esc(&r.scenario.description),
        t0 = t0.format("%Y-%m-%d %H:%M"),
        t1 = t1.format("%Y-%m-%d %H:%M"),
        seed = r.scenario.seed,
        inv = r.invocations.len(),
        wall = r.wall.as_secs_f64(),
    );
    h.push_str("<h2>Requests</h2><table><tr><th>request</th><th>team</th><th>outcome</th><th>bought</th><th>fee</th><th>on-demand</th><th>saving</th><th>planned start</th><th>started</th><th>replacements</th><th>drained</th><th>ended</th></tr>");
    for q in &r.summary {
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&q.request_id),
            esc(&q.team),
            esc(&q.outcome),
            esc(&q.bought),
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
    h.push_str("</table><h2>Checks</h2><table><tr><th></th><th>check</th><th>subject</th><th>detail</th></tr>");
    for c in &r.checks {
        let _ = write!(
            h,
            "<tr><td class=\"{}\">{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            if c.passed { "pass" } else { "fail" },
            if c.passed { "PASS" } else { "FAIL" },
            esc(&c.name),
            esc(&c.subject),
            esc(&c.detail)
        );
    }
    h.push_str("</table><h2>Functions</h2><table><tr><th>function</th><th>memory MB</th><th>init ms</th><th>invocations</th><th>errors</th><th>peak RSS MiB</th><th>max ms</th><th>max CPU ms</th><th>recommended MemorySize</th><th>DynamoDB calls per invocation</th><th>most DynamoDB calls of a quiet one</th><th>other AWS calls per invocation</th></tr>");
    for f in &r.functions {
        let calls = calls_of(r, &f.name);
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.1}</td><td>{}</td><td>{:.1}</td><td>{}</td><td>{:.1}</td><td>{}</td><td>{:.1}</td></tr>",
            esc(&f.name),
            f.memory_mb,
            f.init.as_millis(),
            f.invocations,
            f.errors,
            f.peak_rss_kb as f64 / 1024.0,
            f.max_duration.as_millis(),
            f.max_cpu.as_secs_f64() * 1000.0,
            recommended_memory_mb(f.peak_rss_kb, f.max_cpu),
            calls.dynamodb_mean,
            calls.quiet_dynamodb_max,
            calls.other_mean
        );
    }
    h.push_str("</table><h2>Every event and decision</h2><pre>");
    for l in &r.timeline.lines {
        let _ = writeln!(
            h,
            "{}  {:<18} {}",
            l.at.format("%Y-%m-%d %H:%M:%S"),
            esc(&l.who),
            esc(&l.what)
        );
    }
    h.push_str("</pre></body></html>\n");
    h
}

/// A function's AWS calls over the run.
struct Calls {
    /// Invocations that did nothing.
    quiet: usize,
    /// DynamoDB calls per invocation.
    dynamodb_mean: f64,
    /// The most DynamoDB calls a quiet invocation made.
    quiet_dynamodb_max: u64,
    /// Calls of the other services per invocation.
    other_mean: f64,
}

fn calls_of(r: &RunResult, function: &str) -> Calls {
    let mine: Vec<_> = r
        .invocations
        .iter()
        .filter(|i| i.function == function)
        .collect();
    let per = |n: u64| {
        if mine.is_empty() {
            0.0
        } else {
            n as f64 / mine.len() as f64
        }
    };
    let dynamodb: u64 = mine.iter().map(|i| i.calls_of("dynamodb")).sum();
    let all: u64 = mine.iter().flat_map(|i| i.aws_calls.values()).sum();
    Calls {
        quiet: mine.iter().filter(|i| i.quiet()).count(),
        dynamodb_mean: per(dynamodb),
        quiet_dynamodb_max: mine
            .iter()
            .filter(|i| i.quiet())
            .map(|i| i.calls_of("dynamodb"))
            .max()
            .unwrap_or(0),
        other_mean: per(all - dynamodb),
    }
}

/// One JSON line per invocation: when, which function, on what, what it decided and published,
/// how long it took, its peak memory and its AWS calls per service.
/// Every notice the topic received, as a recipient reads it: its time, attributes, subject
/// and body.
pub fn notices_text(r: &RunResult) -> String {
    let mut s = String::new();
    for m in &r.notices {
        let _ = writeln!(
            s,
            "=== {} | team={} detail_type={} request_id={} | delivered to {}\nSubject: {}\n\n{}\n",
            m["at"].as_str().unwrap_or("?"),
            m["attributes"]["team"].as_str().unwrap_or("-"),
            m["attributes"]["detail_type"].as_str().unwrap_or("-"),
            m["attributes"]["request_id"].as_str().unwrap_or("-"),
            m["deliveries"].as_array().map_or(0, Vec::len),
            m["subject"].as_str().unwrap_or(""),
            m["message"].as_str().unwrap_or("")
        );
    }
    s
}

pub fn invocations_jsonl(r: &RunResult) -> String {
    let mut out = String::new();
    for i in &r.invocations {
        let line = serde_json::json!({
            "at": i.at.to_rfc3339(),
            "function": i.function,
            "trigger": i.trigger,
            "ok": i.ok,
            "error": i.error,
            "decisions": i.decisions,
            "published": i.published.iter().map(|e| e["detail-type"].clone()).collect::<Vec<_>>(),
            "duration_ms": i.duration.as_secs_f64() * 1000.0,
            "peak_rss_kb": i.peak_rss_kb,
            "cpu_ms": i.cpu.as_secs_f64() * 1000.0,
            "aws_calls": i.aws_calls,
        });
        out.push_str(&line.to_string());
        out.push('\n');
    }
    out
}

/// The memory at which Lambda gives a function one full vCPU; below it, the CPU share is in
/// proportion to the memory (AWS's Lambda developer guide, "Configuring memory").
pub const ONE_VCPU_MB: u64 = 1769;

/// The CPU latency the heaviest invocation may take at the recommended memory's CPU share.
pub const CPU_LATENCY_BUDGET: std::time::Duration = std::time::Duration::from_secs(1);

/// The `MemorySize` to give a function whose invocations peaked at `peak_rss_kb` of memory and
/// whose heaviest took `max_cpu` of CPU here: the least multiple of 64 MB, never under Lambda's
/// 128 MB, that holds the peak with half again as much headroom and runs that invocation's CPU
/// work within [`CPU_LATENCY_BUDGET`] at `memory / ONE_VCPU_MB` of a vCPU (never asking past one
/// vCPU: the functions' work is one request at a time). CPU-bound time costs the same at any
/// memory (the bill is memory x duration, and the duration shrinks as the share grows); only
/// the time spent waiting on AWS grows in cost with it, which is why the floor is not higher.
/// The CPU time is this machine's: a proxy for a Graviton core, not a measurement of one.
pub fn recommended_memory_mb(peak_rss_kb: u64, max_cpu: std::time::Duration) -> u64 {
    let for_rss = (peak_rss_kb * 3 / 2).div_ceil(1024);
    let for_cpu = (max_cpu.as_nanos() * u128::from(ONE_VCPU_MB))
        .div_ceil(CPU_LATENCY_BUDGET.as_nanos())
        .min(u128::from(ONE_VCPU_MB)) as u64;
    for_rss.max(for_cpu).div_ceil(64).max(2) * 64
}

#[cfg(test)]
mod memory_tests {
    use super::recommended_memory_mb;
    use std::time::Duration;

    const IDLE: Duration = Duration::ZERO;

    #[test]
    fn memory_is_peak_plus_half_rounded_up_to_64_mb_and_at_least_128() {
        assert_eq!(recommended_memory_mb(0, IDLE), 128);
        assert_eq!(recommended_memory_mb(34 * 1024, IDLE), 128); // 51 MB
        assert_eq!(recommended_memory_mb(100 * 1024, IDLE), 192); // 150 MB
        assert_eq!(recommended_memory_mb(128 * 1024, IDLE), 192); // exactly 192 MB
        assert_eq!(recommended_memory_mb(129 * 1024, IDLE), 256); // 193.5 MB
    }

    #[test]
    fn memory_buys_the_cpu_share_that_runs_the_heaviest_invocation_within_a_second() {
        // 72 ms of CPU within 1 s needs 72/1000 of a vCPU: 127.4 MB, so 128
        assert_eq!(recommended_memory_mb(0, Duration::from_millis(72)), 128);
        // 100 ms: 176.9 MB, so 192
        assert_eq!(recommended_memory_mb(0, Duration::from_millis(100)), 192);
        // 300 ms: 530.7 MB, so 576; the larger of the two needs wins
        assert_eq!(recommended_memory_mb(0, Duration::from_millis(300)), 576);
        assert_eq!(
            recommended_memory_mb(400 * 1024, Duration::from_millis(100)),
            640
        );
        // never past one vCPU: 5 s of CPU asks for 1,769 MB, so 1,792
        assert_eq!(recommended_memory_mb(0, Duration::from_secs(5)), 1792);
    }
}
