//! Money: a decimal USD amount everywhere, and integer micro-USD in the budget ledger.
//!
//! Floats never touch money. Amounts cross every boundary (events, the table, logs) as
//! decimal strings; the ledger alone stores integer micro-USD because DynamoDB update
//! arithmetic (and moto's emulation of it) must stay exact.

use std::fmt;
use std::ops::{Add, Sub};
use std::str::FromStr;

use rust_decimal::prelude::ToPrimitive;
use rust_decimal::{Decimal, RoundingStrategy};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A USD amount. Serialised as a decimal string, e.g. `"7974.40"`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Usd(#[serde(with = "rust_decimal::serde::str")] Decimal);

impl JsonSchema for Usd {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Usd".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "pattern": "^-?[0-9]+(\\.[0-9]+)?$",
            "description": "A USD amount as a decimal string, e.g. \"7974.40\""
        })
    }
}

/// Why a string is not a USD amount.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MoneyError {
    #[error("must be a decimal string such as \"1500.00\", got {0:?}")]
    NotDecimal(String),
    #[error("must be greater than zero, got {0}")]
    NotPositive(String),
    #[error("must have at most 6 decimal places (micro-USD), got {0}")]
    TooPrecise(String),
    #[error("is too large: {0}")]
    TooLarge(String),
}

/// The largest amount the ledger can hold exactly, with headroom for sums: $1e12.
const MAX_USD: i64 = 1_000_000_000_000;

impl Usd {
    pub const ZERO: Usd = Usd(Decimal::ZERO);

    pub fn new(amount: Decimal) -> Self {
        Usd(amount.normalize())
    }

    pub fn amount(self) -> Decimal {
        self.0
    }

    /// Parses a decimal string (no exponent, no float syntax), at most micro-USD precision.
    pub fn parse(s: &str) -> Result<Usd, MoneyError> {
        let t = s.trim();
        let well_formed = !t.is_empty()
            && t.chars()
                .enumerate()
                .all(|(i, c)| c.is_ascii_digit() || c == '.' || (i == 0 && c == '-'))
            && t.matches('.').count() <= 1
            && !t.ends_with('.')
            && !t.starts_with('.');
        if !well_formed {
            return Err(MoneyError::NotDecimal(s.to_string()));
        }
        let d = Decimal::from_str(t).map_err(|_| MoneyError::NotDecimal(s.to_string()))?;
        if d.scale() > 6 && d.normalize().scale() > 6 {
            return Err(MoneyError::TooPrecise(s.to_string()));
        }
        if d.abs() > Decimal::from(MAX_USD) {
            return Err(MoneyError::TooLarge(s.to_string()));
        }
        Ok(Usd::new(d))
    }

    /// Parses a strictly positive amount, as budgets and fees must be.
    pub fn parse_positive(s: &str) -> Result<Usd, MoneyError> {
        let u = Usd::parse(s)?;
        if u.0 <= Decimal::ZERO {
            return Err(MoneyError::NotPositive(s.to_string()));
        }
        Ok(u)
    }

    /// The ledger amount for a debit: rounded *up* to the micro-dollar, so a debit never
    /// under-counts what was spent.
    pub fn to_micros_ceil(self) -> MicroUsd {
        let m = (self.0 * Decimal::from(1_000_000))
            .round_dp_with_strategy(0, RoundingStrategy::ToPositiveInfinity);
        MicroUsd(m.to_i64().expect("Usd is bounded by MAX_USD"))
    }

    /// Rounds to cents for display (half away from zero).
    pub fn to_cents(self) -> Usd {
        Usd(self
            .0
            .round_dp_with_strategy(2, RoundingStrategy::MidpointAwayFromZero))
    }

    pub fn is_positive(self) -> bool {
        self.0 > Decimal::ZERO
    }
}

impl FromStr for Usd {
    type Err = MoneyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Usd::parse(s)
    }
}

impl fmt::Display for Usd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Always at least two decimals: "34.60", "7974.40", "0.000001".
        let d = self.0.normalize();
        if d.scale() < 2 {
            write!(f, "{:.2}", d)
        } else {
            write!(f, "{}", d)
        }
    }
}

impl Add for Usd {
    type Output = Usd;
    fn add(self, rhs: Usd) -> Usd {
        Usd::new(self.0 + rhs.0)
    }
}

impl Sub for Usd {
    type Output = Usd;
    fn sub(self, rhs: Usd) -> Usd {
        Usd::new(self.0 - rhs.0)
    }
}

impl std::iter::Sum for Usd {
    fn sum<I: Iterator<Item = Usd>>(iter: I) -> Usd {
        iter.fold(Usd::ZERO, |a, b| a + b)
    }
}

/// Integer micro-USD: the budget ledger's unit (1 USD = 1,000,000).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct MicroUsd(pub i64);

impl MicroUsd {
    pub fn to_usd(self) -> Usd {
        Usd::new(Decimal::new(self.0, 6))
    }
}

impl fmt::Display for MicroUsd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.to_usd())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_strings_round_trip_without_loss() {
        for s in ["7974.40", "0.000001", "34.608", "1000000000000", "511"] {
            let u = Usd::parse(s).unwrap();
            let json = serde_json::to_string(&u).unwrap();
            let back: Usd = serde_json::from_str(&json).unwrap();
            assert_eq!(back, u, "{s}");
            assert_eq!(back.amount(), Decimal::from_str(s).unwrap());
        }
    }

    #[test]
    fn float_syntax_and_garbage_are_rejected() {
        for s in ["1e3", "", "abc", "1.", ".5", "1.2.3", "NaN", "+5", "1,000"] {
            assert!(Usd::parse(s).is_err(), "{s:?} should be rejected");
        }
    }

    #[test]
    fn positive_amounts_reject_zero_and_negatives() {
        assert!(matches!(
            Usd::parse_positive("0"),
            Err(MoneyError::NotPositive(_))
        ));
        assert!(matches!(
            Usd::parse_positive("-1"),
            Err(MoneyError::NotPositive(_))
        ));
        assert!(Usd::parse_positive("0.01").is_ok());
    }

    #[test]
    fn sub_micro_precision_is_rejected() {
        assert!(matches!(
            Usd::parse("1.0000001"),
            Err(MoneyError::TooPrecise(_))
        ));
        assert!(Usd::parse("1.0000000").is_ok());
    }

    #[test]
    fn micros_round_up_and_convert_back_exactly() {
        assert_eq!(
            Usd::parse("7974.40").unwrap().to_micros_ceil(),
            MicroUsd(7_974_400_000)
        );
        assert_eq!(
            MicroUsd(7_974_400_000).to_usd(),
            Usd::parse("7974.4").unwrap()
        );
        assert_eq!(
            Usd::parse("0.000001").unwrap().to_micros_ceil(),
            MicroUsd(1)
        );
    }

    #[test]
    fn display_keeps_two_decimals() {
        assert_eq!(Usd::parse("511").unwrap().to_string(), "511.00");
        assert_eq!(Usd::parse("34.608").unwrap().to_string(), "34.608");
    }
}
