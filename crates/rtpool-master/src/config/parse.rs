//! Parsers of the master's option values ([`super::args`]): each returns the value or a
//! message that says what is wrong and what to write instead (clap prefixes the option).

use std::time::Duration;

use super::{check_hedge_factor, check_miss_ratio};
use crate::journal::FsyncPolicy;
use crate::realtime::DEFAULT_PRIORITY;

/// `--listen`: `HOST:PORT` (`[::1]:7070` for IPv6); only the form is checked here, binding
/// says whether the address is usable.
pub(super) fn parse_listen(text: &str) -> Result<String, String> {
    let hint = "write HOST:PORT, e.g. 127.0.0.1:7070 (this machine only), 0.0.0.0:7070 (every \
                interface) or 127.0.0.1:0 (a free port)";
    match text.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {
            Ok(text.to_owned())
        }
        Some((_, port)) if port.parse::<u16>().is_err() => {
            Err(format!("{port:?} is not a port number (0-65535); {hint}"))
        }
        _ => Err(format!("{text:?} is not HOST:PORT; {hint}")),
    }
}

/// `--hedge-factor`: a number above 1.
pub(super) fn parse_hedge_factor(text: &str) -> Result<f64, String> {
    let value: f64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a number; use e.g. 3 or 2.5"))?;
    check_hedge_factor(value)
}

/// `--overload-miss-ratio`: a share from 0 to 1.
pub(super) fn parse_miss_ratio(text: &str) -> Result<f64, String> {
    let value: f64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a number; use e.g. 0.05"))?;
    check_miss_ratio(value)
}

/// A duration in seconds (`--result-ttl`, `--service-grace`, ...): a finite number >= 0.
pub(super) fn parse_seconds(text: &str) -> Result<f64, String> {
    let value: f64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a number of seconds; use e.g. 30 or 2.5"))?;
    if Duration::try_from_secs_f64(value).is_err() {
        return Err(format!("must be a number of seconds >= 0, not {value}"));
    }
    Ok(value)
}

/// `--rt-priority`: a SCHED_FIFO priority.
pub(super) fn parse_positive(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("must be a whole number above 0, not {text:?}")),
    }
}

pub(super) fn parse_positive_u64(text: &str) -> Result<u64, String> {
    parse_positive(text).map(|n| n as u64)
}

pub(super) fn parse_priority(text: &str) -> Result<u8, String> {
    match text.parse::<u8>() {
        Ok(n @ 1..=99) => Ok(n),
        _ => Err(format!(
            "must be 1-99 (a SCHED_FIFO priority; default {DEFAULT_PRIORITY}), not {text:?}"
        )),
    }
}

/// `--ha-lease-ms`: at least 100 ms (the leader renews every third of it, and must do so over a
/// database round trip) and at most an hour.
pub(super) fn parse_ha_lease(text: &str) -> Result<u32, String> {
    match text.trim().parse::<u32>() {
        Ok(ms @ 100..=3_600_000) => Ok(ms),
        _ => Err(format!(
            "must be a whole number of milliseconds from 100 to 3600000 (default 1000), not {text:?}"
        )),
    }
}

/// `--fsync`: `always`, `batch`, `batch:MS` or `off`.
pub(super) fn parse_fsync(text: &str) -> Result<FsyncPolicy, String> {
    text.parse()
        .map_err(|e: crate::journal::JournalError| e.to_string())
}
