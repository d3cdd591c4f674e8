//! The REST API on a running coordinator: refusals with the right status and a
//! JSON error, the bearer token, and the OpenAPI document.

use crate::common;

use std::time::Duration;

use reqwest::StatusCode;
use rumqttc::QoS;
use serde_json::{json, Value};
use starling_proto::{encode, Channel, NodeId, NodeState, Topics};

async fn error_of(response: reqwest::Response, status: StatusCode) -> Value {
    assert_eq!(response.status(), status);
    let body: Value = response.json().await.unwrap();
    assert!(body["error"].is_string(), "{body}");
    assert!(body["message"].as_str().unwrap().len() > 10, "{body}");
    body
}

#[tokio::test]
async fn refusals_are_json_errors_with_the_right_status() {
    let dir = tempfile::tempdir().unwrap();
    let running = common::start_coordinator(dir.path(), |c| c.max_artifact_bytes = 4096).await;
    let base = format!("{}/api/v1", running.rest_url());
    let http = reqwest::Client::new();

    let health: Value = http
        .get(format!("{base}/health"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(health["status"], "ok");
    assert_eq!(health["database"], "sqlite");

    // Not wasm.
    let response = http
        .post(format!("{base}/artifacts"))
        .body("#!/bin/sh\necho hi\n")
        .send()
        .await
        .unwrap();
    let body = error_of(response, StatusCode::BAD_REQUEST).await;
    assert_eq!(body["error"], "invalid_artifact");
    assert!(body["message"]
        .as_str()
        .unwrap()
        .contains("not a WebAssembly module"));
    // Wasm header, broken body.
    let response = http
        .post(format!("{base}/artifacts"))
        .body(&b"\0asm\x01\0\0\0\x01\x05"[..])
        .send()
        .await
        .unwrap();
    error_of(response, StatusCode::BAD_REQUEST).await;
    // Over the size limit.
    let mut big = common::minimal_wasm();
    big.resize(8192, 0);
    let response = http
        .post(format!("{base}/artifacts"))
        .body(big)
        .send()
        .await
        .unwrap();
    let body = error_of(response, StatusCode::PAYLOAD_TOO_LARGE).await;
    assert_eq!(body["error"], "artifact_too_large");

    // A module, twice.
    let module = common::minimal_wasm();
    let first: Value = http
        .post(format!("{base}/artifacts"))
        .body(module.clone())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let second = http
        .post(format!("{base}/artifacts"))
        .body(module.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(second.status(), StatusCode::CREATED);
    let second: Value = second.json().await.unwrap();
    assert_eq!(first["digest"], second["digest"]);
    assert_eq!(first["created"], true);
    assert_eq!(second["created"], false);
    assert_eq!(first["size"], module.len());
    let digest = first["digest"].as_str().unwrap().to_string();
    let fetched = http
        .get(format!("{base}/artifacts/{digest}"))
        .send()
        .await
        .unwrap();
    assert_eq!(fetched.status(), StatusCode::OK);
    assert_eq!(fetched.bytes().await.unwrap().to_vec(), module);

    // Unknown and malformed digests.
    let response = http
        .get(format!("{base}/artifacts/{}", "ab".repeat(32)))
        .send()
        .await
        .unwrap();
    error_of(response, StatusCode::NOT_FOUND).await;
    let response = http
        .get(format!("{base}/artifacts/xyz"))
        .send()
        .await
        .unwrap();
    error_of(response, StatusCode::BAD_REQUEST).await;

    // Submissions.
    let response = http
        .post(format!("{base}/tasks"))
        .json(&json!({"artifact": "ab".repeat(32)}))
        .send()
        .await
        .unwrap();
    let body = error_of(response, StatusCode::NOT_FOUND).await;
    assert_eq!(body["error"], "artifact_not_found");
    let response = http
        .post(format!("{base}/tasks"))
        .json(&json!({"artifact": digest, "input_text": "a", "input_base64": "YQ=="}))
        .send()
        .await
        .unwrap();
    error_of(response, StatusCode::BAD_REQUEST).await;
    let response = http
        .post(format!("{base}/tasks"))
        .json(&json!({"artifact": digest, "input_base64": "!!!"}))
        .send()
        .await
        .unwrap();
    error_of(response, StatusCode::BAD_REQUEST).await;
    let response = http
        .post(format!("{base}/tasks"))
        .json(&json!({"artifact": digest, "priority": 999}))
        .send()
        .await
        .unwrap();
    error_of(response, StatusCode::UNPROCESSABLE_ENTITY).await;
    let response = http
        .post(format!("{base}/tasks"))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    error_of(response, StatusCode::BAD_REQUEST).await;
    let response = http
        .post(format!("{base}/tasks"))
        .json(&json!({"artifact": digest, "input_text": "x".repeat(600 * 1024)}))
        .send()
        .await
        .unwrap();
    error_of(response, StatusCode::PAYLOAD_TOO_LARGE).await;

    let created = http.post(format!("{base}/tasks"))
        .json(&json!({"artifact": digest, "input_text": "hello", "args": ["a", "b"], "deadline_ms": 60000, "priority": 3, "class": "io"}))
        .send().await.unwrap();
    assert_eq!(created.status(), StatusCode::CREATED);
    let task: Value = created.json().await.unwrap();
    assert_eq!(task["state"], "pending");
    assert_eq!(task["input_bytes"], 5);
    assert_eq!(task["class"], "io");
    assert!(task["deadline_unix_ms"].as_u64().unwrap() > task["created_ms"].as_u64().unwrap());
    let id = task["id"].as_str().unwrap().to_string();

    // No node exists, so the policy holds it and says why.
    let held = common::eventually(Duration::from_secs(10), "a hold explanation", || {
        let http = http.clone();
        let url = format!("{base}/tasks/{id}");
        async move {
            let task: Value = http.get(url).send().await.ok()?.json().await.ok()?;
            task["explanation"].is_object().then_some(task)
        }
    })
    .await;
    assert_eq!(held["state"], "pending");
    assert!(held["explanation"]["summary"].is_string(), "{held}");

    let listed: Value = http
        .get(format!("{base}/tasks?state=pending&limit=5"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed["tasks"][0]["id"], id.as_str());
    let response = http
        .get(format!("{base}/tasks?state=sleeping"))
        .send()
        .await
        .unwrap();
    error_of(response, StatusCode::BAD_REQUEST).await;

    // Unknown tasks, nodes and routes.
    error_of(
        http.get(format!("{base}/tasks/no-such-task"))
            .send()
            .await
            .unwrap(),
        StatusCode::NOT_FOUND,
    )
    .await;
    error_of(
        http.post(format!("{base}/tasks/no-such-task/cancel"))
            .send()
            .await
            .unwrap(),
        StatusCode::NOT_FOUND,
    )
    .await;
    error_of(
        http.get(format!("{base}/nodes/ghost"))
            .send()
            .await
            .unwrap(),
        StatusCode::NOT_FOUND,
    )
    .await;
    error_of(
        http.get(format!("{base}/nope")).send().await.unwrap(),
        StatusCode::NOT_FOUND,
    )
    .await;

    // Cancel a pending task, then again.
    let cancelled = http
        .post(format!("{base}/tasks/{id}/cancel"))
        .send()
        .await
        .unwrap();
    assert_eq!(cancelled.status(), StatusCode::OK);
    let cancelled: Value = cancelled.json().await.unwrap();
    assert_eq!(cancelled["state"], "cancelled");
    error_of(
        http.post(format!("{base}/tasks/{id}/cancel"))
            .send()
            .await
            .unwrap(),
        StatusCode::CONFLICT,
    )
    .await;

    running.shutdown().await;
}

#[tokio::test]
async fn calls_need_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let running =
        common::start_coordinator(dir.path(), |c| c.api_token = Some("s3cret".into())).await;
    let base = format!("{}/api/v1", running.rest_url());
    let http = reqwest::Client::new();
    let module = common::minimal_wasm();

    let missing = http
        .post(format!("{base}/artifacts"))
        .body(module.clone())
        .send()
        .await
        .unwrap();
    let body = error_of(missing, StatusCode::UNAUTHORIZED).await;
    assert_eq!(body["error"], "unauthorized");
    let wrong = http
        .post(format!("{base}/artifacts"))
        .bearer_auth("guess")
        .body(module.clone())
        .send()
        .await
        .unwrap();
    error_of(wrong, StatusCode::UNAUTHORIZED).await;
    error_of(
        http.post(format!("{base}/tasks"))
            .json(&json!({}))
            .send()
            .await
            .unwrap(),
        StatusCode::UNAUTHORIZED,
    )
    .await;
    error_of(
        http.post(format!("{base}/tasks/x/cancel"))
            .send()
            .await
            .unwrap(),
        StatusCode::UNAUTHORIZED,
    )
    .await;
    // Nothing was stored by the refused upload.
    let listed: Value = http
        .get(format!("{base}/tasks"))
        .bearer_auth("s3cret")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed["tasks"], json!([]));

    let ok = http
        .post(format!("{base}/artifacts"))
        .bearer_auth("s3cret")
        .body(module)
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), StatusCode::CREATED);
    // Reading needs a token too (any role); health stays open for probes.
    assert_eq!(
        http.get(format!("{base}/nodes"))
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        http.get(format!("{base}/health"))
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );
    running.shutdown().await;
}

/// The served document equals `coordinator/openapi.json` (regenerate it with
/// `UPDATE_OPENAPI=1 cargo test -p starling-coordinator --test it rest::openapi`),
/// and every GET path in it answers on a running server.
#[tokio::test]
async fn openapi_document_is_checked_in_and_every_get_path_answers() {
    let dir = tempfile::tempdir().unwrap();
    let running = common::start_coordinator(dir.path(), |_| {}).await;
    let rest = running.rest_url();
    let http = reqwest::Client::new();
    let served = http
        .get(format!("{rest}/api/v1/openapi.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(served.status(), StatusCode::OK);
    let served_text = served.text().await.unwrap();
    let served: Value = serde_json::from_str(&served_text).unwrap();

    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("openapi.json");
    if std::env::var_os("UPDATE_OPENAPI").is_some() {
        std::fs::write(
            &path,
            format!("{}\n", serde_json::to_string_pretty(&served).unwrap()),
        )
        .unwrap();
    }
    let checked_in: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert!(
        served == checked_in,
        "the served OpenAPI document differs from coordinator/openapi.json; \
         if the change is intended, run UPDATE_OPENAPI=1 cargo test -p starling-coordinator --test it rest::openapi"
    );

    // Real values for the path parameters: a node, an artifact, a task.
    let (client, _events) = common::mqtt_client(running.mqtt_url(), "openapi-node").await;
    let topics = Topics::default();
    let node = NodeId::new("openapi-node").unwrap();
    client
        .publish(
            topics.node(&node, Channel::Capability),
            QoS::AtLeastOnce,
            true,
            encode(&common::capability("openapi-node")).unwrap(),
        )
        .await
        .unwrap();
    client
        .publish(
            topics.node(&node, Channel::Status),
            QoS::AtLeastOnce,
            true,
            encode(&common::status("openapi-node", NodeState::Offline)).unwrap(),
        )
        .await
        .unwrap();
    let module = common::minimal_wasm();
    let stored: Value = common::upload(&http, &rest, module).await;
    let digest = stored["digest"].as_str().unwrap().to_string();
    let task: Value = common::submit(&http, &rest, &json!({"artifact": digest})).await;
    let task_id = task["id"].as_str().unwrap().to_string();
    common::eventually(Duration::from_secs(10), "the node to register", || {
        let http = http.clone();
        let url = format!("{rest}/api/v1/nodes/openapi-node");
        async move { (http.get(url).send().await.ok()?.status() == StatusCode::OK).then_some(()) }
    })
    .await;

    let paths = served["paths"].as_object().unwrap();
    let mut checked = 0;
    for (template, operations) in paths {
        // Peer-only routes need the federation's token and a federated
        // coordinator: tests/it/federation.rs covers them.
        if operations.get("get").is_none() || template.starts_with("/api/v1/federation/") {
            continue;
        }
        let url = template
            .replace("/nodes/{id}", "/nodes/openapi-node")
            .replace("{digest}", &digest)
            .replace("{id}", &task_id);
        assert!(!url.contains('{'), "unfilled parameter in {template}");
        let response = http.get(format!("{rest}{url}")).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK, "GET {url}");
        checked += 1;
    }
    assert!(checked >= 7, "only {checked} GET paths in the document");
    running.shutdown().await;
}
