//! Journal records and their msgpack payloads.
//!
//! This module owns the [`Record`] types and the payload layout (one msgpack array per record,
//! first element a tag), read and written with `rtpool_proto::msgpack`, the workspace's one
//! msgpack layer. A package's options are the wire's [`PackageOpts`], stored as the same
//! options map a `SUBMIT` carries, so a new option is journaled without a change here. Framing
//! (magic, length, CRC, LSN) is [`super::frame`]'s; what a sequence of records means is
//! [`super::replay`]'s; the layouts of older versions are `legacy.rs`'s. The layout is
//! documented in `docs/journal.md`; changing it means a new [`FORMAT_VERSION`].

mod call;
mod legacy;
#[cfg(test)]
mod tests;

use bytes::Bytes;
use rtpool_core::PackageOpts;
use rtpool_proto::msgpack::{Reader, Writer};
use rtpool_proto::{ProtoError, OPTS};

pub use self::call::{decode_call, encode_call};
#[cfg(test)]
pub(crate) use self::legacy::encode_v2;

/// Version written in every file's meta record.
pub const FORMAT_VERSION: u64 = 3;

/// Oldest version replay reads: the one before [`FORMAT_VERSION`], never older (the retirement
/// rule of `docs/journal.md`: bumping the format retires the oldest version and its decoder in
/// `legacy.rs`). An older file is refused with [`super::JournalError::RetiredFormat`]. Version 2
/// lists a package's options as fields rather than as an options map.
pub const MIN_FORMAT_VERSION: u64 = FORMAT_VERSION - 1;

/// Payload tags: the first element of every payload array.
mod tag {
    pub const META: u64 = 0;
    pub const PACKAGE: u64 = 1;
    pub const DONE: u64 = 2;
    pub const DELIVERED: u64 = 3;
    pub const END: u64 = 4;
    pub const CHARGE: u64 = 5;
}

/// Fields of a `Package` payload, tag included, in this version.
const PACKAGE_FIELDS: usize = 7;

/// A package the master accepted: everything needed to run its tasks again after a restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackageRecord {
    /// Package id; never reused (see [`super::Replay::next_package`]).
    pub package: u64,
    /// The submitting user (the one charged for its execution time).
    pub user: String,
    /// SHA-256 of the function code.
    pub fn_hash: [u8; 32],
    /// The function code, as the client sent it.
    pub fn_code: Bytes,
    /// Task arguments, one per task; a task's index is its position here.
    pub tasks: Vec<Bytes>,
    /// The package's options, its idempotency key among them.
    pub opts: PackageOpts,
}

/// One task's result, accepted from a worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DoneRecord {
    /// The package the task belongs to.
    pub package: u64,
    /// The task's index in [`PackageRecord::tasks`].
    pub index: u32,
    /// Result status as the protocol defines it (opaque here).
    pub status: u8,
    /// Result bytes.
    pub data: Bytes,
    /// Execution time charged to the package's user, in microseconds.
    pub exec_us: u64,
    /// How long after the package's deadline the result came, in microseconds (0: on time or
    /// no deadline).
    pub late_us: u64,
}

/// One journaled fact. The lead turns scheduler events into these; the journal never looks at
/// the scheduler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// A package was accepted.
    Package(PackageRecord),
    /// One task's result was accepted from a worker.
    Done(DoneRecord),
    /// The client acknowledged these results.
    Delivered {
        /// The package.
        package: u64,
        /// Task indices acknowledged.
        indices: Vec<u32>,
    },
    /// The package was freed (all delivered, cancelled, rejected or expired by TTL).
    End {
        /// The package.
        package: u64,
    },
    /// Execution time to charge to `user`, carried over by compaction from a `Done` record it
    /// dropped. Written only by compaction.
    Charge {
        /// The user to charge.
        user: String,
        /// Execution time in microseconds.
        exec_us: u64,
    },
}

/// Everything a frame's payload can hold: a [`Record`] or a file's meta record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Entry {
    /// First record of every file: ids and LSNs that must survive compaction.
    Meta {
        /// Format of the file's records ([`FORMAT_VERSION`] when written by this master).
        version: u64,
        /// 1 + the highest package id ever journaled (0 when none was).
        next_package: u64,
        /// The highest LSN ever assigned when the file was written.
        last_lsn: u64,
    },
    /// A record appended by the master or copied by compaction.
    Record(Record),
}

/// Encodes `entry` as its msgpack payload.
pub(crate) fn encode(entry: &Entry) -> Vec<u8> {
    let mut out = Vec::new();
    encode_into(&mut out, entry);
    out
}

/// Appends the msgpack payload of `entry` to `out`.
pub(crate) fn encode_into(out: &mut Vec<u8>, entry: &Entry) {
    out.reserve(64 + entry_data_len(entry));
    let w = &mut Writer(out);
    match entry {
        Entry::Meta {
            version,
            next_package,
            last_lsn,
        } => {
            w.array(4);
            w.uint(tag::META);
            w.uint(*version);
            w.uint(*next_package);
            w.uint(*last_lsn);
        }
        Entry::Record(rec) => encode_record(w, rec),
    }
}

/// Bytes of bulk data (code, arguments, results) in `entry`, to size the buffer once.
fn entry_data_len(entry: &Entry) -> usize {
    match entry {
        Entry::Record(Record::Package(p)) => {
            p.fn_code.len() + p.tasks.iter().map(|t| t.len() + 5).sum::<usize>()
        }
        Entry::Record(Record::Done(d)) => d.data.len(),
        Entry::Record(Record::Delivered { indices, .. }) => indices.len() * 5,
        _ => 0,
    }
}

fn encode_record(w: &mut Writer<'_, Vec<u8>>, rec: &Record) {
    match rec {
        Record::Package(p) => {
            w.array(PACKAGE_FIELDS);
            w.uint(tag::PACKAGE);
            w.uint(p.package);
            w.str(&p.user);
            w.bin(&p.fn_hash);
            w.bin(&p.fn_code);
            w.array(p.tasks.len());
            for task in &p.tasks {
                w.bin(task);
            }
            p.opts.write_map(w);
        }
        Record::Done(d) => {
            w.array(7);
            w.uint(tag::DONE);
            w.uint(d.package);
            w.uint(d.index);
            w.uint(d.status);
            w.bin(&d.data);
            w.uint(d.exec_us);
            w.uint(d.late_us);
        }
        Record::Delivered { package, indices } => {
            w.array(3);
            w.uint(tag::DELIVERED);
            w.uint(*package);
            w.array(indices.len());
            for &i in indices {
                w.uint(i);
            }
        }
        Record::End { package } => {
            w.array(2);
            w.uint(tag::END);
            w.uint(*package);
        }
        Record::Charge { user, exec_us } => {
            w.array(3);
            w.uint(tag::CHARGE);
            w.str(user);
            w.uint(*exec_us);
        }
    }
}

/// The reason of a decoding error, without the wire's "malformed" framing: the journal's
/// errors name the record field and the caller adds the offset.
fn reason(err: ProtoError) -> String {
    match err {
        ProtoError::Malformed { reason, .. } => reason,
        other => other.to_string(),
    }
}

/// Decodes one payload. The error says which field was wrong; the caller adds the offset.
pub(crate) fn decode(payload: &[u8]) -> Result<Entry, String> {
    // One copy per record: the record's `bin` fields are slices of it, so a result keeps its own
    // record's bytes alive, never the whole file buffer.
    let mut r = Reader::new(Bytes::copy_from_slice(payload));
    decode_entry(&mut r).map_err(reason)
}

fn decode_entry(r: &mut Reader) -> Result<Entry, ProtoError> {
    let fields = r.array_len("record", 1)?;
    if fields == 0 {
        return Err(r.malformed("record: empty array, expected a tag first".to_owned()));
    }
    let tag = r.u64("tag")?;
    // A version-2 `Package` record has another field count; either form is read whatever the
    // file's version (an old file is appended to in this version until its upgrade).
    let (entry, expected) = match tag {
        tag::META => (decode_meta(r)?, 4),
        tag::PACKAGE if fields == PACKAGE_FIELDS => {
            (Entry::Record(Record::Package(decode_package(r)?)), fields)
        }
        tag::PACKAGE if legacy::is_package(fields) => (
            Entry::Record(Record::Package(legacy::decode_package(r)?)),
            fields,
        ),
        tag::PACKAGE => {
            return Err(r.malformed(format!(
                "record tag {tag} has {fields} fields, expected {PACKAGE_FIELDS}"
            )))
        }
        tag::DONE => {
            let done = DoneRecord {
                package: r.u64("Done.package")?,
                index: r.u32("Done.index")?,
                status: r.u8("Done.status")?,
                data: r.bin("Done.data")?,
                exec_us: r.u64("Done.exec_us")?,
                late_us: r.u64("Done.late_us")?,
            };
            (Entry::Record(Record::Done(done)), 7)
        }
        tag::DELIVERED => {
            let package = r.u64("Delivered.package")?;
            let n = r.array_len("Delivered.indices", 1)?;
            let mut indices = Vec::with_capacity(n);
            for _ in 0..n {
                indices.push(r.u32("Delivered.indices[]")?);
            }
            (Entry::Record(Record::Delivered { package, indices }), 3)
        }
        tag::END => {
            let package = r.u64("End.package")?;
            (Entry::Record(Record::End { package }), 2)
        }
        tag::CHARGE => {
            let user = r.string("Charge.user", usize::MAX)?;
            let exec_us = r.u64("Charge.exec_us")?;
            (Entry::Record(Record::Charge { user, exec_us }), 3)
        }
        other => return Err(r.malformed(format!("unknown record tag {other}"))),
    };
    if fields != expected {
        return Err(r.malformed(format!(
            "record tag {tag} has {fields} fields, expected {expected}"
        )));
    }
    if r.remaining() > 0 {
        return Err(r.malformed(format!("{} trailing bytes after the record", r.remaining())));
    }
    Ok(entry)
}

fn decode_meta(r: &mut Reader) -> Result<Entry, ProtoError> {
    let version = r.u64("Meta.version")?;
    // A retired version (below MIN_FORMAT_VERSION) decodes: replay refuses it with an error of
    // its own that says how to upgrade. A newer or unknown one cannot be read at all.
    if version == 0 || version > FORMAT_VERSION {
        return Err(r.malformed(format!(
            "journal format version {version}, this master reads versions \
             {MIN_FORMAT_VERSION} to {FORMAT_VERSION}"
        )));
    }
    Ok(Entry::Meta {
        version,
        next_package: r.u64("Meta.next_package")?,
        last_lsn: r.u64("Meta.last_lsn")?,
    })
}

/// The 32-byte function hash of a `Package` record.
pub(super) fn fn_hash(r: &mut Reader) -> Result<[u8; 32], ProtoError> {
    let hash = r.bin("Package.fn_hash")?;
    hash[..].try_into().map_err(|_| {
        r.malformed(format!(
            "Package.fn_hash has {} bytes, expected 32",
            hash.len()
        ))
    })
}

/// The task arguments of a `Package` record.
pub(super) fn tasks(r: &mut Reader) -> Result<Vec<Bytes>, ProtoError> {
    // Every task takes at least one byte, so this never allocates more than the payload holds.
    let n = r.array_len("Package.tasks", 1)?;
    let mut tasks = Vec::with_capacity(n);
    for _ in 0..n {
        tasks.push(r.bin("Package.tasks[]")?);
    }
    Ok(tasks)
}

/// Decodes the fields of a `Package` record of this version.
fn decode_package(r: &mut Reader) -> Result<PackageRecord, ProtoError> {
    let package = r.u64("Package.package")?;
    let user = r.string("Package.user", usize::MAX)?;
    let fn_hash = fn_hash(r)?;
    let fn_code = r.bin("Package.fn_code")?;
    let tasks = tasks(r)?;
    let (opts, bad) = PackageOpts::read_map(r, &OPTS)?;
    if let Some((key, why)) = bad {
        // Checked when the client sent it, so a bad option here is a bug or a newer master's.
        return Err(r.malformed(format!("Package.opts: option `{key}`: {why}")));
    }
    Ok(PackageRecord {
        package,
        user,
        fn_hash,
        fn_code,
        tasks,
        opts,
    })
}
