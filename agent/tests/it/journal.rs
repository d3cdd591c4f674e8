//! The journal on a real SQLite file: what it keeps across a reopen, what a
//! receipt removes, and its policy when full.

use crate::support;

use std::time::Duration;

use starling_agent::journal::{Journal, JournalError, JournalLimits, JOURNAL_FILE};
use starling_proto::{Digest, ExecLimits, NodeId, TaskEvent, TaskId, TaskState};

const NODE: &str = "journal-node";

fn assignment(task: &str) -> starling_proto::Assignment {
    support::signed_assignment(
        NODE,
        task,
        Digest([3; 32]),
        "http://127.0.0.1:1/a",
        b"input",
        ExecLimits::default(),
    )
}

fn event(task: &str, state: TaskState) -> TaskEvent {
    TaskEvent::state(
        TaskId::new(task).unwrap(),
        1,
        NodeId::new(NODE).unwrap(),
        state,
    )
}

fn limits(max_entries: usize, max_attempts: usize) -> JournalLimits {
    JournalLimits {
        max_entries,
        max_attempts,
        skew: Duration::from_secs(60),
    }
}

async fn unacked_states(journal: &Journal) -> Vec<(String, TaskState)> {
    journal
        .unacked(0, u64::MAX, 1000)
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.event.task_id.to_string(), e.event.state))
        .collect()
}

#[tokio::test]
async fn the_journal_survives_a_reopen_and_receipts_empty_the_outbox() {
    let dir = tempfile::tempdir().unwrap();
    let now = support::now_ms();
    let running_assignment = assignment("running");
    {
        let (journal, attempts) = Journal::open(dir.path(), JournalLimits::default())
            .await
            .unwrap();
        assert!(attempts.is_empty());
        journal
            .accept(
                &assignment("done"),
                &event("done", TaskState::Accepted),
                now,
            )
            .await
            .unwrap();
        let mut succeeded = event("done", TaskState::Succeeded);
        succeeded.output = b"result".to_vec();
        journal.record(&succeeded, now + 1).await.unwrap();
        journal
            .accept(
                &running_assignment,
                &event("running", TaskState::Accepted),
                now + 2,
            )
            .await
            .unwrap();
        journal
            .record(&event("running", TaskState::Running), now + 3)
            .await
            .unwrap();
        // No close: the process dies here.
    }
    assert!(dir.path().join(JOURNAL_FILE).exists());

    let (journal, attempts) = Journal::open(dir.path(), JournalLimits::default())
        .await
        .unwrap();
    assert_eq!(attempts.len(), 2);
    let done = attempts
        .iter()
        .find(|a| a.last_event.task_id.as_str() == "done")
        .unwrap();
    assert_eq!(done.last_event.state, TaskState::Succeeded);
    assert_eq!(done.last_event.output, b"result");
    assert!(
        done.assignment.is_none(),
        "a finished attempt keeps no assignment"
    );
    let running = attempts
        .iter()
        .find(|a| a.last_event.task_id.as_str() == "running")
        .unwrap();
    assert_eq!(running.last_event.state, TaskState::Running);
    // The signed assignment comes back byte for byte (its signature still holds).
    assert_eq!(running.assignment.as_ref(), Some(&running_assignment));

    // Every event awaits its receipt, oldest first.
    assert_eq!(
        unacked_states(&journal).await,
        [
            ("done".to_owned(), TaskState::Accepted),
            ("done".to_owned(), TaskState::Succeeded),
            ("running".to_owned(), TaskState::Accepted),
            ("running".to_owned(), TaskState::Running),
        ]
    );
    // Only those journaled by a given time, for the periodic resend.
    assert_eq!(journal.unacked(0, now + 1, 100).await.unwrap().len(), 2);

    // Receipts remove them; a duplicate receipt changes nothing.
    let done_id = TaskId::new("done").unwrap();
    assert!(journal.ack(&done_id, 1, TaskState::Accepted).await.unwrap());
    assert!(journal
        .ack(&done_id, 1, TaskState::Succeeded)
        .await
        .unwrap());
    assert!(!journal
        .ack(&done_id, 1, TaskState::Succeeded)
        .await
        .unwrap());
    drop(journal);

    let (journal, attempts) = Journal::open(dir.path(), JournalLimits::default())
        .await
        .unwrap();
    assert_eq!(
        unacked_states(&journal).await,
        [
            ("running".to_owned(), TaskState::Accepted),
            ("running".to_owned(), TaskState::Running),
        ]
    );
    // The acknowledged result is remembered without its output.
    let done = attempts
        .iter()
        .find(|a| a.last_event.task_id.as_str() == "done")
        .unwrap();
    assert_eq!(done.last_event.state, TaskState::Succeeded);
    assert!(done.last_event.output.is_empty());
}

#[tokio::test]
async fn a_full_outbox_refuses_new_attempts_and_keeps_every_unacked_event() {
    let dir = tempfile::tempdir().unwrap();
    let now = support::now_ms();
    let (journal, _) = Journal::open(dir.path(), limits(2, 100)).await.unwrap();
    journal
        .accept(&assignment("a"), &event("a", TaskState::Accepted), now)
        .await
        .unwrap();
    journal
        .accept(&assignment("b"), &event("b", TaskState::Accepted), now)
        .await
        .unwrap();
    let refused = journal
        .accept(&assignment("c"), &event("c", TaskState::Accepted), now)
        .await
        .unwrap_err();
    assert!(
        matches!(
            refused,
            JournalError::Full {
                what: "unacknowledged events",
                limit: 2
            }
        ),
        "{refused}"
    );
    // An event that would open a new attempt is refused as well...
    assert!(matches!(
        journal
            .record(&event("cancelled-early", TaskState::Cancelled), now)
            .await,
        Err(JournalError::Full { .. })
    ));
    // ...but the attempts already accepted still report, past the limit.
    journal
        .record(&event("a", TaskState::Running), now)
        .await
        .unwrap();
    journal
        .record(&event("a", TaskState::Succeeded), now)
        .await
        .unwrap();
    assert_eq!(journal.counts().await.unwrap(), (4, 2));
    assert_eq!(unacked_states(&journal).await.len(), 4);

    // Receipts make room again.
    let a = TaskId::new("a").unwrap();
    for state in [
        TaskState::Accepted,
        TaskState::Running,
        TaskState::Succeeded,
    ] {
        journal.ack(&a, 1, state).await.unwrap();
    }
    journal
        .accept(&assignment("c"), &event("c", TaskState::Accepted), now)
        .await
        .unwrap();
    assert_eq!(journal.counts().await.unwrap(), (2, 3));
}

#[tokio::test]
async fn finished_attempts_are_pruned_only_after_their_assignment_expired() {
    let dir = tempfile::tempdir().unwrap();
    let now = support::now_ms();
    let (journal, _) = Journal::open(dir.path(), limits(100, 2)).await.unwrap();
    for task in ["old", "newer"] {
        journal
            .accept(&assignment(task), &event(task, TaskState::Accepted), now)
            .await
            .unwrap();
        journal
            .record(&event(task, TaskState::Succeeded), now)
            .await
            .unwrap();
    }
    // Both finished, but their events are not acknowledged: nothing to prune.
    let refused = journal
        .accept(
            &assignment("third"),
            &event("third", TaskState::Accepted),
            now,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            refused,
            JournalError::Full {
                what: "remembered attempts",
                ..
            }
        ),
        "{refused}"
    );
    for task in ["old", "newer"] {
        let id = TaskId::new(task).unwrap();
        journal.ack(&id, 1, TaskState::Accepted).await.unwrap();
        journal.ack(&id, 1, TaskState::Succeeded).await.unwrap();
    }
    // Acknowledged, but their assignments could still be replayed.
    assert!(journal
        .accept(
            &assignment("third"),
            &event("third", TaskState::Accepted),
            now
        )
        .await
        .is_err());
    // Past expiry plus skew the oldest goes, and only as many as needed.
    // (The assignments were signed a few ms after `now`.)
    let later = now + 60_000 + 60_000 + 5_000;
    let pruned = journal
        .accept(
            &assignment("third"),
            &event("third", TaskState::Accepted),
            later,
        )
        .await
        .unwrap();
    assert_eq!(pruned, [(TaskId::new("old").unwrap(), 1)]);
    assert_eq!(journal.counts().await.unwrap(), (1, 2));
}
