//! Coalesced rewrites of the Mosquitto files. Each enrollment and each
//! revocation changes the password file, and the REST call may answer only
//! once the file holds the change and Mosquitto has reread it (a new node's
//! first login is refused otherwise, and a revoked node must be cut off). A rewrite reads every node from the store and writes the whole
//! file, so one rewrite per change made a fleet enrolling at once cost
//! O(fleet²). [`MosquittoWriter`] lets one rewrite cover every change stored
//! before it began.
//!
//! Each change takes a generation once it is stored. A rewrite notes the
//! newest generation handed out before it reads the store, so the rows it
//! writes hold that change and every earlier one. Rewrites run one at a
//! time; a caller whose generation a finished rewrite covers returns without
//! writing, so all the changes stored while one rewrite runs share the
//! next one.
//!
//! A rewrite ends once Mosquitto has reread the password file, not when
//! the signal is sent. Mosquitto acts on a SIGHUP only when its loop next
//! wakes (it blocks signals while it waits for sockets, up to 100 ms), and
//! it handles the sockets that woke it before it reloads, so a login right
//! after the signal is checked against the old file; and it clears its
//! reload flag when a reload ends, so a SIGHUP that arrives during a
//! reload is lost, and the files stay unread (a revoked node let in, a new
//! one refused) until the next change. The rewrite watches the password
//! file's access time and signals again until it moves; Mosquitto reads
//! the file and applies it in one turn of its single-threaded loop, so any
//! login after that is checked against the new file.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::mosquitto::MosquittoFiles;
use super::AccessError;
use crate::store::Store;

/// How long a change waits for a rewrite that covers it. A rewrite takes
/// the store read and the write (milliseconds for thousands of nodes) and
/// Mosquitto's reread (up to its 100 ms tick), and a change waits for at
/// most the one running and the next, so reaching this means the disk,
/// the signal or Mosquitto is stuck.
pub const REWRITE_WAIT: Duration = Duration::from_secs(10);

/// How long a rewrite waits for Mosquitto to reread the password file
/// after each signal before it signals again. Mosquitto blocks signals
/// while it waits for sockets, up to 100 ms, so a reread takes up to that
/// long; a signal that arrived while Mosquitto was reloading was lost, and
/// one more is harmless (a pending SIGHUP absorbs the next). About 4.7 s
/// in all, within [`REWRITE_WAIT`].
const REREAD_WAITS: [Duration; 5] = [
    Duration::from_millis(150),
    Duration::from_millis(300),
    Duration::from_millis(600),
    Duration::from_millis(1_200),
    Duration::from_millis(2_400),
];

/// How often a rewrite looks at the password file's access time.
const REREAD_POLL: Duration = Duration::from_millis(1);

/// Rewrites a Mosquitto's files (and signals it) after enrollments and
/// revocations, one rewrite for all the changes that arrived while the
/// previous one ran.
#[derive(Debug)]
pub struct MosquittoWriter {
    files: Arc<MosquittoFiles>,
    /// Whether the files' directory keeps access times, which tell when
    /// Mosquitto has reread them; found at the first rewrite that signals.
    access_times: Arc<std::sync::OnceLock<bool>>,
    /// The newest generation handed out: one per change, taken after the
    /// change was stored.
    requested: AtomicU64,
    /// The newest generation the files on disk hold (and Mosquitto has
    /// reread, where it is signalled). Locked through each rewrite, so rewrites never
    /// overlap (they share the files' temporary names); the guard moves
    /// into the blocking write, so a caller that stops waiting (its request
    /// dropped, its wait timed out) leaves the lock held until the write is
    /// done.
    covered: Arc<tokio::sync::Mutex<u64>>,
    /// Rewrites done: files written and reread by Mosquitto.
    rewrites: Arc<AtomicU64>,
    /// How long [`MosquittoWriter::rewrite`] waits.
    wait: Duration,
}

impl MosquittoWriter {
    /// A writer of `files`, which hold the store's nodes as they were when
    /// it was made (the coordinator writes them once at start).
    pub fn new(files: MosquittoFiles) -> Self {
        Self::with_wait(files, REWRITE_WAIT)
    }

    /// As [`MosquittoWriter::new`], waiting at most `wait` per change.
    fn with_wait(files: MosquittoFiles, wait: Duration) -> Self {
        Self {
            files: Arc::new(files),
            access_times: Arc::new(std::sync::OnceLock::new()),
            requested: AtomicU64::new(0),
            covered: Arc::new(tokio::sync::Mutex::new(0)),
            rewrites: Arc::new(AtomicU64::new(0)),
            wait,
        }
    }

    /// The files it writes.
    pub fn files(&self) -> &MosquittoFiles {
        &self.files
    }

    /// How many rewrites it has done.
    pub fn rewrites(&self) -> u64 {
        self.rewrites.load(Ordering::Relaxed)
    }

    /// Returns once the files hold every change stored before this call
    /// and Mosquitto has reread them: after a rewrite that began after this
    /// call, run by this caller or by another. Fails with
    /// the error of this caller's own rewrite (a later caller tries again),
    /// or when nothing covered the change within the wait; either way the
    /// change stays stored, and the next rewrite or a restart writes it.
    pub async fn rewrite(&self, store: &Store) -> Result<(), AccessError> {
        // Taken after the caller's store write, so a rewrite that sees this
        // generation reads the store after that write.
        let generation = self.requested.fetch_add(1, Ordering::SeqCst) + 1;
        tokio::time::timeout(self.wait, self.cover(generation, store))
            .await
            .map_err(|_| AccessError::RewriteTimedOut { waited: self.wait })?
    }

    /// Waits for the running rewrite, then rewrites unless it covered
    /// `generation`.
    async fn cover(&self, generation: u64, store: &Store) -> Result<(), AccessError> {
        let mut covered = self.covered.clone().lock_owned().await;
        if *covered >= generation {
            return Ok(());
        }
        // Every generation up to `newest` was taken after its change was
        // stored, so the rows read below hold them all.
        let newest = self.requested.load(Ordering::SeqCst);
        let rows = store.node_credentials().await?;
        let files = self.files.clone();
        let access_times = self.access_times.clone();
        let rewrites = self.rewrites.clone();
        // fsyncs, `kill` processes and waits: off the async workers.
        tokio::task::spawn_blocking(move || {
            files.write_files(&rows)?;
            if files.signal()? {
                let access_times = *access_times.get_or_init(|| {
                    let works = files.access_times_work();
                    if !works {
                        tracing::warn!(dir = %files.dir.display(), "reading a file under the Mosquitto auth dir does not move its access time (noatime?), so enrollments and revocations cannot wait for Mosquitto to reread its password file: a login right after one may be checked against the old file, and a signal Mosquitto drops while it reloads leaves the old file in force until the next change");
                    }
                    works
                });
                if access_times {
                    await_reread(&files)?;
                }
            }
            *covered = newest;
            rewrites.fetch_add(1, Ordering::Relaxed);
            Ok(())
        })
        .await
        .map_err(|error| AccessError::RewriteStopped {
            detail: error.to_string(),
        })?
    }
}

/// Waits until Mosquitto has reread the password file that was just
/// written and signalled for, signalling again after each of
/// [`REREAD_WAITS`] but the last.
fn await_reread(files: &MosquittoFiles) -> Result<(), AccessError> {
    for (attempt, wait) in REREAD_WAITS.into_iter().enumerate() {
        if attempt > 0 && !files.signal()? {
            // Mosquitto stopped: the next one reads the files when it starts.
            return Ok(());
        }
        let deadline = std::time::Instant::now() + wait;
        loop {
            if files.reread_since_written() {
                return Ok(());
            }
            if std::time::Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(REREAD_POLL);
        }
    }
    Err(AccessError::Reload {
        detail: format!(
            "Mosquitto did not reread {} after {} signals",
            files.passwd_path().display(),
            REREAD_WAITS.len()
        ),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::access::{new_node_password, Reload};

    async fn store(dir: &std::path::Path) -> Store {
        Store::open(&format!("sqlite://{}", dir.join("c.db").display()))
            .await
            .unwrap()
    }

    fn files(dir: std::path::PathBuf, reload: Reload) -> MosquittoFiles {
        MosquittoFiles {
            dir,
            reload,
            username: "coordinator".into(),
            password_hash: "$7$hash".into(),
            topic_prefix: "starling/v1".into(),
            allow_anonymous: false,
        }
    }

    async fn enroll(store: &Store, node: &str) {
        let (_, hashes) = new_node_password().unwrap();
        store
            .set_node_credentials(node, hashes.for_node("key"), 1)
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn concurrent_changes_share_rewrites_and_each_is_written_before_it_returns() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path()).await;
        let writer = MosquittoWriter::new(files(dir.path().join("auth"), Reload::Manual));
        let nodes: Vec<String> = (0..64).map(|i| format!("n-{i:02}")).collect();
        let changes = nodes.iter().map(|node| {
            let (store, writer) = (&store, &writer);
            async move {
                enroll(store, node).await;
                writer.rewrite(store).await.unwrap();
                // Returned: the file holds this node.
                let passwd = std::fs::read_to_string(writer.files().passwd_path()).unwrap();
                assert!(passwd.contains(&format!("\n{node}:$7$")), "{node} missing");
            }
        });
        futures_util::future::join_all(changes).await;
        let rewrites = writer.rewrites();
        assert!(
            (1..=32).contains(&rewrites),
            "{rewrites} rewrites for 64 changes"
        );
        store.close().await;
    }

    #[tokio::test]
    async fn changes_waiting_behind_a_rewrite_share_the_next_one() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path()).await;
        let writer = MosquittoWriter::new(files(dir.path().join("auth"), Reload::Manual));
        for i in 0..16 {
            enroll(&store, &format!("n-{i}")).await;
        }
        // join_all polls in order: the first takes the lock and notes only
        // its own generation; the other 15 queue behind it and share one.
        let waits = (0..16).map(|_| writer.rewrite(&store));
        for result in futures_util::future::join_all(waits).await {
            result.unwrap();
        }
        assert_eq!(writer.rewrites(), 2);
        store.close().await;
    }

    #[tokio::test]
    async fn a_failed_rewrite_is_typed_and_the_next_change_rewrites() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path()).await;
        // The directory's place is taken by a file: nothing can be written.
        let blocked = dir.path().join("auth");
        std::fs::write(&blocked, "not a directory").unwrap();
        let writer = MosquittoWriter::new(files(blocked.clone(), Reload::Manual));
        enroll(&store, "n-1").await;
        let error = writer.rewrite(&store).await.unwrap_err();
        assert!(matches!(error, AccessError::Write { .. }), "{error}");
        assert_eq!(writer.rewrites(), 0);
        std::fs::remove_file(&blocked).unwrap();
        enroll(&store, "n-2").await;
        writer.rewrite(&store).await.unwrap();
        let passwd = std::fs::read_to_string(writer.files().passwd_path()).unwrap();
        assert!(
            passwd.contains("\nn-1:") && passwd.contains("\nn-2:"),
            "{passwd}"
        );

        // A pid file without a pid: the files are written, the signal fails.
        let pid_file = dir.path().join("mosquitto.pid");
        std::fs::write(&pid_file, "garbage").unwrap();
        let signalled = MosquittoWriter::new(files(blocked, Reload::PidFile(pid_file)));
        let error = signalled.rewrite(&store).await.unwrap_err();
        assert!(matches!(error, AccessError::Reload { .. }), "{error}");
        assert_eq!(signalled.rewrites(), 0);
        store.close().await;
    }

    #[tokio::test]
    async fn a_change_waits_a_bounded_time_for_a_stuck_rewrite() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path()).await;
        let writer = MosquittoWriter::with_wait(
            files(dir.path().join("auth"), Reload::Manual),
            Duration::from_millis(100),
        );
        let stuck = writer.covered.clone().lock_owned().await;
        let error = writer.rewrite(&store).await.unwrap_err();
        assert!(
            matches!(error, AccessError::RewriteTimedOut { waited } if waited == Duration::from_millis(100)),
            "{error}"
        );
        drop(stuck);
        writer.rewrite(&store).await.unwrap();
        assert_eq!(writer.rewrites(), 1);
        store.close().await;
    }

    /// A child process, killed and reaped when the test ends, passed or not.
    struct KillOnDrop(std::process::Child);

    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    #[tokio::test]
    async fn a_signal_mosquitto_drops_is_sent_again_until_it_rereads_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path()).await;
        let auth = dir.path().join("auth");
        let (ready, signals) = (dir.path().join("ready"), dir.path().join("signals"));
        let probe = files(auth.clone(), Reload::Manual);
        probe.create_dir().unwrap();
        if !probe.access_times_work() {
            eprintln!("skipped: the temporary directory keeps no access times");
            return;
        }
        // Stands in for a Mosquitto that was reloading when the first SIGHUP
        // came (so it dropped it) and rereads the password file on the next.
        // SIGHUP's default action back first: a shell cannot trap a signal
        // it was started with ignored, and a test run under nohup (as
        // scripts/ci-timings once ran CI) would pass that on.
        let reloader = std::process::Command::new("env")
            .args(["--default-signal=HUP", "sh", "-c"])
            .arg(
                r#"trap 'echo hup >> "$1"; [ "$(wc -l < "$1")" -ge 2 ] && cat "$2" > /dev/null' HUP
                   touch "$3"
                   while :; do sleep 0.01; done"#,
            )
            .args(["reloader", signals.to_str().unwrap()])
            .arg(auth.join("passwd"))
            .arg(&ready)
            .spawn()
            .unwrap();
        let reloader = KillOnDrop(reloader);
        while !ready.exists() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let pid = Arc::new(std::sync::atomic::AtomicU32::new(reloader.0.id()));
        let writer = MosquittoWriter::new(files(auth, Reload::Pid(pid)));
        enroll(&store, "n-1").await;
        writer.rewrite(&store).await.unwrap();
        let sent = std::fs::read_to_string(&signals).unwrap().lines().count();
        drop(reloader);
        assert_eq!(sent, 2, "one signal dropped, one acted on");
        assert!(writer.files().reread_since_written());
        assert_eq!(writer.rewrites(), 1);
        store.close().await;
    }
}
