//! moto's server as a child process, shared by the tests that run at the same time.
//!
//! It runs single-threaded (ARCHITECTURE section 6). It can outlive nothing: it logs to a
//! file, never to our stdout (an inherited pipe would hold CI's open), exits when its stdin
//! (a pipe we hold) closes, and is killed when the last test using it drops it.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// How long a cold start of moto may take (Python imports every backend).
const STARTUP_DEADLINE: Duration = Duration::from_secs(60);
const POLL_EVERY: Duration = Duration::from_millis(25);

pub struct Moto {
    child: Child,
    /// Held open for the server's life: closing it tells the server to exit.
    stdin: Option<ChildStdin>,
    url: String,
    log: PathBuf,
}

static SHARED: Mutex<Weak<Moto>> = Mutex::new(Weak::new());

/// The workspace root (this crate lives in `<root>/tests`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate sits inside the workspace")
        .to_path_buf()
}

impl Moto {
    /// The running server, or a new one when no test holds one.
    pub fn shared() -> anyhow::Result<Arc<Moto>> {
        let mut slot = SHARED.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = slot.upgrade() {
            return Ok(m);
        }
        let m = Arc::new(Moto::start()?);
        *slot = Arc::downgrade(&m);
        Ok(m)
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn start() -> anyhow::Result<Moto> {
        let root = workspace_root();
        let python = root.join(".venv/bin/python");
        if !python.exists() {
            bail!(
                "{} is missing: run `make venv` (it installs the pinned moto server the \
                 integration tests run against)",
                python.display()
            );
        }
        let launcher = root.join("tests/support/moto_server.py");
        let log_dir = std::env::temp_dir().join("capacity-pilot-moto");
        std::fs::create_dir_all(&log_dir)
            .with_context(|| format!("creating {}", log_dir.display()))?;
        let stem = format!(
            "moto-{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        );
        let log = log_dir.join(format!("{stem}.log"));
        // moto binds a port of its own choosing and writes it here once it listens. A port
        // picked here and handed over raced every socket opened meanwhile: an emulator
        // started by a concurrent test once took it, and DynamoDB calls reached the emulator.
        let port_file = log_dir.join(format!("{stem}.port"));

        let mut child = Command::new(&python)
            .arg(&launcher)
            .arg(&log)
            .arg(&port_file)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {} {}", python.display(), launcher.display()))?;
        let stdin = child.stdin.take();
        let mut moto = Moto {
            child,
            stdin,
            url: String::new(),
            log,
        };
        let port = moto.wait_for_port(&port_file)?;
        moto.url = format!("http://127.0.0.1:{port}");
        Ok(moto)
    }

    /// The port moto reports once it listens.
    fn wait_for_port(&mut self, port_file: &Path) -> anyhow::Result<u16> {
        let deadline = Instant::now() + STARTUP_DEADLINE;
        loop {
            if let Some(port) = std::fs::read_to_string(port_file)
                .ok()
                .and_then(|t| t.trim().parse::<u16>().ok())
            {
                let _ = std::fs::remove_file(port_file);
                return Ok(port);
            }
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "moto exited during startup ({status}); its log {}:\n{}",
                    self.log.display(),
                    self.log_tail()
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "moto did not listen within {STARTUP_DEADLINE:?}; its log {}:\n{}",
                    self.log.display(),
                    self.log_tail()
                );
            }
            std::thread::sleep(POLL_EVERY);
        }
    }

    fn log_tail(&self) -> String {
        let mut text = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let _ = f.read_to_string(&mut text);
        }
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        // Closing stdin alone ends it; kill as well, so a wedged server cannot linger.
        drop(self.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
