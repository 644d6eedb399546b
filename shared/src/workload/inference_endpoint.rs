//! A SageMaker inference endpoint: the request names the endpoint, we name its config per
//! segment, so a repeat creates neither twice and a drain deletes exactly what the segment
//! made (the config can outlive its endpoint).

use tracing::info;

use super::{DrainTarget, Launch, Launching, settle};
use crate::domain::naming::workload_name;
use crate::domain::request::RequestId;
use crate::ports::{EndpointSpec, PortError, Store, Workloads};

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
    if !l.recorded.contains_key(&t.segment) {
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
    w: &DrainTarget,
    endpoint_name: &str,
) -> Result<Vec<String>, PortError> {
    let mut acted = Vec::new();
    let config_name = workload_name(id, w.segment);
    for region in &w.regions {
        let exists = workloads
            .describe_endpoint(region, endpoint_name)
            .await?
            .is_some();
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
