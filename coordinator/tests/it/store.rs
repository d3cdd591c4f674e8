//! The store against both backends: SQLite in a temp dir and a fresh
//! PostgreSQL database. The same scenario runs on each.

use crate::common;

use sha2::{Digest as _, Sha256};
use starling_api::{TaskDemand, TaskKind, TaskLimits, TaskStatus};
use starling_coordinator::store::{
    Admission, CancelOutcome, EventOutcome, EventToRecord, NewTask, ReportMark, Store,
};
use starling_proto::{Digest, FailureReason, NodeId, Runtime, TaskEvent, TaskId, TaskState};

const MAX_ATTEMPTS: u32 = 3;

fn new_task(id: &str, artifact: Digest, created_ms: u64) -> NewTask {
    NewTask {
        id: id.to_string(),
        artifact,
        runtime: Runtime::Wasm,
        input: b"some input".to_vec(),
        args: vec!["--n".into(), "10".into()],
        class: TaskKind::Io,
        demand: TaskDemand {
            cpu_cores: 0.5,
            memory_mb: 32,
            gpu: false,
            io_mbps: 20.0,
            ..TaskDemand::default()
        },
        limits: TaskLimits {
            wall_ms: 2_000,
            memory_bytes: 16 << 20,
            output_bytes: 4096,
            ..TaskLimits::default()
        },
        work_seconds: 0.25,
        priority: 7,
        deadline_unix_ms: Some(created_ms + 10_000),
        created_ms,
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

async fn exercise(store: &Store) {
    // Artifacts: content-addressed, storing twice is harmless.
    let bytes = common::minimal_wasm();
    let digest = Digest(Sha256::digest(&bytes).into());
    assert!(store
        .put_artifact(&digest, &bytes, Runtime::Wasm, "", 1)
        .await
        .unwrap());
    assert!(!store
        .put_artifact(&digest, &bytes, Runtime::Wasm, "", 2)
        .await
        .unwrap());
    assert_eq!(store.artifact(&digest).await.unwrap(), Some(bytes.clone()));
    assert_eq!(
        store.artifact_info(&digest).await.unwrap(),
        Some((bytes.len() as u64, Runtime::Wasm))
    );
    // An OpenCL package keeps its runtime.
    let package = b"{\"format\":\"starling-opencl/1\"}".to_vec();
    let package_digest = Digest(Sha256::digest(&package).into());
    assert!(store
        .put_artifact(&package_digest, &package, Runtime::Opencl, "", 3)
        .await
        .unwrap());
    assert_eq!(
        store.artifact_info(&package_digest).await.unwrap(),
        Some((package.len() as u64, Runtime::Opencl))
    );
    assert_eq!(store.artifact_info(&Digest([7; 32])).await.unwrap(), None);
    assert_eq!(store.artifact(&Digest([7; 32])).await.unwrap(), None);

    // Tasks round trip field by field.
    let first = new_task("task-1", digest, 1_000);
    store.insert_task(&first).await.unwrap();
    let second = new_task("task-2", digest, 2_000);
    store.insert_task(&second).await.unwrap();
    let loaded = store.task("task-1").await.unwrap().unwrap();
    assert_eq!(loaded.spec, first);
    assert_eq!(loaded.status, TaskStatus::Pending);
    assert_eq!(loaded.attempt, 0);
    assert!(store.task("nope").await.unwrap().is_none());

    let listed = store.list_tasks(None, 10).await.unwrap();
    let ids: Vec<_> = listed.iter().map(|t| t.spec.id.as_str()).collect();
    assert_eq!(ids, ["task-2", "task-1"], "newest first");
    let pending = store.pending_tasks(10).await.unwrap();
    assert_eq!(pending[0].spec.id, "task-1", "queue is oldest first");

    // Assignment, guarded by state and attempt.
    let explanation =
        serde_json::json!({"policy": "test", "summary": "only node", "alternatives": []});
    assert!(store
        .assign_task("task-1", 1, "node-a", 2, &explanation, 3_000)
        .await
        .unwrap());
    assert!(
        !store
            .assign_task("task-1", 1, "node-b", 2, &explanation, 3_001)
            .await
            .unwrap(),
        "a task is assigned once per attempt"
    );
    let assigned = store.task("task-1").await.unwrap().unwrap();
    assert_eq!(assigned.status, TaskStatus::Assigned);
    assert_eq!(assigned.node_id.as_deref(), Some("node-a"));
    assert_eq!(assigned.power_level, Some(2));
    assert_eq!(assigned.explanation, Some(explanation.clone()));
    assert_eq!(store.in_flight_tasks(10).await.unwrap().len(), 1);

    // Events: recorded once whatever the redeliveries.
    let mut running = event("task-1", 1, "node-a", TaskState::Running);
    running.power = Some(starling_proto::PowerApplied {
        requested: 0,
        in_force: 1,
        max_frequency_khz: Some(1_000_000),
    });
    assert_eq!(
        store
            .record_event(&running, 3_100, MAX_ATTEMPTS)
            .await
            .unwrap(),
        EventOutcome::Recorded {
            status: TaskStatus::Running,
            changed: true
        }
    );
    assert_eq!(
        store
            .record_event(&running, 3_150, MAX_ATTEMPTS)
            .await
            .unwrap(),
        EventOutcome::Duplicate
    );
    let mut done = event("task-1", 1, "node-a", TaskState::Succeeded);
    done.output = b"42\n".to_vec();
    done.exit_code = Some(0);
    for _ in 0..3 {
        store
            .record_event(&done, 3_200, MAX_ATTEMPTS)
            .await
            .unwrap();
    }
    // A stale failure for the same attempt after success changes nothing.
    let late = TaskEvent::failed(
        TaskId::new("task-1").unwrap(),
        1,
        NodeId::new("node-a").unwrap(),
        FailureReason::Trap,
        "late",
    );
    assert_eq!(
        store
            .record_event(&late, 3_300, MAX_ATTEMPTS)
            .await
            .unwrap(),
        EventOutcome::Recorded {
            status: TaskStatus::Succeeded,
            changed: false
        }
    );
    let finished = store.task("task-1").await.unwrap().unwrap();
    assert_eq!(finished.status, TaskStatus::Succeeded);
    assert_eq!(finished.output.as_deref(), Some(&b"42\n"[..]));
    assert_eq!(finished.exit_code, Some(0));
    let events = store.events("task-1").await.unwrap();
    let states: Vec<_> = events.iter().map(|e| e.state.as_str()).collect();
    assert_eq!(
        states,
        ["running", "succeeded", "failed"],
        "one row per attempt and state"
    );
    // The level the agent applied is kept with its event.
    assert_eq!(
        events[0].power,
        Some(serde_json::json!({"requested": 0, "in_force": 1, "max_frequency_khz": 1_000_000}))
    );
    assert_eq!(events[1].power, None);
    let attempts = store.attempts("task-1").await.unwrap();
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].state, "succeeded");

    // Unknown tasks change nothing.
    assert_eq!(
        store
            .record_event(
                &event("ghost", 1, "node-a", TaskState::Running),
                4_000,
                MAX_ATTEMPTS
            )
            .await
            .unwrap(),
        EventOutcome::UnknownTask
    );

    // A node going offline: the task is retried until attempts run out.
    for attempt in 1..=MAX_ATTEMPTS {
        assert!(store
            .assign_task("task-2", attempt, "node-b", 0, &explanation, 5_000)
            .await
            .unwrap());
        let lost = store
            .requeue_node_tasks("node-b", MAX_ATTEMPTS, 5_100)
            .await
            .unwrap();
        assert_eq!(lost.len(), 1);
        let expected = if attempt < MAX_ATTEMPTS {
            TaskStatus::Pending
        } else {
            TaskStatus::Failed
        };
        assert_eq!(lost[0].status, expected);
        assert_eq!(
            store.task("task-2").await.unwrap().unwrap().status,
            expected
        );
    }
    let failed = store.task("task-2").await.unwrap().unwrap();
    assert_eq!(failed.failure_reason.as_deref(), Some("node_lost"));
    assert_eq!(
        store.attempts("task-2").await.unwrap().len(),
        MAX_ATTEMPTS as usize
    );
    assert!(store
        .requeue_node_tasks("node-b", MAX_ATTEMPTS, 5_200)
        .await
        .unwrap()
        .is_empty());

    // Cancel: pending at once, running through the node, ended is a conflict.
    store
        .insert_task(&new_task("task-3", digest, 6_000))
        .await
        .unwrap();
    assert_eq!(
        store.request_cancel("task-3", 6_100).await.unwrap(),
        CancelOutcome::Cancelled
    );
    store
        .insert_task(&new_task("task-4", digest, 7_000))
        .await
        .unwrap();
    assert!(store
        .assign_task("task-4", 1, "node-c", 1, &explanation, 7_100)
        .await
        .unwrap());
    assert_eq!(
        store.request_cancel("task-4", 7_200).await.unwrap(),
        CancelOutcome::SendCancel {
            node_id: "node-c".into(),
            attempt: 1
        }
    );
    store
        .record_event(
            &event("task-4", 1, "node-c", TaskState::Cancelled),
            7_300,
            MAX_ATTEMPTS,
        )
        .await
        .unwrap();
    assert_eq!(
        store.request_cancel("task-4", 7_400).await.unwrap(),
        CancelOutcome::AlreadyEnded(TaskStatus::Cancelled)
    );
    assert_eq!(
        store.request_cancel("ghost", 7_500).await.unwrap(),
        CancelOutcome::NotFound
    );
    // A cancel in flight when the node vanishes ends the task as cancelled.
    store
        .insert_task(&new_task("task-6", digest, 7_600))
        .await
        .unwrap();
    assert!(store
        .assign_task("task-6", 1, "node-e", 0, &explanation, 7_700)
        .await
        .unwrap());
    assert!(matches!(
        store.request_cancel("task-6", 7_800).await.unwrap(),
        CancelOutcome::SendCancel { .. }
    ));
    let lost = store
        .requeue_node_tasks("node-e", MAX_ATTEMPTS, 7_900)
        .await
        .unwrap();
    assert_eq!(lost[0].status, TaskStatus::Cancelled);
    assert_eq!(
        store.task("task-6").await.unwrap().unwrap().status,
        TaskStatus::Cancelled
    );

    // An agent too busy to run it: back to pending for another attempt.
    store
        .insert_task(&new_task("task-5", digest, 8_000))
        .await
        .unwrap();
    assert!(store
        .assign_task("task-5", 1, "node-d", 0, &explanation, 8_100)
        .await
        .unwrap());
    let busy = TaskEvent::failed(
        TaskId::new("task-5").unwrap(),
        1,
        NodeId::new("node-d").unwrap(),
        FailureReason::AgentBusy,
        "shutting down",
    );
    store
        .record_event(&busy, 8_200, MAX_ATTEMPTS)
        .await
        .unwrap();
    let retried = store.task("task-5").await.unwrap().unwrap();
    assert_eq!(retried.status, TaskStatus::Pending);
    assert_eq!(retried.attempt, 1);

    let filtered = store
        .list_tasks(Some(TaskStatus::Cancelled), 10)
        .await
        .unwrap();
    let ids: Vec<_> = filtered.iter().map(|t| t.spec.id.as_str()).collect();
    assert_eq!(ids, ["task-6", "task-4", "task-3"]);

    // Artifacts are charged to their uploader; those no task references
    // are collected once older than the cut, with their compiled code.
    let old = b"\0asm old, unreferenced".to_vec();
    let old_digest = Digest(Sha256::digest(&old).into());
    let young = b"\0asm young, unreferenced".to_vec();
    let young_digest = Digest(Sha256::digest(&young).into());
    store
        .put_artifact(&old_digest, &old, Runtime::Wasm, "uploader-1", 10)
        .await
        .unwrap();
    store
        .put_artifact(&young_digest, &young, Runtime::Wasm, "uploader-1", 50_000)
        .await
        .unwrap();
    assert_eq!(
        store.uploaded_bytes("uploader-1").await.unwrap(),
        (old.len() + young.len()) as u64
    );
    assert_eq!(store.uploaded_bytes("someone else").await.unwrap(), 0);
    let key = starling_coordinator::store::PrecompiledKey {
        module: &old_digest,
        target: "x86_64-unknown-linux-gnu",
        engine: "wasmtime-test",
    };
    store
        .put_precompiled(&key, &Digest([9; 32]), b"code", 11)
        .await
        .unwrap();
    let (count, bytes) = store.collect_artifacts(20_000).await.unwrap();
    // The old one, and the OpenCL package stored above that no task used.
    assert_eq!(count, 2);
    assert_eq!(bytes, (old.len() + package.len()) as u64);
    assert_eq!(store.artifact_info(&old_digest).await.unwrap(), None);
    assert_eq!(store.precompiled_digest(&key).await.unwrap(), None);
    assert!(store.artifact_info(&young_digest).await.unwrap().is_some());
    // Tasks keep theirs, however old.
    assert!(store.artifact_info(&digest).await.unwrap().is_some());
    assert_eq!(
        store.uploaded_bytes("uploader-1").await.unwrap(),
        young.len() as u64
    );
}

#[tokio::test]
async fn sqlite_store_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!(
        "sqlite://{}",
        dir.path().join("nested/starling.db").display()
    );
    std::fs::create_dir_all(dir.path().join("nested")).unwrap();
    let store = Store::open(&url).await.unwrap();
    assert_eq!(store.backend_name(), "sqlite");
    exercise(&store).await;
    store.close().await;
    // Reopening runs the migrations again without harm and keeps the data.
    let again = Store::open(&url).await.unwrap();
    assert_eq!(again.list_tasks(None, 100).await.unwrap().len(), 6);
    again.close().await;
}

#[tokio::test]
async fn postgres_store_round_trips() {
    let db = common::PostgresDb::create();
    let store = Store::open(&db.url).await.unwrap();
    assert_eq!(store.backend_name(), "postgres");
    exercise(&store).await;
    store.close().await;
    let again = Store::open(&db.url).await.unwrap();
    assert_eq!(again.list_tasks(None, 100).await.unwrap().len(), 6);
    again.close().await;
    drop(db);
}

/// A submitter's pending tasks stay within its quota however its batches
/// race: twenty concurrent batches of five against a quota of ten store two
/// of them, whole, and refuse the rest whole; another submitter is not
/// counted with it, and a task placed leaves the count.
async fn pending_quota_holds_under_concurrent_batches(store: &Store) {
    let bytes = b"quota module";
    let artifact = Digest(Sha256::digest(bytes).into());
    store
        .put_artifact(&artifact, bytes, Runtime::Wasm, "", 1)
        .await
        .unwrap();
    let batch = |n: usize| {
        (0..5)
            .map(|i| new_task(&format!("q{n}-{i}"), artifact, 1_000 + n as u64))
            .collect::<Vec<_>>()
    };
    let batches: Vec<_> = (0..20).map(batch).collect();
    let outcomes = futures_util::future::join_all(
        batches
            .iter()
            .map(|tasks| store.insert_tasks_as(tasks, "mallory", Some(10))),
    )
    .await;
    let stored = outcomes
        .iter()
        .filter(|outcome| matches!(outcome, Ok(Admission::Stored)))
        .count();
    assert_eq!(stored, 2, "{outcomes:?}");
    assert!(
        outcomes.iter().all(|outcome| matches!(
            outcome,
            Ok(Admission::Stored | Admission::OverQuota { pending: 5 | 10 })
        )),
        "{outcomes:?}"
    );
    let pending = store
        .list_tasks(Some(TaskStatus::Pending), 1000)
        .await
        .unwrap();
    assert_eq!(pending.len(), 10);
    // Whole batches only: each stored batch has all five of its tasks.
    for n in 0..20 {
        let of_batch = pending
            .iter()
            .filter(|t| t.spec.id.starts_with(&format!("q{n}-")))
            .count();
        assert!(
            of_batch == 0 || of_batch == 5,
            "batch {n}: {of_batch} tasks"
        );
    }
    // Another submitter's share is its own.
    let other = vec![new_task("other", artifact, 5_000)];
    assert_eq!(
        store
            .insert_tasks_as(&other, "alice", Some(10))
            .await
            .unwrap(),
        Admission::Stored
    );
    // Cancelling one of mallory's frees a place.
    let first = &pending[0].spec.id;
    assert_eq!(
        store.request_cancel(first, 6_000).await.unwrap(),
        CancelOutcome::Cancelled
    );
    let one = vec![new_task("again", artifact, 7_000)];
    assert_eq!(
        store
            .insert_tasks_as(&one, "mallory", Some(10))
            .await
            .unwrap(),
        Admission::Stored
    );
    let two = vec![new_task("over", artifact, 8_000)];
    assert_eq!(
        store
            .insert_tasks_as(&two, "mallory", Some(10))
            .await
            .unwrap(),
        Admission::OverQuota { pending: 10 }
    );
}

#[tokio::test]
async fn pending_quota_holds_on_sqlite_and_postgres() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("quota.db").display());
    let store = Store::open(&url).await.unwrap();
    pending_quota_holds_under_concurrent_batches(&store).await;
    store.close().await;
    let db = common::PostgresDb::create();
    let store = Store::open(&db.url).await.unwrap();
    pending_quota_holds_under_concurrent_batches(&store).await;
    store.close().await;
    drop(db);
}

#[tokio::test]
async fn unreachable_or_unsupported_databases_are_reported() {
    let error = Store::open("mysql://x").await.unwrap_err().to_string();
    assert!(error.contains("--db"), "{error}");
    let port = common::free_port();
    let error = Store::open(&format!("postgres://postgres:pw@127.0.0.1:{port}/x"))
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("cannot open database"), "{error}");
    assert!(!error.contains("pw@"), "password must not leak: {error}");
}

mod redeliveries {
    use super::*;
    use proptest::prelude::*;

    fn state_strategy() -> impl Strategy<Value = TaskState> {
        prop_oneof![
            Just(TaskState::Accepted),
            Just(TaskState::Running),
            Just(TaskState::Succeeded),
            Just(TaskState::Failed),
            Just(TaskState::Cancelled),
            Just(TaskState::Rejected),
        ]
    }

    /// What a test can compare of a task: everything but receive times.
    async fn snapshot(store: &Store) -> (TaskStatus, Option<Vec<u8>>, Vec<(u32, String)>) {
        let task = store.task("t").await.unwrap().unwrap();
        let events = store
            .events("t")
            .await
            .unwrap()
            .into_iter()
            .map(|e| (e.attempt, e.state))
            .collect();
        (task.status, task.output, events)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// Any sequence of events, delivered again in full, changes nothing the
        /// second time, and the store keeps one row per attempt and state.
        #[test]
        fn recording_is_idempotent(sequence in proptest::collection::vec((1u32..=2, state_strategy()), 1..12)) {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async {
                let dir = tempfile::tempdir().unwrap();
                let store = Store::open(&format!("sqlite://{}", dir.path().join("p.db").display())).await.unwrap();
                let bytes = common::minimal_wasm();
                let digest = Digest(Sha256::digest(&bytes).into());
                store.put_artifact(&digest, &bytes, Runtime::Wasm, "", 0).await.unwrap();
                store.insert_task(&new_task("t", digest, 0)).await.unwrap();
                let explanation = serde_json::json!({});
                assert!(store.assign_task("t", 1, "n", 0, &explanation, 1).await.unwrap());
                let events: Vec<TaskEvent> = sequence
                    .iter()
                    .map(|(attempt, state)| {
                        let mut event = event("t", *attempt, "n", *state);
                        event.output = format!("{attempt}{state:?}").into_bytes();
                        event
                    })
                    .collect();
                for event in &events {
                    store.record_event(event, 2, MAX_ATTEMPTS).await.unwrap();
                }
                let once = snapshot(&store).await;
                for event in &events {
                    // Attempt 2 was never assigned to anyone: never recorded.
                    let expected = if event.attempt == 1 { EventOutcome::Duplicate } else { EventOutcome::NotAssigned };
                    assert_eq!(store.record_event(event, 3, MAX_ATTEMPTS).await.unwrap(), expected);
                }
                let twice = snapshot(&store).await;
                assert_eq!(&once, &twice);
                let mut distinct: Vec<(u32, String)> = sequence
                    .iter()
                    .filter(|(attempt, _)| *attempt == 1)
                    .map(|(attempt, state)| (*attempt, format!("{state:?}").to_lowercase()))
                    .collect();
                distinct.sort();
                distinct.dedup();
                let mut stored = once.2.clone();
                stored.sort();
                assert_eq!(stored, distinct);
                // Attempt 2's events never move the task; nor does a refusal,
                // which is history only.
                let first_terminal = sequence.iter().find(|(attempt, state)| {
                    *attempt == 1 && state.is_terminal() && *state != TaskState::Rejected
                });
                match first_terminal {
                    Some((_, TaskState::Succeeded)) => assert_eq!(once.0, TaskStatus::Succeeded),
                    Some((_, TaskState::Failed)) => assert_eq!(once.0, TaskStatus::Failed),
                    Some((_, _)) => assert_eq!(once.0, TaskStatus::Cancelled),
                    None => assert!(once.0.is_in_flight(), "{:?}", once.0),
                }
                store.close().await;
            });
        }

        /// Group commit changes nothing of the rules: any sequence of events
        /// (two nodes, two attempts, a task that does not exist) recorded as
        /// one batch gives the outcomes, the task and the history that
        /// recording them one by one gives, and raises the batch's marks.
        #[test]
        fn a_batch_records_what_one_by_one_records(
            sequence in proptest::collection::vec((1u32..=2, prop_oneof![Just("n"), Just("m")], state_strategy(), any::<bool>()), 1..16)
        ) {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async {
                let dir = tempfile::tempdir().unwrap();
                let mut stores = Vec::new();
                for name in ["one.db", "batch.db"] {
                    let store = Store::open(&format!("sqlite://{}", dir.path().join(name).display())).await.unwrap();
                    let bytes = common::minimal_wasm();
                    let digest = Digest(Sha256::digest(&bytes).into());
                    store.put_artifact(&digest, &bytes, Runtime::Wasm, "", 0).await.unwrap();
                    store.insert_task(&new_task("t", digest, 0)).await.unwrap();
                    assert!(store.assign_task("t", 1, "n", 0, &serde_json::json!({}), 1).await.unwrap());
                    stores.push(store);
                }
                let events: Vec<TaskEvent> = sequence
                    .iter()
                    .map(|(attempt, node, state, known)| {
                        let mut event = event(if *known { "t" } else { "no-such-task" }, *attempt, node, *state);
                        event.output = format!("{attempt}{state:?}").into_bytes();
                        event
                    })
                    .collect();
                let mut one_by_one = Vec::new();
                for event in &events {
                    one_by_one.push(stores[0].record_event(event, 2, MAX_ATTEMPTS).await.unwrap());
                }
                let batch: Vec<EventToRecord<'_>> = events
                    .iter()
                    .enumerate()
                    .map(|(i, event)| EventToRecord {
                        event,
                        mark: Some(ReportMark { node_id: event.node_id.to_string(), channel: "events", counter: 100 + i as u64 }),
                    })
                    .collect();
                let batched = stores[1].record_events(&batch, 2, MAX_ATTEMPTS).await.unwrap();
                assert_eq!(batched, one_by_one);
                assert_eq!(snapshot(&stores[1]).await, snapshot(&stores[0]).await);
                assert_eq!(
                    stores[1].task("t").await.unwrap().unwrap().updated_ms,
                    stores[0].task("t").await.unwrap().unwrap().updated_ms,
                    "an event that records nothing leaves no trace"
                );
                let last = |node: &str| events.iter().enumerate().filter(|(_, e)| e.node_id.as_str() == node).map(|(i, _)| 100 + i as u64).max();
                let mut expected: Vec<(String, String, u64)> = ["m", "n"]
                    .into_iter()
                    .filter_map(|node| Some((node.to_string(), "events".to_string(), last(node)?)))
                    .collect();
                expected.sort();
                let mut marks = stores[1].report_marks().await.unwrap();
                marks.sort();
                assert_eq!(marks, expected);
                for store in stores {
                    store.close().await;
                }
            });
        }
    }
}
