//! The live event stream (`GET /api/v1/events`) against a real coordinator
//! and agent: a task's states arrive in order as they happen, nodes and
//! their telemetry show up, a client resumes with `Last-Event-ID` and gets
//! exactly what it missed, an unknown position is reset, and a client that
//! stops reading is reset and cut off while others keep receiving. Plus the
//! long poll behind `starling run --wait` and `starling watch`.

use std::io::{BufRead, BufReader, Read, Write};
use std::time::{Duration, Instant};

use starling_api::client::{Client, EventFilter, EventStream, StreamMessage};
use starling_api::{EventKind, LiveEvent, NodeChangeKind, SubmitTask, TaskStatus};
use starling_tests::{modules, wasm_file, Agent, Coordinator, NetNs, Store};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn client(coordinator: &Coordinator) -> Client {
    Client::new(&coordinator.rest, Some(coordinator.token.clone()))
}

fn publish_echo(coordinator: &Coordinator, dir: &std::path::Path) -> String {
    let echo = wasm_file(dir, "echo", modules::ECHO);
    let out = coordinator.cli(&["publish", echo.to_str().unwrap()], None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn echo_task(digest: &str, input: &str) -> SubmitTask {
    serde_json::from_value(serde_json::json!({ "artifact": digest, "input_text": input })).unwrap()
}

/// The next message within `timeout`.
async fn next(stream: &mut EventStream, timeout: Duration) -> StreamMessage {
    tokio::time::timeout(timeout, stream.next())
        .await
        .expect("an event within the timeout")
        .expect("the stream is open")
        .expect("a well-formed event")
}

/// The next task change of the stream (other kinds skipped).
async fn next_task_change(stream: &mut EventStream) -> (String, starling_api::TaskChange) {
    loop {
        match next(stream, Duration::from_secs(30)).await {
            StreamMessage::Event {
                id,
                event: LiveEvent::Task(change),
            } => return (id, change),
            StreamMessage::Event { .. } => continue,
            StreamMessage::Reset(reset) => panic!("unexpected reset: {reset:?}"),
        }
    }
}

/// A coordinator with the echo module published, and a client of it.
struct Fixture {
    coordinator: Coordinator,
    digest: String,
    runtime: tokio::runtime::Runtime,
    client: Client,
    _dir: tempfile::TempDir,
}

impl Fixture {
    fn start(extra: &[&str]) -> Fixture {
        Fixture::with(Coordinator::start(None, Store::Sqlite, extra))
    }

    fn with(coordinator: Coordinator) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        Fixture {
            digest: publish_echo(&coordinator, dir.path()),
            runtime: runtime(),
            client: client(&coordinator),
            coordinator,
            _dir: dir,
        }
    }
}

#[test]
fn a_task_streams_from_submit_to_success_and_nodes_show_up() {
    let _turn = super::alongside();
    let Fixture {
        coordinator,
        digest,
        runtime,
        client,
        _dir,
    } = Fixture::start(&[]);

    // Watching nodes before the agent starts: it comes online, then its
    // telemetry flows. (Its capability shows as a `capability` change only
    // when it arrives after the node's status; either order is valid.)
    let mut nodes = runtime
        .block_on(client.events(
            &EventFilter {
                node: Some("ev-1".into()),
                ..EventFilter::default()
            },
            None,
        ))
        .unwrap();
    let _agent = Agent::start(&coordinator, &coordinator.mqtt, "ev-1", "");
    let (mut online, mut telemetry) = (false, false);
    runtime.block_on(async {
        while !(online && telemetry) {
            match next(&mut nodes, Duration::from_secs(30)).await {
                StreamMessage::Event { event, .. } => match event {
                    LiveEvent::Node(change) => {
                        assert_eq!(change.node_id, "ev-1");
                        assert!(
                            matches!(
                                change.change,
                                NodeChangeKind::Online | NodeChangeKind::Capability
                            ),
                            "{change:?}"
                        );
                        online |= change.change == NodeChangeKind::Online;
                    }
                    LiveEvent::Telemetry(sample) => {
                        assert_eq!(sample.node_id, "ev-1");
                        assert!((0.0..=1.0).contains(&sample.memory_used));
                        telemetry = true;
                    }
                    other => panic!("the node filter let through {other:?}"),
                },
                StreamMessage::Reset(reset) => panic!("{reset:?}"),
            }
        }
    });
    coordinator.wait_for_nodes(1, Duration::from_secs(30));

    // A task's states, in order, as they happen.
    let mut tasks = runtime
        .block_on(client.events(
            &EventFilter {
                kinds: vec![EventKind::Task],
                ..EventFilter::default()
            },
            None,
        ))
        .unwrap();
    let submitted = runtime
        .block_on(client.submit(&echo_task(&digest, "hi")))
        .unwrap();
    let states = runtime.block_on(async {
        let mut states = Vec::new();
        loop {
            let (_, change) = next_task_change(&mut tasks).await;
            assert_eq!(change.task_id, submitted.id);
            states.push(change.status);
            if change.status == TaskStatus::Assigned {
                assert_eq!(change.node_id.as_deref(), Some("ev-1"));
                assert!(change.power_level.is_some(), "{change:?}");
            }
            if change.status.is_terminal() {
                assert_eq!(change.node_id.as_deref(), Some("ev-1"));
                return states;
            }
        }
    });
    assert_eq!(
        states,
        [
            TaskStatus::Pending,
            TaskStatus::Assigned,
            TaskStatus::Running,
            TaskStatus::Succeeded
        ]
    );

    // The long poll answers as soon as the task ends, with its output.
    let submitted = runtime
        .block_on(client.submit(&echo_task(&digest, "poll")))
        .unwrap();
    let started = Instant::now();
    let done = runtime
        .block_on(client.task_wait(&submitted.id, Duration::from_secs(30)))
        .unwrap();
    assert_eq!(done.state, TaskStatus::Succeeded);
    assert!(started.elapsed() < Duration::from_secs(20));
    // An ended task answers at once, whatever the wait.
    let started = Instant::now();
    let again = runtime
        .block_on(client.task_wait(&submitted.id, Duration::from_secs(30)))
        .unwrap();
    assert_eq!(again.state, TaskStatus::Succeeded);
    assert!(started.elapsed() < Duration::from_secs(5));
    // `starling task ID --wait` waits the same way.
    let out = coordinator.cli(&["task", &submitted.id, "--wait", "--json"], None);
    assert!(out.status.success());
}

#[test]
fn a_long_poll_gives_up_after_its_wait_and_refuses_a_bad_one() {
    let _turn = super::alongside();
    // No agent: the task stays pending.
    let Fixture {
        coordinator,
        digest,
        runtime,
        client,
        _dir,
    } = Fixture::start(&[]);
    let task = runtime
        .block_on(client.submit(&echo_task(&digest, "x")))
        .unwrap();
    let started = Instant::now();
    let waited = runtime
        .block_on(client.task_wait(&task.id, Duration::from_millis(300)))
        .unwrap();
    assert_eq!(waited.state, TaskStatus::Pending);
    assert!(started.elapsed() >= Duration::from_millis(300));
    let (status, body) =
        coordinator.http("GET", &format!("/api/v1/tasks/{}?wait=soon", task.id), None);
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("invalid_query"), "{body}");
    let (status, _) = coordinator.http("GET", "/api/v1/tasks/no-such-task?wait=1s", None);
    assert_eq!(status, 404);
}

#[test]
fn a_client_resumes_with_last_event_id_and_an_unknown_position_is_reset() {
    let _turn = super::alongside();
    let Fixture {
        coordinator,
        digest,
        runtime,
        client,
        _dir,
    } = Fixture::start(&[]);
    let filter = EventFilter {
        kinds: vec![EventKind::Task],
        ..EventFilter::default()
    };
    runtime.block_on(async {
        let mut stream = client.events(&filter, None).await.unwrap();
        let first = client.submit(&echo_task(&digest, "1")).await.unwrap();
        let (seen, change) = next_task_change(&mut stream).await;
        assert_eq!(change.task_id, first.id);
        assert_eq!(stream.last_id(), Some(seen.as_str()));
        drop(stream);

        // Missed while disconnected.
        let second = client.submit(&echo_task(&digest, "2")).await.unwrap();
        let third = client.submit(&echo_task(&digest, "3")).await.unwrap();

        let mut resumed = client.events(&filter, Some(&seen)).await.unwrap();
        let (_, change) = next_task_change(&mut resumed).await;
        assert_eq!(change.task_id, second.id);
        let (_, change) = next_task_change(&mut resumed).await;
        assert_eq!(change.task_id, third.id);
        // Nothing else was missed.
        assert!(
            tokio::time::timeout(Duration::from_millis(300), resumed.next())
                .await
                .is_err()
        );

        // A position from another run of the coordinator.
        let (boot, _) = seen.split_once('-').unwrap();
        let other_boot = format!("{:x}-1", u64::from_str_radix(boot, 16).unwrap() ^ 1);
        let mut elsewhere = client.events(&filter, Some(&other_boot)).await.unwrap();
        match next(&mut elsewhere, Duration::from_secs(10)).await {
            StreamMessage::Reset(reset) => assert_eq!(reset.reason, "unknown_position"),
            other => panic!("{other:?}"),
        }
        // It streams from now on after the reset.
        let fourth = client.submit(&echo_task(&digest, "4")).await.unwrap();
        let (_, change) = next_task_change(&mut elsewhere).await;
        assert_eq!(change.task_id, fourth.id);

        // Garbage is refused with a clear error.
        let refused = client.events(&filter, Some("yesterday")).await.unwrap_err();
        assert!(refused.to_string().contains("invalid_query"), "{refused}");
    });
    let (status, body) = coordinator.http("GET", "/api/v1/events?kind=tasks", None);
    assert_eq!(status, 400, "{body}");
}

/// Opens a raw stream that never reads: a client stalled behind a slow link.
fn stalled_client(
    runtime: &tokio::runtime::Runtime,
    coordinator: &Coordinator,
) -> std::net::TcpStream {
    let addr: std::net::SocketAddr = coordinator
        .rest
        .trim_start_matches("http://")
        .parse()
        .unwrap();
    let mut stream = runtime.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        // A small window, so the coordinator's writes back up quickly.
        socket.set_recv_buffer_size(4096).unwrap();
        socket.connect(addr).await.unwrap().into_std().unwrap()
    });
    stream.set_nonblocking(false).unwrap();
    write!(
        stream,
        "GET /api/v1/events?kind=task HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {}\r\nAccept: text/event-stream\r\n\r\n",
        coordinator.token
    )
    .unwrap();
    stream
}

#[test]
fn a_stalled_client_is_reset_and_cut_off_while_others_keep_up() {
    // Network namespaces: alone, like every test that makes them.
    let _turn = super::alone();
    // Over a veth link (MTU 1500) rather than loopback, whose 64 KiB segments
    // make the kernel give each socket megabytes of send buffer: here the
    // stalled stream's buffers fill after a few hundred events, as on a
    // real network.
    let ns = NetNs::create();
    let ip: std::net::Ipv4Addr = format!("10.231.{}.2", ns.host_octets()[2]).parse().unwrap();
    let Fixture {
        coordinator,
        digest,
        runtime,
        client,
        _dir,
    } = Fixture::with(Coordinator::start_in_namespace(
        &ns.name,
        ip,
        &["--event-buffer", "32"],
    ));
    let filter = EventFilter {
        kinds: vec![EventKind::Task],
        ..EventFilter::default()
    };
    let mut stalled = stalled_client(&runtime, &coordinator);
    // More events than the stalled stream's buffers hold: the coordinator's
    // 64 KiB connection buffer and the sockets' (some 500 events of ~220
    // bytes over this link).
    const TASKS: usize = 2000;
    runtime.block_on(async {
        let mut keeping_up = client.events(&filter, None).await.unwrap();
        // Submitted 16 at a time; the reader that keeps up sees every one.
        let mut submitted = Vec::with_capacity(TASKS);
        for chunk in (0..TASKS).collect::<Vec<_>>().chunks(32) {
            let mut batch = tokio::task::JoinSet::new();
            for i in chunk {
                let (client, task) = (client.clone(), echo_task(&digest, &i.to_string()));
                batch.spawn(async move { client.submit(&task).await });
            }
            while let Some(task) = batch.join_next().await {
                submitted.push(task.unwrap().unwrap().id);
            }
            // Read what came so far, as a live client does.
            for _ in chunk {
                let (_, change) = next_task_change(&mut keeping_up).await;
                assert_eq!(change.status, TaskStatus::Pending);
            }
        }
        assert_eq!(submitted.len(), TASKS);
    });

    // The stalled client now reads what was queued for it: some events, then a
    // reset, then the end of the stream.
    stalled
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut reader = BufReader::new(&mut stalled);
    let reading = Instant::now();
    let mut events = 0usize;
    let mut reset = None;
    let mut line = String::new();
    let mut last_event = String::new();
    loop {
        // Keep-alive comments would keep a stream that is never reset open.
        assert!(
            reading.elapsed() < Duration::from_secs(60),
            "no reset after {events} events"
        );
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) => break,
            Ok(_) => {}
            Err(error) => panic!("the stalled stream was neither reset nor closed: {error}"),
        }
        if let Some(name) = line.strip_prefix("event: ") {
            last_event = name.trim().to_owned();
            if last_event == "task" {
                events += 1;
            }
        }
        if let Some(data) = line.strip_prefix("data: ") {
            if last_event == "reset" {
                reset = Some(data.trim().to_owned());
                // After the reset nothing but the end of the chunked body.
                let mut rest = Vec::new();
                let _ = reader.read_to_end(&mut rest);
                assert!(
                    !String::from_utf8_lossy(&rest).contains("event:"),
                    "events after the reset"
                );
                break;
            }
        }
    }
    let reset = reset.expect("a reset event");
    assert!(reset.contains("too_slow"), "{reset}");
    assert!(events < TASKS, "it cannot have had every event: {events}");
}

/// The stream as an attacker meets it: no token or a made-up one gets
/// nothing, a viewer's revoked token stops working, and positions forged to
/// reach past the ring or overflow it are a `reset` (or a 400), not a crash.
#[test]
fn the_stream_is_for_token_holders_and_forged_positions_do_not_break_it() {
    let _turn = super::alongside();
    let Fixture {
        coordinator,
        digest,
        runtime,
        client,
        _dir,
    } = Fixture::start(&[]);
    let url = format!("{}/api/v1/events", coordinator.rest);
    runtime.block_on(async {
        let http = reqwest::Client::new();
        let anonymous = http.get(&url).send().await.unwrap();
        assert_eq!(anonymous.status(), 401);
        let forged = http
            .get(&url)
            .bearer_auth("stk_made_up")
            .send()
            .await
            .unwrap();
        assert_eq!(forged.status(), 401);
    });
    let created = coordinator.cli_json(
        &[
            "api-token",
            "create",
            "--role",
            "viewer",
            "--name",
            "watcher",
        ],
        None,
    );
    let viewer_token = created["token"].as_str().unwrap().to_owned();
    let viewer = Client::new(&coordinator.rest, Some(viewer_token));
    let filter = EventFilter::default();
    runtime.block_on(async {
        let mut stream = viewer.events(&filter, None).await.unwrap();
        let task = client.submit(&echo_task(&digest, "seen")).await.unwrap();
        let (_, change) = next_task_change(&mut stream).await;
        assert_eq!(change.task_id, task.id);
        // Positions past the newest event, at the top of the range, or far
        // too long: a reset or a clear refusal.
        let boot = stream
            .last_id()
            .unwrap()
            .split_once('-')
            .unwrap()
            .0
            .to_owned();
        for forged in [format!("{boot}-{}", u64::MAX), format!("{boot}-999999999")] {
            let mut resumed = viewer.events(&filter, Some(&forged)).await.unwrap();
            match next(&mut resumed, Duration::from_secs(10)).await {
                StreamMessage::Reset(reset) => assert_eq!(reset.reason, "unknown_position"),
                other => panic!("{other:?}"),
            }
        }
        let huge = format!("{boot}-{}", "9".repeat(4000));
        assert!(viewer.events(&filter, Some(&huge)).await.is_err());
    });
    let id = created["id"].as_str().unwrap();
    let revoked = coordinator.cli(&["api-token", "revoke", id], None);
    assert!(revoked.status.success());
    let refused = runtime.block_on(viewer.events(&filter, None)).unwrap_err();
    assert!(refused.to_string().contains("401"), "{refused}");
}
