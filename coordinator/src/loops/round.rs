//! One scheduling round's decisions turned into steps, without I/O: for each
//! decision of the policy, place it on a node, hold it, or (federated, and
//! the engine says a peer finishes it in time where this site does not)
//! forward it. The scheduler loop reads the store, asks the policy, walks
//! the steps and writes them; this module only decides, so a round over a
//! fixed cluster view is a unit test.

use starling_placement::federation::{commit, route, RemoteSite, Route};
use starling_placement::{Decision, Outcome, PendingTask};
use starling_proto::NodeId;

use crate::cluster_view::ViewNode;
use crate::store::TaskRecord;

/// What to do with one decision.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Step {
    /// Assign `attempt` of pending task `task` to `node_id` at `power_level`.
    Place {
        /// Index into the round's pending tasks.
        task: usize,
        /// The node chosen.
        node_id: NodeId,
        /// The new attempt's number.
        attempt: u32,
        /// The power level chosen with it.
        power_level: u8,
        /// Why, as stored with the task.
        explanation: serde_json::Value,
    },
    /// Keep the task pending and record why.
    Hold {
        /// Index into the round's pending tasks.
        task: usize,
        /// Why, as stored with the task.
        explanation: serde_json::Value,
    },
    /// Send `attempt` of the task to the peer site `site` (index into the
    /// round's sites); confirm with [`Round::forwarded`] once recorded.
    Forward {
        /// Index into the round's pending tasks.
        task: usize,
        /// Index into the round's sites.
        site: usize,
        /// The site's name.
        name: String,
        /// Its REST API.
        api_url: String,
        /// The new attempt's number.
        attempt: u32,
        /// Why, as stored with the task.
        explanation: serde_json::Value,
    },
    /// A decision about a task or node the policy was not given: ignored.
    Invalid(&'static str),
}

/// One round's state: the peers' digests, charged as work is forwarded to
/// them so one round does not overfill a peer.
#[derive(Debug, Clone)]
pub(crate) struct Round {
    sites: Vec<RemoteSite>,
    now_ms: u64,
}

impl Round {
    /// A round at `now_ms` with these live peers (none when not federated).
    pub(crate) fn new(sites: Vec<RemoteSite>, now_ms: u64) -> Self {
        Self { sites, now_ms }
    }

    /// Whether `record` may go to another site: there are peers, and it was
    /// not forwarded here (one hop, no loops).
    pub(crate) fn may_forward(&self, record: &TaskRecord) -> bool {
        !self.sites.is_empty() && record.origin.is_none()
    }

    /// The step for `decision`. `excluded` names the sites this task was
    /// taken back from, which are not tried again for it.
    pub(crate) fn step(
        &self,
        decision: &Decision,
        pending: &[TaskRecord],
        queue: &[PendingTask],
        nodes: &[ViewNode],
        excluded: &[String],
    ) -> Step {
        let Some(index) = usize::try_from(decision.task_key)
            .ok()
            .filter(|&index| index < pending.len() && index < queue.len())
        else {
            return Step::Invalid("policy decided on a task it was not given");
        };
        let record = &pending[index];
        if self.may_forward(record) {
            if let Some(step) = self.forward(index, record, &queue[index], decision, excluded) {
                return step;
            }
        }
        let explanation = serde_json::to_value(&decision.explanation)
            .unwrap_or_else(|error| serde_json::json!({ "error": error.to_string() }));
        match decision.outcome {
            Outcome::Place { node, power_level } => match nodes.get(node) {
                Some(view_node) => Step::Place {
                    task: index,
                    node_id: view_node.id.clone(),
                    attempt: record.attempt + 1,
                    power_level,
                    explanation,
                },
                None => Step::Invalid("policy chose a node outside the view"),
            },
            Outcome::Hold { .. } => Step::Hold {
                task: index,
                explanation,
            },
        }
    }

    /// The forward the engine routes this task to, if any.
    fn forward(
        &self,
        index: usize,
        record: &TaskRecord,
        task: &PendingTask,
        decision: &Decision,
        excluded: &[String],
    ) -> Option<Step> {
        let candidates: Vec<usize> = (0..self.sites.len())
            .filter(|&i| {
                !excluded
                    .iter()
                    .any(|site| site == self.sites[i].digest.site.as_str())
            })
            .collect();
        let offered: Vec<RemoteSite> = candidates.iter().map(|&i| self.sites[i].clone()).collect();
        let Route::Forward {
            site,
            finish_ms,
            summary,
        } = route(task, self.now_ms, decision, &offered)
        else {
            tracing::debug!(
                task = %record.spec.id,
                deadline = ?task.deadline_ms,
                local = ?decision.explanation.alternatives.first().and_then(|a| a.finish_ms),
                "stays here"
            );
            return None;
        };
        let chosen = &self.sites[candidates[site]];
        let name = chosen.digest.site.to_string();
        // The local decision's node counts at the top level too, so a
        // forwarded task's explanation reads like any other's (how many
        // nodes here were looked at, and why they were ruled out).
        let explanation = serde_json::json!({
            "policy": decision.explanation.policy,
            "summary": summary,
            "considered": decision.explanation.considered,
            "filtered": decision.explanation.filtered,
            "forwarded_to": name,
            "estimated_finish_ms": finish_ms,
            "local": decision.explanation,
        });
        Some(Step::Forward {
            task: index,
            site: candidates[site],
            name,
            api_url: chosen.digest.api_url.to_string(),
            attempt: record.attempt + 1,
            explanation,
        })
    }

    /// Charges a forward the store recorded to its site's digest.
    pub(crate) fn forwarded(&mut self, site: usize, task: &PendingTask) {
        if let Some(chosen) = self.sites.get_mut(site) {
            commit(chosen, task);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use starling_placement::catalog::policy_by_name;
    use starling_placement::federation::{site_capacity, InterSiteLink};
    use starling_placement::testing::node;
    use starling_placement::ClusterView;
    use starling_proto::{ClassCapacity, SiteId, WorkClass};

    use super::*;
    use crate::cluster_view::{assemble, Snapshot};

    const NOW: u64 = 100_000;

    fn record(id: &str, cores: f32, work_seconds: f64, deadline_in_ms: Option<u64>) -> TaskRecord {
        let mut task = TaskRecord {
            updated_ms: NOW - 1_000,
            ..TaskRecord::sample(id)
        };
        task.spec.demand.cpu_cores = cores;
        task.spec.work_seconds = work_seconds;
        task.spec.deadline_unix_ms = deadline_in_ms.map(|ms| NOW + ms);
        task.spec.created_ms = NOW - 1_000;
        task
    }

    /// A fixed cluster: `fast` (4 cores at full speed) and `slow` (2 cores
    /// at a quarter speed), nothing in flight.
    fn snapshot(pending: Vec<TaskRecord>) -> Snapshot {
        let view = ClusterView {
            now_ms: NOW,
            nodes: vec![node("fast", 4.0, 1.0), node("slow", 2.0, 0.25)],
        };
        let ids = view
            .nodes
            .iter()
            .map(|node| ViewNode {
                id: node.id.clone(),
                telemetry_received_ms: Some(NOW),
            })
            .collect();
        assemble(view, ids, &[], pending)
    }

    /// A peer with `free_slots` full-speed CPU slots and no wait, 20 ms away.
    fn peer(name: &str, free_slots: u16) -> RemoteSite {
        let empty = ClusterView {
            now_ms: NOW,
            nodes: vec![node("peer", 4.0, 1.0)],
        };
        let mut capacity = site_capacity(&empty, &[]);
        capacity.classes.clear();
        capacity
            .classes
            .push(ClassCapacity {
                class: WorkClass::Cpu,
                free_slots,
                speed: 1.0,
                wait_ms: 0,
            })
            .unwrap();
        RemoteSite {
            digest: capacity
                .into_digest(SiteId::new(name).unwrap(), 1, "http://127.0.0.1:1", &[])
                .unwrap(),
            link: InterSiteLink {
                rtt_ms: 20.0,
                bandwidth_mbps: 100.0,
            },
        }
    }

    /// Runs the heuristic over the snapshot and steps every decision, as
    /// the scheduler does, confirming every forward.
    fn run(snapshot: &Snapshot, round: &mut Round, excluded: &[String]) -> Vec<Step> {
        let mut policy = policy_by_name("heuristic", 42).unwrap();
        let decisions = policy.decide(&snapshot.view, &snapshot.queue);
        let mut steps = Vec::new();
        for decision in decisions {
            let step = round.step(
                &decision,
                &snapshot.pending,
                &snapshot.queue,
                &snapshot.ids,
                excluded,
            );
            if let Step::Forward { task, site, .. } = &step {
                round.forwarded(*site, &snapshot.queue[*task]);
            }
            steps.push(step);
        }
        steps
    }

    fn placed_on(steps: &[Step], task: usize) -> Option<(String, u32)> {
        steps.iter().find_map(|step| match step {
            Step::Place {
                task: placed,
                node_id,
                attempt,
                ..
            } if *placed == task => Some((node_id.to_string(), *attempt)),
            _ => None,
        })
    }

    #[test]
    fn a_round_places_work_on_the_node_that_finishes_it_first() {
        let snapshot = snapshot(vec![record("t0", 1.0, 2.0, None)]);
        let steps = run(&snapshot, &mut Round::new(Vec::new(), NOW), &[]);
        assert_eq!(placed_on(&steps, 0), Some(("fast".to_string(), 1)));
        let Step::Place { explanation, .. } = &steps[0] else {
            panic!("{steps:?}")
        };
        assert_eq!(explanation["policy"], "heuristic");
        assert_eq!(explanation["considered"], 2, "{explanation}");
        assert_eq!(explanation["filtered"], serde_json::json!([]));
    }

    #[test]
    fn a_task_no_node_can_hold_is_held_with_its_reason() {
        // 64 GiB of memory: more than either node has (a hard filter).
        let mut huge = record("huge", 1.0, 1.0, None);
        huge.spec.demand.memory_mb = 64 * 1024;
        let snapshot = snapshot(vec![huge]);
        let steps = run(&snapshot, &mut Round::new(Vec::new(), NOW), &[]);
        match &steps[..] {
            [Step::Hold {
                task: 0,
                explanation,
            }] => {
                assert!(explanation["summary"].as_str().is_some(), "{explanation}");
                // Both nodes ruled out for memory, named.
                assert_eq!(explanation["considered"], 2, "{explanation}");
                assert_eq!(
                    explanation["filtered"],
                    serde_json::json!([{"reason": "memory", "count": 2, "nodes": ["fast", "slow"]}])
                );
            }
            other => panic!("expected a hold, got {other:?}"),
        }
    }

    #[test]
    fn work_late_here_goes_to_a_peer_in_time_until_its_slots_are_charged() {
        // 10 s of work due in 15 s, behind a minute of backlog on every
        // local node; the peer has a free full-speed slot.
        let mut late = snapshot(vec![
            record("a", 1.0, 10.0, Some(15_000)),
            record("b", 1.0, 10.0, Some(15_000)),
        ]);
        // Both local nodes are saturated: 60 s of backlog each.
        for node in &mut late.view.nodes {
            node.load.free_cpu_cores = 0.0;
            node.load.backlog_cpu_s = 60.0 * node.cpu_cores;
            node.load.queued_tasks = 8;
        }
        let mut round = Round::new(vec![peer("site-b", 1)], NOW);
        let steps = run(&late, &mut round, &[]);
        let forwarded: Vec<&Step> = steps
            .iter()
            .filter(|step| matches!(step, Step::Forward { .. }))
            .collect();
        assert_eq!(forwarded.len(), 1, "one free slot at the peer: {steps:?}");
        let Step::Forward {
            name,
            attempt,
            explanation,
            ..
        } = forwarded[0]
        else {
            unreachable!()
        };
        assert_eq!((name.as_str(), *attempt), ("site-b", 1));
        assert_eq!(explanation["forwarded_to"], "site-b");
        // What the local policy looked at travels with the forward.
        assert_eq!(explanation["considered"], 2, "{explanation}");
        assert_eq!(explanation["filtered"], serde_json::json!([]));
        assert_eq!(explanation["local"]["considered"], 2, "{explanation}");
    }

    #[test]
    fn no_second_hop_and_no_return_to_a_site_that_gave_the_task_back() {
        let mut late = snapshot(vec![record("a", 1.0, 10.0, Some(15_000))]);
        for node in &mut late.view.nodes {
            node.load.free_cpu_cores = 0.0;
            node.load.backlog_cpu_s = 60.0 * node.cpu_cores;
            node.load.queued_tasks = 8;
        }
        // Taken back from site-b before: it stays here.
        let mut round = Round::new(vec![peer("site-b", 4)], NOW);
        let steps = run(&late, &mut round, &["site-b".to_string()]);
        assert!(
            !steps
                .iter()
                .any(|step| matches!(step, Step::Forward { .. })),
            "{steps:?}"
        );
        // Forwarded here by another site: never forwarded on.
        late.pending[0].origin = Some(("site-c".into(), "x".into()));
        let mut round = Round::new(vec![peer("site-b", 4)], NOW);
        assert!(!round.may_forward(&late.pending[0]));
        let steps = run(&late, &mut round, &[]);
        assert!(
            !steps
                .iter()
                .any(|step| matches!(step, Step::Forward { .. })),
            "{steps:?}"
        );
    }

    #[test]
    fn decisions_outside_the_round_are_refused_not_applied() {
        let snapshot = snapshot(vec![record("t0", 1.0, 1.0, None)]);
        let round = Round::new(Vec::new(), NOW);
        let mut policy = policy_by_name("heuristic", 42).unwrap();
        let mut decision = policy.decide(&snapshot.view, &snapshot.queue).remove(0);
        decision.task_key = 9;
        assert!(matches!(
            round.step(
                &decision,
                &snapshot.pending,
                &snapshot.queue,
                &snapshot.ids,
                &[]
            ),
            Step::Invalid(_)
        ));
        decision.task_key = 0;
        decision.outcome = starling_placement::Outcome::Place {
            node: 5,
            power_level: 0,
        };
        assert!(matches!(
            round.step(
                &decision,
                &snapshot.pending,
                &snapshot.queue,
                &snapshot.ids,
                &[]
            ),
            Step::Invalid(_)
        ));
    }
}
