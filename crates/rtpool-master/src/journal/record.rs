//! Journal records and their msgpack payloads.
//!
//! This module owns the [`Record`] types and the payload layout (one msgpack array per record,
//! first element a tag). Framing (magic, length, CRC, LSN) is [`super::frame`]'s; what a
//! sequence of records means is [`super::replay`]'s. The layout is documented in
//! `docs/journal.md`; changing it means a new [`FORMAT_VERSION`].

use bytes::Bytes;
use rtpool_core::MissPolicy;

/// Version written in every file's meta record.
pub const FORMAT_VERSION: u64 = 2;

/// Oldest version replay reads; it refuses any other. Version 1 has no deadline options in
/// `Package` records and no `late_us` in `Done` records: they read as their defaults.
pub const MIN_FORMAT_VERSION: u64 = 1;

/// `Package.opts.on_miss` on disk.
mod on_miss {
    pub const RUN: u64 = 0;
    pub const DROP: u64 = 1;
}

/// Payload tags: the first element of every payload array.
mod tag {
    pub const META: u64 = 0;
    pub const PACKAGE: u64 = 1;
    pub const DONE: u64 = 2;
    pub const DELIVERED: u64 = 3;
    pub const END: u64 = 4;
    pub const CHARGE: u64 = 5;
}

/// A package the master accepted: everything needed to run its tasks again after a restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackageRecord {
    /// Package id; never reused (see [`super::Replay::next_package`]).
    pub package: u64,
    /// The submitting user (the one charged for its execution time).
    pub user: String,
    /// The client's idempotency key.
    pub key: String,
    /// SHA-256 of the function code.
    pub fn_hash: [u8; 32],
    /// The function code, as the client sent it.
    pub fn_code: Bytes,
    /// Scheduling priority.
    pub priority: i32,
    /// Per-task timeout in milliseconds.
    pub timeout_ms: u32,
    /// Task arguments, one per task; a task's index is its position here.
    pub tasks: Vec<Bytes>,
    /// Deadline of every task, milliseconds after the package was received; 0 = none.
    pub deadline_ms: u32,
    /// What happens to tasks that can no longer make the deadline.
    pub on_miss: MissPolicy,
    /// Admission control was asked for.
    pub admit: bool,
    /// Copies of each task (0 and 1 both mean one).
    pub replicas: u8,
    /// Agreeing results needed (0 and 1 both mean the first result wins).
    pub quorum: u8,
    /// Most copies of one task ever started; 0 = the default.
    pub max_copies: u8,
    /// Straggler hedging.
    pub hedge: bool,
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
#[cfg(test)]
pub(crate) fn encode(entry: &Entry) -> Vec<u8> {
    let mut out = Vec::new();
    encode_into(&mut out, entry);
    out
}

/// `rec` as a version-1 master wrote it: `Package` without its options array, `Done`
/// without `late_us`.
#[cfg(test)]
pub(crate) fn encode_v1(rec: &Record) -> Vec<u8> {
    let mut payload = encode(&Entry::Record(rec.clone()));
    match rec {
        Record::Package(p) => {
            let opts = (
                p.deadline_ms,
                p.on_miss,
                p.admit,
                p.replicas,
                p.quorum,
                p.max_copies,
            );
            let defaults = (0, MissPolicy::Run, false, 1, 1, 0);
            assert_eq!(
                (opts, p.hedge),
                (defaults, false),
                "version 1 has no options"
            );
            // fixarray 10 -> 9, and the options array (8 bytes at the defaults) cut off.
            assert_eq!(payload[0], 0x9a);
            payload[0] = 0x99;
            payload.truncate(payload.len() - 8);
        }
        Record::Done(d) => {
            assert_eq!((payload[0], d.late_us), (0x97, 0), "a fixint late_us of 0");
            payload[0] = 0x96;
            payload.pop();
        }
        _ => {}
    }
    payload
}

/// Appends the msgpack payload of `entry` to `out`.
pub(crate) fn encode_into(out: &mut Vec<u8>, entry: &Entry) {
    out.reserve(64 + entry_data_len(entry));
    let mut w = Writer(out);
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
        Entry::Record(rec) => encode_record(&mut w, rec),
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

fn encode_record(w: &mut Writer<'_>, rec: &Record) {
    match rec {
        Record::Package(p) => {
            w.array(10);
            w.uint(tag::PACKAGE);
            w.uint(p.package);
            w.str(&p.user);
            w.str(&p.key);
            w.bin(&p.fn_hash);
            w.bin(&p.fn_code);
            w.sint(p.priority.into());
            w.uint(p.timeout_ms.into());
            w.array(p.tasks.len());
            for task in &p.tasks {
                w.bin(task);
            }
            w.array(7);
            w.uint(p.deadline_ms.into());
            w.uint(match p.on_miss {
                MissPolicy::Run => on_miss::RUN,
                MissPolicy::Drop => on_miss::DROP,
            });
            w.bool(p.admit);
            w.uint(p.replicas.into());
            w.uint(p.quorum.into());
            w.uint(p.max_copies.into());
            w.bool(p.hedge);
        }
        Record::Done(d) => {
            w.array(7);
            w.uint(tag::DONE);
            w.uint(d.package);
            w.uint(d.index.into());
            w.uint(d.status.into());
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
                w.uint(i.into());
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

/// A `Vec` writer; writing msgpack into memory cannot fail.
struct Writer<'a>(&'a mut Vec<u8>);

const INFALLIBLE: &str = "writing msgpack to a Vec cannot fail";

impl Writer<'_> {
    fn array(&mut self, len: usize) {
        rmp::encode::write_array_len(self.0, len32(len)).expect(INFALLIBLE);
    }
    fn uint(&mut self, v: u64) {
        rmp::encode::write_uint(self.0, v).expect(INFALLIBLE);
    }
    fn sint(&mut self, v: i64) {
        rmp::encode::write_sint(self.0, v).expect(INFALLIBLE);
    }
    fn str(&mut self, v: &str) {
        rmp::encode::write_str(self.0, v).expect(INFALLIBLE);
    }
    fn bin(&mut self, v: &[u8]) {
        rmp::encode::write_bin(self.0, v).expect(INFALLIBLE);
    }
    fn bool(&mut self, v: bool) {
        rmp::encode::write_bool(self.0, v).expect(INFALLIBLE);
    }
}

/// A msgpack length; the master never accepts anything near 4 GiB, so a longer one is our bug.
fn len32(len: usize) -> u32 {
    u32::try_from(len).expect("a journaled value is shorter than 4 GiB")
}

/// Decodes one payload. The error says which field was wrong; the caller adds the offset.
pub(crate) fn decode(payload: &[u8]) -> Result<Entry, String> {
    let mut r = Reader(payload);
    let fields = r.array("record")?;
    let tag = r.uint("tag")?;
    // Version 1 records of `Package` and `Done` lack their last field; either form is read
    // whatever the file's version (a version-1 file is appended to in version 2 until its
    // upgrade).
    let (entry, expected) = match tag {
        tag::META => (decode_meta(&mut r)?, 4),
        tag::PACKAGE => {
            let v1 = fields == 9;
            let package = decode_package(&mut r, v1)?;
            (
                Entry::Record(Record::Package(package)),
                if v1 { 9 } else { 10 },
            )
        }
        tag::DONE => {
            let v1 = fields == 6;
            let done = DoneRecord {
                package: r.uint("Done.package")?,
                index: r.narrow("Done.index")?,
                status: r.narrow("Done.status")?,
                data: r.bin("Done.data")?,
                exec_us: r.uint("Done.exec_us")?,
                late_us: if v1 { 0 } else { r.uint("Done.late_us")? },
            };
            (Entry::Record(Record::Done(done)), if v1 { 6 } else { 7 })
        }
        tag::DELIVERED => {
            let package = r.uint("Delivered.package")?;
            let n = r.array("Delivered.indices")?;
            let mut indices = Vec::with_capacity(n.min(r.0.len()));
            for _ in 0..n {
                indices.push(r.narrow("Delivered.indices[]")?);
            }
            (Entry::Record(Record::Delivered { package, indices }), 3)
        }
        tag::END => {
            let package = r.uint("End.package")?;
            (Entry::Record(Record::End { package }), 2)
        }
        tag::CHARGE => {
            let user = r.str("Charge.user")?;
            let exec_us = r.uint("Charge.exec_us")?;
            (Entry::Record(Record::Charge { user, exec_us }), 3)
        }
        other => return Err(format!("unknown record tag {other}")),
    };
    if fields != expected {
        return Err(format!(
            "record tag {tag} has {fields} fields, expected {expected}"
        ));
    }
    if !r.0.is_empty() {
        return Err(format!("{} trailing bytes after the record", r.0.len()));
    }
    Ok(entry)
}

fn decode_meta(r: &mut Reader<'_>) -> Result<Entry, String> {
    let version = r.uint("Meta.version")?;
    if !(MIN_FORMAT_VERSION..=FORMAT_VERSION).contains(&version) {
        return Err(format!(
            "journal format version {version}, this master reads versions \
             {MIN_FORMAT_VERSION} to {FORMAT_VERSION}"
        ));
    }
    Ok(Entry::Meta {
        version,
        next_package: r.uint("Meta.next_package")?,
        last_lsn: r.uint("Meta.last_lsn")?,
    })
}

/// Decodes a `Package` record's fields; `v1`: without the options array of version 2.
fn decode_package(r: &mut Reader<'_>, v1: bool) -> Result<PackageRecord, String> {
    let package = r.uint("Package.package")?;
    let user = r.str("Package.user")?;
    let key = r.str("Package.key")?;
    let hash = r.bin("Package.fn_hash")?;
    let fn_hash: [u8; 32] = hash[..]
        .try_into()
        .map_err(|_| format!("Package.fn_hash has {} bytes, expected 32", hash.len()))?;
    let fn_code = r.bin("Package.fn_code")?;
    let priority = r.sint("Package.priority")?;
    let timeout_ms = r.narrow("Package.timeout_ms")?;
    let n = r.array("Package.tasks")?;
    // Every task takes at least one byte, so this never allocates more than the payload holds.
    let mut tasks = Vec::with_capacity(n.min(r.0.len()));
    for _ in 0..n {
        tasks.push(r.bin("Package.tasks[]")?);
    }
    let mut record = PackageRecord {
        package,
        user,
        key,
        fn_hash,
        fn_code,
        priority,
        timeout_ms,
        tasks,
        // Version 1 has no options array: the defaults a `SUBMIT` without the options gets.
        deadline_ms: 0,
        on_miss: MissPolicy::Run,
        admit: false,
        replicas: 1,
        quorum: 1,
        max_copies: 0,
        hedge: false,
    };
    if !v1 {
        decode_package_opts(r, &mut record)?;
    }
    Ok(record)
}

/// The options array of a version-2 `Package` record.
fn decode_package_opts(r: &mut Reader<'_>, p: &mut PackageRecord) -> Result<(), String> {
    let n = r.array("Package.opts")?;
    if n != 7 {
        return Err(format!("Package.opts has {n} fields, expected 7"));
    }
    p.deadline_ms = r.narrow("Package.opts.deadline_ms")?;
    p.on_miss = match r.uint("Package.opts.on_miss")? {
        on_miss::RUN => MissPolicy::Run,
        on_miss::DROP => MissPolicy::Drop,
        other => {
            return Err(format!(
                "Package.opts.on_miss: {other} is not 0 (run) or 1 (drop)"
            ))
        }
    };
    p.admit = r.bool("Package.opts.admit")?;
    p.replicas = r.narrow("Package.opts.replicas")?;
    p.quorum = r.narrow("Package.opts.quorum")?;
    p.max_copies = r.narrow("Package.opts.max_copies")?;
    p.hedge = r.bool("Package.opts.hedge")?;
    Ok(())
}

/// A msgpack cursor over one payload. The payload passed its CRC, so a failure here means a
/// writer bug or a version mismatch, never a torn write; still, it never panics.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn array(&mut self, field: &str) -> Result<usize, String> {
        let n = rmp::decode::read_array_len(&mut self.0)
            .map_err(|e| format!("{field}: expected an array ({e})"))?;
        Ok(n as usize)
    }
    fn uint(&mut self, field: &str) -> Result<u64, String> {
        rmp::decode::read_int(&mut self.0)
            .map_err(|e| format!("{field}: expected an unsigned integer ({e})"))
    }
    fn sint(&mut self, field: &str) -> Result<i32, String> {
        rmp::decode::read_int(&mut self.0)
            .map_err(|e| format!("{field}: expected a 32-bit integer ({e})"))
    }
    fn bool(&mut self, field: &str) -> Result<bool, String> {
        rmp::decode::read_bool(&mut self.0).map_err(|e| format!("{field}: expected a bool ({e})"))
    }
    fn narrow<T: TryFrom<u64>>(&mut self, field: &str) -> Result<T, String> {
        let v = self.uint(field)?;
        T::try_from(v).map_err(|_| format!("{field}: {v} is out of range"))
    }
    fn take(&mut self, len: u32, field: &str) -> Result<&[u8], String> {
        let len = len as usize;
        if len > self.0.len() {
            return Err(format!(
                "{field}: length {len} is beyond the {} bytes left",
                self.0.len()
            ));
        }
        let (head, tail) = self.0.split_at(len);
        self.0 = tail;
        Ok(head)
    }
    fn str(&mut self, field: &str) -> Result<String, String> {
        let len = rmp::decode::read_str_len(&mut self.0)
            .map_err(|e| format!("{field}: expected a string ({e})"))?;
        let raw = self.take(len, field)?;
        String::from_utf8(raw.to_vec()).map_err(|_| format!("{field}: not UTF-8"))
    }
    fn bin(&mut self, field: &str) -> Result<Bytes, String> {
        let len = rmp::decode::read_bin_len(&mut self.0)
            .map_err(|e| format!("{field}: expected binary data ({e})"))?;
        // A copy, not a slice of the file buffer: a slice would keep the whole file in memory
        // for as long as any one result of it lives.
        Ok(Bytes::copy_from_slice(self.take(len, field)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample_package(package: u64) -> PackageRecord {
        PackageRecord {
            package,
            user: "alice".into(),
            key: format!("key-{package}"),
            fn_hash: [7; 32],
            fn_code: Bytes::from_static(b"def f(x): return x"),
            priority: -3,
            timeout_ms: 1500,
            tasks: vec![
                Bytes::from_static(b"a"),
                Bytes::new(),
                Bytes::from(vec![0xC1; 300]),
            ],
            deadline_ms: 0,
            on_miss: MissPolicy::Run,
            admit: false,
            replicas: 1,
            quorum: 1,
            max_copies: 0,
            hedge: false,
        }
    }

    /// A package with every deadline, replica and hedging option away from its default.
    fn package_with_every_option() -> PackageRecord {
        PackageRecord {
            deadline_ms: u32::MAX,
            on_miss: MissPolicy::Drop,
            admit: true,
            replicas: 16,
            quorum: 9,
            max_copies: 255,
            hedge: true,
            ..sample_package(3)
        }
    }

    fn all_records() -> Vec<Record> {
        vec![
            Record::Package(sample_package(u64::MAX)),
            Record::Done(DoneRecord {
                package: 4,
                index: u32::MAX,
                status: 255,
                data: Bytes::from(vec![1u8; 70_000]),
                exec_us: 123_456_789_012,
                late_us: u64::MAX,
            }),
            Record::Package(package_with_every_option()),
            Record::Delivered {
                package: 4,
                indices: vec![0, 1, 127, 128, 65_536, u32::MAX],
            },
            Record::Delivered {
                package: 5,
                indices: vec![],
            },
            Record::End { package: 0 },
            Record::Charge {
                user: "bob ü".into(),
                exec_us: 0,
            },
        ]
    }

    #[test]
    fn every_record_type_round_trips() {
        for rec in all_records() {
            let entry = Entry::Record(rec);
            let payload = encode(&entry);
            assert_eq!(decode(&payload).unwrap(), entry);
        }
        for version in MIN_FORMAT_VERSION..=FORMAT_VERSION {
            let meta = Entry::Meta {
                version,
                next_package: 42,
                last_lsn: 7,
            };
            assert_eq!(decode(&encode(&meta)).unwrap(), meta);
        }
    }

    #[test]
    fn every_package_option_round_trips() {
        let p = package_with_every_option();
        let entry = Entry::Record(Record::Package(p.clone()));
        let Entry::Record(Record::Package(back)) = decode(&encode(&entry)).unwrap() else {
            panic!("not a Package record");
        };
        assert_eq!(back, p);
        // Each option on its own, so that no two fields can be swapped unnoticed.
        let single = [
            PackageRecord {
                deadline_ms: 250,
                ..sample_package(1)
            },
            PackageRecord {
                on_miss: MissPolicy::Drop,
                ..sample_package(1)
            },
            PackageRecord {
                admit: true,
                ..sample_package(1)
            },
            PackageRecord {
                replicas: 3,
                ..sample_package(1)
            },
            PackageRecord {
                quorum: 2,
                ..sample_package(1)
            },
            PackageRecord {
                max_copies: 5,
                ..sample_package(1)
            },
            PackageRecord {
                hedge: true,
                ..sample_package(1)
            },
        ];
        for p in single {
            let entry = Entry::Record(Record::Package(p));
            assert_eq!(decode(&encode(&entry)).unwrap(), entry);
        }
    }

    #[test]
    fn version_1_records_read_with_default_options() {
        let v1_package = encode_v1(&Record::Package(sample_package(8)));
        let Entry::Record(Record::Package(p)) = decode(&v1_package).unwrap() else {
            panic!("not a Package record");
        };
        assert_eq!(p, sample_package(8));
        assert_eq!((p.replicas, p.quorum, p.on_miss), (1, 1, MissPolicy::Run));
        let done = DoneRecord {
            package: 8,
            index: 2,
            status: 0,
            data: Bytes::from_static(b"ok"),
            exec_us: 40,
            late_us: 0,
        };
        let v1_done = encode_v1(&Record::Done(done.clone()));
        assert_eq!(decode(&v1_done).unwrap(), Entry::Record(Record::Done(done)));
    }

    #[test]
    fn bad_package_options_are_rejected() {
        let payload = encode(&Entry::Record(Record::Package(sample_package(1))));
        // The options array is the last 8 bytes: fixarray 7, then deadline_ms, on_miss, ...
        let opts_at = payload.len() - 8;
        assert_eq!(payload[opts_at], 0x97);
        let mut bad_policy = payload.clone();
        bad_policy[opts_at + 2] = 2;
        assert!(decode(&bad_policy)
            .unwrap_err()
            .contains("on_miss: 2 is not 0 (run) or 1 (drop)"));
        let mut short = payload.clone();
        short[opts_at] = 0x96;
        short.pop();
        assert!(decode(&short)
            .unwrap_err()
            .contains("Package.opts has 6 fields, expected 7"));
        let mut not_bool = payload.clone();
        not_bool[opts_at + 3] = 0x01; // admit
        assert!(decode(&not_bool)
            .unwrap_err()
            .contains("Package.opts.admit"));
        let mut big_replicas = payload;
        big_replicas.truncate(opts_at + 4);
        big_replicas.extend_from_slice(&[0xcd, 0x01, 0x00, 0x01, 0x00, 0xc2]); // replicas 256
        assert!(decode(&big_replicas)
            .unwrap_err()
            .contains("Package.opts.replicas"));
    }

    #[test]
    fn package_payload_is_a_tagged_msgpack_array() {
        let payload = encode(&Entry::Record(Record::End { package: 3 }));
        // fixarray of 2, positive fixint tag 4, positive fixint 3.
        assert_eq!(payload, vec![0x92, 0x04, 0x03]);
    }

    #[test]
    fn truncated_or_padded_payloads_are_rejected() {
        for rec in all_records() {
            let payload = encode(&Entry::Record(rec));
            for cut in 0..payload.len() {
                assert!(decode(&payload[..cut]).is_err(), "cut at {cut} decoded");
            }
            let mut padded = payload.clone();
            padded.push(0);
            assert!(decode(&padded).unwrap_err().contains("trailing"));
        }
    }

    #[test]
    fn wrong_version_and_unknown_tag_are_rejected() {
        let mut buf = Vec::new();
        let mut w = Writer(&mut buf);
        w.array(4);
        w.uint(tag::META);
        w.uint(FORMAT_VERSION + 1);
        w.uint(0);
        w.uint(0);
        assert!(decode(&buf).unwrap_err().contains("version"));
        let mut buf = Vec::new();
        let mut w = Writer(&mut buf);
        w.array(4);
        w.uint(tag::META);
        w.uint(MIN_FORMAT_VERSION - 1);
        w.uint(0);
        w.uint(0);
        assert!(decode(&buf).unwrap_err().contains("reads versions 1 to 2"));
        let mut buf = Vec::new();
        let mut w = Writer(&mut buf);
        w.array(2);
        w.uint(99);
        w.uint(0);
        assert!(decode(&buf).unwrap_err().contains("unknown record tag 99"));
    }
}
