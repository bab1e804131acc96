//! The worker's side of the schema: `HELLO` (with a worker's optional identity, resources and
//! labels) and `ASSIGN` (with a task's optional inputs and resources).

use super::list;
use crate::error::ProtoError;
use crate::limits::{MAX_NAME_BYTES, MAX_TOKEN_BYTES};
use crate::message::{Assignment, Msg, Role};
use crate::msgpack::Reader;
use crate::options::{quote, Labels, Resources};

pub(super) fn decode_hello(r: &mut Reader) -> Result<Msg, ProtoError> {
    let version = r.u32("HELLO.version")?;
    let role_range = r.str_range("HELLO.role", usize::MAX)?;
    let role_bytes = r.bytes_of(role_range);
    let Some(role) = Role::from_wire(role_bytes) else {
        let found = quote(role_bytes);
        return Err(r.malformed(format!(
            "HELLO.role: expected \"client\" or \"worker\", found {found:?}"
        )));
    };
    Ok(read_struct!(r, "HELLO", Msg::Hello {
        token: string(MAX_TOKEN_BYTES), name: string(MAX_NAME_BYTES), slots: u32;
        version, role, identity: None, resources: Resources::default(),
        labels: Labels::default(), features: 0
    }))
}

/// Reads the `extra` (1 to 4) trailing fields of a `HELLO`: identity, resources, labels,
/// features.
pub(super) fn read_hello_trailing(
    r: &mut Reader,
    hello: &mut Msg,
    extra: usize,
) -> Result<(), ProtoError> {
    let Msg::Hello {
        identity,
        resources,
        labels,
        features,
        ..
    } = hello
    else {
        return Ok(());
    };
    *identity = Some(r.string("HELLO.identity", MAX_NAME_BYTES)?);
    if extra >= 2 {
        *resources = Resources::read(r, "HELLO.resources")?
            .map_err(|reason| r.malformed(format!("HELLO.resources: {reason}")))?;
    }
    if extra >= 3 {
        *labels = Labels::read(r, "HELLO.labels")?
            .map_err(|reason| r.malformed(format!("HELLO.labels: {reason}")))?;
    }
    if extra >= 4 {
        *features = r.u32("HELLO.features")?;
    }
    Ok(())
}

pub(super) fn decode_assign(r: &mut Reader) -> Result<Msg, ProtoError> {
    // fixarray, task, attempt, two empty bins, a nil and timeout_ms: 9 bytes at least.
    let tasks = list(r, "ASSIGN.tasks", 9, |r| {
        // Six fields, seven (the inputs of a task whose dependency the master held) or eight
        // (and the resources the task holds).
        let fields = r.array_len("ASSIGN.tasks[]", 1)?;
        if !(6..=8).contains(&fields) {
            let reason = format!("ASSIGN.tasks[] has {fields} fields, expected 6 to 8");
            return Err(r.malformed(reason));
        }
        let mut a = read_struct!(r, "ASSIGN.tasks[]", Assignment {
            task: u64, attempt: u32, fn_hash: bin, fn_code: bin_or_nil, args: bin,
            timeout_ms: u32; inputs: Vec::new(), res: Resources::default()
        });
        if fields >= 7 {
            a.inputs = list(r, "ASSIGN.tasks[].inputs", 1, |r| {
                r.bin("ASSIGN.tasks[].inputs[]")
            })?;
        }
        if fields == 8 {
            a.res = Resources::read(r, "ASSIGN.tasks[].res")?
                .map_err(|reason| r.malformed(format!("ASSIGN.tasks[].res: {reason}")))?;
        }
        Ok(a)
    })?;
    Ok(Msg::Assign { tasks })
}
