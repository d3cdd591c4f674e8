//! The runner bounds concurrent executions and counts the rest as queued.

use crate::support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::support::HttpServer;
use starling_agent::artifact::{sha256, ArtifactStore};
use starling_agent::runner::Runner;
use starling_agent::telemetry::TaskCounts;
use starling_agent::wasm::WasmExecutor;
use starling_proto::{Assignment, FailureReason, NodeId, TaskState};
use tokio::sync::mpsc;

fn spin_assignment(task: &str, url: &str, digest: starling_proto::Digest) -> Assignment {
    support::spin_assignment("queue-node", task, url, digest)
}

async fn wait_for_counts(runner: &Runner, expected: TaskCounts) {
    let counters = runner.counters();
    for _ in 0..400 {
        if counters.snapshot() == expected {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!(
        "counts stayed at {:?}, expected {expected:?}",
        counters.snapshot()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_slot_runs_one_task_and_queues_the_next() {
    let http = HttpServer::start().await;
    let spin = wat::parse_str(support::LOOP_WAT).unwrap();
    let digest = sha256(&spin);
    let url = http.serve("/spin", spin);
    let dir = tempfile::tempdir().unwrap();
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let runner = Arc::new(Runner::new(
        NodeId::new("queue-node").unwrap(),
        Arc::new(WasmExecutor::new().unwrap()),
        None,
        ArtifactStore::open(dir.path(), 1 << 20).unwrap(),
        1,
        0,
        events_tx,
    ));

    let first_cancel = Arc::new(AtomicBool::new(false));
    let second_cancel = Arc::new(AtomicBool::new(false));
    tokio::spawn(Arc::clone(&runner).run_attempt(
        spin_assignment("a", &url, digest),
        Arc::clone(&first_cancel),
    ));
    tokio::spawn(Arc::clone(&runner).run_attempt(
        spin_assignment("b", &url, digest),
        Arc::clone(&second_cancel),
    ));
    wait_for_counts(
        &runner,
        TaskCounts {
            running: 1,
            queued: 1,
        },
    )
    .await;
    let running = events.recv().await.unwrap();
    assert_eq!(running.state, TaskState::Running);
    assert_eq!(runner.counters().executions(), 1);

    // A third attempt queues behind them; cancelling it answers at once.
    let third_cancel = Arc::new(AtomicBool::new(false));
    tokio::spawn(Arc::clone(&runner).run_attempt(
        spin_assignment("c", &url, digest),
        Arc::clone(&third_cancel),
    ));
    wait_for_counts(
        &runner,
        TaskCounts {
            running: 1,
            queued: 2,
        },
    )
    .await;
    third_cancel.store(true, Ordering::SeqCst);
    let cancelled = events.recv().await.unwrap();
    assert_eq!(
        (cancelled.task_id.as_str(), cancelled.state),
        ("c", TaskState::Cancelled)
    );
    wait_for_counts(
        &runner,
        TaskCounts {
            running: 1,
            queued: 1,
        },
    )
    .await;

    // Cancelling the running one frees the slot for the queued one.
    let (first, second) = if running.task_id.as_str() == "a" {
        (first_cancel, second_cancel)
    } else {
        (second_cancel, first_cancel)
    };
    first.store(true, Ordering::SeqCst);
    let cancelled = events.recv().await.unwrap();
    assert_eq!(cancelled.state, TaskState::Cancelled);
    assert_eq!(cancelled.task_id, running.task_id);
    let next = events.recv().await.unwrap();
    assert_eq!(next.state, TaskState::Running);
    assert_ne!(next.task_id, running.task_id);
    wait_for_counts(
        &runner,
        TaskCounts {
            running: 1,
            queued: 0,
        },
    )
    .await;

    second.store(true, Ordering::SeqCst);
    assert_eq!(events.recv().await.unwrap().state, TaskState::Cancelled);
    wait_for_counts(&runner, TaskCounts::default()).await;
    assert_eq!(runner.counters().executions(), 2);
}

#[tokio::test]
async fn bytes_that_are_not_wasm_fail_as_invalid_module() {
    let http = HttpServer::start().await;
    let script = b"#!/bin/sh\necho not a module\n".to_vec();
    let digest = sha256(&script);
    let url = http.serve("/script", script);
    let dir = tempfile::tempdir().unwrap();
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let runner = Arc::new(Runner::new(
        NodeId::new("n").unwrap(),
        Arc::new(WasmExecutor::new().unwrap()),
        None,
        ArtifactStore::open(dir.path(), 1 << 20).unwrap(),
        1,
        0,
        events_tx,
    ));
    runner
        .run_attempt(
            spin_assignment("s", &url, digest),
            Arc::new(AtomicBool::new(false)),
        )
        .await;
    let event = events.recv().await.unwrap();
    assert_eq!(event.state, TaskState::Failed);
    assert_eq!(event.reason, Some(FailureReason::InvalidModule));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_module_asleep_in_a_host_call_still_times_out() {
    // poll_oneoff on one 30-second relative clock subscription.
    let sleeper = r#"
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
    let http = HttpServer::start().await;
    let bytes = wat::parse_str(sleeper).unwrap();
    let digest = sha256(&bytes);
    let url = http.serve("/sleep", bytes);
    let dir = tempfile::tempdir().unwrap();
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let runner = Arc::new(Runner::new(
        NodeId::new("n").unwrap(),
        Arc::new(WasmExecutor::new().unwrap()),
        None,
        ArtifactStore::open(dir.path(), 1 << 20).unwrap(),
        1,
        0,
        events_tx,
    ));
    let mut task = spin_assignment("sleepy", &url, digest);
    task.limits.wall_ms = 300;
    let started = std::time::Instant::now();
    runner
        .clone()
        .run_attempt(task, Arc::new(AtomicBool::new(false)))
        .await;
    assert_eq!(events.recv().await.unwrap().state, TaskState::Running);
    let event = events.recv().await.unwrap();
    assert_eq!(event.state, TaskState::Failed);
    assert_eq!(event.reason, Some(FailureReason::Timeout));
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(runner.counters().snapshot(), TaskCounts::default());
}
