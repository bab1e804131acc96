//! Tokens: generated into the data dir on first start, compared in constant time.
//!
//! There are two secrets, one per role, so a leaked worker token cannot submit work and a client
//! token cannot pull other users' tasks. Each token carries a role prefix (`rtc_`, `rtw_`) so a
//! human can tell them apart; the comparison covers the whole string.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use rtpool_proto::Role;
use subtle::ConstantTimeEq;

use crate::error::MasterError;

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
}
