//! `starling up`: the whole of Starling in one process on embedded defaults —
//! the coordinator with its embedded MQTT broker and SQLite under one data
//! directory, and one agent for this machine — until Ctrl-C.
//!
//! It is secure by default like `serve` with a token: unless an API token is
//! given, it makes an admin token and writes it to `<data-dir>/admin.token`
//! (mode 0600), which the `starling` CLI run from the same directory picks
//! up. The local agent gets credentials minted directly in the store and
//! pins the coordinator's key, so it enrolls without a join token.

use std::net::SocketAddr;
use std::path::PathBuf;

use starling_agent::AgentConfig;
use starling_proto::Label;

use starling_coordinator::config::{DEFAULT_LISTEN, DEFAULT_MQTT_LISTEN, DEFAULT_POLICY};
use starling_coordinator::{start, CoordinatorConfig, StartError};

use crate::{ADMIN_TOKEN_FILE, DEFAULT_UP_DATA_DIR};

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
        default_value = DEFAULT_UP_DATA_DIR,
        value_name = "DIR"
    )]
    pub data_dir: PathBuf,
    /// The admin API token [default: the one in DIR/admin.token, made on first start].
    #[arg(
        long,
        env = "STARLING_API_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    pub api_token: Option<String>,
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
    /// The admin token or the local agent's credentials could not be made.
    #[error("{0}")]
    Credentials(String),
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

    let (api_token, token_file) = match &args.api_token {
        Some(token) if !token.trim().is_empty() => (token.trim().to_string(), None),
        _ => {
            let (token, path) = admin_token(&args.data_dir)?;
            (token, Some(path))
        }
    };
    let config = CoordinatorConfig {
        listen: args.listen,
        mqtt_listen: args.mqtt_listen,
        data_dir: args.data_dir.join("coordinator"),
        policy: args.policy.clone(),
        api_token: Some(api_token),
        ..CoordinatorConfig::default()
    };
    let running = start(config).await?;
    let mut agent_config = AgentConfig {
        broker: running.mqtt_url().to_string(),
        node_id: args.node_id.clone(),
        data_dir: args.data_dir.join("agent"),
        labels: args.labels.clone(),
        coordinator_url: Some(running.rest_url()),
        ..AgentConfig::default()
    };
    let credentials = match local_agent_credentials(&running, &agent_config).await {
        Ok(credentials) => credentials,
        Err(error) => {
            running.shutdown().await;
            return Err(error);
        }
    };
    agent_config.node_id = Some(credentials.node_id.clone());
    agent_config.mqtt_username = Some(credentials.mqtt_username);
    agent_config.mqtt_password = Some(credentials.mqtt_password);
    agent_config.coordinator_key = Some(key_bytes(&credentials.coordinator_key)?);
    let (stop_agent, agent_stopped) = tokio::sync::oneshot::channel::<()>();
    let mut agent = tokio::spawn(starling_agent::run(agent_config, async move {
        let _ = agent_stopped.await;
    }));
    println!("{}", running.ready_line());
    eprintln!(
        "starling up: REST API at {rest}  (export STARLING_URL={rest})\n\
         starling up: MQTT broker at {mqtt}; data in {data}; policy {policy}\n\
         starling up: {token}\n\
         starling up: try `starling nodes`, `starling run FILE.wasm --wait`; Ctrl-C stops",
        rest = running.rest_url(),
        mqtt = running.mqtt_url(),
        data = args.data_dir.display(),
        policy = args.policy,
        token = match &token_file {
            Some(path) => format!(
                "admin API token in {} (the starling CLI reads it from there when run here)",
                path.display()
            ),
            None => "admin API token: the one given (--api-token / STARLING_API_TOKEN)".to_string(),
        },
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

/// The admin token in `<data_dir>/admin.token`, made (0600) when missing.
fn admin_token(data_dir: &std::path::Path) -> Result<(String, PathBuf), UpError> {
    let path = data_dir.join(ADMIN_TOKEN_FILE);
    if let Ok(text) = std::fs::read_to_string(&path) {
        let token = text.trim().to_string();
        if !token.is_empty() {
            return Ok((token, path));
        }
    }
    let failed = |error: &dyn std::fmt::Display| {
        UpError::Credentials(format!(
            "cannot write the admin token to {}: {error}; pass --data-dir with a writable directory or --api-token",
            path.display()
        ))
    };
    std::fs::create_dir_all(data_dir).map_err(|error| failed(&error))?;
    let token =
        starling_coordinator::access::new_secret(starling_coordinator::access::API_TOKEN_PREFIX)
            .map_err(|error| UpError::Credentials(error.to_string()))?;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.mode(0o600);
    }
    let mut file = options.open(&path).map_err(|error| failed(&error))?;
    std::io::Write::write_all(&mut file, format!("{token}\n").as_bytes())
        .map_err(|error| failed(&error))?;
    Ok((token, path))
}

/// Credentials for the in-process agent, minted in the store (no join token:
/// this process is the coordinator).
async fn local_agent_credentials(
    running: &starling_coordinator::Running,
    agent_config: &AgentConfig,
) -> Result<starling_api::NodeCredentials, UpError> {
    let node_id = agent_config
        .resolved_node_id()
        .map_err(|error| UpError::Credentials(error.to_string()))?;
    // The agent's report key, made in its data directory as enrollment
    // would; a restarted `starling up` mints new credentials and a new key.
    let report_key = starling_agent::report_key::create(&agent_config.data_dir)
        .map_err(|error| UpError::Credentials(error.to_string()))?;
    running
        .mint_node_credentials(
            node_id.as_str(),
            &starling_agent::report_key::public_hex(&report_key),
        )
        .await
        .map_err(|error| {
            UpError::Credentials(format!(
                "cannot mint the local agent's credentials: {error}"
            ))
        })
}

fn key_bytes(hex_key: &str) -> Result<[u8; 32], UpError> {
    let bytes = hex::decode(hex_key)
        .map_err(|error| UpError::Credentials(format!("coordinator key: {error}")))?;
    <[u8; 32]>::try_from(bytes.as_slice()).map_err(|_| {
        UpError::Credentials(format!("coordinator key is {} bytes, not 32", bytes.len()))
    })
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
