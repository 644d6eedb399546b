//! What a refused on-demand or spot launch means, and where to try next. AWS refuses for
//! reasons of different reach (aws-reference §11.3 and §11.2): a zone that has no capacity
//! or does not offer the type says nothing about the next zone; an account limit holds for
//! the whole region. The launcher tries the request's placements in order, skipping those a
//! refusal's scope covers: another subnet (of the same zone when only the subnet is full),
//! then another zone, then another region where the request names a subnet, then spot when
//! the request is interruptible, then a reservation.

/// How far a refusal reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// This subnet only: another subnet, even in the same zone, may launch.
    Subnet,
    /// This zone only: another subnet in another zone may launch.
    Zone,
    /// AWS's capacity in the whole region.
    Region,
    /// The account's limit in the region: another region may launch.
    AccountRegion,
}

/// One row of [`REFUSALS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    pub code: &'static str,
    pub scope: Scope,
    /// What it means, for the decision's reason.
    pub means: &'static str,
}

/// Every refusal of an on-demand or spot launch that is not the request's fault: the next
/// placement is tried (see the module doc). Any other refusal fails the request.
pub const REFUSALS: &[Refusal] = &[
    // EC2 error codes: "The specified subnet does not contain enough free private IP
    // addresses to fulfill your request." Each interface takes an address per instance, and
    // an EFA template has several (aws-reference §11.1), so a subnet fills up long before the
    // zone runs out of capacity. It says nothing about the next subnet (review Task 3 #2).
    Refusal {
        code: "InsufficientFreeAddressesInSubnet",
        scope: Scope::Subnet,
        means: "the subnet has too few free private IP addresses",
    },
    Refusal {
        code: "InsufficientInstanceCapacity",
        scope: Scope::Zone,
        means: "the zone has no capacity of the type now",
    },
    Refusal {
        code: "Unsupported",
        scope: Scope::Zone,
        means: "the zone does not offer the type",
    },
    Refusal {
        code: "VcpuLimitExceeded",
        scope: Scope::AccountRegion,
        means: "the account's vCPU limit for the type's family in the region is reached",
    },
    Refusal {
        code: "InstanceLimitExceeded",
        scope: Scope::AccountRegion,
        means: "the account's instance limit for the type in the region is reached",
    },
    Refusal {
        code: "MaxSpotInstanceCountExceeded",
        scope: Scope::AccountRegion,
        means: "the account's spot instance limit in the region is reached",
    },
    Refusal {
        code: "ResourceLimitExceeded",
        scope: Scope::AccountRegion,
        means: "the account's SageMaker quota for the type in the region is reached",
    },
    Refusal {
        code: "InsufficientCapacity",
        scope: Scope::Region,
        means: "SageMaker has no capacity of the type in the region now",
    },
    Refusal {
        code: "InsufficientCapacityError",
        scope: Scope::Region,
        means: "SageMaker has no capacity of the type in the region now",
    },
    Refusal {
        code: "CapacityError",
        scope: Scope::Region,
        means: "SageMaker could not place the job for capacity",
    },
];

/// Whether a row names `code`.
pub fn is_listed(code: &str) -> bool {
    REFUSALS.iter().any(|r| r.code == code)
}

/// The row for `code`; a code no row names reaches as far as its region.
pub fn of(code: &str) -> Refusal {
    REFUSALS
        .iter()
        .find(|r| r.code == code)
        .copied()
        .unwrap_or(Refusal {
            code: "",
            scope: Scope::Region,
            means: "no capacity",
        })
}

/// Where one on-demand or spot attempt launches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub region: String,
    /// The subnet and its zone, for EC2 instances.
    pub subnet: Option<(String, String)>,
}

impl Placement {
    /// Whether a refusal of `scope` at `at` rules this placement out too.
    pub fn covered_by(&self, scope: Scope, at: &Placement) -> bool {
        if self.region != at.region {
            return false;
        }
        match scope {
            Scope::Region | Scope::AccountRegion => true,
            Scope::Subnet => match (&self.subnet, &at.subnet) {
                (Some((subnet, _)), Some((refused, _))) => subnet == refused,
                _ => true,
            },
            Scope::Zone => match (&self.subnet, &at.subnet) {
                (Some((_, zone)), Some((_, refused))) => zone == refused,
                _ => true,
            },
        }
    }

    pub fn describe(&self) -> String {
        match &self.subnet {
            Some((subnet, zone)) => format!("{subnet} ({zone}, {})", self.region),
            None => self.region.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(region: &str, zone: &str) -> Placement {
        Placement {
            region: region.into(),
            subnet: Some((format!("subnet-{zone}"), zone.into())),
        }
    }

    #[test]
    fn a_zone_refusal_leaves_the_other_zones_and_regions() {
        let refused = at("us-east-1", "us-east-1a");
        let scope = of("Unsupported").scope;
        assert!(at("us-east-1", "us-east-1a").covered_by(scope, &refused));
        assert!(!at("us-east-1", "us-east-1b").covered_by(scope, &refused));
        assert!(!at("us-west-2", "us-west-2a").covered_by(scope, &refused));
    }

    #[test]
    fn a_subnet_without_free_addresses_leaves_the_zones_other_subnets() {
        // Issue 50: GIVEN a launch refused for the subnet's free addresses
        let refused = at("us-east-1", "us-east-1a");
        let scope = of("InsufficientFreeAddressesInSubnet").scope;
        assert_eq!(scope, Scope::Subnet);
        // THEN that subnet is ruled out, and no other: not another subnet of the same zone
        let other_subnet = Placement {
            region: "us-east-1".into(),
            subnet: Some(("subnet-other".into(), "us-east-1a".into())),
        };
        assert!(at("us-east-1", "us-east-1a").covered_by(scope, &refused));
        assert!(!other_subnet.covered_by(scope, &refused));
        assert!(!at("us-east-1", "us-east-1b").covered_by(scope, &refused));
        assert!(!at("us-west-2", "us-west-2a").covered_by(scope, &refused));
    }

    #[test]
    fn an_account_limit_covers_its_region_only() {
        let refused = at("us-east-1", "us-east-1a");
        for code in [
            "VcpuLimitExceeded",
            "InstanceLimitExceeded",
            "MaxSpotInstanceCountExceeded",
            "ResourceLimitExceeded",
        ] {
            let scope = of(code).scope;
            assert_eq!(scope, Scope::AccountRegion, "{code}");
            assert!(at("us-east-1", "us-east-1b").covered_by(scope, &refused));
            assert!(!at("us-west-2", "us-west-2a").covered_by(scope, &refused));
        }
    }

    #[test]
    fn every_row_names_a_distinct_code() {
        let mut codes: Vec<_> = REFUSALS.iter().map(|r| r.code).collect();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), REFUSALS.len());
    }
}
