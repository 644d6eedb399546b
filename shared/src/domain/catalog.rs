//! What we know about instance types: which product sells each, and what an hour costs
//! on demand. Both are data, overridable from configuration, so a new AWS type or a price
//! change needs no code change.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::money::Usd;

/// The instance types each reservation product accepts.
///
/// Capacity Blocks sell EC2 types (`p5.48xlarge`); training plans sell SageMaker types
/// (`ml.p5.48xlarge`). On-demand and spot use the list of their platform.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SupportedInstanceTypes {
    pub capacity_block: Vec<String>,
    pub training_plan: Vec<String>,
}

impl Default for SupportedInstanceTypes {
    /// The types in aws-reference.md sections 0, 3.1 and 7.1 (as of late 2026).
    fn default() -> Self {
        let s = |v: &[&str]| v.iter().map(|t| t.to_string()).collect();
        SupportedInstanceTypes {
            capacity_block: s(&[
                "p6-b300.48xlarge",
                "p6-b200.48xlarge",
                "p5.4xlarge",
                "p5.48xlarge",
                "p5e.48xlarge",
                "p5en.48xlarge",
                "p4d.24xlarge",
                "p4de.24xlarge",
                "trn1.32xlarge",
                "trn2.3xlarge",
                "trn2.48xlarge",
            ]),
            training_plan: s(&[
                "ml.p4d.24xlarge",
                "ml.p4de.24xlarge",
                "ml.p5.4xlarge",
                "ml.p5.48xlarge",
                "ml.p5e.48xlarge",
                "ml.p5en.48xlarge",
                "ml.p6-b200.48xlarge",
                "ml.p6-b300.48xlarge",
                // (Not ml.p6e-gb200.36xlarge: it comes as UltraServers, searched and bought by
                // `UltraServerType`, which no request can ask for yet; review aws-reality-2 #5.)
                "ml.trn1.32xlarge",
                "ml.trn2.48xlarge",
            ]),
        }
    }
}

impl SupportedInstanceTypes {
    pub fn ec2(&self) -> &[String] {
        &self.capacity_block
    }
    pub fn sagemaker(&self) -> &[String] {
        &self.training_plan
    }
}

/// Per-hour prices of one instance type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HourlyPrice {
    pub on_demand: Usd,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spot: Option<Usd>,
}

/// On-demand (and spot) price per instance-hour, by instance type. Used to show what a
/// reservation saves, and to estimate on-demand and spot spend before debiting it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(transparent)]
pub struct PriceTable(pub BTreeMap<String, HourlyPrice>);

impl PriceTable {
    pub fn on_demand(&self, instance_type: &str) -> Option<Usd> {
        self.0.get(instance_type).map(|p| p.on_demand)
    }
    pub fn spot(&self, instance_type: &str) -> Option<Usd> {
        self.0.get(instance_type).and_then(|p| p.spot)
    }
}

/// When the built-in prices were current (what `capacity-pilot plan`'s break-even cites).
pub const PRICES_AS_OF: &str = "late 2026";

impl Default for PriceTable {
    /// Illustrative us-east-1 list prices. p5.48xlarge at $55.04/h is the figure the source
    /// articles quote; the rest are of the same vintage. Deployments set
    /// `ON_DEMAND_PRICES_USD` to their own negotiated prices.
    fn default() -> Self {
        let rows: &[(&str, &str, Option<&str>)] = &[
            ("p4d.24xlarge", "21.96", Some("9.00")),
            ("p4de.24xlarge", "27.45", Some("11.00")),
            ("p5.4xlarge", "6.88", Some("2.80")),
            ("p5.48xlarge", "55.04", Some("22.00")),
            ("p5e.48xlarge", "60.50", Some("24.50")),
            ("p5en.48xlarge", "63.30", Some("25.60")),
            ("p6-b200.48xlarge", "113.93", Some("45.00")),
            ("p6-b300.48xlarge", "142.42", None),
            ("trn1.32xlarge", "21.50", Some("8.60")),
            ("trn2.3xlarge", "2.24", None),
            ("trn2.48xlarge", "35.76", Some("14.30")),
            ("ml.p4d.24xlarge", "25.25", None),
            ("ml.p4de.24xlarge", "31.57", None),
            ("ml.p5.4xlarge", "7.91", None),
            ("ml.p5.48xlarge", "63.30", None),
            ("ml.p5e.48xlarge", "69.58", None),
            ("ml.p5en.48xlarge", "72.80", None),
            ("ml.p6-b200.48xlarge", "131.02", None),
            ("ml.p6-b300.48xlarge", "163.78", None),
            ("ml.p6e-gb200.36xlarge", "190.00", None),
            ("ml.trn1.32xlarge", "24.73", None),
            ("ml.trn2.48xlarge", "41.12", None),
        ];
        PriceTable(
            rows.iter()
                .map(|(t, od, spot)| {
                    (
                        t.to_string(),
                        HourlyPrice {
                            on_demand: Usd::parse(od).expect("valid literal"),
                            spot: spot.map(|s| Usd::parse(s).expect("valid literal")),
                        },
                    )
                })
                .collect(),
        )
    }
}

/// The accelerators one instance of a type carries, by the EC2 type (a SageMaker `ml.` type
/// carries its EC2 type's): the accelerator's short name, how many, and its maker's name for
/// it (AWS's accelerated-computing instance type pages).
pub const ACCELERATORS: [(&str, &str, u32, &str); 12] = [
    ("p6-b300.48xlarge", "B300", 8, "NVIDIA B300"),
    ("p6-b200.48xlarge", "B200", 8, "NVIDIA B200"),
    (
        "p6e-gb200.36xlarge",
        "GB200",
        4,
        "NVIDIA GB200 (UltraServer)",
    ),
    ("p5.4xlarge", "H100", 1, "NVIDIA H100 80GB"),
    ("p5.48xlarge", "H100", 8, "NVIDIA H100 80GB"),
    ("p5e.48xlarge", "H200", 8, "NVIDIA H200 141GB"),
    ("p5en.48xlarge", "H200", 8, "NVIDIA H200 141GB"),
    ("p4d.24xlarge", "A100", 8, "NVIDIA A100 40GB"),
    ("p4de.24xlarge", "A100-80GB", 8, "NVIDIA A100 80GB"),
    ("trn1.32xlarge", "Trainium", 16, "AWS Trainium"),
    ("trn2.3xlarge", "Trainium2", 1, "AWS Trainium2"),
    ("trn2.48xlarge", "Trainium2", 16, "AWS Trainium2"),
];

/// What one instance of `instance_type` carries: (accelerator, count per instance), for an
/// EC2 type or its SageMaker `ml.` twin; `None` for a type the table does not know.
pub fn accelerators(instance_type: &str) -> Option<(&'static str, u32)> {
    let ec2 = instance_type.strip_prefix("ml.").unwrap_or(instance_type);
    ACCELERATORS
        .iter()
        .find(|(t, ..)| *t == ec2)
        .map(|(_, a, n, _)| (*a, *n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_supported_type_has_its_accelerators_and_an_ml_type_its_ec2_twins() {
        // GIVEN the default catalogue
        let types = SupportedInstanceTypes::default();
        // THEN each type of either product names what it carries, and an `ml.` type carries
        // what its EC2 twin does
        for t in types.ec2().iter().chain(types.sagemaker()) {
            assert!(accelerators(t).is_some(), "{t} has no accelerators");
        }
        assert_eq!(accelerators("ml.p5.48xlarge"), Some(("H100", 8)));
        assert_eq!(accelerators("p5.4xlarge"), Some(("H100", 1)));
        assert_eq!(accelerators("trn2.48xlarge"), Some(("Trainium2", 16)));
        assert_eq!(accelerators("m5.large"), None);
    }

    #[test]
    fn no_ultraserver_type_is_in_the_default_plan_catalogue() {
        let types = SupportedInstanceTypes::default();
        assert!(
            !types.training_plan.iter().any(|t| t.contains("gb200")),
            "{:?}",
            types.training_plan
        );
    }

    #[test]
    fn every_default_type_has_an_on_demand_price() {
        let types = SupportedInstanceTypes::default();
        let prices = PriceTable::default();
        for t in types.capacity_block.iter().chain(&types.training_plan) {
            assert!(prices.on_demand(t).is_some(), "no price for {t}");
        }
    }

    #[test]
    fn the_articles_p5_price_is_the_default() {
        assert_eq!(
            PriceTable::default().on_demand("p5.48xlarge"),
            Some(Usd::parse("55.04").unwrap())
        );
    }
}
