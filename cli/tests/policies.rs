//! The role policies equal the calls. The template outputs three managed policies for people
//! who use `capacity-pilot`: `RequesterPolicy`, `ApproverPolicy` and `OperatorPolicy`. This
//! test records, command by command, every AWS operation the CLI binary makes, at the wire:
//! a small proxy, which the CLI reaches through `AWS_ENDPOINT_URL` for every service, reads
//! each request's service (its SigV4 credential scope) and operation (`X-Amz-Target`, or the
//! form's `Action`), and forwards it unchanged to moto (DynamoDB) or the emulator (the rest).
//! Each policy must grant exactly the IAM actions that the operations of the commands it
//! serves need, mapped through `infra/iam/operations.yaml`: nothing missing (the command
//! would be refused in AWS) and nothing extra (least privilege). Its statements name the
//! stack's own resources, never `*`, and it puts events only with the sources of its role.
//! `PlanPolicy`, for `capacity-pilot plan`, is held to `plan`'s calls the same way; it puts no
//! event, touches the table only by partition key (the pacing items it writes, the ledgers it
//! reads), and names `*` only for the searches and describes that take no resource.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use assert_cmd::Command;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use capacity_pilot::domain::naming::MANAGED_TAG;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use integration_tests::flow::{APPROVER, Flow, REGION, SOURCE};
use integration_tests::iam::{operation_table, yaml};
use integration_tests::moto::Moto;
use serde_json::{Value, json};

mod support;

const PLAN_POLICY: &str = "PlanPolicy";
const APPROVER_ROLE: &str = "arn:aws:iam::123456789012:role/capacity-approver";

/// The only actions `PlanPolicy` may grant on `*`: the Service Authorization Reference lists
/// no resource type for them (list_amazonec2.html, list_amazonsagemaker.html), so a statement
/// that grants them must name every resource.
const NO_RESOURCE_TYPE: [&str; 5] = [
    "ec2:DescribeCapacityBlockOfferings",
    "ec2:DescribeCapacityReservations",
    "ec2:DescribeSubnets",
    "ec2:DescribeLaunchTemplateVersions",
    "sagemaker:SearchTrainingPlanOfferings",
];

/// Each policy, the commands it serves (ARCHITECTURE §8.13), and the stack parameter whose
/// sources it may put events with.
const POLICIES: [(&str, &[&str], &str); 3] = [
    (
        "RequesterPolicy",
        &[
            "types", "new", "submit", "status", "list", "history", "watch", "cancel", "extend",
        ],
        "AllowedRequestSources",
    ),
    (
        "ApproverPolicy",
        &["approve", "reject", "status", "list", "history", "budget"],
        "ApproverSources",
    ),
    (
        "OperatorPolicy",
        &[
            "status", "list", "history", "watch", "budget", "cancel", "pause", "resume",
        ],
        "AllowedRequestSources",
    ),
];

// ---------------------------------------------------------------------------------------
// The recording proxy
// ---------------------------------------------------------------------------------------

/// One AWS call as the wire shows it: the service and operation, the DynamoDB index it
/// reads (if any), the partition key of the item it names (`Key` or `Item`, if any), and
/// the sources of the events it puts (if any).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Call {
    service: String,
    operation: String,
    index: Option<String>,
    key: Option<String>,
    sources: Vec<String>,
}

/// What a request is, from its headers and body.
fn call_of(headers: &HeaderMap, body: &[u8]) -> Call {
    // `Credential=AKID/20261201/us-east-1/dynamodb/aws4_request`
    let service = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|a| a.split("Credential=").nth(1))
        .and_then(|c| c.split([',', ' ']).next())
        .and_then(|scope| scope.split('/').nth(3))
        .unwrap_or("<unsigned>")
        .to_string();
    let target = headers
        .get("x-amz-target")
        .and_then(|v| v.to_str().ok())
        .and_then(|t| t.split_once('.'))
        .map(|(_, op)| op.to_string());
    let json: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let operation = target
        .or_else(|| {
            String::from_utf8_lossy(body)
                .split('&')
                .find_map(|kv| kv.strip_prefix("Action="))
                .map(str::to_string)
        })
        .unwrap_or_else(|| "<unknown>".into());
    Call {
        service,
        operation,
        index: json["IndexName"].as_str().map(str::to_string),
        key: [&json["Key"], &json["Item"]]
            .into_iter()
            .find_map(|item| item["pk"]["S"].as_str())
            .map(str::to_string),
        sources: json["Entries"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e["Source"].as_str().map(str::to_string))
            .collect(),
    }
}

#[derive(Clone)]
struct Upstream {
    dynamodb: String,
    others: String,
    client: Client<HttpConnector, Full<Bytes>>,
    calls: Arc<Mutex<Vec<Call>>>,
}

/// Records the call and forwards it unchanged (method, path, headers, body); the answer
/// comes back unchanged too, but for its framing (the body is read whole, so hyper sets
/// its length instead of chunking it).
async fn forward(State(up): State<Upstream>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let body = match axum::body::to_bytes(body, usize::MAX).await {
        Ok(b) => b,
        Err(e) => return (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    };
    let call = call_of(&parts.headers, &body);
    let base = if call.service == "dynamodb" {
        &up.dynamodb
    } else {
        &up.others
    };
    up.calls.lock().unwrap().push(call);
    let uri = format!(
        "{}{}",
        base.trim_end_matches('/'),
        parts.uri.path_and_query().map_or("/", |p| p.as_str())
    );
    let mut out = axum::http::Request::from_parts(parts, Full::new(body));
    *out.uri_mut() = match uri.parse() {
        Ok(u) => u,
        Err(e) => return (StatusCode::BAD_GATEWAY, format!("{uri}: {e}")).into_response(),
    };
    let answer = match up.client.request(out).await {
        Ok(a) => a,
        Err(e) => return (StatusCode::BAD_GATEWAY, format!("{uri}: {e:?}")).into_response(),
    };
    let (mut parts, body) = answer.into_parts();
    let body = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return (StatusCode::BAD_GATEWAY, format!("{uri}: {e}")).into_response(),
    };
    parts.headers.remove(header::TRANSFER_ENCODING);
    Response::from_parts(parts, Body::from(body))
}

/// The proxy, listening on a port of its own until the test ends.
struct Proxy {
    url: String,
    calls: Arc<Mutex<Vec<Call>>>,
}

impl Proxy {
    async fn start(dynamodb: &str, others: &str) -> Proxy {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let up = Upstream {
            dynamodb: dynamodb.to_string(),
            others: others.to_string(),
            client: Client::builder(TokioExecutor::new()).build_http(),
            calls: calls.clone(),
        };
        let app = axum::Router::new().fallback(forward).with_state(up);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Proxy { url, calls }
    }

    /// The calls made since the last take.
    fn take(&self) -> Vec<Call> {
        std::mem::take(&mut *self.calls.lock().unwrap())
    }
}

// ---------------------------------------------------------------------------------------
// The deployment and the CLI
// ---------------------------------------------------------------------------------------

/// The stack's parameters: the flow's configuration.
fn parameters() -> BTreeMap<String, String> {
    [
        ("AllowedRegions", REGION),
        ("AllowedRequestSources", SOURCE),
        ("ApproverSources", APPROVER),
        ("TeamBudgetsUsd", r#"{"*": "250000"}"#),
        (
            "SageMakerExecutionRoleArn",
            "arn:aws:iam::123456789012:role/sm",
        ),
        ("ApproverPrincipals", APPROVER_ROLE),
        ("ApproveAboveUsd", "1"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// A flow that asks an approver above $1, with the stack the CLI reads registered in its
/// emulator, and the approver's access key known to its STS.
async fn deployed() -> Flow {
    support::deployed(&[("APPROVE_ABOVE_USD", "1")], APPROVER_ROLE).await
}

/// Runs the CLI's commands through the proxy, keeping what each command called.
struct Recorder<'a> {
    f: &'a Flow,
    proxy: Proxy,
    /// Command (its first argument) -> the calls of every run of it.
    calls: BTreeMap<String, BTreeSet<Call>>,
}

impl Recorder<'_> {
    /// `capacity-pilot` with a user's environment, every AWS service at the proxy.
    fn cli(&self, access_key: &str) -> Command {
        let mut c = support::cli_as(self.f, access_key);
        c.env("AWS_ENDPOINT_URL", &self.proxy.url)
            .env_remove("AWS_ENDPOINT_URL_DYNAMODB");
        c
    }

    /// Runs a command as `access_key`, requiring it to succeed; records its calls; gives
    /// its stdout.
    fn ok(&mut self, access_key: &str, args: &[&str]) -> String {
        self.proxy.take();
        let o = self
            .cli(access_key)
            .args(args)
            .output()
            .expect("the CLI runs");
        self.recorded(args, o)
    }

    /// [`Recorder::ok`] for a command that waits for the functions (`--wait`): the events
    /// on the bus are delivered while it runs.
    async fn ok_delivering(&mut self, access_key: &str, args: &[&str]) -> String {
        self.proxy.take();
        let mut c = self.cli(access_key);
        c.args(args);
        let run = tokio::task::spawn_blocking(move || c.output());
        tokio::pin!(run);
        let o = loop {
            tokio::select! {
                o = &mut run => break o.expect("the CLI's thread").expect("the CLI runs"),
                _ = tokio::time::sleep(std::time::Duration::from_millis(300)) => {
                    self.f.deliver().await;
                }
            }
        };
        self.recorded(args, o)
    }

    fn recorded(&mut self, args: &[&str], o: std::process::Output) -> String {
        let calls = self.proxy.take();
        let (out, err) = (
            String::from_utf8_lossy(&o.stdout).to_string(),
            String::from_utf8_lossy(&o.stderr).to_string(),
        );
        assert!(
            o.status.success(),
            "capacity-pilot {args:?} exited {:?}\nstdout: {out}\nstderr: {err}",
            o.status.code()
        );
        self.calls
            .entry(args[0].to_string())
            .or_default()
            .extend(calls);
        out
    }

    fn requester(&mut self, args: &[&str]) -> String {
        self.ok("AKIDREQUESTER", args)
    }

    async fn requester_delivering(&mut self, args: &[&str]) -> String {
        self.ok_delivering("AKIDREQUESTER", args).await
    }

    async fn operator_delivering(&mut self, args: &[&str]) -> String {
        self.ok_delivering("AKIDOPERATOR", args).await
    }

    fn approver(&mut self, args: &[&str]) -> String {
        self.ok("AKIDAPPROVER", args)
    }

    fn operator(&mut self, args: &[&str]) -> String {
        self.ok("AKIDOPERATOR", args)
    }

    fn planner(&mut self, args: &[&str]) -> String {
        self.ok("AKIDPLANNER", args)
    }

    /// A request's `approves` key, as `status` shows it.
    fn awaiting_key(&mut self, id: &str) -> String {
        let status: Value =
            serde_json::from_str(&self.requester(&["status", id, "-o", "json"])).unwrap();
        assert_eq!(status["status"], "AwaitingApproval", "{status}");
        status["awaiting_approval"]["approves"]
            .as_str()
            .unwrap()
            .to_string()
    }
}

/// A training-job request on a training plan: 2 x ml.p5.48xlarge for 48 h in December.
fn training_request(id: &str) -> Value {
    json!({
        "schema_version": 1, "request_id": id, "team": "team-b",
        "instance_types": ["ml.p5.48xlarge"], "instance_count": 2, "duration_hours": 48,
        "earliest_start": "2026-12-02T00:00:00Z", "latest_end": "2026-12-20T11:30:00Z",
        "regions": [REGION],
        "budget": {"max_upfront_usd": "20000"},
        "workload": {"kind": "training-job",
            "training_image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/eval:2026.11",
            "output_s3_uri": "s3://team-b-models/eval/",
            "volume_size_gb": 500}
    })
}

/// A HyperPod request on a plan: 2 x ml.p5.48xlarge for 48 h in `cluster`'s group `finetune`.
fn hyperpod_request(id: &str, cluster: &str) -> Value {
    json!({
        "schema_version": 1, "request_id": id, "team": "team-f",
        "instance_types": ["ml.p5.48xlarge"], "instance_count": 2, "duration_hours": 48,
        "earliest_start": "2026-12-02T00:00:00Z", "latest_end": "2026-12-20T11:30:00Z",
        "regions": [REGION],
        "budget": {"max_upfront_usd": "20000"},
        "workload": {"kind": "hyperpod-cluster", "cluster_name": cluster,
            "instance_group_name": "finetune",
            "life_cycle_config": {"source_s3_uri": "s3://team-f-hyperpod/lifecycle/",
                "on_create": "on_create.sh"}}
    })
}

/// Creates a HyperPod cluster that carries the managed tag (with no instance groups yet),
/// through the emulator's own CreateCluster, and waits until it is InService.
fn managed_cluster(f: &Flow, name: &str) {
    f.cloud
        .with_world(|w| {
            w.sagemaker_call(
                REGION,
                "CreateCluster",
                &json!({"ClusterName": name, "Tags": [{"Key": MANAGED_TAG, "Value": "true"}]}),
            )
        })
        .expect("CreateCluster");
    f.cloud.step(chrono::TimeDelta::minutes(5));
    let status = f.cloud.with_world(|w| {
        w.sm.clusters
            .get(&(REGION.to_string(), name.to_string()))
            .map(|c| c.status.clone())
    });
    assert_eq!(status.as_deref(), Some("InService"));
}

/// Writes `v` to a temporary file for `submit`.
fn file(name: &str, v: &Value) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("capacity-pilot-policies-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, serde_json::to_string_pretty(v).unwrap()).unwrap();
    p
}

// ---------------------------------------------------------------------------------------
// The template and the operation table
// ---------------------------------------------------------------------------------------

fn one_or_many(v: &Value) -> Vec<Value> {
    match v {
        Value::Array(all) => all.clone(),
        Value::Null => vec![],
        one => vec![one.clone()],
    }
}

/// A policy's statements, as the template writes them.
fn statements(template: &Value, policy: &str) -> Vec<Value> {
    let resource = &template["Resources"][policy];
    assert_eq!(
        resource["Type"], "AWS::IAM::ManagedPolicy",
        "{policy} is a managed policy"
    );
    let document = &resource["Properties"]["PolicyDocument"];
    assert_eq!(document["Version"], "2012-10-17", "{policy}");
    let all = one_or_many(&document["Statement"]);
    assert!(!all.is_empty(), "{policy} has statements");
    all
}

fn actions(statement: &Value) -> BTreeSet<String> {
    one_or_many(&statement["Action"])
        .iter()
        .map(|a| a.as_str().expect("an action is a string").to_string())
        .collect()
}

/// How `policy` differs from what `commands` were recorded calling, mapped through
/// infra/iam/operations.yaml: each action needed and not granted, granted and not needed,
/// and each operation the table does not map. Empty: it grants exactly what they call.
fn unlike_calls(
    template: &Value,
    policy: &str,
    commands: &[&str],
    recorded: &BTreeMap<String, BTreeSet<Call>>,
) -> Vec<String> {
    let table = operation_table();
    let mut wrong = Vec::new();
    let mut needed = BTreeSet::new();
    for command in commands {
        let calls = recorded
            .get(*command)
            .unwrap_or_else(|| panic!("{policy}: `{command}` was never run"));
        for c in calls {
            match table.get(&(c.service.clone(), c.operation.clone())) {
                Some(actions) => needed.extend(actions.iter().cloned()),
                None => wrong.push(format!(
                    "`{command}` calls {}:{}, which infra/iam/operations.yaml does not map",
                    c.service, c.operation
                )),
            }
        }
    }
    let granted: BTreeSet<String> = statements(template, policy)
        .iter()
        .flat_map(actions)
        .collect();
    for missing in needed.difference(&granted) {
        wrong.push(format!(
            "{policy}: its commands call what needs {missing}, which it does not grant"
        ));
    }
    for extra in granted.difference(&needed) {
        wrong.push(format!(
            "{policy} grants {extra}, which none of its commands was seen needing"
        ));
    }
    wrong
}

/// The resources a statement of `service`'s actions names: the stack's own, by service.
fn resources_for(service: &str, indexes: &BTreeSet<String>) -> Vec<Value> {
    match service {
        "events" => vec![json!({"Fn::GetAtt": ["Bus", "Arn"]})],
        "dynamodb" => std::iter::once(json!({"Fn::GetAtt": ["StateTable", "Arn"]}))
            .chain(
                indexes
                    .iter()
                    .map(|i| json!({"Fn::Sub": format!("${{StateTable.Arn}}/index/{i}")})),
            )
            .collect(),
        "cloudformation" => vec![json!({"Fn::Sub":
            "arn:${AWS::Partition}:cloudformation:${AWS::Region}:${AWS::AccountId}:stack/${AWS::StackName}/*"})],
        other => panic!("no resource is expected for {other}'s actions"),
    }
}

/// The partition keys a statement's `dynamodb:LeadingKeys` condition allows, as patterns.
fn leading_keys(statement: &Value) -> Vec<String> {
    one_or_many(&statement["Condition"]["ForAllValues:StringLike"]["dynamodb:LeadingKeys"])
        .iter()
        .filter_map(|p| p.as_str().map(str::to_string))
        .collect()
}

/// Whether `key` matches `pattern` as `StringLike` reads it, for the patterns the template
/// writes: a literal, or a literal prefix and `*`.
fn like(pattern: &str, key: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => !prefix.contains(['*', '?']) && key.starts_with(prefix),
        None => !pattern.contains('?') && key == pattern,
    }
}

/// The condition every `events:PutEvents` statement carries: the event's source is one of
/// the parameter's comma list.
fn source_condition(parameter: &str) -> Value {
    json!({"StringEquals": {"events:source": {"Fn::Split": [",", {"Ref": parameter}]}}})
}

// ---------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------

#[test]
fn the_proxy_reads_each_call_as_its_protocol_names_it() {
    let signed = |service: &str, target: Option<&str>| {
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            format!(
                "AWS4-HMAC-SHA256 Credential=AKID/20261201/us-east-1/{service}/aws4_request, \
                 SignedHeaders=host, Signature=0"
            )
            .parse()
            .unwrap(),
        );
        if let Some(t) = target {
            h.insert("x-amz-target", t.parse().unwrap());
        }
        h
    };
    // GIVEN a JSON-protocol query of an index, a read and a put of an item, a put of two
    // events, and a form-protocol call
    let query = call_of(
        &signed("dynamodb", Some("DynamoDB_20120810.Query")),
        br#"{"TableName": "t", "IndexName": "work"}"#,
    );
    let get = call_of(
        &signed("dynamodb", Some("DynamoDB_20120810.GetItem")),
        br#"{"TableName": "t", "Key": {"pk": {"S": "BUDGET#team-a#2026-12"}, "sk": {"S": "LEDGER"}}}"#,
    );
    let write = call_of(
        &signed("dynamodb", Some("DynamoDB_20120810.PutItem")),
        br#"{"TableName": "t", "Item": {"pk": {"S": "PACE#us-east-1"}, "sk": {"S": "PACE"}}}"#,
    );
    let put = call_of(
        &signed("events", Some("AWSEvents.PutEvents")),
        br#"{"Entries": [{"Source": "a"}, {"Source": "b"}]}"#,
    );
    let sts = call_of(
        &signed("sts", None),
        b"Action=GetCallerIdentity&Version=2011-06-15",
    );
    // THEN each is its service's operation, with what it reads and puts
    assert_eq!(
        (query.service.as_str(), query.operation.as_str()),
        ("dynamodb", "Query")
    );
    assert_eq!(query.index.as_deref(), Some("work"));
    assert_eq!(query.key, None);
    assert_eq!(get.key.as_deref(), Some("BUDGET#team-a#2026-12"));
    assert_eq!(
        (write.operation.as_str(), write.key.as_deref()),
        ("PutItem", Some("PACE#us-east-1"))
    );
    assert_eq!(
        (put.operation.as_str(), put.sources.clone()),
        ("PutEvents", vec!["a".to_string(), "b".to_string()])
    );
    assert_eq!(
        (sts.service.as_str(), sts.operation.as_str()),
        ("sts", "GetCallerIdentity")
    );
    // AND an unsigned call, or one of no known protocol, is said to be
    let odd = call_of(&HeaderMap::new(), b"{}");
    assert_eq!(
        (odd.service.as_str(), odd.operation.as_str()),
        ("<unsigned>", "<unknown>")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_role_policy_grants_exactly_what_its_commands_call() {
    // GIVEN a deployment that asks an approver above $1, and the CLI pointed at a recording
    // proxy in front of moto (DynamoDB) and the emulator (CloudFormation, STS, EventBridge)
    let f = deployed().await;
    let moto = Moto::shared().expect("moto");
    let proxy = Proxy::start(moto.url(), &f.cloud.url()).await;
    let mut r = Recorder {
        f: &f,
        proxy,
        calls: BTreeMap::new(),
    };

    // WHEN a requester looks at the types, writes a request, and submits two
    r.requester(&["types", "--gpu", "H100"]);
    r.requester(&[
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
    ]);
    // (one of them waiting until the functions record it)
    // (one that may be extended)
    let mut extendable = f.ec2_request("pol-bought");
    extendable["extend"] =
        json!({"when": "requested", "max_hours": 48, "max_upfront_usd": "20000"});
    let path = file("pol-bought.json", &extendable);
    r.requester(&["submit", path.to_str().unwrap()]);
    let path = file("pol-rejected.json", &f.ec2_request("pol-rejected"));
    let accepted = r
        .requester_delivering(&[
            "submit",
            path.to_str().unwrap(),
            "--wait",
            "--timeout",
            "60",
            "-o",
            "json",
        ])
        .await;
    let accepted: Value = serde_json::from_str(&accepted).expect("submit --wait answers JSON");
    assert_eq!(accepted["request_id"], "pol-rejected", "{accepted}");
    f.deliver().await;
    // ... and reads them while they await approval
    let bought_key = r.awaiting_key("pol-bought");
    let rejected_key = r.awaiting_key("pol-rejected");
    r.requester(&["list", "-o", "json"]);
    r.requester(&["history", "pol-bought", "-o", "json"]);

    // AND an approver reads them, approves one and rejects the other
    r.approver(&["status", "pol-bought", "-o", "json"]);
    r.approver(&["list", "--live", "-o", "json"]);
    r.approver(&["history", "pol-rejected", "-o", "json"]);
    r.approver(&["budget", "-o", "json"]);
    r.approver(&["approve", "pol-bought", "--yes", "--key", &bought_key]);
    r.approver(&["reject", "pol-rejected", "--yes", "--key", &rejected_key]);
    f.deliver().await;
    assert_eq!(f.status("pol-bought").await.as_str(), "Reserved");
    assert_eq!(f.status("pol-rejected").await.as_str(), "Rejected");
    // AND the requester asks for an extension of the bought one
    let asked: Value = serde_json::from_str(&r.requester(&[
        "extend",
        "pol-bought",
        "--hours",
        "24",
        "--yes",
        "-o",
        "json",
    ]))
    .expect("extend answers JSON");
    assert_eq!(asked["hours"], 24, "{asked}");
    assert_eq!(
        f.bus("Capacity Extension Requested").len(),
        1,
        "the ask is on the bus"
    );

    // AND the requester and an operator follow the rejected one (it has ended: watch
    // returns), read the bought one with its window, and cancel it
    r.requester(&["watch", "pol-rejected", "-o", "json"]);
    r.requester(&["status", "pol-bought", "-o", "json"]);
    r.operator(&["watch", "pol-rejected", "-o", "json"]);
    r.operator(&["status", "pol-bought", "-o", "table"]);
    r.operator(&["list", "-o", "table"]);
    r.operator(&["history", "pol-bought", "-o", "table"]);
    r.operator(&["budget", "--team", "team-a", "-o", "table"]);
    let status: Value = serde_json::from_str(&r.operator(&["status", "pol-bought", "-o", "json"]))
        .expect("status is JSON");
    assert_eq!(status["windows"].as_array().unwrap().len(), 1, "{status}");
    // (the operator's waiting until the functions answer it)
    let cancelled = r
        .operator_delivering(&[
            "cancel",
            "pol-bought",
            "--reason",
            "moved",
            "--wait",
            "--timeout",
            "60",
            "-o",
            "json",
        ])
        .await;
    let cancelled: Value = serde_json::from_str(&cancelled).expect("cancel --wait answers JSON");
    assert!(cancelled["status"].is_string(), "answered: {cancelled}");
    r.requester(&["cancel", "pol-bought", "--stop-running", "-o", "json"]);
    // AND an operator pauses purchases and resumes them (ARCHITECTURE 9.7)
    r.operator(&["pause", "--reason", "policy test", "-o", "json"]);
    r.operator(&["resume", "-o", "json"]);

    // THEN each policy's actions are the operations its commands made, mapped through
    // infra/iam/operations.yaml: none missing, none extra
    let template = yaml("infra/template.yaml");
    let wrong: Vec<String> = POLICIES
        .iter()
        .flat_map(|(policy, commands, _)| unlike_calls(&template, policy, commands, &r.calls))
        .collect();
    assert!(wrong.is_empty(), "{wrong:#?}\nrecorded: {:#?}", r.calls);
    // AND `types` and `new` call nothing, `approve` and `reject` ask STS who the caller is
    assert!(r.calls["types"].is_empty() && r.calls["new"].is_empty());
    for decide in ["approve", "reject"] {
        assert!(
            r.calls[decide]
                .iter()
                .any(|c| c.service == "sts" && c.operation == "GetCallerIdentity"),
            "{decide}: {:?}",
            r.calls[decide]
        );
    }

    // AND the pause's writes name the PAUSE item, the one key OperatorPolicy lets them
    for command in ["pause", "resume"] {
        let writes: Vec<&Call> = r.calls[command]
            .iter()
            .filter(|c| {
                c.service == "dynamodb" && matches!(c.operation.as_str(), "PutItem" | "DeleteItem")
            })
            .collect();
        assert!(!writes.is_empty(), "{command}: {:?}", r.calls[command]);
        assert!(
            writes.iter().all(|c| c.key.as_deref() == Some("PAUSE")),
            "{command}: {writes:?}"
        );
    }

    // AND the table's statement names each index its commands query, and no other
    for (policy, commands, parameter) in POLICIES {
        let calls: Vec<&Call> = commands.iter().flat_map(|c| &r.calls[*c]).collect();
        let indexes: BTreeSet<String> = calls.iter().filter_map(|c| c.index.clone()).collect();
        for s in statements(&template, policy) {
            if actions(&s).iter().any(|a| a.starts_with("dynamodb:")) {
                assert_eq!(
                    one_or_many(&s["Resource"]),
                    resources_for("dynamodb", &indexes),
                    "{policy}: {s}"
                );
            }
        }
        // AND every event its commands put has a source of the parameter its condition
        // names, as the stack was deployed with
        let put: BTreeSet<&String> = calls.iter().flat_map(|c| &c.sources).collect();
        let deployed = parameters();
        let allowed: BTreeSet<&str> = deployed[parameter].split(',').collect();
        for source in put {
            assert!(
                allowed.contains(source.as_str()),
                "{policy}: a command put an event as {source}, not one of {parameter} ({allowed:?})"
            );
        }
    }
}

#[test]
fn each_role_policy_is_an_output_and_grants_on_the_stacks_own_resources_and_sources_only() {
    // GIVEN the template
    let template = yaml("infra/template.yaml");
    for (policy, _, parameter) in POLICIES {
        // THEN the policy's ARN is an output, saying who attaches it
        let output = &template["Outputs"][format!("{policy}Arn")];
        assert_eq!(output["Value"], json!({"Ref": policy}), "{policy}Arn");
        assert!(
            output["Description"]
                .as_str()
                .is_some_and(|d| d.contains("Attach")),
            "{policy}Arn says who attaches it: {output}"
        );
        for s in statements(&template, policy) {
            // AND each statement allows one service's actions on that service's resource
            // of this stack, never `*`
            assert_eq!(s["Effect"], "Allow", "{policy}: {s}");
            let services: BTreeSet<String> = actions(&s)
                .iter()
                .map(|a| a.split(':').next().unwrap().to_string())
                .collect();
            assert_eq!(services.len(), 1, "{policy}: one service a statement: {s}");
            let service = services.first().unwrap();
            let resources = one_or_many(&s["Resource"]);
            assert!(
                !resources.is_empty() && resources.iter().all(|r| r != "*"),
                "{policy}: {s}"
            );
            // (the table's indexes, which the recording test holds to what is queried)
            let index = |r: &Value| {
                service == "dynamodb"
                    && r["Fn::Sub"]
                        .as_str()
                        .is_some_and(|s| s.starts_with("${StateTable.Arn}/index/"))
            };
            let expected = resources_for(service, &BTreeSet::new());
            assert!(
                expected.iter().all(|e| resources.contains(e))
                    && resources.iter().all(|r| expected.contains(r) || index(r)),
                "{policy}: {service} statement names {resources:?}, not {expected:?}"
            );
            // AND a put is conditioned on the event's source being one of its role's sources
            let writes = actions(&s)
                .iter()
                .any(|a| a == "dynamodb:PutItem" || a == "dynamodb:DeleteItem");
            if service == "events" {
                assert_eq!(s["Condition"], source_condition(parameter), "{policy}");
            } else if writes {
                // (ARCHITECTURE 9.7: the operators' one write, the PAUSE item, and no other)
                assert_eq!(policy, "OperatorPolicy", "{s}");
                assert_eq!(
                    s["Condition"],
                    json!({"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": ["PAUSE"]}}),
                    "{policy}: {s}"
                );
            } else {
                assert!(s["Condition"].is_null(), "{policy}: {s}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_plan_policy_grants_exactly_what_plan_calls_for_blocks_jobs_hyperpod_and_endpoints() {
    // GIVEN a deployment with a managed HyperPod cluster and a SageMaker model, and the CLI
    // pointed at a recording proxy in front of moto (DynamoDB) and the emulator (the rest)
    let f = deployed().await;
    managed_cluster(&f, "team-f-research");
    f.cloud
        .with_world(|w| {
            w.sagemaker_call(REGION, "CreateModel", &json!({"ModelName": "serving-llm"}))
        })
        .expect("CreateModel");
    let moto = Moto::shared().expect("moto");
    let proxy = Proxy::start(moto.url(), &f.cloud.url()).await;
    let mut r = Recorder {
        f: &f,
        proxy,
        calls: BTreeMap::new(),
    };

    // WHEN someone plans, with the stack, an EC2 request (Capacity Blocks), a training job, a
    // HyperPod cluster's group and an endpoint (training plans)
    let requests = [
        ("plan-ec2", f.ec2_request("plan-ec2"), "capacity-block"),
        (
            "plan-training",
            training_request("plan-training"),
            "training-plan(training-job)",
        ),
        (
            "plan-hyperpod",
            hyperpod_request("plan-hyperpod", "team-f-research"),
            "training-plan(hyperpod-cluster)",
        ),
        (
            "plan-endpoint",
            integration_tests::flow::endpoint_request("plan-endpoint", "serving-llm"),
            "training-plan(endpoint)",
        ),
    ];
    for (id, request, product) in requests {
        let path = file(&format!("{id}.json"), &request);
        let out: Value =
            serde_json::from_str(&r.planner(&["plan", path.to_str().unwrap(), "-o", "json"]))
                .expect("plan answers JSON");
        // (each is planned on its product with every query answered, the account's blocks
        // listed when a block is planned, and the team's budget read: every call was made,
        // and succeeded)
        let plans = out["plans"].as_array().expect("plans");
        assert!(plans.iter().any(|p| p["product"] == product), "{id}: {out}");
        assert_eq!(out["not_searched"], json!([]), "{id}: {out}");
        assert_eq!(out["decided_without"], json!([]), "{id}: {out}");
        assert!(out["budget"]["cap_usd"].is_string(), "{id}: {out}");
        assert!(
            out["rejections"]
                .as_array()
                .is_some_and(|r| r.iter().all(|r| !r["reason"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("HyperPod"))),
            "{id}: {out}"
        );
    }

    // THEN PlanPolicy's actions are the operations `plan` made, mapped through
    // infra/iam/operations.yaml: none missing, none extra
    let template = yaml("infra/template.yaml");
    let wrong = unlike_calls(&template, PLAN_POLICY, &["plan"], &r.calls);
    assert!(wrong.is_empty(), "{wrong:#?}\nrecorded: {:#?}", r.calls);
    // AND its one write is the region's pacing item (the searches it took), and each item it
    // reads or writes is one a statement granting that operation names by partition key
    let calls = &r.calls["plan"];
    let writes: BTreeSet<(&str, Option<&str>)> = calls
        .iter()
        .filter(|c| c.service == "dynamodb" && c.operation != "GetItem")
        .map(|c| (c.operation.as_str(), c.key.as_deref()))
        .collect();
    let pace = format!("PACE#{REGION}");
    assert_eq!(
        writes,
        BTreeSet::from([("PutItem", Some(pace.as_str()))]),
        "{calls:#?}"
    );
    let table = operation_table();
    let policy = statements(&template, PLAN_POLICY);
    for c in calls.iter().filter(|c| c.service == "dynamodb") {
        let key = c
            .key
            .as_deref()
            .expect("each table call of plan names an item");
        for action in &table[&(c.service.clone(), c.operation.clone())] {
            assert!(
                policy
                    .iter()
                    .any(|s| actions(s).contains(action)
                        && leading_keys(s).iter().any(|p| like(p, key))),
                "{action} on {key}: no statement of {PLAN_POLICY} grants it for that key"
            );
        }
    }
    // AND it put nothing on the bus and bought nothing
    assert!(calls.iter().all(|c| c.sources.is_empty()), "{calls:#?}");
    assert_eq!(f.blocks_for("plan-ec2"), 0);
    assert!(f.cloud.with_world(|w| w.sm.plans.is_empty()));
}

#[test]
fn the_plan_policy_is_an_output_puts_no_event_and_writes_only_the_pacing_items() {
    // GIVEN the template
    let template = yaml("infra/template.yaml");
    // THEN PlanPolicy's ARN is an output, saying who attaches it
    let output = &template["Outputs"]["PlanPolicyArn"];
    assert_eq!(
        output["Value"],
        json!({"Ref": PLAN_POLICY}),
        "PlanPolicyArn"
    );
    assert!(
        output["Description"]
            .as_str()
            .is_some_and(|d| d.contains("Attach")),
        "PlanPolicyArn says who attaches it: {output}"
    );
    let no_resource_type: BTreeSet<String> =
        NO_RESOURCE_TYPE.iter().map(|a| a.to_string()).collect();
    let mut writes = 0;
    for s in statements(&template, PLAN_POLICY) {
        // AND each statement allows one service's actions, and none puts events
        assert_eq!(s["Effect"], "Allow", "{s}");
        let granted = actions(&s);
        let services: BTreeSet<&str> = granted
            .iter()
            .map(|a| a.split(':').next().unwrap())
            .collect();
        assert_eq!(services.len(), 1, "one service a statement: {s}");
        assert!(
            !granted.contains("events:PutEvents"),
            "plan puts no event: {s}"
        );
        let resources = one_or_many(&s["Resource"]);
        match *services.first().unwrap() {
            // AND the table (no index) only by partition key: a statement that writes, to the
            // pacing items only; one that reads, the pacing items or the teams' ledgers
            "dynamodb" => {
                assert_eq!(
                    resources,
                    resources_for("dynamodb", &BTreeSet::new()),
                    "{s}"
                );
                let keys = leading_keys(&s);
                assert_eq!(
                    s["Condition"],
                    json!({"ForAllValues:StringLike": {"dynamodb:LeadingKeys": keys}}),
                    "{s}"
                );
                if granted.iter().any(|a| a != "dynamodb:GetItem") {
                    writes += 1;
                    assert_eq!(keys, ["PACE#*"], "{s}");
                } else {
                    assert!(keys == ["PACE#*"] || keys == ["BUDGET#*"], "{s}");
                }
            }
            "cloudformation" => {
                assert_eq!(
                    resources,
                    resources_for("cloudformation", &BTreeSet::new()),
                    "{s}"
                );
                assert!(s["Condition"].is_null(), "{s}");
            }
            // AND `*` only for the searches and describes that take no resource; HyperPod's
            // describes name the account's clusters, DescribeModel its models
            "ec2" | "sagemaker" if resources == [json!("*")] => {
                assert!(granted.is_subset(&no_resource_type), "{s}");
                assert!(s["Condition"].is_null(), "{s}");
            }
            "sagemaker" => {
                let resource = |kind: &str| json!({"Fn::Sub": format!("arn:${{AWS::Partition}}:sagemaker:*:${{AWS::AccountId}}:{kind}/*")});
                assert!(
                    resources == [resource("cluster")] || resources == [resource("model")],
                    "{s}"
                );
                assert!(granted.iter().all(|a| !no_resource_type.contains(a)), "{s}");
            }
            other => panic!("{PLAN_POLICY} grants {other}'s actions: {s}"),
        }
    }
    // AND it writes the table in one statement
    assert_eq!(writes, 1);
}
