//! `Package` records of format version 2, which listed a package's options as fields:
//! `[1, package, user, key, fn_hash, fn_code, priority, timeout_ms, tasks, [deadline_ms,
//! on_miss (0 run, 1 drop), admit, replicas, quorum, max_copies, hedge]]`. This layout is frozen:
//! a file written by the previous format must still replay, and is rewritten in the current
//! version at open. New options never appear here. Version 1 is retired (see "Format versions"
//! in `docs/journal.md`): its files are refused at their meta record, and this module goes when
//! the next format version retires version 2.

use rtpool_core::{MissPolicy, PackageOpts};
use rtpool_proto::msgpack::{Int, Reader};
use rtpool_proto::ProtoError;

use super::{fn_hash, tasks, PackageRecord};

/// Fields of a version-2 `Package` payload, tag included.
const V2_FIELDS: usize = 10;

/// Fields of the options array of a version-2 `Package` record.
const V2_OPTS: usize = 7;

/// `Package.opts.on_miss` on disk in version 2.
mod on_miss {
    pub const RUN: u64 = 0;
    pub const DROP: u64 = 1;
}

/// A `Package` payload of `fields` fields is one of version 2.
pub(super) fn is_package(fields: usize) -> bool {
    fields == V2_FIELDS
}

/// Decodes the fields of a version-2 `Package` record.
pub(super) fn decode_package(r: &mut Reader) -> Result<PackageRecord, ProtoError> {
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
    let mut opts = PackageOpts {
        priority,
        timeout_ms,
        key,
        ..PackageOpts::default()
    };
    decode_v2_opts(r, &mut opts)?;
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

/// `rec` as a version-2 master wrote it (only `Package` records differ from this version's).
#[cfg(test)]
pub(crate) fn encode_v2(rec: &super::Record) -> Vec<u8> {
    match rec {
        super::Record::Package(p) => encode_package(p),
        other => super::encode(&super::Entry::Record(other.clone())),
    }
}

/// A `Package` payload of version 2.
#[cfg(test)]
fn encode_package(p: &PackageRecord) -> Vec<u8> {
    let mut out = Vec::new();
    let w = &mut rtpool_proto::msgpack::Writer(&mut out);
    let o = &p.opts;
    w.array(V2_FIELDS);
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
    out
}
