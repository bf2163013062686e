//! The state machine's snapshot as a file of its own beside the sled database.
//!
//! sled 0.34 stores any value over a quarter of its 512 KiB segment in a separate file
//! under `blobs/` and never fsyncs that file (`pagecache/blob_io.rs`): `flush` makes the
//! pointer to it durable, not its bytes, so after a power loss a peer would find its
//! snapshot unreadable. A snapshot (megabytes) is therefore written here: to a temporary
//! file, fsynced, renamed over the previous one, and the directory fsynced, so the file
//! always holds either the old snapshot or the new one, whole. A checksum in the header
//! tells a damaged file from a valid one.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use xxhash_rust::xxh3::xxh3_64;

/// The file's name in the data directory.
pub const FILE: &str = "snapshot.bin";
const MAGIC: &[u8; 8] = b"RTRSNAP1";
const HEADER: usize = 8 + 8 + 8 + 8;

/// The snapshot file of one data directory.
#[derive(Debug)]
pub struct SnapshotFile {
    dir: PathBuf,
    /// Distinct temporary names for writers that overlap (a build and an install).
    seq: AtomicU64,
    /// Serialises replacements: the file only ever moves forward in the log.
    write: std::sync::Mutex<Option<u64>>,
}

impl SnapshotFile {
    /// The snapshot file in `dir` (created if missing).
    pub fn new(dir: &Path) -> std::io::Result<SnapshotFile> {
        std::fs::create_dir_all(dir)?;
        Ok(SnapshotFile {
            dir: dir.to_path_buf(),
            seq: AtomicU64::new(0),
            write: std::sync::Mutex::new(None),
        })
    }

    fn path(&self) -> PathBuf {
        self.dir.join(FILE)
    }

    /// The stored snapshot's log index and bytes, `None` without one. A file that is cut
    /// short or whose checksum does not match is an error, never an empty state.
    pub fn read(&self) -> std::io::Result<Option<(u64, Vec<u8>)>> {
        let mut f = match File::open(self.path()) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut head = [0u8; HEADER];
        f.read_exact(&mut head)
            .map_err(|e| damaged(&self.path(), &e))?;
        let word = |i: usize| u64::from_le_bytes(head[i..i + 8].try_into().unwrap_or([0; 8]));
        if &head[..8] != MAGIC {
            return Err(damaged(&self.path(), &"not a snapshot file"));
        }
        let (index, len, sum) = (word(8), word(16), word(24));
        let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
        f.take(len)
            .read_to_end(&mut bytes)
            .map_err(|e| damaged(&self.path(), &e))?;
        if bytes.len() as u64 != len || xxh3_64(&bytes) != sum {
            return Err(damaged(&self.path(), &"cut short or checksum mismatch"));
        }
        Ok(Some((index, bytes)))
    }

    /// Makes `bytes`, the snapshot up to log index `index`, the stored one, durably,
    /// unless the stored one is newer (an overlapping build of older state finishing
    /// last must not take the file back). Returns whether it was written.
    pub fn replace(&self, index: u64, bytes: &[u8]) -> std::io::Result<bool> {
        let mut current = self.write.lock().unwrap_or_else(|e| e.into_inner());
        if current.is_none() {
            *current = self.read_index()?;
        }
        if current.is_some_and(|c| c > index) {
            return Ok(false);
        }
        let n = self.seq.fetch_add(1, Relaxed);
        let tmp = self
            .dir
            .join(format!("{FILE}.{}.{n}.tmp", std::process::id()));
        let res = (|| {
            let mut f = File::create(&tmp)?;
            let mut head = Vec::with_capacity(HEADER);
            head.extend_from_slice(MAGIC);
            head.extend_from_slice(&index.to_le_bytes());
            head.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
            head.extend_from_slice(&xxh3_64(bytes).to_le_bytes());
            f.write_all(&head)?;
            f.write_all(bytes)?;
            f.sync_all()?;
            std::fs::rename(&tmp, self.path())?;
            // The rename is durable only once the directory is.
            File::open(&self.dir)?.sync_all()
        })();
        if res.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        res?;
        *current = Some(index);
        Ok(true)
    }

    /// The stored snapshot's log index, reading only the header.
    fn read_index(&self) -> std::io::Result<Option<u64>> {
        let mut f = match File::open(self.path()) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut head = [0u8; HEADER];
        f.read_exact(&mut head)
            .map_err(|e| damaged(&self.path(), &e))?;
        Ok(Some(u64::from_le_bytes(
            head[8..16].try_into().unwrap_or([0; 8]),
        )))
    }

    /// Removes temporary files a crash left behind.
    pub fn clean(&self) {
        let Ok(dir) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for e in dir.flatten() {
            let name = e.file_name();
            let name = name.to_string_lossy();
            if name.starts_with(FILE) && name.ends_with(".tmp") {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

fn damaged(path: &Path, why: &dyn std::fmt::Display) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!("snapshot {} is damaged: {why}", path.display()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("snapfile-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn replaces_forward_only_and_detects_damage() {
        let d = dir("fwd");
        let f = SnapshotFile::new(&d).unwrap();
        assert!(f.read().unwrap().is_none());
        assert!(f.replace(10, b"ten").unwrap());
        assert!(f.replace(20, b"twenty").unwrap());
        // An older build finishing last leaves the newer snapshot in place.
        assert!(!f.replace(15, b"fifteen").unwrap());
        assert_eq!(f.read().unwrap(), Some((20, b"twenty".to_vec())));
        // A second handle (a restart) sees the same and keeps the order.
        let g = SnapshotFile::new(&d).unwrap();
        assert!(!g.replace(19, b"x").unwrap());
        assert_eq!(g.read().unwrap(), Some((20, b"twenty".to_vec())));
        // A flipped byte or a cut file is refused, not read as no snapshot.
        let p = d.join(FILE);
        let mut raw = std::fs::read(&p).unwrap();
        let last = raw.len() - 1;
        raw[last] ^= 1;
        std::fs::write(&p, &raw).unwrap();
        assert!(g.read().is_err());
        std::fs::write(&p, &raw[..raw.len() - 2]).unwrap();
        assert!(g.read().is_err());
        // No temporary file is left behind.
        std::fs::write(d.join(format!("{FILE}.1.2.tmp")), b"junk").unwrap();
        g.clean();
        let names: Vec<_> = std::fs::read_dir(&d)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from(FILE)]);
        let _ = std::fs::remove_dir_all(&d);
    }
}
