//! Gauges a running master reports ([`MasterStats`]): the core's, the connections', the
//! journal's and real-time mode's. The scheduler fills them in; [`crate::handle`] and the
//! Python module read them.

use rtpool_core::CoreStats;

use crate::realtime::RealtimeReport;

/// Gauges of a running master.
#[derive(Debug, Clone, Default)]
pub struct MasterStats {
    /// The core's gauges and counters.
    pub core: CoreStats,
    /// Authenticated connections.
    pub connections: usize,
    /// The journal's counters, if there is a journal.
    pub journal: Option<crate::journal::JournalStats>,
    /// What the journal replayed at start-up.
    pub replay: Option<ReplayStats>,
    /// What real-time mode achieved, when it was asked for.
    pub realtime: Option<RealtimeReport>,
}

/// The journal replay at start-up.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReplayStats {
    /// Records read.
    pub records: u64,
    /// Bytes read.
    pub bytes: u64,
    /// Time taken, microseconds.
    pub elapsed_us: u64,
    /// Live packages found.
    pub packages: usize,
}
