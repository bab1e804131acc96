//! [`PackageOpts`]: the options of a package, defined once for the wire, the core and the
//! journal.
//!
//! The list in `package_options!` below is the only place an option is named: the macro
//! generates the struct, its defaults, the decoder's key table and error field names, the
//! reading of one value with its type and range checks, and the writing of the options map
//! (only the values that differ from their default, in list order, as the Python encoder does).
//! The wire (`SUBMIT.opts`, `CALL.opts`), the core (`Event::Submit.opts`) and the journal
//! (`Package` records) all carry this one type.
//!
//! Adding an option is one line here (its doc, type, default, wire key and optional limits),
//! plus the code that honours it. Limits that involve other options or the master's state
//! (`quorum <= replicas`, at most 16 copies, `admit` without a deadline) are the core's to
//! check.

mod request;

use std::ops::Range;

use bytes::BufMut;
use rmp::Marker;

use crate::error::ProtoError;
use crate::limits::MAX_KEY_BYTES;
use crate::msgpack::{describe, Int, Reader, Writer};

pub use self::request::{
    check_name, Labels, Resources, Unschedulable, MAX_ENTRIES, MAX_LABEL_VALUE_BYTES,
    MAX_NAME_BYTES as MAX_RESOURCE_NAME_BYTES,
};

/// What the master does with the tasks of a package that can no longer make their deadline
/// (`opts.on_miss`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum MissPolicy {
    /// `"run"`: late tasks run anyway; each late result reports its lateness (the default).
    #[default]
    Run,
    /// `"drop"`: a queued task that cannot finish in time (by its function's estimate) is not
    /// started, and at the deadline every unfinished task fails with `status::MISSED`
    /// (running ones are aborted on their workers).
    Drop,
}

impl MissPolicy {
    /// The policy's name on the wire: `"run"` or `"drop"`.
    pub fn as_str(self) -> &'static str {
        match self {
            MissPolicy::Run => "run",
            MissPolicy::Drop => "drop",
        }
    }

    /// Parses the wire name of a policy; `None` for anything but `"run"` and `"drop"`.
    pub fn from_wire(name: &[u8]) -> Option<MissPolicy> {
        match name {
            b"run" => Some(MissPolicy::Run),
            b"drop" => Some(MissPolicy::Drop),
            _ => None,
        }
    }
}

/// Defines [`PackageOpts`] from one list of `field: type = default => "wire_key"` entries, each
/// with its doc comment and an optional `limit (min, max)` (an integer's range, a string's
/// length in bytes).
macro_rules! package_options {
    ($(
        $(#[doc = $doc:literal])*
        $field:ident: $ty:ty = $default:expr => $key:literal $(, limit $limit:expr)?;
    )*) => {
        /// Options of a package (`SUBMIT.opts`, `CALL.opts`), as the client sent them, the
        /// core runs them and the journal records them. [`Default`] gives the protocol's
        /// defaults, which the encoder leaves out of the map.
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct PackageOpts {
            $( $(#[doc = $doc])* pub $field: $ty, )*
        }

        impl Default for PackageOpts {
            fn default() -> Self {
                Self { $( $field: $default, )* }
            }
        }

        /// The option keys of protocol version 1, in spec order; a key's position is its slot.
        pub const OPTION_KEYS: &[&str] = &[$( $key ),*];

        /// The field names of `SUBMIT.opts`, for errors.
        pub const SUBMIT_OPTS: OptFields = OptFields {
            map: "SUBMIT.opts",
            key: "SUBMIT.opts key",
            value: "SUBMIT.opts value",
            options: &[$( concat!("SUBMIT.opts.", $key) ),*],
        };

        /// The field names of `CALL.opts`: the same keys as `SUBMIT.opts` (the core refuses
        /// those calls cannot use).
        pub const CALL_OPTS: OptFields = OptFields {
            map: "CALL.opts",
            key: "CALL.opts key",
            value: "CALL.opts value",
            options: &[$( concat!("CALL.opts.", $key) ),*],
        };

        /// The field names of an options map anywhere else (the master's journal).
        pub const OPTS: OptFields = OptFields {
            map: "opts",
            key: "opts key",
            value: "opts value",
            options: &[$( concat!("opts.", $key) ),*],
        };

        impl PackageOpts {
            /// Reads the value of option `slot` (named `field` in errors) into `self`:
            /// `Ok(Err(reason))` for a wrong type or value (the value is consumed, `self`
            /// unchanged), `Err` when the body itself is broken.
            #[allow(unused_assignments)]
            fn read_slot(
                &mut self,
                r: &mut Reader,
                slot: usize,
                field: &str,
            ) -> Result<Result<(), String>, ProtoError> {
                let mut i = 0;
                $(
                    if slot == i {
                        let limit: Option<(i64, i64)> = None $( .or(Some($limit)) )?;
                        return Ok(<$ty as OptionValue>::read(r, field, limit)?
                            .map(|v| self.$field = v));
                    }
                    i += 1;
                )*
                unreachable!("option slot {slot} of {}", OPTION_KEYS.len())
            }

            /// Writes the options as a msgpack map of the values that differ from their
            /// default, in spec order, so that the bytes match the Python encoder's (default
            /// options are the empty map `0x80`).
            pub fn write_map<B: BufMut>(&self, w: &mut Writer<'_, B>) {
                let d = Self::default();
                let n = 0 $( + usize::from(self.$field != d.$field) )*;
                w.map(n);
                $(
                    if self.$field != d.$field {
                        w.str($key);
                        self.$field.write(w);
                    }
                )*
            }
        }
    };
}

package_options! {
    /// Higher runs first. Within one priority, users take turns (fair share) and each user's
    /// packages run earliest deadline first (FIFO for packages without a deadline, after those
    /// with one).
    priority: i32 = 0 => "priority";
    /// Execution time limit per task, milliseconds; 0 = none.
    timeout_ms: u32 = 0 => "timeout_ms";
    /// Idempotency key (at most [`MAX_KEY_BYTES`]); empty = none. A submission whose key
    /// names a live package of the same user attaches to that package instead of creating one.
    key: String = String::new() => "key", limit (0, MAX_KEY_BYTES as i64);
    /// Deadline of every task, milliseconds after the master received the package; 0 = none.
    deadline_ms: u32 = 0 => "deadline_ms";
    /// What happens to tasks that can no longer make the deadline.
    on_miss: MissPolicy = MissPolicy::Run => "on_miss";
    /// Admission control: refuse the package at submission (`ERROR admission`) if, by the
    /// running estimate of its function's execution time, the queue ahead and the worker
    /// slots, it cannot finish by its deadline.
    admit: bool = false => "admit";
    /// Copies of each task, run on distinct workers; 0 and 1 both mean one (no redundancy).
    replicas: u8 = 1 => "replicas";
    /// Byte-equal results needed before one is accepted; 0 and 1 both mean the first result
    /// wins (the other copies are cancelled).
    quorum: u8 = 1 => "quorum";
    /// Most copies of one task ever started (initial replicas, copies added after a
    /// disagreement, hedges); 0 = the default, `replicas + quorum` (at most 16).
    max_copies: u8 = 0 => "max_copies";
    /// Straggler hedging: a task that runs longer than a multiple of its function's p95
    /// execution time, or whose deadline is at risk, gets a backup copy on another worker; the
    /// first result wins.
    hedge: bool = false => "hedge";
    /// How many times a task of this package may be attempted before it fails as poison
    /// (`status::LOST`: its worker was lost on each attempt); 1 to 255 on the wire, 0 (left
    /// out) = the master's `max_attempts` setting.
    max_attempts: u32 = 0 => "max_attempts", limit (1, 255);
    /// Data locality: the worker (its session id, as `WELCOME` told it) that holds the largest
    /// kept result among the task's arguments; 0 = none. A worker that can take the task now
    /// is preferred to the others (they pass over it while it has a free credit). The Python
    /// SDK sets it for a task whose arguments are kept results of 64 KiB or more.
    near: u64 = 0 => "near", limit (0, i64::MAX);
    /// A dependency held by the master: the package (of the same user) whose task
    /// `after_index` produces the input of every task of this package; 0 = none. The tasks
    /// wait at the master until that task is done, then run near its worker and receive its
    /// result as `Assignment.inputs`; they fail (status 3) when it fails or is cancelled.
    after: u64 = 0 => "after", limit (0, i64::MAX);
    /// The index of the producing task in package `after`.
    after_index: u32 = 0 => "after_index";
    /// What each task holds of its worker while it runs, beside its slot (`gpu=1`): it runs
    /// only on a worker whose totals cover it, when that worker has it free. Empty = nothing.
    resources: Resources = Resources::default() => "resources";
    /// Labels the worker must have, each equal (`zone=a`). Empty = any worker.
    labels: Labels = Labels::default() => "labels";
    /// What happens when no connected worker could ever serve `resources` and `labels`.
    unschedulable: Unschedulable = Unschedulable::Error => "unschedulable";
}

impl PackageOpts {
    /// Copies started per task at submission (at least 1).
    pub fn replicas(&self) -> u8 {
        self.replicas.max(1)
    }

    /// Agreeing results needed (at least 1).
    pub fn quorum(&self) -> u8 {
        self.quorum.max(1)
    }

    /// Most copies of one task ever started.
    pub fn max_copies(&self) -> u8 {
        if self.max_copies > 0 {
            self.max_copies.max(self.replicas())
        } else {
            self.replicas()
                .saturating_add(self.quorum())
                .min(16)
                .max(self.replicas())
        }
    }

    /// Reads an options map; `f` names its fields in errors ([`SUBMIT_OPTS`], [`CALL_OPTS`],
    /// [`OPTS`]).
    ///
    /// A bad option (unknown, duplicate, wrong type or out of range) does not stop the reading,
    /// as the rest of the frame must still be checked: the first one is returned as
    /// `(key, reason)` beside the options.
    ///
    /// # Errors
    ///
    /// [`ProtoError::Malformed`] when the map itself is not msgpack a peer could have meant
    /// (a key that is not a str, a value that runs past the end).
    pub fn read_map(
        r: &mut Reader,
        f: &OptFields,
    ) -> Result<(PackageOpts, Option<(String, String)>), ProtoError> {
        let n = r.map_len(f.map)?;
        let mut opts = PackageOpts::default();
        let mut bad = None;
        let mut seen = [false; OPTION_KEYS.len()];
        for _ in 0..n {
            let key = r.str_range(f.key, usize::MAX)?;
            let name = r.bytes_of(key.clone());
            let slot = OPTION_KEYS.iter().position(|k| k.as_bytes() == name);
            let problem = match slot {
                Some(i) if seen[i] => {
                    r.skip(f.value, 0)?;
                    Some("duplicate option".to_owned())
                }
                Some(i) => {
                    seen[i] = true;
                    opts.read_slot(r, i, f.options[i])?.err()
                }
                None => {
                    r.skip(f.value, 0)?;
                    Some(unknown_option())
                }
            };
            if let (Some(reason), None) = (problem, &bad) {
                bad = Some((quote(r.bytes_of(key)), reason));
            }
        }
        Ok((opts, bad))
    }
}

/// The field names of one options map, for error messages (static, so that reading options
/// allocates nothing).
#[derive(Debug)]
pub struct OptFields {
    /// The map itself.
    pub map: &'static str,
    /// Any of its keys.
    pub key: &'static str,
    /// A value that is skipped.
    pub value: &'static str,
    /// Each option's value, by slot (as [`OPTION_KEYS`]).
    pub options: &'static [&'static str],
}

/// Why an unknown option was refused; names the ones this version knows.
fn unknown_option() -> String {
    let quoted: Vec<String> = OPTION_KEYS.iter().map(|k| format!("`{k}`")).collect();
    let (last, rest) = quoted.split_last().expect("at least one option");
    format!(
        "unknown option (version 1 knows {} and {last})",
        rest.join(", ")
    )
}

/// Longest option key or role value quoted back in an error, in bytes.
const QUOTE_BYTES: usize = 64;

/// A peer-sent string for an error message: at most [`QUOTE_BYTES`], cut on a char boundary.
pub(crate) fn quote(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut end = text.len().min(QUOTE_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

/// The type of one option's value: how it is read (with its checks) and written.
trait OptionValue: Sized + PartialEq {
    /// Reads a value: `Ok(Err(reason))` for a wrong type, or a value outside `limit` (an
    /// integer's range, a string's length in bytes; `None`: the type's own); the value is
    /// consumed either way. `Err` when the body itself is broken.
    fn read(
        r: &mut Reader,
        field: &str,
        limit: Option<(i64, i64)>,
    ) -> Result<Result<Self, String>, ProtoError>;

    /// Writes the value in its most compact msgpack form.
    fn write<B: BufMut>(&self, w: &mut Writer<'_, B>);
}

/// Integer options: read within their type's range (or a narrower limit), written compactly.
macro_rules! int_option {
    ($($ty:ty => $write:ident),*) => {$(
        impl OptionValue for $ty {
            fn read(
                r: &mut Reader,
                field: &str,
                limit: Option<(i64, i64)>,
            ) -> Result<Result<Self, String>, ProtoError> {
                let (min, max) = limit.unwrap_or((<$ty>::MIN.into(), <$ty>::MAX.into()));
                // The range check makes the cast lossless for any limit within the type.
                Ok(read_int(r, field, min, max)?.map(|v| v as $ty))
            }

            fn write<B: BufMut>(&self, w: &mut Writer<'_, B>) {
                w.$write(*self);
            }
        }
    )*};
}

int_option!(i32 => sint, u32 => uint, u8 => uint);

/// `u64` options (session ids): within `0..=i64::MAX` unless a narrower limit is given.
impl OptionValue for u64 {
    fn read(
        r: &mut Reader,
        field: &str,
        limit: Option<(i64, i64)>,
    ) -> Result<Result<Self, String>, ProtoError> {
        let (min, max) = limit.unwrap_or((0, i64::MAX));
        Ok(read_int(r, field, min.max(0), max)?.map(|v| v as u64))
    }

    fn write<B: BufMut>(&self, w: &mut Writer<'_, B>) {
        w.uint(*self);
    }
}

impl OptionValue for bool {
    fn read(
        r: &mut Reader,
        field: &str,
        _limit: Option<(i64, i64)>,
    ) -> Result<Result<Self, String>, ProtoError> {
        let found = r.peek_marker();
        // `skip` consumes the one byte of a bool, or the whole value of another type.
        r.skip(field, 0)?;
        Ok(match found {
            Some(Marker::True) => Ok(true),
            Some(Marker::False) => Ok(false),
            other => Err(format!(
                "expected a bool, found {}",
                other.map_or("?", describe)
            )),
        })
    }

    fn write<B: BufMut>(&self, w: &mut Writer<'_, B>) {
        w.bool(*self);
    }
}

impl OptionValue for String {
    fn read(
        r: &mut Reader,
        field: &str,
        limit: Option<(i64, i64)>,
    ) -> Result<Result<Self, String>, ProtoError> {
        let max = limit.map_or(usize::MAX, |(_, max)| max as usize);
        Ok(read_str(r, field)?.and_then(|range| {
            let value = r.bytes_of(range);
            if value.len() > max {
                return Err(format!(
                    "{} bytes is longer than the limit of {max}",
                    value.len()
                ));
            }
            Ok(String::from_utf8_lossy(value).into_owned())
        }))
    }

    fn write<B: BufMut>(&self, w: &mut Writer<'_, B>) {
        w.str(self);
    }
}

impl OptionValue for MissPolicy {
    fn read(
        r: &mut Reader,
        field: &str,
        _limit: Option<(i64, i64)>,
    ) -> Result<Result<Self, String>, ProtoError> {
        Ok(read_str(r, field)?.and_then(|range| {
            let value = r.bytes_of(range);
            MissPolicy::from_wire(value)
                .ok_or_else(|| format!("expected \"run\" or \"drop\", found {:?}", quote(value)))
        }))
    }

    fn write<B: BufMut>(&self, w: &mut Writer<'_, B>) {
        w.str(self.as_str());
    }
}

/// Reads a `str` option and returns its range: `Ok(Err(reason))` for another type (the value
/// is consumed), `Err` when the body itself is broken.
pub(crate) fn read_str(
    r: &mut Reader,
    field: &str,
) -> Result<Result<Range<usize>, String>, ProtoError> {
    if matches!(
        r.peek_marker(),
        Some(Marker::FixStr(_) | Marker::Str8 | Marker::Str16 | Marker::Str32)
    ) {
        return Ok(Ok(r.str_range(field, usize::MAX)?));
    }
    let found = r.peek_marker().map(describe);
    r.skip(field, 0)?;
    Ok(Err(format!(
        "expected a str, found {}",
        found.unwrap_or("?")
    )))
}

/// Reads an integer option within `min..=max`: `Ok(Err(reason))` for a wrong type or range
/// (the value is consumed), `Err` when the body itself is broken.
pub(crate) fn read_int(
    r: &mut Reader,
    field: &str,
    min: i64,
    max: i64,
) -> Result<Result<i64, String>, ProtoError> {
    let is_int = matches!(
        r.peek_marker(),
        Some(
            Marker::FixPos(_)
                | Marker::FixNeg(_)
                | Marker::U8
                | Marker::U16
                | Marker::U32
                | Marker::U64
                | Marker::I8
                | Marker::I16
                | Marker::I32
                | Marker::I64
        )
    );
    if !is_int {
        let found = r.peek_marker().map(describe);
        r.skip(field, 0)?;
        return Ok(Err(format!(
            "expected an integer, found {}",
            found.unwrap_or("?")
        )));
    }
    let value: i128 = match r.int(field)? {
        Int::Uint(v) => v.into(),
        Int::Neg(v) => v.into(),
    };
    Ok(if value < min.into() || value > max.into() {
        Err(format!("{value} is out of range {min}..={max}"))
    } else {
        Ok(value as i64)
    })
}
