//! Placements: a scheduling round's decisions recorded together, in one
//! transaction (one commit, one fence check), each with its attempt row and
//! its outbox row.

use super::{check_term, to_db, with_pool, Backend, Store, StoreError};
use crate::live::task_change;
use crate::task::TaskStatus;
use starling_api::TaskChange;

/// Most placements written by one statement: 6 parameters each, well
/// under SQLite's 32,766 and PostgreSQL's 65,535 per statement.
const CHUNK: usize = 500;

/// `rows` rows of `columns` numbered placeholders for a `VALUES` list, the
/// first numbered `first`: `($3, $4), ($5, $6)`.
fn placeholders(rows: usize, columns: usize, first: usize) -> String {
    (0..rows)
        .map(|row| {
            let cells: Vec<String> = (0..columns)
                .map(|column| format!("${}", first + row * columns + column))
                .collect();
            format!("({})", cells.join(", "))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// One task placed on one node, as the scheduler decided it.
#[derive(Debug, Clone, PartialEq)]
pub struct Placement {
    /// The task.
    pub task_id: String,
    /// The attempt it gets (the one it had plus one).
    pub attempt: u32,
    /// The node.
    pub node_id: String,
    /// The power level chosen with the node.
    pub power_level: u8,
    /// Why (the policy's explanation, stored with the task and the attempt).
    pub explanation: serde_json::Value,
}

/// What [`Store::assign_tasks`] recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    /// For each placement in order: whether it was recorded (false: the task
    /// was no longer pending at that attempt, cancelled or placed meanwhile).
    pub assigned: Vec<bool>,
    /// The leader's term it was recorded under (none without replicas), for
    /// the assignments sent.
    pub term: Option<u64>,
}

impl Store {
    /// Records `placements` in one transaction: each pending task gets its
    /// attempt on its node (state `assigned`), an attempt row (with the
    /// leader's term) and an outbox row. With `first_send_claimed_until`, the
    /// outbox rows say their first send is already claimed (one send, next
    /// due then): the caller sends each assignment right after the commit,
    /// and if it dies first, the outbox sends it at that time. Without, the
    /// rows are due now and never sent. Fenced like every leader-only write.
    pub async fn assign_tasks(
        &self,
        placements: &[Placement],
        now_ms: u64,
        first_send_claimed_until: Option<u64>,
    ) -> Result<Placed, StoreError> {
        let fence = self.fence()?;
        let (next_send_ms, sends) = match first_send_claimed_until {
            Some(until) => (until, 1_i64),
            None => (now_ms, 0),
        };
        let explanations: Vec<String> = placements
            .iter()
            .map(|placement| placement.explanation.to_string())
            .collect();
        let mut assigned = vec![false; placements.len()];
        with_pool!(self, pool => {
            let mut tx = pool.begin().await?;
            check_term!(tx, fence);
            // A few statements per chunk rather than three per placement:
            // each is a round trip, and on a busy host a round trip is
            // a wait for the CPU, so a round's placements took a second.
            for (chunk, start) in placements.chunks(CHUNK).zip((0..).step_by(CHUNK)) {
                let explanations = &explanations[start..start + chunk.len()];
                let update = format!(
                    "UPDATE tasks SET state = 'assigned', attempt = v.column2, node_id = v.column3, \
                     power_level = v.column4, explanation = v.column5, updated_ms = $1 \
                     FROM (VALUES {}) AS v \
                     WHERE tasks.id = v.column1 AND tasks.state = 'pending' AND tasks.attempt = v.column6 \
                     RETURNING id",
                    placeholders(chunk.len(), 6, 2)
                );
                let mut query = sqlx::query_scalar::<_, String>(&update).bind(to_db(now_ms));
                for (placement, explanation) in chunk.iter().zip(explanations) {
                    query = query
                        .bind(&placement.task_id)
                        .bind(i64::from(placement.attempt))
                        .bind(&placement.node_id)
                        .bind(i64::from(placement.power_level))
                        .bind(explanation)
                        .bind(i64::from(placement.attempt.saturating_sub(1)));
                }
                let updated: std::collections::HashSet<String> =
                    query.fetch_all(&mut *tx).await?.into_iter().collect();
                let placed: Vec<(&Placement, &String)> = chunk
                    .iter()
                    .zip(explanations)
                    .filter(|(placement, _)| updated.contains(&placement.task_id))
                    .collect();
                for (offset, placement) in chunk.iter().enumerate() {
                    assigned[start + offset] = updated.contains(&placement.task_id);
                }
                if placed.is_empty() {
                    continue;
                }
                let attempts = format!(
                    "INSERT INTO attempts (task_id, attempt, node_id, power_level, assigned_ms, state, explanation, epoch) \
                     SELECT column1, column2, column3, column4, $1, 'assigned', column5, $2 FROM (VALUES {}) AS v",
                    placeholders(placed.len(), 5, 3)
                );
                let mut query = sqlx::query(&attempts)
                    .bind(to_db(now_ms))
                    .bind(fence.map(to_db));
                for (placement, explanation) in &placed {
                    query = query
                        .bind(&placement.task_id)
                        .bind(i64::from(placement.attempt))
                        .bind(&placement.node_id)
                        .bind(i64::from(placement.power_level))
                        .bind(*explanation);
                }
                query.execute(&mut *tx).await?;
                let outbox = format!(
                    "INSERT INTO outbox (task_id, attempt, node_id, next_send_ms, sends) \
                     SELECT column1, column2, column3, $1, $2 FROM (VALUES {}) AS v",
                    placeholders(placed.len(), 3, 3)
                );
                let mut query = sqlx::query(&outbox).bind(to_db(next_send_ms)).bind(sends);
                for (placement, _) in &placed {
                    query = query
                        .bind(&placement.task_id)
                        .bind(i64::from(placement.attempt))
                        .bind(&placement.node_id);
                }
                query.execute(&mut *tx).await?;
            }
            tx.commit().await?;
            Ok::<(), sqlx::Error>(())
        })?;
        for (placement, _) in placements.iter().zip(&assigned).filter(|(_, a)| **a) {
            self.announce(TaskChange {
                power_level: Some(placement.power_level),
                ..task_change(
                    &placement.task_id,
                    TaskStatus::Assigned,
                    placement.attempt,
                    Some(&placement.node_id),
                    now_ms,
                )
            });
        }
        Ok(Placed {
            assigned,
            term: fence,
        })
    }
}
