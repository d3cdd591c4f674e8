//! `starling up`: the whole of Starling in one process on embedded defaults —
//! the coordinator with its embedded MQTT broker and SQLite under one data
//! directory, and one agent for this machine — until Ctrl-C.

use std::net::SocketAddr;
use std::path::PathBuf;

use starling_agent::AgentConfig;
use starling_proto::Label;

use crate::config::{DEFAULT_LISTEN, DEFAULT_MQTT_LISTEN, DEFAULT_POLICY};
use crate::{start, CoordinatorConfig, StartError};

/// Arguments of `starling up`.
#[derive(Debug, Clone, clap::Args)]
pub struct UpArgs {
    /// Where the REST API listens (port 0 picks a free port).
    #[arg(long, env = "STARLING_LISTEN", default_value = DEFAULT_LISTEN, value_name = "ADDR")]
    pub listen: SocketAddr,
    /// Where the embedded MQTT broker listens (port 0 picks a free port).
    #[arg(long, env = "STARLING_MQTT_LISTEN", default_value = DEFAULT_MQTT_LISTEN, value_name = "ADDR")]
    pub mqtt_listen: SocketAddr,
    /// Directory for the database, the artifacts and the agent's module cache.
    #[arg(
        long,
        env = "STARLING_DATA_DIR",
        default_value = ".starling",
        value_name = "DIR"
    )]
    pub data_dir: PathBuf,
    /// Placement policy.
    #[arg(long, env = "STARLING_POLICY", default_value = DEFAULT_POLICY, value_name = "NAME")]
    pub policy: String,
    /// The local agent's node id (default: derived from the machine id).
    #[arg(long, value_name = "ID")]
    pub node_id: Option<String>,
    /// The local agent's labels, `k=v,k=v`.
    #[arg(long, value_name = "K=V,...", value_delimiter = ',', value_parser = parse_label)]
    pub labels: Vec<Label>,
}

fn parse_label(s: &str) -> Result<Label, String> {
    Label::parse(s).map_err(|e| e.to_string())
}

/// Why `starling up` stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum UpError {
    /// The coordinator could not start.
    #[error(transparent)]
    Start(#[from] StartError),
    /// The local agent failed.
    #[error("the local agent stopped: {0}")]
    Agent(#[from] starling_agent::AgentError),
    /// Signal handlers could not be installed.
    #[error("cannot install the signal handlers: {0}")]
    Signals(std::io::Error),
}

/// Runs the coordinator and a local agent until SIGINT or SIGTERM.
pub async fn run(args: UpArgs) -> Result<(), UpError> {
    // Install the handlers before the agent probes OpenCL: PoCL loads LLVM,
    // which installs signal handlers of its own that would otherwise end the
    // process on SIGTERM without a clean shutdown.
    let mut shutdown = Shutdown::install().map_err(UpError::Signals)?;

    let config = CoordinatorConfig {
        listen: args.listen,
        mqtt_listen: args.mqtt_listen,
        data_dir: args.data_dir.join("coordinator"),
        policy: args.policy.clone(),
        ..CoordinatorConfig::default()
    };
    let running = start(config).await?;
    let agent_config = AgentConfig {
        broker: running.mqtt_url().to_string(),
        node_id: args.node_id.clone(),
        data_dir: args.data_dir.join("agent"),
        labels: args.labels.clone(),
        ..AgentConfig::default()
    };
    let (stop_agent, agent_stopped) = tokio::sync::oneshot::channel::<()>();
    let mut agent = tokio::spawn(starling_agent::run(agent_config, async move {
        let _ = agent_stopped.await;
    }));
    println!("{}", running.ready_line());
    eprintln!(
        "starling up: REST API at {rest}  (export STARLING_URL={rest})\n\
         starling up: MQTT broker at {mqtt}; data in {data}; policy {policy}\n\
         starling up: try `starling nodes`, `starling run FILE.wasm --wait`; Ctrl-C stops",
        rest = running.rest_url(),
        mqtt = running.mqtt_url(),
        data = args.data_dir.display(),
        policy = args.policy,
    );

    let agent_result = tokio::select! {
        () = shutdown.wait() => {
            tracing::info!("shutting down");
            let _ = stop_agent.send(());
            (&mut agent).await
        }
        result = &mut agent => result,
    };
    running.shutdown().await;
    match agent_result {
        Ok(result) => result.map_err(UpError::from),
        Err(join) => Err(UpError::Agent(starling_agent::AgentError::Internal(
            join.to_string(),
        ))),
    }
}

/// SIGINT or SIGTERM, whichever comes first.
struct Shutdown {
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
}

impl Shutdown {
    fn install() -> std::io::Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Ok(Self {
                terminate: signal(SignalKind::terminate())?,
                interrupt: signal(SignalKind::interrupt())?,
            })
        }
        #[cfg(not(unix))]
        {
            Ok(Self {})
        }
    }

    async fn wait(&mut self) {
        #[cfg(unix)]
        {
            tokio::select! {
                _ = self.terminate.recv() => {}
                _ = self.interrupt.recv() => {}
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
