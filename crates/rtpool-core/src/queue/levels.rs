//! [`Levels`]: the ready queue's priority classes, highest first, the highest held in front of
//! a `BTreeMap` of the others.
//!
//! Most queues hold one priority, and a resource class's queue is one of up to 256: its
//! priority class in a map of its own was a heap node apart from the queue (cold in cache
//! when a lost worker's 16 tasks go back to 16 classes' queues, issue 26). Held in front, the
//! highest is read and written where the queue itself is, in O(1); the others stay in the map,
//! O(log classes), as before.

use std::cmp::Reverse;
use std::collections::BTreeMap;

use super::Class;

/// Priority classes by `Reverse(priority)` (the highest first).
#[derive(Debug, Default)]
pub(super) struct Levels {
    /// A class above every class of `rest`, held outside it (`None`: the highest is in
    /// `rest`, or there is none).
    top: Option<(Reverse<i32>, Class)>,
    rest: BTreeMap<Reverse<i32>, Class>,
}

impl Levels {
    #[cfg(test)]
    pub(super) fn is_empty(&self) -> bool {
        self.top.is_none() && self.rest.is_empty()
    }

    /// The highest class's key.
    pub(super) fn first_key(&self) -> Option<Reverse<i32>> {
        match &self.top {
            Some((k, _)) => Some(*k),
            None => self.rest.first_key_value().map(|(k, _)| *k),
        }
    }

    /// The highest class.
    pub(super) fn first_mut(&mut self) -> Option<&mut Class> {
        match &mut self.top {
            Some((_, c)) => Some(c),
            None => self.rest.values_mut().next(),
        }
    }

    /// Forgets the highest class.
    pub(super) fn remove_first(&mut self) {
        if self.top.take().is_none() {
            self.rest.pop_first();
        }
    }

    pub(super) fn get_mut(&mut self, key: Reverse<i32>) -> Option<&mut Class> {
        match &mut self.top {
            Some((k, c)) if *k == key => Some(c),
            _ => self.rest.get_mut(&key),
        }
    }

    /// The class of `key`, made empty if it has none.
    pub(super) fn entry(&mut self, key: Reverse<i32>) -> &mut Class {
        let in_front = match &self.top {
            Some((k, _)) => key <= *k,
            None => self.rest.first_key_value().is_none_or(|(k, _)| key < *k),
        };
        if !in_front {
            return self.rest.entry(key).or_default();
        }
        if self.top.as_ref().is_some_and(|(k, _)| key < *k) {
            // A higher class takes the front; the old one is the highest of the rest now.
            let (k, c) = self.top.take().expect("checked");
            self.rest.insert(k, c);
        }
        &mut self.top.get_or_insert_with(|| (key, Class::default())).1
    }

    /// Every class, highest first.
    pub(super) fn iter(&self) -> impl Iterator<Item = (&Reverse<i32>, &Class)> {
        self.top.iter().map(|(k, c)| (k, c)).chain(self.rest.iter())
    }

    /// The classes of `Reverse(priority)` up to `to` (priority `to.0` or higher), highest first.
    pub(super) fn up_to(&self, to: Reverse<i32>) -> impl Iterator<Item = &Class> {
        let top = self
            .top
            .iter()
            .filter(move |(k, _)| *k <= to)
            .map(|(_, c)| c);
        top.chain(self.rest.range(..=to).map(|(_, c)| c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(l: &Levels) -> Vec<i32> {
        l.iter().map(|(k, _)| k.0).collect()
    }

    #[test]
    fn the_highest_is_held_in_front_and_order_is_kept() {
        let mut l = Levels::default();
        l.entry(Reverse(0)).work_us = 1;
        assert!(l.rest.is_empty(), "the only class is held in front");
        l.entry(Reverse(-5)).work_us = 2;
        l.entry(Reverse(7)).work_us = 3;
        assert_eq!(keys(&l), vec![7, 0, -5]);
        assert_eq!(l.first_key(), Some(Reverse(7)));
        assert_eq!(l.top.as_ref().map(|(k, _)| k.0), Some(7));
        assert_eq!(l.get_mut(Reverse(0)).map(|c| c.work_us), Some(1));
        assert_eq!(l.up_to(Reverse(0)).map(|c| c.work_us).sum::<u64>(), 4);
        l.remove_first();
        assert_eq!(l.first_key(), Some(Reverse(0)));
        assert_eq!(l.first_mut().map(|c| c.work_us), Some(1));
        // With nothing in front, a class below the highest goes to the map, one above to the
        // front.
        l.entry(Reverse(-1));
        assert!(l.top.is_none());
        l.entry(Reverse(3)).work_us = 4;
        assert_eq!(keys(&l), vec![3, 0, -1, -5]);
        for _ in 0..4 {
            l.remove_first();
        }
        assert!(l.is_empty());
        assert_eq!(l.first_key(), None);
    }
}
