//! [`SqliteStore`]: the default store, one SQLite file (normally `<data-dir>/rtpool.db`).
//!
//! WAL mode lets `rtpool token` change the file while a master reads it; `synchronous=FULL`
//! makes every commit durable, which matters for [`Store::add_usage`] (usage and its watermark
//! must not roll back behind the journal) and costs little: the master writes usage about once
//! a second, off the dispatch path, and tokens change by hand.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rtpool_proto::Role;
use rusqlite::{params, Connection, OptionalExtension, Row};

use super::{
    check_id_prefix, check_user, from_db_int, new_token, now_unix, one_match, quota_to_us,
    role_from_db, to_db_int, token_hash, token_id, usage_to_db, Store, StoreError, TokenInfo,
    UserQuota, SCHEMA_VERSION, WATERMARK_KEY,
};

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
pub struct SqliteStore {
    conn: Connection,
    path: PathBuf,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .finish()
    }
}

impl SqliteStore {
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
        let mut store = Self {
            conn,
            path: path.to_path_buf(),
        };
        store.migrate().map_err(|e| match e {
            StoreError::Sqlite(source) => open_err(source),
            other => other,
        })?;
        store.repair().map_err(open_err)?;
        Ok(store)
    }

    fn migrate(&mut self) -> Result<(), StoreError> {
        // IMMEDIATE: two processes opening a new file at once migrate one after the other.
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        tx.execute_batch("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")?;
        let current: i64 = tx.query_row(
            "SELECT COALESCE(MAX(version), 0) FROM schema_version",
            [],
            |r| r.get(0),
        )?;
        if current > SCHEMA_VERSION {
            return Err(StoreError::SchemaTooNew {
                found: current,
                supported: SCHEMA_VERSION,
            });
        }
        for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > current) {
            tx.execute_batch(sql)?;
            tx.execute(
                "INSERT INTO schema_version (version) VALUES (?1)",
                [version],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    fn repair(&mut self) -> rusqlite::Result<()> {
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

    fn token_by_id(&self, id: &str) -> Result<TokenInfo, StoreError> {
        self.conn
            .query_row(
                "SELECT id, user_name, role, created_unix, revoked FROM tokens WHERE id = ?1",
                [id],
                raw_token,
            )?
            .into_info()
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

/// A `tokens` row before its role is parsed (row closures cannot return a [`StoreError`]).
struct RawToken {
    id: String,
    user: String,
    role: String,
    created_unix: i64,
    revoked: bool,
}

impl RawToken {
    fn into_info(self) -> Result<TokenInfo, StoreError> {
        Ok(TokenInfo {
            role: role_from_db(&self.role)?,
            id: self.id,
            user: self.user,
            created_unix: self.created_unix,
            revoked: self.revoked,
        })
    }
}

fn raw_token(r: &Row<'_>) -> rusqlite::Result<RawToken> {
    Ok(RawToken {
        id: r.get(0)?,
        user: r.get(1)?,
        role: r.get(2)?,
        created_unix: r.get(3)?,
        revoked: r.get(4)?,
    })
}

impl Store for SqliteStore {
    fn create_token(
        &mut self,
        user: &str,
        role: Role,
        quota_seconds: Option<f64>,
    ) -> Result<(String, TokenInfo), StoreError> {
        check_user(user)?;
        let quota_us = quota_to_us(quota_seconds)?;
        let token = new_token(role);
        let hash = token_hash(&token);
        let info = TokenInfo {
            id: token_id(&hash),
            user: user.into(),
            role,
            created_unix: now_unix(),
            revoked: false,
        };
        let tx = self.conn.transaction()?;
        tx.execute(
            "INSERT INTO tokens (hash, id, user_name, role, created_unix, revoked)
             VALUES (?1, ?2, ?3, ?4, ?5, 0)",
            params![hash, info.id, user, role.as_str(), info.created_unix],
        )?;
        tx.execute(
            "INSERT INTO users (user_name) VALUES (?1) ON CONFLICT (user_name) DO NOTHING",
            [user],
        )?;
        if quota_seconds.is_some() {
            tx.execute(
                "UPDATE users SET quota_us = ?2 WHERE user_name = ?1",
                params![user, quota_us],
            )?;
        }
        tx.commit()?;
        Ok((token, info))
    }

    fn list_tokens(&mut self) -> Result<Vec<TokenInfo>, StoreError> {
        let mut stmt = self.conn.prepare(
            "SELECT id, user_name, role, created_unix, revoked FROM tokens
             ORDER BY created_unix, rowid",
        )?;
        let rows = stmt.query_map([], raw_token)?;
        rows.map(|r| r?.into_info()).collect()
    }

    fn revoke(&mut self, id: &str) -> Result<TokenInfo, StoreError> {
        let prefix = check_id_prefix(id)?;
        let matches = {
            let mut stmt = self
                .conn
                .prepare("SELECT id FROM tokens WHERE id LIKE ?1 || '%' ORDER BY id")?;
            let rows = stmt.query_map([&prefix], |r| r.get::<_, String>(0))?;
            rows.collect::<Result<Vec<_>, _>>()?
        };
        let id = one_match(&prefix, matches)?;
        self.conn
            .execute("UPDATE tokens SET revoked = 1 WHERE id = ?1", [&id])?;
        self.token_by_id(&id)
    }

    fn verify(&mut self, token: &str) -> Result<Option<(String, Role)>, StoreError> {
        let row: Option<(String, String)> = self
            .conn
            .query_row(
                "SELECT user_name, role FROM tokens WHERE hash = ?1 AND revoked = 0",
                [token_hash(token)],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        row.map(|(user, role)| Ok((user, role_from_db(&role)?)))
            .transpose()
    }

    fn set_quota(&mut self, user: &str, quota_seconds: Option<f64>) -> Result<(), StoreError> {
        check_user(user)?;
        let quota_us = quota_to_us(quota_seconds)?;
        self.conn.execute(
            "INSERT INTO users (user_name, quota_us) VALUES (?1, ?2)
             ON CONFLICT (user_name) DO UPDATE SET quota_us = excluded.quota_us",
            params![user, quota_us],
        )?;
        Ok(())
    }

    fn quotas(&mut self) -> Result<Vec<UserQuota>, StoreError> {
        let mut stmt = self.conn.prepare(
            "SELECT user_name, quota_us, used_us, max_priority FROM users ORDER BY user_name",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok(UserQuota {
                user: r.get::<_, String>(0)?,
                quota_us: lenient_int(r.get_ref(1)?).map(|q| from_db_int("quota_us", q)),
                used_us: from_db_int("used_us", lenient_int(r.get_ref(2)?).unwrap_or(0)),
                max_priority: lenient_int(r.get_ref(3)?)
                    .map(|p| p.clamp(i32::MIN.into(), i32::MAX.into()) as i32),
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    fn add_usage(&mut self, usage: &[(String, u64)], watermark: u64) -> Result<(), StoreError> {
        let watermark = to_db_int("watermark", watermark)?;
        let tx = self.conn.transaction()?;
        {
            let mut add = tx.prepare(
                "INSERT INTO users (user_name, used_us) VALUES (?1, ?2)
                 ON CONFLICT (user_name) DO UPDATE SET used_us = CASE
                     WHEN used_us > 9223372036854775807 - excluded.used_us
                     THEN 9223372036854775807 ELSE used_us + excluded.used_us END",
            )?;
            for (user, delta_us) in usage {
                add.execute(params![user, usage_to_db(*delta_us)])?;
            }
        }
        tx.execute(
            "INSERT INTO meta (key, value) VALUES (?1, ?2)
             ON CONFLICT (key) DO UPDATE SET value = max(value, excluded.value)",
            params![WATERMARK_KEY, watermark],
        )?;
        tx.commit()?;
        Ok(())
    }

    fn watermark(&mut self) -> Result<u64, StoreError> {
        let value: Option<i64> = self
            .conn
            .query_row(
                "SELECT value FROM meta WHERE key = ?1",
                [WATERMARK_KEY],
                |r| r.get(0),
            )
            .optional()?;
        Ok(from_db_int("watermark", value.unwrap_or(0)))
    }

    fn set_max_priority(
        &mut self,
        user: &str,
        max_priority: Option<i32>,
    ) -> Result<(), StoreError> {
        check_user(user)?;
        self.conn.execute(
            "INSERT INTO users (user_name, max_priority) VALUES (?1, ?2)
             ON CONFLICT (user_name) DO UPDATE SET max_priority = excluded.max_priority",
            params![user, max_priority],
        )?;
        Ok(())
    }

    fn revoked_ids(&mut self) -> Result<Vec<String>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT id FROM tokens WHERE revoked <> 0")?;
        let rows = stmt.query_map([], |r| r.get::<_, String>(0))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}

/// An integer column read whatever SQLite holds in it: a REAL saturates into `i64`, NULL and
/// text read as `None`.
fn lenient_int(value: rusqlite::types::ValueRef<'_>) -> Option<i64> {
    use rusqlite::types::ValueRef;
    match value {
        ValueRef::Integer(i) => Some(i),
        // `as` saturates (and maps NaN to 0).
        ValueRef::Real(f) => Some(f as i64),
        ValueRef::Null | ValueRef::Text(_) | ValueRef::Blob(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::tests::{check_ambiguous, check_store, raw_token_absent_from, sibling_id};

    #[test]
    fn sqlite_store_passes_the_shared_suite() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rtpool.db");
        let mut store = SqliteStore::open(&path).unwrap();
        let tokens = check_store(&mut store);
        let id = store.list_tokens().unwrap()[0].id.clone();
        store
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
            .conn
            .query_row("SELECT COUNT(*) FROM schema_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(versions, SCHEMA_VERSION);
        let mode: String = again
            .conn
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
        let sync: i64 = again
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
            .conn
            .execute_batch(
                "UPDATE users SET used_us = used_us + 9223372036854775807 WHERE user_name = 'bob';
                 UPDATE users SET quota_us = 1e300, used_us = -4 WHERE user_name = 'alice';",
            )
            .unwrap();
        let kind: String = store
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
