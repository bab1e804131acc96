//! The store test suite, shared by both backends: each backend's tests open a fresh store and
//! hand it to [`check_store`].

use std::path::Path;

use rtpool_proto::Role;

use super::*;

/// Exercise every [`Store`] operation on an empty store; returns the raw tokens it created, for
/// the caller to check that none of them is stored.
pub(crate) fn check_store(store: &mut dyn Store) -> Vec<String> {
    assert_eq!(store.list_tokens().unwrap(), vec![]);
    assert_eq!(store.quotas().unwrap(), vec![]);
    assert_eq!(store.watermark().unwrap(), 0);

    // Create and verify.
    let (alice, alice_info) = store
        .create_token("alice", Role::Client, Some(2.5))
        .unwrap();
    let (alice_w, alice_w_info) = store.create_token("alice", Role::Worker, None).unwrap();
    let (bob, bob_info) = store.create_token("bob", Role::Client, None).unwrap();
    for (token, prefix) in [(&alice, "rtc_"), (&alice_w, "rtw_"), (&bob, "rtc_")] {
        assert!(token.starts_with(prefix), "{token}");
        assert_eq!(token.len(), 4 + 43, "{token}");
    }
    assert_ne!(alice, bob);
    assert_eq!(alice_info.id, token_hash(&alice)[..12]);
    assert_eq!(alice_info.user, "alice");
    assert_eq!(alice_info.role, Role::Client);
    assert!(!alice_info.revoked);
    assert!(alice_info.created_unix > 1_600_000_000);
    assert_eq!(
        store.verify(&alice).unwrap(),
        Some(("alice".into(), Role::Client))
    );
    assert_eq!(
        store.verify(&alice_w).unwrap(),
        Some(("alice".into(), Role::Worker))
    );
    assert_eq!(
        store.verify(&bob).unwrap(),
        Some(("bob".into(), Role::Client))
    );

    // Wrong tokens.
    assert_eq!(store.verify("").unwrap(), None);
    assert_eq!(store.verify("rtc_nope").unwrap(), None);
    let mut altered = alice.clone().into_bytes();
    *altered.last_mut().unwrap() ^= 1;
    assert_eq!(
        store.verify(&String::from_utf8(altered).unwrap()).unwrap(),
        None
    );
    assert_eq!(store.verify(&alice_info.id).unwrap(), None);

    // List, oldest first.
    let listed = store.list_tokens().unwrap();
    let mut expected = vec![alice_info.clone(), alice_w_info.clone(), bob_info.clone()];
    // Same-second creations are ordered by id in PostgreSQL and by insertion in SQLite.
    let key = |t: &TokenInfo| (t.created_unix, t.user.clone(), t.role.as_str());
    let mut sorted = listed.clone();
    sorted.sort_by_key(key);
    expected.sort_by_key(key);
    assert_eq!(sorted, expected);

    check_revoke(store, &bob, &bob_info, &alice);
    check_quotas(store);
    vec![alice, alice_w, bob]
}

fn check_revoke(store: &mut dyn Store, bob: &str, bob_info: &TokenInfo, alice: &str) {
    assert!(matches!(
        store.revoke("abc"),
        Err(StoreError::InvalidId { .. })
    ));
    assert!(matches!(
        store.revoke("zzzzzzzz"),
        Err(StoreError::InvalidId { .. })
    ));
    // A 12-char id that is not a token's (flip the last hex digit of bob's).
    let mut other = bob_info.id.clone();
    let last = other.pop().unwrap();
    other.push(if last == '0' { '1' } else { '0' });
    let err = store.revoke(&other).unwrap_err();
    assert!(matches!(err, StoreError::NoSuchToken { .. }), "{err}");
    assert!(err.to_string().contains("rtpool token list"), "{err}");

    // By a 6-char prefix, upper case accepted.
    let revoked = store.revoke(&bob_info.id[..6].to_uppercase()).unwrap();
    assert_eq!(
        revoked,
        TokenInfo {
            revoked: true,
            ..bob_info.clone()
        }
    );
    assert_eq!(store.verify(bob).unwrap(), None);
    assert!(store.verify(alice).unwrap().is_some());
    // Idempotent.
    assert!(store.revoke(&bob_info.id).unwrap().revoked);
    let listed = store.list_tokens().unwrap();
    assert_eq!(listed.iter().filter(|t| t.revoked).count(), 1);
}

fn check_quotas(store: &mut dyn Store) {
    let q = |user: &str, quota_us: Option<u64>, used_us: u64| UserQuota {
        user: user.into(),
        quota_us,
        used_us,
        max_priority: None,
    };
    assert_eq!(
        store.quotas().unwrap(),
        vec![q("alice", Some(2_500_000), 0), q("bob", None, 0)]
    );
    store.set_quota("bob", Some(0.25)).unwrap();
    store.set_quota("carol", Some(10.0)).unwrap();
    store.set_quota("alice", None).unwrap();
    assert!(matches!(
        store.set_quota("dave", Some(-1.0)),
        Err(StoreError::InvalidQuota { .. })
    ));
    assert!(matches!(
        store.set_quota("dave", Some(f64::NAN)),
        Err(StoreError::InvalidQuota { .. })
    ));
    assert!(matches!(
        store.set_quota("no spaces", Some(1.0)),
        Err(StoreError::InvalidUser { .. })
    ));
    assert!(matches!(
        store.create_token("", Role::Client, None),
        Err(StoreError::InvalidUser { .. })
    ));

    // Usage accumulates, in one transaction with a watermark that never goes down.
    store
        .add_usage(&[("alice".into(), 100), ("bob".into(), 7)], 10)
        .unwrap();
    store
        .add_usage(
            &[
                ("alice".into(), 50),
                ("alice".into(), 1),
                ("erin".into(), 3),
            ],
            5,
        )
        .unwrap();
    assert_eq!(store.watermark().unwrap(), 10);
    store.add_usage(&[], 42).unwrap();
    assert_eq!(store.watermark().unwrap(), 42);
    assert!(matches!(
        store.add_usage(&[("alice".into(), 1)], u64::MAX),
        Err(StoreError::TooLarge { .. })
    ));
    // The failed call wrote nothing.
    assert_eq!(store.watermark().unwrap(), 42);
    assert_eq!(
        store.quotas().unwrap(),
        vec![
            q("alice", None, 151),
            q("bob", Some(250_000), 7),
            q("carol", Some(10_000_000), 0),
            q("erin", None, 3),
        ]
    );
    // Setting a quota keeps the usage.
    store.set_quota("alice", Some(1.0)).unwrap();
    assert_eq!(store.quotas().unwrap()[0], q("alice", Some(1_000_000), 151));

    // Usage saturates: no report can overflow the column (SQLite would turn it into a REAL,
    // PostgreSQL would fail every later flush).
    for _ in 0..3 {
        store
            .add_usage(&[("erin".into(), u64::MAX), ("erin".into(), 1 << 62)], 43)
            .unwrap();
    }
    let erin = store.quotas().unwrap().pop().unwrap();
    assert_eq!(erin, q("erin", None, i64::MAX as u64));
    store.add_usage(&[("bob".into(), 1)], 44).unwrap();
    assert_eq!(store.quotas().unwrap()[1], q("bob", Some(250_000), 8));

    // Priority ceilings: set, kept with the quota, removed.
    store.set_max_priority("bob", Some(3)).unwrap();
    store.set_max_priority("frank", Some(-2)).unwrap();
    let quotas = store.quotas().unwrap();
    let ceiling = |u: &str| quotas.iter().find(|q| q.user == u).unwrap().max_priority;
    assert_eq!(
        (ceiling("bob"), ceiling("frank"), ceiling("alice")),
        (Some(3), Some(-2), None)
    );
    assert_eq!(quotas[1].quota_us, Some(250_000));
    store.set_max_priority("bob", None).unwrap();
    assert_eq!(store.quotas().unwrap()[1].max_priority, None);
    assert!(matches!(
        store.set_max_priority("no spaces", Some(1)),
        Err(StoreError::InvalidUser { .. })
    ));

    // Revoked ids.
    let revoked = store.revoked_ids().unwrap();
    assert_eq!(revoked.len(), 1, "{revoked:?}");
}

/// An id that shares its first 6 chars with `id` but differs after: backends plant a row with
/// it (tokens with a common 6-char prefix would take ~4000 random ones to occur).
pub(crate) fn sibling_id(id: &str) -> String {
    let tail = if &id[6..] == "000000" {
        "111111"
    } else {
        "000000"
    };
    format!("{}{tail}", &id[..6])
}

/// After a backend planted a token row with id `sibling_id(id)`: a 6-char prefix is ambiguous,
/// the full id is not.
pub(crate) fn check_ambiguous(store: &mut dyn Store, id: &str) {
    let err = store.revoke(&id[..6]).unwrap_err();
    let StoreError::AmbiguousId { matches, .. } = &err else {
        panic!("expected an ambiguous id, got {err}");
    };
    let mut expected = vec![id.to_string(), sibling_id(id)];
    expected.sort();
    assert_eq!(matches, &expected);
    assert!(err.to_string().contains("give more characters"), "{err}");
    assert!(store.revoke(id).unwrap().revoked);
}

/// Fail if any of `tokens` (or its random part) appears in `bytes`.
pub(crate) fn raw_token_absent_from(bytes: &[u8], tokens: &[String]) {
    assert!(!tokens.is_empty());
    for token in tokens {
        for needle in [token.as_str(), &token[4..]] {
            assert!(
                !bytes.windows(needle.len()).any(|w| w == needle.as_bytes()),
                "the raw token {token} is stored"
            );
        }
    }
    // And the hashes are there, so the check looked at the right bytes.
    let hash = token_hash(&tokens[0]);
    assert!(
        bytes.windows(hash.len()).any(|w| w == hash.as_bytes()),
        "the token hash is not where the test looked"
    );
}

#[test]
fn open_picks_the_backend_from_the_url() {
    let dir = tempfile::tempdir().unwrap();
    for store in [None, Some("sqlite"), Some("")] {
        open(store, &dir.path().join("data")).unwrap();
        assert!(dir.path().join("data/rtpool.db").exists());
    }
    let file = dir.path().join("other.db");
    let url = format!("sqlite://{}", file.display());
    let (token, _) = open(Some(&url), Path::new("/nonexistent"))
        .unwrap()
        .create_token("u", Role::Client, None)
        .unwrap();
    assert!(open(Some(&url), Path::new("/nonexistent"))
        .unwrap()
        .verify(&token)
        .unwrap()
        .is_some());
    let err = open(Some("mysql://u:pw@h/db"), dir.path()).err().unwrap();
    assert!(matches!(err, StoreError::BadUrl { .. }), "{err}");
    assert!(!err.to_string().contains("pw"), "{err}");
    assert!(err.to_string().contains("postgres://user@host:port/db"));
}

#[test]
fn urls_are_redacted() {
    assert_eq!(
        redact_url("postgres://u:pw@h:5432/db"),
        "postgres://u:***@h:5432/db"
    );
    assert_eq!(redact_url("postgres://u@h/db"), "postgres://u@h/db");
    assert_eq!(redact_url("postgres://h/db?x=y"), "postgres://h/db?x=y");
}

#[test]
fn quota_seconds_become_microseconds() {
    assert_eq!(quota_to_us(None).unwrap(), None);
    assert_eq!(quota_to_us(Some(0.0)).unwrap(), Some(0));
    assert_eq!(quota_to_us(Some(1.5)).unwrap(), Some(1_500_000));
    assert_eq!(quota_to_us(Some(1e-7)).unwrap(), Some(0));
    assert!(quota_to_us(Some(f64::INFINITY)).is_err());
    assert!(quota_to_us(Some(1e13)).is_err());
    assert!(quota_to_us(Some(9.2e12)).is_ok());
}
