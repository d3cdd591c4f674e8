//! The federation's REST side on a running coordinator: the sites list, the
//! peer token on every federation route, forwards that are idempotent on
//! their origin, and refusals that store nothing.

use crate::common;

use reqwest::StatusCode;
use serde_json::{json, Value};
use starling_api::TaskStatus;
use starling_coordinator::config::FederationConfig;
use starling_coordinator::federation::ClusterKey;
use starling_coordinator::store::forwards::{RemoteResult, TakenBack};

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

async fn get_json(http: &reqwest::Client, url: &str) -> Value {
    http.get(url).send().await.unwrap().json().await.unwrap()
}

async fn task_count(http: &reqwest::Client, rest: &str) -> usize {
    let list = get_json(http, &format!("{rest}/api/v1/tasks")).await;
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

    let sites = get_json(&http, &format!("{rest}/api/v1/sites")).await;
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
    let task = get_json(&http, &format!("{rest}/api/v1/tasks/{}", ids[0])).await;
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
    let sites = get_json(&http, &format!("{rest}/api/v1/sites")).await;
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
    let task = get_json(&http, &format!("{rest}/api/v1/tasks/{id}")).await;
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
    let task = get_json(&http, &format!("{rest}/api/v1/tasks/{id}")).await;
    assert_eq!(task["state"], "pending", "{task:#}");
    assert!(task.get("site").is_none(), "{task:#}");
    assert!(task["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .any(|a| a["node_id"] == "site:site-y" && a["state"] == "lost"));

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
                let task = get_json(&http, &url).await;
                let lost = task["attempts"]
                    .as_array()?
                    .iter()
                    .any(|a| a["node_id"] == "site:site-gone" && a["state"] == "lost");
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
