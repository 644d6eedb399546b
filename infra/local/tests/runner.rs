//! The local runner plays every scenario of `infra/local/scenarios/` (each `*.yaml`, in name
//! order) with the real function binaries, one moto's DynamoDB shared by all of them (a fresh
//! table per scenario) and an emulator each, and every expected outcome holds. The default
//! scenario and the realism scenario also get the assertions of their own below.
//!
//! It runs the binaries `cargo build --workspace --bins` left in cargo's target directory
//! (`make test` builds them, through `--all-targets`); it fails naming the missing binary
//! otherwise. Outcomes are judged by the runner's checks, from the buses and the emulator.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use local_cloud::runner::moto::Moto;
use local_cloud::runner::{RunOptions, RunResult, report, run_with, target_dir};

/// Every scenario file, in name order.
fn scenarios(root: &Path) -> Vec<PathBuf> {
    let dir = root.join("infra/local/scenarios");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    files
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_scenario_plays_with_the_real_binaries_on_one_moto_and_every_check_passes() {
    // GIVEN the workspace's built binaries, every scenario file and one moto server
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the workspace root");
    let target = target_dir(&root).expect("cargo metadata");
    let files = scenarios(&root);
    let names: Vec<String> = files
        .iter()
        .map(|f| f.file_stem().unwrap().to_string_lossy().to_string())
        .collect();
    for known in ["default", "realism"] {
        assert!(
            names.iter().any(|n| n == known),
            "no {known}.yaml: {names:?}"
        );
    }
    std::fs::create_dir_all(target.join("capacity-pilot-test")).expect("the output directory");
    let moto = Arc::new(
        Moto::start(&root, target.join("capacity-pilot-test/moto.log"))
            .await
            .expect("moto starts"),
    );

    for (file, name) in files.iter().zip(&names) {
        // WHEN the runner plays each to its end on that moto
        let result = run_with(
            RunOptions {
                scenario: file.clone(),
                root: root.clone(),
                bin_dir: None,
                out_dir: Some(target.join(format!("capacity-pilot-test-{name}"))),
                every_tick: false,
                print: false,
            },
            Some(moto.clone()),
        )
        .await
        .unwrap_or_else(|e| panic!("{name}.yaml does not play: {e:#}"));

        // (What the notices topic received, as its recipients read it, is kept beside the
        // logs: `<target>/capacity-pilot-test-<name>/notices.txt`.)
        std::fs::write(
            result.out_dir.join("notices.txt"),
            report::notices_text(&result),
        )
        .expect("writing notices.txt");
        // THEN every check passes, about every request it expects something of
        every_check_passes_about_every_request(name, &result);
        // ... and what each known scenario shows besides
        match name.as_str() {
            "default" => {
                the_default_scenario_judges_every_team_shows_the_replacement_and_counts_calls(
                    &result,
                )
            }
            "realism" => the_realism_scenario_plays_every_harsh_behaviour_together(&result),
            _ => {}
        }
    }
    if let Ok(moto) = Arc::try_unwrap(moto) {
        moto.stop().await;
    }
}

fn every_check_passes_about_every_request(name: &str, result: &RunResult) {
    let text = report::render(result);
    assert!(result.passed(), "{name}.yaml: {text}");
    for id in result.scenario.expect.keys() {
        assert!(
            result.checks.iter().any(|c| &c.subject == id),
            "{name}.yaml: no check about {id}: {text}"
        );
    }
    // ... on the stack the runner deployed: its parameters are the scenario's (the others
    // the template's defaults) and its outputs name the bus and this scenario's table
    let stack = result.stack.as_ref().expect("the stack is registered");
    assert_eq!(stack.stack.name, "capacity-pilot");
    assert_eq!(stack.region, result.scenario.region);
    for (k, v) in &result.scenario.parameters {
        assert_eq!(stack.stack.parameters.get(k), Some(v), "{name}.yaml: {k}");
    }
    let output = |key: &str| {
        stack
            .stack
            .outputs
            .iter()
            .find(|o| o.key == key)
            .map(|o| o.value.clone())
    };
    let region = &result.scenario.region;
    assert_eq!(output("BusName").as_deref(), Some("capacity-pilot"));
    assert_eq!(
        output("BusArn"),
        Some(format!(
            "arn:aws:events:{region}:123456789012:event-bus/capacity-pilot"
        ))
    );
    let table = local_cloud::runner::shared_table_name(&result.scenario.name);
    assert_eq!(output("StateTableName"), Some(table.clone()));
    assert_eq!(
        output("StateTableArn"),
        Some(format!(
            "arn:aws:dynamodb:{region}:123456789012:table/{table}"
        ))
    );
}

/// The default scenario: five teams over three weeks.
fn the_default_scenario_judges_every_team_shows_the_replacement_and_counts_calls(
    result: &RunResult,
) {
    // THEN every check passes ...
    let text = report::render(result);
    assert!(result.passed(), "{text}");
    // ... and the checks judged every team's request and every function ran
    for team in ["team-a", "team-b", "team-c", "team-d", "team-e"] {
        assert!(
            result.checks.iter().any(|c| c.subject.starts_with(team)),
            "no check about {team}: {text}"
        );
    }
    // ... the chart shows each launched request's instances, the replaced one included
    for q in &result.summary {
        let launched = q.actual_start.is_some();
        assert_eq!(
            !q.instances.is_empty(),
            launched,
            "{}: instances {:?}",
            q.request_id,
            q.instances
        );
    }
    for (request, instance, _) in &result.broken {
        let q = result.summary.iter().find(|q| &q.request_id == request);
        let replaced = q.and_then(|q| q.instances.iter().find(|i| &i.id == instance));
        let by = replaced.and_then(|i| i.replaced_by.clone());
        assert!(
            by.is_some(),
            "{instance} of {request} is not shown replaced: {replaced:?}"
        );
        assert!(
            q.is_some_and(|q| q
                .instances
                .iter()
                .any(|i| i.replaces.as_ref() == Some(instance))),
            "{request}: no instance shown replacing {instance}"
        );
    }
    assert!(report::svg(result).contains("replaced</text>"));
    for f in &result.functions {
        assert!(f.invocations > 0, "{} never ran: {text}", f.name);
        assert!(f.peak_rss_kb > 0, "{} has no peak memory: {text}", f.name);
    }
    // ... and each invocation's AWS calls are counted per service: every scheduled one reads
    // the table once for its whole tick, and a quiet one (no decision, nothing published,
    // whatever woke it) makes no other DynamoDB call (issue 20's budget)
    for i in &result.invocations {
        if i.trigger == "Scheduled Event" {
            assert!(
                i.calls_of("dynamodb") > 0,
                "{} at {} made no DynamoDB call: {:?}",
                i.function,
                i.at,
                i.aws_calls
            );
        }
        if i.quiet() {
            assert!(
                i.calls_of("dynamodb") <= 1,
                "a quiet {} at {} ({}) made {} DynamoDB calls: {:?}",
                i.function,
                i.at,
                i.trigger,
                i.calls_of("dynamodb"),
                i.aws_calls
            );
        }
    }
    // ... and replace-unhealthy's ticks ask EC2 for the instances the table shows running
    assert!(
        result
            .invocations
            .iter()
            .any(|i| i.function == "replace-unhealthy"
                && i.trigger == "Scheduled Event"
                && i.calls_of("ec2") > 0)
    );
}

/// The realism scenario: two allowed regions (the forwarder in us-west-2), a quota refusal,
/// EFA with slow RunInstances, a failed payment, HyperPod with another group, a failing
/// endpoint, a tag SageMaker refuses.
fn the_realism_scenario_plays_every_harsh_behaviour_together(result: &RunResult) {
    // THEN every check passes, about every request
    let text = report::render(result);
    assert!(result.passed(), "{text}");
    for id in result.scenario.expect.keys() {
        assert!(
            result.checks.iter().any(|c| &c.subject == id),
            "no check about {id}: {text}"
        );
    }
    // ... us-west-2's AWS events reached the home region only through the forwarder: some
    // were forwarded and some (those no home rule wants) were not
    assert_eq!(result.forwarded.len(), 1, "{:?}", result.forwarded);
    let (region, seen, forwarded) = &result.forwarded[0];
    assert_eq!(region, "us-west-2");
    assert!(*forwarded > 0 && forwarded < seen, "{:?}", result.forwarded);
    let west_delivered: Vec<_> = result
        .default_events
        .iter()
        .filter(|e| e["detail-type"] == "Capacity Block Delivered" && e["region"] == "us-west-2")
        .collect();
    assert_eq!(west_delivered.len(), 1, "{text}");
    assert!(
        result
            .invocations
            .iter()
            .any(|i| i.function == "launch-workloads"
                && i.trigger == "Capacity Block Delivered"
                && i.decisions
                    .iter()
                    .any(|d| d["request_id"] == "team-w-west" && d["action"] == "launched")),
        "team W was not launched by its forwarded Delivered event: {text}"
    );
    // ... and no event on the home default bus says a region other than the two allowed
    assert!(
        result
            .default_events
            .iter()
            .all(|e| e["region"] == "us-east-1" || e["region"] == "us-west-2")
    );
}
