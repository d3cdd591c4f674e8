//! Wasm grants: a module sees the real clock and real random bytes only when
//! its assignment grants them and the node's policy allows them; otherwise a
//! fixed clock and zeros, and a grant the policy forbids is refused before
//! the module runs.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use starling_agent::wasm::{ExecError, RunRequest, WasmExecutor};
use starling_proto::{ExecLimits, FailureReason, Grants};

/// Writes 32 bytes to stdout: the realtime clock (u64 LE, ns), the monotonic
/// clock (u64 LE, ns), then 16 bytes from random_get. A failing call exits
/// with its errno, so a refused call cannot pass for a fixed value.
const PROBE: &str = r#"
(module
  (import "wasi_snapshot_preview1" "clock_time_get"
    (func $clock (param i32 i64 i32) (result i32)))
  (import "wasi_snapshot_preview1" "random_get"
    (func $random (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write"
    (func $write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 1)
  (func $check (param $errno i32)
    (if (local.get $errno) (then (call $exit (i32.add (i32.const 100) (local.get $errno))))))
  (func (export "_start")
    (call $check (call $clock (i32.const 0) (i64.const 1) (i32.const 0)))
    (call $check (call $clock (i32.const 1) (i64.const 1) (i32.const 8)))
    (call $check (call $random (i32.const 16) (i32.const 16)))
    ;; iovec at 64: buf=0 len=32
    (i32.store (i32.const 64) (i32.const 0))
    (i32.store (i32.const 68) (i32.const 32))
    (call $check (call $write (i32.const 1) (i32.const 64) (i32.const 1) (i32.const 72)))))
"#;

struct Seen {
    wall_ns: u64,
    monotonic_ns: u64,
    random: Vec<u8>,
}

fn run(executor: &WasmExecutor, grants: Grants) -> Result<Seen, ExecError> {
    let module = executor.compile(&wat::parse_str(PROBE).unwrap()).unwrap();
    let outcome = executor.run_request(
        &module,
        RunRequest {
            program_name: "probe",
            input: b"",
            args: &[],
            limits: &ExecLimits::default(),
            cancel: None,
            grants,
        },
    )?;
    let out = outcome.output;
    assert_eq!(out.len(), 32, "{out:?}");
    Ok(Seen {
        wall_ns: u64::from_le_bytes(out[0..8].try_into().unwrap()),
        monotonic_ns: u64::from_le_bytes(out[8..16].try_into().unwrap()),
        random: out[16..32].to_vec(),
    })
}

const NONE: Grants = Grants {
    clock: false,
    random: false,
};
const ALL: Grants = Grants {
    clock: true,
    random: true,
};

#[test]
fn without_grants_the_clock_is_fixed_and_random_bytes_are_zeros() {
    // Even a node that allows everything gives a task only what it asked for.
    let executor = WasmExecutor::with_policy(ALL).unwrap();
    let seen = run(&executor, NONE).unwrap();
    assert_eq!(seen.wall_ns, 0);
    assert_eq!(seen.monotonic_ns, 0);
    assert_eq!(seen.random, vec![0; 16]);
    // Twice the same: the values are fixed, not merely small.
    let again = run(&executor, NONE).unwrap();
    assert_eq!((again.wall_ns, again.monotonic_ns), (0, 0));
    assert_eq!(again.random, vec![0; 16]);
}

#[test]
fn granted_and_allowed_the_module_sees_the_real_clock_and_randomness() {
    let executor = WasmExecutor::with_policy(ALL).unwrap();
    let before = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let seen = run(&executor, ALL).unwrap();
    let after = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let wall = Duration::from_nanos(seen.wall_ns);
    assert!(
        wall + Duration::from_secs(1) >= before && wall <= after + Duration::from_secs(1),
        "wall clock {wall:?} not between {before:?} and {after:?}"
    );
    assert!(seen.monotonic_ns > 0);
    // 16 zero bytes from a real generator: probability 2^-128.
    assert_ne!(seen.random, vec![0; 16]);
    let again = run(&executor, ALL).unwrap();
    assert_ne!(again.random, seen.random);
}

#[test]
fn one_grant_does_not_bring_the_other() {
    let executor = WasmExecutor::with_policy(ALL).unwrap();
    let clock_only = run(
        &executor,
        Grants {
            clock: true,
            random: false,
        },
    )
    .unwrap();
    assert!(clock_only.wall_ns > 0);
    assert_eq!(clock_only.random, vec![0; 16]);
    let random_only = run(
        &executor,
        Grants {
            clock: false,
            random: true,
        },
    )
    .unwrap();
    assert_eq!((random_only.wall_ns, random_only.monotonic_ns), (0, 0));
    assert_ne!(random_only.random, vec![0; 16]);
}

#[test]
fn a_grant_the_policy_forbids_is_refused_before_running() {
    // The default policy allows nothing.
    let executor = WasmExecutor::new().unwrap();
    let error = run(
        &executor,
        Grants {
            clock: true,
            random: false,
        },
    )
    .err()
    .expect("the clock grant must be refused");
    assert!(
        matches!(error, ExecError::GrantRefused { grant: "clock" }),
        "{error}"
    );
    assert!(error.to_string().contains("--allow-grant clock"), "{error}");
    assert_eq!(error.failure_reason(), FailureReason::PolicyRefused);

    let clock_only = WasmExecutor::with_policy(Grants {
        clock: true,
        random: false,
    })
    .unwrap();
    let error = run(&clock_only, ALL)
        .err()
        .expect("the random grant must be refused");
    assert!(
        matches!(error, ExecError::GrantRefused { grant: "random" }),
        "{error}"
    );
    assert!(clock_only.check_grants(&ALL).is_err());
    assert!(clock_only
        .check_grants(&Grants {
            clock: true,
            random: false
        })
        .is_ok());
    // Asking for nothing is always allowed.
    assert!(executor.check_grants(&NONE).is_ok());
    assert_eq!(run(&executor, NONE).unwrap().wall_ns, 0);
}

// ------------------------------------------------------------- end to end

/// Prints `1` when the wall clock it reads is not the Unix epoch, else `0`.
const CLOCK_IS_REAL: &str = r#"
(module
  (import "wasi_snapshot_preview1" "clock_time_get"
    (func $clock (param i32 i64 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write"
    (func $write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "_start")
    (drop (call $clock (i32.const 0) (i64.const 1) (i32.const 0)))
    (i32.store8 (i32.const 100)
      (select (i32.const 49) (i32.const 48) (i64.ne (i64.load (i32.const 0)) (i64.const 0))))
    (i32.store (i32.const 64) (i32.const 100))
    (i32.store (i32.const 68) (i32.const 1))
    (drop (call $write (i32.const 1) (i32.const 64) (i32.const 1) (i32.const 72)))))
"#;

/// Runs the clock module through `starling run` with a manifest asking for
/// the clock, on a coordinator whose one agent has `agent_flags`.
fn run_with_clock_grant(agent_flags: &[&str]) -> serde_json::Value {
    use starling_tests::{wasm_file, Agent, Coordinator, Store};
    let coordinator = Coordinator::start(None, Store::Sqlite, &[]);
    let _agent = Agent::start_with(
        &coordinator,
        &coordinator.mqtt,
        "grants-node",
        "",
        None,
        agent_flags,
    );
    coordinator.wait_for_nodes(1, Duration::from_secs(30));
    let dir = tempfile::tempdir().unwrap();
    let module = wasm_file(dir.path(), "clock", CLOCK_IS_REAL);
    std::fs::write(
        dir.path().join("clock.toml"),
        "name = \"clock\"\n[grants]\nclock = true\n",
    )
    .unwrap();
    let out = coordinator.cli(&["run", module.to_str().unwrap(), "--wait", "--json"], None);
    let task: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
        panic!(
            "starling run: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            coordinator.process.log()
        )
    });
    assert_eq!(task["limits"]["grants"]["clock"], true, "{task:#}");
    task
}

#[test]
fn a_manifest_grant_reaches_the_module_only_where_the_node_allows_it() {
    let allowed = run_with_clock_grant(&["--allow-grant", "clock"]);
    assert_eq!(allowed["state"], "succeeded", "{allowed:#}");
    assert_eq!(allowed["output_text"], "1", "{allowed:#}");

    let refused = run_with_clock_grant(&[]);
    assert_eq!(refused["state"], "failed", "{refused:#}");
    assert_eq!(refused["reason"], "policy_refused", "{refused:#}");
    let message = refused["message"].as_str().unwrap_or_default();
    assert!(message.contains("--allow-grant clock"), "{refused:#}");
    // Refused before it ran: the attempt never reported running.
    let events = refused["events"].as_array().cloned().unwrap_or_default();
    assert!(
        events.iter().all(|event| event["state"] != "running"),
        "{refused:#}"
    );
}
