//! Deterministic names and tokens derived from a request, so that a repeated attempt
//! collides with (or returns) the first one instead of creating a second resource.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use super::request::RequestId;

/// Tag on everything we create; destructive IAM actions are conditioned on it.
pub const MANAGED_TAG: &str = "capacity-pilot:managed";
/// Tag naming the request a resource belongs to; reconciliation searches by it.
pub const REQUEST_TAG: &str = "capacity-pilot:request-id";

/// The tags on everything bought or launched for a request: the request's own tags, then
/// ours, which win (destructive IAM actions and reconciliation rely on them).
pub fn resource_tags(
    request_tags: &BTreeMap<String, String>,
    request_id: &RequestId,
) -> BTreeMap<String, String> {
    let mut tags = request_tags.clone();
    tags.insert(MANAGED_TAG.into(), "true".into());
    tags.insert(REQUEST_TAG.into(), request_id.to_string());
    tags
}

/// The training plan name for a request: a second `CreateTrainingPlan` with it fails with
/// `ResourceInUse` instead of buying again. `attempt` > 0 only after reconciliation has
/// shown that every earlier plan of the request is gone (failed payment, say).
///
/// Attempt 0 is `cp-<id>`, attempt n is `cp<n>-<id>`: the attempt sits before the id, so no
/// request's name can be another request's retry (`cp-a-1` is only ever request `a-1`).
pub fn plan_name(request_id: &RequestId, attempt: u32) -> String {
    // Request ids are at most 48 characters of [A-Za-z0-9-], so this fits SageMaker's
    // `[a-zA-Z0-9](-*[a-zA-Z0-9]){0,63}`.
    if attempt == 0 {
        format!("cp-{request_id}")
    } else {
        format!("cp{attempt}-{request_id}")
    }
}

/// The attempt whose [`plan_name`] `name` is for `request_id`, if it is one of them.
pub fn plan_attempt(name: &str, request_id: &RequestId) -> Option<u32> {
    let rest = name.strip_prefix("cp")?;
    let (attempt, id) = rest.split_once('-')?;
    if id != request_id.as_str() {
        return None;
    }
    match attempt {
        "" => Some(0),
        n if n.bytes().all(|b| b.is_ascii_digit()) && !n.starts_with('0') => n.parse().ok(),
        _ => None,
    }
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
    use super::*;

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
        for attempt in [0, 1, 99] {
            let n = plan_name(&id, attempt);
            assert!(n.len() <= 64, "{n}");
            assert!(n.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
            assert!(!n.ends_with('-'));
        }
        assert_eq!(plan_name(&RequestId::parse("r-1").unwrap(), 0), "cp-r-1");
    }

    #[test]
    fn resource_tags_keep_the_requests_and_ours_win() {
        let id = RequestId::parse("r-1").unwrap();
        let mine = BTreeMap::from([
            ("project".to_string(), "x".to_string()),
            (REQUEST_TAG.to_string(), "someone-else".to_string()),
        ]);
        let tags = resource_tags(&mine, &id);
        assert_eq!(tags["project"], "x");
        assert_eq!(tags[MANAGED_TAG], "true");
        assert_eq!(tags[REQUEST_TAG], "r-1");
        assert_eq!(tags.len(), 3);
    }

    #[test]
    fn a_plan_name_belongs_to_exactly_one_request_and_attempt() {
        let ids =
            ["r", "r-1", "r-1-2", "1", "1-r", "cp", "cp-r"].map(|i| RequestId::parse(i).unwrap());
        for id in &ids {
            for attempt in [0, 1, 2, 10, 4_000_000_000] {
                let name = plan_name(id, attempt);
                for other in &ids {
                    let expect = (other == id).then_some(attempt);
                    assert_eq!(plan_attempt(&name, other), expect, "{name} vs {other}");
                }
            }
        }
        let r = RequestId::parse("r").unwrap();
        for not_ours in ["cp-r-1", "cp01-r", "cpx-r", "cp1r", "cp--r", "xcp-r"] {
            assert_eq!(plan_attempt(not_ours, &r), None, "{not_ours}");
        }
    }
}
