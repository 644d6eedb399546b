//! The `Clock` adapters: the system clock in production, and for local runs the emulator's
//! simulated clock, read over HTTP from `CAPACITY_PILOT_CLOCK_URL` (`{"now": "<RFC 3339>"}`).

use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;

use crate::ports::{Clock, PortError};

const SERVICE: &str = "clock";
const TIMEOUT: Duration = Duration::from_secs(5);

/// The real time.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl SystemClock {
    /// The wall clock: the one place production code reads it (ARCHITECTURE §8.12).
    pub fn wall() -> DateTime<Utc> {
        Utc::now()
    }
}

impl Clock for SystemClock {
    async fn now(&self) -> Result<DateTime<Utc>, PortError> {
        Ok(SystemClock::wall())
    }
}

/// A clock read from a URL (plain HTTP: it is only ever a local emulator).
#[derive(Debug, Clone)]
pub struct HttpClock {
    url: http::Uri,
    client: Client<HttpConnector, Empty<Bytes>>,
}

#[derive(Deserialize)]
struct Now {
    now: String,
}

fn unavailable(code: &str, message: impl Into<String>) -> PortError {
    PortError::Transient {
        service: SERVICE,
        code: code.to_string(),
        message: message.into(),
    }
}

impl HttpClock {
    pub fn new(url: &str) -> Result<HttpClock, PortError> {
        let url: http::Uri = url.parse().map_err(|e| PortError::Permanent {
            service: SERVICE,
            code: "InvalidClockUrl".to_string(),
            message: format!("{url:?}: {e}"),
        })?;
        if url.scheme_str() != Some("http") {
            return Err(PortError::Permanent {
                service: SERVICE,
                code: "InvalidClockUrl".to_string(),
                message: format!("{url}: only http:// URLs are supported"),
            });
        }
        let client = Client::builder(TokioExecutor::new()).build_http();
        Ok(HttpClock { url, client })
    }

    async fn read(&self) -> Result<DateTime<Utc>, PortError> {
        let res = self
            .client
            .get(self.url.clone())
            .await
            .map_err(|e| unavailable("ClockUnreachable", format!("GET {}: {e}", self.url)))?;
        let status = res.status();
        let body = res
            .into_body()
            .collect()
            .await
            .map_err(|e| unavailable("ClockUnreachable", format!("GET {}: {e}", self.url)))?
            .to_bytes();
        if !status.is_success() {
            return Err(unavailable(
                "ClockError",
                format!(
                    "GET {}: HTTP {status}: {}",
                    self.url,
                    String::from_utf8_lossy(&body)
                ),
            ));
        }
        let now: Now = serde_json::from_slice(&body).map_err(|e| PortError::Permanent {
            service: SERVICE,
            code: "MalformedClock".to_string(),
            message: format!("GET {}: {e}", self.url),
        })?;
        DateTime::parse_from_rfc3339(&now.now)
            .map(|t| t.with_timezone(&Utc))
            .map_err(|e| PortError::Permanent {
                service: SERVICE,
                code: "MalformedClock".to_string(),
                message: format!("GET {}: now {:?}: {e}", self.url, now.now),
            })
    }
}

impl Clock for HttpClock {
    async fn now(&self) -> Result<DateTime<Utc>, PortError> {
        tokio::time::timeout(TIMEOUT, self.read())
            .await
            .map_err(|_| unavailable("ClockTimeout", format!("GET {}: timed out", self.url)))?
    }
}

/// The clock the configuration asks for: `CAPACITY_PILOT_CLOCK_URL` set means the
/// simulated clock, unset the system clock.
#[derive(Debug, Clone)]
pub enum ConfiguredClock {
    System(SystemClock),
    /// Boxed: the HTTP client is much larger than the unit system clock.
    Http(Box<HttpClock>),
}

impl ConfiguredClock {
    pub fn from_url(url: Option<&str>) -> Result<ConfiguredClock, PortError> {
        match url {
            None => Ok(ConfiguredClock::System(SystemClock)),
            Some(u) => HttpClock::new(u).map(|c| ConfiguredClock::Http(Box::new(c))),
        }
    }
}

impl Clock for ConfiguredClock {
    async fn now(&self) -> Result<DateTime<Utc>, PortError> {
        match self {
            ConfiguredClock::System(c) => c.now().await,
            ConfiguredClock::Http(c) => c.now().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// Serves one HTTP response to each connection.
    async fn serve(status: &'static str, body: &'static str) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf).await;
                let resp = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(resp.as_bytes()).await;
            }
        });
        format!("http://{addr}/_local/clock")
    }

    #[tokio::test]
    async fn the_http_clock_reads_the_simulated_time() {
        let url = serve("200 OK", r#"{"now":"2026-12-07T11:30:00Z"}"#).await;
        let clock = ConfiguredClock::from_url(Some(&url)).unwrap();
        let now = clock.now().await.unwrap();
        assert_eq!(now.to_rfc3339(), "2026-12-07T11:30:00+00:00");
    }

    #[tokio::test]
    async fn a_clock_answering_garbage_is_an_error_naming_the_url() {
        let url = serve("200 OK", r#"{"time":"x"}"#).await;
        let err = HttpClock::new(&url).unwrap().now().await.unwrap_err();
        assert_eq!(err.code(), Some("MalformedClock"));
        assert!(err.to_string().contains(&url), "{err}");
    }

    #[tokio::test]
    async fn no_url_means_the_system_clock() {
        let clock = ConfiguredClock::from_url(None).unwrap();
        assert!(matches!(clock, ConfiguredClock::System(_)));
        let now = clock.now().await.unwrap();
        assert!((Utc::now() - now).num_seconds().abs() < 5);
    }

    #[test]
    fn an_https_url_is_refused() {
        assert!(HttpClock::new("https://example.com/clock").is_err());
    }
}
