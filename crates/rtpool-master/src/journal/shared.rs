//! [`Shared`]: the counters the journal's threads (writer, compactor) update and
//! [`super::Journal::stats`] reads, apart from the threads so that none of them imports another.

use std::sync::atomic::{AtomicBool, AtomicU64};

/// Counters the threads update and [`super::Journal::stats`] reads.
#[derive(Default)]
pub(super) struct Shared {
    /// Durations of the `fdatasync`s of `journal.log`, for the status snapshot and metrics.
    pub(super) fsync_us: crate::status::histogram::AtomicBuckets,
    pub(super) watermark: AtomicU64,
    pub(super) failed: AtomicBool,
    pub(super) dropped_warned: AtomicBool,
    /// Size of `journal.log`, published after each whole group write (a running compaction
    /// copies up to it).
    pub(super) file_bytes: AtomicU64,
    pub(super) records: AtomicU64,
    pub(super) bytes_written: AtomicU64,
    pub(super) groups: AtomicU64,
    pub(super) fsyncs: AtomicU64,
    pub(super) compactions: AtomicU64,
    pub(super) compactions_cancelled: AtomicU64,
    pub(super) compacting: AtomicBool,
    pub(super) last_group_records: AtomicU64,
    pub(super) last_group_bytes: AtomicU64,
    pub(super) max_group_records: AtomicU64,
    pub(super) written_lsn: AtomicU64,
    pub(super) synced_lsn: AtomicU64,
    pub(super) last_compaction_us: AtomicU64,
    /// How long the writer paused appends to install the last compaction, microseconds.
    pub(super) last_compaction_pause_us: AtomicU64,
    /// Estimated bytes of records waiting in the queue.
    pub(super) queued_bytes: AtomicU64,
    /// Capacity of the writer thread's group buffer, bytes.
    pub(super) buffer_bytes: AtomicU64,
    /// Appends that waited for room in the queue, and how long in all (microseconds).
    pub(super) backpressure_waits: AtomicU64,
    pub(super) backpressure_us: AtomicU64,
}
