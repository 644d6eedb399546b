//! moto's DynamoDB-compatible server as a child process (ARCHITECTURE section 6): the same
//! single-threaded launcher the integration tests use (`tests/support/moto_server.py`), from
//! `.venv`. It logs to a file, exits when its stdin closes and is killed when dropped.
//!
//! The state table is created from `Resources.StateTable.Properties` of the template, and the
//! runner reads its work index, for scheduling only, through DynamoDB's JSON API.
//!
//! The functions reach moto through a relay that passes every byte through and counts the
//! requests that may write (any `X-Amz-Target` but a read): the runner rescans the `due`
//! index only when that count moved, as nothing else changes the table.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::process::{Child, ChildStdin, Command};
use tokio::task::JoinHandle;

use super::http;

const STARTUP_DEADLINE: Duration = Duration::from_secs(60);

/// The DynamoDB operations that never write; any other target counts as a write.
const READS: &[&str] = &[
    "GetItem",
    "BatchGetItem",
    "Query",
    "Scan",
    "TransactGetItems",
    "DescribeTable",
    "ListTables",
    "DescribeTimeToLive",
    "DescribeEndpoints",
    "DescribeLimits",
    "ListTagsOfResource",
];

/// A `due` scan: its table, the writes counted before it, and its answer.
type DueScan = (String, u64, Option<DateTime<Utc>>);

pub struct Moto {
    child: Child,
    stdin: Option<ChildStdin>,
    /// moto itself (the runner's own calls).
    direct_url: String,
    /// The relay in front of moto (what the functions call).
    relay_url: String,
    relay: JoinHandle<()>,
    /// Requests through the relay that may have written.
    writes: Arc<AtomicU64>,
    /// Every request through the relay: the functions' DynamoDB calls.
    calls: Arc<AtomicU64>,
    /// The last `due` scan: (its table, writes counted before it, its answer). One moto can
    /// serve several runs one after another, each with its own table.
    due: Mutex<Option<DueScan>>,
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
        // moto binds a port of its own choosing and writes it here once it listens: a port
        // picked here and handed over could be taken by another socket first.
        let port_file = log.with_extension("port");
        let _ = std::fs::remove_file(&port_file);
        let mut child = Command::new(&python)
            .arg(&launcher)
            .arg(&log)
            .arg(&port_file)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {} {}", python.display(), launcher.display()))?;
        let stdin = child.stdin.take();
        let deadline = Instant::now() + STARTUP_DEADLINE;
        let port = loop {
            if let Some(port) = std::fs::read_to_string(&port_file)
                .ok()
                .and_then(|t| t.trim().parse::<u16>().ok())
            {
                break port;
            }
            if let Some(status) = child.try_wait()? {
                bail!(
                    "moto exited during startup ({status}); see {}",
                    log.display()
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "moto did not listen within {STARTUP_DEADLINE:?}; see {}",
                    log.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let writes = Arc::new(AtomicU64::new(0));
        let calls = Arc::new(AtomicU64::new(0));
        let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let relay_url = format!("http://{}", listener.local_addr()?);
        let relay = tokio::spawn(relay(listener, port, writes.clone(), calls.clone()));
        Ok(Moto {
            child,
            stdin,
            direct_url: format!("http://127.0.0.1:{port}"),
            relay_url,
            relay,
            writes,
            calls,
            due: Mutex::new(None),
            log,
        })
    }

    /// The functions' DynamoDB calls so far (every request through the relay).
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    /// Where the functions reach DynamoDB (the relay).
    pub fn url(&self) -> &str {
        &self.relay_url
    }

    /// One DynamoDB JSON API call.
    pub async fn call(&self, op: &str, input: &Value) -> anyhow::Result<Value> {
        let target = format!("DynamoDB_20120810.{op}");
        let (status, body) = http::post(
            &self.direct_url,
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

    /// Deletes table `name` if it exists, so that a run on a shared moto starts empty.
    pub async fn drop_table(&self, name: &str) -> anyhow::Result<()> {
        match self.call("DeleteTable", &json!({"TableName": name})).await {
            Ok(_) => Ok(()),
            Err(e) if e.to_string().contains("ResourceNotFoundException") => Ok(()),
            Err(e) => Err(e),
        }
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

    /// The earliest due time on the table's work index (the sparse index every function's
    /// schedule reads its work from), if any item carries one: a request's exact
    /// `next_action_at` (a live request sits in the index earlier, at its last write, so
    /// every tick reads it), else the index's own time (an unsent outbox item's is 0: due
    /// now). For scheduling only. The index is scanned again only after a request that may
    /// have written.
    pub async fn earliest_due(
        &self,
        table: &str,
        template: &Value,
    ) -> anyhow::Result<Option<DateTime<Utc>>> {
        let writes = self.writes.load(Ordering::SeqCst);
        if let Some((scanned, seen, due)) = &*self.due.lock().unwrap_or_else(|p| p.into_inner())
            && scanned == table
            && *seen == writes
        {
            return Ok(*due);
        }
        let due = self.scan_due(table, template).await?;
        *self.due.lock().unwrap_or_else(|p| p.into_inner()) =
            Some((table.to_string(), writes, due));
        Ok(due)
    }

    async fn scan_due(
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
                "ProjectionExpression": "#d, #n",
                "ExpressionAttributeNames": {"#d": due_attr, "#n": "next_action_at"},
            });
            if let Some(k) = start.take() {
                input["ExclusiveStartKey"] = k;
            }
            let out = self.call("Scan", &input).await?;
            for item in out["Items"].as_array().into_iter().flatten() {
                let exact = item["next_action_at"]["S"]
                    .as_str()
                    .and_then(|t| t.parse::<DateTime<Utc>>().ok())
                    .map(|t| t.timestamp());
                let indexed = item[due_attr]["N"]
                    .as_str()
                    .and_then(|n| n.parse::<f64>().ok())
                    .map(|n| n as i64);
                if let Some(n) = exact.or(indexed) {
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
        self.relay.abort();
        drop(self.stdin.take());
        let _ = self.child.kill().await;
    }
}

/// Accepts the functions' connections and relays each to moto on `port`.
async fn relay(
    listener: tokio::net::TcpListener,
    port: u16,
    writes: Arc<AtomicU64>,
    calls: Arc<AtomicU64>,
) {
    while let Ok((client, _)) = listener.accept().await {
        let writes = writes.clone();
        let calls = calls.clone();
        tokio::spawn(async move {
            let Ok(upstream) = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).await else {
                return;
            };
            let _ = client.set_nodelay(true);
            let _ = upstream.set_nodelay(true);
            let (mut client_rd, mut client_wr) = client.into_split();
            let (mut up_rd, mut up_wr) = upstream.into_split();
            let requests = async {
                let mut window: Vec<u8> = Vec::new();
                let mut buf = vec![0u8; 16 * 1024];
                loop {
                    let n = match client_rd.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    window.extend_from_slice(&buf[..n]);
                    if may_write(&window) {
                        writes.fetch_add(1, Ordering::SeqCst);
                    }
                    calls.fetch_add(count_requests(&mut window), Ordering::SeqCst);
                    // Keep a tail long enough to hold a header line cut by this read.
                    let keep = window.len().min(CARRY);
                    window.drain(..window.len() - keep);
                    if up_wr.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
                let _ = up_wr.shutdown().await;
            };
            let responses = async {
                let _ = tokio::io::copy(&mut up_rd, &mut client_wr).await;
                let _ = client_wr.shutdown().await;
            };
            tokio::join!(requests, responses);
        });
    }
}

/// How much of the request stream the relay keeps between reads.
const CARRY: usize = 256;

/// Counts the complete `X-Amz-Target` headers in `window`, one per DynamoDB request, and
/// drops the bytes up to each, so the tail kept for a header cut by a read never counts twice.
fn count_requests(window: &mut Vec<u8>) -> u64 {
    const NAME: &[u8] = b"x-amz-target:";
    let mut n = 0;
    while let Some(i) = window
        .windows(NAME.len())
        .position(|w| w.eq_ignore_ascii_case(NAME))
    {
        let start = i + NAME.len();
        let Some(end) = window[start..].windows(2).position(|w| w == b"\r\n") else {
            break;
        };
        n += 1;
        window.drain(..start + end);
    }
    n
}

/// Whether `bytes` hold a complete `X-Amz-Target` header naming an operation that may
/// write. A header seen twice (in the carried tail) only costs one more scan.
fn may_write(bytes: &[u8]) -> bool {
    const NAME: &[u8] = b"x-amz-target:";
    let mut from = 0;
    while let Some(i) = bytes[from..]
        .windows(NAME.len())
        .position(|w| w.eq_ignore_ascii_case(NAME))
    {
        let start = from + i + NAME.len();
        let Some(end) = bytes[start..].windows(2).position(|w| w == b"\r\n") else {
            return false;
        };
        let value = String::from_utf8_lossy(&bytes[start..start + end]);
        let op = value.trim().rsplit('.').next().unwrap_or("");
        if !READS.contains(&op) {
            return true;
        }
        from = start + end;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_request_is_counted_once_even_when_a_read_cuts_its_header() {
        let req = |op: &str| {
            format!("POST / HTTP/1.1\r\nx-amz-target: DynamoDB_20120810.{op}\r\n\r\n{{}}")
        };
        let stream = format!("{}{}{}", req("Query"), req("GetItem"), req("PutItem"));
        // Fed in pieces that cut a header, with the relay's carried tail kept between reads.
        let mut window = Vec::new();
        let mut counted = 0;
        for piece in stream.as_bytes().chunks(7) {
            window.extend_from_slice(piece);
            counted += count_requests(&mut window);
            let keep = window.len().min(CARRY);
            window.drain(..window.len() - keep);
        }
        assert_eq!(counted, 3);
    }

    #[test]
    fn only_targets_that_are_not_reads_count_as_writes() {
        let req = |op: &str| {
            format!("POST / HTTP/1.1\r\nx-amz-target: DynamoDB_20120810.{op}\r\n\r\n{{}}")
        };
        assert!(!may_write(req("Query").as_bytes()));
        assert!(!may_write(req("GetItem").as_bytes()));
        assert!(may_write(req("TransactWriteItems").as_bytes()));
        assert!(may_write(req("UpdateItem").as_bytes()));
        assert!(may_write(
            format!("{}{}", req("Query"), req("PutItem")).as_bytes()
        ));
        // A header cut before its line end is judged once the rest arrives.
        assert!(!may_write(b"X-Amz-Target: DynamoDB_20120810.Put"));
    }
}
