//! Atomic file replacement, shared by every crate that writes results (embedding indexes,
//! checkpoints, training histories).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// Writes `bytes` to `path` atomically and durably: to a temporary file beside it
/// (`<name>.tmp-<pid>`), synced, then renamed over `path`, and the folder synced (best effort
/// where folders cannot be opened). A crash leaves either the old file or the new one, never a
/// torn one; on an error the temporary file is removed.
///
/// # Errors
/// The I/O error of creating, writing, syncing or renaming; callers name `path` in their own
/// error type.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut file = AtomicFile::create(path)?;
    file.write_all(bytes)?;
    file.commit()
}

/// A file written in pieces and replaced atomically and durably, as [`write_atomic`] does: the
/// bytes go to `<name>.tmp-<pid>` beside the target, and [`AtomicFile::commit`] syncs it, renames
/// it over the target and syncs the folder. Dropped without a commit (an error on the way), the
/// temporary file is removed and the target is untouched. For outputs too large to hold in
/// memory at once (an embedding index assembled from its shards).
#[derive(Debug)]
pub struct AtomicFile {
    writer: Option<BufWriter<File>>,
    tmp: PathBuf,
    path: PathBuf,
}

impl AtomicFile {
    /// Creates the temporary file beside `path`.
    ///
    /// # Errors
    /// The I/O error of creating it.
    pub fn create(path: &Path) -> std::io::Result<Self> {
        let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
        tmp_name.push(format!(".tmp-{}", std::process::id()));
        let tmp = path.with_file_name(tmp_name);
        let file = File::create(&tmp)?;
        Ok(Self {
            writer: Some(BufWriter::with_capacity(1 << 20, file)),
            tmp,
            path: path.to_path_buf(),
        })
    }

    /// Flushes and syncs the temporary file, renames it over the target and syncs the folder.
    ///
    /// # Errors
    /// The I/O error of any step; the temporary file is then removed.
    pub fn commit(mut self) -> std::io::Result<()> {
        let Some(writer) = self.writer.take() else {
            return Err(std::io::Error::other("the file was already committed"));
        };
        let done = writer
            .into_inner()
            .map_err(std::io::IntoInnerError::into_error)
            .and_then(|f| f.sync_all())
            .and_then(|()| std::fs::rename(&self.tmp, &self.path));
        if let Err(e) = done {
            let _ = std::fs::remove_file(&self.tmp);
            return Err(e);
        }
        match self.path.parent() {
            Some(p) if !p.as_os_str().is_empty() => sync_dir(p),
            _ => sync_dir(Path::new(".")),
        }
        Ok(())
    }
}

impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match &mut self.writer {
            Some(w) => w.write(buf),
            None => Err(std::io::Error::other("the file was already committed")),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match &mut self.writer {
            Some(w) => w.flush(),
            None => Ok(()),
        }
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if self.writer.take().is_some() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
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
    fn a_file_dropped_without_commit_leaves_the_target_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.bin");
        std::fs::write(&path, b"old").unwrap();
        let mut file = AtomicFile::create(&path).unwrap();
        file.write_all(b"part").unwrap();
        drop(file);
        assert_eq!(std::fs::read(&path).unwrap(), b"old");
        let mut file = AtomicFile::create(&path).unwrap();
        file.write_all(b"new ").unwrap();
        file.write_all(b"bytes").unwrap();
        file.commit().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new bytes");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
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
