//! `local-cloud serve`: the emulator as a standalone process, for the AWS CLI and the real
//! function binaries (pointed at it through `AWS_ENDPOINT_URL_*`).
//! `local-cloud run <scenario>`: the local runner, which plays a scenario with the real
//! function binaries and judges it (exit status 1 when a check fails).

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use local_cloud::{LocalCloud, Options};
use tracing_subscriber::EnvFilter;

#[derive(Debug, Parser)]
#[command(
    name = "local-cloud",
    about = "Offline EC2 + SageMaker capacity emulator and EventBridge PutEvents"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve on 127.0.0.1 with the clock starting at the real current time.
    Serve {
        /// Port to listen on (0 picks a free one).
        #[arg(long, default_value_t = 4566)]
        port: u16,
        /// Market seed: the same seed gives the same offerings and prices.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Play a scenario with the real function binaries (build them first:
    /// `cargo build --workspace --bins`) and judge its expected outcomes.
    Run {
        /// The scenario file.
        #[arg(default_value = "infra/local/scenarios/default.yaml")]
        scenario: PathBuf,
        /// The workspace root (holds infra/template.yaml, .venv and tests/support).
        #[arg(long, default_value = ".")]
        root: PathBuf,
        /// Where the function binaries are (default: cargo's target dir, debug).
        #[arg(long)]
        bin_dir: Option<PathBuf>,
        /// Where logs go (default: <target dir>/capacity-pilot).
        #[arg(long)]
        out_dir: Option<PathBuf>,
        /// Fire every schedule at every tick, not only ticks with due work (slow).
        #[arg(long)]
        every_tick: bool,
        /// Print only the summary and the checks, not the timeline.
        #[arg(long)]
        quiet: bool,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // The runner prints its own timeline; the emulator's logs would drown it.
    let default_level = match cli.command {
        Command::Run { .. } => "warn",
        Command::Serve { .. } => "info",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level)),
        )
        .init();
    match cli.command {
        Command::Run {
            scenario,
            root,
            bin_dir,
            out_dir,
            every_tick,
            quiet,
        } => {
            let root = root
                .canonicalize()
                .with_context(|| format!("{}", root.display()))?;
            let scenario = if scenario.is_absolute() {
                scenario
            } else {
                root.join(scenario)
            };
            let result = local_cloud::runner::run(local_cloud::runner::RunOptions {
                root,
                scenario,
                bin_dir,
                out_dir,
                every_tick,
                print: !quiet,
            })
            .await?;
            print!("{}", local_cloud::runner::report::render(&result));
            let html = result.out_dir.join("report.html");
            std::fs::write(&html, local_cloud::runner::report::html(&result))
                .with_context(|| format!("writing {}", html.display()))?;
            let notices = result.out_dir.join("notices.txt");
            std::fs::write(&notices, local_cloud::runner::report::notices_text(&result))
                .with_context(|| format!("writing {}", notices.display()))?;
            let jsonl = result.out_dir.join("invocations.jsonl");
            std::fs::write(
                &jsonl,
                local_cloud::runner::report::invocations_jsonl(&result),
            )
            .with_context(|| format!("writing {}", jsonl.display()))?;
            println!(
                "report: {}; every invocation: {}",
                html.display(),
                jsonl.display()
            );
            if !result.passed() {
                std::process::exit(1);
            }
        }
        Command::Serve { port, seed } => {
            let cloud = LocalCloud::start(Options {
                seed,
                port,
                ..Options::default()
            })
            .await
            .with_context(|| format!("cannot listen on 127.0.0.1:{port}"))?;
            println!("local-cloud listening on {} (seed {seed})", cloud.url());
            tokio::signal::ctrl_c()
                .await
                .context("waiting for Ctrl-C")?;
            cloud.stop().await;
        }
    }
    Ok(())
}
