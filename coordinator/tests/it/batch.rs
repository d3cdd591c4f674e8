//! `POST /api/v1/tasks:batch` on a running coordinator: a batch is created
//! in order and runs; an invalid item, an oversize or empty batch and a
//! caller without the developer role are refused and create nothing; the
//! store's batch insert is one transaction. On SQLite and PostgreSQL.

use crate::common;

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};
use starling_api::client::{Client, ClientError};
use starling_api::{ErrorCode, Role, SubmitTask, TaskStatus, MAX_BATCH_TASKS};
use starling_coordinator::store::{NewTask, Store};
use starling_proto::{Digest, Runtime};

const BOOTSTRAP: &str = "batch-admin-secret";

fn task(digest: &str, input: &str) -> SubmitTask {
    SubmitTask {
        artifact: digest.to_string(),
        input_text: Some(input.to_string()),
        ..SubmitTask::default()
    }
}

/// How many tasks the coordinator holds, in any state.
async fn stored_tasks(running: &starling_coordinator::Running) -> usize {
    running.store().list_tasks(None, 2000).await.unwrap().len()
}

async fn batch_of_500_runs_in_order(db: Option<String>) {
    let dir = tempfile::tempdir().unwrap();
    let running = common::start_coordinator(dir.path(), |c| c.db = db).await;
    let rest = running.rest_url();
    let http = reqwest::Client::new();
    common::stand_in_agent(running.mqtt_url(), "batch-a").await;
    common::stand_in_agent(running.mqtt_url(), "batch-b").await;
    let stored = common::upload(&http, &rest, common::minimal_wasm()).await;
    let digest = stored["digest"].as_str().unwrap();
    let client = Client::new(&rest, None);

    let tasks: Vec<SubmitTask> = (0..500).map(|n| task(digest, &n.to_string())).collect();
    let created = client.submit_batch(&tasks).await.unwrap().tasks;
    assert_eq!(created.len(), 500);
    for task in &created {
        assert_eq!(task.state, TaskStatus::Pending);
        assert_eq!(task.artifact, digest);
        assert_eq!(task.attempt, 0);
    }
    // In the order given: ids (UUIDv7) rise, so the queue takes them in order too.
    assert!(created.windows(2).all(|pair| pair[0].id < pair[1].id));
    let backend = running.store().backend_name();

    let url = format!("{rest}/api/v1/tasks?state=succeeded&limit=1000");
    common::eventually(
        Duration::from_secs(180),
        "every task of the batch to succeed",
        || {
            let http = http.clone();
            let url = url.clone();
            async move {
                let listed: Value = http.get(url).send().await.ok()?.json().await.ok()?;
                (listed["tasks"].as_array()?.len() == 500).then_some(())
            }
        },
    )
    .await;
    // Each task got its own item: task n echoes input n.
    for (n, created) in created.iter().enumerate() {
        let task = running.store().task(&created.id).await.unwrap().unwrap();
        assert_eq!(
            task.output,
            Some(format!("echo:{n}").into_bytes()),
            "{backend}"
        );
        assert_eq!(task.attempt, 1, "{backend}");
    }
    assert_eq!(stored_tasks(&running).await, 500);
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_500_is_created_in_order_and_runs_on_sqlite() {
    batch_of_500_runs_in_order(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_500_is_created_in_order_and_runs_on_postgres() {
    let db = common::PostgresDb::create();
    batch_of_500_runs_in_order(Some(db.url.clone())).await;
    drop(db);
}

/// A refusal's code, status and the item its message names.
fn refusal(error: ClientError) -> (ErrorCode, u16, Option<usize>, String) {
    match error {
        ClientError::Api {
            code,
            status,
            message,
            ..
        } => (
            code,
            status,
            starling_api::batch_item_index(&message),
            message,
        ),
        other => panic!("not a refusal: {other}"),
    }
}

#[tokio::test]
async fn an_invalid_item_creates_nothing_and_is_named_by_its_index() {
    let dir = tempfile::tempdir().unwrap();
    let running = common::start_coordinator(dir.path(), |_| {}).await;
    let rest = running.rest_url();
    let http = reqwest::Client::new();
    let stored = common::upload(&http, &rest, common::minimal_wasm()).await;
    let digest = stored["digest"].as_str().unwrap();
    let client = Client::new(&rest, None);
    let good = |n: usize| task(digest, &n.to_string());

    let unknown = "ab".repeat(32);
    let too_long = "x".repeat(starling_proto::limits::MAX_INLINE_INPUT_BYTES + 1);
    let cases: Vec<(usize, SubmitTask, ErrorCode, u16)> = vec![
        (2, task("not-a-digest", "x"), ErrorCode::InvalidDigest, 400),
        (3, task(&unknown, "x"), ErrorCode::ArtifactNotFound, 404),
        (1, task(digest, &too_long), ErrorCode::InputTooLarge, 413),
        (
            4,
            SubmitTask {
                limits: starling_api::TaskLimits {
                    wall_ms: 0,
                    ..Default::default()
                },
                ..good(4)
            },
            ErrorCode::InvalidLimits,
            400,
        ),
    ];
    for (bad, item, code, status) in cases {
        let mut tasks: Vec<SubmitTask> = (0..6).map(good).collect();
        tasks[bad] = item;
        let (got_code, got_status, index, message) =
            refusal(client.submit_batch(&tasks).await.unwrap_err());
        assert_eq!((got_code, got_status), (code, status), "{message}");
        assert_eq!(index, Some(bad), "{message}");
        assert!(message.starts_with(&format!("tasks[{bad}]: ")), "{message}");
        assert_eq!(stored_tasks(&running).await, 0, "{message}");
    }

    // A body that is not a batch: 422, and nothing created.
    let answer = http
        .post(format!("{rest}/api/v1/tasks:batch"))
        .json(&json!({"task": [{"artifact": digest}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let body: Value = answer.json().await.unwrap();
    assert_eq!(body["error"], "invalid_json", "{body}");
    assert_eq!(stored_tasks(&running).await, 0);

    // The same items, fixed, are all created.
    let tasks: Vec<SubmitTask> = (0..6).map(good).collect();
    assert_eq!(client.submit_batch(&tasks).await.unwrap().tasks.len(), 6);
    assert_eq!(stored_tasks(&running).await, 6);
    running.shutdown().await;
}

#[tokio::test]
async fn empty_and_oversize_batches_are_refused_with_their_codes() {
    let dir = tempfile::tempdir().unwrap();
    let running = common::start_coordinator(dir.path(), |_| {}).await;
    let rest = running.rest_url();
    let http = reqwest::Client::new();
    let stored = common::upload(&http, &rest, common::minimal_wasm()).await;
    let digest = stored["digest"].as_str().unwrap();
    let client = Client::new(&rest, None);

    let (code, status, index, message) = refusal(client.submit_batch(&[]).await.unwrap_err());
    assert_eq!(
        (code, status, index),
        (ErrorCode::EmptyBatch, 400, None),
        "{message}"
    );

    let tasks: Vec<SubmitTask> = (0..=MAX_BATCH_TASKS)
        .map(|n| task(digest, &n.to_string()))
        .collect();
    let (code, status, index, message) = refusal(client.submit_batch(&tasks).await.unwrap_err());
    assert_eq!(
        (code, status, index),
        (ErrorCode::BatchTooLarge, 413, None),
        "{message}"
    );
    assert!(
        message.contains("1001") && message.contains("1000"),
        "{message}"
    );
    assert_eq!(stored_tasks(&running).await, 0);

    // The body limit is the batch route's own (8 MiB), above the 2 MiB of
    // other JSON routes: 3 MiB of inputs pass, 9 MiB do not.
    let input = "y".repeat(500 * 1024);
    let three_mib: Vec<SubmitTask> = (0..6).map(|_| task(digest, &input)).collect();
    assert_eq!(
        client.submit_batch(&three_mib).await.unwrap().tasks.len(),
        6
    );
    let nine_mib: Vec<SubmitTask> = (0..18).map(|_| task(digest, &input)).collect();
    let (_, status, _, message) = refusal(client.submit_batch(&nine_mib).await.unwrap_err());
    assert_eq!(status, 413, "{message}");
    assert_eq!(stored_tasks(&running).await, 6);

    // The full 1000 in one batch are taken.
    let tasks: Vec<SubmitTask> = (0..MAX_BATCH_TASKS)
        .map(|n| task(digest, &n.to_string()))
        .collect();
    assert_eq!(
        client.submit_batch(&tasks).await.unwrap().tasks.len(),
        MAX_BATCH_TASKS
    );
    assert_eq!(stored_tasks(&running).await, 6 + MAX_BATCH_TASKS);
    running.shutdown().await;
}

async fn create_token(http: &reqwest::Client, rest: &str, role: Role) -> String {
    let answer = http
        .post(format!("{rest}/api/v1/api-tokens"))
        .bearer_auth(BOOTSTRAP)
        .json(&json!({"name": format!("batch-{role}"), "role": role}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::CREATED);
    let body: Value = answer.json().await.unwrap();
    body["token"].as_str().unwrap().to_string()
}

/// The attacker holds a viewer token (or none): the batch is refused before
/// its body is read and nothing is created; a developer's goes through.
#[tokio::test]
async fn a_viewer_cannot_submit_a_batch() {
    let dir = tempfile::tempdir().unwrap();
    let running =
        common::start_coordinator(dir.path(), |c| c.api_token = Some(BOOTSTRAP.into())).await;
    let rest = running.rest_url();
    let http = reqwest::Client::new();
    let viewer = create_token(&http, &rest, Role::Viewer).await;
    let developer = create_token(&http, &rest, Role::Developer).await;
    let stored: Value = http
        .post(format!("{rest}/api/v1/artifacts"))
        .bearer_auth(BOOTSTRAP)
        .body(common::minimal_wasm())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let digest = stored["digest"].as_str().unwrap();
    let tasks: Vec<SubmitTask> = (0..10).map(|n| task(digest, &n.to_string())).collect();

    let (code, status, _, _) = refusal(
        Client::new(&rest, Some(viewer))
            .submit_batch(&tasks)
            .await
            .unwrap_err(),
    );
    assert_eq!((code, status), (ErrorCode::Forbidden, 403));
    for token in [None, Some("stk_guess".to_string())] {
        let (code, status, _, _) = refusal(
            Client::new(&rest, token)
                .submit_batch(&tasks)
                .await
                .unwrap_err(),
        );
        assert_eq!((code, status), (ErrorCode::Unauthorized, 401));
    }
    assert_eq!(stored_tasks(&running).await, 0);

    let created = Client::new(&rest, Some(developer))
        .submit_batch(&tasks)
        .await
        .unwrap();
    assert_eq!(created.tasks.len(), 10);
    assert_eq!(stored_tasks(&running).await, 10);
    running.shutdown().await;
}

fn new_task(id: &str, artifact: Digest, created_ms: u64) -> NewTask {
    NewTask {
        id: id.to_string(),
        artifact,
        runtime: Runtime::Wasm,
        input: Vec::new(),
        args: Vec::new(),
        class: Default::default(),
        demand: Default::default(),
        limits: Default::default(),
        work_seconds: 1.0,
        priority: 0,
        deadline_unix_ms: None,
        created_ms,
    }
}

/// The store's batch insert is one transaction: a row that fails (a
/// duplicate id) in the middle leaves none of the batch behind.
async fn batch_insert_is_all_or_nothing(store: &Store) {
    let artifact = Digest([9; 32]);
    store
        .put_artifact(&artifact, b"\0asm", Runtime::Wasm, "", 1)
        .await
        .unwrap();
    let batch = [
        new_task("batch-1", artifact, 10),
        new_task("batch-2", artifact, 10),
        new_task("batch-1", artifact, 10),
        new_task("batch-3", artifact, 10),
    ];
    store.insert_tasks(&batch).await.unwrap_err();
    assert!(store.list_tasks(None, 10).await.unwrap().is_empty());
    store.insert_tasks(&batch[..2]).await.unwrap();
    let listed = store.list_tasks(None, 10).await.unwrap();
    assert_eq!(listed.len(), 2);
    assert!(listed.iter().all(|task| task.status == TaskStatus::Pending));
}

#[tokio::test]
async fn the_batch_insert_is_one_transaction_on_sqlite_and_postgres() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("batch.db").display());
    let store = Store::open(&url).await.unwrap();
    batch_insert_is_all_or_nothing(&store).await;
    store.close().await;

    let db = common::PostgresDb::create();
    let store = Store::open(&db.url).await.unwrap();
    batch_insert_is_all_or_nothing(&store).await;
    store.close().await;
    drop(db);
}

/// 1,000 single submits against one batch of 1,000 (no agents: only
/// submission is timed). Prints the figures; asserts no timings.
async fn single_submits_against_one_batch(db: Option<String>) {
    let dir = tempfile::tempdir().unwrap();
    let running = common::start_coordinator(dir.path(), |c| c.db = db).await;
    let rest = running.rest_url();
    let http = reqwest::Client::new();
    let stored = common::upload(&http, &rest, common::minimal_wasm()).await;
    let digest = stored["digest"].as_str().unwrap();
    let client = Client::new(&rest, None);
    let tasks: Vec<SubmitTask> = (0..MAX_BATCH_TASKS)
        .map(|n| task(digest, &n.to_string()))
        .collect();

    let started = Instant::now();
    for task in &tasks {
        client.submit(task).await.unwrap();
    }
    let single = started.elapsed();
    let started = Instant::now();
    client.submit_batch(&tasks).await.unwrap();
    let batch = started.elapsed();
    assert_eq!(stored_tasks(&running).await, 2 * MAX_BATCH_TASKS);
    println!(
        "{MAX_BATCH_TASKS} tasks on {}: single submits {single:?}, one batch {batch:?}, ratio {:.1}x",
        running.store().backend_name(),
        single.as_secs_f64() / batch.as_secs_f64()
    );
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_single_submits_against_one_batch() {
    single_submits_against_one_batch(None).await;
    let db = common::PostgresDb::create();
    single_submits_against_one_batch(Some(db.url.clone())).await;
    drop(db);
}
