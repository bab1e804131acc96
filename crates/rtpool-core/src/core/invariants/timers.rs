//! The timer table's invariants: every armed timer names what it times, and everything timed
//! is armed.

use crate::core::Core;
use crate::core::Timer;
use crate::task::TaskState;

impl Core {
    /// Every armed timer names a running attempt with that deadline or a detached package with
    /// that expiry, and every deadline and expiry is armed.
    pub(super) fn check_timers(&self) {
        let mut armed = 0;
        for &(at, timer) in self.timers.keys() {
            match timer {
                Timer::TimeLimit(id, attempt) => {
                    let task = self
                        .tasks
                        .get(id.0)
                        .unwrap_or_else(|| panic!("timer of freed {id}"));
                    assert!(
                        matches!(task.state, TaskState::Running { .. }),
                        "timer of {id}, which is {:?}",
                        task.state
                    );
                    assert_eq!(task.attempt, attempt, "timer of an old attempt of {id}");
                    assert_eq!(
                        task.time_limit_at,
                        Some(at),
                        "{id}'s time limit is not its timer"
                    );
                }
                Timer::Class(slot) => {
                    let c = self.classes.get(slot).expect("timer of a forgotten class");
                    assert_eq!(
                        c.orphan_at,
                        Some(at),
                        "class {}'s grace is not its timer",
                        c.describe()
                    );
                }
                Timer::ResultTtl(slot) => {
                    let p = self.packages.get(slot).expect("timer of a freed package");
                    assert!(p.client.is_none(), "{} is attached but has a TTL", p.id);
                    assert_eq!(p.expires, Some(at), "{}'s expiry is not its timer", p.id);
                }
                Timer::Deadline(slot) => {
                    let p = self
                        .packages
                        .get(slot)
                        .expect("deadline of a freed package");
                    assert!(p.deadline_armed, "{}'s deadline timer is not marked", p.id);
                    assert_eq!(p.deadline, Some(at), "{}'s deadline is not its timer", p.id);
                }
                Timer::Hedge(id, attempt) => {
                    let task = self
                        .tasks
                        .get(id.0)
                        .unwrap_or_else(|| panic!("hedge timer of freed {id}"));
                    assert!(
                        matches!(task.state, TaskState::Running { .. }),
                        "hedge timer of {id}, which is {:?}",
                        task.state
                    );
                    assert_eq!(
                        task.attempt, attempt,
                        "hedge timer of an old attempt of {id}"
                    );
                    assert_eq!(task.hedge_at, Some(at), "{id}'s hedge_at is not its timer");
                }
                Timer::Calls(service, class) => {
                    let cc = self
                        .services
                        .get(service)
                        .and_then(|s| s.classes.get(&class))
                        .unwrap_or_else(|| panic!("grace timer of freed calls {service}/{class}"));
                    assert_eq!(cc.orphan_at, Some(at), "calls {service}/{class}'s grace");
                }
                Timer::Service(slot) => {
                    let s = self
                        .services
                        .get(slot)
                        .unwrap_or_else(|| panic!("grace timer of freed service {slot}"));
                    assert_eq!(
                        s.orphan_at,
                        Some(at),
                        "{}'s orphan_at is not its timer",
                        s.name
                    );
                }
            }
            armed += 1;
        }
        let hedges = self
            .tasks
            .iter()
            .filter(|(_, t)| t.hedge_at.is_some())
            .count();
        let drops = self
            .packages
            .iter()
            .filter(|(_, p)| p.deadline_armed)
            .count();
        let deadlines = self
            .tasks
            .iter()
            .filter(|(_, t)| t.time_limit_at.is_some())
            .count();
        let expiries = self
            .packages
            .iter()
            .filter(|(_, p)| p.expires.is_some())
            .count();
        let orphans = self
            .services
            .iter()
            .filter(|(_, s)| s.orphan_at.is_some())
            .count()
            + self
                .classes
                .iter()
                .filter(|(_, c)| c.orphan_at.is_some())
                .count()
            + self
                .services
                .iter()
                .flat_map(|(_, s)| s.classes.values())
                .filter(|cc| cc.orphan_at.is_some())
                .count();
        assert_eq!(
            armed,
            deadlines + expiries + hedges + drops + orphans,
            "timers and deadlines disagree"
        );
    }
}
