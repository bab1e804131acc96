//! The configuration file of `grpc_initialize(config_file)`: `key = value` lines, `#`
//! comments, every key optional. Without a file (`NULL` or `""`), the environment alone:
//!
//! ```text
//! # rtpool client configuration (docs/clients.md, "C")
//! master = 10.0.0.5:7070, 10.0.0.6:7070   # default: $RTPOOL_MASTER, else 127.0.0.1:7070
//! token_file = /etc/rtpool/client.token   # default: $RTPOOL_TOKEN
//! ca_file = /etc/rtpool/cert.pem          # TLS, trusting this PEM file; default: no TLS
//! server_name = master.example            # the name on the master's certificate
//! connect_timeout_ms = 10000
//! reconnect_timeout_ms = 60000
//! ```
//!
//! The token itself has no key: a file readable by others is no place for it.

use std::time::Duration;

use rtpool_client::Config;

use crate::error::{CapiError, GRPC_CONFIGFILE_ERROR, GRPC_CONFIGFILE_NOT_FOUND};

/// The master address used when neither the file nor `$RTPOOL_MASTER` gives one.
pub(crate) const DEFAULT_MASTER: &str = "127.0.0.1:7070";

/// What `grpc_initialize` read: how to reach the default master and any other one a handle
/// names.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Settings {
    /// The default master's addresses (`host:port`, comma-separated).
    pub master: Option<String>,
    /// The client token's file.
    pub token_file: Option<String>,
    /// TLS trust root.
    pub ca_file: Option<String>,
    /// TLS server name.
    pub server_name: Option<String>,
    /// One connection attempt's limit.
    pub connect_timeout_ms: Option<u64>,
    /// How long to keep reconnecting after losing the master.
    pub reconnect_timeout_ms: Option<u64>,
}

impl Settings {
    /// Read the file at `path` (`None`: no file).
    ///
    /// # Errors
    ///
    /// `GRPC_CONFIGFILE_NOT_FOUND` when it cannot be read, `GRPC_CONFIGFILE_ERROR` naming the
    /// line of an unknown key or a bad value.
    pub fn load(path: Option<&str>) -> Result<Settings, CapiError> {
        let Some(path) = path.filter(|p| !p.is_empty()) else {
            return Ok(Settings::default());
        };
        let text = std::fs::read_to_string(path).map_err(|e| {
            CapiError::new(
                GRPC_CONFIGFILE_NOT_FOUND,
                format!("cannot read the configuration file {path}: {e}"),
            )
        })?;
        Settings::parse(&text)
            .map_err(|e| CapiError::new(GRPC_CONFIGFILE_ERROR, format!("{path}: {e}")))
    }

    /// Parse a file's text.
    ///
    /// # Errors
    ///
    /// A message naming the line.
    pub fn parse(text: &str) -> Result<Settings, String> {
        let mut settings = Settings::default();
        for (number, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let at = |e: &str| format!("line {}: {e}", number + 1);
            let (key, value) = line
                .split_once('=')
                .ok_or_else(|| at("expected key = value"))?;
            let (key, value) = (key.trim(), value.trim().to_owned());
            let millis = |v: &str| {
                v.parse::<u64>().map_err(|_| {
                    at(&format!(
                        "{key} must be a number of milliseconds, got {v:?}"
                    ))
                })
            };
            match key {
                "master" => settings.master = Some(value),
                "token_file" => settings.token_file = Some(value),
                "ca_file" => settings.ca_file = Some(value),
                "server_name" => settings.server_name = Some(value),
                "connect_timeout_ms" => settings.connect_timeout_ms = Some(millis(&value)?),
                "reconnect_timeout_ms" => settings.reconnect_timeout_ms = Some(millis(&value)?),
                "token" => return Err(at("a token does not go in a configuration file: use RTPOOL_TOKEN or token_file")),
                other => {
                    return Err(at(&format!(
                        "unknown key {other:?} (known: master, token_file, ca_file, server_name, connect_timeout_ms, reconnect_timeout_ms)"
                    )))
                }
            }
        }
        Ok(settings)
    }

    /// The default master: the file's, else `$RTPOOL_MASTER`, else [`DEFAULT_MASTER`].
    pub fn default_master(&self) -> String {
        self.master
            .clone()
            .or_else(|| {
                std::env::var("RTPOOL_MASTER")
                    .ok()
                    .filter(|m| !m.trim().is_empty())
            })
            .unwrap_or_else(|| DEFAULT_MASTER.to_owned())
    }

    /// The client configuration for the master at `addresses`.
    ///
    /// # Errors
    ///
    /// `GRPC_SERVER_NOT_FOUND`-class config errors from the client crate (a bad address).
    pub fn client_config(&self, addresses: &str) -> Result<Config, CapiError> {
        let mut config = Config::new(addresses)
            .map_err(|e| CapiError::new(crate::error::GRPC_SERVER_NOT_FOUND, e.to_string()))?;
        if let Some(file) = &self.token_file {
            config = config.token_file(file);
        }
        if let Some(file) = &self.ca_file {
            config = config.ca_file(file);
        }
        if let Some(name) = &self.server_name {
            config = config.server_name(name);
        }
        if let Some(ms) = self.connect_timeout_ms {
            config = config.connect_timeout(Duration::from_millis(ms));
        }
        if let Some(ms) = self.reconnect_timeout_ms {
            config = config.reconnect_timeout(Duration::from_millis(ms));
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_sets_each_key_and_comments_are_ignored() {
        let text =
            "# a comment\nmaster = h:1, g:2  # two\nconnect_timeout_ms = 500\n\nca_file=/c.pem\n";
        let s = Settings::parse(text).unwrap();
        assert_eq!(s.master.as_deref(), Some("h:1, g:2"));
        assert_eq!(s.connect_timeout_ms, Some(500));
        assert_eq!(s.ca_file.as_deref(), Some("/c.pem"));
        assert_eq!(s.default_master(), "h:1, g:2");
    }

    #[test]
    fn bad_lines_name_themselves() {
        assert!(Settings::parse("master\n")
            .unwrap_err()
            .starts_with("line 1: expected key = value"));
        assert!(Settings::parse("\nfoo = 1")
            .unwrap_err()
            .contains("line 2: unknown key \"foo\""));
        assert!(Settings::parse("connect_timeout_ms = soon")
            .unwrap_err()
            .contains("milliseconds"));
        assert!(Settings::parse("token = abc")
            .unwrap_err()
            .contains("RTPOOL_TOKEN"));
    }

    #[test]
    fn a_missing_file_is_configfile_not_found() {
        let err = Settings::load(Some("/nonexistent/rtpool.conf")).unwrap_err();
        assert_eq!(err.code, GRPC_CONFIGFILE_NOT_FOUND);
        assert!(err.message.contains("/nonexistent/rtpool.conf"));
        assert_eq!(Settings::load(None).unwrap(), Settings::default());
    }
}
