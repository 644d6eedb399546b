//! `local-cloud serve`: the emulator as a standalone process, for the AWS CLI, the local runner
//! and the real function binaries (pointed at it through `AWS_ENDPOINT_URL_*`).

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
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .init();
    let cli = Cli::parse();
    match cli.command {
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
