//! `rtpool-master`: the master's command line ([`rtpool_master::cli`]), the same one
//! `rtpool master` runs.

fn main() {
    std::process::exit(rtpool_master::cli::main(
        "rtpool-master",
        std::env::args_os().skip(1),
    ));
}
