//! [`SqliteStore`]: the default store, one SQLite file (normally `<data-dir>/rtpool.db`).
//!
//! WAL mode lets `rtpool token` change the file while a master reads it; `synchronous=FULL`
//! makes every commit durable, which matters for [`super::Store::add_usage`] (usage and its watermark
//! must not roll back behind the journal) and costs little: the master writes usage about once
//! a second, off the dispatch path, and tokens change by hand.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::Connection;

use super::dialect::{Dialect, Value};
use super::sql::SqlStore;
use super::StoreError;

/// Schema migrations: `(version, SQL)`, applied in order, each once, in one transaction with
/// the `schema_version` row that records it (SQLite's DDL is transactional: an upgrade is
/// applied whole or not at all).
const MIGRATIONS: &[(i64, &str)] = &[
    (
        1,
        "CREATE TABLE IF NOT EXISTS tokens (
        hash TEXT PRIMARY KEY,
        id TEXT NOT NULL UNIQUE,
        user_name TEXT NOT NULL,
        role TEXT NOT NULL,
        created_unix INTEGER NOT NULL,
        revoked INTEGER NOT NULL DEFAULT 0
    );
    CREATE TABLE IF NOT EXISTS users (
        user_name TEXT PRIMARY KEY,
        quota_us INTEGER,
        used_us INTEGER NOT NULL DEFAULT 0
    );
    CREATE TABLE IF NOT EXISTS meta (
        key TEXT PRIMARY KEY,
        value INTEGER NOT NULL
    );",
    ),
    // Per-user priority ceiling (NULL: none).
    (2, "ALTER TABLE users ADD COLUMN max_priority INTEGER;"),
];

/// Puts back in range the counts an older master could write out of range: SQLite turns an
/// integer sum that overflows into a REAL (a worker reporting `exec_us` above 2^63 did that),
/// which then failed every read of the table. REALs past the range saturate, negative or
/// non-numeric values become 0. Run at every open; changes nothing on a sound database.
const REPAIR_USAGE: &str = "UPDATE users SET used_us = CASE
        WHEN typeof(used_us) NOT IN ('integer', 'real') THEN 0
        WHEN used_us >= 9223372036854775807 THEN 9223372036854775807
        WHEN used_us < 0 THEN 0
        ELSE CAST(used_us AS INTEGER) END
    WHERE typeof(used_us) <> 'integer' OR used_us < 0";
const REPAIR_QUOTA: &str = "UPDATE users SET quota_us = CASE
        WHEN typeof(quota_us) NOT IN ('integer', 'real') THEN NULL
        WHEN quota_us >= 9223372036854775807 THEN 9223372036854775807
        WHEN quota_us < 0 THEN 0
        ELSE CAST(quota_us AS INTEGER) END
    WHERE quota_us IS NOT NULL AND (typeof(quota_us) <> 'integer' OR quota_us < 0)";

/// A store in one SQLite file.
pub type SqliteStore = SqlStore<Sqlite>;

/// A SQLite connection, the [`Dialect`] of [`SqliteStore`].
pub struct Sqlite {
    pub(super) conn: Connection,
    path: PathBuf,
}

impl std::fmt::Debug for Sqlite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sqlite").field("path", &self.path).finish()
    }
}

impl SqlStore<Sqlite> {
    /// Open (creating if missing) the database at `path` and bring its schema up to date.
    ///
    /// # Errors
    /// [`StoreError::OpenSqlite`] when the file cannot be opened or set up,
    /// [`StoreError::SchemaTooNew`] when a newer rtpool wrote it.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let open_err = |source| StoreError::OpenSqlite {
            path: path.to_path_buf(),
            source,
        };
        let conn = Connection::open(path).map_err(open_err)?;
        // A master and `rtpool token` may write at the same moment: wait for the lock.
        conn.busy_timeout(Duration::from_secs(5))
            .map_err(open_err)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(open_err)?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(open_err)?;
        restrict_permissions(path);
        let db = Sqlite {
            conn,
            path: path.to_path_buf(),
        };
        let store = Self::migrated(db).map_err(|e| match e {
            StoreError::Sqlite(source) => open_err(source),
            other => other,
        })?;
        store.db.repair().map_err(open_err)?;
        Ok(store)
    }
}

impl Sqlite {
    fn repair(&self) -> rusqlite::Result<()> {
        let fixed = self.conn.execute(REPAIR_USAGE, [])? + self.conn.execute(REPAIR_QUOTA, [])?;
        if fixed > 0 {
            tracing::warn!(
                "store {}: repaired {fixed} out-of-range usage or quota values (written by an \
                 older rtpool from a bad worker report)",
                self.path.display()
            );
        }
        Ok(())
    }
}

/// SQLite numbers its placeholders `?1`; the shared statements write `$1`.
fn placeholders(sql: &str) -> String {
    sql.replace('$', "?")
}

impl Dialect for Sqlite {
    // IMMEDIATE: take the write lock at once, so two processes opening a new file migrate one
    // after the other and a writer never fails to upgrade a read lock.
    const BEGIN: &'static str = "BEGIN IMMEDIATE";
    const BIGINT: &'static str = "INTEGER";
    const INSERTION_ORDER: &'static str = "rowid";
    const MIGRATIONS: &'static [(i64, &'static str)] = MIGRATIONS;

    fn batch(&mut self, sql: &str) -> Result<(), StoreError> {
        Ok(self.conn.execute_batch(sql)?)
    }

    fn execute(&mut self, sql: &str, params: &[Value]) -> Result<u64, StoreError> {
        let mut stmt = self.conn.prepare_cached(&placeholders(sql))?;
        Ok(stmt.execute(rusqlite::params_from_iter(params))? as u64)
    }

    fn query(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Vec<Value>>, StoreError> {
        let mut stmt = self.conn.prepare_cached(&placeholders(sql))?;
        let width = stmt.column_count();
        let rows = stmt.query_map(rusqlite::params_from_iter(params), |row| {
            (0..width)
                .map(|i| Ok(from_sqlite(row.get_ref(i)?)))
                .collect::<rusqlite::Result<Vec<_>>>()
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}

/// A value as SQLite returns it; a blob (which rtpool never writes) reads as `NULL`.
fn from_sqlite(value: ValueRef<'_>) -> Value {
    match value {
        ValueRef::Integer(i) => Value::Int(i),
        ValueRef::Real(f) => Value::Real(f),
        ValueRef::Text(t) => Value::Text(String::from_utf8_lossy(t).into_owned()),
        ValueRef::Null | ValueRef::Blob(_) => Value::Null,
    }
}

impl rusqlite::ToSql for Value {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match self {
            Value::Null => ValueRef::Null,
            Value::Int(i) => ValueRef::Integer(*i),
            Value::Real(f) => ValueRef::Real(*f),
            Value::Text(s) => ValueRef::Text(s.as_bytes()),
            Value::Bool(b) => ValueRef::Integer(i64::from(*b)),
        }))
    }
}

/// Owner-only permissions on a new database file: it holds no secrets, but who may connect
/// and how much they used is nobody else's business. Best effort (the file may be elsewhere).
fn restrict_permissions(path: &Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
    }
    #[cfg(not(unix))]
    let _ = path;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::tests::{check_ambiguous, check_store, raw_token_absent_from, sibling_id};
    use crate::store::{Store, SCHEMA_VERSION};
    use rtpool_proto::Role;

    #[test]
    fn sqlite_store_passes_the_shared_suite() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rtpool.db");
        let mut store = SqliteStore::open(&path).unwrap();
        let tokens = check_store(&mut store);
        let id = store.list_tokens().unwrap()[0].id.clone();
        store
            .db
            .conn
            .execute(
                "INSERT INTO tokens VALUES ('planted', ?1, 'mallory', 'client', 0, 0)",
                [sibling_id(&id)],
            )
            .unwrap();
        check_ambiguous(&mut store, &id);
        drop(store);
        // The file and its WAL hold hashes only (checkpointed on close, so look at both).
        for entry in std::fs::read_dir(dir.path()).unwrap() {
            let bytes = std::fs::read(entry.unwrap().path()).unwrap();
            raw_token_absent_from(&bytes, &tokens);
        }
    }

    #[test]
    fn reopening_keeps_data_and_migrates_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.db");
        let (token, info) = SqliteStore::open(&path)
            .unwrap()
            .create_token("alice", Role::Client, Some(1.5))
            .unwrap();
        let mut again = SqliteStore::open(&path).unwrap();
        assert_eq!(
            again.verify(&token).unwrap(),
            Some(("alice".into(), Role::Client))
        );
        assert_eq!(again.list_tokens().unwrap(), vec![info]);
        let versions: i64 = again
            .db
            .conn
            .query_row("SELECT COUNT(*) FROM schema_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(versions, SCHEMA_VERSION);
        let mode: String = again
            .db
            .conn
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
        let sync: i64 = again
            .db
            .conn
            .query_row("PRAGMA synchronous", [], |r| r.get(0))
            .unwrap();
        assert_eq!(sync, 2, "synchronous=FULL");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    #[test]
    fn a_bad_row_on_disk_is_repaired_and_readable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.db");
        let mut store = SqliteStore::open(&path).unwrap();
        store
            .create_token("alice", Role::Client, Some(1.0))
            .unwrap();
        store.add_usage(&[("bob".into(), 5)], 1).unwrap();
        // What an older master wrote after a worker reported exec_us above 2^63: SQLite turned
        // the overflowing sum into a REAL, and every read of the table failed.
        store
            .db
            .conn
            .execute_batch(
                "UPDATE users SET used_us = used_us + 9223372036854775807 WHERE user_name = 'bob';
                 UPDATE users SET quota_us = 1e300, used_us = -4 WHERE user_name = 'alice';",
            )
            .unwrap();
        let kind: String = store
            .db
            .conn
            .query_row(
                "SELECT typeof(used_us) FROM users WHERE user_name = 'bob'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(kind, "real", "the test must plant the bad row it claims to");
        // Even before a repair, reading is lenient.
        let quotas = store.quotas().unwrap();
        assert_eq!(quotas[1].used_us, i64::MAX as u64);
        drop(store);
        let mut again = SqliteStore::open(&path).unwrap();
        let quotas = again.quotas().unwrap();
        assert_eq!(
            (quotas[0].quota_us, quotas[0].used_us, quotas[1].used_us),
            (Some(i64::MAX as u64), 0, i64::MAX as u64)
        );
        let kinds: Vec<String> = again
            .db
            .conn
            .prepare("SELECT typeof(used_us) FROM users")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(kinds, ["integer", "integer"]);
        again.add_usage(&[("bob".into(), 7)], 2).unwrap();
        assert_eq!(again.quotas().unwrap()[1].used_us, i64::MAX as u64);
    }

    #[test]
    fn a_version_1_database_is_migrated() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v1.db");
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(MIGRATIONS[0].1).unwrap();
        conn.execute_batch(
            "CREATE TABLE schema_version (version INTEGER NOT NULL);
             INSERT INTO schema_version VALUES (1);
             INSERT INTO users (user_name, quota_us, used_us) VALUES ('old', 7, 3);",
        )
        .unwrap();
        drop(conn);
        let mut store = SqliteStore::open(&path).unwrap();
        store.set_max_priority("old", Some(2)).unwrap();
        let q = store.quotas().unwrap().pop().unwrap();
        assert_eq!(
            (q.quota_us, q.used_us, q.max_priority),
            (Some(7), 3, Some(2))
        );
    }

    #[test]
    fn a_newer_schema_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.db");
        let store = SqliteStore::open(&path).unwrap();
        store
            .db
            .conn
            .execute("INSERT INTO schema_version (version) VALUES (99)", [])
            .unwrap();
        drop(store);
        let err = SqliteStore::open(&path).unwrap_err();
        assert!(
            matches!(err, StoreError::SchemaTooNew { found: 99, .. }),
            "{err}"
        );
    }
}
