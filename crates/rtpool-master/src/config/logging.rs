//! How a command-line master logs: [`LogFormat`] (`--log-format`), [`Logging`] (what
//! [`super::args::MasterArgs`] hands to [`crate::init_logging`]) and the check of a
//! `--log-level` filter. Logging is per process, so none of it is part of [`super::MasterConfig`].

/// How log lines are written (`--log-format`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event; ANSI colours only when stderr is a terminal.
    #[default]
    Text,
    /// One JSON object per line (`timestamp`, `level`, `target`, `fields`).
    Json,
}

/// The logging of a command-line master: not part of [`super::MasterConfig`] (logging is per
/// process), installed by [`crate::init_logging`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Logging {
    /// The tracing filter (`--log-level`, `$RTPOOL_LOG`, else `info`).
    pub filter: String,
    /// The line format (`--log-format`).
    pub format: LogFormat,
}

/// The level names a plain `--log-level` may be.
const LOG_LEVELS: &[&str] = &["error", "warn", "info", "debug", "trace", "off"];

/// `--log-level`: a level name, or tracing directives (`target=level`, comma-separated). A
/// bare word that is no level is refused: tracing would read `loud` as "everything of the
/// target `loud`", which silences every line of the master.
pub(super) fn parse_log_filter(text: &str) -> Result<String, String> {
    let hint = "use error, warn, info, debug, trace or off, or directives such as \
                rtpool_master=debug,warn";
    for directive in text.split(',').map(str::trim) {
        let level = directive.rsplit_once('=').map_or(directive, |(_, l)| l);
        if !LOG_LEVELS.contains(&level.to_ascii_lowercase().as_str()) {
            return Err(format!("{level:?} is not a log level; {hint}"));
        }
    }
    // tracing reads "warn, h2=off" as a bad level " h2": spaces around commas are dropped.
    let text = text.split(',').map(str::trim).collect::<Vec<_>>().join(",");
    tracing_subscriber::EnvFilter::try_new(&text)
        .map(|_| text)
        .map_err(|e| format!("{e}; {hint}"))
}
