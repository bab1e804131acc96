//! Reading a journal file back: what its records mean, and the torn-tail repair at open.
//!
//! This module owns [`State`] (the live packages, charges and counters a file describes) and
//! the scan that builds it. Open and compaction both use the scan: open repairs a torn tail,
//! compaction treats any bad record as an error since it reads a file the writer just wrote.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fs::OpenOptions;
use std::path::Path;

use super::frame;
use super::record::{self, DoneRecord, Entry, PackageRecord, Record};
use super::{JournalError, Replay, ReplayedPackage};

/// A package not ended, with the LSNs compaction keeps.
#[derive(Debug, Clone)]
pub(crate) struct LivePackage {
    /// LSN of its `Package` record.
    pub(crate) lsn: u64,
    pub(crate) record: PackageRecord,
    /// `(lsn, result)` of results not delivered, in journal order.
    pub(crate) done: Vec<(u64, DoneRecord)>,
    pub(crate) delivered: BTreeSet<u32>,
    /// Highest LSN of a `Delivered` record of this package (0 when none).
    pub(crate) delivered_lsn: u64,
}

/// What a sequence of records describes.
#[derive(Debug, Default)]
pub(crate) struct State {
    pub(crate) live: BTreeMap<u64, LivePackage>,
    /// User (an index in `user_names`) of every package whose `Package` record was read,
    /// ended or not, to charge its `Done` records.
    users: HashMap<u64, u32>,
    /// Each user name once: a long journal has one charge per result, and a name per charge
    /// would multiply the memory replay and compaction take.
    user_names: Vec<String>,
    user_ids: HashMap<String, u32>,
    pub(crate) next_package: u64,
    /// `(user index, exec_us, lsn)`, in file order.
    pub(crate) charges: Vec<(u32, u64, u64)>,
    /// Charges with an LSN at or below this are not kept: compaction sets it to the watermark
    /// (the user store has them), so they cost it no memory.
    pub(crate) drop_charges_upto: u64,
    pub(crate) last_lsn: u64,
    /// Records applied, meta records not counted.
    pub(crate) records: u64,
    /// Version of the file's meta record; `None` before one was read.
    pub(crate) format_version: Option<u64>,
}

impl State {
    /// Applies one entry read at LSN `lsn`.
    pub(crate) fn apply(&mut self, lsn: u64, entry: Entry) {
        self.last_lsn = self.last_lsn.max(lsn);
        let rec = match entry {
            Entry::Meta {
                version,
                next_package,
                last_lsn,
            } => {
                self.format_version.get_or_insert(version);
                self.next_package = self.next_package.max(next_package);
                self.last_lsn = self.last_lsn.max(last_lsn);
                return;
            }
            Entry::Record(rec) => rec,
        };
        self.records += 1;
        match rec {
            Record::Package(p) => self.on_package(lsn, p),
            Record::Done(d) => self.on_done(lsn, d),
            Record::Delivered { package, indices } => {
                if let Some(live) = self.live.get_mut(&package) {
                    live.delivered.extend(indices);
                    live.delivered_lsn = live.delivered_lsn.max(lsn);
                    let delivered = &live.delivered;
                    live.done.retain(|(_, d)| !delivered.contains(&d.index));
                }
            }
            Record::End { package } => {
                self.live.remove(&package);
            }
            Record::Charge { user, exec_us } => {
                let user = self.intern(user);
                self.charge(user, exec_us, lsn);
            }
        }
    }

    fn on_package(&mut self, lsn: u64, p: PackageRecord) {
        self.next_package = self.next_package.max(p.package.saturating_add(1));
        let user = self.intern(p.user.clone());
        self.users.insert(p.package, user);
        let live = LivePackage {
            lsn,
            record: p,
            done: Vec::new(),
            delivered: BTreeSet::new(),
            delivered_lsn: 0,
        };
        if let Some(old) = self.live.insert(live.record.package, live) {
            // The caller never reuses a live id; if it did, the later package wins.
            tracing::warn!(
                package = old.record.package,
                lsn,
                "journal: a Package record replaces a live package of the same id"
            );
        }
    }

    fn on_done(&mut self, lsn: u64, d: DoneRecord) {
        match self.users.get(&d.package) {
            Some(&user) => self.charge(user, d.exec_us, lsn),
            None => tracing::warn!(
                package = d.package,
                lsn,
                "journal: Done record of an unknown package is not charged"
            ),
        }
        if let Some(live) = self.live.get_mut(&d.package) {
            if !live.delivered.contains(&d.index) {
                live.done.push((lsn, d));
            }
        }
    }

    /// The index of `user` in `user_names`, adding it if new.
    fn intern(&mut self, user: String) -> u32 {
        if let Some(&id) = self.user_ids.get(&user) {
            return id;
        }
        let id = u32::try_from(self.user_names.len()).expect("fewer than 2^32 users");
        self.user_names.push(user.clone());
        self.user_ids.insert(user, id);
        id
    }

    fn charge(&mut self, user: u32, exec_us: u64, lsn: u64) {
        if lsn > self.drop_charges_upto {
            self.charges.push((user, exec_us, lsn));
        }
    }

    /// The name of an interned user.
    pub(crate) fn user_name(&self, user: u32) -> &str {
        &self.user_names[user as usize]
    }

    /// LSNs of the `Done` records the live state still holds.
    pub(crate) fn kept_done_lsns(&self) -> HashSet<u64> {
        self.live
            .values()
            .flat_map(|p| p.done.iter().map(|(lsn, _)| *lsn))
            .collect()
    }

    /// The public view of this state; timing and repair fields are filled by the caller.
    pub(crate) fn into_replay(self) -> Replay {
        let names = self.user_names;
        let mut charges: Vec<(String, u64, u64)> = self
            .charges
            .into_iter()
            .map(|(user, exec_us, lsn)| (names[user as usize].clone(), exec_us, lsn))
            .collect();
        charges.sort_by_key(|c| c.2);
        // In the order they were accepted, not by id: a held dependent (option `after`) is
        // restored after its producer, which it must find live to be held again (ids are not
        // monotonic across master instances, and a dependent may have the lower one).
        let mut live: Vec<LivePackage> = self.live.into_values().collect();
        live.sort_unstable_by_key(|p| p.lsn);
        Replay {
            packages: live
                .into_iter()
                .map(|p| ReplayedPackage {
                    record: p.record,
                    done: p.done.into_iter().map(|(_, d)| d).collect(),
                    delivered: p.delivered.into_iter().collect(),
                })
                .collect(),
            next_package: self.next_package,
            charges,
            records: self.records,
            bytes: 0,
            elapsed: std::time::Duration::ZERO,
            truncated_tail: None,
            last_lsn: self.last_lsn,
            format_version: self.format_version.unwrap_or(record::FORMAT_VERSION),
        }
    }
}

/// The result of scanning a file's bytes.
#[derive(Debug)]
pub(crate) struct Scan {
    pub(crate) state: State,
    /// End of the last whole record.
    pub(crate) end: usize,
    /// Offset and reason of a bad record with nothing valid after it: a torn tail.
    pub(crate) torn: Option<(usize, String)>,
}

/// Applies every record of `buf` (the contents of `path`).
///
/// # Errors
///
/// [`JournalError::Corrupt`] for a record that passed its CRC but does not decode, or for a bad
/// record with a valid one anywhere after it.
pub(crate) fn scan(buf: &[u8], path: &Path) -> Result<Scan, JournalError> {
    let corrupt = |offset: usize, reason: String| JournalError::Corrupt {
        path: path.to_owned(),
        offset: offset as u64,
        reason,
    };
    let mut state = State::default();
    let mut off = 0;
    // Each round consumes at least one header's worth of bytes, so this ends.
    while off < buf.len() {
        match frame::check(buf, off) {
            Ok(f) => {
                let entry = record::decode(f.payload).map_err(|r| corrupt(off, r))?;
                if let record::Entry::Meta { version, .. } = entry {
                    if version < record::MIN_FORMAT_VERSION {
                        return Err(JournalError::RetiredFormat {
                            path: path.to_owned(),
                            version,
                        });
                    }
                }
                state.apply(f.lsn, entry);
                off = f.end;
            }
            Err(reason) => {
                if let Some(valid) = frame::find_valid(buf, off + 1) {
                    let reason = format!("{reason} (a valid record starts at offset {valid})");
                    return Err(corrupt(off, reason));
                }
                return Ok(Scan {
                    state,
                    end: off,
                    torn: Some((off, reason)),
                });
            }
        }
    }
    Ok(Scan {
        state,
        end: off,
        torn: None,
    })
}

/// Reads `path` (a missing file is an empty journal), cuts a torn tail off the file, and
/// returns what it holds, with `bytes` and `truncated_tail` filled in.
pub(crate) fn recover(path: &Path) -> Result<Replay, JournalError> {
    let buf = match std::fs::read(path) {
        Ok(buf) => buf,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(JournalError::io("read", path, e)),
    };
    let scan = scan(&buf, path)?;
    let mut truncated_tail = None;
    if let Some((offset, reason)) = &scan.torn {
        let cut = buf.len() - offset;
        tracing::warn!(
            path = %path.display(),
            offset,
            bytes_cut = cut,
            reason = %reason,
            "journal: cutting off a torn last record (the master stopped mid-write)"
        );
        let file = OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(|e| JournalError::io("open", path, e))?;
        file.set_len(*offset as u64)
            .map_err(|e| JournalError::io("truncate", path, e))?;
        file.sync_all()
            .map_err(|e| JournalError::io("fsync", path, e))?;
        truncated_tail = Some((*offset as u64, cut as u64));
    }
    Ok(Replay {
        bytes: scan.end as u64,
        truncated_tail,
        ..scan.state.into_replay()
    })
}
