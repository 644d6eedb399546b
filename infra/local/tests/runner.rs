//! The local runner plays the default scenario (`infra/local/scenarios/default.yaml`) and the
//! realism scenario (`infra/local/scenarios/realism.yaml`) with the real function binaries,
//! moto's DynamoDB and the emulator, and every expected outcome holds.
//!
//! It runs the binaries `cargo build --workspace --bins` left in cargo's target directory
//! (`make test` builds them, through `--all-targets`); it fails naming the missing binary
//! otherwise. Outcomes are judged by the runner's checks, from the buses and the emulator.

use std::path::Path;

use local_cloud::runner::{RunOptions, report, run, target_dir};

/// Plays `scenario` (a file of `infra/local/scenarios/`) with the workspace's built binaries
/// to its end, writing its outputs under the target directory's `out`.
async fn play(scenario: &str, out: &str) -> local_cloud::runner::RunResult {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the workspace root");
    let out_dir = target_dir(&root).expect("cargo metadata").join(out);
    run(RunOptions {
        scenario: root.join("infra/local/scenarios").join(scenario),
        root,
        bin_dir: None,
        out_dir: Some(out_dir),
        every_tick: false,
        print: false,
    })
    .await
    .expect("the scenario plays")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_scenario_plays_with_the_real_binaries_and_every_check_passes() {
    // GIVEN the workspace's built function binaries and the default scenario
    // WHEN the runner plays it to its end
    let result = play("default.yaml", "capacity-pilot-test").await;

    // THEN every check passes ...
    let text = report::render(&result);
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
    assert!(report::svg(&result).contains("replaced</text>"));
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_realism_scenario_plays_every_harsh_behaviour_together_and_every_check_passes() {
    // GIVEN the built binaries and the realism scenario: two allowed regions (the forwarder in
    // us-west-2), a quota refusal, EFA with slow RunInstances, a failed payment, HyperPod with
    // another group, a failing endpoint, a tag SageMaker refuses
    // WHEN the runner plays it to its end
    let result = play("realism.yaml", "capacity-pilot-test-realism").await;

    // THEN every check passes, about every request
    let text = report::render(&result);
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
