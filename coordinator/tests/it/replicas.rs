//! Replicas of one site on one PostgreSQL: the lease (one leader at a time,
//! a new term at each change of hands), fencing (a deposed leader's writes
//! fail and change nothing), and two whole coordinators handing the site
//! over when the leader stops.

use std::time::{Duration, Instant};

use sha2::{Digest as _, Sha256};
use starling_api::{TaskDemand, TaskKind, TaskLimits, TaskStatus};
use starling_coordinator::leader::Leadership;
use starling_coordinator::store::{NewTask, Store, StoreError};
use starling_proto::{Digest, Runtime};

use crate::common;

const TTL: u64 = 1_500;

fn new_task(id: &str, artifact: Digest) -> NewTask {
    NewTask {
        id: id.to_string(),
        artifact,
        runtime: Runtime::Wasm,
        input: Vec::new(),
        args: Vec::new(),
        class: TaskKind::Cpu,
        demand: TaskDemand::default(),
        limits: TaskLimits::default(),
        work_seconds: 0.1,
        priority: 1,
        deadline_unix_ms: None,
        created_ms: 1,
    }
}

/// Two replicas' stores on one database, each with its own standing.
async fn two_replicas(url: &str) -> ((Store, Leadership), (Store, Leadership)) {
    let a = Leadership::replica();
    let b = Leadership::replica();
    let store_a = Store::open(url).await.unwrap().with_leadership(a.clone());
    let store_b = Store::open(url).await.unwrap().with_leadership(b.clone());
    ((store_a, a), (store_b, b))
}

#[tokio::test]
async fn one_replica_holds_the_lease_and_the_next_takes_it_only_once_it_runs_out() {
    let db = common::PostgresDb::create();
    let ((a, _), (b, _)) = two_replicas(&db.url).await;
    assert_eq!(a.acquire_lease("a", 1_000, TTL).await.unwrap(), Some(1));
    assert_eq!(b.acquire_lease("b", 1_000, TTL).await.unwrap(), None);
    assert!(a.renew_lease("a", 1, 2_000, TTL).await.unwrap());
    // Renewed until 3 500: not yet free at 3 499.
    assert_eq!(b.acquire_lease("b", 3_499, TTL).await.unwrap(), None);
    assert_eq!(b.acquire_lease("b", 3_500, TTL).await.unwrap(), Some(2));
    // The old term cannot be renewed or handed back any more.
    assert!(!a.renew_lease("a", 1, 3_600, TTL).await.unwrap());
    a.release_lease("a", 1).await.unwrap();
    assert_eq!(a.acquire_lease("a", 3_700, TTL).await.unwrap(), None);
    // A clean stop hands it back at once, under a new term again.
    b.release_lease("b", 2).await.unwrap();
    assert_eq!(a.acquire_lease("a", 3_800, TTL).await.unwrap(), Some(3));
    let terms = a.leader_terms().await.unwrap();
    let holders: Vec<(u64, &str, u64)> = terms
        .iter()
        .map(|t| (t.epoch, t.holder.as_str(), t.acquired_ms))
        .collect();
    assert_eq!(holders, [(1, "a", 1_000), (2, "b", 3_500), (3, "a", 3_800)]);
    a.close().await;
    b.close().await;
}

#[tokio::test]
async fn a_deposed_leaders_writes_fail_and_change_nothing() {
    let db = common::PostgresDb::create();
    let ((a, lead_a), (b, lead_b)) = two_replicas(&db.url).await;
    let bytes = common::minimal_wasm();
    let digest = Digest(Sha256::digest(&bytes).into());
    a.put_artifact(&digest, &bytes, Runtime::Wasm, "", 1)
        .await
        .unwrap();
    for id in ["t1", "t2", "t3"] {
        a.insert_task(&new_task(id, digest)).await.unwrap();
    }
    let why = serde_json::json!({"summary": "test"});

    // A replica that never led writes nothing a leader writes.
    assert!(!a.leads());
    assert!(matches!(
        a.assign_task("t1", 1, "n1", 0, &why, 10).await,
        Err(StoreError::Deposed)
    ));

    lead_a.lead(a.acquire_lease("a", 1_000, TTL).await.unwrap().unwrap());
    assert!(a.assign_task("t1", 1, "n1", 0, &why, 1_100).await.unwrap());
    assert_eq!(
        db.query("SELECT epoch FROM attempts WHERE task_id = 't1'"),
        "1"
    );

    // A is paused past its lease (it does not know); B takes over.
    let term_b = b.acquire_lease("b", 2_600, TTL).await.unwrap().unwrap();
    lead_b.lead(term_b);
    assert_eq!(term_b, 2);
    assert!(a.leads(), "A still believes it leads");
    assert!(matches!(
        a.assign_task("t2", 1, "n1", 0, &why, 2_700).await,
        Err(StoreError::Deposed)
    ));
    assert!(matches!(
        a.requeue_node_tasks("n1", 3, 2_700).await,
        Err(StoreError::Deposed)
    ));
    let entry = a.outbox_entry("t1", 1).await.unwrap().unwrap();
    assert!(matches!(
        a.claim_outbox_send(&entry, 9_000, a.leader_term()).await,
        Err(StoreError::Deposed)
    ));
    assert!(matches!(
        a.end_attempt("t1", 1, "n1", "unknown_to_node", 3, 2_700)
            .await,
        Err(StoreError::Deposed)
    ));
    // None of it landed: t2 waits, t1 is still on n1 with its row unsent.
    assert_eq!(
        a.task("t2").await.unwrap().unwrap().status,
        TaskStatus::Pending
    );
    let t1 = a.task("t1").await.unwrap().unwrap();
    assert_eq!(
        (t1.status, t1.node_id.as_deref()),
        (TaskStatus::Assigned, Some("n1"))
    );
    assert_eq!(a.outbox_entry("t1", 1).await.unwrap().unwrap().sends, 0);

    // The new leader's writes land, under its term.
    assert!(b.assign_task("t2", 1, "n2", 0, &why, 2_800).await.unwrap());
    assert!(b
        .claim_outbox_send(&entry, 9_000, b.leader_term())
        .await
        .unwrap());
    assert_eq!(
        db.query("SELECT task_id || ':' || epoch FROM attempts ORDER BY task_id"),
        "t1:1\nt2:2"
    );
    a.close().await;
    b.close().await;
}

/// A fresh coordinator's health: whether it leads and under which term.
async fn standing(http: &reqwest::Client, rest: &str) -> (bool, Option<u64>) {
    let health = common::get_json(http, &format!("{rest}/api/v1/health")).await;
    (
        health["leader"].as_bool().unwrap(),
        health["leader_term"].as_u64(),
    )
}

#[tokio::test]
async fn two_coordinators_share_a_site_and_the_survivor_leads_when_the_leader_stops() {
    let db = common::PostgresDb::create();
    let broker = common::Mosquitto::start();
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let configure = |config: &mut starling_coordinator::CoordinatorConfig| {
        config.db = Some(db.url.clone());
        config.broker = Some(broker.url.clone());
    };
    let first = common::start_coordinator(dirs[0].path(), configure).await;
    let second = common::start_coordinator(dirs[1].path(), configure).await;
    let http = reqwest::Client::new();
    let first_url = first.rest_url();
    let second_url = second.rest_url();
    // Exactly one leads, soon.
    let deadline = Instant::now() + Duration::from_secs(10);
    let (leader, follower, follower_url) = loop {
        let a = standing(&http, &first_url).await;
        let b = standing(&http, &second_url).await;
        assert!(!(a.0 && b.0), "two leaders at once: {a:?} {b:?}");
        if a.0 {
            break (first, second, second_url);
        }
        if b.0 {
            break (second, first, first_url);
        }
        assert!(Instant::now() < deadline, "nobody leads");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let (_, term) = standing(&http, &leader.rest_url()).await;
    let metrics = http
        .get(format!("{}/metrics", leader.rest_url()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.contains("starling_leader 1"), "{metrics}");
    assert_eq!(standing(&http, &follower_url).await, (false, None));

    // A clean stop hands the lease over at once.
    let stopped = Instant::now();
    leader.shutdown().await;
    let took_over = loop {
        if let (true, Some(new_term)) = standing(&http, &follower_url).await {
            assert!(Some(new_term) > term, "{new_term} after {term:?}");
            break stopped.elapsed();
        }
        assert!(stopped.elapsed() < Duration::from_secs(10), "no takeover");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(took_over < Duration::from_secs(2), "took {took_over:?}");
    follower.shutdown().await;
}
