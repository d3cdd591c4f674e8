//! Issue 15: a node's caps on task limits (item 7), and an agent that shuts
//! down while a module sleeps in a host call (item 10).

use crate::support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::support::HttpServer;
use starling_agent::artifact::{sha256, ArtifactStore};
use starling_agent::caps::TaskCaps;
use starling_agent::runner::Runner;
use starling_agent::wasm::WasmExecutor;
use starling_proto::{ExecLimits, FailureReason, NodeId, TaskEvent, TaskState};
use tokio::sync::mpsc;

/// Grows memory by 64 pages (4 MiB) at a time until growth fails.
const GROW_FOREVER_WAT: &str = r#"
(module
  (memory (export "memory") 1)
  (func (export "_start")
    (loop $l
      (br_if $l (i32.ne (memory.grow (i32.const 64)) (i32.const -1))))))
"#;

/// Sleeps 30 s in `poll_oneoff` on one relative monotonic-clock subscription.
const SLEEP_WAT: &str = r#"
(module
  (import "wasi_snapshot_preview1" "poll_oneoff" (func $poll (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "_start")
    (i64.store (i32.const 0) (i64.const 1))            ;; userdata
    (i32.store8 (i32.const 8) (i32.const 0))           ;; tag: clock
    (i32.store (i32.const 16) (i32.const 1))           ;; clock id: monotonic
    (i64.store (i32.const 24) (i64.const 30000000000)) ;; timeout: 30 s
    (i64.store (i32.const 32) (i64.const 0))           ;; precision
    (i32.store16 (i32.const 40) (i32.const 0))         ;; flags: relative
    (drop (call $poll (i32.const 0) (i32.const 100) (i32.const 1) (i32.const 200)))))
"#;

fn runner(
    dir: &std::path::Path,
    caps: TaskCaps,
) -> (Arc<Runner>, mpsc::UnboundedReceiver<TaskEvent>) {
    let (events_tx, events) = mpsc::unbounded_channel();
    let runner = Runner::new(
        NodeId::new("caps-node").unwrap(),
        Arc::new(WasmExecutor::new().unwrap()),
        None,
        ArtifactStore::open(dir, 1 << 20).unwrap(),
        1,
        0,
        events_tx,
    )
    .with_task_caps(caps);
    (Arc::new(runner), events)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_assignment_over_the_caps_is_refused_and_one_within_them_is_held_to_its_limit() {
    let http = HttpServer::start().await;
    let module = wat::parse_str(GROW_FOREVER_WAT).unwrap();
    let digest = sha256(&module);
    let url = http.serve("/grow", module);
    let dir = tempfile::tempdir().unwrap();
    let caps = TaskCaps {
        memory_bytes: 16 << 20,
        wall_ms: 30_000,
        output_bytes: 1 << 20,
    };
    let (runner, mut events) = runner(dir.path(), caps);

    // The finding: a task with an unbounded memory limit filled 1 GiB.
    let unbounded = support::unsigned_assignment(
        "caps-node",
        "unbounded",
        digest,
        &url,
        b"",
        ExecLimits {
            memory_bytes: u64::MAX,
            ..ExecLimits::default()
        },
    );
    Arc::clone(&runner)
        .run_attempt(unbounded, Arc::new(AtomicBool::new(false)))
        .await;
    let refused = events.recv().await.unwrap();
    assert_eq!(refused.state, TaskState::Failed, "{refused:?}");
    assert_eq!(refused.reason, Some(FailureReason::AgentBusy));
    let message = refused.message.as_deref().unwrap_or_default();
    assert!(
        message.contains("memory") && message.contains("--max-task-memory"),
        "{message}"
    );
    assert_eq!(http.hits(), 0, "a refused attempt fetched its module");
    assert_eq!(runner.counters().executions(), 0);

    // Within the caps: runs, and its own (smaller) limit stops it.
    let bounded = support::unsigned_assignment(
        "caps-node",
        "bounded",
        digest,
        &url,
        b"",
        ExecLimits {
            memory_bytes: 8 << 20,
            ..ExecLimits::default()
        },
    );
    Arc::clone(&runner)
        .run_attempt(bounded, Arc::new(AtomicBool::new(false)))
        .await;
    assert_eq!(events.recv().await.unwrap().state, TaskState::Running);
    let stopped = events.recv().await.unwrap();
    assert_eq!(stopped.state, TaskState::Failed, "{stopped:?}");
    assert_eq!(stopped.reason, Some(FailureReason::MemoryLimit));
}

/// Counts panics whose message is Tokio's "being shutdown" one, whichever
/// thread and test they come from, and passes every panic on.
fn count_shutdown_panics() -> Arc<AtomicUsize> {
    let count = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&count);
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let text = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or_default();
        if text.contains("it is being shutdown") {
            seen.fetch_add(1, Ordering::SeqCst);
        }
        previous(info);
    }));
    count
}

/// Issue 15, item 10: SIGTERM right after a task ended panicked the agent
/// with "A Tokio 1.x context was found, but it is being shutdown". The task
/// had ended on the runner's outer timer while its module still slept in
/// `poll_oneoff`, on a blocking thread of the agent's runtime; shutting the
/// runtime down woke that sleep against a stopped timer.
#[test]
fn shutting_down_after_an_attempt_timed_out_in_a_host_call_does_not_panic() {
    let panics = count_shutdown_panics();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    runtime.block_on(async {
        let http = HttpServer::start().await;
        let module = wat::parse_str(SLEEP_WAT).unwrap();
        let digest = sha256(&module);
        let url = http.serve("/sleep", module);
        let (runner, mut events) = runner(dir.path(), TaskCaps::UNBOUNDED);
        let task = support::unsigned_assignment(
            "caps-node",
            "asleep",
            digest,
            &url,
            b"",
            ExecLimits {
                wall_ms: 200,
                ..ExecLimits::default()
            },
        );
        runner
            .run_attempt(task, Arc::new(AtomicBool::new(false)))
            .await;
        assert_eq!(events.recv().await.unwrap().state, TaskState::Running);
        let ended = events.recv().await.unwrap();
        assert_eq!(ended.reason, Some(FailureReason::Timeout), "{ended:?}");
    });
    // The agent's main returns and drops its runtime, as on SIGTERM.
    let started = std::time::Instant::now();
    drop(runtime);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the runtime waited {:?} for the sleeping module",
        started.elapsed()
    );
    // A panic on another thread would show up shortly after the drop.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        panics.load(Ordering::SeqCst),
        0,
        "a thread panicked on the runtime's shutdown"
    );
}
