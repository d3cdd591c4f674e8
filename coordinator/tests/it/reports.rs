//! Reports that prove their sender, whatever the broker: the coordinator runs
//! its broker wide open (`--mqtt-allow-anonymous`: anyone may connect, read
//! and publish on every topic, as a compromised or misconfigured broker
//! would), a node enrolls with its report key, and an attacker who can
//! publish anywhere and read everything tries to speak for it.

use crate::common;

use std::time::Duration;

use reqwest::StatusCode;
use rumqttc::QoS;
use serde_json::{json, Value};
use starling_proto::{
    decode, encode, Assignment, Channel, NodeId, NodeState, ReportChannel, TaskEvent, TaskId,
    TaskState, Topics,
};

const NODE: &str = "edge-b";

/// The `starling_reports_refused_total` count for `reason`.
async fn refused(http: &reqwest::Client, rest: &str, reason: &str) -> u64 {
    let text = http
        .get(format!("{rest}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let prefix = format!("starling_reports_refused_total{{reason=\"{reason}\"}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {prefix} in /metrics"))
        .trim()
        .parse()
        .unwrap()
}

async fn enroll(
    http: &reqwest::Client,
    rest: &str,
    node: &str,
    report_key: &str,
) -> reqwest::Response {
    let join: Value = http
        .post(format!("{rest}/api/v1/join-tokens"))
        .json(&json!({}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    http.post(format!("{rest}/api/v1/enroll"))
        .json(&json!({"join_token": join["token"], "node_id": node, "report_key": report_key}))
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn enrollment_refuses_a_report_key_that_is_not_an_ed25519_key() {
    let dir = tempfile::tempdir().unwrap();
    let running = common::start_coordinator(dir.path(), |_| {}).await;
    let rest = running.rest_url();
    let http = reqwest::Client::new();
    // Not hex, too short, and the identity point (a key of small order that
    // would accept forged signatures).
    let identity = format!("01{}", "00".repeat(31));
    for key in ["zz", "abcd", identity.as_str()] {
        let answer = enroll(&http, &rest, "pi-9", key).await;
        assert_eq!(answer.status(), StatusCode::BAD_REQUEST, "{key}");
        let body: Value = answer.json().await.unwrap();
        assert_eq!(body["error"], "invalid_report_key", "{body}");
    }
    assert!(running.store().node_credentials().await.unwrap().is_empty());
    running.shutdown().await;
}

#[tokio::test]
async fn forged_reports_are_refused_and_counted_on_a_broker_that_lets_anyone_publish() {
    let dir = tempfile::tempdir().unwrap();
    let running = common::start_coordinator(dir.path(), |config| {
        config.node_timeout = Duration::from_secs(600);
    })
    .await;
    let rest = running.rest_url();
    let mqtt = running.mqtt_url().to_string();
    let http = reqwest::Client::new();
    let topics = Topics::default();
    let node = NodeId::new(NODE).unwrap();
    let topic = |channel| topics.node(&node, channel);

    assert_eq!(
        enroll(&http, &rest, NODE, &common::report_key_hex(NODE))
            .await
            .status(),
        StatusCode::CREATED
    );

    // The attacker reads everything on the broker, B's traffic included.
    let (mallory, mut overheard) = common::mqtt_client(&mqtt, "mallory").await;
    mallory.subscribe("#", QoS::AtLeastOnce).await.unwrap();
    // B, speaking for itself with signed reports.
    let (b, mut b_incoming) = common::mqtt_client(&mqtt, NODE).await;
    b.subscribe(topic(Channel::Assign), QoS::AtLeastOnce)
        .await
        .unwrap();
    let mut capability = common::capability(NODE);
    capability.cpu.cores = 4;
    b.publish(
        topic(Channel::Capability),
        QoS::AtLeastOnce,
        true,
        common::sealed(NODE, ReportChannel::Capability, &capability),
    )
    .await
    .unwrap();
    b.publish(
        topic(Channel::Status),
        QoS::AtLeastOnce,
        true,
        common::sealed(
            NODE,
            ReportChannel::Status,
            &common::status(NODE, NodeState::Online),
        ),
    )
    .await
    .unwrap();
    b.publish(
        topic(Channel::Telemetry),
        QoS::AtLeastOnce,
        false,
        common::sealed(NODE, ReportChannel::Telemetry, &common::telemetry(NODE, 1)),
    )
    .await
    .unwrap();
    let nodes_url = format!("{rest}/api/v1/nodes/{NODE}");
    common::eventually(Duration::from_secs(10), "edge-b online", || {
        let (http, url) = (http.clone(), nodes_url.clone());
        async move { (common::get_json(&http, &url).await["online"] == true).then_some(()) }
    })
    .await;

    // A task runs on B.
    let stored = common::upload(&http, &rest, common::minimal_wasm()).await;
    let task = common::submit(&http, &rest, &json!({"artifact": stored["digest"]})).await;
    let id = task["id"].as_str().unwrap().to_string();
    let assignment = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let publish = b_incoming.recv().await.unwrap();
            if let Ok(assignment) = decode::<Assignment>(&publish.payload) {
                return assignment;
            }
        }
    })
    .await
    .expect("B got its assignment");
    let task_id = TaskId::new(&id).unwrap();
    let running_event = TaskEvent::state(
        task_id.clone(),
        assignment.attempt,
        node.clone(),
        TaskState::Running,
    );
    let genuine_running = common::sealed(NODE, ReportChannel::Events, &running_event);
    b.publish(
        topic(Channel::Events),
        QoS::AtLeastOnce,
        false,
        genuine_running.clone(),
    )
    .await
    .unwrap();
    let task_url = format!("{rest}/api/v1/tasks/{id}");
    common::eventually(Duration::from_secs(10), "task running", || {
        let (http, url) = (http.clone(), task_url.clone());
        async move { (common::get_json(&http, &url).await["state"] == "running").then_some(()) }
    })
    .await;
    // What the attacker overheard of B: a signed telemetry sample.
    let overheard_telemetry = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let publish = overheard.recv().await.unwrap();
            if publish.topic == topic(Channel::Telemetry) {
                return publish.payload.to_vec();
            }
        }
    })
    .await
    .expect("the open broker shows B's telemetry to everyone");

    let before: Vec<u64> = refusal_counts(&http, &rest).await;

    // The forgeries, on B's own topics.
    let mut forged_done = TaskEvent::state(
        task_id.clone(),
        assignment.attempt,
        node.clone(),
        TaskState::Succeeded,
    );
    forged_done.output = b"mallory's output".to_vec();
    let mut big = common::capability(NODE);
    big.cpu.cores = 64;
    let mallory_key = common::report_key("mallory");
    let signed_by_mallory = encode(&starling_proto::SignedReport::sign(
        &mallory_key,
        node.clone(),
        ReportChannel::Events,
        common::next_counter(),
        encode(&forged_done).unwrap(),
    ))
    .unwrap();
    let forgeries: Vec<(Channel, Vec<u8>)> = vec![
        // Unsigned: a result, an offline status, a bigger capability.
        (Channel::Events, encode(&forged_done).unwrap()),
        (
            Channel::Status,
            encode(&common::status(NODE, NodeState::Offline)).unwrap(),
        ),
        (Channel::Capability, encode(&big).unwrap()),
        // Signed, with the attacker's key, in B's name.
        (Channel::Events, signed_by_mallory),
        // B's genuine reports sent again.
        (Channel::Events, genuine_running),
        (Channel::Telemetry, overheard_telemetry.clone()),
        // B's genuine telemetry moved to its status topic.
        (Channel::Status, overheard_telemetry),
    ];
    for (channel, payload) in forgeries {
        mallory
            .publish(topic(channel), QoS::AtLeastOnce, false, payload)
            .await
            .unwrap();
    }
    // A forged cancel is the coordinator's channel: B would act on it only
    // if signed by the coordinator; ingest never consumes it.
    let after = common::eventually(Duration::from_secs(10), "seven refusals counted", || {
        let (http, rest, before) = (http.clone(), rest.clone(), before.clone());
        async move {
            let now = refusal_counts(&http, &rest).await;
            let added: u64 = now.iter().zip(&before).map(|(n, b)| n - b).sum();
            (added >= 7).then_some(now)
        }
    })
    .await;
    let added = |i: usize| after[i] - before[i];
    // Order of REASONS: unsigned, no_key, other_node, wrong_channel, signature, replay.
    assert_eq!(added(0), 3, "unsigned");
    assert_eq!(added(3), 1, "wrong_channel");
    assert_eq!(added(4), 1, "signature");
    assert_eq!(added(5), 2, "replay");

    // Nothing the attacker said took effect: the task still runs on B, B is
    // online with its own capability.
    let task = common::get_json(&http, &task_url).await;
    assert_eq!(task["state"], "running", "{task}");
    let shown = common::get_json(&http, &nodes_url).await;
    assert_eq!(shown["online"], true, "{shown}");
    assert_eq!(shown["capability"]["cpu"]["cores"], 4, "{shown}");

    // B's own result is the one recorded.
    let mut done = TaskEvent::state(
        task_id,
        assignment.attempt,
        node.clone(),
        TaskState::Succeeded,
    );
    done.output = b"b's output".to_vec();
    done.exit_code = Some(0);
    b.publish(
        topic(Channel::Events),
        QoS::AtLeastOnce,
        false,
        common::sealed(NODE, ReportChannel::Events, &done),
    )
    .await
    .unwrap();
    let finished = common::eventually(Duration::from_secs(10), "task succeeded", || {
        let (http, url) = (http.clone(), task_url.clone());
        async move {
            let task = common::get_json(&http, &url).await;
            (task["state"] == "succeeded").then_some(task)
        }
    })
    .await;
    assert_eq!(finished["output_text"], "b's output");

    // A node that never enrolled has no key: on this development broker its
    // unsigned reports are heard, as before signing existed.
    common::stand_in_agent(&mqtt, "dev-1").await;
    common::eventually(Duration::from_secs(10), "dev-1 listed", || {
        let (http, url) = (http.clone(), format!("{rest}/api/v1/nodes/dev-1"));
        async move { (common::get_json(&http, &url).await["id"] == "dev-1").then_some(()) }
    })
    .await;
    running.shutdown().await;
}

/// Every refusal count, in the order of `ReportRefused::REASONS`.
async fn refusal_counts(http: &reqwest::Client, rest: &str) -> Vec<u64> {
    let mut counts = Vec::new();
    for reason in [
        "unsigned",
        "no_key",
        "other_node",
        "wrong_channel",
        "signature",
        "replay",
    ] {
        counts.push(refused(http, rest, reason).await);
    }
    counts
}
