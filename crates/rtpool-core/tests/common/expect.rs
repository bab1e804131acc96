//! Assertions on a step's actions that several scenario files make: the one rejection, the one
//! result, messages that must name things. Each panics with the actions it looked at.

use rtpool_core::{Action, PackageId, RejectReason, TaskStatus};

use super::outcomes;

/// An `Ok` result of task `index` carrying `data`, as [`outcomes`] lists it.
pub fn ok(index: u32, data: &str) -> (u32, TaskStatus, String) {
    (index, TaskStatus::Ok, data.to_owned())
}

/// Why the submission in these actions was rejected.
///
/// # Panics
///
/// If no action is a `Rejected`.
pub fn rejection(actions: &[Action]) -> RejectReason {
    actions
        .iter()
        .find_map(|a| match a {
            Action::Rejected { reason, .. } => Some(reason.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("not rejected: {actions:?}"))
}

/// The actions are exactly one `Rejected`: its reason.
///
/// # Panics
///
/// If they are anything else.
pub fn only_rejection(actions: &[Action]) -> RejectReason {
    match actions {
        [Action::Rejected { reason, .. }] => reason.clone(),
        other => panic!("expected one rejection alone, got {other:?}"),
    }
}

/// The one result these actions deliver, as `(index, status, UTF-8 data)`.
///
/// # Panics
///
/// If they deliver none or more than one, saying `expected` and the actions.
pub fn only_outcome(actions: &[Action], expected: &str) -> (u32, TaskStatus, String) {
    match &outcomes(actions)[..] {
        [one] => one.clone(),
        other => panic!("{expected}: got {other:?} from {actions:?}"),
    }
}

/// `text` contains every one of `needles`.
///
/// # Panics
///
/// Naming the first needle missing, and the text.
pub fn assert_mentions(text: &str, needles: &[&str]) {
    for needle in needles {
        assert!(text.contains(needle), "{needle:?} missing from {text:?}");
    }
}

/// The last of these actions frees `package`, journaled and not expired: it ended with its
/// last result acknowledged.
///
/// # Panics
///
/// If the last action is anything else.
pub fn assert_freed_last(actions: &[Action], package: PackageId) {
    assert_eq!(
        actions.last(),
        Some(&Action::PackageFreed {
            journaled: true,
            package,
            expired: false
        }),
        "{actions:?}"
    );
}
