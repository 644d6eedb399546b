//! Records every AWS operation a client makes, at the SDK's HTTP client: the operation is
//! read from the request as the service's protocol names it (`X-Amz-Target` for the JSON
//! protocols, `Action=` for EC2's query protocol). Each function in a flow gets its own
//! recorder, so the IAM test can compare what each function called with what the template
//! grants it. Nothing in production code knows about it: it is passed as the SDK's HTTP
//! client, as any other HTTP client would be.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use aws_smithy_runtime_api::client::http::{
    HttpClient, HttpConnector, HttpConnectorFuture, HttpConnectorSettings, SharedHttpClient,
    SharedHttpConnector,
};
use aws_smithy_runtime_api::client::orchestrator::HttpRequest;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;

/// `(service, operation)`, e.g. `("ec2", "RunInstances")`, `("dynamodb", "TransactWriteItems")`.
pub type Operation = (String, String);

/// The operations seen, shared by every client built with [`Calls::http_client`].
#[derive(Clone, Debug, Default)]
pub struct Calls {
    seen: Arc<Mutex<BTreeSet<Operation>>>,
    /// Every call, in order.
    log: Arc<Mutex<Vec<Operation>>>,
    /// Every call's body, in order.
    bodies: Arc<Mutex<Vec<(Operation, String)>>>,
}

impl Calls {
    pub fn seen(&self) -> BTreeSet<Operation> {
        self.seen.lock().unwrap().clone()
    }

    /// Every call so far, in the order made.
    pub fn log(&self) -> Vec<Operation> {
        self.log.lock().unwrap().clone()
    }

    /// Every call so far with its request body, in the order made.
    pub fn bodies(&self) -> Vec<(Operation, String)> {
        self.bodies.lock().unwrap().clone()
    }

    /// The functions' own SDK HTTP client ([`capacity_pilot::aws::wiring::https_client`]; the
    /// stand-ins speak plain HTTP), recording into these calls.
    pub fn http_client(&self) -> SharedHttpClient {
        self.wrap(capacity_pilot::aws::wiring::https_client())
    }

    /// `inner` (an in-process client, say), recording into these calls.
    pub fn wrap(&self, inner: SharedHttpClient) -> SharedHttpClient {
        SharedHttpClient::new(Recording {
            inner,
            calls: self.clone(),
        })
    }
}

#[derive(Debug)]
struct Recording {
    inner: SharedHttpClient,
    calls: Calls,
}

impl HttpClient for Recording {
    fn http_connector(
        &self,
        settings: &HttpConnectorSettings,
        components: &RuntimeComponents,
    ) -> SharedHttpConnector {
        SharedHttpConnector::new(RecordingConnector {
            inner: self.inner.http_connector(settings, components),
            calls: self.calls.clone(),
        })
    }
}

#[derive(Debug)]
struct RecordingConnector {
    inner: SharedHttpConnector,
    calls: Calls,
}

impl HttpConnector for RecordingConnector {
    fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
        if let Some(op) = operation_of(&request) {
            self.calls.seen.lock().unwrap().insert(op.clone());
            self.calls.log.lock().unwrap().push(op.clone());
            let body = request
                .body()
                .bytes()
                .map(|b| String::from_utf8_lossy(b).to_string())
                .unwrap_or_default();
            self.calls.bodies.lock().unwrap().push((op, body));
        }
        self.inner.call(request)
    }
}

/// `inner`, with `write` made just before the first call of `operation` (its name, e.g.
/// `TransactWriteItems`): another writer between a store's read and its write, at the HTTP
/// client as the SDK calls it. Nothing in production code knows about it.
pub fn interleaved(
    operation: &str,
    inner: SharedHttpClient,
    write: impl std::future::Future<Output = ()> + Send + 'static,
) -> SharedHttpClient {
    SharedHttpClient::new(Interleaved {
        operation: operation.to_string(),
        inner,
        write: Arc::new(Mutex::new(Some(Box::pin(write)))),
    })
}

type Write = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

#[derive(Clone)]
struct Interleaved {
    operation: String,
    inner: SharedHttpClient,
    write: Arc<Mutex<Option<Write>>>,
}

impl std::fmt::Debug for Interleaved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Interleaved")
            .field("operation", &self.operation)
            .finish()
    }
}

impl HttpClient for Interleaved {
    fn http_connector(
        &self,
        settings: &HttpConnectorSettings,
        components: &RuntimeComponents,
    ) -> SharedHttpConnector {
        SharedHttpConnector::new(InterleavedConnector {
            inner: self.inner.http_connector(settings, components),
            at: self.clone(),
        })
    }
}

#[derive(Debug)]
struct InterleavedConnector {
    inner: SharedHttpConnector,
    at: Interleaved,
}

impl HttpConnector for InterleavedConnector {
    fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
        let due = operation_of(&request).is_some_and(|(_, op)| op == self.at.operation);
        match due.then(|| self.at.write.lock().unwrap().take()).flatten() {
            Some(write) => {
                let inner = self.inner.clone();
                HttpConnectorFuture::new(async move {
                    write.await;
                    inner.call(request).await
                })
            }
            None => self.inner.call(request),
        }
    }
}

/// The operation a request invokes, by its protocol.
fn operation_of(request: &HttpRequest) -> Option<Operation> {
    if let Some(target) = request.headers().get("x-amz-target") {
        let (prefix, op) = target.split_once('.')?;
        let service = match prefix {
            p if p.starts_with("DynamoDB") => "dynamodb",
            "SageMaker" => "sagemaker",
            "AWSEvents" => "events",
            other => other,
        };
        return Some((service.to_string(), op.to_string()));
    }
    let body = request.body().bytes()?;
    let pairs = serde_urlencoded::from_bytes::<Vec<(String, String)>>(body).ok()?;
    let field = |name: &str| {
        pairs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let action = field("Action")?;
    // Query-protocol services are told apart by their API version.
    let service = match field("Version").as_deref() {
        Some("2010-03-31") => "sns",
        Some("2010-05-15") => "cloudformation",
        Some("2011-06-15") => "sts",
        _ => "ec2",
    };
    Some((service.to_string(), action))
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_smithy_types::body::SdkBody;

    fn request(target: Option<&str>, body: &str) -> HttpRequest {
        let mut r = HttpRequest::new(SdkBody::from(body.to_string()));
        if let Some(t) = target {
            r.headers_mut().insert("x-amz-target", t.to_string());
        }
        r
    }

    #[test]
    fn operations_are_read_as_each_protocol_names_them() {
        let op = |s: &str, o: &str| Some((s.to_string(), o.to_string()));
        assert_eq!(
            operation_of(&request(Some("DynamoDB_20120810.TransactWriteItems"), "{}")),
            op("dynamodb", "TransactWriteItems")
        );
        assert_eq!(
            operation_of(&request(Some("SageMaker.CreateTrainingPlan"), "{}")),
            op("sagemaker", "CreateTrainingPlan")
        );
        assert_eq!(
            operation_of(&request(Some("AWSEvents.PutEvents"), "{}")),
            op("events", "PutEvents")
        );
        assert_eq!(
            operation_of(&request(None, "Action=RunInstances&Version=2016-11-15")),
            op("ec2", "RunInstances")
        );
        assert_eq!(
            operation_of(&request(
                None,
                "Action=Publish&Version=2010-03-31&TopicArn=arn%3Aaws%3Asns%3Aus-east-1%3A1%3At"
            )),
            op("sns", "Publish")
        );
        assert_eq!(operation_of(&request(None, "")), None);
    }
}
