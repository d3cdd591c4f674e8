//! The two binaries as users meet them: `starling-coordinator serve` (ready
//! line, one-line startup errors) and the `starling` CLI (output, exit codes).

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

const COORDINATOR: &str = env!("CARGO_BIN_EXE_starling-coordinator");
/// The `starling` CLI is built by its own crate (`starling-cli`); the shared
/// harness builds the workspace's binaries once and finds it.
fn cli_binary() -> std::path::PathBuf {
    starling_tests::binary("starling")
}

fn serve(dir: &std::path::Path, extra: &[&str]) -> Command {
    let mut command = Command::new(COORDINATOR);
    command
        .arg("serve")
        .arg("--data-dir")
        .arg(dir)
        .args(extra)
        .env_remove("STARLING_API_TOKEN")
        .env("RUST_LOG", "warn");
    command
}

/// The first line a spawned `serve` prints on stdout (its ready line).
fn ready_line(child: &mut std::process::Child) -> String {
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    line
}

/// Runs `serve` expecting it to fail at startup; returns its stderr.
fn failing_serve(extra: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let output = serve(dir.path(), extra).output().unwrap();
    assert!(!output.status.success(), "serve {extra:?} should fail");
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    let last = stderr.lines().last().unwrap_or_default().to_string();
    assert!(last.starts_with("starling-coordinator: "), "{stderr}");
    last
}

#[test]
fn serve_prints_the_ready_line_and_serves() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("coordinator.toml");
    // The file asks for a policy that does not exist; the flag wins.
    std::fs::write(
        &config,
        "policy = \"no-such-policy\"\nlisten = \"127.0.0.1:0\"\n",
    )
    .unwrap();
    let mut child = serve(
        dir.path(),
        &[
            "--config",
            config.to_str().unwrap(),
            "--policy",
            "heuristic",
            "--mqtt-listen",
            "127.0.0.1:0",
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let line = ready_line(&mut child);
    let fields: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(&fields[..2], ["starling-coordinator", "ready"], "{line}");
    let rest = fields[2].strip_prefix("rest=http://127.0.0.1:").unwrap();
    let mqtt = fields[3].strip_prefix("mqtt=mqtt://127.0.0.1:").unwrap();
    assert_ne!(rest.parse::<u16>().unwrap(), 0);
    assert_ne!(mqtt.parse::<u16>().unwrap(), 0);
    let output = Command::new(cli_binary())
        .args([
            "--coordinator",
            &format!("http://127.0.0.1:{rest}"),
            "nodes",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(output.status.success());
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "[]");
    assert!(
        dir.path().join("coordinator.db").exists(),
        "SQLite created under the data dir"
    );
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn startup_errors_say_what_to_change() {
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy_addr = busy.local_addr().unwrap().to_string();
    let error = failing_serve(&["--listen", &busy_addr, "--mqtt-listen", "127.0.0.1:0"]);
    assert!(
        error.contains("address in use") && error.contains("--listen"),
        "{error}"
    );

    let error = failing_serve(&["--listen", "127.0.0.1:0", "--mqtt-listen", &busy_addr]);
    assert!(error.contains("--mqtt-listen"), "{error}");

    let port = common::free_port();
    let error = failing_serve(&[
        "--listen",
        "127.0.0.1:0",
        "--broker",
        &format!("mqtt://127.0.0.1:{port}"),
    ]);
    assert!(
        error.contains("cannot reach the MQTT broker") && error.contains("--broker"),
        "{error}"
    );

    let error = failing_serve(&[
        "--listen",
        "127.0.0.1:0",
        "--mqtt-listen",
        "127.0.0.1:0",
        "--db",
        &format!("postgres://postgres@127.0.0.1:{port}/x"),
    ]);
    assert!(
        error.contains("cannot open database") && error.contains("--db"),
        "{error}"
    );

    let error = failing_serve(&["--listen", "127.0.0.1:0", "--policy", "astrology"]);
    assert!(
        error.contains("heuristic") && error.contains("--policy"),
        "{error}"
    );

    // The environment beats the config file.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("coordinator.toml");
    std::fs::write(&config, "policy = \"heuristic\"\n").unwrap();
    let output = serve(
        dir.path(),
        &[
            "--config",
            config.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "--mqtt-listen",
            "127.0.0.1:0",
        ],
    )
    .env("STARLING_POLICY", "tea-leaves")
    .output()
    .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("tea-leaves"));

    let long_url = format!("http://{}.example", "x".repeat(200));
    let error = failing_serve(&["--listen", "127.0.0.1:0", "--public-url", &long_url]);
    assert!(error.contains("--public-url"), "{error}");

    let error = failing_serve(&["--listen", "nowhere"]);
    assert!(error.contains("--listen"), "{error}");

    // Federation: a site without a key, without credentials, with another
    // site's credentials, a key that is not one, a busy gossip port.
    let error = failing_serve(&["--listen", "127.0.0.1:0", "--site", "plant-a"]);
    assert!(error.contains("--cluster-key"), "{error}");
    let root = tempfile::tempdir().unwrap();
    let init = Command::new(COORDINATOR)
        .args(["federation", "init", "--site", "plant-a", "--data-dir"])
        .arg(root.path())
        .output()
        .unwrap();
    assert!(init.status.success(), "{init:?}");
    let said = String::from_utf8_lossy(&init.stdout);
    assert!(said.contains("federation issue --site NAME"), "{said}");
    let credentials = root.path().join("site-credentials.json");
    let credentials = credentials.to_str().unwrap();
    let again = Command::new(COORDINATOR)
        .args(["federation", "init", "--site", "plant-a", "--data-dir"])
        .arg(root.path())
        .output()
        .unwrap();
    assert!(!again.status.success(), "a second root over the first");
    let error = failing_serve(&[
        "--listen",
        "127.0.0.1:0",
        "--site",
        "plant-a",
        "--cluster-key",
        "c2hvcnQ=",
    ]);
    assert!(
        error.contains("--site-credentials") && error.contains("federation issue --site plant-a"),
        "{error}"
    );
    let error = failing_serve(&[
        "--listen",
        "127.0.0.1:0",
        "--mqtt-listen",
        "127.0.0.1:0",
        "--site",
        "plant-a",
        "--site-credentials",
        credentials,
        "--cluster-key",
        "c2hvcnQ=",
    ]);
    assert!(
        error.contains("32") && error.contains("cluster-key"),
        "{error}"
    );
    let busy_udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let key = Command::new(COORDINATOR)
        .arg("cluster-key")
        .output()
        .unwrap();
    assert!(key.status.success());
    let key = String::from_utf8(key.stdout).unwrap();
    let error = failing_serve(&[
        "--listen",
        "127.0.0.1:0",
        "--mqtt-listen",
        "127.0.0.1:0",
        "--site",
        "plant-a",
        "--site-credentials",
        credentials,
        "--cluster-key",
        key.trim(),
        "--gossip-listen",
        &busy_udp.local_addr().unwrap().to_string(),
    ]);
    assert!(
        error.contains("address in use") && error.contains("--gossip-listen"),
        "{error}"
    );
    let error = failing_serve(&[
        "--listen",
        "127.0.0.1:0",
        "--mqtt-listen",
        "127.0.0.1:0",
        "--site",
        "plant-b",
        "--site-credentials",
        credentials,
        "--cluster-key",
        key.trim(),
        "--gossip-listen",
        "127.0.0.1:0",
    ]);
    assert!(
        error.contains("for site plant-a") && error.contains("--site plant-b"),
        "{error}"
    );

    // Issuing another site's credentials and revoking a site need the root.
    let issued = root.path().join("plant-b.json");
    let issue = Command::new(COORDINATOR)
        .args(["federation", "issue", "--site", "plant-b", "--out"])
        .arg(&issued)
        .arg("--data-dir")
        .arg(root.path())
        .output()
        .unwrap();
    assert!(issue.status.success(), "{issue:?}");
    let bundle = std::fs::read_to_string(&issued).unwrap();
    let root_file = std::fs::read_to_string(root.path().join("federation-root.json")).unwrap();
    let root_file: serde_json::Value = serde_json::from_str(&root_file).unwrap();
    assert!(!bundle.contains(root_file["root_key"].as_str().unwrap()));
    assert!(bundle.contains(root_file["root_public_key"].as_str().unwrap()));
    let revoke = Command::new(COORDINATOR)
        .args(["federation", "revoke", "--site", "plant-b", "--data-dir"])
        .arg(root.path())
        .output()
        .unwrap();
    assert!(revoke.status.success(), "{revoke:?}");
    let revocation: serde_json::Value = serde_json::from_slice(&revoke.stdout).unwrap();
    assert_eq!(revocation["site"], "plant-b");
    let elsewhere = tempfile::tempdir().unwrap();
    let refused = Command::new(COORDINATOR)
        .args(["federation", "revoke", "--site", "plant-b", "--data-dir"])
        .arg(elsewhere.path())
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("federation init"));
}

#[test]
fn sim_compares_federation_on_and_off_and_refuses_settings_it_cannot_use() {
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(COORDINATOR)
        .args([
            "sim",
            "--sites",
            "3",
            "--seed",
            "7",
            "--duration",
            "10",
            "--nodes-per-profile",
            "2",
            "--out",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("federation.json")).unwrap())
            .unwrap();
    let table = std::fs::read_to_string(dir.path().join("federation.md")).unwrap();
    assert!(table.contains("| heuristic | on |"), "{table}");
    assert!(report.is_object(), "{report}");
    for bad in [vec!["--sites", "1"], vec!["--site-load", "0.5"]] {
        let output = Command::new(COORDINATOR)
            .arg("sim")
            .args(&bad)
            .arg("--out")
            .arg(dir.path())
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "{bad:?}");
    }
}

#[test]
fn the_cli_explains_itself_and_reports_an_unreachable_coordinator() {
    let help = Command::new(cli_binary()).arg("--help").output().unwrap();
    assert!(help.status.success());
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.contains("Examples:") && help.contains("starling run"),
        "{help}"
    );

    let usage = Command::new(cli_binary())
        .arg("frobnicate")
        .output()
        .unwrap();
    assert_eq!(usage.status.code(), Some(2));

    let port = common::free_port();
    let output = Command::new(cli_binary())
        .args([
            "--coordinator",
            &format!("http://127.0.0.1:{port}"),
            "tasks",
        ])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(3));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("cannot reach the coordinator"), "{stderr}");
}

async fn cli(rest: &str, args: &[&str], stdin: &[u8]) -> std::process::Output {
    use tokio::io::AsyncWriteExt;
    let mut child = tokio::process::Command::new(cli_binary())
        .arg("--coordinator")
        .arg(rest)
        .args(args)
        .env_remove("STARLING_API_TOKEN")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut pipe = child.stdin.take().unwrap();
    pipe.write_all(stdin).await.unwrap();
    drop(pipe);
    tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .unwrap()
        .unwrap()
}

#[tokio::test]
async fn starling_run_waits_and_prints_the_output() {
    // Built (or found) before anything below is timed.
    cli_binary();
    let dir = tempfile::tempdir().unwrap();
    let running = common::start_coordinator(dir.path(), |_| {}).await;
    let rest = running.rest_url();
    common::stand_in_agent(running.mqtt_url(), "cli-node").await;
    let module = dir.path().join("echo.wasm");
    std::fs::write(&module, common::minimal_wasm()).unwrap();
    std::fs::write(
        dir.path().join("task.toml"),
        "name = \"echo\"\nclass = \"io\"\ndeadline = \"20s\"\n[demand]\ncpu_cores = 1.0\nmemory_mb = 8\n",
    )
    .unwrap();
    common::eventually(Duration::from_secs(10), "the node online", || {
        let rest = rest.clone();
        async move {
            let output = cli(&rest, &["nodes", "--json"], b"").await;
            let nodes: serde_json::Value = serde_json::from_slice(&output.stdout).ok()?;
            (nodes[0]["online"] == true).then_some(())
        }
    })
    .await;

    let output = cli(
        &rest,
        &["run", module.to_str().unwrap(), "--input", "-", "--wait"],
        b"hello",
    )
    .await;
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(output.stdout, b"echo:hello");

    // JSON, and the manifest's class and deadline went with the submission.
    let output = cli(
        &rest,
        &[
            "run",
            module.to_str().unwrap(),
            "--input",
            "-",
            "--wait",
            "--json",
            "--arg",
            "-v",
        ],
        b"again",
    )
    .await;
    assert_eq!(output.status.code(), Some(0));
    let task: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(task["state"], "succeeded");
    assert_eq!(task["node_id"], "cli-node");
    assert_eq!(task["class"], "io");
    assert_eq!(task["args"], serde_json::json!(["-v"]));
    let deadline =
        task["deadline_unix_ms"].as_u64().unwrap() - task["created_ms"].as_u64().unwrap();
    assert_eq!(deadline, 20_000);

    // A failed task: reason on stderr, exit 1; with --json the task on stdout.
    let output = cli(
        &rest,
        &["run", module.to_str().unwrap(), "--input", "-", "--wait"],
        b"fail",
    )
    .await;
    assert_eq!(output.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("trap"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let output = cli(
        &rest,
        &[
            "run",
            module.to_str().unwrap(),
            "--input",
            "-",
            "--wait",
            "--json",
        ],
        b"fail",
    )
    .await;
    assert_eq!(output.status.code(), Some(1));
    let task: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(task["reason"], "trap");

    // Publishing something that is not wasm: exit 2 with the coordinator's reason.
    let notes = dir.path().join("notes.wasm");
    std::fs::write(&notes, "#!/bin/sh\n").unwrap();
    let output = cli(&rest, &["publish", notes.to_str().unwrap()], b"").await;
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("not a WebAssembly module"));

    // Publishing by file, running by digest, listing, showing, cancelling.
    let output = cli(&rest, &["publish", module.to_str().unwrap()], b"").await;
    let digest = String::from_utf8_lossy(&output.stdout).trim().to_string();
    assert_eq!(digest.len(), 64);
    let output = cli(&rest, &["run", &digest, "--deadline", "5s"], b"").await;
    assert_eq!(output.status.code(), Some(0));
    let id = String::from_utf8_lossy(&output.stdout).trim().to_string();
    let output = cli(&rest, &["tasks", "--json"], b"").await;
    let tasks: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert!(
        tasks
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["id"] == id.as_str()),
        "{tasks}"
    );
    let output = cli(&rest, &["task", &id], b"").await;
    assert!(String::from_utf8_lossy(&output.stdout).contains(&id));
    let output = cli(&rest, &["task", "no-such-task"], b"").await;
    assert_eq!(output.status.code(), Some(2));
    running.shutdown().await;
}

#[test]
fn train_writes_a_model_that_serve_runs_and_bad_models_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("models/ddqn.json");
    let output = Command::new(COORDINATOR)
        .args([
            "train",
            "--policy",
            "ddqn",
            "--load",
            "medium",
            "--nodes-per-profile",
            "1",
            "--episodes",
            "3",
            "--episode-seconds",
            "5",
            "--updates",
            "5",
            "--json",
            "--out",
        ])
        .arg(&model)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let summary: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(summary["training"]["episodes"], 3, "{summary}");
    assert!(summary["training"]["command"]
        .as_str()
        .unwrap()
        .starts_with("starling-coordinator train --policy ddqn --load medium"));
    let curve = std::fs::read_to_string(dir.path().join("models/ddqn.curve.csv")).unwrap();
    assert_eq!(
        curve.lines().count(),
        4,
        "a header and one line per episode"
    );
    let text = std::fs::read_to_string(&model).unwrap();
    assert!(text.contains("\"layout\": \"starling-placement-features/1\""));

    // serve runs it.
    let mut child = serve(
        dir.path(),
        &[
            "--listen",
            "127.0.0.1:0",
            "--mqtt-listen",
            "127.0.0.1:0",
            "--policy",
            "ddqn",
            "--model",
            model.to_str().unwrap(),
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let line = ready_line(&mut child);
    assert!(line.starts_with("starling-coordinator ready"), "{line}");
    child.kill().unwrap();
    child.wait().unwrap();

    let plain = ["--listen", "127.0.0.1:0", "--mqtt-listen", "127.0.0.1:0"];
    let with = |extra: &[&str]| -> String {
        let mut args = plain.to_vec();
        args.extend_from_slice(extra);
        failing_serve(&args)
    };
    // Another policy's model.
    let error = with(&["--policy", "hirl", "--model", model.to_str().unwrap()]);
    assert!(
        error.contains("drives policy ddqn") && error.contains("--policy is hirl"),
        "{error}"
    );
    // HiRL's placement alone runs on a HiRL model, so a ddqn one is refused too.
    let error = with(&[
        "--policy",
        "hirl-full-power",
        "--model",
        model.to_str().unwrap(),
    ]);
    assert!(
        error.contains("drives policy ddqn") && error.contains("--policy is hirl-full-power"),
        "{error}"
    );
    // Another feature layout: named, with what to do about it.
    let renamed = dir.path().join("renamed.json");
    std::fs::write(&renamed, text.replace("\"node.fit\"", "\"node.fitness\"")).unwrap();
    let error = with(&["--policy", "ddqn", "--model", renamed.to_str().unwrap()]);
    assert!(
        error.contains("renamed.json")
            && error.contains("feature 16 is \"node.fitness\" where this build has \"node.fit\"")
            && error.contains("retrain"),
        "{error}"
    );
    // Not a model; no such file.
    let garbage = dir.path().join("garbage.json");
    std::fs::write(&garbage, "{\"weights\": [1, 2, 3]}").unwrap();
    let error = with(&["--policy", "ddqn", "--model", garbage.to_str().unwrap()]);
    assert!(error.contains("not a Starling model file"), "{error}");
    let error = with(&["--policy", "ddqn", "--model", "/nonexistent/model.json"]);
    assert!(error.contains("cannot read model file"), "{error}");

    // train refuses what it cannot train: a usage error (exit status 2) with a reason.
    let output = Command::new(COORDINATOR)
        .args(["train", "--policy", "heuristic", "--out"])
        .arg(dir.path().join("x.json"))
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("expected hirl or ddqn"));
    let output = Command::new(COORDINATOR)
        .args(["train", "--policy", "hirl", "--load", "extreme", "--out"])
        .arg(dir.path().join("x.json"))
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--load \"extreme\""));
    for (flag, value, says) in [
        (
            "--latency-margin",
            "1",
            "--latency-margin 1: expected a share",
        ),
        ("--latency-margin", "NaN", "--latency-margin NaN"),
        ("--power-action", "fastest", "--power-action \"fastest\""),
    ] {
        let output = Command::new(COORDINATOR)
            .args(["train", "--policy", "hirl", flag, value, "--out"])
            .arg(dir.path().join("x.json"))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{flag} {value}: {stderr}");
        assert!(stderr.contains(says), "{flag} {value}: {stderr}");
        assert!(!dir.path().join("x.json").exists(), "nothing written");
    }
}
