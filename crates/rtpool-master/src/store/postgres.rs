//! [`PgStore`]: the store in a PostgreSQL database, for operators who run one anyway or several
//! masters that share users.
//!
//! The client is the synchronous `postgres` crate (tokio-postgres on a private runtime), without
//! TLS: reach the database over loopback, a Unix socket or a trusted network. Being
//! synchronous, it must not be called on a tokio runtime thread; the master calls it from
//! `spawn_blocking`.

use std::collections::HashMap;
use std::error::Error;

use ::postgres::types::{to_sql_checked, FromSql, IsNull, ToSql, Type};
use ::postgres::{Client, NoTls, Statement};
use bytes::BytesMut;

use super::dialect::{Dialect, Value};
use super::sql::SqlStore;
use super::{redact_url, StoreError};

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
pub type PgStore = SqlStore<Postgres>;

/// A PostgreSQL connection, the [`Dialect`] of [`PgStore`].
pub struct Postgres {
    pub(super) client: Client,
    /// Statements prepared on this connection, by their text: the master adds usage about once
    /// a second, one statement a user, and a round trip to prepare each would double that.
    prepared: HashMap<String, Statement>,
}

impl std::fmt::Debug for Postgres {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Postgres").finish_non_exhaustive()
    }
}

impl SqlStore<Postgres> {
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
        Self::migrated(Postgres {
            client,
            prepared: HashMap::new(),
        })
    }

    /// Drop `schema` and everything in it (tests clean up with it).
    #[cfg(test)]
    pub(crate) fn drop_schema(&mut self, schema: &str) -> Result<(), StoreError> {
        self.db
            .client
            .batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))?;
        Ok(())
    }

    /// Every text value in the store's tables, for the test that no raw token is stored.
    #[cfg(test)]
    pub(crate) fn dump_text(&mut self) -> Result<Vec<u8>, StoreError> {
        let mut out = Vec::new();
        for table in ["tokens", "users", "meta", "schema_version"] {
            for row in self
                .db
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

impl Postgres {
    fn prepared(&mut self, sql: &str) -> Result<Statement, StoreError> {
        if let Some(stmt) = self.prepared.get(sql) {
            return Ok(stmt.clone());
        }
        let stmt = self.client.prepare(sql)?;
        self.prepared.insert(sql.to_owned(), stmt.clone());
        Ok(stmt)
    }
}

fn as_params(params: &[Value]) -> Vec<&(dyn ToSql + Sync)> {
    params.iter().map(|p| p as &(dyn ToSql + Sync)).collect()
}

impl Dialect for Postgres {
    const BEGIN: &'static str = "BEGIN";
    const BIGINT: &'static str = "BIGINT";
    const INSERTION_ORDER: &'static str = "id";
    const MIGRATIONS: &'static [(i64, &'static str)] = MIGRATIONS;

    fn batch(&mut self, sql: &str) -> Result<(), StoreError> {
        Ok(self.client.batch_execute(sql)?)
    }

    fn execute(&mut self, sql: &str, params: &[Value]) -> Result<u64, StoreError> {
        let stmt = self.prepared(sql)?;
        Ok(self.client.execute(&stmt, &as_params(params))?)
    }

    fn query(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Vec<Value>>, StoreError> {
        let stmt = self.prepared(sql)?;
        let rows = self.client.query(&stmt, &as_params(params))?;
        rows.iter()
            .map(|row| {
                (0..row.len())
                    .map(|i| Ok(row.try_get::<_, Value>(i)?))
                    .collect()
            })
            .collect()
    }

    fn lock_migrations(&mut self) -> Result<(), StoreError> {
        self.client
            .execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])?;
        Ok(())
    }
}

type BoxError = Box<dyn Error + Sync + Send>;

/// A parameter takes the type PostgreSQL inferred for its place: an integer bound where an
/// `INTEGER` column stands is sent as 32 bits (and refused when it does not fit).
impl ToSql for Value {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, BoxError> {
        match self {
            Value::Null => Ok(IsNull::Yes),
            Value::Int(i) if *ty == Type::INT4 => i32::try_from(*i)?.to_sql(ty, out),
            Value::Int(i) => i.to_sql(ty, out),
            Value::Real(f) => f.to_sql(ty, out),
            Value::Text(s) => s.to_sql(ty, out),
            Value::Bool(b) => b.to_sql(ty, out),
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    to_sql_checked!();
}

/// A column read by its type: the integers, booleans and floats the schema uses, else text.
impl<'a> FromSql<'a> for Value {
    fn from_sql(ty: &Type, raw: &'a [u8]) -> Result<Self, BoxError> {
        Ok(match *ty {
            Type::INT8 => Value::Int(i64::from_sql(ty, raw)?),
            Type::INT4 => Value::Int(i32::from_sql(ty, raw)?.into()),
            Type::INT2 => Value::Int(i16::from_sql(ty, raw)?.into()),
            Type::BOOL => Value::Bool(bool::from_sql(ty, raw)?),
            Type::FLOAT8 => Value::Real(f64::from_sql(ty, raw)?),
            _ => Value::Text(String::from_sql(ty, raw)?),
        })
    }

    fn from_sql_null(_: &Type) -> Result<Self, BoxError> {
        Ok(Value::Null)
    }

    fn accepts(_: &Type) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::tests::{check_ambiguous, check_store, raw_token_absent_from, sibling_id};
    use crate::store::{Store, SCHEMA_VERSION};
    use rtpool_proto::Role;

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
            .db
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
            .db
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
