//! The binary as an operator meets it: help, probe output, config precedence,
//! and the start error when no broker is there.

use crate::support;

use std::process::Command;

fn agent() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_starling-agent"));
    for variable in [
        "STARLING_BROKER",
        "STARLING_NODE_ID",
        "STARLING_DATA_DIR",
        "STARLING_LABELS",
        "STARLING_CONFIG",
    ] {
        command.env_remove(variable);
    }
    command
}

#[test]
fn help_teaches_with_examples() {
    let out = agent().args(["run", "--help"]).output().unwrap();
    assert!(out.status.success());
    let out = agent().arg("--help").output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("Examples:"), "{text}");
    assert!(text.contains("starling-agent probe"), "{text}");
}

#[test]
fn probe_prints_json_and_flags_beat_env_beat_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("agent.toml");
    std::fs::write(
        &file,
        "node-id = \"from-file\"\n[labels]\nzone = \"file-zone\"\nrack = \"r1\"\n",
    )
    .unwrap();
    let data = dir.path().join("data");
    let probe = |extra: &[&str], env_id: Option<&str>| {
        let mut command = agent();
        command
            .arg("probe")
            .arg("--config")
            .arg(&file)
            .arg("--data-dir")
            .arg(&data)
            .args(extra);
        if let Some(id) = env_id {
            command.env("STARLING_NODE_ID", id);
        }
        let out = command.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let from_file = probe(&[], None);
    assert_eq!(from_file["node_id"], "from-file");
    assert_eq!(from_file["labels"].as_array().unwrap().len(), 2);
    assert!(from_file["runtimes"]
        .as_array()
        .unwrap()
        .contains(&serde_json::json!("wasm")));
    assert_eq!(probe(&[], Some("from-env"))["node_id"], "from-env");
    let from_flag = probe(
        &["--node-id", "from-flag", "--labels", "zone=flag"],
        Some("from-env"),
    );
    assert_eq!(from_flag["node_id"], "from-flag");
    assert_eq!(from_flag["labels"][0]["value"], "flag");
    let declared = probe(
        &["--disk-read-mbps", "120", "--disk-write-mbps", "45"],
        None,
    );
    let disks = declared["disks"].as_array().unwrap();
    if !disks.is_empty() {
        assert!(
            disks
                .iter()
                .any(|d| d["rate_source"] == "declared" && d["read_mbps"] == 120.0),
            "{disks:?}"
        );
    }
}

#[test]
fn bad_settings_and_missing_broker_fail_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let out = agent()
        .args(["probe", "--labels", "novalue"])
        .arg("--data-dir")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("key=value"), "{stderr}");

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out = agent()
        .args(["run", "--node-id", "cli-test", "--broker"])
        .arg(format!("mqtt://127.0.0.1:{port}"))
        .arg("--data-dir")
        .arg(dir.path())
        .env("RUST_LOG", "off")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains(&format!(
            "cannot reach MQTT broker at mqtt://127.0.0.1:{port}: connection refused; start one or pass --broker"
        )),
        "{stderr}"
    );
}

#[test]
fn sigterm_stops_the_agent_cleanly_with_an_offline_status() {
    let broker = support::Mosquitto::start();
    let dir = tempfile::tempdir().unwrap();
    let child = agent()
        .args(["run", "--node-id", "term-test", "--broker", &broker.url])
        .arg("--data-dir")
        .arg(dir.path())
        .env("RUST_LOG", "info")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until the agent's retained capability is on the broker.
    let capability = Command::new("mosquitto_sub")
        .args(["-h", "127.0.0.1", "-p", &broker.port.to_string()])
        .args([
            "-t",
            "starling/v1/nodes/term-test/capability",
            "-C",
            "1",
            "-W",
            "30",
        ])
        .output()
        .unwrap();
    assert!(
        capability.status.success(),
        "the agent never published its capability"
    );

    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}: {stderr}", out.status);
    assert!(stderr.contains("shutting down"), "{stderr}");

    let status = Command::new("mosquitto_sub")
        .args(["-h", "127.0.0.1", "-p", &broker.port.to_string()])
        .args([
            "-t",
            "starling/v1/nodes/term-test/status",
            "-C",
            "1",
            "-W",
            "10",
            "-F",
            "%x",
        ])
        .output()
        .unwrap();
    let hex = String::from_utf8_lossy(&status.stdout).trim().to_owned();
    let status: starling_proto::Status =
        starling_proto::decode(&hex::decode(hex).unwrap()).unwrap();
    assert_eq!(status.state, starling_proto::NodeState::Offline);
}
