//! [`Config`]: where the master is and how to reach it (addresses, token, TLS, reconnection),
//! each knob with a sane default, and the resolution of the token from an argument, the
//! `RTPOOL_TOKEN` environment variable or a file.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::ClientError;

/// How to connect to a master.
///
/// ```
/// use rtpool_client::Config;
/// let config = Config::new("h1:7070, h2:7070").unwrap().token("secret");
/// assert_eq!(config.addresses(), ["h1:7070", "h2:7070"]);
/// assert!(Config::new("").is_err());
/// ```
#[derive(Debug, Clone)]
pub struct Config {
    addresses: Vec<String>,
    token: Option<String>,
    token_file: Option<PathBuf>,
    /// Connect with TLS, trusting the certificates in this PEM file (the master's
    /// `--tls-self-signed` `cert.pem`, or a CA).
    pub(crate) ca_file: Option<PathBuf>,
    /// The TLS server name to check; default: the host of the address.
    pub(crate) server_name: Option<String>,
    /// How long one connection attempt may take (TCP, TLS and the handshake).
    pub(crate) connect_timeout: Duration,
    /// How long to keep trying to reconnect after losing the master before failing the
    /// pending calls with [`ClientError::ConnectionLost`].
    pub(crate) reconnect_timeout: Duration,
}

impl Config {
    /// A configuration for the masters at `addresses` (`"h1:7070,h2:7070"`; tried in order,
    /// each reconnection pass from the last good address; a standby's `not_leader` sends the
    /// dial to the leader it names). The token defaults to `$RTPOOL_TOKEN`.
    ///
    /// # Errors
    ///
    /// [`ClientError::Config`] for an empty list or an entry without `host:port`.
    pub fn new(addresses: &str) -> Result<Config, ClientError> {
        let list: Vec<String> = addresses
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .map(str::to_owned)
            .collect();
        if list.is_empty() {
            return Err(ClientError::Config(
                "no master address given; pass HOST:PORT (several separated by commas)".into(),
            ));
        }
        for a in &list {
            let port = a.rsplit_once(':').map(|(_, p)| p.parse::<u16>());
            if !matches!(port, Some(Ok(_))) {
                return Err(ClientError::Config(format!(
                    "master address {a:?} is not HOST:PORT (like 10.0.0.5:7070)"
                )));
            }
        }
        Ok(Config {
            addresses: list,
            token: None,
            token_file: None,
            ca_file: None,
            server_name: None,
            connect_timeout: Duration::from_secs(10),
            reconnect_timeout: Duration::from_secs(60),
        })
    }

    /// The master addresses, in order.
    pub fn addresses(&self) -> &[String] {
        &self.addresses
    }

    /// Uses this client token (else a [`token_file`](Config::token_file), else
    /// `$RTPOOL_TOKEN`).
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Reads the token from this file (its first line, trimmed).
    pub fn token_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.token_file = Some(path.into());
        self
    }

    /// Connects with TLS, trusting the PEM certificates in `path`.
    pub fn ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca_file = Some(path.into());
        self
    }

    /// The name the master's certificate must carry (default: the address's host).
    pub fn server_name(mut self, name: impl Into<String>) -> Self {
        self.server_name = Some(name.into());
        self
    }

    /// How long one connection attempt may take (default 10 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long to try reconnecting after losing the master (default 60 s).
    pub fn reconnect_timeout(mut self, timeout: Duration) -> Self {
        self.reconnect_timeout = timeout;
        self
    }

    /// The token: the one given, else the token file's, else `$RTPOOL_TOKEN`.
    ///
    /// # Errors
    ///
    /// [`ClientError::Config`] when none is set or the file cannot be read.
    pub fn resolve_token(&self) -> Result<String, ClientError> {
        if let Some(t) = &self.token {
            return Ok(t.clone());
        }
        if let Some(path) = &self.token_file {
            let text = std::fs::read_to_string(path).map_err(|e| {
                ClientError::Config(format!(
                    "cannot read the token file {}: {e}",
                    path.display()
                ))
            })?;
            let token = text.lines().next().unwrap_or("").trim().to_owned();
            if token.is_empty() {
                return Err(ClientError::Config(format!(
                    "the token file {} is empty",
                    path.display()
                )));
            }
            return Ok(token);
        }
        match std::env::var("RTPOOL_TOKEN") {
            Ok(t) if !t.trim().is_empty() => Ok(t.trim().to_owned()),
            _ => Err(ClientError::Config(
                "no token: set RTPOOL_TOKEN, or give one (Config::token / token_file); the \
                 master prints its client token on first start (client.token in its data dir)"
                    .into(),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_comes_from_the_argument_then_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t");
        std::fs::write(&path, "from-file\nignored\n").unwrap();
        let c = Config::new("h:1").unwrap().token_file(&path);
        assert_eq!(c.resolve_token().unwrap(), "from-file");
        assert_eq!(c.token("given").resolve_token().unwrap(), "given");
        let missing = Config::new("h:1")
            .unwrap()
            .token_file(dir.path().join("none"));
        assert!(missing
            .resolve_token()
            .unwrap_err()
            .to_string()
            .contains("cannot read"));
    }

    #[test]
    fn an_address_without_a_port_is_refused() {
        let err = Config::new("localhost").unwrap_err();
        assert!(err.to_string().contains("is not HOST:PORT"), "{err}");
    }
}
