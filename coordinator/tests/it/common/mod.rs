//! Shared helpers of the coordinator's integration tests: a real Mosquitto on
//! an ephemeral port, a fresh PostgreSQL database, a coordinator started in
//! process, and small wasm modules.
#![allow(
    dead_code,
    unused_imports,
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs
)]

use std::path::Path;

use std::time::{Duration, Instant};

use rumqttc::{AsyncClient, Event, EventLoop, MqttOptions, Packet, QoS};
use starling_coordinator::{CoordinatorConfig, Running};
use starling_proto::{
    decode, encode, Assignment, Capability, Channel, CpuInfo, FailureReason, LinkState, NodeId,
    NodeState, Status, TaskEvent, TaskState, Telemetry, Topics,
};

/// Uploads an artifact's bytes over REST and returns the JSON answer.
pub async fn upload(http: &reqwest::Client, rest: &str, bytes: Vec<u8>) -> serde_json::Value {
    post(http.post(format!("{rest}/api/v1/artifacts")).body(bytes)).await
}

/// GETs `url` and returns its JSON body.
pub async fn get_json(http: &reqwest::Client, url: &str) -> serde_json::Value {
    http.get(url).send().await.unwrap().json().await.unwrap()
}

/// Submits a task over REST and returns the JSON answer.
pub async fn submit(
    http: &reqwest::Client,
    rest: &str,
    task: &serde_json::Value,
) -> serde_json::Value {
    post(http.post(format!("{rest}/api/v1/tasks")).json(task)).await
}

async fn post(request: reqwest::RequestBuilder) -> serde_json::Value {
    request.send().await.unwrap().json().await.unwrap()
}

/// A module that exports `_start` and does nothing.
pub const MINIMAL_WAT: &str = r#"(module (func (export "_start")))"#;

pub fn minimal_wasm() -> Vec<u8> {
    wat::parse_str(MINIMAL_WAT).unwrap()
}

pub use starling_tests::{free_port, Mosquitto, PostgresDb};

/// Starts a coordinator in process on ephemeral ports.
pub async fn start_coordinator(dir: &Path, adjust: impl FnOnce(&mut CoordinatorConfig)) -> Running {
    let mut config = CoordinatorConfig::ephemeral(dir);
    // Stand-in agents here connect without enrolling; tests of broker
    // authentication turn this off in `adjust`.
    config.mqtt_allow_anonymous = true;
    adjust(&mut config);
    starling_coordinator::start(config).await.unwrap()
}

/// An MQTT client standing in for an agent; its event loop runs in the background.
pub async fn mqtt_client(
    host_port: &str,
    id: &str,
) -> (
    AsyncClient,
    tokio::sync::mpsc::UnboundedReceiver<rumqttc::Publish>,
) {
    let (host, port) = host_port
        .trim_start_matches("mqtt://")
        .rsplit_once(':')
        .unwrap();
    let mut options = MqttOptions::new(id, host, port.parse().unwrap());
    options
        .set_keep_alive(Duration::from_secs(5))
        .set_max_packet_size(2 << 20, 2 << 20);
    let (client, eventloop) = AsyncClient::new(options, 64);
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let (connected_tx, connected_rx) = tokio::sync::oneshot::channel();
    tokio::spawn(drive(eventloop, tx, connected_tx));
    tokio::time::timeout(Duration::from_secs(10), connected_rx)
        .await
        .expect("MQTT connect timed out")
        .unwrap();
    (client, rx)
}

async fn drive(
    mut eventloop: EventLoop,
    publishes: tokio::sync::mpsc::UnboundedSender<rumqttc::Publish>,
    connected: tokio::sync::oneshot::Sender<()>,
) {
    let mut connected = Some(connected);
    loop {
        match eventloop.poll().await {
            Ok(Event::Incoming(Packet::ConnAck(_))) => {
                if let Some(tx) = connected.take() {
                    let _ = tx.send(());
                }
            }
            Ok(Event::Incoming(Packet::Publish(publish))) => {
                let _ = publishes.send(publish);
            }
            Ok(_) => {}
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

pub fn capability(id: &str) -> Capability {
    starling_proto::fixtures::capability(id)
}

pub fn telemetry(id: &str, seq: u64) -> Telemetry {
    let mut telemetry = Telemetry {
        cpu_load: 0.5,
        energy_joules: 1.5,
        ..starling_proto::fixtures::telemetry(id, seq, seq * 1000)
    };
    telemetry.link.rtt_ms = Some(1.0);
    telemetry
}

pub fn status(id: &str, state: NodeState) -> Status {
    Status {
        v: starling_proto::PROTOCOL_VERSION,
        node_id: NodeId::new(id).unwrap(),
        state,
    }
}

/// Polls `check` every 50 ms until it returns `Some`, or panics after `timeout`.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A stand-in agent: answers each assignment with running + a result.
pub async fn stand_in_agent(mqtt_url: &str, id: &'static str) {
    let topics = Topics::default();
    let node = NodeId::new(id).unwrap();
    let (client, mut incoming) = mqtt_client(mqtt_url, id).await;
    client
        .subscribe(topics.node(&node, Channel::Assign), QoS::AtLeastOnce)
        .await
        .unwrap();
    client
        .publish(
            topics.node(&node, Channel::Capability),
            QoS::AtLeastOnce,
            true,
            encode(&capability(id)).unwrap(),
        )
        .await
        .unwrap();
    client
        .publish(
            topics.node(&node, Channel::Status),
            QoS::AtLeastOnce,
            true,
            encode(&status(id, NodeState::Online)).unwrap(),
        )
        .await
        .unwrap();
    // Telemetry every second, as a real agent sends it: the coordinator
    // suspects a node it has not heard from within its node timeout.
    let heartbeat = client.clone();
    tokio::spawn(async move {
        let topic = Topics::default().node(&NodeId::new(id).unwrap(), Channel::Telemetry);
        for seq in 1.. {
            let report = encode(&telemetry(id, seq)).unwrap();
            if heartbeat
                .publish(topic.clone(), QoS::AtMostOnce, false, report)
                .await
                .is_err()
            {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
    tokio::spawn(async move {
        while let Some(publish) = incoming.recv().await {
            let Ok(assignment) = decode::<Assignment>(&publish.payload) else {
                continue;
            };
            let events_topic = topics.node(&node, Channel::Events);
            let running = TaskEvent::state(
                assignment.task_id.clone(),
                assignment.attempt,
                node.clone(),
                TaskState::Running,
            );
            client
                .publish(
                    events_topic.clone(),
                    QoS::AtLeastOnce,
                    false,
                    encode(&running).unwrap(),
                )
                .await
                .unwrap();
            let event = if assignment.input == b"fail" {
                TaskEvent::failed(
                    assignment.task_id.clone(),
                    assignment.attempt,
                    node.clone(),
                    FailureReason::Trap,
                    "unreachable executed",
                )
            } else {
                let mut done = TaskEvent::state(
                    assignment.task_id.clone(),
                    assignment.attempt,
                    node.clone(),
                    TaskState::Succeeded,
                );
                done.output = [b"echo:".as_slice(), &assignment.input].concat();
                done
            };
            client
                .publish(
                    events_topic,
                    QoS::AtLeastOnce,
                    false,
                    encode(&event).unwrap(),
                )
                .await
                .unwrap();
        }
    });
}

/// A node's report key in these tests, fixed by its id (the agent makes a
/// random one at enrollment).
pub fn report_key(id: &str) -> ed25519_dalek::SigningKey {
    let mut seed = [7u8; 32];
    for (slot, byte) in seed.iter_mut().zip(id.bytes()) {
        *slot ^= byte;
    }
    ed25519_dalek::SigningKey::from_bytes(&seed)
}

/// The public half of [`report_key`], as enrollment sends it.
pub fn report_key_hex(id: &str) -> String {
    hex::encode(report_key(id).verifying_key().to_bytes())
}

/// A report counter above every one issued before in this process: Unix
/// microseconds, as agents count.
pub fn next_counter() -> u64 {
    static LAST: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    let previous = LAST.fetch_max(now, std::sync::atomic::Ordering::SeqCst);
    if previous >= now {
        LAST.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1
    } else {
        now
    }
}

/// `message` signed by node `id`'s [`report_key`] as a report of `channel`,
/// with a fresh counter: what an enrolled agent publishes.
pub fn sealed<M: starling_proto::Message>(
    id: &str,
    channel: starling_proto::ReportChannel,
    message: &M,
) -> Vec<u8> {
    encode(&starling_proto::SignedReport::sign(
        &report_key(id),
        NodeId::new(id).unwrap(),
        channel,
        next_counter(),
        encode(message).unwrap(),
    ))
    .unwrap()
}
