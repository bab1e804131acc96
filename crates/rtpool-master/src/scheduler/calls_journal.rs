//! Packages of calls in the journal: the `Package` record of an accepted package of calls
//! (written once the core accepted it, with the version each call was resolved to), and its
//! calls read back at restore. Their deliveries and ends are journaled as any package's; their
//! results are not (a restored package of calls runs its undelivered calls again).
//!
//! Under `--fsync always` a package of calls is acknowledged before its record is durable
//! (within the journal's next sync): the core resolves the versions the record names.

use rtpool_core::{CallSpec, ClientId, PackageId, PackageOpts, CALLS_HASH};
use tracing::warn;

use super::Scheduler;
use crate::journal::{decode_call, encode_call, PackageRecord, Record};

impl Scheduler {
    /// Journals the package of calls the core just accepted as `package`.
    pub(super) fn journal_calls(
        &mut self,
        package: PackageId,
        client: ClientId,
        mut calls: Vec<CallSpec>,
        opts: PackageOpts,
    ) {
        let Some(journal) = &self.journal else {
            return;
        };
        if let Some(versions) = self.core.call_versions(package) {
            for (call, version) in calls.iter_mut().zip(versions) {
                if !version.is_empty() {
                    call.version = version;
                }
            }
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
            opts,
        };
        self.last_lsn = journal.append(Record::Package(record));
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
