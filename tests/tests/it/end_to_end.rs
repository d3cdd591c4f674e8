//! The spine, whole and real: agents report over MQTT, the coordinator places a
//! wasm task submitted through the CLI, an agent runs it, and the CLI prints
//! its output. Against Mosquitto, against the embedded broker, and with the
//! PostgreSQL store.

use std::time::Duration;

use starling_tests::{modules, wasm_file, Agent, Coordinator, Mosquitto, PostgresDb, Store};

/// Submits the echo module through `starling run --wait` and checks its output.
fn run_echo(coordinator: &Coordinator, dir: &std::path::Path, input: &str) {
    let echo = wasm_file(dir, "echo", modules::ECHO);
    let out = coordinator.cli(
        &[
            "run",
            echo.to_str().unwrap(),
            "--input",
            "-",
            "--deadline",
            "30s",
            "--wait",
        ],
        Some(input.as_bytes()),
    );
    assert!(
        out.status.success(),
        "starling run failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        coordinator.process.log()
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("echo:{input}")
    );
}

/// Runs several tasks and returns the set of nodes that ran them.
fn run_many(coordinator: &Coordinator, dir: &std::path::Path, count: usize) -> Vec<String> {
    let echo = wasm_file(dir, "echo", modules::ECHO);
    let mut nodes = Vec::new();
    for i in 0..count {
        let task = coordinator.cli_json(
            &["run", echo.to_str().unwrap(), "--input", "-", "--wait"],
            Some(format!("task {i}").as_bytes()),
        );
        assert_eq!(task["state"], "succeeded", "{task}");
        nodes.push(task["node_id"].as_str().unwrap_or_default().to_string());
    }
    nodes
}

#[test]
fn two_agents_over_mosquitto_with_sqlite() {
    let _turn = crate::alongside();
    let broker = Mosquitto::start();
    let coordinator = Coordinator::start(Some(&broker.url), Store::Sqlite, &[]);
    let _a = Agent::start(&coordinator, &broker.url, "edge-a", "zone=lab");
    let _b = Agent::start(&coordinator, &broker.url, "edge-b", "zone=field");
    coordinator.wait_for_nodes(2, Duration::from_secs(30));
    let dir = tempfile::tempdir().unwrap();
    run_echo(&coordinator, dir.path(), "hello over mosquitto");
    let nodes = run_many(&coordinator, dir.path(), 6);
    assert!(
        nodes.iter().all(|n| n == "edge-a" || n == "edge-b"),
        "{nodes:?}"
    );
}

#[test]
fn two_agents_over_the_embedded_broker() {
    let _turn = crate::alongside();
    let coordinator = Coordinator::start(None, Store::Sqlite, &[]);
    let _a = Agent::start(&coordinator, &coordinator.mqtt, "embedded-a", "");
    let _b = Agent::start(&coordinator, &coordinator.mqtt, "embedded-b", "");
    coordinator.wait_for_nodes(2, Duration::from_secs(30));
    let dir = tempfile::tempdir().unwrap();
    run_echo(
        &coordinator,
        dir.path(),
        "hello over the coordinator's broker",
    );
}

#[test]
fn two_agents_with_the_postgres_store() {
    let _turn = crate::alongside();
    let db = PostgresDb::create();
    let broker = Mosquitto::start();
    let coordinator = Coordinator::start(Some(&broker.url), Store::Postgres(db.url.clone()), &[]);
    let _a = Agent::start(&coordinator, &broker.url, "pg-a", "");
    let _b = Agent::start(&coordinator, &broker.url, "pg-b", "");
    coordinator.wait_for_nodes(2, Duration::from_secs(30));
    let dir = tempfile::tempdir().unwrap();
    run_echo(&coordinator, dir.path(), "hello with postgres");
    // The result outlives the coordinator: a new one on the same database lists it.
    drop(coordinator);
    let again = Coordinator::start(Some(&broker.url), Store::Postgres(db.url.clone()), &[]);
    let listed = again.cli(&["tasks", "--json"], None);
    assert!(
        listed.status.success(),
        "{}",
        String::from_utf8_lossy(&listed.stderr)
    );
    let tasks: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert!(
        tasks
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["state"] == "succeeded"),
        "{tasks}"
    );
}

#[test]
fn starling_up_runs_everything_in_one_process() {
    let _turn = crate::alongside();
    let mut up = Coordinator::start_up(&["--node-id", "local"]);
    let nodes = up.wait_for_nodes(1, Duration::from_secs(30));
    assert_eq!(nodes[0]["id"], "local", "{nodes}");
    let dir = tempfile::tempdir().unwrap();
    run_echo(&up, dir.path(), "hello from starling up");
    // Ctrl-C (SIGTERM here) stops it cleanly: exit status 0.
    up.process.stop();
    assert_eq!(up.process.exit_code(), Some(0), "{}", up.process.log());
}

#[test]
fn a_learned_policy_places_real_tasks() {
    let _turn = crate::alongside();
    // HiRL with the shipped model: the DDQN picks the node, the TD3 actor its
    // power level, and the explanation says so.
    let coordinator = Coordinator::start(None, Store::Sqlite, &["--policy", "hirl"]);
    let _a = Agent::start(&coordinator, &coordinator.mqtt, "learned-a", "");
    let _b = Agent::start(&coordinator, &coordinator.mqtt, "learned-b", "");
    coordinator.wait_for_nodes(2, Duration::from_secs(30));
    let dir = tempfile::tempdir().unwrap();
    run_echo(&coordinator, dir.path(), "placed by hirl");
    let echo = wasm_file(dir.path(), "echo", modules::ECHO);
    let task = coordinator.cli_json(
        &["run", echo.to_str().unwrap(), "--input", "-", "--wait"],
        Some(b"again"),
    );
    assert_eq!(task["state"], "succeeded", "{task}");
    let id = task["id"].as_str().unwrap();
    let shown = coordinator.cli_json(&["task", id], None);
    let explanation = &shown["explanation"];
    assert_eq!(explanation["policy"], "hirl", "{shown}");
    let summary = explanation["summary"].as_str().unwrap();
    assert!(
        summary.contains("DDQN value") && summary.contains("TD3 power actor"),
        "{summary}"
    );
    // The agents have no cpufreq: each offers one level and says it cannot
    // apply levels, and the task's events say what was in force.
    let running = shown["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["state"] == "running")
        .unwrap_or_else(|| panic!("no running event: {shown}"));
    assert_eq!(
        running["power"],
        serde_json::json!({"requested": 0, "in_force": 0, "max_frequency_khz": null}),
        "{shown}"
    );
}
