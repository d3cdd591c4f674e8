//! The federation's REST side on a running coordinator: the sites list, the
//! peer token on every federation route, forwards that are idempotent on
//! their origin, and refusals that store nothing; forwarded attempts that no
//! node can own, and the migration that moved older ones to a site column.

use crate::common;

use reqwest::StatusCode;
use serde_json::{json, Value};
use starling_api::TaskStatus;
use starling_coordinator::config::FederationConfig;
use starling_coordinator::federation::ClusterKey;
use starling_coordinator::store::forwards::{RemoteResult, TakenBack};
use starling_coordinator::store::EventOutcome;
use starling_proto::{NodeId, TaskEvent, TaskId, TaskState};

fn federation(key: &str) -> FederationConfig {
    FederationConfig {
        site: "site-x".into(),
        gossip_listen: "127.0.0.1:0".parse().unwrap(),
        gossip_advertise: None,
        seeds: Vec::new(),
        cluster_key: key.into(),
        link_mbps: 100.0,
        forward_timeout: std::time::Duration::from_secs(10),
    }
}

fn forward(origin_task: &str, artifact: &str) -> Value {
    json!({
        "origin_site": "site-home",
        "origin_task": origin_task,
        "artifact": artifact,
        "runtime": "wasm",
        "input_base64": "aGk=",
        "args": [],
        "class": "cpu",
        "demand": {},
        "limits": {},
        "work_seconds": 0.5,
        "priority": 0,
        "deadline_unix_ms": null,
        "created_ms": 1
    })
}

async fn task_count(http: &reqwest::Client, rest: &str) -> usize {
    let list = common::get_json(http, &format!("{rest}/api/v1/tasks")).await;
    list["tasks"].as_array().unwrap().len()
}

#[tokio::test]
async fn forwards_need_the_peer_token_are_idempotent_and_refusals_store_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let key = ClusterKey::generate().unwrap();
    let token = ClusterKey::parse(&key).unwrap().peer_token().to_string();
    let running = common::start_coordinator(dir.path(), |c| {
        c.federation = Some(federation(&key));
    })
    .await;
    let rest = running.rest_url();
    let http = reqwest::Client::new();

    let sites = common::get_json(&http, &format!("{rest}/api/v1/sites")).await;
    assert_eq!(sites["federated"], true);
    assert_eq!(sites["site"], "site-x");
    assert_eq!(sites["sites"][0]["state"], "self");

    let stored: Value = common::upload(&http, &rest, common::minimal_wasm()).await;
    let digest = stored["digest"].as_str().unwrap().to_string();
    let url = format!("{rest}/api/v1/federation/tasks");

    // No token, another federation's token, an API-style token: 401, nothing stored.
    let other = ClusterKey::parse(&ClusterKey::generate().unwrap())
        .unwrap()
        .peer_token()
        .to_string();
    for bearer in [None, Some(other.as_str()), Some("starling-peer.00")] {
        let mut request = http.post(&url).json(&forward("t1", &digest));
        if let Some(bearer) = bearer {
            request = request.bearer_auth(bearer);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{bearer:?}");
        let status = http
            .get(format!("{url}/site-home/t1"))
            .bearer_auth(bearer.unwrap_or(""))
            .send()
            .await
            .unwrap();
        assert_eq!(status.status(), StatusCode::UNAUTHORIZED);
    }
    assert_eq!(task_count(&http, &rest).await, 0);

    // The same forward twice (an answer lost on the way): one task.
    let mut ids = Vec::new();
    for created in [true, false] {
        let response = http
            .post(&url)
            .bearer_auth(&token)
            .json(&forward("t1", &digest))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::CREATED);
        let accepted: Value = response.json().await.unwrap();
        assert_eq!(accepted["created"], created, "{accepted}");
        ids.push(accepted["task_id"].as_str().unwrap().to_string());
    }
    assert_eq!(ids[0], ids[1]);
    assert_eq!(task_count(&http, &rest).await, 1);
    let task = common::get_json(&http, &format!("{rest}/api/v1/tasks/{}", ids[0])).await;
    assert_eq!(task["origin_site"], "site-home");
    let status: Value = http
        .get(format!("{url}/site-home/t1"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(status["task_id"], ids[0]);
    assert_eq!(status["state"], "pending");

    // Unknown forward, an artifact this site lacks from a site it never
    // heard of, a body that is not a forward: refused, nothing stored.
    let response = http
        .get(format!("{url}/site-home/t2"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    let response = http
        .post(&url)
        .bearer_auth(&token)
        .json(&forward("t3", &"ab".repeat(32)))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CONFLICT);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"], "artifact_unavailable", "{body}");
    let mut bad = forward("t4", &digest);
    bad["work_seconds"] = json!(-1.0);
    let response = http
        .post(&url)
        .bearer_auth(&token)
        .json(&bad)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let response = http
        .post(&url)
        .bearer_auth(&token)
        .header("content-type", "application/json")
        .body("{\"origin_site\": 5}")
        .send()
        .await
        .unwrap();
    assert!(response.status().is_client_error());
    assert_eq!(task_count(&http, &rest).await, 1);

    // Cancelled at its home's request.
    let cancelled: Value = http
        .post(format!("{url}/site-home/t1/cancel"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(cancelled["state"], "cancelled");
    running.shutdown().await;
}

#[tokio::test]
async fn a_coordinator_that_does_not_federate_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let running = common::start_coordinator(dir.path(), |_| {}).await;
    let rest = running.rest_url();
    let http = reqwest::Client::new();
    let sites = common::get_json(&http, &format!("{rest}/api/v1/sites")).await;
    assert_eq!(sites["federated"], false);
    let response = http
        .post(format!("{rest}/api/v1/federation/tasks"))
        .json(&forward("t1", &"ab".repeat(32)))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"], "not_federated");
    running.shutdown().await;
}

/// The home side's record of a forward, on the real store: one forward per
/// attempt, a result recorded once, a cancel passed on, and the answer of a
/// peer whose forward was taken back ignored.
#[tokio::test]
async fn a_forward_is_recorded_once_and_a_late_answer_after_take_back_is_ignored() {
    // Not federated, so no forwarder acts on these rows behind the test's
    // back; the store and the REST API are the real ones.
    let dir = tempfile::tempdir().unwrap();
    let running = common::start_coordinator(dir.path(), |_| {}).await;
    let rest = running.rest_url();
    let http = reqwest::Client::new();
    let store = running.store();
    let stored: Value = common::upload(&http, &rest, common::minimal_wasm()).await;
    let digest = stored["digest"].as_str().unwrap();
    let explanation = json!({"summary": "test"});
    let done = RemoteResult {
        status: TaskStatus::Succeeded,
        node: Some("node-y".into()),
        output: Some(b"out".to_vec()),
        exit_code: Some(0),
        failure_reason: None,
        failure_message: None,
    };

    // Forwarded, answered, finished: recorded once; a repeat changes nothing.
    let task: Value = common::submit(&http, &rest, &json!({"artifact": digest})).await;
    let id = task["id"].as_str().unwrap();
    assert!(store
        .forward_task(id, 1, "site-y", "http://y", &explanation, 1)
        .await
        .unwrap());
    assert!(!store
        .forward_task(id, 1, "site-y", "http://y", &explanation, 1)
        .await
        .unwrap());
    assert_eq!(store.open_forwards(10).await.unwrap().len(), 1);
    assert!(store.finish_forward(id, 1, &done, 2).await.unwrap());
    assert!(!store.finish_forward(id, 1, &done, 3).await.unwrap());
    let task = common::get_json(&http, &format!("{rest}/api/v1/tasks/{id}")).await;
    assert_eq!(task["state"], "succeeded", "{task:#}");
    assert_eq!(task["site"], "site-y");
    assert_eq!(task["site_node"], "node-y");
    assert_eq!(task["output_text"], "out");
    let successes = task["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["state"] == "succeeded")
        .count();
    assert_eq!(successes, 1, "{task:#}");
    assert!(store.open_forwards(10).await.unwrap().is_empty());

    // Taken back: back in the queue, the peer excluded, its late answer ignored.
    let task: Value = common::submit(&http, &rest, &json!({"artifact": digest})).await;
    let id = task["id"].as_str().unwrap();
    assert!(store
        .forward_task(id, 1, "site-y", "http://y", &explanation, 1)
        .await
        .unwrap());
    let outcome = store
        .take_back_forward(id, 1, "was declared down", 3, 2)
        .await
        .unwrap();
    assert_eq!(outcome, TakenBack::Requeued);
    assert_eq!(
        store.take_back_forward(id, 1, "again", 3, 3).await.unwrap(),
        TakenBack::AlreadyEnded
    );
    assert!(!store.finish_forward(id, 1, &done, 4).await.unwrap());
    assert_eq!(
        store.abandoned_sites(id).await.unwrap(),
        vec!["site-y".to_string()]
    );
    let task = common::get_json(&http, &format!("{rest}/api/v1/tasks/{id}")).await;
    assert_eq!(task["state"], "pending", "{task:#}");
    assert!(task.get("site").is_none(), "{task:#}");
    assert!(task["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .any(|a| a["site"] == "site-y" && a["node_id"].is_null() && a["state"] == "lost"));

    // A cancel while at a peer: accepted (202) for the forwarder to pass on,
    // and a take-back then ends the task cancelled instead of requeuing it.
    let task: Value = common::submit(&http, &rest, &json!({"artifact": digest})).await;
    let id = task["id"].as_str().unwrap();
    assert!(store
        .forward_task(id, 1, "site-y", "http://y", &explanation, 1)
        .await
        .unwrap());
    let response = http
        .post(format!("{rest}/api/v1/tasks/{id}/cancel"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    assert!(store
        .open_forwards(10)
        .await
        .unwrap()
        .iter()
        .any(|f| f.task_id == id && f.cancel_requested));
    assert_eq!(
        store
            .take_back_forward(id, 1, "was declared down", 3, 2)
            .await
            .unwrap(),
        TakenBack::Cancelled
    );
    running.shutdown().await;
}

/// The forwarder itself takes back work sent to a site the failure detector
/// does not hold alive (here: one it never heard of), and the task returns
/// to the queue with the attempt marked lost.
#[tokio::test]
async fn the_forwarder_takes_back_work_at_a_site_that_is_not_alive() {
    let dir = tempfile::tempdir().unwrap();
    let key = ClusterKey::generate().unwrap();
    let running = common::start_coordinator(dir.path(), |c| {
        c.federation = Some(federation(&key));
    })
    .await;
    let rest = running.rest_url();
    let http = reqwest::Client::new();
    let stored: Value = common::upload(&http, &rest, common::minimal_wasm()).await;
    let task: Value = common::submit(
        &http,
        &rest,
        &json!({"artifact": stored["digest"].as_str().unwrap()}),
    )
    .await;
    let id = task["id"].as_str().unwrap().to_string();
    assert!(running
        .store()
        .forward_task(&id, 1, "site-gone", "http://192.0.2.1:1", &json!({}), 1)
        .await
        .unwrap());
    let url = format!("{rest}/api/v1/tasks/{id}");
    common::eventually(
        std::time::Duration::from_secs(10),
        "the forward to be taken back",
        || {
            let (http, url) = (http.clone(), url.clone());
            async move {
                let task = common::get_json(&http, &url).await;
                let lost = task["attempts"].as_array()?.iter().any(|a| {
                    a["site"] == "site-gone" && a["node_id"].is_null() && a["state"] == "lost"
                });
                (lost && task["state"] == "pending").then_some(())
            }
        },
    )
    .await;
    assert_eq!(
        running.store().abandoned_sites(&id).await.unwrap(),
        vec!["site-gone".to_string()]
    );
    running.shutdown().await;
}

/// Issue 15, item 11, played as the attacker: forwarded attempts were once
/// recorded under the node id `site:{site}`, so a node enrolled under that
/// name owned them. That name is refused at enrollment now, and a forwarded
/// attempt has no node at all: no node's event passes its owner check,
/// before or after a take-back, and no node's timeout ends it.
#[tokio::test]
async fn no_node_owns_a_forwarded_attempt() {
    const ADMIN: &str = "federation-admin-secret";
    let dir = tempfile::tempdir().unwrap();
    // Not federated, so no forwarder acts on the rows behind the test's back.
    let running = common::start_coordinator(dir.path(), |c| {
        c.api_token = Some(ADMIN.into());
        // Enrollment is how nodes get broker logins.
        c.mqtt_allow_anonymous = false;
    })
    .await;
    let rest = running.rest_url();
    let http = reqwest::Client::new();
    let store = running.store();

    // The pseudo node id, and its relatives with a dot, are refused with a
    // 400 that says what a node id may hold.
    let answer = http
        .post(format!("{rest}/api/v1/join-tokens"))
        .bearer_auth(ADMIN)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::CREATED);
    let join: Value = answer.json().await.unwrap();
    let join = join["token"].as_str().unwrap();
    for node in ["site:plant-b", "..", ".", "plant-b.local"] {
        let answer = http
            .post(format!("{rest}/api/v1/enroll"))
            .json(&json!({
                "join_token": join,
                "node_id": node,
                "report_key": common::report_key_hex("attacker"),
            }))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), StatusCode::BAD_REQUEST, "{node}");
        let body: Value = answer.json().await.unwrap();
        assert_eq!(body["error"], "invalid_node_id", "{node}: {body}");
        let message = body["message"].as_str().unwrap();
        assert!(
            message.contains("ASCII letters, digits, '-' and '_'"),
            "{node}: {message}"
        );
    }

    // A task forwarded to plant-b, the attempt recorded with the site.
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(
        reqwest::header::AUTHORIZATION,
        format!("Bearer {ADMIN}").parse().unwrap(),
    );
    let http = reqwest::Client::builder()
        .default_headers(headers)
        .build()
        .unwrap();
    let stored: Value = common::upload(&http, &rest, common::minimal_wasm()).await;
    let task: Value = common::submit(
        &http,
        &rest,
        &json!({"artifact": stored["digest"].as_str().unwrap()}),
    )
    .await;
    let id = task["id"].as_str().unwrap().to_string();
    assert!(store
        .forward_task(&id, 1, "plant-b", "http://plant-b", &json!({}), 1)
        .await
        .unwrap());
    let attempts = store.attempts(&id).await.unwrap();
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].node_id, None);
    assert_eq!(attempts[0].site.as_deref(), Some("plant-b"));

    // Every name an attacker might pick: the site's, the old pseudo id with
    // the `:` replaced, and an ordinary node.
    let attackers = ["plant-b", "site-plant-b", "site_plant-b", "site", "pi-1"];
    let forge = |node: &str, state: TaskState| {
        TaskEvent::state(
            TaskId::new(&id).unwrap(),
            1,
            NodeId::new(node).unwrap(),
            state,
        )
    };
    for node in attackers {
        for state in [TaskState::Running, TaskState::Succeeded, TaskState::Failed] {
            assert_eq!(
                store.record_event(&forge(node, state), 2, 3).await.unwrap(),
                EventOutcome::NotAssigned,
                "{node} {state:?} while forwarded"
            );
        }
        // A node of that name timing out does not end the forwarded attempt.
        assert!(store
            .requeue_node_tasks(node, 3, 2)
            .await
            .unwrap()
            .is_empty());
    }
    assert_eq!(store.open_forwards(10).await.unwrap().len(), 1);

    // After a take-back the task waits in the queue: the rule that accepts a
    // late result of the latest attempt from the node that ran it must not
    // see any node as that one.
    assert_eq!(
        store
            .take_back_forward(&id, 1, "was declared down", 3, 3)
            .await
            .unwrap(),
        TakenBack::Requeued
    );
    for node in attackers {
        assert_eq!(
            store
                .record_event(&forge(node, TaskState::Succeeded), 4, 3)
                .await
                .unwrap(),
            EventOutcome::NotAssigned,
            "{node} after the take-back"
        );
    }
    let task = common::get_json(&http, &format!("{rest}/api/v1/tasks/{id}")).await;
    assert_eq!(task["state"], "pending", "{task:#}");
    assert!(task["output_text"].is_null(), "{task:#}");
    // The REST view shows where the attempt went: the site, no node.
    let attempt = &task["attempts"][0];
    assert_eq!(attempt["site"], "plant-b", "{task:#}");
    assert!(attempt["node_id"].is_null(), "{task:#}");
    let lost = &task["events"][0];
    assert_eq!(lost["state"], "lost", "{task:#}");
    assert_eq!(lost["site"], "plant-b", "{task:#}");
    assert!(lost["node_id"].is_null(), "{task:#}");
    running.shutdown().await;
}

/// Runs the migrations up to 0006 (the schema of the versions that wrote
/// `site:NAME` attempts) on `$pool`, then writes rows the way they did.
macro_rules! write_legacy_rows {
    ($pool:expr) => {{
        let pool = $pool;
        let migrations = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
        let mut old = sqlx::migrate::Migrator::new(migrations).await.unwrap();
        old.migrations = old
            .migrations
            .iter()
            .filter(|migration| migration.version <= 6)
            .cloned()
            .collect::<Vec<_>>()
            .into();
        old.run(pool).await.unwrap();
        sqlx::query("INSERT INTO artifacts (digest, size_bytes, bytes, created_ms) VALUES ('d', 1, $1, 1)")
            .bind(vec![0u8])
            .execute(pool)
            .await
            .unwrap();
        for id in ["legacy-forwarded", "legacy-local"] {
            sqlx::query(
                "INSERT INTO tasks (id, artifact, runtime, input, args, class, demand, limits, work_seconds, \
                 priority, created_ms, updated_ms, state, attempt, cancel_requested) \
                 VALUES ($1, 'd', 'wasm', $2, '[]', 'cpu', '{}', '{}', 1.0, 0, 1, 1, 'succeeded', 2, 0)",
            )
            .bind(id)
            .bind(Vec::<u8>::new())
            .execute(pool)
            .await
            .unwrap();
        }
        let statements = [
            // Forwarded twice: taken back once, then run by pi-9 at plant-b.
            "INSERT INTO attempts (task_id, attempt, node_id, power_level, assigned_ms, state) \
             VALUES ('legacy-forwarded', 1, 'site:plant-b', 0, 1, 'lost')",
            "INSERT INTO attempts (task_id, attempt, node_id, power_level, assigned_ms, state) \
             VALUES ('legacy-forwarded', 2, 'site:plant-b', 0, 2, 'succeeded')",
            "INSERT INTO forwards (task_id, attempt, site, api_url, state, created_ms, answered_ms) \
             VALUES ('legacy-forwarded', 1, 'plant-b', 'http://b', 'abandoned', 1, 2)",
            "INSERT INTO forwards (task_id, attempt, site, api_url, state, created_ms, answered_ms) \
             VALUES ('legacy-forwarded', 2, 'plant-b', 'http://b', 'done', 2, 3)",
            "INSERT INTO events (task_id, attempt, state, node_id, received_ms, output_bytes) \
             VALUES ('legacy-forwarded', 1, 'lost', 'site:plant-b', 2, 0)",
            "INSERT INTO events (task_id, attempt, state, node_id, received_ms, output_bytes) \
             VALUES ('legacy-forwarded', 2, 'succeeded', 'plant-b/pi-9', 3, 3)",
            // A local node an older version let enroll as `site:odd`: its
            // attempt stays its own (no forward row names it).
            "INSERT INTO attempts (task_id, attempt, node_id, power_level, assigned_ms, state) \
             VALUES ('legacy-local', 1, 'site:odd', 0, 1, 'succeeded')",
            "INSERT INTO events (task_id, attempt, state, node_id, received_ms, output_bytes) \
             VALUES ('legacy-local', 1, 'succeeded', 'site:odd', 2, 0)",
        ];
        for statement in statements {
            sqlx::query(statement).execute(pool).await.unwrap();
        }
    }};
}

/// What migration 0008 must make of the legacy rows.
async fn check_migrated_legacy_rows(store: &starling_coordinator::store::Store) {
    let attempts = store.attempts("legacy-forwarded").await.unwrap();
    let places: Vec<(Option<&str>, Option<&str>)> = attempts
        .iter()
        .map(|a| (a.node_id.as_deref(), a.site.as_deref()))
        .collect();
    assert_eq!(places, [(None, Some("plant-b")), (None, Some("plant-b"))]);
    let events = store.events("legacy-forwarded").await.unwrap();
    let places: Vec<(&str, Option<&str>, Option<&str>)> = events
        .iter()
        .map(|e| (e.state.as_str(), e.node_id.as_deref(), e.site.as_deref()))
        .collect();
    assert_eq!(
        places,
        [
            ("lost", None, Some("plant-b")),
            ("succeeded", Some("pi-9"), Some("plant-b"))
        ]
    );
    let local = store.attempts("legacy-local").await.unwrap();
    assert_eq!(local[0].node_id.as_deref(), Some("site:odd"));
    assert_eq!(local[0].site, None);
    let events = store.events("legacy-local").await.unwrap();
    assert_eq!(events[0].node_id.as_deref(), Some("site:odd"));
    assert_eq!(events[0].site, None);
}

#[tokio::test]
async fn migration_0008_moves_legacy_site_attempts_to_the_site_column_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!(
        "sqlite://{}?mode=rwc",
        dir.path().join("legacy.db").display()
    );
    let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
    write_legacy_rows!(&pool);
    pool.close().await;
    let store = starling_coordinator::store::Store::open(&url)
        .await
        .unwrap();
    check_migrated_legacy_rows(&store).await;
    store.close().await;
}

#[tokio::test]
async fn migration_0008_moves_legacy_site_attempts_to_the_site_column_on_postgres() {
    let db = common::PostgresDb::create();
    let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
    write_legacy_rows!(&pool);
    pool.close().await;
    let store = starling_coordinator::store::Store::open(&db.url)
        .await
        .unwrap();
    check_migrated_legacy_rows(&store).await;
    store.close().await;
    drop(db);
}
