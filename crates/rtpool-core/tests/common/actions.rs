//! Reading a step's actions: which tasks went where, which results, frees, aborts and drops
//! came out, as plain values a test compares.

use bytes::Bytes;
use rtpool_core::{
    Action, AssignCall, AssignTask, PackageId, TaskId, TaskOutcome, TaskStatus, WorkerId,
};

/// The tasks of every `Assign`, per worker, in action order.
pub fn assignments(actions: &[Action]) -> Vec<(WorkerId, Vec<AssignTask>)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Assign { worker, tasks } => Some((*worker, tasks.clone())),
            _ => None,
        })
        .collect()
}

/// The ids of the tasks assigned to `worker` by these actions.
pub fn tasks_of(actions: &[Action], worker: WorkerId) -> Vec<TaskId> {
    assignments(actions)
        .into_iter()
        .filter(|(w, _)| *w == worker)
        .flat_map(|(_, tasks)| tasks.into_iter().map(|t| t.task))
        .collect()
}

/// Every assigned task id, in action order.
pub fn all_assigned(actions: &[Action]) -> Vec<TaskId> {
    assignments(actions)
        .into_iter()
        .flat_map(|(_, ts)| ts.into_iter().map(|t| t.task))
        .collect()
}

/// The results of every `SendResults` (new results, whether a client is attached or not), as
/// `(package, outcomes)`.
pub fn results(actions: &[Action]) -> Vec<(PackageId, Vec<TaskOutcome>)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::SendResults {
                package, results, ..
            } => Some((*package, results.clone())),
            _ => None,
        })
        .collect()
}

/// The indices of every delivered result, in order.
pub fn result_indices(actions: &[Action]) -> Vec<u32> {
    results(actions)
        .into_iter()
        .flat_map(|(_, rs)| rs.into_iter().map(|r| r.index))
        .collect()
}

/// Every `(package, expired)` freed by these actions, in order.
pub fn freed(actions: &[Action]) -> Vec<(PackageId, bool)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::PackageFreed {
                package, expired, ..
            } => Some((*package, *expired)),
            _ => None,
        })
        .collect()
}

/// Every `(worker, task, attempt)` of the `Abort` actions, in order.
pub fn aborts(actions: &[Action]) -> Vec<(WorkerId, TaskId, u32)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Abort { worker, tasks } => Some(tasks.iter().map(|&(t, at)| (*worker, t, at))),
            _ => None,
        })
        .flatten()
        .collect()
}

/// Every `(worker, keys)` of the `DropKept` actions, in order.
pub fn drops(actions: &[Action]) -> Vec<(WorkerId, Vec<Bytes>)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::DropKept { worker, keys } => Some((*worker, keys.clone())),
            _ => None,
        })
        .collect()
}

/// The indices of every `Resend`, in order.
pub fn resent_indices(actions: &[Action]) -> Vec<u32> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Resend { results, .. } => Some(results.iter().map(|r| r.index)),
            _ => None,
        })
        .flatten()
        .collect()
}

/// Every result of every `SendResults`, as `(index, status, UTF-8 data)`.
pub fn outcomes(actions: &[Action]) -> Vec<(u32, TaskStatus, String)> {
    results(actions)
        .into_iter()
        .flat_map(|(_, rs)| rs)
        .map(|r| {
            (
                r.index,
                r.status,
                String::from_utf8_lossy(&r.data).into_owned(),
            )
        })
        .collect()
}

/// The calls assigned, per worker.
pub fn call_assignments(actions: &[Action]) -> Vec<(WorkerId, Vec<AssignCall>)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::AssignCalls { worker, calls } => Some((*worker, calls.clone())),
            _ => None,
        })
        .collect()
}

/// The calls assigned to `worker`.
pub fn calls_of(actions: &[Action], worker: WorkerId) -> Vec<TaskId> {
    call_assignments(actions)
        .into_iter()
        .filter(|(w, _)| *w == worker)
        .flat_map(|(_, calls)| calls.into_iter().map(|c| c.task))
        .collect()
}
