//! What a task asks of its worker and what a worker has: [`Resources`] (counted amounts such as
//! `gpu=2`), [`Labels`] (`zone=a`), and what happens to a request no connected worker can
//! serve ([`Unschedulable`]). Package options (`SUBMIT.opts.resources`, `.labels`,
//! `.unschedulable`) and the trailing fields of a worker's `HELLO` carry them.
//!
//! Both maps are kept sorted by name, so that two equal requests are equal values (the core
//! interns a request as a resource class) and the encoder's bytes do not depend on the order a
//! user wrote them in.

use bytes::BufMut;
use rmp::Marker;

use super::{quote, read_int, read_str, OptionValue};
use crate::error::ProtoError;
use crate::msgpack::{describe, Reader, Writer};

/// Most entries of a [`Resources`] or [`Labels`] map.
pub const MAX_ENTRIES: usize = 32;
/// Longest resource name or label key, in bytes.
pub const MAX_NAME_BYTES: usize = 32;
/// Longest label value, in bytes.
pub const MAX_LABEL_VALUE_BYTES: usize = 128;

/// Why `name` is not a resource name or label key (`[a-z][a-z0-9_]{0,31}`), or `None`.
pub fn check_name(name: &str) -> Option<String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_BYTES
        && name.as_bytes()[0].is_ascii_lowercase()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    (!ok).then(|| {
        format!(
            "{:?} is not a valid name: use 1 to {MAX_NAME_BYTES} characters of a-z, 0-9 and _, \
             starting with a letter",
            quote(name.as_bytes())
        )
    })
}

/// Named amounts, sorted by name, each name once: a worker's totals or a task's request.
/// Amounts are whole numbers (GPUs, GiB of memory, licenses); a missing name is 0.
///
/// Boxed (and `None` when empty), so that every package's options, which hold one, grow by
/// two words only.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Resources(Option<Box<[(String, u64)]>>);

impl Resources {
    /// Checks and sorts `entries`: valid names, each once, at most [`MAX_ENTRIES`], amounts
    /// up to `i64::MAX`. Zero amounts are dropped (asking for `gpu=0` asks for nothing).
    ///
    /// # Errors
    ///
    /// The reason, naming the bad entry.
    pub fn new(entries: impl IntoIterator<Item = (String, u64)>) -> Result<Self, String> {
        let mut v: Vec<(String, u64)> = entries.into_iter().collect();
        if v.len() > MAX_ENTRIES {
            return Err(format!("{} resources, at most {MAX_ENTRIES}", v.len()));
        }
        for (name, amount) in &v {
            if let Some(reason) = check_name(name) {
                return Err(reason);
            }
            if *amount > i64::MAX as u64 {
                return Err(format!("{name}={amount} is larger than {}", i64::MAX));
            }
        }
        v.sort();
        if let Some(w) = v.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(format!("resource {} given twice", w[0].0));
        }
        v.retain(|(_, amount)| *amount > 0);
        Ok(Self((!v.is_empty()).then(|| v.into_boxed_slice())))
    }

    /// No resource named.
    pub fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    fn entries(&self) -> &[(String, u64)] {
        self.0.as_deref().unwrap_or(&[])
    }

    /// The entries, sorted by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, u64)> {
        self.entries().iter().map(|(n, a)| (n.as_str(), *a))
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries().len()
    }

    /// The amount of `name` (0 when absent).
    pub fn get(&self, name: &str) -> u64 {
        let e = self.entries();
        e.binary_search_by(|(n, _)| n.as_str().cmp(name))
            .map_or(0, |i| e[i].1)
    }

    /// The first entry of `self` that `total` has less of, as `(name, asked, has)`; `None`
    /// when `total` covers every amount.
    pub fn shortfall(&self, total: &Resources) -> Option<(&str, u64, u64)> {
        self.iter()
            .map(|(name, asked)| (name, asked, total.get(name)))
            .find(|&(_, asked, has)| has < asked)
    }

    /// `name=amount,...` in name order (empty string for none).
    pub fn describe(&self) -> String {
        let parts: Vec<String> = self.iter().map(|(n, a)| format!("{n}={a}")).collect();
        parts.join(",")
    }

    /// Reads a msgpack map of str to non-negative integer: `Ok(Err(reason))` for a wrong type
    /// or a bad entry (the value is consumed), `Err` when the body is broken.
    pub fn read(r: &mut Reader, field: &str) -> Result<Result<Self, String>, ProtoError> {
        read_map(r, field, |r, field| {
            Ok(read_int(r, field, 0, i64::MAX)?.map(|v| v as u64))
        })
        .map(|entries| entries.and_then(Self::new))
    }

    /// Writes it as a msgpack map in name order.
    pub fn write<B: BufMut>(&self, w: &mut Writer<'_, B>) {
        w.map(self.entries().len());
        for (name, amount) in self.entries() {
            w.str(name);
            w.uint(*amount);
        }
    }
}

/// Named strings, sorted by key, each key once: a worker's labels or the labels a task
/// requires (all must be equal on the worker).
///
/// Boxed and `None` when empty, as [`Resources`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Labels(Option<Box<[(String, String)]>>);

impl Labels {
    /// Checks and sorts `entries`: valid keys, each once, values of at most
    /// [`MAX_LABEL_VALUE_BYTES`], at most [`MAX_ENTRIES`].
    ///
    /// # Errors
    ///
    /// The reason, naming the bad entry.
    pub fn new(entries: impl IntoIterator<Item = (String, String)>) -> Result<Self, String> {
        let mut v: Vec<(String, String)> = entries.into_iter().collect();
        if v.len() > MAX_ENTRIES {
            return Err(format!("{} labels, at most {MAX_ENTRIES}", v.len()));
        }
        for (key, value) in &v {
            if let Some(reason) = check_name(key) {
                return Err(reason);
            }
            if value.len() > MAX_LABEL_VALUE_BYTES {
                return Err(format!(
                    "label {key}: {} bytes, at most {MAX_LABEL_VALUE_BYTES}",
                    value.len()
                ));
            }
        }
        v.sort();
        if let Some(w) = v.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(format!("label {} given twice", w[0].0));
        }
        Ok(Self((!v.is_empty()).then(|| v.into_boxed_slice())))
    }

    /// No label.
    pub fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    fn entries(&self) -> &[(String, String)] {
        self.0.as_deref().unwrap_or(&[])
    }

    /// The entries, sorted by key.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.entries().iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        let e = self.entries();
        e.binary_search_by(|(k, _)| k.as_str().cmp(key))
            .ok()
            .map(|i| e[i].1.as_str())
    }

    /// The first required label that `have` lacks or has another value of, as
    /// `(key, wanted, has)`; `None` when every one matches.
    pub fn mismatch<'a>(&'a self, have: &'a Labels) -> Option<(&'a str, &'a str, Option<&'a str>)> {
        self.iter()
            .map(|(k, v)| (k, v, have.get(k)))
            .find(|&(_, v, h)| h != Some(v))
    }

    /// `key=value,...` in key order (empty string for none).
    pub fn describe(&self) -> String {
        let parts: Vec<String> = self.iter().map(|(k, v)| format!("{k}={v}")).collect();
        parts.join(",")
    }

    /// Reads a msgpack map of str to str, as [`Resources::read`].
    pub fn read(r: &mut Reader, field: &str) -> Result<Result<Self, String>, ProtoError> {
        read_map(r, field, |r, field| {
            Ok(read_str(r, field)?
                .map(|range| String::from_utf8_lossy(r.bytes_of(range)).into_owned()))
        })
        .map(|entries| entries.and_then(Self::new))
    }

    /// Writes it as a msgpack map in key order.
    pub fn write<B: BufMut>(&self, w: &mut Writer<'_, B>) {
        w.map(self.entries().len());
        for (key, value) in self.entries() {
            w.str(key);
            w.str(value);
        }
    }
}

/// Reads a msgpack map with str keys and values read by `value`; `Ok(Err(reason))` for a
/// value that is not a map or a bad entry (everything consumed).
fn read_map<T>(
    r: &mut Reader,
    field: &str,
    mut value: impl FnMut(&mut Reader, &str) -> Result<Result<T, String>, ProtoError>,
) -> Result<Result<Vec<(String, T)>, String>, ProtoError> {
    if !matches!(
        r.peek_marker(),
        Some(Marker::FixMap(_) | Marker::Map16 | Marker::Map32)
    ) {
        let found = r.peek_marker().map(describe);
        r.skip(field, 0)?;
        return Ok(Err(format!(
            "expected a map, found {}",
            found.unwrap_or("?")
        )));
    }
    let n = r.map_len(field)?;
    let mut entries = Vec::with_capacity(n.min(MAX_ENTRIES));
    let mut bad = None;
    for _ in 0..n {
        let key = match read_str(r, field)? {
            Ok(range) => Ok(String::from_utf8_lossy(r.bytes_of(range)).into_owned()),
            Err(reason) => Err(format!("a key: {reason}")),
        };
        let v = value(r, field)?;
        match (key, v) {
            (Ok(k), Ok(v)) => entries.push((k, v)),
            (Ok(k), Err(reason)) => {
                bad.get_or_insert(format!("{k}: {reason}"));
            }
            (Err(reason), _) => {
                bad.get_or_insert(reason);
            }
        }
    }
    Ok(match bad {
        Some(reason) => Err(reason),
        None => Ok(entries),
    })
}

impl OptionValue for Resources {
    fn read(
        r: &mut Reader,
        field: &str,
        _limit: Option<(i64, i64)>,
    ) -> Result<Result<Self, String>, ProtoError> {
        Resources::read(r, field)
    }

    fn write<B: BufMut>(&self, w: &mut Writer<'_, B>) {
        Resources::write(self, w);
    }
}

impl OptionValue for Labels {
    fn read(
        r: &mut Reader,
        field: &str,
        _limit: Option<(i64, i64)>,
    ) -> Result<Result<Self, String>, ProtoError> {
        Labels::read(r, field)
    }

    fn write<B: BufMut>(&self, w: &mut Writer<'_, B>) {
        Labels::write(self, w);
    }
}

/// What the master does with a package whose request no connected worker could ever serve
/// (`opts.unschedulable`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Unschedulable {
    /// `"error"`: refuse it at submission (`ERROR unschedulable`), and fail its queued tasks
    /// when the last worker that could serve it leaves for longer than the service grace (the
    /// default).
    #[default]
    Error,
    /// `"wait"`: accept it with a warning (`ACCEPTED.notice`) and queue it until a worker that
    /// can serve it joins.
    Wait,
}

impl Unschedulable {
    /// The policy's name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Unschedulable::Error => "error",
            Unschedulable::Wait => "wait",
        }
    }
}

impl OptionValue for Unschedulable {
    fn read(
        r: &mut Reader,
        field: &str,
        _limit: Option<(i64, i64)>,
    ) -> Result<Result<Self, String>, ProtoError> {
        Ok(
            read_str(r, field)?.and_then(|range| match r.bytes_of(range.clone()) {
                b"error" => Ok(Unschedulable::Error),
                b"wait" => Ok(Unschedulable::Wait),
                other => Err(format!(
                    "expected \"error\" or \"wait\", found {:?}",
                    quote(other)
                )),
            }),
        )
    }

    fn write<B: BufMut>(&self, w: &mut Writer<'_, B>) {
        w.str(self.as_str());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resources_are_sorted_checked_and_zero_free() {
        let r = Resources::new([("mem_gb".into(), 8), ("gpu".into(), 1), ("x".into(), 0)]).unwrap();
        assert_eq!(r.describe(), "gpu=1,mem_gb=8");
        assert_eq!(r.get("gpu"), 1);
        assert_eq!(r.get("cpu"), 0);
        assert!(Resources::new([("GPU".into(), 1)])
            .unwrap_err()
            .contains("not a valid name"));
        assert!(Resources::new([("a".into(), 1), ("a".into(), 2)])
            .unwrap_err()
            .contains("twice"));
        let total = Resources::new([("gpu".into(), 2), ("mem_gb".into(), 4)]).unwrap();
        assert_eq!(r.shortfall(&total), Some(("mem_gb", 8, 4)));
        let big = Resources::new([("gpu".into(), 2), ("mem_gb".into(), 64)]).unwrap();
        assert_eq!(r.shortfall(&big), None);
    }

    #[test]
    fn labels_match_all_or_name_the_first_that_differs() {
        let want =
            Labels::new([("zone".into(), "a".into()), ("cuda".into(), "12".into())]).unwrap();
        let have =
            Labels::new([("zone".into(), "a".into()), ("cuda".into(), "11".into())]).unwrap();
        assert_eq!(want.mismatch(&have), Some(("cuda", "12", Some("11"))));
        let have =
            Labels::new([("zone".into(), "a".into()), ("cuda".into(), "12".into())]).unwrap();
        assert_eq!(want.mismatch(&have), None);
        assert_eq!(
            want.mismatch(&Labels::default()),
            Some(("cuda", "12", None))
        );
    }
}
