//! The bounded history of live events, as a plain structure: events in,
//! numbered; reads from a client's cursor out, filtered, or word that the
//! cursor fell off the end. No locks, no clock, no tasks: [`super::Feed`]
//! wraps it in a mutex and wakes readers.

use std::collections::VecDeque;
use std::sync::Arc;

use starling_api::{EventKind, LiveEvent, StreamPosition};

/// One event as every client receives it: numbered, and encoded once.
#[derive(Debug)]
pub(crate) struct Stamped {
    /// Where it stands in the stream.
    pub(crate) position: StreamPosition,
    /// The event.
    pub(crate) event: LiveEvent,
    /// The event as JSON, written once for all clients.
    pub(crate) json: String,
}

/// Which events a client wants. Empty parts match everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Filter {
    /// Only these kinds; `None` for all.
    pub(crate) kinds: Option<Vec<EventKind>>,
    /// Only events of this task.
    pub(crate) task: Option<String>,
    /// Only events of this node (its own changes, telemetry, and the task
    /// changes of attempts on it).
    pub(crate) node: Option<String>,
}

impl Filter {
    /// Whether `event` passes.
    pub(crate) fn matches(&self, event: &LiveEvent) -> bool {
        if let Some(kinds) = &self.kinds {
            if !kinds.contains(&event.kind()) {
                return false;
            }
        }
        if let Some(task) = &self.task {
            if event.task_id() != Some(task.as_str()) {
                return false;
            }
        }
        if let Some(node) = &self.node {
            if event.node_id() != Some(node.as_str()) {
                return false;
            }
        }
        true
    }
}

/// What a read from a cursor found.
#[derive(Debug)]
pub(crate) enum Read {
    /// Events past the cursor that pass the filter (possibly none), and the
    /// cursor to read from next.
    Events(Vec<Arc<Stamped>>, u64),
    /// Events past the cursor were dropped from the ring before this
    /// client read them.
    Behind,
}

/// The last `capacity` events of this coordinator's run.
#[derive(Debug)]
pub(crate) struct Ring {
    boot: u64,
    capacity: usize,
    events: VecDeque<Arc<Stamped>>,
    /// The number of the newest event; 0 before the first.
    latest: u64,
}

impl Ring {
    /// An empty ring for the run `boot`, holding at most `capacity` events
    /// (at least one).
    pub(crate) fn new(boot: u64, capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Ring {
            boot,
            capacity,
            events: VecDeque::with_capacity(capacity.min(4096)),
            latest: 0,
        }
    }

    /// The number of the newest event (0 before the first).
    pub(crate) fn latest(&self) -> u64 {
        self.latest
    }

    /// The run this ring numbers events for.
    #[cfg(test)]
    pub(crate) fn boot(&self) -> u64 {
        self.boot
    }

    /// Appends an event, dropping the oldest past capacity; returns its
    /// number.
    pub(crate) fn push(&mut self, event: LiveEvent) -> u64 {
        self.latest += 1;
        // Serialising plain data cannot fail (no maps with non-string keys,
        // no custom Serialize); an empty object keeps the stream well-formed
        // if that ever changes.
        let json = serde_json::to_string(&event).unwrap_or_else(|_| "{}".to_owned());
        if self.events.len() == self.capacity {
            self.events.pop_front();
        }
        self.events.push_back(Arc::new(Stamped {
            position: StreamPosition {
                boot: self.boot,
                seq: self.latest,
            },
            event,
            json,
        }));
        self.latest
    }

    /// Where a client resuming from `position` starts: its cursor, or `None`
    /// when the position is from another run, from the future, or older
    /// than what the ring still holds (events in between are lost).
    pub(crate) fn resume(&self, position: StreamPosition) -> Option<u64> {
        if position.boot != self.boot || position.seq > self.latest {
            return None;
        }
        (position.seq >= self.first().saturating_sub(1)).then_some(position.seq)
    }

    /// The number of the oldest event held (`latest + 1` when empty).
    fn first(&self) -> u64 {
        self.events
            .front()
            .map_or(self.latest + 1, |stamped| stamped.position.seq)
    }

    /// Up to `max` events after `cursor` that pass `filter`.
    pub(crate) fn read(&self, cursor: u64, filter: &Filter, max: usize) -> Read {
        if cursor + 1 < self.first() {
            return Read::Behind;
        }
        // Events are numbered without gaps, so the cursor's successor sits
        // at a known offset.
        let skip = usize::try_from(cursor + 1 - self.first()).unwrap_or(usize::MAX);
        let mut found = Vec::new();
        let mut next = cursor;
        for stamped in self.events.iter().skip(skip) {
            if found.len() == max {
                break;
            }
            next = stamped.position.seq;
            if filter.matches(&stamped.event) {
                found.push(stamped.clone());
            }
        }
        Read::Events(found, next)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use starling_api::{NodeChange, NodeChangeKind, TaskChange, TaskStatus};

    fn task(id: &str, node: Option<&str>) -> LiveEvent {
        LiveEvent::Task(TaskChange {
            task_id: id.into(),
            status: TaskStatus::Running,
            attempt: 1,
            node_id: node.map(str::to_owned),
            site: None,
            power_level: Some(0),
            reason: None,
            at_ms: 1,
        })
    }

    fn node(id: &str) -> LiveEvent {
        LiveEvent::Node(NodeChange {
            node_id: id.into(),
            change: NodeChangeKind::Online,
            at_ms: 1,
        })
    }

    fn seqs(read: Read) -> (Vec<u64>, u64) {
        match read {
            Read::Events(events, next) => (events.iter().map(|e| e.position.seq).collect(), next),
            Read::Behind => panic!("behind"),
        }
    }

    #[test]
    fn numbers_events_and_reads_past_a_cursor() {
        let mut ring = Ring::new(7, 10);
        for i in 0..4 {
            ring.push(task(&format!("t{i}"), None));
        }
        assert_eq!(ring.latest(), 4);
        assert_eq!(
            seqs(ring.read(0, &Filter::default(), 100)),
            (vec![1, 2, 3, 4], 4)
        );
        assert_eq!(seqs(ring.read(2, &Filter::default(), 100)), (vec![3, 4], 4));
        assert_eq!(seqs(ring.read(4, &Filter::default(), 100)), (vec![], 4));
        // A batch limit leaves the cursor at the last event handed out.
        assert_eq!(
            seqs(ring.read(0, &Filter::default(), 3)),
            (vec![1, 2, 3], 3)
        );
    }

    #[test]
    fn a_filter_skips_events_but_moves_the_cursor() {
        let mut ring = Ring::new(7, 10);
        ring.push(task("a", Some("n1")));
        ring.push(node("n2"));
        ring.push(task("b", Some("n2")));
        ring.push(node("n1"));
        let by_task = Filter {
            task: Some("b".into()),
            ..Filter::default()
        };
        assert_eq!(seqs(ring.read(0, &by_task, 100)), (vec![3], 4));
        let by_node = Filter {
            node: Some("n1".into()),
            ..Filter::default()
        };
        assert_eq!(seqs(ring.read(0, &by_node, 100)), (vec![1, 4], 4));
        let nodes_only = Filter {
            kinds: Some(vec![EventKind::Node]),
            ..Filter::default()
        };
        assert_eq!(seqs(ring.read(0, &nodes_only, 100)), (vec![2, 4], 4));
    }

    #[test]
    fn a_cursor_the_ring_dropped_is_behind() {
        let mut ring = Ring::new(7, 3);
        for i in 0..5 {
            ring.push(node(&format!("n{i}")));
        }
        // Holds 3, 4, 5: a reader at 2 lost nothing, a reader at 1 lost 2.
        assert_eq!(
            seqs(ring.read(2, &Filter::default(), 100)),
            (vec![3, 4, 5], 5)
        );
        assert!(matches!(
            ring.read(1, &Filter::default(), 100),
            Read::Behind
        ));
        assert!(matches!(
            ring.read(0, &Filter::default(), 100),
            Read::Behind
        ));
    }

    #[test]
    fn resume_accepts_only_positions_still_held_in_this_run() {
        let mut ring = Ring::new(7, 3);
        for i in 0..5 {
            ring.push(node(&format!("n{i}")));
        }
        let at = |boot, seq| StreamPosition { boot, seq };
        assert_eq!(ring.resume(at(7, 5)), Some(5));
        assert_eq!(ring.resume(at(7, 2)), Some(2));
        assert_eq!(ring.resume(at(7, 1)), None, "event 2 was dropped");
        assert_eq!(ring.resume(at(7, 6)), None, "from the future");
        assert_eq!(ring.resume(at(8, 5)), None, "another run");
        let empty = Ring::new(9, 3);
        assert_eq!(empty.resume(at(9, 0)), Some(0));
    }

    #[test]
    fn json_is_written_once_with_the_kind() {
        let mut ring = Ring::new(1, 2);
        ring.push(node("n1"));
        let (events, _) = match ring.read(0, &Filter::default(), 1) {
            Read::Events(events, next) => (events, next),
            Read::Behind => panic!(),
        };
        let json: serde_json::Value = serde_json::from_str(&events[0].json).unwrap();
        assert_eq!(json["kind"], "node");
        assert_eq!(json["node_id"], "n1");
    }
}
