//! The federation's REST side on a running coordinator: the sites list, the
//! peer token on every federation route, forwards that are idempotent on
//! their origin, and refusals that store nothing.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use reqwest::StatusCode;
use serde_json::{json, Value};
use starling_coordinator::config::FederationConfig;
use starling_coordinator::federation::ClusterKey;

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
    let list: Value = http
        .get(format!("{rest}/api/v1/tasks"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
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

    let sites: Value = http
        .get(format!("{rest}/api/v1/sites"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
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
    let task: Value = http
        .get(format!("{rest}/api/v1/tasks/{}", ids[0]))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
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
    let sites: Value = http
        .get(format!("{rest}/api/v1/sites"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
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
