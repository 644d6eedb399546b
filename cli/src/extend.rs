//! `capacity-pilot extend` (ARCHITECTURE §9.3): ask for an extension of a request's Capacity
//! Block or training plan. The CLI checks what it can read (the request, its `extend`
//! policy, the hours, what its extensions have used, the payment lead) so that a clear error
//! comes before anything is sent; purchase-capacity prices the extension with AWS, checks
//! the fee, buys it or asks an approver, and answers on the bus. Also what `status`,
//! `approve` and `reject` show of a request's extensions, which live on its reservations.

use chrono::Duration;
use clap::Args;
use comfy_table::Table;
use serde_json::{Value, json};

use capacity_pilot::domain::events::{ExtensionRequest, inbound as detail_type};
use capacity_pilot::domain::extension::{
    DEFAULT_PAYMENT_LEAD_MINUTES, Extension, ExtensionState, hours_problem, used,
};
use capacity_pilot::domain::money::MicroUsd;
use capacity_pilot::domain::reservation::Reservation;
use capacity_pilot::domain::window::{self, Window};
use capacity_pilot::ports::{RequestRecord, Store};

use crate::Global;
use crate::commands::connect;
use crate::fail::{Fail, Result};
use crate::show::{Out, micro, usd, when};

#[derive(Debug, Args)]
pub struct ExtendArgs {
    request_id: String,
    /// How many hours to add: whole days (24, 48, ...), beyond 336 (14 days) whole weeks
    /// (504, 672, ...), at most 4368 (182 days).
    #[arg(long)]
    hours: u32,
    /// Which of the request's reservations (`status` lists them); default: the one whose
    /// window ends last among those not yet drained.
    #[arg(long)]
    reservation: Option<String>,
    /// Do not ask (needed off a terminal).
    #[arg(long)]
    yes: bool,
    /// The event's source (default: the first of the stack's AllowedRequestSources).
    #[arg(long)]
    source: Option<String>,
}

/// The last window of reservation `r`: the one that ends with it.
fn last_window<'a>(windows: &'a [Window], r: &Reservation) -> Option<&'a Window> {
    windows
        .iter()
        .filter(|w| w.reservation.id == r.id && w.last_of_reservation)
        .max_by_key(|w| w.end())
}

/// Why `r` cannot be extended now, if it cannot: not a block or plan, over, or its last
/// window draining or ended (purchase-capacity's own rule).
fn not_extendable(r: &Reservation, windows: &[Window]) -> Option<String> {
    if !r.product.is_reservation() {
        return Some(format!("{} is not a Capacity Block or training plan", r.id));
    }
    if !r.state.is_live() {
        return Some(format!("AWS reports {} {}", r.id, r.state));
    }
    match last_window(windows, r) {
        None => Some(format!("{} has no window recorded yet", r.id)),
        Some(w) if !w.state.is_undrained() => Some(format!(
            "its last window, {}, is {}",
            w.number,
            w.state.as_str()
        )),
        Some(_) => None,
    }
}

/// The reservation an extension asks for, and its last window: `named`, or the one whose
/// window ends last among those not yet drained, as purchase-capacity picks it.
fn target<'a>(
    rec: &RequestRecord,
    held: &'a [Reservation],
    windows: &'a [Window],
    named: Option<&str>,
) -> Result<(&'a Reservation, &'a Window)> {
    let id = &rec.request_id;
    let r = match named {
        Some(rid) => {
            let Some(r) = held.iter().find(|r| r.id == rid) else {
                return Err(Fail::NotFound(format!(
                    "{rid} is not a reservation of {id}: it holds {}\n  pick one from \
                     `capacity-pilot status {id}`, or leave out --reservation",
                    if held.is_empty() {
                        "none yet".to_string()
                    } else {
                        Reservation::id_list(held)
                    }
                )));
            };
            if let Some(why) = not_extendable(r, windows) {
                return Err(Fail::Refused(format!(
                    "{rid} cannot be extended: {why}\n  nothing was sent"
                )));
            }
            r
        }
        None => held
            .iter()
            .filter(|r| not_extendable(r, windows).is_none())
            .max_by_key(|r| r.end())
            .ok_or_else(|| {
                Fail::Refused(format!(
                    "{id} holds no reservation whose last window is still to run (nothing \
                     bought yet, or every window drains or ended already): nothing to extend\n  \
                     nothing was sent; `capacity-pilot status {id}` shows its windows"
                ))
            })?,
    };
    let w = last_window(windows, r).ok_or_else(|| {
        Fail::Refused(format!(
            "{} has no window recorded yet\n  nothing was sent",
            r.id
        ))
    })?;
    Ok((r, w))
}

pub async fn extend(g: &Global, out: &Out, a: ExtendArgs) -> Result<()> {
    if let Some(p) = hours_problem(a.hours) {
        return Err(Fail::Usage(format!("--hours {}: {p}", a.hours)));
    }
    if !a.yes && !out.interactive {
        return Err(Fail::Usage(
            "extend asks on a terminal before it spends; elsewhere pass --yes".into(),
        ));
    }
    let c = connect(g).await?;
    let source = c.source(&a.source, "AllowedRequestSources")?;
    let rec = c.request(&a.request_id).await?;
    let id = rec.request_id.clone();
    let Some(policy) = rec.request.extend.clone() else {
        return Err(Fail::Refused(format!(
            "{id} was submitted without `extend`, so none of its reservations is extended by \
             capacity-pilot\n  nothing was sent; a request that may be extended says \
             `extend: {{when, max_hours, max_upfront_usd}}` (docs/requests.md), or extend the \
             block or plan yourself in the console (its fee is then not counted)"
        )));
    };
    let held = c
        .store
        .reservations(&rec.request_id)
        .await
        .map_err(Fail::store)?;
    let windows = window::windows(&held, &rec.windows, c.drain_lead(&rec));
    let (r, w) = target(&rec, &held, &windows, a.reservation.as_deref())?;
    if let Some(open) = r.open_extension() {
        return Err(Fail::Refused(format!(
            "extension {} of {} is still {} (AWS takes one at a time)\n  nothing was sent; \
             ask again once `capacity-pilot status {id}` shows it succeeded or failed",
            open.number,
            r.id,
            open.state.as_str()
        )));
    }
    let lead_minutes = c
        .dep
        .config
        .as_ref()
        .map_or(DEFAULT_PAYMENT_LEAD_MINUTES, |cfg| {
            cfg.extension_payment_lead_minutes
        });
    let buy_by = w.drain_at - Duration::minutes(i64::from(lead_minutes));
    if c.now > buy_by {
        return Err(Fail::Refused(format!(
            "past the payment lead: an extension of {} had to be bought by {}, {} before \
             window {}'s drain at {}, so that AWS's payment (up to 12 hours) clears before it\n  \
             nothing was sent; the window drains as planned (an extension you buy yourself in \
             the console moves the drain only if its payment clears first)",
            r.id,
            when(buy_by),
            lead_words(lead_minutes),
            w.number,
            when(w.drain_at)
        )));
    }
    let (used_hours, used_fee) = used(held.iter().flat_map(|h| h.extensions.iter()));
    let hours_left = policy.max_hours.saturating_sub(used_hours);
    if a.hours > hours_left {
        return Err(Fail::Refused(format!(
            "over extend.max_hours: {} h on top of the {used_hours} h extended so far is more \
             than {}\n  nothing was sent; {}",
            a.hours,
            policy.max_hours,
            if hours_left >= 24 {
                format!("ask for at most {hours_left} h")
            } else {
                "the request's extensions have used all it allows".to_string()
            }
        )));
    }
    if let Some(cfg) = &c.dep.config
        && let Some(p) = cfg.team_source_problem(&rec.team, &source)
    {
        return Err(Fail::Refused(format!(
            "{}\n  nothing was sent; pass --source with one of the team's sources",
            p.message
        )));
    }
    let fee_left = MicroUsd(policy.max_upfront_usd.to_micros_ceil().0 - used_fee.0);
    let new_end = w.end() + Duration::hours(i64::from(a.hours));
    let what = format!(
        "{} ({} x {}, {} in {}) by {} h: window {} would end {} instead of {}",
        r.id,
        r.instance_count,
        r.instance_type,
        r.product,
        r.region,
        a.hours,
        w.number,
        when(new_end),
        when(w.end())
    );
    if !a.yes {
        eprintln!(
            "{id}: extend {what}\n  the fee is AWS's price, at most {} (what is left of \
             extend.max_upfront_usd); bought by {} at the latest",
            micro(fee_left),
            when(buy_by)
        );
        let ok = dialoguer::Confirm::new()
            .with_prompt("Ask for this extension?")
            .default(false)
            .interact()
            .map_err(|e| Fail::Usage(format!("could not ask: {e}")))?;
        if !ok {
            eprintln!("nothing was sent");
            return Ok(());
        }
    }
    let ask = ExtensionRequest {
        request_id: id.to_string(),
        hours: a.hours,
        reservation_id: a.reservation.clone(),
    };
    let detail = serde_json::to_value(&ask).unwrap_or(Value::Null);
    let event_id = c
        .put(&source, detail_type::EXTENSION_REQUESTED, &detail, false)
        .await?;
    if out.json() {
        out.print_json(&json!({
            "request_id": id, "event_id": event_id, "source": source,
            "reservation_id": r.id, "window": w.number, "hours": a.hours,
            "ends_at": w.end(), "extended_ends_at": new_end, "buy_by": buy_by,
            "extend_hours_left": hours_left - a.hours, "extend_usd_left": fee_left.to_usd(),
        }));
        return Ok(());
    }
    println!("extension asked for {id} (event {event_id}) as {source}:\n  {what}");
    println!(
        "{}",
        crate::show::paragraph(
            "purchase-capacity prices it with AWS and answers Capacity Extension Offered (then \
             buys it, or waits for an approver: Capacity Extension Awaiting Approval) or \
             Capacity Extension Failed with the reason. The window's end and drain move once \
             AWS takes the payment (up to 12 hours)."
        )
    );
    println!("follow it: capacity-pilot status {id}");
    Ok(())
}

// ---------------------------------------------------------------------------------------
// What status, approve and reject show
// ---------------------------------------------------------------------------------------

/// The key an approver names, while it awaits one.
fn approves(e: &Extension) -> Option<&str> {
    (e.state == ExtensionState::AwaitingApproval)
        .then_some(e.approval_key.as_deref())
        .flatten()
}

/// Every extension of the request's reservations, oldest first within each.
fn all(held: &[Reservation]) -> impl Iterator<Item = (&Reservation, &Extension)> {
    held.iter()
        .flat_map(|r| r.extensions.iter().map(move |e| (r, e)))
}

/// The extensions awaiting an approver, with their keys.
pub fn awaiting(held: &[Reservation]) -> Vec<(&Reservation, &Extension, &str)> {
    all(held)
        .filter_map(|(r, e)| approves(e).map(|k| (r, e, k)))
        .collect()
}

/// An extension, in words: what approving it would buy.
pub fn what(r: &Reservation, e: &Extension) -> String {
    format!(
        "extension {} of {} ({} x {}, {} in {}): {} h more, to end {} instead of {}, for {}",
        e.number,
        r.id,
        r.instance_count,
        r.instance_type,
        r.product,
        r.region,
        e.offer.hours,
        when(e.offer.ends_at),
        when(e.offer.starts_at),
        usd(e.offer.fee)
    )
}

/// `status`'s JSON of the request's extensions.
pub fn json(held: &[Reservation]) -> Value {
    json!(
        all(held)
            .map(|(r, e)| json!({
                "reservation_id": r.id, "extension": e.number, "hours": e.offer.hours,
                "upfront_fee_usd": e.offer.fee, "state": e.state, "reason": e.reason,
                "ends_at": e.offer.starts_at, "extended_ends_at": e.offer.ends_at,
                "buy_by": e.buy_by, "asked_by": e.asked.as_str(), "asked_at": e.asked_at,
                "approves": approves(e), "approved_by": e.approved_by,
            }))
            .collect::<Vec<_>>()
    )
}

/// `status`'s JSON of the request's `extend` policy and what its extensions used of it.
pub fn policy_json(rec: &RequestRecord, held: &[Reservation]) -> Value {
    let Some(p) = &rec.request.extend else {
        return Value::Null;
    };
    let (hours, fee) = used(all(held).map(|(_, e)| e));
    json!({
        "when": p.when, "max_hours": p.max_hours, "max_upfront_usd": p.max_upfront_usd,
        "used_hours": hours, "used_usd": fee.to_usd(),
    })
}

/// `status`'s line on the `extend` policy.
pub fn policy_line(rec: &RequestRecord, held: &[Reservation]) -> Option<String> {
    let p = rec.request.extend.as_ref()?;
    let (hours, fee) = used(all(held).map(|(_, e)| e));
    Some(format!(
        "{}: {hours} of {} h and {} of {} used (capacity-pilot extend {} --hours H)",
        p.when.as_str(),
        p.max_hours,
        micro(fee),
        usd(p.max_upfront_usd),
        rec.request_id
    ))
}

/// `status`'s table of the request's extensions; `None` when it has none.
pub fn table(out: &Out, held: &[Reservation]) -> Option<Table> {
    let mut t = out.table(&[
        "EXTENSION",
        "RESERVATION",
        "HOURS",
        "FEE",
        "STATE",
        "NEW END",
        "REASON",
    ]);
    let mut any = false;
    for (r, e) in all(held) {
        any = true;
        t.add_row(vec![
            e.number.to_string(),
            r.id.clone(),
            e.offer.hours.to_string(),
            usd(e.offer.fee),
            e.state.as_str().to_string(),
            when(e.offer.ends_at),
            e.reason.clone(),
        ]);
    }
    any.then_some(t)
}

/// A lead in words: `12 h`, or `90 minutes`.
fn lead_words(minutes: u32) -> String {
    if minutes.is_multiple_of(60) {
        format!("{} h", minutes / 60)
    } else {
        format!("{minutes} minutes")
    }
}
