//! What the scheduler journals for the core's actions (results, deliveries, ends) and for an
//! accepted package of code; `calls_journal.rs` does the same for packages of calls.

use bytes::Bytes;
use rtpool_core::{Action, Event, FnHash, PackageId, PackageOpts};
use rtpool_proto::Msg;

use super::Scheduler;
use crate::journal::{DoneRecord, Journal, PackageRecord, Record};

impl Scheduler {
    /// Appends the journal record an action implies, if any.
    pub(super) fn journal_action(&mut self, action: &Action) {
        let Some(journal) = &self.journal else {
            return;
        };
        // The core marks what must be journaled (not the results, deliveries and end of a
        // package of calls).
        if !action.is_journaled() {
            return;
        }
        match action {
            Action::SendResults {
                package, results, ..
            } => {
                for r in results {
                    self.last_lsn = journal.append(Record::Done(DoneRecord {
                        package: package.0,
                        index: r.index,
                        status: r.status as u8,
                        data: r.data.clone(),
                        exec_us: r.exec_us,
                        late_us: r.late_us,
                    }));
                }
            }
            Action::Delivered {
                package, indices, ..
            } => {
                self.last_lsn = journal.append(Record::Delivered {
                    package: package.0,
                    indices: indices.clone(),
                });
            }
            Action::PackageFreed { package, .. } => {
                self.last_lsn = journal.append(Record::End { package: package.0 });
            }
            _ => {}
        }
    }
}

impl Scheduler {
    /// A submission the journal cannot make durable now (its PostgreSQL database is
    /// unreachable) is refused at once with `ERROR rejected` saying so, rather than left
    /// unanswered: the client may retry (another master may have taken over by then).
    /// Returns whether it refused `event`.
    pub(super) fn refuse_unjournalable(&self, event: &Event) -> bool {
        let (client, req_id) = match event {
            Event::Submit { client, req_id, .. } | Event::SubmitCalls { client, req_id, .. } => {
                (*client, *req_id)
            }
            _ => return false,
        };
        let Some(reason) = self.journal.as_ref().and_then(Journal::unavailable) else {
            return false;
        };
        let msg = Msg::Error {
            code: "rejected".into(),
            message: reason,
            reference: req_id,
        };
        // At once, even past acknowledgements still held (they wait for the same database, and
        // may never come): the client matches answers by `req_id`.
        self.reply(client.0, msg, false);
        true
    }
}

/// The journal record of an accepted package.
pub(super) fn package_record(
    package: PackageId,
    user: String,
    fn_hash: FnHash,
    fn_code: &Bytes,
    opts: &PackageOpts,
    tasks: &[Bytes],
) -> PackageRecord {
    PackageRecord {
        package: package.0,
        user,
        fn_hash: fn_hash.0,
        fn_code: fn_code.clone(),
        tasks: tasks.to_vec(),
        opts: opts.clone(),
    }
}
