//! SageMaker behind the ports: training-plan offerings, purchases and plans for
//! `CapacityMarket`, and training jobs, HyperPod instance groups and endpoints for
//! `Workloads`. All SageMaker <-> domain conversion is here.
//!
//! SageMaker answers "not found" and "already exists" with the unmodeled
//! `ValidationException` for several operations, so those are read from the error code and
//! message (see `error.rs`), never from the Rust error variant.

use std::collections::BTreeMap;
use std::sync::Arc;

use aws_config::SdkConfig;
use aws_sdk_sagemaker::Client;
use aws_sdk_sagemaker::config::retry::RetryConfig;
use aws_sdk_sagemaker::operation::describe_cluster::DescribeClusterOutput;
use aws_sdk_sagemaker::types::{
    AlgorithmSpecification, CapacityReservationPreference, ClusterInstanceGroupDetails,
    ClusterInstanceGroupSpecification, ClusterInstanceType, ClusterLifeCycleConfig,
    OutputDataConfig, ProductionVariant, ProductionVariantCapacityReservationConfig,
    ProductionVariantInstanceType, ReservedCapacityInstanceType, ReservedCapacitySummary,
    ResourceConfig, SageMakerResourceName, StoppingCondition, Tag, TrainingInputMode,
    TrainingInstanceType, TrainingPlanOffering,
};
use chrono::{DateTime, Utc};

use super::error::{Call, Failure, classify, malformed, to_chrono, to_smithy};
use super::hyperpod_update;
use super::regional::Regional;
use crate::domain::catalog::PriceTable;
use crate::domain::extension::{ExtensionOffer, ExtensionPayment, ExtensionSeen};
use crate::domain::money::Usd;
use crate::domain::naming::{MANAGED_TAG, REQUEST_TAG};
use crate::domain::offering::{Offering, Product, Segment, TargetResource};
use crate::domain::request::RequestId;
use crate::domain::reservation::{Reservation, ReservationState};
use crate::ports::{
    EndpointCreation, EndpointInfo, EndpointSpec, InstanceGroupInfo, InstanceGroupSpec, JobInfo,
    JobState, OfferingQuery, PortError, PurchaseSpec, TrainingJobSpec,
};

pub const SERVICE: &str = "sagemaker";

/// The SageMaker adapter, one client per region.
#[derive(Clone, Debug)]
pub struct SageMakerAdapter {
    clients: Regional<Client>,
    prices: Arc<PriceTable>,
}

fn build_client(config: &SdkConfig, region: &str) -> Client {
    let conf = aws_sdk_sagemaker::config::Builder::from(config)
        .region(aws_sdk_sagemaker::config::Region::new(region.to_string()))
        .build();
    Client::from_conf(conf)
}

type SdkError<E> =
    aws_sdk_sagemaker::error::SdkError<E, aws_sdk_sagemaker::config::http::HttpResponse>;

fn err<E>(op: &'static str, call: Call) -> impl FnOnce(SdkError<E>) -> PortError
where
    E: aws_sdk_sagemaker::error::ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    move |e| classify(SERVICE, op, call, e)
}

fn tags_with_managed(tags: &BTreeMap<String, String>) -> Vec<Tag> {
    let mut tags = tags.clone();
    tags.entry(MANAGED_TAG.to_string())
        .or_insert_with(|| "true".to_string());
    tags.iter()
        .map(|(k, v)| Tag::builder().key(k).value(v).build())
        .collect()
}

fn i32_of(op: &'static str, what: &str, n: u32) -> Result<i32, PortError> {
    i32::try_from(n).map_err(|_| PortError::Permanent {
        service: SERVICE,
        code: "ValidationException".to_string(),
        message: format!("{op}: {what} {n} is too large"),
    })
}

/// A purchase call's configuration (ARCHITECTURE §8.11): no SDK retries (no purchase API has
/// an idempotency token: a retry after a lost answer could buy twice) and an explicit
/// operation timeout; the block's or plan's purchase and its extension's alike.
fn purchase_config() -> aws_sdk_sagemaker::config::Builder {
    aws_sdk_sagemaker::config::Builder::default()
        .retry_config(RetryConfig::disabled())
        .timeout_config(
            aws_sdk_sagemaker::config::timeout::TimeoutConfig::builder()
                .operation_timeout(super::PURCHASE_OPERATION_TIMEOUT)
                .build(),
        )
}

fn time(
    op: &'static str,
    what: &str,
    t: Option<&aws_smithy_types::DateTime>,
) -> Result<DateTime<Utc>, PortError> {
    t.and_then(to_chrono)
        .ok_or_else(|| malformed(SERVICE, op, format!("{what} is missing or out of range")))
}

fn fee(
    op: &'static str,
    id: &str,
    fee: Option<&str>,
    currency: Option<&str>,
) -> Result<Usd, PortError> {
    if let Some(c) = currency.filter(|c| *c != "USD") {
        return Err(malformed(
            SERVICE,
            op,
            format!("{id} is priced in {c}, not USD"),
        ));
    }
    let f = fee.ok_or_else(|| malformed(SERVICE, op, format!("{id} has no UpfrontFee")))?;
    Usd::parse(f).map_err(|e| malformed(SERVICE, op, format!("{id} UpfrontFee {f:?}: {e}")))
}

/// A plan's extension as SageMaker reports it. Its `PaymentStatus` and `Status` are free
/// strings (aws-reference §3.1): failed when either says so; taken when the payment status
/// says it succeeded (or, with no payment status, the extension is active); anything else is
/// pending (live: never read as failed, which would give its debit back).
fn plan_extension(
    op: &'static str,
    e: &aws_sdk_sagemaker::types::TrainingPlanExtension,
) -> Result<ExtensionSeen, PortError> {
    let id = e
        .training_plan_extension_offering_id()
        .ok_or_else(|| malformed(SERVICE, op, "an extension has no offering id"))?;
    let said = |s: Option<&str>| s.unwrap_or_default().to_ascii_lowercase();
    let (payment, status) = (said(e.payment_status()), said(e.status()));
    let payment = if payment.contains("fail") || status.contains("fail") {
        ExtensionPayment::Failed
    } else if ["succeeded", "success", "paid", "completed"].contains(&payment.as_str())
        || (payment.is_empty() && status == "active")
    {
        ExtensionPayment::Succeeded
    } else {
        ExtensionPayment::Pending
    };
    let fee = match e.upfront_fee() {
        Some(_) => Some(fee(op, id, e.upfront_fee(), e.currency_code())?),
        None => None,
    };
    Ok(ExtensionSeen {
        offering_id: id.to_string(),
        hours: e
            .duration_hours()
            .and_then(|h| u32::try_from(h).ok())
            .unwrap_or_default(),
        starts_at: time(op, "StartDate", e.start_date())?,
        ends_at: time(op, "EndDate", e.end_date())?,
        fee,
        payment,
        bought_at: e.extended_at().and_then(to_chrono),
    })
}

/// The `SageMakerResourceName` a plan serves, as the domain's target.
pub fn target_of(name: &str) -> Option<TargetResource> {
    Some(match name {
        "training-job" => TargetResource::TrainingJob,
        "hyperpod-cluster" => TargetResource::HyperpodCluster,
        "endpoint" => TargetResource::Endpoint,
        _ => return None,
    })
}

/// SageMaker's plan statuses, mapped to the domain's. `Active` may go back to `Scheduled`
/// between discontinuous reserved capacities; the mapping keeps that.
pub fn plan_state(s: &str) -> ReservationState {
    match s {
        "Pending" => ReservationState::PaymentPending,
        "Scheduled" => ReservationState::Scheduled,
        "Active" => ReservationState::Active,
        "Expired" => ReservationState::Expired,
        "Failed" => ReservationState::Failed,
        other => {
            tracing::warn!(status = other, "unknown training plan status");
            ReservationState::Unknown
        }
    }
}

fn job_state(s: &str) -> JobState {
    match s {
        "Completed" => JobState::Completed,
        "Failed" => JobState::Failed,
        "Stopping" => JobState::Stopping,
        // A job being deleted is as good as stopped for us.
        "Stopped" | "Deleting" => JobState::Stopped,
        _ => JobState::InProgress,
    }
}

/// The plan name in a training-plan ARN (`...:training-plan/<name>`), or the input itself.
pub fn plan_name_of(name_or_arn: &str) -> &str {
    name_or_arn.rsplit('/').next().unwrap_or(name_or_arn)
}

/// Whether `name` is the plan name of `request_id` for some attempt (`naming::plan_name`).
/// The deployment is the one whose hash `plan_name` carries (ARCHITECTURE §8.7): another
/// stack's plans for the same request id are not the request's.
fn is_plan_of(name: &str, plan_name: &str, request_id: &RequestId) -> bool {
    use crate::domain::naming::{plan_attempt, plan_name_hash};
    let hash = plan_name_hash(plan_name, request_id).unwrap_or_default();
    name == plan_name || plan_attempt(name, request_id, hash).is_some()
}

/// The fields a plan reports in DescribeTrainingPlan and in ListTrainingPlans' summaries.
struct PlanView<'a> {
    arn: Option<&'a str>,
    name: Option<&'a str>,
    status: Option<&'a str>,
    start: Option<&'a aws_smithy_types::DateTime>,
    end: Option<&'a aws_smithy_types::DateTime>,
    fee: Option<&'a str>,
    currency: Option<&'a str>,
    total_instances: Option<i32>,
    targets: &'a [SageMakerResourceName],
    capacities: &'a [ReservedCapacitySummary],
}

impl<'a> PlanView<'a> {
    /// What ListTrainingPlans says of a plan.
    fn of_summary(p: &'a aws_sdk_sagemaker::types::TrainingPlanSummary) -> PlanView<'a> {
        PlanView {
            arn: p.training_plan_arn(),
            name: p.training_plan_name(),
            status: p.status().map(|s| s.as_str()),
            start: p.start_time(),
            end: p.end_time(),
            fee: p.upfront_fee(),
            currency: p.currency_code(),
            total_instances: p.total_instance_count(),
            targets: p.target_resources(),
            capacities: p.reserved_capacity_summaries(),
        }
    }
}

fn plan_reservation(
    op: &'static str,
    region: &str,
    p: PlanView<'_>,
) -> Result<Option<Reservation>, PortError> {
    let arn = p
        .arn
        .ok_or_else(|| malformed(SERVICE, op, "a training plan has no ARN"))?;
    let Some(target) = p.targets.first().and_then(|t| target_of(t.as_str())) else {
        // A plan for a resource we don't serve (e.g. studio-apps) is not one of ours.
        tracing::warn!(
            training_plan_arn = arn,
            "skipping a plan for an unknown target resource"
        );
        return Ok(None);
    };
    let mut segments = Vec::new();
    for rc in p.capacities {
        segments.push(Segment {
            start: time(op, "ReservedCapacity StartTime", rc.start_time())?,
            end: time(op, "ReservedCapacity EndTime", rc.end_time())?,
            availability_zone: rc.availability_zone().map(str::to_string),
        });
    }
    if segments.is_empty() {
        // Not yet paid for: the plan knows its window, not its capacities.
        if let (Some(start), Some(end)) = (p.start.and_then(to_chrono), p.end.and_then(to_chrono)) {
            segments.push(Segment {
                start,
                end,
                availability_zone: None,
            });
        }
    }
    segments.sort_by_key(|s| s.start);
    let instance_count = p
        .total_instances
        .or_else(|| p.capacities.first().and_then(|c| c.total_instance_count()))
        .and_then(|n| u32::try_from(n).ok())
        .unwrap_or_default();
    Ok(Some(Reservation {
        id: arn.to_string(),
        product: Product::TrainingPlan { target },
        region: region.to_string(),
        instance_type: p
            .capacities
            .first()
            .and_then(|c| c.instance_type())
            .map(|t| t.as_str().to_string())
            .unwrap_or_default(),
        instance_count,
        segments,
        upfront_fee: fee(op, p.name.unwrap_or(arn), p.fee, p.currency)?,
        state: p
            .status
            .map(plan_state)
            .unwrap_or(ReservationState::Unknown),
        offering_id: None,
        request_tag: None,
        ultraserver: p.capacities.iter().any(|c| {
            c.reserved_capacity_type()
                .is_some_and(|t| t.as_str() == "UltraServer")
        }),
        bought_at: None,
        debit_month: None,
        debit_team: None,
        payment_check_at: None,
        extensions: Vec::new(),
        extension_check_at: None,
        deployment_tag: None,
    }))
}

impl SageMakerAdapter {
    /// Clients for every region are built from `config` on first use.
    pub fn new(config: &SdkConfig, prices: PriceTable) -> SageMakerAdapter {
        SageMakerAdapter {
            clients: Regional::new(config, build_client),
            prices: Arc::new(prices),
        }
    }

    /// Uses `client` for `region` (tests with mocked clients).
    pub fn with_client(self, region: &str, client: Client) -> SageMakerAdapter {
        self.clients.insert(region, client);
        self
    }

    pub fn client(&self, region: &str) -> Client {
        self.clients.get(region)
    }

    // ----------------------------------------------------------------------------------
    // Training plans
    // ----------------------------------------------------------------------------------

    /// SearchTrainingPlanOfferings for one target resource; each offering keeps all of its
    /// reserved-capacity segments.
    pub async fn search_plans(&self, q: &OfferingQuery) -> Result<Vec<Offering>, PortError> {
        const OP: &str = "SearchTrainingPlanOfferings";
        let Product::TrainingPlan { target } = q.product else {
            return Err(not_a_plan(OP, q.product));
        };
        let out = self
            .client(&q.region)
            .search_training_plan_offerings()
            .instance_type(ReservedCapacityInstanceType::from(q.instance_type.as_str()))
            .instance_count(i32_of(OP, "InstanceCount", q.instance_count)?)
            .duration_hours(i64::from(q.duration_hours))
            .start_time_after(to_smithy(q.start_from))
            .end_time_before(to_smithy(q.end_by))
            .target_resources(SageMakerResourceName::from(target.as_aws()))
            .send()
            .await
            .map_err(err(OP, Call::Retryable))?;
        let mut offerings = Vec::new();
        for o in out.training_plan_offerings() {
            offerings.extend(self.offering(q, target, o)?);
        }
        tracing::debug!(region = %q.region, instance_type = %q.instance_type, found = offerings.len(), "training plan offerings");
        Ok(offerings)
    }

    fn offering(
        &self,
        q: &OfferingQuery,
        target: TargetResource,
        o: &TrainingPlanOffering,
    ) -> Result<Option<Offering>, PortError> {
        const OP: &str = "SearchTrainingPlanOfferings";
        let id = o
            .training_plan_offering_id()
            .ok_or_else(|| malformed(SERVICE, OP, "an offering has no id"))?;
        if o.currency_code().is_some_and(|c| c != "USD") {
            tracing::warn!(offering_id = id, currency = ?o.currency_code(), "skipping an offering not priced in USD");
            return Ok(None);
        }
        let rcs = o.reserved_capacity_offerings();
        if rcs.is_empty() {
            return Err(malformed(
                SERVICE,
                OP,
                format!("offering {id} has no reserved capacity"),
            ));
        }
        let mut segments = Vec::new();
        for rc in rcs {
            segments.push(Segment {
                start: time(OP, "StartTime", rc.start_time())?,
                end: time(OP, "EndTime", rc.end_time())?,
                availability_zone: rc.availability_zone().map(str::to_string),
            });
        }
        let first = &rcs[0];
        let instance_type = first
            .instance_type()
            .map(|t| t.as_str().to_string())
            .unwrap_or_else(|| q.instance_type.clone());
        let instance_count = first
            .instance_count()
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or(q.instance_count);
        Ok(Some(Offering::new(
            id,
            Product::TrainingPlan { target },
            &q.region,
            instance_type,
            instance_count,
            segments,
            fee(OP, id, o.upfront_fee(), o.currency_code())?,
            &self.prices,
        )))
    }

    /// CreateTrainingPlan named `spec.plan_name`, with SDK retries disabled (no idempotency
    /// token). A taken name means an earlier attempt bought it: `OutcomeUnknown`, settled by
    /// [`SageMakerAdapter::plans_for_request`].
    pub async fn purchase_plan(
        &self,
        offering: &Offering,
        spec: &PurchaseSpec,
    ) -> Result<Reservation, PortError> {
        const OP: &str = "CreateTrainingPlan";
        let Product::TrainingPlan { .. } = offering.product else {
            return Err(not_a_plan(OP, offering.product));
        };
        let mut tags = spec.tags.clone();
        tags.insert(REQUEST_TAG.to_string(), spec.request_id.to_string());
        tracing::info!(
            request_id = %spec.request_id,
            offering_id = %offering.id,
            training_plan_name = %spec.plan_name,
            region = %offering.region,
            upfront_fee = %offering.upfront_fee,
            "purchasing training plan"
        );
        let out = self
            .client(&offering.region)
            .create_training_plan()
            .training_plan_name(&spec.plan_name)
            .training_plan_offering_id(&offering.id)
            .set_tags(Some(tags_with_managed(&tags)))
            .customize()
            .config_override(purchase_config())
            .send()
            .await
            .map_err(err(OP, Call::Purchase))?;
        let arn = out
            .training_plan_arn()
            .ok_or_else(|| PortError::OutcomeUnknown {
                service: SERVICE,
                message: format!("{OP}: the response has no TrainingPlanArn"),
            })?;
        // Built from the offering rather than a second call, which could fail after a
        // purchase that succeeded.
        Ok(Reservation {
            id: arn.to_string(),
            product: offering.product,
            region: offering.region.clone(),
            instance_type: offering.instance_type.clone(),
            instance_count: offering.instance_count,
            segments: offering.segments.clone(),
            upfront_fee: offering.upfront_fee,
            state: ReservationState::PaymentPending,
            offering_id: Some(offering.id.clone()),
            request_tag: Some(spec.request_id.to_string()),
            ultraserver: false,
            bought_at: None,
            debit_month: None,
            debit_team: None,
            payment_check_at: None,
            extensions: Vec::new(),
            extension_check_at: None,
            deployment_tag: None,
        })
    }

    /// SearchTrainingPlanOfferings with the plan's ARN: what plan `arn` can be extended by,
    /// for `hours` (ARCHITECTURE §9.3).
    pub async fn plan_extension_offers(
        &self,
        region: &str,
        arn: &str,
        hours: u32,
    ) -> Result<Vec<ExtensionOffer>, PortError> {
        const OP: &str = "SearchTrainingPlanOfferings";
        let out = self
            .client(region)
            .search_training_plan_offerings()
            .training_plan_arn(arn)
            .duration_hours(i64::from(hours))
            .send()
            .await
            .map_err(err(OP, Call::Retryable))?;
        let mut offers = Vec::new();
        for o in out.training_plan_extension_offerings() {
            let id = o
                .training_plan_extension_offering_id()
                .ok_or_else(|| malformed(SERVICE, OP, "an extension offering has no id"))?;
            offers.push(ExtensionOffer {
                offering_id: id.to_string(),
                hours: o
                    .duration_hours()
                    .and_then(|h| u32::try_from(h).ok())
                    .ok_or_else(|| malformed(SERVICE, OP, format!("{id} has no DurationHours")))?,
                starts_at: time(OP, "StartDate", o.start_date())?,
                ends_at: time(OP, "EndDate", o.end_date())?,
                fee: fee(OP, id, o.upfront_fee(), o.currency_code())?,
            });
        }
        Ok(offers)
    }

    /// ExtendTrainingPlan with SDK retries disabled, as a plan's purchase: the API has no
    /// idempotency token. Any doubt is `OutcomeUnknown`, settled by
    /// [`SageMakerAdapter::plan_extensions`].
    pub async fn extend_plan(
        &self,
        region: &str,
        offer: &ExtensionOffer,
    ) -> Result<ExtensionSeen, PortError> {
        const OP: &str = "ExtendTrainingPlan";
        tracing::info!(
            offering_id = %offer.offering_id,
            region,
            upfront_fee = %offer.fee,
            "purchasing training plan extension"
        );
        let out = self
            .client(region)
            .extend_training_plan()
            .training_plan_extension_offering_id(&offer.offering_id)
            .customize()
            .config_override(purchase_config())
            .send()
            .await
            .map_err(err(OP, Call::Purchase))?;
        let e = out
            .training_plan_extensions()
            .iter()
            .find(|e| e.training_plan_extension_offering_id() == Some(offer.offering_id.as_str()))
            .ok_or_else(|| PortError::OutcomeUnknown {
                service: SERVICE,
                message: format!(
                    "{OP}: the response names no extension of {}",
                    offer.offering_id
                ),
            })?;
        plan_extension(OP, e).map_err(|e| PortError::OutcomeUnknown {
            service: SERVICE,
            message: format!("{OP}: bought, but the response is unreadable: {e}"),
        })
    }

    /// DescribeTrainingPlanExtensionHistory of plan `arn`: every extension of it SageMaker
    /// lists, paid, pending or failed.
    pub async fn plan_extensions(
        &self,
        region: &str,
        arn: &str,
    ) -> Result<Vec<ExtensionSeen>, PortError> {
        const OP: &str = "DescribeTrainingPlanExtensionHistory";
        let mut pages = self
            .client(region)
            .describe_training_plan_extension_history()
            .training_plan_arn(arn)
            .into_paginator()
            .items()
            .send();
        let mut out = Vec::new();
        while let Some(item) = pages.next().await {
            let e = item.map_err(err(OP, Call::Retryable))?;
            out.push(plan_extension(OP, &e)?);
        }
        Ok(out)
    }

    /// DescribeTrainingPlan by name or ARN; `None` when SageMaker does not know it.
    pub async fn describe_plan(
        &self,
        region: &str,
        name_or_arn: &str,
    ) -> Result<Option<Reservation>, PortError> {
        self.describe_plan_named(region, name_or_arn, None).await
    }

    /// [`Self::describe_plan`]; with `exact`, a plan SageMaker returns under another name
    /// (names that differ only in case, if SageMaker folds them) is not taken for it.
    async fn describe_plan_named(
        &self,
        region: &str,
        name_or_arn: &str,
        exact: Option<&str>,
    ) -> Result<Option<Reservation>, PortError> {
        const OP: &str = "DescribeTrainingPlan";
        let res = self
            .client(region)
            .describe_training_plan()
            .training_plan_name(plan_name_of(name_or_arn))
            .send()
            .await;
        let p = match res {
            Ok(p) => p,
            Err(e) => {
                let f = Failure::from_sdk(OP, e);
                if f.is_not_found() {
                    return Ok(None);
                }
                return Err(f.into_port(SERVICE, Call::Retryable));
            }
        };
        if let Some(want) = exact
            && p.training_plan_name() != Some(want)
        {
            tracing::warn!(
                asked = want,
                returned = p.training_plan_name(),
                "DescribeTrainingPlan returned a plan of another name; not taken as ours"
            );
            return Ok(None);
        }
        plan_reservation(
            OP,
            region,
            PlanView {
                arn: p.training_plan_arn(),
                name: p.training_plan_name(),
                status: p.status().map(|s| s.as_str()),
                start: p.start_time(),
                end: p.end_time(),
                fee: p.upfront_fee(),
                currency: p.currency_code(),
                total_instances: p.total_instance_count(),
                targets: p.target_resources(),
                capacities: p.reserved_capacity_summaries(),
            },
        )
    }

    /// The request's plans: DescribeTrainingPlan by the deterministic name, plus
    /// ListTrainingPlans for names of other attempts (and in case the describe misses a
    /// plan just created).
    pub async fn plans_for_request(
        &self,
        region: &str,
        request_id: &RequestId,
        plan_name: &str,
    ) -> Result<Vec<Reservation>, PortError> {
        const OP: &str = "ListTrainingPlans";
        // Only the plan of exactly this name: another request's id may differ from this one
        // only in case (review N15), and this request's tag is stamped on what is found.
        let mut found: Vec<Reservation> = self
            .describe_plan_named(region, plan_name, Some(plan_name))
            .await?
            .into_iter()
            .collect();
        let mut pages = self
            .client(region)
            .list_training_plans()
            .into_paginator()
            .items()
            .send();
        while let Some(p) = pages.next().await {
            let p = p.map_err(err(OP, Call::Retryable))?;
            let Some(name) = p.training_plan_name() else {
                continue;
            };
            if !is_plan_of(name, plan_name, request_id) {
                continue;
            }
            if found
                .iter()
                .any(|r| Some(r.id.as_str()) == p.training_plan_arn())
            {
                continue;
            }
            found.extend(plan_reservation(OP, region, PlanView::of_summary(&p))?);
        }
        for r in &mut found {
            r.request_tag = Some(request_id.to_string());
        }
        Ok(found)
    }

    /// Every training plan named for a request of the deployment `deployment_id` (the
    /// deployment's hash in its name, ARCHITECTURE §8.7), over every page, each with its
    /// request and deployment: what the detector of unrecorded reservations reads.
    pub async fn plans_of_deployment(
        &self,
        region: &str,
        deployment_id: &str,
    ) -> Result<Vec<Reservation>, PortError> {
        const OP: &str = "ListTrainingPlans";
        let hash = crate::domain::naming::deployment_hash(deployment_id);
        let mut found = Vec::new();
        let mut pages = self
            .client(region)
            .list_training_plans()
            .into_paginator()
            .items()
            .send();
        while let Some(p) = pages.next().await {
            let p = p.map_err(err(OP, Call::Retryable))?;
            let Some(name) = p.training_plan_name() else {
                continue;
            };
            let Some(request_id) = crate::domain::naming::plan_request(name, &hash) else {
                continue;
            };
            if let Some(mut r) = plan_reservation(OP, region, PlanView::of_summary(&p))? {
                r.request_tag = Some(request_id.to_string());
                r.deployment_tag = Some(deployment_id.to_string());
                found.push(r);
            }
        }
        Ok(found)
    }

    // ----------------------------------------------------------------------------------
    // Training jobs
    // ----------------------------------------------------------------------------------

    /// CreateTrainingJob, into the plan when `training_plan_arn` is set. The job name is our
    /// key: an existing job of that name is success.
    pub async fn start_training_job(&self, spec: &TrainingJobSpec) -> Result<(), PortError> {
        const OP: &str = "CreateTrainingJob";
        let mut resources = ResourceConfig::builder()
            .instance_type(TrainingInstanceType::from(spec.instance_type.as_str()))
            .instance_count(i32_of(OP, "InstanceCount", spec.instance_count)?)
            .volume_size_in_gb(i32_of(OP, "VolumeSizeInGB", spec.volume_size_gb)?);
        if let Some(arn) = &spec.training_plan_arn {
            resources = resources.training_plan_arn(arn);
        }
        tracing::info!(
            region = %spec.region,
            job_name = %spec.job_name,
            training_plan_arn = ?spec.training_plan_arn,
            instance_type = %spec.instance_type,
            instance_count = spec.instance_count,
            "creating training job"
        );
        let res = self
            .client(&spec.region)
            .create_training_job()
            .training_job_name(&spec.job_name)
            .role_arn(&spec.role_arn)
            .algorithm_specification(
                AlgorithmSpecification::builder()
                    .training_image(&spec.training_image)
                    .training_input_mode(TrainingInputMode::File)
                    .build(),
            )
            .output_data_config(
                OutputDataConfig::builder()
                    .s3_output_path(&spec.output_s3_uri)
                    .build(),
            )
            .resource_config(resources.build())
            .stopping_condition(
                StoppingCondition::builder()
                    .max_runtime_in_seconds(i32_of(
                        OP,
                        "MaxRuntimeInSeconds",
                        spec.max_runtime_seconds,
                    )?)
                    .build(),
            )
            .set_hyper_parameters(
                (!spec.hyper_parameters.is_empty())
                    .then(|| spec.hyper_parameters.clone().into_iter().collect()),
            )
            .set_tags(Some(tags_with_managed(&spec.tags)))
            .send()
            .await;
        match res {
            Ok(_) => Ok(()),
            Err(e) => {
                let f = Failure::from_sdk(OP, e);
                if f.is_already_exists() {
                    tracing::info!(job_name = %spec.job_name, "training job exists already");
                    return Ok(());
                }
                Err(f.into_port(SERVICE, Call::Retryable))
            }
        }
    }

    /// DescribeTrainingJob; `None` for SageMaker's "not found" `ValidationException`.
    pub async fn describe_training_job(
        &self,
        region: &str,
        job_name: &str,
    ) -> Result<Option<JobInfo>, PortError> {
        const OP: &str = "DescribeTrainingJob";
        let res = self
            .client(region)
            .describe_training_job()
            .training_job_name(job_name)
            .send()
            .await;
        let j = match res {
            Ok(j) => j,
            Err(e) => {
                let f = Failure::from_sdk(OP, e);
                if f.is_not_found() {
                    return Ok(None);
                }
                return Err(f.into_port(SERVICE, Call::Retryable));
            }
        };
        Ok(Some(JobInfo {
            job_name: j.training_job_name().unwrap_or(job_name).to_string(),
            state: j
                .training_job_status()
                .map(|s| job_state(s.as_str()))
                .unwrap_or(JobState::InProgress),
            detail: j
                .secondary_status()
                .map(|s| s.as_str().to_string())
                .unwrap_or_default(),
            failure_reason: j.failure_reason().map(str::to_string),
        }))
    }

    /// StopTrainingJob. A job already stopped, finished or gone needs no stopping.
    pub async fn stop_training_job(&self, region: &str, job_name: &str) -> Result<(), PortError> {
        const OP: &str = "StopTrainingJob";
        tracing::info!(region, job_name, "stopping training job");
        let res = self
            .client(region)
            .stop_training_job()
            .training_job_name(job_name)
            .send()
            .await;
        let Err(e) = res else { return Ok(()) };
        let f = Failure::from_sdk(OP, e);
        let not_running =
            f.code == "ValidationException" && f.message.contains("training job is in status");
        if f.is_not_found() || not_running {
            return Ok(());
        }
        Err(f.into_port(SERVICE, Call::Retryable))
    }

    // ----------------------------------------------------------------------------------
    // HyperPod instance groups
    // ----------------------------------------------------------------------------------

    /// DescribeCluster (and ListTags for the managed tag); `None` when the cluster does not
    /// exist. A cluster without the group gives `instance_group_name: None`.
    pub async fn describe_instance_group(
        &self,
        region: &str,
        cluster_name: &str,
        instance_group_name: &str,
    ) -> Result<Option<InstanceGroupInfo>, PortError> {
        const OP: &str = "DescribeCluster";
        let client = self.client(region);
        let res = client
            .describe_cluster()
            .cluster_name(cluster_name)
            .send()
            .await;
        let c = match res {
            Ok(c) => c,
            Err(e) => {
                let f = Failure::from_sdk(OP, e);
                if f.is_not_found() {
                    return Ok(None);
                }
                return Err(f.into_port(SERVICE, Call::Retryable));
            }
        };
        let arn = c
            .cluster_arn()
            .ok_or_else(|| malformed(SERVICE, OP, format!("cluster {cluster_name} has no ARN")))?;
        let cluster_managed = self.has_managed_tag(region, arn).await?;
        let group = c
            .instance_groups()
            .iter()
            .find(|g| g.instance_group_name() == Some(instance_group_name));
        let cluster_status = c
            .cluster_status()
            .map(|s| s.as_str().to_string())
            .unwrap_or_default();
        let group_roles: Vec<(String, String)> = c
            .instance_groups()
            .iter()
            .filter_map(|g| {
                Some((
                    g.instance_group_name()?.to_string(),
                    g.execution_role()?.to_string(),
                ))
            })
            .collect();
        let Some(g) = group else {
            return Ok(Some(InstanceGroupInfo {
                cluster_name: cluster_name.to_string(),
                cluster_managed,
                instance_group_name: None,
                current_count: 0,
                target_count: 0,
                status: cluster_status,
                group_roles,
            }));
        };
        let current_count = match g.current_count() {
            Some(n) => u32::try_from(n).unwrap_or_default(),
            None => {
                self.count_nodes(region, cluster_name, instance_group_name)
                    .await?
            }
        };
        Ok(Some(InstanceGroupInfo {
            cluster_name: cluster_name.to_string(),
            cluster_managed,
            instance_group_name: Some(instance_group_name.to_string()),
            current_count,
            target_count: g
                .target_count()
                .and_then(|n| u32::try_from(n).ok())
                .unwrap_or_default(),
            status: g
                .status()
                .map(|s| s.as_str().to_string())
                .unwrap_or(cluster_status),
            group_roles,
        }))
    }

    /// Every tag of the resource `arn` (ListTags, all pages).
    async fn tags_of(
        &self,
        region: &str,
        arn: &str,
    ) -> Result<BTreeMap<String, String>, PortError> {
        const OP: &str = "ListTags";
        let mut pages = self
            .client(region)
            .list_tags()
            .resource_arn(arn)
            .into_paginator()
            .items()
            .send();
        let mut tags = BTreeMap::new();
        while let Some(t) = pages.next().await {
            let t = t.map_err(err(OP, Call::Retryable))?;
            if let Some(k) = t.key() {
                tags.insert(k.to_string(), t.value().unwrap_or_default().to_string());
            }
        }
        Ok(tags)
    }

    /// Whether the resource carries `capacity-pilot:managed=true`.
    async fn has_managed_tag(&self, region: &str, arn: &str) -> Result<bool, PortError> {
        const OP: &str = "ListTags";
        let mut pages = self
            .client(region)
            .list_tags()
            .resource_arn(arn)
            .into_paginator()
            .items()
            .send();
        while let Some(t) = pages.next().await {
            let t = t.map_err(err(OP, Call::Retryable))?;
            // Only "true" counts, as the IAM conditions that guard UpdateCluster demand: a
            // cluster tagged `True`, `yes` or `false` would pass a presence check, have a
            // plan bought for it, and then be denied the update (review M8a).
            if t.key() == Some(MANAGED_TAG) {
                return Ok(t.value() == Some("true"));
            }
        }
        Ok(false)
    }

    async fn count_nodes(
        &self,
        region: &str,
        cluster: &str,
        group: &str,
    ) -> Result<u32, PortError> {
        const OP: &str = "ListClusterNodes";
        let mut pages = self
            .client(region)
            .list_cluster_nodes()
            .cluster_name(cluster)
            .instance_group_name_contains(group)
            .into_paginator()
            .items()
            .send();
        let mut n = 0;
        while let Some(node) = pages.next().await {
            let node = node.map_err(err(OP, Call::Retryable))?;
            if node.instance_group_name() == Some(group) {
                n += 1;
            }
        }
        Ok(n)
    }

    /// UpdateCluster with the group's type, count and plan. A group that exists keeps its
    /// life-cycle configuration unless the spec gives one.
    pub async fn put_instance_group(&self, spec: &InstanceGroupSpec) -> Result<(), PortError> {
        const OP: &str = "UpdateCluster";
        let count = i32_of(OP, "InstanceCount", spec.instance_count)?;
        let name = spec.instance_group_name.as_str();
        let groups = self
            .stable_update(&spec.region, &spec.cluster_name, |current| {
                let groups = current.instance_groups();
                // An update that went through (its answer lost, or an SDK retry refused as
                // a conflict after it) is settled here: the group already is what we want.
                if let Some(g) = groups
                    .iter()
                    .find(|g| g.instance_group_name() == Some(name))
                    && hyperpod_update::already(g, count, spec.training_plan_arn.as_deref())
                {
                    tracing::info!(
                        cluster_name = %spec.cluster_name,
                        instance_group_name = %name,
                        "the instance group already has its count and plan; no update sent"
                    );
                    return None;
                }
                // Every group goes back with its own settings; ours changes only in count
                // and plan (a new one is made from the request).
                let mut out: Vec<ClusterInstanceGroupSpecification> = Vec::new();
                let mut found = false;
                for g in groups {
                    let mut s = hyperpod_update::unchanged(g);
                    if g.instance_group_name() == Some(name) {
                        found = true;
                        s.instance_count = Some(count);
                        s.training_plan_arn = spec.training_plan_arn.clone();
                    }
                    out.push(s);
                }
                if !found {
                    let life_cycle =
                        match (&spec.life_cycle_source_s3_uri, &spec.life_cycle_on_create) {
                            (Some(src), Some(on_create)) => Some(
                                ClusterLifeCycleConfig::builder()
                                    .source_s3_uri(src)
                                    .on_create(on_create)
                                    .build(),
                            ),
                            _ => None,
                        };
                    out.push(
                        ClusterInstanceGroupSpecification::builder()
                            .instance_group_name(name)
                            .instance_type(ClusterInstanceType::from(spec.instance_type.as_str()))
                            .instance_count(count)
                            .execution_role(&spec.execution_role_arn)
                            .set_life_cycle_config(life_cycle)
                            .set_training_plan_arn(spec.training_plan_arn.clone())
                            .build(),
                    );
                }
                Some(out)
            })
            .await?;
        let Some(groups) = groups else {
            return Ok(());
        };
        tracing::info!(
            region = %spec.region,
            cluster_name = %spec.cluster_name,
            instance_group_name = %name,
            instance_count = spec.instance_count,
            training_plan_arn = ?spec.training_plan_arn,
            groups = groups.len(),
            "updating hyperpod instance group"
        );
        self.client(&spec.region)
            .update_cluster()
            .cluster_name(&spec.cluster_name)
            .set_instance_groups(Some(groups))
            .send()
            .await
            .map_err(err(OP, Call::Retryable))?;
        Ok(())
    }

    /// UpdateCluster with `InstanceGroupsToDelete` naming the group, every other group sent
    /// back with its own settings: after its last window a group would otherwise stay on
    /// the cluster at zero, pointing at an expired plan that every later update of the
    /// cluster sends back (review aws-reality-2, Task 3 #4). `false` when the cluster has no
    /// group of that name (removed by an earlier call whose answer was lost, or by another
    /// party): nothing is sent.
    pub async fn remove_instance_group(
        &self,
        region: &str,
        cluster_name: &str,
        instance_group_name: &str,
    ) -> Result<bool, PortError> {
        const OP: &str = "UpdateCluster";
        let ours =
            |g: &ClusterInstanceGroupDetails| g.instance_group_name() == Some(instance_group_name);
        let others = self
            .stable_update(region, cluster_name, |current| {
                let groups = current.instance_groups();
                groups.iter().any(ours).then(|| {
                    groups
                        .iter()
                        .filter(|g| !ours(g))
                        .map(hyperpod_update::unchanged)
                        .collect::<Vec<_>>()
                })
            })
            .await?;
        let Some(others) = others else {
            tracing::info!(
                cluster_name,
                instance_group_name,
                "the instance group is gone already; nothing removed"
            );
            return Ok(false);
        };
        tracing::info!(
            region,
            cluster_name,
            instance_group_name,
            groups_kept = others.len(),
            "removing hyperpod instance group"
        );
        self.client(region)
            .update_cluster()
            .cluster_name(cluster_name)
            .set_instance_groups((!others.is_empty()).then_some(others))
            .instance_groups_to_delete(instance_group_name)
            .send()
            .await
            .map_err(err(OP, Call::Retryable))?;
        Ok(true)
    }

    /// The groups of an UpdateCluster `build` makes from the cluster's description, or
    /// `None` when it says nothing is to be sent. There is no version to condition
    /// UpdateCluster on: an update of another party that completed since our description
    /// would be reverted by ours (review N10). Described again right before sending, the
    /// groups must read the same; else the update is built again from what the cluster is
    /// now, up to 3 descriptions, then it is tried again later.
    async fn stable_update(
        &self,
        region: &str,
        cluster_name: &str,
        build: impl Fn(&DescribeClusterOutput) -> Option<Vec<ClusterInstanceGroupSpecification>>,
    ) -> Result<Option<Vec<ClusterInstanceGroupSpecification>>, PortError> {
        /// Descriptions that may differ before an update is sent anyway.
        const DESCRIBES: usize = 3;
        let client = self.client(region);
        let describe = || async {
            client
                .describe_cluster()
                .cluster_name(cluster_name)
                .send()
                .await
                .map_err(err("DescribeCluster", Call::Retryable))
        };
        let specs = |c: &DescribeClusterOutput| -> Vec<ClusterInstanceGroupSpecification> {
            c.instance_groups()
                .iter()
                .map(hyperpod_update::unchanged)
                .collect()
        };
        let mut current = describe().await?;
        let mut described = 1;
        loop {
            let Some(groups) = build(&current) else {
                return Ok(None);
            };
            let again = describe().await?;
            described += 1;
            if specs(&current) == specs(&again) {
                return Ok(Some(groups));
            }
            if described >= DESCRIBES {
                return Err(PortError::Transient {
                    service: SERVICE,
                    code: "ClusterChanging".into(),
                    message: format!(
                        "HyperPod cluster {cluster_name} changed between each of {DESCRIBES} \
                         descriptions; its update is tried again later rather than undoing \
                         another party's"
                    ),
                });
            }
            tracing::info!(
                cluster_name = %cluster_name,
                "the cluster changed since it was described; building the update again"
            );
            current = again;
        }
    }

    // ----------------------------------------------------------------------------------
    // Endpoints
    // ----------------------------------------------------------------------------------

    /// CreateEndpointConfig (`capacity-reservations-only` in the plan when one is given),
    /// then DescribeEndpointConfig, then CreateEndpoint. Existing ones of those names are
    /// success. A config SageMaker does not show yet is `ConfigNotVisible`, never an error:
    /// the botocore `sagemaker` model (CreateEndpoint) says "a load call is made to DynamoDB
    /// to verify that your endpoint configuration exists … If the dependent entities are not
    /// yet in DynamoDB, this causes a validation error … So retry logic is recommended … We
    /// also recommend that customers call DescribeEndpointConfig before calling
    /// CreateEndpoint" (review aws-reality-2, Task 3 #1).
    pub async fn create_endpoint(
        &self,
        spec: &EndpointSpec,
    ) -> Result<EndpointCreation, PortError> {
        let client = self.client(&spec.region);
        let mut variant = ProductionVariant::builder()
            .variant_name(&spec.variant_name)
            .model_name(&spec.model_name)
            .initial_instance_count(i32_of(
                "CreateEndpointConfig",
                "InitialInstanceCount",
                spec.instance_count,
            )?)
            .instance_type(ProductionVariantInstanceType::from(
                spec.instance_type.as_str(),
            ));
        if let Some(arn) = &spec.ml_reservation_arn {
            variant = variant.capacity_reservation_config(
                ProductionVariantCapacityReservationConfig::builder()
                    .capacity_reservation_preference(CapacityReservationPreference::from(
                        "capacity-reservations-only",
                    ))
                    .ml_reservation_arn(arn)
                    .build(),
            );
        }
        let tags = tags_with_managed(&spec.tags);
        tracing::info!(
            region = %spec.region,
            endpoint_name = %spec.endpoint_name,
            ml_reservation_arn = ?spec.ml_reservation_arn,
            "creating endpoint"
        );
        let res = client
            .create_endpoint_config()
            .endpoint_config_name(&spec.endpoint_config_name)
            .production_variants(variant.build())
            .set_tags(Some(tags.clone()))
            .send()
            .await;
        if let Err(e) = res {
            let f = Failure::from_sdk("CreateEndpointConfig", e);
            if !f.is_already_exists() {
                return Err(f.into_port(SERVICE, Call::Retryable));
            }
        }
        let res = client
            .describe_endpoint_config()
            .endpoint_config_name(&spec.endpoint_config_name)
            .send()
            .await;
        if let Err(e) = res {
            let f = Failure::from_sdk("DescribeEndpointConfig", e);
            if !f.is_not_found() {
                return Err(f.into_port(SERVICE, Call::Retryable));
            }
            tracing::info!(
                region = %spec.region,
                endpoint_config_name = %spec.endpoint_config_name,
                message = %f.message,
                "the endpoint config is not visible yet; the endpoint is created later"
            );
            return Ok(EndpointCreation::ConfigNotVisible(format!(
                "DescribeEndpointConfig: {}",
                f.message
            )));
        }
        let res = client
            .create_endpoint()
            .endpoint_name(&spec.endpoint_name)
            .endpoint_config_name(&spec.endpoint_config_name)
            .set_tags(Some(tags))
            .send()
            .await;
        if let Err(e) = res {
            let f = Failure::from_sdk("CreateEndpoint", e);
            if f.is_already_exists() {
                return Ok(EndpointCreation::Created);
            }
            // Described a moment ago, yet CreateEndpoint's own look-up may still miss it:
            // the documented validation error, retried, never a refusal.
            if f.is_endpoint_config_not_found() {
                tracing::info!(
                    region = %spec.region,
                    endpoint_config_name = %spec.endpoint_config_name,
                    message = %f.message,
                    "CreateEndpoint does not see the endpoint config yet; the endpoint is created later"
                );
                return Ok(EndpointCreation::ConfigNotVisible(format!(
                    "CreateEndpoint: {}",
                    f.message
                )));
            }
            return Err(f.into_port(SERVICE, Call::Retryable));
        }
        Ok(EndpointCreation::Created)
    }

    /// DescribeEndpoint; `None` for the "could not find" `ValidationException`.
    pub async fn describe_endpoint(
        &self,
        region: &str,
        endpoint_name: &str,
    ) -> Result<Option<EndpointInfo>, PortError> {
        const OP: &str = "DescribeEndpoint";
        let res = self
            .client(region)
            .describe_endpoint()
            .endpoint_name(endpoint_name)
            .send()
            .await;
        match res {
            Ok(e) => {
                let arn = e.endpoint_arn().ok_or_else(|| {
                    malformed(SERVICE, OP, format!("endpoint {endpoint_name} has no ARN"))
                })?;
                let tags = self.tags_of(region, arn).await?;
                Ok(Some(EndpointInfo {
                    endpoint_name: e.endpoint_name().unwrap_or(endpoint_name).to_string(),
                    status: e
                        .endpoint_status()
                        .map(|s| s.as_str().to_string())
                        .unwrap_or_default(),
                    failure_reason: e.failure_reason().map(str::to_string),
                    tags,
                }))
            }
            Err(e) => {
                let f = Failure::from_sdk(OP, e);
                if f.is_not_found() {
                    return Ok(None);
                }
                Err(f.into_port(SERVICE, Call::Retryable))
            }
        }
    }

    /// Whether the model exists in `region` (DescribeModel): SageMaker answers one it does
    /// not know with `ValidationException` "Could not find model …".
    pub async fn model_exists(&self, region: &str, model_name: &str) -> Result<bool, PortError> {
        const OP: &str = "DescribeModel";
        match self
            .client(region)
            .describe_model()
            .model_name(model_name)
            .send()
            .await
        {
            Ok(_) => Ok(true),
            Err(e) => {
                let f = Failure::from_sdk(OP, e);
                if f.is_not_found() {
                    return Ok(false);
                }
                Err(f.into_port(SERVICE, Call::Retryable))
            }
        }
    }

    /// DeleteEndpoint then DeleteEndpointConfig; missing ones are success.
    pub async fn delete_endpoint(
        &self,
        region: &str,
        endpoint_name: &str,
        endpoint_config_name: &str,
    ) -> Result<(), PortError> {
        let client = self.client(region);
        tracing::info!(
            region,
            endpoint_name,
            endpoint_config_name,
            "deleting endpoint"
        );
        if let Err(e) = client
            .delete_endpoint()
            .endpoint_name(endpoint_name)
            .send()
            .await
        {
            let f = Failure::from_sdk("DeleteEndpoint", e);
            if !f.is_not_found() {
                return Err(f.into_port(SERVICE, Call::Retryable));
            }
        }
        let res = client
            .delete_endpoint_config()
            .endpoint_config_name(endpoint_config_name)
            .send()
            .await;
        if let Err(e) = res {
            let f = Failure::from_sdk("DeleteEndpointConfig", e);
            if !f.is_not_found() {
                return Err(f.into_port(SERVICE, Call::Retryable));
            }
        }
        Ok(())
    }
}

fn not_a_plan(op: &'static str, product: Product) -> PortError {
    PortError::Permanent {
        service: SERVICE,
        code: "WrongProduct".to_string(),
        message: format!("{op}: {product} is not a training plan"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_names_of_other_attempts_belong_to_the_request() {
        let id = RequestId::parse("team-a-42").unwrap();
        let n0 = crate::domain::naming::plan_name(&id, "prod", 0);
        assert!(is_plan_of(&n0, &n0, &id));
        assert!(is_plan_of(
            &crate::domain::naming::plan_name(&id, "prod", 3),
            &n0,
            &id
        ));
        assert!(!is_plan_of("cp-team-a-421", &n0, &id));
        // request team-a's retries are never another request's first plan, and back
        let other = RequestId::parse("team-a").unwrap();
        assert!(!is_plan_of(
            &n0,
            &crate::domain::naming::plan_name(&other, "prod", 0),
            &other
        ));
        assert!(!is_plan_of(
            &crate::domain::naming::plan_name(&other, "prod", 42),
            &n0,
            &id
        ));
        assert!(!is_plan_of("cp-team-a-42-x", &n0, &id));
        assert!(!is_plan_of("someone-else", &n0, &id));
    }

    #[test]
    fn arns_and_names_both_name_a_plan() {
        assert_eq!(
            plan_name_of("arn:aws:sagemaker:us-east-1:123456789012:training-plan/cp-r-1"),
            "cp-r-1"
        );
        assert_eq!(plan_name_of("cp-r-1"), "cp-r-1");
    }
}
