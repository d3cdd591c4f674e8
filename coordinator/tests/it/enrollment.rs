//! A fleet enrolling at once, against a coordinator that runs its own
//! Mosquitto: every enrollment answers only once the broker lets the new
//! node in, the rewrites of the password file are shared between the
//! enrollments that arrive together, and a node revoked among many is cut
//! off when its revoke call answers.

use crate::common;

use std::time::Duration;

use reqwest::StatusCode;
use rumqttc::{AsyncClient, Event, EventLoop, MqttOptions, Packet};
use serde_json::{json, Value};

const BOOTSTRAP: &str = "bootstrap-admin-secret";

/// Nodes that enroll at once.
const FLEET: usize = 64;

/// Connects and waits for the broker's answer: Ok once a ConnAck accepted
/// the login, Err with the reason otherwise.
async fn try_connect(
    url: &str,
    id: &str,
    password: &str,
) -> Result<(AsyncClient, EventLoop), String> {
    let (host, port) = url.trim_start_matches("mqtt://").rsplit_once(':').unwrap();
    let mut options = MqttOptions::new(id, host, port.parse().unwrap());
    options.set_keep_alive(Duration::from_secs(5));
    options.set_credentials(id, password);
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

/// Drives a connection in the background; the receiver hears when the
/// broker closes it.
fn drive(mut eventloop: EventLoop) -> tokio::sync::oneshot::Receiver<()> {
    let (closed, heard) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        while eventloop.poll().await.is_ok() {}
        let _ = closed.send(());
    });
    heard
}

/// The value of an unlabelled series on `/metrics`.
async fn metric(http: &reqwest::Client, rest: &str, name: &str) -> u64 {
    let text = http
        .get(format!("{rest}/metrics"))
        .bearer_auth(BOOTSTRAP)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics:\n{text}"))
}

/// Enrolls `node` and returns its MQTT password. (The password file is
/// not read here: the coordinator tells that Mosquitto reread it by its
/// access time, which a read by the test would move too.)
async fn enroll(http: &reqwest::Client, rest: &str, token: &str, node: &str) -> String {
    let answer = http
        .post(format!("{rest}/api/v1/enroll"))
        .json(&json!({"join_token": token, "node_id": node, "report_key": common::report_key_hex(node)}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::CREATED, "{node}");
    let credentials: Value = answer.json().await.unwrap();
    credentials["mqtt_password"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fleet_enrolling_at_once_shares_rewrites_and_every_node_logs_in() {
    let dir = tempfile::tempdir().unwrap();
    let running = common::start_coordinator(dir.path(), |config| {
        config.api_token = Some(BOOTSTRAP.into());
        config.mqtt_allow_anonymous = false;
    })
    .await;
    let rest = running.rest_url();
    let mqtt = running.mqtt_url().to_string();
    let passwd = dir.path().join("broker").join("passwd");
    let http = reqwest::Client::new();
    let token: Value = http
        .post(format!("{rest}/api/v1/join-tokens"))
        .bearer_auth(BOOTSTRAP)
        .json(&json!({"uses": FLEET}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let token = token["token"].as_str().unwrap().to_string();
    let reloads_at_start = metric(&http, &rest, "starling_mosquitto_reloads_total").await;

    // Every node enrolls at once and logs in as soon as it has its password.
    let mut fleet = tokio::task::JoinSet::new();
    for i in 0..FLEET {
        let (http, rest, token, mqtt) = (http.clone(), rest.clone(), token.clone(), mqtt.clone());
        fleet.spawn(async move {
            let node = format!("fleet-{i:02}");
            let password = enroll(&http, &rest, &token, &node).await;
            let (client, eventloop) = try_connect(&mqtt, &node, &password)
                .await
                .unwrap_or_else(|error| panic!("{node} refused right after enrolling: {error}"));
            (node, password, client, drive(eventloop))
        });
    }
    let mut nodes = Vec::new();
    while let Some(joined) = fleet.join_next().await {
        nodes.push(joined.unwrap());
    }
    nodes.sort_by(|a, b| a.0.cmp(&b.0));
    let reloads = metric(&http, &rest, "starling_mosquitto_reloads_total").await - reloads_at_start;
    eprintln!("{FLEET} enrollments, {reloads} rewrites of Mosquitto's files");
    assert!(reloads >= 1, "nothing was rewritten");
    assert!(
        reloads <= (FLEET / 4) as u64,
        "{reloads} rewrites for {FLEET} enrollments at once"
    );

    // Eight of them are revoked at once while connected: each revoke call
    // answers only once the broker refuses the node's login, and each loses
    // its session; the others stay connected.
    let kept = nodes.split_off(8);
    let mut revokes = tokio::task::JoinSet::new();
    for (node, password, _, _) in &nodes {
        let (http, rest, mqtt, node, password) = (
            http.clone(),
            rest.clone(),
            mqtt.clone(),
            node.clone(),
            password.clone(),
        );
        revokes.spawn(async move {
            let answer = http
                .post(format!("{rest}/api/v1/nodes/{node}/revoke"))
                .bearer_auth(BOOTSTRAP)
                .send()
                .await
                .unwrap();
            assert_eq!(answer.status(), StatusCode::OK, "{node}");
            assert!(
                try_connect(&mqtt, &node, &password).await.is_err(),
                "{node} logged in after its revoke call answered"
            );
        });
    }
    while let Some(joined) = revokes.join_next().await {
        joined.unwrap();
    }
    for (node, _, _client, closed) in nodes {
        assert!(
            tokio::time::timeout(Duration::from_secs(2), closed)
                .await
                .is_ok(),
            "{node} kept its session after it was revoked"
        );
    }
    // No rewrite runs now: reading the password file disturbs nothing.
    let passwd_text = std::fs::read_to_string(&passwd).unwrap();
    for (node, _, _client, mut closed) in kept {
        assert!(passwd_text.contains(&format!("\n{node}:$7$")), "{node}");
        assert!(
            matches!(
                closed.try_recv(),
                Err(tokio::sync::oneshot::error::TryRecvError::Empty)
            ),
            "{node}, not revoked, lost its session"
        );
    }
    running.shutdown().await;
}
