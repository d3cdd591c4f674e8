//! Power levels applied: the runner writes the chosen level's frequency
//! ceiling into cpufreq (a sysfs-shaped directory here), the highest level
//! among running tasks wins, the events carry what was in force, and the
//! ceiling found at start is restored once no task runs.

use crate::support;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::support::HttpServer;
use starling_agent::artifact::{sha256, ArtifactStore};
use starling_agent::power::{Cpufreq, PowerLevels};
use starling_agent::runner::Runner;
use starling_agent::wasm::WasmExecutor;
use starling_proto::{Assignment, NodeId, PowerApplied, TaskEvent, TaskState};
use tokio::sync::mpsc;

/// One policy from 500 MHz to 2 GHz, its ceiling at 1.8 GHz (an operator's).
fn sysfs() -> (tempfile::TempDir, PathBuf) {
    let root = tempfile::tempdir().unwrap();
    let policy = root.path().join("devices/system/cpu/cpufreq/policy0");
    std::fs::create_dir_all(&policy).unwrap();
    for (file, khz) in [
        ("cpuinfo_min_freq", 500_000),
        ("cpuinfo_max_freq", 2_000_000),
        ("scaling_max_freq", 1_800_000),
    ] {
        std::fs::write(policy.join(file), format!("{khz}\n")).unwrap();
    }
    let ceiling = policy.join("scaling_max_freq");
    (root, ceiling)
}

fn ceiling(path: &Path) -> u32 {
    std::fs::read_to_string(path)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

fn spin(task: &str, url: &str, digest: starling_proto::Digest, level: u8) -> Assignment {
    let mut assignment = support::spin_assignment("power-node", task, url, digest);
    assignment.power_level = level;
    assignment
}

async fn next(events: &mut mpsc::UnboundedReceiver<TaskEvent>, task: &str) -> TaskEvent {
    let event = tokio::time::timeout(Duration::from_secs(30), events.recv())
        .await
        .expect("an event within 30 s")
        .unwrap();
    assert_eq!(event.task_id.as_str(), task, "{event:?}");
    event
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chosen_level_is_written_the_highest_wins_and_the_ceiling_is_restored() {
    let (root, ceiling_file) = sysfs();
    let http = HttpServer::start().await;
    let module = wat::parse_str(support::LOOP_WAT).unwrap();
    let digest = sha256(&module);
    let url = http.serve("/spin", module);
    let dir = tempfile::tempdir().unwrap();
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let cpufreq = Cpufreq::open(root.path()).unwrap().unwrap();
    let runner = Arc::new(
        Runner::new(
            NodeId::new("power-node").unwrap(),
            Arc::new(WasmExecutor::new().unwrap()),
            None,
            ArtifactStore::open(dir.path(), 1 << 20).unwrap(),
            2,
            2,
            events_tx,
        )
        .with_power(Arc::new(PowerLevels::new(
            Some(cpufreq),
            vec![0.25, 0.5, 1.0],
        ))),
    );

    // A powersave task: its ceiling, a quarter of 2 GHz, is written.
    let low_cancel = Arc::new(AtomicBool::new(false));
    tokio::spawn(
        Arc::clone(&runner).run_attempt(spin("low", &url, digest, 0), Arc::clone(&low_cancel)),
    );
    let running = next(&mut events, "low").await;
    assert_eq!(running.state, TaskState::Running);
    let low_applied = PowerApplied {
        requested: 0,
        in_force: 0,
        max_frequency_khz: Some(500_000),
    };
    assert_eq!(running.power, Some(low_applied));
    assert_eq!(ceiling(&ceiling_file), 500_000);
    assert_eq!(runner.power_level(), 0);

    // A balanced task beside it: the higher level wins, for both.
    let mid_cancel = Arc::new(AtomicBool::new(false));
    tokio::spawn(
        Arc::clone(&runner).run_attempt(spin("mid", &url, digest, 1), Arc::clone(&mid_cancel)),
    );
    let running = next(&mut events, "mid").await;
    assert_eq!(
        running.power,
        Some(PowerApplied {
            requested: 1,
            in_force: 1,
            max_frequency_khz: Some(1_000_000)
        })
    );
    assert_eq!(ceiling(&ceiling_file), 1_000_000);

    // The mid one ends: back to the low one's ceiling; its last event says
    // what it ran under.
    mid_cancel.store(true, Ordering::SeqCst);
    let ended = next(&mut events, "mid").await;
    assert_eq!(ended.state, TaskState::Cancelled);
    assert_eq!(ended.power.map(|p| p.in_force), Some(1));
    assert_eq!(ceiling(&ceiling_file), 500_000);

    // The low one ends: it ran while level 1 was in force, and says so; the
    // operator's ceiling comes back.
    low_cancel.store(true, Ordering::SeqCst);
    let ended = next(&mut events, "low").await;
    assert_eq!(
        ended.power,
        Some(PowerApplied {
            requested: 0,
            in_force: 1,
            max_frequency_khz: Some(1_000_000)
        })
    );
    assert_eq!(
        ceiling(&ceiling_file),
        1_800_000,
        "restored, not set to the max"
    );
    assert_eq!(runner.power_level(), 2, "the node's own level when idle");
}
