//! Bad input ends in a clear failed event or HTTP error, and both the agent and
//! the coordinator keep serving: malformed CBOR on every topic, an unsigned
//! assignment, a module that loops forever, one that grows memory
//! without end, one that writes unbounded output, an upload that is not wasm.

use std::process::Command;
use std::time::Duration;

use starling_proto::{
    encode, Assignment, Channel, Digest, ExecLimits, NodeId, Runtime, TaskId, Topics,
};
use starling_tests::{modules, wasm_file, Agent, Coordinator, Mosquitto, Store};

fn publish(port: u16, topic: &str, payload: &[u8]) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("payload");
    std::fs::write(&file, payload).unwrap();
    let status = Command::new("mosquitto_pub")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-q",
            "1",
            "-t",
            topic,
            "-f",
        ])
        .arg(&file)
        .status()
        .unwrap();
    assert!(status.success());
}

/// Runs a module with tight limits and returns the task as JSON.
fn run_limited(coordinator: &Coordinator, module: &std::path::Path) -> serde_json::Value {
    let out = coordinator.cli(
        &[
            "run",
            module.to_str().unwrap(),
            "--timeout",
            "2s",
            "--memory",
            "16MiB",
            "--max-output",
            "64KiB",
            "--wait",
            "--json",
        ],
        None,
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "a failed task exits 1: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn bad_input_fails_clearly_and_everything_keeps_serving() {
    let _turn = crate::alongside();
    let broker = Mosquitto::start();
    let mut coordinator = Coordinator::start(Some(&broker.url), Store::Sqlite, &[]);
    let mut agent = Agent::start(&coordinator, &broker.url, "victim", "");
    coordinator.wait_for_nodes(1, Duration::from_secs(30));
    let dir = tempfile::tempdir().unwrap();
    let topics = Topics::default();
    let node = NodeId::new("victim").unwrap();

    // Malformed CBOR on every topic, for a known and an unknown node.
    for channel in Channel::ALL {
        for garbage in [&b"\xff\xff\xff"[..], b"not cbor at all", &[0x9f; 64], b""] {
            publish(broker.port, &topics.node(&node, channel), garbage);
            publish(
                broker.port,
                &topics.node(&NodeId::new("ghost").unwrap(), channel),
                garbage,
            );
        }
    }

    // An unsigned assignment, as anyone on the network could publish: the
    // agent refuses it without fetching or running anything, and says so.
    let task_id = TaskId::new("bogus-digest-task").unwrap();
    let digest = Digest([0xab; 32]);
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let assignment = Assignment {
        v: starling_proto::PROTOCOL_VERSION,
        node_id: node.clone(),
        task_id: task_id.clone(),
        attempt: 1,
        runtime: Runtime::Wasm,
        artifact: digest,
        artifact_url: heapless::String::try_from(
            format!("{}/api/v1/artifacts/{digest}", coordinator.rest).as_str(),
        )
        .unwrap(),
        args: heapless::Vec::new(),
        input: Vec::new(),
        limits: ExecLimits::default(),
        power_level: 0,
        deadline_unix_ms: None,
        grants: Default::default(),
        publisher: None,
        precompiled: None,
        leader_epoch: None,
        issued_unix_ms: now_ms,
        expires_unix_ms: now_ms + 60_000,
        signature: Vec::new(),
    };
    let events = Command::new("mosquitto_sub")
        .args(["-h", "127.0.0.1", "-p", &broker.port.to_string()])
        .args([
            "-t",
            &topics.node(&node, Channel::Events),
            "-F",
            "%x",
            "-W",
            "20",
            "-C",
            "1",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    publish(
        broker.port,
        &topics.node(&node, Channel::Assign),
        &encode(&assignment).unwrap(),
    );
    let out = events.wait_with_output().unwrap();
    let states: Vec<starling_proto::TaskEvent> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|hex| {
            let bytes: Vec<u8> = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                .collect();
            starling_proto::decode(&starling_tests::report_message(&bytes)).unwrap()
        })
        .collect();
    let rejected = states
        .iter()
        .find(|e| e.state == starling_proto::TaskState::Rejected)
        .unwrap_or_else(|| panic!("no rejected event: {states:?}\n{}", agent.process.log()));
    assert_eq!(rejected.task_id, task_id);
    assert!(
        rejected.message.as_ref().is_some_and(|m| !m.is_empty()),
        "a refusal says why: {rejected:?}"
    );

    // Modules that misbehave end in failed tasks with the matching reason.
    for (name, text, reason) in [
        ("loop", modules::LOOP_FOREVER, "timeout"),
        ("grow", modules::GROW_FOREVER, "memory_limit"),
        ("spew", modules::SPEW_FOREVER, "output_limit"),
    ] {
        let module = wasm_file(dir.path(), name, text);
        let task = run_limited(&coordinator, &module);
        assert_eq!(task["state"], "failed", "{name}: {task}");
        assert_eq!(task["reason"], reason, "{name}: {task}");
    }

    // An upload that is not wasm is refused with a clear message.
    let not_wasm = dir.path().join("notes.wasm");
    std::fs::write(&not_wasm, b"#!/bin/sh\necho not a module\n").unwrap();
    let out = coordinator.cli(&["publish", not_wasm.to_str().unwrap()], None);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("not a WebAssembly module") || stderr.contains("not wasm"),
        "{stderr}"
    );

    // And after all that, both sides still serve a good task.
    assert!(
        agent.process.is_running(),
        "agent died:\n{}",
        agent.process.log()
    );
    assert!(coordinator.process.is_running(), "coordinator died");
    let echo = wasm_file(dir.path(), "echo", modules::ECHO);
    let out = coordinator.cli(
        &["run", echo.to_str().unwrap(), "--input", "-", "--wait"],
        Some(b"still here"),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "echo:still here");
}
