//! The agent against a real Mosquitto: retained capability and status,
//! telemetry, an assignment run end to end with its module served over HTTP,
//! malformed payloads survived, redelivery not re-run, cancel, shutdown.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod support;

use std::time::Duration;

use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use starling_agent::artifact::sha256;
use starling_agent::{AgentConfig, AgentError};
use starling_proto::{
    Assignment, Cancel, Capability, Channel, Digest, ExecLimits, FailureReason, NodeId, NodeState,
    Runtime, Status, TaskEvent, TaskId, TaskState, Telemetry, Topics, PROTOCOL_VERSION,
};
use support::{HttpServer, Mosquitto};
use tokio::sync::{mpsc, oneshot};

/// A test-side MQTT client that hands every publish it receives to a channel.
struct Observer {
    client: AsyncClient,
    received: mpsc::UnboundedReceiver<(String, Vec<u8>)>,
    held: std::collections::VecDeque<(String, Vec<u8>)>,
}

impl Observer {
    async fn start(port: u16, filter: &str) -> Self {
        static OBSERVERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let id = OBSERVERS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let mut options = MqttOptions::new(format!("observer-{id}"), "127.0.0.1", port);
        options.set_max_packet_size(2 << 20, 2 << 20);
        let (client, mut eventloop) = AsyncClient::new(options, 64);
        let (sender, received) = mpsc::unbounded_channel();
        client.subscribe(filter, QoS::AtLeastOnce).await.unwrap();
        let (subscribed_tx, subscribed_rx) = oneshot::channel();
        tokio::spawn(async move {
            let mut subscribed = Some(subscribed_tx);
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::Publish(p))) => {
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

    async fn next_event(&mut self, topics: &Topics, node: &NodeId) -> TaskEvent {
        let payload = self
            .next_on(&topics.node(node, Channel::Events), Duration::from_secs(20))
            .await
            .expect("no task event within 20 s");
        starling_proto::decode(&payload).unwrap()
    }

    async fn publish(&self, topic: String, payload: Vec<u8>) {
        self.client
            .publish(topic, QoS::AtLeastOnce, false, payload)
            .await
            .unwrap();
    }
}

fn assignment(
    task: &str,
    digest: Digest,
    url: &str,
    input: &[u8],
    limits: ExecLimits,
) -> Assignment {
    Assignment {
        v: PROTOCOL_VERSION,
        task_id: TaskId::new(task).unwrap(),
        attempt: 1,
        runtime: Runtime::Wasm,
        artifact: digest,
        artifact_url: heapless::String::try_from(url).unwrap(),
        args: heapless::Vec::new(),
        input: input.to_vec(),
        limits,
        power_level: 1,
        deadline_unix_ms: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_serves_assignments_over_mosquitto() {
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
    let mut observer = Observer::start(broker.port, "starling/v1/nodes/e2e-node/#").await;

    let data_dir = tempfile::tempdir().unwrap();
    let config = AgentConfig {
        broker: broker.url.clone(),
        node_id: Some(node.to_string()),
        data_dir: data_dir.path().to_owned(),
        telemetry_interval: Duration::from_millis(200),
        max_tasks: 2,
        ..AgentConfig::default()
    };
    let (stop, stopped) = oneshot::channel::<()>();
    let agent = tokio::spawn(starling_agent::run(config, async {
        let _ = stopped.await;
    }));

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

    // Garbage on the assign and cancel topics is dropped; the agent keeps serving.
    let assign_topic = topics.node(&node, Channel::Assign);
    observer
        .publish(assign_topic.clone(), b"\xff\xfe garbage".to_vec())
        .await;
    observer
        .publish(topics.node(&node, Channel::Cancel), Vec::new())
        .await;

    let echo_task = assignment(
        "echo-1",
        echo_digest,
        &echo_url,
        b"hello edge",
        ExecLimits::default(),
    );
    let payload = starling_proto::encode(&echo_task).unwrap();
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
    assert_eq!(repeat.output, b"hello edge");
    let extra = observer
        .next_on(
            &topics.node(&node, Channel::Events),
            Duration::from_millis(1500),
        )
        .await;
    assert!(
        extra.is_none(),
        "a redelivered attempt produced more events"
    );
    assert_eq!(http.hits(), fetches);

    // A second task with the same module comes from the cache.
    let again = assignment(
        "echo-2",
        echo_digest,
        &echo_url,
        b"again",
        ExecLimits::default(),
    );
    observer
        .publish(
            assign_topic.clone(),
            starling_proto::encode(&again).unwrap(),
        )
        .await;
    let mut last = observer.next_event(&topics, &node).await;
    while !last.state.is_terminal() {
        last = observer.next_event(&topics, &node).await;
    }
    assert_eq!(last.state, TaskState::Succeeded);
    assert_eq!(last.output, b"again");
    assert!(last.metrics.unwrap().cache_hit);
    assert_eq!(http.hits(), fetches);

    // An unknown digest: accepted, then failed with fetch_failed.
    let missing = Digest([0xab; 32]);
    let ghost = assignment(
        "ghost",
        missing,
        &format!("{}/artifacts/{missing}", http.base),
        b"",
        ExecLimits::default(),
    );
    observer
        .publish(
            assign_topic.clone(),
            starling_proto::encode(&ghost).unwrap(),
        )
        .await;
    assert_eq!(
        observer.next_event(&topics, &node).await.state,
        TaskState::Accepted
    );
    let failed = observer.next_event(&topics, &node).await;
    assert_eq!(failed.state, TaskState::Failed);
    assert_eq!(failed.reason, Some(FailureReason::FetchFailed));

    // A spinning task is stopped by a cancel.
    let spin_task = assignment(
        "spin",
        spin_digest,
        &spin_url,
        b"",
        ExecLimits {
            wall_ms: 60_000,
            ..ExecLimits::default()
        },
    );
    observer
        .publish(
            assign_topic.clone(),
            starling_proto::encode(&spin_task).unwrap(),
        )
        .await;
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

    // Shutdown publishes offline and returns cleanly.
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
async fn restarted_agent_remembers_attempts() {
    let broker = Mosquitto::start();
    let http = HttpServer::start().await;
    let echo = wat::parse_str(support::ECHO_WAT).unwrap();
    let digest = sha256(&echo);
    let url = http.serve("/echo", echo);
    let topics = Topics::default();
    let node = NodeId::new("restart-node").unwrap();
    let mut observer = Observer::start(broker.port, "starling/v1/nodes/restart-node/#").await;
    let data_dir = tempfile::tempdir().unwrap();

    // An earlier run accepted "cut-short" and died before finishing it.
    {
        let (mut journal, _) =
            starling_agent::journal::AttemptJournal::open(data_dir.path()).unwrap();
        journal
            .append(&TaskEvent::state(
                TaskId::new("cut-short").unwrap(),
                1,
                node.clone(),
                TaskState::Accepted,
            ))
            .unwrap();
    }
    let config = AgentConfig {
        broker: broker.url.clone(),
        node_id: Some(node.to_string()),
        data_dir: data_dir.path().to_owned(),
        ..AgentConfig::default()
    };

    let (stop, stopped) = oneshot::channel::<()>();
    let first = tokio::spawn(starling_agent::run(config.clone(), async {
        let _ = stopped.await;
    }));
    let interrupted = observer.next_event(&topics, &node).await;
    assert_eq!(interrupted.task_id.as_str(), "cut-short");
    assert_eq!(interrupted.state, TaskState::Failed);
    assert_eq!(interrupted.reason, Some(FailureReason::AgentBusy));

    let task = assignment("once", digest, &url, b"only once", ExecLimits::default());
    let payload = starling_proto::encode(&task).unwrap();
    let assign_topic = topics.node(&node, Channel::Assign);
    observer
        .publish(assign_topic.clone(), payload.clone())
        .await;
    let mut last = observer.next_event(&topics, &node).await;
    while !last.state.is_terminal() {
        last = observer.next_event(&topics, &node).await;
    }
    assert_eq!(last.state, TaskState::Succeeded);
    stop.send(()).unwrap();
    first.await.unwrap().unwrap();

    // A new agent process over the same data dir gets the assignment again.
    let (stop, stopped) = oneshot::channel::<()>();
    let second = tokio::spawn(starling_agent::run(config, async {
        let _ = stopped.await;
    }));
    observer
        .next_on(
            &topics.node(&node, Channel::Capability),
            Duration::from_secs(30),
        )
        .await
        .expect("the restarted agent did not come up");
    observer.publish(assign_topic, payload).await;
    let repeat = observer.next_event(&topics, &node).await;
    assert_eq!(repeat.state, TaskState::Succeeded);
    assert_eq!(repeat.output, b"only once");
    let extra = observer
        .next_on(
            &topics.node(&node, Channel::Events),
            Duration::from_millis(1500),
        )
        .await;
    assert!(extra.is_none(), "the restarted agent ran the attempt again");
    stop.send(()).unwrap();
    second.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_reconnects_after_the_broker_restarts() {
    let mut broker = Mosquitto::start();
    let http = HttpServer::start().await;
    let echo = wat::parse_str(support::ECHO_WAT).unwrap();
    let digest = sha256(&echo);
    let url = http.serve("/echo", echo);
    let topics = Topics::default();
    let node = NodeId::new("bouncy").unwrap();
    let data_dir = tempfile::tempdir().unwrap();
    let config = AgentConfig {
        broker: broker.url.clone(),
        node_id: Some(node.to_string()),
        data_dir: data_dir.path().to_owned(),
        telemetry_interval: Duration::from_millis(200),
        ..AgentConfig::default()
    };
    let (stop, stopped) = oneshot::channel::<()>();
    let agent = tokio::spawn(starling_agent::run(config, async {
        let _ = stopped.await;
    }));
    {
        let mut observer = Observer::start(broker.port, "starling/v1/nodes/bouncy/#").await;
        observer
            .next_on(
                &topics.node(&node, Channel::Capability),
                Duration::from_secs(30),
            )
            .await
            .expect("no capability");
    }

    // The broker restarts without persistence: it forgets the agent's session,
    // its subscriptions and every retained message.
    broker.restart();
    let mut observer = Observer::start(broker.port, "starling/v1/nodes/bouncy/#").await;
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

    // Subscriptions were renewed: work still arrives.
    let task = assignment(
        "after-bounce",
        digest,
        &url,
        b"still here",
        ExecLimits::default(),
    );
    observer
        .publish(
            topics.node(&node, Channel::Assign),
            starling_proto::encode(&task).unwrap(),
        )
        .await;
    let mut last = observer.next_event(&topics, &node).await;
    while !last.state.is_terminal() {
        last = observer.next_event(&topics, &node).await;
    }
    assert_eq!(last.state, TaskState::Succeeded);
    assert_eq!(last.output, b"still here");

    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), agent)
        .await
        .expect("the agent did not stop")
        .unwrap()
        .unwrap();
}
