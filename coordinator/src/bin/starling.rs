//! `starling`: the command line client of a Starling coordinator.

use clap::Parser;

fn main() {
    let cli = starling_coordinator::cli::Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("starling: cannot start the async runtime: {error}");
            std::process::exit(starling_coordinator::cli::EXIT_TASK_FAILED);
        }
    };
    let code = runtime.block_on(starling_coordinator::cli::run(cli));
    std::process::exit(code);
}
