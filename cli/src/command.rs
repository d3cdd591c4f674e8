//! The `starling` command line: publish modules, run tasks, watch nodes and
//! tasks, over the coordinator's REST API. Arguments, dispatch and output.

use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::Engine as _;
use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};

use starling_api::client::{Client, ClientError, EventFilter};
use starling_api::{
    ArtifactSignature, ArtifactStored, CreateApiToken, CreateJoinToken, ErrorCode, NodeSummary,
    Role, SiteList, SubmitTask, TaskDetail, TaskKind, TaskLimits, TaskStatus, TaskSummary,
};
use starling_net::{parse_duration, parse_size};

use crate::manifest::Manifest;

/// Exit status: success.
pub const EXIT_OK: i32 = 0;
/// Exit status: the task failed (or was cancelled), or the coordinator failed.
pub const EXIT_TASK_FAILED: i32 = 1;
/// Exit status: bad usage or a request the coordinator refused.
pub const EXIT_USAGE: i32 = 2;
/// Exit status: the coordinator could not be reached.
pub const EXIT_UNREACHABLE: i32 = 3;

/// How long one long poll of `--wait` asks the coordinator to hold the
/// request: the answer comes as soon as the task ends, so this only bounds
/// how often a long task costs a request.
const LONG_POLL: Duration = Duration::from_secs(30);

const EXAMPLES: &str = "\
Examples:
  starling up                                     coordinator + broker + SQLite + local agent, here
  starling nodes                                  list the nodes the coordinator knows
  starling publish primes.wasm                    upload a module; prints its digest
  starling keygen --out me.key                    a publisher key; prints the public half
  starling publish primes.wasm --sign-with me.key upload and sign; nodes with
                                                  --trusted-publisher KEY run only signed work
  starling run primes.wasm --arg 100000 --wait    upload, submit, wait, print the output
  echo hello | starling run echo.wasm --input - --wait
  starling submit-batch tasks.jsonl               many tasks in one request, one JSON task a line;
                                                  all created or none (see submit-batch --help)
  starling run 9f86d0…0a08 --deadline 5s          submit an already published module by digest
  starling run tasks/saxpy/saxpy.cl --arg n=4 --input xy.f32 --wait
                                                  an OpenCL kernel: scalars as NAME=VALUE,
                                                  input = its input buffers, little-endian
  starling tasks --state failed                   recent failed tasks
  starling task 0190c3e4-…                        one task: state, node, output, why it went there
  starling task 0190c3e4-… --wait                 wait for it to end, then show it
  starling watch --node pi-7                      live events of one node (--json: one object a line)
  starling watch --kind task                      every task state change as it happens
  starling cancel 0190c3e4-…
  starling token create --ttl 1h --uses 3         a join token for enrolling up to 3 agents (operator)
  starling image configure starling-arm64.img --coordinator-url http://10.0.0.2:7878 \\
      --join-token stj_… --coordinator-key 3f…e1
                                                  a flashable image that enrolls by itself
  starling node revoke pi-7                       shut a node out: broker login, messages, its tasks move
  starling api-token create --role developer --name ci
                                                  a bearer token for CI (admin); shown once
  starling api-token list | revoke ID

A task.toml beside the module (or tasks/NAME/task.toml above it) sets the task's
class, demand, work estimate and default deadline; for a .cl kernel its [opencl]
section names the kernel, its arguments and work sizes.

The API token comes from --token, STARLING_API_TOKEN, or the admin.token that
`starling up` writes under its data directory (./.starling/admin.token). Roles:
viewer reads; developer also publishes, runs and cancels; operator also makes join
tokens and revokes nodes; admin also manages API tokens.

Exit status: 0 ok, 1 task failed or cancelled, 2 usage or request refused
(401 no or bad token, 403 role too low), 3 coordinator unreachable.";

/// Starling's command line client.
#[derive(Debug, Parser)]
#[command(
    name = "starling",
    version,
    about = "Run WebAssembly and OpenCL tasks on a Starling edge fleet",
    after_help = EXAMPLES
)]
pub struct Cli {
    /// The coordinator's URL.
    #[arg(
        long,
        global = true,
        env = "STARLING_URL",
        default_value = "http://127.0.0.1:7878",
        value_name = "URL"
    )]
    pub coordinator: String,
    /// API token [default: STARLING_API_TOKEN, else ./.starling/admin.token from `starling up`].
    #[arg(
        long,
        global = true,
        env = "STARLING_API_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    pub token: Option<String>,
    /// CA certificate (PEM) to trust for an https:// coordinator [default: the system roots].
    #[arg(long, global = true, env = "STARLING_CA_FILE", value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
    /// Print JSON instead of text.
    #[arg(long, global = true)]
    pub json: bool,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run everything in this process: coordinator, embedded broker, SQLite and a local agent.
    #[cfg(feature = "up")]
    Up(crate::up::UpArgs),
    /// List nodes: id, online, architecture, cores, memory, load.
    Nodes,
    /// List the sites of the federation as this coordinator sees them: state by the failure
    /// detector, REST URL, digest age, round trip, free slots, queue.
    Sites,
    /// Show one node (`starling node ID`), or revoke it (`starling node revoke ID`).
    Node(NodeArgs),
    /// Join tokens that let agents enroll (operator role).
    Token {
        /// What to do.
        #[command(subcommand)]
        action: TokenAction,
    },
    /// API tokens and their roles (admin role).
    #[command(name = "api-token")]
    ApiToken {
        /// What to do.
        #[command(subcommand)]
        action: ApiTokenAction,
    },
    /// Upload a WebAssembly module, or an OpenCL kernel with its manifest; prints its digest.
    ///
    /// A `.cl` file is packed with the `[opencl]` section of its manifest
    /// (`task.toml` beside it, or `--manifest`), checked here as the
    /// coordinator will check it, and uploaded as one artifact.
    Publish {
        /// The .wasm module or .cl kernel.
        file: PathBuf,
        /// Manifest for a .cl kernel, instead of looking beside it.
        #[arg(long, value_name = "FILE")]
        manifest: Option<PathBuf>,
        /// Also sign the artifact with this publisher key (see `starling keygen`).
        #[arg(long, value_name = "KEY_FILE")]
        sign_with: Option<PathBuf>,
    },
    /// Device images (operator, offline): write the join file a flashed device enrolls with.
    Image {
        /// What to do.
        #[command(subcommand)]
        action: ImageAction,
    },
    /// Sign a published artifact with a publisher key, so nodes that trust the key
    /// (`starling-agent --trusted-publisher`) run it.
    ///
    /// The digest is signed here; the secret never leaves this machine. The
    /// coordinator checks the signature and sends it with every assignment.
    Sign {
        /// The artifact's digest (64 hex digits), as `starling publish` printed it.
        digest: String,
        /// The publisher key file (`starling keygen`).
        #[arg(long, value_name = "KEY_FILE")]
        key: PathBuf,
    },
    /// Make a publisher key: writes its secret to a new file (mode 0600) and prints the
    /// public key that nodes list with `--trusted-publisher`. Works offline.
    Keygen {
        /// Where to write the secret; never overwritten.
        #[arg(long, value_name = "FILE", default_value = "publisher.key")]
        out: PathBuf,
    },
    /// Submit a task (uploading the module first when given a file).
    Run(RunArgs),
    /// Submit many tasks at once from a JSON-lines file, one task a line: all are
    /// created or, if one is refused, none (at most 1000).
    #[command(name = "submit-batch", after_help = crate::batch::SUBMIT_BATCH_HELP)]
    SubmitBatch {
        /// The JSON-lines file (`-` reads stdin).
        #[arg(value_name = "FILE.jsonl|-")]
        file: PathBuf,
    },
    /// List recent tasks, newest first.
    Tasks {
        /// Only tasks in this state (pending, assigned, running, succeeded, failed, cancelled).
        #[arg(long)]
        state: Option<String>,
        /// How many.
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// Show one task: state, node, attempts, output, failure and placement explanation.
    Task {
        /// The task's id.
        id: String,
        /// Wait until the task has ended first (exit status 1 unless it succeeded).
        #[arg(long)]
        wait: bool,
    },
    /// Print live events as they happen: task state changes, nodes coming and going,
    /// telemetry (once a second per node), sites. Runs until interrupted; resumes
    /// where it was after a dropped connection.
    Watch {
        /// Only events of this node (its changes, telemetry, and tasks on it).
        #[arg(long, value_name = "ID")]
        node: Option<String>,
        /// Only events of this task.
        #[arg(long, value_name = "ID")]
        task: Option<String>,
        /// Only these kinds, comma-separated: task, node, telemetry, site.
        #[arg(long, value_name = "KINDS", value_delimiter = ',')]
        kind: Vec<starling_api::EventKind>,
    },
    /// Cancel a task.
    Cancel {
        /// The task's id.
        id: String,
    },
}

/// Arguments of `starling node`.
#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct NodeArgs {
    /// The node's id: show its capability, latest telemetry and status.
    #[arg(required = true)]
    pub id: Option<String>,
    /// Or act on a node.
    #[command(subcommand)]
    pub action: Option<NodeAction>,
}

/// `starling node` actions.
#[derive(Debug, Subcommand)]
pub enum NodeAction {
    /// Revoke a node's credentials (operator): the broker refuses its next
    /// login, its messages are ignored, its in-flight tasks are placed again.
    /// It can enroll again only with a new join token.
    Revoke {
        /// The node's id.
        id: String,
    },
}

/// `starling token` actions.
#[derive(Debug, Subcommand)]
pub enum TokenAction {
    /// Create a join token; an agent enrolls with it once
    /// (`starling-agent run --coordinator-url URL --join-token TOKEN --coordinator-key KEY`).
    /// The secret is printed once and stored only as a hash.
    Create {
        /// How long it stays valid (e.g. 10m, 1h, 7d is 168h).
        #[arg(long, default_value = "1h", value_name = "DUR")]
        ttl: String,
        /// How many agents may enroll with it.
        #[arg(long, default_value_t = 1, value_name = "N")]
        uses: u32,
    },
}

/// `starling image` actions.
#[derive(Debug, Subcommand)]
pub enum ImageAction {
    /// Write starling.toml (coordinator, key, join token) into an image's FAT boot partition,
    /// without mounting it (mtools), before flashing it with `bmaptool copy` or `dd`. Every
    /// device flashed from the image enrolls once with the token (use --uses N) under a node
    /// id derived from its /etc/machine-id, then removes the token from its card.
    ///
    /// Example: starling image configure starling-arm64.img --coordinator-url
    /// http://10.0.0.2:8080 --join-token stj_… --coordinator-key 3f…e1
    Configure {
        /// The raw disk image (from deploy/image/build).
        image: PathBuf,
        /// The settings written (--node-id only for an image meant for one device).
        #[command(flatten)]
        join: starling_net::JoinArgs,
    },
}

/// `starling api-token` actions.
#[derive(Debug, Subcommand)]
pub enum ApiTokenAction {
    /// Create a bearer token with a role; the secret is printed once and
    /// stored only as a hash.
    Create {
        /// viewer (read), developer (+ publish, run, cancel), operator (+ join
        /// tokens, revoke nodes) or admin (+ API tokens).
        #[arg(long, value_name = "ROLE")]
        role: Role,
        /// Who or what the token is for (e.g. ci, grafana, alice).
        #[arg(long, value_name = "NAME")]
        name: String,
    },
    /// List tokens: id, name, role, created, revoked (never the secrets).
    List,
    /// Revoke a token by id; calls with it get 401 from then on.
    Revoke {
        /// The token's id, as `list` shows it.
        id: String,
    },
}

/// Arguments of `starling run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// A .wasm module, a .cl kernel (with its task.toml), or the digest of a published one.
    pub target: String,
    /// File whose bytes go to the task's stdin, or for a kernel its input
    /// buffers concatenated (`-` reads this command's stdin).
    #[arg(long, value_name = "FILE|-")]
    pub input: Option<String>,
    /// An argument for the task (repeat for more); a kernel's scalars as NAME=VALUE.
    #[arg(long = "arg", value_name = "ARG", allow_hyphen_values = true)]
    pub args: Vec<String>,
    /// Deadline from now (e.g. 500ms, 10s, 2m) [default: the manifest's, else none].
    #[arg(long, value_name = "DUR")]
    pub deadline: Option<String>,
    /// Priority, 0..=255, higher first.
    #[arg(long, default_value_t = 0)]
    pub priority: u8,
    /// Wall-clock limit per attempt (e.g. 10s).
    #[arg(long, value_name = "DUR")]
    pub timeout: Option<String>,
    /// Memory limit per attempt (e.g. 64MiB).
    #[arg(long, value_name = "SIZE")]
    pub memory: Option<String>,
    /// Output limit per attempt (e.g. 256KiB).
    #[arg(long, value_name = "SIZE")]
    pub max_output: Option<String>,
    /// Task class (cpu, gpu, io) [default: the manifest's, else cpu].
    #[arg(long)]
    pub class: Option<String>,
    /// Manifest to use instead of looking beside the module.
    #[arg(long, value_name = "FILE")]
    pub manifest: Option<PathBuf>,
    /// Wait for the task to end and print its output.
    #[arg(long)]
    pub wait: bool,
    /// Keep the task, parked, even if no node of the site can run it now
    /// (without this the coordinator refuses it with `no_capable_node`).
    #[arg(long)]
    pub wait_for_node: bool,
}

/// A CLI failure with the exit status it maps to.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Bad arguments or local input.
    #[error("{0}")]
    Usage(String),
    /// The coordinator failed a call.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// `starling up` could not start or stopped with an error.
    #[error(transparent)]
    #[cfg(feature = "up")]
    Up(#[from] crate::up::UpError),
}

impl From<crate::batch::SubmitBatchError> for CliError {
    fn from(error: crate::batch::SubmitBatchError) -> Self {
        match error {
            crate::batch::SubmitBatchError::Input(message) => CliError::Usage(message),
            crate::batch::SubmitBatchError::Client(error) => CliError::Client(error),
        }
    }
}

impl From<crate::watch::WatchError> for CliError {
    fn from(error: crate::watch::WatchError) -> Self {
        match error {
            crate::watch::WatchError::Client(error) => CliError::Client(error),
            crate::watch::WatchError::Output(error) => {
                CliError::Usage(format!("cannot write to stdout: {error}"))
            }
        }
    }
}

impl CliError {
    /// The exit status for this error.
    pub fn exit_code(&self) -> i32 {
        match self {
            CliError::Usage(_) => EXIT_USAGE,
            CliError::Client(ClientError::Unreachable { .. }) => EXIT_UNREACHABLE,
            // The coordinator's own failures are not the caller's doing; every
            // other refusal says what to change in the request.
            CliError::Client(ClientError::Api { code, status, .. }) => match code {
                ErrorCode::Internal | ErrorCode::DatabaseUnavailable => EXIT_TASK_FAILED,
                ErrorCode::Unknown if *status >= 500 => EXIT_TASK_FAILED,
                _ => EXIT_USAGE,
            },
            // An id no URL can carry (`.`, `..`, empty) is the caller's to fix.
            CliError::Client(ClientError::InvalidId { .. }) => EXIT_USAGE,
            CliError::Client(_) => EXIT_TASK_FAILED,
            #[cfg(feature = "up")]
            CliError::Up(_) => EXIT_TASK_FAILED,
        }
    }
}

fn print_json<T: serde::Serialize>(value: &T) -> Result<(), CliError> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|error| CliError::Usage(format!("cannot print JSON: {error}")))?;
    println!("{text}");
    Ok(())
}

/// Runs the CLI and returns the process's exit status.
pub async fn run(cli: Cli) -> i32 {
    let token = cli.token.clone().or_else(up_admin_token);
    let client = match Client::with_ca_file(&cli.coordinator, token, cli.ca_file.as_deref()) {
        Ok(client) => client,
        Err(error) => {
            eprintln!("starling: {error}");
            return EXIT_USAGE;
        }
    };
    match dispatch(&cli, &client).await {
        Ok(code) => code,
        Err(error) => {
            eprintln!("starling: {error}");
            error.exit_code()
        }
    }
}

/// Where `starling up`, run here with its default data directory, wrote its
/// admin token: the fallback when neither --token nor STARLING_API_TOKEN is given.
pub fn default_admin_token_path() -> PathBuf {
    Path::new(crate::DEFAULT_UP_DATA_DIR).join(crate::ADMIN_TOKEN_FILE)
}

fn up_admin_token() -> Option<String> {
    std::fs::read_to_string(default_admin_token_path())
        .ok()
        .map(|text| text.trim().to_string())
        .filter(|token| !token.is_empty())
}

async fn dispatch(cli: &Cli, client: &Client) -> Result<i32, CliError> {
    match &cli.command {
        #[cfg(feature = "up")]
        Command::Up(args) => {
            crate::up::run(args.clone()).await?;
            Ok(EXIT_OK)
        }
        Command::Nodes => {
            let nodes = client.nodes().await?.nodes;
            if cli.json {
                print_json(&nodes)?;
            } else {
                print_nodes(&nodes);
            }
            Ok(EXIT_OK)
        }
        Command::Sites => {
            let sites = client.sites().await?;
            if cli.json {
                print_json(&sites)?;
            } else {
                print_sites(&sites);
            }
            Ok(EXIT_OK)
        }
        Command::Node(NodeArgs {
            action: Some(NodeAction::Revoke { id }),
            ..
        }) => {
            let revoked = client.revoke_node(id).await?;
            if cli.json {
                print_json(&revoked)?;
            } else {
                println!(
                    "{} revoked; {} task(s) in flight on it went back to the queue",
                    revoked.node_id,
                    revoked.requeued_tasks.len()
                );
            }
            Ok(EXIT_OK)
        }
        Command::Node(NodeArgs { id, action: None }) => {
            let id = id
                .as_deref()
                .ok_or_else(|| CliError::Usage("give a node id: starling node ID".into()))?;
            let node = client.node(id).await?;
            print_json(&node)?;
            Ok(EXIT_OK)
        }
        Command::Token {
            action: TokenAction::Create { ttl, uses },
        } => {
            let ttl = usage(parse_duration(ttl), "--ttl")?;
            let created = client
                .create_join_token(&CreateJoinToken {
                    ttl_seconds: Some(ttl.as_secs().max(1)),
                    uses: Some(*uses),
                })
                .await?;
            if cli.json {
                print_json(&created)?;
            } else {
                println!("{}", created.token);
                eprintln!(
                    "starling: join token for {} enrollment(s), valid for {}; shown only now.\n\
                     starling: enroll an agent with: starling-agent run --coordinator-url {} --join-token TOKEN --coordinator-key {}",
                    created.uses,
                    humanize(ttl),
                    client.base(),
                    created.coordinator_key
                );
            }
            Ok(EXIT_OK)
        }
        Command::ApiToken { action } => api_token(cli, client, action).await,
        Command::Publish {
            file,
            manifest,
            sign_with,
        } => {
            // Read the key first: a bad key file fails before anything is uploaded.
            let key = sign_with.as_deref().map(read_publisher_key).transpose()?;
            let stored = publish(client, file, manifest.as_deref()).await?;
            let signature = match &key {
                Some(key) => Some(sign_artifact(client, key, &stored.digest).await?),
                None => None,
            };
            if cli.json {
                print_json(&serde_json::json!({
                    "digest": stored.digest,
                    "size": stored.size,
                    "runtime": stored.runtime,
                    "created": stored.created,
                    "publisher_key": signature.as_ref().map(|s| &s.key),
                }))?;
            } else {
                println!("{}", stored.digest);
                if let Some(signature) = signature {
                    eprintln!("starling: signed by publisher {}", signature.key);
                }
            }
            Ok(EXIT_OK)
        }
        Command::Sign { digest, key } => {
            let key = read_publisher_key(key)?;
            let signature = sign_artifact(client, &key, digest).await?;
            if cli.json {
                print_json(&signature)?;
            } else {
                println!("{digest} signed by publisher {}", signature.key);
            }
            Ok(EXIT_OK)
        }
        Command::Image {
            action: ImageAction::Configure { image, join },
        } => {
            let file = join.to_join_file();
            let done = crate::image::configure(image, &file)
                .map_err(|error| CliError::Usage(error.to_string()))?;
            if cli.json {
                print_json(&done)?;
            } else {
                println!(
                    "wrote {} into partition {} of {}",
                    done.file,
                    done.partition,
                    done.image.display()
                );
            }
            Ok(EXIT_OK)
        }
        Command::Keygen { out } => {
            let key = crate::publisher::generate()
                .and_then(|key| crate::publisher::write(out, &key).map(|()| key))
                .map_err(|error| CliError::Usage(error.to_string()))?;
            let public = crate::publisher::public_hex(&key);
            if cli.json {
                print_json(&serde_json::json!({
                    "public_key": public,
                    "key_file": out,
                }))?;
            } else {
                println!("{public}");
                eprintln!(
                    "starling: secret written to {} (keep it private); nodes trust it with: starling-agent run --trusted-publisher {public}",
                    out.display()
                );
            }
            Ok(EXIT_OK)
        }
        Command::Run(args) => run_task(cli, client, args).await,
        Command::SubmitBatch { file } => {
            let created = crate::batch::submit_file(client, file).await?;
            if cli.json {
                print_json(&created)?;
            } else {
                for task in &created.tasks {
                    println!("{}", task.id);
                }
            }
            Ok(EXIT_OK)
        }
        Command::Tasks { state, limit } => {
            let tasks = client.tasks(state.as_deref(), *limit).await?.tasks;
            if cli.json {
                print_json(&tasks)?;
            } else {
                print_tasks(&tasks);
            }
            Ok(EXIT_OK)
        }
        Command::Task { id, wait } => {
            let task = if *wait {
                wait_for_end(client, id, cli.json).await?
            } else {
                client.task(id).await?
            };
            if cli.json {
                print_json(&task)?;
            } else {
                print_task(&task);
            }
            Ok(if *wait && task.state != TaskStatus::Succeeded {
                EXIT_TASK_FAILED
            } else {
                EXIT_OK
            })
        }
        Command::Watch { node, task, kind } => {
            let filter = EventFilter {
                task: task.clone(),
                node: node.clone(),
                kinds: kind.clone(),
            };
            crate::watch::watch(client, &filter, cli.json).await?;
            Ok(EXIT_OK)
        }
        Command::Cancel { id } => {
            let task = client.cancel(id).await?;
            if cli.json {
                print_json(&task)?;
            } else if task.state == TaskStatus::Cancelled {
                println!("{} cancelled", task.id);
            } else {
                println!(
                    "{} cancel sent to node {}",
                    task.id,
                    task.node_id.as_deref().unwrap_or("?")
                );
            }
            Ok(EXIT_OK)
        }
    }
}

async fn api_token(cli: &Cli, client: &Client, action: &ApiTokenAction) -> Result<i32, CliError> {
    match action {
        ApiTokenAction::Create { role, name } => {
            let created = client
                .create_api_token(&CreateApiToken {
                    name: name.clone(),
                    role: *role,
                })
                .await?;
            if cli.json {
                print_json(&created)?;
            } else {
                println!("{}", created.token);
                eprintln!(
                    "starling: {} token {} ({}) created; shown only now. Use it with --token or STARLING_API_TOKEN",
                    created.role, created.id, created.name
                );
            }
        }
        ApiTokenAction::List => {
            let tokens = client.api_tokens().await?.tokens;
            if cli.json {
                print_json(&tokens)?;
            } else if tokens.is_empty() {
                println!("no API tokens (the bootstrap --api-token is not listed)");
            } else {
                println!("{:<38} {:<10} {:<20} {:<8}", "ID", "ROLE", "NAME", "STATE");
                for token in tokens {
                    println!(
                        "{:<38} {:<10} {:<20} {:<8}",
                        token.id,
                        token.role,
                        token.name,
                        if token.revoked_ms.is_some() {
                            "revoked"
                        } else {
                            "live"
                        }
                    );
                }
            }
        }
        ApiTokenAction::Revoke { id } => {
            let tokens = client.revoke_api_token(id).await?.tokens;
            if cli.json {
                print_json(&tokens)?;
            } else {
                println!("{id} revoked");
            }
        }
    }
    Ok(EXIT_OK)
}

fn humanize(duration: Duration) -> String {
    let seconds = duration.as_secs();
    match seconds {
        s if s % 3600 == 0 => format!("{}h", s / 3600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

fn read_publisher_key(path: &Path) -> Result<ed25519_dalek::SigningKey, CliError> {
    crate::publisher::read(path).map_err(|error| CliError::Usage(error.to_string()))
}

/// Signs `digest` here and records the signature with the coordinator.
async fn sign_artifact(
    client: &Client,
    key: &ed25519_dalek::SigningKey,
    digest: &str,
) -> Result<ArtifactSignature, CliError> {
    let parsed = starling_proto::Digest::parse(digest).map_err(|error| {
        CliError::Usage(format!("{error}; give the digest starling publish printed"))
    })?;
    let signature = crate::publisher::sign(key, &parsed);
    Ok(client.sign_artifact(digest, &signature).await?)
}

async fn publish(
    client: &Client,
    file: &Path,
    manifest: Option<&Path>,
) -> Result<ArtifactStored, CliError> {
    let bytes = artifact_bytes(file, manifest)?;
    Ok(client.publish(bytes).await?)
}

/// The bytes to upload for a file: a module as it is; a `.cl` kernel packed
/// with its manifest's `[opencl]` section.
fn artifact_bytes(file: &Path, manifest: Option<&Path>) -> Result<Vec<u8>, CliError> {
    if file.extension().and_then(|e| e.to_str()) != Some("cl") {
        return std::fs::read(file)
            .map_err(|error| CliError::Usage(format!("cannot read {}: {error}", file.display())));
    }
    let path = manifest
        .map(Path::to_path_buf)
        .or_else(|| Manifest::find_for(file))
        .ok_or_else(|| {
            CliError::Usage(format!(
                "no task.toml beside {}; an OpenCL kernel needs a manifest with an [opencl] section (see tasks/saxpy/task.toml), or pass --manifest",
                file.display()
            ))
        })?;
    let mut loaded = Manifest::load(&path).map_err(|error| CliError::Usage(error.to_string()))?;
    // The file named on the command line is the source, whatever the manifest says.
    if let Some(kernel) = loaded.kernel.as_mut() {
        kernel.source = file.to_path_buf();
    }
    let package = loaded
        .package(&path)
        .map_err(|error| CliError::Usage(error.to_string()))?;
    Ok(package.to_bytes())
}

fn read_input(source: &str) -> Result<Vec<u8>, CliError> {
    if source == "-" {
        let mut bytes = Vec::new();
        std::io::stdin()
            .read_to_end(&mut bytes)
            .map_err(|error| CliError::Usage(format!("cannot read stdin: {error}")))?;
        Ok(bytes)
    } else {
        std::fs::read(source)
            .map_err(|error| CliError::Usage(format!("cannot read input {source}: {error}")))
    }
}

fn usage<T, E: std::fmt::Display>(result: Result<T, E>, what: &str) -> Result<T, CliError> {
    result.map_err(|error| CliError::Usage(format!("{what}: {error}")))
}

fn looks_like_digest(text: &str) -> bool {
    let hex = text.strip_prefix("sha256:").unwrap_or(text);
    hex.len() == 64 && hex.chars().all(|c| c.is_ascii_hexdigit())
}

async fn run_task(cli: &Cli, client: &Client, args: &RunArgs) -> Result<i32, CliError> {
    let target = Path::new(&args.target);
    let (digest, manifest_path) = if target.is_file() {
        let manifest = match &args.manifest {
            Some(path) => Some(path.clone()),
            None => Manifest::find_for(target),
        };
        let stored = publish(client, target, manifest.as_deref()).await?;
        (stored.digest, manifest)
    } else if looks_like_digest(&args.target) {
        (args.target.clone(), args.manifest.clone())
    } else {
        return Err(CliError::Usage(format!(
            "{} is neither a file nor a digest; give a .wasm or .cl file or the digest `starling publish` printed",
            args.target
        )));
    };
    let manifest = match &manifest_path {
        Some(path) => {
            Some(Manifest::load(path).map_err(|error| CliError::Usage(error.to_string()))?)
        }
        None => None,
    };
    if let (Some(path), false) = (&manifest_path, cli.json) {
        eprintln!("starling: using manifest {}", path.display());
    }

    let mut limits = TaskLimits::default();
    if let Some(timeout) = &args.timeout {
        limits.wall_ms = u64::try_from(usage(parse_duration(timeout), "--timeout")?.as_millis())
            .unwrap_or(u64::MAX);
    }
    if let Some(memory) = &args.memory {
        limits.memory_bytes = usage(parse_size(memory), "--memory")?;
    }
    if let Some(output) = &args.max_output {
        limits.output_bytes = usage(parse_size(output), "--max-output")?;
    }
    let deadline = match &args.deadline {
        Some(text) => Some(usage(parse_duration(text), "--deadline")?),
        None => manifest.as_ref().and_then(Manifest::deadline),
    };
    let class = match &args.class {
        Some(text) => text
            .parse::<TaskKind>()
            .map_err(|error| CliError::Usage(error.to_string()))?,
        None => manifest.as_ref().map(|m| m.class).unwrap_or_default(),
    };
    let input = match &args.input {
        Some(source) => read_input(source)?,
        None => Vec::new(),
    };
    let submission = SubmitTask {
        artifact: digest,
        input_base64: (!input.is_empty())
            .then(|| base64::engine::general_purpose::STANDARD.encode(&input)),
        input_text: None,
        args: args.args.clone(),
        deadline_ms: deadline.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        priority: args.priority,
        class,
        demand: manifest.as_ref().map(|m| m.demand).unwrap_or_default(),
        limits,
        work_seconds: manifest.as_ref().and_then(|m| m.work_seconds),
        grants: manifest.as_ref().map(|m| m.grants),
        wait_for_node: args.wait_for_node,
    };
    let task = client.submit(&submission).await?;
    if !args.wait {
        if cli.json {
            print_json(&task)?;
        } else {
            println!("{}", task.id);
        }
        return Ok(EXIT_OK);
    }
    let task = wait_for_end(client, &task.id, cli.json).await?;
    if cli.json {
        print_json(&task)?;
    }
    match task.state {
        TaskStatus::Succeeded => {
            if !cli.json {
                let output = task
                    .output_base64
                    .as_deref()
                    .map(|encoded| base64::engine::general_purpose::STANDARD.decode(encoded))
                    .transpose()
                    .map_err(|error| {
                        CliError::Usage(format!("the coordinator sent bad base64: {error}"))
                    })?
                    .unwrap_or_default();
                let mut stdout = std::io::stdout().lock();
                stdout
                    .write_all(&output)
                    .and_then(|()| stdout.flush())
                    .map_err(|error| CliError::Usage(format!("cannot write output: {error}")))?;
            }
            Ok(EXIT_OK)
        }
        state => {
            eprintln!(
                "starling: task {} {state}: {}{}",
                task.id,
                task.reason.as_deref().unwrap_or("no reason given"),
                task.message
                    .as_deref()
                    .map(|message| format!(" ({message})"))
                    .unwrap_or_default()
            );
            Ok(EXIT_TASK_FAILED)
        }
    }
}

async fn wait_for_end(client: &Client, id: &str, json: bool) -> Result<TaskDetail, CliError> {
    let spinner = if json || !std::io::stderr().is_terminal() {
        ProgressBar::hidden()
    } else {
        let spinner = ProgressBar::new_spinner();
        if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
            spinner.set_style(style);
        }
        spinner.enable_steady_tick(Duration::from_millis(100));
        spinner
    };
    let started = Instant::now();
    loop {
        // Answered when the task ends (or after LONG_POLL): no poll loop, so
        // the result arrives as soon as the coordinator records it.
        let task = client.task_wait(id, LONG_POLL).await?;
        spinner.set_message(format!(
            "task {} {}{}",
            task.id,
            task.state,
            task.node_id
                .as_deref()
                .map(|node| format!(" on {node}"))
                .unwrap_or_default()
        ));
        if task.state.is_terminal() {
            spinner.finish_and_clear();
            tracing::debug!(elapsed = ?started.elapsed(), "task ended");
            return Ok(task);
        }
    }
}

fn print_nodes(nodes: &[NodeSummary]) {
    if nodes.is_empty() {
        println!(
            "no nodes yet; start an agent with `starling-agent run --broker mqtt://HOST:PORT`"
        );
        return;
    }
    println!(
        "{:<24} {:<8} {:<8} {:>5} {:>9} {:>5} {:>6}",
        "NODE", "STATE", "ARCH", "CORES", "MEMORY", "GPUS", "LOAD"
    );
    for node in nodes {
        println!(
            "{:<24} {:<8} {:<8} {:>5} {:>8}M {:>5} {:>6}",
            node.id,
            if node.online { "online" } else { "offline" },
            node.arch,
            node.cores,
            node.memory_bytes / (1024 * 1024),
            node.gpus,
            node.cpu_load
                .map(|load| format!("{:.0}%", load * 100.0))
                .unwrap_or_else(|| "-".to_string())
        );
    }
}

fn print_sites(list: &SiteList) {
    if !list.federated {
        println!("this coordinator does not federate; start it with --site NAME --cluster-key KEY [--seed ADDR]");
        return;
    }
    println!(
        "{:<20} {:<8} {:<22} {:<28} {:>7} {:>7} {:>5} {:>7} {:>7}",
        "SITE", "STATE", "GOSSIP", "API", "DIGEST", "RTT", "NODES", "FREE", "PENDING"
    );
    let age = |ms: Option<u64>| {
        ms.map_or_else(
            || "-".to_string(),
            |ms| format!("{:.1}s", ms as f64 / 1000.0),
        )
    };
    for site in &list.sites {
        let digest = site.digest.as_ref();
        println!(
            "{:<20} {:<8} {:<22} {:<28} {:>7} {:>7} {:>5} {:>7} {:>7}",
            site.site,
            site.state.as_str(),
            site.gossip_addr.as_deref().unwrap_or("-"),
            site.api_url.as_deref().unwrap_or("-"),
            age(site.digest_age_ms),
            site.rtt_ms
                .map_or_else(|| "-".to_string(), |ms| format!("{ms:.0}ms")),
            digest.map_or_else(|| "-".to_string(), |d| d.nodes.to_string()),
            digest.map_or_else(
                || "-".to_string(),
                |d| d
                    .classes
                    .iter()
                    .map(|c| u32::from(c.free_slots))
                    .sum::<u32>()
                    .to_string()
            ),
            digest.map_or_else(|| "-".to_string(), |d| d.pending.to_string()),
        );
    }
}

fn print_tasks(tasks: &[TaskSummary]) {
    if tasks.is_empty() {
        println!("no tasks");
        return;
    }
    println!(
        "{:<38} {:<10} {:<20} {:>7}",
        "TASK", "STATE", "NODE", "ATTEMPT"
    );
    for task in tasks {
        println!(
            "{:<38} {:<10} {:<20} {:>7}",
            task.id,
            task.state,
            task.node_id.as_deref().unwrap_or("-"),
            task.attempt
        );
    }
}

fn print_task(task: &TaskDetail) {
    println!("task      {}", task.id);
    println!("state     {}", task.state);
    println!("artifact  {}", task.artifact);
    match &task.site {
        Some(site) => println!(
            "node      {} at site {site} (forwarded)",
            task.site_node.as_deref().unwrap_or("-")
        ),
        None => println!("node      {}", task.node_id.as_deref().unwrap_or("-")),
    }
    if let Some(origin) = &task.origin_site {
        println!("from      site {origin}");
    }
    println!("attempt   {}", task.attempt);
    if let Some(level) = task.power_level {
        println!("power     level {level}");
    }
    if let Some(reason) = &task.reason {
        println!(
            "failure   {reason}{}",
            task.message
                .as_deref()
                .map(|m| format!(": {m}"))
                .unwrap_or_default()
        );
    }
    if let Some(explanation) = &task.explanation {
        if let Some(summary) = explanation.get("summary").and_then(|s| s.as_str()) {
            println!("placement {summary}");
        }
    }
    for event in &task.events {
        let from = match (&event.site, &event.node_id) {
            (Some(site), Some(node)) => format!("{node} at site {site}"),
            (Some(site), None) => format!("site {site}"),
            (None, Some(node)) => node.clone(),
            (None, None) => "?".to_owned(),
        };
        println!(
            "event     attempt {} {} from {from}",
            event.attempt, event.state
        );
    }
    match (&task.output_text, &task.output_base64) {
        (Some(text), _) => println!("output\n{text}"),
        (None, Some(encoded)) => println!("output (base64) {encoded}"),
        (None, None) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_well_formed() {
        // clap checks names, groups and defaults only when a subcommand is
        // built; this builds them all.
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
