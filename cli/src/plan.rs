//! `capacity-pilot plan`: what the deployment would buy for a request, through the search
//! function's own queries, pacing and planning (`capacity_pilot::search`) with the caller's
//! credentials. It buys nothing. With a stack it takes its Capacity Block searches from the
//! deployment's pacing item (ARCHITECTURE §8.8), one conditional write per region; without
//! one, at most [`SEARCHES_WITHOUT_STACK`] per region.

use std::collections::{BTreeMap, BTreeSet};

use clap::Args;
use rust_decimal::Decimal;
use serde_json::{Value, json};

use capacity_pilot::aws::capacity::{AwsMarket, AwsWorkloads};
use capacity_pilot::config::{DEFAULT_DRAIN_MINUTES, DEFAULT_MAX_BLOCK_INSTANCES};
use capacity_pilot::domain::catalog::{
    PRICES_AS_OF, PriceTable, SupportedInstanceTypes, accelerators,
};
use capacity_pilot::domain::money::Usd;
use capacity_pilot::domain::offering::{Offering, Product};
use capacity_pilot::domain::planner::Plan;
use capacity_pilot::domain::request::{ValidationContext, parse_request};
use capacity_pilot::domain::window::DrainLead;
use capacity_pilot::ports::{BudgetMonth, CapacityMarket, OfferingQuery, Pacing, Store};
use capacity_pilot::search::{self, queries_for};
use capacity_pilot::workload::preflight::Depth;

use crate::Global;
use crate::commands::{DEFAULT_REGIONS, read_request};
use crate::deployment::{self, Deployment};
use crate::fail::{Fail, Result};
use crate::show::{Out, paragraph, usd, when};

/// Capacity Block searches per region a run makes without a stack's pacing item: the
/// emulator's and our reading of EC2's bucket (ARCHITECTURE §8.10).
pub const SEARCHES_WITHOUT_STACK: u32 = search::DESCRIBE_PACE.burst;

#[derive(Debug, Args)]
pub struct PlanArgs {
    /// The request, JSON or YAML; `-` reads stdin.
    file: String,
    /// Also dry-run each EC2 launch (RunInstances with DryRun, as purchase-capacity does
    /// before buying): needs ec2:RunInstances and iam:PassRole on the instance profile's role.
    #[arg(long)]
    preflight: bool,
}

/// One query that was not answered, and why.
struct Unanswered {
    query: OfferingQuery,
    why: String,
}

pub async fn plan(g: &Global, out: &Out, a: PlanArgs) -> Result<()> {
    let detail = read_request(&a.file)?;
    let sdk = deployment::sdk(g).await?;
    let now = deployment::now().await?;
    // The stack's configuration when it resolves; else the built-in defaults, said so.
    let dep = match Deployment::resolve(g, &sdk).await {
        Ok(d) => Some(d),
        Err(Fail::NotFound(why)) => {
            eprintln!("note: {why}\n  planning with built-in defaults and no stack");
            None
        }
        Err(e) => return Err(e),
    };
    let config = dep.as_ref().and_then(|d| d.config.clone());
    let settings = match &dep {
        Some(d) => d.settings_from(),
        None => "built-in defaults (no stack)".into(),
    };
    let defaults = SupportedInstanceTypes::default();
    let default_regions: Vec<String> = DEFAULT_REGIONS.iter().map(|s| s.to_string()).collect();
    let (types, regions, prices, max_blocks, default_drain) = match &config {
        Some(c) => (
            &c.instance_types,
            &c.allowed_regions,
            c.prices.clone(),
            c.max_block_instances,
            c.default_drain_minutes,
        ),
        None => (
            &defaults,
            &default_regions,
            PriceTable::default(),
            DEFAULT_MAX_BLOCK_INSTANCES,
            DEFAULT_DRAIN_MINUTES,
        ),
    };
    let ctx = ValidationContext {
        now,
        instance_types: types,
        allowed_regions: regions,
    };
    let request = parse_request(&detail, &ctx).map_err(|problems| Fail::Invalid {
        file: a.file.clone(),
        problems,
    })?;

    // The searches the function would make, Capacity Block ones paced per region.
    let queries = queries_for(&request, now);
    let mut wanted: BTreeMap<String, u32> = BTreeMap::new();
    for q in queries
        .iter()
        .filter(|q| q.product == Product::CapacityBlock)
    {
        *wanted.entry(q.region.clone()).or_default() += 1;
    }
    let store = dep.as_ref().filter(|d| d.stack.is_some()).map(|d| {
        let s = d.store(&sdk);
        s.begin_run(now);
        s
    });
    let mut allowed: BTreeMap<String, u32> = BTreeMap::new();
    for (region, n) in &wanted {
        let granted = match &store {
            Some(s) => s
                .take_searches(region, *n, now)
                .await
                .map_err(Fail::store)?,
            None => (*n).min(SEARCHES_WITHOUT_STACK),
        };
        allowed.insert(region.clone(), granted);
    }
    out.progress_line(&format!(
        "searching {} quer{} in {}",
        queries.len(),
        if queries.len() == 1 { "y" } else { "ies" },
        request.regions.join(", ")
    ));
    let market = AwsMarket::new(&sdk, prices.clone());
    let mut offerings: Vec<Offering> = Vec::new();
    let mut unanswered: Vec<Unanswered> = Vec::new();
    let mut searched = 0u32;
    for q in &queries {
        if q.product == Product::CapacityBlock {
            let left = allowed.entry(q.region.clone()).or_default();
            if *left == 0 {
                unanswered.push(Unanswered {
                    query: q.clone(),
                    why: match &store {
                        Some(_) => format!("{}'s Capacity Block search allowance is spent for now", q.region),
                        None => format!(
                            "not searched: without a stack a run makes at most {SEARCHES_WITHOUT_STACK} \
                             Capacity Block searches per region"
                        ),
                    },
                });
                continue;
            }
            *left -= 1;
        }
        searched += 1;
        match market.search(q).await {
            Ok(found) => offerings.extend(found),
            Err(e) => unanswered.push(Unanswered {
                query: q.clone(),
                why: e.to_string(),
            }),
        }
    }
    let mut seen = BTreeSet::new();
    offerings.retain(|o| seen.insert((o.region.clone(), o.id.clone())));

    let workloads = AwsWorkloads::new(&sdk);
    let uses_instances = capacity_pilot::workload::runs_instances(&request);
    if a.preflight && uses_instances {
        out.progress_line("pre-flight: dry-running each launch (ec2:RunInstances, iam:PassRole)");
    }
    let block_regions = regions.clone();
    let (planning, missed) = search::plan_offerings(
        &workloads,
        &request,
        &offerings,
        &prices,
        max_blocks,
        (
            config.as_ref(),
            Depth {
                dry_run: a.preflight,
            },
        ),
        now,
        || async {
            let mut live = Vec::new();
            for region in &block_regions {
                live.extend(market.blocks_in_account(region).await?);
            }
            Ok(live)
        },
    )
    .await
    .map_err(|e| {
        Fail::Aws(format!(
            "planning failed: {e}\n  check your credentials and region"
        ))
    })?;

    // What the team may still spend, when the stack says.
    let budget = match (&store, &config) {
        (Some(s), Some(c)) => {
            let cap = c.team_budgets.cap_for(&request.team);
            let spent = s
                .budget_spent(&request.team, &BudgetMonth::of(now))
                .await
                .map_err(Fail::store)?;
            Some((cap, spent))
        }
        _ => None,
    };
    let drain = DrainLead::of(&request, default_drain);
    let prices_from = if config.as_ref().is_some_and(|_| {
        dep.as_ref()
            .and_then(|d| d.parameter("OnDemandPricesUsd"))
            .is_some()
    }) {
        "the deployment's OnDemandPricesUsd over the built-in list prices".to_string()
    } else {
        format!("illustrative us-east-1 list prices of {PRICES_AS_OF}")
    };

    let rows: Vec<Value> = planning.plans.iter().map(|p| plan_json(p, drain)).collect();
    if out.json() {
        out.print_json(&json!({
            "request_id": request.id,
            "settings": settings,
            "prices": prices_from,
            "searches": searched,
            "plans": rows,
            "rejections": planning.rejections,
            "not_searched": unanswered.iter().map(|u| json!({
                "product": u.query.product.to_string(), "region": u.query.region,
                "instance_type": u.query.instance_type, "duration_hours": u.query.duration_hours,
                "why": u.why,
            })).collect::<Vec<_>>(),
            "preflight": if a.preflight { "reads and RunInstances dry runs" } else { "reads only (--preflight adds RunInstances dry runs)" },
            "decided_without": missed,
            "budget": budget.map(|(cap, spent)| json!({
                "team": request.team, "cap_usd": cap, "spent_usd": spent.to_usd(),
            })),
        }));
        return Ok(());
    }

    println!(
        "plan for {} (nothing is bought); settings: {settings}",
        request.id
    );
    match budget {
        Some((Some(cap), spent)) => println!(
            "budget: team {} has {} of {} left this month",
            request.team,
            usd(cap - spent.to_usd()),
            usd(cap)
        ),
        Some((None, _)) => println!(
            "budget: team {} has no cap: it may not spend (TeamBudgetsUsd)",
            request.team
        ),
        None => println!("budget: unknown (no stack)"),
    }
    println!(
        "{searched} search{} made{}",
        if searched == 1 { "" } else { "es" },
        if store.is_some() {
            ", taken from the deployment's allowance"
        } else {
            ""
        }
    );
    if planning.plans.is_empty() {
        println!("\nno feasible plan");
    } else {
        // One short paragraph per plan: a table of thirteen columns wraps on any terminal.
        for (i, p) in planning.plans.iter().enumerate() {
            let f = figures(p, drain);
            println!(
                "\n{}. {} {} x {}{} in {}",
                i + 1,
                p.product,
                p.instance_count,
                p.instance_type,
                f.accelerators
                    .map(|(name, n)| format!(" ({n} {name})"))
                    .unwrap_or_default(),
                where_of(p)
            );
            println!(
                "   {} to {}{}, {} usable hours per instance (to the drain)",
                when(p.start),
                when(p.end),
                if p.is_split() { " in two blocks" } else { "" },
                f.usable_hours.round_dp(1)
            );
            println!(
                "   {} up front{}; on demand {}{}",
                usd(p.upfront_fee),
                f.per_accelerator_hour
                    .map(|h| format!(" ({} per GPU-hour)", usd(h)))
                    .unwrap_or_default(),
                p.on_demand_cost
                    .map(usd)
                    .unwrap_or_else(|| "unpriced".into()),
                p.saving
                    .map(|s| format!(", saving {}", usd(s)))
                    .unwrap_or_default()
            );
            if let Some(b) = f.break_even {
                println!("   break-even: {}", break_even_words(b));
            }
        }
        if let Some(best) = planning.best()
            && let Some(b) = best.break_even_use()
        {
            println!(
                "\n{}",
                paragraph(&format!(
                    "Plan 1 pays for itself if the workload runs at least {} of its reserved \
                     instance-hours: below that, on demand would have cost less (on-demand \
                     prices: {prices_from}).",
                    percent(b)
                ))
            );
        }
    }
    // Every offering not in a plan shown above, with why (the plans' own offerings are
    // listed as plans, their rank said there).
    let shown: BTreeSet<&str> = planning
        .plans
        .iter()
        .flat_map(|p| p.offering_ids())
        .collect();
    let others: Vec<_> = planning
        .rejections
        .iter()
        .filter(|r| !shown.contains(r.offering_id.as_str()))
        .collect();
    if !others.is_empty() {
        println!("\nnot planned:");
        let mut t = out.table(&["OFFERING", "TYPE", "WHERE", "START", "WHY"]);
        // A reason's advice (what follows its first "; ") is said once, below the table: a
        // pre-flight refusal is the same for every offering in a zone or region.
        let mut advice: Vec<&str> = Vec::new();
        for r in others {
            let why = match r.reason.split_once("; ") {
                Some((why, then)) => {
                    if !advice.contains(&then) {
                        advice.push(then);
                    }
                    why.to_string()
                }
                None => r.reason.clone(),
            };
            let o = offerings
                .iter()
                .find(|o| o.id == r.offering_id && o.region == r.region);
            t.add_row(vec![
                r.offering_id.clone(),
                o.map(|o| o.instance_type.clone()).unwrap_or_default(),
                o.and_then(|o| o.segments.first()?.availability_zone.clone())
                    .unwrap_or_else(|| r.region.clone()),
                o.map(|o| when(o.start())).unwrap_or_default(),
                why,
            ]);
        }
        out.print_table(&mut t);
        for a in advice {
            println!("{}", crate::show::hanging("  ", &format!("so: {a}")));
        }
    }
    if !unanswered.is_empty() {
        println!("\nnot answered:");
        for u in &unanswered {
            println!(
                "{}",
                crate::show::hanging(
                    "  ",
                    &format!(
                        "{} {} in {} for {} h: {}",
                        u.query.product,
                        u.query.instance_type,
                        u.query.region,
                        u.query.duration_hours,
                        u.why
                    )
                )
            );
        }
    }
    for m in &missed {
        println!(
            "{}",
            crate::show::hanging("", &format!("decided without: {m}"))
        );
    }
    if !a.preflight && uses_instances {
        println!(
            "\n{}",
            paragraph(
                "pre-flight: reads only. --preflight also dry-runs each launch as the purchase \
                 does (needs ec2:RunInstances and iam:PassRole on the instance profile's role)."
            )
        );
    }
    Ok(())
}

/// What a plan gives per use.
struct Figures {
    usable_hours: Decimal,
    /// The accelerator and how many in all.
    accelerators: Option<(&'static str, u32)>,
    per_accelerator_hour: Option<Usd>,
    break_even: Option<Decimal>,
}

fn figures(p: &Plan, drain: DrainLead) -> Figures {
    let acc = accelerators(&p.instance_type).map(|(name, per)| (name, per * p.instance_count));
    let per_accelerator_hour = acc.and_then(|(_, n)| {
        let hours = Decimal::from(n) * p.covered_hours;
        (hours > Decimal::ZERO).then(|| Usd::new((p.upfront_fee.amount() / hours).round_dp(2)))
    });
    Figures {
        usable_hours: p.usable_hours(drain),
        accelerators: acc,
        per_accelerator_hour,
        break_even: p.break_even_use(),
    }
}

fn plan_json(p: &Plan, drain: DrainLead) -> Value {
    let f = figures(p, drain);
    json!({
        "product": p.product.to_string(),
        "instance_type": p.instance_type,
        "region": p.region,
        "zones": zones(p),
        "start": p.start,
        "end": p.end,
        "segments": p.segments,
        "usable_hours": f.usable_hours.round_dp(2),
        "instance_count": p.instance_count,
        "accelerators": f.accelerators.map(|(name, n)| json!({"name": name, "count": n})),
        "upfront_fee_usd": p.upfront_fee,
        "fee_per_accelerator_hour_usd": f.per_accelerator_hour,
        "on_demand_cost_usd": p.on_demand_cost,
        "saving_usd": p.saving,
        "break_even_use": f.break_even.map(|b| b.round_dp(4)),
        "offering_ids": p.offering_ids(),
        "reason": p.reason,
    })
}

fn zones(p: &Plan) -> Vec<String> {
    let mut z: Vec<String> = p
        .offerings
        .iter()
        .flat_map(|o| &o.segments)
        .filter_map(|s| s.availability_zone.clone())
        .collect();
    z.dedup();
    z
}

fn where_of(p: &Plan) -> String {
    let z = zones(p);
    if z.is_empty() {
        p.region.clone()
    } else {
        z.join(", ")
    }
}

/// The break-even share in words.
fn break_even_words(b: Decimal) -> String {
    if b > Decimal::ONE {
        "never: on demand costs less even used throughout".into()
    } else {
        format!(
            "worth it if used at least {} of the reserved hours",
            percent(b)
        )
    }
}

/// `0.575` as `57.5%`; above 1, said as never paying for itself.
fn percent(d: Decimal) -> String {
    if d > Decimal::ONE {
        "never".into()
    } else {
        format!("{}%", (d * Decimal::from(100)).round_dp(1))
    }
}
