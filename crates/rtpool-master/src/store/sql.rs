//! [`SqlStore`]: the [`Store`] written once in SQL, over any [`Dialect`]: the migrations
//! runner, transactions, and every query. The backend files hold only their connection, their
//! schema text and what is theirs alone (SQLite's repair of old rows, PostgreSQL's test schemas).

use rtpool_proto::Role;

use super::dialect::{Dialect, Value};
use super::{
    check_id_prefix, check_user, from_db_int, new_token, now_unix, one_match, quota_to_us,
    role_from_db, to_db_int, token_hash, token_id, usage_to_db, Store, StoreError, TokenInfo,
    UserQuota, SCHEMA_VERSION, WATERMARK_KEY,
};

/// The columns [`token_from_row`] reads, in its order.
const TOKEN_COLUMNS: &str = "id, user_name, role, created_unix, revoked";

/// A store in a SQL database reached through `D`.
#[derive(Debug)]
pub struct SqlStore<D> {
    /// The backend's connection.
    pub(super) db: D,
}

impl<D: Dialect> SqlStore<D> {
    /// Sets one column of a user's row (`quota_us`, `max_priority`: a name from this file,
    /// never from input), creating the row if the user has none.
    fn set_user_column(
        &mut self,
        user: &str,
        column: &str,
        value: Value,
    ) -> Result<(), StoreError> {
        self.db.execute(
            &format!(
                "INSERT INTO users (user_name, {column}) VALUES ($1, $2)
                 ON CONFLICT (user_name) DO UPDATE SET {column} = excluded.{column}"
            ),
            &[user.into(), value],
        )?;
        Ok(())
    }

    /// Wrap `db` and bring its schema up to date.
    ///
    /// # Errors
    /// [`StoreError::SchemaTooNew`] when a newer rtpool wrote the schema, or a database error.
    pub(super) fn migrated(db: D) -> Result<Self, StoreError> {
        let mut store = Self { db };
        store.migrate()?;
        Ok(store)
    }

    /// Run `f` in one write transaction: committed when it returns `Ok`, rolled back otherwise.
    fn transaction<T>(
        &mut self,
        f: impl FnOnce(&mut D) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.db.batch(D::BEGIN)?;
        let done = f(&mut self.db).and_then(|value| self.db.batch("COMMIT").map(|()| value));
        if done.is_err() {
            // Best effort: the first error is the one to report.
            let _ = self.db.batch("ROLLBACK");
        }
        done
    }

    fn migrate(&mut self) -> Result<(), StoreError> {
        self.transaction(|db| {
            db.lock_migrations()?;
            db.batch(&format!(
                "CREATE TABLE IF NOT EXISTS schema_version (version {} NOT NULL)",
                D::BIGINT
            ))?;
            let rows = db.query("SELECT COALESCE(MAX(version), 0) FROM schema_version", &[])?;
            let current = first(rows).int("schema version")?;
            if current > SCHEMA_VERSION {
                return Err(StoreError::SchemaTooNew {
                    found: current,
                    supported: SCHEMA_VERSION,
                });
            }
            for (version, sql) in D::MIGRATIONS.iter().filter(|(v, _)| *v > current) {
                db.batch(sql)?;
                db.execute(
                    "INSERT INTO schema_version (version) VALUES ($1)",
                    &[Value::Int(*version)],
                )?;
            }
            Ok(())
        })
    }

    fn token_by_id(&mut self, id: &str) -> Result<TokenInfo, StoreError> {
        let sql = format!("SELECT {TOKEN_COLUMNS} FROM tokens WHERE id = $1");
        token_from_row(self.db.query(&sql, &[id.into()])?.into_iter().next())
    }
}

/// The first column of the first row (`NULL` when there is none).
fn first(rows: Vec<Vec<Value>>) -> Value {
    rows.into_iter()
        .next()
        .and_then(|row| row.into_iter().next())
        .unwrap_or(Value::Null)
}

/// A `tokens` row read as [`TOKEN_COLUMNS`]; `None` (no row) is corrupt too: the caller
/// selected an id it had just seen.
fn token_from_row(row: Option<Vec<Value>>) -> Result<TokenInfo, StoreError> {
    let mut cols = row.unwrap_or_default().into_iter();
    let mut next = || cols.next().unwrap_or(Value::Null);
    Ok(TokenInfo {
        id: next().into_text("token id")?,
        user: next().into_text("user name")?,
        role: role_from_db(&next().into_text("role")?)?,
        created_unix: next().int("created_unix")?,
        revoked: next().flag("revoked")?,
    })
}

impl<D: Dialect> Store for SqlStore<D> {
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
        self.transaction(|db| {
            db.execute(
                "INSERT INTO tokens (hash, id, user_name, role, created_unix, revoked)
                 VALUES ($1, $2, $3, $4, $5, FALSE)",
                &[
                    hash.as_str().into(),
                    info.id.as_str().into(),
                    user.into(),
                    role.as_str().into(),
                    info.created_unix.into(),
                ],
            )?;
            db.execute(
                "INSERT INTO users (user_name) VALUES ($1) ON CONFLICT (user_name) DO NOTHING",
                &[user.into()],
            )?;
            if quota_seconds.is_some() {
                db.execute(
                    "UPDATE users SET quota_us = $2 WHERE user_name = $1",
                    &[user.into(), quota_us.into()],
                )?;
            }
            Ok(())
        })?;
        Ok((token, info))
    }

    fn list_tokens(&mut self) -> Result<Vec<TokenInfo>, StoreError> {
        let sql = format!(
            "SELECT {TOKEN_COLUMNS} FROM tokens ORDER BY created_unix, {}",
            D::INSERTION_ORDER
        );
        let rows = self.db.query(&sql, &[])?;
        rows.into_iter().map(|r| token_from_row(Some(r))).collect()
    }

    fn revoke(&mut self, id: &str) -> Result<TokenInfo, StoreError> {
        let prefix = check_id_prefix(id)?;
        let matches = self
            .db
            .query(
                "SELECT id FROM tokens WHERE id LIKE $1 || '%' ORDER BY id",
                &[prefix.as_str().into()],
            )?
            .into_iter()
            .map(|row| first(vec![row]).into_text("token id"))
            .collect::<Result<Vec<_>, _>>()?;
        let id = one_match(&prefix, matches)?;
        self.db.execute(
            "UPDATE tokens SET revoked = TRUE WHERE id = $1",
            &[id.as_str().into()],
        )?;
        self.token_by_id(&id)
    }

    fn verify(&mut self, token: &str) -> Result<Option<(String, Role)>, StoreError> {
        let row = self
            .db
            .query(
                "SELECT user_name, role FROM tokens WHERE hash = $1 AND NOT revoked",
                &[token_hash(token).as_str().into()],
            )?
            .into_iter()
            .next();
        row.map(|row| {
            let mut cols = row.into_iter();
            let user = cols.next().unwrap_or(Value::Null).into_text("user name")?;
            let role = cols.next().unwrap_or(Value::Null).into_text("role")?;
            Ok((user, role_from_db(&role)?))
        })
        .transpose()
    }

    fn set_quota(&mut self, user: &str, quota_seconds: Option<f64>) -> Result<(), StoreError> {
        check_user(user)?;
        let quota_us = quota_to_us(quota_seconds)?;
        self.set_user_column(user, "quota_us", quota_us.into())
    }

    fn quotas(&mut self) -> Result<Vec<UserQuota>, StoreError> {
        let rows = self.db.query(
            "SELECT user_name, quota_us, used_us, max_priority FROM users ORDER BY user_name",
            &[],
        )?;
        rows.into_iter()
            .map(|row| {
                let mut cols = row.into_iter();
                let mut next = || cols.next().unwrap_or(Value::Null);
                Ok(UserQuota {
                    user: next().into_text("user name")?,
                    quota_us: next().lenient_int().map(|q| from_db_int("quota_us", q)),
                    used_us: from_db_int("used_us", next().lenient_int().unwrap_or(0)),
                    max_priority: next()
                        .lenient_int()
                        .map(|p| p.clamp(i32::MIN.into(), i32::MAX.into()) as i32),
                })
            })
            .collect()
    }

    fn add_usage(&mut self, usage: &[(String, u64)], watermark: u64) -> Result<(), StoreError> {
        let watermark = to_db_int("watermark", watermark)?;
        self.transaction(|db| {
            for (user, delta_us) in usage {
                db.execute(
                    "INSERT INTO users (user_name, used_us) VALUES ($1, $2)
                     ON CONFLICT (user_name) DO UPDATE SET used_us = CASE
                         WHEN users.used_us > 9223372036854775807 - excluded.used_us
                         THEN 9223372036854775807 ELSE users.used_us + excluded.used_us END",
                    &[user.as_str().into(), usage_to_db(*delta_us).into()],
                )?;
            }
            db.execute(
                "INSERT INTO meta (key, value) VALUES ($1, $2)
                 ON CONFLICT (key) DO UPDATE SET value = CASE
                     WHEN excluded.value > meta.value THEN excluded.value ELSE meta.value END",
                &[WATERMARK_KEY.into(), watermark.into()],
            )?;
            Ok(())
        })
    }

    fn watermark(&mut self) -> Result<u64, StoreError> {
        let rows = self.db.query(
            "SELECT value FROM meta WHERE key = $1",
            &[WATERMARK_KEY.into()],
        )?;
        let value = match first(rows) {
            Value::Null => 0,
            value => value.int("watermark")?,
        };
        Ok(from_db_int("watermark", value))
    }

    fn set_max_priority(
        &mut self,
        user: &str,
        max_priority: Option<i32>,
    ) -> Result<(), StoreError> {
        check_user(user)?;
        self.set_user_column(user, "max_priority", max_priority.into())
    }

    fn revoked_ids(&mut self) -> Result<Vec<String>, StoreError> {
        let rows = self.db.query("SELECT id FROM tokens WHERE revoked", &[])?;
        rows.into_iter()
            .map(|row| first(vec![row]).into_text("token id"))
            .collect()
    }
}
