//! Builds an emulator and SDK clients the way production code builds them: one `SdkConfig` whose
//! endpoint is the test's own local-cloud.

use aws_config::retry::RetryConfig;
use aws_sdk_ec2::config::{Credentials, Region};
use chrono::{DateTime, Utc};
use local_cloud::{LocalCloud, Options, Settings};
use serde_json::Value;

/// Every test starts its clock here unless it says otherwise.
pub const T0: &str = "2026-09-01T08:00:00Z";

pub fn t0() -> DateTime<Utc> {
    T0.parse().expect("valid")
}

pub fn at(s: &str) -> DateTime<Utc> {
    s.parse().expect("valid RFC 3339")
}

pub struct Env {
    pub cloud: LocalCloud,
    pub ec2: aws_sdk_ec2::Client,
    pub sm: aws_sdk_sagemaker::Client,
    pub eb: aws_sdk_eventbridge::Client,
}

pub async fn sdk_config(url: &str, region: &'static str, retries: bool) -> aws_config::SdkConfig {
    sdk_config_as(url, region, "AKIDLOCALCLOUD", retries).await
}

/// The same, signing with another access key id (STS answers who it belongs to).
pub async fn sdk_config_as(
    url: &str,
    region: &'static str,
    access_key_id: &str,
    retries: bool,
) -> aws_config::SdkConfig {
    let retry = if retries {
        RetryConfig::standard()
    } else {
        RetryConfig::disabled()
    };
    capacity_pilot::aws::wiring::sdk_loader()
        .endpoint_url(url)
        .region(Region::new(region))
        .credentials_provider(Credentials::new(
            access_key_id,
            "local-cloud-secret",
            None,
            None,
            "local-cloud-tests",
        ))
        .retry_config(retry)
        .load()
        .await
}

pub async fn env() -> Env {
    env_with(Options {
        seed: 42,
        start: Some(t0()),
        ..Options::default()
    })
    .await
}

/// The default environment with these settings.
pub async fn env_with_settings(settings: Settings) -> Env {
    env_with(Options {
        seed: 42,
        start: Some(t0()),
        settings,
        ..Options::default()
    })
    .await
}

pub async fn env_with(options: Options) -> Env {
    env_in(options, "us-east-1").await
}

pub async fn env_in(options: Options, region: &'static str) -> Env {
    let cloud = LocalCloud::start(options).await.expect("emulator starts");
    let conf = sdk_config(&cloud.url(), region, false).await;
    Env {
        ec2: aws_sdk_ec2::Client::new(&conf),
        sm: aws_sdk_sagemaker::Client::new(&conf),
        eb: aws_sdk_eventbridge::Client::new(&conf),
        cloud,
    }
}

/// Converts an SDK timestamp.
pub fn chrono_of(t: &aws_smithy_types::DateTime) -> DateTime<Utc> {
    DateTime::from_timestamp(t.secs(), t.subsec_nanos()).expect("in range")
}

/// Converts to an SDK timestamp.
pub fn smithy_of(t: DateTime<Utc>) -> aws_smithy_types::DateTime {
    aws_smithy_types::DateTime::from_secs(t.timestamp())
}

/// Events on the default bus with this detail-type.
pub fn events_of(cloud: &LocalCloud, detail_type: &str) -> Vec<Value> {
    cloud
        .events("default")
        .into_iter()
        .filter(|e| e["detail-type"] == detail_type)
        .collect()
}

/// A minimal HTTP/1.1 client for the control API, so the routes are tested as other processes
/// use them.
pub async fn http(url: &str, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = url.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connects");
    let body = body.unwrap_or("");
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(req.as_bytes()).await.expect("writes");
    let mut buf = Vec::new();
    stream.read_to_end(&mut buf).await.expect("reads");
    let text = String::from_utf8_lossy(&buf).to_string();
    let status: u16 = text[9..12].parse().expect("status code");
    let (head, rest) = text.split_once("\r\n\r\n").expect("head and body");
    let rest = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(rest)
    } else {
        rest.to_string()
    };
    let json = if rest.trim().is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&rest).unwrap_or(Value::String(rest))
    };
    (status, json)
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        s = &rest[n + 2..];
    }
    out
}

/// Creates SageMaker model `name` (what an endpoint config's variant names) in `env`'s region.
pub async fn create_model(env: &Env, name: &str) {
    env.sm
        .create_model()
        .model_name(name)
        .execution_role_arn("arn:aws:iam::123456789012:role/sm")
        .send()
        .await
        .expect("CreateModel");
}
