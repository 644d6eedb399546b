//! The market and workload ports over both AWS services: `AwsMarket` sends Capacity Block
//! calls to EC2 and training-plan calls to SageMaker; `AwsWorkloads` sends instances to EC2
//! and jobs, instance groups and endpoints to SageMaker. Each holds one client per region.

use aws_config::SdkConfig;

use super::ec2::Ec2Adapter;
use super::sagemaker::SageMakerAdapter;
use crate::domain::catalog::PriceTable;
use crate::domain::extension::{ExtensionOffer, ExtensionSeen};
use crate::domain::offering::{Offering, Product};
use crate::domain::request::RequestId;
use crate::domain::reservation::Reservation;
use crate::ports::{
    CapacityMarket, EndpointInfo, EndpointSpec, InstanceFilter, InstanceGroupInfo,
    InstanceGroupSpec, InstanceInfo, JobInfo, LaunchSpec, OfferingQuery, PortError, PurchaseSpec,
    TrainingJobSpec, Workloads,
};

/// `CapacityMarket` for Capacity Blocks (EC2) and training plans (SageMaker).
#[derive(Clone, Debug)]
pub struct AwsMarket {
    pub ec2: Ec2Adapter,
    pub sagemaker: SageMakerAdapter,
}

impl AwsMarket {
    /// Clients per region are built from `config` on first use; offerings are priced
    /// against `prices`.
    pub fn new(config: &SdkConfig, prices: PriceTable) -> AwsMarket {
        AwsMarket {
            ec2: Ec2Adapter::new(config, prices.clone()),
            sagemaker: SageMakerAdapter::new(config, prices),
        }
    }

    pub fn from_adapters(ec2: Ec2Adapter, sagemaker: SageMakerAdapter) -> AwsMarket {
        AwsMarket { ec2, sagemaker }
    }
}

fn not_a_reservation(product: Product) -> PortError {
    PortError::Permanent {
        service: "market",
        code: "WrongProduct".to_string(),
        message: format!("{product} is not bought from a capacity market"),
    }
}

impl CapacityMarket for AwsMarket {
    async fn search(&self, query: &OfferingQuery) -> Result<Vec<Offering>, PortError> {
        match query.product {
            Product::CapacityBlock => self.ec2.search_blocks(query).await,
            Product::TrainingPlan { .. } => self.sagemaker.search_plans(query).await,
            p => Err(not_a_reservation(p)),
        }
    }

    async fn purchase(
        &self,
        offering: &Offering,
        spec: &PurchaseSpec,
    ) -> Result<Reservation, PortError> {
        match offering.product {
            Product::CapacityBlock => self.ec2.purchase_block(offering, spec).await,
            Product::TrainingPlan { .. } => self.sagemaker.purchase_plan(offering, spec).await,
            p => Err(not_a_reservation(p)),
        }
    }

    async fn describe(
        &self,
        product: Product,
        region: &str,
        reservation_id: &str,
    ) -> Result<Option<Reservation>, PortError> {
        match product {
            Product::CapacityBlock => self.ec2.describe_reservation(region, reservation_id).await,
            Product::TrainingPlan { .. } => {
                self.sagemaker.describe_plan(region, reservation_id).await
            }
            p => Err(not_a_reservation(p)),
        }
    }

    async fn extension_offers(
        &self,
        r: &Reservation,
        hours: u32,
    ) -> Result<Vec<ExtensionOffer>, PortError> {
        match r.product {
            Product::CapacityBlock => {
                self.ec2
                    .block_extension_offers(&r.region, &r.id, hours)
                    .await
            }
            Product::TrainingPlan { .. } => {
                self.sagemaker
                    .plan_extension_offers(&r.region, &r.id, hours)
                    .await
            }
            p => Err(not_a_reservation(p)),
        }
    }

    async fn extend(
        &self,
        r: &Reservation,
        offer: &ExtensionOffer,
    ) -> Result<ExtensionSeen, PortError> {
        match r.product {
            Product::CapacityBlock => self.ec2.extend_block(&r.region, &r.id, offer).await,
            Product::TrainingPlan { .. } => self.sagemaker.extend_plan(&r.region, offer).await,
            p => Err(not_a_reservation(p)),
        }
    }

    async fn extensions(&self, r: &Reservation) -> Result<Vec<ExtensionSeen>, PortError> {
        match r.product {
            Product::CapacityBlock => self.ec2.block_extensions(&r.region, &r.id).await,
            Product::TrainingPlan { .. } => self.sagemaker.plan_extensions(&r.region, &r.id).await,
            p => Err(not_a_reservation(p)),
        }
    }

    async fn find_by_request(
        &self,
        product: Product,
        region: &str,
        request_id: &RequestId,
        plan_name: &str,
    ) -> Result<Vec<Reservation>, PortError> {
        match product {
            Product::CapacityBlock => self.ec2.reservations_for_request(region, request_id).await,
            Product::TrainingPlan { target } => Ok(self
                .sagemaker
                .plans_for_request(region, request_id, plan_name)
                .await?
                .into_iter()
                .filter(|r| r.product == Product::TrainingPlan { target })
                .collect()),
            p => Err(not_a_reservation(p)),
        }
    }

    async fn blocks_in_account(&self, region: &str) -> Result<Vec<Reservation>, PortError> {
        self.ec2.blocks_in_account(region).await
    }

    async fn find_by_deployment(
        &self,
        region: &str,
        deployment_id: &str,
    ) -> Result<Vec<Reservation>, PortError> {
        let mut found = self
            .ec2
            .reservations_of_deployment(region, deployment_id)
            .await?;
        found.extend(
            self.sagemaker
                .plans_of_deployment(region, deployment_id)
                .await?,
        );
        Ok(found)
    }
}

/// `Workloads` over EC2 instances and SageMaker jobs, instance groups and endpoints.
#[derive(Clone, Debug)]
pub struct AwsWorkloads {
    pub ec2: Ec2Adapter,
    pub sagemaker: SageMakerAdapter,
}

impl AwsWorkloads {
    pub fn new(config: &SdkConfig) -> AwsWorkloads {
        AwsWorkloads {
            ec2: Ec2Adapter::new(config, PriceTable::default()),
            sagemaker: SageMakerAdapter::new(config, PriceTable::default()),
        }
    }

    pub fn from_adapters(ec2: Ec2Adapter, sagemaker: SageMakerAdapter) -> AwsWorkloads {
        AwsWorkloads { ec2, sagemaker }
    }
}

impl Workloads for AwsWorkloads {
    async fn launch_instances(&self, spec: &LaunchSpec) -> Result<Vec<InstanceInfo>, PortError> {
        self.ec2.launch_instances(spec).await
    }

    async fn describe_instances(
        &self,
        region: &str,
        filter: &InstanceFilter,
    ) -> Result<Vec<InstanceInfo>, PortError> {
        self.ec2.describe_instances(region, filter).await
    }

    async fn terminate_instances(
        &self,
        region: &str,
        instance_ids: &[String],
    ) -> Result<(), PortError> {
        self.ec2.terminate_instances(region, instance_ids).await
    }

    async fn tag_instances(
        &self,
        region: &str,
        instance_ids: &[String],
        tags: &std::collections::BTreeMap<String, String>,
    ) -> Result<(), PortError> {
        self.ec2.tag_instances(region, instance_ids, tags).await
    }

    async fn preflight_instances(&self, spec: &LaunchSpec, dry_run: bool) -> Result<(), PortError> {
        self.ec2.preflight_instances(spec, dry_run).await
    }

    async fn model_exists(&self, region: &str, model_name: &str) -> Result<bool, PortError> {
        self.sagemaker.model_exists(region, model_name).await
    }

    async fn subnet_zones(
        &self,
        region: &str,
        subnet_ids: &[String],
    ) -> Result<Vec<(String, String)>, PortError> {
        self.ec2.subnet_zones(region, subnet_ids).await
    }

    async fn subnet_in_zone(
        &self,
        region: &str,
        subnet_ids: &[String],
        availability_zone: &str,
    ) -> Result<Option<String>, PortError> {
        self.ec2
            .subnet_in_zone(region, subnet_ids, availability_zone)
            .await
    }

    async fn plan_state(
        &self,
        region: &str,
        plan_arn: &str,
    ) -> Result<Option<crate::domain::reservation::ReservationState>, PortError> {
        Ok(self
            .sagemaker
            .describe_plan(region, plan_arn)
            .await?
            .map(|r| r.state))
    }

    async fn start_training_job(&self, spec: &TrainingJobSpec) -> Result<(), PortError> {
        self.sagemaker.start_training_job(spec).await
    }

    async fn describe_training_job(
        &self,
        region: &str,
        job_name: &str,
    ) -> Result<Option<JobInfo>, PortError> {
        self.sagemaker.describe_training_job(region, job_name).await
    }

    async fn stop_training_job(&self, region: &str, job_name: &str) -> Result<(), PortError> {
        self.sagemaker.stop_training_job(region, job_name).await
    }

    async fn describe_instance_group(
        &self,
        region: &str,
        cluster_name: &str,
        instance_group_name: &str,
    ) -> Result<Option<InstanceGroupInfo>, PortError> {
        self.sagemaker
            .describe_instance_group(region, cluster_name, instance_group_name)
            .await
    }

    async fn put_instance_group(&self, spec: &InstanceGroupSpec) -> Result<(), PortError> {
        self.sagemaker.put_instance_group(spec).await
    }

    async fn remove_instance_group(
        &self,
        region: &str,
        cluster_name: &str,
        instance_group_name: &str,
    ) -> Result<bool, PortError> {
        self.sagemaker
            .remove_instance_group(region, cluster_name, instance_group_name)
            .await
    }

    async fn create_endpoint(
        &self,
        spec: &EndpointSpec,
    ) -> Result<crate::ports::EndpointCreation, PortError> {
        self.sagemaker.create_endpoint(spec).await
    }

    async fn describe_endpoint(
        &self,
        region: &str,
        endpoint_name: &str,
    ) -> Result<Option<EndpointInfo>, PortError> {
        self.sagemaker
            .describe_endpoint(region, endpoint_name)
            .await
    }

    async fn delete_endpoint(
        &self,
        region: &str,
        endpoint_name: &str,
        endpoint_config_name: &str,
    ) -> Result<(), PortError> {
        self.sagemaker
            .delete_endpoint(region, endpoint_name, endpoint_config_name)
            .await
    }
}
