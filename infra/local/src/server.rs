//! The HTTP face: one `POST /` for every AWS service (routed by `X-Amz-Target`, or for a form
//! body by the SigV4 credential scope's service: `cloudformation`, `sts` and `sns` are awsQuery,
//! anything else EC2's query protocol), the region read from the credential scope, fault injection, and the
//! rendering of results and errors in each protocol's shape. The control API lives under
//! `/_local/`.

use std::sync::{Arc, Mutex, MutexGuard};

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::{DateTime, TimeDelta, Utc};
use serde::Deserialize;
use serde_json::{Value, json};

use aws_smithy_async::rt::sleep::{AsyncSleep, SharedAsyncSleep};

use crate::cloudformation::Stack;
use crate::error::ApiError;
use crate::query::Query;
use crate::world::{Fault, FaultKind, Settings, World};
use crate::xml::{El, el};

/// State shared by every request of one emulator instance.
#[derive(Debug)]
pub struct Shared {
    pub world: Mutex<World>,
    /// Latency faults and RunInstances' latency sleep on it (ARCHITECTURE §8.12).
    pub sleep: SharedAsyncSleep,
}

impl Shared {
    pub fn lock(&self) -> MutexGuard<'_, World> {
        // a panic in a handler must not wedge the emulator for the rest of a test run
        self.world.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub type App = Arc<Shared>;

/// The full router: AWS endpoint plus control API.
pub fn router(app: App) -> Router {
    Router::new()
        .route("/", post(aws))
        .route("/_local/clock", get(clock_get))
        .route("/_local/clock/step", post(clock_step))
        .route("/_local/clock/next", get(clock_next))
        .route(
            "/_local/faults",
            get(faults_get).post(faults_add).delete(faults_clear),
        )
        .route("/_local/instances/{id}/impair", post(instance_impair))
        .route("/_local/instances/{id}/fail", post(instance_fail))
        .route(
            "/_local/instances/{id}/spot-interruption",
            post(instance_spot),
        )
        .route("/_local/instances/{id}/health-event", post(instance_health))
        .route(
            "/_local/capacity-reservations/{id}/fail-payment",
            post(reservation_fail_payment),
        )
        .route(
            "/_local/capacity-reservations/{id}/extend",
            post(reservation_extend),
        )
        .route(
            "/_local/training-plans/{region}/{name}/fail-payment",
            post(plan_fail_payment),
        )
        .route(
            "/_local/training-plans/{region}/{name}/extend",
            post(plan_extend),
        )
        .route(
            "/_local/extension-payment-fails",
            post(extension_payment_fails),
        )
        .route(
            "/_local/payment-failures",
            get(payment_failures_get).post(payment_failures_add),
        )
        .route("/_local/events", get(events_all))
        .route("/_local/events/{bus}", get(events_bus))
        .route("/_local/events/{region}/{bus}", get(events_region_bus))
        .route("/_local/state", get(state_get))
        .route("/_local/settings", get(settings_get).patch(settings_patch))
        .route("/_local/stacks/{region}", get(stacks_get).post(stacks_put))
        .route(
            "/_local/identities",
            get(identities_get).post(identities_put),
        )
        .route("/_local/sns/messages", get(sns_messages_get))
        .route("/_local/sns/subscriptions", get(sns_subscriptions_get))
        .route("/_local/sns/subscriptions/confirm", post(sns_confirm))
        .with_state(app)
}

/// A SigV4 credential scope: `Credential=AKID/20260901/us-east-1/ec2/aws4_request`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Scope {
    access_key_id: String,
    region: String,
    service: String,
}

fn scope_of(headers: &HeaderMap) -> Option<Scope> {
    let auth = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let cred = auth.split("Credential=").nth(1)?;
    let scope = cred.split([',', ' ']).next()?;
    let parts: Vec<&str> = scope.split('/').collect();
    (parts.len() >= 5).then(|| Scope {
        access_key_id: parts[0].to_string(),
        region: parts[2].to_string(),
        service: parts[3].to_string(),
    })
}

/// The region in the credential scope (`us-east-1` for an unsigned request).
fn region_of(headers: &HeaderMap) -> String {
    scope_of(headers).map_or_else(|| "us-east-1".to_string(), |s| s.region)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    Ec2,
    SageMaker,
    Events,
    /// awsQuery
    CloudFormation,
    /// awsQuery
    Sts,
    /// awsQuery
    Sns,
}

impl Protocol {
    /// The service name in [`World::calls`].
    fn service(self) -> &'static str {
        match self {
            Protocol::Ec2 => "ec2",
            Protocol::SageMaker => "sagemaker",
            Protocol::Events => "events",
            Protocol::CloudFormation => "cloudformation",
            Protocol::Sts => "sts",
            Protocol::Sns => "sns",
        }
    }

    /// An awsQuery service's answer namespace.
    fn query_xmlns(self) -> Option<&'static str> {
        match self {
            Protocol::CloudFormation => Some(crate::cloudformation::XMLNS),
            Protocol::Sts => Some(crate::sts::XMLNS),
            Protocol::Sns => Some(crate::sns::XMLNS),
            _ => None,
        }
    }
}

/// Which service a form body is for: the credential scope's service, or for an unsigned
/// request the API version it names; EC2 otherwise.
fn form_protocol(scope: Option<&Scope>, query: &Query) -> Protocol {
    match scope.map(|s| s.service.as_str()) {
        Some("cloudformation") => Protocol::CloudFormation,
        Some("sts") => Protocol::Sts,
        Some("sns") => Protocol::Sns,
        Some(_) => Protocol::Ec2,
        None => match query.get("Version") {
            Some("2010-05-15") => Protocol::CloudFormation,
            Some("2011-06-15") => Protocol::Sts,
            Some("2010-03-31") => Protocol::Sns,
            _ => Protocol::Ec2,
        },
    }
}

/// What an operation answered, before rendering.
enum Answer {
    /// EC2: the children of `<{op}Response>`.
    Ec2(Vec<El>),
    /// awsJson.
    Json(Value),
    /// awsQuery: the children of `<{op}Result>` (none: an operation that answers nothing has
    /// no `<{op}Result>`).
    Query(Vec<El>),
}

async fn aws(State(app): State<App>, headers: HeaderMap, body: Bytes) -> Response {
    let request_id = app.lock().next_uuid("request");
    let scope = scope_of(&headers);
    let region = region_of(&headers);
    let target = headers
        .get("x-amz-target")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let (protocol, op, query, input) = match &target {
        Some(t) => {
            let (svc, op) = t.split_once('.').unwrap_or((t.as_str(), ""));
            let protocol = match svc {
                "SageMaker" => Protocol::SageMaker,
                "AWSEvents" => Protocol::Events,
                _ => {
                    let e = ApiError::new(
                        400,
                        "UnknownOperationException",
                        format!("Unknown target {t}"),
                    );
                    return render_error(Protocol::SageMaker, &e, &request_id);
                }
            };
            let input: Value = if body.is_empty() {
                json!({})
            } else {
                match serde_json::from_slice(&body) {
                    Ok(v) => v,
                    Err(e) => {
                        let e = ApiError::new(400, "SerializationException", e.to_string());
                        return render_error(protocol, &e, &request_id);
                    }
                }
            };
            (protocol, op.to_string(), Query::default(), input)
        }
        None => match Query::parse(&body) {
            Ok(q) => {
                let protocol = form_protocol(scope.as_ref(), &q);
                let Some(op) = q.get("Action").map(str::to_string) else {
                    let e = ApiError::ec2(
                        400,
                        "MissingAction",
                        "The request must contain the parameter Action",
                    );
                    return render_error(protocol, &e, &request_id);
                };
                (protocol, op, q, Value::Null)
            }
            Err(e) => return render_error(Protocol::Ec2, &e, &request_id),
        },
    };
    let fault = {
        let mut w = app.lock();
        // Every AWS call that reached the emulator, per service, for the runner's counts.
        *w.calls.entry(protocol.service().to_string()).or_default() += 1;
        *w.operations.entry(op.clone()).or_default() += 1;
        w.take_fault(&op)
    };
    let mut lose_response = false;
    match fault {
        None => {}
        Some(FaultKind::Latency { millis }) => {
            app.sleep
                .sleep(std::time::Duration::from_millis(millis))
                .await;
        }
        Some(FaultKind::LostResponse) => lose_response = true,
        Some(FaultKind::Throttle) => {
            let e = match protocol {
                Protocol::Ec2 => {
                    ApiError::new(503, "RequestLimitExceeded", "Request limit exceeded.")
                }
                Protocol::CloudFormation | Protocol::Sts | Protocol::Sns => {
                    ApiError::new(400, "Throttling", "Rate exceeded")
                }
                _ => ApiError::new(400, "ThrottlingException", "Rate exceeded"),
            };
            return render_error(protocol, &e, &request_id);
        }
        Some(FaultKind::InternalError) => {
            return render_error(protocol, &internal(protocol), &request_id);
        }
        Some(FaultKind::Error {
            status,
            code,
            message,
        }) => {
            let e = ApiError::new(status, &code, message);
            return render_error(protocol, &e, &request_id);
        }
    }
    let (result, latency_ms) = {
        let mut w = app.lock();
        let latency_ms = if protocol == Protocol::Ec2 && op == "RunInstances" {
            w.settings.run_instances_latency_ms
        } else {
            0
        };
        let result = match protocol {
            Protocol::Ec2 => w.ec2_call(&region, &op, &query).map(Answer::Ec2),
            Protocol::SageMaker => w.sagemaker_call(&region, &op, &input).map(Answer::Json),
            Protocol::Events => w.events_call(&region, &op, &input).map(Answer::Json),
            Protocol::CloudFormation => w
                .cloudformation_call(&region, &op, &query)
                .map(Answer::Query),
            Protocol::Sts => w
                .sts_call(
                    scope.as_ref().map(|s| s.access_key_id.as_str()),
                    &op,
                    &query,
                )
                .map(Answer::Query),
            Protocol::Sns => w
                .sns_call(
                    scope.as_ref().map(|s| s.access_key_id.as_str()),
                    &region,
                    &op,
                    &query,
                )
                .map(Answer::Query),
        };
        (result, latency_ms)
    };
    tracing::debug!(op, region, ok = result.is_ok(), "request");
    // RunInstances' own latency (ARCHITECTURE §8.10): the call is done, the world is free for
    // other requests, and only this answer waits.
    if latency_ms > 0 {
        app.sleep
            .sleep(std::time::Duration::from_millis(latency_ms))
            .await;
    }
    if lose_response {
        return render_error(protocol, &internal(protocol), &request_id);
    }
    match result {
        Ok(Answer::Ec2(children)) => {
            let mut root = el(&format!("{op}Response")).v("requestId", &request_id);
            for c in children {
                root = root.child(c);
            }
            with_ids(
                (
                    StatusCode::OK,
                    [(header::CONTENT_TYPE, "text/xml;charset=UTF-8")],
                    root.document(),
                )
                    .into_response(),
                &request_id,
            )
        }
        Ok(Answer::Query(children)) => {
            let ns = protocol
                .query_xmlns()
                .unwrap_or(crate::cloudformation::XMLNS);
            let mut root = el(&format!("{op}Response"));
            if !children.is_empty() {
                let mut result = el(&format!("{op}Result"));
                for c in children {
                    result = result.child(c);
                }
                root = root.child(result);
            }
            let root = root.child(el("ResponseMetadata").v("RequestId", &request_id));
            with_ids(
                (
                    StatusCode::OK,
                    [(header::CONTENT_TYPE, "text/xml")],
                    root.document_in(ns),
                )
                    .into_response(),
                &request_id,
            )
        }
        Ok(Answer::Json(json)) => with_ids(
            (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "application/x-amz-json-1.1")],
                json.to_string(),
            )
                .into_response(),
            &request_id,
        ),
        Err(e) => render_error(protocol, &e, &request_id),
    }
}

fn internal(protocol: Protocol) -> ApiError {
    match protocol {
        Protocol::Ec2 => ApiError::new(
            500,
            "InternalError",
            "An internal error has occurred. Retry your request.",
        ),
        Protocol::SageMaker => ApiError::new(500, "InternalFailure", "An internal error occurred."),
        Protocol::Events => ApiError::new(500, "InternalException", "An internal error occurred."),
        Protocol::CloudFormation | Protocol::Sts => ApiError::new(
            500,
            "InternalFailure",
            "The request processing has failed because of an unknown error, exception or failure.",
        ),
        // SNS's modelled `InternalErrorException`
        Protocol::Sns => ApiError::new(500, "InternalError", "Internal Error"),
    }
}

fn with_ids(mut resp: Response, request_id: &str) -> Response {
    if let Ok(v) = HeaderValue::from_str(request_id) {
        resp.headers_mut().insert("x-amzn-requestid", v.clone());
        resp.headers_mut().insert("x-amz-request-id", v);
    }
    resp
}

fn render_error(protocol: Protocol, e: &ApiError, request_id: &str) -> Response {
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST);
    let resp = match protocol {
        Protocol::Ec2 => {
            let body = el("Response")
                .child(el("Errors").child(el("Error").v("Code", &e.code).v("Message", &e.message)))
                .v("RequestID", request_id);
            (
                status,
                [(header::CONTENT_TYPE, "text/xml;charset=UTF-8")],
                format!(
                    "<?xml version=\"1.0\" encoding=\"UTF-8\"?>{}",
                    body.render()
                ),
            )
                .into_response()
        }
        Protocol::CloudFormation | Protocol::Sts | Protocol::Sns => {
            // awsQuery: `Sender` for the caller's errors, `Receiver` for the service's.
            let kind = if e.status >= 500 {
                "Receiver"
            } else {
                "Sender"
            };
            let body = el("ErrorResponse")
                .child(
                    el("Error")
                        .v("Type", kind)
                        .v("Code", &e.code)
                        .v("Message", &e.message),
                )
                .v("RequestId", request_id);
            let ns = protocol
                .query_xmlns()
                .unwrap_or(crate::cloudformation::XMLNS);
            (
                status,
                [(header::CONTENT_TYPE, "text/xml")],
                body.document_in(ns),
            )
                .into_response()
        }
        Protocol::SageMaker | Protocol::Events => (
            status,
            [(header::CONTENT_TYPE, "application/x-amz-json-1.1")],
            json!({"__type": e.code, "message": e.message, "Message": e.message}).to_string(),
        )
            .into_response(),
    };
    with_ids(resp, request_id)
}

// ---- control API ----------------------------------------------------------------------------

fn control_error(e: &ApiError) -> Response {
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST);
    (status, Json(json!({"error": e.code, "message": e.message}))).into_response()
}

fn rfc(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

async fn clock_get(State(app): State<App>) -> Json<Value> {
    Json(json!({"now": rfc(app.lock().now)}))
}

/// A step: by `seconds`/`minutes`/`hours`, `to` an RFC 3339 time, or `next` transition.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Step {
    pub seconds: Option<i64>,
    pub minutes: Option<i64>,
    pub hours: Option<i64>,
    pub to: Option<DateTime<Utc>>,
    pub next: bool,
}

async fn clock_step(State(app): State<App>, body: Bytes) -> Response {
    let step: Step = if body.is_empty() {
        Step::default()
    } else {
        match serde_json::from_slice(&body) {
            Ok(s) => s,
            Err(e) => return control_error(&ApiError::new(400, "BadRequest", e.to_string())),
        }
    };
    let mut w = app.lock();
    let now = w.now;
    let target = if step.next {
        match w.next_transition() {
            Some(t) => t.max(now),
            None => now,
        }
    } else if let Some(t) = step.to {
        t
    } else {
        now + TimeDelta::seconds(step.seconds.unwrap_or(0))
            + TimeDelta::minutes(step.minutes.unwrap_or(0))
            + TimeDelta::hours(step.hours.unwrap_or(0))
    };
    if target < now {
        return control_error(&ApiError::new(
            400,
            "BadRequest",
            "the clock never moves backwards",
        ));
    }
    let ran = w.advance_to(target);
    Json(json!({"now": rfc(w.now), "transitions": ran, "next": w.next_transition().map(rfc)}))
        .into_response()
}

async fn clock_next(State(app): State<App>) -> Json<Value> {
    let w = app.lock();
    Json(json!({"now": rfc(w.now), "next": w.next_transition().map(rfc)}))
}

async fn faults_get(State(app): State<App>) -> Json<Value> {
    Json(json!({"faults": app.lock().faults}))
}

async fn faults_add(State(app): State<App>, body: Bytes) -> Response {
    match serde_json::from_slice::<Fault>(&body) {
        Ok(f) => {
            app.lock().faults.push(f);
            StatusCode::NO_CONTENT.into_response()
        }
        Err(e) => control_error(&ApiError::new(400, "BadRequest", e.to_string())),
    }
}

async fn faults_clear(State(app): State<App>) -> StatusCode {
    app.lock().faults.clear();
    StatusCode::NO_CONTENT
}

fn done(r: Result<(), ApiError>) -> Response {
    match r {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => control_error(&e),
    }
}

#[derive(Debug, Deserialize)]
struct Impair {
    #[serde(default = "yes")]
    impaired: bool,
}

fn yes() -> bool {
    true
}

async fn instance_impair(State(app): State<App>, Path(id): Path<String>, body: Bytes) -> Response {
    let impaired = serde_json::from_slice::<Impair>(&body).map_or(true, |i| i.impaired);
    done(app.lock().impair_instance(&id, impaired))
}

async fn instance_fail(State(app): State<App>, Path(id): Path<String>) -> Response {
    done(app.lock().fail_instance(&id))
}

async fn instance_spot(State(app): State<App>, Path(id): Path<String>) -> Response {
    done(app.lock().interrupt_spot(&id))
}

#[derive(Debug, Deserialize)]
struct Health {
    #[serde(default = "retirement")]
    code: String,
    /// Minutes from now that the change starts (14 days when not given).
    #[serde(default)]
    start_in_minutes: Option<i64>,
}

fn retirement() -> String {
    "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED".to_string()
}

async fn instance_health(State(app): State<App>, Path(id): Path<String>, body: Bytes) -> Response {
    let (code, start_in) = serde_json::from_slice::<Health>(&body).map_or_else(
        |_| (retirement(), None),
        |h| (h.code, h.start_in_minutes.map(chrono::TimeDelta::minutes)),
    );
    done(app.lock().health_event(&id, &code, start_in))
}

async fn reservation_fail_payment(State(app): State<App>, Path(id): Path<String>) -> Response {
    done(app.lock().fail_payment(&id))
}

async fn plan_fail_payment(
    State(app): State<App>,
    Path((region, name)): Path<(String, String)>,
) -> Response {
    done(app.lock().fail_plan_payment(&region, &name))
}

/// A console extension: `{"hours": n}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Extend {
    pub hours: i64,
}

fn extend_body(body: &[u8]) -> Result<Extend, ApiError> {
    serde_json::from_slice::<Extend>(body)
        .map_err(|e| ApiError::new(400, "BadRequest", e.to_string()))
}

/// Extends a block by hand, as the console would (`World::extend_block`).
async fn reservation_extend(
    State(app): State<App>,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let hours = match extend_body(&body) {
        Ok(e) => e.hours,
        Err(e) => return control_error(&e),
    };
    match app.lock().extend_block(&id, hours) {
        Ok(e) => Json(json!({
            "capacity_reservation_id": id,
            "offering_id": e.offering_id,
            "status": e.status,
            "hours": e.hours,
            "start": rfc(e.start),
            "end": rfc(e.end),
            "upfront_fee": e.upfront_fee.to_string(),
        }))
        .into_response(),
        Err(e) => control_error(&e),
    }
}

/// Extends a training plan by hand, as the console would (`World::extend_plan`).
async fn plan_extend(
    State(app): State<App>,
    Path((region, name)): Path<(String, String)>,
    body: Bytes,
) -> Response {
    let hours = match extend_body(&body) {
        Ok(e) => e.hours,
        Err(e) => return control_error(&e),
    };
    match app.lock().extend_plan(&region, &name, hours) {
        Ok(e) => Json(json!({
            "training_plan_name": name,
            "payment_status": e.payment_status(),
            "hours": e.hours,
            "start": rfc(e.start),
            "end": rfc(e.end),
            "paid_at": rfc(e.paid_at),
            "availability_zone": e.availability_zone,
            "upfront_fee": e.upfront_fee.to_string(),
        }))
        .into_response(),
        Err(e) => control_error(&e),
    }
}

/// Arms a one-shot extension payment failure: `{"reservation": "<cr id, plan ARN or name>"}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExtensionPaymentFails {
    pub reservation: String,
}

/// The next extension bought for the reservation fails its payment
/// (`World::fail_next_extension_payment`); answers the key armed.
async fn extension_payment_fails(State(app): State<App>, body: Bytes) -> Response {
    match serde_json::from_slice::<ExtensionPaymentFails>(&body) {
        Ok(x) => match app.lock().fail_next_extension_payment(&x.reservation) {
            Ok(key) => Json(json!({"armed": key})).into_response(),
            Err(e) => control_error(&e),
        },
        Err(e) => control_error(&ApiError::new(400, "BadRequest", e.to_string())),
    }
}

/// Forces the payments of the next `count` reservations bought for a request to fail.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PaymentFailures {
    pub request_id: String,
    #[serde(default = "one")]
    pub count: u32,
    /// How many of the request's next purchases pay before these fail.
    #[serde(default)]
    pub after: u32,
}

fn one() -> u32 {
    1
}

async fn payment_failures_get(State(app): State<App>) -> Json<Value> {
    Json(json!({"payment_failures": app.lock().payment_failures}))
}

async fn payment_failures_add(State(app): State<App>, body: Bytes) -> Response {
    match serde_json::from_slice::<PaymentFailures>(&body) {
        Ok(p) => {
            app.lock()
                .force_payment_failures_after(&p.request_id, p.after, p.count);
            StatusCode::NO_CONTENT.into_response()
        }
        Err(e) => control_error(&ApiError::new(400, "BadRequest", e.to_string())),
    }
}

/// Every bus: the home region's by name, the others' as `<region>/<name>`.
async fn events_all(State(app): State<App>) -> Json<Value> {
    Json(json!(app.lock().buses_by_label()))
}

/// A bus of the home region.
async fn events_bus(State(app): State<App>, Path(bus): Path<String>) -> Json<Value> {
    Json(json!({"events": app.lock().home_events(&bus)}))
}

/// A bus of any region.
async fn events_region_bus(
    State(app): State<App>,
    Path((region, bus)): Path<(String, String)>,
) -> Json<Value> {
    Json(json!({"events": app.lock().events(&region, &bus)}))
}

async fn state_get(State(app): State<App>) -> Json<Value> {
    Json(app.lock().snapshot())
}

async fn settings_get(State(app): State<App>) -> Json<Value> {
    Json(json!(app.lock().settings))
}

async fn settings_patch(State(app): State<App>, body: Bytes) -> Response {
    let mut w = app.lock();
    let mut current = json!(w.settings);
    let patch: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return control_error(&ApiError::new(400, "BadRequest", e.to_string())),
    };
    let Some(obj) = patch.as_object() else {
        return control_error(&ApiError::new(400, "BadRequest", "expected a JSON object"));
    };
    for (k, v) in obj {
        if current.get(k).is_none() {
            return control_error(&ApiError::new(
                400,
                "BadRequest",
                format!("unknown setting {k}"),
            ));
        }
        current[k] = v.clone();
    }
    match serde_json::from_value::<Settings>(current) {
        Ok(s) => {
            w.settings = s;
            Json(json!(w.settings)).into_response()
        }
        Err(e) => control_error(&ApiError::new(400, "BadRequest", e.to_string())),
    }
}

/// The stacks registered in a region.
async fn stacks_get(State(app): State<App>, Path(region): Path<String>) -> Json<Value> {
    let w = app.lock();
    Json(json!({"stacks": w.stacks_in(&region)}))
}

/// Registers (or replaces) a stack in a region, as a deployment would leave it.
async fn stacks_put(State(app): State<App>, Path(region): Path<String>, body: Bytes) -> Response {
    let stack: Stack = match serde_json::from_slice(&body) {
        Ok(s) => s,
        Err(e) => return control_error(&ApiError::new(400, "BadRequest", e.to_string())),
    };
    match app.lock().put_stack(&region, stack) {
        Ok(id) => Json(json!({"stack_id": id})).into_response(),
        Err(e) => control_error(&e),
    }
}

/// An access key id and the identity it signs for.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Identity {
    access_key_id: String,
    arn: String,
}

async fn identities_get(State(app): State<App>) -> Json<Value> {
    Json(json!({"identities": app.lock().identities}))
}

async fn identities_put(State(app): State<App>, body: Bytes) -> Response {
    match serde_json::from_slice::<Identity>(&body) {
        Ok(i) => done(app.lock().put_identity(&i.access_key_id, &i.arn)),
        Err(e) => control_error(&ApiError::new(400, "BadRequest", e.to_string())),
    }
}

/// Every message SNS accepted, oldest first.
async fn sns_messages_get(State(app): State<App>) -> Json<Value> {
    Json(json!({"messages": app.lock().sns_messages()}))
}

/// Every SNS subscription, in creation order.
async fn sns_subscriptions_get(State(app): State<App>) -> Json<Value> {
    Json(json!({"subscriptions": app.lock().sns_subscriptions()}))
}

/// Which pending SNS subscription(s) to confirm: one by ARN, or every one of a topic to an
/// endpoint.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SnsConfirm {
    #[serde(default)]
    subscription_arn: Option<String>,
    #[serde(default)]
    topic_arn: Option<String>,
    #[serde(default)]
    endpoint: Option<String>,
}

/// Confirms pending SNS subscriptions, standing in for the recipient following the link.
async fn sns_confirm(State(app): State<App>, body: Bytes) -> Response {
    let c: SnsConfirm = match serde_json::from_slice(&body) {
        Ok(c) => c,
        Err(e) => return control_error(&ApiError::new(400, "BadRequest", e.to_string())),
    };
    let confirmed = app.lock().confirm_sns_subscriptions(
        c.subscription_arn.as_deref(),
        c.topic_arn.as_deref(),
        c.endpoint.as_deref(),
    );
    match confirmed {
        Ok(arns) => Json(json!({"confirmed": arns})).into_response(),
        Err(e) => control_error(&e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signed(scope: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_str(&format!(
                "AWS4-HMAC-SHA256 Credential={scope}, SignedHeaders=host, Signature=0"
            ))
            .expect("header"),
        );
        h
    }

    #[test]
    fn a_form_body_goes_to_the_service_its_signature_names() {
        // GIVEN form bodies signed for CloudFormation, STS, SNS and EC2, and unsigned ones
        let q = |body: &str| Query::parse(body.as_bytes()).expect("form");
        let describe = q("Action=DescribeStacks&Version=2010-05-15");
        let cfn = signed("AKID/20260901/us-west-2/cloudformation/aws4_request");
        let sts = signed("AKID2/20260901/us-east-1/sts/aws4_request");
        let ec2 = signed("AKID/20260901/us-east-1/ec2/aws4_request");
        // WHEN each is routed
        // THEN the scope's service decides, and an unsigned body's API version
        let scope = scope_of(&cfn).expect("scope");
        assert_eq!(
            (scope.access_key_id.as_str(), scope.region.as_str()),
            ("AKID", "us-west-2")
        );
        assert_eq!(
            form_protocol(Some(&scope), &describe),
            Protocol::CloudFormation
        );
        assert_eq!(
            form_protocol(scope_of(&sts).as_ref(), &q("Action=GetCallerIdentity")),
            Protocol::Sts
        );
        assert_eq!(
            scope_of(&sts).map(|s| s.access_key_id),
            Some("AKID2".to_string())
        );
        assert_eq!(
            form_protocol(scope_of(&ec2).as_ref(), &describe),
            Protocol::Ec2
        );
        assert_eq!(form_protocol(None, &describe), Protocol::CloudFormation);
        assert_eq!(
            form_protocol(None, &q("Action=GetCallerIdentity&Version=2011-06-15")),
            Protocol::Sts
        );
        assert_eq!(
            form_protocol(None, &q("Action=DescribeSubnets&Version=2016-11-15")),
            Protocol::Ec2
        );
        assert_eq!(
            form_protocol(
                scope_of(&signed("AKID/20260901/us-east-1/sns/aws4_request")).as_ref(),
                &q("Action=Publish&Version=2010-03-31")
            ),
            Protocol::Sns
        );
        assert_eq!(
            form_protocol(None, &q("Action=Publish&Version=2010-03-31")),
            Protocol::Sns
        );
        assert_eq!(region_of(&HeaderMap::new()), "us-east-1");
    }
}
