//! `starling-coordinator`: the coordinator server. `serve` starts it.

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

/// Starling's coordinator: node registry, placement, task store and REST API.
#[derive(Debug, Parser)]
#[command(
    name = "starling-coordinator",
    version,
    after_help = "Examples:\n  starling-coordinator serve\n  STARLING_API_TOKEN=$(cat /etc/starling/api.token) starling-coordinator serve --listen 0.0.0.0:7878 --public-url http://10.0.0.5:7878\n  starling-coordinator serve --broker mqtt://127.0.0.1:1883 --db postgres://postgres@127.0.0.1/starling\n  starling-coordinator serve --config /etc/starling/coordinator.toml\n  starling-coordinator sim --seed 42 --out bench/\n  starling-coordinator train --policy hirl --out hirl.json\n  starling-coordinator cluster-key > cluster.key   # once per federation; copy it to each site, mode 0600\n  starling-coordinator federation init --site plant-a\n  starling-coordinator serve --site plant-a --site-credentials .starling/coordinator/site-credentials.json --cluster-key-file cluster.key --gossip-listen 10.0.0.5:7946 --seed 10.0.1.5:7946\n\nEvery flag can also be set by its STARLING_* environment variable or in the --config file;\nflags win over the environment, which wins over the file. A --listen beyond loopback needs\n--api-token (or --insecure-no-auth, on an isolated network)."
)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Start the coordinator (embedded MQTT broker and SQLite unless told otherwise).
    // Boxed: the settings dwarf the other variant (clippy::large_enum_variant).
    Serve(Box<starling_coordinator::ServeArgs>),
    /// Simulate an edge fleet and compare every placement policy side by side.
    // Boxed like Serve: the scenario flags made it the largest variant.
    Sim(Box<starling_coordinator::simulate::SimArgs>),
    /// Train a learned placement policy (hirl or ddqn) in the simulator and write its model file.
    Train(starling_coordinator::train::TrainArgs),
    /// Print a new random cluster key (base64, 32 bytes) for --cluster-key.
    ClusterKey,
    /// The federation's trust root: create it (init), issue a site's credentials (issue), revoke a
    /// site (revoke).
    Federation(starling_coordinator::federation::identity::commands::FederationArgs),
    /// Run only the federation's gossip, with a synthetic site digest, printing what it sees as
    /// JSON lines (for benchmarks and experiments with many members on one machine).
    GossipMember(starling_coordinator::federation::member::GossipMemberArgs),
}

fn main() {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env()
                // The broker's connection log ("mosquitto" target) is debug.
                .unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    if let Err(error) = run(args) {
        // The library's errors already carry their cause in their message;
        // the chain would repeat it.
        eprintln!("starling-coordinator: {error}");
        // A setting the command cannot use is a usage error, like clap's own.
        let usage = matches!(
            error.downcast_ref(),
            Some(starling_coordinator::train::TrainCommandError::Usage(_))
        ) || matches!(
            error.downcast_ref(),
            Some(starling_coordinator::simulate::SimCommandError::Usage(_))
        );
        std::process::exit(if usage { 2 } else { 1 });
    }
}

fn run(args: Args) -> anyhow::Result<()> {
    let serve = match args.command {
        Command::Serve(serve) => serve,
        Command::Sim(sim) => return Ok(starling_coordinator::simulate::run(&sim)?),
        Command::Train(train) => return Ok(starling_coordinator::train::run(&train)?),
        Command::ClusterKey => {
            println!(
                "{}",
                starling_coordinator::federation::ClusterKey::generate()?
            );
            return Ok(());
        }
        Command::Federation(federation) => {
            return Ok(starling_coordinator::federation::identity::commands::run(
                &federation,
            )?)
        }
        Command::GossipMember(member) => {
            return runtime()?.block_on(starling_coordinator::federation::member::run(member))
        }
    };
    let config = serve.resolve()?;
    runtime()?.block_on(async move {
        let running = starling_coordinator::start(config).await?;
        println!("{}", running.ready_line());
        shutdown_signal().await;
        tracing::info!("shutting down");
        running.shutdown().await;
        Ok(())
    })
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|error| anyhow::anyhow!("cannot start the async runtime: {error}"))
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut terminate) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = terminate.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
