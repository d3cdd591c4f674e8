//! `starling`: the command line client of a Starling coordinator.

use clap::Parser;

fn main() {
    let cli = starling_cli::Cli::parse();
    // `up` runs servers and logs like one; the client commands stay quiet
    // unless RUST_LOG asks otherwise.
    let default_filter = match cli.command {
        #[cfg(feature = "up")]
        starling_cli::Command::Up(_) => "info,sqlx=warn",
        _ => "warn",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter)),
        )
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
    // Multi-threaded: `starling up` runs the coordinator and an agent here.
    // The client commands make one request at a time.
    #[cfg(feature = "up")]
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    #[cfg(not(feature = "up"))]
    let mut builder = tokio::runtime::Builder::new_current_thread();
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("starling: cannot start the async runtime: {error}");
            std::process::exit(starling_cli::EXIT_TASK_FAILED);
        }
    };
    let code = runtime.block_on(starling_cli::run(cli));
    std::process::exit(code);
}
