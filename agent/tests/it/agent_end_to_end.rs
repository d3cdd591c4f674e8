//! The agent against a real Mosquitto: retained capability and status,
//! telemetry, an assignment run end to end with its module served over HTTP,
//! malformed and forged payloads survived, redelivery not re-run, cancel,
//! shutdown; events re-sent until acknowledged; a kill mid-task re-runs the
//! attempt once; a broker restart loses no result; a node rebooted while the
//! broker is down resumes its work and delivers once the broker is back.

use crate::support;

use std::time::Duration;

use crate::support::{HttpServer, Mosquitto};
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use starling_agent::artifact::sha256;
use starling_agent::journal::{Journal, JournalLimits};
use starling_agent::{AgentConfig, AgentError};
use starling_proto::{
    Assignment, Cancel, Capability, Channel, Digest, EventAck, ExecLimits, FailureReason, NodeId,
    NodeState, Runtime, Status, TaskEvent, TaskId, TaskState, Telemetry, Topics, PROTOCOL_VERSION,
};
use tokio::sync::{mpsc, oneshot};

/// A test-side MQTT client that hands every publish it receives to a channel
/// and, when asked, plays the coordinator's part of acknowledging every task
/// event it sees.
struct Observer {
    client: AsyncClient,
    received: mpsc::UnboundedReceiver<(String, Vec<u8>)>,
    held: std::collections::VecDeque<(String, Vec<u8>)>,
}

impl Observer {
    async fn start(port: u16, filter: &str) -> Self {
        Self::start_with(port, filter, false).await
    }

    /// An observer that answers every task event with its `EventAck`.
    async fn acking(port: u16, filter: &str) -> Self {
        Self::start_with(port, filter, true).await
    }

    async fn start_with(port: u16, filter: &str, ack_events: bool) -> Self {
        static OBSERVERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let id = OBSERVERS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let mut options = MqttOptions::new(format!("observer-{id}"), "127.0.0.1", port);
        options.set_max_packet_size(2 << 20, 2 << 20);
        let (client, mut eventloop) = AsyncClient::new(options, 64);
        let (sender, received) = mpsc::unbounded_channel();
        client.subscribe(filter, QoS::AtLeastOnce).await.unwrap();
        let (subscribed_tx, subscribed_rx) = oneshot::channel();
        // Receipts are published from their own task: publishing from the
        // task that polls the event loop can deadlock.
        let (ack_sender, mut acks) = mpsc::unbounded_channel::<(String, Vec<u8>)>();
        let ack_client = client.clone();
        tokio::spawn(async move {
            while let Some((topic, payload)) = acks.recv().await {
                let _ = ack_client
                    .publish(topic, QoS::AtLeastOnce, false, payload)
                    .await;
            }
        });
        tokio::spawn(async move {
            let topics = Topics::default();
            let mut subscribed = Some(subscribed_tx);
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        if ack_events {
                            if let Some((node, Channel::Events)) = topics.parse(&p.topic) {
                                if let Ok(event) = starling_proto::decode::<TaskEvent>(&p.payload) {
                                    let ack = EventAck {
                                        v: PROTOCOL_VERSION,
                                        task_id: event.task_id,
                                        attempt: event.attempt,
                                        state: event.state,
                                    };
                                    let _ = ack_sender.send((
                                        topics.node(&node, Channel::Ack),
                                        starling_proto::encode(&ack).unwrap(),
                                    ));
                                }
                            }
                        }
                        if sender.send((p.topic, p.payload.to_vec())).is_err() {
                            return; // The observer was dropped.
                        }
                    }
                    Ok(Event::Incoming(Packet::SubAck(_))) => {
                        if let Some(tx) = subscribed.take() {
                            let _ = tx.send(());
                        }
                    }
                    Ok(_) => {}
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        });
        subscribed_rx.await.unwrap();
        Self {
            client,
            received,
            held: std::collections::VecDeque::new(),
        }
    }

    /// The next message on `topic` within `timeout`; messages on other topics
    /// are kept for later calls, so the order of topics does not matter.
    async fn next_on(&mut self, topic: &str, timeout: Duration) -> Option<Vec<u8>> {
        if let Some(index) = self.held.iter().position(|(t, _)| t == topic) {
            return self.held.remove(index).map(|(_, payload)| payload);
        }
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let (t, payload) = tokio::time::timeout_at(deadline, self.received.recv())
                .await
                .ok()??;
            if t == topic {
                return Some(payload);
            }
            self.held.push_back((t, payload));
        }
    }

    async fn next_event_within(
        &mut self,
        topics: &Topics,
        node: &NodeId,
        timeout: Duration,
    ) -> Option<TaskEvent> {
        self.next_on(&topics.node(node, Channel::Events), timeout)
            .await
            .map(|payload| starling_proto::decode(&payload).unwrap())
    }

    async fn next_event(&mut self, topics: &Topics, node: &NodeId) -> TaskEvent {
        self.next_event_within(topics, node, Duration::from_secs(30))
            .await
            .expect("no task event within 30 s")
    }

    /// Events until the first final one of `task`, which is returned with
    /// every event seen on the way.
    async fn until_final(
        &mut self,
        topics: &Topics,
        node: &NodeId,
        task: &str,
    ) -> (TaskEvent, Vec<TaskEvent>) {
        let mut seen = Vec::new();
        loop {
            let event = self.next_event(topics, node).await;
            seen.push(event.clone());
            if event.task_id.as_str() == task && event.state.is_terminal() {
                return (event, seen);
            }
        }
    }

    async fn publish(&self, topic: String, payload: Vec<u8>) {
        self.client
            .publish(topic, QoS::AtLeastOnce, false, payload)
            .await
            .unwrap();
    }

    async fn assign(&self, topics: &Topics, node: &NodeId, assignment: &Assignment) {
        self.publish(
            topics.node(node, Channel::Assign),
            starling_proto::encode(assignment).unwrap(),
        )
        .await;
    }

    async fn ack(&self, topics: &Topics, node: &NodeId, event: &TaskEvent) {
        let ack = EventAck {
            v: PROTOCOL_VERSION,
            task_id: event.task_id.clone(),
            attempt: event.attempt,
            state: event.state,
        };
        self.publish(
            topics.node(node, Channel::Ack),
            starling_proto::encode(&ack).unwrap(),
        )
        .await;
    }
}

fn assignment(
    node: &NodeId,
    task: &str,
    digest: Digest,
    url: &str,
    input: &[u8],
    limits: ExecLimits,
) -> Assignment {
    support::signed_assignment(node.as_str(), task, digest, url, input, limits)
}

fn config(broker: &Mosquitto, node: &NodeId, data_dir: &std::path::Path) -> AgentConfig {
    AgentConfig {
        broker: broker.url.clone(),
        node_id: Some(node.to_string()),
        data_dir: data_dir.to_owned(),
        telemetry_interval: Duration::from_millis(200),
        max_tasks: 2,
        opencl: false,
        coordinator_key: Some(support::coordinator_public_key()),
        ..AgentConfig::default()
    }
}

/// What the journal in `data_dir` holds, once the agent has stopped:
/// (unacknowledged events, remembered attempts).
async fn journal_counts(data_dir: &std::path::Path) -> (usize, usize) {
    let (journal, _) = Journal::open(data_dir, JournalLimits::default())
        .await
        .unwrap();
    let counts = journal.counts().await.unwrap();
    journal.close().await;
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_serves_assignments_over_mosquitto() {
    support::logs();
    let broker = Mosquitto::start();
    let http = HttpServer::start().await;
    let echo = wat::parse_str(support::ECHO_WAT).unwrap();
    let echo_digest = sha256(&echo);
    let echo_url = http.serve(&format!("/artifacts/{echo_digest}"), echo);
    let spin = wat::parse_str(support::LOOP_WAT).unwrap();
    let spin_digest = sha256(&spin);
    let spin_url = http.serve(&format!("/artifacts/{spin_digest}"), spin);

    let topics = Topics::default();
    let node = NodeId::new("e2e-node").unwrap();
    let mut observer = Observer::acking(broker.port, "starling/v1/nodes/e2e-node/#").await;

    let data_dir = tempfile::tempdir().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let agent = tokio::spawn(starling_agent::run(
        config(&broker, &node, data_dir.path()),
        async {
            let _ = stopped.await;
        },
    ));

    // Status and capability, both decodable with the proto codec.
    let wait = Duration::from_secs(30);
    let status: Status = starling_proto::decode(
        &observer
            .next_on(&topics.node(&node, Channel::Status), wait)
            .await
            .expect("no status"),
    )
    .unwrap();
    assert_eq!(status.state, NodeState::Online);
    let capability: Capability = starling_proto::decode(
        &observer
            .next_on(&topics.node(&node, Channel::Capability), wait)
            .await
            .expect("no capability"),
    )
    .unwrap();
    assert_eq!(capability.node_id, node);
    assert!(capability.runtimes.contains(&Runtime::Wasm));

    // Telemetry arrives periodically with increasing sequence numbers.
    let telemetry_topic = topics.node(&node, Channel::Telemetry);
    let first: Telemetry =
        starling_proto::decode(&observer.next_on(&telemetry_topic, wait).await.unwrap()).unwrap();
    let second: Telemetry =
        starling_proto::decode(&observer.next_on(&telemetry_topic, wait).await.unwrap()).unwrap();
    assert!(second.seq > first.seq);
    assert!(second.link.rtt_ms.is_some());

    // Garbage on the assign, cancel and ack topics is dropped; the agent keeps serving.
    let assign_topic = topics.node(&node, Channel::Assign);
    observer
        .publish(assign_topic.clone(), b"\xff\xfe garbage".to_vec())
        .await;
    observer
        .publish(topics.node(&node, Channel::Cancel), Vec::new())
        .await;
    observer
        .publish(topics.node(&node, Channel::Ack), b"\x00".to_vec())
        .await;

    // Forged, unsigned, replayed-after-expiry and misaddressed assignments
    // are refused and reported; nothing is fetched or run.
    let genuine = assignment(
        &node,
        "echo-1",
        echo_digest,
        &echo_url,
        b"hello edge",
        ExecLimits::default(),
    );
    let mut forged = genuine.clone();
    forged.input = b"rm -rf".to_vec();
    let unsigned = support::unsigned_assignment(
        node.as_str(),
        "echo-1",
        echo_digest,
        &echo_url,
        b"x",
        ExecLimits::default(),
    );
    let mut stale = genuine.clone();
    stale.issued_unix_ms -= 3_600_000;
    stale.expires_unix_ms -= 3_600_000;
    let stale = support::sign(stale, &support::coordinator_key());
    let misaddressed = assignment(
        &NodeId::new("someone-else").unwrap(),
        "echo-1",
        echo_digest,
        &echo_url,
        b"x",
        ExecLimits::default(),
    );
    for (bad, check) in [
        (&forged, "bad signature"),
        (&unsigned, "unsigned"),
        (&stale, "expired"),
        (&misaddressed, "wrong node"),
    ] {
        observer.assign(&topics, &node, bad).await;
        let event = observer.next_event(&topics, &node).await;
        assert_eq!(event.state, TaskState::Rejected, "{check}");
        let message = event.message.unwrap();
        assert!(message.contains(check), "{message}");
    }
    assert_eq!(http.hits(), 0, "a refused assignment fetched its module");

    // The genuine assignment of the same attempt still runs.
    let payload = starling_proto::encode(&genuine).unwrap();
    observer
        .publish(assign_topic.clone(), payload.clone())
        .await;
    let states: Vec<TaskEvent> = vec![
        observer.next_event(&topics, &node).await,
        observer.next_event(&topics, &node).await,
        observer.next_event(&topics, &node).await,
    ];
    let names: Vec<TaskState> = states.iter().map(|e| e.state).collect();
    assert_eq!(
        names,
        [
            TaskState::Accepted,
            TaskState::Running,
            TaskState::Succeeded
        ]
    );
    let done = &states[2];
    assert_eq!(done.output, b"hello edge");
    assert_eq!(done.exit_code, Some(0));
    let metrics = done.metrics.unwrap();
    assert!(!metrics.cache_hit);
    let fetches = http.hits();

    // Redelivery of the same attempt re-publishes the result and runs nothing.
    observer.publish(assign_topic.clone(), payload).await;
    let repeat = observer.next_event(&topics, &node).await;
    assert_eq!(repeat.state, TaskState::Succeeded);
    let extra = observer
        .next_event_within(&topics, &node, Duration::from_millis(1500))
        .await;
    assert!(
        extra.is_none(),
        "a redelivered attempt produced more events: {extra:?}"
    );
    assert_eq!(http.hits(), fetches);

    // A second task with the same module comes from the cache.
    let again = assignment(
        &node,
        "echo-2",
        echo_digest,
        &echo_url,
        b"again",
        ExecLimits::default(),
    );
    observer.assign(&topics, &node, &again).await;
    let (last, _) = observer.until_final(&topics, &node, "echo-2").await;
    assert_eq!(last.state, TaskState::Succeeded);
    assert_eq!(last.output, b"again");
    assert!(last.metrics.unwrap().cache_hit);
    assert_eq!(http.hits(), fetches);

    // An unknown digest: accepted, then failed with fetch_failed.
    let missing = Digest([0xab; 32]);
    let ghost = assignment(
        &node,
        "ghost",
        missing,
        &format!("{}/artifacts/{missing}", http.base),
        b"",
        ExecLimits::default(),
    );
    observer.assign(&topics, &node, &ghost).await;
    assert_eq!(
        observer.next_event(&topics, &node).await.state,
        TaskState::Accepted
    );
    let failed = observer.next_event(&topics, &node).await;
    assert_eq!(failed.state, TaskState::Failed);
    assert_eq!(failed.reason, Some(FailureReason::FetchFailed));

    // A spinning task is stopped by a cancel.
    let spin_task = assignment(
        &node,
        "spin",
        spin_digest,
        &spin_url,
        b"",
        ExecLimits {
            wall_ms: 60_000,
            ..ExecLimits::default()
        },
    );
    observer.assign(&topics, &node, &spin_task).await;
    assert_eq!(
        observer.next_event(&topics, &node).await.state,
        TaskState::Accepted
    );
    assert_eq!(
        observer.next_event(&topics, &node).await.state,
        TaskState::Running
    );
    let cancel = Cancel {
        v: PROTOCOL_VERSION,
        task_id: TaskId::new("spin").unwrap(),
        attempt: 1,
    };
    observer
        .publish(
            topics.node(&node, Channel::Cancel),
            starling_proto::encode(&cancel).unwrap(),
        )
        .await;
    assert_eq!(
        observer.next_event(&topics, &node).await.state,
        TaskState::Cancelled
    );

    // Shutdown publishes offline and returns cleanly (after the last
    // receipt had time to land).
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.send(()).unwrap();
    let result = tokio::time::timeout(Duration::from_secs(10), agent)
        .await
        .expect("the agent did not stop")
        .unwrap();
    assert!(result.is_ok(), "{result:?}");
    let status: Status = starling_proto::decode(
        &observer
            .next_on(&topics.node(&node, Channel::Status), wait)
            .await
            .expect("no offline status"),
    )
    .unwrap();
    assert_eq!(status.state, NodeState::Offline);

    // Every event was acknowledged, so the outbox is empty; no refusal was journaled.
    assert_eq!(journal_counts(data_dir.path()).await, (0, 4));
}

#[tokio::test]
async fn unreachable_broker_is_a_clear_start_error() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let data_dir = tempfile::tempdir().unwrap();
    let config = AgentConfig {
        broker: format!("mqtt://127.0.0.1:{port}"),
        node_id: Some("lonely".into()),
        data_dir: data_dir.path().to_owned(),
        opencl: false,
        ..AgentConfig::default()
    };
    let error = starling_agent::run(config, std::future::pending())
        .await
        .unwrap_err();
    assert!(
        matches!(error, AgentError::BrokerUnreachable { .. }),
        "{error}"
    );
    let text = error.to_string();
    assert!(text.contains("connection refused"), "{text}");
    assert!(text.contains("--broker"), "{text}");
    assert!(text.contains(&format!("mqtt://127.0.0.1:{port}")), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_are_sent_again_until_acknowledged_and_a_full_journal_refuses_work() {
    support::logs();
    let broker = Mosquitto::start();
    let http = HttpServer::start().await;
    let echo = wat::parse_str(support::ECHO_WAT).unwrap();
    let digest = sha256(&echo);
    let url = http.serve("/echo", echo);
    let topics = Topics::default();
    let node = NodeId::new("resend-node").unwrap();
    // This observer acknowledges nothing unless told to.
    let mut observer = Observer::start(broker.port, "starling/v1/nodes/resend-node/#").await;
    let data_dir = tempfile::tempdir().unwrap();
    let config = AgentConfig {
        event_resend_interval: Duration::from_millis(300),
        journal_max_entries: 2,
        ..config(&broker, &node, data_dir.path())
    };
    let (stop, stopped) = oneshot::channel::<()>();
    let agent = tokio::spawn(starling_agent::run(config, async {
        let _ = stopped.await;
    }));
    observer
        .next_on(
            &topics.node(&node, Channel::Capability),
            Duration::from_secs(30),
        )
        .await
        .expect("no capability");

    let first = assignment(&node, "first", digest, &url, b"one", ExecLimits::default());
    observer.assign(&topics, &node, &first).await;
    let (done, _) = observer.until_final(&topics, &node, "first").await;
    assert_eq!(done.state, TaskState::Succeeded);

    // Without receipts, every event comes again, the result included.
    let mut resent = Vec::new();
    while let Some(event) = observer
        .next_event_within(&topics, &node, Duration::from_millis(1500))
        .await
    {
        resent.push(event.state);
        if resent.len() >= 6 {
            break;
        }
    }
    assert!(
        resent.contains(&TaskState::Succeeded) && resent.contains(&TaskState::Accepted),
        "unacknowledged events were not sent again: {resent:?}"
    );

    // The outbox holds 3 events, over its bound of 2: new work is refused,
    // unjournaled, so the coordinator can place it elsewhere.
    let second = assignment(&node, "second", digest, &url, b"two", ExecLimits::default());
    observer.assign(&topics, &node, &second).await;
    let (refused, _) = observer.until_final(&topics, &node, "second").await;
    assert_eq!(refused.state, TaskState::Failed);
    assert_eq!(refused.reason, Some(FailureReason::AgentBusy));
    assert!(
        refused.message.as_deref().unwrap_or("").contains("full"),
        "{refused:?}"
    );

    // Receipts empty the outbox; the resends stop and work is taken again.
    for state in [
        TaskState::Accepted,
        TaskState::Running,
        TaskState::Succeeded,
    ] {
        let mut event = done.clone();
        event.state = state;
        observer.ack(&topics, &node, &event).await;
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    // Drain what was in flight before the receipts landed.
    while observer
        .next_event_within(&topics, &node, Duration::from_millis(200))
        .await
        .is_some()
    {}
    let quiet = observer
        .next_event_within(&topics, &node, Duration::from_millis(1500))
        .await;
    assert!(
        quiet.is_none(),
        "acknowledged events were sent again: {quiet:?}"
    );

    let third = assignment(
        &node,
        "third",
        digest,
        &url,
        b"three",
        ExecLimits::default(),
    );
    observer.assign(&topics, &node, &third).await;
    let (done, _) = observer.until_final(&topics, &node, "third").await;
    assert_eq!(done.state, TaskState::Succeeded);
    assert_eq!(done.output, b"three");

    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), agent)
        .await
        .expect("the agent did not stop")
        .unwrap()
        .unwrap();
    // "third"'s three events still await receipts; "second" left no trace.
    assert_eq!(journal_counts(data_dir.path()).await, (3, 2));
}

/// Starts an agent on a runtime of its own, so that dropping the runtime
/// stops it dead at whatever await it was in, as a kill would (no shutdown
/// path, no offline status, no journal close); gives it a long counting task
/// and returns once the task runs, with the runtime and the assignment.
async fn doomed_agent_running(
    observer: &mut Observer,
    config: &AgentConfig,
    node: &NodeId,
    task_id: &str,
    digest: Digest,
    url: &str,
) -> (tokio::runtime::Runtime, Assignment) {
    let topics = Topics::default();
    let doomed = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    doomed.spawn(starling_agent::run(config.clone(), std::future::pending()));
    observer
        .next_on(
            &topics.node(node, Channel::Capability),
            Duration::from_secs(30),
        )
        .await
        .expect("no capability");
    let task = assignment(
        node,
        task_id,
        digest,
        url,
        b"",
        ExecLimits {
            wall_ms: 120_000,
            ..ExecLimits::default()
        },
    );
    observer.assign(&topics, node, &task).await;
    assert_eq!(
        observer.next_event(&topics, node).await.state,
        TaskState::Accepted
    );
    assert_eq!(
        observer.next_event(&topics, node).await.state,
        TaskState::Running
    );
    (doomed, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_agent_reruns_the_interrupted_attempt_exactly_once() {
    support::logs();
    let broker = Mosquitto::start();
    let http = HttpServer::start().await;
    let count = wat::parse_str(support::COUNT_WAT).unwrap();
    let digest = sha256(&count);
    let url = http.serve("/count", count);
    let topics = Topics::default();
    let node = NodeId::new("killed-node").unwrap();
    let mut observer = Observer::acking(broker.port, "starling/v1/nodes/killed-node/#").await;
    let data_dir = tempfile::tempdir().unwrap();
    let config = config(&broker, &node, data_dir.path());

    let (doomed, task) =
        doomed_agent_running(&mut observer, &config, &node, "interrupted", digest, &url).await;
    let status: Status = starling_proto::decode(
        &observer
            .next_on(
                &topics.node(&node, Channel::Status),
                Duration::from_secs(30),
            )
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(status.state, NodeState::Online);
    doomed.shutdown_background();
    // The broker announces the death through the last will.
    let status: Status = starling_proto::decode(
        &observer
            .next_on(
                &topics.node(&node, Channel::Status),
                Duration::from_secs(30),
            )
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(status.state, NodeState::Offline);

    // The restarted agent runs the attempt again from its journal, once.
    let (stop, stopped) = oneshot::channel::<()>();
    let second = tokio::spawn(starling_agent::run(config, async {
        let _ = stopped.await;
    }));
    let (done, seen) = observer.until_final(&topics, &node, "interrupted").await;
    assert_eq!(done.state, TaskState::Succeeded, "{seen:?}");
    assert_eq!(done.output, b"done");
    assert!(
        seen.iter().any(|e| e.state == TaskState::Running),
        "the restarted agent did not report the re-run: {seen:?}"
    );
    let extra = observer
        .next_event_within(&topics, &node, Duration::from_secs(3))
        .await;
    assert!(extra.is_none(), "more events after the result: {extra:?}");

    // A redelivery (re-signed, as the coordinator's outbox sends it) is
    // answered with the result and not run a third time.
    let redelivered = support::sign(task, &support::coordinator_key());
    observer.assign(&topics, &node, &redelivered).await;
    let repeat = observer.next_event(&topics, &node).await;
    assert_eq!(repeat.state, TaskState::Succeeded);
    let extra = observer
        .next_event_within(&topics, &node, Duration::from_secs(3))
        .await;
    assert!(extra.is_none(), "the redelivery ran again: {extra:?}");

    stop.send(()).unwrap();
    second.await.unwrap().unwrap();
    assert_eq!(journal_counts(data_dir.path()).await, (0, 1));
}

/// The states of `task`'s events waiting in the journal's outbox, read
/// through a second, read-only connection while the agent runs.
async fn outbox_states(data_dir: &std::path::Path, task: &str) -> Vec<String> {
    let url = format!(
        "sqlite://{}?mode=ro",
        data_dir.join("journal.sqlite").display()
    );
    let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
    let states: Vec<(String,)> =
        sqlx::query_as("SELECT state FROM outbox WHERE task_id = ? ORDER BY seq")
            .bind(task)
            .fetch_all(&pool)
            .await
            .unwrap();
    pool.close().await;
    states.into_iter().map(|(state,)| state).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_rebooted_during_a_broker_outage_resumes_its_work_offline() {
    support::logs();
    let mut broker = Mosquitto::start();
    let http = HttpServer::start().await;
    let count = wat::parse_str(support::COUNT_WAT).unwrap();
    let digest = sha256(&count);
    let url = http.serve("/count", count);
    let topics = Topics::default();
    let node = NodeId::new("rebooted").unwrap();
    let data_dir = tempfile::tempdir().unwrap();
    let config = config(&broker, &node, data_dir.path());
    {
        let mut observer = Observer::acking(broker.port, "starling/v1/nodes/rebooted/#").await;
        let (doomed, _) = doomed_agent_running(
            &mut observer,
            &config,
            &node,
            "through-the-outage",
            digest,
            &url,
        )
        .await;
        // The broker dies, then the node loses power.
        broker.kill();
        doomed.shutdown_background();
    }

    // The node boots with the broker still down: it resumes the attempt
    // from its journal instead of failing to start.
    let (stop, stopped) = oneshot::channel::<()>();
    let agent = tokio::spawn(starling_agent::run(config, async {
        let _ = stopped.await;
    }));
    let start = std::time::Instant::now();
    loop {
        assert!(
            !agent.is_finished(),
            "the agent stopped while the broker was down: {:?}",
            agent.await
        );
        let states = outbox_states(data_dir.path(), "through-the-outage").await;
        if states.iter().any(|s| s == "succeeded") {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the attempt did not finish offline; outbox: {states:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The broker returns: the queued result arrives, once.
    broker.start_again();
    let mut observer = Observer::acking(broker.port, "starling/v1/nodes/rebooted/#").await;
    let (done, _) = observer
        .until_final(&topics, &node, "through-the-outage")
        .await;
    assert_eq!(done.state, TaskState::Succeeded);
    assert_eq!(done.output, b"done");
    // The observer's receipts empty the outbox.
    let start = std::time::Instant::now();
    loop {
        let states = outbox_states(data_dir.path(), "through-the-outage").await;
        if states.is_empty() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "events still unacknowledged: {states:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop.send(()).unwrap();
    agent.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_finished_while_the_broker_restarts_still_arrives() {
    support::logs();
    let mut broker = Mosquitto::start();
    let http = HttpServer::start().await;
    let count = wat::parse_str(support::COUNT_WAT).unwrap();
    let count_digest = sha256(&count);
    let count_url = http.serve("/count", count);
    let echo = wat::parse_str(support::ECHO_WAT).unwrap();
    let echo_digest = sha256(&echo);
    let echo_url = http.serve("/echo", echo);
    let topics = Topics::default();
    let node = NodeId::new("bouncy").unwrap();
    let data_dir = tempfile::tempdir().unwrap();
    let config = AgentConfig {
        event_resend_interval: Duration::from_millis(500),
        ..config(&broker, &node, data_dir.path())
    };
    let (stop, stopped) = oneshot::channel::<()>();
    let agent = tokio::spawn(starling_agent::run(config, async {
        let _ = stopped.await;
    }));
    {
        let mut observer = Observer::acking(broker.port, "starling/v1/nodes/bouncy/#").await;
        observer
            .next_on(
                &topics.node(&node, Channel::Capability),
                Duration::from_secs(30),
            )
            .await
            .expect("no capability");
        let slow = assignment(
            &node,
            "slow",
            count_digest,
            &count_url,
            b"",
            ExecLimits {
                wall_ms: 120_000,
                ..ExecLimits::default()
            },
        );
        observer.assign(&topics, &node, &slow).await;
        assert_eq!(
            observer.next_event(&topics, &node).await.state,
            TaskState::Accepted
        );
        assert_eq!(
            observer.next_event(&topics, &node).await.state,
            TaskState::Running
        );
    }

    // The broker restarts without persistence while the task runs: it
    // forgets the agent's session, its subscriptions, every queued message
    // and every retained one.
    broker.restart();
    let mut observer = Observer::acking(broker.port, "starling/v1/nodes/bouncy/#").await;
    let (done, _) = observer.until_final(&topics, &node, "slow").await;
    assert_eq!(done.state, TaskState::Succeeded);
    assert_eq!(done.output, b"done");
    let status: Status = starling_proto::decode(
        &observer
            .next_on(
                &topics.node(&node, Channel::Status),
                Duration::from_secs(30),
            )
            .await
            .expect("no status after the broker restarted"),
    )
    .unwrap();
    assert_eq!(status.state, NodeState::Online);
    observer
        .next_on(
            &topics.node(&node, Channel::Capability),
            Duration::from_secs(30),
        )
        .await
        .expect("capability not re-published after the broker lost it");

    // Subscriptions were renewed: work still arrives, and receipts too.
    let task = assignment(
        &node,
        "after-bounce",
        echo_digest,
        &echo_url,
        b"still here",
        ExecLimits::default(),
    );
    observer.assign(&topics, &node, &task).await;
    let (last, _) = observer.until_final(&topics, &node, "after-bounce").await;
    assert_eq!(last.state, TaskState::Succeeded);
    assert_eq!(last.output, b"still here");
    tokio::time::sleep(Duration::from_millis(500)).await;

    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), agent)
        .await
        .expect("the agent did not stop")
        .unwrap()
        .unwrap();
    assert_eq!(journal_counts(data_dir.path()).await, (0, 2));
}
