//! Many tasks through the whole coordinator (REST, scheduler, embedded broker,
//! two stand-in agents, ingest, store) on SQLite and on PostgreSQL, side by
//! side: every task succeeds once, each event is stored once. It prints the
//! throughput of each backend and their ratio; it asserts no timings.

use crate::common;

use std::time::{Duration, Instant};

use serde_json::{json, Value};

const TASKS: usize = 100;

async fn run_batch(db: Option<String>) -> Duration {
    let dir = tempfile::tempdir().unwrap();
    let running = common::start_coordinator(dir.path(), |c| c.db = db).await;
    let rest = running.rest_url();
    let http = reqwest::Client::new();
    common::stand_in_agent(running.mqtt_url(), "bulk-a").await;
    common::stand_in_agent(running.mqtt_url(), "bulk-b").await;
    common::eventually(Duration::from_secs(15), "two nodes online", || {
        let http = http.clone();
        let url = format!("{rest}/api/v1/health");
        async move {
            let health: Value = http.get(url).send().await.ok()?.json().await.ok()?;
            (health["nodes_online"] == 2).then_some(())
        }
    })
    .await;
    let stored: Value = common::upload(&http, &rest, common::minimal_wasm()).await;

    let started = Instant::now();
    let mut ids = Vec::with_capacity(TASKS);
    for n in 0..TASKS {
        let task: Value = common::submit(
            &http,
            &rest,
            &json!({"artifact": stored["digest"], "input_text": format!("{n}")}),
        )
        .await;
        ids.push(task["id"].as_str().unwrap().to_string());
    }
    let url = format!("{rest}/api/v1/tasks?state=succeeded&limit=1000");
    common::eventually(Duration::from_secs(60), "every task to succeed", || {
        let http = http.clone();
        let url = url.clone();
        async move {
            let listed: Value = http.get(url).send().await.ok()?.json().await.ok()?;
            (listed["tasks"].as_array()?.len() == TASKS).then_some(())
        }
    })
    .await;
    let elapsed = started.elapsed();

    let mut per_node = std::collections::BTreeMap::new();
    for (n, id) in ids.iter().enumerate() {
        let task = running.store().task(id).await.unwrap().unwrap();
        assert_eq!(task.output, Some(format!("echo:{n}").into_bytes()));
        assert_eq!(task.attempt, 1);
        let events = running.store().events(id).await.unwrap();
        let states: Vec<&str> = events.iter().map(|e| e.state.as_str()).collect();
        assert_eq!(states, ["running", "succeeded"], "task {id}");
        *per_node.entry(task.node_id.unwrap()).or_insert(0usize) += 1;
    }
    println!(
        "{} tasks per node: {per_node:?}",
        running.store().backend_name()
    );
    running.shutdown().await;
    elapsed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_tasks_on_sqlite_and_postgres() {
    let sqlite = run_batch(None).await;
    let db = common::PostgresDb::create();
    let postgres = run_batch(Some(db.url.clone())).await;
    drop(db);
    let rate = |elapsed: Duration| TASKS as f64 / elapsed.as_secs_f64();
    println!(
        "{TASKS} tasks submitted and completed: sqlite {:.0} tasks/s ({sqlite:?}), postgres {:.0} tasks/s ({postgres:?}), postgres/sqlite time ratio {:.2}",
        rate(sqlite),
        rate(postgres),
        postgres.as_secs_f64() / sqlite.as_secs_f64()
    );
}
