//! `capacity-pilot plan` against the emulator and moto: the search function's queries,
//! pacing and planning with the caller's credentials, buying nothing.

use std::process::Output;

use assert_cmd::Command;
use integration_tests::flow::{BUS, Flow, REGION, t0};
use serde_json::{Value, json};

mod support;

/// A flow, with the stack the CLI reads registered when `stack`.
async fn flow(stack: bool) -> Flow {
    if stack {
        support::deployed(&[], "").await
    } else {
        Flow::start_with(11, &[]).await
    }
}

fn cli(f: &Flow) -> Command {
    support::cli_as(f, "AKIDPLANNER")
}

fn run(f: &Flow, args: &[&str]) -> (String, String, i32) {
    let o: Output = cli(f).args(args).output().expect("the CLI runs");
    (
        String::from_utf8_lossy(&o.stdout).to_string(),
        String::from_utf8_lossy(&o.stderr).to_string(),
        o.status.code().unwrap_or(-1),
    )
}

fn ok(f: &Flow, args: &[&str]) -> String {
    let (out, err, code) = run(f, args);
    assert_eq!(
        code, 0,
        "capacity-pilot {args:?} exited {code}\nstdout: {out}\nstderr: {err}"
    );
    out
}

fn file(name: &str, v: &Value) -> String {
    support::file(name, v).to_string_lossy().to_string()
}

/// How many Capacity Block searches the emulator has answered.
fn block_searches(f: &Flow) -> usize {
    f.cloud.with_world(|w| {
        w.operations
            .get("DescribeCapacityBlockOfferings")
            .copied()
            .unwrap_or(0) as usize
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_stack_plan_makes_at_most_five_block_searches_a_region_and_says_what_it_lacks() {
    // GIVEN no stack, and a request whose queries are seven Capacity Block searches in one
    // region (three types and, split allowed, two lengths of the first ... )
    let f = flow(false).await;
    let mut r = f.ec2_request("plan-nostack");
    r["instance_types"] = json!([
        "p5.48xlarge",
        "p5e.48xlarge",
        "p5en.48xlarge",
        "p4d.24xlarge"
    ]);
    r["allow_split"] = json!(true);
    let path = file("nostack.json", &r);
    // WHEN it is planned
    let before = block_searches(&f);
    let out: Value = serde_json::from_str(&ok(&f, &["plan", &path, "-o", "json"])).unwrap();
    // THEN five were asked, the rest named as not searched, with why
    assert_eq!(block_searches(&f) - before, 5);
    assert_eq!(out["searches"], 5);
    let skipped = out["not_searched"].as_array().unwrap();
    assert_eq!(skipped.len(), 3, "{out}");
    assert!(
        skipped[0]["why"]
            .as_str()
            .unwrap()
            .contains("without a stack"),
        "{out}"
    );
    // ... the settings and the budget say there is no stack, and nothing was bought
    assert_eq!(out["settings"], "built-in defaults (no stack)");
    assert_eq!(out["budget"], Value::Null);
    assert!(!out["plans"].as_array().unwrap().is_empty(), "{out}");
    assert_eq!(f.blocks_for("plan-nostack"), 0);
    let table = ok(&f, &["plan", &path, "-o", "table"]);
    assert!(table.contains("budget: unknown (no stack)"), "{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_stack_plan_takes_its_searches_from_the_deployments_allowance() {
    // GIVEN a deployment, and a request of two Capacity Block searches
    let f = flow(true).await;
    let mut r = f.ec2_request("plan-stack");
    r["instance_types"] = json!(["p5.48xlarge", "p5e.48xlarge"]);
    let path = file("stack.json", &r);
    // WHEN it is planned
    let out: Value = serde_json::from_str(&ok(&f, &["plan", &path, "-o", "json"])).unwrap();
    assert_eq!(out["searches"], 2);
    assert_eq!(out["budget"]["cap_usd"], "250000");
    // THEN the deployment's allowance for the region has those two taken: of its five, three
    // are left for the search function this minute
    let store = f.table.store();
    use capacity_pilot::ports::Pacing;
    let left = store.take_searches(REGION, 5, t0()).await.unwrap();
    assert_eq!(left, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plan_ranked_first_is_what_the_deployment_buys_for_the_same_request() {
    // GIVEN a deployment and a request
    let f = flow(true).await;
    let r = f.ec2_request("plan-then-buy");
    let path = file("buy.json", &r);
    // WHEN it is planned, then submitted once the allowance has refilled
    let out: Value = serde_json::from_str(&ok(&f, &["plan", &path, "-o", "json"])).unwrap();
    let first = out["plans"][0]["offering_ids"].clone();
    assert!(out["plans"][0]["break_even_use"].is_string(), "{out}");
    f.cloud.advance_to(t0() + chrono::TimeDelta::minutes(10));
    ok(&f, &["submit", &path]);
    f.deliver().await;
    // THEN what it bought is the plan ranked first
    let reserved = f.bus("Capacity Reserved");
    assert_eq!(reserved.len(), 1, "{:?}", f.bus("Capacity Offerings Found"));
    let bought = &f.bus("Capacity Offerings Found")[0]["detail"]["plans"][0]["offering_ids"];
    assert_eq!(bought, &first);
    assert_eq!(
        (
            &reserved[0]["detail"]["upfront_fee_usd"],
            &reserved[0]["detail"]["start"]
        ),
        (
            &out["plans"][0]["upfront_fee_usd"],
            &out["plans"][0]["start"]
        ),
        "{reserved:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_shows_each_plans_use_and_break_even_and_each_offering_it_would_not_buy() {
    // GIVEN a request whose cap rules some offerings out
    let f = flow(true).await;
    let mut r = f.ec2_request("plan-table");
    r["budget"]["max_upfront_usd"] = json!("7000");
    r["drain_minutes"] = json!(20);
    let path = file("table.json", &r);
    // WHEN it is planned on a terminal's table
    let table = ok(&f, &["plan", &path, "-o", "table"]);
    // THEN (a snapshot a person has read) the plans, their use and break-even, and every
    // offering not planned with its reason
    insta::assert_snapshot!("plan_table", table);
    assert!(
        table.contains("exceeds the request's max_upfront_usd"),
        "{table}"
    );
    assert!(
        table.contains("pays for itself if the workload runs at least"),
        "{table}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mode_plan_request_ends_planned_debiting_nothing_and_its_id_then_executes_that_plan() {
    // GIVEN a deployment, and a request submitted with `mode: plan`
    let f = flow(true).await;
    let mut r = f.ec2_request("plan-mode");
    r["mode"] = json!("plan");
    ok(&f, &["submit", &file("mode-plan.json", &r)]);
    f.deliver().await;
    f.tick_all().await;
    // THEN it ends Planned with its plans announced, and nothing bought or debited
    let status: Value =
        serde_json::from_str(&ok(&f, &["status", "plan-mode", "-o", "json"])).unwrap();
    assert_eq!(status["status"], "Planned", "{status}");
    assert_eq!(status["spent_usd"], "0");
    assert_eq!(f.blocks_for("plan-mode"), 0);
    assert!(f.bus("Capacity Reserved").is_empty());
    assert_eq!(f.team_spent("team-a", t0()).await.0, 0);
    let planned =
        f.bus_for("Capacity Offerings Found", "plan-mode")[0]["detail"]["plans"][0].clone();

    // WHEN the same id is submitted again to execute, once the allowance has refilled
    f.cloud.advance_to(t0() + chrono::TimeDelta::minutes(10));
    r["mode"] = json!("execute");
    ok(&f, &["submit", &file("mode-execute.json", &r)]);
    f.deliver().await;
    // THEN it is a new request (not a duplicate), and it buys the plan announced first
    let reserved = f.bus_for("Capacity Reserved", "plan-mode");
    assert_eq!(reserved.len(), 1, "{:?}", f.cloud.events(BUS));
    assert_eq!(
        (
            &reserved[0]["detail"]["upfront_fee_usd"],
            &reserved[0]["detail"]["start"]
        ),
        (&planned["upfront_fee_usd"], &planned["start"])
    );
    let history: Value =
        serde_json::from_str(&ok(&f, &["history", "plan-mode", "-o", "json"])).unwrap();
    assert_eq!(history[0]["to"], "Accepted");
    assert_eq!(history[0]["from"], Value::Null);
}

/// The seeded GPU template's id in `region`: an `lt-` id exists in that region only.
fn template_in(f: &Flow, region: &str) -> String {
    f.cloud.with_world(|w| {
        w.launch_templates(region)
            .into_iter()
            .find(|t| t.name == "capacity-pilot-gpu")
            .expect("the seeded GPU template")
            .id
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offering_where_the_launch_template_does_not_resolve_is_not_planned_saying_why() {
    // GIVEN a request for us-east-1 naming its template by us-west-2's id
    let f = flow(true).await;
    let mut r = f.ec2_request("plan-template");
    r["workload"]["launch_template"] = json!({"id": template_in(&f, "us-west-2")});
    let path = file("template.json", &r);
    // WHEN it is planned (reads only)
    let out: Value = serde_json::from_str(&ok(&f, &["plan", &path, "-o", "json"])).unwrap();
    // THEN no plan is made, and every offering says the template does not resolve there
    assert_eq!(out["plans"], json!([]), "{out}");
    let rejections = out["rejections"].as_array().expect("rejections");
    assert!(!rejections.is_empty(), "{out}");
    for rj in rejections {
        let why = rj["reason"].as_str().unwrap();
        assert!(
            why.contains("pre-flight: launch template lt-")
                && why.contains("InvalidLaunchTemplateId.NotFound")
                && why.contains("exists in one region only"),
            "{why}"
        );
    }
    // AND no dry run was made
    assert_eq!(
        f.cloud
            .with_world(|w| w.operations.get("RunInstances").copied().unwrap_or(0)),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_preflight_dry_runs_each_zone_and_an_unauthorized_launch_rejects_its_offerings() {
    // GIVEN a deployment and an EC2 request
    let f = flow(true).await;
    let r = f.ec2_request("plan-preflight");
    let path = file("preflight.json", &r);
    // WHEN it is planned with --preflight
    let passed: Value =
        serde_json::from_str(&ok(&f, &["plan", &path, "--preflight", "-o", "json"])).unwrap();
    // THEN each zone's launch was dry-run, nothing launched, and the plans stand
    let dry_runs = f
        .cloud
        .with_world(|w| w.operations.get("RunInstances").copied().unwrap_or(0));
    assert!(dry_runs >= 1, "{passed}");
    assert!(
        f.cloud.with_world(|w| w.ec2.instances.is_empty()),
        "a dry run launches nothing"
    );
    assert!(!passed["plans"].as_array().unwrap().is_empty(), "{passed}");
    assert_eq!(passed["preflight"], "reads and RunInstances dry runs");

    // WHEN the caller may not launch (EC2 answers UnauthorizedOperation) and plans again
    f.cloud.inject(local_cloud::world::Fault::error(
        "RunInstances",
        403,
        "UnauthorizedOperation",
        "You are not authorized to perform this operation.",
        None,
    ));
    f.cloud.advance_to(t0() + chrono::TimeDelta::minutes(10));
    let refused: Value =
        serde_json::from_str(&ok(&f, &["plan", &path, "--preflight", "-o", "json"])).unwrap();
    // THEN no plan is made, each offering rejected for it with what to grant
    assert_eq!(refused["plans"], json!([]), "{refused}");
    let rejections = refused["rejections"].as_array().unwrap();
    assert!(
        rejections.iter().any(|rj| {
            let why = rj["reason"].as_str().unwrap();
            why.contains("RunInstances dry run")
                && why.contains("UnauthorizedOperation")
                && why.contains("iam:PassRole")
        }),
        "{refused}"
    );
    // AND the table says the refusal per offering, and what to do once
    let table = ok(&f, &["plan", &path, "--preflight", "-o", "table"]);
    assert!(
        table.contains("answered") && table.contains("UnauthorizedOperation"),
        "{table}"
    );
    assert_eq!(
        table.matches("so: the launching role needs").count(),
        1,
        "{table}"
    );
    // AND without --preflight the same plans stand (reads only)
    f.cloud.advance_to(t0() + chrono::TimeDelta::minutes(20));
    let reads: Value = serde_json::from_str(&ok(&f, &["plan", &path, "-o", "json"])).unwrap();
    assert!(!reads["plans"].as_array().unwrap().is_empty(), "{reads}");
}
