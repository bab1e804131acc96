//! The data dir's guard: one master per data dir, and nothing in it readable by others.
//!
//! Two masters on one data dir interleave their journals and lose acknowledged packages, so a
//! master takes an exclusive lock on `<data-dir>/master.lock` before it reads or writes anything
//! there, and holds it for its whole life. The lock is an OS file lock (`flock`), which the
//! kernel releases when the process dies, however it dies: a master restarted after `kill -9`
//! takes it again, with no stale lock file to delete by hand. The file holds the holder's pid
//! and address, so a second master refuses to start with a message naming both.
//!
//! The data dir holds the journal (code, arguments and results of every live package), the
//! store (who may connect, how much they used) and the tokens: the dir is made `0700` and the
//! files `0600`, and a dir found more open is tightened, with a log line. What each file holds
//! is its owner's business ([`crate::journal`], [`crate::store`], [`crate::auth`]); this module
//! only guards the dir.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// Why the data dir cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another process holds the lock.
    #[error("data dir {path} is in use by another master (pid {pid}, listening on {address}); stop it first, or give this master another --data-dir")]
    InUse {
        /// The data dir.
        path: PathBuf,
        /// The holder's pid, as its lock file says.
        pid: String,
        /// The holder's listen address, as its lock file says (`starting` before it bound).
        address: String,
    },
    /// The dir or the lock file could not be created, opened or locked.
    #[error("cannot use data dir {path}: {source}; check that it exists and is writable")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

/// Name of the lock file in the data dir.
pub const LOCK_FILE: &str = "master.lock";

/// Files of the data dir that are made owner-only at start-up when found more open.
const PRIVATE_FILES: &[&str] = &[
    "journal.log",
    "journal.log.compact",
    "rtpool.db",
    "rtpool.db-wal",
    "rtpool.db-shm",
    "client.token",
    "worker.token",
    "tls/key.pem",
    LOCK_FILE,
];

/// The exclusive lock on a data dir, held while this value lives (the kernel drops it when the
/// process dies).
#[derive(Debug)]
pub struct DataDirLock {
    file: File,
    path: PathBuf,
}

impl DataDirLock {
    /// Create `dir` (mode `0700`) if missing, tighten it and its files when they are open to
    /// others, and take its lock, writing this process's pid into the lock file.
    ///
    /// # Errors
    /// [`LockError::InUse`] when another process holds the lock (naming its pid and address),
    /// [`LockError::Io`] when the dir or the lock file cannot be used.
    pub fn acquire(dir: &Path) -> Result<Self, LockError> {
        prepare_dir(dir)?;
        let path = dir.join(LOCK_FILE);
        let io_err = |source| LockError::Io {
            path: path.clone(),
            source,
        };
        let mut opts = OpenOptions::new();
        opts.read(true).write(true).create(true).truncate(false);
        let mut file = private(&mut opts).open(&path).map_err(io_err)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let (pid, address) = parse_holder(&holder);
                return Err(LockError::InUse {
                    path: dir.to_path_buf(),
                    pid,
                    address,
                });
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io_err(e)),
        }
        let mut lock = Self {
            file,
            path: path.clone(),
        };
        lock.write_holder(None).map_err(io_err)?;
        Ok(lock)
    }

    /// Record the address this master listens on, for the message a second master prints.
    pub fn set_address(&mut self, addr: SocketAddr) {
        if let Err(e) = self.write_holder(Some(addr)) {
            tracing::warn!("cannot write {}: {e}", self.path.display());
        }
    }

    fn write_holder(&mut self, addr: Option<SocketAddr>) -> std::io::Result<()> {
        let address = addr.map_or_else(|| "starting".to_string(), |a| a.to_string());
        self.file.set_len(0)?;
        self.file.seek(SeekFrom::Start(0))?;
        writeln!(self.file, "pid {}", std::process::id())?;
        writeln!(self.file, "address {address}")?;
        self.file.flush()
    }
}

/// The pid and address a lock file names ("unknown" for what it does not hold).
fn parse_holder(text: &str) -> (String, String) {
    let field = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key).map(|v| v.trim().to_string()))
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| "unknown".into())
    };
    (field("pid "), field("address "))
}

/// Make `opts` create files owner-only (`0600`) on Unix; the journal, store and token writers
/// use it for every file they create in the data dir.
pub fn private(opts: &mut OpenOptions) -> &mut OpenOptions {
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    opts
}

/// Create `dir` owner-only, or tighten an existing one (and its known files) that others can
/// read, logging what changed.
fn prepare_dir(dir: &Path) -> Result<(), LockError> {
    let dir_err = |source| LockError::Io {
        path: dir.to_path_buf(),
        source,
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(dir_err)?;
        // Not fatal: a dir we do not own (a volume's root mounted with a group, as Kubernetes
        // does with `fsGroup`) cannot be changed by us; its files still are made 0600.
        if let Err(e) = tighten(dir, 0o700) {
            tracing::warn!(
                "cannot make data dir {} owner-only ({e}); make it mode 0700 yourself",
                dir.display()
            );
        }
        for name in PRIVATE_FILES {
            let path = dir.join(name);
            // Missing files are fine; one we cannot tighten is logged, not fatal.
            if path.exists() {
                if let Err(e) = tighten(&path, 0o600) {
                    tracing::warn!("cannot make {} owner-only: {e}", path.display());
                }
            }
        }
    }
    #[cfg(not(unix))]
    std::fs::create_dir_all(dir).map_err(dir_err)?;
    Ok(())
}

/// Set `path`'s mode to `mode` when it grants more (group or others bits), with a log line.
#[cfg(unix)]
fn tighten(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let old = std::fs::metadata(path)?.permissions().mode() & 0o777;
    if old & !mode != 0 {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
        tracing::warn!(
            "{} was mode {old:04o}, readable by others; made it {mode:04o} (it holds tasks' code, \
             arguments, results or credentials)",
            path.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_names_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let mut first = DataDirLock::acquire(&data).unwrap();
        first.set_address("127.0.0.1:7070".parse().unwrap());
        let err = DataDirLock::acquire(&data).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("pid {}", std::process::id())),
            "{msg}"
        );
        assert!(msg.contains("127.0.0.1:7070"), "{msg}");
        drop(first);
        DataDirLock::acquire(&data).expect("the lock is free once its holder is gone");
    }

    #[cfg(unix)]
    #[test]
    fn an_open_dir_and_its_files_are_tightened() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir(&data).unwrap();
        std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(data.join("journal.log"), b"x").unwrap();
        std::fs::set_permissions(
            data.join("journal.log"),
            std::fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        let _lock = DataDirLock::acquire(&data).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&data), 0o700);
        assert_eq!(mode(&data.join("journal.log")), 0o600);
        assert_eq!(mode(&data.join(LOCK_FILE)), 0o600);
    }

    #[test]
    fn holder_lines_parse() {
        assert_eq!(
            parse_holder("pid 12\naddress 1.2.3.4:5\n"),
            ("12".into(), "1.2.3.4:5".into())
        );
        assert_eq!(parse_holder(""), ("unknown".into(), "unknown".into()));
    }
}
