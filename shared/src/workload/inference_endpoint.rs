//! A SageMaker inference endpoint: the request names the endpoint, we name its config per
//! segment, so a repeat creates neither twice and a drain deletes exactly what the segment
//! made (the config can outlive its endpoint).

use tracing::{info, warn};

use super::{DrainTarget, Launch, Launching, settle};
use crate::domain::naming::{MANAGED_TAG, REQUEST_TAG, owns, workload_name};
use crate::domain::request::{FieldError, RequestId};
use crate::ports::{EndpointInfo, EndpointSpec, PortError, Store, Workloads};

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

pub(super) async fn launch<W: Workloads, S: Store>(
    l: &Launching<'_, W, S>,
    e: &Endpoint<'_>,
) -> Result<Launch, PortError> {
    let (t, id) = (l.target, &l.rec.request_id);
    let endpoint_name = e.endpoint_name;
    let deployment = l.config.deployment_id.as_str();
    if !l.recorded.contains_key(&t.segment) {
        // "Already exists" is not "ours": someone may have taken the name since submission.
        if let Some(existing) = l
            .workloads
            .describe_endpoint(&t.region, endpoint_name)
            .await?
            && let Some(why) = not_ours(&existing, &t.region, id, deployment)
        {
            return Ok(Launch::Refuse(format!("{why}; nothing was created")));
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
        if let Err(err) = l.workloads.create_endpoint(&spec).await {
            return settle(err, &format!("endpoint {endpoint_name}"));
        }
        // Created between our look and our call by someone else: their tags show it.
        if let Some(existing) = l
            .workloads
            .describe_endpoint(&t.region, endpoint_name)
            .await?
            && let Some(why) = not_ours(&existing, &t.region, id, deployment)
        {
            return Ok(Launch::Refuse(format!("{why}; it was not adopted")));
        }
        info!(request_id = %id, reservation_id = %t.reservation_id, endpoint_name = %endpoint_name, "created an endpoint");
        l.store
            .put_workload(l.record(t.segment, endpoint_name.to_string(), "Creating"))
            .await?;
    }
    Ok(Launch::Done(vec![endpoint_name.to_string()]))
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
