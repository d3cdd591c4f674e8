//! Two coordinator replicas of one site on one PostgreSQL and one broker,
//! and a swarm of 500 devices running 5,000 tasks. A third of the way in
//! the leader is paused past its lease (SIGSTOP) and resumed: the other
//! replica has taken over, and the paused one must find itself deposed. Two
//! thirds in, the new leader is killed (SIGKILL): the survivor takes over.
//! Then a checker reads the whole history from the database: every task
//! completed exactly once, every attempt placed under a term that existed,
//! and no task placed again under an older term than its previous attempt
//! (what a deposed leader's placement would look like).

use std::process::Command;
use std::time::{Duration, Instant};

use starling_tests::{modules, wasm_file, Coordinator, Mosquitto, PostgresDb, Store, Swarm};

const DEVICES: usize = 500;
const TASKS: usize = 5_000;
const BATCH: usize = 1_000;

/// `GET /api/v1/health` of one replica, or `None` while it does not answer.
fn health(coordinator: &Coordinator) -> Option<serde_json::Value> {
    let (status, text) = coordinator.http("GET", "/api/v1/health", None);
    (status == 200).then(|| serde_json::from_str(&text).unwrap())
}

fn leads(coordinator: &Coordinator) -> bool {
    health(coordinator).is_some_and(|h| h["leader"] == true)
}

/// Waits for `done` (see [`starling_tests::wait_until`]).
fn wait(timeout: Duration, what: &str, done: impl FnMut() -> bool) -> Duration {
    starling_tests::wait_until(timeout, what, done)
}

fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill {signal} {pid}");
}

fn succeeded(db: &PostgresDb) -> usize {
    db.query("SELECT count(*) FROM tasks WHERE state = 'succeeded'")
        .parse()
        .unwrap()
}

#[test]
fn replicas_hand_the_site_over_and_every_task_completes_exactly_once() {
    // Pauses, kills and deadlines on two cores: nothing else runs beside it.
    let _turn = crate::alone();
    let db = PostgresDb::create();
    let broker = Mosquitto::start();
    let flags = [
        "--mqtt-allow-anonymous",
        "--leader-lease",
        "1500ms",
        "--resend-interval",
        "2s",
    ];
    let mut replicas = [
        Coordinator::start(Some(&broker.url), Store::Postgres(db.url.clone()), &flags),
        Coordinator::start(Some(&broker.url), Store::Postgres(db.url.clone()), &flags),
    ];
    wait(Duration::from_secs(10), "a leader", || {
        replicas.iter().any(leads)
    });
    assert!(
        !(leads(&replicas[0]) && leads(&replicas[1])),
        "two leaders at once"
    );

    let swarm = Swarm::start(
        &replicas[0],
        &broker.url,
        DEVICES,
        "rep",
        &["--execute", "modelled", "--modelled-work", "20ms"],
    );
    for replica in &replicas {
        let mut last = None;
        let online = || {
            last = health(replica);
            last.as_ref()
                .is_some_and(|h| h["nodes_online"].as_u64() == Some(DEVICES as u64))
        };
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            wait(
                Duration::from_secs(120),
                "every device online at both replicas",
                online,
            )
        }))
        .is_err()
        {
            panic!("not every device online: {last:?}");
        }
    }

    let dir = tempfile::tempdir().unwrap();
    let module = wasm_file(dir.path(), "spin", &modules::spin(10));
    let out = replicas[1].cli(&["publish", module.to_str().unwrap()], None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let digest = String::from_utf8_lossy(&out.stdout).trim().to_string();
    // Submitted through both replicas: any of them takes work.
    for batch in 0..TASKS / BATCH {
        let tasks: Vec<serde_json::Value> = (0..BATCH)
            .map(|_| serde_json::json!({"artifact": digest}))
            .collect();
        let body = serde_json::to_vec(&serde_json::json!({ "tasks": tasks })).unwrap();
        let (status, text) = replicas[batch % 2].http(
            "POST",
            "/api/v1/tasks:batch",
            Some(("application/json", body)),
        );
        assert_eq!(status, 201, "{text}");
    }

    let submitted = Instant::now();
    // A third in: pause the leader past its lease and past the 3 s after
    // which PostgreSQL ends a transaction it left open.
    wait(
        Duration::from_secs(120),
        "a third of the tasks done",
        || succeeded(&db) >= TASKS / 3,
    );
    eprintln!("a third done {:?} after submitting", submitted.elapsed());
    let first = usize::from(!leads(&replicas[0]));
    let second = 1 - first;
    signal(replicas[first].process.pid(), "-STOP");
    let took_over = wait(Duration::from_secs(10), "the other replica leads", || {
        leads(&replicas[second])
    });
    std::thread::sleep(Duration::from_secs(4));
    signal(replicas[first].process.pid(), "-CONT");
    wait(
        Duration::from_secs(10),
        "the paused replica knows it was deposed",
        || health(&replicas[first]).is_some_and(|h| h["leader"] == false),
    );
    assert!(leads(&replicas[second]), "the new leader kept the lease");
    eprintln!("after SIGSTOP of the leader: the other led in {took_over:?}");

    // Two thirds in: kill the new leader.
    wait(
        Duration::from_secs(120),
        "two thirds of the tasks done",
        || succeeded(&db) >= 2 * TASKS / 3,
    );
    eprintln!("two thirds done {:?} after submitting", submitted.elapsed());
    let pending_at_kill: u64 = db
        .query("SELECT count(*) FROM tasks WHERE state = 'pending'")
        .parse()
        .unwrap();
    replicas[second].process.kill();
    let killed = Instant::now();
    let took_over = wait(Duration::from_secs(10), "the survivor leads", || {
        leads(&replicas[first])
    });
    eprintln!("after SIGKILL of the leader: the survivor led in {took_over:?}");
    assert!(
        took_over < Duration::from_secs(3),
        "failover took {took_over:?} (lease 1.5 s)"
    );
    // It places new work (or finishes what was left) under its new term.
    let term = health(&replicas[first]).unwrap()["leader_term"]
        .as_u64()
        .unwrap();
    let ended = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait(Duration::from_secs(90), "every task ends", || {
            db.query(
                "SELECT count(*) FROM tasks WHERE state NOT IN ('succeeded', 'failed', 'cancelled')",
            ) == "0"
        })
    }));
    if ended.is_err() {
        panic!(
            "not every task ended: {} (by state), leader {:?}\nunfinished: {}\ntheir attempts: {}\ntheir events: {}\noutbox: {}",
            db.query("SELECT state || '=' || count(*) FROM tasks GROUP BY state"),
            health(&replicas[first]),
            db.query("SELECT id || ' ' || state || ' ' || attempt || ' ' || coalesce(node_id, '-') FROM tasks WHERE state NOT IN ('succeeded', 'failed', 'cancelled')"),
            db.query("SELECT a.task_id || ' ' || a.attempt || ' ' || a.node_id || ' ' || a.state || ' ' || a.assigned_ms || ' e' || coalesce(a.epoch, 0) FROM attempts a JOIN tasks t ON t.id = a.task_id WHERE t.state NOT IN ('succeeded', 'failed', 'cancelled')"),
            db.query("SELECT e.task_id || ' ' || e.attempt || ' ' || e.state || ' ' || e.received_ms || ' ' || coalesce(e.message, '') FROM events e JOIN tasks t ON t.id = e.task_id WHERE t.state NOT IN ('succeeded', 'failed', 'cancelled')"),
            db.query("SELECT o.task_id || ' ' || o.sends || ' ' || o.next_send_ms FROM outbox o"),
        );
    }
    eprintln!(
        "all {TASKS} tasks ended {:?} after the kill",
        killed.elapsed()
    );

    // The checker, over the history in the database.
    assert_eq!(succeeded(&db), TASKS, "every accepted task succeeded");
    // The result recorded is the current attempt's, once per task.
    assert_eq!(
        db.query(
            "SELECT count(*) FROM tasks t WHERE (SELECT count(*) FROM events e \
             WHERE e.task_id = t.id AND e.attempt = t.attempt AND e.state = 'succeeded') <> 1"
        ),
        "0",
        "every task's result is its current attempt's, recorded once"
    );
    // Execution is at least once: a task may have run on an attempt the
    // coordinator had already given up on (lost), whose late result is
    // kept as history only. Any other attempt that succeeded is a bug.
    let ran_twice = db.query(
        "SELECT e.task_id || ' attempt ' || e.attempt || ' (' || a.state || ', term ' || \
         coalesce(a.epoch, 0) || ') beside attempt ' || t.attempt FROM events e \
         JOIN tasks t ON t.id = e.task_id JOIN attempts a ON a.task_id = e.task_id AND a.attempt = e.attempt \
         WHERE e.state = 'succeeded' AND e.attempt <> t.attempt",
    );
    let not_lost: Vec<&str> = ran_twice
        .lines()
        .filter(|line| !line.contains("(lost,"))
        .collect();
    assert!(
        not_lost.is_empty(),
        "a second success of an attempt the coordinator had not given up on: {not_lost:?}"
    );
    eprintln!(
        "{} tasks also ran on an attempt given up on (history only): {:?}",
        ran_twice.lines().filter(|l| !l.is_empty()).count(),
        ran_twice.lines().take(3).collect::<Vec<_>>()
    );
    assert_eq!(
        db.query(
            "SELECT count(*) FROM attempts a LEFT JOIN leader_terms t ON t.epoch = a.epoch \
             WHERE t.epoch IS NULL"
        ),
        "0",
        "every attempt was placed under a term that existed"
    );
    assert_eq!(
        db.query(
            "SELECT count(*) FROM attempts a JOIN attempts b \
             ON b.task_id = a.task_id AND b.attempt = a.attempt + 1 WHERE b.epoch < a.epoch"
        ),
        "0",
        "no task was placed again under an older term than its previous attempt"
    );
    let terms: u64 = db
        .query("SELECT count(*) FROM leader_terms")
        .parse()
        .unwrap();
    assert!(terms >= 3, "three terms at least: {terms}");
    let placed_by_survivor: u64 = db
        .query(&format!(
            "SELECT count(*) FROM attempts WHERE epoch = {term}"
        ))
        .parse()
        .unwrap();
    assert!(
        pending_at_kill == 0 || placed_by_survivor > 0,
        "the survivor placed the {pending_at_kill} tasks left waiting"
    );
    drop(swarm);
}
