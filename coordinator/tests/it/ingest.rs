//! MQTT ingest against a real Mosquitto, and the embedded rumqttd broker: nodes
//! appear from their reports, bad messages change nothing, and a task goes
//! through assignment, events, node loss and cancel with a stand-in agent.

use crate::common;

use std::time::Duration;

use reqwest::StatusCode;
use rumqttc::{AsyncClient, QoS};
use serde_json::{json, Value};
use starling_proto::{
    decode, encode, Assignment, Cancel, Channel, NodeId, NodeState, TaskEvent, TaskId, TaskState,
    Topics,
};

const WAIT: Duration = Duration::from_secs(15);

async fn get_json(http: &reqwest::Client, url: &str) -> (StatusCode, Value) {
    let response = http.get(url).send().await.unwrap();
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn publish(client: &AsyncClient, topic: String, retain: bool, bytes: Vec<u8>) {
    client
        .publish(topic, QoS::AtLeastOnce, retain, bytes)
        .await
        .unwrap();
}

async fn register_node(client: &AsyncClient, id: &str) {
    let topics = Topics::default();
    let node = NodeId::new(id).unwrap();
    // Status first, as agents do: the coordinator holds it until the capability arrives.
    publish(
        client,
        topics.node(&node, Channel::Status),
        true,
        encode(&common::status(id, NodeState::Online)).unwrap(),
    )
    .await;
    publish(
        client,
        topics.node(&node, Channel::Capability),
        true,
        encode(&common::capability(id)).unwrap(),
    )
    .await;
    publish(
        client,
        topics.node(&node, Channel::Telemetry),
        false,
        encode(&common::telemetry(id, 1)).unwrap(),
    )
    .await;
}

async fn wait_for_node(http: &reqwest::Client, rest: &str, id: &str, online: bool) -> Value {
    let url = format!("{rest}/api/v1/nodes");
    common::eventually(WAIT, "the node in GET /nodes", || {
        let http = http.clone();
        let url = url.clone();
        async move {
            let (_, nodes) = get_json(&http, &url).await;
            nodes["nodes"]
                .as_array()?
                .iter()
                .find(|n| n["id"] == id && n["online"] == online && !n["cpu_load"].is_null())
                .cloned()
        }
    })
    .await
}

#[tokio::test]
async fn reports_over_mosquitto_register_nodes_and_garbage_changes_nothing() {
    let broker = common::Mosquitto::start();
    let dir = tempfile::tempdir().unwrap();
    let running = common::start_coordinator(dir.path(), |c| {
        c.broker = Some(broker.url.clone());
        c.node_timeout = Duration::from_secs(600);
    })
    .await;
    assert!(!running.embedded_broker());
    assert_eq!(running.mqtt_url(), broker.url);
    let rest = running.rest_url();
    let http = reqwest::Client::new();

    let (client, _incoming) = common::mqtt_client(&broker.url, "test-agent-pi-1").await;
    register_node(&client, "pi-1").await;
    let node = wait_for_node(&http, &rest, "pi-1", true).await;
    assert_eq!(node["cores"], 4);
    assert_eq!(node["arch"], "x86_64");
    let (_, detail_before) = get_json(&http, &format!("{rest}/api/v1/nodes/pi-1")).await;
    assert_eq!(detail_before["status"], "online");
    assert_eq!(detail_before["telemetry"]["seq"], 1);

    // Garbage on every topic of a known and an unknown node, a report for an
    // unknown node, a report whose payload names another node, and an event
    // for an unknown task.
    let topics = Topics::default();
    for id in ["pi-1", "ghost"] {
        let node = NodeId::new(id).unwrap();
        for channel in Channel::ALL {
            for garbage in [&b"\xff\xff\xff"[..], b"not cbor at all", &[0x9f; 64]] {
                publish(
                    &client,
                    topics.node(&node, channel),
                    false,
                    garbage.to_vec(),
                )
                .await;
            }
        }
    }
    let ghost = NodeId::new("ghost").unwrap();
    publish(
        &client,
        topics.node(&ghost, Channel::Telemetry),
        false,
        encode(&common::telemetry("ghost", 9)).unwrap(),
    )
    .await;
    publish(
        &client,
        topics.node(&ghost, Channel::Status),
        false,
        encode(&common::status("ghost", NodeState::Online)).unwrap(),
    )
    .await;
    let pi = NodeId::new("pi-1").unwrap();
    publish(
        &client,
        topics.node(&pi, Channel::Telemetry),
        false,
        encode(&common::telemetry("impostor", 50)).unwrap(),
    )
    .await;
    let stray = TaskEvent::state(
        TaskId::new("no-such-task").unwrap(),
        1,
        pi.clone(),
        TaskState::Succeeded,
    );
    publish(
        &client,
        topics.node(&pi, Channel::Events),
        false,
        encode(&stray).unwrap(),
    )
    .await;
    // A good report after the garbage proves the handler kept going, in order.
    publish(
        &client,
        topics.node(&pi, Channel::Telemetry),
        false,
        encode(&common::telemetry("pi-1", 2)).unwrap(),
    )
    .await;
    let url = format!("{rest}/api/v1/nodes/pi-1");
    let detail_after = common::eventually(WAIT, "telemetry seq 2", || {
        let http = http.clone();
        let url = url.clone();
        async move {
            let (_, detail) = get_json(&http, &url).await;
            (detail["telemetry"]["seq"] == 2).then_some(detail)
        }
    })
    .await;
    assert_eq!(detail_after["capability"], detail_before["capability"]);
    assert_eq!(detail_after["status"], "online");
    let (_, nodes) = get_json(&http, &format!("{rest}/api/v1/nodes")).await;
    assert_eq!(nodes["nodes"].as_array().unwrap().len(), 1, "{nodes}");
    let (_, tasks) = get_json(&http, &format!("{rest}/api/v1/tasks")).await;
    assert_eq!(tasks["tasks"], json!([]));
    let metrics = http
        .get(format!("{rest}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let ignored: u64 = metrics
        .lines()
        .find_map(|line| line.strip_prefix("starling_mqtt_messages_ignored_total "))
        .unwrap()
        .parse()
        .unwrap();
    // 3 kinds of garbage on the 4 channels the coordinator consumes, for 2
    // nodes; 1 unknown-node telemetry, 1 mismatched telemetry, 1 event for an
    // unknown task (the ghost's status is held, not refused).
    assert_eq!(ignored, 3 * 4 * 2 + 3, "{metrics}");
    assert!(metrics.contains("starling_nodes_online 1"), "{metrics}");
    let (status, health) = get_json(&http, &format!("{rest}/api/v1/health")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(health["nodes_online"], 1);
    running.shutdown().await;
}

async fn next_message<M: starling_proto::Message>(
    incoming: &mut tokio::sync::mpsc::UnboundedReceiver<rumqttc::Publish>,
    topic: &str,
) -> M {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let publish = tokio::time::timeout_at(deadline, incoming.recv())
            .await
            .unwrap_or_else(|_| panic!("nothing on {topic}"))
            .unwrap();
        if publish.topic == topic {
            return decode(&publish.payload).unwrap();
        }
    }
}

async fn task_state(http: &reqwest::Client, rest: &str, id: &str, state: &str) -> Value {
    let url = format!("{rest}/api/v1/tasks/{id}");
    common::eventually(WAIT, &format!("task {id} {state}"), || {
        let http = http.clone();
        let url = url.clone();
        async move {
            let (_, task) = get_json(&http, &url).await;
            (task["state"] == state).then_some(task)
        }
    })
    .await
}

#[tokio::test]
async fn a_task_runs_through_a_stand_in_agent_over_the_embedded_broker() {
    let dir = tempfile::tempdir().unwrap();
    // The stand-in sends one telemetry report, not one a second: a long node
    // timeout keeps it from being suspected mid-test.
    let running = common::start_coordinator(dir.path(), |c| {
        c.max_attempts = 2;
        c.node_timeout = Duration::from_secs(600);
    })
    .await;
    assert!(running.embedded_broker());
    let rest = running.rest_url();
    let http = reqwest::Client::new();
    let topics = Topics::default();
    let node = NodeId::new("edge-1").unwrap();

    let (agent, mut incoming) = common::mqtt_client(running.mqtt_url(), "agent-edge-1").await;
    agent
        .subscribe(topics.node(&node, Channel::Assign), QoS::AtLeastOnce)
        .await
        .unwrap();
    agent
        .subscribe(topics.node(&node, Channel::Cancel), QoS::AtLeastOnce)
        .await
        .unwrap();
    register_node(&agent, "edge-1").await;
    wait_for_node(&http, &rest, "edge-1", true).await;

    let module = common::minimal_wasm();
    let stored: Value = common::upload(&http, &rest, module.clone()).await;
    let digest = stored["digest"].as_str().unwrap().to_string();
    let task: Value = common::submit(
        &http,
        &rest,
        &json!({"artifact": digest, "input_text": "ping", "args": ["x"], "deadline_ms": 30000}),
    )
    .await;
    let id = task["id"].as_str().unwrap().to_string();

    // The assignment names the task, the first attempt and where to fetch the module.
    let assign_topic = topics.node(&node, Channel::Assign);
    let assignment: Assignment = next_message(&mut incoming, &assign_topic).await;
    assert_eq!(assignment.task_id.as_str(), id);
    assert_eq!(assignment.attempt, 1);
    assert_eq!(assignment.input, b"ping");
    assert_eq!(assignment.args.len(), 1);
    assert!(assignment.deadline_unix_ms.is_some());
    let fetched = http
        .get(assignment.artifact_url.as_str())
        .send()
        .await
        .unwrap();
    assert_eq!(fetched.bytes().await.unwrap().to_vec(), module);
    let assigned = task_state(&http, &rest, &id, "assigned").await;
    assert_eq!(assigned["node_id"], "edge-1");
    assert!(assigned["explanation"]["summary"].is_string(), "{assigned}");

    // Events, each delivered twice: recorded once.
    let task_id = TaskId::new(&id).unwrap();
    let events_topic = topics.node(&node, Channel::Events);
    let mut done = TaskEvent::state(task_id.clone(), 1, node.clone(), TaskState::Succeeded);
    done.output = b"pong\n".to_vec();
    done.exit_code = Some(0);
    for event in [
        TaskEvent::state(task_id.clone(), 1, node.clone(), TaskState::Accepted),
        TaskEvent::state(task_id.clone(), 1, node.clone(), TaskState::Running),
        done,
    ] {
        for _ in 0..2 {
            publish(&agent, events_topic.clone(), false, encode(&event).unwrap()).await;
        }
    }
    let finished = task_state(&http, &rest, &id, "succeeded").await;
    assert_eq!(finished["output_text"], "pong\n");
    assert_eq!(finished["output_base64"], "cG9uZwo=");
    assert_eq!(finished["exit_code"], 0);
    let states: Vec<&str> = finished["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["accepted", "running", "succeeded"]);

    // A second task; its node vanishes (last will): a new attempt follows.
    let second: Value = common::submit(&http, &rest, &json!({"artifact": digest})).await;
    let second_id = second["id"].as_str().unwrap().to_string();
    let first_try: Assignment = next_message(&mut incoming, &assign_topic).await;
    assert_eq!(first_try.task_id.as_str(), second_id);
    assert_eq!(first_try.attempt, 1);
    let status_topic = topics.node(&node, Channel::Status);
    publish(
        &agent,
        status_topic.clone(),
        true,
        encode(&common::status("edge-1", NodeState::Offline)).unwrap(),
    )
    .await;
    let requeued = task_state(&http, &rest, &second_id, "pending").await;
    assert_eq!(requeued["attempts"][0]["state"], "lost");
    publish(
        &agent,
        status_topic.clone(),
        true,
        encode(&common::status("edge-1", NodeState::Online)).unwrap(),
    )
    .await;
    let second_try: Assignment = next_message(&mut incoming, &assign_topic).await;
    assert_eq!(second_try.task_id.as_str(), second_id);
    assert_eq!(second_try.attempt, 2);
    // An event of the lost attempt changes nothing.
    let stale = TaskEvent::state(
        second_try.task_id.clone(),
        1,
        node.clone(),
        TaskState::Succeeded,
    );
    publish(&agent, events_topic.clone(), false, encode(&stale).unwrap()).await;

    // Cancel while it runs: the node gets a Cancel for attempt 2.
    publish(
        &agent,
        events_topic.clone(),
        false,
        encode(&TaskEvent::state(
            second_try.task_id.clone(),
            2,
            node.clone(),
            TaskState::Running,
        ))
        .unwrap(),
    )
    .await;
    task_state(&http, &rest, &second_id, "running").await;
    let response = http
        .post(format!("{rest}/api/v1/tasks/{second_id}/cancel"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    let cancel: Cancel = next_message(&mut incoming, &topics.node(&node, Channel::Cancel)).await;
    assert_eq!(cancel.task_id.as_str(), second_id);
    assert_eq!(cancel.attempt, 2);
    publish(
        &agent,
        events_topic.clone(),
        false,
        encode(&TaskEvent::state(
            second_try.task_id.clone(),
            2,
            node.clone(),
            TaskState::Cancelled,
        ))
        .unwrap(),
    )
    .await;
    let cancelled = task_state(&http, &rest, &second_id, "cancelled").await;
    assert!(
        cancelled["output_text"].is_null(),
        "the stale success left no output: {cancelled}"
    );

    // Out of attempts (2 here): losing the node fails the task.
    let third: Value = common::submit(&http, &rest, &json!({"artifact": digest})).await;
    let third_id = third["id"].as_str().unwrap().to_string();
    for attempt in 1..=2 {
        let assignment: Assignment = next_message(&mut incoming, &assign_topic).await;
        assert_eq!(
            (assignment.task_id.as_str(), assignment.attempt),
            (third_id.as_str(), attempt)
        );
        publish(
            &agent,
            status_topic.clone(),
            true,
            encode(&common::status("edge-1", NodeState::Offline)).unwrap(),
        )
        .await;
        if attempt < 2 {
            task_state(&http, &rest, &third_id, "pending").await;
            publish(
                &agent,
                status_topic.clone(),
                true,
                encode(&common::status("edge-1", NodeState::Online)).unwrap(),
            )
            .await;
        }
    }
    let failed = task_state(&http, &rest, &third_id, "failed").await;
    assert_eq!(failed["reason"], "node_lost");
    running.shutdown().await;
}

#[tokio::test]
async fn a_silent_node_gets_no_work_until_it_reports_again() {
    let dir = tempfile::tempdir().unwrap();
    let running = common::start_coordinator(dir.path(), |c| {
        c.node_timeout = Duration::from_millis(700);
    })
    .await;
    let rest = running.rest_url();
    let http = reqwest::Client::new();
    let topics = Topics::default();
    let node = NodeId::new("quiet").unwrap();
    let (agent, mut incoming) = common::mqtt_client(running.mqtt_url(), "agent-quiet").await;
    agent
        .subscribe(topics.node(&node, Channel::Assign), QoS::AtLeastOnce)
        .await
        .unwrap();
    register_node(&agent, "quiet").await;
    wait_for_node(&http, &rest, "quiet", true).await;
    tokio::time::sleep(Duration::from_millis(1000)).await;

    let stored: Value = common::upload(&http, &rest, common::minimal_wasm()).await;
    let task: Value = common::submit(&http, &rest, &json!({"artifact": stored["digest"]})).await;
    let id = task["id"].as_str().unwrap().to_string();
    // Held while the node is silent, with the policy's reason recorded.
    let url = format!("{rest}/api/v1/tasks/{id}");
    common::eventually(WAIT, "a hold explanation", || {
        let http = http.clone();
        let url = url.clone();
        async move {
            let (_, task) = get_json(&http, &url).await;
            (task["state"] == "pending" && task["explanation"].is_object()).then_some(())
        }
    })
    .await;
    assert!(incoming.try_recv().is_err(), "a silent node got work");

    publish(
        &agent,
        topics.node(&node, Channel::Telemetry),
        false,
        encode(&common::telemetry("quiet", 2)).unwrap(),
    )
    .await;
    let assignment: Assignment =
        next_message(&mut incoming, &topics.node(&node, Channel::Assign)).await;
    assert_eq!(assignment.task_id.as_str(), id);
    running.shutdown().await;
}

#[tokio::test]
async fn the_embedded_broker_routes_messages_between_clients() {
    let dir = tempfile::tempdir().unwrap();
    let running = common::start_coordinator(dir.path(), |_| {}).await;
    // Under the topic prefix: even the development broker's anonymous
    // clients may use only that.
    let (subscriber, mut incoming) = common::mqtt_client(running.mqtt_url(), "subscriber").await;
    subscriber
        .subscribe("starling/v1/lab/test/#", QoS::AtLeastOnce)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (publisher, _ignored) = common::mqtt_client(running.mqtt_url(), "publisher").await;
    // A large payload too: the broker accepts messages up to the protocol's limit.
    let big = vec![7u8; starling_proto::limits::MAX_MESSAGE_BYTES];
    publisher
        .publish(
            "starling/v1/lab/test/a",
            QoS::AtLeastOnce,
            false,
            b"hello".to_vec(),
        )
        .await
        .unwrap();
    publisher
        .publish(
            "starling/v1/lab/test/big",
            QoS::AtLeastOnce,
            false,
            big.clone(),
        )
        .await
        .unwrap();
    let first = tokio::time::timeout(WAIT, incoming.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (first.topic.as_str(), &first.payload[..]),
        ("starling/v1/lab/test/a", &b"hello"[..])
    );
    let second = tokio::time::timeout(WAIT, incoming.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(second.topic, "starling/v1/lab/test/big");
    assert_eq!(second.payload.len(), big.len());
    running.shutdown().await;
}
