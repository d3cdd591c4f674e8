//! `starling-agent`: the edge agent binary. `run` serves tasks; `probe` prints
//! what this device can do; `swarm` runs many virtual devices in one process.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use starling_agent::caps::{parse_cap_duration, parse_cap_size, CapSettings};
use starling_agent::config::{
    parse_coordinator_key, parse_duration, parse_grants, parse_labels, parse_publisher_keys,
};
use starling_agent::{AgentConfig, ConfigLayer};

const AFTER_HELP: &str = "\
Examples:
  starling-agent probe
      Print this device's capability report as JSON.
  starling-agent run --broker mqtt://10.0.0.2:1883 --labels zone=kitchen,floor=1
      Serve tasks from the broker at 10.0.0.2, with two placement labels.
  STARLING_BROKER=mqtt://broker:1883 starling-agent run --config /etc/starling/agent.toml
      Settings come from flags, then STARLING_* variables, then the file, then defaults.
  starling-agent run --measure-io false --max-tasks 2 --telemetry-interval 500ms
      Skip the data directory's disk probe at start, run two tasks at once, report twice a second.
  starling-agent run --broker mqtts://10.0.0.2:8883 --mqtt-ca-file ca.pem \\
      --coordinator-url http://10.0.0.2:8080 --join-token $(starling token create)
      Enroll once with a join token (credentials are kept in <data-dir>/credentials.json,
      mode 0600; later starts need no token) and connect over TLS.
  starling-agent join --coordinator-url http://10.0.0.2:8080 --join-token TOKEN \\
      --coordinator-key KEY
      On a device with the starling-agent package: write the join file the service waits for.
  starling-agent import-join-file /boot/firmware/starling.toml
      As root (the packaged unit does this before each start): move a flashed card's join
      token into /var/lib/starling/join.toml and off the boot partition.
  starling-agent run --allow-grant clock,random
      Let wasm tasks whose manifest asks for them read the real clock and real random bytes.

Config file (TOML; every key optional):
  broker = \"mqtt://10.0.0.2:1883\"
  node-id = \"pi-kitchen\"
  data-dir = \"/var/lib/starling/agent\"
  telemetry-interval = \"1s\"
  max-tasks = 4
  disk-read-mbps = 90.0
  disk-write-mbps = 40.0
  cpu-speed = 0.35               # declare one core's speed instead of measuring it at start
  opencl = true                  # look for OpenCL devices (through starling-opencl-worker)
  coordinator-url = \"http://10.0.0.2:8080\"   # where to enroll
  mqtt-ca-file = \"/etc/starling/ca.pem\"      # for mqtts:// brokers
  allow-grants = [\"clock\"]                   # what wasm tasks may be granted [default: none]
  [task-caps]                    # the most one task may ask for here [default: half the memory, 1h, 64MiB]
  memory = \"2GiB\"
  wall = \"2h\"
  [labels]
  zone = \"kitchen\"

Logs go to stderr; set RUST_LOG (for example RUST_LOG=debug) for more.";

const SWARM_AFTER_HELP: &str = "\
Examples:
  starling-agent swarm --count 200 --broker mqtt://10.0.0.2:1883 \\
      --coordinator-url http://10.0.0.2:8080 --join-token $(starling token create --uses 200) \\
      --coordinator-key KEY
      Enroll 200 virtual devices (16 at a time) and run them: swarm-00001 … swarm-00200,
      an even mix of pi4, jetson, nuc and gateway, each running its wasm tasks for real.
  starling-agent swarm --count 1000 --execute modelled --profiles pi4=3,jetson,nuc,gateway \\
      --seed 7 --ramp 20s --broker mqtt://127.0.0.1:1883 --allow-unsigned
      1,000 devices against a development broker (coordinator with --mqtt-allow-anonymous),
      three Pi 4s for each other kind, drawn with seed 7, connecting over 20 seconds; tasks
      are not run but take the time the profile's speed gives them.
  starling-agent swarm --count 50 --profiles profiles.toml --node-prefix lab --data-dir /tmp/lab ...
      Devices from a TOML file of [[profile]] tables (name, weight, arch, cores, max_mhz,
      core_speed, memory_mib, io_mbps, bandwidth_mbps, idle_watts, full_watts, level_speeds,
      labels, gpu_gflops, ...), named lab-00001 …, their state under /tmp/lab/lab-00001/ ….

Each device is a whole agent (its own MQTT session, credentials, journal, capability,
telemetry and last will) sharing the process's wasm engine and module cache. A second start
with the same --data-dir and --node-prefix reuses the credentials and needs no join token.
When every device is connected, one JSON line goes to stdout:
  {\"event\":\"ready\",\"count\":200,\"enrolled\":200,\"seconds\":9.4,\"first\":\"swarm-00001\",\"last\":\"swarm-00200\"}
Ctrl-C or SIGTERM stops every device cleanly (offline status, disconnect).

Modelled execution: a task's work is its argument work_ms=N (reference-core milliseconds),
or --modelled-work; it takes work / (profile speed x power level speed) on the device.";

/// Starling's edge agent: reports this device to a coordinator over MQTT and
/// runs the wasm and OpenCL tasks it is assigned, verified by digest and under limits.
#[derive(Debug, Parser)]
#[command(name = "starling-agent", version, after_help = AFTER_HELP)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Connect to the broker and serve tasks until interrupted (Ctrl-C or SIGTERM).
    Run(Settings),
    /// Print this device's capability report (the retained MQTT message) as JSON.
    Probe(Settings),
    /// Run many virtual devices in this process, each a whole agent with its own MQTT
    /// session, credentials, journal, capability and telemetry (tests, benchmarks, demos).
    #[command(after_help = SWARM_AFTER_HELP)]
    Swarm(SwarmArgs),
    /// Write a join file that the packaged agent picks up and enrolls with (run as root
    /// after installing the package; the file goes to the agent's user, mode 0600).
    Join(JoinCommand),
    /// Move the join token of the first join file found into the agent's state (run as root;
    /// the packaged unit does it before each start), so the agent never writes the boot
    /// partition. Exits 0 when there is nothing to move, 1 when the file is bad or unwritable.
    ImportJoinFile(ImportArgs),
}

/// `starling-agent swarm`'s own flags; the agent's settings follow them.
#[derive(Debug, Args)]
struct SwarmArgs {
    /// How many virtual devices.
    #[arg(long, value_name = "N")]
    count: usize,
    /// Devices are named PREFIX-00001, PREFIX-00002, ….
    #[arg(long, value_name = "PREFIX", default_value = "swarm")]
    node_prefix: String,
    /// Device profiles: built-in names with optional weights (pi4, jetson, nuc, gateway;
    /// e.g. pi4=3,nuc), or a TOML file of [[profile]] tables.
    #[arg(
        long,
        value_name = "FILE|NAMES",
        default_value = "pi4,jetson,nuc,gateway"
    )]
    profiles: String,
    /// Draw each device's profile at random with this seed [default: weighted round-robin].
    #[arg(long, value_name = "S")]
    seed: Option<u64>,
    /// How tasks run: real (the shared wasm engine) or modelled (waited for, as long as the
    /// profile's speed makes them take).
    #[arg(long, value_enum, value_name = "MODE", default_value = "real")]
    execute: ExecuteMode,
    /// Reference-core work of a modelled task without a work_ms=N argument, like 100ms.
    #[arg(long, value_name = "DURATION", default_value = "100ms")]
    modelled_work: String,
    /// Spread the devices' connections over this long, like 10s [default: 10ms per device].
    #[arg(long, value_name = "DURATION")]
    ramp: Option<String>,
    /// Most enrollments in flight at once.
    #[arg(long, value_name = "N", default_value_t = 16)]
    enroll_concurrency: usize,
    /// Threads of the async runtime all devices share [default: the number of CPU cores, at most 4].
    #[arg(long, value_name = "N")]
    worker_threads: Option<usize>,
    /// The agent's settings, applied to every device (--data-dir is the swarm's root,
    /// default ./.starling/swarm; --node-id is refused).
    #[command(flatten)]
    settings: Settings,
}

/// `--execute`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum ExecuteMode {
    /// Through the shared wasm engine, as `run` does.
    Real,
    /// Waited for, as long as the profile's speed makes the task take.
    Modelled,
}

/// The join file in the agent's state, where the packaged unit looks first.
const STATE_JOIN_FILE: &str = "/var/lib/starling/join.toml";

#[derive(Debug, Args)]
struct ImportArgs {
    /// The join files to look for, first found wins (the boot partition's starling.toml).
    #[arg(required = true, value_name = "FILE")]
    from: Vec<PathBuf>,
    /// Where the file goes; it takes the owner of the directory it is in, mode 0600.
    #[arg(long, value_name = "FILE", default_value = STATE_JOIN_FILE)]
    into: PathBuf,
}

#[derive(Debug, Args)]
struct JoinCommand {
    #[command(flatten)]
    join: starling_net::JoinArgs,
    /// Where to write it; it takes the owner of the directory it is in.
    #[arg(long, value_name = "FILE", default_value = STATE_JOIN_FILE)]
    file: PathBuf,
}

#[derive(Debug, Args)]
struct Settings {
    /// TOML config file; flags and STARLING_* variables override it.
    #[arg(long, env = "STARLING_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
    /// MQTT broker URL [default: mqtt://127.0.0.1:1883].
    #[arg(long, env = "STARLING_BROKER", value_name = "URL")]
    broker: Option<String>,
    /// Node id [default: the host name and /etc/machine-id, sanitized].
    #[arg(long, env = "STARLING_NODE_ID", value_name = "ID")]
    node_id: Option<String>,
    /// Directory for the module cache [default: ./.starling/agent].
    #[arg(long, env = "STARLING_DATA_DIR", value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Placement labels, key=value pairs separated by commas.
    #[arg(long, env = "STARLING_LABELS", value_name = "K=V,...")]
    labels: Option<String>,
    /// How often to publish telemetry, like 500ms or 2s [default: 1s].
    #[arg(long, env = "STARLING_TELEMETRY_INTERVAL", value_name = "DURATION")]
    telemetry_interval: Option<String>,
    /// MQTT topic prefix [default: starling/v1].
    #[arg(long, env = "STARLING_TOPIC_PREFIX", value_name = "PREFIX")]
    topic_prefix: Option<String>,
    /// Most tasks run at once; more wait in a queue [default: the number of CPU cores].
    #[arg(long, env = "STARLING_MAX_TASKS", value_name = "N")]
    max_tasks: Option<usize>,
    /// Where sysfs is, for cpufreq (tests give a directory shaped like /sys).
    #[arg(long, hide = true, value_name = "DIR")]
    sysfs_root: Option<PathBuf>,
    /// Measure the data directory's disk with a short write, fsync and read at start
    /// (on by default; `--measure-io false` leaves its rates unknown).
    #[arg(long, env = "STARLING_MEASURE_IO", num_args = 0..=1, default_missing_value = "true",
          value_name = "BOOL")]
    measure_io: Option<bool>,
    /// Declared sequential read rate of the data directory's disk, in MB/s.
    #[arg(long, env = "STARLING_DISK_READ_MBPS", value_name = "MB/S")]
    disk_read_mbps: Option<f32>,
    /// Declared sequential write rate of the data directory's disk, in MB/s.
    #[arg(long, env = "STARLING_DISK_WRITE_MBPS", value_name = "MB/S")]
    disk_write_mbps: Option<f32>,
    /// Declared speed of one core relative to the reference core (1.0: a 3 GHz x86
    /// core); skips the calibration at start [default: measured at start].
    #[arg(long, env = "STARLING_CPU_SPEED", value_name = "SPEED")]
    cpu_speed: Option<f32>,
    /// Look for OpenCL devices and run OpenCL tasks [default: true].
    #[arg(long, env = "STARLING_OPENCL", value_name = "BOOL")]
    opencl: Option<bool>,
    /// The starling-opencl-worker binary [default: the one beside starling-agent].
    #[arg(long, env = "STARLING_OPENCL_WORKER", value_name = "FILE")]
    opencl_worker: Option<PathBuf>,
    /// The coordinator's REST URL, to enroll with a join token.
    #[arg(long, env = "STARLING_COORDINATOR_URL", value_name = "URL")]
    coordinator_url: Option<String>,
    /// PEM CA to trust for an https:// --coordinator-url and its artifact URLs [default: the system roots].
    #[arg(long, env = "STARLING_COORDINATOR_CA_FILE", value_name = "FILE")]
    coordinator_ca_file: Option<PathBuf>,
    /// A join token from `starling token create`; used once, ignored once
    /// <data-dir>/credentials.json exists.
    #[arg(
        long,
        env = "STARLING_JOIN_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    join_token: Option<String>,
    /// A join file (starling.toml: coordinator-url, coordinator-key, join-token) to read at
    /// start; repeat for places to look in order. Until the node is enrolled the agent waits
    /// for one, and removes the token from it after enrolling.
    #[arg(
        long = "join-file",
        env = "STARLING_JOIN_FILES",
        value_name = "FILE",
        value_delimiter = ','
    )]
    join_files: Vec<PathBuf>,
    /// Largest memory limit a task may have on this node, like 2GiB; a task
    /// asking for more is refused and placed elsewhere [default: half the device's memory].
    #[arg(long, env = "STARLING_MAX_TASK_MEMORY", value_name = "SIZE")]
    max_task_memory: Option<String>,
    /// Longest wall-time limit a task may have on this node, like 2h [default: 1h].
    #[arg(long, env = "STARLING_MAX_TASK_WALL", value_name = "DURATION")]
    max_task_wall: Option<String>,
    /// Largest output limit a task may have on this node [default: 64MiB].
    #[arg(long, env = "STARLING_MAX_TASK_OUTPUT", value_name = "SIZE")]
    max_task_output: Option<String>,
    /// MQTT user name [default: the enrolled one; none without enrollment].
    #[arg(long, env = "STARLING_MQTT_USERNAME", value_name = "NAME")]
    mqtt_username: Option<String>,
    /// MQTT password [default: the enrolled one].
    #[arg(
        long,
        env = "STARLING_MQTT_PASSWORD",
        value_name = "PASSWORD",
        hide_env_values = true
    )]
    mqtt_password: Option<String>,
    /// PEM CA certificates to trust for an mqtts:// broker [default: the system roots].
    #[arg(long, env = "STARLING_MQTT_CA_FILE", value_name = "FILE")]
    mqtt_ca_file: Option<PathBuf>,
    /// PEM client certificate chain, for brokers that require one (with --mqtt-client-key).
    #[arg(long, env = "STARLING_MQTT_CLIENT_CERT", value_name = "FILE")]
    mqtt_client_cert: Option<PathBuf>,
    /// PEM private key of the client certificate.
    #[arg(long, env = "STARLING_MQTT_CLIENT_KEY", value_name = "FILE")]
    mqtt_client_key: Option<PathBuf>,
    /// Grants wasm tasks may have on this node: clock, random, all or none [default: none].
    #[arg(
        long = "allow-grant",
        env = "STARLING_ALLOW_GRANTS",
        value_name = "GRANT,..."
    )]
    allow_grants: Option<String>,
    /// Run only artifacts signed by one of these publisher keys (64 hex digits each, from
    /// `starling keygen`) [default: any artifact the coordinator signs for].
    #[arg(
        long = "trusted-publisher",
        env = "STARLING_TRUSTED_PUBLISHERS",
        value_name = "HEX,...",
        value_delimiter = ','
    )]
    trusted_publishers: Vec<String>,
    /// The coordinator's ed25519 public key, 64 hex digits [default: the one pinned at enrollment].
    #[arg(long, env = "STARLING_COORDINATOR_KEY", value_name = "HEX")]
    coordinator_key: Option<String>,
    /// Development only: run assignments without a verifiable signature.
    #[arg(long, env = "STARLING_ALLOW_UNSIGNED", num_args = 0..=1, default_missing_value = "true",
          value_name = "BOOL")]
    allow_unsigned: Option<bool>,
    /// Most task events kept awaiting the coordinator's receipt [default: see the docs].
    #[arg(long, env = "STARLING_JOURNAL_MAX_ENTRIES", value_name = "N")]
    journal_max_entries: Option<usize>,
    /// Most attempts the journal remembers [default: see the docs].
    #[arg(long, env = "STARLING_JOURNAL_MAX_ATTEMPTS", value_name = "N")]
    journal_max_attempts: Option<usize>,
    /// How often unacknowledged task events are sent again [default: 5s].
    #[arg(long, env = "STARLING_EVENT_RESEND_INTERVAL", value_name = "DURATION")]
    event_resend_interval: Option<String>,
}

impl Settings {
    /// Flags and environment (clap has already applied that precedence), then
    /// the join file's layer when there is one, then the file, then the defaults.
    fn resolve(&self, join: Option<ConfigLayer>) -> anyhow::Result<AgentConfig> {
        let labels = self
            .labels
            .as_deref()
            .map(parse_labels)
            .transpose()
            .context("in --labels / STARLING_LABELS")?;
        let telemetry_interval = self
            .telemetry_interval
            .as_deref()
            .map(parse_duration)
            .transpose()
            .context("in --telemetry-interval / STARLING_TELEMETRY_INTERVAL")?;
        let flags = ConfigLayer {
            broker: self.broker.clone(),
            node_id: self.node_id.clone(),
            data_dir: self.data_dir.clone(),
            labels,
            telemetry_interval,
            topic_prefix: self.topic_prefix.clone(),
            max_tasks: self.max_tasks,
            measure_io: self.measure_io,
            declared_io_mbps: match (self.disk_read_mbps, self.disk_write_mbps) {
                (None, None) => None,
                (read, write) => Some((read.unwrap_or(0.0), write.unwrap_or(0.0))),
            },
            declared_cpu_speed: self.cpu_speed,
            opencl: self.opencl,
            opencl_worker: self.opencl_worker.clone(),
            coordinator_url: self.coordinator_url.clone(),
            coordinator_ca_file: self.coordinator_ca_file.clone(),
            join_token: self.join_token.clone(),
            mqtt_username: self.mqtt_username.clone(),
            mqtt_password: self.mqtt_password.clone(),
            mqtt_ca_file: self.mqtt_ca_file.clone(),
            mqtt_client_cert: self.mqtt_client_cert.clone(),
            mqtt_client_key: self.mqtt_client_key.clone(),
            allowed_grants: self
                .allow_grants
                .as_deref()
                .map(parse_grants)
                .transpose()
                .context("in --allow-grant / STARLING_ALLOW_GRANTS")?,
            coordinator_key: self
                .coordinator_key
                .as_deref()
                .map(parse_coordinator_key)
                .transpose()
                .context("in --coordinator-key / STARLING_COORDINATOR_KEY")?,
            allow_unsigned: self.allow_unsigned,
            trusted_publishers: if self.trusted_publishers.is_empty() {
                None
            } else {
                Some(
                    parse_publisher_keys(&self.trusted_publishers.join(","))
                        .context("in --trusted-publisher / STARLING_TRUSTED_PUBLISHERS")?,
                )
            },
            journal_max_entries: self.journal_max_entries,
            journal_max_attempts: self.journal_max_attempts,
            event_resend_interval: self
                .event_resend_interval
                .as_deref()
                .map(parse_duration)
                .transpose()
                .context("in --event-resend-interval / STARLING_EVENT_RESEND_INTERVAL")?,
            task_caps: CapSettings {
                memory_bytes: self
                    .max_task_memory
                    .as_deref()
                    .map(|text| parse_cap_size("--max-task-memory", text))
                    .transpose()?,
                wall: self
                    .max_task_wall
                    .as_deref()
                    .map(|text| parse_cap_duration("--max-task-wall", text))
                    .transpose()?,
                output_bytes: self
                    .max_task_output
                    .as_deref()
                    .map(|text| parse_cap_size("--max-task-output", text))
                    .transpose()?,
            },
            ..ConfigLayer::default()
        };
        let mut layers = vec![flags];
        layers.extend(join);
        if let Some(path) = &self.config {
            layers.push(ConfigLayer::from_file(path)?);
        }
        let mut config = AgentConfig::from_layers(&layers)?;
        if let Some(root) = &self.sysfs_root {
            config.sysfs_root = root.clone();
        }
        Ok(config)
    }
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    match execute(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            // One line an operator can act on, with the causes after colons.
            eprintln!("starling-agent: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn execute(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Probe(settings) => {
            let config = settings.resolve(None)?;
            let mut capability = starling_agent::probe(&config)?;
            let executor = starling_agent::wasm::WasmExecutor::new()?;
            starling_agent::calibrate::measure_cpu(
                &mut capability,
                &executor,
                &config.sysfs_root,
                config.declared_cpu_speed,
            );
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("cannot start the async runtime")?;
            if let Some(opencl) = runtime.block_on(starling_agent::probe::probe_opencl(&config)) {
                starling_agent::probe::add_opencl(&mut capability, &opencl);
            }
            println!("{}", serde_json::to_string_pretty(&capability)?);
            Ok(())
        }
        Command::Run(settings) => {
            // One worker thread, not one per core: the runtime only moves
            // messages (MQTT, HTTP fetches, journal calls that sqlx runs on
            // its own threads), and `block_on` runs the agent's main loop on
            // this thread beside it. Tasks run on threads of their own and
            // compiles on the blocking pool, so neither waits for a worker.
            // Each worker costs a stack and a malloc arena (issue 17,
            // scripts/bench-footprint). The name tells the agent's threads
            // from wasmtime-wasi's runtime's in `top -H`.
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("starling-async")
                .enable_all()
                .build()
                .context("cannot start the async runtime")?;
            runtime.block_on(async {
                let shutdown = shutdown_signal()?;
                tokio::pin!(shutdown);
                // Waiting for a join file must not outlive a stop request.
                let resolved = tokio::select! {
                    resolved = resolve_with_join_file(&settings) => Some(resolved?),
                    () = &mut shutdown => None,
                };
                let Some((mut config, joined_from)) = resolved else {
                    return anyhow::Ok(());
                };
                let used_token = config.join_token.is_some();
                starling_agent::enroll::prepare(&mut config)
                    .await
                    .context("cannot set up this node's credentials")?;
                if let Some(path) = joined_from.filter(|_| used_token) {
                    forget_token(&path);
                }
                starling_agent::run(config, shutdown).await?;
                anyhow::Ok(())
            })?;
            Ok(())
        }
        Command::Swarm(args) => swarm(args),
        Command::Join(args) => write_join_file(&args),
        Command::ImportJoinFile(args) => import_join_file(&args),
    }
}

/// `starling-agent swarm`: the devices' settings from the flags, then the
/// swarm on a runtime of its own until Ctrl-C or SIGTERM.
fn swarm(args: SwarmArgs) -> anyhow::Result<()> {
    use starling_agent::swarm::{self, profiles, ExecutionMode, SwarmConfig};
    if !args.settings.join_files.is_empty() {
        anyhow::bail!("a swarm enrolls with --join-token; drop --join-file");
    }
    let mut base = args.settings.resolve(None)?;
    if args.settings.data_dir.is_none() {
        base.data_dir = swarm::default_data_dir();
    }
    let profiles = profiles::parse(&args.profiles).context("in --profiles")?;
    let ramp = match &args.ramp {
        Some(text) => parse_duration(text).context("in --ramp")?,
        None => std::time::Duration::from_millis(10)
            .saturating_mul(u32::try_from(args.count).unwrap_or(u32::MAX)),
    };
    let config = SwarmConfig {
        base,
        count: args.count,
        node_prefix: args.node_prefix,
        profiles: profiles::ProfileMix::new(profiles, args.seed),
        execution: match args.execute {
            ExecuteMode::Real => ExecutionMode::Real,
            ExecuteMode::Modelled => ExecutionMode::Modelled,
        },
        modelled_work: parse_duration(&args.modelled_work).context("in --modelled-work")?,
        ramp,
        enroll_concurrency: args.enroll_concurrency,
        max_tasks_given: args.settings.max_tasks.is_some(),
        progress: true,
    };
    let threads = args.worker_threads.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(usize::from)
            .unwrap_or(1)
            .min(4)
    });
    // One runtime for every device: it only moves messages, as `run`'s does;
    // tasks run on threads of their own and compiles on the blocking pool.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .thread_name("starling-async")
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        let shutdown = shutdown_signal()?;
        swarm::run_swarm(config, shutdown, |ready| {
            use std::io::Write as _;
            // One line, flushed: tests and benchmarks wait for it.
            let mut stdout = std::io::stdout().lock();
            if let Ok(line) = serde_json::to_string(ready) {
                let _ = writeln!(stdout, "{line}");
                let _ = stdout.flush();
            }
            tracing::info!(
                devices = ready.count,
                seconds = ready.seconds,
                "every device is connected"
            );
        })
        .await?;
        anyhow::Ok(())
    })
}

/// The configuration to run with, and the join file it came from. With
/// `--join-file` paths and no credentials yet, waits for a join file; once
/// enrolled, a join file still gives the broker and coordinator, and a bad one
/// is logged and left out (the credentials are what the node needs).
async fn resolve_with_join_file(
    settings: &Settings,
) -> anyhow::Result<(AgentConfig, Option<PathBuf>)> {
    use starling_agent::join::{self, Lookup};
    let config = settings.resolve(None)?;
    if settings.join_files.is_empty() {
        return Ok((config, None));
    }
    let enrolled = starling_agent::enroll::credentials_path(&config).exists();
    let found = if enrolled || config.join_token.is_some() {
        match join::look(&settings.join_files) {
            Lookup::Found { path, file } => Some((path, file)),
            Lookup::Absent => None,
            Lookup::Bad(error) => {
                tracing::warn!("{error}; starting without it");
                None
            }
        }
    } else {
        Some(join::wait(&settings.join_files, join::POLL_INTERVAL).await)
    };
    let Some((path, file)) = found else {
        return Ok((config, None));
    };
    tracing::info!(path = %path.display(), "using the join file");
    let layer = join::layer(&file).with_context(|| format!("in {}", path.display()))?;
    Ok((settings.resolve(Some(layer))?, Some(path)))
}

/// Removes the join token from the file it came from, now that the node is
/// enrolled (or was already: a token left by a crash is removed too). A
/// failure is logged, not fatal: the token is single-use on the coordinator.
fn forget_token(path: &std::path::Path) {
    match starling_agent::join::remove_token(path) {
        Ok(true) => {
            tracing::info!(path = %path.display(), "enrolled; removed the join token from the join file")
        }
        Ok(false) => {}
        Err(error) => tracing::warn!("{error}; remove the join-token line by hand"),
    }
}

/// `starling-agent join`: checks the settings as the agent will, and writes
/// them where the packaged agent looks, owned like the directory they go in.
fn write_join_file(args: &JoinCommand) -> anyhow::Result<()> {
    let file = args.join.to_join_file();
    let text = file.render()?;
    let owner = owner_of_parent(&args.file)?;
    starling_agent::join::replace(&args.file, &text, Some(owner))?;
    eprintln!(
        "starling-agent: wrote {}; the agent enrolls with it within seconds (journalctl -u starling-agent)",
        args.file.display()
    );
    Ok(())
}

/// `starling-agent import-join-file`: moves a join token off the boot
/// partition into the agent's state, saying what it did.
fn import_join_file(args: &ImportArgs) -> anyhow::Result<()> {
    use starling_agent::join::{self, Imported};
    let owner = owner_of_parent(&args.into)?;
    match join::import(&args.from, &args.into, Some(owner))? {
        Imported::Absent => eprintln!(
            "starling-agent: no join file at {}; nothing to import",
            args.from
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(" or ")
        ),
        Imported::NoToken(path) => eprintln!(
            "starling-agent: {} carries no join token; nothing to import",
            path.display()
        ),
        Imported::Moved { from } => eprintln!(
            "starling-agent: moved the join file {} to {} and removed the token from {}",
            from.display(),
            args.into.display(),
            from.display()
        ),
    }
    Ok(())
}

/// The owner (uid, gid) of the directory `file` goes in, created if missing:
/// a file written by root for the agent goes to the agent's user this way.
fn owner_of_parent(file: &std::path::Path) -> anyhow::Result<(u32, u32)> {
    use std::os::unix::fs::MetadataExt;
    let dir = file
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let meta = std::fs::metadata(dir).with_context(|| format!("cannot read {}", dir.display()))?;
    Ok((meta.uid(), meta.gid()))
}

/// Resolves on Ctrl-C or SIGTERM (systemd's stop).
///
/// OpenCL now runs only in the worker process, but the handler is still
/// installed first thing: PoCL (through LLVM) installs handlers of its own that
/// end the process on SIGTERM, and the agent must stop cleanly whatever a
/// future in-process library does.
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()> + Send> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut terminate =
            signal(SignalKind::terminate()).context("cannot install the SIGTERM handler")?;
        let mut interrupt =
            signal(SignalKind::interrupt()).context("cannot install the SIGINT handler")?;
        Ok(async move {
            tokio::select! {
                _ = interrupt.recv() => {}
                _ = terminate.recv() => {}
            }
        })
    }
    #[cfg(not(unix))]
    {
        Ok(async {
            let _ = tokio::signal::ctrl_c().await;
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_well_formed() {
        // clap checks names, groups and defaults only when a subcommand is
        // built; this builds them all (a clash fails here, not on a device).
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
