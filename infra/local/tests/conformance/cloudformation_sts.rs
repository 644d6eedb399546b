//! CloudFormation DescribeStacks and STS GetCallerIdentity (awsQuery) through the real
//! `aws_sdk_cloudformation` and `aws_sdk_sts` clients: what the CLI reads of a deployed stack
//! and of who is calling.

use std::collections::BTreeMap;

use aws_sdk_cloudformation::error::ProvideErrorMetadata;
use aws_sdk_cloudformation::types::StackStatus;
use local_cloud::{Fault, FaultKind, Stack, StackOutput};
use serde_json::json;

use crate::helpers::*;

fn stack() -> Stack {
    Stack {
        name: "capacity-pilot".into(),
        description: Some("capacity-pilot: buys capacity".into()),
        parameters: BTreeMap::from([
            ("AllowedRegions".into(), "us-east-1,us-west-2".into()),
            ("TeamBudgetsUsd".into(), r#"{"team-a": "5000"}"#.into()),
        ]),
        outputs: vec![
            StackOutput {
                key: "BusName".into(),
                value: "capacity-pilot".into(),
                description: Some("The custom bus other systems put capacity requests on.".into()),
            },
            StackOutput {
                key: "StateTableName".into(),
                value: "capacity-pilot-state".into(),
                description: None,
            },
        ],
        tags: BTreeMap::from([("team".into(), "platform & infra <ops>".into())]),
        id: None,
    }
}

async fn clients(
    env: &Env,
    region: &'static str,
    access_key_id: &str,
) -> (aws_sdk_cloudformation::Client, aws_sdk_sts::Client) {
    let conf = sdk_config_as(&env.cloud.url(), region, access_key_id, false).await;
    (
        aws_sdk_cloudformation::Client::new(&conf),
        aws_sdk_sts::Client::new(&conf),
    )
}

#[tokio::test]
async fn describe_stacks_answers_a_registered_stacks_outputs_and_parameters() {
    // GIVEN a stack registered in us-east-1 through the Rust API, and another through the
    // control API
    let env = env().await;
    let id = env
        .cloud
        .with_world(|w| w.put_stack("us-east-1", stack()))
        .expect("a valid stack");
    let (status, body) = http(
        &env.cloud.url(),
        "POST",
        "/_local/stacks/us-east-1",
        Some(r#"{"name": "other", "outputs": [{"key": "K", "value": "V"}]}"#),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (cfn, _) = clients(&env, "us-east-1", "AKIDLOCALCLOUD").await;

    // WHEN the real client describes the first by name
    let out = cfn
        .describe_stacks()
        .stack_name("capacity-pilot")
        .send()
        .await
        .expect("the stack is described");

    // THEN it answers the one stack with its id, status, time, parameters, outputs and tags
    assert_eq!(out.stacks().len(), 1);
    let s = &out.stacks()[0];
    assert_eq!(s.stack_name(), Some("capacity-pilot"));
    assert_eq!(s.stack_id(), Some(id.as_str()));
    let prefix = "arn:aws:cloudformation:us-east-1:123456789012:stack/capacity-pilot/";
    let uuid = id
        .strip_prefix(prefix)
        .expect("CloudFormation's stack id form");
    assert_eq!(uuid.len(), 36, "a UUID: {uuid}");
    assert_eq!(s.stack_status(), Some(&StackStatus::CreateComplete));
    assert_eq!(s.creation_time().map(chrono_of), Some(t0()));
    assert_eq!(s.description(), Some("capacity-pilot: buys capacity"));
    let params: BTreeMap<&str, &str> = s
        .parameters()
        .iter()
        .map(|p| (p.parameter_key().unwrap(), p.parameter_value().unwrap()))
        .collect();
    assert_eq!(
        params,
        BTreeMap::from([
            ("AllowedRegions", "us-east-1,us-west-2"),
            ("TeamBudgetsUsd", r#"{"team-a": "5000"}"#),
        ])
    );
    let outputs: Vec<(&str, &str, Option<&str>)> = s
        .outputs()
        .iter()
        .map(|o| {
            (
                o.output_key().unwrap(),
                o.output_value().unwrap(),
                o.description(),
            )
        })
        .collect();
    assert_eq!(
        outputs,
        [
            (
                "BusName",
                "capacity-pilot",
                Some("The custom bus other systems put capacity requests on.")
            ),
            ("StateTableName", "capacity-pilot-state", None),
        ]
    );
    assert_eq!(s.tags().len(), 1);
    assert_eq!(s.tags()[0].key(), Some("team"));
    assert_eq!(s.tags()[0].value(), Some("platform & infra <ops>"));
    // ... by its id too, and without a name every stack of the region
    let by_id = cfn.describe_stacks().stack_name(&id).send().await.unwrap();
    assert_eq!(by_id.stacks()[0].stack_name(), Some("capacity-pilot"));
    let all = cfn.describe_stacks().send().await.unwrap();
    let names: Vec<_> = all.stacks().iter().filter_map(|s| s.stack_name()).collect();
    assert_eq!(names, ["capacity-pilot", "other"]);
    assert_eq!(all.stacks()[1].outputs()[0].output_value(), Some("V"));
    assert!(all.stacks()[1].parameters().is_empty());
    // ... and stacks are regional: us-west-2 has none
    let (west, _) = clients(&env, "us-west-2", "AKIDLOCALCLOUD").await;
    assert!(
        west.describe_stacks()
            .send()
            .await
            .unwrap()
            .stacks()
            .is_empty()
    );
}

#[tokio::test]
async fn a_stack_unknown_to_describe_stacks_is_a_validation_error_naming_it() {
    // GIVEN a stack registered in us-east-1 only
    let env = env().await;
    env.cloud
        .with_world(|w| w.put_stack("us-east-1", stack()))
        .expect("a valid stack");
    let (cfn, _) = clients(&env, "us-east-1", "AKIDLOCALCLOUD").await;
    let (west, _) = clients(&env, "us-west-2", "AKIDLOCALCLOUD").await;

    // WHEN another name is described, and the stack's name in another region
    let err = cfn
        .describe_stacks()
        .stack_name("no-such-stack")
        .send()
        .await
        .unwrap_err();
    let west_err = west
        .describe_stacks()
        .stack_name("capacity-pilot")
        .send()
        .await
        .unwrap_err();

    // THEN each is an HTTP 400 ValidationError naming the stack, with a request id
    assert_eq!(err.code(), Some("ValidationError"));
    assert_eq!(
        err.message(),
        Some("Stack with id no-such-stack does not exist")
    );
    let raw = err.raw_response().expect("an HTTP answer");
    assert_eq!(raw.status().as_u16(), 400);
    let body = std::str::from_utf8(raw.body().bytes().unwrap()).unwrap();
    assert!(body.contains("<Type>Sender</Type>"), "{body}");
    assert!(body.contains("<RequestId>"), "{body}");
    assert_eq!(west_err.code(), Some("ValidationError"));
    assert_eq!(
        west_err.message(),
        Some("Stack with id capacity-pilot does not exist")
    );
    // ... and an action CloudFormation does not have here is InvalidAction (an unsigned form
    // body goes to the service its API version names)
    let (status, body) = http(
        &env.cloud.url(),
        "POST",
        "/",
        Some("Action=ListStacks&Version=2010-05-15"),
    )
    .await;
    assert_eq!(status, 400);
    let body = body.as_str().unwrap_or_default();
    assert!(
        body.contains("<Code>InvalidAction</Code>")
            && body.contains("Could not find operation ListStacks for version 2010-05-15"),
        "{body}"
    );
}

#[tokio::test]
async fn get_caller_identity_answers_the_registered_arn_and_its_account() {
    // GIVEN an access key registered as an assumed-role session of another account (through
    // the control API) and one as a user of the emulator's account (through the Rust API)
    let env = env().await;
    let (status, _) = http(
        &env.cloud.url(),
        "POST",
        "/_local/identities",
        Some(
            &json!({"access_key_id": "AKIDALICE",
                    "arn": "arn:aws:sts::210987654321:assumed-role/CapacityAdmin/alice"})
            .to_string(),
        ),
    )
    .await;
    assert_eq!(status, 204);
    env.cloud
        .with_world(|w| w.put_identity("AKIDBOB", "arn:aws:iam::123456789012:user/bob"))
        .expect("a valid identity");
    let (_, alice) = clients(&env, "us-east-1", "AKIDALICE").await;
    let (_, bob) = clients(&env, "eu-west-1", "AKIDBOB").await;

    // WHEN each asks STS who it is
    let a = alice.get_caller_identity().send().await.unwrap();
    let b = bob.get_caller_identity().send().await.unwrap();

    // THEN each gets its ARN, its ARN's account and STS's user id form
    assert_eq!(
        a.arn(),
        Some("arn:aws:sts::210987654321:assumed-role/CapacityAdmin/alice")
    );
    assert_eq!(a.account(), Some("210987654321"));
    let user_id = a.user_id().unwrap();
    assert!(
        user_id.starts_with("AROA") && user_id.ends_with(":alice"),
        "{user_id}"
    );
    assert_eq!(b.arn(), Some("arn:aws:iam::123456789012:user/bob"));
    assert_eq!(b.account(), Some("123456789012"));
    assert!(b.user_id().unwrap().starts_with("AIDA"));
    // ... and a refused registration says why
    let (status, body) = http(
        &env.cloud.url(),
        "POST",
        "/_local/identities",
        Some(r#"{"access_key_id": "AKID", "arn": "bob"}"#),
    )
    .await;
    assert_eq!(status, 400, "{body}");
}

#[tokio::test]
async fn an_unregistered_access_key_is_an_iam_user_of_the_emulators_account() {
    // GIVEN no identity registered
    let env = env().await;
    let (_, sts) = clients(&env, "us-east-1", "AKIDSOMEONE").await;

    // WHEN its key asks STS who it is
    let me = sts.get_caller_identity().send().await.unwrap();

    // THEN it is the IAM user named after the key, in the emulator's account
    assert_eq!(me.arn(), Some("arn:aws:iam::123456789012:user/AKIDSOMEONE"));
    assert_eq!(me.account(), Some("123456789012"));
    assert!(me.user_id().is_some_and(|u| u.starts_with("AIDA")));
}

#[tokio::test]
async fn stack_and_identity_calls_are_counted_and_take_injected_faults() {
    // GIVEN a registered stack, and faults on DescribeStacks, GetCallerIdentity and PutEvents
    let env = env().await;
    env.cloud
        .with_world(|w| w.put_stack("us-east-1", stack()))
        .expect("a valid stack");
    let (cfn, sts) = clients(&env, "us-east-1", "AKIDLOCALCLOUD").await;
    let once = |operation: &str, kind: FaultKind| Fault {
        operation: operation.into(),
        kind,
        count: Some(1),
    };
    env.cloud
        .inject(once("DescribeStacks", FaultKind::Throttle));
    env.cloud
        .inject(once("GetCallerIdentity", FaultKind::InternalError));
    env.cloud.inject(once(
        "PutEvents",
        FaultKind::Error {
            status: 400,
            code: "AccessDeniedException".into(),
            message: "not allowed".into(),
        },
    ));

    // WHEN each is called twice (the fault is used up by the first)
    let throttled = cfn
        .describe_stacks()
        .stack_name("capacity-pilot")
        .send()
        .await
        .unwrap_err();
    let described = cfn
        .describe_stacks()
        .stack_name("capacity-pilot")
        .send()
        .await;
    let failed = sts.get_caller_identity().send().await.unwrap_err();
    let identified = sts.get_caller_identity().send().await;
    let entry = || {
        aws_sdk_eventbridge::types::PutEventsRequestEntry::builder()
            .source("capacity-pilot.cli")
            .detail_type("Capacity Request Submitted")
            .detail("{}")
            .event_bus_name("capacity-pilot")
            .build()
    };
    let refused = env
        .eb
        .put_events()
        .entries(entry())
        .send()
        .await
        .unwrap_err();
    let put = env.eb.put_events().entries(entry()).send().await;

    // THEN the first answers the fault in awsQuery's shape (CloudFormation's throttling code,
    // a 500 from STS), the second succeeds, and every call is counted per service
    assert_eq!(throttled.code(), Some("Throttling"));
    assert!(described.is_ok());
    assert_eq!(
        aws_sdk_sts::error::ProvideErrorMetadata::code(&failed),
        Some("InternalFailure")
    );
    assert_eq!(failed.raw_response().unwrap().status().as_u16(), 500);
    assert!(identified.is_ok());
    assert_eq!(
        aws_sdk_eventbridge::error::ProvideErrorMetadata::code(&refused),
        Some("AccessDeniedException")
    );
    assert!(put.is_ok());
    let calls = env.cloud.with_world(|w| w.calls.clone());
    assert_eq!(calls.get("cloudformation"), Some(&2));
    assert_eq!(calls.get("sts"), Some(&2));
    assert_eq!(calls.get("events"), Some(&2));
    assert_eq!(calls.get("ec2"), None, "none went to EC2");
}
