//! TLS to the master: a rustls connector that trusts the PEM certificates of a CA file (the
//! master's `--tls-self-signed` `cert.pem`, or the CA that signed its `--tls-cert`), built
//! with the same provider (ring) as the master's `tls.rs`.
//!
//! The system trust store is not read (no extra dependency for it): give the CA file.

use std::fs;
use std::io::BufReader;
use std::path::Path;
use std::sync::Arc;

use tokio_rustls::rustls::crypto::ring::default_provider;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tokio_rustls::rustls::{ClientConfig, RootCertStore};
use tokio_rustls::TlsConnector;

use crate::error::ClientError;

fn tls_err(what: impl std::fmt::Display) -> ClientError {
    ClientError::Config(format!("TLS setup failed: {what}"))
}

/// A connector trusting the certificates in `ca_file`.
///
/// # Errors
///
/// [`ClientError::Config`] when the file cannot be read or holds no PEM certificate.
pub(crate) fn connector(ca_file: &Path) -> Result<TlsConnector, ClientError> {
    let file = fs::File::open(ca_file).map_err(|e| {
        tls_err(format!(
            "cannot read the CA file {}: {e}",
            ca_file.display()
        ))
    })?;
    let certs: Vec<CertificateDer<'static>> = rustls_pemfile::certs(&mut BufReader::new(file))
        .collect::<Result<_, _>>()
        .map_err(|e| {
            tls_err(format!(
                "{} is not a PEM certificate: {e}",
                ca_file.display()
            ))
        })?;
    let mut roots = RootCertStore::empty();
    for cert in certs {
        roots
            .add(cert)
            .map_err(|e| tls_err(format!("{}: {e}", ca_file.display())))?;
    }
    if roots.is_empty() {
        return Err(tls_err(format!(
            "{} holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
            ca_file.display()
        )));
    }
    let config = ClientConfig::builder_with_provider(Arc::new(default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(tls_err)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(TlsConnector::from(Arc::new(config)))
}

/// The name to check the master's certificate against: `name`, else the host of `address`.
///
/// # Errors
///
/// [`ClientError::Config`] for a name that is neither a DNS name nor an IP address.
pub(crate) fn server_name(
    address: &str,
    name: Option<&str>,
) -> Result<ServerName<'static>, ClientError> {
    let host = name.unwrap_or_else(|| {
        let host = address.rsplit_once(':').map_or(address, |(h, _)| h);
        host.trim_start_matches('[').trim_end_matches(']')
    });
    ServerName::try_from(host.to_owned())
        .map_err(|e| tls_err(format!("{host:?} is not a server name for TLS: {e}")))
}
