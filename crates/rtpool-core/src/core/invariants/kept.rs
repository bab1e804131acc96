//! The kept calls' invariants (lineage): each record's value, readers and sources agree with
//! the tasks and packages they name.

use std::collections::HashMap;

use crate::core::lineage::distinct_sources;
use crate::core::Core;
use crate::ids::TaskId;

impl Core {
    /// Records of kept transaction intermediates (`lineage.rs`): each is needed (read, waited
    /// for by a copy, or its recipe held); its counts match the calls, copies and records
    /// that name it; its copy and its worker name it back.
    pub(super) fn check_kept_calls(&self) {
        let mut readers: HashMap<u64, u32> = HashMap::new();
        let mut copies: HashMap<u64, Vec<TaskId>> = HashMap::new();
        for (key, task) in self.tasks.iter() {
            let Some(call) = &task.call else { continue };
            for s in distinct_sources(&call.sources) {
                if task.shadow {
                    copies.entry(s).or_default().push(TaskId(key));
                } else {
                    *readers.entry(s).or_default() += 1;
                }
            }
        }
        let mut recipe_refs: HashMap<u64, u32> = HashMap::new();
        for (_, r) in self.kept_calls.iter() {
            for s in distinct_sources(&r.sources) {
                *recipe_refs.entry(s).or_default() += 1;
            }
        }
        for (id, r) in self.kept_calls.iter() {
            assert!(
                r.readers > 0 || !r.remake_readers.is_empty() || r.recipe_refs > 0,
                "kept record {id} is needed by nothing but was not freed"
            );
            assert_eq!(
                r.readers,
                readers.get(&id).copied().unwrap_or(0),
                "readers of kept record {id}"
            );
            assert_eq!(
                r.recipe_refs,
                recipe_refs.get(&id).copied().unwrap_or(0),
                "recipe refs of kept record {id}"
            );
            let mut listed = r.remake_readers.clone();
            listed.sort_unstable();
            let mut found = copies.get(&id).cloned().unwrap_or_default();
            found.sort_unstable();
            assert_eq!(listed, found, "copies reading kept record {id}");
            if let Some(copy) = r.remake {
                let t = self
                    .tasks
                    .get(copy.0)
                    .unwrap_or_else(|| panic!("kept record {id}'s copy {copy} is freed"));
                assert!(
                    t.shadow && t.call.as_ref().is_some_and(|c| c.remakes == id),
                    "{copy} does not make kept record {id}"
                );
                assert!(
                    r.worker.is_none(),
                    "kept record {id} is kept and made again"
                );
            }
            if let Some(w) = r.worker.and_then(|w| self.workers.get(&w)) {
                assert!(
                    w.kept_calls.contains(&id),
                    "the worker of kept record {id} does not list it"
                );
            }
        }
        for (wid, w) in self.workers.iter() {
            for id in w.kept_calls.iter() {
                let r = self
                    .kept_calls
                    .get(*id)
                    .unwrap_or_else(|| panic!("{wid} lists freed kept record {id}"));
                assert_eq!(
                    r.worker,
                    Some(*wid),
                    "{wid} lists kept record {id} of another worker"
                );
            }
        }
    }
}
