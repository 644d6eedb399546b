//! SNS `Publish` behind `NoticeSink`: each notice to the notices topic (ARCHITECTURE §9.2),
//! one call each, with its subject, its plain-text body and the String message attributes a
//! team's filter policy reads (`team`, `detail_type`, `request_id`). The SDK retries
//! throttling and transient errors; what still fails is reported, and the outbox keeps its
//! event for the next run.

use aws_config::SdkConfig;
use aws_sdk_sns::Client;
use aws_sdk_sns::types::MessageAttributeValue;

use super::error::{Call, classify};
use crate::domain::notices::Notice;
use crate::ports::{NoticeSink, PortError, PublishReport};

pub const SERVICE: &str = "sns";

/// What SNS answers for a message it will never take as it is (its subject, body or
/// attributes), as opposed to a topic, key or permission problem that fixing the deployment
/// cures. Such a notice is sent once more in a plain fallback form, and dropped, loudly, if
/// that is refused too: one malformed notice must not hold its event in the outbox for ever
/// (republished to the bus on every run).
const MESSAGE_REFUSED: &[&str] = &[
    "InvalidParameter",
    "ParameterValueInvalid",
    "InvalidParameterValue",
];

/// The fallback body's length at most: well under SNS's 256 KiB.
const FALLBACK_BODY_BYTES: usize = 64 * 1024;

/// `n` in a form SNS takes whatever went wrong with it: a plain subject naming the
/// detail-type, and the body cut short, ASCII only.
fn fallback(n: &Notice) -> Notice {
    let mut body: String = n
        .body
        .chars()
        .map(|c| if c.is_ascii() { c } else { '?' })
        .take(FALLBACK_BODY_BYTES)
        .collect();
    if body.len() < n.body.len() {
        body.push_str("\n[cut short]");
    }
    Notice {
        subject: crate::domain::notices::subject_line(&format!(
            "capacity-pilot: {}",
            n.detail_type
        )),
        body,
        ..n.clone()
    }
}

/// Publishes notices to one topic.
#[derive(Clone, Debug)]
pub struct SnsNotices {
    client: Client,
    topic_arn: String,
}

impl SnsNotices {
    /// The topic `topic_arn` (`NOTICES_TOPIC_ARN`), in the ARN's region.
    pub fn new(config: &SdkConfig, topic_arn: impl Into<String>) -> SnsNotices {
        let topic_arn = topic_arn.into();
        // A topic is called in its own region: the ARN's fourth field.
        let client = match topic_arn.split(':').nth(3).filter(|r| !r.is_empty()) {
            Some(region) => Client::from_conf(
                aws_sdk_sns::config::Builder::from(config)
                    .region(aws_sdk_sns::config::Region::new(region.to_string()))
                    .build(),
            ),
            None => Client::new(config),
        };
        SnsNotices::from_client(client, topic_arn)
    }

    pub fn from_client(client: Client, topic_arn: impl Into<String>) -> SnsNotices {
        SnsNotices {
            client,
            topic_arn: topic_arn.into(),
        }
    }

    async fn publish_one(&self, notice: &Notice) -> Result<(), PortError> {
        let mut call = self
            .client
            .publish()
            .topic_arn(&self.topic_arn)
            .subject(&notice.subject)
            .message(&notice.body);
        for (name, value) in notice.attributes() {
            let v = MessageAttributeValue::builder()
                .data_type("String")
                .string_value(value)
                .build()
                .map_err(|e| PortError::Permanent {
                    service: SERVICE,
                    code: "InvalidAttribute".into(),
                    message: e.to_string(),
                })?;
            call = call.message_attributes(name, v);
        }
        call.send()
            .await
            .map(|_| ())
            .map_err(|e| classify(SERVICE, "Publish", Call::Retryable, e))
    }
}

impl NoticeSink for SnsNotices {
    async fn notify(&self, notices: &[(String, Notice)]) -> Result<PublishReport, PortError> {
        let mut report = PublishReport::default();
        for (key, notice) in notices {
            let mut outcome = self.publish_one(notice).await;
            if let Err(e) = &outcome
                && e.code().is_some_and(|c| MESSAGE_REFUSED.contains(&c))
            {
                tracing::warn!(event_key = %key, detail_type = %notice.detail_type, error = %e,
                    "notice refused as written; sending its plain form");
                outcome = match self.publish_one(&fallback(notice)).await {
                    Err(e) if e.code().is_some_and(|c| MESSAGE_REFUSED.contains(&c)) => {
                        tracing::error!(alert = "notice-dropped", event_key = %key,
                            detail_type = %notice.detail_type, error = %e,
                            "notice refused even in its plain form: dropped; its event is published");
                        Ok(())
                    }
                    other => other,
                };
            }
            match outcome {
                Ok(()) => report.sent.push(key.clone()),
                Err(e) => {
                    tracing::warn!(event_key = %key, detail_type = %notice.detail_type,
                        error = %e, "notice not published");
                    report.failed.push((
                        key.clone(),
                        e.code().unwrap_or("OutcomeUnknown").to_string(),
                        e.to_string(),
                    ));
                }
            }
        }
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_sns::operation::publish::{PublishError, PublishOutput};
    use aws_smithy_mocks::{RuleMode, mock};

    fn client(rules: &[&aws_smithy_mocks::Rule]) -> Client {
        let mut interceptor =
            aws_smithy_mocks::MockResponseInterceptor::new().rule_mode(RuleMode::MatchAny);
        for r in rules {
            interceptor = interceptor.with_rule(r);
        }
        let conf = aws_sdk_sns::Config::builder()
            .behavior_version(aws_sdk_sns::config::BehaviorVersion::latest())
            .region(aws_sdk_sns::config::Region::new("us-east-1"))
            .credentials_provider(aws_sdk_sns::config::Credentials::new(
                "AKID", "SECRET", None, None, "test",
            ))
            .retry_config(aws_sdk_sns::config::retry::RetryConfig::disabled())
            .http_client(aws_smithy_mocks::create_mock_http_client())
            .interceptor(interceptor)
            .build();
        Client::from_conf(conf)
    }

    fn notice(team: Option<&str>) -> Notice {
        Notice {
            subject: "r1 reserved".into(),
            body: "Request r1 is reserved.".into(),
            team: team.map(str::to_string),
            detail_type: "Capacity Reserved".into(),
            request_id: Some("r1".into()),
        }
    }

    #[tokio::test]
    async fn a_notice_is_published_with_its_subject_body_and_filter_attributes() {
        let ok = mock!(Client::publish)
            .match_requests(|r| {
                let attrs = r.message_attributes().cloned().unwrap_or_default();
                let s = |k: &str| {
                    attrs
                        .get(k)
                        .and_then(|v| v.string_value())
                        .map(str::to_string)
                };
                r.topic_arn() == Some("arn:aws:sns:us-east-1:123456789012:notices")
                    && r.subject() == Some("r1 reserved")
                    && r.message() == Some("Request r1 is reserved.")
                    && s("team").as_deref() == Some("ml-eval")
                    && s("detail_type").as_deref() == Some("Capacity Reserved")
                    && s("request_id").as_deref() == Some("r1")
                    && attrs.values().all(|v| v.data_type() == "String")
            })
            .then_output(|| PublishOutput::builder().message_id("m-1").build());
        let sink =
            SnsNotices::from_client(client(&[&ok]), "arn:aws:sns:us-east-1:123456789012:notices");
        let report = sink
            .notify(&[("r1:reserved:v3".into(), notice(Some("ml-eval")))])
            .await
            .unwrap();
        assert_eq!(report.sent, vec!["r1:reserved:v3".to_string()]);
        assert!(report.failed.is_empty());
        assert_eq!(ok.num_calls(), 1);
    }

    #[tokio::test]
    async fn a_notice_refused_as_written_goes_in_its_plain_form_and_is_never_held_for_ever() {
        let refused = mock!(Client::publish)
            .match_requests(|r| r.subject() == Some("r1 reserved"))
            .then_error(|| {
                PublishError::generic(
                    aws_smithy_types::error::ErrorMetadata::builder()
                        .code("InvalidParameter")
                        .message("Invalid parameter: Subject")
                        .build(),
                )
            });
        let plain = mock!(Client::publish)
            .match_requests(|r| r.subject() == Some("capacity-pilot: Capacity Reserved"))
            .then_output(|| PublishOutput::builder().message_id("m-3").build());
        let sink = SnsNotices::from_client(
            client(&[&refused, &plain]),
            "arn:aws:sns:us-east-1:123456789012:notices",
        );
        let report = sink
            .notify(&[("k".into(), notice(Some("a")))])
            .await
            .unwrap();
        assert_eq!(report.sent, vec!["k".to_string()]);
        assert_eq!((refused.num_calls(), plain.num_calls()), (1, 1));
        // AND refused in both forms, it is dropped: its event is not held back
        let never = mock!(Client::publish).then_error(|| {
            PublishError::generic(
                aws_smithy_types::error::ErrorMetadata::builder()
                    .code("ParameterValueInvalid")
                    .message("bad")
                    .build(),
            )
        });
        let sink = SnsNotices::from_client(
            client(&[&never]),
            "arn:aws:sns:us-east-1:123456789012:notices",
        );
        let report = sink
            .notify(&[("k".into(), notice(Some("a")))])
            .await
            .unwrap();
        assert_eq!(report.sent, vec!["k".to_string()]);
        assert_eq!(never.num_calls(), 2);
    }

    #[tokio::test]
    async fn a_refused_notice_is_reported_with_its_code_and_the_rest_still_go() {
        let refused = mock!(Client::publish)
            .match_requests(|r| r.message_attributes().and_then(|a| a.get("team")).is_none())
            .then_error(|| {
                PublishError::generic(
                    aws_smithy_types::error::ErrorMetadata::builder()
                        .code("AuthorizationError")
                        .message("not authorized to publish")
                        .build(),
                )
            });
        let ok = mock!(Client::publish)
            .match_requests(|r| r.message_attributes().and_then(|a| a.get("team")).is_some())
            .then_output(|| PublishOutput::builder().message_id("m-2").build());
        let sink = SnsNotices::from_client(
            client(&[&refused, &ok]),
            "arn:aws:sns:us-east-1:123456789012:notices",
        );
        let report = sink
            .notify(&[
                ("k-none".into(), notice(None)),
                ("k-team".into(), notice(Some("a"))),
            ])
            .await
            .unwrap();
        assert_eq!(report.sent, vec!["k-team".to_string()]);
        assert_eq!(report.failed.len(), 1);
        assert_eq!(report.failed[0].0, "k-none");
        assert_eq!(report.failed[0].1, "AuthorizationError");
    }
}
