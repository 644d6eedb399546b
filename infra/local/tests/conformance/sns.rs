//! Amazon SNS standard topics (awsQuery) through the real `aws_sdk_sns` client: the notices topic
//! the product publishes to, the teams' filtered subscriptions, and what SNS refuses.

use std::collections::HashMap;

use aws_sdk_sns::error::ProvideErrorMetadata;
use aws_sdk_sns::types::{MessageAttributeValue, Tag};
use chrono::TimeDelta;
use local_cloud::{Fault, FaultKind, Options};
use serde_json::{Value, json};

use crate::helpers::*;

const TEAM_A_EMAIL: &str = "team-a@example.com";

async fn client(env: &Env, region: &'static str, access_key_id: &str) -> aws_sdk_sns::Client {
    let conf = sdk_config_as(&env.cloud.url(), region, access_key_id, false).await;
    aws_sdk_sns::Client::new(&conf)
}

async fn sns(env: &Env) -> aws_sdk_sns::Client {
    client(env, "us-east-1", "AKIDLOCALCLOUD").await
}

async fn topic(sns: &aws_sdk_sns::Client, name: &str) -> String {
    sns.create_topic()
        .name(name)
        .send()
        .await
        .expect("CreateTopic")
        .topic_arn()
        .expect("an ARN")
        .to_string()
}

fn string(v: &str) -> MessageAttributeValue {
    typed("String", v)
}

fn typed(data_type: &str, v: &str) -> MessageAttributeValue {
    MessageAttributeValue::builder()
        .data_type(data_type)
        .string_value(v)
        .build()
        .expect("a data type")
}

/// Publishes a notice for `team`, as the product does.
async fn notice(sns: &aws_sdk_sns::Client, topic: &str, team: &str, detail_type: &str) -> String {
    sns.publish()
        .topic_arn(topic)
        .subject(format!("{detail_type} for {team}"))
        .message(format!("{team}: {detail_type}"))
        .message_attributes("team", string(team))
        .message_attributes("detail_type", string(detail_type))
        .message_attributes("request_id", string("req-1"))
        .send()
        .await
        .expect("Publish")
        .message_id()
        .expect("a message id")
        .to_string()
}

/// Subscribes with a filter policy, asking for the subscription's ARN even while pending.
async fn subscribe(
    sns: &aws_sdk_sns::Client,
    topic: &str,
    protocol: &str,
    endpoint: &str,
    policy: Option<Value>,
) -> String {
    let mut call = sns
        .subscribe()
        .topic_arn(topic)
        .protocol(protocol)
        .endpoint(endpoint)
        .return_subscription_arn(true);
    if let Some(p) = policy {
        call = call.attributes("FilterPolicy", p.to_string());
    }
    call.send()
        .await
        .expect("Subscribe")
        .subscription_arn()
        .expect("an ARN")
        .to_string()
}

/// The subscription ARNs each recorded message was delivered to, oldest message first.
fn deliveries(env: &Env) -> Vec<Vec<String>> {
    env.cloud
        .sns_messages()
        .iter()
        .map(|m| {
            m["deliveries"]
                .as_array()
                .expect("a list")
                .iter()
                .map(|d| d.as_str().expect("an ARN").to_string())
                .collect()
        })
        .collect()
}

fn sqs(n: u32) -> String {
    format!("arn:aws:sqs:us-east-1:123456789012:queue-{n}")
}

fn status<E>(e: &aws_sdk_sns::error::SdkError<E>) -> u16 {
    e.raw_response().expect("an HTTP answer").status().as_u16()
}

#[tokio::test]
async fn a_publish_to_a_missing_topic_is_not_found() {
    // GIVEN one topic in us-east-1
    let env = env().await;
    let sns = sns(&env).await;
    let arn = topic(&sns, "capacity-pilot-notices").await;
    let west = client(&env, "us-west-2", "AKIDLOCALCLOUD").await;

    // WHEN a topic that does not exist is published to, one of another region, and a malformed
    // ARN
    let missing = sns
        .publish()
        .topic_arn(arn.replace("notices", "other"))
        .message("hello")
        .send()
        .await
        .unwrap_err();
    let elsewhere = west
        .publish()
        .topic_arn(&arn)
        .message("hello")
        .send()
        .await
        .unwrap_err();
    let malformed = sns
        .publish()
        .topic_arn("capacity-pilot-notices")
        .message("hello")
        .send()
        .await
        .unwrap_err();

    // THEN the first is HTTP 404 NotFound in awsQuery's error shape, the others InvalidParameter
    assert_eq!(missing.code(), Some("NotFound"));
    assert_eq!(missing.message(), Some("Topic does not exist"));
    assert!(
        missing
            .as_service_error()
            .is_some_and(|e| e.is_not_found_exception())
    );
    assert_eq!(status(&missing), 404);
    let raw = missing.raw_response().unwrap();
    let body = std::str::from_utf8(raw.body().bytes().unwrap()).unwrap();
    assert!(
        body.contains("<ErrorResponse xmlns=\"http://sns.amazonaws.com/doc/2010-03-31/\">")
            && body.contains("<Type>Sender</Type>")
            && body.contains("<RequestId>"),
        "{body}"
    );
    assert_eq!(elsewhere.code(), Some("InvalidParameter"));
    assert_eq!(elsewhere.message(), Some("Invalid parameter: TopicArn"));
    assert_eq!(status(&elsewhere), 400);
    assert_eq!(
        malformed.message(),
        Some("Invalid parameter: TopicArn Reason: An ARN must have at least 6 elements, not 1")
    );
    assert!(env.cloud.sns_messages().is_empty(), "nothing recorded");
}

#[tokio::test]
async fn create_topic_is_idempotent_on_its_name_per_region_and_account() {
    // GIVEN a topic created with a display name, a KMS key and a tag
    let env = env().await;
    let sns = sns(&env).await;
    let created = sns
        .create_topic()
        .name("capacity-pilot-notices")
        .attributes("DisplayName", "Capacity notices")
        .attributes("KmsMasterKeyId", "alias/aws/sns")
        .tags(
            Tag::builder()
                .key("team")
                .value("platform")
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
    let arn = created.topic_arn().unwrap().to_string();

    // WHEN it is created again with no attributes, the same ones, other ones, other tags; in
    // another region; and by a caller of another account
    let again = topic(&sns, "capacity-pilot-notices").await;
    let same = sns
        .create_topic()
        .name("capacity-pilot-notices")
        .attributes("DisplayName", "Capacity notices")
        .send()
        .await
        .unwrap();
    let other_attrs = sns
        .create_topic()
        .name("capacity-pilot-notices")
        .attributes("DisplayName", "Other")
        .send()
        .await
        .unwrap_err();
    let other_tags = sns
        .create_topic()
        .name("capacity-pilot-notices")
        .tags(Tag::builder().key("team").value("ops").build().unwrap())
        .send()
        .await
        .unwrap_err();
    let west = topic(
        &client(&env, "us-west-2", "AKIDLOCALCLOUD").await,
        "capacity-pilot-notices",
    )
    .await;
    env.cloud
        .with_world(|w| w.put_identity("AKIDBOB", "arn:aws:iam::210987654321:user/bob"))
        .unwrap();
    let bobs = topic(
        &client(&env, "us-east-1", "AKIDBOB").await,
        "capacity-pilot-notices",
    )
    .await;

    // THEN the ARN is SNS's form in the caller's account, answered again for the same name,
    // refused for other attributes or tags; regions and accounts have their own topics
    assert_eq!(
        arn,
        "arn:aws:sns:us-east-1:123456789012:capacity-pilot-notices"
    );
    assert_eq!(again, arn);
    assert_eq!(same.topic_arn(), Some(arn.as_str()));
    assert_eq!(other_attrs.code(), Some("InvalidParameter"));
    assert_eq!(
        other_attrs.message(),
        Some(
            "Invalid parameter: Attributes Reason: Topic already exists with different attributes"
        )
    );
    assert_eq!(
        other_tags.message(),
        Some("Invalid parameter: Tags Reason: Topic already exists with different tags")
    );
    assert_eq!(
        west,
        "arn:aws:sns:us-west-2:123456789012:capacity-pilot-notices"
    );
    assert_eq!(
        bobs,
        "arn:aws:sns:us-east-1:210987654321:capacity-pilot-notices"
    );
    // ... and the attributes given are kept
    let attrs = sns
        .get_topic_attributes()
        .topic_arn(&arn)
        .send()
        .await
        .unwrap();
    let attrs = attrs.attributes().unwrap();
    assert_eq!(attrs["KmsMasterKeyId"], "alias/aws/sns");
    assert_eq!(attrs["DisplayName"], "Capacity notices");
}

#[tokio::test]
async fn a_topic_name_outside_snss_rules_is_refused() {
    // GIVEN an emulator
    let env = env().await;
    let sns = sns(&env).await;
    let create = |name: String| {
        let sns = sns.clone();
        async move { sns.create_topic().name(name).send().await }
    };

    // WHEN topics are created with names SNS takes and names it does not, a FIFO topic, and an
    // attribute SNS does not have
    let longest = create("a".repeat(256)).await;
    let mut refused = Vec::new();
    for name in [
        String::new(),
        "a".repeat(257),
        "notices.fifo".into(),
        "bad:name".into(),
        "bad name".into(),
    ] {
        refused.push(create(name).await.unwrap_err());
    }
    let fifo = sns
        .create_topic()
        .name("notices.fifo")
        .attributes("FifoTopic", "true")
        .send()
        .await
        .unwrap_err();
    let unknown = sns
        .create_topic()
        .name("notices")
        .attributes("Colour", "blue")
        .send()
        .await
        .unwrap_err();

    // THEN 256 letters is a name, the others are "Invalid parameter: Topic Name"; FIFO topics
    // and unknown attributes are InvalidParameter too
    assert!(longest.is_ok());
    for e in refused {
        assert_eq!(e.code(), Some("InvalidParameter"));
        assert_eq!(e.message(), Some("Invalid parameter: Topic Name"));
    }
    assert_eq!(fifo.code(), Some("InvalidParameter"));
    assert!(
        fifo.message()
            .unwrap()
            .contains("FIFO topics are not modelled")
    );
    assert_eq!(
        unknown.message(),
        Some("Invalid parameter: Attributes Reason: Invalid attribute name: Colour")
    );
}

#[tokio::test]
async fn get_topic_attributes_counts_confirmed_and_pending_subscriptions() {
    // GIVEN a topic with two queue subscriptions and one email subscription, one queue gone
    let env = env().await;
    let sns = sns(&env).await;
    let arn = topic(&sns, "notices").await;
    subscribe(&sns, &arn, "sqs", &sqs(1), None).await;
    let gone = subscribe(&sns, &arn, "sqs", &sqs(2), None).await;
    subscribe(&sns, &arn, "email", TEAM_A_EMAIL, None).await;
    sns.unsubscribe()
        .subscription_arn(gone)
        .send()
        .await
        .unwrap();

    // WHEN its attributes are read, and a missing topic's
    let out = sns
        .get_topic_attributes()
        .topic_arn(&arn)
        .send()
        .await
        .unwrap();
    let missing = sns
        .get_topic_attributes()
        .topic_arn(format!("{arn}-nope"))
        .send()
        .await
        .unwrap_err();

    // THEN they name the topic, its owner and its subscriptions by state
    let a = out.attributes().unwrap();
    assert_eq!(a["TopicArn"], arn);
    assert_eq!(a["Owner"], "123456789012");
    assert_eq!(a["SubscriptionsConfirmed"], "1");
    assert_eq!(a["SubscriptionsPending"], "1");
    assert_eq!(a["SubscriptionsDeleted"], "1");
    assert_eq!(a["DisplayName"], "");
    assert!(!a.contains_key("KmsMasterKeyId"), "no key was given");
    let policy: Value = serde_json::from_str(&a["Policy"]).unwrap();
    assert_eq!(policy["Statement"][0]["Resource"], arn);
    assert_eq!(missing.code(), Some("NotFound"));
    assert_eq!(status(&missing), 404);
}

#[tokio::test]
async fn a_deleted_topic_is_gone_with_its_subscriptions() {
    // GIVEN a topic with a subscription
    let env = env().await;
    let sns = sns(&env).await;
    let arn = topic(&sns, "notices").await;
    let sub = subscribe(&sns, &arn, "sqs", &sqs(1), None).await;

    // WHEN it is deleted, twice
    sns.delete_topic().topic_arn(&arn).send().await.unwrap();
    let twice = sns.delete_topic().topic_arn(&arn).send().await;

    // THEN deleting again is no error, publishing is NotFound, and the subscription is gone
    assert!(twice.is_ok());
    let err = sns
        .publish()
        .topic_arn(&arn)
        .message("x")
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("NotFound"));
    let err = sns
        .get_subscription_attributes()
        .subscription_arn(sub)
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("NotFound"));
    assert_eq!(err.message(), Some("Subscription does not exist"));
    assert!(env.cloud.sns_subscriptions().is_empty());
}

#[tokio::test]
async fn an_empty_message_is_refused() {
    // GIVEN a topic
    let env = env().await;
    let sns = sns(&env).await;
    let arn = topic(&sns, "notices").await;

    // WHEN an empty message and no message are published
    let empty = sns
        .publish()
        .topic_arn(&arn)
        .message("")
        .send()
        .await
        .unwrap_err();
    let none = sns.publish().topic_arn(&arn).send().await.unwrap_err();

    // THEN the first is InvalidParameter "Empty message", the second the validation error
    assert_eq!(empty.code(), Some("InvalidParameter"));
    assert_eq!(empty.message(), Some("Invalid parameter: Empty message"));
    assert_eq!(none.code(), Some("ValidationError"));
    assert!(env.cloud.sns_messages().is_empty());
}

#[tokio::test]
async fn a_subject_of_100_characters_or_with_a_line_break_is_refused() {
    // GIVEN a topic
    let env = env().await;
    let sns = sns(&env).await;
    let arn = topic(&sns, "notices").await;
    let publish = |subject: String| {
        let (sns, arn) = (sns.clone(), arn.clone());
        async move {
            sns.publish()
                .topic_arn(arn)
                .subject(subject)
                .message("body")
                .send()
                .await
        }
    };

    // WHEN subjects of 99 and 100 characters, with a line break, a control character, a
    // leading space, a non-ASCII letter, and an empty one are published
    let ok = publish("x".repeat(99)).await;
    let mut refused = Vec::new();
    for s in [
        "x".repeat(100),
        "Capacity bought\nfor team-a".into(),
        "tab\there".into(),
        " leading space".into(),
        "Capacité".into(),
        String::new(),
    ] {
        refused.push((s.clone(), publish(s).await.unwrap_err()));
    }

    // THEN only the 99-character one is taken
    assert!(ok.is_ok());
    for (s, e) in refused {
        assert_eq!(e.code(), Some("InvalidParameter"), "{s:?}");
        assert_eq!(e.message(), Some("Invalid parameter: Subject"), "{s:?}");
    }
    assert_eq!(env.cloud.sns_messages().len(), 1);
}

#[tokio::test]
async fn a_message_over_256_kib_is_refused() {
    // GIVEN a topic, and one whose MaximumMessageSize is 1 KiB
    let env = env().await;
    let sns = sns(&env).await;
    let arn = topic(&sns, "notices").await;
    let small = sns
        .create_topic()
        .name("small")
        .attributes("MaximumMessageSize", "1024")
        .send()
        .await
        .unwrap()
        .topic_arn()
        .unwrap()
        .to_string();
    // the attribute's name, data type and value count: "team" + "String" + "team-a" = 16 bytes
    let with_attr = |arn: &str, len: usize| {
        sns.publish()
            .topic_arn(arn)
            .message("é".repeat(len / 2) + &"a".repeat(len % 2))
            .message_attributes("team", string("team-a"))
            .send()
    };

    // WHEN messages of exactly the limit and one byte over are published (UTF-8 bytes, not
    // characters), on both topics
    let at_limit = with_attr(&arn, 262_144 - 16).await;
    let over = with_attr(&arn, 262_144 - 16 + 1).await.unwrap_err();
    let body_only = sns
        .publish()
        .topic_arn(&arn)
        .message("a".repeat(262_145))
        .send()
        .await
        .unwrap_err();
    let small_ok = with_attr(&small, 1024 - 16).await;
    let small_over = with_attr(&small, 1024 - 16 + 1).await.unwrap_err();

    // THEN the limit is taken and a byte more is "Message too long"
    assert!(at_limit.is_ok());
    for e in [&over, &body_only, &small_over] {
        assert_eq!(e.code(), Some("InvalidParameter"));
        assert_eq!(e.message(), Some("Invalid parameter: Message too long"));
    }
    assert!(small_ok.is_ok());
    assert_eq!(env.cloud.sns_messages().len(), 2);
}

#[tokio::test]
async fn message_attributes_are_checked_as_sns_checks_them() {
    // GIVEN a topic
    let env = env().await;
    let sns = sns(&env).await;
    let arn = topic(&sns, "notices").await;
    let publish = |name: &str, value: MessageAttributeValue| {
        sns.publish()
            .topic_arn(&arn)
            .message("body")
            .message_attributes(name, value)
            .send()
    };
    let binary = |dt: &str, bytes: &[u8]| {
        MessageAttributeValue::builder()
            .data_type(dt)
            .binary_value(aws_smithy_types::Blob::new(bytes))
            .build()
            .unwrap()
    };

    // WHEN attributes SNS takes and ones it refuses are published
    for (name, value) in [
        ("team", string("team-a")),
        ("teams", typed("String.Array", r#"["team-a", "team-b"]"#)),
        ("count", typed("Number", "4")),
        ("blob", binary("Binary", b"\x00\x01")),
        ("custom", typed("String.team", "team-a")),
        ("a.b-c_d", string("x")),
    ] {
        publish(name, value).await.expect(name);
    }
    let cases = [
        (
            publish("team", string("")).await,
            "The message attribute 'team' must contain non-empty message attribute value for \
             message attribute type 'String'.",
        ),
        (
            publish("team", binary("String", b"x")).await,
            "The message attribute 'team' with type 'String' must use field 'String'.",
        ),
        (
            publish("blob", typed("Binary", "x")).await,
            "The message attribute 'blob' with type 'Binary' must use field 'Binary'.",
        ),
        (
            publish("team", typed("Text", "x")).await,
            "The message attribute 'team' has an invalid message attribute type, the set of \
             supported type prefixes is Binary, Number, and String.",
        ),
        (
            publish("team", typed("String.", "x")).await,
            "The message attribute 'team' has an invalid message attribute type, the set of \
             supported type prefixes is Binary, Number, and String.",
        ),
        (
            publish(&"a".repeat(257), string("x")).await,
            "Length of message attribute name must be less than 256 bytes.",
        ),
        (
            publish("a^b", string("x")).await,
            "Invalid non-alphanumeric character '#x5E' was found in the message attribute name. \
             Can only include alphanumeric characters, hyphens, underscores, or dots.",
        ),
        (
            publish(".team", string("x")).await,
            "Invalid message attribute name starting with character '.' was found.",
        ),
        (
            publish("team.", string("x")).await,
            "Invalid message attribute name ending with character '.' was found.",
        ),
        (
            publish("te..am", string("x")).await,
            "Message attribute name can not have successive '.' character.",
        ),
    ];

    // THEN the refusals are ParameterValueInvalid (the SDK's InvalidParameterValueException)
    // with SNS's messages
    for (result, message) in cases {
        let e = result.unwrap_err();
        assert_eq!(e.code(), Some("ParameterValueInvalid"));
        assert!(
            e.as_service_error()
                .is_some_and(|s| s.is_invalid_parameter_value_exception())
        );
        assert_eq!(e.message(), Some(message));
    }
    // ... so are reserved prefixes and a Number that is not one
    for (name, value) in [
        ("AWS.team", string("x")),
        ("amazon.team", string("x")),
        ("count", typed("Number", "four")),
    ] {
        let e = publish(name, value).await.unwrap_err();
        assert_eq!(e.code(), Some("ParameterValueInvalid"), "{name}");
    }
    assert_eq!(env.cloud.sns_messages().len(), 6);
}

#[tokio::test]
async fn publishing_to_a_phone_or_with_a_message_structure_is_refused() {
    // GIVEN a topic
    let env = env().await;
    let sns = sns(&env).await;
    let arn = topic(&sns, "notices").await;

    // WHEN a phone number, a message structure and a deduplication id are published with
    let phone = sns
        .publish()
        .phone_number("+15555550100")
        .message("x")
        .send()
        .await
        .unwrap_err();
    let structure = sns
        .publish()
        .topic_arn(&arn)
        .message_structure("json")
        .message(r#"{"default": "x"}"#)
        .send()
        .await
        .unwrap_err();
    let dedup = sns
        .publish()
        .topic_arn(&arn)
        .message("x")
        .message_deduplication_id("d-1")
        .send()
        .await
        .unwrap_err();

    // THEN each is InvalidParameter, and nothing is recorded
    for e in [&phone, &structure, &dedup] {
        assert_eq!(e.code(), Some("InvalidParameter"));
    }
    assert!(phone.message().unwrap().contains("not modelled"));
    assert!(structure.message().unwrap().contains("not modelled"));
    assert_eq!(
        dedup.message(),
        Some(
            "Invalid parameter: MessageDeduplicationId Reason: The request includes \
             MessageDeduplicationId parameter that is not valid for this topic type"
        )
    );
    assert!(env.cloud.sns_messages().is_empty());
}

#[tokio::test]
async fn an_accepted_publish_is_recorded_with_the_emulator_clock_and_a_message_id() {
    // GIVEN a topic with a queue subscription, in two emulators of the same seed
    let env = env().await;
    let twin = env_with(Options {
        seed: 42,
        start: Some(t0()),
        ..Options::default()
    })
    .await;
    let (sns, twin_sns) = (sns(&env).await, sns(&twin).await);
    let arn = topic(&sns, "notices").await;
    topic(&twin_sns, "notices").await;
    let sub = subscribe(&sns, &arn, "sqs", &sqs(1), None).await;
    subscribe(&twin_sns, &arn, "sqs", &sqs(1), None).await;

    // WHEN a notice is published at T0 and another 90 minutes later, in both
    let first = notice(&sns, &arn, "team-a", "Capacity Bought").await;
    env.cloud.step(TimeDelta::minutes(90));
    let second = notice(&sns, &arn, "team-b", "Capacity Lost").await;
    let twin_first = notice(&twin_sns, &arn, "team-a", "Capacity Bought").await;

    // THEN each is recorded in order with its id, subject, body, attributes and the emulator's
    // time, delivered to the subscription; ids are UUIDs from the seeded id source
    let (status, body) = http(&env.cloud.url(), "GET", "/_local/sns/messages", None).await;
    assert_eq!(status, 200);
    let messages = body["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 2);
    assert_eq!(
        messages[0],
        json!({
            "topic_arn": arn,
            "message_id": first,
            "subject": "Capacity Bought for team-a",
            "message": "team-a: Capacity Bought",
            "attributes": {"team": "team-a", "detail_type": "Capacity Bought", "request_id": "req-1"},
            "attribute_types": {"team": "String", "detail_type": "String", "request_id": "String"},
            "at": "2026-09-01T08:00:00Z",
            "deliveries": [sub],
        })
    );
    assert_eq!(messages[1]["message_id"], second);
    assert_eq!(messages[1]["at"], "2026-09-01T09:30:00Z");
    assert_eq!(first.len(), 36, "a UUID: {first}");
    assert_ne!(first, second);
    assert_eq!(
        twin_first, first,
        "the same seed and calls give the same ids"
    );
    // ... and the state snapshot (`GET /_local/state`) carries SNS too
    let (_, state) = http(&env.cloud.url(), "GET", "/_local/state", None).await;
    assert_eq!(state["sns"]["messages"], 2);
    assert_eq!(state["sns"]["topics"][0]["arn"], arn);
    assert_eq!(state["sns"]["subscriptions"][0]["subscription_arn"], sub);
}

#[tokio::test]
async fn subscribe_accepts_the_modelled_protocols_and_refuses_others() {
    // GIVEN a topic
    let env = env().await;
    let sns = sns(&env).await;
    let arn = topic(&sns, "notices").await;
    let sub = |protocol: &str, endpoint: &str| {
        sns.subscribe()
            .topic_arn(&arn)
            .protocol(protocol)
            .endpoint(endpoint)
            .send()
    };

    // WHEN each modelled protocol subscribes, an unknown one, an unmodelled one, endpoints of
    // the wrong form, and a missing topic
    let accepted = [
        ("email", TEAM_A_EMAIL.to_string()),
        ("email-json", "ops@example.com".to_string()),
        ("http", "http://hooks.example.com/notices".to_string()),
        ("https", "https://hooks.example.com/notices".to_string()),
        ("sqs", sqs(1)),
        (
            "lambda",
            "arn:aws:lambda:us-east-1:123456789012:function:notify".to_string(),
        ),
    ];
    let mut answers = Vec::new();
    for (protocol, endpoint) in &accepted {
        answers.push(sub(protocol, endpoint).await.expect(protocol));
    }
    let unknown = sub("pigeon", "coop").await.unwrap_err();
    let sms = sub("sms", "+15555550100").await.unwrap_err();
    let bad_email = sub("email", "not-an-address").await.unwrap_err();
    let bad_https = sub("https", "http://insecure.example.com")
        .await
        .unwrap_err();
    let bad_sqs = sub("sqs", "https://sqs.us-east-1.amazonaws.com/1/q")
        .await
        .unwrap_err();
    let no_topic = sns
        .subscribe()
        .topic_arn(format!("{arn}-nope"))
        .protocol("sqs")
        .endpoint(sqs(1))
        .send()
        .await
        .unwrap_err();

    // THEN the modelled ones are taken (pending ones answered "pending confirmation"), the
    // others refused
    let shown: Vec<&str> = answers
        .iter()
        .map(|a| a.subscription_arn().unwrap())
        .collect();
    assert_eq!(&shown[..4], ["pending confirmation"; 4]);
    assert!(shown[4].starts_with(&format!("{arn}:")) && shown[5].starts_with(&format!("{arn}:")));
    assert_eq!(
        unknown.message(),
        Some("Invalid parameter: Amazon SNS does not support this protocol string: pigeon")
    );
    assert!(sms.message().unwrap().contains("not modelled"));
    assert_eq!(
        bad_email.message(),
        Some("Invalid parameter: Email address")
    );
    assert_eq!(bad_https.code(), Some("InvalidParameter"));
    assert_eq!(
        bad_sqs.message(),
        Some("Invalid parameter: SQS endpoint ARN")
    );
    assert_eq!(no_topic.code(), Some("NotFound"));
    assert_eq!(status(&no_topic), 404);
}

#[tokio::test]
async fn an_email_subscription_receives_nothing_until_confirmed() {
    // GIVEN a topic with an email subscription for team-a (pending) and a queue (confirmed)
    let env = env().await;
    let sns = sns(&env).await;
    let arn = topic(&sns, "notices").await;
    let answered = sns
        .subscribe()
        .topic_arn(&arn)
        .protocol("email")
        .endpoint(TEAM_A_EMAIL)
        .send()
        .await
        .unwrap();
    let queue = subscribe(&sns, &arn, "sqs", &sqs(1), None).await;
    let url = env.cloud.url();
    let (_, listed) = http(&url, "GET", "/_local/sns/subscriptions", None).await;
    let email = listed["subscriptions"][0]["subscription_arn"]
        .as_str()
        .unwrap()
        .to_string();
    let by_topic = sns
        .list_subscriptions_by_topic()
        .topic_arn(&arn)
        .send()
        .await
        .unwrap();

    // WHEN a notice is published, three days pass, the subscription is confirmed through the
    // control API, and another notice is published
    notice(&sns, &arn, "team-a", "Capacity Bought").await;
    env.cloud.step(TimeDelta::days(3));
    let (status, confirmed) = http(
        &url,
        "POST",
        "/_local/sns/subscriptions/confirm",
        Some(&json!({"topic_arn": arn, "endpoint": TEAM_A_EMAIL}).to_string()),
    )
    .await;
    notice(&sns, &arn, "team-a", "Capacity Lost").await;

    // THEN Subscribe answered "pending confirmation", the listing "PendingConfirmation", the
    // first notice reached the queue only and the second both (a pending subscription does not
    // expire: AWS's confirmation link does, a known gap)
    assert_eq!(answered.subscription_arn(), Some("pending confirmation"));
    assert_eq!(
        listed["subscriptions"][0],
        json!({
            "subscription_arn": email,
            "topic_arn": arn,
            "protocol": "email",
            "endpoint": TEAM_A_EMAIL,
            "confirmed": false,
            "filter_policy": null,
            "filter_policy_scope": "MessageAttributes",
            "raw_message_delivery": false,
        })
    );
    let members = by_topic.subscriptions();
    assert_eq!(members.len(), 2);
    assert_eq!(members[0].subscription_arn(), Some("PendingConfirmation"));
    assert_eq!(members[0].endpoint(), Some(TEAM_A_EMAIL));
    assert_eq!(members[0].owner(), Some("123456789012"));
    assert_eq!(members[1].subscription_arn(), Some(queue.as_str()));
    assert_eq!((status, confirmed), (200, json!({"confirmed": [email]})));
    assert_eq!(
        deliveries(&env),
        [vec![queue.clone()], vec![email.clone(), queue]]
    );
    let attrs = sns
        .get_subscription_attributes()
        .subscription_arn(&email)
        .send()
        .await
        .unwrap();
    assert_eq!(attrs.attributes().unwrap()["PendingConfirmation"], "false");
    // ... and nothing to confirm is 404
    let (status, _) = http(
        &url,
        "POST",
        "/_local/sns/subscriptions/confirm",
        Some(r#"{"subscription_arn": "arn:aws:sns:us-east-1:123456789012:notices:nope"}"#),
    )
    .await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn subscribing_again_answers_the_same_subscription_unless_its_attributes_differ() {
    // GIVEN a queue subscription with raw delivery and a team filter
    let env = env().await;
    let sns = sns(&env).await;
    let arn = topic(&sns, "notices").await;
    let policy = json!({"team": ["team-a"]}).to_string();
    let again = |attrs: &[(&str, &str)]| {
        let mut call = sns
            .subscribe()
            .topic_arn(&arn)
            .protocol("sqs")
            .endpoint(sqs(1))
            .return_subscription_arn(true);
        for (k, v) in attrs {
            call = call.attributes(*k, *v);
        }
        call.send()
    };
    let first = again(&[("RawMessageDelivery", "True"), ("FilterPolicy", &policy)])
        .await
        .unwrap();

    // WHEN it subscribes again with the same attributes, fewer, a default, and other ones
    let same = again(&[("RawMessageDelivery", "true"), ("FilterPolicy", &policy)]).await;
    let none = again(&[]).await;
    let default = again(&[("FilterPolicyScope", "MessageAttributes")]).await;
    let other = again(&[("RawMessageDelivery", "false")]).await.unwrap_err();
    let other_policy = again(&[("FilterPolicy", r#"{"team": ["team-b"]}"#)])
        .await
        .unwrap_err();

    // THEN the same subscription is answered, and other attributes are refused
    for answer in [same, none, default] {
        assert_eq!(answer.unwrap().subscription_arn(), first.subscription_arn());
    }
    for e in [other, other_policy] {
        assert_eq!(
            e.message(),
            Some(
                "Invalid parameter: Attributes Reason: Subscription already exists with \
                 different attributes"
            )
        );
    }
    assert_eq!(env.cloud.sns_subscriptions().len(), 1);
}

#[tokio::test]
async fn a_team_filter_policy_receives_only_its_own_team_s_messages() {
    // GIVEN team-a's and team-b's confirmed subscriptions with team filter policies, and an
    // unfiltered one
    let env = env().await;
    let sns = sns(&env).await;
    let arn = topic(&sns, "capacity-pilot-notices").await;
    let a = subscribe(
        &sns,
        &arn,
        "sqs",
        &sqs(1),
        Some(json!({"team": ["team-a"]})),
    )
    .await;
    let b = subscribe(
        &sns,
        &arn,
        "lambda",
        "arn:aws:lambda:us-east-1:123456789012:function:team-b",
        Some(json!({"team": ["team-b"], "detail_type": [{"prefix": "Capacity"}]})),
    )
    .await;
    let all = subscribe(&sns, &arn, "sqs", &sqs(3), None).await;

    // WHEN notices for team-a, team-b, team-c and one without a team are published
    notice(&sns, &arn, "team-a", "Capacity Bought").await;
    notice(&sns, &arn, "team-b", "Capacity Lost").await;
    notice(&sns, &arn, "team-b", "Budget Exceeded").await;
    notice(&sns, &arn, "team-c", "Capacity Bought").await;
    sns.publish()
        .topic_arn(&arn)
        .message("no team")
        .send()
        .await
        .unwrap();

    // THEN each team's subscription got only its team's notices (team-b's only its capacity
    // ones), the unfiltered one all
    assert_eq!(
        deliveries(&env),
        [
            vec![a, all.clone()],
            vec![b, all.clone()],
            vec![all.clone()],
            vec![all.clone()],
            vec![all],
        ]
    );
}

#[tokio::test]
async fn filter_policy_operators_follow_snss_matching() {
    // GIVEN one queue per operator
    let env = env().await;
    let sns = sns(&env).await;
    let arn = topic(&sns, "notices").await;
    let policies = [
        json!({"team": [{"prefix": "team-"}]}),
        json!({"team": [{"suffix": "-a"}]}),
        json!({"team": [{"anything-but": ["team-a", "team-b"]}]}),
        json!({"team": [{"anything-but": {"prefix": "team-"}}]}),
        json!({"request_id": [{"exists": false}]}),
        json!({"team": [{"equals-ignore-case": "TEAM-A"}]}),
        json!({"count": [{"numeric": [">", 0, "<=", 8]}]}),
        json!({"teams": ["team-a"]}),
    ];
    let mut subs = Vec::new();
    for (n, p) in policies.into_iter().enumerate() {
        subs.push(subscribe(&sns, &arn, "sqs", &sqs(n as u32), Some(p)).await);
    }
    let publish = |attrs: Vec<(&str, MessageAttributeValue)>| {
        let mut call = sns.publish().topic_arn(&arn).message("x");
        for (k, v) in attrs {
            call = call.message_attributes(k, v);
        }
        call.send()
    };

    // WHEN messages with various attributes are published
    publish(vec![
        ("team", string("team-a")),
        ("count", typed("Number", "4")),
    ])
    .await
    .unwrap();
    publish(vec![
        ("team", string("ops")),
        ("count", typed("Number", "9")),
    ])
    .await
    .unwrap();
    publish(vec![
        ("team", string("team-c")),
        ("request_id", string("r-1")),
        ("teams", typed("String.Array", r#"["team-b", "team-a"]"#)),
    ])
    .await
    .unwrap();

    // THEN each reached the subscriptions whose policy it satisfies
    let got: Vec<Vec<usize>> = deliveries(&env)
        .iter()
        .map(|d| {
            d.iter()
                .map(|arn| subs.iter().position(|s| s == arn).unwrap())
                .collect()
        })
        .collect();
    assert_eq!(
        got,
        [
            // prefix, suffix, no request_id, equals-ignore-case, 0 < 4 <= 8
            vec![0, 1, 4, 5, 6],
            // anything-but both lists, no request_id; 9 is out of range
            vec![2, 3, 4],
            // prefix, anything-but the two teams, the array's element
            vec![0, 2, 7],
        ]
    );
}

#[tokio::test]
async fn a_malformed_or_too_large_filter_policy_is_refused() {
    // GIVEN a topic and a queue subscription
    let env = env().await;
    let sns = sns(&env).await;
    let arn = topic(&sns, "notices").await;
    let sub = subscribe(&sns, &arn, "sqs", &sqs(1), None).await;
    let subscribe_with = |policy: &str| {
        sns.subscribe()
            .topic_arn(&arn)
            .protocol("sqs")
            .endpoint(sqs(2))
            .attributes("FilterPolicy", policy)
            .send()
    };
    let set = |policy: &str| {
        sns.set_subscription_attributes()
            .subscription_arn(&sub)
            .attribute_name("FilterPolicy")
            .attribute_value(policy)
            .send()
    };
    let six_keys = json!({"a": ["1"], "b": ["1"], "c": ["1"], "d": ["1"], "e": ["1"], "f": ["1"]});
    let values: Vec<String> = (0..13).map(|i| format!("v{i}")).collect();
    let complex = json!({"a": values, "b": values});

    // WHEN policies SNS refuses are given to Subscribe and to SetSubscriptionAttributes
    let not_json = subscribe_with("invalid-json").await.unwrap_err();
    let scalar = subscribe_with(r#"{"team": "team-a"}"#).await.unwrap_err();
    let bad_op = set(r#"{"team": [{"regex": ".*"}]}"#).await.unwrap_err();
    let nested = set(r#"{"detail": {"team": ["team-a"]}}"#)
        .await
        .unwrap_err();
    let too_many = set(&six_keys.to_string()).await.unwrap_err();
    let too_complex = subscribe_with(&complex.to_string()).await.unwrap_err();
    let or = set(r#"{"$or": [{"a": ["1"]}, {"b": ["1"]}]}"#)
        .await
        .unwrap_err();
    let five_keys = set(r#"{"a": ["1"], "b": ["1"], "c": ["1"], "d": ["1"], "e": ["1"]}"#).await;

    // THEN each is InvalidParameter with SNS's reason, after the operation's own prefix; five
    // keys are taken
    assert!(
        not_json.message().unwrap().starts_with(
            "Invalid parameter: Attributes Reason: FilterPolicy: failed to parse JSON."
        ),
        "{not_json:?}"
    );
    assert_eq!(
        scalar.message(),
        Some(
            "Invalid parameter: Attributes Reason: FilterPolicy: \"team\" must be an object or an \
             array"
        )
    );
    assert_eq!(
        bad_op.message(),
        Some("Invalid parameter: FilterPolicy: Unrecognized match type regex")
    );
    assert_eq!(
        nested.message(),
        Some(
            "Invalid parameter: Filter policy scope MessageAttributes does not support nested \
             filter policy"
        )
    );
    assert_eq!(
        too_many.message(),
        Some("Invalid parameter: FilterPolicy: Filter policy can not have more than 5 keys")
    );
    assert_eq!(
        too_complex.message(),
        Some("Invalid parameter: Attributes Reason: FilterPolicy: Filter policy is too complex")
    );
    assert!(or.message().unwrap().contains("not modelled"));
    let codes = [
        not_json.code(),
        scalar.code(),
        bad_op.code(),
        nested.code(),
        too_many.code(),
        too_complex.code(),
        or.code(),
    ];
    assert_eq!(codes, [Some("InvalidParameter"); 7]);
    assert!(five_keys.is_ok());
    assert_eq!(
        env.cloud.sns_subscriptions().len(),
        1,
        "no refused Subscribe kept"
    );
}

#[tokio::test]
async fn a_message_body_filter_policy_matches_the_json_body() {
    // GIVEN a subscription filtering the message body with a nested policy
    let env = env().await;
    let sns = sns(&env).await;
    let arn = topic(&sns, "notices").await;
    let sub = sns
        .subscribe()
        .topic_arn(&arn)
        .protocol("sqs")
        .endpoint(sqs(1))
        .attributes("FilterPolicyScope", "MessageBody")
        .attributes(
            "FilterPolicy",
            json!({"detail": {"team": ["team-a"]}}).to_string(),
        )
        .send()
        .await
        .unwrap()
        .subscription_arn()
        .unwrap()
        .to_string();

    // WHEN JSON bodies for team-a and team-b, a dotted key, and a text body are published
    for body in [
        json!({"detail": {"team": "team-a"}}).to_string(),
        json!({"detail": {"team": "team-b"}}).to_string(),
        json!({"detail.team": "team-a"}).to_string(),
        "team-a".to_string(),
    ] {
        sns.publish()
            .topic_arn(&arn)
            .message(body)
            .message_attributes("team", string("team-a"))
            .send()
            .await
            .unwrap();
    }

    // THEN the body decides, not the attributes
    assert_eq!(
        deliveries(&env),
        [vec![sub.clone()], vec![], vec![sub], vec![]]
    );
}

#[tokio::test]
async fn subscription_attributes_are_read_and_changed() {
    // GIVEN a queue subscription and an email one
    let env = env().await;
    let sns = sns(&env).await;
    let arn = topic(&sns, "notices").await;
    let queue = subscribe(&sns, &arn, "sqs", &sqs(1), None).await;
    let email = subscribe(&sns, &arn, "email", TEAM_A_EMAIL, None).await;
    let set = |sub: &str, name: &str, value: &str| {
        sns.set_subscription_attributes()
            .subscription_arn(sub)
            .attribute_name(name)
            .attribute_value(value)
            .send()
    };
    let get = |sub: String| async {
        sns.get_subscription_attributes()
            .subscription_arn(sub)
            .send()
            .await
            .unwrap()
            .attributes()
            .unwrap()
            .clone()
    };
    let before = get(queue.clone()).await;

    // WHEN its filter policy, scope and raw delivery are set, and wrong values given
    set(&queue, "FilterPolicy", r#"{"team": ["team-a"]}"#)
        .await
        .unwrap();
    set(&queue, "RawMessageDelivery", "TRUE").await.unwrap();
    let after = get(queue.clone()).await;
    let bad_raw = set(&queue, "RawMessageDelivery", "yes").await.unwrap_err();
    let bad_scope = set(&queue, "FilterPolicyScope", "Everything")
        .await
        .unwrap_err();
    let bad_name = set(&queue, "Colour", "blue").await.unwrap_err();
    let raw_email = set(&email, "RawMessageDelivery", "true").await.unwrap_err();
    let missing = set(
        &format!("{arn}:00000000-0000-0000-0000-000000000000"),
        "RawMessageDelivery",
        "true",
    )
    .await
    .unwrap_err();
    set(&queue, "FilterPolicy", "").await.unwrap();
    let cleared = get(queue.clone()).await;

    // THEN the attributes read back as set, and the wrong ones are refused
    let expect: HashMap<String, String> = [
        ("SubscriptionArn", queue.as_str()),
        ("TopicArn", arn.as_str()),
        ("Owner", "123456789012"),
        ("Protocol", "sqs"),
        ("Endpoint", sqs(1).as_str()),
        ("PendingConfirmation", "false"),
        ("ConfirmationWasAuthenticated", "true"),
        ("RawMessageDelivery", "false"),
        (
            "SubscriptionPrincipal",
            "arn:aws:iam::123456789012:user/AKIDLOCALCLOUD",
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert_eq!(before, expect);
    assert_eq!(after["FilterPolicy"], r#"{"team": ["team-a"]}"#);
    assert_eq!(after["FilterPolicyScope"], "MessageAttributes");
    assert_eq!(after["RawMessageDelivery"], "true");
    assert_eq!(
        bad_raw.message(),
        Some("Invalid parameter: RawMessageDelivery: Invalid value [yes]. Must be true or false.")
    );
    assert_eq!(
        bad_scope.message(),
        Some(
            "Invalid parameter: FilterPolicyScope: Invalid value [Everything]. Please use either \
             MessageBody or MessageAttributes"
        )
    );
    assert_eq!(bad_name.message(), Some("Invalid parameter: AttributeName"));
    assert_eq!(raw_email.code(), Some("InvalidParameter"));
    assert_eq!(missing.code(), Some("NotFound"));
    assert_eq!(status(&missing), 404);
    assert!(
        !cleared.contains_key("FilterPolicy"),
        "an empty policy removes it"
    );
    let pending = get(email).await;
    assert_eq!(pending["PendingConfirmation"], "true");
    assert_eq!(pending["ConfirmationWasAuthenticated"], "false");
}

#[tokio::test]
async fn an_unsubscribed_subscription_receives_nothing_more() {
    // GIVEN a queue subscription that has received one notice
    let env = env().await;
    let sns = sns(&env).await;
    let arn = topic(&sns, "notices").await;
    let sub = subscribe(&sns, &arn, "sqs", &sqs(1), None).await;
    notice(&sns, &arn, "team-a", "Capacity Bought").await;

    // WHEN it unsubscribes (twice, and once with a malformed ARN) and another is published
    sns.unsubscribe()
        .subscription_arn(&sub)
        .send()
        .await
        .unwrap();
    let twice = sns.unsubscribe().subscription_arn(&sub).send().await;
    let malformed = sns
        .unsubscribe()
        .subscription_arn("pending confirmation")
        .send()
        .await
        .unwrap_err();
    notice(&sns, &arn, "team-a", "Capacity Lost").await;

    // THEN the second notice reached nobody; unsubscribing again is no error
    assert_eq!(deliveries(&env), [vec![sub], vec![]]);
    assert!(twice.is_ok());
    assert_eq!(
        malformed.message(),
        Some(
            "Invalid parameter: SubscriptionArn Reason: An ARN must have at least 6 elements, \
             not 1"
        )
    );
    let listed = sns
        .list_subscriptions_by_topic()
        .topic_arn(&arn)
        .send()
        .await
        .unwrap();
    assert!(listed.subscriptions().is_empty());
    assert!(listed.next_token().is_none());
}

#[tokio::test]
async fn another_accounts_topic_is_not_authorized() {
    // GIVEN a topic of the emulator's account, and a caller of another account
    let env = env().await;
    let sns = sns(&env).await;
    let arn = topic(&sns, "notices").await;
    env.cloud
        .with_world(|w| w.put_identity("AKIDBOB", "arn:aws:iam::210987654321:user/bob"))
        .unwrap();
    let bob = client(&env, "us-east-1", "AKIDBOB").await;

    // WHEN the other account publishes to it and subscribes to it
    let publish = bob
        .publish()
        .topic_arn(&arn)
        .message("x")
        .send()
        .await
        .unwrap_err();
    let subscribe = bob
        .subscribe()
        .topic_arn(&arn)
        .protocol("sqs")
        .endpoint("arn:aws:sqs:us-east-1:210987654321:q")
        .send()
        .await
        .unwrap_err();

    // THEN both are HTTP 403 AuthorizationError naming the caller (the default topic policy
    // allows only the owner's account)
    let refusals = [
        (
            publish.code(),
            publish.message(),
            status(&publish),
            "Publish",
        ),
        (
            subscribe.code(),
            subscribe.message(),
            status(&subscribe),
            "Subscribe",
        ),
    ];
    for (code, message, status, action) in refusals {
        assert_eq!(code, Some("AuthorizationError"));
        assert_eq!(status, 403);
        assert_eq!(
            message,
            Some(
                format!(
                    "User: arn:aws:iam::210987654321:user/bob is not authorized to perform: \
                     SNS:{action} on resource: {arn} because no resource-based policy allows \
                     the SNS:{action} action"
                )
                .as_str()
            )
        );
    }
    assert!(env.cloud.sns_messages().is_empty());
}

#[tokio::test]
async fn sns_calls_are_counted_and_take_injected_faults() {
    // GIVEN a topic, and faults on Publish: a throttle, an internal error, a custom error, a
    // lost response
    let env = env().await;
    let sns = sns(&env).await;
    let arn = topic(&sns, "notices").await;
    let once = |kind: FaultKind| Fault {
        operation: "Publish".into(),
        kind,
        count: Some(1),
    };
    env.cloud.inject(once(FaultKind::Throttle));
    env.cloud.inject(once(FaultKind::InternalError));
    env.cloud.inject(Fault::error(
        "Publish",
        400,
        "KMSAccessDenied",
        "The ciphertext refers to a customer master key that does not exist",
        Some(1),
    ));
    env.cloud.inject(once(FaultKind::LostResponse));
    let publish = || sns.publish().topic_arn(&arn).message("x").send();

    // WHEN Publish is called five times, and an operation SNS has but the emulator does not
    let throttled = publish().await.unwrap_err();
    let failed = publish().await.unwrap_err();
    let custom = publish().await.unwrap_err();
    let lost = publish().await.unwrap_err();
    let published = publish().await;
    let unmodelled = sns.list_topics().send().await.unwrap_err();

    // THEN the faults answer in awsQuery's shape, in order, and nothing is recorded for them
    // but the lost response (done, then 500); every call is counted under sns
    assert_eq!(throttled.code(), Some("Throttling"));
    assert_eq!(status(&throttled), 400);
    assert_eq!(failed.code(), Some("InternalError"));
    assert!(
        failed
            .as_service_error()
            .is_some_and(|e| e.is_internal_error_exception())
    );
    assert_eq!(status(&failed), 500);
    assert_eq!(custom.code(), Some("KMSAccessDenied"));
    assert!(
        custom
            .as_service_error()
            .is_some_and(|e| e.is_kms_access_denied_exception())
    );
    assert_eq!(status(&lost), 500);
    assert!(published.is_ok());
    assert_eq!(
        env.cloud.sns_messages().len(),
        2,
        "the lost one and the last"
    );
    assert_eq!(unmodelled.code(), Some("InvalidAction"));
    let (calls, publishes) = env
        .cloud
        .with_world(|w| (w.calls.clone(), w.operations.get("Publish").copied()));
    assert_eq!(calls.get("sns"), Some(&7));
    assert_eq!(publishes, Some(5));
    assert_eq!(calls.get("ec2"), None);
    // ... and an unsigned SNS request is refused
    let (status, body) = http(
        &env.cloud.url(),
        "POST",
        "/",
        Some("Action=ListTopics&Version=2010-03-31"),
    )
    .await;
    assert_eq!(status, 403);
    assert!(
        body.as_str()
            .is_some_and(|b| b.contains("<Code>MissingAuthenticationToken</Code>")),
        "{body}"
    );
}

#[tokio::test]
async fn each_matching_subscription_receives_a_message_exactly_once() {
    // GIVEN two queues and a function, all matching
    let env = env().await;
    let sns = sns(&env).await;
    let arn = topic(&sns, "notices").await;
    let subs = [
        subscribe(&sns, &arn, "sqs", &sqs(1), None).await,
        subscribe(
            &sns,
            &arn,
            "sqs",
            &sqs(2),
            Some(json!({"team": ["team-a"]})),
        )
        .await,
        subscribe(
            &sns,
            &arn,
            "lambda",
            "arn:aws:lambda:us-east-1:123456789012:function:f",
            None,
        )
        .await,
    ];

    // WHEN one notice is published
    notice(&sns, &arn, "team-a", "Capacity Bought").await;

    // THEN each subscription got it once: no duplicate (AWS may deliver twice: a known gap)
    assert_eq!(deliveries(&env), [subs.to_vec()]);
}

#[tokio::test]
async fn deliveries_are_recorded_not_sent_and_redrive_policies_are_only_stored() {
    // GIVEN a confirmed email subscription to an address nobody reads, and a queue with a
    // redrive policy naming a dead-letter queue
    let env = env().await;
    let sns = sns(&env).await;
    let arn = topic(&sns, "notices").await;
    let email = subscribe(&sns, &arn, "email", "nobody@invalid.example", None).await;
    env.cloud.confirm_sns_subscription(&email).unwrap();
    let redrive = json!({"deadLetterTargetArn": sqs(99)}).to_string();
    let queue = sns
        .subscribe()
        .topic_arn(&arn)
        .protocol("sqs")
        .endpoint(sqs(1))
        .attributes("RedrivePolicy", &redrive)
        .send()
        .await
        .unwrap()
        .subscription_arn()
        .unwrap()
        .to_string();

    // WHEN a notice is published
    notice(&sns, &arn, "team-a", "Capacity Bought").await;

    // THEN it is recorded as delivered to both (nothing is sent, nothing fails, nothing is
    // retried or dead-lettered), and the redrive policy is only shown back
    assert_eq!(deliveries(&env), [vec![email, queue.clone()]]);
    let attrs = sns
        .get_subscription_attributes()
        .subscription_arn(&queue)
        .send()
        .await
        .unwrap();
    assert_eq!(attrs.attributes().unwrap()["RedrivePolicy"], redrive);
}

#[tokio::test]
async fn a_changed_filter_policy_applies_to_the_next_publish() {
    // GIVEN a queue filtering for team-a
    let env = env().await;
    let sns = sns(&env).await;
    let arn = topic(&sns, "notices").await;
    let sub = subscribe(
        &sns,
        &arn,
        "sqs",
        &sqs(1),
        Some(json!({"team": ["team-a"]})),
    )
    .await;

    // WHEN its policy is changed to team-b and team-b's notice published at once
    sns.set_subscription_attributes()
        .subscription_arn(&sub)
        .attribute_name("FilterPolicy")
        .attribute_value(json!({"team": ["team-b"]}).to_string())
        .send()
        .await
        .unwrap();
    notice(&sns, &arn, "team-b", "Capacity Bought").await;
    notice(&sns, &arn, "team-a", "Capacity Bought").await;

    // THEN the new policy already applies (AWS: up to 15 minutes; a known gap)
    assert_eq!(deliveries(&env), [vec![sub], vec![]]);
}
