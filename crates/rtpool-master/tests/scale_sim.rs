//! The simulated workers of `rtpool bench scale` against an in-process master: they connect,
//! run a client's package over the real protocol, and every refusal is answered and counted.

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{expect_accepted, master, Peer};
use rtpool_master::sim::{SimConfig, SimStats, Simulator};
use rtpool_master::{MasterConfig, MasterHandle};
use rtpool_proto::{Msg, PackageOpts, Role};
use sha2::{Digest, Sha256};

/// Polls the simulator until `pred` holds, or panics with its counters after 20 s.
fn wait_sim(sim: &Simulator, what: &str, pred: impl Fn(&SimStats) -> bool) -> SimStats {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = sim.stats();
        if pred(&s) {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting until {what}: {s:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Submits `n` one-byte tasks and returns how many results came back.
fn run_package(m: &MasterHandle, n: u32) -> usize {
    let (mut client, welcome) = Peer::hello(m, Role::Client, &m.tokens().client.clone(), 0);
    assert!(matches!(welcome, Msg::Welcome { .. }), "{welcome:?}");
    let code = b"noop";
    client.send(&Msg::Submit {
        req_id: 1,
        fn_hash: Bytes::copy_from_slice(&Sha256::digest(code)),
        fn_code: Bytes::from_static(code),
        opts: PackageOpts::default(),
        tasks: (0..n)
            .map(|i| Bytes::from(i.to_be_bytes().to_vec()))
            .collect(),
    });
    expect_accepted(client.recv(), 1);
    let mut got = 0;
    while got < n as usize {
        match client.recv() {
            Msg::Results { results, .. } => got += results.len(),
            other => panic!("expected RESULTS, got {other:?}"),
        }
    }
    got
}

#[test]
fn simulated_workers_connect_and_run_a_package_at_default_settings() {
    let m = master();
    let mut sim = Simulator::start(SimConfig::new(
        m.addr().to_string(),
        m.tokens().worker.clone(),
        200,
    ))
    .unwrap();
    wait_sim(&sim, "200 workers connected", |s| s.connected == 200);
    assert_eq!(run_package(&m, 2000), 2000);
    let s = wait_sim(&sim, "2000 results sent", |s| s.tasks == 2000);
    let s2 = sim.stop();
    assert_eq!(
        (s.busy, s.refused, s.gave_up, s.connect_errors),
        (0, 0, 0, 0)
    );
    assert_eq!(
        (s2.lease_lost, s2.disconnected, s2.closed_by_master),
        (0, 0, 0)
    );
    assert!(s.assign_frames > 0 && s.assign_frames <= s.tasks);
}

#[test]
fn beyond_max_connections_workers_are_answered_busy_and_the_client_reserve_holds() {
    let m = MasterHandle::start(MasterConfig {
        listen: "127.0.0.1:0".into(),
        max_connections: 40,
        client_reserve: Some(4),
        ..Default::default()
    })
    .unwrap();
    let mut config = SimConfig::new(m.addr().to_string(), m.tokens().worker.clone(), 60);
    config.max_attempts = 3;
    // The master's budget of handshakes per address at these limits: no `busy` for that.
    config.handshake_concurrency = 4;
    let mut sim = Simulator::start(config).unwrap();
    // 36 places for workers (40 minus the 4 kept for clients); the other 24 meet `busy` on each
    // of their 3 attempts and give up: every refusal was an answer the simulator counted.
    let s = wait_sim(&sim, "every worker connected or gave up", |s| {
        s.connected + s.gave_up == 60
    });
    assert_eq!((s.connected, s.gave_up, s.busy), (36, 24, 72));
    assert_eq!((s.refused, s.connect_errors), (0, 0));
    assert_eq!(run_package(&m, 500), 500);
    let s = sim.stop();
    assert_eq!((s.tasks, s.lease_lost, s.disconnected), (500, 0, 0));
}
