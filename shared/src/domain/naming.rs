//! Deterministic names and tokens derived from a request, so that a repeated attempt
//! collides with (or returns) the first one instead of creating a second resource.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use super::request::{RequestId, Team};

/// Tag on everything we create; destructive IAM actions are conditioned on it.
pub const MANAGED_TAG: &str = "capacity-pilot:managed";
/// Tag naming the request a resource belongs to; reconciliation searches by it.
pub const REQUEST_TAG: &str = "capacity-pilot:request-id";
/// Tag naming the deployment (stack) that created a resource (ARCHITECTURE §8.7):
/// reconciliation and adoption only take what carries ours.
pub const DEPLOYMENT_TAG: &str = "capacity-pilot:deployment";
/// Tag naming the team a resource was bought or launched for, in its ledger's spelling
/// (lower case): activate it as a cost-allocation tag to see each team's spend in Cost
/// Explorer.
pub const TEAM_TAG: &str = "capacity-pilot:team";

/// Tag on the EC2 instances launched into a window: when its drain starts (RFC 3339, UTC),
/// the moment capacity-pilot stops them. A job reads it from the instance metadata (instance
/// tags enabled in the launch template) to checkpoint before then.
pub const DRAIN_AT_TAG: &str = "capacity-pilot:drain-at";

/// [`DRAIN_AT_TAG`]'s value for a drain starting `at`: `2026-12-09T10:45:00Z`.
pub fn drain_at_value(at: chrono::DateTime<chrono::Utc>) -> String {
    at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// The tags on everything bought or launched for a request: the request's own tags, then
/// ours, which win (destructive IAM actions and reconciliation rely on them).
pub fn resource_tags(
    request_tags: &BTreeMap<String, String>,
    request_id: &RequestId,
    team: &Team,
    deployment_id: &str,
) -> BTreeMap<String, String> {
    let mut tags = request_tags.clone();
    tags.insert(MANAGED_TAG.into(), "true".into());
    tags.insert(REQUEST_TAG.into(), request_id.to_string());
    tags.insert(TEAM_TAG.into(), team.ledger().to_string());
    tags.insert(DEPLOYMENT_TAG.into(), deployment_id.to_string());
    tags
}

/// Whether a resource with `tags` is ours for `request_id` in deployment `deployment_id`
/// (ARCHITECTURE §8.7): our managed tag set to `true`, the request's tag, and this
/// deployment's tag. A resource created before deployments were tagged has none, and
/// counts as ours by the other two. Anything else with the same name is someone else's:
/// never adopted, changed or deleted.
pub fn owns(tags: &BTreeMap<String, String>, request_id: &RequestId, deployment_id: &str) -> bool {
    tags.get(MANAGED_TAG).map(String::as_str) == Some("true")
        && tags.get(REQUEST_TAG).map(String::as_str) == Some(request_id.as_str())
        && tags
            .get(DEPLOYMENT_TAG)
            .is_none_or(|d| d.as_str() == deployment_id)
}

/// Six hex digits of a hash of the deployment id: its mark in training plan names.
pub fn deployment_hash(deployment_id: &str) -> String {
    let digest = hex::encode(Sha256::digest(deployment_id.as_bytes()));
    digest[..6].to_string()
}

/// The training plan name for a request: a second `CreateTrainingPlan` with it fails with
/// `ResourceInUse` instead of buying again. `attempt` > 0 once an earlier plan of the request
/// went final (a failed payment, say): each plan bought takes the next.
///
/// Attempt 0 is `cp-<hash>-<id>`, attempt n is `cp<n>-<hash>-<id>`, `<hash>` the deployment's
/// [`deployment_hash`] (ARCHITECTURE §8.7: two stacks given the same request id never
/// share a name). The attempt sits before the id, so no request's name can be another
/// request's retry. Request ids are at most 48 characters of `[A-Za-z0-9-]`: up to attempt
/// 999 this fits SageMaker's 64-character `[a-zA-Z0-9](-*[a-zA-Z0-9]){0,63}`. The id is
/// lower-cased (review N15): SageMaker may fold names' case, and ids are compared ignoring
/// it; plans named before, with the id as given, are still read as the request's.
pub fn plan_name(request_id: &RequestId, deployment_id: &str, attempt: u32) -> String {
    let (hash, id) = (deployment_hash(deployment_id), request_id.folded());
    if attempt == 0 {
        format!("cp-{hash}-{id}")
    } else {
        format!("cp{attempt}-{hash}-{id}")
    }
}

/// Whether `named` is `request_id` as a plan name carries it: lower-cased, or as given
/// (named before names were lower-cased).
fn names_id(named: &str, request_id: &RequestId) -> bool {
    named == request_id.folded() || named == request_id.as_str()
}

/// The attempt whose [`plan_name`] `name` is for `request_id` in the deployment whose
/// [`deployment_hash`] is `hash`, if it is one of them. Names from before deployments were
/// named (`cp-<id>`, `cp<n>-<id>`) are read as this deployment's too, so a purchase in doubt
/// across the upgrade is still found.
pub fn plan_attempt(name: &str, request_id: &RequestId, hash: &str) -> Option<u32> {
    let rest = name.strip_prefix("cp")?;
    let (attempt, rest) = rest.split_once('-')?;
    let attempt = match attempt {
        "" => 0,
        n if n.bytes().all(|b| b.is_ascii_digit()) && !n.starts_with('0') => n.parse().ok()?,
        _ => return None,
    };
    let ours = rest
        .strip_prefix(hash)
        .and_then(|r| r.strip_prefix('-'))
        .is_some_and(|id| names_id(id, request_id));
    (ours || rest == request_id.as_str()).then_some(attempt)
}

/// The request whose [`plan_name`] `name` is, in the deployment whose [`deployment_hash`] is
/// `hash`; none for another deployment's, or a name from before deployments were named. Its
/// id is as the name carries it: lower-cased, unless named before names were.
pub fn plan_request(name: &str, hash: &str) -> Option<RequestId> {
    let rest = name.strip_prefix("cp")?;
    let (attempt, rest) = rest.split_once('-')?;
    if !(attempt.is_empty() || attempt.bytes().all(|b| b.is_ascii_digit())) {
        return None;
    }
    let id = rest.strip_prefix(hash)?.strip_prefix('-')?;
    RequestId::parse(id).ok()
}

/// The deployment hash in plan name `name` of `request_id`, when it has one.
pub fn plan_name_hash<'a>(name: &'a str, request_id: &RequestId) -> Option<&'a str> {
    let rest = name.strip_prefix("cp")?;
    let (_, rest) = rest.split_once('-')?;
    let hash = [request_id.folded(), request_id.to_string()]
        .iter()
        .find_map(|id| rest.strip_suffix(id.as_str())?.strip_suffix('-'))?;
    (hash.len() == 6 && hash.bytes().all(|b| b.is_ascii_hexdigit())).then_some(hash)
}

/// `RunInstances` `ClientToken`: a hash of (reservation id, slot, generation), 64 characters
/// at most. EC2 answers a used token with the old (possibly terminated) instance, so each
/// replacement increments `generation`.
pub fn client_token(reservation_id: &str, slot: u32, generation: u32) -> String {
    let mut h = Sha256::new();
    h.update(reservation_id.as_bytes());
    h.update([0]);
    h.update(slot.to_be_bytes());
    h.update(generation.to_be_bytes());
    let digest = hex::encode(h.finalize());
    format!("cp-{}", &digest[..61])
}

/// The training job, endpoint config and similar names for a request's segment.
pub fn workload_name(request_id: &RequestId, segment: u32) -> String {
    format!("cp-{request_id}-s{segment}")
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_drain_tag_reads_as_an_rfc_3339_instant_to_the_second_in_utc() {
        use chrono::TimeZone;
        let at = chrono::Utc
            .with_ymd_and_hms(2026, 12, 9, 10, 45, 0)
            .unwrap();
        assert_eq!(drain_at_value(at), "2026-12-09T10:45:00Z");
        let back: chrono::DateTime<chrono::Utc> = drain_at_value(at).parse().unwrap();
        assert_eq!(back, at);
    }

    use super::*;

    #[test]
    fn a_plan_name_says_its_request_only_in_its_own_deployment() {
        let id = RequestId::parse("team-a-eval-7").unwrap();
        let hash = deployment_hash("prod");
        for attempt in [0, 1, 12] {
            let name = plan_name(&id, "prod", attempt);
            assert_eq!(plan_request(&name, &hash), Some(id.clone()), "{name}");
            assert_eq!(plan_request(&name, &deployment_hash("staging")), None);
        }
        // before deployments were named, and names not ours
        assert_eq!(plan_request("cp-team-a-eval-7", &hash), None);
        assert_eq!(
            plan_request(&format!("xy-{hash}-team-a-eval-7"), &hash),
            None
        );
        assert_eq!(
            plan_request(&format!("cpx-{hash}-team-a-eval-7"), &hash),
            None
        );
    }

    #[test]
    fn a_resource_is_ours_only_with_our_managed_request_and_deployment_tags() {
        let id = RequestId::parse("r1").unwrap();
        let team = Team::parse("team-a").unwrap();
        let ours = resource_tags(&BTreeMap::new(), &id, &team, "stack-a");
        assert!(owns(&ours, &id, "stack-a"));
        assert!(!owns(&ours, &id, "stack-b"), "another deployment's");
        assert!(
            !owns(&ours, &RequestId::parse("r2").unwrap(), "stack-a"),
            "another request's"
        );
        let mut legacy = ours.clone();
        legacy.remove(DEPLOYMENT_TAG);
        assert!(
            owns(&legacy, &id, "stack-a"),
            "from before deployments were tagged"
        );
        let mut unmanaged = ours;
        unmanaged.insert(MANAGED_TAG.into(), "false".into());
        assert!(!owns(&unmanaged, &id, "stack-a"));
        assert!(!owns(&BTreeMap::new(), &id, "stack-a"));
    }

    #[test]
    fn client_tokens_are_stable_short_and_change_with_each_generation() {
        let a = client_token("cr-0123456789abcdef0", 3, 0);
        assert_eq!(a, client_token("cr-0123456789abcdef0", 3, 0));
        assert_eq!(a.len(), 64);
        assert_ne!(a, client_token("cr-0123456789abcdef0", 3, 1));
        assert_ne!(a, client_token("cr-0123456789abcdef0", 4, 0));
        assert_ne!(a, client_token("cr-0123456789abcdef1", 3, 0));
    }

    #[test]
    fn plan_names_fit_sagemaker_rules_for_the_longest_request_id() {
        let id = RequestId::parse(&"a".repeat(48)).unwrap();
        for attempt in [0, 1, 999] {
            let n = plan_name(&id, "a-very-long-stack-name-of-a-deployment-x", attempt);
            assert!(n.len() <= 64, "{n}");
            assert!(n.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
            assert!(!n.ends_with('-'));
        }
        let r1 = RequestId::parse("r-1").unwrap();
        let hash = deployment_hash("prod");
        assert_eq!(plan_name(&r1, "prod", 0), format!("cp-{hash}-r-1"));
        assert_eq!(
            plan_name_hash(&plan_name(&r1, "prod", 3), &r1),
            Some(hash.as_str())
        );
    }

    #[test]
    fn resource_tags_keep_the_requests_and_ours_win() {
        let id = RequestId::parse("r-1").unwrap();
        let mine = BTreeMap::from([
            ("project".to_string(), "x".to_string()),
            (REQUEST_TAG.to_string(), "someone-else".to_string()),
            (TEAM_TAG.to_string(), "someone-elses".to_string()),
        ]);
        // the team in its ledger's spelling: one cost-allocation value per team
        let tags = resource_tags(&mine, &id, &Team::parse("Team-A").unwrap(), "prod");
        assert_eq!(tags["project"], "x");
        assert_eq!(tags[MANAGED_TAG], "true");
        assert_eq!(tags[REQUEST_TAG], "r-1");
        assert_eq!(tags[TEAM_TAG], "team-a");
        assert_eq!(tags[DEPLOYMENT_TAG], "prod");
        assert_eq!(tags.len(), 5);
    }

    #[test]
    fn a_plan_name_carries_the_id_lower_cased_and_one_named_before_is_still_the_requests() {
        let (mixed, lower) = (
            RequestId::parse("Team-A-7").unwrap(),
            RequestId::parse("team-a-7").unwrap(),
        );
        let hash = deployment_hash("prod");
        // New names are the same for both spellings (review N15: SageMaker may fold case).
        assert_eq!(plan_name(&mixed, "prod", 2), format!("cp2-{hash}-team-a-7"));
        assert_eq!(plan_name(&mixed, "prod", 2), plan_name(&lower, "prod", 2));
        assert_eq!(
            plan_attempt(&plan_name(&mixed, "prod", 2), &mixed, &hash),
            Some(2)
        );
        // A plan named before, with the id as given, is still the request's (a purchase in
        // doubt across the upgrade), and only that spelling's.
        let before = format!("cp-{hash}-Team-A-7");
        assert_eq!(plan_attempt(&before, &mixed, &hash), Some(0));
        assert_eq!(plan_attempt(&before, &lower, &hash), None);
        assert_eq!(plan_name_hash(&before, &mixed), Some(hash.as_str()));
        assert_eq!(plan_request(&before, &hash), Some(mixed.clone()));
        assert_eq!(
            plan_request(&plan_name(&mixed, "prod", 0), &hash),
            Some(lower)
        );
    }

    #[test]
    fn a_plan_name_belongs_to_exactly_one_request_and_attempt() {
        let ids =
            ["r", "r-1", "r-1-2", "1", "1-r", "cp", "cp-r"].map(|i| RequestId::parse(i).unwrap());
        let (ours, theirs) = (deployment_hash("prod"), deployment_hash("staging"));
        for id in &ids {
            for attempt in [0, 1, 2, 10, 4_000_000_000] {
                let name = plan_name(id, "prod", attempt);
                for other in &ids {
                    let expect = (other == id).then_some(attempt);
                    assert_eq!(
                        plan_attempt(&name, other, &ours),
                        expect,
                        "{name} vs {other}"
                    );
                }
                // Another deployment's plan for the same request id is never ours.
                let other_stack = plan_name(id, "staging", attempt);
                assert_eq!(plan_attempt(&other_stack, id, &ours), None, "{other_stack}");
                assert_eq!(plan_attempt(&other_stack, id, &theirs), Some(attempt));
            }
        }
        let r = RequestId::parse("r").unwrap();
        // A name from before deployments were named is still found (in doubt across the
        // upgrade).
        assert_eq!(plan_attempt("cp-r", &r, &ours), Some(0));
        assert_eq!(plan_attempt("cp2-r", &r, &ours), Some(2));
        for not_ours in ["cp-r-1", "cp01-r", "cpx-r", "cp1r", "cp--r", "xcp-r"] {
            assert_eq!(plan_attempt(not_ours, &r, &ours), None, "{not_ours}");
        }
    }
}
