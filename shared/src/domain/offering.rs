//! Capacity products and the offerings the market shows us, in one shape for both
//! EC2 Capacity Blocks (always one segment) and SageMaker training plans (one or more
//! segments, for one target resource).

use std::fmt;

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::catalog::PriceTable;
use super::money::Usd;

/// The SageMaker resource a training plan is bought for. Plans are not interchangeable.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum TargetResource {
    TrainingJob,
    HyperpodCluster,
    Endpoint,
}

impl TargetResource {
    /// The `SageMakerResourceName` value on the wire.
    pub fn as_aws(self) -> &'static str {
        match self {
            TargetResource::TrainingJob => "training-job",
            TargetResource::HyperpodCluster => "hyperpod-cluster",
            TargetResource::Endpoint => "endpoint",
        }
    }
}

/// A way to get capacity.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "kebab-case", tag = "product")]
pub enum Product {
    /// EC2 Capacity Block for ML.
    CapacityBlock,
    /// SageMaker training plan for one target resource.
    TrainingPlan {
        target: TargetResource,
    },
    OnDemand,
    Spot,
}

impl Product {
    /// Reservations are bought up front and can't be cancelled; on-demand and spot are not.
    pub fn is_reservation(self) -> bool {
        matches!(self, Product::CapacityBlock | Product::TrainingPlan { .. })
    }
}

impl fmt::Display for Product {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Product::CapacityBlock => write!(f, "capacity-block"),
            Product::TrainingPlan { target } => write!(f, "training-plan({})", target.as_aws()),
            Product::OnDemand => write!(f, "on-demand"),
            Product::Spot => write!(f, "spot"),
        }
    }
}

/// One contiguous period of reserved capacity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Segment {
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub availability_zone: Option<String>,
}

impl Segment {
    pub fn duration_minutes(&self) -> i64 {
        (self.end - self.start).num_minutes()
    }

    /// Exact hours, minutes included (blocks that start mid-day are whole days plus a part).
    pub fn hours(&self) -> Decimal {
        Decimal::from(self.duration_minutes()) / Decimal::from(60)
    }
}

/// An offering as the market shows it, priced against on-demand.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Offering {
    /// `CapacityBlockOfferingId` or `TrainingPlanOfferingId`.
    pub id: String,
    pub product: Product,
    pub region: String,
    pub instance_type: String,
    pub instance_count: u32,
    /// In start order; a Capacity Block has exactly one.
    pub segments: Vec<Segment>,
    pub upfront_fee: Usd,
    /// Instance-hours over all segments.
    pub instance_hours: Decimal,
    /// What the same instance-hours cost on demand; `None` when the price table lacks the type.
    pub on_demand_cost: Option<Usd>,
}

impl Offering {
    /// Builds an offering and prices its instance-hours from the on-demand table.
    #[allow(clippy::too_many_arguments)] // one per field of the offering as AWS describes it
    pub fn new(
        id: impl Into<String>,
        product: Product,
        region: impl Into<String>,
        instance_type: impl Into<String>,
        instance_count: u32,
        mut segments: Vec<Segment>,
        upfront_fee: Usd,
        prices: &PriceTable,
    ) -> Offering {
        segments.sort_by_key(|s| s.start);
        let instance_type = instance_type.into();
        let hours: Decimal = segments.iter().map(Segment::hours).sum();
        let instance_hours = hours * Decimal::from(instance_count);
        let on_demand_cost = prices
            .on_demand(&instance_type)
            .map(|p| Usd::new(p.amount() * instance_hours));
        Offering {
            id: id.into(),
            product,
            region: region.into(),
            instance_type,
            instance_count,
            segments,
            upfront_fee,
            instance_hours,
            on_demand_cost,
        }
    }

    pub fn start(&self) -> DateTime<Utc> {
        self.segments.first().map(|s| s.start).unwrap_or_default()
    }

    pub fn end(&self) -> DateTime<Utc> {
        self.segments.last().map(|s| s.end).unwrap_or_default()
    }

    /// Total reserved minutes over all segments.
    pub fn covered_minutes(&self) -> i64 {
        self.segments.iter().map(Segment::duration_minutes).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn an_offering_prices_its_instance_hours_against_on_demand() {
        let start = Utc.with_ymd_and_hms(2026, 12, 7, 11, 30, 0).unwrap();
        let o = Offering::new(
            "cb-1",
            Product::CapacityBlock,
            "us-east-1",
            "p5.48xlarge",
            4,
            vec![Segment {
                start,
                end: start + chrono::Duration::hours(48),
                availability_zone: Some("us-east-1a".into()),
            }],
            Usd::parse("6644.74").unwrap(),
            &PriceTable::default(),
        );
        assert_eq!(o.instance_hours, Decimal::from(192));
        // 192 h x $55.04
        assert_eq!(o.on_demand_cost, Some(Usd::parse("10567.68").unwrap()));
    }
}
