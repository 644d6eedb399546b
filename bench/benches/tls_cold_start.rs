//! What TLS adds to a cold start (`make bench`): the local runner's figures speak plain HTTP to
//! the stand-ins, so they leave out what a deployed function's first calls pay: loading the
//! system's root certificates, building each client's root store, and one full handshake per
//! host. This plays a cold start's first calls with the production HTTP client
//! (`wiring::sdk_loader`) and the SDK clients the functions use, once over TLS and once over
//! plain HTTP, each run in a fresh process (the roots are loaded once per process), against a
//! local server; the difference is TLS's cost. Figures are medians over `BENCH_TLS_RUNS` (20)
//! processes of each kind.
//!
//! The server's certificate is an ECDSA P-256 leaf signed by a CA of this run's, appended to
//! the system's bundle (`SSL_CERT_FILE`), so the client loads as many roots as on a host. AWS's
//! endpoints present RSA-2048 chains; verifying either costs well under a millisecond.

use std::io::Write;
use std::sync::Arc;
use std::time::Instant;

use capacity_pilot::aws::wiring::sdk_loader;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;

/// The services a function's cold start reaches, in the order of the steps below.
const SERVICES: [&str; 4] = ["dynamodb", "eventbridge", "ec2", "sagemaker"];
/// Where a system keeps its root bundle (Debian, Amazon Linux), as rustls-native-certs finds it.
const BUNDLES: [&str; 3] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
];
const CHILD: &str = "TLS_COLD_START_CHILD";

fn main() {
    if std::env::var_os(CHILD).is_some() {
        child();
    } else {
        parent();
    }
}

/// Nanoseconds of CPU this process has run, all its threads, as the local runner reads it.
fn cpu_ns() -> u64 {
    local_cloud::runner::lambda_host::cpu_ns(std::process::id())
}

/// One cold start's calls, each step's wall and CPU time printed as one JSON line.
fn child() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut steps = Vec::new();
        let mut mark = (Instant::now(), cpu_ns());
        let mut step = |name: &str| {
            let now = (Instant::now(), cpu_ns());
            steps.push((
                name.to_string(),
                (now.0 - mark.0).as_secs_f64() * 1e3,
                (now.1 - mark.1) as f64 / 1e6,
            ));
            mark = (Instant::now(), cpu_ns());
        };
        let sdk = sdk_loader().load().await;
        let ddb = aws_sdk_dynamodb::Client::new(&sdk);
        let events = aws_sdk_eventbridge::Client::new(&sdk);
        let ec2 = aws_sdk_ec2::Client::new(&sdk);
        let sagemaker = aws_sdk_sagemaker::Client::new(&sdk);
        step("config and clients");
        ddb.list_tables().send().await.expect("dynamodb");
        step("dynamodb: first call");
        ddb.list_tables().send().await.expect("dynamodb");
        step("dynamodb: second call");
        events.list_event_buses().send().await.expect("eventbridge");
        step("eventbridge: first call");
        ec2.describe_regions().send().await.expect("ec2");
        step("ec2: first call");
        sagemaker
            .list_training_plans()
            .send()
            .await
            .expect("sagemaker");
        step("sagemaker: first call");
        println!("{}", serde_json::to_string(&steps).expect("figures"));
    });
}

/// Serves both modes' ports, runs the children and prints the medians.
fn parent() {
    // (`cargo bench` passes `--bench`; the number of runs comes from the environment.)
    let runs: usize = std::env::var("BENCH_TLS_RUNS")
        .ok()
        .map(|n| n.parse().expect("BENCH_TLS_RUNS: a number"))
        .unwrap_or(20);
    let dir = std::env::temp_dir().join(format!("tls-cold-start-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");

    // A CA of this run's, and the server's leaf for localhost.
    let ca_key = rcgen::KeyPair::generate().expect("ca key");
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("ca params");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "tls-cold-start CA");
    let ca = ca_params.self_signed(&ca_key).expect("ca");
    let leaf_key = rcgen::KeyPair::generate().expect("leaf key");
    let leaf = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .expect("leaf params")
        .signed_by(&leaf_key, &rcgen::Issuer::new(ca_params, ca_key))
        .expect("leaf");
    let system = BUNDLES
        .iter()
        .find_map(|p| Some((*p, std::fs::read(p).ok()?)));
    let bundle = dir.join("bundle.pem");
    let mut f = std::fs::File::create(&bundle).expect("bundle");
    if let Some((_, pem)) = &system {
        f.write_all(pem).expect("bundle");
        f.write_all(b"\n").expect("bundle");
    }
    f.write_all(ca.pem().as_bytes()).expect("bundle");
    drop(f);
    let roots = std::fs::read_to_string(&bundle)
        .expect("bundle")
        .matches("BEGIN CERTIFICATE")
        .count();

    let tls = Arc::new(
        rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone(), ca.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()),
        )
        .expect("server config"),
    );
    let server = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("server runtime");
    let ports = server.block_on(async {
        let mut ports = Vec::new();
        for secure in [true, false] {
            let mut these = Vec::new();
            for _ in SERVICES {
                let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
                these.push(listener.local_addr().expect("addr").port());
                let tls = secure.then(|| tokio_rustls::TlsAcceptor::from(tls.clone()));
                tokio::spawn(async move {
                    while let Ok((tcp, _)) = listener.accept().await {
                        let tls = tls.clone();
                        tokio::spawn(async move {
                            match tls {
                                Some(tls) => {
                                    if let Ok(s) = tls.accept(tcp).await {
                                        serve(s).await;
                                    }
                                }
                                None => serve(tcp).await,
                            }
                        });
                    }
                });
            }
            ports.push(these);
        }
        ports
    });

    let me = std::env::current_exe().expect("current exe");
    let exe_size = std::fs::metadata(&me).map(|m| m.len()).unwrap_or(0);
    // Each mode's first child is not counted: it loads the binary's pages into the cache.
    let mut results = Vec::new();
    for (mode, scheme, ports) in [("tls", "https", &ports[0]), ("plain", "http", &ports[1])] {
        let mut all: Vec<Vec<(String, f64, f64)>> = Vec::new();
        for i in 0..=runs {
            let mut cmd = std::process::Command::new(&me);
            cmd.env(CHILD, "1")
                .env("SSL_CERT_FILE", &bundle)
                .env_remove("SSL_CERT_DIR")
                .env("AWS_REGION", "us-east-1")
                .env("AWS_ACCESS_KEY_ID", "AKIDBENCH")
                .env("AWS_SECRET_ACCESS_KEY", "bench")
                .env_remove("AWS_PROFILE");
            for (service, port) in SERVICES.iter().zip(ports) {
                cmd.env(
                    format!("AWS_ENDPOINT_URL_{}", service.to_uppercase()),
                    format!("{scheme}://localhost:{port}"),
                );
            }
            let out = cmd.output().expect("child");
            assert!(
                out.status.success(),
                "child failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let line = String::from_utf8(out.stdout).expect("utf-8");
            let steps: Vec<(String, f64, f64)> =
                serde_json::from_str(line.trim()).expect("child's figures");
            if i > 0 {
                all.push(steps);
            }
        }
        results.push((mode, all));
    }

    let median = |mut xs: Vec<f64>| {
        xs.sort_by(f64::total_cmp);
        let n = xs.len();
        if n % 2 == 1 {
            xs[n / 2]
        } else {
            (xs[n / 2 - 1] + xs[n / 2]) / 2.0
        }
    };
    println!(
        "== TLS on a cold start: the production client's first calls, fresh processes, \
         medians of {runs} ==",
    );
    println!(
        "roots: {roots} certificates ({}, and this run's CA); binary {:.1} MiB",
        system.map(|(p, _)| p).unwrap_or("no system bundle found"),
        exe_size as f64 / (1 << 20) as f64
    );
    println!(
        "{:<26} {:>11} {:>11} {:>13} {:>13} {:>12}",
        "step", "tls wall ms", "tls cpu ms", "plain wall ms", "plain cpu ms", "tls cpu +ms"
    );
    let names: Vec<String> = results[0].1[0].iter().map(|s| s.0.clone()).collect();
    let (mut tls_cpu, mut plain_cpu) = (0.0, 0.0);
    for (k, name) in names.iter().enumerate() {
        let fig = |m: usize, f: fn(&(String, f64, f64)) -> f64| {
            median(results[m].1.iter().map(|r| f(&r[k])).collect())
        };
        let (tw, tc, pw, pc) = (
            fig(0, |s| s.1),
            fig(0, |s| s.2),
            fig(1, |s| s.1),
            fig(1, |s| s.2),
        );
        tls_cpu += tc;
        plain_cpu += pc;
        println!(
            "{name:<26} {tw:>11.2} {tc:>11.2} {pw:>13.2} {pc:>13.2} {:>12.2}",
            tc - pc
        );
    }
    let extra = tls_cpu - plain_cpu;
    println!(
        "TLS adds {extra:.2} ms of CPU to these calls ({tls_cpu:.2} against {plain_cpu:.2}); at \
         128 MB (128/1,769 of a vCPU) that is about {:.0} ms, at 256 MB {:.0} ms",
        extra * 1769.0 / 128.0,
        extra * 1769.0 / 256.0
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Answers every HTTP/1.1 request on the connection with what the step's call parses: EC2's
/// XML for its query protocol, a training plan list for SageMaker, `{}` for the others.
async fn serve<S: AsyncRead + AsyncWrite + Unpin>(mut s: S) {
    let mut buf = Vec::new();
    loop {
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let mut chunk = [0u8; 4096];
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        while buf.len() < head_end + length {
            let mut chunk = [0u8; 4096];
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let body = String::from_utf8_lossy(&buf[head_end..head_end + length]).to_string();
        buf.drain(..head_end + length);
        let (kind, answer) = if body.contains("Action=DescribeRegions") {
            (
                "text/xml",
                "<DescribeRegionsResponse xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\">\
                 <requestId>bench</requestId><regionInfo/></DescribeRegionsResponse>",
            )
        } else if head.contains("listtrainingplans") {
            (
                "application/x-amz-json-1.1",
                "{\"TrainingPlanSummaries\":[]}",
            )
        } else {
            ("application/x-amz-json-1.0", "{}")
        };
        let response = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: {kind}\r\ncontent-length: {}\r\n\
             x-amzn-requestid: bench\r\n\r\n{answer}",
            answer.len()
        );
        if s.write_all(response.as_bytes()).await.is_err() || s.flush().await.is_err() {
            return;
        }
    }
}
