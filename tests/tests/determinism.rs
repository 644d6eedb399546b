//! Determinism (ARCHITECTURE §8.12): production code takes its time, ids and sleeps from
//! injected sources, so one seed replays a lifecycle bit for bit.

use std::path::{Path, PathBuf};

use integration_tests::moto::workspace_root;

/// What production code must not call directly, outside the default adapters.
const FORBIDDEN: [&str; 4] = [
    "Utc::now(",
    "Uuid::new_v4(",
    "tokio::time::sleep(",
    "std::thread::sleep(",
];

/// The default adapters: the only production files that may read the wall clock, the OS's
/// randomness or tokio's timer. Each holds the one source production passes in.
const DEFAULT_ADAPTERS: [&str; 3] = [
    // SystemClock::wall, behind the Clock port and the store's time outside a run
    "shared/src/aws/clock.rs",
    // RandomIds, behind the Ids port
    "shared/src/aws/ids.rs",
    // the emulator's clock starts at the real time unless told a start
    "infra/local/src/lib.rs",
];

/// Production sources: the library, the functions, and the emulator (not its local runner,
/// which hosts real processes on the real clock, and not test code).
fn production_files(root: &Path) -> Vec<PathBuf> {
    let mut dirs = vec![root.join("shared/src"), root.join("infra/local/src")];
    for f in std::fs::read_dir(root.join("functions")).unwrap() {
        dirs.push(f.unwrap().path().join("src"));
    }
    let mut out = Vec::new();
    while let Some(dir) = dirs.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().to_string();
            if p.is_dir() {
                if !matches!(name.as_str(), "tests" | "fakes" | "runner") {
                    dirs.push(p);
                }
            } else if name.ends_with(".rs") && !name.ends_with("tests.rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The lines of `source` (up to its test module) that call a forbidden source.
fn offending(source: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in source.lines().enumerate() {
        if line.trim_start().starts_with("#[cfg(test)]") {
            break;
        }
        if line.trim_start().starts_with("//") {
            continue;
        }
        if FORBIDDEN.iter().any(|f| line.contains(f)) {
            out.push((n + 1, line.trim().to_string()));
        }
    }
    out
}

#[test]
fn production_code_takes_time_ids_and_sleeps_only_from_its_sources() {
    let root = workspace_root();
    let mut found = Vec::new();
    for f in production_files(&root) {
        let rel = f.strip_prefix(&root).unwrap().to_string_lossy().to_string();
        if DEFAULT_ADAPTERS.contains(&rel.as_str()) {
            continue;
        }
        let source = std::fs::read_to_string(&f).unwrap();
        for (line, text) in offending(&source) {
            found.push(format!("{rel}:{line}: {text}"));
        }
    }
    assert!(
        found.is_empty(),
        "use the Clock, Ids or Sleep source instead:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_check_sees_each_forbidden_call_and_not_test_code_or_comments() {
    let source = "fn a() { let t = chrono::Utc::now(); }\n\
                  // Utc::now() in a comment\n\
                  fn b() { let id = uuid::Uuid::new_v4(); }\n\
                  async fn c() { tokio::time::sleep(d).await; }\n\
                  #[cfg(test)]\n\
                  mod tests { fn t() { Utc::now(); } }\n";
    let lines: Vec<usize> = offending(source).into_iter().map(|(n, _)| n).collect();
    assert_eq!(lines, [1, 3, 4]);
    // and the scan covers the code it guards
    let files = production_files(&workspace_root());
    for must in [
        "shared/src/aws/dynamodb/mod.rs",
        "shared/src/outbox.rs",
        "functions/purchase-capacity/src/handler.rs",
        "shared/src/purchase/protocol.rs",
        "infra/local/src/server.rs",
    ] {
        assert!(
            files.iter().any(|f| f.ends_with(must)),
            "{must} is not scanned"
        );
    }
}
