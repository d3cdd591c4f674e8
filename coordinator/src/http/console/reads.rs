//! Reads the console's live streams share (issue 33: 400 open task-list
//! streams each read the task list again on every event, and exhausted
//! the database's pool). A stream asks for a value that reflects at least
//! the feed position of the event it handles; the first stream to ask past
//! what is held reads, and those that ask while it reads wait for its
//! result instead of reading too. So one event costs one read per view,
//! however many browsers show it.
//!
//! Correct because the store is written before the feed announces a
//! change: a read that starts after the feed's newest position is `S`
//! sees every change announced up to `S`.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use starling_api::{TaskDetail, TaskStatus};

use crate::store::TaskRecord;

/// The tables the console's streams read through.
#[derive(Debug, Default)]
pub(crate) struct StreamReads {
    /// The newest tasks, by the state the list is filtered on.
    pub(crate) task_lists: SharedReads<Option<TaskStatus>, Vec<TaskRecord>>,
    /// One task's row, by id.
    pub(crate) tasks: SharedReads<String, Option<TaskRecord>>,
    /// One task's page, by id.
    pub(crate) task_details: SharedReads<String, TaskDetail>,
}

/// Most keys one table holds; past it, it starts over (a key costs one
/// read to fill again).
const MAX_KEYS: usize = 1024;

/// A value as read, and the feed position it reflects at least.
struct Held<V> {
    seq: u64,
    value: Arc<V>,
}

type Slot<V> = Arc<tokio::sync::Mutex<Option<Held<V>>>>;

/// One table of shared reads, by key (a list's filter, a task's id).
pub(crate) struct SharedReads<K, V> {
    slots: Mutex<HashMap<K, Slot<V>>>,
    /// Reads made (not shared), for `/metrics`.
    reads: AtomicU64,
}

impl<K, V> Default for SharedReads<K, V> {
    fn default() -> Self {
        Self {
            slots: Mutex::new(HashMap::new()),
            reads: AtomicU64::new(0),
        }
    }
}

impl<K, V> SharedReads<K, V> {
    /// Reads made since start (each served every stream that asked meanwhile).
    pub(crate) fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }
}

impl<K, V> std::fmt::Debug for SharedReads<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedReads").finish_non_exhaustive()
    }
}

impl<K: Eq + Hash + Clone, V> SharedReads<K, V> {
    /// The value for `key` that reflects at least feed position
    /// `at_least`: the one held if it does, else one `read` now, noted as
    /// reflecting `latest()` (the feed's newest position before the read).
    pub(crate) async fn get<E, Fut>(
        &self,
        key: &K,
        at_least: u64,
        latest: impl FnOnce() -> u64,
        read: impl FnOnce() -> Fut,
    ) -> Result<Arc<V>, E>
    where
        Fut: Future<Output = Result<V, E>>,
    {
        let slot = {
            // Every change to the map is one insert or one clear: a
            // poisoned lock still holds a consistent map.
            let mut slots = self
                .slots
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if slots.len() >= MAX_KEYS && !slots.contains_key(key) {
                slots.clear();
            }
            slots.entry(key.clone()).or_default().clone()
        };
        let mut held = slot.lock().await;
        if let Some(held) = held.as_ref().filter(|held| held.seq >= at_least) {
            return Ok(held.value.clone());
        }
        let seq = latest();
        self.reads.fetch_add(1, Ordering::Relaxed);
        let value = Arc::new(read().await?);
        *held = Some(Held {
            seq,
            value: value.clone(),
        });
        Ok(value)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    async fn read(
        reads: &SharedReads<&'static str, u64>,
        count: &AtomicU64,
        at_least: u64,
        latest: u64,
    ) -> u64 {
        *reads
            .get(
                &"list",
                at_least,
                || latest,
                || async {
                    // Long enough that the other readers arrive meanwhile.
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                    Ok::<u64, ()>(count.fetch_add(1, Ordering::SeqCst) + 1)
                },
            )
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn streams_that_ask_at_once_share_one_read() {
        let reads = Arc::new(SharedReads::default());
        let count = Arc::new(AtomicU64::new(0));
        let mut streams = tokio::task::JoinSet::new();
        for _ in 0..400 {
            let (reads, count) = (reads.clone(), count.clone());
            streams.spawn(async move { read(&reads, &count, 7, 7).await });
        }
        let all = streams.join_all().await;
        assert_eq!(count.load(Ordering::SeqCst), 1, "one read for 400 streams");
        assert_eq!(reads.reads(), 1);
        assert!(all.iter().all(|value| *value == 1));
    }

    #[tokio::test]
    async fn a_later_event_reads_again_and_an_earlier_one_does_not() {
        let reads = SharedReads::default();
        let count = AtomicU64::new(0);
        assert_eq!(read(&reads, &count, 3, 5).await, 1);
        // Position 5 is reflected: events up to it reuse the read.
        assert_eq!(read(&reads, &count, 5, 9).await, 1);
        assert_eq!(read(&reads, &count, 1, 9).await, 1);
        // Event 6 came after it: read again.
        assert_eq!(read(&reads, &count, 6, 9).await, 2);
        assert_eq!(count.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_failed_read_is_not_kept() {
        let reads: SharedReads<&str, u64> = SharedReads::default();
        let failed = reads
            .get(&"k", 1, || 1, || async { Err::<u64, &str>("down") })
            .await;
        assert_eq!(failed.unwrap_err(), "down");
        let value = reads
            .get(&"k", 1, || 1, || async { Ok::<u64, &str>(4) })
            .await
            .unwrap();
        assert_eq!(*value, 4);
    }

    #[tokio::test]
    async fn the_table_stays_bounded() {
        let reads: SharedReads<usize, usize> = SharedReads::default();
        for key in 0..(MAX_KEYS * 3) {
            reads
                .get(&key, 0, || 0, || async { Ok::<usize, ()>(key) })
                .await
                .unwrap();
        }
        assert!(reads.slots.lock().unwrap().len() <= MAX_KEYS);
    }
}
