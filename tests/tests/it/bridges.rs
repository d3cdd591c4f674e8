//! Spreading agents over several Mosquitto brokers: edge brokers bridged to
//! one core broker that the coordinator uses. An agent given both edges
//! (`--broker edge1,edge2`) reports and runs tasks through the first; when
//! that broker dies, it moves to the second and keeps working, and the
//! coordinator, on the core, never notices more than a short silence.

use std::time::Duration;

use starling_tests::{modules, wasm_file, Agent, Coordinator, Mosquitto, Store};

/// A Mosquitto that bridges every Starling topic, both ways, to `core`.
fn edge_broker(core: &Mosquitto, name: &str) -> Mosquitto {
    Mosquitto::start_with_config(&format!(
        "allow_anonymous true\n\
         connection {name}\n\
         address 127.0.0.1:{}\n\
         topic starling/v1/# both 1\n\
         cleansession true\n\
         restart_timeout 1\n",
        core.port
    ))
}

fn run_echo(coordinator: &Coordinator, module: &std::path::Path, input: &str) -> serde_json::Value {
    let task = coordinator.cli_json(
        &[
            "run",
            module.to_str().unwrap(),
            "--input",
            "-",
            "--deadline",
            "60s",
            "--wait",
        ],
        Some(input.as_bytes()),
    );
    assert_eq!(
        task["state"],
        "succeeded",
        "{task}\n{}",
        coordinator.process.log()
    );
    task
}

#[test]
fn an_agent_fails_over_between_bridged_edge_brokers() {
    let _turn = crate::alongside();
    let core = Mosquitto::start();
    let mut first = edge_broker(&core, "edge-1");
    let second = edge_broker(&core, "edge-2");
    let coordinator =
        Coordinator::start(Some(&core.url), Store::Sqlite, &["--mqtt-allow-anonymous"]);
    let agent = Agent::start(
        &coordinator,
        &format!("{},{}", first.url, second.url),
        "bridged-1",
        "",
    );
    coordinator.wait_for_nodes(1, Duration::from_secs(30));
    let dir = tempfile::tempdir().unwrap();
    let echo = wasm_file(dir.path(), "echo", modules::ECHO);
    let task = run_echo(&coordinator, &echo, "through edge 1");
    assert_eq!(task["node_id"], "bridged-1");

    first.kill();
    // The agent moves to the second edge broker; its reports reach the core
    // through that bridge, and assignments come back the same way.
    let task = run_echo(&coordinator, &echo, "through edge 2");
    assert_eq!(task["node_id"], "bridged-1");
    let log = agent.process.log();
    assert!(
        log.contains("lost the MQTT connection") && log.contains(&second.url),
        "the agent says where it went: {log}"
    );
    let nodes = coordinator.cli_json(&["nodes"], None);
    assert!(
        nodes[0]["state"] == "online" || nodes[0]["online"] == true,
        "{nodes}"
    );
}

#[test]
fn an_agent_with_no_broker_reachable_names_every_one_it_tried() {
    let _turn = crate::alongside();
    let core = Mosquitto::start();
    let coordinator =
        Coordinator::start(Some(&core.url), Store::Sqlite, &["--mqtt-allow-anonymous"]);
    let (a, b) = (starling_tests::free_port(), starling_tests::free_port());
    let mut agent = Agent::start_with(
        &coordinator,
        &format!("mqtt://127.0.0.1:{a},mqtt://127.0.0.1:{b}"),
        "nowhere-1",
        "",
        None,
        &[],
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while agent.process.exit_code().is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "{}",
            agent.process.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_ne!(agent.process.exit_code(), Some(0));
    let log = agent.process.log();
    assert!(
        log.contains(&format!("127.0.0.1:{a}")) && log.contains(&format!("127.0.0.1:{b}")),
        "{log}"
    );
}
