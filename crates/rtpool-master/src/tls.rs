//! TLS for the master's listener: the [`TlsAcceptor`] built from a PEM certificate chain and
//! key, or from a self-signed pair generated on first start (`--tls-self-signed`).
//!
//! This module owns loading and generating the files; the handshake itself, its deadline and
//! telling a plain peer apart from a TLS one are the connection's ([`crate::connection`]).

use std::fs;
use std::io::{BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio_rustls::rustls::crypto::ring::default_provider;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::TlsAcceptor;

use crate::config::MasterConfig;
use crate::error::MasterError;

/// The master's TLS setup: what accepts the handshakes, and where the certificate is.
#[derive(Clone)]
pub struct Tls {
    /// Accepts TLS handshakes with the configured certificate.
    pub acceptor: TlsAcceptor,
    /// The certificate file (clients of a self-signed master use it as their CA file).
    pub cert_path: PathBuf,
    /// Whether the certificate was generated (`--tls-self-signed`) rather than given.
    pub self_signed: bool,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("cert_path", &self.cert_path)
            .field("self_signed", &self.self_signed)
            .finish_non_exhaustive()
    }
}

fn tls_err(what: impl std::fmt::Display) -> MasterError {
    MasterError::Runtime(format!("TLS setup failed: {what}"))
}

/// The TLS setup `config` asks for: `None` for plain TCP.
///
/// # Errors
/// When the options contradict each other, a file cannot be read or written, or the PEM files
/// hold no usable certificate or key.
pub fn from_config(config: &MasterConfig) -> Result<Option<Tls>, MasterError> {
    let (cert, key, self_signed) = match (&config.tls_cert, &config.tls_key) {
        (Some(_), _) | (_, Some(_)) if config.tls_self_signed => {
            return Err(tls_err(
                "--tls-self-signed generates its own certificate: drop --tls-cert/--tls-key",
            ))
        }
        (Some(cert), Some(key)) => (cert.clone(), key.clone(), false),
        (Some(_), None) | (None, Some(_)) => {
            return Err(tls_err("--tls-cert and --tls-key go together: give both"))
        }
        (None, None) if config.tls_self_signed => {
            let Some(dir) = &config.data_dir else {
                return Err(tls_err(
                    "--tls-self-signed writes its certificate to the data dir: give --data-dir",
                ));
            };
            let (cert, key) = self_signed_files(&dir.join("tls"), &config.listen)?;
            (cert, key, true)
        }
        (None, None) => return Ok(None),
    };
    let acceptor = acceptor_from_pem(&cert, &key)?;
    Ok(Some(Tls {
        acceptor,
        cert_path: cert,
        self_signed,
    }))
}

/// A TLS acceptor serving the certificate chain in `cert` with the private key in `key`.
///
/// # Errors
/// When a file cannot be read or holds no certificate (or no key) rustls accepts.
pub fn acceptor_from_pem(cert: &Path, key: &Path) -> Result<TlsAcceptor, MasterError> {
    let open = |path: &Path| {
        fs::File::open(path)
            .map(BufReader::new)
            .map_err(|e| tls_err(format!("cannot read {}: {e}", path.display())))
    };
    let certs: Vec<CertificateDer<'static>> = rustls_pemfile::certs(&mut open(cert)?)
        .collect::<Result<_, _>>()
        .map_err(|e| tls_err(format!("{} is not a PEM certificate: {e}", cert.display())))?;
    if certs.is_empty() {
        return Err(tls_err(format!(
            "{} holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
            cert.display()
        )));
    }
    let key_der: PrivateKeyDer<'static> = rustls_pemfile::private_key(&mut open(key)?)
        .map_err(|e| tls_err(format!("{} is not a PEM key: {e}", key.display())))?
        .ok_or_else(|| tls_err(format!("{} holds no PEM private key", key.display())))?;
    let config = ServerConfig::builder_with_provider(Arc::new(default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(tls_err)?
        .with_no_client_auth()
        .with_single_cert(certs, key_der)
        .map_err(|e| {
            tls_err(format!(
                "{} and {} do not make a usable certificate and key: {e}",
                cert.display(),
                key.display()
            ))
        })?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// `dir/cert.pem` and `dir/key.pem`, generated for localhost, 127.0.0.1, ::1 and the host of
/// `listen` unless both files already exist (a restarted master keeps its certificate, so
/// clients keep trusting it). The key is written with mode 0600.
///
/// # Errors
/// When the directory or the files cannot be written, or generation fails.
pub fn self_signed_files(dir: &Path, listen: &str) -> Result<(PathBuf, PathBuf), MasterError> {
    let cert_path = dir.join("cert.pem");
    let key_path = dir.join("key.pem");
    if cert_path.is_file() && key_path.is_file() {
        return Ok((cert_path, key_path));
    }
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| MasterError::DataDir { path, source }
    };
    fs::create_dir_all(dir).map_err(io_err(dir))?;
    let generated = rcgen::generate_simple_self_signed(subject_names(listen))
        .map_err(|e| tls_err(format!("cannot generate a self-signed certificate: {e}")))?;
    write_private(&key_path, generated.key_pair.serialize_pem().as_bytes())
        .map_err(io_err(&key_path))?;
    fs::write(&cert_path, generated.cert.pem()).map_err(io_err(&cert_path))?;
    Ok((cert_path, key_path))
}

/// The names a self-signed certificate is valid for.
fn subject_names(listen: &str) -> Vec<String> {
    let mut names: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
    let host = listen.rsplit_once(':').map_or(listen, |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    // A wildcard bind address is no name a client can connect to.
    let wildcard = matches!(host, "" | "0.0.0.0" | "::");
    if !wildcard && !names.iter().any(|n| n == host) {
        names.push(host.to_string());
    }
    names
}

/// Write `data` to a new file readable by its owner only (replacing any stale one).
fn write_private(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let _ = fs::remove_file(path);
    let mut options = fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(path)?;
    file.write_all(data)?;
    file.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subject_names_add_the_listen_host_but_not_wildcards() {
        assert_eq!(subject_names("127.0.0.1:0").len(), 3);
        assert_eq!(subject_names("0.0.0.0:7070").len(), 3);
        assert_eq!(subject_names("[::]:7070").len(), 3);
        assert_eq!(subject_names("[::1]:7070").len(), 3);
        assert_eq!(subject_names("10.1.2.3:7070")[3], "10.1.2.3");
        assert_eq!(subject_names("pool.example:7070")[3], "pool.example");
    }

    #[test]
    fn self_signed_files_are_generated_once_with_a_private_key() {
        let dir = std::env::temp_dir().join(format!("rtpool-tls-unit-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let (cert, key) = self_signed_files(&dir, "127.0.0.1:0").unwrap();
        let first = fs::read(&cert).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(&key).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        acceptor_from_pem(&cert, &key).unwrap();
        // A second start reuses the pair instead of invalidating what clients trust.
        let (cert2, _) = self_signed_files(&dir, "127.0.0.1:0").unwrap();
        assert_eq!(fs::read(cert2).unwrap(), first);
        let _ = fs::remove_dir_all(&dir);
    }
}
