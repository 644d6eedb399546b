//! A capacity market with offerings the test lists, purchases it counts, and the failures
//! that make exactly-once buying hard: lost responses, vanished offerings, throttling and
//! training-plan name collisions.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Duration, Utc};

use super::{Fault, Faults, ManualClock, REQUEST_ID_TAG, errors, lock};
use crate::domain::extension::{ExtensionOffer, ExtensionPayment, ExtensionSeen};
use crate::domain::money::Usd;
use crate::domain::offering::{Offering, Product};
use crate::domain::request::RequestId;
use crate::domain::reservation::{Reservation, ReservationState};
use crate::ports::{CapacityMarket, OfferingQuery, PortError, PurchaseSpec};

/// The account the fake's ARNs name.
const ACCOUNT: &str = "123456789012";

/// The market's operations, for scripting faults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MarketOp {
    Search,
    Purchase,
    Describe,
    FindByRequest,
    FindByDeployment,
    BlocksInAccount,
    ExtensionOffers,
    Extend,
    Extensions,
}

/// One call the market received, for assertions.
#[derive(Debug, Clone, PartialEq)]
pub enum MarketCall {
    Search(OfferingQuery),
    Purchase {
        offering_id: String,
        spec: PurchaseSpec,
    },
    Describe {
        product: Product,
        region: String,
        reservation_id: String,
    },
    FindByRequest {
        product: Product,
        region: String,
        request_id: RequestId,
        plan_name: String,
    },
    FindByDeployment {
        region: String,
        deployment_id: String,
    },
    BlocksInAccount {
        region: String,
    },
    ExtensionOffers {
        reservation_id: String,
        hours: u32,
    },
    Extend {
        reservation_id: String,
        offering_id: String,
    },
    Extensions {
        reservation_id: String,
    },
}

/// An extension the market sold (through the port, or by hand).
#[derive(Debug, Clone)]
struct SoldExtension {
    reservation_id: String,
    seen: ExtensionSeen,
    /// Lookups of the history that still miss it (without a clock).
    unlisted_for: u32,
    /// With a clock: when the history starts to list it.
    listed_from: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone)]
struct Owned {
    reservation: Reservation,
    /// Training plans only.
    plan_name: Option<String>,
    /// Lookups (describe or find) that still miss it: AWS's listings lag, without a clock.
    unlisted_for: u32,
    /// With a clock: when lookups start to see it.
    listed_from: Option<DateTime<Utc>>,
}

impl Owned {
    /// What one lookup sees: nothing while the listing lags (counting the lookup down).
    fn look_up(&mut self, now: Option<DateTime<Utc>>) -> Option<Reservation> {
        if let (Some(from), Some(now)) = (self.listed_from, now)
            && now < from
        {
            return None;
        }
        if self.unlisted_for > 0 {
            self.unlisted_for -= 1;
            return None;
        }
        Some(self.reservation.clone())
    }
}

#[derive(Debug)]
struct State {
    listed: Vec<Offering>,
    per_query: BTreeMap<OfferingQuery, Vec<Offering>>,
    withdrawn: BTreeSet<String>,
    sell_out: bool,
    purchase_state: ReservationState,
    listing_lag: u32,
    clock: Option<ManualClock>,
    listing_lag_time: Duration,
    reservations: Vec<Owned>,
    purchases: BTreeMap<String, u32>,
    next_id: u64,
    faults: Faults<MarketOp>,
    /// Standing answers to searches of a region (and type, when given): every matching
    /// search fails with the error, until cleared.
    search_errors: Vec<(String, Option<String>, PortError)>,
    calls: Vec<MarketCall>,
    /// What an hour of extension costs, per reservation instance; `None`: nothing offered.
    extension_hourly: Option<Usd>,
    extensions: Vec<SoldExtension>,
}

/// An in-memory [`CapacityMarket`]; clones share the market.
#[derive(Debug, Clone)]
pub struct FakeMarket {
    state: Arc<Mutex<State>>,
}

impl Default for FakeMarket {
    fn default() -> Self {
        FakeMarket::new()
    }
}

impl FakeMarket {
    /// An empty market. Offerings stay for sale after a purchase (so a double purchase
    /// shows up as a count of 2) unless [`FakeMarket::sell_out_after_purchase`].
    pub fn new() -> FakeMarket {
        FakeMarket {
            state: Arc::new(Mutex::new(State {
                listed: Vec::new(),
                per_query: BTreeMap::new(),
                withdrawn: BTreeSet::new(),
                sell_out: false,
                purchase_state: ReservationState::Pending,
                listing_lag: 1,
                clock: None,
                listing_lag_time: Duration::minutes(2),
                reservations: Vec::new(),
                purchases: BTreeMap::new(),
                next_id: 1,
                faults: Faults::default(),
                search_errors: Vec::new(),
                calls: Vec::new(),
                extension_hourly: None,
                extensions: Vec::new(),
            })),
        }
    }

    // ---- seeding -----------------------------------------------------------------------

    /// Lists an offering; a search returns it when it matches the query's product, region,
    /// type, count and date range (AWS also returns neighbouring durations, so the duration
    /// is not filtered).
    pub fn list(&self, offering: Offering) {
        lock(&self.state).listed.push(offering);
    }

    pub fn list_all(&self, offerings: impl IntoIterator<Item = Offering>) {
        lock(&self.state).listed.extend(offerings);
    }

    /// Exactly what a search for `query` returns (overrides the filtered list). Its
    /// offerings can be bought too.
    pub fn set_search_result(&self, query: OfferingQuery, offerings: Vec<Offering>) {
        lock(&self.state).per_query.insert(query, offerings);
    }

    /// The offering disappears from searches, and buying it fails with `OfferingGone`.
    pub fn withdraw(&self, offering_id: &str) {
        lock(&self.state).withdrawn.insert(offering_id.to_string());
    }

    /// Whether a bought offering is withdrawn (as real capacity would be).
    pub fn sell_out_after_purchase(&self, yes: bool) {
        lock(&self.state).sell_out = yes;
    }

    /// The state new reservations start in (default `Pending`, as a fresh block has been
    /// seen: aws-reference §11.1). The fake answers at the port: a pending block's count is
    /// what the adapter reads from the offering or the `incrementalRequestedQuantity` tag,
    /// never the 0 of its totals.
    pub fn set_purchase_state(&self, state: ReservationState) {
        lock(&self.state).purchase_state = state;
    }

    /// How many lookups (`describe` or `find_by_request`, each call one) miss a reservation
    /// after it is bought, as AWS's listings lag, by id too (aws-reference §11.3). Default 1:
    /// the look right after a purchase does not see it; 0 is the lenient reading. With a
    /// clock ([`FakeMarket::with_clock`]) the lag is a time instead, and 0 turns it off.
    pub fn set_listing_lag(&self, lookups: u32) {
        let mut s = lock(&self.state);
        s.listing_lag = lookups;
        if lookups == 0 {
            s.listing_lag_time = Duration::zero();
        }
    }

    /// Lookups see a new reservation `lag` after its purchase on `clock` (default lag: 2
    /// minutes, the emulator's: ARCHITECTURE §8.10) instead of after a number of lookups.
    pub fn with_clock(self, clock: ManualClock) -> FakeMarket {
        lock(&self.state).clock = Some(clock);
        self
    }

    /// The listing lag on the attached clock.
    pub fn set_listing_lag_time(&self, lag: Duration) {
        lock(&self.state).listing_lag_time = lag;
    }

    /// A reservation that already exists, e.g. bought by an attempt whose response was
    /// lost. `plan_name` makes a training plan findable (and collide) by name.
    pub fn add_reservation(&self, reservation: Reservation, plan_name: Option<&str>) {
        lock(&self.state).reservations.push(Owned {
            reservation,
            plan_name: plan_name.map(str::to_string),
            unlisted_for: 0,
            listed_from: None,
        });
    }

    /// Moves a reservation to another state (payment failed, active, expired...).
    /// Returns whether it exists.
    pub fn set_reservation_state(&self, reservation_id: &str, state: ReservationState) -> bool {
        let mut s = lock(&self.state);
        match s
            .reservations
            .iter_mut()
            .find(|o| o.reservation.id == reservation_id)
        {
            Some(o) => {
                o.reservation.state = state;
                true
            }
            None => false,
        }
    }

    /// Moves a reservation's last end by `by`, as an extension bought outside capacity-pilot
    /// would (in the console); returns whether it exists.
    pub fn extend_reservation(&self, reservation_id: &str, by: Duration) -> bool {
        let mut s = lock(&self.state);
        match s
            .reservations
            .iter_mut()
            .find(|o| o.reservation.id == reservation_id)
            .and_then(|o| o.reservation.segments.last_mut())
        {
            Some(seg) => {
                seg.end += by;
                true
            }
            None => false,
        }
    }

    /// Offers extensions of every active or scheduled reservation with no extension payment
    /// pending, at `hourly` per instance-hour (none are offered until this is called).
    pub fn offer_extensions(&self, hourly: Usd) {
        lock(&self.state).extension_hourly = Some(hourly);
    }

    /// Settles every extension whose payment is pending as `payment` says: a paid one moves
    /// its reservation's last end to the extension's; a failed one leaves it. Returns how
    /// many it settled.
    pub fn settle_extensions(&self, payment: ExtensionPayment) -> usize {
        let mut s = lock(&self.state);
        let mut settled = Vec::new();
        for e in s.extensions.iter_mut() {
            if e.seen.payment == ExtensionPayment::Pending {
                e.seen.payment = payment;
                settled.push((e.reservation_id.clone(), e.seen.ends_at));
            }
        }
        if payment == ExtensionPayment::Succeeded {
            for (id, end) in &settled {
                if let Some(seg) = s
                    .reservations
                    .iter_mut()
                    .find(|o| o.reservation.id == *id)
                    .and_then(|o| o.reservation.segments.last_mut())
                {
                    seg.end = *end;
                }
            }
        }
        settled.len()
    }

    /// An extension of `reservation_id` by `hours` bought outside capacity-pilot (in the
    /// console) at `at`, paid at once (priced as [`FakeMarket::offer_extensions`] says):
    /// listed in the history at once, the end moved.
    pub fn extend_by_hand(&self, reservation_id: &str, hours: u32, at: DateTime<Utc>) -> bool {
        let mut s = lock(&self.state);
        let n = s.extensions.len() + 1;
        let hourly = s.extension_hourly;
        let Some(seg) = s
            .reservations
            .iter_mut()
            .find(|o| o.reservation.id == reservation_id)
            .and_then(|o| o.reservation.segments.last_mut())
        else {
            return false;
        };
        let starts_at = seg.end;
        seg.end += Duration::hours(i64::from(hours));
        let ends_at = seg.end;
        let count = rust_decimal::Decimal::from(
            s.reservations
                .iter()
                .find(|o| o.reservation.id == reservation_id)
                .map_or(0, |o| o.reservation.instance_count),
        );
        let fee = hourly.map(|h| Usd::new(h.amount() * rust_decimal::Decimal::from(hours) * count));
        s.extensions.push(SoldExtension {
            reservation_id: reservation_id.to_string(),
            seen: ExtensionSeen {
                offering_id: format!("hand-{n:05}"),
                hours,
                starts_at,
                ends_at,
                fee,
                payment: ExtensionPayment::Succeeded,
                bought_at: Some(at),
            },
            unlisted_for: 0,
            listed_from: None,
        });
        true
    }

    /// How many extensions of `reservation_id` were bought through the port.
    pub fn extensions_bought(&self, reservation_id: &str) -> usize {
        lock(&self.state)
            .extensions
            .iter()
            .filter(|e| {
                e.reservation_id == reservation_id && !e.seen.offering_id.starts_with("hand-")
            })
            .count()
    }

    // ---- faults ------------------------------------------------------------------------

    /// The next call of `op` returns `error` and does nothing.
    pub fn fail_next(&self, op: MarketOp, error: PortError) {
        lock(&self.state).faults.push(op, Fault::Fail(error));
    }

    /// The next call of `op` takes effect, then returns `error`.
    pub fn apply_then_fail_next(&self, op: MarketOp, error: PortError) {
        lock(&self.state)
            .faults
            .push(op, Fault::ApplyThenFail(error));
    }

    /// The next purchase buys, and the caller hears `OutcomeUnknown`.
    pub fn lose_next_purchase_response(&self) {
        self.apply_then_fail_next(MarketOp::Purchase, errors::outcome_unknown("market"));
    }

    /// The next call of `op` is throttled.
    pub fn throttle_next(&self, op: MarketOp) {
        self.fail_next(op, errors::throttled("market"));
    }

    /// Every search of `region` (and `instance_type`, when given) fails with `error` until
    /// [`FakeMarket::clear_faults`]: a type AWS does not sell there, a missing quota, a
    /// region that keeps failing.
    pub fn fail_searches(&self, region: &str, instance_type: Option<&str>, error: PortError) {
        lock(&self.state).search_errors.push((
            region.to_string(),
            instance_type.map(str::to_string),
            error,
        ));
    }

    pub fn clear_faults(&self) {
        let mut s = lock(&self.state);
        s.faults.clear();
        s.search_errors.clear();
    }

    // ---- assertions --------------------------------------------------------------------

    /// How many times `offering_id` was bought (lost responses included).
    pub fn purchases_of(&self, offering_id: &str) -> u32 {
        lock(&self.state)
            .purchases
            .get(offering_id)
            .copied()
            .unwrap_or(0)
    }

    /// Purchases of every offering.
    pub fn purchase_count(&self) -> u32 {
        lock(&self.state).purchases.values().sum()
    }

    /// Every reservation the market knows, bought or added, in order.
    pub fn reservations(&self) -> Vec<Reservation> {
        lock(&self.state)
            .reservations
            .iter()
            .map(|o| o.reservation.clone())
            .collect()
    }

    pub fn calls(&self) -> Vec<MarketCall> {
        lock(&self.state).calls.clone()
    }

    pub fn calls_of(&self, op: MarketOp) -> usize {
        lock(&self.state)
            .calls
            .iter()
            .filter(|c| {
                op == match c {
                    MarketCall::Search(_) => MarketOp::Search,
                    MarketCall::Purchase { .. } => MarketOp::Purchase,
                    MarketCall::Describe { .. } => MarketOp::Describe,
                    MarketCall::FindByRequest { .. } => MarketOp::FindByRequest,
                    MarketCall::FindByDeployment { .. } => MarketOp::FindByDeployment,
                    MarketCall::BlocksInAccount { .. } => MarketOp::BlocksInAccount,
                    MarketCall::ExtensionOffers { .. } => MarketOp::ExtensionOffers,
                    MarketCall::Extend { .. } => MarketOp::Extend,
                    MarketCall::Extensions { .. } => MarketOp::Extensions,
                }
            })
            .count()
    }
}

fn matches_query(o: &Offering, q: &OfferingQuery) -> bool {
    o.product == q.product
        && o.region == q.region
        && o.instance_type == q.instance_type
        && o.instance_count == q.instance_count
        && o.start() >= q.start_from
        && o.end() <= q.end_by
}

impl State {
    fn known_offering(&self, id: &str) -> Option<Offering> {
        self.listed
            .iter()
            .chain(self.per_query.values().flatten())
            .find(|o| o.id == id)
            .cloned()
    }

    fn buy(&mut self, offering: &Offering, spec: &PurchaseSpec) -> Result<Reservation, PortError> {
        if self.withdrawn.contains(&offering.id) {
            return Err(gone(&offering.id));
        }
        let Some(listed) = self.known_offering(&offering.id) else {
            return Err(gone(&offering.id));
        };
        let n = self.next_id;
        let (id, plan_name) = match listed.product {
            Product::TrainingPlan { .. } => {
                if spec.plan_name.is_empty() {
                    return Err(errors::permanent(
                        "sagemaker",
                        "ValidationException",
                        "TrainingPlanName must not be empty",
                    ));
                }
                let taken = self.reservations.iter().any(|o| {
                    o.reservation.region == listed.region
                        && o.plan_name.as_deref() == Some(spec.plan_name.as_str())
                });
                if taken {
                    return Err(errors::permanent(
                        "sagemaker",
                        "ResourceInUse",
                        format!("Training plan {} already exists", spec.plan_name),
                    ));
                }
                let arn = format!(
                    "arn:aws:sagemaker:{}:{ACCOUNT}:training-plan/{}",
                    listed.region, spec.plan_name
                );
                (arn, Some(spec.plan_name.clone()))
            }
            _ => (format!("cr-{n:017x}"), None),
        };
        self.next_id += 1;
        let reservation = Reservation {
            id,
            product: listed.product,
            region: listed.region.clone(),
            instance_type: listed.instance_type.clone(),
            instance_count: listed.instance_count,
            segments: listed.segments.clone(),
            upfront_fee: listed.upfront_fee,
            state: self.purchase_state,
            offering_id: Some(listed.id.clone()),
            request_tag: Some(
                spec.tags
                    .get(REQUEST_ID_TAG)
                    .cloned()
                    .unwrap_or_else(|| spec.request_id.to_string()),
            ),
            deployment_tag: spec
                .tags
                .get(crate::domain::naming::DEPLOYMENT_TAG)
                .cloned(),
            ultraserver: false,
            bought_at: None,
            debit_month: None,
            debit_team: None,
            payment_check_at: None,
            extensions: Vec::new(),
            extension_check_at: None,
        };
        let (unlisted_for, listed_from) = match &self.clock {
            Some(c) => (0, Some(c.get() + self.listing_lag_time)),
            None => (self.listing_lag, None),
        };
        self.reservations.push(Owned {
            reservation: reservation.clone(),
            plan_name,
            unlisted_for,
            listed_from,
        });
        *self.purchases.entry(listed.id.clone()).or_default() += 1;
        if self.sell_out {
            self.withdrawn.insert(listed.id);
        }
        Ok(reservation)
    }
}

fn gone(offering_id: &str) -> PortError {
    PortError::OfferingGone {
        code: "InvalidCapacityBlockOfferingId.NotFound".into(),
        message: format!("offering {offering_id} is not for sale"),
    }
}

impl CapacityMarket for FakeMarket {
    async fn search(&self, query: &OfferingQuery) -> Result<Vec<Offering>, PortError> {
        let mut s = lock(&self.state);
        s.calls.push(MarketCall::Search(query.clone()));
        let after = match s.faults.next(MarketOp::Search) {
            Some(Fault::Fail(e)) => return Err(e),
            Some(Fault::ApplyThenFail(e)) => Some(e),
            None => None,
        };
        if let Some((_, _, e)) = s.search_errors.iter().find(|(region, ty, _)| {
            *region == query.region && ty.as_ref().is_none_or(|t| *t == query.instance_type)
        }) {
            return Err(e.clone());
        }
        let found: Vec<Offering> = match s.per_query.get(query) {
            Some(list) => list.clone(),
            None => s
                .listed
                .iter()
                .filter(|o| matches_query(o, query))
                .cloned()
                .collect(),
        };
        let found = found
            .into_iter()
            .filter(|o| !s.withdrawn.contains(&o.id))
            .collect();
        match after {
            Some(e) => Err(e),
            None => Ok(found),
        }
    }

    async fn purchase(
        &self,
        offering: &Offering,
        spec: &PurchaseSpec,
    ) -> Result<Reservation, PortError> {
        let mut s = lock(&self.state);
        s.calls.push(MarketCall::Purchase {
            offering_id: offering.id.clone(),
            spec: spec.clone(),
        });
        match s.faults.next(MarketOp::Purchase) {
            Some(Fault::Fail(e)) => Err(e),
            Some(Fault::ApplyThenFail(e)) => {
                // Whatever happened, the caller only hears the error.
                let _ = s.buy(offering, spec);
                Err(e)
            }
            None => s.buy(offering, spec),
        }
    }

    async fn describe(
        &self,
        product: Product,
        region: &str,
        reservation_id: &str,
    ) -> Result<Option<Reservation>, PortError> {
        let mut s = lock(&self.state);
        let now = s.clock.as_ref().map(ManualClock::get);
        s.calls.push(MarketCall::Describe {
            product,
            region: region.to_string(),
            reservation_id: reservation_id.to_string(),
        });
        let after = match s.faults.next(MarketOp::Describe) {
            Some(Fault::Fail(e)) => return Err(e),
            Some(Fault::ApplyThenFail(e)) => Some(e),
            None => None,
        };
        let found = s
            .reservations
            .iter_mut()
            .find(|o| o.reservation.region == region && o.reservation.id == reservation_id)
            .and_then(|o| o.look_up(now));
        match after {
            Some(e) => Err(e),
            None => Ok(found),
        }
    }

    async fn find_by_request(
        &self,
        product: Product,
        region: &str,
        request_id: &RequestId,
        plan_name: &str,
    ) -> Result<Vec<Reservation>, PortError> {
        let mut s = lock(&self.state);
        let now = s.clock.as_ref().map(ManualClock::get);
        s.calls.push(MarketCall::FindByRequest {
            product,
            region: region.to_string(),
            request_id: request_id.clone(),
            plan_name: plan_name.to_string(),
        });
        let after = match s.faults.next(MarketOp::FindByRequest) {
            Some(Fault::Fail(e)) => return Err(e),
            Some(Fault::ApplyThenFail(e)) => Some(e),
            None => None,
        };
        let found = s
            .reservations
            .iter_mut()
            .filter(|o| o.reservation.product == product && o.reservation.region == region)
            .filter(|o| {
                o.reservation.request_tag.as_deref() == Some(request_id.as_str())
                    || (!plan_name.is_empty() && o.plan_name.as_deref() == Some(plan_name))
            })
            .filter_map(|o| o.look_up(now))
            .collect();
        match after {
            Some(e) => Err(e),
            None => Ok(found),
        }
    }

    async fn find_by_deployment(
        &self,
        region: &str,
        deployment_id: &str,
    ) -> Result<Vec<Reservation>, PortError> {
        let mut s = lock(&self.state);
        let now = s.clock.as_ref().map(ManualClock::get);
        s.calls.push(MarketCall::FindByDeployment {
            region: region.to_string(),
            deployment_id: deployment_id.to_string(),
        });
        if let Some(Fault::Fail(e) | Fault::ApplyThenFail(e)) =
            s.faults.next(MarketOp::FindByDeployment)
        {
            return Err(e);
        }
        Ok(s.reservations
            .iter_mut()
            .filter(|o| o.reservation.region == region)
            .filter(|o| o.reservation.deployment_tag.as_deref() == Some(deployment_id))
            .filter_map(|o| o.look_up(now))
            .collect())
    }

    async fn extension_offers(
        &self,
        r: &Reservation,
        hours: u32,
    ) -> Result<Vec<ExtensionOffer>, PortError> {
        let mut s = lock(&self.state);
        s.calls.push(MarketCall::ExtensionOffers {
            reservation_id: r.id.clone(),
            hours,
        });
        if let Some(Fault::Fail(e) | Fault::ApplyThenFail(e)) =
            s.faults.next(MarketOp::ExtensionOffers)
        {
            return Err(e);
        }
        let Some(hourly) = s.extension_hourly else {
            return Ok(Vec::new());
        };
        let pending = s
            .extensions
            .iter()
            .any(|e| e.reservation_id == r.id && e.seen.payment == ExtensionPayment::Pending);
        let Some(held) = s
            .reservations
            .iter()
            .find(|o| o.reservation.id == r.id)
            .map(|o| o.reservation.clone())
        else {
            return Ok(Vec::new());
        };
        if pending
            || !matches!(
                held.state,
                ReservationState::Active | ReservationState::Scheduled
            )
        {
            return Ok(Vec::new());
        }
        let n = s.next_id;
        s.next_id += 1;
        let prefix = match held.product {
            Product::TrainingPlan { .. } => "tpeo",
            _ => "cbe",
        };
        let fee = Usd::new(
            hourly.amount()
                * rust_decimal::Decimal::from(hours)
                * rust_decimal::Decimal::from(held.instance_count),
        );
        Ok(vec![ExtensionOffer {
            offering_id: format!("{prefix}-{n:017x}"),
            hours,
            starts_at: held.end(),
            ends_at: held.end() + Duration::hours(i64::from(hours)),
            fee,
        }])
    }

    async fn extend(
        &self,
        r: &Reservation,
        offer: &ExtensionOffer,
    ) -> Result<ExtensionSeen, PortError> {
        let mut s = lock(&self.state);
        s.calls.push(MarketCall::Extend {
            reservation_id: r.id.clone(),
            offering_id: offer.offering_id.clone(),
        });
        let after = match s.faults.next(MarketOp::Extend) {
            Some(Fault::Fail(e)) => return Err(e),
            Some(Fault::ApplyThenFail(e)) => Some(e),
            None => None,
        };
        let now = s.clock.as_ref().map(ManualClock::get);
        if s.extensions
            .iter()
            .any(|e| e.seen.offering_id == offer.offering_id)
        {
            return Err(PortError::OfferingGone {
                code: "InvalidParameterValue".into(),
                message: format!(
                    "extension offering {} was bought already",
                    offer.offering_id
                ),
            });
        }
        let seen = ExtensionSeen {
            offering_id: offer.offering_id.clone(),
            hours: offer.hours,
            starts_at: offer.starts_at,
            ends_at: offer.ends_at,
            fee: Some(offer.fee),
            payment: ExtensionPayment::Pending,
            bought_at: now,
        };
        let (unlisted_for, listed_from) = match now {
            Some(now) => (0, Some(now + s.listing_lag_time)),
            None => (s.listing_lag, None),
        };
        s.extensions.push(SoldExtension {
            reservation_id: r.id.clone(),
            seen: seen.clone(),
            unlisted_for,
            listed_from,
        });
        match after {
            Some(e) => Err(e),
            None => Ok(seen),
        }
    }

    async fn extensions(&self, r: &Reservation) -> Result<Vec<ExtensionSeen>, PortError> {
        let mut s = lock(&self.state);
        s.calls.push(MarketCall::Extensions {
            reservation_id: r.id.clone(),
        });
        if let Some(Fault::Fail(e) | Fault::ApplyThenFail(e)) = s.faults.next(MarketOp::Extensions)
        {
            return Err(e);
        }
        let now = s.clock.as_ref().map(ManualClock::get);
        let mut out = Vec::new();
        for e in s.extensions.iter_mut().filter(|e| e.reservation_id == r.id) {
            if let (Some(from), Some(now)) = (e.listed_from, now)
                && now < from
            {
                continue;
            }
            if e.unlisted_for > 0 {
                e.unlisted_for -= 1;
                continue;
            }
            out.push(e.seen.clone());
        }
        Ok(out)
    }

    async fn blocks_in_account(&self, region: &str) -> Result<Vec<Reservation>, PortError> {
        let mut s = lock(&self.state);
        let now = s.clock.as_ref().map(ManualClock::get);
        s.calls.push(MarketCall::BlocksInAccount {
            region: region.to_string(),
        });
        if let Some(Fault::Fail(e) | Fault::ApplyThenFail(e)) =
            s.faults.next(MarketOp::BlocksInAccount)
        {
            return Err(e);
        }
        Ok(s.reservations
            .iter_mut()
            .filter(|o| o.reservation.region == region)
            .filter(|o| o.reservation.product == Product::CapacityBlock)
            .filter_map(|o| o.look_up(now))
            .filter(|r| r.state.is_live())
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::catalog::PriceTable;
    use crate::domain::money::Usd;
    use crate::domain::offering::{Segment, TargetResource};
    use chrono::{DateTime, Duration, TimeZone, Utc};

    fn t0() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 12, 7, 11, 30, 0).unwrap()
    }

    fn offering(id: &str, product: Product, start: DateTime<Utc>, hours: i64) -> Offering {
        Offering::new(
            id,
            product,
            "us-east-1",
            "p5.48xlarge",
            2,
            vec![Segment {
                start,
                end: start + Duration::hours(hours),
                availability_zone: Some("us-east-1a".into()),
            }],
            Usd::parse("1000.00").unwrap(),
            &PriceTable::default(),
        )
    }

    fn query(product: Product) -> OfferingQuery {
        OfferingQuery {
            product,
            region: "us-east-1".into(),
            instance_type: "p5.48xlarge".into(),
            instance_count: 2,
            duration_hours: 24,
            start_from: t0(),
            end_by: t0() + Duration::days(7),
        }
    }

    fn spec(request: &str) -> PurchaseSpec {
        PurchaseSpec {
            request_id: RequestId::parse(request).unwrap(),
            plan_name: format!("cp-{request}"),
            instance_platform: "Linux/UNIX".into(),
            tags: BTreeMap::from([(REQUEST_ID_TAG.to_string(), request.to_string())]),
        }
    }

    const PLAN: Product = Product::TrainingPlan {
        target: TargetResource::TrainingJob,
    };

    #[tokio::test]
    async fn a_search_returns_the_listed_offerings_that_match_the_query() {
        // GIVEN offerings inside and outside the query's range, and of another product
        let market = FakeMarket::new();
        market.list_all([
            offering("in", Product::CapacityBlock, t0() + Duration::days(1), 24),
            offering(
                "too-late",
                Product::CapacityBlock,
                t0() + Duration::days(7),
                24,
            ),
            offering("plan", PLAN, t0() + Duration::days(1), 24),
        ]);
        // WHEN searching for Capacity Blocks
        let found = market.search(&query(Product::CapacityBlock)).await.unwrap();
        // THEN only the matching block is returned
        let ids: Vec<_> = found.iter().map(|o| o.id.as_str()).collect();
        assert_eq!(ids, vec!["in"]);
    }

    #[tokio::test]
    async fn a_search_seeded_per_query_returns_exactly_the_seed() {
        let market = FakeMarket::new();
        let odd = offering("odd", Product::CapacityBlock, t0() - Duration::days(3), 24);
        market.set_search_result(query(Product::CapacityBlock), vec![odd.clone()]);
        assert_eq!(
            market.search(&query(Product::CapacityBlock)).await.unwrap(),
            vec![odd]
        );
        assert!(market.search(&query(PLAN)).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_purchase_creates_a_reservation_tagged_with_the_request_and_counts_it() {
        // GIVEN a listed block
        let market = FakeMarket::new();
        let o = offering("cb-1", Product::CapacityBlock, t0(), 24);
        market.list(o.clone());
        // WHEN it is bought for r-1
        let r = market.purchase(&o, &spec("r-1")).await.unwrap();
        // THEN the reservation carries the offering, fee and tag, and is findable by request
        assert!(r.id.starts_with("cr-"));
        assert_eq!(r.offering_id.as_deref(), Some("cb-1"));
        assert_eq!(r.upfront_fee, o.upfront_fee);
        assert_eq!(r.state, ReservationState::Pending);
        assert_eq!(market.purchases_of("cb-1"), 1);
        let rid = RequestId::parse("r-1").unwrap();
        // AND the first lookup misses it (the listing lags), the next finds it
        let lookup = || market.find_by_request(Product::CapacityBlock, "us-east-1", &rid, "");
        assert_eq!(lookup().await.unwrap(), vec![]);
        assert_eq!(lookup().await.unwrap(), vec![r.clone()]);
        assert_eq!(
            market
                .describe(Product::CapacityBlock, "us-east-1", &r.id)
                .await
                .unwrap(),
            Some(r)
        );
    }

    #[tokio::test]
    async fn a_lost_purchase_response_buys_and_returns_outcome_unknown() {
        // GIVEN a market that will lose the next purchase's response
        let market = FakeMarket::new();
        let o = offering("cb-1", Product::CapacityBlock, t0(), 24);
        market.list(o.clone());
        market.lose_next_purchase_response();
        // WHEN buying
        let err = market.purchase(&o, &spec("r-1")).await.unwrap_err();
        // THEN the caller hears OutcomeUnknown, but the block was bought and can be found
        assert!(matches!(err, PortError::OutcomeUnknown { .. }));
        assert_eq!(market.purchases_of("cb-1"), 1);
        let rid = RequestId::parse("r-1").unwrap();
        let lookup = || market.find_by_request(Product::CapacityBlock, "us-east-1", &rid, "");
        assert_eq!(lookup().await.unwrap().len(), 0, "the listing lags");
        assert_eq!(lookup().await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn a_failed_purchase_buys_nothing() {
        let market = FakeMarket::new();
        let o = offering("cb-1", Product::CapacityBlock, t0(), 24);
        market.list(o.clone());
        market.throttle_next(MarketOp::Purchase);
        assert!(
            market
                .purchase(&o, &spec("r-1"))
                .await
                .unwrap_err()
                .is_retryable()
        );
        assert_eq!(market.purchase_count(), 0);
        assert_eq!(market.calls_of(MarketOp::Purchase), 1);
    }

    #[tokio::test]
    async fn a_withdrawn_or_unknown_offering_is_gone() {
        let market = FakeMarket::new();
        let o = offering("cb-1", Product::CapacityBlock, t0(), 24);
        market.list(o.clone());
        market.withdraw("cb-1");
        assert!(matches!(
            market.purchase(&o, &spec("r-1")).await,
            Err(PortError::OfferingGone { .. })
        ));
        assert!(
            market
                .search(&query(Product::CapacityBlock))
                .await
                .unwrap()
                .is_empty()
        );
        let never_listed = offering("cb-2", Product::CapacityBlock, t0(), 24);
        assert!(matches!(
            market.purchase(&never_listed, &spec("r-1")).await,
            Err(PortError::OfferingGone { .. })
        ));
        assert_eq!(market.purchase_count(), 0);
    }

    #[tokio::test]
    async fn a_sold_out_offering_can_be_bought_only_once() {
        let market = FakeMarket::new();
        market.sell_out_after_purchase(true);
        let o = offering("cb-1", Product::CapacityBlock, t0(), 24);
        market.list(o.clone());
        market.purchase(&o, &spec("r-1")).await.unwrap();
        assert!(matches!(
            market.purchase(&o, &spec("r-2")).await,
            Err(PortError::OfferingGone { .. })
        ));
        assert_eq!(market.purchases_of("cb-1"), 1);
    }

    #[tokio::test]
    async fn a_second_training_plan_of_the_same_name_fails_with_resource_in_use() {
        // GIVEN a plan bought for r-1 with a lost response (listed at once: the lenient
        // reading, as this is about names)
        let market = FakeMarket::new();
        market.set_listing_lag(0);
        let o = offering("tp-1", PLAN, t0(), 24);
        market.list(o.clone());
        market.lose_next_purchase_response();
        assert!(market.purchase(&o, &spec("r-1")).await.is_err());
        // WHEN the retry creates the same plan name
        let err = market.purchase(&o, &spec("r-1")).await.unwrap_err();
        // THEN it collides instead of buying twice
        assert_eq!(err.code(), Some("ResourceInUse"));
        assert!(matches!(err, PortError::Permanent { .. }));
        assert_eq!(market.purchases_of("tp-1"), 1);
        // AND the plan is found by its name even without a tag match
        let found = market
            .find_by_request(
                PLAN,
                "us-east-1",
                &RequestId::parse("someone-else").unwrap(),
                "cp-r-1",
            )
            .await
            .unwrap();
        assert_eq!(found.len(), 1);
        assert!(found[0].id.ends_with("training-plan/cp-r-1"));
    }

    #[tokio::test]
    async fn an_added_reservation_is_found_and_its_state_can_change() {
        let market = FakeMarket::new();
        let o = offering("cb-1", Product::CapacityBlock, t0(), 24);
        market.list(o.clone());
        let mut r = market.purchase(&o, &spec("r-1")).await.unwrap();
        r.id = "cr-existing".into();
        market.add_reservation(r, None);
        assert!(market.set_reservation_state("cr-existing", ReservationState::PaymentFailed));
        let seen = market
            .describe(Product::CapacityBlock, "us-east-1", "cr-existing")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(seen.state, ReservationState::PaymentFailed);
        assert!(
            market
                .describe(Product::CapacityBlock, "eu-west-1", "cr-existing")
                .await
                .unwrap()
                .is_none()
        );
    }
}
