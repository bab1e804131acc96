//! Compaction in the background: a thread of its own rewrites the journal while the writer
//! thread goes on appending to it, like Redis's AOF rewrite.
//!
//! The writer starts a [`Compactor`] at a cut: the file's size after a group write, so every
//! byte before it is a whole record. The compactor reads the records before the cut (streamed,
//! never the whole file in memory), writes their compacted form to `<path>.compact` (see
//! `compact.rs`), then copies the bytes the writer appended since the cut, as they are, in
//! rounds until little is left. The writer finishes the job on its own thread
//! (`thread.rs`): it copies the last few bytes, fsyncs, renames. Replaying the result gives
//! the same state as replaying the file it replaces: the compacted prefix replays to the
//! prefix's state, and the records after it apply to that state as they did before.
//!
//! A cancelled compaction (the journal is closing) stops within one chunk of reading, one
//! package written or one fsync of at most [`compact::SYNC_EVERY_BYTES`], and leaves the old
//! file whole: nothing is renamed until the writer says so.

use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::thread::JoinHandle;

use super::compact;
use super::frame::{self, HEADER_BYTES, MAX_PAYLOAD_BYTES};
use super::record;
use super::replay::State;
use super::shared::Shared;
use super::JournalError;

/// Bytes left to copy below which the compactor hands over to the writer.
const HANDOVER_BYTES: u64 = 1 << 20;

/// Most rounds of tail copying before handing over whatever is left.
const MAX_TAIL_ROUNDS: usize = 16;

/// What a compactor thread leaves for the writer.
#[derive(Debug)]
pub(super) struct Done {
    /// `<path>.compact`, open for appending, holding the compacted prefix and the copied tail.
    pub(super) file: File,
    /// Its size.
    pub(super) size: u64,
    /// Offset in `journal.log` up to which it holds everything.
    pub(super) copied_to: u64,
}

/// How a compaction ended.
pub(super) enum Outcome {
    /// Ready to install.
    Done(Done),
    /// Cancelled before it finished.
    Cancelled,
    /// Failed; the old file stays.
    Failed(JournalError),
}

/// A compaction running in its own thread.
pub(super) struct Compactor {
    cancel: Arc<AtomicBool>,
    thread: JoinHandle<Outcome>,
}

impl Compactor {
    /// Starts compacting `path` up to `cut` bytes, dropping charges at or below `watermark`.
    /// `shared.file_bytes` tells it how far the writer has written since.
    pub(super) fn start(
        path: PathBuf,
        cut: u64,
        watermark: u64,
        shared: Arc<Shared>,
        bytes_per_s: u64,
    ) -> Result<Compactor, JournalError> {
        let cancel = Arc::new(AtomicBool::new(false));
        let flag = cancel.clone();
        let thread = std::thread::Builder::new()
            .name("rtpool-compact".into())
            .spawn(move || run(&path, cut, watermark, &shared, &flag, bytes_per_s))
            .map_err(|e| JournalError::io("start compaction thread for", Path::new("."), e))?;
        Ok(Compactor { cancel, thread })
    }

    /// Whether it has finished (then [`Compactor::join`] does not wait).
    pub(super) fn is_finished(&self) -> bool {
        self.thread.is_finished()
    }

    /// Its outcome, waiting for it.
    pub(super) fn join(self) -> Outcome {
        self.thread.join().unwrap_or_else(|_| {
            Outcome::Failed(JournalError::io(
                "compact",
                Path::new("journal"),
                std::io::Error::other("the compaction thread panicked"),
            ))
        })
    }

    /// Asks it to stop, waits for it and removes what it wrote.
    pub(super) fn cancel(self, path: &Path) {
        self.cancel.store(true, SeqCst);
        let _ = self.join();
        let _ = std::fs::remove_file(compact::tmp_path(path));
    }
}

/// The compactor thread's body.
fn run(
    path: &Path,
    cut: u64,
    watermark: u64,
    shared: &Shared,
    cancel: &AtomicBool,
    bytes_per_s: u64,
) -> Outcome {
    let result = (|| {
        let Some(state) = read_prefix(path, cut, watermark, cancel)? else {
            return Ok(None);
        };
        let pace = compact::Pace::new(bytes_per_s);
        let Some((file, size)) = compact::write(path, &state, watermark, cancel, &pace)? else {
            return Ok(None);
        };
        drop(state);
        copy_tail(path, file, size, cut, shared, cancel)
    })();
    match result {
        Ok(Some(done)) => Outcome::Done(done),
        Ok(None) => Outcome::Cancelled,
        Err(err) => Outcome::Failed(err),
    }
}

/// The state the first `cut` bytes of `path` describe, read one frame at a time, without the
/// charges at or below `watermark`; `None` when cancelled.
///
/// # Errors
///
/// Any bad record is [`JournalError::Corrupt`]: this thread's own writer wrote every byte.
fn read_prefix(
    path: &Path,
    cut: u64,
    watermark: u64,
    cancel: &AtomicBool,
) -> Result<Option<State>, JournalError> {
    let file = File::open(path).map_err(|e| JournalError::io("read", path, e))?;
    let mut input = BufReader::with_capacity(1 << 20, file.take(cut));
    let corrupt = |offset: u64, reason: String| JournalError::Corrupt {
        path: path.to_owned(),
        offset,
        reason,
    };
    let mut state = State::default();
    state.drop_charges_upto = watermark;
    let mut buf = Vec::new();
    let mut off = 0u64;
    let mut since_check = 0usize;
    while off < cut {
        buf.resize(HEADER_BYTES, 0);
        input
            .read_exact(&mut buf)
            .map_err(|e| corrupt(off, format!("cannot read a header: {e}")))?;
        let len = u32::from_le_bytes(buf[4..8].try_into().expect("4 bytes")) as usize;
        if len > MAX_PAYLOAD_BYTES {
            return Err(corrupt(off, format!("impossible record length {len}")));
        }
        buf.resize(HEADER_BYTES + len, 0);
        input
            .read_exact(&mut buf[HEADER_BYTES..])
            .map_err(|e| corrupt(off, format!("cannot read a payload: {e}")))?;
        let f = frame::check(&buf, 0).map_err(|r| corrupt(off, r))?;
        let entry = record::decode(f.payload).map_err(|r| corrupt(off, r))?;
        state.apply(f.lsn, entry);
        off += buf.len() as u64;
        since_check += buf.len();
        if since_check >= 1 << 20 {
            since_check = 0;
            if cancel.load(SeqCst) {
                return Ok(None);
            }
        }
    }
    Ok(Some(state))
}

/// Copies what the writer appended after `from` to `out`, in rounds while the writer keeps
/// appending, until less than [`HANDOVER_BYTES`] is left; then fsyncs `out`.
fn copy_tail(
    path: &Path,
    mut out: File,
    mut size: u64,
    from: u64,
    shared: &Shared,
    cancel: &AtomicBool,
) -> Result<Option<Done>, JournalError> {
    let tmp = compact::tmp_path(path);
    let mut input = File::open(path).map_err(|e| JournalError::io("read", path, e))?;
    let mut copied_to = from;
    for _ in 0..MAX_TAIL_ROUNDS {
        if cancel.load(SeqCst) {
            return Ok(None);
        }
        // Published after each whole group write: everything below it is whole records.
        let end = shared.file_bytes.load(SeqCst);
        if end.saturating_sub(copied_to) < HANDOVER_BYTES {
            break;
        }
        size += copy_range(&mut input, path, &mut out, &tmp, copied_to, end)?;
        copied_to = end;
    }
    out.sync_data()
        .map_err(|e| JournalError::io("fsync", &tmp, e))?;
    Ok(Some(Done {
        file: out,
        size,
        copied_to,
    }))
}

/// Copies bytes `from..to` of `input` (at `path`) to the end of `out` (at `tmp`); returns how
/// many.
pub(super) fn copy_range(
    input: &mut File,
    path: &Path,
    out: &mut File,
    tmp: &Path,
    from: u64,
    to: u64,
) -> Result<u64, JournalError> {
    input
        .seek(SeekFrom::Start(from))
        .map_err(|e| JournalError::io("read", path, e))?;
    let want = to.saturating_sub(from);
    let copied = std::io::copy(&mut input.take(want), out)
        .map_err(|e| JournalError::io("copy the tail of", path, e))?;
    if copied != want {
        let short = std::io::Error::other(format!("copied {copied} of {want} bytes"));
        return Err(JournalError::io("copy the tail of", path, short));
    }
    out.flush().map_err(|e| JournalError::io("write", tmp, e))?;
    Ok(copied)
}
