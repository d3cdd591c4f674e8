//! `starling-agent swarm` against a real coordinator and its managed
//! Mosquitto: fifty virtual devices enroll with one join token, show up with
//! their profiles' capabilities, run two hundred real wasm tasks exactly once
//! each, and go offline by their last wills when the process is killed; and
//! a device's credentials reach only its own topics and its own session.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::{Duration, Instant};

use starling_tests::{modules, wasm_file, Coordinator, Store, Swarm};

const DEVICES: usize = 50;
const TASKS: usize = 200;

/// The nodes as `GET /api/v1/nodes` lists them, by id.
fn nodes(coordinator: &Coordinator) -> BTreeMap<String, serde_json::Value> {
    let (status, text) = coordinator.http("GET", "/api/v1/nodes", None);
    assert_eq!(status, 200, "{text}");
    let list: serde_json::Value = serde_json::from_str(&text).unwrap();
    list["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|node| (node["id"].as_str().unwrap().to_string(), node.clone()))
        .collect()
}

/// Waits until `done` holds for the node list; panics with the list after `timeout`.
fn wait_nodes(
    coordinator: &Coordinator,
    timeout: Duration,
    what: &str,
    done: impl Fn(&BTreeMap<String, serde_json::Value>) -> bool,
) -> BTreeMap<String, serde_json::Value> {
    let start = Instant::now();
    loop {
        let nodes = nodes(coordinator);
        if done(&nodes) {
            return nodes;
        }
        assert!(
            start.elapsed() < timeout,
            "nodes not {what} after {timeout:?}: {nodes:#?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[test]
fn fifty_enrolled_devices_run_two_hundred_tasks_once_each_and_go_offline_by_their_wills() {
    // Fifty agents and two hundred tasks load both cores: no other test beside it.
    let _turn = crate::alone();
    let coordinator = Coordinator::start(None, Store::Sqlite, &[]);
    let mut swarm = Swarm::start(&coordinator, &coordinator.mqtt, DEVICES, "it", &[]);
    assert_eq!(swarm.ready["count"], DEVICES);
    assert_eq!(swarm.ready["enrolled"], DEVICES);
    assert_eq!(swarm.ready["first"], "it-00001");
    assert_eq!(swarm.ready["last"], "it-00050");

    // Every device is listed online with its profile's capability: the
    // default mix is pi4, jetson, nuc, gateway in turn.
    let listed = wait_nodes(
        &coordinator,
        Duration::from_secs(60),
        "all online",
        |nodes| {
            swarm
                .node_ids()
                .iter()
                .all(|id| nodes.get(id).is_some_and(|node| node["online"] == true))
        },
    );
    let expected = [
        ("pi4", "aarch64", 4 << 30, "class=sbc"),
        ("jetson", "aarch64", 4 << 30, "class=gpu"),
        ("nuc", "x86_64", 16u64 << 30, "class=pc"),
        ("gateway", "x86_64", 8 << 30, "class=gateway"),
    ];
    for (index, id) in swarm.node_ids().iter().enumerate() {
        let node = &listed[id];
        let (profile, arch, memory, class) = expected[index % 4];
        let labels: Vec<&str> = node["labels"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l.as_str().unwrap())
            .collect();
        assert!(
            labels.contains(&format!("profile={profile}").as_str()),
            "{node}"
        );
        assert!(labels.contains(&class), "{node}");
        assert_eq!(node["arch"], arch, "{node}");
        assert_eq!(node["cores"], 4, "{node}");
        assert_eq!(node["memory_bytes"], memory, "{node}");
        // Real execution offers what a device can honour: wasm only.
        assert_eq!(node["runtimes"], serde_json::json!(["wasm"]), "{node}");
    }
    // The full capability too: a Jetson lists its GPU, at its clock.
    let (status, text) = coordinator.http("GET", "/api/v1/nodes/it-00002", None);
    assert_eq!(status, 200, "{text}");
    let jetson: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(jetson["capability"]["cpu"]["max_mhz"], 1430, "{jetson:#}");
    assert_eq!(
        jetson["capability"]["gpus"][0]["name"], "NVIDIA Tegra X1",
        "{jetson:#}"
    );

    // Two hundred real wasm tasks in one batch.
    let dir = tempfile::tempdir().unwrap();
    let echo = wasm_file(dir.path(), "echo", modules::ECHO);
    let out = coordinator.cli(&["publish", echo.to_str().unwrap()], None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let digest = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let batch = serde_json::json!({
        "tasks": (0..TASKS)
            .map(|i| serde_json::json!({"artifact": digest, "input_text": format!("n{i}")}))
            .collect::<Vec<_>>(),
    });
    let (status, text) = coordinator.http(
        "POST",
        "/api/v1/tasks:batch",
        Some(("application/json", serde_json::to_vec(&batch).unwrap())),
    );
    assert!(status == 200 || status == 201, "{status}: {text}");
    let created: serde_json::Value = serde_json::from_str(&text).unwrap();
    let ids: Vec<String> = created["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids.len(), TASKS);

    let start = Instant::now();
    loop {
        let (status, text) =
            coordinator.http("GET", "/api/v1/tasks?state=succeeded&limit=1000", None);
        assert_eq!(status, 200, "{text}");
        let list: serde_json::Value = serde_json::from_str(&text).unwrap();
        let done = list["tasks"].as_array().unwrap().len();
        if done == TASKS {
            break;
        }
        let (_, failed) = coordinator.http("GET", "/api/v1/tasks?state=failed", None);
        assert!(
            start.elapsed() < Duration::from_secs(180),
            "{done} of {TASKS} tasks succeeded after 180 s; failed: {failed}\n{}",
            swarm.log()
        );
        std::thread::sleep(Duration::from_millis(500));
    }

    // Each succeeded on its first attempt, with one succeeded event and the
    // right output, and ran once: the swarm finished each attempt once.
    let mut ran_on = BTreeSet::new();
    for (index, id) in ids.iter().enumerate() {
        let task = coordinator.task(id);
        assert_eq!(task["state"], "succeeded", "{task:#}");
        assert_eq!(task["output_text"], format!("echo:n{index}"), "{task:#}");
        assert_eq!(task["attempts"].as_array().unwrap().len(), 1, "{task:#}");
        let succeeded = task["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["state"] == "succeeded")
            .count();
        assert_eq!(succeeded, 1, "{task:#}");
        ran_on.insert(task["node_id"].as_str().unwrap().to_string());
    }
    let log = swarm.log();
    let finished: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("attempt finished"))
        .collect();
    assert_eq!(
        finished.len(),
        TASKS,
        "attempts finished in the swarm's log"
    );
    for id in &ids {
        let runs = finished
            .iter()
            .filter(|line| line.contains(id.as_str()))
            .count();
        assert_eq!(runs, 1, "task {id} ran {runs} times");
    }
    assert!(
        ran_on.len() > 1,
        "the tasks were spread over devices: {ran_on:?}"
    );

    // SIGKILL: nobody says goodbye; the broker publishes every last will.
    swarm.kill();
    wait_nodes(
        &coordinator,
        Duration::from_secs(30),
        "all offline",
        |nodes| {
            swarm
                .node_ids()
                .iter()
                .all(|id| nodes.get(id).is_some_and(|node| node["online"] == false))
        },
    );
}

/// Runs `mosquitto_pub` or `mosquitto_sub` (MQTT 5, so the broker says why
/// it refuses) with `args`; returns its exit status and what it printed.
fn mosquitto(program: &str, port: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new(program)
        .args(["-h", "127.0.0.1", "-p", port, "-V", "mqttv5"])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program} is installed: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn a_devices_credentials_reach_only_its_own_topics_and_its_own_session() {
    let _turn = crate::alongside();
    let coordinator = Coordinator::start(None, Store::Sqlite, &[]);
    let swarm = Swarm::start(&coordinator, &coordinator.mqtt, 2, "cell", &[]);
    let (a, b) = (swarm.node_id(0), swarm.node_id(1));
    wait_nodes(&coordinator, Duration::from_secs(60), "online", |nodes| {
        [&a, &b]
            .iter()
            .all(|id| nodes.get(*id).is_some_and(|node| node["online"] == true))
    });
    let port = coordinator.mqtt.rsplit(':').next().unwrap().to_string();
    let (user, password) = swarm.credentials(&a);
    assert_eq!(user, a);
    let login = ["-u", user.as_str(), "-P", password.as_str()];

    // Device A's login, asking for B's client id, publishes on B's topics:
    // the broker refuses every one (MQTT 5 tells the publisher so) ...
    let publish = |topic: &str| {
        let args = [
            &login[..],
            &["-i", b.as_str(), "-q", "1", "-t", topic, "-m", "forged"],
        ];
        mosquitto("mosquitto_pub", &port, &args.concat()).1
    };
    for channel in ["status", "capability", "telemetry", "events"] {
        let topic = format!("starling/v1/nodes/{b}/{channel}");
        let said = publish(&topic);
        assert!(
            said.contains("Not authorized"),
            "publishing on {topic} as {a}: {said:?}"
        );
    }
    // ... while on A's own topic it takes the message (the coordinator then
    // drops it: it is not a report signed with A's key).
    let own = format!("starling/v1/nodes/{a}/telemetry");
    let said = publish(&own);
    assert!(
        !said.contains("Not authorized"),
        "publishing on {own} as {a}: {said:?}"
    );

    // And it reads no other node's messages: both nodes' capability and
    // status are retained on the broker, and none reaches it.
    let (_, read) = mosquitto(
        "mosquitto_sub",
        &port,
        &[
            &login[..],
            &["-t", "starling/v1/nodes/+/+", "-F", "%t", "-W", "3"],
        ]
        .concat(),
    );
    assert!(
        !read.lines().any(|line| line.starts_with("starling/")),
        "{a}'s login read: {read:?}"
    );

    // The client id is bound to the login: the session A's login took over
    // was A's own, never B's. B stayed connected throughout; A came back.
    let log = swarm.log();
    let lost = |node: &str| {
        log.lines()
            .any(|l| l.contains(&format!("node={node}")) && l.contains("lost the MQTT connection"))
    };
    assert!(!lost(&b), "device {b} lost its session:\n{log}");
    assert!(
        lost(&a),
        "the takeover should have hit {a}'s own session:\n{log}"
    );
    wait_nodes(
        &coordinator,
        Duration::from_secs(30),
        "online again",
        |nodes| {
            [&a, &b]
                .iter()
                .all(|id| nodes.get(*id).is_some_and(|node| node["online"] == true))
        },
    );

    // B's password is not A's: a login as B with it is refused.
    let (ok, said) = mosquitto(
        "mosquitto_pub",
        &port,
        &[
            "-u",
            b.as_str(),
            "-P",
            password.as_str(),
            "-t",
            "x",
            "-m",
            "x",
        ],
    );
    assert!(!ok, "logged in as {b} with {a}'s password: {said:?}");
}
