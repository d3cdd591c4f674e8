//! The federation's REST side on a running coordinator: the sites list, a
//! site's signed request on every federation route (and a site acting only
//! in its own name), revocations, forwards that are idempotent on
//! their origin, and refusals that store nothing; forwarded attempts that no
//! node can own, and the migration that moved older ones to a site column.

use crate::common;

use reqwest::StatusCode;
use serde_json::{json, Value};
use starling_api::TaskStatus;
use std::path::{Path, PathBuf};

use starling_coordinator::config::FederationConfig;
use starling_coordinator::federation::identity::{SiteIdentity, TrustRoot};
use starling_coordinator::federation::ClusterKey;
use starling_coordinator::store::forwards::{RemoteResult, TakenBack};
use starling_coordinator::store::EventOutcome;
use starling_coordinator::task::unix_now_ms;
use starling_proto::{NodeId, SiteId, TaskEvent, TaskId, TaskState};

fn federation(key: &str, credentials: &Path) -> FederationConfig {
    FederationConfig {
        site: "site-x".into(),
        gossip_listen: "127.0.0.1:0".parse().unwrap(),
        gossip_advertise: None,
        seeds: Vec::new(),
        cluster_key: key.into(),
        site_credentials: credentials.to_path_buf(),
        link_mbps: 100.0,
        forward_timeout: std::time::Duration::from_secs(10),
    }
}

/// A federation's trust root with site-x's credentials written under `dir`
/// (the coordinator under test serves site-x): the root, and the file.
fn trust_root(dir: &Path) -> (TrustRoot, PathBuf) {
    let root = TrustRoot::generate().unwrap();
    let path = dir.join("site-x.credentials.json");
    root.issue(&SiteId::new("site-x").unwrap(), unix_now_ms(), None)
        .unwrap()
        .write_new(&path)
        .unwrap();
    (root, path)
}

/// `site`'s identity, issued by `root` now (or at `issued_ms`).
fn identity(root: &TrustRoot, site: &str) -> SiteIdentity {
    root.issue(&SiteId::new(site).unwrap(), unix_now_ms(), None)
        .unwrap()
        .identity
}

/// A federation call to site-x signed by `by` at `at_ms`, the way a peer's
/// forwarder signs it.
async fn signed(
    http: &reqwest::Client,
    by: &SiteIdentity,
    method: reqwest::Method,
    url: &str,
    body: Option<&Value>,
    at_ms: u64,
) -> reqwest::Response {
    let body = body.map(|body| serde_json::to_vec(body).unwrap());
    let path = reqwest::Url::parse(url).unwrap().path().to_string();
    let signature = by.sign_request(
        "site-x",
        method.as_str(),
        &path,
        body.as_deref().unwrap_or_default(),
        at_ms,
    );
    let mut request = http.request(method, url);
    for (name, value) in signature.headers() {
        request = request.header(name, value);
    }
    if let Some(body) = body {
        request = request
            .header("content-type", "application/json")
            .body(body);
    }
    request.send().await.unwrap()
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
async fn forwards_need_a_site_signature_are_idempotent_and_refusals_store_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let key = ClusterKey::generate().unwrap();
    let (root, credentials) = trust_root(dir.path());
    let home = identity(&root, "site-home");
    let running = common::start_coordinator(dir.path(), |c| {
        c.federation = Some(federation(&key, &credentials));
    })
    .await;
    let rest = running.rest_url();
    let http = reqwest::Client::new();
    let now = unix_now_ms;
    use reqwest::Method;

    let sites = common::get_json(&http, &format!("{rest}/api/v1/sites")).await;
    assert_eq!(sites["federated"], true);
    assert_eq!(sites["site"], "site-x");
    assert_eq!(sites["sites"][0]["state"], "self");

    let stored: Value = common::upload(&http, &rest, common::minimal_wasm()).await;
    let digest = stored["digest"].as_str().unwrap().to_string();
    let url = format!("{rest}/api/v1/federation/tasks");

    // Unsigned, with a bearer token of any kind, or signed by a site of
    // another federation: 401, nothing stored.
    let stranger = identity(&TrustRoot::generate().unwrap(), "site-home");
    for bearer in [None, Some("starling-peer.00")] {
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
    let response = signed(
        &http,
        &stranger,
        Method::POST,
        &url,
        Some(&forward("t1", &digest)),
        now(),
    )
    .await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    let body: Value = response.json().await.unwrap();
    assert!(
        body["message"].as_str().unwrap().contains("trust root"),
        "{body}"
    );
    assert_eq!(task_count(&http, &rest).await, 0);

    // The same forward twice (an answer lost on the way): one task.
    let mut ids = Vec::new();
    for created in [true, false] {
        let response = signed(
            &http,
            &home,
            Method::POST,
            &url,
            Some(&forward("t1", &digest)),
            now(),
        )
        .await;
        assert_eq!(response.status(), StatusCode::CREATED);
        let accepted: Value = response.json().await.unwrap();
        assert_eq!(accepted["created"], created, "{accepted}");
        ids.push(accepted["task_id"].as_str().unwrap().to_string());
    }
    assert_eq!(ids[0], ids[1]);
    assert_eq!(task_count(&http, &rest).await, 1);
    let task = common::get_json(&http, &format!("{rest}/api/v1/tasks/{}", ids[0])).await;
    assert_eq!(task["origin_site"], "site-home");
    let status: Value = signed(
        &http,
        &home,
        Method::GET,
        &format!("{url}/site-home/t1"),
        None,
        now(),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(status["task_id"], ids[0]);
    assert_eq!(status["state"], "pending");

    // Unknown forward, an artifact this site lacks from a site it never
    // heard of, a body that is not a forward: refused, nothing stored.
    let response = signed(
        &http,
        &home,
        Method::GET,
        &format!("{url}/site-home/t2"),
        None,
        now(),
    )
    .await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    let response = signed(
        &http,
        &home,
        Method::POST,
        &url,
        Some(&forward("t3", &"ab".repeat(32))),
        now(),
    )
    .await;
    assert_eq!(response.status(), StatusCode::CONFLICT);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"], "artifact_unavailable", "{body}");
    let mut bad = forward("t4", &digest);
    bad["work_seconds"] = json!(-1.0);
    let response = signed(&http, &home, Method::POST, &url, Some(&bad), now()).await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let response = signed(
        &http,
        &home,
        Method::POST,
        &url,
        Some(&json!({"origin_site": 5})),
        now(),
    )
    .await;
    assert!(response.status().is_client_error());
    assert_eq!(task_count(&http, &rest).await, 1);

    // Cancelled at its home's request.
    let cancelled: Value = signed(
        &http,
        &home,
        Method::POST,
        &format!("{url}/site-home/t1/cancel"),
        None,
        now(),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(cancelled["state"], "cancelled");
    running.shutdown().await;
}

/// Issue 20, item 3, played as the attacker: a member of the federation
/// (it holds the cluster key and valid credentials of its own) cannot
/// forward, read or cancel in another site's name; certificates that are
/// forged, expired or another root's, requests replayed late, sent on to
/// another site or altered, and a revoked site are refused.
#[tokio::test]
async fn a_site_cannot_act_for_another_and_forged_stale_or_revoked_credentials_are_refused() {
    use reqwest::Method;
    let dir = tempfile::tempdir().unwrap();
    let key = ClusterKey::generate().unwrap();
    let (root, credentials) = trust_root(dir.path());
    let home = identity(&root, "site-home");
    let evil = identity(&root, "site-evil");
    let running = common::start_coordinator(dir.path(), |c| {
        c.federation = Some(federation(&key, &credentials));
    })
    .await;
    let rest = running.rest_url();
    let http = reqwest::Client::new();
    let now = unix_now_ms;
    let stored: Value = common::upload(&http, &rest, common::minimal_wasm()).await;
    let digest = stored["digest"].as_str().unwrap().to_string();
    let url = format!("{rest}/api/v1/federation/tasks");
    let response = signed(
        &http,
        &home,
        Method::POST,
        &url,
        Some(&forward("t1", &digest)),
        now(),
    )
    .await;
    assert_eq!(response.status(), StatusCode::CREATED);

    // site-evil, a member in good standing, in site-home's name: 403 on
    // each route, and nothing changes.
    let response = signed(
        &http,
        &evil,
        Method::POST,
        &url,
        Some(&forward("t2", &digest)),
        now(),
    )
    .await;
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"], "forbidden", "{body}");
    for (method, path) in [
        (Method::GET, format!("{url}/site-home/t1")),
        (Method::POST, format!("{url}/site-home/t1/cancel")),
    ] {
        let response = signed(&http, &evil, method.clone(), &path, None, now()).await;
        assert_eq!(response.status(), StatusCode::FORBIDDEN, "{method} {path}");
    }
    assert_eq!(task_count(&http, &rest).await, 1);
    let status: Value = signed(
        &http,
        &home,
        Method::GET,
        &format!("{url}/site-home/t1"),
        None,
        now(),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(
        status["state"], "pending",
        "cancelled by another site: {status}"
    );
    // Its own name in the path, site-home's tasks unreachable: 404.
    let response = signed(
        &http,
        &evil,
        Method::GET,
        &format!("{url}/site-evil/t1"),
        None,
        now(),
    )
    .await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);

    // Claiming site-home in the header with its own certificate.
    let mut request = http.get(format!("{url}/site-home/t1"));
    let mut headers = evil.sign_request(
        "site-x",
        "GET",
        "/api/v1/federation/tasks/site-home/t1",
        b"",
        now(),
    );
    headers.site = "site-home".into();
    for (name, value) in headers.headers() {
        request = request.header(name, value);
    }
    assert_eq!(
        request.send().await.unwrap().status(),
        StatusCode::UNAUTHORIZED
    );

    // Certificates: another root's, an expired one.
    let stranger = identity(&TrustRoot::generate().unwrap(), "site-home");
    let expired = root
        .issue(
            &SiteId::new("site-home").unwrap(),
            now() - 10_000,
            Some(now() - 1),
        )
        .unwrap()
        .identity;
    for (who, by) in [("another root", &stranger), ("expired", &expired)] {
        let response = signed(
            &http,
            by,
            Method::GET,
            &format!("{url}/site-home/t1"),
            None,
            now(),
        )
        .await;
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{who}");
    }

    // A signed request replayed after the allowed skew, one signed for
    // another site, one whose body was changed after signing.
    let response = signed(
        &http,
        &home,
        Method::GET,
        &format!("{url}/site-home/t1"),
        None,
        now() - 61_000,
    )
    .await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    let body: Value = response.json().await.unwrap();
    assert!(
        body["message"].as_str().unwrap().contains("clock"),
        "{body}"
    );
    let elsewhere = home.sign_request(
        "site-y",
        "GET",
        "/api/v1/federation/tasks/site-home/t1",
        b"",
        now(),
    );
    let mut request = http.get(format!("{url}/site-home/t1"));
    for (name, value) in elsewhere.headers() {
        request = request.header(name, value);
    }
    assert_eq!(
        request.send().await.unwrap().status(),
        StatusCode::UNAUTHORIZED
    );
    let original = serde_json::to_vec(&forward("t5", &digest)).unwrap();
    let signature = home.sign_request(
        "site-x",
        "POST",
        "/api/v1/federation/tasks",
        &original,
        now(),
    );
    let mut altered = forward("t5", &digest);
    altered["priority"] = json!(9);
    let mut request = http.post(&url).json(&altered);
    for (name, value) in signature.headers() {
        request = request.header(name, value);
    }
    assert_eq!(
        request.send().await.unwrap().status(),
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(task_count(&http, &rest).await, 1);

    // Revocation: one another root signed is refused; the root's is taken
    // (once), stored, and site-home is refused from then on.
    let revocations = format!("{rest}/api/v1/federation/revocations");
    let forged = TrustRoot::generate()
        .unwrap()
        .revoke(&SiteId::new("site-home").unwrap(), now());
    let response = http.post(&revocations).json(&forged).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"], "invalid_revocation", "{body}");
    let revocation = root.revoke(&SiteId::new("site-home").unwrap(), now());
    for new in [true, false] {
        let answer: Value = http
            .post(&revocations)
            .json(&revocation)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(answer["new"], new, "{answer}");
    }
    assert_eq!(
        running.store().site_revocations().await.unwrap(),
        vec![revocation.clone()]
    );
    for (method, path, body) in [
        (Method::GET, format!("{url}/site-home/t1"), None),
        (Method::POST, format!("{url}/site-home/t1/cancel"), None),
        (Method::POST, url.clone(), Some(forward("t6", &digest))),
    ] {
        let response = signed(&http, &home, method.clone(), &path, body.as_ref(), now()).await;
        assert_eq!(
            response.status(),
            StatusCode::UNAUTHORIZED,
            "{method} {path}"
        );
        let body: Value = response.json().await.unwrap();
        assert!(
            body["message"].as_str().unwrap().contains("revoked"),
            "{body}"
        );
    }
    // Other sites are unaffected; site-home with credentials issued after
    // the revocation is a member again.
    let response = signed(
        &http,
        &evil,
        Method::GET,
        &format!("{url}/site-evil/t1"),
        None,
        now(),
    )
    .await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    let renewed = root
        .issue(
            &SiteId::new("site-home").unwrap(),
            revocation.revoked_ms + 1,
            None,
        )
        .unwrap()
        .identity;
    let response = signed(
        &http,
        &renewed,
        Method::GET,
        &format!("{url}/site-home/t1"),
        None,
        now(),
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    running.shutdown().await;
}

/// Federation without credentials, or with another site's, does not start.
#[tokio::test]
async fn a_coordinator_refuses_credentials_of_another_site() {
    let dir = tempfile::tempdir().unwrap();
    let key = ClusterKey::generate().unwrap();
    let root = TrustRoot::generate().unwrap();
    let path = dir.path().join("site-y.json");
    root.issue(&SiteId::new("site-y").unwrap(), unix_now_ms(), None)
        .unwrap()
        .write_new(&path)
        .unwrap();
    let mut config = starling_coordinator::CoordinatorConfig::ephemeral(dir.path());
    config.mqtt_allow_anonymous = true;
    config.federation = Some(federation(&key, &path));
    let Err(error) = starling_coordinator::start(config.clone()).await else {
        panic!("started with another site's credentials");
    };
    let error = error.to_string();
    assert!(
        error.contains("site-y") && error.contains("federation issue --site site-x"),
        "{error}"
    );
    config.federation = Some(federation(&key, &dir.path().join("missing.json")));
    let Err(error) = starling_coordinator::start(config).await else {
        panic!("started without credentials");
    };
    assert!(error.to_string().contains("missing.json"), "{error}");
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
    let (_root, credentials) = trust_root(dir.path());
    let running = common::start_coordinator(dir.path(), |c| {
        c.federation = Some(federation(&key, &credentials));
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

/// Issue 20, item 5: a forward is checked by the function that checks
/// `POST /api/v1/tasks`, so what a submission may not hold (too many or too
/// long arguments, an impossible demand, too much input) is refused with the
/// same typed error, and nothing is stored.
#[tokio::test]
async fn forwards_are_checked_like_submissions_and_refusals_store_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let key = ClusterKey::generate().unwrap();
    let (root, credentials) = trust_root(dir.path());
    let home = identity(&root, "site-home");
    let running = common::start_coordinator(dir.path(), |c| {
        c.federation = Some(federation(&key, &credentials));
    })
    .await;
    let rest = running.rest_url();
    let http = reqwest::Client::new();
    let stored: Value = common::upload(&http, &rest, common::minimal_wasm()).await;
    let digest = stored["digest"].as_str().unwrap();
    let url = format!("{rest}/api/v1/federation/tasks");
    let max_input = starling_proto::limits::MAX_INLINE_INPUT_BYTES;
    let too_much_input = base64::Engine::encode(
        &base64::engine::general_purpose::STANDARD,
        vec![0u8; max_input + 1],
    );
    let cases: [(&str, Value, StatusCode, &str); 5] = [
        (
            "args",
            json!(vec!["a"; starling_proto::limits::MAX_ARGS + 1]),
            StatusCode::BAD_REQUEST,
            "invalid_args",
        ),
        (
            "args",
            json!(["x".repeat(starling_proto::limits::ARG_LEN + 1)]),
            StatusCode::BAD_REQUEST,
            "invalid_args",
        ),
        (
            "demand",
            json!({"cpu_cores": 0.0}),
            StatusCode::BAD_REQUEST,
            "invalid_demand",
        ),
        (
            "input_base64",
            json!(too_much_input),
            StatusCode::PAYLOAD_TOO_LARGE,
            "input_too_large",
        ),
        (
            "input_base64",
            json!("not base64!"),
            StatusCode::BAD_REQUEST,
            "invalid_input",
        ),
    ];
    for (i, (field, value, status, code)) in cases.into_iter().enumerate() {
        let mut body = forward(&format!("bad-{i}"), digest);
        body[field] = value;
        let response = signed(
            &http,
            &home,
            reqwest::Method::POST,
            &url,
            Some(&body),
            unix_now_ms(),
        )
        .await;
        assert_eq!(response.status(), status, "{field}");
        let error: Value = response.json().await.unwrap();
        assert_eq!(error["error"], code, "{field}: {error}");
        // The same body as a local submission gets the same answer.
        let mut submission = json!({"artifact": digest, field: body[field].clone()});
        if field == "args" || field == "demand" {
            submission["input_text"] = json!("hi");
        }
        let local = http
            .post(format!("{rest}/api/v1/tasks"))
            .json(&submission)
            .send()
            .await
            .unwrap();
        assert_eq!(local.status(), status, "{field} submitted locally");
        let local: Value = local.json().await.unwrap();
        assert_eq!(local["error"], code, "{field} submitted locally: {local}");
    }
    // The runtime a forward names must be its artifact's.
    let mut body = forward("opencl", digest);
    body["runtime"] = json!("opencl");
    let response = signed(
        &http,
        &home,
        reqwest::Method::POST,
        &url,
        Some(&body),
        unix_now_ms(),
    )
    .await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert_eq!(task_count(&http, &rest).await, 0);

    // Within bounds, it is taken.
    let mut body = forward("good", digest);
    body["args"] = json!(vec!["a"; starling_proto::limits::MAX_ARGS]);
    let response = signed(
        &http,
        &home,
        reqwest::Method::POST,
        &url,
        Some(&body),
        unix_now_ms(),
    )
    .await;
    assert_eq!(response.status(), StatusCode::CREATED);
    assert_eq!(task_count(&http, &rest).await, 1);
    running.shutdown().await;
}

/// A peer's REST API that answers every artifact fetch with an endless
/// chunked body (no Content-Length) and everything else with a 404.
/// Returns its URL and how many artifact bytes it got to write.
async fn endless_artifact_server() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let sent = std::sync::Arc::new(AtomicUsize::new(0));
    let counter = sent.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let counter = counter.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buffer = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buffer[..n]),
                    }
                }
                if !head.starts_with(b"GET /api/v1/artifacts/") {
                    let _ = stream
                        .write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                        .await;
                    return;
                }
                let header = b"HTTP/1.1 200 OK\r\ncontent-type: application/wasm\r\ntransfer-encoding: chunked\r\n\r\n";
                if stream.write_all(header).await.is_err() {
                    return;
                }
                let chunk = vec![0u8; 16 * 1024];
                let framed =
                    [format!("{:x}\r\n", chunk.len()).as_bytes(), &chunk, b"\r\n"].concat();
                while stream.write_all(&framed).await.is_ok() {
                    counter.fetch_add(chunk.len(), Ordering::Relaxed);
                }
            });
        }
    });
    (url, sent)
}

/// Issue 20, item 5: an artifact fetched from a peer is read as a stream
/// and given up at this site's maximum, whatever the peer sends: here an
/// endless chunked body without a Content-Length. The forward is refused
/// and nothing is stored.
#[tokio::test]
async fn an_artifact_fetch_stops_at_the_maximum_without_a_content_length() {
    let dir = tempfile::tempdir().unwrap();
    let key = ClusterKey::generate().unwrap();
    let (root, credentials) = trust_root(dir.path());
    const MAX: usize = 256 * 1024;
    let running = common::start_coordinator(&dir.path().join("x"), |c| {
        c.federation = Some(federation(&key, &credentials));
        c.max_artifact_bytes = MAX;
    })
    .await;
    let gossip: std::net::SocketAddr = running
        .ready_line()
        .split_whitespace()
        .find_map(|field| field.strip_prefix("gossip="))
        .unwrap()
        .parse()
        .unwrap();
    // site-home: a real coordinator whose gossip names the endless server
    // as its REST API.
    let (peer_url, sent) = endless_artifact_server().await;
    let home_credentials = dir.path().join("site-home.credentials.json");
    root.issue(&SiteId::new("site-home").unwrap(), unix_now_ms(), None)
        .unwrap()
        .write_new(&home_credentials)
        .unwrap();
    let home = common::start_coordinator(&dir.path().join("home"), |c| {
        c.public_url = Some(peer_url.clone());
        c.federation = Some(FederationConfig {
            site: "site-home".into(),
            seeds: vec![gossip],
            ..federation(&key, &home_credentials)
        });
    })
    .await;
    let rest = running.rest_url();
    let http = reqwest::Client::new();
    common::eventually(
        std::time::Duration::from_secs(20),
        "site-x to learn site-home's REST URL",
        || {
            let (http, rest, peer_url) = (http.clone(), rest.clone(), peer_url.clone());
            async move {
                let sites = common::get_json(&http, &format!("{rest}/api/v1/sites")).await;
                sites["sites"]
                    .as_array()?
                    .iter()
                    .any(|s| s["site"] == "site-home" && s["api_url"] == peer_url.as_str())
                    .then_some(())
            }
        },
    )
    .await;

    let digest = "ab".repeat(32);
    let response = signed(
        &http,
        &identity(&root, "site-home"),
        reqwest::Method::POST,
        &format!("{rest}/api/v1/federation/tasks"),
        Some(&forward("big", &digest)),
        unix_now_ms(),
    )
    .await;
    assert_eq!(response.status(), StatusCode::CONFLICT);
    let error: Value = response.json().await.unwrap();
    assert_eq!(error["error"], "artifact_unavailable", "{error}");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("more than the {MAX} bytes")),
        "{message}"
    );
    let response = http
        .get(format!("{rest}/api/v1/artifacts/{digest}"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    assert_eq!(task_count(&http, &rest).await, 0);
    // It stopped reading: what the peer got to write is the maximum plus
    // what the sockets buffer, far from unbounded.
    let written = sent.load(std::sync::atomic::Ordering::Relaxed);
    assert!(written < 64 * 1024 * 1024, "the peer wrote {written} bytes");
    home.shutdown().await;
    running.shutdown().await;
}

/// The ed25519 signature of `digest` by `key`, as `starling sign` makes it.
fn publisher_signature(key: &ed25519_dalek::SigningKey, digest: &str) -> Value {
    use ed25519_dalek::Signer as _;
    let digest = starling_proto::Digest::parse(digest).unwrap();
    json!({
        "key": hex::encode(key.verifying_key().to_bytes()),
        "signature": hex::encode(key.sign(&digest.0).to_bytes()),
    })
}

/// Issue 20, item 4, and the attacker's side of it: a forward carries its
/// artifact's publisher signature, kept here with the artifact once it
/// verifies; one that does not verify over that artifact is refused with
/// `invalid_signature` before anything is fetched or stored, and a peer may
/// add a signature but not replace one this site holds.
#[tokio::test]
async fn a_forward_keeps_its_publisher_signature_and_a_false_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let key = ClusterKey::generate().unwrap();
    let (root, credentials) = trust_root(dir.path());
    let home = identity(&root, "site-home");
    let running = common::start_coordinator(dir.path(), |c| {
        c.federation = Some(federation(&key, &credentials));
    })
    .await;
    let rest = running.rest_url();
    let http = reqwest::Client::new();
    let url = format!("{rest}/api/v1/federation/tasks");
    let stored: Value = common::upload(&http, &rest, common::minimal_wasm()).await;
    let digest = stored["digest"].as_str().unwrap();
    let artifact = starling_proto::Digest::parse(digest).unwrap();
    let publisher = ed25519_dalek::SigningKey::from_bytes(&[3u8; 32]);
    let other = ed25519_dalek::SigningKey::from_bytes(&[4u8; 32]);
    let elsewhere = "cd".repeat(32);

    // Signed over another artifact, signed bytes that are not hex, a key
    // that is not one: refused, nothing stored. For an artifact this site
    // lacks, the refusal comes before any fetch (its origin is not even known).
    let mut not_hex = publisher_signature(&publisher, digest);
    not_hex["signature"] = json!("zz");
    let mut not_a_key = publisher_signature(&publisher, digest);
    not_a_key["key"] = json!("00");
    for (i, (artifact_of_forward, signature)) in [
        (digest, publisher_signature(&publisher, &elsewhere)),
        (digest, not_hex),
        (digest, not_a_key),
        (elsewhere.as_str(), publisher_signature(&publisher, digest)),
    ]
    .into_iter()
    .enumerate()
    {
        let mut body = forward(&format!("forged-{i}"), artifact_of_forward);
        body["publisher"] = signature;
        let response = signed(
            &http,
            &home,
            reqwest::Method::POST,
            &url,
            Some(&body),
            unix_now_ms(),
        )
        .await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "case {i}");
        let error: Value = response.json().await.unwrap();
        assert_eq!(error["error"], "invalid_signature", "case {i}: {error}");
    }
    assert_eq!(task_count(&http, &rest).await, 0);
    assert_eq!(
        running.store().artifact_publisher(&artifact).await.unwrap(),
        None
    );

    // A signature that verifies is kept with the artifact: assignments
    // here carry it, so nodes that trust the publisher run the task.
    let mut body = forward("signed", digest);
    body["publisher"] = publisher_signature(&publisher, digest);
    let response = signed(
        &http,
        &home,
        reqwest::Method::POST,
        &url,
        Some(&body),
        unix_now_ms(),
    )
    .await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let kept = running
        .store()
        .artifact_publisher(&artifact)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(kept.key, publisher.verifying_key().to_bytes().to_vec());

    // Another valid signature by another key does not replace it.
    let mut body = forward("resigned", digest);
    body["publisher"] = publisher_signature(&other, digest);
    let response = signed(
        &http,
        &home,
        reqwest::Method::POST,
        &url,
        Some(&body),
        unix_now_ms(),
    )
    .await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let kept = running
        .store()
        .artifact_publisher(&artifact)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(kept.key, publisher.verifying_key().to_bytes().to_vec());
    assert_eq!(task_count(&http, &rest).await, 2);
    running.shutdown().await;
}
