//! `capacity-pilot pause` and `resume` (ARCHITECTURE §9.7): an operator stops every new
//! purchase, and every new on-demand or spot run, at once and until resumed, without a
//! deploy. The PAUSE item they write and delete is read by the purchase's lease and an
//! on-demand hold (a ConditionCheck each) and by every tick; nothing else is held back.

use aws_sdk_sts::error::ProvideErrorMetadata;
use clap::Args;
use serde_json::json;

use capacity_pilot::domain::status::RequestStatus;
use capacity_pilot::ports::{Pause, PortError, RequestRecord, Store};

use crate::Global;
use crate::commands::{Conn, connect};
use crate::fail::{Fail, Result};
use crate::show::{Out, micro, usd, when};

#[derive(Debug, Args)]
pub struct PauseArgs {
    /// Why, shown in `status` and in each held-back request's history.
    #[arg(long)]
    reason: String,
}

pub async fn pause(g: &Global, out: &Out, a: PauseArgs) -> Result<()> {
    let reason = a.reason.trim();
    if reason.is_empty() {
        return Err(Fail::Usage(
            "--reason must say why purchases are paused: it is shown to everyone they hold back"
                .into(),
        ));
    }
    let c = connect(g).await?;
    let by = caller(&c).await?;
    let p = Pause {
        by,
        reason: reason.to_string(),
        since: c.now,
    };
    match c.store.put_pause(p.clone()).await.map_err(write_failed)? {
        Ok(()) => {}
        Err(standing) => {
            return Err(Fail::Refused(format!(
                "purchases are already {}\n  nothing was changed; `capacity-pilot resume` first \
                 to pause for another reason",
                standing.describe()
            )));
        }
    }
    let flight = in_flight(&c).await?;
    if out.json() {
        out.print_json(&json!({"paused": p, "in_flight": flight.iter().map(|(r, what)| json!({"request_id": r.request_id, "status": r.status, "what": what})).collect::<Vec<_>>()}));
        return Ok(());
    }
    println!(
        "purchases {}\n  nothing new is bought, and no on-demand or spot run is started, until \
         `capacity-pilot resume`;\n  searches, approvals asked, launches into what was bought, \
         drains and cleanup go on",
        p.describe()
    );
    if flight.is_empty() {
        println!("  no purchase was under way");
    } else {
        println!("  under way before the pause, and finishing:");
        for (r, what) in &flight {
            println!("    {} ({}): {what}", r.request_id, r.status.as_str());
        }
    }
    Ok(())
}

pub async fn resume(g: &Global, out: &Out) -> Result<()> {
    let c = connect(g).await?;
    let gone = c.store.delete_pause().await.map_err(write_failed)?;
    if out.json() {
        out.print_json(&json!({"resumed": gone.is_some(), "was": gone}));
        return Ok(());
    }
    match gone {
        Some(p) => println!(
            "purchases resumed (they were {})\n  what waited is bought at the purchase \
             function's next run, within 5 minutes, if it still can be; an approval given \
             during the pause must be given again",
            p.describe()
        ),
        None => println!("purchases were not paused; nothing was changed"),
    }
    Ok(())
}

/// Who runs the command: the pause records it.
async fn caller(c: &Conn) -> Result<String> {
    let sts = aws_sdk_sts::Client::new(&c.sdk);
    let me = sts.get_caller_identity().send().await.map_err(|e| {
        Fail::Aws(format!(
            "sts:GetCallerIdentity failed ({}): a pause records who made it\n  check your \
             credentials",
            e.code().unwrap_or("unknown")
        ))
    })?;
    Ok(me.arn().unwrap_or_default().to_string())
}

/// The purchases and on-demand runs already under way: they finish (a lease taken before
/// the pause, an estimate held).
async fn in_flight(c: &Conn) -> Result<Vec<(RequestRecord, String)>> {
    let all = c.store.list_requests().await.map_err(Fail::store)?;
    Ok(all
        .into_iter()
        .filter_map(|r| {
            let what = match r.status {
                RequestStatus::Purchasing => {
                    let plan = r.candidates.first().map_or(String::new(), |p| {
                        format!(
                            "buying {} for {}",
                            p.offering_ids().join(" + "),
                            usd(p.upfront_fee)
                        )
                    });
                    let until = r.lease.as_ref().map_or(String::new(), |l| {
                        format!(", lease until {}", when(l.expires_at))
                    });
                    format!("{plan}{until}")
                }
                RequestStatus::TryingOnDemand
                | RequestStatus::RunningOnDemand
                | RequestStatus::RunningSpot
                    if r.open_debit.is_some() =>
                {
                    format!(
                        "an on-demand or spot estimate of {} is held",
                        micro(r.open_debit.unwrap_or_default())
                    )
                }
                _ => return None,
            };
            Some((r, what))
        })
        .collect())
}

/// A pause or resume the table refused, as the CLI says it.
fn write_failed(e: PortError) -> Fail {
    let text = e.to_string();
    if text.contains("AccessDenied") {
        Fail::Refused(format!(
            "not allowed to write the pause: {text}\n  use a role with the stack's \
             OperatorPolicy"
        ))
    } else {
        Fail::store(e)
    }
}
