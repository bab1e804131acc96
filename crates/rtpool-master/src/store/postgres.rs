//! [`PgStore`]: the store in a PostgreSQL database, for operators who run one anyway or several
//! masters that share users.
//!
//! The client is the synchronous `postgres` crate (tokio-postgres on a private runtime), without
//! TLS: reach the database over loopback, a Unix socket or a trusted network. Being
//! synchronous, it must not be called on a tokio runtime thread; the master calls it from
//! `spawn_blocking`.

use ::postgres::{Client, NoTls, Row};
use rtpool_proto::Role;

use super::{
    check_id_prefix, check_user, from_db_int, new_token, now_unix, one_match, quota_to_us,
    redact_url, role_from_db, to_db_int, token_hash, token_id, usage_to_db, Store, StoreError,
    TokenInfo, UserQuota, SCHEMA_VERSION, WATERMARK_KEY,
};

/// Schema migrations: `(version, SQL)`, applied in order, each once, under an advisory lock so
/// two masters starting together do not race. Statements are idempotent too.
const MIGRATIONS: &[(i64, &str)] = &[
    (
        1,
        "CREATE TABLE IF NOT EXISTS tokens (
        hash TEXT PRIMARY KEY,
        id TEXT NOT NULL UNIQUE,
        user_name TEXT NOT NULL,
        role TEXT NOT NULL,
        created_unix BIGINT NOT NULL,
        revoked BOOLEAN NOT NULL DEFAULT FALSE
    );
    CREATE TABLE IF NOT EXISTS users (
        user_name TEXT PRIMARY KEY,
        quota_us BIGINT,
        used_us BIGINT NOT NULL DEFAULT 0
    );
    CREATE TABLE IF NOT EXISTS meta (
        key TEXT PRIMARY KEY,
        value BIGINT NOT NULL
    );",
    ),
    // Per-user priority ceiling (NULL: none).
    (
        2,
        "ALTER TABLE users ADD COLUMN IF NOT EXISTS max_priority INTEGER;",
    ),
];

/// Arbitrary constant naming rtpool's migration lock (`pg_advisory_xact_lock`).
const MIGRATION_LOCK: i64 = 0x7274_706f_6f6c;

/// A store in a PostgreSQL database.
pub struct PgStore {
    client: Client,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore").finish_non_exhaustive()
    }
}

impl PgStore {
    /// Connect to `url` (`postgres://user[:password]@host:port/db`) and bring the schema up to
    /// date.
    ///
    /// # Errors
    /// [`StoreError::ConnectPostgres`] when the server cannot be reached or refuses the login,
    /// [`StoreError::SchemaTooNew`] when a newer rtpool wrote the schema.
    pub fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_in_schema(url, None)
    }

    /// Like [`PgStore::connect`], with the tables in `schema` (created if missing) instead of
    /// the user's default search path. Tests use it to get a fresh, private set of tables.
    pub(crate) fn connect_in_schema(url: &str, schema: Option<&str>) -> Result<Self, StoreError> {
        let connect_err = |source| StoreError::ConnectPostgres {
            url: redact_url(url),
            source,
        };
        let mut client = Client::connect(url, NoTls).map_err(connect_err)?;
        if let Some(schema) = schema {
            debug_assert!(schema
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_'));
            client
                .batch_execute(&format!(
                    "CREATE SCHEMA IF NOT EXISTS {schema}; SET search_path TO {schema}"
                ))
                .map_err(connect_err)?;
        }
        let mut store = Self { client };
        store.migrate()?;
        Ok(store)
    }

    fn migrate(&mut self) -> Result<(), StoreError> {
        let mut tx = self.client.transaction()?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])?;
        tx.batch_execute("CREATE TABLE IF NOT EXISTS schema_version (version BIGINT NOT NULL)")?;
        let current: i64 = tx
            .query_one("SELECT COALESCE(MAX(version), 0) FROM schema_version", &[])?
            .get(0);
        if current > SCHEMA_VERSION {
            return Err(StoreError::SchemaTooNew {
                found: current,
                supported: SCHEMA_VERSION,
            });
        }
        for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > current) {
            tx.batch_execute(sql)?;
            tx.execute(
                "INSERT INTO schema_version (version) VALUES ($1)",
                &[version],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    fn token_by_id(&mut self, id: &str) -> Result<TokenInfo, StoreError> {
        let row = self.client.query_one(
            "SELECT id, user_name, role, created_unix, revoked FROM tokens WHERE id = $1",
            &[&id],
        )?;
        token_from_row(&row)
    }

    /// Drop `schema` and everything in it (tests clean up with it).
    #[cfg(test)]
    pub(crate) fn drop_schema(&mut self, schema: &str) -> Result<(), StoreError> {
        self.client
            .batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))?;
        Ok(())
    }

    /// Every text value in the store's tables, for the test that no raw token is stored.
    #[cfg(test)]
    pub(crate) fn dump_text(&mut self) -> Result<Vec<u8>, StoreError> {
        let mut out = Vec::new();
        for table in ["tokens", "users", "meta", "schema_version"] {
            for row in self
                .client
                .query(&format!("SELECT t::text FROM {table} t"), &[])?
            {
                out.extend_from_slice(row.get::<_, String>(0).as_bytes());
                out.push(b'\n');
            }
        }
        Ok(out)
    }
}

fn token_from_row(row: &Row) -> Result<TokenInfo, StoreError> {
    Ok(TokenInfo {
        id: row.try_get(0)?,
        user: row.try_get(1)?,
        role: role_from_db(row.try_get(2)?)?,
        created_unix: row.try_get(3)?,
        revoked: row.try_get(4)?,
    })
}

impl Store for PgStore {
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
        let mut tx = self.client.transaction()?;
        tx.execute(
            "INSERT INTO tokens (hash, id, user_name, role, created_unix, revoked)
             VALUES ($1, $2, $3, $4, $5, FALSE)",
            &[&hash, &info.id, &user, &role.as_str(), &info.created_unix],
        )?;
        tx.execute(
            "INSERT INTO users (user_name) VALUES ($1) ON CONFLICT (user_name) DO NOTHING",
            &[&user],
        )?;
        if quota_seconds.is_some() {
            tx.execute(
                "UPDATE users SET quota_us = $2 WHERE user_name = $1",
                &[&user, &quota_us],
            )?;
        }
        tx.commit()?;
        Ok((token, info))
    }

    fn list_tokens(&mut self) -> Result<Vec<TokenInfo>, StoreError> {
        self.client
            .query(
                "SELECT id, user_name, role, created_unix, revoked FROM tokens
                 ORDER BY created_unix, id",
                &[],
            )?
            .iter()
            .map(token_from_row)
            .collect()
    }

    fn revoke(&mut self, id: &str) -> Result<TokenInfo, StoreError> {
        let prefix = check_id_prefix(id)?;
        let matches = self
            .client
            .query(
                "SELECT id FROM tokens WHERE id LIKE $1 || '%' ORDER BY id",
                &[&prefix],
            )?
            .iter()
            .map(|r| r.try_get(0))
            .collect::<Result<Vec<String>, _>>()?;
        let id = one_match(&prefix, matches)?;
        self.client
            .execute("UPDATE tokens SET revoked = TRUE WHERE id = $1", &[&id])?;
        self.token_by_id(&id)
    }

    fn verify(&mut self, token: &str) -> Result<Option<(String, Role)>, StoreError> {
        let row = self.client.query_opt(
            "SELECT user_name, role FROM tokens WHERE hash = $1 AND NOT revoked",
            &[&token_hash(token)],
        )?;
        row.map(|r| Ok((r.try_get(0)?, role_from_db(r.try_get(1)?)?)))
            .transpose()
    }

    fn set_quota(&mut self, user: &str, quota_seconds: Option<f64>) -> Result<(), StoreError> {
        check_user(user)?;
        let quota_us = quota_to_us(quota_seconds)?;
        self.client.execute(
            "INSERT INTO users (user_name, quota_us) VALUES ($1, $2)
             ON CONFLICT (user_name) DO UPDATE SET quota_us = EXCLUDED.quota_us",
            &[&user, &quota_us],
        )?;
        Ok(())
    }

    fn quotas(&mut self) -> Result<Vec<UserQuota>, StoreError> {
        self.client
            .query(
                "SELECT user_name, quota_us, used_us, max_priority FROM users ORDER BY user_name",
                &[],
            )?
            .iter()
            .map(|r| {
                let quota_us: Option<i64> = r.try_get(1)?;
                Ok(UserQuota {
                    user: r.try_get(0)?,
                    quota_us: quota_us.map(|q| from_db_int("quota_us", q)),
                    used_us: from_db_int("used_us", r.try_get(2)?),
                    max_priority: r.try_get(3)?,
                })
            })
            .collect()
    }

    fn add_usage(&mut self, usage: &[(String, u64)], watermark: u64) -> Result<(), StoreError> {
        let watermark = to_db_int("watermark", watermark)?;
        let mut tx = self.client.transaction()?;
        let add = tx.prepare(
            "INSERT INTO users (user_name, used_us) VALUES ($1, $2)
             ON CONFLICT (user_name) DO UPDATE SET used_us = CASE
                 WHEN users.used_us > 9223372036854775807 - EXCLUDED.used_us
                 THEN 9223372036854775807 ELSE users.used_us + EXCLUDED.used_us END",
        )?;
        for (user, delta_us) in usage {
            tx.execute(&add, &[user, &usage_to_db(*delta_us)])?;
        }
        tx.execute(
            "INSERT INTO meta (key, value) VALUES ($1, $2)
             ON CONFLICT (key) DO UPDATE SET value = GREATEST(meta.value, EXCLUDED.value)",
            &[&WATERMARK_KEY, &watermark],
        )?;
        tx.commit()?;
        Ok(())
    }

    fn watermark(&mut self) -> Result<u64, StoreError> {
        let value: Option<i64> = self
            .client
            .query_opt("SELECT value FROM meta WHERE key = $1", &[&WATERMARK_KEY])?
            .map(|r| r.try_get(0))
            .transpose()?;
        Ok(from_db_int("watermark", value.unwrap_or(0)))
    }

    fn set_max_priority(
        &mut self,
        user: &str,
        max_priority: Option<i32>,
    ) -> Result<(), StoreError> {
        check_user(user)?;
        self.client.execute(
            "INSERT INTO users (user_name, max_priority) VALUES ($1, $2)
             ON CONFLICT (user_name) DO UPDATE SET max_priority = EXCLUDED.max_priority",
            &[&user, &max_priority],
        )?;
        Ok(())
    }

    fn revoked_ids(&mut self) -> Result<Vec<String>, StoreError> {
        self.client
            .query("SELECT id FROM tokens WHERE revoked", &[])?
            .iter()
            .map(|r| Ok(r.try_get(0)?))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::tests::{check_ambiguous, check_store, raw_token_absent_from, sibling_id};

    /// The test server's URL, or `None` (with a loud note) when `make test` did not start one.
    fn pg_url() -> Option<String> {
        match std::env::var("RTPOOL_TEST_PG_URL") {
            Ok(url) if !url.is_empty() => Some(url),
            _ => {
                eprintln!(
                    "\n*** NOTE: RTPOOL_TEST_PG_URL is not set: the PostgreSQL store tests did \
                     NOT run. `make test` starts a server (scripts/pg-test-server) and sets it. ***\n"
                );
                None
            }
        }
    }

    /// A store in a fresh schema, dropped again by the caller.
    fn fresh(url: &str) -> (PgStore, String) {
        let mut raw = [0u8; 6];
        getrandom::getrandom(&mut raw).unwrap();
        let schema = format!("rtpool_test_{}", hex::encode(raw));
        (
            PgStore::connect_in_schema(url, Some(&schema)).unwrap(),
            schema,
        )
    }

    #[test]
    fn postgres_store_passes_the_shared_suite() {
        let Some(url) = pg_url() else { return };
        let (mut store, schema) = fresh(&url);
        let tokens = check_store(&mut store);
        let id = store.list_tokens().unwrap()[0].id.clone();
        store
            .client
            .execute(
                "INSERT INTO tokens VALUES ('planted', $1, 'mallory', 'client', 0, FALSE)",
                &[&sibling_id(&id)],
            )
            .unwrap();
        check_ambiguous(&mut store, &id);
        raw_token_absent_from(&store.dump_text().unwrap(), &tokens);
        store.drop_schema(&schema).unwrap();
    }

    #[test]
    fn migrations_are_idempotent() {
        let Some(url) = pg_url() else { return };
        let (mut store, schema) = fresh(&url);
        let (token, _) = store.create_token("bob", Role::Worker, None).unwrap();
        let mut again = PgStore::connect_in_schema(&url, Some(&schema)).unwrap();
        assert_eq!(
            again.verify(&token).unwrap(),
            Some(("bob".into(), Role::Worker))
        );
        let versions: i64 = again
            .client
            .query_one("SELECT COUNT(*) FROM schema_version", &[])
            .unwrap()
            .get(0);
        assert_eq!(versions, SCHEMA_VERSION);
        store.drop_schema(&schema).unwrap();
    }

    #[test]
    fn a_version_1_schema_is_migrated() {
        let Some(url) = pg_url() else { return };
        let mut raw = [0u8; 6];
        getrandom::getrandom(&mut raw).unwrap();
        let schema = format!("rtpool_test_{}", hex::encode(raw));
        let mut client = Client::connect(&url, NoTls).unwrap();
        client
            .batch_execute(&format!(
                "CREATE SCHEMA {schema}; SET search_path TO {schema}; {}
                 CREATE TABLE schema_version (version BIGINT NOT NULL);
                 INSERT INTO schema_version VALUES (1);
                 INSERT INTO users (user_name, quota_us, used_us) VALUES ('old', 7, 3);",
                MIGRATIONS[0].1
            ))
            .unwrap();
        let mut store = PgStore::connect_in_schema(&url, Some(&schema)).unwrap();
        store.set_max_priority("old", Some(2)).unwrap();
        let q = store.quotas().unwrap().pop().unwrap();
        assert_eq!(
            (q.quota_us, q.used_us, q.max_priority),
            (Some(7), 3, Some(2))
        );
        store
            .add_usage(&[("old".into(), u64::MAX), ("old".into(), u64::MAX)], 1)
            .unwrap();
        assert_eq!(store.quotas().unwrap()[0].used_us, i64::MAX as u64);
        store.drop_schema(&schema).unwrap();
    }

    #[test]
    fn unreachable_server_says_where_and_hides_the_password() {
        // Port 1 on loopback: nothing listens there.
        let err = PgStore::connect("postgres://u:secret@127.0.0.1:1/db").unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.starts_with("cannot connect to PostgreSQL at postgres://u:***@127.0.0.1:1/db"),
            "{msg}"
        );
        assert!(!msg.contains("secret"), "{msg}");
    }
}
