//! The scripts CI runs on itself. `scripts/keep-mtimes` decides which of a
//! fresh clone's files cargo takes for unchanged: a file it wrongly gave an
//! old time would let CI test what it built from an earlier commit, so its
//! rules are checked here on real git clones.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use starling_tests::workspace_root;

fn git(dir: &Path, args: &[&str]) {
    let status = Command::new("git")
        .current_dir(dir)
        .args(["-c", "user.name=ci", "-c", "user.email=ci@example.invalid"])
        .args(args)
        .status()
        .expect("git is installed");
    assert!(status.success(), "git {args:?}");
}

fn write(root: &Path, path: &str, text: &str) {
    let path = root.join(path);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn mtime(root: &Path, path: &str) -> SystemTime {
    std::fs::metadata(root.join(path))
        .unwrap()
        .modified()
        .unwrap()
}

/// A new clone of `origin` at `at` (removed first, as CI's work directory
/// is), with `scripts/keep-mtimes manifest` run in it.
fn clone_and_keep(origin: &Path, at: &Path, manifest: &Path) {
    if at.exists() {
        std::fs::remove_dir_all(at).unwrap();
    }
    git(
        origin.parent().unwrap(),
        &[
            "clone",
            "--quiet",
            origin.to_str().unwrap(),
            at.to_str().unwrap(),
        ],
    );
    let out = Command::new(workspace_root().join("scripts/keep-mtimes"))
        .current_dir(at)
        .arg(manifest)
        .output()
        .expect("python3 is installed");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_fresh_clone_keeps_the_times_of_only_what_did_not_change() {
    let _turn = crate::alongside();
    let dir = tempfile::tempdir().unwrap();
    let origin: PathBuf = dir.path().join("origin");
    let work = dir.path().join("work");
    let manifest = dir.path().join("mtimes.json");
    std::fs::create_dir_all(&origin).unwrap();
    git(&origin, &["init", "--quiet"]);
    write(&origin, "a/src/lib.rs", "// a");
    write(&origin, "a/migrations/0001.sql", "CREATE TABLE t (x int);");
    write(&origin, "b/src/lib.rs", "// b");
    write(&origin, "c/src/lib.rs", "// c");
    write(&origin, "Cargo.toml", "[workspace]");
    git(&origin, &["add", "."]);
    git(&origin, &["commit", "--quiet", "-m", "one"]);

    // The first clone: nothing to keep. Its files are then given a time
    // far in the past, as if built long ago, and recorded so by a second
    // run in the same clone on a new manifest (on the first one's, it would
    // give them back the clone's own times, unchanged as they are).
    clone_and_keep(&origin, &work, &manifest);
    std::fs::remove_file(&manifest).unwrap();
    let built = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
    for path in [
        "a/src/lib.rs",
        "a/migrations/0001.sql",
        "b/src/lib.rs",
        "c/src/lib.rs",
        "Cargo.toml",
    ] {
        std::fs::File::options()
            .write(true)
            .open(work.join(path))
            .unwrap()
            .set_modified(built)
            .unwrap();
    }
    let out = Command::new(workspace_root().join("scripts/keep-mtimes"))
        .current_dir(&work)
        .arg(&manifest)
        .output()
        .unwrap();
    assert!(out.status.success());

    // The next commit changes b's source and adds a migration to a, whose
    // sources are unchanged: sqlx::migrate! reads its directory, which
    // cargo does not track, so all of a counts as changed.
    write(&origin, "b/src/lib.rs", "// b, changed");
    write(&origin, "a/migrations/0002.sql", "ALTER TABLE t ADD y int;");
    git(&origin, &["add", "."]);
    git(&origin, &["commit", "--quiet", "-m", "two"]);
    clone_and_keep(&origin, &work, &manifest);
    assert_eq!(mtime(&work, "c/src/lib.rs"), built, "unchanged: kept");
    assert_eq!(mtime(&work, "Cargo.toml"), built, "unchanged: kept");
    assert!(mtime(&work, "b/src/lib.rs") > built, "changed: new");
    assert!(
        mtime(&work, "a/src/lib.rs") > built,
        "unchanged, but its directory gained a file: new"
    );
    assert!(mtime(&work, "a/migrations/0002.sql") > built);

    // The same commit again: every file keeps the time the last clone had.
    let before = mtime(&work, "b/src/lib.rs");
    clone_and_keep(&origin, &work, &manifest);
    assert_eq!(mtime(&work, "b/src/lib.rs"), before);
    assert_eq!(mtime(&work, "c/src/lib.rs"), built);

    // Back to the first commit: b's content differs from what the manifest
    // last recorded for it, so it is new, never the old time of that
    // content (the cache holds a build of the other one).
    git(&origin, &["reset", "--quiet", "--hard", "HEAD~1"]);
    clone_and_keep(&origin, &work, &manifest);
    assert!(mtime(&work, "b/src/lib.rs") > before);
    assert_eq!(mtime(&work, "c/src/lib.rs"), built);
}
