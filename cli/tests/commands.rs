//! The CLI binary against the offline stand-ins, over HTTP as a user's machine talks to AWS:
//! the emulator answers CloudFormation, STS and EventBridge, moto's DynamoDB holds the
//! flow's table, and the five functions (the flows' production wiring) move the requests the
//! CLI puts on the bus. Table and JSON outputs are snapshots (`cli/tests/snapshots/`;
//! `INSTA_UPDATE=always` rewrites them after a deliberate change, to be read in review).

use std::path::Path;
use std::process::Output;

use assert_cmd::Command;
use integration_tests::flow::{APPROVER, BUS, Flow, Function, REGION, SOURCE};
use serde_json::{Value, json};

mod support;
use support::{APPROVER_ARN, cli, cli_as, deployed, file};

fn run(c: &mut Command, args: &[&str]) -> Output {
    c.args(args).output().expect("the CLI runs")
}

fn text(o: &Output) -> (String, String, i32) {
    (
        String::from_utf8_lossy(&o.stdout).to_string(),
        String::from_utf8_lossy(&o.stderr).to_string(),
        o.status.code().unwrap_or(-1),
    )
}

/// Runs, asserting the exit code, and gives stdout.
fn ok(c: &mut Command, args: &[&str]) -> String {
    let o = run(c, args);
    let (out, err, code) = text(&o);
    assert_eq!(
        code, 0,
        "capacity-pilot {args:?} exited {code}\nstdout: {out}\nstderr: {err}"
    );
    out
}

fn fails(c: &mut Command, args: &[&str], want: i32) -> String {
    let o = run(c, args);
    let (out, err, code) = text(&o);
    assert_eq!(
        code, want,
        "capacity-pilot {args:?} exited {code}, not {want}\nstdout: {out}\nstderr: {err}"
    );
    err
}

/// The seeded launch template's name and every subnet, for `new`.
fn template_and_subnets(f: &Flow) -> (String, String) {
    f.cloud.with_world(|w| {
        let t = w
            .launch_templates(REGION)
            .into_iter()
            .find(|t| t.name == "capacity-pilot-gpu")
            .expect("the seeded GPU template")
            .name
            .to_string();
        let s: Vec<String> = w.subnets(REGION).into_iter().map(|s| s.id).collect();
        (t, s.join(","))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_writes_a_request_whose_placeholders_submit_names_and_filled_in_it_is_accepted() {
    // GIVEN a deployed stack and a request `new` wrote without a launch template or subnets
    let f = deployed(&[], "").await;
    let draft: Value = serde_json::from_str(&ok(
        &mut cli(&f),
        &[
            "new",
            "--gpus",
            "H100:32",
            "--hours",
            "48",
            "--start",
            "2026-12-02",
            "--by",
            "2026-12-20",
            "--team",
            "team-a",
        ],
    ))
    .expect("new writes JSON");
    assert_eq!(draft["instance_types"], json!(["p5.48xlarge"]));
    assert_eq!(draft["instance_count"], 4);
    assert_eq!(draft["latest_end"], "2026-12-20T11:30:00Z");

    // WHEN it is submitted as written
    let before = f.bus("Capacity Request Submitted").len();
    let err = fails(
        &mut cli(&f),
        &["submit", file("draft.json", &draft).to_str().unwrap()],
        3,
    );
    // THEN each placeholder is named at its field, and nothing reached the bus
    assert!(
        err.contains("workload.launch_template.name: is the placeholder"),
        "{err}"
    );
    assert!(
        err.contains("workload.subnet_ids[0]: is the placeholder"),
        "{err}"
    );
    assert_eq!(f.bus("Capacity Request Submitted").len(), before);

    // WHEN a whole event is submitted (the README's validation step: an invalid sample)
    let sample = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../infra/events/requests/invalid/many-fields.json");
    let err = fails(&mut cli(&f), &["submit", sample.to_str().unwrap()], 3);
    // THEN its detail is the request, refused naming each field at fault, and nothing is put
    for field in ["instance_types[1]", "instance_count", "workload.subnet_ids"] {
        assert!(err.contains(&format!("{field}: ")), "{field}: {err}");
    }
    assert!(!err.contains("detail-type"), "{err}");
    assert_eq!(f.bus("Capacity Request Submitted").len(), before);

    // WHEN `new` is told them, and the request is submitted
    let (template, subnets) = template_and_subnets(&f);
    let full = ok(
        &mut cli(&f),
        &[
            "new",
            "--gpus",
            "H100:32",
            "--hours",
            "48",
            "--start",
            "2026-12-02",
            "--by",
            "2026-12-20",
            "--team",
            "team-a",
            "--id",
            "cli-new",
            "--launch-template",
            &template,
            "--subnets",
            &subnets,
        ],
    );
    let path = file("full.json", &serde_json::from_str(&full).unwrap());
    let out = ok(
        &mut cli(&f),
        &["submit", path.to_str().unwrap(), "-o", "json"],
    );
    let put: Value = serde_json::from_str(&out).unwrap();
    // THEN it is put as the stack's first request source, and the functions record it
    assert_eq!(put["request_id"], "cli-new");
    assert_eq!(put["source"], SOURCE);
    let submitted = f.bus("Capacity Request Submitted");
    assert_eq!(submitted.last().unwrap()["source"], SOURCE);
    f.deliver().await;
    let status: Value =
        serde_json::from_str(&ok(&mut cli(&f), &["status", "cli-new", "-o", "json"])).unwrap();
    assert_eq!(status["status"], "Reserved", "{status}");
    assert_eq!(status["windows"].as_array().unwrap().len(), 1, "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_file_names_every_field_at_fault_exits_3_and_sends_nothing() {
    let f = deployed(&[], "").await;
    // GIVEN a request with three faults and one unknown field
    let mut bad = f.ec2_request("cli-bad");
    bad["instance_count"] = json!(0);
    bad["duration_hours"] = json!(30);
    bad["team"] = json!("");
    bad["colour"] = json!("blue");
    // WHEN it is submitted
    let err = fails(
        &mut cli(&f),
        &["submit", file("bad.json", &bad).to_str().unwrap()],
        3,
    );
    // THEN every field is named, in the schema's order, and the bus got nothing
    insta::assert_snapshot!(
        "submit_bad_file",
        err.replace(&std::env::temp_dir().display().to_string(), "$TMP")
            .replace(
                &format!("capacity-pilot-cli-{}", std::process::id()),
                "$DIR"
            )
    );
    assert!(f.bus("Capacity Request Submitted").is_empty());
    // AND a file that is not there says so (4), stdin that is not a request too (3)
    fails(&mut cli(&f), &["submit", "/nonexistent/request.json"], 4);
    let mut c = cli(&f);
    c.write_stdin("[1, 2");
    fails(&mut c, &["submit", "-"], 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_stack_or_request_says_so_and_exits_4() {
    let f = deployed(&[], "").await;
    let err = fails(
        &mut cli(&f),
        &["status", "nobody", "--stack", "not-deployed"],
        4,
    );
    assert!(
        err.contains("no stack named \"not-deployed\" in us-east-1"),
        "{err}"
    );
    for args in [
        vec!["status", "nobody"],
        vec!["history", "nobody"],
        vec!["approve", "nobody", "--yes", "--max-fee", "1"],
        vec!["cancel", "nobody"],
    ] {
        let err = fails(&mut cli(&f), &args, 4);
        assert!(err.contains("no request \"nobody\""), "{args:?}: {err}");
    }
    // ... and a bad command line is a usage error (2)
    fails(&mut cli(&f), &["status"], 2);
    fails(&mut cli(&f), &["list", "--status", "Sleeping"], 2);
    fails(&mut cli(&f), &["approve", "x", "--yes"], 2);
}

/// A request bought through the functions, then read through every reading command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_list_history_and_budget_read_a_bought_request_as_tables_and_json() {
    let f = deployed(&[], "").await;
    let path = file("bought.json", &f.ec2_request("cli-bought"));
    ok(&mut cli(&f), &["submit", path.to_str().unwrap()]);
    f.deliver().await;
    for (name, args) in [
        ("status_table", vec!["status", "cli-bought", "-o", "table"]),
        ("status_json", vec!["status", "cli-bought", "-o", "json"]),
        ("list_table", vec!["list", "-o", "table"]),
        (
            "list_json",
            vec!["list", "--team", "TEAM-A", "--live", "-o", "json"],
        ),
        (
            "history_table",
            vec!["history", "cli-bought", "-o", "table"],
        ),
        (
            "budget_table",
            vec!["budget", "--team", "team-a", "-o", "table"],
        ),
        ("budget_json", vec!["budget", "-o", "json"]),
    ] {
        let out = ok(&mut cli(&f), &args);
        let out = if name.ends_with("_json") {
            canonical(&out)
        } else {
            out
        };
        insta::assert_snapshot!(name, out);
    }
    // AND filters that match nothing say so
    let none = ok(&mut cli(&f), &["list", "--status", "Failed", "-o", "table"]);
    assert_eq!(none.trim(), "no requests match");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approve_answers_the_plan_awaiting_approval_with_its_key_and_refuses_another() {
    // GIVEN a deployment that asks an approver above $1, and a request awaiting approval
    let f = deployed(
        &[("APPROVE_ABOVE_USD", "1")],
        "arn:aws:iam::123456789012:role/capacity-approver",
    )
    .await;
    let path = file("approve.json", &f.ec2_request("cli-approve"));
    ok(&mut cli(&f), &["submit", path.to_str().unwrap()]);
    f.deliver().await;
    let status: Value =
        serde_json::from_str(&ok(&mut cli(&f), &["status", "cli-approve", "-o", "json"])).unwrap();
    assert_eq!(status["status"], "AwaitingApproval", "{status}");
    let key = status["awaiting_approval"]["approves"]
        .as_str()
        .unwrap()
        .to_string();
    let fee = status["awaiting_approval"]["upfront_fee_usd"]
        .as_str()
        .unwrap()
        .to_string();
    let announced = f.bus_for("Capacity Purchase Awaiting Approval", "cli-approve");
    assert!(
        announced[0]["detail"]["event_key"]
            .as_str()
            .unwrap()
            .starts_with(&key),
        "{announced:?}"
    );

    // WHEN an approval names another plan's key, or caps the fee below it
    let err = fails(
        &mut cli_as(&f, "AKIDAPPROVER"),
        &[
            "approve",
            "cli-approve",
            "--yes",
            "--key",
            "cli-approve:awaiting-approval:other",
        ],
        6,
    );
    assert!(
        err.contains(&key),
        "the refusal names the current key: {err}"
    );
    fails(
        &mut cli_as(&f, "AKIDAPPROVER"),
        &["approve", "cli-approve", "--yes", "--max-fee", "1"],
        6,
    );
    // THEN nothing was put
    assert!(f.bus("Capacity Purchase Approved").is_empty());
    // ... and without --yes off a terminal it asks for one (2)
    fails(
        &mut cli_as(&f, "AKIDAPPROVER"),
        &["approve", "cli-approve"],
        2,
    );

    // WHEN the approver approves within the fee
    let out = ok(
        &mut cli_as(&f, "AKIDAPPROVER"),
        &[
            "approve",
            "cli-approve",
            "--yes",
            "--max-fee",
            &fee,
            "-o",
            "json",
        ],
    );
    let sent: Value = serde_json::from_str(&out).unwrap();
    // THEN the decision names the caller and the key, from the approver source, and buys
    let approved = f.bus("Capacity Purchase Approved");
    assert_eq!(approved.len(), 1);
    assert_eq!(approved[0]["source"], APPROVER);
    assert_eq!(approved[0]["detail"]["approver"], APPROVER_ARN);
    assert_eq!(approved[0]["detail"]["approves"], key.as_str());
    assert_eq!(sent["approver"], APPROVER_ARN);
    f.deliver().await;
    assert_eq!(f.status("cli-approve").await.as_str(), "Reserved");
    // AND approving again is refused: nothing awaits approval (6)
    let err = fails(
        &mut cli_as(&f, "AKIDAPPROVER"),
        &["approve", "cli-approve", "--yes", "--key", &key],
        6,
    );
    assert!(err.contains("not awaiting approval"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_put_exits_6_naming_approver_principals_when_none_are_configured() {
    // GIVEN a stack with no ApproverPrincipals and a request awaiting approval
    let f = deployed(&[("APPROVE_ABOVE_USD", "1")], "").await;
    let path = file("denied.json", &f.ec2_request("cli-denied"));
    ok(&mut cli(&f), &["submit", path.to_str().unwrap()]);
    f.deliver().await;
    let key =
        f.bus_for("Capacity Purchase Awaiting Approval", "cli-denied")[0]["detail"]["event_key"]
            .as_str()
            .unwrap()
            .to_string();
    // WHEN the bus denies the decision, as its policy denies approver sources to others
    f.cloud.with_world(|w| {
        w.faults.push(local_cloud::world::Fault::error(
            "PutEvents",
            400,
            "AccessDeniedException",
            "User is not authorized to perform: events:PutEvents",
            Some(1),
        ))
    });
    let err = fails(
        &mut cli(&f),
        &["approve", "cli-denied", "--yes", "--key", &key],
        6,
    );
    // THEN it says why
    assert!(
        err.contains("no approver principals configured (ApproverPrincipals)"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_the_bus_fails_exits_5_and_says_nothing_was_sent() {
    let f = deployed(&[], "").await;
    f.cloud.with_world(|w| {
        w.faults.push(local_cloud::world::Fault {
            operation: "PutEvents".into(),
            kind: local_cloud::world::FaultKind::InternalError,
            count: None,
        })
    });
    let path = file("fails.json", &f.ec2_request("cli-fails"));
    let err = fails(&mut cli(&f), &["submit", path.to_str().unwrap()], 5);
    assert!(err.contains("nothing was sent"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_lists_the_paid_windows_that_run_on_and_stop_running_asks_to_stop_them() {
    // GIVEN a bought request whose payment has cleared
    let f = deployed(&[], "").await;
    let path = file("cancel.json", &f.ec2_request("cli-cancel"));
    ok(&mut cli(&f), &["submit", path.to_str().unwrap()]);
    f.deliver().await;
    f.cloud
        .advance_to(integration_tests::flow::t0() + chrono::TimeDelta::minutes(15));
    f.tick(Function::Purchase).await.unwrap();
    // WHEN it is cancelled
    let out = ok(
        &mut cli(&f),
        &[
            "cancel",
            "cli-cancel",
            "--reason",
            "called off",
            "-o",
            "table",
        ],
    );
    // THEN its paid window is listed with its drain, and the cancellation asks no stop ...
    insta::assert_snapshot!("cancel_table", redact_event(&out));
    let sent = f.bus("Capacity Request Cancelled");
    assert_eq!(
        sent.last().unwrap()["detail"],
        json!({"request_id": "cli-cancel", "reason": "called off"})
    );
    // ... and the functions answer it, keeping the window
    f.deliver().await;
    let refused = f.bus_for("Capacity Cancellation Refused", "cli-cancel");
    assert_eq!(refused.len(), 1, "{:?}", f.cloud.events(BUS));
    assert_eq!(
        refused[0]["detail"]["kept_windows"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    // WHEN it is cancelled again with --stop-running
    ok(
        &mut cli(&f),
        &["cancel", "cli-cancel", "--stop-running", "-o", "json"],
    );
    // THEN the event asks for it
    assert_eq!(
        f.bus("Capacity Request Cancelled").last().unwrap()["detail"]["stop_running"],
        true
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_holds_back_every_purchase_until_resume_and_status_shows_it() {
    // GIVEN a deployed stack whose purchases an operator pauses
    let f = deployed(&[], "").await;
    let paused = ok(
        &mut cli(&f),
        &["pause", "--reason", "budget review", "-o", "table"],
    );
    assert!(
        paused.contains("purchases paused by arn:") && paused.contains("budget review"),
        "{paused}"
    );
    assert!(paused.contains("no purchase was under way"), "{paused}");
    // AND pausing again is refused, naming the pause that stands
    let again = fails(&mut cli(&f), &["pause", "--reason", "other"], 6);
    assert!(
        again.contains("already paused") && again.contains("budget review"),
        "{again}"
    );
    // AND a pause must say why
    fails(&mut cli(&f), &["pause", "--reason", " "], 2);

    // WHEN a request is submitted and the functions run
    let path = file("paused.json", &f.ec2_request("cli-paused"));
    ok(&mut cli(&f), &["submit", path.to_str().unwrap()]);
    f.deliver().await;
    // THEN its plan is found but not bought, and status says why, with the pause
    let status: Value =
        serde_json::from_str(&ok(&mut cli(&f), &["status", "cli-paused", "-o", "json"])).unwrap();
    assert_eq!(status["status"], "OfferingsFound", "{status}");
    assert!(
        status["reason"].as_str().unwrap().starts_with("paused by"),
        "{status}"
    );
    assert_eq!(status["purchases_paused"]["reason"], "budget review");
    assert!(
        status["next_action"]
            .as_str()
            .unwrap()
            .contains("capacity-pilot resume"),
        "{status}"
    );
    let table = ok(&mut cli(&f), &["status", "cli-paused", "-o", "table"]);
    assert!(
        table.contains("paused") && table.contains("capacity-pilot resume"),
        "{table}"
    );
    let history = ok(&mut cli(&f), &["history", "cli-paused", "-o", "table"]);
    assert!(history.contains("budget review"), "{history}");

    // WHEN purchases resume and the purchase function runs
    let resumed = ok(&mut cli(&f), &["resume", "-o", "table"]);
    assert!(resumed.contains("purchases resumed"), "{resumed}");
    assert!(ok(&mut cli(&f), &["resume", "-o", "table"]).contains("were not paused"));
    f.tick(Function::Purchase).await.unwrap();
    // THEN it is bought
    assert_eq!(f.status("cli-paused").await.as_str(), "Reserved");
}

/// JSON `text` with every object's keys sorted: what serde_json writes keeps insertion order
/// when a crate of the build turns on its `preserve_order` feature (a workspace build does),
/// so a snapshot holds the content, not the build's order.
fn canonical(text: &str) -> String {
    fn sorted(v: &Value) -> Value {
        match v {
            Value::Object(m) => {
                let mut keys: Vec<&String> = m.keys().collect();
                keys.sort();
                let mut out = serde_json::Map::new();
                for k in keys {
                    out.insert(k.clone(), sorted(&m[k]));
                }
                Value::Object(out)
            }
            Value::Array(a) => Value::Array(a.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }
    let v: Value = serde_json::from_str(text).expect("JSON output");
    serde_json::to_string_pretty(&sorted(&v)).unwrap()
}

/// `text` with the emulator's event ids replaced, so a snapshot holds what a person reads.
fn redact_event(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find("(event ") {
        out.push_str(&rest[..i + 7]);
        rest = &rest[i + 7..];
        let end = rest.find([')', ',']).unwrap_or(rest.len());
        out.push_str("<event id>");
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

#[test]
fn completions_are_written_for_each_shell() {
    for shell in ["bash", "zsh", "fish"] {
        let out = Command::cargo_bin("capacity-pilot")
            .unwrap()
            .args(["completions", shell])
            .output()
            .unwrap();
        assert!(out.status.success());
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("approve"),
            "{shell}"
        );
    }
}

/// An inference endpoint request for `endpoint`, from the CLI's `new`.
fn endpoint_request(f: &Flow, id: &str, endpoint: &str) -> std::path::PathBuf {
    let text = ok(
        &mut cli(f),
        &[
            "new",
            "--gpus",
            "H100:8",
            "--kind",
            "inference-endpoint",
            "--hours",
            "24",
            "--start",
            "2026-12-02",
            "--by",
            "2026-12-20",
            "--team",
            "team-c",
            "--id",
            id,
            "--model",
            "workshop-llm",
            "--endpoint",
            endpoint,
        ],
    );
    file(&format!("{id}.json"), &serde_json::from_str(&text).unwrap())
}

/// Runs the CLI while the flow delivers what reaches the bus, as the deployment would.
async fn delivering(f: &Flow, mut c: Command, args: &[&str]) -> Output {
    c.args(args);
    let run = tokio::task::spawn_blocking(move || c.output());
    tokio::pin!(run);
    loop {
        tokio::select! {
            o = &mut run => return o.expect("the CLI's thread").expect("the CLI runs"),
            _ = tokio::time::sleep(std::time::Duration::from_millis(300)) => {
                f.deliver().await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_wait_follows_a_request_to_accepted_or_to_the_deployments_rejection() {
    // GIVEN a stack, and an endpoint request accepted through `submit --wait`
    let f = deployed(&[], "").await;
    let first = endpoint_request(&f, "cli-first", "workshop-llm");
    let o = delivering(
        &f,
        cli(&f),
        &["submit", first.to_str().unwrap(), "--wait", "-o", "table"],
    )
    .await;
    let (out, err, code) = text(&o);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("cli-first is "), "{out}");
    // WHEN a second request claims the same endpoint name over the same days: the file is
    // valid, so only the deployment can refuse it
    let second = endpoint_request(&f, "cli-second", "workshop-llm");
    let o = delivering(&f, cli(&f), &["submit", second.to_str().unwrap(), "--wait"]).await;
    // THEN --wait reads the rejection the search function kept, and exits 3 naming the field
    let (out, err, code) = text(&o);
    assert_eq!(code, 3, "{out}\n{err}");
    assert!(err.contains("rejected by the deployment"), "{err}");
    assert!(err.contains("workload.endpoint_name"), "{err}");
    // AND `status` of the id says why no request is recorded
    let err = fails(&mut cli(&f), &["status", "cli-second"], 4);
    assert!(
        err.contains("was rejected at 2026-12-01 09:00 UTC"),
        "{err}"
    );
    assert!(err.contains("workload.endpoint_name"), "{err}");
}

#[test]
fn types_and_new_print_the_catalogue_and_a_request_without_calling_aws() {
    // GIVEN no AWS at all: no endpoint, no region, no credentials
    let bare = || {
        let mut c = Command::cargo_bin("capacity-pilot").unwrap();
        c.env_clear().env("NO_COLOR", "1");
        c
    };
    // THEN the catalogue prints as a table and as JSON ...
    insta::assert_snapshot!("types_table", ok(&mut bare(), &["types", "-o", "table"]));
    insta::assert_snapshot!(
        "types_h200_json",
        canonical(&ok(&mut bare(), &["types", "--gpu", "h200", "-o", "json"]))
    );
    // ... and `new` writes a request, saying on stderr what it chose and what is left to fill
    let o = run(
        &mut bare(),
        &[
            "new",
            "--gpus",
            "H200:12",
            "--hours",
            "72",
            "--start",
            "2026-12-07",
            "--by",
            "2026-12-14",
            "--team",
            "ml-eval",
        ],
    );
    let (out, err, code) = text(&o);
    assert_eq!(code, 0, "{err}");
    insta::assert_snapshot!("new_stdout", out);
    insta::assert_snapshot!("new_stderr", err);
    // AND what it cannot do is a usage error naming the flag
    let err = fails(
        &mut bare(),
        &[
            "new",
            "--gpus",
            "H100",
            "--hours",
            "48",
            "--start",
            "2026-12-07",
            "--by",
            "2026-12-14",
        ],
        2,
    );
    assert!(err.contains("--gpus \"H100\""), "{err}");
    let err = fails(
        &mut bare(),
        &[
            "new",
            "--gpus",
            "H100:8",
            "--hours",
            "30",
            "--start",
            "2026-12-07",
            "--by",
            "2026-12-14",
        ],
        2,
    );
    assert!(err.contains("--hours 30"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reject_ends_the_request_and_watch_shows_its_changes_until_it_has_ended() {
    // GIVEN a request awaiting approval
    let f = deployed(
        &[("APPROVE_ABOVE_USD", "1")],
        "arn:aws:iam::123456789012:role/capacity-approver",
    )
    .await;
    let path = file("reject.json", &f.ec2_request("cli-reject"));
    ok(&mut cli(&f), &["submit", path.to_str().unwrap()]);
    f.deliver().await;
    let key =
        f.bus_for("Capacity Purchase Awaiting Approval", "cli-reject")[0]["detail"]["event_key"]
            .as_str()
            .unwrap()
            .to_string();
    // WHEN the approver rejects it, naming the key the event carried
    let out = ok(
        &mut cli_as(&f, "AKIDAPPROVER"),
        &[
            "reject",
            "cli-reject",
            "--yes",
            "--key",
            &key,
            "--comment",
            "too early",
            "-o",
            "table",
        ],
    );
    assert!(out.starts_with("rejected cli-reject:\n  "), "{out}");
    f.deliver().await;
    // THEN the request ends Rejected with nothing bought, and watch prints each change and
    // stops
    let rejected = f.bus("Capacity Purchase Rejected");
    // (the current plan's key, as the function checks it: the event's key up to its `:v<n>`)
    let sent = rejected[0]["detail"]["approves"].as_str().unwrap();
    assert!(key.starts_with(&format!("{sent}:v")), "{sent} / {key}");
    insta::assert_snapshot!(
        "watch_ended",
        ok(&mut cli(&f), &["watch", "cli-reject", "-o", "table"])
    );
    assert_eq!(f.blocks_for("cli-reject"), 0);
}

/// Runs a test's body as `#[tokio::test(flavor = "multi_thread", worker_threads = 2)]`
/// does, but on a thread (and workers) with 16 MiB stacks: purchase-capacity's extension
/// protocol, polled in a debug build, needs more than a test thread's 2 MiB.
fn on_big_stack<F>(body: F)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    const STACK: usize = 16 << 20;
    std::thread::Builder::new()
        .stack_size(STACK)
        .spawn(move || {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_stack_size(STACK)
                .enable_all()
                .build()
                .expect("a runtime")
                .block_on(body)
        })
        .expect("the test's thread")
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// [`Flow::ec2_request`] whose reservations may be extended by up to `max_hours`.
fn extendable_request(f: &Flow, id: &str, max_hours: u32) -> std::path::PathBuf {
    let mut r = f.ec2_request(id);
    r["extend"] = json!({"when": "requested", "max_hours": max_hours, "max_upfront_usd": "100000"});
    file(&format!("{id}.json"), &r)
}

/// Submits `path` and lets the functions buy it, the payment taken: a bought request.
async fn bought(f: &Flow, path: &Path) {
    ok(&mut cli(f), &["submit", path.to_str().unwrap()]);
    Box::pin(f.deliver()).await;
    settle(f).await;
}

/// Lets the emulator's payments clear, and the purchase function read them.
async fn settle(f: &Flow) {
    f.cloud.step(chrono::TimeDelta::minutes(15));
    Box::pin(f.tick(Function::Purchase)).await.unwrap();
    Box::pin(f.deliver()).await;
}

/// Delivers what reached the bus: the `Capacity Extension Requested` events from the CLI
/// go to purchase-capacity, by the template's rule or, where it has none yet, directly.
async fn deliver_asks(f: &Flow, from: usize) {
    for ev in f.bus("Capacity Extension Requested").into_iter().skip(from) {
        if Function::for_event(BUS, &ev).is_empty() {
            Box::pin(f.invoke(Function::Purchase, serde_json::from_value(ev).unwrap()))
                .await
                .expect("purchase-capacity takes the ask");
        }
    }
    Box::pin(f.deliver()).await;
}

#[test]
fn extend_refuses_locally_what_cannot_be_bought_then_asks_and_status_shows_the_extension() {
    on_big_stack(extend_refuses_locally_then_asks());
}

async fn extend_refuses_locally_then_asks() {
    // GIVEN a bought request whose reservations may be extended by 48 h, and one without
    // `extend`
    let f = deployed(&[], "").await;
    Box::pin(bought(&f, &extendable_request(&f, "cli-extend", 48))).await;
    Box::pin(bought(&f, &file("plain.json", &f.ec2_request("cli-plain")))).await;
    assert_eq!(f.status("cli-extend").await.as_str(), "Reserved");

    // WHEN an extension is asked for that cannot be bought, THEN each says why and what to
    // do, with the exit code of its kind, and nothing reaches the bus
    for (args, code, says) in [
        (
            vec!["extend", "cli-extend", "--hours", "30", "--yes"],
            2,
            "whole days given as hours",
        ),
        (
            vec!["extend", "cli-extend", "--hours", "360", "--yes"],
            2,
            "whole weeks",
        ),
        (
            vec!["extend", "cli-extend", "--hours", "24"],
            2,
            "pass --yes",
        ),
        (
            vec!["extend", "nobody", "--hours", "24", "--yes"],
            4,
            "no request \"nobody\"",
        ),
        (
            vec!["extend", "cli-plain", "--hours", "24", "--yes"],
            6,
            "submitted without `extend`",
        ),
        (
            vec!["extend", "cli-extend", "--hours", "72", "--yes"],
            6,
            "over extend.max_hours: 72 h on top of the 0 h extended so far is more than 48",
        ),
        (
            vec![
                "extend",
                "cli-extend",
                "--hours",
                "24",
                "--reservation",
                "cr-0000000000000000f",
                "--yes",
            ],
            4,
            "is not a reservation of cli-extend",
        ),
    ] {
        let err = fails(&mut cli(&f), &args, code);
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(
            code == 4 || err.contains("nothing was sent") || code == 2,
            "{args:?}: {err}"
        );
    }
    assert!(f.bus("Capacity Extension Requested").is_empty());

    // WHEN it asks for a day
    let out = ok(
        &mut cli(&f),
        &[
            "extend",
            "cli-extend",
            "--hours",
            "24",
            "--yes",
            "-o",
            "table",
        ],
    );
    // THEN the ask is put as the request source, and says what comes next
    assert!(
        out.starts_with("extension asked for cli-extend (event "),
        "{out}"
    );
    assert!(
        out.contains("Capacity Extension Offered")
            && out.contains("capacity-pilot status cli-extend"),
        "{out}"
    );
    let asked = f.bus("Capacity Extension Requested");
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0]["source"], SOURCE);
    assert_eq!(
        asked[0]["detail"],
        json!({"request_id": "cli-extend", "hours": 24})
    );
    // AND purchase-capacity prices and buys it, and status shows it on its reservation
    Box::pin(deliver_asks(&f, 0)).await;
    assert_eq!(
        f.bus_for("Capacity Extension Offered", "cli-extend").len(),
        1,
        "{:?}",
        f.bus_for("Capacity Extension Failed", "cli-extend")
    );
    let status: Value =
        serde_json::from_str(&ok(&mut cli(&f), &["status", "cli-extend", "-o", "json"])).unwrap();
    let x = &status["extensions"][0];
    assert_eq!(x["extension"], 1, "{status}");
    assert_eq!(x["hours"], 24, "{status}");
    assert!(x["upfront_fee_usd"].is_string(), "{status}");
    assert_eq!(x["approves"], Value::Null, "{status}");
    assert_eq!(status["extend"]["used_hours"], 24, "{status}");
    let table = ok(&mut cli(&f), &["status", "cli-extend", "-o", "table"]);
    assert!(
        table.contains("EXTENSION") && table.contains("NEW END"),
        "{table}"
    );
    assert!(table.contains("requested: 24 of 48 h"), "{table}");
    // AND while it is not settled, another is refused: AWS takes one at a time
    if x["state"] == "buying" || x["state"] == "payment-pending" {
        let err = fails(
            &mut cli(&f),
            &["extend", "cli-extend", "--hours", "24", "--yes"],
            6,
        );
        assert!(err.contains("AWS takes one at a time"), "{err}");
    }
}

#[test]
fn approve_answers_an_extension_awaiting_approval_by_its_own_key() {
    on_big_stack(approve_an_extension());
}

async fn approve_an_extension() {
    // GIVEN a deployment that asks an approver above $1, and a bought request whose
    // extension waits for one
    let f = deployed(
        &[("APPROVE_ABOVE_USD", "1")],
        "arn:aws:iam::123456789012:role/capacity-approver",
    )
    .await;
    ok(
        &mut cli(&f),
        &[
            "submit",
            extendable_request(&f, "cli-xapprove", 96).to_str().unwrap(),
        ],
    );
    Box::pin(f.deliver()).await;
    let status: Value =
        serde_json::from_str(&ok(&mut cli(&f), &["status", "cli-xapprove", "-o", "json"])).unwrap();
    let plan_key = status["awaiting_approval"]["approves"]
        .as_str()
        .unwrap()
        .to_string();
    ok(
        &mut cli_as(&f, "AKIDAPPROVER"),
        &["approve", "cli-xapprove", "--yes", "--key", &plan_key],
    );
    Box::pin(f.deliver()).await;
    Box::pin(settle(&f)).await;
    assert_eq!(f.status("cli-xapprove").await.as_str(), "Reserved");
    ok(
        &mut cli(&f),
        &["extend", "cli-xapprove", "--hours", "48", "--yes"],
    );
    Box::pin(deliver_asks(&f, 0)).await;
    let asking = f.bus_for("Capacity Extension Awaiting Approval", "cli-xapprove");
    assert_eq!(asking.len(), 1, "{:?}", f.cloud.events(BUS));
    let key = asking[0]["detail"]["event_key"]
        .as_str()
        .unwrap()
        .to_string();
    // THEN status shows the extension waiting, with the key an approver names
    let status: Value =
        serde_json::from_str(&ok(&mut cli(&f), &["status", "cli-xapprove", "-o", "json"])).unwrap();
    let x = &status["extensions"][0];
    assert_eq!(x["state"], "awaiting-approval", "{status}");
    assert_eq!(x["approves"], key.as_str(), "{status}");
    let table = ok(&mut cli(&f), &["status", "cli-xapprove", "-o", "table"]);
    assert!(table.contains(&format!("(key {key})")), "{table}");

    // WHEN an approval names another extension's key, or caps the fee below it
    let err = fails(
        &mut cli_as(&f, "AKIDAPPROVER"),
        &[
            "approve",
            "cli-xapprove",
            "--yes",
            "--key",
            "cli-xapprove:window-1:extension-9:awaiting-approval",
        ],
        6,
    );
    assert!(
        err.contains(&key),
        "the refusal names the key awaiting: {err}"
    );
    let err = fails(
        &mut cli_as(&f, "AKIDAPPROVER"),
        &["approve", "cli-xapprove", "--yes", "--max-fee", "0.01"],
        6,
    );
    assert!(err.contains("extension 1 of "), "{err}");
    // THEN nothing was put
    assert!(f.bus("Capacity Purchase Approved").len() == 1);

    // WHEN the approver approves it by its key
    let out = ok(
        &mut cli_as(&f, "AKIDAPPROVER"),
        &[
            "approve",
            "cli-xapprove",
            "--yes",
            "--key",
            &key,
            "-o",
            "json",
        ],
    );
    let sent: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(sent["extension"]["extension"], 1, "{sent}");
    // THEN the decision names the extension's key, and purchase-capacity buys it
    let approved = f.bus("Capacity Purchase Approved");
    assert_eq!(approved.len(), 2);
    assert_eq!(approved[1]["detail"]["approves"], key.as_str());
    assert_eq!(approved[1]["source"], APPROVER);
    Box::pin(f.deliver()).await;
    let status: Value =
        serde_json::from_str(&ok(&mut cli(&f), &["status", "cli-xapprove", "-o", "json"])).unwrap();
    let x = &status["extensions"][0];
    assert_ne!(x["state"], "awaiting-approval", "{status}");
    assert_ne!(x["state"], "failed", "{status}");
    assert_eq!(x["approved_by"], APPROVER_ARN, "{status}");
    // AND nothing awaits approval any more
    let err = fails(
        &mut cli_as(&f, "AKIDAPPROVER"),
        &["approve", "cli-xapprove", "--yes", "--key", &key],
        6,
    );
    assert!(
        err.contains("no extension of cli-xapprove awaits approval"),
        "{err}"
    );
}
