//! Access control against real parts: REST roles and tokens over HTTP with
//! the rows counted in SQLite before and after each refusal, enrollment on
//! SQLite and PostgreSQL, the coordinator's own broker under attack by
//! enrolled nodes, and an operator's Mosquitto running on the password file,
//! ACL and settings the coordinator writes.

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use rumqttc::{AsyncClient, Event, EventLoop, MqttOptions, Packet, QoS};
use serde_json::{json, Value};
use starling_api::Role;
use starling_coordinator::access::{self, MosquittoFiles};
use starling_coordinator::Running;

const BOOTSTRAP: &str = "bootstrap-admin-secret";

async fn start(
    dir: &Path,
    adjust: impl FnOnce(&mut starling_coordinator::CoordinatorConfig),
) -> Running {
    common::start_coordinator(dir, |config| {
        config.api_token = Some(BOOTSTRAP.into());
        config.mqtt_allow_anonymous = false;
        adjust(config);
    })
    .await
}

/// Row counts of every table a refused call could have touched.
async fn counts(db: &Path) -> Vec<(String, i64)> {
    let url = format!("sqlite://{}", db.join("coordinator.db").display());
    let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
    let mut out = Vec::new();
    for table in [
        "artifacts",
        "tasks",
        "events",
        "api_tokens",
        "join_tokens",
        "node_credentials",
    ] {
        let (n,): (i64,) = sqlx::query_as(&format!("SELECT COUNT(*) FROM {table}"))
            .fetch_one(&pool)
            .await
            .unwrap();
        out.push((table.to_string(), n));
    }
    // Revocations and spent join-token uses change rows without adding any.
    let (revoked,): (i64,) = sqlx::query_as(
        "SELECT (SELECT COUNT(*) FROM api_tokens WHERE revoked_ms IS NOT NULL) + \
         (SELECT COUNT(*) FROM node_credentials WHERE revoked_ms IS NOT NULL) + \
         (SELECT COALESCE(SUM(uses_left), 0) FROM join_tokens) + \
         (SELECT COUNT(*) FROM tasks WHERE cancel_requested <> 0)",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    out.push(("revocations, uses, cancels".to_string(), revoked));
    pool.close().await;
    out
}

async fn create_token(http: &reqwest::Client, rest: &str, role: Role) -> String {
    let answer = http
        .post(format!("{rest}/api/v1/api-tokens"))
        .bearer_auth(BOOTSTRAP)
        .json(&json!({"name": format!("test-{role}"), "role": role}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::CREATED);
    let body: Value = answer.json().await.unwrap();
    let token = body["token"].as_str().unwrap().to_string();
    assert!(token.starts_with("stk_"), "{token}");
    token
}

async fn join_token(http: &reqwest::Client, rest: &str, body: Value) -> String {
    let answer = http
        .post(format!("{rest}/api/v1/join-tokens"))
        .bearer_auth(BOOTSTRAP)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::CREATED);
    let body: Value = answer.json().await.unwrap();
    body["token"].as_str().unwrap().to_string()
}

async fn enroll(http: &reqwest::Client, rest: &str, token: &str, node: &str) -> reqwest::Response {
    http.post(format!("{rest}/api/v1/enroll"))
        .json(&json!({"join_token": token, "node_id": node, "report_key": common::report_key_hex(node)}))
        .send()
        .await
        .unwrap()
}

/// One request of the table below.
struct Call {
    method: reqwest::Method,
    path: String,
    body: Option<Vec<u8>>,
    json: Option<Value>,
    needs: Role,
}

fn call(method: reqwest::Method, path: &str, needs: Role) -> Call {
    Call {
        method,
        path: path.to_string(),
        body: None,
        json: None,
        needs,
    }
}

fn request(
    http: &reqwest::Client,
    rest: &str,
    call: &Call,
    token: Option<&str>,
) -> reqwest::RequestBuilder {
    let mut request = http.request(call.method.clone(), format!("{rest}{}", call.path));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = &call.body {
        request = request.body(body.clone());
    }
    if let Some(json) = &call.json {
        request = request.json(json);
    }
    request
}

#[tokio::test]
async fn every_endpoint_checks_its_role_and_a_refusal_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let running = start(dir.path(), |_| {}).await;
    let rest = running.rest_url();
    let http = reqwest::Client::new();
    let tokens: Vec<(Role, String)> = {
        let mut tokens = Vec::new();
        for role in Role::ALL {
            tokens.push((role, create_token(&http, &rest, role).await));
        }
        tokens
    };
    // Something to read and act on: an artifact, a pending task, an enrolled node.
    let stored = common::upload(&http, &rest, common::minimal_wasm()).await;
    let digest = stored["digest"].as_str().map(str::to_string);
    assert!(
        digest.is_none(),
        "upload without a token must fail: {stored}"
    );
    let artifact: Value = http
        .post(format!("{rest}/api/v1/artifacts"))
        .bearer_auth(BOOTSTRAP)
        .body(common::minimal_wasm())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let digest = artifact["digest"].as_str().unwrap().to_string();
    let task: Value = http
        .post(format!("{rest}/api/v1/tasks"))
        .bearer_auth(BOOTSTRAP)
        .json(&json!({"artifact": digest}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let task_id = task["id"].as_str().unwrap().to_string();
    let join = join_token(&http, &rest, json!({})).await;
    assert_eq!(
        enroll(&http, &rest, &join, "pi-1").await.status(),
        StatusCode::CREATED
    );
    let listed: Value = http
        .get(format!("{rest}/api/v1/api-tokens"))
        .bearer_auth(BOOTSTRAP)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let token_id = listed["tokens"][0]["id"].as_str().unwrap().to_string();

    use reqwest::Method;
    let mut calls = vec![
        call(Method::GET, "/api/v1/nodes", Role::Viewer),
        call(Method::GET, "/api/v1/nodes/pi-1", Role::Viewer),
        call(Method::GET, "/api/v1/tasks", Role::Viewer),
        call(
            Method::GET,
            &format!("/api/v1/tasks/{task_id}"),
            Role::Viewer,
        ),
        call(Method::GET, "/metrics", Role::Viewer),
        call(
            Method::POST,
            &format!("/api/v1/tasks/{task_id}/cancel"),
            Role::Developer,
        ),
        call(Method::POST, "/api/v1/nodes/pi-1/revoke", Role::Operator),
        call(Method::GET, "/api/v1/api-tokens", Role::Admin),
        call(
            Method::POST,
            &format!("/api/v1/api-tokens/{token_id}/revoke"),
            Role::Admin,
        ),
    ];
    let mut upload = call(Method::POST, "/api/v1/artifacts", Role::Developer);
    upload.body = Some(wat::parse_str(r#"(module (func (export "_start") nop))"#).unwrap());
    calls.push(upload);
    let mut sign = call(
        Method::POST,
        &format!("/api/v1/artifacts/{digest}/signature"),
        Role::Developer,
    );
    sign.json = Some(json!({"key": "00".repeat(32), "signature": "00".repeat(64)}));
    calls.push(sign);
    let mut submit = call(Method::POST, "/api/v1/tasks", Role::Developer);
    submit.json = Some(json!({"artifact": digest}));
    calls.push(submit);
    let mut batch = call(Method::POST, "/api/v1/tasks:batch", Role::Developer);
    batch.json = Some(json!({"tasks": [{"artifact": digest}, {"artifact": digest}]}));
    calls.push(batch);
    let mut join_call = call(Method::POST, "/api/v1/join-tokens", Role::Operator);
    join_call.json = Some(json!({}));
    calls.push(join_call);
    let mut token_call = call(Method::POST, "/api/v1/api-tokens", Role::Admin);
    token_call.json = Some(json!({"name": "x", "role": "viewer"}));
    calls.push(token_call);

    // A revoked token is as good as none.
    let revoked = create_token(&http, &rest, Role::Admin).await;
    let all: Value = http
        .get(format!("{rest}/api/v1/api-tokens"))
        .bearer_auth(BOOTSTRAP)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let revoked_id = all["tokens"].as_array().unwrap().last().unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let answer = http
        .post(format!("{rest}/api/v1/api-tokens/{revoked_id}/revoke"))
        .bearer_auth(BOOTSTRAP)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::OK);

    let before = counts(dir.path()).await;
    for call in &calls {
        let what = format!("{} {}", call.method, call.path);
        for (token, label) in [
            (None, "no token"),
            (Some("stk_guess"), "unknown token"),
            (Some(revoked.as_str()), "revoked token"),
        ] {
            let answer = request(&http, &rest, call, token).send().await.unwrap();
            assert_eq!(
                answer.status(),
                StatusCode::UNAUTHORIZED,
                "{what} with {label}"
            );
            let body: Value = answer.json().await.unwrap();
            assert_eq!(body["error"], "unauthorized", "{what}");
            assert!(
                body["message"].as_str().unwrap().contains("token"),
                "{what}"
            );
        }
        for (role, token) in &tokens {
            if role.allows(call.needs) {
                continue;
            }
            let answer = request(&http, &rest, call, Some(token))
                .send()
                .await
                .unwrap();
            assert_eq!(answer.status(), StatusCode::FORBIDDEN, "{what} as {role}");
            let body: Value = answer.json().await.unwrap();
            assert_eq!(body["error"], "forbidden");
            assert!(
                body["message"]
                    .as_str()
                    .unwrap()
                    .contains(call.needs.as_str()),
                "{what}: {body}"
            );
        }
    }
    assert_eq!(
        counts(dir.path()).await,
        before,
        "a refused call changed the store"
    );
    // The task is still pending and the node still enrolled.
    assert_eq!(
        running
            .store()
            .task(&task_id)
            .await
            .unwrap()
            .unwrap()
            .status
            .to_string(),
        "pending"
    );

    // Each role reaches what it needs and, by the hierarchy, everything below.
    for call in &calls {
        for (role, token) in &tokens {
            if !role.allows(call.needs) || call.method != Method::GET {
                continue;
            }
            let answer = request(&http, &rest, call, Some(token))
                .send()
                .await
                .unwrap();
            // Allowed is all this checks: pi-1 enrolled but never reported,
            // so its detail is a 404 from the handler, not the gate.
            assert!(
                ![StatusCode::UNAUTHORIZED, StatusCode::FORBIDDEN].contains(&answer.status()),
                "{} {} as {role}: {}",
                call.method,
                call.path,
                answer.status()
            );
        }
    }
    let developer = &tokens[1].1;
    let answer = http
        .post(format!("{rest}/api/v1/tasks"))
        .bearer_auth(developer)
        .json(&json!({"artifact": digest}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::CREATED);
    let operator = &tokens[2].1;
    let answer = http
        .post(format!("{rest}/api/v1/join-tokens"))
        .bearer_auth(operator)
        .json(&json!({"uses": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::CREATED);

    // Public endpoints need nothing.
    for path in ["/api/v1/health", "/api/v1/identity", "/api/v1/openapi.json"] {
        let answer = http.get(format!("{rest}{path}")).send().await.unwrap();
        assert_eq!(answer.status(), StatusCode::OK, "{path}");
    }
    let answer = http
        .get(format!("{rest}/api/v1/artifacts/{digest}"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        answer.status(),
        StatusCode::OK,
        "agents fetch artifacts without a token"
    );
    running.shutdown().await;
}

#[tokio::test]
async fn secrets_are_stored_only_as_hashes() {
    let dir = tempfile::tempdir().unwrap();
    let running = start(dir.path(), |_| {}).await;
    let rest = running.rest_url();
    let http = reqwest::Client::new();
    let api = create_token(&http, &rest, Role::Operator).await;
    let join = join_token(&http, &rest, json!({})).await;
    assert!(join.starts_with("sjt_"), "{join}");
    let creds: Value = enroll(&http, &rest, &join, "edge-7")
        .await
        .json()
        .await
        .unwrap();
    let password = creds["mqtt_password"].as_str().unwrap().to_string();
    running.shutdown().await;

    // Every byte of the database file, WAL included: no secret appears.
    let mut bytes = Vec::new();
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let path = entry.unwrap().path();
        if path.to_string_lossy().contains("coordinator.db") {
            bytes.extend(std::fs::read(&path).unwrap());
        }
    }
    assert!(!bytes.is_empty());
    let holds = |needle: &str| bytes.windows(needle.len()).any(|w| w == needle.as_bytes());
    for secret in [&api, &join, &password] {
        assert!(!holds(secret), "a secret is stored in clear");
    }
    for secret in [&api, &join, &password] {
        assert!(
            holds(&access::sha256_hex(secret)),
            "the hash of a secret is stored"
        );
    }
}

#[tokio::test]
async fn join_tokens_are_single_use_and_expire_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let running = start(dir.path(), |_| {}).await;
    join_tokens_are_single_use_and_expire(&running).await;
    running.shutdown().await;
}

#[tokio::test]
async fn join_tokens_are_single_use_and_expire_on_postgres() {
    let dir = tempfile::tempdir().unwrap();
    let db = common::PostgresDb::create();
    let running = start(dir.path(), |c| c.db = Some(db.url.clone())).await;
    join_tokens_are_single_use_and_expire(&running).await;
    running.shutdown().await;
}

async fn join_tokens_are_single_use_and_expire(running: &Running) {
    let rest = running.rest_url();
    let http = reqwest::Client::new();
    let identity: Value = http
        .get(format!("{rest}/api/v1/identity"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(identity["coordinator_key"], running.coordinator_key());
    assert_eq!(
        identity["protocol_version"],
        starling_proto::PROTOCOL_VERSION
    );

    let token = join_token(&http, &rest, json!({})).await;
    let answer = enroll(&http, &rest, &token, "pi-1").await;
    assert_eq!(answer.status(), StatusCode::CREATED);
    let creds: Value = answer.json().await.unwrap();
    assert_eq!(creds["node_id"], "pi-1");
    assert_eq!(creds["mqtt_username"], "pi-1");
    assert_eq!(creds["coordinator_key"], running.coordinator_key());
    assert_eq!(creds["coordinator_key"].as_str().unwrap().len(), 64);
    assert_eq!(creds["topic_prefix"], "starling/v1");
    assert!(creds["mqtt_password"].as_str().unwrap().len() >= 43);

    // Used up.
    let again = enroll(&http, &rest, &token, "pi-2").await;
    assert_eq!(again.status(), StatusCode::UNAUTHORIZED);
    let body: Value = again.json().await.unwrap();
    assert!(body["message"]
        .as_str()
        .unwrap()
        .contains("starling token create"));
    // Unknown.
    assert_eq!(
        enroll(&http, &rest, "sjt_nonsense", "pi-2").await.status(),
        StatusCode::UNAUTHORIZED
    );
    // An enrolled node cannot be taken over, and the refusal spends nothing.
    let fresh = join_token(&http, &rest, json!({"uses": 1})).await;
    assert_eq!(
        enroll(&http, &rest, &fresh, "pi-1").await.status(),
        StatusCode::CONFLICT
    );
    assert_eq!(
        enroll(&http, &rest, &fresh, "pi-2").await.status(),
        StatusCode::CREATED
    );
    // Bad node ids are refused before the token is spent.
    let spare = join_token(&http, &rest, json!({})).await;
    assert_eq!(
        enroll(&http, &rest, &spare, "bad/id").await.status(),
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        enroll(&http, &rest, &spare, "pi-3").await.status(),
        StatusCode::CREATED
    );

    // After revocation the node may enroll again, with a new token.
    let answer = http
        .post(format!("{rest}/api/v1/nodes/pi-1/revoke"))
        .bearer_auth(BOOTSTRAP)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::OK);
    let answer = http
        .post(format!("{rest}/api/v1/nodes/pi-1/revoke"))
        .bearer_auth(BOOTSTRAP)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::NOT_FOUND, "revoked twice");
    let renewed = join_token(&http, &rest, json!({})).await;
    assert_eq!(
        enroll(&http, &rest, &renewed, "pi-1").await.status(),
        StatusCode::CREATED
    );

    // Multi-use tokens count down; expired ones are refused.
    let twice = join_token(&http, &rest, json!({"uses": 2})).await;
    assert_eq!(
        enroll(&http, &rest, &twice, "m-1").await.status(),
        StatusCode::CREATED
    );
    assert_eq!(
        enroll(&http, &rest, &twice, "m-2").await.status(),
        StatusCode::CREATED
    );
    assert_eq!(
        enroll(&http, &rest, &twice, "m-3").await.status(),
        StatusCode::UNAUTHORIZED
    );
    let short = join_token(&http, &rest, json!({"ttl_seconds": 1})).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(
        enroll(&http, &rest, &short, "late").await.status(),
        StatusCode::UNAUTHORIZED
    );
    let rows = running.store().node_credentials().await.unwrap();
    let names: Vec<&str> = rows.iter().map(|row| row.node_id.as_str()).collect();
    assert_eq!(names, ["m-1", "m-2", "pi-1", "pi-2", "pi-3"]);
}

/// Connects with rumqttc and waits for the broker's answer: Ok once a
/// ConnAck accepted the login, Err with the reason when it was refused or
/// the broker closed the connection.
async fn try_connect(
    url: &str,
    id: &str,
    login: Option<(&str, &str)>,
) -> Result<(AsyncClient, EventLoop), String> {
    let (host, port) = url.trim_start_matches("mqtt://").rsplit_once(':').unwrap();
    let mut options = MqttOptions::new(id, host, port.parse().unwrap());
    options.set_keep_alive(Duration::from_secs(5));
    if let Some((user, password)) = login {
        options.set_credentials(user, password);
    }
    let (client, mut eventloop) = AsyncClient::new(options, 16);
    let answer = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match eventloop.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(ack))) => {
                    return if ack.code == rumqttc::ConnectReturnCode::Success {
                        Ok(())
                    } else {
                        Err(format!("{:?}", ack.code))
                    };
                }
                Ok(_) => continue,
                Err(error) => return Err(error.to_string()),
            }
        }
    })
    .await
    .map_err(|_| "no answer".to_string())?;
    answer.map(|()| (client, eventloop))
}

/// Drives an event loop in the background, forwarding publishes.
fn drive(mut eventloop: EventLoop) -> tokio::sync::mpsc::UnboundedReceiver<rumqttc::Publish> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            match eventloop.poll().await {
                Ok(Event::Incoming(Packet::Publish(publish))) => {
                    let _ = tx.send(publish);
                }
                Ok(_) => {}
                Err(_) => return,
            }
        }
    });
    rx
}

/// Retries `try_connect` until it answers as `want` (Mosquitto reloads its
/// files asynchronously after SIGHUP).
async fn connect_until(
    url: &str,
    id: &str,
    login: Option<(&str, &str)>,
    want: bool,
) -> Option<(AsyncClient, EventLoop)> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let result = try_connect(url, id, login).await;
        match (result, want) {
            (Ok(connected), true) => return Some(connected),
            (Err(_), false) => return None,
            (result, _) => {
                assert!(
                    Instant::now() < deadline,
                    "{id}: wanted accepted={want}, got {:?}",
                    result.map(|_| ())
                );
                if let Ok((client, _)) = result {
                    let _ = client.disconnect().await;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// Lists the node ids REST shows.
async fn node_ids(http: &reqwest::Client, rest: &str) -> Vec<String> {
    let nodes: Value = http
        .get(format!("{rest}/api/v1/nodes"))
        .bearer_auth(BOOTSTRAP)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    nodes["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n["id"].as_str().map(str::to_string))
        .collect()
}

/// The resident memory of a process, in bytes.
fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    kib * 1024
}

/// Whether a driven connection is still open after `wait`: its receiver
/// neither closed nor got anything it should not have.
async fn still_connected(
    incoming: &mut tokio::sync::mpsc::UnboundedReceiver<rumqttc::Publish>,
    wait: Duration,
) -> bool {
    match tokio::time::timeout(wait, incoming.recv()).await {
        Err(_) => true,
        Ok(Some(publish)) => panic!("unexpected message on {}", publish.topic),
        Ok(None) => false,
    }
}

/// The attacks of issue 15 against the coordinator's own broker, each by an
/// enrolled node with its own valid login: logins, confinement of publish
/// and subscribe, client-id takeover, oversize and retained floods, and the
/// revoked node's live session.
#[tokio::test]
async fn the_coordinators_broker_confines_every_node_to_its_own_topics() {
    let dir = tempfile::tempdir().unwrap();
    let running = start(dir.path(), |_| {}).await;
    let rest = running.rest_url();
    let mqtt = running.mqtt_url().to_string();
    let broker_pid = running
        .broker_pid()
        .expect("the coordinator runs its broker");
    let http = reqwest::Client::new();

    assert!(
        try_connect(&mqtt, "anon", None).await.is_err(),
        "anonymous let in"
    );
    assert!(try_connect(&mqtt, "nobody", Some(("nobody", "x")))
        .await
        .is_err());

    let token = join_token(&http, &rest, json!({"uses": 2})).await;
    let mut passwords = Vec::new();
    for node in ["edge-a", "edge-b"] {
        let creds: Value = enroll(&http, &rest, &token, node)
            .await
            .json()
            .await
            .unwrap();
        passwords.push(creds["mqtt_password"].as_str().unwrap().to_string());
    }
    let (a_pw, b_pw) = (passwords[0].clone(), passwords[1].clone());
    assert!(try_connect(&mqtt, "edge-a", Some(("edge-a", "wrong")))
        .await
        .is_err());
    assert!(
        try_connect(&mqtt, "edge-a", Some(("edge-a", &b_pw)))
            .await
            .is_err(),
        "another node's password"
    );

    // B is connected and subscribed to its own orders.
    let (b, b_loop) = try_connect(&mqtt, "edge-b", Some(("edge-b", &b_pw)))
        .await
        .expect("edge-b connects");
    let mut b_incoming = drive(b_loop);
    b.subscribe("starling/v1/nodes/edge-b/#", QoS::AtLeastOnce)
        .await
        .unwrap();

    // A logs in with B's client id: the broker binds the client id to the
    // login, so A's session is "edge-a" and B keeps its connection.
    let (a, a_loop) = try_connect(&mqtt, "edge-b", Some(("edge-a", &a_pw)))
        .await
        .expect("edge-a connects");
    let mut a_incoming = drive(a_loop);
    assert!(
        still_connected(&mut b_incoming, Duration::from_millis(1500)).await,
        "edge-a's login with client id edge-b knocked edge-b off"
    );

    // A subscribes to everything and poses as B on every channel.
    a.subscribe("#", QoS::AtLeastOnce).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let topics = starling_proto::Topics::default();
    let b_id = starling_proto::NodeId::new("edge-b").unwrap();
    for channel in starling_proto::Channel::ALL {
        a.publish(
            topics.node(&b_id, channel),
            QoS::AtLeastOnce,
            false,
            starling_proto::encode(&common::capability("edge-b")).unwrap(),
        )
        .await
        .unwrap();
    }
    // B's own report goes through, and A, subscribed to `#`, does not see it.
    b.publish(
        topics.node(&b_id, starling_proto::Channel::Capability),
        QoS::AtLeastOnce,
        true,
        common::sealed(
            "edge-b",
            starling_proto::ReportChannel::Capability,
            &common::capability("edge-b"),
        ),
    )
    .await
    .unwrap();
    assert!(
        still_connected(&mut b_incoming, Duration::from_millis(1000)).await,
        "edge-b received a message edge-a forged on its topics"
    );
    assert!(
        still_connected(&mut a_incoming, Duration::from_millis(200)).await,
        "edge-a, subscribed to #, saw another node's traffic"
    );
    common::eventually(Duration::from_secs(10), "edge-b listed", || {
        let (http, rest) = (http.clone(), rest.clone());
        async move {
            node_ids(&http, &rest)
                .await
                .contains(&"edge-b".to_string())
                .then_some(())
        }
    })
    .await;
    assert_eq!(
        node_ids(&http, &rest).await,
        ["edge-b"],
        "a forged report was applied"
    );

    // Floods: 200 retained 1 MiB messages on arbitrary topics, and on A's
    // own telemetry while A never reads its `#` subscription.
    let before = rss_bytes(broker_pid);
    let (flooder, flood_loop) = try_connect(&mqtt, "edge-a", Some(("edge-a", &a_pw)))
        .await
        .expect("edge-a connects again");
    let _flood_incoming = drive(flood_loop);
    let a_id = starling_proto::NodeId::new("edge-a").unwrap();
    let megabyte = vec![0x5a_u8; 1024 * 1024 - 1024];
    for i in 0..200 {
        let topic = if i % 2 == 0 {
            format!("junk/{i}")
        } else {
            topics.node(&a_id, starling_proto::Channel::Telemetry)
        };
        if flooder
            .publish(topic, QoS::AtMostOnce, true, megabyte.clone())
            .await
            .is_err()
        {
            break;
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = rss_bytes(broker_pid);
    assert!(
        after < before + 32 * 1024 * 1024,
        "the broker grew from {before} to {after} bytes under the floods"
    );

    // An oversize retained message on A's own capability topic is refused at
    // the broker: ingest goes on (A's next normal report is applied).
    let (big, big_loop) = try_connect(&mqtt, "edge-a", Some(("edge-a", &a_pw)))
        .await
        .expect("edge-a connects");
    let _big_incoming = drive(big_loop);
    let _ = big
        .publish(
            topics.node(&a_id, starling_proto::Channel::Capability),
            QoS::AtLeastOnce,
            true,
            vec![0u8; 2 * 1024 * 1024],
        )
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (good, good_loop) = try_connect(&mqtt, "edge-a", Some(("edge-a", &a_pw)))
        .await
        .expect("edge-a connects");
    let _good_incoming = drive(good_loop);
    good.publish(
        topics.node(&a_id, starling_proto::Channel::Capability),
        QoS::AtLeastOnce,
        true,
        common::sealed(
            "edge-a",
            starling_proto::ReportChannel::Capability,
            &common::capability("edge-a"),
        ),
    )
    .await
    .unwrap();
    common::eventually(
        Duration::from_secs(5),
        "edge-a listed after the oversize message",
        || {
            let (http, rest) = (http.clone(), rest.clone());
            async move {
                node_ids(&http, &rest)
                    .await
                    .contains(&"edge-a".to_string())
                    .then_some(())
            }
        },
    )
    .await;

    // Revoked: B's live session is dropped within a second, and it cannot
    // log in again; A still can.
    let revoked_at = Instant::now();
    let answer: Value = http
        .post(format!("{rest}/api/v1/nodes/edge-b/revoke"))
        .bearer_auth(BOOTSTRAP)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(answer["node_id"], "edge-b");
    let closed = tokio::time::timeout(Duration::from_secs(1), async {
        while b_incoming.recv().await.is_some() {}
    })
    .await;
    assert!(
        closed.is_ok(),
        "the revoked node kept its session for more than 1 s"
    );
    eprintln!("revoked session dropped after {:?}", revoked_at.elapsed());
    assert!(
        try_connect(&mqtt, "edge-b", Some(("edge-b", &b_pw)))
            .await
            .is_err(),
        "a revoked node logged in again"
    );
    assert!(try_connect(&mqtt, "edge-a-2", Some(("edge-a", &a_pw)))
        .await
        .is_ok());
    running.shutdown().await;
    // The broker is killed at shutdown and reaped by its supervisor.
    let gone = || {
        std::fs::read_to_string(format!("/proc/{broker_pid}/status"))
            .map_or(true, |status| status.contains("State:\tZ"))
    };
    let deadline = Instant::now() + Duration::from_secs(2);
    while !gone() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(gone(), "the broker outlived its coordinator's shutdown");
}

#[tokio::test]
async fn mosquitto_runs_on_the_files_the_coordinator_writes() {
    let auth = tempfile::tempdir().unwrap();
    let pid_file = auth.path().join("mosquitto.pid");
    // Mosquitto must find the files at start, and the coordinator needs the
    // broker at start: write a first version, as an operator's setup would.
    let files = MosquittoFiles {
        dir: auth.path().to_path_buf(),
        reload: access::Reload::Manual,
        username: "coordinator".into(),
        password_hash: access::mosquitto_hash("coordinator-pw").unwrap(),
        topic_prefix: "starling/v1".into(),
        allow_anonymous: false,
    };
    files.write(&[]).unwrap();
    // The operator's configuration: a listener, a pid file, and the
    // settings file the coordinator writes, included as the docs say.
    let broker = common::Mosquitto::start_with_config(&format!(
        // `user`: run as whoever runs the test (Mosquitto started as root
        // would switch to `mosquitto`, which cannot read the 0600 files).
        "{}pid_file {}\nuser {}\ninclude_dir {}",
        files.listener_settings_text(),
        pid_file.display(),
        std::env::var("USER").unwrap_or_else(|_| "root".into()),
        auth.path().display(),
    ));
    let dir = tempfile::tempdir().unwrap();
    let running = start(dir.path(), |c| {
        c.broker = Some(broker.url.clone());
        c.mqtt_username = Some("coordinator".into());
        c.mqtt_password = Some("coordinator-pw".into());
        c.mosquitto_auth_dir = Some(auth.path().to_path_buf());
        c.mosquitto_pid_file = Some(pid_file.clone());
    })
    .await;
    let rest = running.rest_url();
    let http = reqwest::Client::new();
    let acl = std::fs::read_to_string(files.acl_path()).unwrap();
    assert!(
        acl.contains("pattern write starling/v1/nodes/%u/events"),
        "{acl}"
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(files.passwd_path())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    assert!(try_connect(&broker.url, "anon", None).await.is_err());
    let token = join_token(&http, &rest, json!({"uses": 2})).await;
    let a: Value = enroll(&http, &rest, &token, "node-a")
        .await
        .json()
        .await
        .unwrap();
    let b: Value = enroll(&http, &rest, &token, "node-b")
        .await
        .json()
        .await
        .unwrap();
    let a_pw = a["mqtt_password"].as_str().unwrap().to_string();
    let b_pw = b["mqtt_password"].as_str().unwrap().to_string();
    let passwd = std::fs::read_to_string(files.passwd_path()).unwrap();
    assert!(!passwd.contains(&a_pw));
    assert!(passwd.contains("node-a:$7$101$"), "{passwd}");

    let (node_a, a_loop) = connect_until(&broker.url, "node-a", Some(("node-a", &a_pw)), true)
        .await
        .unwrap();
    let mut a_incoming = drive(a_loop);
    assert!(
        try_connect(&broker.url, "node-a-x", Some(("node-a", "wrong")))
            .await
            .is_err()
    );
    assert!(
        try_connect(&broker.url, "node-a-y", Some(("node-a", &b_pw)))
            .await
            .is_err()
    );
    let (watcher, w_loop) = try_connect(
        &broker.url,
        "watcher",
        Some(("coordinator", "coordinator-pw")),
    )
    .await
    .unwrap();
    let mut watched = drive(w_loop);
    watcher
        .subscribe("starling/v1/nodes/#", QoS::AtLeastOnce)
        .await
        .unwrap();
    // Each topic on its own: Mosquitto refuses a wildcard no ACL line covers.
    for topic in [
        "starling/v1/nodes/node-b/assign",
        "starling/v1/nodes/node-a/assign",
    ] {
        node_a.subscribe(topic, QoS::AtLeastOnce).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;

    // node-a poses as node-b: nothing gets through. Then its own report does.
    for topic in [
        "starling/v1/nodes/node-b/events",
        "starling/v1/nodes/node-b/capability",
        "starling/v1/nodes/node-b/status",
        "starling/v1/nodes/node-a/assign",
    ] {
        node_a
            .publish(topic, QoS::AtLeastOnce, false, b"forged".to_vec())
            .await
            .unwrap();
    }
    node_a
        .publish(
            "starling/v1/nodes/node-a/telemetry",
            QoS::AtLeastOnce,
            false,
            b"mine".to_vec(),
        )
        .await
        .unwrap();
    let first = tokio::time::timeout(Duration::from_secs(5), watched.recv())
        .await
        .expect("node-a's own telemetry arrives")
        .unwrap();
    assert_eq!(
        first.topic, "starling/v1/nodes/node-a/telemetry",
        "a forged message got through"
    );
    assert_eq!(&first.payload[..], b"mine");

    // Orders: node-a reads its own, not node-b's.
    for topic in [
        "starling/v1/nodes/node-b/assign",
        "starling/v1/nodes/node-a/assign",
    ] {
        watcher
            .publish(topic, QoS::AtLeastOnce, false, b"order".to_vec())
            .await
            .unwrap();
    }
    let order = tokio::time::timeout(Duration::from_secs(5), a_incoming.recv())
        .await
        .expect("node-a's own assignment arrives")
        .unwrap();
    assert_eq!(
        order.topic, "starling/v1/nodes/node-a/assign",
        "node-a read node-b's orders"
    );

    // Revoked: Mosquitto refuses node-a's next login after its reload.
    let answer = http
        .post(format!("{rest}/api/v1/nodes/node-a/revoke"))
        .bearer_auth(BOOTSTRAP)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::OK);
    assert!(
        connect_until(&broker.url, "node-a-2", Some(("node-a", &a_pw)), false)
            .await
            .is_none()
    );
    assert!(!std::fs::read_to_string(files.passwd_path())
        .unwrap()
        .contains("node-a:"));
    assert!(try_connect(&broker.url, "node-b", Some(("node-b", &b_pw)))
        .await
        .is_ok());
    running.shutdown().await;
}

#[tokio::test]
async fn the_cli_manages_tokens_and_says_why_it_was_refused() {
    use clap::Parser as _;
    use starling_cli::{run, Cli, EXIT_OK, EXIT_USAGE};
    let dir = tempfile::tempdir().unwrap();
    let running = start(dir.path(), |_| {}).await;
    let rest = running.rest_url();
    let cli = |args: &[&str]| {
        let mut full = vec!["starling", "--coordinator", rest.as_str()];
        full.extend_from_slice(args);
        Cli::parse_from(full)
    };
    assert_eq!(
        run(cli(&["token", "create", "--json"])).await,
        EXIT_USAGE,
        "no token: 401"
    );
    assert_eq!(
        run(cli(&[
            "--token", BOOTSTRAP, "token", "create", "--ttl", "10m", "--uses", "2"
        ]))
        .await,
        EXIT_OK
    );
    assert_eq!(
        run(cli(&[
            "--token",
            BOOTSTRAP,
            "api-token",
            "create",
            "--role",
            "viewer",
            "--name",
            "grafana"
        ]))
        .await,
        EXIT_OK
    );
    let tokens = running.store().api_tokens().await.unwrap();
    assert_eq!(tokens.len(), 1);
    assert_eq!(tokens[0].role, Role::Viewer);
    assert_eq!(tokens[0].name, "grafana");
    assert_eq!(
        run(cli(&["--token", BOOTSTRAP, "api-token", "list"])).await,
        EXIT_OK
    );
    assert_eq!(
        run(cli(&[
            "--token",
            BOOTSTRAP,
            "api-token",
            "revoke",
            &tokens[0].id
        ]))
        .await,
        EXIT_OK
    );
    assert!(running.store().api_tokens().await.unwrap()[0]
        .revoked_ms
        .is_some());
    assert_eq!(
        run(cli(&[
            "--token",
            BOOTSTRAP,
            "node",
            "revoke",
            "never-enrolled"
        ]))
        .await,
        EXIT_USAGE
    );
    assert!(Cli::try_parse_from([
        "starling",
        "api-token",
        "create",
        "--role",
        "root",
        "--name",
        "x"
    ])
    .is_err());
    running.shutdown().await;
}
