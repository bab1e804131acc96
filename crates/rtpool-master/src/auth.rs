//! Tokens: the two built-in ones, generated into the data dir on first start and compared in
//! constant time, and per-user ones from the [store](crate::store), checked by hash.
//!
//! There are two built-in secrets, one per role, so a leaked worker token cannot submit work and
//! a client token cannot pull other users' tasks; they act for the user `default`, which has no
//! quota. Each token carries a role prefix (`rtc_`, `rtw_`) so a human can tell them apart; the
//! comparison covers the whole string. [`Authenticator`] checks a `HELLO` against both kinds
//! and names the user the connection acts for.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rtpool_proto::Role;
use subtle::ConstantTimeEq;
use tokio::sync::watch;

use crate::error::MasterError;
use crate::store::{role_prefix, token_id_of, Store, StoreError, UserQuota};

/// How often the store is read for revoked tokens and priority ceilings: a revoked token's
/// sessions are closed, and a new ceiling applies, within about this long.
pub const POLICY_POLL: Duration = Duration::from_secs(1);

/// The user that the built-in tokens act for.
pub const DEFAULT_USER: &str = "default";

/// The master's two secrets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tokens {
    /// Lets a peer connect as a client.
    pub client: String,
    /// Lets a peer connect as a worker.
    pub worker: String,
}

/// Why a `HELLO` was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthFailure {
    /// The token matches neither role.
    Invalid,
    /// The token is valid, but for the other role.
    WrongRole,
}

impl Tokens {
    /// Fresh random tokens.
    pub fn generate() -> Self {
        Self {
            client: new_token("rtc_"),
            worker: new_token("rtw_"),
        }
    }

    /// Check `token` for `role` in constant time (both comparisons always run).
    pub fn check(&self, role: Role, token: &str) -> Result<(), AuthFailure> {
        let is_client = ct_eq(&self.client, token);
        let is_worker = ct_eq(&self.worker, token);
        match (role, is_client, is_worker) {
            (Role::Client, true, _) | (Role::Worker, _, true) => Ok(()),
            (_, false, false) => Err(AuthFailure::Invalid),
            _ => Err(AuthFailure::WrongRole),
        }
    }

    /// Read the tokens from `dir`, creating the dir and any missing token file. Returns the
    /// tokens and whether any was newly generated (the master prints them then).
    ///
    /// # Errors
    /// [`MasterError::DataDir`] when the dir or a file cannot be read or written,
    /// [`MasterError::BadTokenFile`] when a file holds no usable token.
    pub fn load_or_create(dir: &Path) -> Result<(Self, bool), MasterError> {
        fs::create_dir_all(dir).map_err(|source| MasterError::DataDir {
            path: dir.to_path_buf(),
            source,
        })?;
        let (client, new_c) = load_or_create_one(&dir.join("client.token"), "rtc_")?;
        let (worker, new_w) = load_or_create_one(&dir.join("worker.token"), "rtw_")?;
        Ok((Self { client, worker }, new_c || new_w))
    }
}

/// Why a `HELLO` token was refused; the message is what the peer reads in `ERROR auth`.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// The token is neither built-in nor a valid (unrevoked) store token.
    #[error("invalid {role} token (unknown or revoked); use the {role} token printed by `rtpool master` on first start (also in <data-dir>/{role}.token) or one from `rtpool token create --role {role}`", role = .role.as_str())]
    Invalid {
        /// The role the peer asked for.
        role: Role,
    },
    /// The token is valid, but for the other role.
    #[error("this is a {other} token, which cannot connect as a {role}; use a {role} token (<data-dir>/{role}.token, or `rtpool token create --role {role}`)", role = .role.as_str(), other = .role.other().as_str())]
    WrongRole {
        /// The role the peer asked for.
        role: Role,
    },
    /// The store could not be asked; the token may be fine.
    #[error("the master cannot check the token now: {0}")]
    Store(#[from] StoreError),
    /// The lookup task died (the master is shutting down).
    #[error("the master cannot check the token now: {0}")]
    Lookup(String),
}

trait OtherRole {
    fn other(self) -> Role;
}

impl OtherRole for Role {
    fn other(self) -> Role {
        match self {
            Role::Client => Role::Worker,
            Role::Worker => Role::Client,
        }
    }
}

/// Who a connection acts for, as its `HELLO` token says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The user: [`DEFAULT_USER`] for a built-in token.
    pub user: String,
    /// The store token's public id (`rtpool token list`); `None` for a built-in token, which
    /// cannot be revoked.
    pub token_id: Option<String>,
}

/// What the store says about users and tokens now, refreshed every [`POLICY_POLL`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    /// Ids of revoked tokens: sessions opened with one are closed.
    pub revoked: HashSet<String>,
    /// Priority ceiling by user; users without one are absent.
    pub max_priority: HashMap<String, i32>,
}

impl Policy {
    /// Whether a session of `identity` must be closed.
    pub fn is_revoked(&self, identity: &Identity) -> bool {
        identity
            .token_id
            .as_ref()
            .is_some_and(|id| self.revoked.contains(id))
    }
}

/// Checks `HELLO` tokens: the built-in ones, then the store's. Cheap to clone (one `Arc`).
#[derive(Clone)]
pub struct Authenticator {
    inner: Arc<AuthInner>,
}

struct AuthInner {
    builtin: Tokens,
    /// Behind a std mutex: every call blocks and runs on a blocking thread, never on the
    /// master's runtime thread; handshakes and usage write-behind are rare enough to share it.
    store: Option<Mutex<Box<dyn Store>>>,
    /// The last [`Policy`] read from the store; connections watch it.
    policy: watch::Sender<Arc<Policy>>,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticator")
            .field("has_store", &self.inner.store.is_some())
            .finish_non_exhaustive()
    }
}

impl Authenticator {
    /// Accept the `builtin` tokens, and when `store` is given, the store's tokens too.
    pub fn new(builtin: Tokens, store: Option<Box<dyn Store>>) -> Self {
        let this = Self {
            inner: Arc::new(AuthInner {
                builtin,
                store: store.map(Mutex::new),
                policy: watch::Sender::new(Arc::new(Policy::default())),
            }),
        };
        // Blocking, once: the first connections already see the ceilings.
        this.refresh_policy();
        this
    }

    /// The current [`Policy`], updated every [`POLICY_POLL`] by [`Authenticator::poll_policy`].
    pub fn policy(&self) -> watch::Receiver<Arc<Policy>> {
        self.inner.policy.subscribe()
    }

    /// Read the policy from the store (blocking) and publish it when it changed. A store that
    /// cannot be read keeps the last policy, with a warning.
    fn refresh_policy(&self) {
        let read = self.with_store(None, |s| {
            let revoked = s.revoked_ids()?.into_iter().collect();
            let max_priority = s
                .quotas()?
                .into_iter()
                .filter_map(|q| Some((q.user, q.max_priority?)))
                .collect();
            Ok(Some(Policy {
                revoked,
                max_priority,
            }))
        });
        match read {
            Ok(Some(policy)) => {
                self.inner.policy.send_if_modified(|old| {
                    let changed = **old != policy;
                    if changed {
                        tracing::info!(
                            revoked = policy.revoked.len(),
                            ceilings = policy.max_priority.len(),
                            "token policy updated from the store"
                        );
                        *old = Arc::new(policy);
                    }
                    changed
                });
            }
            Ok(None) => {}
            Err(e) => tracing::warn!("cannot read revoked tokens and priority ceilings: {e}"),
        }
    }

    /// Re-read the policy every [`POLICY_POLL`] (on a blocking thread) until the master stops;
    /// returns at once without a store.
    pub async fn poll_policy(self) {
        if !self.has_store() {
            return;
        }
        let mut tick = tokio::time::interval(POLICY_POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let this = self.clone();
            if tokio::task::spawn_blocking(move || this.refresh_policy())
                .await
                .is_err()
            {
                return;
            }
        }
    }

    /// The built-in tokens.
    pub fn tokens(&self) -> &Tokens {
        &self.inner.builtin
    }

    /// Whether per-user tokens are checked too.
    pub fn has_store(&self) -> bool {
        self.inner.store.is_some()
    }

    /// Who `token` acts for when connecting as `role`: [`DEFAULT_USER`] for a built-in token,
    /// the token's user (and id) for a store token. The store is asked on a blocking thread.
    ///
    /// # Errors
    /// [`AuthError::Invalid`], [`AuthError::WrongRole`], or [`AuthError::Store`] when the store
    /// failed.
    pub async fn authenticate(&self, token: &str, role: Role) -> Result<Identity, AuthError> {
        match self.inner.builtin.check(role, token) {
            Ok(()) => {
                return Ok(Identity {
                    user: DEFAULT_USER.to_string(),
                    token_id: None,
                })
            }
            Err(AuthFailure::WrongRole) => return Err(AuthError::WrongRole { role }),
            Err(AuthFailure::Invalid) => {}
        }
        // Only strings shaped like a store token cost a lookup.
        let plausible = [Role::Client, Role::Worker]
            .iter()
            .any(|r| token.starts_with(role_prefix(*r)))
            && token.len() <= 128;
        if self.inner.store.is_none() || !plausible {
            return Err(AuthError::Invalid { role });
        }
        let this = self.clone();
        let owned = token.to_string();
        let found =
            tokio::task::spawn_blocking(move || this.with_store(None, |s| s.verify(&owned)))
                .await
                .map_err(|e| AuthError::Lookup(e.to_string()))??;
        match found {
            Some((user, r)) if r == role => Ok(Identity {
                user,
                token_id: Some(token_id_of(token)),
            }),
            Some(_) => Err(AuthError::WrongRole { role }),
            None => Err(AuthError::Invalid { role }),
        }
    }

    /// Every user's quota and usage (empty without a store). Blocks: call it at start-up or from
    /// a blocking thread.
    ///
    /// # Errors
    /// The store's error.
    pub fn quotas(&self) -> Result<Vec<UserQuota>, StoreError> {
        self.with_store(Vec::new(), |s| s.quotas())
    }

    /// [`Store::add_usage`] on the store (a no-op without one). Blocks: call it from a blocking
    /// thread.
    ///
    /// # Errors
    /// The store's error; then nothing was written.
    pub fn add_usage(&self, usage: &[(String, u64)], watermark: u64) -> Result<(), StoreError> {
        self.with_store((), |s| s.add_usage(usage, watermark))
    }

    /// [`Store::watermark`] (0 without a store). Blocks.
    ///
    /// # Errors
    /// The store's error.
    pub fn watermark(&self) -> Result<u64, StoreError> {
        self.with_store(0, |s| s.watermark())
    }

    /// Run `f` on the store, or return `absent` when there is none.
    fn with_store<T>(
        &self,
        absent: T,
        f: impl FnOnce(&mut dyn Store) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let Some(store) = &self.inner.store else {
            return Ok(absent);
        };
        // A panic while holding the lock leaves the database consistent (it has its own
        // transactions), so the store is still usable.
        let mut guard = store
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        f(guard.as_mut())
    }
}

fn ct_eq(a: &str, b: &str) -> bool {
    // `ct_eq` on slices of different lengths returns false without comparing bytes; the
    // length of a token is not secret (it is fixed by the format).
    bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

fn new_token(prefix: &str) -> String {
    let mut raw = [0u8; 24];
    getrandom::getrandom(&mut raw).expect("the OS random source failed");
    format!("{prefix}{}", hex::encode(raw))
}

fn load_or_create_one(path: &PathBuf, prefix: &str) -> Result<(String, bool), MasterError> {
    let io_err = |source| MasterError::DataDir {
        path: path.clone(),
        source,
    };
    match fs::read_to_string(path) {
        Ok(text) => {
            let token = text.trim().to_string();
            if token.len() < 16 || token.contains(char::is_whitespace) {
                return Err(MasterError::BadTokenFile { path: path.clone() });
            }
            Ok((token, false))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let token = new_token(prefix);
            write_private(path, &token).map_err(io_err)?;
            Ok((token, true))
        }
        Err(e) => Err(io_err(e)),
    }
}

fn write_private(path: &Path, token: &str) -> std::io::Result<()> {
    let mut opts = fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f = opts.open(path)?;
    writeln!(f, "{token}")?;
    f.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_are_separate() {
        let t = Tokens::generate();
        assert!(t.client.starts_with("rtc_") && t.worker.starts_with("rtw_"));
        assert_eq!(t.check(Role::Client, &t.client), Ok(()));
        assert_eq!(t.check(Role::Worker, &t.worker), Ok(()));
        assert_eq!(
            t.check(Role::Client, &t.worker),
            Err(AuthFailure::WrongRole)
        );
        assert_eq!(
            t.check(Role::Worker, &t.client),
            Err(AuthFailure::WrongRole)
        );
        assert_eq!(t.check(Role::Client, "nope"), Err(AuthFailure::Invalid));
        assert_eq!(t.check(Role::Client, ""), Err(AuthFailure::Invalid));
    }

    #[test]
    fn tokens_persist_in_the_data_dir() {
        let dir = std::env::temp_dir().join(format!("rtpool-auth-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let (first, created) = Tokens::load_or_create(&dir).unwrap();
        assert!(created);
        let (second, created_again) = Tokens::load_or_create(&dir).unwrap();
        assert!(!created_again);
        assert_eq!(first, second);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(dir.join("client.token"))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        fs::write(dir.join("worker.token"), "\n").unwrap();
        assert!(matches!(
            Tokens::load_or_create(&dir),
            Err(MasterError::BadTokenFile { .. })
        ));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn authenticator_is_shareable_across_tasks() {
        fn assert_shareable<T: Send + Sync + Clone + 'static>() {}
        assert_shareable::<Authenticator>();
    }

    #[tokio::test]
    async fn authenticator_accepts_builtin_and_store_tokens() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = crate::store::open(None, dir.path()).unwrap();
        let (alice, alice_info) = store.create_token("alice", Role::Client, None).unwrap();
        let (alice_w, _) = store.create_token("alice", Role::Worker, None).unwrap();
        let (bob, _) = store.create_token("bob", Role::Client, None).unwrap();
        store.revoke(&alice_info.id).unwrap();
        // A second handle, as `rtpool token` would have while the master runs.
        let mut cli = crate::store::open(None, dir.path()).unwrap();
        let builtin = Tokens::generate();
        let auth = Authenticator::new(builtin.clone(), Some(store));
        let ok = |r: Result<Identity, AuthError>| r.unwrap().user;
        assert_eq!(
            ok(auth.authenticate(&builtin.client, Role::Client).await),
            "default"
        );
        assert_eq!(
            ok(auth.authenticate(&builtin.worker, Role::Worker).await),
            "default"
        );
        assert_eq!(ok(auth.authenticate(&bob, Role::Client).await), "bob");
        assert_eq!(ok(auth.authenticate(&alice_w, Role::Worker).await), "alice");

        let err = auth.authenticate(&alice, Role::Client).await.unwrap_err();
        assert!(
            matches!(err, AuthError::Invalid { role: Role::Client }),
            "{err}"
        );
        assert!(err
            .to_string()
            .contains("invalid client token (unknown or revoked)"));
        let err = auth.authenticate(&alice_w, Role::Client).await.unwrap_err();
        assert_eq!(
            err.to_string(),
            "this is a worker token, which cannot connect as a client; use a client token \
             (<data-dir>/client.token, or `rtpool token create --role client`)"
        );
        let err = auth
            .authenticate(&builtin.client, Role::Worker)
            .await
            .unwrap_err();
        assert!(
            matches!(err, AuthError::WrongRole { role: Role::Worker }),
            "{err}"
        );
        let err = auth.authenticate("nope", Role::Worker).await.unwrap_err();
        assert!(
            matches!(err, AuthError::Invalid { role: Role::Worker }),
            "{err}"
        );

        // A token created after the authenticator opened the store works at once.
        let (carol, _) = cli.create_token("carol", Role::Client, Some(3.0)).unwrap();
        assert_eq!(ok(auth.authenticate(&carol, Role::Client).await), "carol");
        auth.add_usage(&[("carol".into(), 5)], 7).unwrap();
        assert_eq!(auth.watermark().unwrap(), 7);
        let carol_q = auth
            .quotas()
            .unwrap()
            .into_iter()
            .find(|q| q.user == "carol");
        assert_eq!(
            carol_q.map(|q| (q.quota_us, q.used_us)),
            Some((Some(3_000_000), 5))
        );

        // The policy: revoked ids and ceilings, as of the last read.
        let identity = auth.authenticate(&bob, Role::Client).await.unwrap();
        assert_eq!(identity.token_id, Some(crate::store::token_id_of(&bob)));
        let policy = auth.policy();
        assert!(policy.borrow().is_revoked(&Identity {
            user: "alice".into(),
            token_id: Some(alice_info.id.clone()),
        }));
        assert!(!policy.borrow().is_revoked(&identity));
        cli.revoke(identity.token_id.as_deref().unwrap()).unwrap();
        cli.set_max_priority("bob", Some(4)).unwrap();
        auth.refresh_policy();
        assert!(policy.borrow().is_revoked(&identity));
        assert_eq!(policy.borrow().max_priority.get("bob"), Some(&4));

        // Without a store only the built-in tokens pass.
        let bare = Authenticator::new(builtin.clone(), None);
        assert!(matches!(
            bare.authenticate(&bob, Role::Client).await,
            Err(AuthError::Invalid { .. })
        ));
        assert_eq!(bare.quotas().unwrap(), vec![]);
        assert_eq!(bare.watermark().unwrap(), 0);
    }
}
