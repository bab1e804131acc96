//! Packages of calls in the journal: the `Package` record of a package of calls, written
//! before the core sees it (each call that names no version pinned to the one it resolves to
//! now, so the record names what the calls run on), and its calls read back at restore. Their
//! deliveries and ends are journaled as any package's (a refused or deduplicated one gets its
//! `End` at once); their results are not (a restored package of calls runs its undelivered
//! calls again).
//!
//! Under `--fsync always` a package of calls is held, like a package of code, until its
//! record is durable: the client's `ACCEPTED` means that a master crash loses nothing of it.

use rtpool_core::{CallSpec, Event, CALLS_HASH};
use tracing::warn;

use super::{Held, Scheduler};
use crate::journal::{decode_call, encode_call, PackageRecord, Record};

impl Scheduler {
    /// Journals a submission of calls (numbered already); `None` when it is held until its
    /// record is durable (`--fsync always`), else the event, to apply now. One whose calls
    /// resolve to nothing now is not journaled when nothing is held (the core refuses it on
    /// this same state at once).
    pub(super) fn journal_calls(&mut self, mut event: Event) -> Option<Event> {
        let Event::SubmitCalls {
            client,
            package,
            calls,
            opts,
            ..
        } = &mut event
        else {
            return Some(event);
        };
        let Some(journal) = &self.journal else {
            return Some(event);
        };
        let resolvable = self.core.pin_call_versions(calls);
        if !resolvable && self.held.is_empty() {
            self.unjournaled = Some(*package);
            return Some(event);
        }
        let user = self
            .client_users
            .get(&client.0)
            .map(|u| self.user_names[u.0 as usize].clone())
            .unwrap_or_default();
        let record = PackageRecord {
            package: package.0,
            user,
            fn_hash: CALLS_HASH.0,
            fn_code: bytes::Bytes::new(),
            tasks: calls.iter().map(encode_call).collect(),
            opts: opts.clone(),
        };
        self.last_lsn = journal.append(Record::Package(record));
        if self.ack_after_fsync {
            self.held.push_back((self.last_lsn, Held::Event(event)));
            return None;
        }
        Some(event)
    }
}

/// The calls of a replayed package of calls (taking its tasks), an empty list for a package of
/// code, or `None` for a package of calls whose record cannot be read (logged; not restored).
pub(super) fn replayed_calls(record: &mut PackageRecord) -> Option<Vec<CallSpec>> {
    if record.fn_hash != CALLS_HASH.0 {
        return Some(Vec::new());
    }
    let tasks = std::mem::take(&mut record.tasks);
    let calls: Result<Vec<CallSpec>, String> = tasks.iter().map(decode_call).collect();
    match calls {
        Ok(calls) if !calls.is_empty() => Some(calls),
        Ok(_) => None,
        Err(e) => {
            warn!(
                package = record.package,
                "journal: a package of calls cannot be read ({e}); not restored"
            );
            None
        }
    }
}
