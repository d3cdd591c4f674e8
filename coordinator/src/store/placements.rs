//! Placements: a scheduling round's decisions recorded together, in one
//! transaction (one commit, one fence check), each with its attempt row and
//! its outbox row.

use super::{check_term, to_db, with_pool, Backend, Store, StoreError};
use crate::live::task_change;
use crate::task::TaskStatus;
use starling_api::TaskChange;

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
        let update =
            "UPDATE tasks SET state = 'assigned', attempt = $2, node_id = $3, power_level = $4, \
             explanation = $5, updated_ms = $6 \
             WHERE id = $1 AND state = 'pending' AND attempt = $7";
        let insert = "INSERT INTO attempts (task_id, attempt, node_id, power_level, assigned_ms, state, explanation, epoch) \
                      VALUES ($1, $2, $3, $4, $5, 'assigned', $6, $7)";
        let outbox = "INSERT INTO outbox (task_id, attempt, node_id, next_send_ms, sends) \
                      VALUES ($1, $2, $3, $4, $5)";
        let (next_send_ms, sends) = match first_send_claimed_until {
            Some(until) => (until, 1_i64),
            None => (now_ms, 0),
        };
        let explanations: Vec<String> = placements
            .iter()
            .map(|placement| placement.explanation.to_string())
            .collect();
        let assigned = with_pool!(self, pool => {
            let mut tx = pool.begin().await?;
            check_term!(tx, fence);
            let mut assigned = Vec::with_capacity(placements.len());
            for (placement, explanation) in placements.iter().zip(&explanations) {
                let updated = sqlx::query(update)
                    .bind(&placement.task_id)
                    .bind(i64::from(placement.attempt))
                    .bind(&placement.node_id)
                    .bind(i64::from(placement.power_level))
                    .bind(explanation)
                    .bind(to_db(now_ms))
                    .bind(i64::from(placement.attempt.saturating_sub(1)))
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                if updated != 1 {
                    assigned.push(false);
                    continue;
                }
                sqlx::query(insert)
                    .bind(&placement.task_id)
                    .bind(i64::from(placement.attempt))
                    .bind(&placement.node_id)
                    .bind(i64::from(placement.power_level))
                    .bind(to_db(now_ms))
                    .bind(explanation)
                    .bind(fence.map(to_db))
                    .execute(&mut *tx)
                    .await?;
                sqlx::query(outbox)
                    .bind(&placement.task_id)
                    .bind(i64::from(placement.attempt))
                    .bind(&placement.node_id)
                    .bind(to_db(next_send_ms))
                    .bind(sends)
                    .execute(&mut *tx)
                    .await?;
                assigned.push(true);
            }
            tx.commit().await?;
            Ok::<Vec<bool>, sqlx::Error>(assigned)
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
