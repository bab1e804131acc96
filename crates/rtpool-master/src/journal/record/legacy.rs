//! `Package` records of format versions 1 and 2, which listed a package's options as fields.
//!
//! Version 2 wrote `[1, package, user, key, fn_hash, fn_code, priority, timeout_ms, tasks,
//! [deadline_ms, on_miss (0 run, 1 drop), admit, replicas, quorum, max_copies, hedge]]`;
//! version 1 the same without the last array (its options read as their defaults). These
//! layouts are frozen: a file written by an older master must still replay, and is rewritten
//! in the current version at open. New options never appear here.

use rtpool_core::{MissPolicy, PackageOpts};
use rtpool_proto::msgpack::{Int, Reader};
use rtpool_proto::ProtoError;

use super::{fn_hash, tasks, PackageRecord};

/// Fields of a version-1 `Package` payload, tag included.
const V1_FIELDS: usize = 9;

/// Fields of a version-2 `Package` payload, tag included.
const V2_FIELDS: usize = 10;

/// Fields of the options array of a version-2 `Package` record.
const V2_OPTS: usize = 7;

/// `Package.opts.on_miss` on disk in version 2.
mod on_miss {
    pub const RUN: u64 = 0;
    pub const DROP: u64 = 1;
}

/// A `Package` payload of `fields` fields is one of an older version.
pub(super) fn is_package(fields: usize) -> bool {
    fields == V1_FIELDS || fields == V2_FIELDS
}

/// Decodes the fields of a version-1 or version-2 `Package` record (by its field count).
pub(super) fn decode_package(r: &mut Reader, fields: usize) -> Result<PackageRecord, ProtoError> {
    let package = r.u64("Package.package")?;
    let user = r.string("Package.user", usize::MAX)?;
    let key = r.string("Package.key", usize::MAX)?;
    let fn_hash = fn_hash(r)?;
    let fn_code = r.bin("Package.fn_code")?;
    let priority = match r.int("Package.priority")? {
        Int::Uint(v) => i32::try_from(v).ok(),
        Int::Neg(v) => i32::try_from(v).ok(),
    }
    .ok_or_else(|| r.malformed("Package.priority: out of range for i32".to_owned()))?;
    let timeout_ms = r.u32("Package.timeout_ms")?;
    let tasks = tasks(r)?;
    // Version 1 has no options array: the defaults a `SUBMIT` without the options gets.
    let mut opts = PackageOpts {
        priority,
        timeout_ms,
        key,
        ..PackageOpts::default()
    };
    if fields == V2_FIELDS {
        decode_v2_opts(r, &mut opts)?;
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

/// The options array of a version-2 `Package` record.
fn decode_v2_opts(r: &mut Reader, p: &mut PackageOpts) -> Result<(), ProtoError> {
    let n = r.array_len("Package.opts", 1)?;
    if n != V2_OPTS {
        return Err(r.malformed(format!("Package.opts has {n} fields, expected {V2_OPTS}")));
    }
    p.deadline_ms = r.u32("Package.opts.deadline_ms")?;
    p.on_miss = match r.u64("Package.opts.on_miss")? {
        on_miss::RUN => MissPolicy::Run,
        on_miss::DROP => MissPolicy::Drop,
        other => {
            return Err(r.malformed(format!(
                "Package.opts.on_miss: {other} is not 0 (run) or 1 (drop)"
            )))
        }
    };
    p.admit = r.bool("Package.opts.admit")?;
    p.replicas = r.u8("Package.opts.replicas")?;
    p.quorum = r.u8("Package.opts.quorum")?;
    p.max_copies = r.u8("Package.opts.max_copies")?;
    p.hedge = r.bool("Package.opts.hedge")?;
    Ok(())
}

/// `rec` as a version-1 master wrote it: `Package` without its options array (its options
/// must be the defaults, key, priority and time limit aside), `Done` without `late_us`.
#[cfg(test)]
pub(crate) fn encode_v1(rec: &super::Record) -> Vec<u8> {
    use super::Record;
    match rec {
        Record::Package(p) => {
            let o = &p.opts;
            let rest = PackageOpts {
                key: String::new(),
                priority: 0,
                timeout_ms: 0,
                ..o.clone()
            };
            assert_eq!(rest, PackageOpts::default(), "version 1 has no options");
            encode_package(p, false)
        }
        Record::Done(d) => {
            assert_eq!(d.late_us, 0, "version 1 has no late_us");
            let mut out = Vec::new();
            let w = &mut rtpool_proto::msgpack::Writer(&mut out);
            w.array(6);
            w.uint(super::tag::DONE);
            w.uint(d.package);
            w.uint(d.index);
            w.uint(d.status);
            w.bin(&d.data);
            w.uint(d.exec_us);
            out
        }
        other => super::encode(&super::Entry::Record(other.clone())),
    }
}

/// `rec` as a version-2 master wrote it (only `Package` records differ from this version's).
#[cfg(test)]
pub(crate) fn encode_v2(rec: &super::Record) -> Vec<u8> {
    match rec {
        super::Record::Package(p) => encode_package(p, true),
        other => super::encode(&super::Entry::Record(other.clone())),
    }
}

/// A `Package` payload of version 2 (`with_opts`) or 1.
#[cfg(test)]
fn encode_package(p: &PackageRecord, with_opts: bool) -> Vec<u8> {
    let mut out = Vec::new();
    let w = &mut rtpool_proto::msgpack::Writer(&mut out);
    let o = &p.opts;
    w.array(if with_opts { V2_FIELDS } else { V1_FIELDS });
    w.uint(super::tag::PACKAGE);
    w.uint(p.package);
    w.str(&p.user);
    w.str(&o.key);
    w.bin(&p.fn_hash);
    w.bin(&p.fn_code);
    w.sint(o.priority);
    w.uint(o.timeout_ms);
    w.array(p.tasks.len());
    for task in &p.tasks {
        w.bin(task);
    }
    if with_opts {
        w.array(V2_OPTS);
        w.uint(o.deadline_ms);
        w.uint(match o.on_miss {
            MissPolicy::Run => on_miss::RUN,
            MissPolicy::Drop => on_miss::DROP,
        });
        w.bool(o.admit);
        w.uint(o.replicas);
        w.uint(o.quorum);
        w.uint(o.max_copies);
        w.bool(o.hedge);
    }
    out
}
