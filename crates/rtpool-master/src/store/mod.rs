//! The store: users, their tokens and their compute-time quotas, in SQLite (default, one file in
//! the data dir) or PostgreSQL (several masters, or an operator who wants one database).
//!
//! The store owns persistence only. It keeps the SHA-256 of each token, never the token itself,
//! so a copy of the database lets nobody connect. Checking a `HELLO` against it is
//! [`crate::auth::Authenticator`]'s job; enforcing quotas (refusing packages, charging execution
//! time) is the scheduler's. The master writes usage behind, off the dispatch path, with
//! [`Store::add_usage`], together with the journal position the usage covers
//! ([`Store::watermark`]), so a restart neither loses nor double-counts usage.
//!
//! Every call blocks (file or network I/O): call it from a blocking context, never from the
//! master's runtime thread directly.

mod dialect;
mod postgres;
mod sql;
mod sqlite;

use std::path::{Path, PathBuf};

use base64::Engine;
use rtpool_proto::Role;
use sha2::{Digest, Sha256};

pub use self::postgres::{PgStore, Postgres};
pub use self::sql::SqlStore;
pub use self::sqlite::{Sqlite, SqliteStore};

/// A token as the store knows it: everything but the secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenInfo {
    /// Public, non-secret name of the token: the first 12 hex chars of its SHA-256.
    pub id: String,
    /// The user the token acts for.
    pub user: String,
    /// What the token may connect as.
    pub role: Role,
    /// Creation time, seconds since the Unix epoch.
    pub created_unix: i64,
    /// A revoked token no longer authenticates.
    pub revoked: bool,
}

/// A user's compute-time budget and what was charged against it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserQuota {
    /// The user's name.
    pub user: String,
    /// Budget in microseconds of execution time; `None` means unlimited.
    pub quota_us: Option<u64>,
    /// Execution time charged so far, in microseconds.
    pub used_us: u64,
    /// Highest package priority the user's clients may ask for; `None` means no ceiling.
    pub max_priority: Option<i32>,
}

/// Why a store operation failed. Messages say what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store URL names no supported backend.
    #[error("unsupported store {url:?}: use `sqlite` (the data dir's rtpool.db), `sqlite:///abs/path.db` or `postgres://user@host:port/db`")]
    BadUrl {
        /// The URL given (password removed).
        url: String,
    },
    /// The SQLite database file could not be opened or set up.
    #[error("cannot open SQLite store {path}: {source}; check that its directory exists and is writable")]
    OpenSqlite {
        /// The database file.
        path: PathBuf,
        /// What SQLite said.
        source: rusqlite::Error,
    },
    /// The data dir holding the default SQLite file could not be created.
    #[error("cannot create data dir {path}: {source}; check the path and its permissions")]
    DataDir {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The PostgreSQL server could not be reached or refused the login.
    #[error("cannot connect to PostgreSQL at {url}: {source}; is the server running, and do the user and database exist?")]
    ConnectPostgres {
        /// The URL (password removed).
        url: String,
        /// What the client library said.
        source: ::postgres::Error,
    },
    /// A query on the SQLite store failed.
    #[error("SQLite store failed: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// A query on the PostgreSQL store failed.
    #[error("PostgreSQL store failed: {0}")]
    Postgres(#[from] ::postgres::Error),
    /// The database was written by a newer rtpool.
    #[error("the store has schema version {found}, newer than the {supported} this rtpool knows; upgrade rtpool")]
    SchemaTooNew {
        /// Version found in `schema_version`.
        found: i64,
        /// Newest version this build can migrate to.
        supported: i64,
    },
    /// A user name that cannot be stored.
    #[error("invalid user name {user:?}: use 1 to 64 characters among letters, digits, `_`, `-`, `.` and `@`")]
    InvalidUser {
        /// The name given.
        user: String,
    },
    /// A quota that is negative, not a number or too large.
    #[error("invalid quota {seconds} s: give a finite number of seconds >= 0 (or no quota for unlimited)")]
    InvalidQuota {
        /// The seconds given.
        seconds: f64,
    },
    /// A number does not fit the database's signed 64-bit integers.
    #[error("{what} {value} is too large to store (at most {max})", max = i64::MAX)]
    TooLarge {
        /// Which number.
        what: &'static str,
        /// Its value.
        value: u64,
    },
    /// A token id that is too short or not hex.
    #[error(
        "invalid token id {id:?}: give at least 6 hex characters of an id from `rtpool token list`"
    )]
    InvalidId {
        /// The id given.
        id: String,
    },
    /// No token has this id (or id prefix).
    #[error("no token with id {id:?}; `rtpool token list` shows the ids")]
    NoSuchToken {
        /// The id or prefix given.
        id: String,
    },
    /// Several tokens start with this prefix.
    #[error("token id prefix {id:?} matches {} tokens ({}); give more characters", matches.len(), matches.join(", "))]
    AmbiguousId {
        /// The prefix given.
        id: String,
        /// The ids it matches.
        matches: Vec<String>,
    },
    /// A stored value the code does not understand (a damaged or foreign database).
    #[error("the store holds an unexpected {what} {value:?}; was the database edited by hand?")]
    Corrupt {
        /// Which field.
        what: &'static str,
        /// Its value.
        value: String,
    },
}

/// Users, tokens and quotas, persisted. See the module docs.
pub trait Store: Send {
    /// Create a token for `user` with `role`, returning the token (shown to the operator once,
    /// never stored) and its info. When `quota_seconds` is `Some`, also set the user's quota.
    ///
    /// # Errors
    /// [`StoreError::InvalidUser`], [`StoreError::InvalidQuota`], or a database error.
    fn create_token(
        &mut self,
        user: &str,
        role: Role,
        quota_seconds: Option<f64>,
    ) -> Result<(String, TokenInfo), StoreError>;

    /// Every token, oldest first, revoked ones included.
    ///
    /// # Errors
    /// A database error.
    fn list_tokens(&mut self) -> Result<Vec<TokenInfo>, StoreError>;

    /// Revoke the token whose id is `id` or starts with `id` (at least 6 hex chars). Revoking a
    /// revoked token is not an error. Returns the token's info after the change.
    ///
    /// # Errors
    /// [`StoreError::InvalidId`], [`StoreError::NoSuchToken`], [`StoreError::AmbiguousId`], or a
    /// database error.
    fn revoke(&mut self, id: &str) -> Result<TokenInfo, StoreError>;

    /// The user and role of `token`, or `None` when it is unknown or revoked.
    ///
    /// # Errors
    /// A database error.
    fn verify(&mut self, token: &str) -> Result<Option<(String, Role)>, StoreError>;

    /// Set `user`'s quota in seconds of execution time (`None`: unlimited), creating the user
    /// if needed; what the user already used is kept.
    ///
    /// # Errors
    /// [`StoreError::InvalidUser`], [`StoreError::InvalidQuota`], or a database error.
    fn set_quota(&mut self, user: &str, quota_seconds: Option<f64>) -> Result<(), StoreError>;

    /// Every user with their quota and usage, by name.
    ///
    /// # Errors
    /// A database error.
    fn quotas(&mut self) -> Result<Vec<UserQuota>, StoreError>;

    /// In one transaction, add each `(user, microseconds)` to that user's usage (creating
    /// unknown users, unlimited) and raise the stored watermark to `watermark` (it never goes
    /// down). Duplicate users in `usage` add up. Usage saturates at `i64::MAX` microseconds
    /// (292,000 years): no value a peer reports can overflow the column.
    ///
    /// # Errors
    /// [`StoreError::TooLarge`] for a watermark above `i64::MAX`, or a database error; then
    /// nothing was written.
    fn add_usage(&mut self, usage: &[(String, u64)], watermark: u64) -> Result<(), StoreError>;

    /// Set `user`'s priority ceiling (`None`: none), creating the user if needed. A client of
    /// the user asking for a higher priority is refused (`ERROR rejected`).
    ///
    /// # Errors
    /// [`StoreError::InvalidUser`] or a database error.
    fn set_max_priority(&mut self, user: &str, max_priority: Option<i32>)
        -> Result<(), StoreError>;

    /// Ids of the revoked tokens, for the master to close their open sessions.
    ///
    /// # Errors
    /// A database error.
    fn revoked_ids(&mut self) -> Result<Vec<String>, StoreError>;

    /// Journal position (LSN) up to which usage is included in the stored totals; 0 at first.
    ///
    /// # Errors
    /// A database error.
    fn watermark(&mut self) -> Result<u64, StoreError>;
}

/// Open the store named by `store`, creating its schema if missing:
/// `None` or `"sqlite"` is `<data_dir>/rtpool.db`; `"sqlite:///abs/path.db"` a given SQLite file;
/// `"postgres://user@host:port/db"` (or `postgresql://`) a PostgreSQL database.
///
/// # Errors
/// [`StoreError::BadUrl`] for any other string, or the backend's open or connect error.
pub fn open(store: Option<&str>, data_dir: &Path) -> Result<Box<dyn Store>, StoreError> {
    match store.map(str::trim) {
        None | Some("") | Some("sqlite") => {
            std::fs::create_dir_all(data_dir).map_err(|source| StoreError::DataDir {
                path: data_dir.to_path_buf(),
                source,
            })?;
            Ok(Box::new(SqliteStore::open(&data_dir.join("rtpool.db"))?))
        }
        Some(url) if url.starts_with("sqlite://") => {
            let path = &url["sqlite://".len()..];
            if path.is_empty() {
                return Err(StoreError::BadUrl { url: url.into() });
            }
            Ok(Box::new(SqliteStore::open(Path::new(path))?))
        }
        Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
            Ok(Box::new(PgStore::connect(url)?))
        }
        Some(url) => Err(StoreError::BadUrl {
            url: redact_url(url),
        }),
    }
}

/// Newest schema version; the migrations of each backend go up to it.
const SCHEMA_VERSION: i64 = 2;

/// Key of the usage watermark in the `meta` table.
const WATERMARK_KEY: &str = "usage_watermark";

/// A fresh token for `role`: its prefix and 43 base64url chars of 32 random bytes.
fn new_token(role: Role) -> String {
    let mut raw = [0u8; 32];
    getrandom::getrandom(&mut raw).expect("the OS random source failed");
    format!(
        "{}{}",
        role_prefix(role),
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw)
    )
}

/// The prefix a token of `role` starts with, so a human can tell the kinds apart.
pub fn role_prefix(role: Role) -> &'static str {
    match role {
        Role::Client => "rtc_",
        Role::Worker => "rtw_",
    }
}

/// Hex SHA-256 of a token: what the store keeps.
fn token_hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// The public id of `token` (what `rtpool token list` shows and `revoke` takes).
pub fn token_id_of(token: &str) -> String {
    token_id(&token_hash(token))
}

/// The public id of a token with hash `hash`.
fn token_id(hash: &str) -> String {
    hash[..12].to_string()
}

fn role_from_db(s: &str) -> Result<Role, StoreError> {
    Role::from_wire(s.as_bytes()).ok_or_else(|| StoreError::Corrupt {
        what: "role",
        value: s.into(),
    })
}

fn check_user(user: &str) -> Result<(), StoreError> {
    let ok = (1..=64).contains(&user.chars().count())
        && user
            .chars()
            .all(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | '@'));
    if ok {
        Ok(())
    } else {
        Err(StoreError::InvalidUser { user: user.into() })
    }
}

/// Seconds to microseconds as the database's signed integer; `None` stays unlimited.
fn quota_to_us(quota_seconds: Option<f64>) -> Result<Option<i64>, StoreError> {
    let Some(seconds) = quota_seconds else {
        return Ok(None);
    };
    let us = (seconds * 1e6).round();
    // `i64::MAX as f64` rounds up to 2^63, so the bound is exclusive.
    if !seconds.is_finite() || seconds < 0.0 || us >= i64::MAX as f64 {
        return Err(StoreError::InvalidQuota { seconds });
    }
    Ok(Some(us as i64))
}

fn to_db_int(what: &'static str, value: u64) -> Result<i64, StoreError> {
    i64::try_from(value).map_err(|_| StoreError::TooLarge { what, value })
}

/// A usage delta as the database's signed integer, saturating (see [`Store::add_usage`]).
fn usage_to_db(delta_us: u64) -> i64 {
    i64::try_from(delta_us).unwrap_or(i64::MAX)
}

/// A stored count of microseconds, read leniently: a negative value (a hand-edited or damaged
/// row) reads as 0, with a warning, so one bad row cannot stop quota accounting for all users.
fn from_db_int(what: &'static str, value: i64) -> u64 {
    u64::try_from(value).unwrap_or_else(|_| {
        tracing::warn!("the store holds a negative {what} ({value}); reading it as 0");
        0
    })
}

/// Check a revoke argument: at least 6 lowercase hex chars (so it is also safe in `LIKE`).
fn check_id_prefix(id: &str) -> Result<String, StoreError> {
    let id = id.trim().to_ascii_lowercase();
    if id.len() < 6 || id.len() > 64 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(StoreError::InvalidId { id });
    }
    Ok(id)
}

/// Pick the one match of a revoke prefix.
fn one_match(id: &str, mut matches: Vec<String>) -> Result<String, StoreError> {
    match matches.len() {
        0 => Err(StoreError::NoSuchToken { id: id.into() }),
        1 => Ok(matches.pop().expect("one match")),
        _ => Err(StoreError::AmbiguousId {
            id: id.into(),
            matches,
        }),
    }
}

fn now_unix() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// `url` with any password replaced by `***`, for messages and logs.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let (authority, tail) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    match authority.rsplit_once('@') {
        Some((userinfo, host)) if userinfo.contains(':') => {
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{scheme}://{user}:***@{host}{tail}")
        }
        _ => url.to_string(),
    }
}

#[cfg(test)]
pub(crate) mod tests;
