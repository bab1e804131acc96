//! The options dict of an embedded master (`rtpool._native.Master(options=...)`,
//! `rtpool.LocalCluster(master_options=...)`), read by the command line's own parser
//! ([`MasterArgs`]): each key is an `rtpool master` option under its field name (`lease_ms`,
//! `result_ttl_s` for `--result-ttl`, `journal` for `--no-journal`), each value what the
//! option takes, so the dict and the command line take the same options with the same checks.

use clap::{ArgAction, CommandFactory, Parser};

use super::args::MasterArgs;
use super::MasterConfig;
use crate::error::MasterError;

/// Options of the command line that make no sense in a dict: logging is set per process.
const COMMAND_LINE_ONLY: &[&str] = &["log_level", "log_format"];

/// A value of the options dict.
#[derive(Debug, Clone, PartialEq)]
pub enum OptionValue {
    /// For a flag (`realtime`, `journal`, `tls_self_signed`): on or off.
    Flag(bool),
    /// For an option with a value: its text as the command line would take it (`"900"`,
    /// `"always"`, `"0-3"`).
    Text(String),
}

/// Every key the options dict takes, in the order of `rtpool master --help`.
pub fn option_keys() -> Vec<String> {
    MasterArgs::command()
        .get_arguments()
        .filter(|a| a.get_long().is_some())
        .map(|a| a.get_id().as_str().to_owned())
        .filter(|id| !matches!(id.as_str(), "help" | "version"))
        .filter(|id| !COMMAND_LINE_ONLY.contains(&id.as_str()))
        .collect()
}

/// Sets the fields of `config` that `options` name, checked as `rtpool master` checks its
/// command line; the other fields keep their value.
///
/// # Errors
///
/// [`MasterError::UnknownOption`] for a key that is no option (naming the known ones),
/// [`MasterError::InvalidOption`] for a value the option refuses (a flag given a value, a
/// number out of range, `tls_cert` without `tls_key`).
pub fn apply_options<I>(config: &mut MasterConfig, options: I) -> Result<(), MasterError>
where
    I: IntoIterator<Item = (String, OptionValue)>,
{
    let cmd = MasterArgs::command();
    let mut argv = vec!["options".to_owned()];
    let mut keys = Vec::new();
    for (key, value) in options {
        let arg = cmd
            .get_arguments()
            .filter(|a| !COMMAND_LINE_ONLY.contains(&a.get_id().as_str()))
            .find(|a| a.get_id() == key.as_str() && a.get_long().is_some())
            .ok_or_else(|| MasterError::UnknownOption {
                key: key.clone(),
                known: option_keys().join(", "),
            })?;
        let long = arg.get_long().expect("filtered on a long flag");
        let is_flag = matches!(arg.get_action(), ArgAction::SetTrue | ArgAction::SetFalse);
        let set_when = matches!(arg.get_action(), ArgAction::SetTrue);
        match value {
            OptionValue::Flag(on) if is_flag => {
                if on == set_when {
                    argv.push(format!("--{long}"));
                }
            }
            OptionValue::Text(text) if !is_flag => argv.push(format!("--{long}={text}")),
            OptionValue::Flag(on) => {
                return Err(MasterError::InvalidOption {
                    key,
                    reason: format!("takes a value as --{long} does, not {on}"),
                })
            }
            OptionValue::Text(text) => {
                return Err(MasterError::InvalidOption {
                    key,
                    reason: format!("takes True or False, not {text:?}"),
                })
            }
        }
        keys.push(key);
    }
    let args = MasterArgs::try_parse_from(argv).map_err(|e| MasterError::InvalidOption {
        key: keys.join(", "),
        reason: clap_reason(&e),
    })?;
    args.apply_to(config);
    Ok(())
}

/// A clap error's message on one line, without its `error: ` prefix, usage and hint.
fn clap_reason(e: &clap::Error) -> String {
    let text = e.to_string();
    let message = text.split("\n\n").next().unwrap_or_default();
    let message = message.strip_prefix("error: ").unwrap_or(message);
    message.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::journal::FsyncPolicy;

    fn text(key: &str, value: &str) -> (String, OptionValue) {
        (key.into(), OptionValue::Text(value.into()))
    }

    fn flag(key: &str, on: bool) -> (String, OptionValue) {
        (key.into(), OptionValue::Flag(on))
    }

    #[test]
    fn the_dict_keys_of_before_still_work() {
        let mut c = MasterConfig {
            listen: "127.0.0.1:0".into(),
            ..MasterConfig::default()
        };
        apply_options(
            &mut c,
            [
                text("lease_ms", "900"),
                text("store", "sqlite:///x.db"),
                text("result_ttl_s", "2.5"),
                text("max_attempts", "5"),
                text("hedge_factor", "3"),
                text("max_task_seconds", "0"),
                text("timeout_grace_s", "0.5"),
                text("service_grace_s", "1"),
                flag("journal", false),
                text("fsync", "batch:5"),
            ],
        )
        .unwrap();
        assert_eq!(
            c.listen, "127.0.0.1:0",
            "what the dict does not name is kept"
        );
        assert_eq!(c.lease_ms, 900);
        assert_eq!(c.store.as_deref(), Some("sqlite:///x.db"));
        assert_eq!(c.result_ttl, Duration::from_millis(2500));
        assert_eq!((c.max_attempts, c.hedge_factor), (5, 3.0));
        assert_eq!(c.max_task_time, Duration::ZERO);
        assert_eq!(c.timeout_grace, Duration::from_millis(500));
        assert_eq!(c.service_grace, Duration::from_secs(1));
        assert!(!c.journal);
        assert_eq!(
            c.fsync,
            FsyncPolicy::Batch {
                window: Duration::from_millis(5)
            }
        );
    }

    #[test]
    fn a_flag_set_to_its_default_changes_nothing() {
        let mut c = MasterConfig::default();
        apply_options(&mut c, [flag("journal", true), flag("realtime", false)]).unwrap();
        assert!(c.journal && !c.realtime.enabled);
        apply_options(&mut c, [flag("realtime", true)]).unwrap();
        assert!(c.realtime.enabled);
    }

    #[test]
    fn an_unknown_key_names_the_known_ones() {
        let err = apply_options(&mut MasterConfig::default(), [text("bogus", "1")])
            .expect_err("refused")
            .to_string();
        assert!(
            err.starts_with("unknown master option \"bogus\"; known: listen,"),
            "{err}"
        );
        for key in [
            "lease_ms",
            "result_ttl_s",
            "journal",
            "fsync",
            "timeout_grace_s",
        ] {
            assert!(err.contains(key), "{err}");
        }
        let err = apply_options(&mut MasterConfig::default(), [text("log_level", "debug")])
            .expect_err("per process, not per master");
        assert!(matches!(err, MasterError::UnknownOption { .. }), "{err}");
    }

    #[test]
    fn bad_values_are_refused_as_the_command_line_refuses_them() {
        for (option, expected) in [
            (
                text("hedge_factor", "1"),
                "hedge_factor: invalid value '1' for '--hedge-factor",
            ),
            (
                text("result_ttl_s", "-1"),
                "must be a number of seconds >= 0",
            ),
            (text("lease_ms", "soon"), "--lease-ms"),
            (text("fsync", "sometimes"), "sometimes"),
            (text("journal", "no"), "journal: takes True or False"),
            (
                flag("lease_ms", true),
                "lease_ms: takes a value as --lease-ms does",
            ),
            (text("tls_cert", "c.pem"), "--tls-key"),
        ] {
            let err = apply_options(&mut MasterConfig::default(), [option.clone()])
                .expect_err("refused")
                .to_string();
            assert!(err.contains(expected), "{option:?}: {err}");
        }
    }
}
