//! The master's command line, run the same way by the `rtpool-master` binary and by
//! `rtpool master` (through `rtpool._native.master_main`): parse [`MasterArgs`], install the
//! logger, run the master in the foreground until SIGINT/SIGTERM.

use std::ffi::OsString;

use crate::config::args::MasterArgs;

/// Runs the master command line `name` (`rtpool-master`, `rtpool master`) with `args` (without
/// the program name) and returns the process's exit code: 0 after a signal or for `--help` and
/// `--version` (printed to stdout), 2 for a command line clap refuses (its message on stderr),
/// 1 when the master cannot start or fails (`{name}: {error}` on stderr).
pub fn main<I, T>(name: &'static str, args: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let (config, logging) = match MasterArgs::parse_named(name, args) {
        Ok(parsed) => parsed,
        Err(e) => {
            let _ = e.print();
            return e.exit_code();
        }
    };
    crate::init_logging(&logging.filter, logging.format);
    crate::mem_trim::own_the_process();
    let run = if config.ha.is_some() {
        crate::ha::run_blocking(config)
    } else {
        crate::run_blocking(config)
    };
    match run {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("{name}: {e}");
            1
        }
    }
}
