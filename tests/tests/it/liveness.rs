//! Liveness by the coordinator's clock, and every attempt ends, across real
//! processes over Mosquitto: one forged telemetry sample (`uptime_ms: 0`,
//! `seq: u64::MAX`) published with a node's own credentials does not keep
//! the node offline, and an attempt an online node does not hold (its
//! telemetry lists nothing) is ended and, attempts spent, fails with a
//! typed reason instead of staying `assigned` forever.

use std::process::Command;
use std::time::{Duration, Instant};

use starling_proto::{
    encode, Capability, Channel, CpuInfo, NodeId, NodeState, ReportChannel, Runtime, SignedReport,
    Status, Telemetry, Topics, PROTOCOL_VERSION,
};
use starling_tests::{modules, wasm_file, Agent, Coordinator, Mosquitto, Store};

/// Publishes `payload` on `topic` with `mosquitto_pub`, logged in as `user`.
fn publish_as(port: u16, user: Option<(&str, &str)>, topic: &str, payload: &[u8], retain: bool) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("payload");
    std::fs::write(&file, payload).unwrap();
    let mut command = Command::new("mosquitto_pub");
    command
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-q", "1"])
        .args(["-i", &format!("raw-{}", std::process::id())])
        .args(["-t", topic, "-f"])
        .arg(&file);
    if let Some((name, password)) = user {
        command.args(["-u", name, "-P", password]);
    }
    if retain {
        command.arg("-r");
    }
    let status = command.status().expect("mosquitto_pub is installed");
    assert!(status.success());
}

pub(crate) fn telemetry(node: &str, seq: u64, uptime_ms: u64) -> Telemetry {
    telemetry_listing(node, seq, uptime_ms, true)
}

/// Telemetry that lists no attempt, saying its list is `complete` or not.
fn telemetry_listing(node: &str, seq: u64, uptime_ms: u64, complete: bool) -> Telemetry {
    Telemetry {
        attempts_complete: complete,
        ..starling_proto::fixtures::telemetry(node, seq, uptime_ms)
    }
}

fn node_detail(coordinator: &Coordinator, node: &str) -> serde_json::Value {
    let (status, body) = coordinator.http("GET", &format!("/api/v1/nodes/{node}"), None);
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

#[test]
fn one_forged_telemetry_sample_does_not_keep_a_node_offline() {
    let _turn = crate::alongside();
    let broker = Mosquitto::start();
    let coordinator =
        Coordinator::start(Some(&broker.url), Store::Sqlite, &["--node-timeout", "2s"]);
    let agent = Agent::start(&coordinator, &broker.url, "victim", "");
    coordinator.wait_for_nodes(1, Duration::from_secs(60));
    // The attacker holds the node's own MQTT credentials.
    let credentials: serde_json::Value =
        serde_json::from_slice(&std::fs::read(agent.dir.path().join("credentials.json")).unwrap())
            .unwrap();
    let user = (
        credentials["mqtt_username"].as_str().unwrap(),
        credentials["mqtt_password"].as_str().unwrap(),
    );
    let topic = Topics::default().node(&NodeId::new("victim").unwrap(), Channel::Telemetry);
    let forged = encode(&telemetry("victim", u64::MAX, 0)).unwrap();
    publish_as(broker.port, Some(user), &topic, &forged, false);

    // The forged sample reached the registry (when nothing refuses it on the
    // way): it is shown until a later real one replaces it.
    let start = Instant::now();
    let mut seen_forged = false;
    while start.elapsed() < Duration::from_secs(1) && !seen_forged {
        let node = node_detail(&coordinator, "victim");
        seen_forged = node["telemetry"]["seq"].as_u64() == Some(u64::MAX);
        std::thread::sleep(Duration::from_millis(50));
    }

    // Three node timeouts later the node was online throughout, and its real
    // telemetry is shown again, moving on.
    let start = Instant::now();
    let mut last = node_detail(&coordinator, "victim");
    while start.elapsed() < Duration::from_secs(6) {
        assert_eq!(
            last["online"],
            true,
            "the node went offline after a forged sample (seen: {seen_forged}): {last:#}\n{}",
            coordinator.process.log()
        );
        std::thread::sleep(Duration::from_millis(250));
        last = node_detail(&coordinator, "victim");
    }
    let first_seq = last["telemetry"]["seq"].as_u64().unwrap();
    assert!(first_seq < u64::MAX, "real telemetry is shown: {last:#}");
    std::thread::sleep(Duration::from_millis(1_500));
    let later = node_detail(&coordinator, "victim");
    assert!(
        later["telemetry"]["seq"].as_u64().unwrap() > first_seq,
        "later real telemetry is shown: {later:#}"
    );
}

/// A node enrolled with its own report key (made here, as an agent makes
/// its own), signing what it publishes with a rising counter.
pub(crate) struct Signer {
    node: NodeId,
    key: ed25519_dalek::SigningKey,
    counter: u64,
}

impl Signer {
    pub(crate) fn enroll(coordinator: &Coordinator, node: &str) -> Self {
        let key = ed25519_dalek::SigningKey::from_bytes(&[0x42; 32]);
        let public: String = key
            .verifying_key()
            .to_bytes()
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect();
        let body = serde_json::json!({
            "join_token": coordinator.join_token(),
            "node_id": node,
            "report_key": public,
        });
        let url = format!("{}/api/v1/enroll", coordinator.rest);
        let status = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                reqwest::Client::new()
                    .post(url)
                    .json(&body)
                    .send()
                    .await
                    .unwrap()
                    .status()
            });
        assert!(status.is_success(), "enrolling {node}: {status}");
        let counter = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros() as u64;
        Self {
            node: NodeId::new(node).unwrap(),
            key,
            counter,
        }
    }

    pub(crate) fn seal<M: starling_proto::Message>(
        &mut self,
        channel: ReportChannel,
        message: &M,
    ) -> Vec<u8> {
        self.counter += 1;
        encode(&SignedReport::sign(
            &self.key,
            self.node.clone(),
            channel,
            self.counter,
            encode(message).unwrap(),
        ))
        .unwrap()
    }
}

/// A node that says it is online, advertises wasm, and whose telemetry
/// lists no attempt, whatever it is sent: it never runs anything.
pub(crate) struct HollowNode {
    /// Flood samples published so far.
    pub(crate) published: std::sync::Arc<std::sync::atomic::AtomicU64>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HollowNode {
    fn start(coordinator: &Coordinator, port: u16, node: &str) -> Self {
        Self::start_as(coordinator, port, node, 4, true)
    }

    /// A hollow node of `cores` cores at 3 GHz whose telemetry says its
    /// (empty) list of attempts is `complete`, or not: with `false`, the
    /// black hole of issue 33 (it keeps what it is given, says nothing, and
    /// its lists never prove that it does not hold something).
    fn start_as(
        coordinator: &Coordinator,
        port: u16,
        node: &str,
        cores: u16,
        complete: bool,
    ) -> Self {
        Self::start_sending(coordinator, port, node, cores, complete, None)
    }

    /// A hollow node that floods: `per_second` signed, valid telemetry
    /// samples a second (each a fresh counter), from the moment it is up. It
    /// offers no runtime, so no task is placed on it.
    pub(crate) fn start_flooding(
        coordinator: &Coordinator,
        port: u16,
        node: &str,
        per_second: u32,
    ) -> Self {
        Self::start_sending(coordinator, port, node, 4, true, Some(per_second))
    }

    fn start_sending(
        coordinator: &Coordinator,
        port: u16,
        node: &str,
        cores: u16,
        complete: bool,
        flood_per_second: Option<u32>,
    ) -> Self {
        let id = NodeId::new(node).unwrap();
        let mut signer = Signer::enroll(coordinator, node);
        let topics = Topics::default();
        let mut capability = Capability {
            cpu: CpuInfo {
                model: "hollow".try_into().unwrap(),
                cores,
                min_mhz: 800,
                max_mhz: 3000,
                speed: None,
                speed_source: Default::default(),
            },
            runtimes: Default::default(),
            ..starling_proto::fixtures::capability(node)
        };
        // A flooding node runs nothing, so that no task goes to it: its
        // flood is all it does.
        if flood_per_second.is_none() {
            capability.runtimes.push(Runtime::Wasm).unwrap();
        }
        publish_as(
            port,
            None,
            &topics.node(&id, Channel::Capability),
            &signer.seal(ReportChannel::Capability, &capability),
            true,
        );
        let status = Status {
            v: PROTOCOL_VERSION,
            node_id: id.clone(),
            state: NodeState::Online,
        };
        publish_as(
            port,
            None,
            &topics.node(&id, Channel::Status),
            &signer.seal(ReportChannel::Status, &status),
            true,
        );
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopping = stop.clone();
        let published = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counted = published.clone();
        let node = node.to_string();
        let thread = std::thread::spawn(move || {
            let topic = topics.node(&id, Channel::Telemetry);
            let started = Instant::now();
            if let Some(per_second) = flood_per_second {
                flood(port, &topic, per_second, &stopping, &counted, |seq| {
                    let uptime = started.elapsed().as_millis() as u64;
                    signer.seal(
                        ReportChannel::Telemetry,
                        &telemetry_listing(&node, seq, uptime, complete),
                    )
                });
                return;
            }
            let mut seq = 0;
            // Bounded: the test is over well within a minute.
            while !stopping.load(std::sync::atomic::Ordering::SeqCst)
                && started.elapsed() < Duration::from_secs(90)
            {
                seq += 1;
                let uptime = started.elapsed().as_millis() as u64;
                let sample = signer.seal(
                    ReportChannel::Telemetry,
                    &telemetry_listing(&node, seq, uptime, complete),
                );
                publish_as(port, None, &topic, &sample, false);
                std::thread::sleep(Duration::from_millis(300));
            }
        });
        Self {
            published,
            stop,
            thread: Some(thread),
        }
    }
}

/// Publishes `per_second` messages a second (QoS 0, one MQTT connection),
/// each made by `sample(seq)` in batches of a tenth of a second, until
/// `stop` (or 90 s).
fn flood(
    port: u16,
    topic: &str,
    per_second: u32,
    stop: &std::sync::atomic::AtomicBool,
    published: &std::sync::atomic::AtomicU64,
    mut sample: impl FnMut(u64) -> Vec<u8>,
) {
    let mut options =
        rumqttc::MqttOptions::new(format!("flood-{}", std::process::id()), "127.0.0.1", port);
    options.set_keep_alive(Duration::from_secs(30));
    let (client, mut connection) = rumqttc::Client::new(options, 1_024);
    std::thread::spawn(move || for _ in connection.iter() {});
    let started = Instant::now();
    let batch = u64::from(per_second / 10).max(1);
    let mut seq = 0_u64;
    let mut tick = 0_u32;
    while !stop.load(std::sync::atomic::Ordering::SeqCst)
        && started.elapsed() < Duration::from_secs(90)
    {
        for _ in 0..batch {
            seq += 1;
            if client
                .publish(topic, rumqttc::QoS::AtMostOnce, false, sample(seq))
                .is_err()
            {
                return;
            }
            published.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        tick += 1;
        let due = started + Duration::from_millis(100) * tick;
        std::thread::sleep(due.saturating_duration_since(Instant::now()));
    }
    let _ = client.disconnect();
}

impl Drop for HollowNode {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[test]
fn an_attempt_its_online_node_does_not_hold_ends_instead_of_staying_assigned() {
    let _turn = crate::alongside();
    let broker = Mosquitto::start();
    let coordinator = Coordinator::start(
        Some(&broker.url),
        Store::Sqlite,
        // The attempt grace is six node timeouts: 6 s here.
        &["--node-timeout", "1s"],
    );
    let _hollow = HollowNode::start(&coordinator, broker.port, "hollow");
    coordinator.wait_for_nodes(1, Duration::from_secs(30));
    let dir = tempfile::tempdir().unwrap();
    let echo = wasm_file(dir.path(), "echo", modules::ECHO);
    let submitted = coordinator.cli_json(
        &["run", echo.to_str().unwrap(), "--input", "-"],
        Some(b"nobody runs this"),
    );
    let id = submitted["id"].as_str().unwrap().to_string();

    // The only node takes every attempt and lists none: each is ended after
    // the grace and the task placed again, until its attempts are spent.
    let start = Instant::now();
    let task = loop {
        let task = coordinator.task(&id);
        if task["state"] == "failed" {
            break task;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the task stayed {} on an online node that does not hold it: {task:#}\n{}",
            task["state"],
            coordinator.process.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(task["reason"], "unknown_to_node", "{task:#}");
    assert_eq!(
        task["attempt"], 3,
        "three attempts (the default), each ended: {task:#}"
    );
    let (_, metrics) = coordinator.http("GET", "/metrics", None);
    assert!(
        metrics.contains("starling_attempts_ended_total{reason=\"unknown_to_node\"} 3"),
        "{metrics}"
    );
}

/// Issue 33, item 4: a black hole (enrolled, online, advertising 64 cores,
/// reporting telemetry whose attempt lists are never complete, answering
/// nothing) is given four tasks. Each attempt is ended when the node has
/// said nothing about it for the grace (6 s here) while reporting, and the
/// task runs on an honest node; the black hole gets no more work. Before,
/// the four stayed `assigned` for as long as anyone watched: the wall-time
/// rule starts at `running`, and reconciling needs a complete list.
#[test]
fn a_black_hole_node_loses_the_tasks_it_never_answers_and_gets_no_more() {
    let _turn = crate::alongside();
    let broker = Mosquitto::start();
    let coordinator =
        Coordinator::start(Some(&broker.url), Store::Sqlite, &["--node-timeout", "1s"]);
    let _hole = HollowNode::start_as(&coordinator, broker.port, "hole", 64, false);
    coordinator.wait_for_nodes(1, Duration::from_secs(30));
    let dir = tempfile::tempdir().unwrap();
    let echo = wasm_file(dir.path(), "echo", modules::ECHO);
    let submit = |input: &str| {
        coordinator.cli_json(
            &[
                "run",
                echo.to_str().unwrap(),
                "--input",
                "-",
                "--timeout",
                "10s",
            ],
            Some(input.as_bytes()),
        )["id"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let submitted = Instant::now();
    let ids: Vec<String> = (0..4).map(|i| submit(&format!("task {i}"))).collect();
    for id in &ids {
        coordinator.wait_task(
            id,
            Duration::from_secs(10),
            "given to the black hole",
            |task| task["state"] == "assigned" && task["node_id"] == "hole",
        );
    }
    // The honest node's own start (enrollment, its calibration and disk
    // probe) is not what the bound below is about: it is taken out.
    let starting = Instant::now();
    let _honest = Agent::start(&coordinator, &broker.url, "honest", "");
    coordinator.wait_for_nodes(2, Duration::from_secs(30));
    let honest_start = starting.elapsed();
    for id in &ids {
        let task = coordinator.wait_task(id, Duration::from_secs(40), "run elsewhere", |task| {
            task["state"] == "succeeded"
        });
        assert_eq!(task["node_id"], "honest", "{task:#}");
        assert_eq!(task["attempt"], 2, "{task:#}");
    }
    let took = submitted.elapsed().saturating_sub(honest_start);
    // The grace from the black hole's first report after each assignment,
    // a review tick, a round and the run: well within the 10 s wall limit
    // plus the grace the wall-time rule would have given a running task.
    assert!(
        took < Duration::from_secs(20),
        "the black hole's four tasks ran elsewhere only after {took:?} (the honest node's start, {honest_start:?}, not counted)"
    );
    let (_, metrics) = coordinator.http("GET", "/metrics", None);
    assert!(
        metrics.contains("starling_attempts_ended_total{reason=\"unanswered\"} 4"),
        "{metrics}"
    );
    assert!(coordinator
        .process
        .log()
        .contains("the node leaves its assignments unanswered"));
    // Suspected, it is offered nothing: the next task goes to the honest
    // node at once, though the black hole claims 64 free cores.
    let next = submit("after");
    let task = coordinator.wait_task(&next, Duration::from_secs(10), "run", |task| {
        task["state"] == "succeeded"
    });
    assert_eq!(task["node_id"], "honest", "{task:#}");
    assert_eq!(task["attempt"], 1, "{task:#}");
}
