//! Fleets of thousands (issue 19), with virtual devices over real MQTT
//! (`starling-agent swarm`, each device a whole agent: its own session,
//! credentials, journal and signed reports):
//!
//! - **ingest**: one coordinator (its own Mosquitto, SQLite) holding N
//!   enrolled devices at 1 Hz telemetry: its CPU and memory, the broker's
//!   and the swarm's, the messages it handled against those offered, and
//!   its backlog (`starling_ingest_backlog`);
//! - **throughput**: 1,000 devices and 1, 2 or 3 coordinator replicas on one
//!   PostgreSQL, 32 submitters posting batches of 50 to the replicas in
//!   turn; submit → placed → succeeded for every task, checked exactly once;
//! - **failover**: two replicas, `kill -9` of the leader, the time until the
//!   survivor leads and until it has placed a task submitted after the kill
//!   (median of 5).
//!
//! `cargo bench --profile dev -p starling-tests --bench fleet -- [--write]
//! [--only ingest|throughput|failover] [--devices 1000,5000,10000]
//! [--tasks 10000] [--trials 5] [--replicas 1,2,3]`: for throughput, the
//! first of `--devices` (1,000 unless given). With `--write` the table goes into
//! BENCHMARKS.md §13.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use starling_tests::{
    modules, wasm_file, write_bench_table, Coordinator, Mosquitto, PostgresDb, Store, Swarm,
};

/// The CPU time (user + system) a process has used so far.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name, which ends with the last ')'.
    let rest = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
    let fields: Vec<u64> = rest
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    // utime and stime are fields 14 and 15 of the whole line (11 and 12 here).
    let ticks = fields.get(11).copied().unwrap_or(0) + fields.get(12).copied().unwrap_or(0);
    Duration::from_secs_f64(ticks as f64 / clock_ticks() as f64)
}

fn clock_ticks() -> u64 {
    let out = Command::new("getconf").arg("CLK_TCK").output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(100)
}

/// Resident memory in MB (10⁶ bytes).
fn rss_mb(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|kb| kb.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb * 1024.0 / 1e6)
}

/// The coordinator's Mosquitto child.
fn broker_pid(coordinator: &Coordinator) -> Option<u32> {
    let out = Command::new("pgrep")
        .args([
            "-P",
            &coordinator.process.pid().to_string(),
            "-x",
            "mosquitto",
        ])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()?
        .trim()
        .parse()
        .ok()
}

/// One value of the coordinator's `/metrics` (the sum over its labels).
fn metric(coordinator: &Coordinator, name: &str) -> f64 {
    let (_, text) = coordinator.http("GET", "/metrics", None);
    text.lines()
        .filter(|line| {
            line.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
        })
        .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

fn health(coordinator: &Coordinator) -> Option<serde_json::Value> {
    let (status, text) = coordinator.http("GET", "/api/v1/health", None);
    (status == 200)
        .then(|| serde_json::from_str(&text).ok())
        .flatten()
}

fn wait(timeout: Duration, what: &str, mut done: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < timeout, "{what}: not within {timeout:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    start.elapsed()
}

/// Most devices one swarm process runs here: each holds about four file
/// descriptors (its socket and its journal's database, WAL and index), and
/// this machine allows a process 20,000.
const DEVICES_PER_SWARM: usize = 2_500;

/// Starts `count` modelled devices enrolled at `coordinator` (in as many
/// swarm processes as [`DEVICES_PER_SWARM`] needs), connecting over `ramp`,
/// and waits until `replicas` all count them online.
fn swarm(
    coordinator: &Coordinator,
    broker: &str,
    count: usize,
    prefix: &str,
    ramp: Duration,
    replicas: &[&Coordinator],
) -> Vec<Swarm> {
    let processes = count.div_ceil(DEVICES_PER_SWARM);
    let swarms: Vec<Swarm> = (0..processes)
        .map(|i| {
            let share = DEVICES_PER_SWARM.min(count - i * DEVICES_PER_SWARM);
            let ramp = ramp / processes as u32;
            one_swarm(coordinator, broker, share, &format!("{prefix}{i}"), ramp)
        })
        .collect();
    for replica in replicas {
        wait(Duration::from_secs(300), "every device online", || {
            health(replica).is_some_and(|h| h["nodes_online"].as_u64() == Some(count as u64))
        });
    }
    swarms
}

/// One swarm process of `count` devices, waited for until it is ready.
fn one_swarm(
    coordinator: &Coordinator,
    broker: &str,
    count: usize,
    prefix: &str,
    ramp: Duration,
) -> Swarm {
    let token = Swarm::join_token(coordinator, count);
    let args: Vec<std::ffi::OsString> = [
        "--broker".to_string(),
        broker.to_string(),
        "--coordinator-url".into(),
        coordinator.rest.clone(),
        "--join-token".into(),
        token,
        "--coordinator-key".into(),
        coordinator.coordinator_key(),
        "--ramp".into(),
        format!("{}ms", ramp.as_millis()),
        "--execute".into(),
        "modelled".into(),
        "--modelled-work".into(),
        "10ms".into(),
    ]
    .into_iter()
    .map(Into::into)
    .collect();
    let mut swarm = Swarm::start_args(count, prefix, args);
    swarm.wait_ready(Duration::from_secs(120) + ramp + Duration::from_millis(count as u64 * 40));
    swarm
}

struct IngestRow {
    devices: usize,
    coordinator_cpu: f64,
    coordinator_rss: f64,
    broker_cpu: f64,
    swarm_cpu: f64,
    swarm_rss: f64,
    handled_per_s: f64,
    backlog_mean: f64,
    backlog_max: f64,
}

fn ingest(devices: usize) -> IngestRow {
    let coordinator = Coordinator::start(None, Store::Sqlite, &[]);
    let ramp = Duration::from_millis(devices as u64 * 5);
    let swarms = swarm(
        &coordinator,
        &coordinator.mqtt,
        devices,
        "ing",
        ramp,
        &[&coordinator],
    );
    // Settle: the last devices' first reports, the coordinator's first
    // telemetry round for each.
    std::thread::sleep(Duration::from_secs(10));
    let swarm_pids: Vec<u32> = swarms.iter().map(|s| s.process.pid()).collect();
    let pids = [
        coordinator.process.pid(),
        broker_pid(&coordinator).unwrap_or(0),
    ];
    let before: Vec<Duration> = pids.iter().map(|pid| cpu_time(*pid)).collect();
    let swarm_before: Duration = swarm_pids.iter().map(|pid| cpu_time(*pid)).sum();
    let handled_before = metric(&coordinator, "starling_mqtt_messages_handled_total");
    let started = Instant::now();
    let mut backlog = Vec::new();
    while started.elapsed() < Duration::from_secs(30) {
        backlog.push(metric(&coordinator, "starling_ingest_backlog"));
        std::thread::sleep(Duration::from_secs(1));
    }
    let window = started.elapsed().as_secs_f64();
    let handled = metric(&coordinator, "starling_mqtt_messages_handled_total") - handled_before;
    let cpu: Vec<f64> = pids
        .iter()
        .zip(&before)
        .map(|(pid, before)| (cpu_time(*pid) - *before).as_secs_f64() / window * 100.0)
        .collect();
    let swarm_cpu = (swarm_pids
        .iter()
        .map(|pid| cpu_time(*pid))
        .sum::<Duration>()
        - swarm_before)
        .as_secs_f64()
        / window
        * 100.0;
    let row = IngestRow {
        devices,
        coordinator_cpu: cpu[0],
        coordinator_rss: rss_mb(pids[0]),
        broker_cpu: cpu[1],
        swarm_cpu,
        swarm_rss: swarm_pids.iter().map(|pid| rss_mb(*pid)).sum(),
        handled_per_s: handled / window,
        backlog_mean: backlog.iter().sum::<f64>() / backlog.len().max(1) as f64,
        backlog_max: backlog.iter().copied().fold(0.0, f64::max),
    };
    drop(swarms);
    drop(coordinator);
    row
}

/// CPU time of every running process named `name`, by pid.
fn cpu_by_pid(name: &str) -> std::collections::HashMap<u32, Duration> {
    let mut times = std::collections::HashMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim() == name {
            times.insert(pid, cpu_time(pid));
        }
    }
    times
}

/// CPU time used by processes named `name` since `before` was read
/// (processes started since count whole).
fn cpu_since(name: &str, before: &std::collections::HashMap<u32, Duration>) -> Duration {
    cpu_by_pid(name)
        .into_iter()
        .map(|(pid, now)| now.saturating_sub(before.get(&pid).copied().unwrap_or_default()))
        .sum()
}

/// CPU milliseconds per task of each part of a throughput run.
#[derive(Default)]
struct CpuPerTask {
    coordinators: f64,
    postgres: f64,
    broker: f64,
    swarm: f64,
}

struct ThroughputRow {
    replicas: usize,
    /// CPU cost per task.
    cpu: CpuPerTask,
    tasks: usize,
    submit_s: f64,
    placed_s: f64,
    done_s: f64,
    /// Tasks that did not succeed (out of attempts).
    failed: usize,
    /// Attempts the coordinator gave up on and placed again.
    rerun: usize,
}

/// `count` coordinator replicas on one database and one development broker.
fn replicas_on(db: &PostgresDb, broker: &Mosquitto, count: usize) -> Vec<Coordinator> {
    (0..count)
        .map(|_| {
            Coordinator::start(
                Some(&broker.url),
                Store::Postgres(db.url.clone()),
                &["--mqtt-allow-anonymous"],
            )
        })
        .collect()
}

fn throughput(replicas: usize, devices: usize, tasks: usize) -> ThroughputRow {
    let db = PostgresDb::create();
    // The coordinators' session queue the operations guide asks of a broker.
    let broker = Mosquitto::start_with_config("allow_anonymous true\nmax_queued_messages 10000");
    let coordinators = replicas_on(&db, &broker, replicas);
    let all: Vec<&Coordinator> = coordinators.iter().collect();
    let swarm = swarm(
        &coordinators[0],
        &broker.url,
        devices,
        "tp",
        Duration::from_millis(devices as u64 * 5),
        &all,
    );
    let dir = tempfile::tempdir().unwrap();
    let module = wasm_file(dir.path(), "spin", &modules::spin(10));
    let out = coordinators[0].cli(&["publish", module.to_str().unwrap()], None);
    assert!(out.status.success());
    let digest = String::from_utf8_lossy(&out.stdout).trim().to_string();

    const SUBMITTERS: usize = 32;
    const BATCH: usize = 50;
    let batches = tasks.div_ceil(BATCH);
    let next = Arc::new(AtomicUsize::new(0));
    let pids: Vec<u32> = coordinators.iter().map(|c| c.process.pid()).collect();
    let cpu_of = |pids: &[u32]| pids.iter().map(|pid| cpu_time(*pid)).sum::<Duration>();
    let coordinators_before = cpu_of(&pids);
    let broker_before = cpu_time(broker.pid());
    let swarm_pids: Vec<u32> = swarm.iter().map(|s| s.process.pid()).collect();
    let swarm_before = cpu_of(&swarm_pids);
    let postgres_before = cpu_by_pid("postgres");
    // The fleet's cost at rest (1 Hz telemetry from every device), taken
    // out of the per-task figures below.
    let idle = Duration::from_secs(5);
    std::thread::sleep(idle);
    let idle_s = idle.as_secs_f64();
    let idle_rate = [
        (cpu_of(&pids).saturating_sub(coordinators_before)).as_secs_f64() / idle_s,
        cpu_since("postgres", &postgres_before).as_secs_f64() / idle_s,
        (cpu_time(broker.pid()).saturating_sub(broker_before)).as_secs_f64() / idle_s,
        (cpu_of(&swarm_pids).saturating_sub(swarm_before)).as_secs_f64() / idle_s,
    ];
    let coordinators_before = cpu_of(&pids);
    let broker_before = cpu_time(broker.pid());
    let swarm_before = cpu_of(&swarm_pids);
    let postgres_before = cpu_by_pid("postgres");
    let started = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..SUBMITTERS {
            let next = Arc::clone(&next);
            let coordinators = &coordinators;
            let digest = &digest;
            scope.spawn(move || loop {
                let batch = next.fetch_add(1, Ordering::Relaxed);
                if batch >= batches {
                    return;
                }
                let items: Vec<serde_json::Value> = (0..BATCH)
                    .map(|_| serde_json::json!({ "artifact": digest }))
                    .collect();
                let body = serde_json::to_vec(&serde_json::json!({ "tasks": items })).unwrap();
                let (status, text) = coordinators[batch % coordinators.len()].http(
                    "POST",
                    "/api/v1/tasks:batch",
                    Some(("application/json", body)),
                );
                assert_eq!(status, 201, "{text}");
            });
        }
    });
    let submit_s = started.elapsed().as_secs_f64();
    let total = batches * BATCH;
    let count = |sql: &str| db.query(sql).parse::<usize>().unwrap_or(0);
    let mut placed_s = None;
    wait(Duration::from_secs(1800), "every task ended", || {
        if placed_s.is_none() && count("SELECT count(*) FROM tasks WHERE state = 'pending'") == 0 {
            placed_s = Some(started.elapsed().as_secs_f64());
        }
        std::thread::sleep(Duration::from_millis(200));
        count("SELECT count(*) FROM tasks WHERE state IN ('succeeded', 'failed', 'cancelled')")
            == total
    });
    let done_s = started.elapsed().as_secs_f64();
    // Above the fleet's cost at rest over the same time.
    let per_task = |spent: Duration, at_rest: f64| {
        (spent.as_secs_f64() - at_rest * done_s).max(0.0) * 1e3 / (batches * BATCH) as f64
    };
    let cpu = CpuPerTask {
        coordinators: per_task(
            cpu_of(&pids).saturating_sub(coordinators_before),
            idle_rate[0],
        ),
        postgres: per_task(cpu_since("postgres", &postgres_before), idle_rate[1]),
        broker: per_task(
            cpu_time(broker.pid()).saturating_sub(broker_before),
            idle_rate[2],
        ),
        swarm: per_task(
            cpu_of(&swarm_pids).saturating_sub(swarm_before),
            idle_rate[3],
        ),
    };
    eprintln!(
        "fleet: at rest, CPU of coordinators {:.0}%, PostgreSQL {:.0}%, Mosquitto {:.0}%, swarm {:.0}%",
        idle_rate[0] * 100.0,
        idle_rate[1] * 100.0,
        idle_rate[2] * 100.0,
        idle_rate[3] * 100.0
    );
    let failed = count("SELECT count(*) FROM tasks WHERE state <> 'succeeded'");
    let rerun = count("SELECT count(*) FROM attempts WHERE state = 'lost'");
    for name in [
        "starling_nodes_suspected_total",
        "starling_attempts_ended_total",
        "starling_task_events_duplicate_total",
        "starling_task_event_batches_total",
        "starling_mqtt_messages_handled_total",
        "starling_assignments_resent_total",
    ] {
        let total: f64 = coordinators.iter().map(|c| metric(c, name)).sum();
        eprintln!("fleet: {name} {total}");
    }
    eprintln!(
        "fleet: assignments refused, by reason: {}",
        db.query(
            "SELECT coalesce(string_agg(why || ' ' || n, ', '), 'none') FROM (SELECT \
             regexp_replace(coalesce(message, reason, '?'), '[0-9]+', 'N', 'g') why, count(*) n \
             FROM events WHERE state = 'rejected' GROUP BY 1) x"
        )
    );
    // What the coordinator had heard of the attempts it gave up on.
    eprintln!(
        "fleet: attempts given up, by the events heard of them: {}",
        db.query(
            "SELECT coalesce(string_agg(heard || ' ' || n, ', '), 'none') FROM (SELECT heard, count(*) n FROM \
             (SELECT coalesce((SELECT string_agg(e.state, '+' ORDER BY e.state) FROM events e WHERE e.task_id = a.task_id \
             AND e.attempt = a.attempt AND e.state <> 'lost'), 'nothing') heard FROM attempts a WHERE a.state = 'lost') x \
             GROUP BY heard) y"
        )
    );
    assert_eq!(
        db.query(
            "SELECT count(*) FROM tasks t WHERE t.state = 'succeeded' AND (SELECT count(*) \
             FROM events e WHERE e.task_id = t.id AND e.attempt = t.attempt AND e.state = 'succeeded') <> 1"
        ),
        "0",
        "every succeeded task recorded its result once"
    );
    drop(swarm);
    drop(coordinators);
    ThroughputRow {
        replicas,
        cpu,
        tasks: total,
        submit_s,
        placed_s: placed_s.unwrap_or(done_s),
        done_s,
        failed,
        rerun,
    }
}

/// One failover: returns (kill → survivor leads, kill → a task submitted
/// after the kill is placed).
fn failover() -> (Duration, Duration) {
    let db = PostgresDb::create();
    let broker = Mosquitto::start();
    let mut replicas = replicas_on(&db, &broker, 2);
    let all: Vec<&Coordinator> = replicas.iter().collect();
    let swarm = swarm(
        &replicas[0],
        &broker.url,
        20,
        "fo",
        Duration::from_secs(1),
        &all,
    );
    let dir = tempfile::tempdir().unwrap();
    let digest = replicas[0].publish_spin(dir.path(), 10);
    wait(Duration::from_secs(10), "a leader", || {
        replicas
            .iter()
            .any(|r| health(r).is_some_and(|h| h["leader"] == true))
    });
    let leader = usize::from(health(&replicas[0]).is_none_or(|h| h["leader"] != true));
    let survivor = 1 - leader;
    replicas[leader].process.kill();
    let killed = Instant::now();
    let leads = wait(Duration::from_secs(30), "the survivor leads", || {
        health(&replicas[survivor]).is_some_and(|h| h["leader"] == true)
    });
    // Submitted right after the kill, through the survivor: placed once it leads.
    let id = replicas[survivor]
        .submit(&digest, "after the kill")
        .unwrap();
    let placed = wait(Duration::from_secs(30), "placed", || {
        let state = replicas[survivor].task(&id)["state"].clone();
        state != "pending"
    });
    let _ = placed;
    let placed = killed.elapsed();
    drop(swarm);
    (leads, placed)
}

fn median(values: &mut [Duration]) -> Duration {
    values.sort();
    values[values.len() / 2]
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn main() {
    // Info, not the tests' debug lines: a line per message is load of its own.
    if std::env::var_os("STARLING_TEST_LOG").is_none() {
        std::env::set_var("STARLING_TEST_LOG", "info");
    }
    let args: Vec<String> = std::env::args().collect();
    // `cargo bench` passes --bench; anything else is ours.
    let only = arg(&args, "--only");
    let run = |part: &str| only.as_deref().is_none_or(|o| o == part);
    let devices: Vec<usize> = arg(&args, "--devices")
        .unwrap_or_else(|| "1000,5000,10000".into())
        .split(',')
        .map(|d| d.parse().unwrap())
        .collect();
    let tasks: usize = arg(&args, "--tasks").map_or(10_000, |t| t.parse().unwrap());
    let trials: usize = arg(&args, "--trials").map_or(5, |t| t.parse().unwrap());
    let mut parts: Vec<(&str, String)> = Vec::new();

    if run("ingest") {
        let mut table = String::new();
        table.push_str(
            "**Ingest.** One coordinator with its own Mosquitto and SQLite; N enrolled devices, \
             each reporting signed telemetry once a second (N messages/s offered), run by one \
             swarm process per 2,500 devices; measured over 30 s after every device is online \
             and 10 s more. CPU is % of one core (this VM has two).\n\n\
             | devices | coordinator CPU | coordinator RSS | Mosquitto CPU | handled/s (offered) | \
             backlog mean / max | swarm CPU | swarm RSS |\n\
             | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
        );
        for n in &devices {
            eprintln!("fleet: ingest at {n} devices");
            let row = ingest(*n);
            let line = format!(
                "| {} | {:.1}% | {:.0} MB | {:.1}% | {:.0} ({}) | {:.1} / {:.0} | {:.1}% | {:.0} MB |\n",
                row.devices,
                row.coordinator_cpu,
                row.coordinator_rss,
                row.broker_cpu,
                row.handled_per_s,
                row.devices,
                row.backlog_mean,
                row.backlog_max,
                row.swarm_cpu,
                row.swarm_rss,
            );
            eprint!("{line}");
            table.push_str(&line);
        }
        parts.push(("ingest", table));
    }
    if run("throughput") {
        let replica_counts: Vec<usize> = arg(&args, "--replicas").map_or(vec![1, 2, 3], |r| {
            r.split(',').map(|n| n.parse().unwrap()).collect()
        });
        let fleet = devices.first().copied().unwrap_or(1_000);
        let mut table = String::new();
        table.push_str(&format!(
            "**Throughput.** {fleet} enrolled devices (modelled tasks of 10 ms reference work), \
             one PostgreSQL, one Mosquitto, 32 submitters posting `POST /api/v1/tasks:batch` of \
             50 tasks to the replicas in turn; {tasks} tasks; every task checked to have \
             succeeded exactly once. The ratios are against 135 tasks/s (the single-submit \
             SQLite figure this issue started from) and Nomad C1M's ≈3,750 placements/s.\n\n\
             CPU per task is each part's CPU time over the run, less its rate at rest (the \
             fleet's telemetry, measured for 5 s before) over the same time, divided by the tasks; \
             a coordinator core's share is 1,000 ms over the coordinators' CPU per task.\n\n\
             | replicas | submitted in | all placed at | all ended at | tasks/s end to end | \
             vs 135/s | vs Nomad C1M | attempts given up and placed again | tasks failed | \
             CPU per task: coordinators | PostgreSQL | Mosquitto | swarm | tasks/s a coordinator core carries |\n\
             | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n"
        ));
        for replicas in replica_counts {
            eprintln!("fleet: throughput with {replicas} replicas, {fleet} devices");
            let row = throughput(replicas, fleet, tasks);
            let rate = row.tasks as f64 / row.done_s;
            let line = format!(
                "| {} | {:.1} s | {:.1} s | {:.1} s | {:.0} | {:.2}× | {:.3}× | {} | {} | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms | {:.0} |\n",
                row.replicas,
                row.submit_s,
                row.placed_s,
                row.done_s,
                rate,
                rate / 135.0,
                rate / 3_750.0,
                row.rerun,
                row.failed,
                row.cpu.coordinators,
                row.cpu.postgres,
                row.cpu.broker,
                row.cpu.swarm,
                1_000.0 / row.cpu.coordinators.max(f64::EPSILON),
            );
            eprint!("{line}");
            table.push_str(&line);
        }
        parts.push(("throughput", table));
    }
    if run("failover") {
        let mut leads = Vec::new();
        let mut placed = Vec::new();
        for trial in 0..trials {
            eprintln!("fleet: failover trial {}", trial + 1);
            let (l, p) = failover();
            leads.push(l);
            placed.push(p);
        }
        let max = |values: &[Duration]| values.iter().max().copied().unwrap_or_default();
        let (lead_max, placed_max) = (max(&leads), max(&placed));
        let table = format!(
            "**Leader failover.** Two replicas on one PostgreSQL, 20 devices, `--leader-lease` \
             1.5 s (the default); `kill -9` of the leader, {trials} trials.\n\n\
             | from the kill to | median | max | goal |\n| --- | ---: | ---: | ---: |\n\
             | the survivor leads | {:.2} s | {:.2} s | |\n\
             | a task submitted after the kill is placed | {:.2} s | {:.2} s | 2 s |\n",
            median(&mut leads).as_secs_f64(),
            lead_max.as_secs_f64(),
            median(&mut placed).as_secs_f64(),
            placed_max.as_secs_f64(),
        );
        parts.push(("failover", table));
    }
    for (part, table) in &parts {
        println!("{table}");
        if args.iter().any(|a| a == "--write") {
            write_bench_table(&format!("fleet-{part}"), table.trim_end());
        }
    }
}
