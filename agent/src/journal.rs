//! The attempt journal: an append-only file in the data directory holding the
//! accepted and final events of recent attempts, so that an agent restarted
//! after a crash still recognises a redelivered assignment (and re-publishes
//! its result instead of running it again), and reports attempts that a crash
//! interrupted as failed rather than leaving them silent.
//!
//! One line per event: the event's CBOR in hex. The file is rewritten with
//! only the newest entries at each start, which bounds its size.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use starling_proto::{TaskEvent, TaskId};

/// Attempts kept when the journal is compacted at start.
pub const JOURNAL_KEPT_ATTEMPTS: usize = 1024;

/// Outputs longer than this are not journaled (the event keeps its state,
/// code and metrics); it bounds the file to a few tens of MiB.
pub const JOURNAL_OUTPUT_BYTES: usize = 16 * 1024;

/// Why the journal could not be used.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// The file could not be read or written.
    #[error("cannot use the attempt journal {path}: {source}; check --data-dir")]
    Io {
        /// The journal file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

/// The open journal.
#[derive(Debug)]
pub struct AttemptJournal {
    path: PathBuf,
    file: std::fs::File,
}

impl AttemptJournal {
    /// Opens the journal in `data_dir`, returning the last event of each
    /// remembered attempt (oldest first) and compacting the file to them.
    /// Lines that do not decode (a torn last write) are skipped.
    pub fn open(data_dir: &Path) -> Result<(Self, Vec<TaskEvent>), JournalError> {
        let path = data_dir.join("attempts.journal");
        let io_error = |source| JournalError::Io {
            path: path.clone(),
            source,
        };
        let mut order: Vec<(TaskId, u32)> = Vec::new();
        let mut latest: HashMap<(TaskId, u32), TaskEvent> = HashMap::new();
        match std::fs::File::open(&path) {
            Ok(file) => {
                for line in std::io::BufReader::new(file).lines() {
                    let line = line.map_err(io_error)?;
                    let Some(event) = decode_line(&line) else {
                        tracing::warn!(path = %path.display(), "skipping an unreadable journal line");
                        continue;
                    };
                    let key = (event.task_id.clone(), event.attempt);
                    if latest.insert(key.clone(), event).is_none() {
                        order.push(key);
                    }
                }
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => return Err(io_error(error)),
        }
        let skip = order.len().saturating_sub(JOURNAL_KEPT_ATTEMPTS);
        let events: Vec<TaskEvent> = order
            .into_iter()
            .skip(skip)
            .filter_map(|key| latest.remove(&key))
            .collect();

        // Compact: write the survivors to a new file and rename it over the old.
        let compacted = data_dir.join("attempts.journal.new");
        {
            let mut file = std::fs::File::create(&compacted).map_err(io_error)?;
            for event in &events {
                file.write_all(encode_line(event).as_bytes())
                    .map_err(io_error)?;
            }
            file.sync_all().map_err(io_error)?;
        }
        std::fs::rename(&compacted, &path).map_err(io_error)?;
        let file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(io_error)?;
        Ok((Self { path, file }, events))
    }

    /// Appends an event.
    pub fn append(&mut self, event: &TaskEvent) -> Result<(), JournalError> {
        self.file
            .write_all(encode_line(event).as_bytes())
            .map_err(|source| JournalError::Io {
                path: self.path.clone(),
                source,
            })
    }
}

fn encode_line(event: &TaskEvent) -> String {
    let mut kept = event.clone();
    if kept.output.len() > JOURNAL_OUTPUT_BYTES {
        kept.output.clear();
    }
    // An event that encoded once for the wire encodes again; if it somehow
    // does not, an empty line is skipped on reading.
    let bytes = starling_proto::encode(&kept).unwrap_or_default();
    let mut line = hex::encode(bytes);
    line.push('\n');
    line
}

fn decode_line(line: &str) -> Option<TaskEvent> {
    let bytes = hex::decode(line.trim()).ok()?;
    starling_proto::decode(&bytes).ok()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use starling_proto::{NodeId, TaskState};

    fn event(task: &str, state: TaskState) -> TaskEvent {
        TaskEvent::state(
            TaskId::new(task).unwrap(),
            1,
            NodeId::new("n").unwrap(),
            state,
        )
    }

    #[test]
    fn journal_survives_reopen_keeps_the_last_event_and_skips_torn_lines() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (mut journal, events) = AttemptJournal::open(dir.path()).unwrap();
            assert!(events.is_empty());
            journal.append(&event("a", TaskState::Accepted)).unwrap();
            journal.append(&event("b", TaskState::Accepted)).unwrap();
            let mut done = event("a", TaskState::Succeeded);
            done.output = b"result".to_vec();
            journal.append(&done).unwrap();
        }
        // A crash mid-write leaves half a line.
        let path = dir.path().join("attempts.journal");
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        file.write_all(b"a1b2c").unwrap();
        drop(file);

        let (_, events) = AttemptJournal::open(dir.path()).unwrap();
        let states: Vec<(&str, TaskState)> = events
            .iter()
            .map(|e| (e.task_id.as_str(), e.state))
            .collect();
        assert_eq!(
            states,
            [("a", TaskState::Succeeded), ("b", TaskState::Accepted)]
        );
        assert_eq!(events[0].output, b"result");
        // Compaction dropped the torn line and the superseded event.
        assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 2);
    }

    #[test]
    fn large_outputs_are_not_journaled() {
        let dir = tempfile::tempdir().unwrap();
        let (mut journal, _) = AttemptJournal::open(dir.path()).unwrap();
        let mut done = event("big", TaskState::Succeeded);
        done.output = vec![b'x'; JOURNAL_OUTPUT_BYTES + 1];
        journal.append(&done).unwrap();
        drop(journal);
        let (_, events) = AttemptJournal::open(dir.path()).unwrap();
        assert_eq!(events[0].state, TaskState::Succeeded);
        assert!(events[0].output.is_empty());
    }
}
