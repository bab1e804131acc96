//! Unit tests of the record payloads: round trips of every record and option, the older
//! versions' layouts, and the refusal of damaged payloads.

use rtpool_core::MissPolicy;
use rtpool_proto::msgpack::Writer;

use super::*;

fn sample_package(package: u64) -> PackageRecord {
    PackageRecord {
        package,
        user: "alice".into(),
        fn_hash: [7; 32],
        fn_code: Bytes::from_static(b"def f(x): return x"),
        tasks: vec![
            Bytes::from_static(b"a"),
            Bytes::new(),
            Bytes::from(vec![0xC1; 300]),
        ],
        opts: PackageOpts {
            key: format!("key-{package}"),
            priority: -3,
            timeout_ms: 1500,
            ..PackageOpts::default()
        },
    }
}

/// A package with every deadline, replica and hedging option away from its default.
fn package_with_every_option() -> PackageRecord {
    let p = sample_package(3);
    PackageRecord {
        opts: PackageOpts {
            deadline_ms: u32::MAX,
            on_miss: MissPolicy::Drop,
            admit: true,
            replicas: 16,
            quorum: 9,
            max_copies: 255,
            hedge: true,
            ..p.opts.clone()
        },
        ..p
    }
}

fn all_records() -> Vec<Record> {
    vec![
        Record::Package(sample_package(u64::MAX)),
        Record::Done(DoneRecord {
            package: 4,
            index: u32::MAX,
            status: 255,
            data: Bytes::from(vec![1u8; 70_000]),
            exec_us: 123_456_789_012,
            late_us: u64::MAX,
        }),
        Record::Package(package_with_every_option()),
        Record::Delivered {
            package: 4,
            indices: vec![0, 1, 127, 128, 65_536, u32::MAX],
        },
        Record::Delivered {
            package: 5,
            indices: vec![],
        },
        Record::End { package: 0 },
        Record::Charge {
            user: "bob ü".into(),
            exec_us: 0,
        },
    ]
}

#[test]
fn every_record_type_round_trips() {
    for rec in all_records() {
        let entry = Entry::Record(rec);
        let payload = encode(&entry);
        assert_eq!(decode(&payload).unwrap(), entry);
    }
    for version in MIN_FORMAT_VERSION..=FORMAT_VERSION {
        let meta = Entry::Meta {
            version,
            next_package: 42,
            last_lsn: 7,
        };
        assert_eq!(decode(&encode(&meta)).unwrap(), meta);
    }
}

#[test]
fn every_package_option_round_trips() {
    let p = package_with_every_option();
    let entry = Entry::Record(Record::Package(p.clone()));
    let Entry::Record(Record::Package(back)) = decode(&encode(&entry)).unwrap() else {
        panic!("not a Package record");
    };
    assert_eq!(back, p);
    // Each option on its own, so that no two fields can be swapped unnoticed.
    let d = PackageOpts::default();
    let single = [
        PackageOpts {
            deadline_ms: 250,
            ..d.clone()
        },
        PackageOpts {
            on_miss: MissPolicy::Drop,
            ..d.clone()
        },
        PackageOpts {
            admit: true,
            ..d.clone()
        },
        PackageOpts {
            replicas: 3,
            ..d.clone()
        },
        PackageOpts {
            quorum: 2,
            ..d.clone()
        },
        PackageOpts {
            max_copies: 5,
            ..d.clone()
        },
        PackageOpts {
            hedge: true,
            ..d.clone()
        },
        PackageOpts {
            priority: i32::MIN,
            ..d.clone()
        },
        PackageOpts {
            timeout_ms: 1,
            ..d.clone()
        },
        PackageOpts {
            key: "k".into(),
            ..d.clone()
        },
        PackageOpts {
            max_attempts: 7,
            ..d.clone()
        },
    ];
    for opts in single {
        let entry = Entry::Record(Record::Package(PackageRecord {
            opts,
            ..sample_package(1)
        }));
        assert_eq!(decode(&encode(&entry)).unwrap(), entry);
    }
}

#[test]
fn retired_version_1_records_are_malformed_and_its_meta_decodes() {
    // Version 1's `Package` was version 2's without the options array (9 fields).
    let mut v1_package = encode_v2(&Record::Package(sample_package(8)));
    v1_package.truncate(v1_package.len() - 8);
    v1_package[0] = 0x99;
    assert!(decode(&v1_package)
        .unwrap_err()
        .contains("record tag 1 has 9 fields, expected 7"));
    // Its `Done` had no `late_us` (6 fields).
    let done = DoneRecord {
        package: 8,
        index: 2,
        status: 0,
        data: Bytes::from_static(b"ok"),
        exec_us: 40,
        late_us: 0,
    };
    let mut v1_done = encode(&Entry::Record(Record::Done(done)));
    assert_eq!(v1_done.pop(), Some(0), "late_us 0 is the last byte");
    v1_done[0] = 0x96;
    assert!(decode(&v1_done).unwrap_err().contains("Done"));
    // Its meta record decodes, for replay to refuse the file with how to upgrade it.
    let meta = Entry::Meta {
        version: MIN_FORMAT_VERSION - 1,
        next_package: 1,
        last_lsn: 2,
    };
    assert_eq!(decode(&encode(&meta)).unwrap(), meta);
}

#[test]
fn bad_version_2_package_options_are_rejected() {
    let payload = encode_v2(&Record::Package(sample_package(1)));
    // The options array is the last 8 bytes: fixarray 7, then deadline_ms, on_miss, ...
    let opts_at = payload.len() - 8;
    assert_eq!(payload[opts_at], 0x97);
    let mut bad_policy = payload.clone();
    bad_policy[opts_at + 2] = 2;
    assert!(decode(&bad_policy)
        .unwrap_err()
        .contains("on_miss: 2 is not 0 (run) or 1 (drop)"));
    let mut short = payload.clone();
    short[opts_at] = 0x96;
    short.pop();
    assert!(decode(&short)
        .unwrap_err()
        .contains("Package.opts has 6 fields, expected 7"));
    let mut not_bool = payload.clone();
    not_bool[opts_at + 3] = 0x01; // admit
    assert!(decode(&not_bool)
        .unwrap_err()
        .contains("Package.opts.admit"));
    let mut big_replicas = payload;
    big_replicas.truncate(opts_at + 4);
    big_replicas.extend_from_slice(&[0xcd, 0x01, 0x00, 0x01, 0x00, 0xc2]); // replicas 256
    assert!(decode(&big_replicas)
        .unwrap_err()
        .contains("Package.opts.replicas"));
}

#[test]
fn version_2_records_read_with_every_option() {
    for p in [sample_package(2), package_with_every_option()] {
        let v2 = encode_v2(&Record::Package(p.clone()));
        assert_eq!(v2[0], 0x9a, "a fixarray of 10");
        assert_eq!(decode(&v2).unwrap(), Entry::Record(Record::Package(p)));
    }
}

#[test]
fn package_options_are_the_wire_options_map() {
    let p = sample_package(1);
    let payload = encode(&Entry::Record(Record::Package(p.clone())));
    assert_eq!(payload[0], 0x97, "a fixarray of 7");
    // The options map ends the payload, written as a SUBMIT writes it.
    let mut map = Vec::new();
    p.opts.write_map(&mut Writer(&mut map));
    assert!(payload.ends_with(&map));
    assert_eq!(
        map[0], 0x83,
        "key, priority and timeout_ms differ from the defaults"
    );
    // An option this master does not know (a newer master's) is refused, naming it.
    let mut unknown = payload[..payload.len() - map.len()].to_vec();
    let w = &mut Writer(&mut unknown);
    w.map(1);
    w.str("future_option");
    w.uint(1u8);
    let err = decode(&unknown).unwrap_err();
    assert!(
        err.contains("Package.opts: option `future_option`"),
        "{err}"
    );
}

#[test]
fn package_payload_is_a_tagged_msgpack_array() {
    let payload = encode(&Entry::Record(Record::End { package: 3 }));
    // fixarray of 2, positive fixint tag 4, positive fixint 3.
    assert_eq!(payload, vec![0x92, 0x04, 0x03]);
}

#[test]
fn truncated_or_padded_payloads_are_rejected() {
    for rec in all_records() {
        let payload = encode(&Entry::Record(rec));
        for cut in 0..payload.len() {
            assert!(decode(&payload[..cut]).is_err(), "cut at {cut} decoded");
        }
        let mut padded = payload.clone();
        padded.push(0);
        assert!(decode(&padded).unwrap_err().contains("trailing"));
    }
}

#[test]
fn wrong_version_and_unknown_tag_are_rejected() {
    let mut buf = Vec::new();
    let w = &mut Writer(&mut buf);
    w.array(4);
    w.uint(tag::META);
    w.uint(FORMAT_VERSION + 1);
    w.uint(0u64);
    w.uint(0u64);
    assert!(decode(&buf).unwrap_err().contains("version"));
    let mut buf = Vec::new();
    let w = &mut Writer(&mut buf);
    w.array(4);
    w.uint(tag::META);
    w.uint(0u64);
    w.uint(0u64);
    w.uint(0u64);
    assert!(decode(&buf).unwrap_err().contains("reads versions 2 to 3"));
    let mut buf = Vec::new();
    let w = &mut Writer(&mut buf);
    w.array(2);
    w.uint(99u64);
    w.uint(0u64);
    assert!(decode(&buf).unwrap_err().contains("unknown record tag 99"));
}
