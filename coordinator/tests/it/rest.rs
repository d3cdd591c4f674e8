//! The REST API on a running coordinator: refusals with the right status and a
//! JSON error, the bearer token, and the OpenAPI document.

use crate::common;

use std::sync::Arc;
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

/// Issue 15, item 7: limits of `u64::MAX` were accepted and sent to nodes.
/// Each limit over the coordinator's maximum is a 400 `invalid_limits` that
/// stores nothing; limits at the maxima are taken.
#[tokio::test]
async fn limits_over_the_maxima_are_refused_and_store_nothing() {
    use starling_proto::limits::{MAX_TASK_MEMORY_BYTES, MAX_TASK_OUTPUT_BYTES, MAX_TASK_WALL_MS};
    let dir = tempfile::tempdir().unwrap();
    let running = common::start_coordinator(dir.path(), |_| {}).await;
    let base = format!("{}/api/v1", running.rest_url());
    let http = reqwest::Client::new();
    let uploaded: Value = http
        .post(format!("{base}/artifacts"))
        .body(common::minimal_wasm())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let digest = uploaded["digest"].as_str().unwrap().to_string();

    let unbounded = [
        json!({"wall_ms": u64::MAX}),
        json!({"memory_bytes": u64::MAX}),
        json!({"output_bytes": u64::MAX}),
        json!({"wall_ms": u64::MAX, "memory_bytes": u64::MAX, "output_bytes": u64::MAX}),
        json!({"wall_ms": MAX_TASK_WALL_MS + 1}),
        json!({"memory_bytes": MAX_TASK_MEMORY_BYTES + 1}),
        json!({"output_bytes": MAX_TASK_OUTPUT_BYTES + 1}),
    ];
    for limits in unbounded {
        let response = http
            .post(format!("{base}/tasks"))
            .json(&json!({"artifact": digest, "limits": limits}))
            .send()
            .await
            .unwrap();
        let body = error_of(response, StatusCode::BAD_REQUEST).await;
        assert_eq!(body["error"], "invalid_limits", "{limits}: {body}");
        assert!(
            body["message"].as_str().unwrap().contains("over the most"),
            "{body}"
        );
    }
    let listed: Value = http
        .get(format!("{base}/tasks"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        listed["tasks"],
        json!([]),
        "a refused submission stored a task"
    );

    let at_maxima = json!({
        "wall_ms": MAX_TASK_WALL_MS,
        "memory_bytes": MAX_TASK_MEMORY_BYTES,
        "output_bytes": MAX_TASK_OUTPUT_BYTES,
    });
    let created = http
        .post(format!("{base}/tasks"))
        .json(&json!({"artifact": digest, "limits": at_maxima}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), StatusCode::CREATED);
    running.shutdown().await;
}

/// Sends a request line and one header but never the blank line that ends
/// the headers, then reads until the server closes the connection. Returns
/// how long that took, or `None` if the server kept it open for twice the
/// header-read timeout.
fn stall_in_headers(stream: impl std::io::Read + std::io::Write) -> Option<Duration> {
    stall(stream, b"GET / HTTP/1.1\r\nHost: x\r\n")
}

/// Sends `sent` (nothing: a silent connection) and reads until the server
/// closes the connection, as [`stall_in_headers`].
fn stall(mut stream: impl std::io::Read + std::io::Write, sent: &[u8]) -> Option<Duration> {
    let started = std::time::Instant::now();
    if !sent.is_empty() {
        stream.write_all(sent).unwrap();
        stream.flush().unwrap();
    }
    let mut buffer = [0u8; 1024];
    loop {
        match stream.read(&mut buffer) {
            // The server may answer 408 before closing: read on to the end.
            Ok(0) => return Some(started.elapsed()),
            Ok(_) => {}
            Err(error)
                if matches!(
                    error.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return None
            }
            // A reset or a TLS stream cut without close_notify: closed.
            Err(_) => return Some(started.elapsed()),
        }
    }
}

fn assert_closed_in_time(closed_after: Option<Duration>, scheme: &str) {
    use starling_coordinator::http::HEADER_READ_TIMEOUT;
    let closed_after = closed_after.unwrap_or_else(|| {
        panic!(
            "{scheme}: a stalled connection was still open after {:?}",
            HEADER_READ_TIMEOUT * 2
        )
    });
    assert!(
        closed_after >= HEADER_READ_TIMEOUT - Duration::from_secs(1)
            && closed_after <= HEADER_READ_TIMEOUT + Duration::from_secs(5),
        "{scheme}: closed after {closed_after:?}, expected about {HEADER_READ_TIMEOUT:?}"
    );
}

/// Issue 15, item 10: a client that sends part of its headers and stalls is
/// disconnected after `HEADER_READ_TIMEOUT`, over HTTP and over HTTPS; and
/// (issue 33, item 2) so is one that sends nothing at all, which used to be
/// kept open for ever (about ten seconds each, all four side by side).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_stalled_in_its_headers_is_closed() {
    use starling_coordinator::http::HEADER_READ_TIMEOUT;
    let dir = tempfile::tempdir().unwrap();
    let pki = starling_tests::Pki::create(dir.path());
    let plain = common::start_coordinator(&dir.path().join("plain"), |_| {}).await;
    let tls = common::start_coordinator(&dir.path().join("tls"), |config| {
        config.rest_tls = Some(starling_coordinator::server_tls::ServerTls {
            cert: pki.server_cert.clone(),
            key: pki.server_key.clone(),
        });
    })
    .await;
    let address = |url: &str| url.rsplit_once("://").unwrap().1.to_string();
    let plain_address = address(&plain.rest_url());
    let tls_address = address(&tls.rest_url());

    let silent = |address: String| {
        tokio::task::spawn_blocking(move || {
            let stream = std::net::TcpStream::connect(&address).unwrap();
            stream
                .set_read_timeout(Some(HEADER_READ_TIMEOUT * 2))
                .unwrap();
            stall(stream, b"")
        })
    };
    let silent_http = silent(plain_address.clone());
    let silent_https = silent(tls_address.clone());
    let over_http = tokio::task::spawn_blocking(move || {
        let stream = std::net::TcpStream::connect(&plain_address).unwrap();
        stream
            .set_read_timeout(Some(HEADER_READ_TIMEOUT * 2))
            .unwrap();
        stall_in_headers(stream)
    });
    let ca = pki.ca.clone();
    let over_https = tokio::task::spawn_blocking(move || {
        use rustls::pki_types::pem::PemObject as _;
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(rustls::pki_types::CertificateDer::from_pem_file(&ca).unwrap())
            .unwrap();
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let connection = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
        let stream = std::net::TcpStream::connect(&tls_address).unwrap();
        stream
            .set_read_timeout(Some(HEADER_READ_TIMEOUT * 2))
            .unwrap();
        let mut tls_stream = rustls::StreamOwned::new(connection, stream);
        // Finish the handshake first, so what is timed is the header read.
        while tls_stream.conn.is_handshaking() {
            tls_stream.conn.complete_io(&mut tls_stream.sock).unwrap();
        }
        stall_in_headers(tls_stream)
    });
    assert_closed_in_time(over_http.await.unwrap(), "http");
    assert_closed_in_time(over_https.await.unwrap(), "https");
    assert_closed_in_time(silent_http.await.unwrap(), "http, silent");
    assert_closed_in_time(silent_https.await.unwrap(), "https, silent");

    // A whole request still gets its answer.
    let health = reqwest::get(format!("{}/api/v1/health", plain.rest_url()))
        .await
        .unwrap();
    assert_eq!(health.status(), StatusCode::OK);
    plain.shutdown().await;
    tls.shutdown().await;
}

/// Issue 33, item 6: a coordinator without API tokens (loopback) refuses
/// what a web page could make the operator's browser send: a cross-site
/// revocation, a write from another origin, and any request under a name
/// that is not its own (DNS rebinding). The CLI's requests (no `Origin`, no
/// `Sec-Fetch-Site`) and same-origin pages still work; a wrong bearer token
/// on a coordinator with tokens waits a quarter of a second for its 401.
#[tokio::test]
async fn an_open_coordinator_refuses_what_a_web_page_could_send() {
    let dir = tempfile::tempdir().unwrap();
    let running = common::start_coordinator(dir.path(), |_| {}).await;
    let base = running.rest_url();
    let http = reqwest::Client::new();
    let revoke = |headers: &[(&'static str, &str)]| {
        let mut request = http.post(format!("{base}/api/v1/nodes/some-node/revoke"));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.send()
    };
    for refused in [
        vec![("sec-fetch-site", "cross-site")],
        vec![("origin", "http://evil.example")],
        vec![("host", "evil.example")],
    ] {
        let answer = revoke(&refused).await.unwrap();
        let body = error_of(answer, StatusCode::FORBIDDEN).await;
        assert_eq!(body["error"], "forbidden", "{refused:?}: {body}");
    }
    let rebound = http
        .get(format!("{base}/api/v1/nodes"))
        .header("host", "evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(rebound.status(), StatusCode::FORBIDDEN);
    // What the CLI sends, and a same-origin page, get through (to the
    // revocation's own answer: the node was never enrolled).
    let host = base.trim_start_matches("http://").to_string();
    for allowed in [
        vec![],
        vec![("origin", format!("http://{host}").leak() as &str)],
    ] {
        let answer = revoke(&allowed).await.unwrap();
        assert_ne!(answer.status(), StatusCode::FORBIDDEN, "{allowed:?}");
    }
    running.shutdown().await;

    let dir = tempfile::tempdir().unwrap();
    let running =
        common::start_coordinator(dir.path(), |c| c.api_token = Some("s3cret".into())).await;
    let started = std::time::Instant::now();
    let wrong = http
        .get(format!("{}/api/v1/nodes", running.rest_url()))
        .bearer_auth("guess")
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    assert!(started.elapsed() >= Duration::from_millis(250));
    // A guess through the console's sign-in form costs the same.
    let started = std::time::Instant::now();
    let signed_in = http
        .post(format!("{}/login", running.rest_url()))
        .header("content-type", "application/x-www-form-urlencoded")
        .body("token=guess&next=%2F")
        .send()
        .await
        .unwrap();
    assert_eq!(signed_in.status(), StatusCode::UNAUTHORIZED);
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "a failed sign-in answered at once"
    );
    running.shutdown().await;
}

/// A new API token of `role`, made with the bootstrap token `s3cret`: its
/// id and its secret.
async fn new_token(http: &reqwest::Client, base: &str, name: &str, role: &str) -> (String, String) {
    let created: Value = http
        .post(format!("{base}/api-tokens"))
        .bearer_auth("s3cret")
        .json(&json!({"name": name, "role": role}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let field = |name: &str| created[name].as_str().unwrap().to_string();
    (field("id"), field("token"))
}

/// Issue 33, item 6: an open `GET /api/v1/events` stream ends soon after
/// its token is revoked (it used to stream on for as long as it stayed
/// open), and its reconnect is refused.
#[tokio::test]
async fn an_event_stream_ends_when_its_token_is_revoked() {
    use futures_util::StreamExt as _;
    let dir = tempfile::tempdir().unwrap();
    let running =
        common::start_coordinator(dir.path(), |c| c.api_token = Some("s3cret".into())).await;
    let base = format!("{}/api/v1", running.rest_url());
    let http = reqwest::Client::new();
    let (id, token) = new_token(&http, &base, "watcher", "viewer").await;
    let stream = http
        .get(format!("{base}/events"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), StatusCode::OK);
    let revoked = http
        .post(format!("{base}/api-tokens/{id}/revoke"))
        .bearer_auth("s3cret")
        .send()
        .await
        .unwrap();
    assert!(revoked.status().is_success(), "{}", revoked.status());
    let revoked_at = std::time::Instant::now();
    let mut body = stream.bytes_stream();
    let ended = tokio::time::timeout(Duration::from_secs(15), async {
        while let Some(chunk) = body.next().await {
            if chunk.is_err() {
                break;
            }
        }
    })
    .await;
    assert!(
        ended.is_ok(),
        "the stream of a revoked token was still open after 15 s"
    );
    assert!(revoked_at.elapsed() <= Duration::from_secs(12));
    let again = http
        .get(format!("{base}/events"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), StatusCode::UNAUTHORIZED);
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

    // Every other documented operation is routed: whatever its handler
    // answers an empty body, it is not the router's "no such endpoint" nor
    // "method not allowed" (the route table and the document are compared in
    // `http::routes`' tests, so the three places a route is written agree).
    let mut routed = 0;
    for (template, operations) in paths {
        for method in operations.as_object().unwrap().keys() {
            if method == "get" || method == "parameters" {
                continue;
            }
            let url = template
                .replace("/nodes/{id}", "/nodes/openapi-node")
                .replace("{digest}", &digest)
                .replace("{site}", "nowhere")
                .replace("{task}", &task_id)
                .replace("{id}", &task_id);
            assert!(!url.contains('{'), "unfilled parameter in {template}");
            let method = reqwest::Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            let response = http
                .request(method.clone(), format!("{rest}{url}"))
                .header("content-type", "application/json")
                .body("{}")
                .send()
                .await
                .unwrap();
            let status = response.status();
            let body = response.text().await.unwrap();
            assert_ne!(
                status,
                StatusCode::METHOD_NOT_ALLOWED,
                "{method} {url}: {body}"
            );
            assert!(
                !body.contains("\"not_found\""),
                "{method} {url} reached the router's fallback: {body}"
            );
            routed += 1;
        }
    }
    assert!(
        routed >= 10,
        "only {routed} other operations in the document"
    );
    running.shutdown().await;
}

/// Issue 33, item 6: one token cannot fill the artifact store. Its uploads
/// are refused past its quota, with what it holds and how to free it;
/// bytes already stored cost nothing again, and another token's share is
/// its own.
#[tokio::test]
async fn a_token_past_its_artifact_quota_is_refused_and_others_are_not() {
    let dir = tempfile::tempdir().unwrap();
    // A module with a custom section of 100 distinct bytes: a new digest each.
    let module = |n: u8| {
        let mut bytes = common::minimal_wasm();
        bytes.extend([0x00, 102, 1, b'q']);
        bytes.extend([n; 100]);
        bytes
    };
    let size = module(0).len() as u64;
    let running = common::start_coordinator(dir.path(), |c| {
        c.api_token = Some("s3cret".into());
        c.artifact_quota_bytes = 3 * size + size / 2;
    })
    .await;
    let base = format!("{}/api/v1", running.rest_url());
    let http = reqwest::Client::new();
    let mut tokens = Vec::new();
    for name in ["one", "two"] {
        tokens.push(new_token(&http, &base, name, "developer").await.1);
    }
    let upload = |token: &str, bytes: Vec<u8>| {
        http.post(format!("{base}/artifacts"))
            .bearer_auth(token)
            .body(bytes)
            .send()
    };
    for n in 0..3 {
        let stored = upload(&tokens[0], module(n)).await.unwrap();
        assert_eq!(stored.status(), StatusCode::CREATED, "module {n}");
    }
    let refused = upload(&tokens[0], module(3)).await.unwrap();
    let body = error_of(refused, StatusCode::PAYLOAD_TOO_LARGE).await;
    assert_eq!(body["error"], "artifact_quota_exceeded", "{body}");
    let message = body["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("take {} bytes", 3 * size)),
        "{message}"
    );
    // The refused upload stored nothing.
    let fetch = || {
        http.get(format!("{base}/artifacts/{}", sha256_hex(&module(3))))
            .send()
    };
    assert_eq!(fetch().await.unwrap().status(), StatusCode::NOT_FOUND);
    // What is stored already costs nothing again.
    let again = upload(&tokens[0], module(1)).await.unwrap();
    assert_eq!(again.status(), StatusCode::CREATED);
    // The other token has a share of its own.
    let other = upload(&tokens[1], module(3)).await.unwrap();
    assert_eq!(other.status(), StatusCode::CREATED);
    assert_eq!(fetch().await.unwrap().status(), StatusCode::OK);
    running.shutdown().await;
}

/// Issue 33: one token's batch calls cannot queue without bound (11,001
/// pending tasks from one client did). Past its share of the queue a
/// submission is refused whole, a single one or a batch, and stores nothing;
/// another token still submits, and a cancelled task frees room.
#[tokio::test]
async fn a_token_past_its_pending_quota_is_refused_and_others_are_not() {
    let dir = tempfile::tempdir().unwrap();
    // No node: every task stays pending (a site that knows no node yet takes
    // work and parks it).
    let running = common::start_coordinator(dir.path(), |c| {
        c.api_token = Some("s3cret".into());
        c.pending_quota = 3;
    })
    .await;
    let base = format!("{}/api/v1", running.rest_url());
    let http = reqwest::Client::new();
    let (_, one) = new_token(&http, &base, "one", "developer").await;
    let (_, two) = new_token(&http, &base, "two", "developer").await;
    let stored: Value = http
        .post(format!("{base}/artifacts"))
        .bearer_auth(&one)
        .body(common::minimal_wasm())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let task = json!({"artifact": stored["digest"]});
    let batch = |token: &str, n: usize| {
        http.post(format!("{base}/tasks:batch"))
            .bearer_auth(token)
            .json(&json!({"tasks": vec![task.clone(); n]}))
            .send()
    };
    let single = |token: &str| {
        http.post(format!("{base}/tasks"))
            .bearer_auth(token)
            .json(&task)
            .send()
    };
    let accepted = batch(&one, 3).await.unwrap();
    assert_eq!(accepted.status(), StatusCode::CREATED);
    let accepted: Value = accepted.json().await.unwrap();
    let first = accepted["tasks"][0]["id"].as_str().unwrap().to_string();

    let refused = error_of(single(&one).await.unwrap(), StatusCode::TOO_MANY_REQUESTS).await;
    assert_eq!(refused["error"], "pending_quota_exceeded", "{refused}");
    let message = refused["message"].as_str().unwrap();
    assert!(
        message.contains("has 3 pending tasks and may have at most 3"),
        "{message}"
    );
    let refused = error_of(batch(&one, 2).await.unwrap(), StatusCode::TOO_MANY_REQUESTS).await;
    assert_eq!(refused["error"], "pending_quota_exceeded", "{refused}");
    let pending = || async {
        let list: Value = http
            .get(format!("{base}/tasks?state=pending&limit=100"))
            .bearer_auth("s3cret")
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        list["tasks"].as_array().unwrap().len()
    };
    assert_eq!(pending().await, 3, "a refused submission stored nothing");

    // The other token's share is its own; a batch within it goes in whole.
    assert_eq!(batch(&two, 3).await.unwrap().status(), StatusCode::CREATED);
    assert_eq!(pending().await, 6);
    // A cancelled task leaves the queue and frees its place.
    let cancelled = http
        .post(format!("{base}/tasks/{first}/cancel"))
        .bearer_auth(&one)
        .send()
        .await
        .unwrap();
    assert_eq!(cancelled.status(), StatusCode::OK);
    assert_eq!(single(&one).await.unwrap().status(), StatusCode::CREATED);
    assert_eq!(
        single(&one).await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    running.shutdown().await;
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(bytes))
}

/// Issue 33, item 6: 400 open console task lists (one viewer's) used to read
/// the task list again each, on every change, and exhausted the database's
/// pool (HTTP 500s, 5 s round trips). Their reads are shared now: every
/// submission beside them is answered, quickly, and the streams still show
/// each new task.
#[tokio::test]
async fn four_hundred_console_streams_leave_the_api_answering() {
    let dir = tempfile::tempdir().unwrap();
    let running =
        common::start_coordinator(dir.path(), |c| c.api_token = Some("s3cret".into())).await;
    let rest = running.rest_url();
    let base = format!("{rest}/api/v1");
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let (_, viewer) = new_token(&http, &base, "wall", "viewer").await;
    let signed_in = http
        .post(format!("{rest}/login"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("token={viewer}&next=%2Ftasks"))
        .send()
        .await
        .unwrap();
    assert_eq!(signed_in.status(), StatusCode::SEE_OTHER);
    let cookie = signed_in.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    let mut streams = Vec::new();
    for _ in 0..400 {
        let stream = http
            .get(format!("{rest}/console/events?view=tasks"))
            .header("cookie", &cookie)
            .send()
            .await
            .unwrap();
        assert_eq!(stream.status(), StatusCode::OK);
        streams.push(stream);
    }

    let module = common::minimal_wasm();
    let stored: Value = http
        .post(format!("{base}/artifacts"))
        .bearer_auth("s3cret")
        .body(module)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let digest = stored["digest"].as_str().unwrap();
    let mut slowest = Duration::ZERO;
    let mut last = String::new();
    for _ in 0..40 {
        let started = std::time::Instant::now();
        let submitted = http
            .post(format!("{base}/tasks"))
            .bearer_auth("s3cret")
            .json(&json!({"artifact": digest}))
            .send()
            .await
            .unwrap();
        assert_eq!(submitted.status(), StatusCode::CREATED);
        let task: Value = submitted.json().await.unwrap();
        last = task["id"].as_str().unwrap().to_string();
        slowest = slowest.max(started.elapsed());
    }
    assert!(
        slowest < Duration::from_secs(1),
        "a submission beside 400 streams took {slowest:?}"
    );
    // One read of the list per change, not one per stream: 400 streams
    // that each read for themselves made 400 reads on opening alone.
    let metrics = http
        .get(format!("{rest}/metrics"))
        .bearer_auth("s3cret")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let reads = metrics
        .lines()
        .find_map(|line| {
            line.strip_prefix("starling_console_stream_reads_total{table=\"task_lists\"} ")
        })
        .and_then(|value| value.trim().parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no console read count in:\n{metrics}"));
    assert!(
        reads <= 100.0,
        "{reads} task-list reads for 400 streams and 40 submissions"
    );
    // The first and the last stream both come to show the last task.
    for index in [0, streams.len() - 1] {
        let stream = &mut streams[index];
        let mut seen = String::new();
        tokio::time::timeout(Duration::from_secs(20), async {
            while !seen.contains(&last) {
                let chunk = stream.chunk().await.unwrap().expect("the stream is open");
                seen.push_str(&String::from_utf8_lossy(&chunk));
            }
        })
        .await
        .unwrap_or_else(|_| panic!("stream {index} never showed task {last}"));
    }
    drop(streams);
    running.shutdown().await;
}
