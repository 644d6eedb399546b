//! moto's DynamoDB-compatible server as a child process (ARCHITECTURE section 6): the same
//! single-threaded launcher the integration tests use (`tests/support/moto_server.py`), from
//! `.venv`. It logs to a file, exits when its stdin closes and is killed when dropped.
//!
//! The state table is created from `Resources.StateTable.Properties` of the template, and the
//! runner reads its `due` index, for scheduling only, through DynamoDB's JSON API.

use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use tokio::process::{Child, ChildStdin, Command};

use super::http;

const STARTUP_DEADLINE: Duration = Duration::from_secs(60);

pub struct Moto {
    child: Child,
    stdin: Option<ChildStdin>,
    url: String,
    pub log: PathBuf,
}

impl Moto {
    /// Starts moto from `<root>/.venv` on a free port, logging to `log`.
    pub async fn start(root: &Path, log: PathBuf) -> anyhow::Result<Moto> {
        let python = root.join(".venv/bin/python");
        if !python.exists() {
            bail!(
                "{} is missing: run `make venv` (it installs the pinned moto server)",
                python.display()
            );
        }
        let launcher = root.join("tests/support/moto_server.py");
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
            .local_addr()?
            .port();
        let mut child = Command::new(&python)
            .arg(&launcher)
            .arg(port.to_string())
            .arg(&log)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {} {}", python.display(), launcher.display()))?;
        let stdin = child.stdin.take();
        let moto = Moto {
            child,
            stdin,
            url: format!("http://127.0.0.1:{port}"),
            log,
        };
        let deadline = Instant::now() + STARTUP_DEADLINE;
        loop {
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                return Ok(moto);
            }
            if Instant::now() > deadline {
                bail!(
                    "moto did not listen on port {port} within {STARTUP_DEADLINE:?}; see {}",
                    moto.log.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// One DynamoDB JSON API call.
    pub async fn call(&self, op: &str, input: &Value) -> anyhow::Result<Value> {
        let target = format!("DynamoDB_20120810.{op}");
        let (status, body) = http::post(
            &self.url,
            &[
                ("Content-Type", "application/x-amz-json-1.0"),
                ("X-Amz-Target", &target),
                (
                    "Authorization",
                    "AWS4-HMAC-SHA256 Credential=local/20261201/us-east-1/dynamodb/aws4_request, SignedHeaders=host, Signature=0",
                ),
            ],
            input.to_string().as_bytes(),
        )
        .await
        .with_context(|| format!("DynamoDB {op}"))?;
        let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        if status != 200 {
            bail!("DynamoDB {op}: HTTP {status}: {v}");
        }
        Ok(v)
    }

    /// CreateTable (and its TTL) from the template's `StateTable` properties.
    pub async fn create_state_table(&self, template: &Value, name: &str) -> anyhow::Result<()> {
        let p = &template["Resources"]["StateTable"]["Properties"];
        if !p.is_object() {
            bail!("the template has no Resources.StateTable.Properties");
        }
        let mut input = json!({
            "TableName": name,
            "AttributeDefinitions": p["AttributeDefinitions"],
            "KeySchema": p["KeySchema"],
            "BillingMode": p.get("BillingMode").cloned().unwrap_or(json!("PAY_PER_REQUEST")),
        });
        if let Some(gsis) = p.get("GlobalSecondaryIndexes") {
            input["GlobalSecondaryIndexes"] = gsis.clone();
        }
        self.call("CreateTable", &input).await?;
        if let Some(ttl) = p.get("TimeToLiveSpecification") {
            self.call(
                "UpdateTimeToLive",
                &json!({"TableName": name, "TimeToLiveSpecification": {
                    "AttributeName": ttl["AttributeName"],
                    "Enabled": ttl.get("Enabled").and_then(Value::as_bool).unwrap_or(false)}}),
            )
            .await?;
        }
        Ok(())
    }

    /// The earliest due time on the table's `due` index (the sparse index every function's
    /// schedule reads its work from), if any item carries one. For scheduling only.
    pub async fn earliest_due(
        &self,
        table: &str,
        template: &Value,
    ) -> anyhow::Result<Option<DateTime<Utc>>> {
        let index = &template["Resources"]["StateTable"]["Properties"]["GlobalSecondaryIndexes"][0];
        let index_name = index["IndexName"]
            .as_str()
            .ok_or_else(|| anyhow!("StateTable has no GlobalSecondaryIndexes[0].IndexName"))?;
        let due_attr = index["KeySchema"]
            .as_array()
            .and_then(|k| k.iter().find(|k| k["KeyType"] == "RANGE"))
            .and_then(|k| k["AttributeName"].as_str())
            .ok_or_else(|| anyhow!("the {index_name} index has no RANGE key"))?;
        let mut earliest: Option<i64> = None;
        let mut start: Option<Value> = None;
        loop {
            let mut input = json!({
                "TableName": table,
                "IndexName": index_name,
                "ProjectionExpression": "#d",
                "ExpressionAttributeNames": {"#d": due_attr},
            });
            if let Some(k) = start.take() {
                input["ExclusiveStartKey"] = k;
            }
            let out = self.call("Scan", &input).await?;
            for item in out["Items"].as_array().into_iter().flatten() {
                if let Some(n) = item[due_attr]["N"]
                    .as_str()
                    .and_then(|n| n.parse::<f64>().ok())
                {
                    let n = n as i64;
                    earliest = Some(earliest.map_or(n, |e| e.min(n)));
                }
            }
            match out.get("LastEvaluatedKey") {
                Some(k) if k.is_object() => start = Some(k.clone()),
                _ => break,
            }
        }
        Ok(earliest.and_then(|s| DateTime::from_timestamp(s, 0)))
    }

    /// Closes stdin (the launcher exits) and kills it, waiting for the exit.
    pub async fn stop(mut self) {
        drop(self.stdin.take());
        let _ = self.child.kill().await;
    }
}
