//! The documentation, held to the code (issue 54): the README's first 60 lines say what it is
//! and the three commands a newcomer needs, in that order; every request example in the README
//! and `docs/` is a valid request (and every one marked invalid is refused); every block marked
//! ```` ```sh offline ```` runs, with no AWS and no build, and succeeds; every link inside the
//! repository resolves; and none of the contradictions the newcomer review found comes back.
//! (The generated field table, errorType list, schemas and samples have their drift tests in
//! `shared/tests/domain/`.)

use std::path::{Path, PathBuf};
use std::process::Command;

use capacity_pilot::domain::catalog::SupportedInstanceTypes;
use capacity_pilot::domain::request::{ValidationContext, parse_request};
use chrono::{DateTime, Duration, Utc};
use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The README and every page under docs/, as (path relative to the repository, text).
fn pages() -> Vec<(String, String)> {
    let mut out = vec![(
        "README.md".to_string(),
        std::fs::read_to_string(repo().join("README.md")).unwrap(),
    )];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(repo().join("docs"))
        .expect("docs/ exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    for p in docs {
        let name = format!("docs/{}", p.file_name().unwrap().to_string_lossy());
        out.push((name, std::fs::read_to_string(&p).unwrap()));
    }
    out
}

/// A fenced block: its info string (` ```sh offline ` gives `sh offline`), first line number
/// (1-based, of the fence) and body.
struct Block {
    info: String,
    line: usize,
    body: String,
}

fn blocks(text: &str) -> Vec<Block> {
    let mut out = vec![];
    let mut open: Option<Block> = None;
    for (i, line) in text.lines().enumerate() {
        let fence = line.trim_start().strip_prefix("```");
        match (&mut open, fence) {
            (None, Some(info)) => {
                open = Some(Block {
                    info: info.trim().to_string(),
                    line: i + 1,
                    body: String::new(),
                })
            }
            (Some(_), Some(_)) => out.push(open.take().unwrap()),
            (Some(b), None) => {
                b.body.push_str(line);
                b.body.push('\n');
            }
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "an unclosed code block");
    out
}

#[test]
fn the_readme_opens_with_what_it_is_then_make_run_plan_and_make_deploy() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let lines: Vec<&str> = readme.lines().collect();
    // The one-paragraph description comes straight after the title, before any section.
    assert!(lines[0].starts_with("# "), "a title first");
    let description = lines
        .iter()
        .position(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .unwrap();
    let first_section = lines.iter().position(|l| l.starts_with("## ")).unwrap();
    assert!(
        description < first_section && description <= 3,
        "the description is line {}",
        description + 1
    );
    // Then, each in a shell block of the first 60 lines, in this order:
    let mut at = vec![];
    for command in ["make run", "capacity-pilot plan", "make deploy"] {
        let line = blocks(&readme)
            .into_iter()
            .find_map(|b| {
                b.body
                    .lines()
                    .position(|l| l.trim_start().starts_with(command))
                    .map(|i| b.line + 1 + i)
            })
            .unwrap_or_else(|| panic!("no block runs {command}"));
        assert!(line <= 60, "{command} is at line {line}, past the first 60");
        at.push((command, line));
    }
    assert!(
        at.windows(2).all(|w| w[0].1 < w[1].1),
        "out of order: {at:?}"
    );
    // About 250 lines: a guide, the reference lives in docs/.
    assert!(
        lines.len() <= 300,
        "the README is {} lines; move reference material to docs/",
        lines.len()
    );
}

/// Judges a request at a day before its earliest start, so the example never goes stale.
fn judge(detail: &Value) -> Result<(), Vec<String>> {
    let earliest: DateTime<Utc> = detail["earliest_start"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(Utc::now);
    let types = SupportedInstanceTypes::default();
    let regions = ["us-east-1", "us-east-2", "us-west-2"].map(String::from);
    parse_request(
        detail,
        &ValidationContext {
            now: earliest - Duration::days(1),
            instance_types: &types,
            allowed_regions: &regions,
        },
    )
    .map(|_| ())
    .map_err(|p| {
        p.into_iter()
            .map(|f| format!("{}: {}", f.field, f.message))
            .collect()
    })
}

#[test]
fn every_request_example_in_the_docs_is_valid_and_every_invalid_one_is_refused() {
    let mut judged = 0;
    for (page, text) in pages() {
        for b in blocks(&text) {
            let invalid = match b.info.as_str() {
                "json" => false,
                "json invalid" => true,
                _ => continue,
            };
            let v: Value = serde_json::from_str(&b.body)
                .unwrap_or_else(|e| panic!("{page}:{}: not JSON: {e}", b.line));
            // A whole event, or its detail; only requests are judged.
            let detail = if v["detail"].is_object() {
                &v["detail"]
            } else {
                &v
            };
            if detail.get("schema_version").is_none() {
                continue;
            }
            judged += 1;
            match (judge(detail), invalid) {
                (Ok(()), false) | (Err(_), true) => {}
                (Err(p), false) => panic!("{page}:{}: the example is refused: {p:#?}", b.line),
                (Ok(()), true) => panic!("{page}:{}: marked invalid, but it is valid", b.line),
            }
        }
    }
    assert!(judged >= 2, "only {judged} request examples in the docs");
}

#[test]
fn every_offline_block_runs_with_no_aws_and_no_build_and_succeeds() {
    let cli = Path::new(env!("CARGO_BIN_EXE_capacity-pilot"));
    let path = format!(
        "{}:{}",
        cli.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let scratch = Path::new(env!("CARGO_TARGET_TMPDIR")).join("docs-offline");
    std::fs::create_dir_all(&scratch).unwrap();
    let mut ran = 0;
    for (page, text) in pages() {
        for b in blocks(&text) {
            if b.info != "sh offline" {
                continue;
            }
            assert!(
                !b.body.lines().any(|l| l.trim_start().starts_with("make ")
                    || l.contains("cargo ")
                    || l.contains("sam ")),
                "{page}:{}: an offline block may not build or deploy",
                b.line
            );
            // No credentials, and an endpoint that refuses: anything reaching for AWS fails.
            let out = Command::new("bash")
                .args(["-euo", "pipefail", "-c", &b.body])
                .current_dir(&scratch)
                .env("PATH", &path)
                .env("CAPACITY_PILOT_REPO", repo())
                .env("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
                .env("AWS_REGION", "us-east-1")
                .env("NO_COLOR", "1")
                .env_remove("AWS_PROFILE")
                .env_remove("AWS_ACCESS_KEY_ID")
                .env_remove("AWS_SECRET_ACCESS_KEY")
                .env_remove("AWS_SESSION_TOKEN")
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{page}:{}: the offline block failed:\n{}\n{}",
                b.line,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            ran += 1;
        }
    }
    assert!(ran >= 2, "only {ran} offline blocks");
}

#[test]
fn every_link_resolves_inside_the_repository_and_no_contradiction_returns() {
    let bus = std::fs::read_to_string(repo().join("infra/template.yaml")).unwrap();
    assert!(
        bus.contains("Fn::Sub: \"${AWS::StackName}-bus\""),
        "the template names the bus <stack>-bus"
    );
    let hash = regex_lite_hash();
    for (page, text) in pages() {
        let dir = repo().join(Path::new(&page).parent().unwrap());
        // Links: [text](target) to a file of the repository.
        for (i, line) in text.lines().enumerate() {
            let mut rest = line;
            while let Some(at) = rest.find("](") {
                let tail = &rest[at + 2..];
                let end = tail.find(')').unwrap_or(tail.len());
                let target = tail[..end].split('#').next().unwrap();
                rest = &tail[end..];
                if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                assert!(
                    dir.join(target).exists(),
                    "{page}:{}: {target} does not exist",
                    i + 1
                );
                let inside = dir.join(target).canonicalize().unwrap();
                assert!(
                    inside.starts_with(repo().canonicalize().unwrap()),
                    "{page}:{}: {target} is outside the repository",
                    i + 1
                );
            }
            let context = format!("{page}:{}: {line}", i + 1);
            assert!(
                !line.contains("../shared"),
                "{context}: outside the repository"
            );
            assert!(
                !line.contains("ARCHITECTURE §") && !line.contains("ARCHITECTURE 8."),
                "{context}: the design document is not in the repository"
            );
            assert!(
                !line.contains("`capacity-pilot` bus"),
                "{context}: the bus is <stack>-bus (capacity-pilot-bus)"
            );
            assert!(
                !line.contains("Node.js") && !line.contains(" Node "),
                "{context}: nothing needs Node"
            );
            if let Some(h) = hash(line) {
                panic!("{context}: a commit hash ({h}); name the make target instead");
            }
        }
    }
    let makefile = std::fs::read_to_string(repo().join("Makefile")).unwrap();
    assert!(!makefile.contains("Node"), "the Makefile lists Node");
}

/// A commit hash in prose: a word of 7-40 lowercase hex characters holding a digit and a
/// letter (ids such as `lt-0abc…` or `sha256:` values carry a prefix and do not count).
fn regex_lite_hash() -> impl Fn(&str) -> Option<String> {
    |line: &str| {
        line.split(|c: char| !c.is_ascii_alphanumeric() && c != '-' && c != ':')
            .find(|w| {
                (7..=40).contains(&w.len())
                    && w.chars()
                        .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
                    && w.chars().any(|c| c.is_ascii_digit())
                    && w.chars().any(|c| c.is_ascii_alphabetic())
            })
            .map(String::from)
    }
}
