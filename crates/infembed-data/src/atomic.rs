//! Atomic file replacement, shared by every crate that writes results (embedding indexes,
//! checkpoints, training histories).

use std::fs::File;
use std::io::Write;
use std::path::Path;

/// Writes `bytes` to `path` atomically and durably: to a temporary file beside it
/// (`<name>.tmp-<pid>`), synced, then renamed over `path`, and the folder synced (best effort
/// where folders cannot be opened). A crash leaves either the old file or the new one, never a
/// torn one; on an error the temporary file is removed.
///
/// # Errors
/// The I/O error of creating, writing, syncing or renaming; callers name `path` in their own
/// error type.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(format!(".tmp-{}", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let written = write_synced(&tmp, bytes).and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => sync_dir(p),
        _ => sync_dir(Path::new(".")),
    }
    Ok(())
}

/// Creates (or truncates) `path`, writes `bytes` and syncs the file to disk.
///
/// # Errors
/// The I/O error of any of the three steps.
pub fn write_synced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut f = File::create(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

/// Syncs a folder's entries (renames into it) to disk. Folders can be opened and synced on Unix;
/// elsewhere this does nothing.
pub fn sync_dir(path: &Path) {
    if let Ok(d) = File::open(path) {
        let _ = d.sync_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_the_file_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.txt");
        write_atomic(&path, b"first").unwrap();
        write_atomic(&path, b"second").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"second");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["out.txt"]);
    }

    #[test]
    fn a_failed_write_keeps_the_old_file_and_removes_the_temporary() {
        let dir = tempfile::tempdir().unwrap();
        // A directory in the way of the rename: the write fails and the directory is kept.
        let path = dir.path().join("taken");
        std::fs::create_dir(&path).unwrap();
        std::fs::write(path.join("inside"), b"x").unwrap();
        assert!(write_atomic(&path, b"new").is_err());
        assert!(path.join("inside").is_file());
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["taken"]);
    }
}
