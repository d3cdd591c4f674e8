//! Delivery, signing, failure detection and reconciliation: the store's
//! outbox and event rules on SQLite and PostgreSQL, and the coordinator's
//! loops against a stand-in agent over a real broker.

use crate::common;

use std::time::{Duration, Instant};

use ed25519_dalek::{Signature, VerifyingKey};
use rumqttc::{AsyncClient, QoS};
use serde_json::{json, Value};
use sha2::{Digest as _, Sha256};
use starling_api::{TaskDemand, TaskKind, TaskLimits, TaskStatus};
use starling_coordinator::signing::Signer;
use starling_coordinator::store::{EventOutcome, NewTask, Store};
use starling_proto::{
    decode, encode, Assignment, Cancel, Channel, Digest, EventAck, FailureReason, NodeId,
    NodeState, Runtime, TaskEvent, TaskId, TaskState, Topics,
};

const MAX_ATTEMPTS: u32 = 3;
const WAIT: Duration = Duration::from_secs(15);

fn new_task(id: &str, artifact: Digest) -> NewTask {
    NewTask {
        id: id.to_string(),
        artifact,
        runtime: Runtime::Wasm,
        input: b"in".to_vec(),
        args: Vec::new(),
        class: TaskKind::Cpu,
        demand: TaskDemand::default(),
        limits: TaskLimits {
            wall_ms: 2_000,
            memory_bytes: 16 << 20,
            output_bytes: 4096,
            ..TaskLimits::default()
        },
        work_seconds: 0.1,
        priority: 1,
        deadline_unix_ms: None,
        created_ms: 1,
    }
}

fn event(task: &str, attempt: u32, node: &str, state: TaskState) -> TaskEvent {
    TaskEvent::state(
        TaskId::new(task).unwrap(),
        attempt,
        NodeId::new(node).unwrap(),
        state,
    )
}

fn success(task: &str, attempt: u32, node: &str, output: &[u8]) -> TaskEvent {
    let mut done = event(task, attempt, node, TaskState::Succeeded);
    done.output = output.to_vec();
    done
}

async fn artifact(store: &Store) -> Digest {
    let bytes = common::minimal_wasm();
    let digest = Digest(Sha256::digest(&bytes).into());
    store
        .put_artifact(&digest, &bytes, Runtime::Wasm, "", 0)
        .await
        .unwrap();
    digest
}

async fn placed(store: &Store, digest: Digest, id: &str, node: &str) {
    store.insert_task(&new_task(id, digest)).await.unwrap();
    assert!(store
        .assign_task(id, 1, node, 0, &json!({}), 1_000)
        .await
        .unwrap());
}

async fn status(store: &Store, id: &str) -> TaskStatus {
    store.task(id).await.unwrap().unwrap().status
}

/// The outbox row is written with the placement, survives a refusal and
/// another node's word, and goes with the first real event, a requeue, a
/// cancel or the task's end.
async fn outbox_follows_the_attempt(store: &Store) {
    let digest = artifact(store).await;
    placed(store, digest, "o-1", "node-a").await;
    let entry = store.outbox_entry("o-1", 1).await.unwrap().unwrap();
    assert_eq!(
        (entry.node_id.as_str(), entry.next_send_ms, entry.sends),
        ("node-a", 1_000, 0)
    );
    assert!(store.due_outbox(999, 10).await.unwrap().is_empty());
    assert_eq!(
        store.due_outbox(1_000, 10).await.unwrap(),
        vec![entry.clone()]
    );
    // Each due send is claimed once.
    assert!(store.claim_outbox_send(&entry, 6_000, None).await.unwrap());
    assert!(!store.claim_outbox_send(&entry, 7_000, None).await.unwrap());
    let claimed = store.outbox_entry("o-1", 1).await.unwrap().unwrap();
    assert_eq!((claimed.next_send_ms, claimed.sends), (6_000, 1));
    assert!(store.due_outbox(5_999, 10).await.unwrap().is_empty());

    // A refusal is history: the task stays as it was and the row stays.
    let mut refused = event("o-1", 1, "node-a", TaskState::Rejected);
    refused.message = Some(starling_proto::task::truncate("signature does not verify"));
    assert_eq!(
        store
            .record_event(&refused, 2_000, MAX_ATTEMPTS)
            .await
            .unwrap(),
        EventOutcome::Recorded {
            status: TaskStatus::Assigned,
            changed: false
        }
    );
    assert_eq!(status(store, "o-1").await, TaskStatus::Assigned);
    assert!(store.outbox_entry("o-1", 1).await.unwrap().is_some());
    let events = store.events("o-1").await.unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].state, "rejected");
    assert_eq!(
        events[0].message.as_deref(),
        Some("signature does not verify")
    );
    // A refused success cannot complete the task either.
    let mut forged_end = refused.clone();
    forged_end.output = b"forged".to_vec();
    assert_eq!(
        store
            .record_event(&forged_end, 2_050, MAX_ATTEMPTS)
            .await
            .unwrap(),
        EventOutcome::Duplicate
    );
    // Another node's word acknowledges nothing and is not even recorded, so
    // it cannot stand in for the assigned node's event.
    assert_eq!(
        store
            .record_event(
                &event("o-1", 1, "node-b", TaskState::Accepted),
                2_100,
                MAX_ATTEMPTS
            )
            .await
            .unwrap(),
        EventOutcome::NotAssigned
    );
    assert_eq!(store.events("o-1").await.unwrap().len(), 1);
    assert!(store.outbox_entry("o-1", 1).await.unwrap().is_some());
    // The assigned node's first event does.
    assert_eq!(
        store
            .record_event(
                &event("o-1", 1, "node-a", TaskState::Accepted),
                2_200,
                MAX_ATTEMPTS
            )
            .await
            .unwrap(),
        EventOutcome::Recorded {
            status: TaskStatus::Running,
            changed: true
        }
    );
    assert_eq!(store.outbox_entry("o-1", 1).await.unwrap(), None);

    // A requeue, a cancel and a result without earlier events each clear it.
    placed(store, digest, "o-2", "node-b").await;
    store
        .requeue_node_tasks("node-b", MAX_ATTEMPTS, 3_000)
        .await
        .unwrap();
    assert_eq!(store.outbox_entry("o-2", 1).await.unwrap(), None);
    placed(store, digest, "o-3", "node-c").await;
    store.request_cancel("o-3", 3_100).await.unwrap();
    assert_eq!(store.outbox_entry("o-3", 1).await.unwrap(), None);
    placed(store, digest, "o-4", "node-c").await;
    store
        .record_event(&success("o-4", 1, "node-c", b"x"), 3_200, MAX_ATTEMPTS)
        .await
        .unwrap();
    assert_eq!(store.outbox_entry("o-4", 1).await.unwrap(), None);
    assert!(store.due_outbox(u64::MAX / 2, 10).await.unwrap().is_empty());
    // o-3 still waits for node-c to confirm its cancel.
    let mut in_flight = store.in_flight_nodes().await.unwrap();
    in_flight.sort();
    assert_eq!(in_flight, ["node-a", "node-c"]);
}

/// A late result of a suspected node's attempt completes the task when
/// nothing else ran it yet; once the task moved on it is history only.
async fn late_results(store: &Store) {
    let digest = artifact(store).await;

    // Suspected, back, and nothing else ran it: accepted, once.
    placed(store, digest, "l-1", "node-a").await;
    store
        .record_event(
            &event("l-1", 1, "node-a", TaskState::Running),
            1_100,
            MAX_ATTEMPTS,
        )
        .await
        .unwrap();
    store
        .requeue_node_tasks("node-a", MAX_ATTEMPTS, 1_200)
        .await
        .unwrap();
    assert_eq!(status(store, "l-1").await, TaskStatus::Pending);
    // A late busy refusal would only put it where it is; a success from
    // another node is not this attempt's.
    let busy = TaskEvent::failed(
        TaskId::new("l-1").unwrap(),
        1,
        NodeId::new("node-a").unwrap(),
        FailureReason::AgentBusy,
        "busy",
    );
    assert_eq!(
        store
            .record_event(&busy, 1_250, MAX_ATTEMPTS)
            .await
            .unwrap(),
        EventOutcome::Stale {
            status: TaskStatus::Pending
        }
    );
    assert_eq!(
        store
            .record_event(&success("l-1", 1, "node-z", b"no"), 1_260, MAX_ATTEMPTS)
            .await
            .unwrap(),
        EventOutcome::NotAssigned
    );
    assert_eq!(
        store
            .record_event(&success("l-1", 1, "node-a", b"late"), 1_300, MAX_ATTEMPTS)
            .await
            .unwrap(),
        EventOutcome::Recorded {
            status: TaskStatus::Succeeded,
            changed: true
        }
    );
    let done = store.task("l-1").await.unwrap().unwrap();
    assert_eq!(done.output.as_deref(), Some(&b"late"[..]));
    assert_eq!(done.node_id.as_deref(), Some("node-a"));
    assert_eq!(store.attempts("l-1").await.unwrap()[0].state, "succeeded");
    // It is not placed again, and nothing later changes it.
    assert!(!store
        .assign_task("l-1", 2, "node-b", 0, &json!({}), 1_400)
        .await
        .unwrap());
    let late_failure = TaskEvent::failed(
        TaskId::new("l-1").unwrap(),
        1,
        NodeId::new("node-a").unwrap(),
        FailureReason::Trap,
        "after all",
    );
    store
        .record_event(&late_failure, 1_500, MAX_ATTEMPTS)
        .await
        .unwrap();
    assert_eq!(status(store, "l-1").await, TaskStatus::Succeeded);

    // Moved to another node: the old attempt's success is history only.
    placed(store, digest, "l-2", "node-c").await;
    store
        .requeue_node_tasks("node-c", MAX_ATTEMPTS, 2_000)
        .await
        .unwrap();
    assert!(store
        .assign_task("l-2", 2, "node-d", 0, &json!({}), 2_100)
        .await
        .unwrap());
    assert_eq!(
        store
            .record_event(&success("l-2", 1, "node-c", b"old"), 2_200, MAX_ATTEMPTS)
            .await
            .unwrap(),
        EventOutcome::Stale {
            status: TaskStatus::Assigned
        }
    );
    assert_eq!(
        store
            .record_event(
                &event("l-2", 1, "node-c", TaskState::Running),
                2_250,
                MAX_ATTEMPTS
            )
            .await
            .unwrap(),
        EventOutcome::Stale {
            status: TaskStatus::Assigned
        }
    );
    store
        .record_event(&success("l-2", 2, "node-d", b"new"), 2_300, MAX_ATTEMPTS)
        .await
        .unwrap();
    let moved = store.task("l-2").await.unwrap().unwrap();
    assert_eq!(moved.status, TaskStatus::Succeeded);
    assert_eq!(moved.output.as_deref(), Some(&b"new"[..]));
    let attempts = store.attempts("l-2").await.unwrap();
    assert_eq!(attempts[0].state, "lost");
    assert_eq!(attempts[1].state, "succeeded");
}

#[tokio::test]
async fn sqlite_outbox_and_late_results() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("d.db").display());
    let store = Store::open(&url).await.unwrap();
    outbox_follows_the_attempt(&store).await;
    late_results(&store).await;
    store.close().await;
}

#[tokio::test]
async fn postgres_outbox_and_late_results() {
    let db = common::PostgresDb::create();
    let store = Store::open(&db.url).await.unwrap();
    outbox_follows_the_attempt(&store).await;
    late_results(&store).await;
    store.close().await;
}

#[tokio::test]
async fn replicas_on_one_postgres_database_share_one_key() {
    let db = common::PostgresDb::create();
    let first = Store::open(&db.url).await.unwrap();
    let second = Store::open(&db.url).await.unwrap();
    let ttl = Duration::from_secs(60);
    let (a, b) = tokio::join!(Signer::load(&first, ttl, 1), Signer::load(&second, ttl, 2));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.public_key_hex(), b.public_key_hex());
    assert_eq!(a.public_key_hex().len(), 64);
    first.close().await;
    // A restart reads the same key back.
    let again = Signer::load(&second, ttl, 3).await.unwrap();
    assert_eq!(again.public_key_hex(), b.public_key_hex());
    second.close().await;
    // Another database has another key.
    let other_db = common::PostgresDb::create();
    let other = Store::open(&other_db.url).await.unwrap();
    let other_key = Signer::load(&other, ttl, 4).await.unwrap();
    assert_ne!(other_key.public_key_hex(), b.public_key_hex());
    other.close().await;
}

mod forward_only {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Step {
        Event(u32, &'static str, TaskState),
        Requeue(&'static str),
        Place(&'static str),
    }

    fn step() -> impl Strategy<Value = Step> {
        let node = prop_oneof![Just("a"), Just("b")];
        let state = prop_oneof![
            Just(TaskState::Accepted),
            Just(TaskState::Running),
            Just(TaskState::Succeeded),
            Just(TaskState::Failed),
            Just(TaskState::Cancelled),
            Just(TaskState::Rejected),
        ];
        prop_oneof![
            (1u32..=3, node.clone(), state).prop_map(|(a, n, s)| Step::Event(a, n, s)),
            node.clone().prop_map(Step::Requeue),
            node.prop_map(Step::Place),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]

        /// Whatever events, requeues and placements interleave, a task ends at
        /// most once: after its first terminal state, neither its state nor
        /// its output changes.
        #[test]
        fn a_task_ends_at_most_once(steps in proptest::collection::vec(step(), 1..24)) {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async {
                let dir = tempfile::tempdir().unwrap();
                let store = Store::open(&format!("sqlite://{}", dir.path().join("f.db").display())).await.unwrap();
                let digest = artifact(&store).await;
                store.insert_task(&new_task("t", digest)).await.unwrap();
                let mut ended: Option<(TaskStatus, Option<Vec<u8>>)> = None;
                for (n, step) in steps.iter().enumerate() {
                    let now = 10 + n as u64;
                    match step {
                        Step::Event(attempt, node, state) => {
                            let mut e = event("t", *attempt, node, *state);
                            e.output = format!("{attempt}{node}{n}").into_bytes();
                            store.record_event(&e, now, MAX_ATTEMPTS).await.unwrap();
                        }
                        Step::Requeue(node) => {
                            store.requeue_node_tasks(node, MAX_ATTEMPTS, now).await.unwrap();
                        }
                        Step::Place(node) => {
                            let task = store.task("t").await.unwrap().unwrap();
                            let _ = store
                                .assign_task("t", task.attempt + 1, node, 0, &json!({}), now)
                                .await
                                .unwrap();
                        }
                    }
                    let task = store.task("t").await.unwrap().unwrap();
                    match &ended {
                        Some((status, output)) => {
                            assert_eq!(&task.status, status, "after {step:?}");
                            assert_eq!(&task.output, output, "after {step:?}");
                        }
                        None if task.status.is_terminal() => {
                            ended = Some((task.status, task.output.clone()));
                        }
                        None => {}
                    }
                    if task.status.is_terminal() || task.status == TaskStatus::Pending {
                        assert!(store.due_outbox(u64::MAX / 2, 10).await.unwrap().is_empty());
                    }
                }
                store.close().await;
            });
        }
    }
}

// --- The coordinator's loops, over a broker ---------------------------------

async fn publish(client: &AsyncClient, topic: String, retain: bool, bytes: Vec<u8>) {
    client
        .publish(topic, QoS::AtLeastOnce, retain, bytes)
        .await
        .unwrap();
}

/// A stand-in agent: subscribed to its assign, cancel and ack channels,
/// registered online with one telemetry report.
async fn stand_in(
    mqtt_url: &str,
    id: &str,
) -> (
    AsyncClient,
    tokio::sync::mpsc::UnboundedReceiver<rumqttc::Publish>,
) {
    let topics = Topics::default();
    let node = NodeId::new(id).unwrap();
    let (client, incoming) = common::mqtt_client(mqtt_url, &format!("agent-{id}")).await;
    for channel in [Channel::Assign, Channel::Cancel, Channel::Ack] {
        client
            .subscribe(topics.node(&node, channel), QoS::AtLeastOnce)
            .await
            .unwrap();
    }
    publish(
        &client,
        topics.node(&node, Channel::Status),
        true,
        encode(&common::status(id, NodeState::Online)).unwrap(),
    )
    .await;
    publish(
        &client,
        topics.node(&node, Channel::Capability),
        true,
        encode(&common::capability(id)).unwrap(),
    )
    .await;
    telemetry(&client, id, 1).await;
    (client, incoming)
}

async fn telemetry(client: &AsyncClient, id: &str, seq: u64) {
    let node = NodeId::new(id).unwrap();
    publish(
        client,
        Topics::default().node(&node, Channel::Telemetry),
        false,
        encode(&common::telemetry(id, seq)).unwrap(),
    )
    .await;
}

async fn send_event(client: &AsyncClient, event: &TaskEvent) {
    publish(
        client,
        Topics::default().node(&event.node_id, Channel::Events),
        false,
        encode(event).unwrap(),
    )
    .await;
}

async fn next_on<M: starling_proto::Message>(
    incoming: &mut tokio::sync::mpsc::UnboundedReceiver<rumqttc::Publish>,
    node: &str,
    channel: Channel,
) -> M {
    let topic = Topics::default().node(&NodeId::new(node).unwrap(), channel);
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

async fn wait_for_node(rest: &str, id: &str) {
    let http = reqwest::Client::new();
    let url = format!("{rest}/api/v1/nodes");
    common::eventually(WAIT, "the node online", || {
        let http = http.clone();
        let url = url.clone();
        async move {
            let nodes: Value = http.get(&url).send().await.ok()?.json().await.ok()?;
            nodes["nodes"]
                .as_array()?
                .iter()
                .find(|n| n["id"] == id && n["online"] == true)
                .map(|_| ())
        }
    })
    .await;
}

async fn submit(rest: &str) -> String {
    let http = reqwest::Client::new();
    let stored = common::upload(&http, rest, common::minimal_wasm()).await;
    let task = common::submit(&http, rest, &json!({"artifact": stored["digest"]})).await;
    task["id"].as_str().unwrap().to_string()
}

async fn wait_state(store: &Store, id: &str, wanted: TaskStatus) {
    common::eventually(WAIT, &format!("task {id} {wanted}"), || async {
        (status(store, id).await == wanted).then_some(())
    })
    .await;
}

fn verify(key_hex: &str, assignment: &Assignment) {
    let key: [u8; 32] = hex::decode(key_hex).unwrap().try_into().unwrap();
    let key = VerifyingKey::from_bytes(&key).unwrap();
    let signature = Signature::from_slice(&assignment.signature).unwrap();
    key.verify_strict(&assignment.signed_bytes().unwrap(), &signature)
        .expect("the assignment's signature verifies with the coordinator key");
}

#[tokio::test]
async fn assignments_are_signed_resent_until_acknowledged_and_receipts_come_back() {
    let dir = tempfile::tempdir().unwrap();
    let running = common::start_coordinator(dir.path(), |c| {
        c.resend_interval = Duration::from_millis(300);
        c.node_timeout = Duration::from_secs(60);
    })
    .await;
    let rest = running.rest_url();
    let key = running.coordinator_key();
    let (agent, mut incoming) = stand_in(running.mqtt_url(), "edge-1").await;
    wait_for_node(&rest, "edge-1").await;
    let id = submit(&rest).await;

    let first: Assignment = next_on(&mut incoming, "edge-1", Channel::Assign).await;
    assert_eq!(first.task_id.as_str(), id);
    assert_eq!(first.node_id.as_str(), "edge-1");
    assert_eq!(first.expires_unix_ms - first.issued_unix_ms, 60_000);
    verify(&key, &first);
    let mut forged = first.clone();
    forged.attempt = 2;
    let forged_signature = Signature::from_slice(&forged.signature).unwrap();
    let verifying =
        VerifyingKey::from_bytes(&hex::decode(&key).unwrap().try_into().unwrap()).unwrap();
    assert!(verifying
        .verify_strict(&forged.signed_bytes().unwrap(), &forged_signature)
        .is_err());

    // Unacknowledged: sent again, signed anew with a later window.
    let second: Assignment = next_on(&mut incoming, "edge-1", Channel::Assign).await;
    assert_eq!((second.task_id.as_str(), second.attempt), (id.as_str(), 1));
    assert!(second.issued_unix_ms > first.issued_unix_ms);
    assert_ne!(second.signature, first.signature);
    verify(&key, &second);

    // A refusal is acknowledged and recorded, and changes nothing.
    let mut refused = event(&id, 1, "edge-1", TaskState::Rejected);
    refused.message = Some(starling_proto::task::truncate("expired"));
    send_event(&agent, &refused).await;
    let ack: EventAck = next_on(&mut incoming, "edge-1", Channel::Ack).await;
    assert_eq!(
        (ack.task_id.as_str(), ack.attempt, ack.state),
        (id.as_str(), 1, TaskState::Rejected)
    );
    assert_eq!(status(running.store(), &id).await, TaskStatus::Assigned);
    assert!(running
        .store()
        .outbox_entry(&id, 1)
        .await
        .unwrap()
        .is_some());
    let third: Assignment = next_on(&mut incoming, "edge-1", Channel::Assign).await;
    assert!(third.issued_unix_ms > second.issued_unix_ms);

    // The first real event acknowledges the assignment: no more sends.
    let accepted = event(&id, 1, "edge-1", TaskState::Accepted);
    send_event(&agent, &accepted).await;
    let ack: EventAck = next_on(&mut incoming, "edge-1", Channel::Ack).await;
    assert_eq!(ack.state, TaskState::Accepted);
    wait_state(running.store(), &id, TaskStatus::Running).await;
    assert_eq!(running.store().outbox_entry(&id, 1).await.unwrap(), None);
    // A redelivered event is acknowledged again (its first receipt may be lost).
    send_event(&agent, &accepted).await;
    let ack: EventAck = next_on(&mut incoming, "edge-1", Channel::Ack).await;
    assert_eq!(ack.state, TaskState::Accepted);
    // An event for a task nobody knows is acknowledged, so the agent drops it.
    send_event(&agent, &success("no-such-task", 1, "edge-1", b"?")).await;
    let ack: EventAck = next_on(&mut incoming, "edge-1", Channel::Ack).await;
    assert_eq!(ack.task_id.as_str(), "no-such-task");
    send_event(&agent, &success(&id, 1, "edge-1", b"done")).await;
    wait_state(running.store(), &id, TaskStatus::Succeeded).await;
    // Quiet from here on: nothing more is re-sent.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    while let Ok(publish) = incoming.try_recv() {
        assert!(
            !publish.topic.ends_with("/assign"),
            "an acknowledged assignment was sent again"
        );
    }
    let metrics = reqwest::get(format!("{rest}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("starling_assignments_rejected_total 1"),
        "{metrics}"
    );
    running.shutdown().await;
}

#[tokio::test]
async fn a_silent_node_loses_its_tasks_within_the_timeout_and_stale_work_is_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    let timeout = Duration::from_millis(1500);
    let running = common::start_coordinator(dir.path(), |c| {
        c.node_timeout = timeout;
        c.resend_interval = Duration::from_secs(30);
    })
    .await;
    let rest = running.rest_url();
    let (agent, mut incoming) = stand_in(running.mqtt_url(), "edge-2").await;
    wait_for_node(&rest, "edge-2").await;
    let id = submit(&rest).await;
    let first: Assignment = next_on(&mut incoming, "edge-2", Channel::Assign).await;
    assert_eq!(first.attempt, 1);
    send_event(&agent, &event(&id, 1, "edge-2", TaskState::Running)).await;
    wait_state(running.store(), &id, TaskStatus::Running).await;

    // Falls silent: no telemetry from now on.
    let silent_since = Instant::now();
    telemetry(&agent, "edge-2", 2).await;
    wait_state(running.store(), &id, TaskStatus::Pending).await;
    let noticed = silent_since.elapsed();
    assert!(
        noticed <= timeout + Duration::from_secs(1),
        "requeued after {noticed:?}"
    );
    assert!(
        noticed >= timeout - Duration::from_millis(200),
        "{noticed:?}"
    );
    assert_eq!(
        running.store().attempts(&id).await.unwrap()[0].state,
        "lost"
    );

    // It comes back (telemetry again): the task goes to it as attempt 2, and
    // its report on the stale attempt 1 is answered with a Cancel.
    telemetry(&agent, "edge-2", 3).await;
    let second: Assignment = next_on(&mut incoming, "edge-2", Channel::Assign).await;
    assert_eq!((second.task_id.as_str(), second.attempt), (id.as_str(), 2));
    send_event(&agent, &event(&id, 2, "edge-2", TaskState::Running)).await;
    send_event(&agent, &event(&id, 1, "edge-2", TaskState::Accepted)).await;
    let cancel: Cancel = next_on(&mut incoming, "edge-2", Channel::Cancel).await;
    assert_eq!((cancel.task_id.as_str(), cancel.attempt), (id.as_str(), 1));
    // Redelivered (its Cancel may have been lost): cancelled again.
    send_event(&agent, &event(&id, 1, "edge-2", TaskState::Running)).await;
    let again: Cancel = next_on(&mut incoming, "edge-2", Channel::Cancel).await;
    assert_eq!(again.attempt, 1);
    // The stale attempt's late success is history; attempt 2 decides.
    send_event(&agent, &success(&id, 1, "edge-2", b"stale")).await;
    send_event(&agent, &success(&id, 2, "edge-2", b"fresh")).await;
    wait_state(running.store(), &id, TaskStatus::Succeeded).await;
    let task = running.store().task(&id).await.unwrap().unwrap();
    assert_eq!(task.output.as_deref(), Some(&b"fresh"[..]));
    assert_eq!(task.attempt, 2);
    running.shutdown().await;
}

#[tokio::test]
async fn after_a_restart_unacknowledged_work_is_resent_and_absent_nodes_lose_theirs() {
    let broker = common::Mosquitto::start();
    let dir = tempfile::tempdir().unwrap();
    let timeout = Duration::from_millis(1500);
    let configure = |c: &mut starling_coordinator::CoordinatorConfig| {
        c.broker = Some(broker.url.clone());
        c.node_timeout = timeout;
        c.resend_interval = Duration::from_secs(30);
    };
    let first = common::start_coordinator(dir.path(), configure).await;
    let rest = first.rest_url();
    let (agent, mut incoming) = stand_in(&broker.url, "edge-3").await;
    wait_for_node(&rest, "edge-3").await;
    let id = submit(&rest).await;
    let sent: Assignment = next_on(&mut incoming, "edge-3", Channel::Assign).await;
    first.shutdown().await;

    // Restarted on the same store: the unacknowledged assignment goes out
    // again at once (not after its 30 s backoff), signed with the same key.
    let second = common::start_coordinator(dir.path(), configure).await;
    let again: Assignment = next_on(&mut incoming, "edge-3", Channel::Assign).await;
    assert_eq!((again.task_id.as_str(), again.attempt), (id.as_str(), 1));
    assert!(again.issued_unix_ms > sent.issued_unix_ms);
    verify(&second.coordinator_key(), &again);

    // The node then vanishes without a last will (its retained reports are
    // cleared): after the node timeout its task is placed again.
    let node = NodeId::new("edge-3").unwrap();
    for channel in [Channel::Status, Channel::Capability] {
        publish(
            &agent,
            Topics::default().node(&node, channel),
            true,
            Vec::new(),
        )
        .await;
    }
    second.shutdown().await;
    let third = common::start_coordinator(dir.path(), configure).await;
    let restarted = Instant::now();
    wait_state(third.store(), &id, TaskStatus::Pending).await;
    assert!(
        restarted.elapsed() <= timeout + Duration::from_secs(1),
        "requeued after {:?}",
        restarted.elapsed()
    );
    let (_other, mut other_incoming) = stand_in(&broker.url, "edge-4").await;
    let moved: Assignment = next_on(&mut other_incoming, "edge-4", Channel::Assign).await;
    assert_eq!((moved.task_id.as_str(), moved.attempt), (id.as_str(), 2));
    third.shutdown().await;
}

/// Issue 20, item 5: a task whose assignment cannot be built (here, stored
/// with more arguments than an assignment carries, as an older version
/// could take them) fails with a reason the API shows, instead of staying
/// `assigned` and being re-sent for ever.
#[tokio::test]
async fn a_task_whose_assignment_cannot_be_built_fails_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let running = common::start_coordinator(dir.path(), |_| {}).await;
    let rest = running.rest_url();
    let http = reqwest::Client::new();
    let stored: Value = common::upload(&http, &rest, common::minimal_wasm()).await;
    let digest = Digest::parse(stored["digest"].as_str().unwrap()).unwrap();
    let id = uuid::Uuid::now_v7().to_string();
    let now = starling_coordinator::task::unix_now_ms();
    running
        .store()
        .insert_task(&NewTask {
            id: id.clone(),
            artifact: digest,
            runtime: Runtime::Wasm,
            input: b"hi".to_vec(),
            args: vec!["a".into(); starling_proto::limits::MAX_ARGS + 1],
            class: Default::default(),
            demand: Default::default(),
            limits: Default::default(),
            work_seconds: 0.1,
            priority: 0,
            deadline_unix_ms: None,
            created_ms: now,
        })
        .await
        .unwrap();
    common::stand_in_agent(running.mqtt_url(), "unbuildable-a").await;
    let url = format!("{rest}/api/v1/tasks/{id}");
    let task = common::eventually(Duration::from_secs(30), "the task to fail", || {
        let (http, url) = (http.clone(), url.clone());
        async move {
            let task = common::get_json(&http, &url).await;
            (task["state"] == "failed").then_some(task)
        }
    })
    .await;
    assert_eq!(task["reason"], "invalid_input", "{task:#}");
    let message = task["message"].as_str().unwrap();
    assert!(
        message.contains("cannot build the task's assignment") && message.contains("arguments"),
        "{message}"
    );
    assert_eq!(task["attempt"], 1, "tried once, not again: {task:#}");
    running.shutdown().await;
}
