//! Tests of the command line ([`super`]): defaults, every option, bad values.

use super::*;

use crate::config::options::{apply_options, OptionValue};
use crate::realtime::DEFAULT_PRIORITY;

fn parse(args: &[&str]) -> Result<(MasterConfig, Logging), clap::Error> {
    MasterArgs::parse_named("rtpool-master", args)
}

#[test]
fn no_option_means_the_defaults() {
    let (config, _) = parse(&[]).unwrap();
    let d = MasterConfig::default();
    assert_eq!(config.listen, d.listen);
    assert_eq!(config.max_frame_bytes, d.max_frame_bytes);
    assert_eq!(config.result_ttl, d.result_ttl);
    assert_eq!(config.fsync, d.fsync);
    assert!(config.journal && !config.realtime.enabled);
    assert_eq!(config.realtime.priority, DEFAULT_PRIORITY);
}

#[test]
fn every_option_reaches_the_configuration() {
    let (c, log) = parse(&[
        "--listen=0.0.0.0:1",
        "--data-dir=/d",
        "--store=sqlite:///s.db",
        "--log-level=debug",
        "--log-format=json",
        "--log-summary=2.5",
        "--tls-cert=c.pem",
        "--tls-key=k.pem",
        "--max-frame-mb=2",
        "--heartbeat-ms=7",
        "--max-connections=9",
        "--max-buffered-mb=3",
        "--client-timeout-ms=11",
        "--lease-ms=13",
        "--result-ttl=1.5",
        "--max-attempts=4",
        "--max-task-seconds=60",
        "--timeout-grace=0.25",
        "--fsync=always",
        "--no-journal",
        "--hedge-factor=2.5",
        "--service-grace=5",
        "--realtime",
        "--rt-priority=7",
        "--cpus=0-2",
    ])
    .unwrap();
    assert_eq!(log.filter, "debug");
    assert_eq!(log.format, LogFormat::Json);
    assert_eq!(c.log_summary, Duration::from_millis(2500));
    assert_eq!(c.listen, "0.0.0.0:1");
    assert_eq!(c.data_dir, Some(PathBuf::from("/d")));
    assert_eq!(c.store.as_deref(), Some("sqlite:///s.db"));
    assert_eq!(c.tls_cert, Some(PathBuf::from("c.pem")));
    assert_eq!(c.tls_key, Some(PathBuf::from("k.pem")));
    assert_eq!((c.max_frame_bytes, c.heartbeat_ms), (2 << 20, 7));
    assert_eq!(
        (c.max_connections, c.max_buffered_bytes),
        (9, Some(3 << 20))
    );
    assert_eq!((c.client_timeout_ms, c.lease_ms), (11, 13));
    assert_eq!(c.result_ttl, Duration::from_millis(1500));
    assert_eq!(c.max_attempts, 4);
    assert_eq!(c.max_task_time, Duration::from_secs(60));
    assert_eq!(c.timeout_grace, Duration::from_millis(250));
    assert_eq!(c.fsync, FsyncPolicy::Always);
    assert!(!c.journal);
    assert_eq!(c.hedge_factor, 2.5);
    assert_eq!(c.service_grace, Duration::from_secs(5));
    assert_eq!(
        c.realtime,
        RealtimeConfig {
            enabled: true,
            priority: 7,
            cpus: Some(vec![0, 1, 2]),
        }
    );
}

#[test]
fn the_admission_options_reach_the_configuration() {
    let (c, _) = parse(&[
        "--max-unauthenticated=5",
        "--max-unauthenticated-per-host=2",
        "--client-reserve=0",
        "--handshake-timeout-ms=700",
    ])
    .unwrap();
    assert_eq!(c.max_unauthenticated, Some(5));
    assert_eq!(c.max_unauthenticated_per_host, Some(2));
    assert_eq!(c.client_reserve, Some(0));
    assert_eq!(c.handshake_timeout, Duration::from_millis(700));
    let (d, _) = parse(&[]).unwrap();
    assert_eq!((d.max_connections, d.max_unauthenticated), (0, None));
    for bad in ["--max-unauthenticated=0", "--handshake-timeout-ms=0"] {
        let e = parse(&[bad]).unwrap_err().to_string();
        assert!(e.contains("above 0"), "{bad}: {e}");
    }
}

#[test]
fn bad_values_are_refused_naming_the_option() {
    for (args, expected) in [
        (&["--hedge-factor=1"][..], "must be a number above 1"),
        (&["--result-ttl=-1"], "must be a number of seconds >= 0"),
        (
            &["--service-grace", "-1"],
            "must be a number of seconds >= 0",
        ),
        (&["--lease-ms", "-1"], "-1 is not in 0.."),
        (&["--fsync=sometimes"], "sometimes"),
        (&["--realtime", "--rt-priority=100"], "must be 1-99"),
        (&["--realtime", "--cpus=3-1"], "runs backwards"),
        (&["--rt-priority=5"], "--rt-priority need --realtime"),
        (
            &["--cpus=1", "--rt-priority=5"],
            "--rt-priority, --cpus need --realtime",
        ),
        (&["--tls-cert=c.pem"], "--tls-key"),
        (&["--bogus"], "--bogus"),
        (
            &["--fsync=sometimes"],
            "use always, batch, batch:<ms> or off",
        ),
        (
            &["--log-level=loud"],
            "\"loud\" is not a log level; use error, warn",
        ),
        (
            &["--log-level=rtpool_master=loud"],
            "\"loud\" is not a log level",
        ),
        (&["--log-format=xml"], "[possible values: text, json]"),
        (
            &["--listen=7070"],
            "\"7070\" is not HOST:PORT; write HOST:PORT",
        ),
        (
            &["--listen=localhost:http"],
            "\"http\" is not a port number",
        ),
        (&["--listen=:7070"], "is not HOST:PORT"),
    ] {
        let err = parse(args).expect_err("refused");
        let text = err.to_string();
        assert!(text.contains(expected), "{args:?}: {text}");
        assert_eq!(err.exit_code(), 2, "{args:?}");
    }
}

#[test]
fn good_log_filters_and_listen_addresses_pass() {
    for filter in [
        "info",
        "DEBUG",
        "off",
        "rtpool_master=debug,warn",
        "warn, h2=off",
    ] {
        let (_, log) = parse(&["--log-level", filter]).expect(filter);
        assert_eq!(log.filter, filter.replace(' ', ""));
        assert_eq!(log.format, LogFormat::Text);
    }
    for listen in [
        "127.0.0.1:0",
        "localhost:7070",
        "[::1]:7070",
        "0.0.0.0:65535",
    ] {
        let (config, _) = parse(&["--listen", listen]).expect(listen);
        assert_eq!(config.listen, listen);
    }
}

#[test]
fn help_names_the_command_and_every_option() {
    let err = parse(&["--help"]).expect_err("help is an early exit");
    assert_eq!(err.exit_code(), 0);
    let help = err.to_string();
    assert!(
        help.contains("rtpool-master --listen 0.0.0.0:7070"),
        "{help}"
    );
    for arg in MasterArgs::command().get_arguments() {
        if let Some(long) = arg.get_long() {
            assert!(
                help.contains(&format!("--{long}")),
                "--{long} missing: {help}"
            );
        }
    }
}

#[test]
fn the_clap_definition_is_consistent() {
    MasterArgs::command().debug_assert();
}

#[test]
fn the_http_options_reach_the_configuration() {
    let (c, _) = parse(&[]).unwrap();
    assert_eq!(c.http.as_deref(), Some(super::super::DEFAULT_HTTP));
    assert!(c.http_is_default && c.metrics);
    let (c, _) = parse(&["--http=off"]).unwrap();
    assert_eq!(c.http, None);
    let (c, _) = parse(&["--http", "127.0.0.1:0", "--http-token=t", "--no-metrics"]).unwrap();
    assert_eq!(c.http.as_deref(), Some("127.0.0.1:0"));
    assert_eq!(c.http_token.as_deref(), Some("t"));
    assert!(!c.http_is_default && !c.metrics);
    // An embedded master: off unless its options dict asks.
    let mut embedded = MasterConfig::default();
    assert_eq!(embedded.http, None);
    let options = [
        ("http".to_owned(), OptionValue::Text("127.0.0.1:0".into())),
        ("metrics".to_owned(), OptionValue::Flag(false)),
    ];
    apply_options(&mut embedded, options).unwrap();
    assert_eq!(embedded.http.as_deref(), Some("127.0.0.1:0"));
    assert!(!embedded.metrics && !embedded.http_is_default);
}

#[test]
fn the_compaction_pace_reaches_the_configuration() {
    let (c, _) = parse(&[]).unwrap();
    assert_eq!(
        c.journal_compact_mb_per_s, 0,
        "default: as fast as the disk goes"
    );
    let (c, _) = parse(&["--journal-compact-mb-per-s", "32"]).unwrap();
    assert_eq!(c.journal_compact_mb_per_s, 32);
    let err = parse(&["--journal-compact-mb-per-s", "fast"]).unwrap_err();
    assert!(
        err.to_string().contains("--journal-compact-mb-per-s"),
        "{err}"
    );
}
