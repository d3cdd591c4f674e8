//! Nobody let in, end to end: assignments an attacker on the network forges,
//! replays or redirects are refused by the agent and reported, and change
//! nothing at the coordinator; the embedded broker refuses clients without
//! credentials; REST calls without a token, or with too low a role, are
//! refused and change nothing; a node that trusts a publisher runs only what
//! that publisher signed; coordinator and agents speak MQTT over TLS with the
//! broker's CA, and not without it.

use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ed25519_dalek::{Signer, SigningKey};
use starling_proto::{decode, encode, Assignment, Channel, NodeId, TaskEvent, TaskState, Topics};
use starling_tests::{
    binary, cli, cli_with_token, modules, wasm_file, Agent, Coordinator, Mosquitto, Pki, Store,
};

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn hex_decode(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// Starts `mosquitto_sub` on one topic, printing `TOPIC HEX` per message.
fn sniff(port: u16, topic: &str, count: usize) -> std::process::Child {
    let child = Command::new("mosquitto_sub")
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-q", "1"])
        .args([
            "-t",
            topic,
            "-F",
            "%t %x",
            "-W",
            "60",
            "-C",
            &count.to_string(),
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("mosquitto_sub is installed");
    // Give it time to subscribe before anything is published.
    std::thread::sleep(Duration::from_millis(500));
    child
}

fn sniffed(child: std::process::Child) -> Vec<(String, Vec<u8>)> {
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| line.split_once(' '))
        .map(|(topic, hex)| (topic.to_string(), hex_decode(hex)))
        .collect()
}

fn publish(port: u16, topic: &str, payload: &[u8]) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("payload");
    std::fs::write(&file, payload).unwrap();
    let status = Command::new("mosquitto_pub")
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-q", "1"])
        .args(["-t", topic, "-f"])
        .arg(&file)
        .status()
        .unwrap();
    assert!(status.success());
}

/// Publishes `assignment` to `node`'s assign topic and returns the event the
/// agent answers with.
fn answer(port: u16, node: &NodeId, payload: &[u8]) -> TaskEvent {
    let topics = Topics::default();
    let events = sniff(port, &topics.node(node, Channel::Events), 1);
    publish(port, &topics.node(node, Channel::Assign), payload);
    let got = sniffed(events);
    assert_eq!(got.len(), 1, "no answer from {node}");
    decode(&starling_tests::report_message(&got[0].1)).unwrap()
}

#[test]
fn forged_replayed_redirected_and_expired_assignments_are_refused_and_reported() {
    let _turn = crate::alongside();
    let broker = Mosquitto::start();
    // Short-lived assignments, so a captured one expires within the test.
    let coordinator = Coordinator::start(
        Some(&broker.url),
        Store::Sqlite,
        &["--assignment-ttl", "3s"],
    );
    let _a = Agent::start(&coordinator, &broker.url, "guard-a", "");
    coordinator.wait_for_nodes(1, Duration::from_secs(60));
    let _b = Agent::start(&coordinator, &broker.url, "guard-b", "");
    coordinator.wait_for_nodes(2, Duration::from_secs(60));
    let dir = tempfile::tempdir().unwrap();
    let echo = wasm_file(dir.path(), "echo", modules::ECHO);

    // An eavesdropper records a genuine assignment on its way to an agent.
    let capture = sniff(broker.port, "starling/v1/nodes/+/assign", 1);
    let task = coordinator.cli_json(
        &["run", echo.to_str().unwrap(), "--input", "-", "--wait"],
        Some(b"genuine"),
    );
    assert_eq!(task["output_text"], "echo:genuine");
    let id = task["id"].as_str().unwrap().to_string();
    let (topic, genuine_bytes) = sniffed(capture).pop().unwrap();
    let genuine: Assignment = decode(&genuine_bytes).unwrap();
    assert_eq!(genuine.task_id.as_str(), id);
    assert_eq!(genuine.signature.len(), 64, "assignments are signed");
    let owner = genuine.node_id.clone();
    let other = NodeId::new(if owner.as_str() == "guard-a" {
        "guard-b"
    } else {
        "guard-a"
    })
    .unwrap();
    assert!(topic.contains(owner.as_str()));

    // Redirected: the genuine bytes, still valid, sent to another node.
    let event = answer(broker.port, &other, &genuine_bytes);
    assert_eq!(event.state, TaskState::Rejected, "{event:?}");

    // Forged: a new attempt signed with a key the agents never pinned.
    let mut forged = genuine.clone();
    forged.attempt += 5;
    forged.input = b"evil".to_vec();
    forged.issued_unix_ms = now_ms();
    forged.expires_unix_ms = now_ms() + 60_000;
    let attacker = SigningKey::from_bytes(&[7; 32]);
    forged.signature = attacker
        .sign(&forged.signed_bytes().unwrap())
        .to_bytes()
        .to_vec();
    let event = answer(broker.port, &owner, &encode(&forged).unwrap());
    assert_eq!(event.state, TaskState::Rejected, "{event:?}");
    assert_eq!(event.attempt, forged.attempt);

    // Tampered: the genuine signature over changed content.
    let mut tampered = genuine.clone();
    tampered.attempt += 6;
    let event = answer(broker.port, &owner, &encode(&tampered).unwrap());
    assert_eq!(event.state, TaskState::Rejected, "{event:?}");

    // Replayed after its window: the genuine bytes, once expired, for a fresh
    // attempt number the agent has never seen (so it cannot be a redelivery).
    let wait = genuine.expires_unix_ms.saturating_sub(now_ms()) + 500;
    std::thread::sleep(Duration::from_millis(wait));
    let event = answer(broker.port, &owner, &genuine_bytes);
    // The agent remembers this attempt: it answers with its old result
    // rather than running it again, or refuses it as expired. Never a rerun.
    assert!(
        matches!(event.state, TaskState::Succeeded | TaskState::Rejected),
        "{event:?}"
    );

    // None of it changed the task: still succeeded once, on its own output.
    let after = coordinator.task(&id);
    assert_eq!(after["state"], "succeeded", "{after:#}");
    assert_eq!(after["attempt"], task["attempt"]);
    assert_eq!(after["output_text"], "echo:genuine");
    // The refusals reached the coordinator: counted and logged. They are
    // not task history, since none came from an attempt the node was given.
    let (status, metrics) = coordinator.http("GET", "/metrics", None);
    assert_eq!(status, 200, "{metrics}");
    let rejected: f64 = metrics
        .lines()
        .find_map(|line| line.strip_prefix("starling_assignments_rejected_total "))
        .unwrap_or_else(|| panic!("no rejection counter in {metrics}"))
        .trim()
        .parse()
        .unwrap();
    assert!(
        rejected >= 3.0,
        "the redirected, forged and tampered copies were reported: {metrics}"
    );
}

#[test]
fn the_embedded_broker_refuses_clients_without_credentials() {
    let _turn = crate::alongside();
    let coordinator = Coordinator::start(None, Store::Sqlite, &[]);
    let port = coordinator.mqtt.rsplit(':').next().unwrap().to_string();
    for credentials in [vec![], vec!["-u", "intruder", "-P", "guess"]] {
        let out = Command::new("mosquitto_sub")
            .args(["-h", "127.0.0.1", "-p", &port, "-t", "starling/v1/#"])
            .args(["-C", "1", "-W", "3"])
            .args(&credentials)
            .output()
            .unwrap();
        assert!(
            !out.status.success(),
            "connected with {credentials:?}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    // An enrolled agent gets in.
    let _agent = Agent::start(&coordinator, &coordinator.mqtt, "member", "");
    coordinator.wait_for_nodes(1, Duration::from_secs(60));
}

#[test]
fn rest_calls_without_a_token_or_with_a_low_role_are_refused_and_change_nothing() {
    let _turn = crate::alongside();
    let coordinator = Coordinator::start(None, Store::Sqlite, &[]);
    let dir = tempfile::tempdir().unwrap();
    let echo = wasm_file(dir.path(), "echo", modules::ECHO);
    let count = || {
        let out = coordinator.cli(&["tasks", "--json", "--limit", "1000"], None);
        assert!(out.status.success());
        serde_json::from_slice::<serde_json::Value>(&out.stdout)
            .unwrap()
            .as_array()
            .map(Vec::len)
            .unwrap_or(0)
    };
    let before = count();

    let anonymous = cli(&coordinator.rest, &["run", echo.to_str().unwrap()], None);
    assert!(!anonymous.status.success());
    assert!(
        String::from_utf8_lossy(&anonymous.stderr).contains("token"),
        "{}",
        String::from_utf8_lossy(&anonymous.stderr)
    );
    let out = coordinator.cli(
        &[
            "api-token",
            "create",
            "--role",
            "viewer",
            "--name",
            "dashboard",
            "--json",
        ],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let viewer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let viewer = viewer["token"].as_str().unwrap();
    let denied = cli_with_token(
        &coordinator.rest,
        Some(viewer),
        &["run", echo.to_str().unwrap()],
        None,
    );
    assert!(!denied.status.success());
    // A viewer may look.
    let looked = cli_with_token(&coordinator.rest, Some(viewer), &["tasks"], None);
    assert!(
        looked.status.success(),
        "{}",
        String::from_utf8_lossy(&looked.stderr)
    );
    assert_eq!(count(), before, "a refused call changed nothing");
}

#[test]
fn a_node_that_trusts_a_publisher_runs_only_what_it_signed() {
    let _turn = crate::alongside();
    let coordinator = Coordinator::start(None, Store::Sqlite, &[]);
    let dir = tempfile::tempdir().unwrap();
    let keygen = |name: &str| {
        let path = dir.path().join(name);
        let made = coordinator.cli_json(&["keygen", "--out", path.to_str().unwrap()], None);
        (path, made["public_key"].as_str().unwrap().to_string())
    };
    let (trusted_key, trusted_public) = keygen("trusted.key");
    let (stranger_key, _) = keygen("stranger.key");
    // A key is never overwritten.
    let again = coordinator.cli(&["keygen", "--out", trusted_key.to_str().unwrap()], None);
    assert!(!again.status.success());

    let _agent = Agent::start_with(
        &coordinator,
        &coordinator.mqtt,
        "strict",
        "",
        None,
        &["--trusted-publisher", &trusted_public],
    );
    coordinator.wait_for_nodes(1, Duration::from_secs(60));
    let echo = wasm_file(dir.path(), "echo", modules::ECHO);
    let out = coordinator.cli(&["publish", echo.to_str().unwrap()], None);
    assert!(out.status.success());
    let digest = String::from_utf8_lossy(&out.stdout).trim().to_string();

    let ended = |task: &serde_json::Value| {
        matches!(
            task["state"].as_str(),
            Some("succeeded" | "failed" | "cancelled")
        )
    };
    let run = |input: &str| {
        let id = coordinator.submit(&digest, input).unwrap();
        coordinator.wait_task(&id, Duration::from_secs(60), "ended", ended)
    };

    // Unsigned: refused by the node's policy, and the task says why.
    let task = run("unsigned");
    assert_eq!(task["state"], "failed", "{task:#}");
    assert_eq!(task["reason"], "policy_refused", "{task:#}");
    assert!(
        task["message"]
            .as_str()
            .unwrap()
            .contains("unsigned artifact"),
        "{task:#}"
    );

    // Signed by a key the node does not trust.
    let signed = coordinator.cli(
        &["sign", &digest, "--key", stranger_key.to_str().unwrap()],
        None,
    );
    assert!(
        signed.status.success(),
        "{}",
        String::from_utf8_lossy(&signed.stderr)
    );
    let task = run("stranger");
    assert_eq!(task["reason"], "policy_refused", "{task:#}");
    assert!(
        task["message"]
            .as_str()
            .unwrap()
            .contains("untrusted publisher"),
        "{task:#}"
    );

    // A signature that does not verify over this digest is refused by the
    // coordinator and replaces nothing.
    let other_digest = "ab".repeat(32);
    let stranger_signature = coordinator.cli(
        &[
            "sign",
            &other_digest,
            "--key",
            stranger_key.to_str().unwrap(),
        ],
        None,
    );
    assert!(!stranger_signature.status.success(), "no such artifact");
    let forged = serde_json::json!({"key": trusted_public, "signature": "00".repeat(64)});
    let (status, body) = coordinator.http(
        "POST",
        &format!("/api/v1/artifacts/{digest}/signature"),
        Some(("application/json", forged.to_string().into_bytes())),
    );
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(status, 400, "{body:#}");
    assert_eq!(body["error"], "invalid_signature", "{body:#}");

    // Signed by the trusted publisher: it runs.
    let signed = coordinator.cli_json(
        &["sign", &digest, "--key", trusted_key.to_str().unwrap()],
        None,
    );
    assert_eq!(signed["key"], trusted_public.as_str());
    let task = run("trusted");
    assert_eq!(task["state"], "succeeded", "{task:#}");
    assert_eq!(task["output_text"], "echo:trusted");
}

#[test]
fn coordinator_and_agents_speak_mqtt_over_tls_only_with_the_right_ca() {
    let _turn = crate::alongside();
    let pki_dir = tempfile::tempdir().unwrap();
    let pki = Pki::create(pki_dir.path());
    let broker = Mosquitto::start_tls(&pki);
    let ca = pki.ca.to_str().unwrap();

    // Without the CA the coordinator does not start, and says why.
    let data = tempfile::tempdir().unwrap();
    let refused = Command::new(binary("starling-coordinator"))
        .args(["serve", "--listen", "127.0.0.1:0", "--broker", &broker.url])
        .arg("--data-dir")
        .arg(data.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(stderr.contains("cannot reach the MQTT broker"), "{stderr}");

    let coordinator = Coordinator::start(Some(&broker.url), Store::Sqlite, &["--mqtt-ca-file", ca]);
    let _agent = Agent::start_with(
        &coordinator,
        &broker.url,
        "tls-edge",
        "",
        None,
        &["--mqtt-ca-file", ca],
    );
    coordinator.wait_for_nodes(1, Duration::from_secs(60));
    let dir = tempfile::tempdir().unwrap();
    let echo = wasm_file(dir.path(), "echo", modules::ECHO);
    let task = coordinator.cli_json(
        &["run", echo.to_str().unwrap(), "--input", "-", "--wait"],
        Some(b"sealed"),
    );
    assert_eq!(task["output_text"], "echo:sealed");

    // A plain MQTT client gets nothing from the TLS port.
    assert_plain_mqtt_refused(broker.port);
}

fn assert_plain_mqtt_refused(port: u16) {
    let plain = Command::new("mosquitto_sub")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(["-t", "starling/v1/#", "-C", "1", "-W", "3"])
        .output()
        .unwrap();
    assert!(!plain.status.success());
}

#[test]
fn the_embedded_broker_serves_tls_with_the_given_certificate() {
    let _turn = crate::alongside();
    let pki_dir = tempfile::tempdir().unwrap();
    let pki = Pki::create(pki_dir.path());
    let coordinator = Coordinator::start(
        None,
        Store::Sqlite,
        &[
            "--mqtt-tls-cert",
            pki.server_cert.to_str().unwrap(),
            "--mqtt-tls-key",
            pki.server_key.to_str().unwrap(),
        ],
    );
    assert!(
        coordinator.mqtt.starts_with("mqtts://"),
        "{}",
        coordinator.mqtt
    );
    let _agent = Agent::start_with(
        &coordinator,
        &coordinator.mqtt,
        "tls-local",
        "",
        None,
        &["--mqtt-ca-file", pki.ca.to_str().unwrap()],
    );
    coordinator.wait_for_nodes(1, Duration::from_secs(60));
    let dir = tempfile::tempdir().unwrap();
    let echo = wasm_file(dir.path(), "echo", modules::ECHO);
    let task = coordinator.cli_json(
        &["run", echo.to_str().unwrap(), "--input", "-", "--wait"],
        Some(b"embedded"),
    );
    assert_eq!(task["output_text"], "echo:embedded");
    let port: u16 = coordinator
        .mqtt
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert_plain_mqtt_refused(port);

    // Half a certificate is refused before anything starts.
    let data = tempfile::tempdir().unwrap();
    let refused = Command::new(binary("starling-coordinator"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--mqtt-listen",
            "127.0.0.1:0",
        ])
        .arg("--data-dir")
        .arg(data.path())
        .arg("--mqtt-tls-cert")
        .arg(&pki.server_cert)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(stderr.contains("--mqtt-tls-key"), "{stderr}");
}

#[test]
fn the_rest_api_serves_https_and_agents_and_the_cli_trust_its_ca() {
    let _turn = crate::alongside();
    let pki_dir = tempfile::tempdir().unwrap();
    let pki = Pki::create(pki_dir.path());
    let coordinator = Coordinator::start_https(None, Store::Sqlite, &[], &pki);
    assert!(
        coordinator.rest.starts_with("https://"),
        "{}",
        coordinator.rest
    );
    // The agent enrolls over HTTPS and fetches its module from an https URL.
    let _agent = Agent::start(&coordinator, &coordinator.mqtt, "https-edge", "");
    coordinator.wait_for_nodes(1, Duration::from_secs(60));
    let dir = tempfile::tempdir().unwrap();
    let echo = wasm_file(dir.path(), "echo", modules::ECHO);
    let task = coordinator.cli_json(
        &["run", echo.to_str().unwrap(), "--input", "-", "--wait"],
        Some(b"private"),
    );
    assert_eq!(task["output_text"], "echo:private");

    // A CLI that does not trust the CA gets nothing, and says why.
    let untrusting = cli(&coordinator.rest, &["nodes"], None);
    assert!(!untrusting.status.success());
    let stderr = String::from_utf8_lossy(&untrusting.stderr);
    assert!(stderr.contains("cannot reach the coordinator"), "{stderr}");
    assert!(stderr.contains("--ca-file"), "{stderr}");
    // Plain HTTP to the HTTPS port gets no API either.
    let plain = cli(
        &coordinator.rest.replacen("https://", "http://", 1),
        &["nodes"],
        None,
    );
    assert!(!plain.status.success());
}

#[test]
fn a_genuine_assignment_replayed_to_a_node_that_lost_its_journal_does_not_run_again() {
    let _turn = crate::alongside();
    let broker = Mosquitto::start();
    // A long validity window: the replay comes well inside it.
    let coordinator = Coordinator::start(
        Some(&broker.url),
        Store::Sqlite,
        &["--assignment-ttl", "5m"],
    );
    let mut agent = Agent::start(&coordinator, &broker.url, "amnesiac", "");
    coordinator.wait_for_nodes(1, Duration::from_secs(60));
    let dir = tempfile::tempdir().unwrap();
    let echo = wasm_file(dir.path(), "echo", modules::ECHO);

    let capture = sniff(broker.port, "starling/v1/nodes/amnesiac/assign", 1);
    let task = coordinator.cli_json(
        &["run", echo.to_str().unwrap(), "--input", "-", "--wait"],
        Some(b"once"),
    );
    assert_eq!(task["output_text"], "echo:once");
    let (_, genuine_bytes) = sniffed(capture).pop().unwrap();
    let genuine: Assignment = decode(&genuine_bytes).unwrap();
    assert!(genuine.expires_unix_ms > now_ms() + 60_000, "still valid");

    // The node loses its journal (a wiped disk) and boots again.
    agent.kill();
    for name in ["journal.sqlite", "journal.sqlite-wal", "journal.sqlite-shm"] {
        let _ = std::fs::remove_file(agent.dir.path().join(name));
    }
    agent.restart();
    coordinator.wait_for_nodes(1, Duration::from_secs(60));
    std::thread::sleep(Duration::from_millis(500));

    // The eavesdropper replays the genuine bytes: refused, not run again.
    let node = NodeId::new("amnesiac").unwrap();
    let event = answer(broker.port, &node, &genuine_bytes);
    assert_eq!(
        event.state,
        TaskState::Rejected,
        "{event:?}\n{}",
        agent.process.log()
    );
    let message = event.message.unwrap();
    assert!(message.contains("before this agent started"), "{message}");
    let after = coordinator.task(task["id"].as_str().unwrap());
    assert_eq!(after["state"], "succeeded");
    assert_eq!(after["attempt"], task["attempt"]);
}
