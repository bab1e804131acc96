//! [`Group`]: the copies of one task that runs redundantly (BOINC's replication, made
//! deadline-aware): `replicas` copies on distinct workers, copies added after a disagreement, and a
//! straggler's hedge.
//!
//! The package lists one copy, the **primary**, and counts only it; the others are *shadows*
//! (tasks of the same package with `shadow = true`). When the primary's own worker answers
//! without deciding the task, a live shadow is promoted to primary, so the package's counters
//! always describe one live copy. A result is accepted once `quorum` copies returned
//! byte-equal results (status and data); the remaining copies are then cancelled (aborted on
//! their workers).

use bytes::Bytes;
use rtpool_proto::msgpack::Writer;

use crate::event::TaskStatus;
use crate::ids::{TaskId, WorkerId};

/// One copy's answer.
#[derive(Debug, Clone)]
pub(crate) struct Vote {
    pub(crate) worker: WorkerId,
    pub(crate) status: TaskStatus,
    pub(crate) data: Bytes,
}

/// The copies of one task.
#[derive(Debug)]
pub(crate) struct Group {
    /// Slab key of the package.
    pub(crate) package: u64,
    /// The task's index in the package.
    pub(crate) index: u32,
    /// Live copies (queued or running), the primary among them.
    pub(crate) copies: Vec<TaskId>,
    /// Copies started so far (live and answered).
    pub(crate) started: u8,
    /// Answers so far, in arrival order.
    pub(crate) votes: Vec<Vote>,
    /// A hedge copy was started.
    pub(crate) hedged: bool,
}

impl Group {
    /// A group of one copy (more are added with [`Group::copies`]).
    pub(crate) fn new(package: u64, index: u32, first: TaskId) -> Self {
        Self {
            package,
            index,
            copies: vec![first],
            started: 1,
            votes: Vec::new(),
            hedged: false,
        }
    }

    /// How many answers agree with `vote` (itself included if recorded).
    pub(crate) fn agreeing(&self, status: TaskStatus, data: &Bytes) -> usize {
        self.votes
            .iter()
            .filter(|v| v.status == status && v.data == *data)
            .count()
    }

    /// The size of the largest set of agreeing answers.
    pub(crate) fn best_agreement(&self) -> usize {
        self.votes
            .iter()
            .map(|v| self.agreeing(v.status, &v.data))
            .max()
            .unwrap_or(0)
    }

    /// The message of a task whose copies never agreed: msgpack `[message, [[worker, status,
    /// data], ...]]`.
    pub(crate) fn disagreement(&self, quorum: u8) -> Bytes {
        let message = format!(
            "no quorum: {} copies answered and no {quorum} of them returned the same result; \
             every answer is attached",
            self.votes.len()
        );
        let mut buf = Vec::new();
        let w = &mut Writer(&mut buf);
        w.array(2);
        w.str(&message);
        w.array(self.votes.len());
        for v in &self.votes {
            w.array(3);
            w.str(&v.worker.to_string());
            w.uint(v.status as u8);
            w.bin(&v.data);
        }
        Bytes::from(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agreement_counts_byte_equal_answers() {
        let mut g = Group::new(0, 0, TaskId(1));
        let vote = |w: u64, s: TaskStatus, d: &'static [u8]| Vote {
            worker: WorkerId(w),
            status: s,
            data: Bytes::from_static(d),
        };
        g.votes.push(vote(1, TaskStatus::Ok, b"42"));
        g.votes.push(vote(2, TaskStatus::Ok, b"41"));
        g.votes.push(vote(3, TaskStatus::Error, b"42"));
        assert_eq!(g.best_agreement(), 1);
        g.votes.push(vote(4, TaskStatus::Ok, b"42"));
        assert_eq!(g.agreeing(TaskStatus::Ok, &Bytes::from_static(b"42")), 2);
        assert_eq!(g.best_agreement(), 2);
        let data = g.disagreement(3);
        // [message, [[worker, status, data] x4]]
        assert_eq!(data[0], 0x92);
        assert!(data.windows(9).any(|w| w == b"no quorum"));
    }
}
