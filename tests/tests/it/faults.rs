//! Nothing lost: real processes killed with SIGKILL, a broker that restarts
//! with an empty memory, a link cut inside a network namespace, and a seeded
//! loop of such faults with a checker over the history of submissions and
//! results. Every accepted task must complete, and none twice.
//!
//! The scenarios share two cores, so they run one at a time and beside no
//! other test of the binary (`serial`).

use std::collections::BTreeMap;
use std::sync::RwLockWriteGuard;
use std::time::{Duration, Instant};

use starling_tests::{modules, Agent, Coordinator, Mosquitto, NetNs, Store};

fn serial() -> RwLockWriteGuard<'static, ()> {
    crate::alone()
}

/// The checker: every accepted task succeeded with its own output, exactly
/// one attempt succeeded, and no attempt of it reported success twice.
/// Returns how many attempts the tasks took in all.
fn check_history(coordinator: &Coordinator, accepted: &BTreeMap<String, String>) -> usize {
    let mut attempts = 0;
    for (id, input) in accepted {
        let task = coordinator.task(id);
        assert_eq!(task["state"], "succeeded", "accepted task lost: {task:#}");
        assert_eq!(
            task["output_text"].as_str(),
            Some(format!("done:{input}").as_str()),
            "{task:#}"
        );
        let succeeded_attempts = task["attempts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| a["state"] == "succeeded")
            .count();
        assert_eq!(succeeded_attempts, 1, "completed more than once: {task:#}");
        let current = task["attempt"].as_u64().unwrap();
        let current_successes = task["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["state"] == "succeeded" && e["attempt"].as_u64() == Some(current))
            .count();
        assert_eq!(current_successes, 1, "{task:#}");
        attempts += task["attempts"].as_array().unwrap().len();
    }
    attempts
}

/// Waits until every accepted task has ended.
fn wait_all(coordinator: &Coordinator, accepted: &BTreeMap<String, String>, timeout: Duration) {
    for id in accepted.keys() {
        coordinator.wait_task(id, timeout, "finished", |t| {
            matches!(
                t["state"].as_str(),
                Some("succeeded" | "failed" | "cancelled")
            )
        });
    }
}

/// Coordinator flags that make the scenarios quick: a node silent for 3 s is
/// suspected, and unacknowledged assignments are re-sent every second.
const FAST: [&str; 4] = ["--node-timeout", "3s", "--resend-interval", "1s"];

#[test]
fn an_agent_killed_mid_task_loses_nothing_and_reports_nothing_twice() {
    let _serial = serial();
    let broker = Mosquitto::start();
    let coordinator = Coordinator::start(Some(&broker.url), Store::Sqlite, &FAST);
    let mut a = Agent::start(&coordinator, &broker.url, "crash-a", "");
    let mut b = Agent::start(&coordinator, &broker.url, "crash-b", "");
    coordinator.wait_for_nodes(2, Duration::from_secs(60));
    let dir = tempfile::tempdir().unwrap();
    let digest = coordinator.publish_spin(dir.path(), 4 * modules::SPIN_SECOND);

    let id = coordinator.submit(&digest, "kill9").expect("accepted");
    let running = coordinator.wait_task(&id, Duration::from_secs(30), "running", |t| {
        t["state"] == "running"
    });
    let victim_id = running["node_id"].as_str().unwrap().to_string();
    let (victim, survivor) = if victim_id == a.node_id {
        (&mut a, &b)
    } else {
        (&mut b, &a)
    };
    let killed = Instant::now();
    victim.kill();
    coordinator.wait_task(&id, Duration::from_secs(30), "moved", |t| {
        t["state"] == "running" && t["node_id"] == survivor.node_id.as_str()
    });
    eprintln!(
        "kill -9 to running elsewhere: {} ms",
        killed.elapsed().as_millis()
    );
    let done = coordinator.wait_task(&id, Duration::from_secs(60), "done", |t| {
        t["state"] == "succeeded"
    });
    assert_eq!(done["attempt"], 2, "{done:#}");

    // The dead agent comes back with attempt 1 in its journal. It resumes it,
    // the coordinator cancels the stale attempt, and nothing completes twice.
    victim.restart();
    coordinator.wait_for_nodes(2, Duration::from_secs(60));
    let start = Instant::now();
    let stale_ended = loop {
        let task = coordinator.task(&id);
        let ended = task["events"].as_array().unwrap().iter().any(|e| {
            e["attempt"] == 1
                && e["node_id"] == victim_id.as_str()
                && matches!(e["state"].as_str(), Some("cancelled" | "failed"))
        });
        if ended || start.elapsed() > Duration::from_secs(20) {
            break ended;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        stale_ended,
        "the restarted agent did not end its stale attempt:\n{}",
        victim.process.log()
    );
    let task = coordinator.task(&id);
    assert_eq!(task["state"], "succeeded");
    assert_eq!(task["attempt"], 2);
    let stale_successes = task["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["attempt"] == 1 && e["state"] == "succeeded")
        .count();
    assert_eq!(stale_successes, 0, "{task:#}");
    check_history(&coordinator, &BTreeMap::from([(id, "kill9".to_string())]));
}

#[test]
fn every_result_arrives_across_broker_restarts() {
    let _serial = serial();
    let mut broker = Mosquitto::start();
    let coordinator = Coordinator::start(Some(&broker.url), Store::Sqlite, &FAST);
    let _a = Agent::start(&coordinator, &broker.url, "restart-a", "");
    let _b = Agent::start(&coordinator, &broker.url, "restart-b", "");
    coordinator.wait_for_nodes(2, Duration::from_secs(60));
    let dir = tempfile::tempdir().unwrap();
    let digest = coordinator.publish_spin(dir.path(), modules::SPIN_SECOND);

    let mut accepted = BTreeMap::new();
    for i in 0..8 {
        let input = format!("broker-{i}");
        accepted.insert(coordinator.submit(&digest, &input).unwrap(), input);
    }
    // Two restarts while tasks run: the broker forgets every session, queued
    // message and subscription each time.
    std::thread::sleep(Duration::from_millis(1500));
    broker.kill_and_restart();
    std::thread::sleep(Duration::from_millis(2000));
    broker.kill_and_restart();
    wait_all(&coordinator, &accepted, Duration::from_secs(120));
    check_history(&coordinator, &accepted);
}

#[test]
fn a_coordinator_killed_during_a_burst_completes_every_accepted_task_once() {
    let _serial = serial();
    let broker = Mosquitto::start();
    let mut coordinator = Coordinator::start(Some(&broker.url), Store::Sqlite, &FAST);
    let _a = Agent::start(&coordinator, &broker.url, "burst-a", "");
    let _b = Agent::start(&coordinator, &broker.url, "burst-b", "");
    coordinator.wait_for_nodes(2, Duration::from_secs(60));
    let dir = tempfile::tempdir().unwrap();
    let digest = coordinator.publish_spin(dir.path(), modules::SPIN_SECOND / 10);

    // A second thread kills the coordinator while the burst is under way.
    let pid = coordinator.process.pid();
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1500));
        std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
            .unwrap();
    });
    let mut accepted = BTreeMap::new();
    let mut refused = 0;
    let mut restarted = false;
    for i in 0..40 {
        let input = format!("burst-{i}");
        match coordinator.submit(&digest, &input) {
            Some(id) => {
                accepted.insert(id, input);
            }
            None => {
                refused += 1;
                if !restarted && !coordinator.process.is_running() {
                    coordinator.kill_and_restart();
                    restarted = true;
                }
            }
        }
    }
    killer.join().unwrap();
    if !restarted {
        coordinator.kill_and_restart();
    }
    assert!(
        accepted.len() >= 20,
        "{} accepted, {refused} refused",
        accepted.len()
    );
    wait_all(&coordinator, &accepted, Duration::from_secs(120));
    check_history(&coordinator, &accepted);
}

#[test]
fn a_node_cut_off_finishes_its_work_and_delivers_after_the_link_returns() {
    let _serial = serial();
    assert!(
        NetNs::available(),
        "this test needs root and iproute2 to make a network namespace"
    );
    let ns = NetNs::create();
    let broker = Mosquitto::start_on(ns.host_octets());
    let listen = format!("{}:0", ns.host_ip());
    // A generous node timeout: this scenario is about a node that keeps
    // working through an outage, not about failing it over.
    let coordinator = Coordinator::start(
        Some(&broker.url),
        Store::Sqlite,
        &["--listen", &listen, "--node-timeout", "60s"],
    );
    let agent = Agent::start_with(
        &coordinator,
        &broker.url,
        "island",
        "",
        Some(&ns),
        &["--max-tasks", "2"],
    );
    coordinator.wait_for_nodes(1, Duration::from_secs(60));
    let dir = tempfile::tempdir().unwrap();
    let digest = coordinator.publish_spin(dir.path(), 2 * modules::SPIN_SECOND);

    let mut accepted = BTreeMap::new();
    for i in 0..2 {
        let input = format!("island-{i}");
        accepted.insert(coordinator.submit(&digest, &input).unwrap(), input);
    }
    for id in accepted.keys() {
        coordinator.wait_task(id, Duration::from_secs(30), "running", |t| {
            t["state"] == "running"
        });
    }
    ns.cut();
    // Long enough for both tasks to finish on the island, short of the
    // broker's keep-alive verdict (1.5 × 5 s).
    std::thread::sleep(Duration::from_secs(5));
    for id in accepted.keys() {
        let task = coordinator.task(id);
        assert_eq!(
            task["state"], "running",
            "no result can arrive while the link is down: {task:#}"
        );
    }
    ns.restore();
    wait_all(&coordinator, &accepted, Duration::from_secs(60));
    for id in accepted.keys() {
        let task = coordinator.task(id);
        assert_eq!(task["attempt"], 1, "ran once, on the island: {task:#}");
        assert_eq!(task["node_id"], "island");
    }
    check_history(&coordinator, &accepted);
    drop(agent);
}

/// A small deterministic generator, so a failing round can be replayed with
/// `STARLING_FAULT_SEED`.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[test]
fn twenty_seeded_rounds_of_faults_lose_nothing_and_complete_nothing_twice() {
    let _serial = serial();
    let seed: u64 = std::env::var("STARLING_FAULT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(42);
    let mut rng = SplitMix(seed);
    assert!(
        NetNs::available(),
        "this test needs root and iproute2 to make a network namespace"
    );
    // loop-c lives in its own network namespace, so a round can cut its link;
    // broker and coordinator listen on the host end of that link.
    let ns = NetNs::create();
    let mut broker = Mosquitto::start_on(ns.host_octets());
    let listen = format!("{}:0", ns.host_ip());
    let mut flags = vec!["--listen", listen.as_str()];
    flags.extend(FAST);
    let mut coordinator = Coordinator::start(Some(&broker.url), Store::Sqlite, &flags);
    let mut agents: Vec<Agent> = ["loop-a", "loop-b", "loop-c"]
        .into_iter()
        .map(|id| {
            let netns = (id == "loop-c").then_some(&ns);
            Agent::start_with(&coordinator, &broker.url, id, "", netns, &[])
        })
        .collect();
    coordinator.wait_for_nodes(3, Duration::from_secs(60));
    let dir = tempfile::tempdir().unwrap();
    let digest = coordinator.publish_spin(dir.path(), modules::SPIN_SECOND / 2);

    let mut accepted = BTreeMap::new();
    let mut faults = Vec::new();
    for round in 0..20 {
        for i in 0..3 {
            let input = format!("r{round}-{i}");
            if let Some(id) = coordinator.submit(&digest, &input) {
                accepted.insert(id, input);
            }
        }
        std::thread::sleep(Duration::from_millis(rng.below(1000)));
        let fault = match rng.below(5) {
            0 => {
                let victim = rng.below(agents.len() as u64) as usize;
                agents[victim].kill();
                std::thread::sleep(Duration::from_millis(rng.below(2000)));
                agents[victim].restart();
                format!("kill -9 agent {}", agents[victim].node_id)
            }
            1 => {
                broker.kill_and_restart();
                "kill -9 broker".to_string()
            }
            2 => {
                coordinator.kill_and_restart();
                "kill -9 coordinator".to_string()
            }
            3 => {
                // Up to 4 s: past the 3 s node timeout about a quarter of
                // the time, so loop-c's work is sometimes moved while it
                // still runs it, and its late results must not count twice.
                let outage = rng.below(4000);
                ns.cut();
                std::thread::sleep(Duration::from_millis(outage));
                ns.restore();
                format!("link to loop-c cut for {outage} ms")
            }
            _ => "none".to_string(),
        };
        faults.push(fault);
    }
    eprintln!("seed {seed}: faults {faults:?}");
    wait_all(&coordinator, &accepted, Duration::from_secs(240));
    let attempts = check_history(&coordinator, &accepted);
    eprintln!(
        "seed {seed}: {} tasks accepted, all completed once, {attempts} attempts",
        accepted.len()
    );
    assert!(accepted.len() >= 50, "only {} accepted", accepted.len());
}
