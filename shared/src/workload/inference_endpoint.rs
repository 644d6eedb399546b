//! A SageMaker inference endpoint: the request names the endpoint, we name its config per
//! segment, so a repeat creates neither twice and a drain deletes exactly what the segment
//! made (the config can outlive its endpoint).

use tracing::{info, warn};

use super::{DrainTarget, Launch, Launching, settle};
use crate::domain::naming::{MANAGED_TAG, REQUEST_TAG, owns, workload_name};
use crate::domain::request::{FieldError, RequestId};
use crate::domain::reservation::ReservationState;
use crate::ports::{EndpointCreation, EndpointInfo, EndpointSpec, PortError, Store, Workloads};

/// Why an existing endpoint of the name is not ours for `id` (ARCHITECTURE §8.7), if it is not.
fn not_ours(e: &EndpointInfo, region: &str, id: &RequestId, deployment: &str) -> Option<String> {
    if owns(&e.tags, id, deployment) {
        return None;
    }
    let whose = match e.tags.get(REQUEST_TAG) {
        Some(other) if e.tags.contains_key(MANAGED_TAG) => format!("request {other}'s"),
        _ => "not capacity-pilot's".to_string(),
    };
    Some(format!(
        "an endpoint named {} already exists in {region} and is {whose} (of this deployment \
         {deployment}, only what it created for request {id} is changed or deleted)",
        e.endpoint_name
    ))
}

/// A request naming an endpoint that exists and is not ours is refused at once: creating it
/// would adopt someone else's endpoint, and the drain would delete it.
pub(super) async fn submission_problem<W: Workloads>(
    workloads: &W,
    regions: &[String],
    id: &RequestId,
    deployment: &str,
    endpoint_name: &str,
) -> Result<Option<FieldError>, PortError> {
    for region in regions {
        if let Some(e) = workloads.describe_endpoint(region, endpoint_name).await?
            && let Some(why) = not_ours(&e, region, id, deployment)
        {
            return Ok(Some(FieldError {
                field: "workload.endpoint_name".to_string(),
                message: format!("{why}; choose another endpoint_name"),
            }));
        }
    }
    Ok(None)
}

/// The request's endpoint, as its workload names it.
pub(super) struct Endpoint<'a> {
    pub model_name: &'a str,
    pub endpoint_name: &'a str,
    pub variant_name: &'a str,
}

/// How many times an endpoint that ends `Failed` is created anew in its window before the
/// request fails with the reason.
pub const ENDPOINT_ATTEMPTS: u32 = 3;

/// The workload record's states, besides AWS's `EndpointStatus` values.
const CREATING: &str = "Creating";
const IN_SERVICE: &str = "InService";
/// A failed attempt deleted, its name not yet free.
const RETRYING: &str = "Retrying";

/// Creates the endpoint once its plan is `Active`, and follows it to `InService`: `Done`
/// only then (aws-reference §11.2: "The training plan must be in the Active status to be
/// used by an inference endpoint"). A `Failed` endpoint is deleted and created again, up to
/// [`ENDPOINT_ATTEMPTS`] times in the window; one still `Deleting` is waited out, since a
/// create with its name meanwhile is refused. The record's generation counts the attempts.
pub(super) async fn launch<W: Workloads, S: Store>(
    l: &Launching<'_, W, S>,
    e: &Endpoint<'_>,
) -> Result<Launch, PortError> {
    let (t, id) = (l.target, &l.rec.request_id);
    let endpoint_name = e.endpoint_name;
    let deployment = l.config.deployment_id.as_str();
    // A relaunch creates the endpoint again: the drain deleted it.
    let recorded = l.current(t.segment);
    let attempt = recorded.map_or(0, |r| r.generation);
    let record = |state: &str, generation: u32| {
        let mut r = l.record(t.segment, endpoint_name.to_string(), state);
        r.generation = generation;
        r
    };
    if recorded.is_some_and(|r| r.state == IN_SERVICE) {
        return Ok(Launch::Done(vec![endpoint_name.to_string()]));
    }
    let existing = l
        .workloads
        .describe_endpoint(&t.region, endpoint_name)
        .await?;
    // "Already exists" is not "ours": someone may have taken the name since submission.
    if let Some(why) = existing
        .as_ref()
        .and_then(|x| not_ours(x, &t.region, id, deployment))
    {
        return Ok(Launch::Refuse(format!("{why}; nothing was created")));
    }
    let created = recorded.is_some_and(|r| r.state == CREATING);
    match existing.as_ref().map(|x| x.status.as_str()) {
        Some("InService") if created => {
            info!(request_id = %id, endpoint_name = %endpoint_name, "the endpoint is in service");
            l.store.put_workload(record(IN_SERVICE, attempt)).await?;
            return Ok(Launch::Done(vec![endpoint_name.to_string()]));
        }
        Some("Failed") if created => {
            let reason = existing
                .as_ref()
                .and_then(|x| x.failure_reason.clone())
                .unwrap_or_else(|| "no reason given".into());
            let tried = attempt + 1;
            if tried >= ENDPOINT_ATTEMPTS {
                return Ok(Launch::Refuse(format!(
                    "endpoint {endpoint_name} failed {tried} times in this window; the last \
                     time: {reason}"
                )));
            }
            // Deleted, then created again once its name is free.
            l.workloads
                .delete_endpoint(&t.region, endpoint_name, &workload_name(id, t.segment))
                .await?;
            l.store.put_workload(record(RETRYING, tried)).await?;
            warn!(request_id = %id, endpoint_name = %endpoint_name, attempt = tried, %reason, "the endpoint failed; deleted to create it again");
            return Ok(Launch::Starting(format!(
                "endpoint {endpoint_name} failed ({reason}); deleted, and created again once \
                 its deletion is done (attempt {} of {ENDPOINT_ATTEMPTS})",
                tried + 1
            )));
        }
        Some("Deleting") => {
            return Ok(Launch::Starting(format!(
                "endpoint {endpoint_name} is still being deleted; it is created again once its \
                 name is free"
            )));
        }
        Some(status) => {
            if !created {
                // Ours and there, but not recorded as created by this attempt (a crash after
                // the create): followed from here.
                l.store.put_workload(record(CREATING, attempt)).await?;
            }
            return Ok(Launch::Starting(format!(
                "endpoint {endpoint_name} is {status}; the window runs once it is InService"
            )));
        }
        None => {}
    }
    if let Some(plan) = &t.plan_arn {
        let state = l.workloads.plan_state(&t.region, plan).await?;
        if state != Some(ReservationState::Active) {
            return Ok(Launch::Starting(format!(
                "training plan {plan} is {}; an endpoint can use it only once it is Active",
                state.map_or("not known to SageMaker yet".to_string(), |s| format!(
                    "{s:?}"
                ))
            )));
        }
    }
    let spec = EndpointSpec {
        region: t.region.clone(),
        endpoint_name: endpoint_name.to_string(),
        endpoint_config_name: workload_name(id, t.segment),
        model_name: e.model_name.to_string(),
        variant_name: e.variant_name.to_string(),
        instance_type: t.instance_type.clone(),
        instance_count: t.instance_count,
        ml_reservation_arn: t.plan_arn.clone(),
        tags: l.tags.clone(),
    };
    // Recorded before the call: a crash after it finds the endpoint ours and follows it.
    l.store.put_workload(record(CREATING, attempt)).await?;
    match l.workloads.create_endpoint(&spec).await {
        Ok(EndpointCreation::Created) => {}
        // AWS documents that a config just created may not be visible to CreateEndpoint yet
        // (botocore `sagemaker` model, CreateEndpoint): the endpoint is created on a later
        // tick (the record finds no endpoint, so this path runs again), never refused.
        Ok(EndpointCreation::ConfigNotVisible(why)) => {
            info!(request_id = %id, endpoint_name = %endpoint_name, endpoint_config_name = %spec.endpoint_config_name, %why, "the endpoint config is not visible yet");
            return Ok(Launch::Starting(format!(
                "endpoint config {} is not visible to SageMaker yet ({why}); endpoint \
                 {endpoint_name} is created on the next tick",
                spec.endpoint_config_name
            )));
        }
        Err(err) => return settle(err, &format!("endpoint {endpoint_name}")),
    }
    info!(request_id = %id, reservation_id = %t.reservation_id, endpoint_name = %endpoint_name, attempt, "created an endpoint");
    Ok(Launch::Starting(format!(
        "endpoint {endpoint_name} was created; the window runs once it is InService"
    )))
}

/// Deletes the endpoint and the segment's config in each of the window's regions; only an
/// endpoint that existed counts as acted on.
pub(super) async fn drain<W: Workloads>(
    workloads: &W,
    id: &RequestId,
    deployment: &str,
    w: &DrainTarget,
    endpoint_name: &str,
) -> Result<Vec<String>, PortError> {
    let mut acted = Vec::new();
    let config_name = workload_name(id, w.segment);
    for region in &w.regions {
        let found = workloads.describe_endpoint(region, endpoint_name).await?;
        if let Some(why) = found
            .as_ref()
            .and_then(|e| not_ours(e, region, id, deployment))
        {
            // Never delete what is not ours (§8.7); the config of ours costs nothing.
            warn!(request_id = %id, region, endpoint = %endpoint_name, "{why}; left alone");
            continue;
        }
        let exists = found.is_some();
        // The config may outlive its endpoint: delete both every time.
        workloads
            .delete_endpoint(region, endpoint_name, &config_name)
            .await?;
        if exists {
            info!(request_id = %id, region, endpoint = %endpoint_name, "deleted the endpoint and its config");
            acted.push(format!("endpoint:{endpoint_name}"));
            acted.push(format!("endpoint-config:{config_name}"));
        }
    }
    Ok(acted)
}
