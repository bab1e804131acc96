//! Messages to frame bodies: the msgpack writing behind [`encode`](super::encode).
//!
//! This module owns the schema of every message as the encoder writes it. Values go through
//! [`Writer`], which writes the most compact msgpack form of every value (as msgpack-python
//! does), so its bytes are the Python encoder's, pinned by `tests/vectors/vectors.json`.

use bytes::{Bytes, BytesMut};

use super::segment::Segs;
use crate::counts::PackageCounts;
use crate::message::{Assignment, Call, CallAssignment, Msg};
use crate::msgpack::Writer;

/// Bytes to reserve for the body of `msg`: exact for payloads, a generous guess for the rest,
/// so that a large `SUBMIT` or `ASSIGN` is written without the buffer growing on the way.
pub(super) fn size_hint(msg: &Msg) -> usize {
    match msg {
        Msg::Hello {
            token,
            name,
            identity,
            resources,
            labels,
            ..
        } => {
            48 + token.len()
                + name.len()
                + identity.as_ref().map_or(0, String::len)
                + 48 * resources.len()
                + 176 * labels.iter().count()
        }
        Msg::Error { code, message, .. } => 32 + code.len() + message.len(),
        Msg::Submit { fn_code, tasks, .. } => {
            96 + fn_code.len() + tasks.iter().map(|t| 5 + t.len()).sum::<usize>()
        }
        Msg::Results { results, .. } => {
            16 + results.iter().map(|t| 64 + t.data.len()).sum::<usize>()
        }
        Msg::Cancel { indices, .. } => 16 + 5 * indices.len(),
        Msg::Assign { tasks } => {
            let one = |a: &Assignment| {
                64 + a.fn_hash.len()
                    + a.fn_code.as_ref().map_or(0, Bytes::len)
                    + a.args.len()
                    + a.inputs.iter().map(|i| 5 + i.len()).sum::<usize>()
                    + 48 * a.res.len()
            };
            8 + tasks.iter().map(one).sum::<usize>()
        }
        Msg::Result { results } => 8 + results.iter().map(|t| 56 + t.data.len()).sum::<usize>(),
        Msg::Return { tasks } | Msg::Abort { tasks } => 8 + 16 * tasks.len(),
        Msg::Release { keys } => 8 + 32 * keys.len(),
        Msg::Drop { keys } => 8 + 20 * keys.len(),
        Msg::Serve { functions } => {
            8 + functions
                .iter()
                .map(|f| 16 + f.name.len() + f.version.len() + f.interface.len())
                .sum::<usize>()
        }
        Msg::Call { calls, .. } => {
            let one =
                |c: &Call| 16 + c.name.len() + c.version.len() + c.args.len() + 5 * c.deps.len();
            96 + calls.iter().map(one).sum::<usize>()
        }
        Msg::AssignCalls { calls } => {
            let one = |c: &CallAssignment| {
                48 + c.name.len()
                    + c.version.len()
                    + c.args.len()
                    + c.inputs.iter().map(|i| 5 + i.len()).sum::<usize>()
                    + 48 * c.res.len()
            };
            8 + calls.iter().map(one).sum::<usize>()
        }
        Msg::FunctionsReply { functions, .. } => {
            16 + functions
                .iter()
                .map(|f| 24 + f.name.len() + f.version.len() + f.interface.len())
                .sum::<usize>()
        }
        Msg::ClusterStatusReply { status, .. } => 16 + status.len(),
        _ => 64,
    }
}

/// Appends the msgpack body of `msg` to `out`.
pub(super) fn write_body(msg: &Msg, out: &mut BytesMut, mut s: Segs<'_>) {
    let w = &mut Writer(out);
    let k = msg.kind();
    match msg {
        Msg::Hello {
            version,
            role,
            token,
            name,
            slots,
            identity,
            resources,
            labels,
            features,
        } => {
            // Trailing fields only as far as needed: features need labels (maybe empty)
            // before them, labels resources, resources an identity (maybe empty).
            let trailing = if *features != 0 {
                4
            } else if !labels.is_empty() {
                3
            } else if !resources.is_empty() {
                2
            } else {
                usize::from(identity.is_some())
            };
            w.head(k, 5 + trailing);
            w.uint(*version);
            w.str(role.as_str());
            w.str(token);
            w.str(name);
            w.uint(*slots);
            if trailing >= 1 {
                w.str(identity.as_deref().unwrap_or(""));
            }
            if trailing >= 2 {
                resources.write(w);
            }
            if trailing >= 3 {
                labels.write(w);
            }
            if trailing >= 4 {
                w.uint(*features);
            }
        }
        Msg::Welcome {
            version,
            session,
            max_frame_bytes,
            heartbeat_ms,
            lease_ms,
            instance,
            idle_heartbeat_ms,
        } => {
            w.head(k, 6 + usize::from(*idle_heartbeat_ms != 0));
            w.uint(*version);
            w.uint(*session);
            w.uint(*max_frame_bytes);
            w.uint(*heartbeat_ms);
            w.uint(*lease_ms);
            w.uint(*instance);
            if *idle_heartbeat_ms != 0 {
                w.uint(*idle_heartbeat_ms);
            }
        }
        Msg::Error {
            code,
            message,
            reference,
        } => {
            w.head(k, 3);
            w.str(code);
            w.str(message);
            w.uint(*reference);
        }
        Msg::Submit {
            req_id,
            fn_hash,
            fn_code,
            opts,
            tasks,
        } => {
            w.head(k, 5);
            w.uint(*req_id);
            s.bin(w, fn_hash);
            s.bin(w, fn_code);
            opts.write_map(w);
            w.array(tasks.len());
            for task in tasks {
                s.bin(w, task);
            }
        }
        Msg::Accepted {
            req_id,
            package,
            notice: Some(notice),
        } => {
            w.head(k, 3);
            w.uint(*req_id);
            w.uint(*package);
            w.str(notice);
        }
        Msg::Accepted {
            req_id,
            package,
            notice: None,
        }
        | Msg::Status { req_id, package }
        | Msg::Attach { req_id, package } => {
            w.head(k, 2);
            w.uint(*req_id);
            w.uint(*package);
        }
        Msg::Results { package, results } => {
            w.head(k, 2);
            w.uint(*package);
            w.array(results.len());
            for t in results {
                w.array(9);
                w.uint(t.index);
                w.uint(t.status);
                s.bin(w, &t.data);
                for us in [
                    t.queue_us,
                    t.worker_us,
                    t.exec_us,
                    t.wait_us,
                    t.flush_us,
                    t.late_us,
                ] {
                    w.uint(us);
                }
            }
        }
        Msg::Cancel { package, indices } => {
            w.head(k, 2);
            w.uint(*package);
            w.array(indices.len());
            for index in indices {
                w.uint(*index);
            }
        }
        Msg::StatusReply {
            req_id,
            package,
            counts,
            workers,
        } => {
            w.head(k, 3 + PackageCounts::LEN);
            w.uint(*req_id);
            w.uint(*package);
            for (_, n) in counts.iter() {
                w.uint(n);
            }
            w.uint(*workers);
        }
        Msg::Ack { package, count } => {
            w.head(k, 2);
            w.uint(*package);
            w.uint(*count);
        }
        Msg::Pull { credits } => {
            w.head(k, 1);
            w.uint(*credits);
        }
        Msg::Assign { tasks } => {
            w.head(k, 1);
            w.array(tasks.len());
            for a in tasks {
                // The seventh field only for a task that has inputs: every other assignment
                // stays as version 2 first defined it.
                let fields = if !a.res.is_empty() {
                    8
                } else if !a.inputs.is_empty() {
                    7
                } else {
                    6
                };
                w.array(fields);
                w.uint(a.task);
                w.uint(a.attempt);
                s.bin(w, &a.fn_hash);
                match &a.fn_code {
                    Some(code) => s.bin(w, code),
                    None => w.nil(),
                }
                s.bin(w, &a.args);
                w.uint(a.timeout_ms);
                if fields >= 7 {
                    w.array(a.inputs.len());
                    for input in &a.inputs {
                        s.bin(w, input);
                    }
                }
                if fields == 8 {
                    a.res.write(w);
                }
            }
        }
        Msg::Result { results } => {
            w.head(k, 1);
            w.array(results.len());
            for t in results {
                w.array(7);
                w.uint(t.task);
                w.uint(t.attempt);
                w.uint(t.status);
                s.bin(w, &t.data);
                for us in [t.exec_us, t.wait_us, t.flush_us] {
                    w.uint(us);
                }
            }
        }
        Msg::Return { tasks } | Msg::Abort { tasks } => {
            w.head(k, 1);
            w.array(tasks.len());
            for (task, attempt) in tasks {
                w.array(2);
                w.uint(*task);
                w.uint(*attempt);
            }
        }
        Msg::Heartbeat | Msg::Drain => w.head(k, 0),
        Msg::Release { keys } => {
            w.head(k, 1);
            w.array(keys.len());
            for (session, key) in keys {
                w.array(2);
                w.uint(*session);
                s.bin(w, key);
            }
        }
        Msg::Drop { keys } => {
            w.head(k, 1);
            w.array(keys.len());
            for key in keys {
                s.bin(w, key);
            }
        }
        Msg::Serve { functions } => {
            w.head(k, 1);
            w.array(functions.len());
            for f in functions {
                w.array(3);
                w.str(&f.name);
                w.str(&f.version);
                s.bin(w, &f.interface);
            }
        }
        Msg::Call {
            req_id,
            opts,
            calls,
        } => {
            w.head(k, 3);
            w.uint(*req_id);
            opts.write_map(w);
            w.array(calls.len());
            for c in calls {
                w.array(5);
                w.str(&c.name);
                w.str(&c.version);
                s.bin(w, &c.args);
                w.array(c.deps.len());
                for dep in &c.deps {
                    w.uint(*dep);
                }
                w.bool(c.fetch);
            }
        }
        Msg::Functions { req_id, name } => {
            w.head(k, 2);
            w.uint(*req_id);
            w.str(name);
        }
        Msg::AssignCalls { calls } => {
            w.head(k, 1);
            w.array(calls.len());
            for c in calls {
                // Trailing fields only as far as needed: `res` needs `keep` (maybe false)
                // before it; a call that asks for nothing is as version 2 defined it.
                let fields = if !c.res.is_empty() {
                    9
                } else if c.keep {
                    8
                } else {
                    7
                };
                w.array(fields);
                w.uint(c.task);
                w.uint(c.attempt);
                w.str(&c.name);
                w.str(&c.version);
                s.bin(w, &c.args);
                w.array(c.inputs.len());
                for input in &c.inputs {
                    s.bin(w, input);
                }
                w.uint(c.timeout_ms);
                if fields >= 8 {
                    w.bool(c.keep);
                }
                if fields == 9 {
                    c.res.write(w);
                }
            }
        }
        Msg::FunctionsReply { req_id, functions } => {
            w.head(k, 2);
            w.uint(*req_id);
            w.array(functions.len());
            for f in functions {
                w.array(4);
                w.str(&f.name);
                w.str(&f.version);
                w.uint(f.servers);
                s.bin(w, &f.interface);
            }
        }
        Msg::ClusterStatus { req_id } => {
            w.head(k, 1);
            w.uint(*req_id);
        }
        Msg::ClusterStatusReply { req_id, status } => {
            w.head(k, 2);
            w.uint(*req_id);
            w.raw(status);
        }
    }
}

/// The message header, on top of the plain msgpack [`Writer`].
trait Head {
    /// The message array header and its kind.
    fn head(&mut self, kind: u8, fields: usize);
}

impl Head for Writer<'_, BytesMut> {
    fn head(&mut self, kind: u8, fields: usize) {
        self.array(1 + fields);
        self.uint(kind);
    }
}
