//! Agents without a compiler (issue 17): the small agent runs the code its
//! coordinator compiled for it, a fleet of small and JIT agents each get what
//! they can run, and code altered on its way to a node is refused before it
//! is loaded.

use std::path::Path;
use std::time::Duration;

use starling_tests::{modules, wasm_file, Agent, Coordinator, PostgresDb, Store};

/// Publishes a module; its digest, as the coordinator names it.
fn publish(coordinator: &Coordinator, module: &Path) -> String {
    let out = coordinator.cli(&["publish", module.to_str().unwrap()], None);
    assert!(
        out.status.success(),
        "publish: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Whether an agent's module cache holds the artifact with `digest`.
fn cached(agent: &Agent, digest: &str) -> bool {
    agent
        .dir
        .path()
        .join("artifacts")
        .join("sha256")
        .join(digest)
        .exists()
}

/// Runs the echo module with `input` and returns the task, whatever its end.
fn run_echo(coordinator: &Coordinator, echo: &Path, input: &str) -> serde_json::Value {
    let id = submit_echo(coordinator, echo, input);
    wait_ended(coordinator, &id)
}

/// Submits the echo module with `input`; the task's id.
fn submit_echo(coordinator: &Coordinator, echo: &Path, input: &str) -> String {
    let out = coordinator.cli(
        &[
            "run",
            echo.to_str().unwrap(),
            "--input",
            "-",
            "--timeout",
            "30s",
        ],
        Some(input.as_bytes()),
    );
    assert!(
        out.status.success(),
        "starling run: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Waits until the task `id` has ended, and returns it.
fn wait_ended(coordinator: &Coordinator, id: &str) -> serde_json::Value {
    coordinator.wait_task(id, Duration::from_secs(60), "ended", |task| {
        matches!(task["state"].as_str(), Some("succeeded" | "failed"))
    })
}

fn output(task: &serde_json::Value) -> &str {
    task["output_text"].as_str().unwrap_or_default()
}

/// Waits until the coordinator no longer lists `node` online.
fn wait_offline(coordinator: &Coordinator, node: &str) {
    let start = std::time::Instant::now();
    loop {
        let nodes = coordinator.cli_json(&["nodes"], None);
        let online = nodes
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["id"] == node && n["online"] == true);
        if !online {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{node} still online: {nodes:#}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn small_and_jit_agents_each_get_code_they_can_run() {
    // Built before this test takes its turn: a test that waits for its
    // turn alone would otherwise wait for this build, and every other test
    // behind it (scripts/test builds it before the tests; this is for a
    // run of this test by itself).
    starling_tests::small_agent_binary();
    let _turn = crate::alongside();
    let started = std::time::Instant::now();
    let phase = |what: &str| eprintln!("[{:>6.1} s] {what}", started.elapsed().as_secs_f64());
    let db = PostgresDb::create();
    let coordinator = Coordinator::start(None, Store::Postgres(db.url.clone()), &[]);
    let dir = tempfile::tempdir().unwrap();
    let echo = wasm_file(dir.path(), "echo", modules::ECHO);
    let module = publish(&coordinator, &echo);

    // A small agent alone: it says it has no compiler, and runs the echo
    // module from code the coordinator compiled for it.
    let small = Agent::start_small(&coordinator, &coordinator.mqtt, "small-1");
    coordinator.wait_for_nodes(1, Duration::from_secs(30));
    let (status, node) = coordinator.http("GET", "/api/v1/nodes/small-1", None);
    assert_eq!(status, 200, "{node}");
    let node: serde_json::Value = serde_json::from_str(&node).unwrap();
    let wasm = &node["capability"]["wasm"];
    assert_eq!(wasm["compiles"], false, "{node:#}");
    assert!(wasm["engine"].as_str().unwrap().starts_with("wasmtime-"));

    phase("small agent online");
    let task = run_echo(&coordinator, &echo, "from precompiled code");
    phase("ran on the small agent");
    assert_eq!(
        task["state"],
        "succeeded",
        "{task:#}\n{}",
        small.process.log()
    );
    assert_eq!(task["node_id"], "small-1");
    assert!(output(&task).contains("from precompiled code"), "{task:#}");
    let compiled = db.query(&format!(
        "SELECT digest FROM precompiled WHERE module = '{module}'"
    ));
    assert_eq!(
        compiled.lines().count(),
        1,
        "one compile per module and target: {compiled}"
    );
    assert!(
        cached(&small, &compiled),
        "the small agent fetched the code"
    );
    assert!(
        !cached(&small, &module),
        "the small agent never fetched the module"
    );

    // A JIT agent joins: tasks run on both, each node getting what it can
    // run (the module for the JIT agent, the code for the small one), and
    // the code is compiled once whatever the number of tasks.
    let jit = Agent::start(&coordinator, &coordinator.mqtt, "jit-1", "");
    coordinator.wait_for_nodes(2, Duration::from_secs(30));
    phase("JIT agent online");
    // Submitted in rounds of eight at once: one task at a time, both nodes
    // are always idle and the cheaper one (by its calibration, which varies
    // with the machine's load) took all sixteen in one run; eight queued
    // at once crowd one node and spread.
    let mut ran_on = std::collections::BTreeSet::new();
    for round in 0..3 {
        let inputs: Vec<String> = (0..8).map(|i| format!("task {round}.{i}")).collect();
        let ids: Vec<String> = inputs
            .iter()
            .map(|input| submit_echo(&coordinator, &echo, input))
            .collect();
        for (id, input) in ids.iter().zip(&inputs) {
            let task = wait_ended(&coordinator, id);
            assert_eq!(task["state"], "succeeded", "{task:#}");
            assert!(output(&task).contains(input.as_str()), "{task:#}");
            ran_on.insert(task["node_id"].as_str().unwrap().to_string());
        }
        if ran_on.len() == 2 {
            break;
        }
    }
    assert_eq!(
        ran_on.into_iter().collect::<Vec<_>>(),
        ["jit-1", "small-1"],
        "both agents ran tasks"
    );
    assert!(cached(&jit, &module), "the JIT agent fetched the module");
    assert!(
        !cached(&jit, &compiled),
        "the JIT agent compiled for itself"
    );
    assert_eq!(
        db.query("SELECT count(*) FROM precompiled"),
        "1",
        "compiled once"
    );
    phase("ran on both");
    drop(jit);
    wait_offline(&coordinator, "jit-1");
    phase("JIT agent offline");

    // Code altered between the coordinator and the node (here, in the
    // coordinator's store, as a compromised artifact server would serve it):
    // the small agent refuses it before loading it, and says why.
    db.query("UPDATE precompiled SET bytes = bytes || '\\x00'::bytea");
    std::fs::remove_file(
        small
            .dir
            .path()
            .join("artifacts")
            .join("sha256")
            .join(&compiled),
    )
    .unwrap();
    let task = run_echo(&coordinator, &echo, "never runs");
    phase("altered code refused");
    assert_eq!(task["state"], "failed", "{task:#}");
    assert_eq!(task["reason"], "digest_mismatch", "{task:#}");
    assert!(!output(&task).contains("never runs"), "{task:#}");
    assert!(!cached(&small, &compiled), "altered code is not kept");
}
