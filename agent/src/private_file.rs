//! Files only the agent's own user may read: the credentials, the node's
//! report key. Written atomically, so a crash leaves the old file or the new
//! one, never half of either.

use std::io::Write;
use std::path::Path;

/// Writes `bytes` to `path` through a temporary file beside it (mode 0600,
/// synced, then renamed over `path`), creating the parent directory.
pub fn write(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_owned(path, bytes, None)
}

/// [`write`], the file given to `owner` (uid, gid) before it takes its name.
///
/// Root uses this to write into the agent's own directory
/// (`import-join-file`, `starling-agent join`), whose entries the agent's
/// user controls: so the temporary file is made anew, never opened through
/// whatever (a symlink to /etc/shadow, say) already has its name, and it is
/// chowned through its descriptor, never by a path that could be swapped.
pub fn write_owned(path: &Path, bytes: &[u8], owner: Option<(u32, u32)>) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut name = path.as_os_str().to_owned();
    name.push(".tmp");
    let temporary = std::path::PathBuf::from(name);
    // A leftover from a crash, or something planted: unlink removes the
    // entry itself (a symlink, not its target), and create_new (O_EXCL)
    // refuses anything that appears in between, symlinks included.
    match std::fs::remove_file(&temporary) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => return Err(error),
        _ => {}
    }
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(&temporary)?;
    #[cfg(unix)]
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::fchown(&file, Some(uid), Some(gid))?;
    }
    #[cfg(not(unix))]
    let _ = owner;
    file.write_all(bytes)?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&temporary, path)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    #[test]
    fn written_files_are_private_and_replace_the_old_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub").join("secret");
        super::write(&path, b"one").unwrap();
        super::write(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        assert!(!dir.path().join("sub").join("secret.tmp").exists());
    }

    #[cfg(unix)]
    #[test]
    fn a_planted_symlink_at_the_temporary_name_is_not_written_through() {
        // The agent's user owns the directory root writes the join file
        // into; what it plants there must not redirect root's write.
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let path = dir.path().join("join.toml");
        std::os::unix::fs::symlink(&victim, dir.path().join("join.toml.tmp")).unwrap();
        let me = {
            use std::os::unix::fs::MetadataExt;
            let meta = std::fs::metadata(dir.path()).unwrap();
            (meta.uid(), meta.gid())
        };
        super::write_owned(&path, b"token", Some(me)).unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert_eq!(std::fs::read(&path).unwrap(), b"token");
        assert!(!std::fs::symlink_metadata(&path)
            .unwrap()
            .file_type()
            .is_symlink());
    }
}
