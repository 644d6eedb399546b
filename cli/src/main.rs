//! `capacity-pilot`: the command line of ARCHITECTURE §8.13. It talks to a deployed stack
//! with the caller's credentials, like the AWS CLI, and reuses the functions' parser,
//! catalogue and store reads.

mod commands;
mod deployment;
mod extend;
mod fail;
mod new;
mod pause;
mod plan;
mod show;

use std::process::ExitCode;

use clap::{Args, CommandFactory, Parser, Subcommand};

use show::{Format, Out};

/// Short-term GPU capacity on AWS: ask, approve, watch, cancel.
#[derive(Debug, Parser)]
#[command(
    name = "capacity-pilot",
    version,
    propagate_version = true,
    max_term_width = 100
)]
#[command(
    after_help = "Exit codes: 0 ok, 2 usage, 3 invalid request, 4 not found, 5 AWS error, \
                        6 refused by policy."
)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Command,
}

/// The AWS CLI's habits, for every command.
#[derive(Debug, Clone, Args)]
pub struct Global {
    /// A named profile of your AWS config (else AWS_PROFILE, else the default chain).
    #[arg(long, global = true)]
    pub profile: Option<String>,
    /// The region the stack runs in (else AWS_REGION or the profile's).
    #[arg(long, global = true)]
    pub region: Option<String>,
    /// Send every AWS call here (else AWS_ENDPOINT_URL and AWS_ENDPOINT_URL_<SERVICE>).
    #[arg(long, global = true)]
    pub endpoint_url: Option<String>,
    /// The stack whose outputs name the bus and table.
    #[arg(
        long,
        global = true,
        env = "CAPACITY_PILOT_STACK",
        default_value = "capacity-pilot"
    )]
    pub stack: String,
    /// The event bus, instead of the stack's BusName output.
    #[arg(long, global = true)]
    pub bus: Option<String>,
    /// The state table, instead of the stack's StateTableName output.
    #[arg(long, global = true)]
    pub table: Option<String>,
    /// A table on a terminal, JSON when piped.
    #[arg(long, short = 'o', global = true, value_enum)]
    pub output: Option<Format>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The instance types, what accelerators each carries, and what sells them.
    Types {
        /// Only the types carrying this accelerator (H100, H200, B200, A100, Trainium2, ...).
        #[arg(long)]
        gpu: Option<String>,
    },
    /// Write a request for N accelerators; submit it after filling in what it cannot know.
    New(Box<commands::NewArgs>),
    /// What the deployment would buy for a request, ranked, with every offering it would not;
    /// buys nothing.
    Plan(plan::PlanArgs),
    /// Validate a request file (or `-` for stdin) and put it on the bus.
    Submit(commands::SubmitArgs),
    /// A request's status, reason, next action, windows, resources and spend.
    Status { request_id: String },
    /// The recorded requests.
    List(commands::ListArgs),
    /// Every state change of a request, oldest first.
    History { request_id: String },
    /// Follow a request's state changes until it ends (or Ctrl-C).
    Watch(commands::WatchArgs),
    /// A team's monthly cap, spend, holds and what is left.
    Budget(commands::BudgetArgs),
    /// Approve the purchase (or extension) a request awaits approval for.
    Approve(commands::DecideArgs),
    /// Reject the purchase (or extension) a request awaits approval for.
    Reject(commands::DecideArgs),
    /// Ask for an extension of a request's Capacity Block or training plan, within its
    /// `extend` policy; purchase-capacity prices and buys it (or asks an approver).
    Extend(extend::ExtendArgs),
    /// Cancel a request: stops what is not yet bought (with --stop-running, paid windows too).
    Cancel(commands::CancelArgs),
    /// Stop every new purchase and on-demand run until `resume`; what is under way finishes.
    Pause(pause::PauseArgs),
    /// Let purchases go on after `pause`.
    Resume,
    /// Shell completions: `capacity-pilot completions bash > /etc/bash_completion.d/capacity-pilot`.
    Completions { shell: clap_complete::Shell },
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let out = Out::new(cli.global.output);
    let result = match cli.command {
        Command::Types { gpu } => commands::types(&out, gpu.as_deref()),
        Command::New(a) => commands::new(&out, *a),
        Command::Plan(a) => plan::plan(&cli.global, &out, a).await,
        Command::Submit(a) => commands::submit(&cli.global, &out, a).await,
        Command::Status { request_id } => commands::status(&cli.global, &out, &request_id).await,
        Command::List(a) => commands::list(&cli.global, &out, a).await,
        Command::History { request_id } => commands::history(&cli.global, &out, &request_id).await,
        Command::Watch(a) => commands::watch(&cli.global, &out, a).await,
        Command::Budget(a) => commands::budget(&cli.global, &out, a).await,
        Command::Approve(a) => commands::decide(&cli.global, &out, a, true).await,
        Command::Reject(a) => commands::decide(&cli.global, &out, a, false).await,
        Command::Cancel(a) => commands::cancel(&cli.global, &out, a).await,
        Command::Extend(a) => extend::extend(&cli.global, &out, a).await,
        Command::Pause(a) => pause::pause(&cli.global, &out, a).await,
        Command::Resume => pause::resume(&cli.global, &out).await,
        Command::Completions { shell } => {
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "capacity-pilot",
                &mut std::io::stdout(),
            );
            Ok(())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.code())
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::Cli;

    #[test]
    fn version_prints_the_crates_version_and_every_command_takes_it() {
        for args in [
            &["capacity-pilot", "--version"][..],
            &["capacity-pilot", "plan", "--version"][..],
        ] {
            let e = Cli::try_parse_from(args).unwrap_err();
            assert_eq!(e.kind(), clap::error::ErrorKind::DisplayVersion, "{args:?}");
            let printed = e.to_string();
            assert!(
                printed.starts_with("capacity-pilot")
                    && printed
                        .trim()
                        .ends_with(&format!(" {}", env!("CARGO_PKG_VERSION"))),
                "{args:?}: {printed}"
            );
        }
    }
}
