//! What an agent's event does to its task: the rules of stale and current
//! attempts, refusals, `agent_busy` requeues and late results, as one pure
//! function. The store reads the rows, asks [`reconcile`], and applies the
//! answer in the same transaction; nothing here touches a database or a clock.

use starling_proto::{FailureReason, TaskState};

use crate::task::TaskStatus;

/// The task as stored when the event arrives: what the rules look at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskFacts<'a> {
    /// The task's state.
    pub status: TaskStatus,
    /// Its current (or last) attempt number; 0 before the first assignment.
    /// It is also how many attempts were made.
    pub attempt: u32,
    /// The node of the current attempt; `None` while the task waits in the
    /// queue or runs at another site.
    pub node: Option<&'a str>,
    /// Whether its submitter asked for a cancel while an attempt ran.
    pub cancel_requested: bool,
}

/// The event as the agent sent it: what the rules look at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventFacts<'a> {
    /// The node that sent it.
    pub node: &'a str,
    /// The attempt it is about.
    pub attempt: u32,
    /// What the node says of the attempt.
    pub state: TaskState,
    /// Why the attempt failed, for `failed`.
    pub reason: Option<FailureReason>,
}

/// What an event does, for an event not recorded before (a redelivery of the
/// same task, attempt and state is recognised by the events table's key and
/// changes nothing whatever this says).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reconciliation {
    /// The sender was never given this attempt (another node's attempt, or
    /// one never made): record nothing, not even history, so such an event
    /// cannot take the place of the real node's event.
    NotAssigned,
    /// The event is about an attempt that is no longer the task's current
    /// one: keep it as history and leave the task alone. The caller may stop
    /// the node's work on that attempt (ingest cancels it when the event says
    /// the node works on it).
    Stale {
        /// Whether it acknowledges the attempt's assignment (not a refusal).
        acknowledge: bool,
    },
    /// An event of the current attempt that changes nothing: a refusal, a
    /// state the task is in already, or a task that ended (a task ends once)
    /// or waits in the queue.
    Unchanged {
        /// Whether it acknowledges the attempt's assignment (not a refusal).
        acknowledge: bool,
    },
    /// The current attempt moves the task forward: to `running`, or to its
    /// end.
    Advance(TaskUpdate),
    /// The current attempt failed with `agent_busy` and attempts remain: the
    /// task goes back to the queue for another node.
    Requeue(TaskUpdate),
    /// A `succeeded` or `failed` of the task's latest attempt from the node
    /// that ran it, while the task waits in the queue (the node was suspected,
    /// came back, and nothing else ran the task yet): the task ends with it
    /// instead of running again.
    LateResult(TaskUpdate),
}

/// How the task's and the attempt's rows change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskUpdate {
    /// The task's new state.
    pub status: TaskStatus,
    /// The state the attempt's row records.
    pub attempt_state: TaskState,
    /// What becomes of the task's output and failure fields.
    pub result: ResultUpdate,
    /// Which node the task is on afterwards.
    pub node: NodeAfter,
    /// Whether the attempt is over (the task ended or went back to the
    /// queue): it gets its finish time, and nothing is left to deliver, so the
    /// task's outbox rows go.
    pub attempt_ended: bool,
}

/// What becomes of the task's output and failure fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResultUpdate {
    /// The event's output and exit code; no failure.
    Output,
    /// The event's exit code, failure reason and message; no output.
    Failure,
    /// As they were.
    Keep,
}

/// Which node the task is on after an update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeAfter {
    /// The event's sender.
    Sender,
    /// None: the task waits in the queue.
    Cleared,
}

impl Reconciliation {
    /// Whether the event is recorded in the task's history.
    pub fn records_event(&self) -> bool {
        !matches!(self, Reconciliation::NotAssigned)
    }

    /// Whether the event acknowledges the attempt's assignment, so its outbox
    /// row goes: any recorded event but a refusal.
    pub fn acknowledges(&self) -> bool {
        match self {
            Reconciliation::NotAssigned => false,
            Reconciliation::Stale { acknowledge } | Reconciliation::Unchanged { acknowledge } => {
                *acknowledge
            }
            Reconciliation::Advance(_)
            | Reconciliation::Requeue(_)
            | Reconciliation::LateResult(_) => true,
        }
    }

    /// The change to apply to the task, if any.
    pub fn update(&self) -> Option<&TaskUpdate> {
        match self {
            Reconciliation::Advance(update)
            | Reconciliation::Requeue(update)
            | Reconciliation::LateResult(update) => Some(update),
            Reconciliation::NotAssigned
            | Reconciliation::Stale { .. }
            | Reconciliation::Unchanged { .. } => None,
        }
    }
}

/// Decides what `event` does to `task`. `assigned_node` is the node the
/// event's attempt was given to, if that attempt was ever made;
/// `max_attempts` bounds how often an `agent_busy` failure requeues.
///
/// A refusal (`rejected`) is history only: a forged assignment must not be
/// able to change a real task. States only move forward: a task that ended
/// stays ended.
pub fn reconcile(
    task: &TaskFacts<'_>,
    assigned_node: Option<&str>,
    event: &EventFacts<'_>,
    max_attempts: u32,
) -> Reconciliation {
    if assigned_node != Some(event.node) {
        return Reconciliation::NotAssigned;
    }
    let current = task.attempt == event.attempt && task.node == Some(event.node);
    if event.state == TaskState::Rejected {
        return if current {
            Reconciliation::Unchanged { acknowledge: false }
        } else {
            Reconciliation::Stale { acknowledge: false }
        };
    }
    if current {
        return match next_status(task.status, task.cancel_requested, event, max_attempts) {
            None => Reconciliation::Unchanged { acknowledge: true },
            Some(TaskStatus::Pending) => Reconciliation::Requeue(TaskUpdate {
                status: TaskStatus::Pending,
                attempt_state: TaskState::Failed,
                result: ResultUpdate::Keep,
                node: NodeAfter::Cleared,
                attempt_ended: true,
            }),
            Some(status) => Reconciliation::Advance(moved_to(status, event.state)),
        };
    }
    // The sender ran this attempt (checked above); it is the latest one and
    // nothing replaced it yet.
    let waits_for_it = task.status == TaskStatus::Pending
        && task.attempt == event.attempt
        && matches!(event.state, TaskState::Succeeded | TaskState::Failed);
    if !waits_for_it {
        return Reconciliation::Stale { acknowledge: true };
    }
    // Judged as if the attempt were still running; a late `agent_busy` would
    // only put the task back where it already is.
    match next_status(
        TaskStatus::Running,
        task.cancel_requested,
        event,
        max_attempts,
    ) {
        Some(status) if status.is_terminal() => {
            Reconciliation::LateResult(moved_to(status, event.state))
        }
        _ => Reconciliation::Stale { acknowledge: true },
    }
}

/// The update that moves the task to `status` (not `pending`) on the event's
/// sender, the attempt's row taking the event's state.
fn moved_to(status: TaskStatus, event_state: TaskState) -> TaskUpdate {
    TaskUpdate {
        status,
        attempt_state: event_state,
        result: match status {
            TaskStatus::Succeeded => ResultUpdate::Output,
            TaskStatus::Failed => ResultUpdate::Failure,
            _ => ResultUpdate::Keep,
        },
        node: NodeAfter::Sender,
        attempt_ended: status.is_terminal(),
    }
}

/// The task's next state after an event of its current attempt, or `None`
/// when the event changes nothing (a task already ended stays ended; one in
/// the queue waits for the scheduler).
fn next_status(
    status: TaskStatus,
    cancel_requested: bool,
    event: &EventFacts<'_>,
    max_attempts: u32,
) -> Option<TaskStatus> {
    if status.is_terminal() || status == TaskStatus::Pending {
        return None;
    }
    let next = match event.state {
        TaskState::Accepted | TaskState::Running => TaskStatus::Running,
        TaskState::Succeeded => TaskStatus::Succeeded,
        TaskState::Failed => {
            let busy = event.reason == Some(FailureReason::AgentBusy);
            if busy && event.attempt < max_attempts && !cancel_requested {
                TaskStatus::Pending
            } else {
                TaskStatus::Failed
            }
        }
        TaskState::Cancelled => TaskStatus::Cancelled,
        // Handled before: a refusal never changes the task.
        TaskState::Rejected => return None,
    };
    (next != status || next == TaskStatus::Pending).then_some(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    use FailureReason::{AgentBusy, Trap};
    use TaskState::{Accepted, Cancelled, Failed, Rejected, Running, Succeeded};

    const MAX: u32 = 3;

    fn task(status: TaskStatus, attempt: u32, node: Option<&str>) -> TaskFacts<'_> {
        TaskFacts {
            status,
            attempt,
            node,
            cancel_requested: false,
        }
    }

    fn cancel_requested(task: TaskFacts<'_>) -> TaskFacts<'_> {
        TaskFacts {
            cancel_requested: true,
            ..task
        }
    }

    fn event(node: &str, attempt: u32, state: TaskState) -> EventFacts<'_> {
        EventFacts {
            node,
            attempt,
            state,
            reason: None,
        }
    }

    fn failed(node: &str, attempt: u32, reason: FailureReason) -> EventFacts<'_> {
        EventFacts {
            reason: Some(reason),
            ..event(node, attempt, Failed)
        }
    }

    fn running(attempt_state: TaskState) -> TaskUpdate {
        TaskUpdate {
            status: TaskStatus::Running,
            attempt_state,
            result: ResultUpdate::Keep,
            node: NodeAfter::Sender,
            attempt_ended: false,
        }
    }

    fn ended(status: TaskStatus, attempt_state: TaskState, result: ResultUpdate) -> TaskUpdate {
        TaskUpdate {
            status,
            attempt_state,
            result,
            node: NodeAfter::Sender,
            attempt_ended: true,
        }
    }

    fn succeeded() -> TaskUpdate {
        ended(TaskStatus::Succeeded, Succeeded, ResultUpdate::Output)
    }

    fn failure() -> TaskUpdate {
        ended(TaskStatus::Failed, Failed, ResultUpdate::Failure)
    }

    fn cancelled() -> TaskUpdate {
        ended(TaskStatus::Cancelled, Cancelled, ResultUpdate::Keep)
    }

    fn requeued() -> TaskUpdate {
        TaskUpdate {
            status: TaskStatus::Pending,
            attempt_state: Failed,
            result: ResultUpdate::Keep,
            node: NodeAfter::Cleared,
            attempt_ended: true,
        }
    }

    const STALE: Reconciliation = Reconciliation::Stale { acknowledge: true };
    const STALE_REFUSAL: Reconciliation = Reconciliation::Stale { acknowledge: false };
    const UNCHANGED: Reconciliation = Reconciliation::Unchanged { acknowledge: true };
    const UNCHANGED_REFUSAL: Reconciliation = Reconciliation::Unchanged { acknowledge: false };

    /// One row: what is stored, who was given the attempt, the event, and
    /// what it must do.
    struct Row {
        name: &'static str,
        task: TaskFacts<'static>,
        assigned: Option<&'static str>,
        event: EventFacts<'static>,
        expected: Reconciliation,
    }

    fn row(
        name: &'static str,
        task: TaskFacts<'static>,
        assigned: Option<&'static str>,
        event: EventFacts<'static>,
        expected: Reconciliation,
    ) -> Row {
        Row {
            name,
            task,
            assigned,
            event,
            expected,
        }
    }

    // One row per line, so the table reads as a table.
    #[rustfmt::skip]
    fn rows() -> Vec<Row> {
        use Reconciliation::{Advance, LateResult, NotAssigned, Requeue};
        use TaskStatus as S;
        let n1 = Some("n1");
        let n2 = Some("n2");
        vec![
            // Events from a node never given the attempt.
            row("attempt never made", task(S::Assigned, 1, n1), None, event("n1", 2, Running), NotAssigned),
            row("another node's attempt", task(S::Assigned, 1, n1), n1, event("n2", 1, Succeeded), NotAssigned),
            row("another node's refusal", task(S::Assigned, 1, n1), n1, event("n2", 1, Rejected), NotAssigned),
            row("a task in the queue, attempt never made", task(S::Pending, 0, None), None, event("n1", 1, Succeeded), NotAssigned),
            row("an ended task, another node", task(S::Succeeded, 1, n1), n1, event("n2", 1, Failed), NotAssigned),
            // Refusals: history only.
            row("refusal of the current attempt", task(S::Assigned, 1, n1), n1, event("n1", 1, Rejected), UNCHANGED_REFUSAL),
            row("refusal of a running attempt", task(S::Running, 1, n1), n1, event("n1", 1, Rejected), UNCHANGED_REFUSAL),
            row("refusal after the end", task(S::Succeeded, 1, n1), n1, event("n1", 1, Rejected), UNCHANGED_REFUSAL),
            row("refusal of a replaced attempt", task(S::Assigned, 2, n2), n1, event("n1", 1, Rejected), STALE_REFUSAL),
            row("refusal while the task waits", task(S::Pending, 1, None), n1, event("n1", 1, Rejected), STALE_REFUSAL),
            // The current attempt moves forward.
            row("assigned, accepted", task(S::Assigned, 1, n1), n1, event("n1", 1, Accepted), Advance(running(Accepted))),
            row("assigned, running", task(S::Assigned, 1, n1), n1, event("n1", 1, Running), Advance(running(Running))),
            row("running, running again", task(S::Running, 1, n1), n1, event("n1", 1, Running), UNCHANGED),
            row("running, accepted late", task(S::Running, 1, n1), n1, event("n1", 1, Accepted), UNCHANGED),
            row("running, succeeded", task(S::Running, 1, n1), n1, event("n1", 1, Succeeded), Advance(succeeded())),
            row("assigned, succeeded at once", task(S::Assigned, 1, n1), n1, event("n1", 1, Succeeded), Advance(succeeded())),
            row("running, failed without reason", task(S::Running, 1, n1), n1, event("n1", 1, Failed), Advance(failure())),
            row("running, trapped", task(S::Running, 1, n1), n1, failed("n1", 1, Trap), Advance(failure())),
            row("running, cancelled", task(S::Running, 1, n1), n1, event("n1", 1, Cancelled), Advance(cancelled())),
            row("assigned, cancelled", task(S::Assigned, 1, n1), n1, event("n1", 1, Cancelled), Advance(cancelled())),
            row("cancel requested, cancelled", cancel_requested(task(S::Running, 2, n1)), n1, event("n1", 2, Cancelled), Advance(cancelled())),
            row("cancel requested, succeeded anyway", cancel_requested(task(S::Running, 1, n1)), n1, event("n1", 1, Succeeded), Advance(succeeded())),
            // agent_busy: requeue while attempts remain.
            row("busy, attempts left", task(S::Running, 1, n1), n1, failed("n1", 1, AgentBusy), Requeue(requeued())),
            row("busy before running", task(S::Assigned, 2, n1), n1, failed("n1", 2, AgentBusy), Requeue(requeued())),
            row("busy on the last attempt", task(S::Running, MAX, n1), n1, failed("n1", MAX, AgentBusy), Advance(failure())),
            row("busy past the last attempt", task(S::Running, MAX + 1, n1), n1, failed("n1", MAX + 1, AgentBusy), Advance(failure())),
            row("busy with a cancel requested", cancel_requested(task(S::Running, 1, n1)), n1, failed("n1", 1, AgentBusy), Advance(failure())),
            // A task ends once.
            row("succeeded, then failed", task(S::Succeeded, 1, n1), n1, event("n1", 1, Failed), UNCHANGED),
            row("failed, then succeeded", task(S::Failed, 1, n1), n1, event("n1", 1, Succeeded), UNCHANGED),
            row("cancelled, then succeeded", task(S::Cancelled, 1, n1), n1, event("n1", 1, Succeeded), UNCHANGED),
            row("succeeded, then running", task(S::Succeeded, 1, n1), n1, event("n1", 1, Running), UNCHANGED),
            row("succeeded, then busy", task(S::Succeeded, 1, n1), n1, failed("n1", 1, AgentBusy), UNCHANGED),
            row("in the queue on the sender", task(S::Pending, 1, n1), n1, event("n1", 1, Succeeded), UNCHANGED),
            // Stale attempts: history only.
            row("replaced attempt running", task(S::Assigned, 2, n2), n1, event("n1", 1, Running), STALE),
            row("replaced attempt accepted", task(S::Running, 2, n2), n1, event("n1", 1, Accepted), STALE),
            row("replaced attempt succeeded", task(S::Running, 2, n2), n1, event("n1", 1, Succeeded), STALE),
            row("older attempt on the same node", task(S::Running, 2, n1), n1, event("n1", 1, Succeeded), STALE),
            row("replaced attempt after the end", task(S::Succeeded, 2, n2), n1, event("n1", 1, Succeeded), STALE),
            row("forwarded to another site", task(S::Running, 1, None), n1, event("n1", 1, Succeeded), STALE),
            // Late results of a suspected node while the task waits.
            row("late success", task(S::Pending, 1, None), n1, event("n1", 1, Succeeded), LateResult(succeeded())),
            row("late failure", task(S::Pending, 2, None), n1, failed("n1", 2, Trap), LateResult(failure())),
            row("late failure without reason", task(S::Pending, 1, None), n1, event("n1", 1, Failed), LateResult(failure())),
            row("late busy, attempts left", task(S::Pending, 1, None), n1, failed("n1", 1, AgentBusy), STALE),
            row("late busy, none left", task(S::Pending, MAX, None), n1, failed("n1", MAX, AgentBusy), LateResult(failure())),
            row("late busy, cancel requested", cancel_requested(task(S::Pending, 1, None)), n1, failed("n1", 1, AgentBusy), LateResult(failure())),
            row("late running", task(S::Pending, 1, None), n1, event("n1", 1, Running), STALE),
            row("late accepted", task(S::Pending, 1, None), n1, event("n1", 1, Accepted), STALE),
            row("late cancelled", task(S::Pending, 1, None), n1, event("n1", 1, Cancelled), STALE),
            row("late result of an older attempt", task(S::Pending, 2, None), n1, event("n1", 1, Succeeded), STALE),
        ]
    }

    #[test]
    fn every_transition_matches_its_row() {
        let mut wrong = Vec::new();
        for row in rows() {
            let got = reconcile(&row.task, row.assigned, &row.event, MAX);
            if got != row.expected {
                wrong.push(format!(
                    "{}: expected {:?}, got {got:?}",
                    row.name, row.expected
                ));
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    #[test]
    fn the_helpers_agree_with_the_verdicts() {
        for row in rows() {
            let got = reconcile(&row.task, row.assigned, &row.event, MAX);
            assert_eq!(
                got.records_event(),
                got != Reconciliation::NotAssigned,
                "{}",
                row.name
            );
            assert_eq!(
                got.acknowledges(),
                got.records_event() && row.event.state != Rejected,
                "{}",
                row.name
            );
            if let Some(update) = got.update() {
                assert_eq!(
                    update.status == TaskStatus::Pending,
                    matches!(got, Reconciliation::Requeue(_)),
                    "{}",
                    row.name
                );
            }
        }
    }

    /// Every combination of stored state and event, beyond the table.
    fn every_case() -> Vec<(
        TaskFacts<'static>,
        Option<&'static str>,
        EventFacts<'static>,
    )> {
        let states = [Accepted, Running, Succeeded, Failed, Cancelled, Rejected];
        let reasons = [None, Some(AgentBusy), Some(Trap)];
        let nodes = [None, Some("n1"), Some("n2")];
        let mut cases = Vec::new();
        for status in TaskStatus::ALL {
            for task_attempt in 0..=MAX + 1 {
                for task_node in nodes {
                    for cancel in [false, true] {
                        for assigned in nodes {
                            for event_attempt in 1..=MAX + 1 {
                                for state in states {
                                    for reason in reasons {
                                        let task = TaskFacts {
                                            status,
                                            attempt: task_attempt,
                                            node: task_node,
                                            cancel_requested: cancel,
                                        };
                                        let event = EventFacts {
                                            node: "n1",
                                            attempt: event_attempt,
                                            state,
                                            reason,
                                        };
                                        cases.push((task, assigned, event));
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        cases
    }

    #[test]
    fn an_ended_task_never_changes_and_a_refusal_changes_nothing() {
        for (task, assigned, event) in every_case() {
            let got = reconcile(&task, assigned, &event, MAX);
            if task.status.is_terminal() || event.state == Rejected {
                assert_eq!(got.update(), None, "{task:?} {assigned:?} {event:?}");
            }
            if assigned != Some(event.node) {
                assert_eq!(got, Reconciliation::NotAssigned, "{task:?} {event:?}");
            }
        }
    }

    #[test]
    fn only_the_current_attempt_or_a_waiting_task_changes() {
        for (task, assigned, event) in every_case() {
            let got = reconcile(&task, assigned, &event, MAX);
            let Some(update) = got.update() else {
                continue;
            };
            let current = task.attempt == event.attempt && task.node == Some(event.node);
            let waiting = task.status == TaskStatus::Pending && task.attempt == event.attempt;
            assert!(current || waiting, "{task:?} {event:?} gave {got:?}");
            // A requeue only while attempts remain; an ended attempt finishes.
            if update.status == TaskStatus::Pending {
                assert!(
                    event.attempt < MAX && !task.cancel_requested,
                    "{task:?} {event:?}"
                );
            }
            assert_eq!(
                update.attempt_ended,
                update.status.is_terminal() || update.status == TaskStatus::Pending
            );
            assert_ne!(update.status, task.status, "{task:?} {event:?}");
        }
    }
}
