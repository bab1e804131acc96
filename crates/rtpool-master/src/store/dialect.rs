//! [`Dialect`]: the little that differs between the SQL backends (how a statement runs, how a
//! write transaction opens, what the schema's column types are called), and [`Value`], what
//! crosses a query either way. Everything the backends share is written once against them in
//! [`super::sql`].

use super::StoreError;

/// A value bound into or read out of a query, whichever backend runs it.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// SQL `NULL`.
    Null,
    /// Any integer column (SQLite `INTEGER`, PostgreSQL `BIGINT` or `INTEGER`).
    Int(i64),
    /// A floating-point value: SQLite holds one where an older master overflowed an integer.
    Real(f64),
    /// A text column.
    Text(String),
    /// A PostgreSQL `BOOLEAN` (SQLite stores flags as integers 0 and 1).
    Bool(bool),
}

impl Value {
    /// The text in this value, or [`StoreError::Corrupt`] naming `what`.
    pub(super) fn into_text(self, what: &'static str) -> Result<String, StoreError> {
        match self {
            Value::Text(s) => Ok(s),
            other => Err(other.corrupt(what)),
        }
    }

    /// The integer in this value, or [`StoreError::Corrupt`] naming `what`.
    pub(super) fn int(&self, what: &'static str) -> Result<i64, StoreError> {
        match self {
            Value::Int(i) => Ok(*i),
            other => Err(other.clone().corrupt(what)),
        }
    }

    /// An integer column read whatever the database holds in it: a REAL saturates into `i64`
    /// (`as` also maps NaN to 0); NULL, text and flags read as `None`.
    pub(super) fn lenient_int(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            Value::Real(f) => Some(*f as i64),
            Value::Null | Value::Text(_) | Value::Bool(_) => None,
        }
    }

    /// A flag: a PostgreSQL boolean or a SQLite integer (non-zero is true).
    pub(super) fn flag(&self, what: &'static str) -> Result<bool, StoreError> {
        match self {
            Value::Bool(b) => Ok(*b),
            Value::Int(i) => Ok(*i != 0),
            other => Err(other.clone().corrupt(what)),
        }
    }

    fn corrupt(self, what: &'static str) -> StoreError {
        StoreError::Corrupt {
            what,
            value: format!("{self:?}"),
        }
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Value::Text(s.to_owned())
    }
}

impl From<i64> for Value {
    fn from(i: i64) -> Self {
        Value::Int(i)
    }
}

impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(v: Option<T>) -> Self {
        v.map_or(Value::Null, Into::into)
    }
}

impl From<i32> for Value {
    fn from(i: i32) -> Self {
        Value::Int(i.into())
    }
}

/// One backend's connection and its SQL dialect. The shared statements are written in the
/// common subset of SQLite and PostgreSQL (`ON CONFLICT .. DO UPDATE`, `TRUE`/`FALSE`, `CASE`
/// for the larger of two values) with `$1`-style placeholders, which a backend may rewrite.
pub trait Dialect: Send {
    /// Statement that opens a write transaction.
    const BEGIN: &'static str;
    /// Name of the 64-bit integer column type (the `schema_version` table).
    const BIGINT: &'static str;
    /// What orders tokens created in the same second: their insertion order where the backend
    /// keeps one.
    const INSERTION_ORDER: &'static str;
    /// Schema migrations: `(version, SQL)`, applied in order, each once, in the transaction
    /// that records it in `schema_version`.
    const MIGRATIONS: &'static [(i64, &'static str)];

    /// Run `sql`, one or more statements without parameters.
    ///
    /// # Errors
    /// The backend's error.
    fn batch(&mut self, sql: &str) -> Result<(), StoreError>;

    /// Run one statement with `params` bound to `$1`, `$2`, ...; returns the rows it changed.
    ///
    /// # Errors
    /// The backend's error.
    fn execute(&mut self, sql: &str, params: &[Value]) -> Result<u64, StoreError>;

    /// Run one query with `params` bound to `$1`, `$2`, ...; returns its rows, column by column.
    ///
    /// # Errors
    /// The backend's error.
    fn query(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Vec<Value>>, StoreError>;

    /// Called first in the migration transaction, so that two masters starting together
    /// migrate one after the other (a no-op where [`Dialect::BEGIN`] already locks).
    ///
    /// # Errors
    /// The backend's error.
    fn lock_migrations(&mut self) -> Result<(), StoreError> {
        Ok(())
    }
}
