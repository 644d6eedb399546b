//! Amazon SNS standard topics (awsQuery: a form body with `Action` and `Version=2010-03-31`, XML
//! answers in the `http://sns.amazonaws.com/doc/2010-03-31/` namespace): CreateTopic,
//! GetTopicAttributes, DeleteTopic, Publish, Subscribe, GetSubscriptionAttributes,
//! SetSubscriptionAttributes, Unsubscribe and ListSubscriptionsByTopic, per region and per account
//! (the caller's, as STS names it: [`World::identity_of`]).
//!
//! Nothing is sent anywhere: every accepted publish is recorded with the subscriptions it was
//! delivered to (the confirmed ones whose filter policy matches), for tests and the control API
//! (`GET /_local/sns/messages`). `email`, `email-json`, `http` and `https` subscriptions wait for a
//! confirmation that only the control API gives (`POST /_local/sns/subscriptions/confirm`,
//! standing in for the recipient clicking the link), and receive nothing until then.
//!
//! Filter policies follow "Amazon SNS message filtering" (SNS Developer Guide): an AND over the
//! policy's keys, an OR over each key's conditions, each condition true when one of the
//! attribute's values (a `String.Array`'s elements) satisfies it.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{Value, json};

use crate::cloudformation::invalid_action;
use crate::error::ApiError;
use crate::query::Query;
use crate::sts::CallerIdentity;
use crate::util::event_time;
use crate::world::World;
use crate::xml::{El, el, members};

/// The namespace of SNS's answers.
pub const XMLNS: &str = "http://sns.amazonaws.com/doc/2010-03-31/";

/// The most a message's body plus its attributes' names, types and values may weigh, unless the
/// topic's `MaximumMessageSize` says otherwise (SNS API Reference: Publish, "By default, a
/// message can be at most 256 KiB in size (262,144 bytes, not 262,144 characters)").
pub const MAX_MESSAGE_BYTES: usize = 262_144;

/// A `Subject` must be shorter than this (SNS API Reference: Publish, "less than 100 characters
/// long").
pub const SUBJECT_LIMIT_CHARS: usize = 100;

/// A filter policy's most keys (SNS Developer Guide: "Filter policy constraints", "A filter
/// policy can have a maximum of five keys").
pub const MAX_POLICY_KEYS: usize = 5;

/// A filter policy's most value combinations (the same page: "The total combination of values in
/// a filter policy must not exceed 150").
pub const MAX_POLICY_COMBINATIONS: usize = 150;

/// A filter policy's most bytes (the same page: "The maximum size of a filter policy is 256 KB").
pub const MAX_POLICY_BYTES: usize = 256 * 1024;

/// What Subscribe answers for a subscription awaiting confirmation without
/// `ReturnSubscriptionArn`.
pub const PENDING_CONFIRMATION: &str = "pending confirmation";

/// How ListSubscriptionsByTopic shows a pending subscription's ARN.
const PENDING_LISTED: &str = "PendingConfirmation";

/// The protocols modelled; `email`, `email-json`, `http` and `https` need a confirmation.
const PROTOCOLS: [&str; 6] = ["email", "email-json", "sqs", "lambda", "https", "http"];

/// Protocols SNS has that local-cloud does not model.
const UNMODELLED_PROTOCOLS: [&str; 3] = ["sms", "application", "firehose"];

/// Topic attributes CreateTopic takes for a standard topic.
const TOPIC_ATTRIBUTES: [&str; 8] = [
    "DisplayName",
    "Policy",
    "DeliveryPolicy",
    "KmsMasterKeyId",
    "SignatureVersion",
    "TracingConfig",
    "MaximumMessageSize",
    "FifoTopic",
];

/// Subscription attributes stored as given but not acted on (no delivery is ever retried).
const OPAQUE_SUBSCRIPTION_ATTRIBUTES: [&str; 4] = [
    "DeliveryPolicy",
    "RedrivePolicy",
    "SubscriptionRoleArn",
    "ReplayPolicy",
];

/// SNS's state: topics by ARN, subscriptions in creation order, every accepted publish.
#[derive(Debug, Default)]
pub struct SnsState {
    pub topics: BTreeMap<String, Topic>,
    pub subscriptions: Vec<Subscription>,
    pub messages: Vec<Published>,
}

/// A standard topic.
#[derive(Debug, Clone, Serialize)]
pub struct Topic {
    pub arn: String,
    pub name: String,
    pub region: String,
    /// The account that created it.
    pub owner: String,
    /// The attributes given at creation (`DisplayName`, `KmsMasterKeyId`, ...).
    pub attributes: BTreeMap<String, String>,
    pub tags: BTreeMap<String, String>,
    pub created: DateTime<Utc>,
    /// How many of its subscriptions were unsubscribed.
    pub subscriptions_deleted: u64,
}

/// Where a subscription's filter policy looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum FilterScope {
    MessageAttributes,
    MessageBody,
}

impl FilterScope {
    fn parse(v: &str) -> Option<FilterScope> {
        match v {
            "MessageAttributes" => Some(FilterScope::MessageAttributes),
            "MessageBody" => Some(FilterScope::MessageBody),
            _ => None,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            FilterScope::MessageAttributes => "MessageAttributes",
            FilterScope::MessageBody => "MessageBody",
        }
    }
}

/// A subscription of a topic.
#[derive(Debug, Clone)]
pub struct Subscription {
    /// `<topic arn>:<id>`.
    pub arn: String,
    pub topic_arn: String,
    pub protocol: String,
    pub endpoint: String,
    /// Whether it receives messages: `sqs` and `lambda` at once, the others once confirmed.
    pub confirmed: bool,
    /// The filter policy as given.
    pub filter_policy: Option<String>,
    pub filter_policy_scope: FilterScope,
    pub raw_message_delivery: bool,
    /// The account that subscribed.
    pub owner: String,
    /// The identity that subscribed.
    pub principal: String,
    /// `DeliveryPolicy`, `RedrivePolicy`, ... as given: stored, shown, never acted on.
    pub other_attributes: BTreeMap<String, String>,
    policy: Option<FilterPolicy>,
}

impl Subscription {
    /// Whether a message with these attributes and body passes the filter policy (none: all do).
    pub fn accepts(&self, attributes: &BTreeMap<String, MessageAttribute>, body: &str) -> bool {
        let Some(policy) = &self.policy else {
            return true;
        };
        match self.filter_policy_scope {
            FilterScope::MessageAttributes => policy.matches(&attribute_fields(attributes)),
            FilterScope::MessageBody => match serde_json::from_str::<Value>(body) {
                Ok(v @ Value::Object(_)) => {
                    let mut fields = BTreeMap::new();
                    body_fields(&v, "", &mut fields);
                    policy.matches(&fields)
                }
                // "Filter policies for the message body assume that the message payload is a
                // well-formed JSON object"
                _ => false,
            },
        }
    }

    /// The control API's picture.
    pub fn to_json(&self) -> Value {
        json!({
            "subscription_arn": self.arn,
            "topic_arn": self.topic_arn,
            "protocol": self.protocol,
            "endpoint": self.endpoint,
            "confirmed": self.confirmed,
            "filter_policy": self.filter_policy.as_deref().map(|p| {
                serde_json::from_str::<Value>(p).unwrap_or_else(|_| Value::String(p.to_string()))
            }),
            "filter_policy_scope": self.filter_policy_scope.as_str(),
            "raw_message_delivery": self.raw_message_delivery,
        })
    }
}

/// One message attribute as published: its `DataType` and its `StringValue` (a `Binary`'s
/// `BinaryValue`, base64, as sent).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MessageAttribute {
    pub data_type: String,
    pub value: String,
}

/// An accepted publish and where it went.
#[derive(Debug, Clone)]
pub struct Published {
    pub topic_arn: String,
    pub message_id: String,
    pub subject: Option<String>,
    pub message: String,
    pub attributes: BTreeMap<String, MessageAttribute>,
    /// The emulator's clock when it was accepted.
    pub at: DateTime<Utc>,
    /// The subscriptions it was delivered to, in subscription order: exactly once each.
    pub deliveries: Vec<String>,
}

impl Published {
    /// The control API's picture.
    pub fn to_json(&self) -> Value {
        json!({
            "topic_arn": self.topic_arn,
            "message_id": self.message_id,
            "subject": self.subject,
            "message": self.message,
            "attributes": self.attributes.iter().map(|(k, a)| (k.clone(), a.value.clone())).collect::<BTreeMap<_, _>>(),
            "attribute_types": self.attributes.iter().map(|(k, a)| (k.clone(), a.data_type.clone())).collect::<BTreeMap<_, _>>(),
            "at": event_time(self.at),
            "deliveries": self.deliveries,
        })
    }
}

impl SnsState {
    /// Every topic and subscription, and how many messages, for the snapshot.
    pub fn snapshot(&self) -> Value {
        json!({
            "topics": self.topics.values().collect::<Vec<_>>(),
            "subscriptions": self.subscriptions.iter().map(Subscription::to_json).collect::<Vec<_>>(),
            "messages": self.messages.len(),
        })
    }
}

// ---- errors ---------------------------------------------------------------------------------

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::new(400, "InvalidParameter", message)
}

/// `InvalidParameterValueException`, whose wire code is `ParameterValueInvalid`.
fn value_invalid(message: impl Into<String>) -> ApiError {
    ApiError::new(400, "ParameterValueInvalid", message)
}

fn topic_not_found() -> ApiError {
    ApiError::new(404, "NotFound", "Topic does not exist")
}

fn subscription_not_found() -> ApiError {
    ApiError::new(404, "NotFound", "Subscription does not exist")
}

/// A required member absent: the validation layer's answer.
fn missing(member: &str) -> ApiError {
    ApiError::new(
        400,
        "ValidationError",
        format!(
            "1 validation error detected: Value null at '{member}' failed to satisfy constraint: \
             Member must not be null"
        ),
    )
}

fn not_authorized(caller: &CallerIdentity, action: &str, arn: &str) -> ApiError {
    ApiError::new(
        403,
        "AuthorizationError",
        format!(
            "User: {} is not authorized to perform: SNS:{action} on resource: {arn} because no \
             resource-based policy allows the SNS:{action} action",
            caller.arn
        ),
    )
}

// ---- request helpers ------------------------------------------------------------------------

/// A parameter as sent, an empty value included (`Query::get` treats an empty value as
/// absent; SNS tells `Subject=` from no `Subject`).
fn raw<'a>(q: &'a Query, key: &str) -> Option<&'a str> {
    q.pairs()
        .find(|(k, _)| k.as_str() == key)
        .map(|(_, v)| v.as_str())
}

/// An awsQuery map `Prefix.entry.N.key` / `Prefix.entry.N.value` (the SDK's `Attributes`).
fn string_map(q: &Query, prefix: &str) -> Result<BTreeMap<String, String>, ApiError> {
    let mut out = BTreeMap::new();
    for n in 1..=q.count(&format!("{prefix}.entry")) {
        let k = raw(q, &format!("{prefix}.entry.{n}.key")).unwrap_or_default();
        let v = raw(q, &format!("{prefix}.entry.{n}.value")).unwrap_or_default();
        if out.insert(k.to_string(), v.to_string()).is_some() {
            return Err(invalid(
                "Invalid parameter: Duplicated keys are not allowed.",
            ));
        }
    }
    Ok(out)
}

/// `Tags.member.N.Key` / `.Value`.
fn topic_tags(q: &Query) -> BTreeMap<String, String> {
    (1..=q.count("Tags.member"))
        .map(|n| {
            (
                raw(q, &format!("Tags.member.{n}.Key"))
                    .unwrap_or_default()
                    .to_string(),
                raw(q, &format!("Tags.member.{n}.Value"))
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect()
}

/// CreateTopic's name rule: 1-256 of ASCII letters, digits, `-` and `_` (SNS API Reference:
/// CreateTopic).
pub fn valid_topic_name(name: &str) -> bool {
    (1..=256).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// A `TopicArn` of this region: `arn:aws:sns:<region>:<account>:<name>`. Fewer than six
/// elements is SNS's "An ARN must have at least 6 elements" answer; another service or region
/// its bare "Invalid parameter: TopicArn".
fn check_topic_arn(arn: &str, region: &str) -> Result<(), ApiError> {
    let parts: Vec<&str> = arn.split(':').collect();
    if parts.len() < 6 {
        return Err(invalid(format!(
            "Invalid parameter: TopicArn Reason: An ARN must have at least 6 elements, not {}",
            parts.len()
        )));
    }
    if parts.len() != 6 || parts[0] != "arn" || parts[2] != "sns" || parts[3] != region {
        return Err(invalid("Invalid parameter: TopicArn"));
    }
    Ok(())
}

/// A `SubscriptionArn`: `<topic arn>:<id>`.
fn check_subscription_arn(arn: &str) -> Result<(), ApiError> {
    let parts: Vec<&str> = arn.split(':').collect();
    match parts.len() {
        n if n < 6 => Err(invalid(format!(
            "Invalid parameter: SubscriptionArn Reason: An ARN must have at least 6 elements, \
             not {n}"
        ))),
        6 => Err(invalid("Invalid parameter: SubscriptionId")),
        _ => Ok(()),
    }
}

/// Raw message delivery's value: `true`/`false` in any case.
fn parse_raw(v: &str) -> Option<bool> {
    match v.to_ascii_lowercase().as_str() {
        "true" => Some(true),
        "false" => Some(false),
        _ => None,
    }
}

/// A Subject SNS takes: 1-99 printable ASCII characters, the first a letter, number or
/// punctuation mark (SNS API Reference: Publish).
pub fn valid_subject(s: &str) -> bool {
    !s.is_empty()
        && s.chars().count() < SUBJECT_LIMIT_CHARS
        && s.chars().all(|c| c.is_ascii() && !c.is_ascii_control())
        && s.chars().next().is_some_and(|c| c.is_ascii_graphic())
}

/// Bytes in a base64 text once decoded, or None when it is not base64.
fn base64_len(s: &str) -> Option<usize> {
    let s = s.trim_end_matches('=');
    if !s
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '+' || c == '/')
    {
        return None;
    }
    Some(s.len() * 3 / 4)
}

/// A message attribute's `DataType`: `String`, `Number` or `Binary`, optionally followed by `.`
/// and a custom label (`String.Array`, `Number.float`).
fn valid_data_type(dt: &str) -> bool {
    ["String", "Number", "Binary"].iter().any(|base| {
        dt == *base
            || dt
                .strip_prefix(base)
                .and_then(|rest| rest.strip_prefix('.'))
                .is_some_and(|label| !label.is_empty())
    })
}

fn base_type(dt: &str) -> &str {
    dt.split('.').next().unwrap_or(dt)
}

/// Checks a message attribute name as SNS does.
fn check_attribute_name(name: &str) -> Result<(), ApiError> {
    if name.is_empty() {
        return Err(value_invalid(
            "The request must contain non-empty message attribute name.",
        ));
    }
    if name.len() >= 256 {
        return Err(value_invalid(
            "Length of message attribute name must be less than 256 bytes.",
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(value_invalid(format!(
            "Invalid non-alphanumeric character '#x{:X}' was found in the message attribute name. \
             Can only include alphanumeric characters, hyphens, underscores, or dots.",
            c as u32
        )));
    }
    if name.starts_with('.') {
        return Err(value_invalid(
            "Invalid message attribute name starting with character '.' was found.",
        ));
    }
    if name.ends_with('.') {
        return Err(value_invalid(
            "Invalid message attribute name ending with character '.' was found.",
        ));
    }
    if name.contains("..") {
        return Err(value_invalid(
            "Message attribute name can not have successive '.' character.",
        ));
    }
    let lower = name.to_ascii_lowercase();
    if lower.starts_with("aws.") || lower.starts_with("amazon.") {
        return Err(value_invalid(format!(
            "The message attribute name '{name}' is reserved: names starting with 'AWS.' or \
             'Amazon.' are reserved for use by Amazon Web Services."
        )));
    }
    Ok(())
}

/// `MessageAttributes.entry.N.Name` / `.Value.DataType` / `.Value.StringValue` /
/// `.Value.BinaryValue`, checked as SNS checks them.
fn message_attributes(q: &Query) -> Result<BTreeMap<String, MessageAttribute>, ApiError> {
    let mut out = BTreeMap::new();
    for n in 1..=q.count("MessageAttributes.entry") {
        let key = |k: &str| raw(q, &format!("MessageAttributes.entry.{n}.{k}"));
        let name = key("Name").unwrap_or_default();
        let Some(dt) = key("Value.DataType") else {
            return Err(missing(&format!(
                "messageAttributes.{name}.member.dataType"
            )));
        };
        check_attribute_name(name)?;
        if !valid_data_type(dt) {
            return Err(value_invalid(format!(
                "The message attribute '{name}' has an invalid message attribute type, the set of \
                 supported type prefixes is Binary, Number, and String."
            )));
        }
        let string = key("Value.StringValue");
        let binary = key("Value.BinaryValue");
        let base = base_type(dt);
        let value = if base == "Binary" {
            match (binary, string) {
                (Some(b), _) if !b.is_empty() => {
                    if base64_len(b).is_none() {
                        return Err(value_invalid(format!(
                            "The message attribute '{name}' with type 'Binary' must be base64."
                        )));
                    }
                    b
                }
                (None, Some(_)) => {
                    return Err(value_invalid(format!(
                        "The message attribute '{name}' with type 'Binary' must use field 'Binary'."
                    )));
                }
                _ => {
                    return Err(value_invalid(format!(
                        "The message attribute '{name}' must contain non-empty message attribute \
                         value for message attribute type 'Binary'."
                    )));
                }
            }
        } else {
            match (string, binary) {
                (Some(s), _) if !s.is_empty() => s,
                (None, Some(_)) => {
                    return Err(value_invalid(format!(
                        "The message attribute '{name}' with type '{base}' must use field 'String'."
                    )));
                }
                _ => {
                    return Err(value_invalid(format!(
                        "The message attribute '{name}' must contain non-empty message attribute \
                         value for message attribute type '{base}'."
                    )));
                }
            }
        };
        if base == "Number" && !value.trim().parse::<f64>().is_ok_and(f64::is_finite) {
            return Err(value_invalid(format!(
                "The message attribute '{name}' with type 'Number' must contain a number, not \
                 '{value}'."
            )));
        }
        out.insert(
            name.to_string(),
            MessageAttribute {
                data_type: dt.to_string(),
                value: value.to_string(),
            },
        );
    }
    Ok(out)
}

/// A message's weight against the size limit: its body plus each attribute's name, data type
/// and value (a binary value decoded), in bytes.
pub fn message_bytes(message: &str, attributes: &BTreeMap<String, MessageAttribute>) -> usize {
    message.len()
        + attributes
            .iter()
            .map(|(name, a)| {
                let value = if base_type(&a.data_type) == "Binary" {
                    base64_len(&a.value).unwrap_or(a.value.len())
                } else {
                    a.value.len()
                };
                name.len() + a.data_type.len() + value
            })
            .sum::<usize>()
}

// ---- the operations -------------------------------------------------------------------------

impl World {
    /// Routes one SNS operation: the children of its `<{op}Result>` (none for an operation
    /// that answers nothing). `access_key_id` is the signature's; the caller's account (from
    /// STS's model) owns what it creates.
    pub fn sns_call(
        &mut self,
        access_key_id: Option<&str>,
        region: &str,
        op: &str,
        q: &Query,
    ) -> Result<Vec<El>, ApiError> {
        self.settle();
        let Some(akid) = access_key_id else {
            return Err(ApiError::new(
                403,
                "MissingAuthenticationToken",
                "Request is missing Authentication Token",
            ));
        };
        let caller = self.identity_of(akid);
        match op {
            "CreateTopic" => self.sns_create_topic(&caller, region, q),
            "GetTopicAttributes" => self.sns_get_topic_attributes(&caller, region, q),
            "DeleteTopic" => self.sns_delete_topic(&caller, region, q),
            "Publish" => self.sns_publish(&caller, region, q),
            "Subscribe" => self.sns_subscribe(&caller, region, q),
            "GetSubscriptionAttributes" => self.sns_get_subscription_attributes(q),
            "SetSubscriptionAttributes" => self.sns_set_subscription_attributes(q),
            "Unsubscribe" => self.sns_unsubscribe(q),
            "ListSubscriptionsByTopic" => self.sns_list_subscriptions_by_topic(&caller, region, q),
            other => Err(invalid_action(other, q)),
        }
    }

    /// The topic `arn`, if the caller may act on it (its own account's).
    fn sns_topic(
        &self,
        caller: &CallerIdentity,
        arn: &str,
        action: &str,
    ) -> Result<&Topic, ApiError> {
        let topic = self.sns.topics.get(arn).ok_or_else(topic_not_found)?;
        if topic.owner != caller.account {
            return Err(not_authorized(caller, action, arn));
        }
        Ok(topic)
    }

    /// CreateTopic: idempotent on the name (within the region and account); the same name with
    /// other attributes or tags is refused.
    fn sns_create_topic(
        &mut self,
        caller: &CallerIdentity,
        region: &str,
        q: &Query,
    ) -> Result<Vec<El>, ApiError> {
        let name = raw(q, "Name").ok_or_else(|| missing("name"))?;
        let mut attributes = string_map(q, "Attributes")?;
        let tags = topic_tags(q);
        let fifo = attributes
            .get("FifoTopic")
            .is_some_and(|v| v.eq_ignore_ascii_case("true"));
        if fifo && name.ends_with(".fifo") {
            return Err(invalid(
                "Invalid parameter: FifoTopic Reason: FIFO topics are not modelled by local-cloud",
            ));
        }
        if fifo || !valid_topic_name(name) {
            return Err(invalid("Invalid parameter: Topic Name"));
        }
        // `FifoTopic=false` is a standard topic: not kept as an attribute
        attributes.remove("FifoTopic");
        for (k, v) in &attributes {
            let feedback = ["Application", "HTTP", "Firehose", "Lambda", "SQS"]
                .iter()
                .any(|p| {
                    k.strip_prefix(p).is_some_and(|rest| {
                        matches!(
                            rest,
                            "SuccessFeedbackRoleArn"
                                | "SuccessFeedbackSampleRate"
                                | "FailureFeedbackRoleArn"
                        )
                    })
                });
            if !feedback && !TOPIC_ATTRIBUTES.contains(&k.as_str()) {
                return Err(invalid(format!(
                    "Invalid parameter: Attributes Reason: Invalid attribute name: {k}"
                )));
            }
            if k == "MaximumMessageSize"
                && !v
                    .parse::<usize>()
                    .is_ok_and(|n| (1024..=1_048_576).contains(&n))
            {
                return Err(invalid(format!(
                    "Invalid parameter: Attributes Reason: MaximumMessageSize: Invalid value \
                     [{v}]. Must be an integer between 1024 and 1048576"
                )));
            }
        }
        let arn = format!("arn:aws:sns:{region}:{}:{name}", caller.account);
        if let Some(t) = self.sns.topics.get(&arn) {
            if attributes
                .iter()
                .any(|(k, v)| t.attributes.get(k) != Some(v))
            {
                return Err(invalid(
                    "Invalid parameter: Attributes Reason: Topic already exists with different \
                     attributes",
                ));
            }
            if !tags.is_empty() && tags != t.tags {
                return Err(invalid(
                    "Invalid parameter: Tags Reason: Topic already exists with different tags",
                ));
            }
        } else {
            let topic = Topic {
                arn: arn.clone(),
                name: name.to_string(),
                region: region.to_string(),
                owner: caller.account.clone(),
                attributes,
                tags,
                created: self.now,
                subscriptions_deleted: 0,
            };
            self.sns.topics.insert(arn.clone(), topic);
        }
        Ok(vec![El::leaf("TopicArn", arn)])
    }

    fn sns_get_topic_attributes(
        &self,
        caller: &CallerIdentity,
        region: &str,
        q: &Query,
    ) -> Result<Vec<El>, ApiError> {
        let arn = raw(q, "TopicArn").ok_or_else(|| missing("topicArn"))?;
        check_topic_arn(arn, region)?;
        let topic = self.sns_topic(caller, arn, "GetTopicAttributes")?;
        let subs = self.sns.subscriptions.iter().filter(|s| s.topic_arn == arn);
        let (confirmed, pending) =
            subs.fold(
                (0, 0),
                |(c, p), s| {
                    if s.confirmed { (c + 1, p) } else { (c, p + 1) }
                },
            );
        let mut attrs: BTreeMap<String, String> = BTreeMap::from([
            ("TopicArn".into(), topic.arn.clone()),
            ("Owner".into(), topic.owner.clone()),
            ("DisplayName".into(), String::new()),
            ("Policy".into(), default_topic_policy(topic)),
            (
                "EffectiveDeliveryPolicy".into(),
                DEFAULT_DELIVERY_POLICY.to_string(),
            ),
            ("SubscriptionsConfirmed".into(), confirmed.to_string()),
            ("SubscriptionsPending".into(), pending.to_string()),
            (
                "SubscriptionsDeleted".into(),
                topic.subscriptions_deleted.to_string(),
            ),
        ]);
        attrs.extend(topic.attributes.clone());
        Ok(vec![attribute_map("Attributes", &attrs)])
    }

    /// DeleteTopic: the topic and its subscriptions go; a topic that does not exist is no
    /// error.
    fn sns_delete_topic(
        &mut self,
        caller: &CallerIdentity,
        region: &str,
        q: &Query,
    ) -> Result<Vec<El>, ApiError> {
        let arn = raw(q, "TopicArn").ok_or_else(|| missing("topicArn"))?;
        check_topic_arn(arn, region)?;
        if self.sns.topics.contains_key(arn) {
            self.sns_topic(caller, arn, "DeleteTopic")?;
            self.sns.topics.remove(arn);
            self.sns.subscriptions.retain(|s| s.topic_arn != arn);
        }
        Ok(Vec::new())
    }

    /// Publish to a topic: checked, recorded with the emulator's clock, and delivered (recorded
    /// as delivered) once to each confirmed subscription whose filter policy matches.
    fn sns_publish(
        &mut self,
        caller: &CallerIdentity,
        region: &str,
        q: &Query,
    ) -> Result<Vec<El>, ApiError> {
        let message = raw(q, "Message").ok_or_else(|| missing("message"))?;
        if raw(q, "TargetArn").is_some() || raw(q, "PhoneNumber").is_some() {
            return Err(invalid(
                "Invalid parameter: TargetArn Reason: publishing to a platform endpoint or a \
                 phone number is not modelled by local-cloud",
            ));
        }
        let Some(arn) = raw(q, "TopicArn") else {
            return Err(invalid(
                "Invalid parameter: TopicArn or TargetArn Reason: no value for required parameter",
            ));
        };
        check_topic_arn(arn, region)?;
        if let Some(structure) = raw(q, "MessageStructure") {
            return Err(invalid(format!(
                "Invalid parameter: MessageStructure Reason: MessageStructure {structure} is not \
                 modelled by local-cloud"
            )));
        }
        if raw(q, "MessageDeduplicationId").is_some() {
            return Err(invalid(
                "Invalid parameter: MessageDeduplicationId Reason: The request includes \
                 MessageDeduplicationId parameter that is not valid for this topic type",
            ));
        }
        if message.is_empty() {
            return Err(invalid("Invalid parameter: Empty message"));
        }
        let subject = raw(q, "Subject");
        if subject.is_some_and(|s| !valid_subject(s)) {
            return Err(invalid("Invalid parameter: Subject"));
        }
        let attributes = message_attributes(q)?;
        let topic = self.sns_topic(caller, arn, "Publish")?;
        let limit = topic
            .attributes
            .get("MaximumMessageSize")
            .and_then(|v| v.parse().ok())
            .unwrap_or(MAX_MESSAGE_BYTES);
        if message_bytes(message, &attributes) > limit {
            return Err(invalid("Invalid parameter: Message too long"));
        }
        let deliveries = self
            .sns
            .subscriptions
            .iter()
            .filter(|s| s.topic_arn == arn && s.confirmed && s.accepts(&attributes, message))
            .map(|s| s.arn.clone())
            .collect();
        let message_id = self.next_uuid("sns-message");
        tracing::debug!(topic = arn, message_id, "sns publish");
        self.sns.messages.push(Published {
            topic_arn: arn.to_string(),
            message_id: message_id.clone(),
            subject: subject.map(str::to_string),
            message: message.to_string(),
            attributes,
            at: self.now,
            deliveries,
        });
        Ok(vec![El::leaf("MessageId", message_id)])
    }

    /// Subscribe: idempotent on (topic, protocol, endpoint) unless the attributes differ.
    fn sns_subscribe(
        &mut self,
        caller: &CallerIdentity,
        region: &str,
        q: &Query,
    ) -> Result<Vec<El>, ApiError> {
        let arn = raw(q, "TopicArn").ok_or_else(|| missing("topicArn"))?;
        let protocol = raw(q, "Protocol").ok_or_else(|| missing("protocol"))?;
        check_topic_arn(arn, region)?;
        if UNMODELLED_PROTOCOLS.contains(&protocol) {
            return Err(invalid(format!(
                "Invalid parameter: Protocol Reason: the {protocol} protocol is not modelled by \
                 local-cloud"
            )));
        }
        if !PROTOCOLS.contains(&protocol) {
            return Err(invalid(format!(
                "Invalid parameter: Amazon SNS does not support this protocol string: {protocol}"
            )));
        }
        let endpoint = raw(q, "Endpoint").unwrap_or_default();
        check_endpoint(protocol, endpoint)?;
        let given = string_map(q, "Attributes")?;
        let attrs = SubscriptionAttributes::parse(protocol, &given)?;
        self.sns_topic(caller, arn, "Subscribe")?;
        let return_arn = q.bool("ReturnSubscriptionArn");
        let answer = |s: &Subscription| {
            let shown = if s.confirmed || return_arn {
                s.arn.clone()
            } else {
                PENDING_CONFIRMATION.to_string()
            };
            Ok(vec![El::leaf("SubscriptionArn", shown)])
        };
        if let Some(existing) = self
            .sns
            .subscriptions
            .iter()
            .find(|s| s.topic_arn == arn && s.protocol == protocol && s.endpoint == endpoint)
        {
            if !attrs.same_as(existing, &given) {
                return Err(invalid(
                    "Invalid parameter: Attributes Reason: Subscription already exists with \
                     different attributes",
                ));
            }
            return answer(existing);
        }
        let id = self.next_uuid("sns-subscription");
        let sub = Subscription {
            arn: format!("{arn}:{id}"),
            topic_arn: arn.to_string(),
            protocol: protocol.to_string(),
            endpoint: endpoint.to_string(),
            confirmed: matches!(protocol, "sqs" | "lambda"),
            filter_policy: attrs.filter_policy,
            filter_policy_scope: attrs.scope.unwrap_or(FilterScope::MessageAttributes),
            raw_message_delivery: attrs.raw.unwrap_or(false),
            owner: caller.account.clone(),
            principal: caller.arn.clone(),
            other_attributes: attrs.other,
            policy: attrs.policy,
        };
        let out = answer(&sub);
        self.sns.subscriptions.push(sub);
        out
    }

    fn sns_subscription(&self, q: &Query) -> Result<&Subscription, ApiError> {
        let arn = raw(q, "SubscriptionArn").ok_or_else(|| missing("subscriptionArn"))?;
        check_subscription_arn(arn)?;
        self.sns
            .subscriptions
            .iter()
            .find(|s| s.arn == arn)
            .ok_or_else(subscription_not_found)
    }

    fn sns_get_subscription_attributes(&self, q: &Query) -> Result<Vec<El>, ApiError> {
        let s = self.sns_subscription(q)?;
        let mut attrs: BTreeMap<String, String> = BTreeMap::from([
            ("SubscriptionArn".into(), s.arn.clone()),
            ("TopicArn".into(), s.topic_arn.clone()),
            ("Owner".into(), s.owner.clone()),
            ("Protocol".into(), s.protocol.clone()),
            ("Endpoint".into(), s.endpoint.clone()),
            ("PendingConfirmation".into(), (!s.confirmed).to_string()),
            (
                "ConfirmationWasAuthenticated".into(),
                s.confirmed.to_string(),
            ),
            (
                "RawMessageDelivery".into(),
                s.raw_message_delivery.to_string(),
            ),
            ("SubscriptionPrincipal".into(), s.principal.clone()),
        ]);
        if let Some(p) = &s.filter_policy {
            attrs.insert("FilterPolicy".into(), p.clone());
            attrs.insert(
                "FilterPolicyScope".into(),
                s.filter_policy_scope.as_str().into(),
            );
        }
        attrs.extend(s.other_attributes.clone());
        Ok(vec![attribute_map("Attributes", &attrs)])
    }

    /// SetSubscriptionAttributes: `FilterPolicy` (empty: removed), `FilterPolicyScope`,
    /// `RawMessageDelivery`, and the stored-only ones.
    fn sns_set_subscription_attributes(&mut self, q: &Query) -> Result<Vec<El>, ApiError> {
        let name = raw(q, "AttributeName").ok_or_else(|| missing("attributeName"))?;
        let value = raw(q, "AttributeValue").unwrap_or_default();
        let arn = self.sns_subscription(q)?.arn.clone();
        let i = self
            .sns
            .subscriptions
            .iter()
            .position(|s| s.arn == arn)
            .expect("just found");
        let s = &mut self.sns.subscriptions[i];
        match name {
            "FilterPolicy" => {
                if value.is_empty() {
                    s.filter_policy = None;
                    s.policy = None;
                } else {
                    let policy = FilterPolicy::parse(value, s.filter_policy_scope)
                        .map_err(|e| e.error("Invalid parameter: FilterPolicy: "))?;
                    s.filter_policy = Some(value.to_string());
                    s.policy = Some(policy);
                }
            }
            "FilterPolicyScope" => {
                let scope = FilterScope::parse(value).ok_or_else(|| {
                    invalid(format!(
                        "Invalid parameter: FilterPolicyScope: Invalid value [{value}]. Please use \
                         either MessageBody or MessageAttributes"
                    ))
                })?;
                if let Some(text) = &s.filter_policy {
                    s.policy = Some(
                        FilterPolicy::parse(text, scope)
                            .map_err(|e| e.error("Invalid parameter: FilterPolicy: "))?,
                    );
                }
                s.filter_policy_scope = scope;
            }
            "RawMessageDelivery" => {
                let raw = parse_raw(value).ok_or_else(|| {
                    invalid(format!(
                        "Invalid parameter: RawMessageDelivery: Invalid value [{value}]. Must be \
                         true or false."
                    ))
                })?;
                if raw && !raw_capable(&s.protocol) {
                    return Err(invalid(format!(
                        "Invalid parameter: Delivery protocol [{}] does not support raw message \
                         delivery.",
                        s.protocol
                    )));
                }
                s.raw_message_delivery = raw;
            }
            other if OPAQUE_SUBSCRIPTION_ATTRIBUTES.contains(&other) => {
                if value.is_empty() {
                    s.other_attributes.remove(other);
                } else {
                    s.other_attributes
                        .insert(other.to_string(), value.to_string());
                }
            }
            _ => return Err(invalid("Invalid parameter: AttributeName")),
        }
        Ok(Vec::new())
    }

    /// Unsubscribe: a subscription that does not exist (any more) is no error.
    fn sns_unsubscribe(&mut self, q: &Query) -> Result<Vec<El>, ApiError> {
        let arn = raw(q, "SubscriptionArn").ok_or_else(|| missing("subscriptionArn"))?;
        check_subscription_arn(arn)?;
        if let Some(i) = self.sns.subscriptions.iter().position(|s| s.arn == arn) {
            let s = self.sns.subscriptions.remove(i);
            if let Some(t) = self.sns.topics.get_mut(&s.topic_arn) {
                t.subscriptions_deleted += 1;
            }
        }
        Ok(Vec::new())
    }

    /// Every subscription of a topic in one page (SNS pages by 100; no `NextToken` is ever
    /// answered, and one given is refused).
    fn sns_list_subscriptions_by_topic(
        &self,
        caller: &CallerIdentity,
        region: &str,
        q: &Query,
    ) -> Result<Vec<El>, ApiError> {
        let arn = raw(q, "TopicArn").ok_or_else(|| missing("topicArn"))?;
        check_topic_arn(arn, region)?;
        self.sns_topic(caller, arn, "ListSubscriptionsByTopic")?;
        if raw(q, "NextToken").is_some() {
            return Err(invalid("Invalid parameter: NextToken"));
        }
        let subs = self
            .sns
            .subscriptions
            .iter()
            .filter(|s| s.topic_arn == arn)
            .map(|s| {
                el("member")
                    .v(
                        "SubscriptionArn",
                        if s.confirmed {
                            s.arn.as_str()
                        } else {
                            PENDING_LISTED
                        },
                    )
                    .v("Owner", &s.owner)
                    .v("Protocol", &s.protocol)
                    .v("Endpoint", &s.endpoint)
                    .v("TopicArn", &s.topic_arn)
            });
        Ok(vec![members("Subscriptions", subs)])
    }

    // ---- control --------------------------------------------------------------------------

    /// Control: confirms pending subscriptions, as the recipient following the confirmation
    /// link would: the one with `subscription_arn`, or every one of `topic_arn` to `endpoint`.
    /// Returns the ARNs confirmed (a confirmed one again is no error); none found is
    /// `NotFound`.
    pub fn confirm_sns_subscriptions(
        &mut self,
        subscription_arn: Option<&str>,
        topic_arn: Option<&str>,
        endpoint: Option<&str>,
    ) -> Result<Vec<String>, ApiError> {
        let matches = |s: &Subscription| match (subscription_arn, topic_arn, endpoint) {
            (Some(arn), _, _) => s.arn == arn,
            (None, Some(t), Some(e)) => s.topic_arn == t && s.endpoint == e,
            _ => false,
        };
        if subscription_arn.is_none() && (topic_arn.is_none() || endpoint.is_none()) {
            return Err(ApiError::new(
                400,
                "BadRequest",
                "name a subscription_arn, or a topic_arn and an endpoint",
            ));
        }
        let mut confirmed = Vec::new();
        for s in self.sns.subscriptions.iter_mut().filter(|s| matches(s)) {
            s.confirmed = true;
            confirmed.push(s.arn.clone());
        }
        if confirmed.is_empty() {
            return Err(ApiError::new(
                404,
                "NotFound",
                "no subscription matches: Subscription does not exist",
            ));
        }
        Ok(confirmed)
    }

    /// Every accepted publish, oldest first, in the control API's shape.
    pub fn sns_messages(&self) -> Vec<Value> {
        self.sns.messages.iter().map(Published::to_json).collect()
    }

    /// Every subscription, in creation order, in the control API's shape.
    pub fn sns_subscriptions(&self) -> Vec<Value> {
        self.sns
            .subscriptions
            .iter()
            .map(Subscription::to_json)
            .collect()
    }
}

/// Protocols that can take raw message delivery (SNS Developer Guide: "Amazon SNS raw message
/// delivery": Amazon SQS, HTTP/S and Firehose endpoints).
fn raw_capable(protocol: &str) -> bool {
    matches!(protocol, "sqs" | "http" | "https")
}

/// The endpoint a protocol takes.
fn check_endpoint(protocol: &str, endpoint: &str) -> Result<(), ApiError> {
    if endpoint.is_empty() {
        return Err(invalid("Invalid parameter: Endpoint"));
    }
    let ok = match protocol {
        "email" | "email-json" => endpoint
            .split_once('@')
            .is_some_and(|(user, host)| !user.is_empty() && host.contains('.')),
        "http" => endpoint.starts_with("http://"),
        "https" => endpoint.starts_with("https://"),
        "sqs" => endpoint.starts_with("arn:aws:sqs:") && endpoint.split(':').count() == 6,
        "lambda" => endpoint.starts_with("arn:aws:lambda:"),
        _ => true,
    };
    if ok {
        return Ok(());
    }
    Err(invalid(match protocol {
        "email" | "email-json" => "Invalid parameter: Email address",
        "sqs" => "Invalid parameter: SQS endpoint ARN",
        "lambda" => "Invalid parameter: Lambda endpoint ARN",
        _ => "Invalid parameter: Endpoint must match the specified protocol",
    }))
}

/// Subscribe's `Attributes`, checked.
struct SubscriptionAttributes {
    /// The policy's text as given (none when absent or empty).
    filter_policy: Option<String>,
    policy: Option<FilterPolicy>,
    scope: Option<FilterScope>,
    raw: Option<bool>,
    other: BTreeMap<String, String>,
}

impl SubscriptionAttributes {
    fn parse(
        protocol: &str,
        given: &BTreeMap<String, String>,
    ) -> Result<SubscriptionAttributes, ApiError> {
        const REASON: &str = "Invalid parameter: Attributes Reason: ";
        let mut out = SubscriptionAttributes {
            filter_policy: None,
            policy: None,
            scope: None,
            raw: None,
            other: BTreeMap::new(),
        };
        for (k, v) in given {
            match k.as_str() {
                "RawMessageDelivery" => {
                    let raw = parse_raw(v).ok_or_else(|| {
                        invalid(format!(
                            "{REASON}RawMessageDelivery: Invalid value [{v}]. Must be true or \
                             false."
                        ))
                    })?;
                    if raw && !raw_capable(protocol) {
                        return Err(invalid(format!(
                            "{REASON}Delivery protocol [{protocol}] does not support raw message \
                             delivery."
                        )));
                    }
                    out.raw = Some(raw);
                }
                "FilterPolicyScope" => {
                    out.scope = Some(FilterScope::parse(v).ok_or_else(|| {
                        invalid(format!(
                            "{REASON}FilterPolicyScope: Invalid value [{v}]. Please use either \
                             MessageBody or MessageAttributes"
                        ))
                    })?);
                }
                "FilterPolicy" => {}
                other if OPAQUE_SUBSCRIPTION_ATTRIBUTES.contains(&other) => {
                    if !v.is_empty() {
                        out.other.insert(k.clone(), v.clone());
                    }
                }
                other => {
                    return Err(invalid(format!("{REASON}Invalid attribute name: {other}")));
                }
            }
        }
        if let Some(text) = given.get("FilterPolicy").filter(|t| !t.is_empty()) {
            let scope = out.scope.unwrap_or(FilterScope::MessageAttributes);
            out.policy =
                Some(FilterPolicy::parse(text, scope).map_err(|e| {
                    e.error("Invalid parameter: Attributes Reason: FilterPolicy: ")
                })?);
            out.filter_policy = Some(text.clone());
        }
        Ok(out)
    }

    /// Whether a Subscribe with these attributes repeats `existing`: every attribute given
    /// equals the subscription's (a default counts as set).
    fn same_as(&self, existing: &Subscription, given: &BTreeMap<String, String>) -> bool {
        let scope_same = self.scope.is_none_or(|s| s == existing.filter_policy_scope);
        let raw_same = self.raw.is_none_or(|r| r == existing.raw_message_delivery);
        let policy_same = match given.get("FilterPolicy") {
            None => true,
            Some(t) if t.is_empty() => existing.filter_policy.is_none(),
            Some(_) => existing.policy.is_some() && self.policy == existing.policy,
        };
        let other_same = self
            .other
            .iter()
            .all(|(k, v)| existing.other_attributes.get(k) == Some(v));
        scope_same && raw_same && policy_same && other_same
    }
}

/// `<Attributes><entry><key>..</key><value>..</value></entry>..</Attributes>`.
fn attribute_map(name: &str, attrs: &BTreeMap<String, String>) -> El {
    let mut m = el(name);
    for (k, v) in attrs {
        m = m.child(el("entry").v("key", k).v("value", v));
    }
    m
}

/// The access policy a topic gets by default: its owner's account may do everything.
fn default_topic_policy(t: &Topic) -> String {
    json!({
        "Version": "2008-10-17",
        "Id": "__default_policy_ID",
        "Statement": [{
            "Sid": "__default_statement_ID",
            "Effect": "Allow",
            "Principal": {"AWS": "*"},
            "Action": [
                "SNS:GetTopicAttributes", "SNS:SetTopicAttributes", "SNS:AddPermission",
                "SNS:RemovePermission", "SNS:DeleteTopic", "SNS:Subscribe",
                "SNS:ListSubscriptionsByTopic", "SNS:Publish"
            ],
            "Resource": t.arn,
            "Condition": {"StringEquals": {"AWS:SourceOwner": t.owner}},
        }],
    })
    .to_string()
}

/// The effective delivery policy of a topic without one.
const DEFAULT_DELIVERY_POLICY: &str = r#"{"http":{"defaultHealthyRetryPolicy":{"minDelayTarget":20,"maxDelayTarget":20,"numRetries":3,"numMaxDelayRetries":0,"numNoDelayRetries":0,"numMinDelayRetries":0,"backoffFunction":"linear"},"disableSubscriptionOverrides":false,"defaultRequestPolicy":{"headerContentType":"text/plain; charset=UTF-8"}}}"#;

// ---- filter policies ------------------------------------------------------------------------

/// A value a policy condition is matched against: a message attribute's value (a
/// `String.Array`'s elements), or a leaf of a JSON message body.
#[derive(Debug, Clone, PartialEq)]
pub enum Scalar {
    Str(String),
    Num(f64),
    Bool(bool),
    Null,
}

impl Scalar {
    fn of(v: &Value) -> Option<Scalar> {
        match v {
            Value::String(s) => Some(Scalar::Str(s.clone())),
            Value::Number(n) => n.as_f64().map(Scalar::Num),
            Value::Bool(b) => Some(Scalar::Bool(*b)),
            Value::Null => Some(Scalar::Null),
            _ => None,
        }
    }
}

/// A numeric comparison.
#[derive(Debug, Clone, Copy, PartialEq)]
enum NumOp {
    Eq,
    Lt,
    Le,
    Gt,
    Ge,
}

impl NumOp {
    fn parse(s: &str) -> Option<NumOp> {
        Some(match s {
            "=" => NumOp::Eq,
            "<" => NumOp::Lt,
            "<=" => NumOp::Le,
            ">" => NumOp::Gt,
            ">=" => NumOp::Ge,
            _ => return None,
        })
    }

    fn holds(self, value: f64, operand: f64) -> bool {
        match self {
            NumOp::Eq => value == operand,
            NumOp::Lt => value < operand,
            NumOp::Le => value <= operand,
            NumOp::Gt => value > operand,
            NumOp::Ge => value >= operand,
        }
    }
}

/// One condition of a policy key's array.
#[derive(Debug, Clone, PartialEq)]
enum Condition {
    /// `"x"`, `5`, `true`, `null`: an equal value (a string a `String` value, a number a
    /// `Number` value).
    Exact(Scalar),
    Prefix(String),
    Suffix(String),
    EqualsIgnoreCase(String),
    /// Any string or number value not among these.
    AnythingBut(Vec<Scalar>),
    /// Any string value not starting with this.
    AnythingButPrefix(String),
    /// A number value satisfying every comparison.
    Numeric(Vec<(NumOp, f64)>),
    /// Whether the key has a value at all.
    Exists(bool),
}

impl Condition {
    fn matches(&self, values: Option<&Vec<Scalar>>) -> bool {
        match self {
            Condition::Exists(want) => values.is_some() == *want,
            _ => values.is_some_and(|vs| vs.iter().any(|v| self.matches_value(v))),
        }
    }

    fn matches_value(&self, v: &Scalar) -> bool {
        match (self, v) {
            (Condition::Exact(want), v) => want == v,
            (Condition::Prefix(p), Scalar::Str(s)) => s.starts_with(p.as_str()),
            (Condition::Suffix(p), Scalar::Str(s)) => s.ends_with(p.as_str()),
            (Condition::EqualsIgnoreCase(p), Scalar::Str(s)) => {
                p.to_lowercase() == s.to_lowercase()
            }
            (Condition::AnythingBut(list), v @ (Scalar::Str(_) | Scalar::Num(_))) => {
                !list.contains(v)
            }
            (Condition::AnythingButPrefix(p), Scalar::Str(s)) => !s.starts_with(p.as_str()),
            (Condition::Numeric(terms), Scalar::Num(n)) => {
                terms.iter().all(|(op, x)| op.holds(*n, *x))
            }
            _ => false,
        }
    }
}

/// Why a filter policy was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PolicyError {
    /// The reason after "FilterPolicy: ".
    Invalid(String),
    /// A nested key under the `MessageAttributes` scope.
    NestedInAttributesScope,
}

impl PolicyError {
    /// The `InvalidParameter` error, with the operation's prefix (`Invalid parameter:
    /// FilterPolicy: ` for SetSubscriptionAttributes, `Invalid parameter: Attributes Reason:
    /// FilterPolicy: ` for Subscribe).
    fn error(&self, prefix: &str) -> ApiError {
        match self {
            PolicyError::Invalid(reason) => invalid(format!("{prefix}{reason}")),
            PolicyError::NestedInAttributesScope => invalid(
                "Invalid parameter: Filter policy scope MessageAttributes does not support nested \
                 filter policy",
            ),
        }
    }
}

/// A checked filter policy: an AND over its keys (a body policy's nested keys as dotted
/// paths), each an OR over its conditions.
#[derive(Debug, Clone, PartialEq)]
pub struct FilterPolicy {
    keys: Vec<(String, Vec<Condition>)>,
}

fn bad(reason: impl Into<String>) -> PolicyError {
    PolicyError::Invalid(reason.into())
}

impl FilterPolicy {
    /// Parses and checks a policy as SNS does for `scope`.
    pub fn parse(text: &str, scope: FilterScope) -> Result<FilterPolicy, PolicyError> {
        if text.len() > MAX_POLICY_BYTES {
            return Err(bad(format!(
                "Filter policy can not be larger than {MAX_POLICY_BYTES} bytes"
            )));
        }
        let v: Value =
            serde_json::from_str(text).map_err(|e| bad(format!("failed to parse JSON. {e}")))?;
        let Value::Object(obj) = v else {
            return Err(bad("Filter policy must be a JSON object"));
        };
        let mut keys = Vec::new();
        collect_keys(&obj, "", scope, &mut keys)?;
        if keys.len() > MAX_POLICY_KEYS {
            return Err(bad(format!(
                "Filter policy can not have more than {MAX_POLICY_KEYS} keys"
            )));
        }
        let combinations = keys
            .iter()
            .try_fold(1usize, |acc, (_, c)| acc.checked_mul(c.len()));
        if combinations.is_none_or(|n| n > MAX_POLICY_COMBINATIONS) {
            return Err(bad("Filter policy is too complex"));
        }
        Ok(FilterPolicy { keys })
    }

    /// Whether a message whose keys have these values passes (a key absent from `fields` has no
    /// value: only `exists: false` matches it).
    pub fn matches(&self, fields: &BTreeMap<String, Vec<Scalar>>) -> bool {
        self.keys
            .iter()
            .all(|(key, conditions)| conditions.iter().any(|c| c.matches(fields.get(key))))
    }
}

fn collect_keys(
    obj: &serde_json::Map<String, Value>,
    path: &str,
    scope: FilterScope,
    out: &mut Vec<(String, Vec<Condition>)>,
) -> Result<(), PolicyError> {
    for (k, v) in obj {
        if k == "$or" {
            return Err(bad("\"$or\" is not modelled by local-cloud"));
        }
        let key = if path.is_empty() {
            k.clone()
        } else {
            format!("{path}.{k}")
        };
        match v {
            Value::Array(items) => out.push((key, conditions(items)?)),
            Value::Object(inner) => {
                if scope == FilterScope::MessageAttributes {
                    return Err(PolicyError::NestedInAttributesScope);
                }
                collect_keys(inner, &key, scope, out)?;
            }
            _ => return Err(bad(format!("\"{k}\" must be an object or an array"))),
        }
    }
    Ok(())
}

fn conditions(items: &[Value]) -> Result<Vec<Condition>, PolicyError> {
    if items.is_empty() {
        return Err(bad("Empty arrays are not allowed"));
    }
    items.iter().map(condition).collect()
}

fn string_pattern(op: &str, v: &Value) -> Result<String, PolicyError> {
    v.as_str()
        .map(str::to_string)
        .ok_or_else(|| bad(format!("{op} match pattern must be a string")))
}

fn condition(item: &Value) -> Result<Condition, PolicyError> {
    let obj = match item {
        Value::Array(_) => {
            return Err(bad(
                "Match value must be String, number, true, false, or null",
            ));
        }
        Value::Object(obj) => obj,
        scalar => return Ok(Condition::Exact(Scalar::of(scalar).expect("a scalar"))),
    };
    if obj.len() != 1 {
        return Err(bad(if obj.is_empty() {
            "Empty objects are not allowed"
        } else {
            "Only one key allowed in match expression"
        }));
    }
    let (op, v) = obj.iter().next().expect("one key");
    Ok(match op.as_str() {
        "prefix" => Condition::Prefix(string_pattern("prefix", v)?),
        "suffix" => Condition::Suffix(string_pattern("suffix", v)?),
        "equals-ignore-case" => {
            Condition::EqualsIgnoreCase(string_pattern("equals-ignore-case", v)?)
        }
        "exists" => Condition::Exists(
            v.as_bool()
                .ok_or_else(|| bad("exists match pattern must be either true or false."))?,
        ),
        "anything-but" => anything_but(v)?,
        "numeric" => Condition::Numeric(numeric(v)?),
        "cidr" | "wildcard" => {
            return Err(bad(format!(
                "\"{op}\" matching is not modelled by local-cloud"
            )));
        }
        other => return Err(bad(format!("Unrecognized match type {other}"))),
    })
}

fn anything_but(v: &Value) -> Result<Condition, PolicyError> {
    let listed = |x: &Value| match x {
        Value::String(_) | Value::Number(_) => Ok(Scalar::of(x).expect("a scalar")),
        _ => Err(bad(
            "Inside anything but list, start|null|boolean is not supported.",
        )),
    };
    match v {
        Value::String(_) | Value::Number(_) => Ok(Condition::AnythingBut(vec![listed(v)?])),
        Value::Array(items) if items.is_empty() => Err(bad("Empty arrays are not allowed")),
        Value::Array(items) => Ok(Condition::AnythingBut(
            items.iter().map(listed).collect::<Result<_, _>>()?,
        )),
        Value::Object(obj) => match obj.iter().next() {
            Some((k, p)) if obj.len() == 1 && k == "prefix" => {
                Ok(Condition::AnythingButPrefix(string_pattern("prefix", p)?))
            }
            Some((k, _)) if obj.len() == 1 => {
                Err(bad(format!("Unsupported anything-but pattern: {k}")))
            }
            _ => Err(bad("Only one key allowed in match expression")),
        },
        _ => Err(bad(
            "Value of anything-but must be an array or single string/number value.",
        )),
    }
}

/// A `numeric` condition: `["=", n]`, or one bound (`<`, `<=`, `>`, `>=`), or a lower bound
/// followed by an upper one.
fn numeric(v: &Value) -> Result<Vec<(NumOp, f64)>, PolicyError> {
    let Some(items) = v.as_array() else {
        return Err(bad("Value of numeric must be an array."));
    };
    let Some(first) = items.first() else {
        return Err(bad("Invalid member in numeric match: ]"));
    };
    let Some(first) = first.as_str() else {
        return Err(bad(format!("Invalid member in numeric match: {first}")));
    };
    let op = NumOp::parse(first)
        .ok_or_else(|| bad(format!("Unrecognized numeric range operator: {first}")))?;
    let operand = |i: usize, name: &str| -> Result<f64, PolicyError> {
        let n = items
            .get(i)
            .and_then(Value::as_f64)
            .ok_or_else(|| bad(format!("Value of {name} must be numeric")))?;
        if n.abs() > 1e9 {
            return Err(bad(format!(
                "Value of {name} must be between -1000000000 and 1000000000"
            )));
        }
        Ok(n)
    };
    let name = if op == NumOp::Eq { "equals" } else { first };
    let mut terms = vec![(op, operand(1, name)?)];
    if !matches!(op, NumOp::Gt | NumOp::Ge) {
        if items.len() > 2 {
            return Err(bad("Too many elements in numeric expression"));
        }
        return Ok(terms);
    }
    let Some(next) = items.get(2) else {
        return Ok(terms);
    };
    let Some(next) = next.as_str() else {
        return Err(bad(format!("Bad value in numeric range: {next}")));
    };
    let upper = match NumOp::parse(next) {
        Some(o @ (NumOp::Lt | NumOp::Le)) => o,
        _ => return Err(bad(format!("Bad numeric range operator: {next}"))),
    };
    let top = operand(3, next)?;
    if items.len() > 4 {
        return Err(bad("Too many terms in numeric range expression"));
    }
    if terms[0].1 >= top {
        return Err(bad("Bottom must be less than top"));
    }
    terms.push((upper, top));
    Ok(terms)
}

/// The values of a message's attributes, by name, for matching: a `String` its string, a
/// `Number` its number, a `String.Array` its elements (none when its value is not a JSON
/// array); `Binary` attributes are ignored ("Amazon SNS ignores message attributes with the
/// Binary data type").
pub fn attribute_fields(
    attributes: &BTreeMap<String, MessageAttribute>,
) -> BTreeMap<String, Vec<Scalar>> {
    attributes
        .iter()
        .filter_map(|(name, a)| {
            let values = match base_type(&a.data_type) {
                "Binary" => return None,
                "Number" => a
                    .value
                    .trim()
                    .parse::<f64>()
                    .ok()
                    .map(Scalar::Num)
                    .into_iter()
                    .collect(),
                _ if a.data_type == "String.Array" => {
                    match serde_json::from_str::<Value>(&a.value) {
                        Ok(Value::Array(items)) => items.iter().filter_map(Scalar::of).collect(),
                        _ => Vec::new(),
                    }
                }
                _ => vec![Scalar::Str(a.value.clone())],
            };
            Some((name.clone(), values))
        })
        .collect()
}

/// The leaves of a JSON message body by dotted path (`{"a": {"b": 1}}` and `{"a.b": 1}` both
/// give `a.b`), an array's elements each a value of the array's path.
pub fn body_fields(v: &Value, path: &str, out: &mut BTreeMap<String, Vec<Scalar>>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                body_fields(v, &p, out);
            }
        }
        Value::Array(items) => {
            for item in items {
                body_fields(item, path, out);
            }
        }
        scalar => out
            .entry(path.to_string())
            .or_default()
            .extend(Scalar::of(scalar)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// (name, data type, value) of each message attribute.
    type Attrs<'a> = Vec<(&'a str, &'a str, &'a str)>;

    fn attrs(pairs: &[(&str, &str, &str)]) -> BTreeMap<String, MessageAttribute> {
        pairs
            .iter()
            .map(|(name, dt, value)| {
                (
                    name.to_string(),
                    MessageAttribute {
                        data_type: dt.to_string(),
                        value: value.to_string(),
                    },
                )
            })
            .collect()
    }

    fn matches(policy: &str, message: &[(&str, &str, &str)]) -> bool {
        FilterPolicy::parse(policy, FilterScope::MessageAttributes)
            .expect("a valid policy")
            .matches(&attribute_fields(&attrs(message)))
    }

    #[test]
    fn filter_policies_match_message_attributes_as_the_sns_guide_describes() {
        // (policy, message attributes, matches) — the examples of "Amazon SNS message
        // filtering" (string, numeric and key matching) and the notices' own attributes
        let team_a = [
            ("team", "String", "team-a"),
            ("detail_type", "String", "Capacity Bought"),
        ];
        let table: Vec<(&str, Attrs, bool)> = vec![
            (r#"{"team": ["team-a"]}"#, team_a.to_vec(), true),
            (r#"{"team": ["team-b"]}"#, team_a.to_vec(), false),
            (r#"{"team": ["team-b", "team-a"]}"#, team_a.to_vec(), true),
            // AND over keys
            (
                r#"{"team": ["team-a"], "detail_type": ["Capacity Lost"]}"#,
                team_a.to_vec(),
                false,
            ),
            (
                r#"{"team": ["team-a"], "detail_type": [{"prefix": "Capacity"}]}"#,
                team_a.to_vec(),
                true,
            ),
            // a key the message lacks
            (r#"{"request_id": ["r-1"]}"#, team_a.to_vec(), false),
            (
                r#"{"request_id": [{"exists": false}]}"#,
                team_a.to_vec(),
                true,
            ),
            (r#"{"team": [{"exists": true}]}"#, team_a.to_vec(), true),
            (r#"{"team": [{"exists": false}]}"#, team_a.to_vec(), false),
            (
                r#"{"request_id": [{"anything-but": "r-1"}]}"#,
                team_a.to_vec(),
                false,
            ),
            (
                r#"{"attr1": [null, {"anything-but": "whatever"}]}"#,
                vec![],
                false,
            ),
            // String.Array: each element on its own
            (
                r#"{"customer_interests": ["rugby", "tennis"]}"#,
                vec![(
                    "customer_interests",
                    "String.Array",
                    r#"["rugby", "football"]"#,
                )],
                true,
            ),
            (
                r#"{"customer_interests": ["rugby", "tennis"]}"#,
                vec![("customer_interests", "String.Array", r#"["baseball"]"#)],
                false,
            ),
            (
                r#"{"customer_interests": [{"anything-but": ["rugby", "tennis"]}]}"#,
                vec![(
                    "customer_interests",
                    "String.Array",
                    r#"["rugby", "baseball"]"#,
                )],
                true,
            ),
            (
                r#"{"customer_interests": [{"anything-but": ["rugby", "tennis"]}]}"#,
                vec![("customer_interests", "String", "rugby")],
                false,
            ),
            (
                r#"{"customer_interests": [{"prefix": "bas"}]}"#,
                vec![("customer_interests", "String", "basketball")],
                true,
            ),
            (
                r#"{"customer_interests": [{"suffix": "ball"}]}"#,
                vec![("customer_interests", "String", "rugby")],
                false,
            ),
            (
                r#"{"customer_interests": [{"anything-but": {"prefix": "bas"}}]}"#,
                vec![("customer_interests", "String", "baseball")],
                false,
            ),
            (
                r#"{"customer_interests": [{"anything-but": {"prefix": "bas"}}]}"#,
                vec![("customer_interests", "String", "rugby")],
                true,
            ),
            (
                r#"{"team": [{"equals-ignore-case": "TEAM-A"}]}"#,
                team_a.to_vec(),
                true,
            ),
            // exact strings are case-sensitive
            (r#"{"team": ["TEAM-A"]}"#, team_a.to_vec(), false),
            // numbers
            (
                r#"{"price_usd": [{"numeric": ["=", 301.5]}]}"#,
                vec![("price_usd", "Number", "3.015e2")],
                true,
            ),
            (
                r#"{"price_usd": [{"numeric": [">", 0, "<=", 150]}]}"#,
                vec![("price_usd", "Number", "150")],
                true,
            ),
            (
                r#"{"price_usd": [{"numeric": [">", 0, "<=", 150]}]}"#,
                vec![("price_usd", "Number", "150.5")],
                false,
            ),
            (
                r#"{"price_usd": [{"numeric": ["<", 0]}]}"#,
                vec![("price_usd", "Number", "-1")],
                true,
            ),
            (
                r#"{"price": [{"anything-but": [100, 500]}]}"#,
                vec![("price", "Number", "100")],
                false,
            ),
            (
                r#"{"price": [{"anything-but": [100, 500]}]}"#,
                vec![("price", "Number", "100.1")],
                true,
            ),
            // a numeric condition on a String attribute, and a string on a Number one
            (
                r#"{"price": [{"numeric": ["=", 5]}]}"#,
                vec![("price", "String", "5")],
                false,
            ),
            (r#"{"price": ["5"]}"#, vec![("price", "Number", "5")], false),
            // Binary attributes are ignored
            (
                r#"{"blob": [{"exists": true}]}"#,
                vec![("blob", "Binary", "AAEC")],
                false,
            ),
            // custom type labels keep their base type
            (
                r#"{"team": ["team-a"]}"#,
                vec![("team", "String.team", "team-a")],
                true,
            ),
        ];
        for (policy, message, want) in table {
            assert_eq!(matches(policy, &message), want, "{policy} on {message:?}");
        }
    }

    #[test]
    fn a_body_policy_matches_nested_and_dotted_keys() {
        // GIVEN a body-scoped policy with a nested key
        let p = FilterPolicy::parse(
            r#"{"object": {"key": [{"prefix": "auto-"}]}, "team": ["team-a"]}"#,
            FilterScope::MessageBody,
        )
        .expect("valid");
        let fields = |body: &str| {
            let mut out = BTreeMap::new();
            body_fields(&serde_json::from_str(body).unwrap(), "", &mut out);
            out
        };
        // THEN nested and dotted bodies match alike, arrays by any element
        assert!(p.matches(&fields(
            r#"{"object": {"key": "auto-1"}, "team": "team-a"}"#
        )));
        assert!(p.matches(&fields(
            r#"{"object.key": "auto-1", "team": ["x", "team-a"]}"#
        )));
        assert!(!p.matches(&fields(
            r#"{"object": {"key": "manual"}, "team": "team-a"}"#
        )));
        assert!(!p.matches(&fields(r#"{"team": "team-a"}"#)));
        // ... and the attributes scope refuses the nesting
        assert_eq!(
            FilterPolicy::parse(
                r#"{"object": {"key": ["x"]}}"#,
                FilterScope::MessageAttributes
            ),
            Err(PolicyError::NestedInAttributesScope)
        );
    }

    #[test]
    fn malformed_policies_are_refused_with_snss_reasons() {
        let reason = |p: &str| match FilterPolicy::parse(p, FilterScope::MessageAttributes) {
            Err(PolicyError::Invalid(r)) => r,
            other => panic!("{p}: {other:?}"),
        };
        assert!(reason("invalid-json").starts_with("failed to parse JSON."));
        assert_eq!(reason("[1]"), "Filter policy must be a JSON object");
        assert_eq!(
            reason(r#"{"key_a": "value_one"}"#),
            "\"key_a\" must be an object or an array"
        );
        assert_eq!(reason(r#"{"key": []}"#), "Empty arrays are not allowed");
        assert_eq!(
            reason(r#"{"key": [["value"]]}"#),
            "Match value must be String, number, true, false, or null"
        );
        assert_eq!(
            reason(r#"{"key": [{"wrong-operator": true}]}"#),
            "Unrecognized match type wrong-operator"
        );
        assert_eq!(
            reason(r#"{"key": [{"suffix": "a", "prefix": "b"}]}"#),
            "Only one key allowed in match expression"
        );
        assert_eq!(
            reason(r#"{"key": [{"suffix": 100}]}"#),
            "suffix match pattern must be a string"
        );
        assert_eq!(
            reason(r#"{"key": [{"exists": "no"}]}"#),
            "exists match pattern must be either true or false."
        );
        assert_eq!(
            reason(r#"{"key": [{"anything-but": {"suffix": "x"}}]}"#),
            "Unsupported anything-but pattern: suffix"
        );
        assert_eq!(
            reason(r#"{"key": [{"numeric": []}]}"#),
            "Invalid member in numeric match: ]"
        );
        assert_eq!(
            reason(r#"{"key": [{"numeric": ["operator"]}]}"#),
            "Unrecognized numeric range operator: operator"
        );
        assert_eq!(
            reason(r#"{"key": [{"numeric": [1, "<="]}]}"#),
            "Invalid member in numeric match: 1"
        );
        assert_eq!(
            reason(r#"{"key": [{"numeric": ["=", "000"]}]}"#),
            "Value of equals must be numeric"
        );
        assert_eq!(
            reason(r#"{"key": [{"numeric": [">="]}]}"#),
            "Value of >= must be numeric"
        );
        assert_eq!(
            reason(r#"{"key": [{"numeric": ["<", 100, ">", 10]}]}"#),
            "Too many elements in numeric expression"
        );
        assert_eq!(
            reason(r#"{"key": [{"numeric": [">=", 1, ">", 2]}]}"#),
            "Bad numeric range operator: >"
        );
        assert_eq!(
            reason(r#"{"key": [{"numeric": [">", 3, "<", 1]}]}"#),
            "Bottom must be less than top"
        );
        assert_eq!(
            reason(r#"{"key": [{"numeric": [">", 20, 30]}]}"#),
            "Bad value in numeric range: 30"
        );
        assert_eq!(
            reason(r#"{"key": [{"numeric": [">", 20, "<", 30, "<", 50]}]}"#),
            "Too many terms in numeric range expression"
        );
        assert_eq!(
            reason(r#"{"a": ["1"], "b": ["1"], "c": ["1"], "d": ["1"], "e": ["1"], "f": ["1"]}"#),
            "Filter policy can not have more than 5 keys"
        );
        let many: Vec<String> = (0..13).map(|i| format!("\"v{i}\"")).collect();
        let list = many.join(",");
        assert_eq!(
            reason(&format!(r#"{{"a": [{list}], "b": [{list}]}}"#)),
            "Filter policy is too complex"
        );
        assert!(reason(r#"{"$or": [{"a": ["1"]}, {"b": ["2"]}]}"#).contains("not modelled"));
    }

    #[test]
    fn subjects_and_attribute_names_follow_snss_rules() {
        assert!(valid_subject("Capacity bought: 4 x p5.48xlarge"));
        assert!(valid_subject(&"x".repeat(99)));
        assert!(!valid_subject(&"x".repeat(100)));
        assert!(!valid_subject(""));
        assert!(!valid_subject(" leading space"));
        assert!(!valid_subject("two\nlines"));
        assert!(!valid_subject("tab\there"));
        assert!(!valid_subject("café"));
        assert!(check_attribute_name("detail_type").is_ok());
        assert!(check_attribute_name("a.b-c_d").is_ok());
        for bad in [
            ".abc",
            "abc.",
            "a..b",
            "a^b",
            "AWS.team",
            "amazon.x",
            "",
            &"a".repeat(256),
        ] {
            assert_eq!(
                check_attribute_name(bad).map_err(|e| e.code),
                Err("ParameterValueInvalid".to_string()),
                "{bad}"
            );
        }
        assert!(valid_data_type("String.Array") && valid_data_type("Number.float"));
        assert!(!valid_data_type("String.") && !valid_data_type("Stringx"));
        assert!(valid_topic_name(&"a".repeat(256)) && !valid_topic_name(&"a".repeat(257)));
        assert!(!valid_topic_name("") && !valid_topic_name("t.fifo") && !valid_topic_name("a b"));
    }

    proptest! {
        /// An exact-string key matches a `String` attribute exactly when the values are equal,
        /// and an `exists: false` key on an attribute the message lacks never changes that.
        #[test]
        fn an_exact_key_matches_only_its_own_value(
            want in "[a-z0-9-]{1,12}",
            got in "[a-z0-9-]{1,12}",
            with_absent_key in any::<bool>(),
        ) {
            let absent = if with_absent_key { r#", "nope": [{"exists": false}]"# } else { "" };
            let policy = format!(r#"{{"team": ["{want}"]{absent}}}"#);
            prop_assert_eq!(matches(&policy, &[("team", "String", &got)]), want == got);
            // a message without the key never matches it
            prop_assert!(!matches(&policy, &[("other", "String", &got)]));
        }

        /// A lower-and-upper numeric range matches exactly the numbers inside it.
        #[test]
        fn a_numeric_range_matches_exactly_its_interval(
            low in -1000i32..1000,
            width in 1i32..1000,
            x in -3000i32..3000,
        ) {
            let high = low + width;
            let policy = format!(r#"{{"n": [{{"numeric": [">", {low}, "<=", {high}]}}]}}"#);
            let got = matches(&policy, &[("n", "Number", &x.to_string())]);
            prop_assert_eq!(got, x > low && x <= high);
        }
    }
}
