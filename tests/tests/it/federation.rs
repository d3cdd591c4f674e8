//! Three sites, each a coordinator with its own embedded broker and agent, in
//! three network namespaces on one bridge: they find each other from one
//! seed, a flooded site spills its overflow to the others and every task
//! completes once, a site cut off is marked down and gets no more work, and
//! once its link is back it rejoins and is used again.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use starling_tests::fabric::Fabric;
use starling_tests::{binary, modules, Agent, Coordinator};

const SITES: [&str; 3] = ["site-a", "site-b", "site-c"];

fn cluster_key() -> String {
    let out = std::process::Command::new(binary("starling-coordinator"))
        .arg("cluster-key")
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// What `starling sites --json` says of `site` at `coordinator`.
fn site_state(coordinator: &Coordinator, site: &str) -> Option<String> {
    let sites = coordinator.cli_json(&["sites"], None);
    sites["sites"]
        .as_array()?
        .iter()
        .find(|entry| entry["site"] == site)
        .and_then(|entry| entry["state"].as_str().map(str::to_string))
}

/// Waits until every coordinator in `watchers` sees `site` in `state`;
/// returns how long that took.
fn wait_site(watchers: &[&Coordinator], site: &str, state: &str, timeout: Duration) -> Duration {
    let start = Instant::now();
    loop {
        if watchers
            .iter()
            .all(|c| site_state(c, site).as_deref() == Some(state))
        {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < timeout,
            "{site} not {state} everywhere after {timeout:?}: {}",
            watchers
                .iter()
                .map(|c| format!("{:#}\n{}", c.cli_json(&["sites"], None), c.process.log()))
                .collect::<Vec<_>>()
                .join("\n---\n")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The work each flooded task declares, and its deadline: six tasks' worth
/// for each of a site's two slots cannot all finish in time, while one
/// task forwarded to a peer with a slot free can (the peers' nodes share
/// this machine's two cores, so a busy site-a makes them report load too).
const WORK_S: f64 = 1.0;
const DEADLINE_MS: u64 = 3_000;

/// Submits `count` tasks to `coordinator` over REST, each estimated at
/// `work_s` seconds with a deadline `deadline_ms` from now.
fn flood(
    coordinator: &Coordinator,
    digest: &str,
    count: usize,
    work_s: f64,
    deadline_ms: u64,
) -> Vec<String> {
    (0..count)
        .map(|i| {
            let body = serde_json::json!({
                "artifact": digest,
                "input_text": format!("t{i}"),
                "work_seconds": work_s,
                "deadline_ms": deadline_ms,
                "limits": {"wall_ms": 60_000},
            });
            let (status, text) = coordinator.http(
                "POST",
                "/api/v1/tasks",
                Some(("application/json", body.to_string().into_bytes())),
            );
            assert_eq!(status, 201, "{text}");
            let task: serde_json::Value = serde_json::from_str(&text).unwrap();
            task["id"].as_str().unwrap().to_string()
        })
        .collect()
}

/// Waits for every task to end and checks each succeeded exactly once:
/// one `succeeded` event, output naming its input. Returns where each ran
/// (`None`: at home).
fn settle(home: &Coordinator, ids: &[String], timeout: Duration) -> Vec<Option<String>> {
    let mut sites = Vec::new();
    for id in ids {
        let task = home.wait_task(id, timeout, "ended", |t| {
            matches!(
                t["state"].as_str(),
                Some("succeeded" | "failed" | "cancelled")
            )
        });
        assert_eq!(task["state"], "succeeded", "{task:#}");
        let successes = task["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|event| event["state"] == "succeeded")
            .count();
        assert_eq!(successes, 1, "one success recorded: {task:#}");
        assert!(
            task["output_text"]
                .as_str()
                .unwrap_or("")
                .starts_with("done:"),
            "{task:#}"
        );
        sites.push(task["site"].as_str().map(str::to_string));
    }
    sites
}

/// How many tasks `peer` holds for each origin task of `origin`; a task
/// forwarded twice would show as 2.
fn taken_from(peer: &Coordinator, origin: &str) -> HashMap<String, usize> {
    let list = peer.cli_json(&["tasks", "--limit", "1000"], None);
    let mut counts = HashMap::new();
    for summary in list.as_array().unwrap() {
        let task = peer.task(summary["id"].as_str().unwrap());
        if task["origin_site"] == origin {
            *counts
                .entry(task["id"].as_str().unwrap().to_string())
                .or_insert(0) += 1;
        }
    }
    counts
}

#[test]
fn three_sites_discover_spill_detect_a_cut_and_rejoin() {
    // Gossip failure detection runs on deadlines; the sites get the machine to
    // themselves, as the fault scenarios do.
    let _alone = crate::alone();
    if !Fabric::available() {
        panic!("this test needs root and iproute2 (ip netns) to build three hosts");
    }
    let fabric = Fabric::create(3).unwrap();
    let key = cluster_key();
    let root = tempfile::tempdir().unwrap();
    let credentials: Vec<String> = site_credentials(root.path(), &SITES)
        .iter()
        .map(|file| file.display().to_string())
        .collect();
    let start = |i: usize, seed: Option<&str>| {
        let gossip = format!("{}:0", fabric.ip(i));
        let mut extra = vec![
            "--site",
            SITES[i],
            "--site-credentials",
            &credentials[i],
            "--cluster-key",
            &key,
            "--gossip-listen",
            &gossip,
            "--forward-timeout",
            "5s",
        ];
        if let Some(seed) = seed {
            extra.extend(["--seed", seed]);
        }
        Coordinator::start_in_namespace(fabric.ns(i), fabric.ip(i), &extra)
    };
    let a = start(0, None);
    let seed = a.ready_field("gossip").unwrap();
    let b = start(1, Some(&seed));
    let c = start(2, Some(&seed));
    let coordinators = [&a, &b, &c];
    let _agents: Vec<Agent> = coordinators
        .iter()
        .enumerate()
        .map(|(i, coordinator)| {
            let agent = Agent::start_in_namespace(
                coordinator,
                &format!("node-{}", SITES[i]),
                fabric.ns(i),
                &["--max-tasks", "2"],
            );
            coordinator.wait_for_nodes(1, Duration::from_secs(30));
            agent
        })
        .collect();

    // Discovery from one seed: B and C know only A, and learn of each other.
    for site in SITES {
        let others: Vec<&Coordinator> = coordinators
            .iter()
            .zip(SITES)
            .filter(|(_, name)| *name != site)
            .map(|(c, _)| *c)
            .collect();
        wait_site(&others, site, "alive", Duration::from_secs(20));
    }
    let out = a.cli(&["sites"], None);
    let table = String::from_utf8_lossy(&out.stdout);
    for site in SITES {
        assert!(table.contains(site), "{table}");
    }

    let dir = tempfile::tempdir().unwrap();
    let digest = a.publish_spin(dir.path(), modules::SPIN_SECOND / 2);

    // A flood at A: two slots cannot finish twelve 1-second tasks within
    // 3 s. Each task declares about what the module takes (half a second
    // of spinning on this class of machine, more beside the other sites'
    // work): the sites learn run times from what ran (issue 35), and work
    // declared four times too long taught site-a that it could finish
    // every wave itself, so nothing was left to spill.
    let ids = flood(&a, &digest, 12, WORK_S, DEADLINE_MS);
    let ran_at = settle(&a, &ids, Duration::from_secs(90));
    let spilled: HashSet<&str> = ran_at.iter().flatten().map(String::as_str).collect();
    assert!(
        !spilled.is_empty(),
        "nothing left site-a: {ran_at:?}\n{}",
        a.process.log()
    );
    assert!(ran_at.iter().any(Option::is_none), "site-a ran some itself");
    // Every forward is one task at its peer.
    for (peer, name) in [(&b, "site-b"), (&c, "site-c")] {
        let taken = taken_from(peer, "site-a");
        assert!(taken.values().all(|&n| n == 1), "{name}: {taken:?}");
        let sent = ran_at.iter().filter(|s| s.as_deref() == Some(name)).count();
        assert!(
            taken.len() >= sent,
            "{name} holds {} of {sent}",
            taken.len()
        );
    }

    // C is cut off while work forwarded to it is in flight: A and B mark it
    // down, that work is taken back and completes elsewhere, once. A site's
    // free slots come from its nodes' CPU load, which lags: right after the
    // first flood C may still look busy and a whole wave goes to B. So waves
    // follow until one reaches C (as after the rejoin below).
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut ids: Vec<String> = Vec::new();
    let at_c = 'waves: loop {
        // Twice the first flood: once site-a has learned that the module
        // runs faster than declared, twelve fit its own slots in time.
        ids.extend(flood(&a, &digest, 24, WORK_S, DEADLINE_MS));
        let wave = Instant::now();
        while wave.elapsed() < Duration::from_secs(15) {
            // One list call a round: a CLI process per task (72 by the
            // last wave, ten times a second) kept the machine busy enough
            // that every site's nodes reported themselves full.
            let (status, text) = a.http("GET", "/api/v1/tasks?limit=1000", None);
            assert_eq!(status, 200, "{text}");
            let list: serde_json::Value = serde_json::from_str(&text).unwrap();
            let at_c: Vec<String> = list["tasks"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|task| {
                    task["site"] == "site-c"
                        && !matches!(task["state"].as_str(), Some("succeeded" | "failed"))
                })
                .filter_map(|task| task["id"].as_str())
                .filter(|id| ids.iter().any(|sent| sent == id))
                .map(str::to_string)
                .collect();
            if !at_c.is_empty() {
                break 'waves at_c;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(
            Instant::now() < deadline,
            "nothing was forwarded to site-c in {} tasks:\n{:#}",
            ids.len(),
            a.cli_json(&["sites"], None)
        );
    };
    fabric.cut(2);
    let detected = wait_site(&[&a, &b], "site-c", "down", Duration::from_secs(30));
    println!("site-c cut off: marked down by site-a and site-b in {detected:?}");
    let ran_at = settle(&a, &ids, Duration::from_secs(90));
    let mut taken_back = 0;
    for id in &at_c {
        let task = a.task(id);
        let lost_at_c = task["attempts"].as_array().unwrap().iter().any(|attempt| {
            attempt["site"] == "site-c"
                && attempt["node_id"].is_null()
                && attempt["state"] == "lost"
        });
        if lost_at_c {
            taken_back += 1;
            assert_ne!(task["site"], "site-c", "{task:#}");
        }
    }
    println!(
        "{} tasks in flight at site-c when it was cut; {taken_back} taken back; ran at {ran_at:?}",
        at_c.len()
    );
    assert!(taken_back >= 1, "no forward to site-c was taken back");
    let ids = flood(&a, &digest, 8, WORK_S, DEADLINE_MS);
    let ran_at = settle(&a, &ids, Duration::from_secs(90));
    assert!(
        ran_at.iter().all(|s| s.as_deref() != Some("site-c")),
        "work went to a site marked down: {ran_at:?}"
    );

    // C's link is back: it rejoins, and takes work again.
    fabric.restore(2);
    let rejoined = wait_site(&[&a, &b], "site-c", "alive", Duration::from_secs(30));
    println!("site-c back: alive again at site-a and site-b in {rejoined:?}");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ids = flood(&a, &digest, 24, WORK_S, DEADLINE_MS);
        let ran_at = settle(&a, &ids, Duration::from_secs(90));
        if ran_at.iter().any(|s| s.as_deref() == Some("site-c")) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "site-c never used again after rejoining: {ran_at:?}\n{:#}\n{}",
            a.cli_json(&["sites"], None),
            a.process.log()
        );
    }
}

/// Each site's credentials, as an operator makes them: `federation init` on
/// the first site (the trust root and its own bundle), `federation issue`
/// from it for the others. In `sites` order.
fn site_credentials(dir: &std::path::Path, sites: &[&str]) -> Vec<std::path::PathBuf> {
    let run = |args: &[&str]| {
        let out = std::process::Command::new(binary("starling-coordinator"))
            .args(args)
            .arg("--data-dir")
            .arg(dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&["federation", "init", "--site", sites[0]]);
    let mut files = vec![dir.join("site-credentials.json")];
    for site in &sites[1..] {
        let file = dir.join(format!("{site}.credentials.json"));
        run(&[
            "federation",
            "issue",
            "--site",
            site,
            "--out",
            file.to_str().unwrap(),
        ]);
        files.push(file);
    }
    files
}

/// Issue 20, item 4: a forwarded task keeps its publisher's signature, so a
/// node of the receiving site that runs only what a trusted publisher
/// signed (`--trusted-publisher`) runs it; the same node refuses forwarded
/// work that is not signed, which shows the signature is what made the
/// difference. Site A has no node, so its work goes to B.
#[test]
fn a_forwarded_signed_task_runs_where_nodes_trust_only_its_publisher() {
    let _alone = crate::alone();
    if !Fabric::available() {
        panic!("this test needs root and iproute2 (ip netns) to build two hosts");
    }
    let fabric = Fabric::create(2).unwrap();
    let dir = tempfile::tempdir().unwrap();
    // The cluster key from a file, as the README shows (never on the command line).
    let key_file = dir.path().join("cluster.key");
    std::fs::write(&key_file, format!("{}\n", cluster_key())).unwrap();
    let credentials = site_credentials(dir.path(), &SITES[..2]);
    let start = |i: usize, seed: Option<&str>| {
        let gossip = format!("{}:0", fabric.ip(i));
        let mut extra = vec![
            "--site",
            SITES[i],
            "--cluster-key-file",
            key_file.to_str().unwrap(),
            "--site-credentials",
            credentials[i].to_str().unwrap(),
            "--gossip-listen",
            &gossip,
        ];
        if let Some(seed) = seed {
            extra.extend(["--seed", seed]);
        }
        Coordinator::start_in_namespace(fabric.ns(i), fabric.ip(i), &extra)
    };
    let a = start(0, None);
    let seed = a.ready_field("gossip").unwrap();
    let b = start(1, Some(&seed));

    // The publisher's key, made at A; B's node trusts only it.
    let publisher_key = dir.path().join("publisher.key");
    let made = a.cli_json(&["keygen", "--out", publisher_key.to_str().unwrap()], None);
    let publisher = made["public_key"].as_str().unwrap().to_string();
    let _agent = Agent::start_in_namespace(
        &b,
        "node-site-b",
        fabric.ns(1),
        &["--trusted-publisher", &publisher],
    );
    b.wait_for_nodes(1, Duration::from_secs(30));
    wait_site(&[&a], "site-b", "alive", Duration::from_secs(20));
    wait_site(&[&b], "site-a", "alive", Duration::from_secs(20));

    let signed = a.publish_spin(dir.path(), 1_000);
    let unsigned = a.publish_spin(dir.path(), 1_001);
    let out = a.cli(
        &["sign", &signed, "--key", publisher_key.to_str().unwrap()],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let ended = |task: &serde_json::Value| {
        matches!(
            task["state"].as_str(),
            Some("succeeded" | "failed" | "cancelled")
        )
    };
    let signed_task = flood(&a, &signed, 1, 0.5, 10_000).remove(0);
    let task = a.wait_task(&signed_task, Duration::from_secs(60), "ended", ended);
    assert_eq!(task["state"], "succeeded", "{task:#}\n{}", b.process.log());
    assert_eq!(task["site"], "site-b", "{task:#}");
    assert_eq!(task["site_node"], "node-site-b", "{task:#}");

    let unsigned_task = flood(&a, &unsigned, 1, 0.5, 10_000).remove(0);
    let task = a.wait_task(&unsigned_task, Duration::from_secs(60), "ended", ended);
    assert_eq!(task["state"], "failed", "{task:#}");
    assert_eq!(task["site"], "site-b", "{task:#}");
    assert_eq!(task["reason"], "policy_refused", "{task:#}");
}
