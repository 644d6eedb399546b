//! SageMaker training jobs: named from the request and segment, so a repeat finds the job
//! instead of starting a second; on demand, a job is only placed once SageMaker says so,
//! because CreateTrainingJob succeeds whatever the capacity.

use tracing::info;

use super::{DrainTarget, Launch, Launching, settle};
use crate::domain::naming::workload_name;
use crate::domain::request::{RequestId, TrainingJobTemplate};
use crate::ports::{JobState, PortError, Store, TrainingJobSpec, WorkloadRecord, Workloads};

/// SageMaker's ceiling on `MaxRuntimeInSeconds` (28 days).
const MAX_JOB_RUNTIME_SECONDS: i64 = 28 * 24 * 3600;

pub(super) async fn launch<W: Workloads, S: Store>(
    l: &Launching<'_, W, S>,
    template: &TrainingJobTemplate,
) -> Result<Launch, PortError> {
    let (t, id) = (l.target, &l.rec.request_id);
    // An on-demand job has a name of its own: after a fall-back, the plan's job for the same
    // segment must not collide with (and "find") the failed one.
    let name = match (&t.plan_arn, t.relaunch) {
        (Some(_), None) => workload_name(id, t.segment),
        (Some(_), Some(n)) => follow_on_name(id, t.segment, n),
        (None, _) => format!("{}-od", workload_name(id, t.segment)),
    };
    if let Some(before) = l.recorded.get(&t.segment).filter(|w| l.stale(w))
        && let Some(wait) = before_follow_on(l, &before.resource_id, &name).await?
    {
        return Ok(wait);
    }
    if l.current(t.segment).is_none() {
        let runtime = (t.must_end_by - l.now)
            .num_seconds()
            .clamp(1, MAX_JOB_RUNTIME_SECONDS);
        let spec = TrainingJobSpec {
            region: t.region.clone(),
            job_name: name.clone(),
            role_arn: l.config.sagemaker_execution_role_arn.clone(),
            training_image: template.training_image.clone(),
            output_s3_uri: template.output_s3_uri.clone(),
            instance_type: t.instance_type.clone(),
            instance_count: t.instance_count,
            volume_size_gb: template.volume_size_gb,
            training_plan_arn: t.plan_arn.clone(),
            max_runtime_seconds: u32::try_from(runtime).unwrap_or(u32::MAX),
            hyper_parameters: template.hyper_parameters.clone(),
            tags: l.tags.clone(),
        };
        if let Err(e) = l.workloads.start_training_job(&spec).await {
            return settle(e, &format!("training job {name}"));
        }
        info!(request_id = %id, reservation_id = %t.reservation_id, job_name = %name, "started a training job");
        l.store
            .put_workload(l.record(t.segment, name.clone(), "InProgress"))
            .await?;
    }
    if t.plan_arn.is_none() {
        return placed(l.workloads, &t.region, &name).await;
    }
    Ok(Launch::Done(vec![name]))
}

/// The follow-on job of window `segment` in the window extension `n` reopened: the job
/// before it ran with a runtime fixed at the old end (ARCHITECTURE §9.3).
pub fn follow_on_name(id: &RequestId, segment: u32, n: u32) -> String {
    format!("{}-x{n}", workload_name(id, segment))
}

/// What keeps the follow-on job `name` from starting after the job `before`: it still runs
/// (its runtime ends at the old end; `Starting` until it stops), or it completed or failed,
/// so nothing follows it (`Done`: the training is over, or its failure is the team's to
/// read). `None`: it stopped (at its runtime's end, or by the drain) or is gone, and the
/// follow-on starts, resuming from the checkpoint the job wrote.
async fn before_follow_on<W: Workloads, S: Store>(
    l: &Launching<'_, W, S>,
    before: &str,
    name: &str,
) -> Result<Option<Launch>, PortError> {
    let job = l
        .workloads
        .describe_training_job(&l.target.region, before)
        .await?;
    Ok(match job.map(|j| j.state) {
        Some(JobState::InProgress | JobState::Stopping) => Some(Launch::Starting(format!(
            "training job {before} runs until its runtime ends at the reservation's old end; \
             the follow-on job {name} starts in the extended window when it stops"
        ))),
        Some(JobState::Completed) => {
            info!(request_id = %l.rec.request_id, job = %before, "the training job completed before its old end: no follow-on job");
            Some(Launch::Done(vec![before.to_string()]))
        }
        Some(JobState::Failed) => {
            info!(request_id = %l.rec.request_id, job = %before, "the training job failed: no follow-on job");
            Some(Launch::Done(vec![before.to_string()]))
        }
        Some(JobState::Stopped) | None => None,
    })
}

/// Whether SageMaker has placed the on-demand training job `name`. CreateTrainingJob
/// succeeds whatever the capacity; a job without capacity fails minutes later with a
/// `CapacityError` / `InsufficientCapacityError` FailureReason.
async fn placed<W: Workloads>(
    workloads: &W,
    region: &str,
    name: &str,
) -> Result<Launch, PortError> {
    let Some(job) = workloads.describe_training_job(region, name).await? else {
        return Ok(Launch::Starting(format!(
            "training job {name} is not visible yet"
        )));
    };
    let reason = job.failure_reason.unwrap_or_default();
    Ok(match job.state {
        JobState::Failed if reason.contains("CapacityError") => Launch::NoCapacity {
            code: "CapacityError".into(),
            why: format!("SageMaker failed training job {name} for capacity ({reason})"),
        },
        JobState::Failed => Launch::Refuse(format!("training job {name} failed: {reason}")),
        JobState::Stopping | JobState::Stopped => Launch::Refuse(format!(
            "training job {name} was stopped before it was placed"
        )),
        JobState::InProgress
            if matches!(
                job.detail.as_str(),
                "" | "Starting" | "Pending" | "LaunchingMLInstances"
            ) =>
        {
            Launch::Starting(format!(
                "training job {name} is {} and has no instances yet",
                if job.detail.is_empty() {
                    "starting"
                } else {
                    &job.detail
                }
            ))
        }
        JobState::InProgress | JobState::Completed => Launch::Done(vec![name.to_string()]),
    })
}

/// Stops the window's jobs still in progress: the segment's own name and every job recorded
/// for the window (an on-demand job has a name of its own).
pub(super) async fn drain<W: Workloads, S: Store>(
    workloads: &W,
    store: &S,
    id: &RequestId,
    w: &DrainTarget,
) -> Result<Vec<String>, PortError> {
    let mut acted = Vec::new();
    let recorded = store.workloads(id).await?;
    let names = job_names(id, w, &recorded);
    for region in &w.regions {
        for name in &names {
            let Some(job) = workloads.describe_training_job(region, name).await? else {
                continue;
            };
            if job.state == JobState::InProgress {
                info!(request_id = %id, region, job = %name, "stopping the training job ahead of forced termination");
                workloads.stop_training_job(region, name).await?;
                acted.push(format!("training-job:{name}"));
            }
        }
    }
    Ok(acted)
}

/// The jobs a window may have: the segment's name first, then each recorded in one of its
/// reservations (or, on demand, any), once each.
pub fn job_names(id: &RequestId, w: &DrainTarget, recorded: &[WorkloadRecord]) -> Vec<String> {
    let mut names = vec![workload_name(id, w.segment)];
    for r in recorded {
        if (w.reservation_ids.contains(&r.reservation_id) || w.on_demand)
            && !names.contains(&r.resource_id)
        {
            names.push(r.resource_id.clone());
        }
    }
    names
}
