//! [`FunctionTable`]: one copy of each function's code, shared by the packages that use it.
//!
//! The shell verifies a hash the first time it sees it; here a hash maps to its code and to the
//! number of live packages using it. The code is dropped when the last of them is freed.

use bytes::Bytes;

use crate::ids::FnHash;
use crate::table::Map;

/// One function: its code and how many live packages use it (always at least 1).
#[derive(Debug)]
pub(crate) struct Function {
    pub(crate) code: Bytes,
    pub(crate) refs: u32,
}

/// Function code by hash, reference-counted by live packages.
#[derive(Debug, Default)]
pub(crate) struct FunctionTable {
    by_hash: Map<FnHash, Function>,
}

impl FunctionTable {
    /// Functions held.
    pub(crate) fn len(&self) -> usize {
        self.by_hash.len()
    }

    /// The code of `hash`, if a live package uses it.
    pub(crate) fn code(&self, hash: &FnHash) -> Option<&Bytes> {
        self.by_hash.get(hash).map(|f| &f.code)
    }

    /// One more package uses `hash`. The first one stores `code`; later ones keep the stored
    /// copy (the shell has checked that both hash to `hash`).
    pub(crate) fn acquire(&mut self, hash: FnHash, code: Bytes) {
        self.by_hash
            .entry(hash)
            .or_insert(Function { code, refs: 0 })
            .refs += 1;
    }

    /// One package using `hash` was freed; the code goes with the last one.
    ///
    /// # Panics
    ///
    /// If `hash` is not held: the core released more than it acquired.
    pub(crate) fn release(&mut self, hash: &FnHash) {
        let f = self
            .by_hash
            .get_mut(hash)
            .unwrap_or_else(|| panic!("release of unknown function {hash:?}"));
        f.refs -= 1;
        if f.refs == 0 {
            self.by_hash.remove(hash);
        }
    }

    /// Every `(hash, function)`. For invariant checks.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&FnHash, &Function)> {
        self.by_hash.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_lives_while_referenced() {
        let mut fns = FunctionTable::default();
        let h = FnHash([1; 32]);
        fns.acquire(h, Bytes::from_static(b"first"));
        fns.acquire(h, Bytes::from_static(b"second"));
        assert_eq!(fns.len(), 1);
        assert_eq!(
            fns.code(&h).unwrap().as_ref(),
            b"first",
            "the first copy is kept"
        );
        fns.release(&h);
        assert!(fns.code(&h).is_some());
        fns.release(&h);
        assert!(fns.code(&h).is_none());
        assert_eq!(fns.len(), 0);
    }

    #[test]
    #[should_panic(expected = "release of unknown function")]
    fn release_of_unknown_hash_panics() {
        FunctionTable::default().release(&FnHash([0; 32]));
    }
}
