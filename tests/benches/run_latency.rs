//! Time from submitting a trivial task to having its result, over the whole
//! real path (REST → store → placement → MQTT → agent → wasmtime → event →
//! store → client), beside the floor: instantiating and running the same
//! module in-process with the agent's own executor. Measured four ways in one
//! run: the result pushed on the live event stream, the same task polled the
//! way `starling run --wait` did before the stream existed, `starling run
//! --wait` as a user runs it (a CLI process, which now long-polls), and the
//! pushed result again while a client that stopped reading holds a stream
//! open. Also where the time goes, from the arrival of each state on the
//! stream.
//!
//! `cargo bench -p starling-tests --bench run_latency` (release build), or with
//! `-- --runs N`; `-- --write` also rewrites the table in BENCHMARKS.md.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::io::Write as _;
use std::time::{Duration, Instant};

use starling_agent::wasm::WasmExecutor;
use starling_api::client::{Client, EventFilter, EventStream, StreamMessage};
use starling_api::{EventKind, LiveEvent, SubmitTask, TaskStatus};
use starling_proto::ExecLimits;
use starling_tests::{bench_progress, modules, wasm_file, Agent, Coordinator, Store};

/// Tasks that flood the stalled client's buffers before it is measured
/// beside: four events each, some 5 MB in all (on loopback the kernel lets
/// a socket's send buffer grow to 4 MB).
const FLOOD: usize = 4000;

fn quantile(samples: &mut [Duration], q: f64) -> Duration {
    samples.sort();
    samples[((samples.len() as f64 - 1.0) * q).round() as usize]
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

/// Each state's arrival on the stream after the submit was sent.
#[derive(Default, Clone, Copy)]
struct Timeline {
    pending: Duration,
    assigned: Duration,
    running: Duration,
    succeeded: Duration,
}

async fn submit_and_watch(
    client: &Client,
    stream: &mut EventStream,
    task: &SubmitTask,
) -> Timeline {
    let start = Instant::now();
    let id = client.submit(task).await.unwrap().id;
    let mut timeline = Timeline::default();
    loop {
        let message = tokio::time::timeout(Duration::from_secs(30), stream.next())
            .await
            .expect("the result within 30 s")
            .expect("the stream is open")
            .unwrap();
        let StreamMessage::Event {
            event: LiveEvent::Task(change),
            ..
        } = message
        else {
            panic!("unexpected {message:?}");
        };
        if change.task_id != id {
            continue;
        }
        let at = start.elapsed();
        match change.status {
            TaskStatus::Pending => timeline.pending = at,
            TaskStatus::Assigned => timeline.assigned = at,
            TaskStatus::Running => timeline.running = at,
            TaskStatus::Succeeded => {
                timeline.succeeded = at;
                return timeline;
            }
            other => panic!("task {id} {other}"),
        }
    }
}

/// Submits and polls with the schedule `starling run --wait` used before the
/// stream: after 5 ms, doubling up to 200 ms.
async fn submit_and_poll(client: &Client, task: &SubmitTask) -> Duration {
    let start = Instant::now();
    let id = client.submit(task).await.unwrap().id;
    let mut interval = Duration::from_millis(5);
    loop {
        if client.task(&id).await.unwrap().state.is_terminal() {
            return start.elapsed();
        }
        tokio::time::sleep(interval).await;
        interval = (interval * 2).min(Duration::from_millis(200));
    }
}

fn main() {
    let mut runs = 100usize;
    let mut write = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--runs" => runs = args.next().and_then(|n| n.parse().ok()).unwrap_or(runs),
            "--write" => write = true,
            _ => {}
        }
    }
    let input = b"ping";
    let module_bytes = wat::parse_str(modules::ECHO).unwrap();

    // The floor: the agent's executor, module compiled once, instantiate + run per sample.
    let executor = WasmExecutor::new().unwrap();
    let module = executor.compile(&module_bytes).unwrap();
    let limits = ExecLimits::default();
    let mut floor = Vec::with_capacity(runs);
    let bar = bench_progress(runs, "in-process instantiate");
    for _ in 0..runs {
        let start = Instant::now();
        let outcome = executor.run(&module, input, &[], &limits).unwrap();
        floor.push(start.elapsed());
        assert_eq!(outcome.output, b"echo:ping");
        bar.inc(1);
    }
    bar.finish_and_clear();

    // The whole path: embedded broker, SQLite, one agent.
    let coordinator = Coordinator::start(None, Store::Sqlite, &[]);
    // The flood below leaves thousands of attempts in the agent's journal
    // until their assignments expire; room for them all.
    let _agent = Agent::start_with(
        &coordinator,
        &coordinator.mqtt,
        "bench",
        "",
        None,
        &["--journal-max-attempts", "100000"],
    );
    coordinator.wait_for_nodes(1, Duration::from_secs(30));
    let dir = tempfile::tempdir().unwrap();
    let path = wasm_file(dir.path(), "echo", modules::ECHO);
    let published = coordinator.cli(&["publish", path.to_str().unwrap(), "--json"], None);
    assert!(published.status.success());
    let digest = serde_json::from_slice::<serde_json::Value>(&published.stdout).unwrap()["digest"]
        .as_str()
        .unwrap()
        .to_string();
    let task: SubmitTask =
        serde_json::from_value(serde_json::json!({ "artifact": digest, "input_text": "ping" }))
            .unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = Client::new(&coordinator.rest, Some(coordinator.token.clone()));
    let tasks_only = EventFilter {
        kinds: vec![EventKind::Task],
        ..EventFilter::default()
    };

    // One warm-up run fills the agent's module cache, as in steady state.
    let warm = coordinator.cli(&["run", &digest, "--input", "-", "--wait"], Some(input));
    assert!(
        warm.status.success(),
        "{}",
        String::from_utf8_lossy(&warm.stderr)
    );

    let (mut pushed, mut polled, mut timelines) = (Vec::new(), Vec::new(), Vec::new());
    let bar = bench_progress(runs, "submit → result: pushed, then polled");
    runtime.block_on(async {
        let mut stream = client.events(&tasks_only, None).await.unwrap();
        for _ in 0..runs {
            let timeline = submit_and_watch(&client, &mut stream, &task).await;
            pushed.push(timeline.succeeded);
            timelines.push(timeline);
            polled.push(submit_and_poll(&client, &task).await);
            bar.inc(1);
        }
    });
    bar.finish_and_clear();

    let mut whole = Vec::with_capacity(runs);
    let bar = bench_progress(runs, "starling run --wait");
    for _ in 0..runs {
        let start = Instant::now();
        let out = coordinator.cli(&["run", &digest, "--input", "-", "--wait"], Some(input));
        whole.push(start.elapsed());
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.stdout, b"echo:ping");
        bar.inc(1);
    }
    bar.finish_and_clear();

    // A client that stopped reading: a raw stream with a small window that
    // nothing reads while the pushed results are measured again.
    let addr = coordinator.rest.trim_start_matches("http://").to_owned();
    let mut stalled = runtime.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        socket
            .connect(addr.parse().unwrap())
            .await
            .unwrap()
            .into_std()
            .unwrap()
    });
    stalled.set_nonblocking(false).unwrap();
    write!(
        stalled,
        "GET /api/v1/events?kind=task HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {}\r\n\r\n",
        coordinator.token
    )
    .unwrap();
    let mut beside_stalled = Vec::with_capacity(runs);
    runtime.block_on(async {
        let mut stream = client.events(&tasks_only, None).await.unwrap();
        // First fill the stalled stream's buffers (on loopback the kernel
        // gives its socket megabytes): a flood of tasks, four events each.
        let bar = bench_progress(FLOOD, "flood past the stalled client");
        let mut flood = tokio::task::JoinSet::new();
        for _ in 0..FLOOD {
            let (client, task) = (client.clone(), task.clone());
            flood.spawn(async move { client.submit(&task).await.unwrap() });
            if flood.len() >= 32 {
                flood.join_next().await;
            }
        }
        while flood.join_next().await.is_some() {}
        let mut ended = 0;
        while ended < FLOOD {
            if let Some(Ok(StreamMessage::Event {
                event: LiveEvent::Task(change),
                ..
            })) = stream.next().await
            {
                if change.status.is_terminal() {
                    ended += 1;
                    bar.inc(1);
                }
            }
        }
        bar.finish_and_clear();
        let bar = bench_progress(runs, "pushed, beside a stalled client");
        for _ in 0..runs {
            beside_stalled.push(
                submit_and_watch(&client, &mut stream, &task)
                    .await
                    .succeeded,
            );
            bar.inc(1);
        }
        bar.finish_and_clear();
    });
    // Whether the stalled client really fell behind: it finds a reset once
    // it reads what was queued for it.
    stalled
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let mut queued = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    let mut stalled_reset = false;
    while let Ok(read) = std::io::Read::read(&mut stalled, &mut chunk) {
        if read == 0 {
            break;
        }
        queued.extend_from_slice(&chunk[..read]);
        // The reset ends its stream (the connection itself stays open).
        if String::from_utf8_lossy(&queued[queued.len().saturating_sub(read + 64)..])
            .contains("event: reset")
        {
            stalled_reset = true;
            break;
        }
    }
    drop(stalled);

    let floor_p50 = quantile(&mut floor, 0.5);
    let row = |name: &str, samples: &mut Vec<Duration>| {
        let p50 = quantile(samples, 0.5);
        let p90 = quantile(samples, 0.9);
        format!(
            "| {name} | {:.2} ms | {:.2} ms | {:.0} |",
            ms(p50),
            ms(p90),
            p50.as_secs_f64() / floor_p50.as_secs_f64()
        )
    };
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    let mut table = vec![
        format!("| path ({runs} runs each, {profile} build) | p50 | p90 | p50 / floor |"),
        "| --- | ---: | ---: | ---: |".to_owned(),
        row("in-process instantiate + run (floor)", &mut floor),
        row("REST submit → `succeeded` event on the stream", &mut pushed),
        row(
            "REST submit → result by polling (the old `--wait`: 5 ms, doubling to 200 ms)",
            &mut polled,
        ),
        row(
            "`starling run DIGEST --wait` (CLI process, long poll)",
            &mut whole,
        ),
        row(
            "REST submit → `succeeded` event, beside a stalled stream client",
            &mut beside_stalled,
        ),
    ];
    // Where the pushed path's time goes: the median of each step, from the
    // arrival of one state on the stream to the next.
    let step = |from: fn(&Timeline) -> Duration, to: fn(&Timeline) -> Duration| {
        let mut gaps: Vec<Duration> = timelines
            .iter()
            .map(|t| to(t).saturating_sub(from(t)))
            .collect();
        ms(quantile(&mut gaps, 0.5))
    };
    table.push(String::new());
    table.push("| step of the pushed path (medians) | time |".to_owned());
    table.push("| --- | ---: |".to_owned());
    for (name, value) in [
        (
            "submit sent → `pending` (REST, store insert)",
            step(|_| Duration::ZERO, |t| t.pending),
        ),
        (
            "`pending` → `assigned` (scheduler wake, placement, store)",
            step(|t| t.pending, |t| t.assigned),
        ),
        (
            "`assigned` → `running` (sign, MQTT to the agent, its `running` event back, store)",
            step(|t| t.assigned, |t| t.running),
        ),
        (
            "`running` → `succeeded` (wasmtime run, result event, store)",
            step(|t| t.running, |t| t.succeeded),
        ),
    ] {
        table.push(format!("| {name} | {value:.2} ms |"));
    }
    table.push(String::new());
    table.push(format!(
        "The stalled client had {:.1} MB queued for it, read afterwards; {}.",
        queued.len() as f64 / 1e6,
        if stalled_reset {
            "it ended with a `reset` (`too_slow`): it had fallen behind the ring while the others were measured"
        } else {
            "it held no `reset`: it had not fallen behind the ring"
        }
    ));
    let table = table.join("\n");
    println!("{table}");
    if write {
        starling_tests::write_bench_table("run-latency", &table);
    }
}
