//! Giving freed memory back to the operating system (issue 29).
//!
//! glibc keeps the pages of freed heap chunks, and after a large chunk is freed it raises its
//! mmap threshold (up to 32 MiB), so later large payloads come from the heap too: a master that
//! held 200 MiB of unacknowledged results (400 of 512 KiB, `benches/mem_release.py`) went from
//! 19 MB to 330-380 MB and stayed at 26-73 MB after they were freed, 7 MB of it in the top
//! of a thread's arena, which `malloc_trim(0)` does not return. Two measures, both for glibc
//! only and both skipped when the master's memory is locked (real-time mode, `mlockall`:
//! re-faulting pages, or locking a new mapping per payload, would cost the hot path):
//!
//! - [`configure`], in a master that is a process of its own ([`own_the_process`]), fixes the mmap threshold at [`MMAP_THRESHOLD_BYTES`] (glibc's own start
//!   value, which it then stops moving): a payload, frame or buffer that large gets a mapping
//!   of its own, unmapped when freed; and the trim threshold at [`TRIM_THRESHOLD_BYTES`], so
//!   a thread arena gives back its free top (`MALLOC_MMAP_THRESHOLD_` in the environment
//!   leaves both to glibc). The cost: a 1 MiB payload is mapped and faulted in afresh each
//!   time (its echo 1.32x slower in `benches/ab_noop.py`, docs/reliability.md);
//! - [`run`], once a second, asks the allocator how many bytes its arenas hold free
//!   (`mallinfo2().fordblks`) and, when at least [`TRIM_MIN_BYTES`] more became free since the
//!   lowest count seen after the last trim, returns the free pages with `malloc_trim(0)`, on
//!   a blocking thread, never on the scheduler's.
//!
//! jemalloc (with a background thread and 1 s decay) and mimalloc were measured against
//! this in `docs/reliability.md` ("Memory back to the OS").

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tracing::debug;

/// How often the allocator's free bytes are read.
pub const TRIM_EVERY: Duration = Duration::from_secs(1);

/// Bytes that must have become free since the last trim (its low point) before the next one.
pub const TRIM_MIN_BYTES: u64 = 16 << 20;

/// Allocations from this size up get a mapping of their own (see the module's doc).
pub const MMAP_THRESHOLD_BYTES: usize = 128 << 10;

/// Free room at the top of an arena past which `free` gives it back. glibc raises it to twice
/// every mapped chunk freed (up to 64 MiB) and, unlike the main arena's, a thread arena's top
/// is given back by nothing else: fixed here with the mmap threshold.
pub const TRIM_THRESHOLD_BYTES: usize = 1 << 20;

/// Set by [`own_the_process`]: the master is the process (the `rtpool-master` binary,
/// `rtpool master`), not a library inside someone else's (`LocalCluster`, `rtpool.Master`).
static OWNS_PROCESS: AtomicBool = AtomicBool::new(false);

/// Says that the master runs as a process of its own, so [`configure`] may set the allocator's
/// process-wide thresholds. An embedded master leaves its host's allocator alone (a library
/// must not make its host's 1 MiB allocations slower); it still trims.
pub fn own_the_process() {
    OWNS_PROCESS.store(true, Ordering::Relaxed);
}

/// Fixes glibc's mmap threshold at [`MMAP_THRESHOLD_BYTES`] and its trim threshold at
/// [`TRIM_THRESHOLD_BYTES`] for the whole process, unless the master is embedded in another
/// program, the environment sets the first, or the memory is locked. Returns whether it did.
pub fn configure() -> bool {
    if !OWNS_PROCESS.load(Ordering::Relaxed)
        || std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_some()
        || sys::memory_locked()
    {
        return false;
    }
    sys::set_thresholds(MMAP_THRESHOLD_BYTES, TRIM_THRESHOLD_BYTES)
}

/// [`configure`]s the allocator, then runs [`Trimmer::tick`] every [`TRIM_EVERY`] until the
/// task is aborted.
pub async fn run() {
    if configure() {
        debug!("allocations of {MMAP_THRESHOLD_BYTES} bytes and more are mapped on their own");
    }
    let mut tick = tokio::time::interval(TRIM_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut trimmer = Trimmer::default();
    loop {
        tick.tick().await;
        match tokio::task::spawn_blocking(move || {
            let mut t = trimmer;
            let trimmed = t.tick();
            (t, trimmed)
        })
        .await
        {
            Ok((t, trimmed)) => {
                trimmer = t;
                if let Some((before, after)) = trimmed {
                    debug!("returned free heap pages: resident {before} -> {after} KiB");
                }
            }
            Err(_) => return,
        }
    }
}

/// The trim decision: the low point of the allocator's free bytes since the last trim.
#[derive(Clone, Copy, Debug, Default)]
pub struct Trimmer {
    low: Option<u64>,
}

impl Trimmer {
    /// Reads the free bytes; trims when [`TRIM_MIN_BYTES`] more are free than at the low
    /// point. Returns the resident KiB before and after a trim it made.
    pub fn tick(&mut self) -> Option<(u64, u64)> {
        let free = sys::free_bytes()?;
        if !self.should_trim(free) || sys::memory_locked() {
            return None;
        }
        let before = sys::resident_kib();
        sys::trim();
        Some((before, sys::resident_kib()))
    }

    /// Whether `free` bytes held free call for a trim (and, if so, the low point restarts).
    pub fn should_trim(&mut self, free: u64) -> bool {
        let low = self.low.map_or(free, |l| l.min(free));
        if free - low >= TRIM_MIN_BYTES {
            self.low = Some(free);
            true
        } else {
            self.low = Some(low);
            false
        }
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
mod sys {
    use std::sync::OnceLock;

    type MallInfo2 = unsafe extern "C" fn() -> libc::mallinfo2;

    /// glibc's `mallinfo2` (2.33+), looked up at run time: linking it would keep the module
    /// from loading on an older glibc (RHEL 8 has 2.28), where the master then never trims.
    fn mallinfo2() -> Option<MallInfo2> {
        static FOUND: OnceLock<Option<MallInfo2>> = OnceLock::new();
        *FOUND.get_or_init(|| {
            // SAFETY: dlsym with glibc's RTLD_DEFAULT (a null handle) and a NUL-terminated
            // name only looks the symbol up.
            let sym = unsafe { libc::dlsym(std::ptr::null_mut(), c"mallinfo2".as_ptr()) };
            // SAFETY: a non-null `mallinfo2` is glibc's, of this signature.
            (!sym.is_null())
                .then(|| unsafe { std::mem::transmute::<*mut libc::c_void, MallInfo2>(sym) })
        })
    }

    /// Bytes in free chunks of every arena (`mallinfo2`), `None` without it.
    pub fn free_bytes() -> Option<u64> {
        let mallinfo2 = mallinfo2()?;
        // SAFETY: mallinfo2 takes no arguments and returns a plain struct by value.
        let info = unsafe { mallinfo2() };
        Some(info.fordblks as u64)
    }

    /// `mallopt(M_MMAP_THRESHOLD, mmap)` and `mallopt(M_TRIM_THRESHOLD, trim)`: both fixed
    /// from then on.
    pub fn set_thresholds(mmap: usize, trim: usize) -> bool {
        let (Ok(mmap), Ok(trim)) = (libc::c_int::try_from(mmap), libc::c_int::try_from(trim))
        else {
            return false;
        };
        // SAFETY: mallopt only sets allocator parameters.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, mmap) == 1
                && libc::mallopt(libc::M_TRIM_THRESHOLD, trim) == 1
        }
    }

    /// Returns the free pages of every arena to the OS.
    pub fn trim() {
        // SAFETY: malloc_trim(0) only releases memory the allocator holds free.
        unsafe {
            libc::malloc_trim(0);
        }
    }

    fn status_kib(field: &str) -> u64 {
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with(field))
                    .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
            })
            .unwrap_or(0)
    }

    pub fn resident_kib() -> u64 {
        status_kib("VmRSS:")
    }

    pub fn memory_locked() -> bool {
        status_kib("VmLck:") > 0
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
mod sys {
    pub fn free_bytes() -> Option<u64> {
        None
    }
    pub fn trim() {}
    pub fn set_thresholds(_mmap: usize, _trim: usize) -> bool {
        false
    }
    pub fn resident_kib() -> u64 {
        0
    }
    pub fn memory_locked() -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trims_only_after_enough_became_free_since_the_low_point() {
        let mut t = Trimmer::default();
        assert!(!t.should_trim(40 << 20)); // the first reading is the low point
        assert!(!t.should_trim(50 << 20));
        assert!(t.should_trim(56 << 20)); // 16 MiB above the low point of 40
        assert!(!t.should_trim(56 << 20)); // the pages are returned; still free, no new trim
        assert!(!t.should_trim(8 << 20)); // reused: a new low point
        assert!(t.should_trim(30 << 20)); // and 22 MiB freed again
    }

    #[test]
    fn glibc_takes_the_fixed_thresholds() {
        // Setting them twice is harmless; other tests of this binary only allocate.
        own_the_process();
        let want = cfg!(all(target_os = "linux", target_env = "gnu"))
            && std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_none()
            && !sys::memory_locked();
        assert_eq!(configure(), want);
    }

    #[test]
    fn this_allocator_reports_its_free_bytes() {
        // The trim itself is shown end to end by tests/test_memory_release.py (a real master's
        // resident size); other tests of this binary allocate in parallel, so none here.
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        assert!(sys::free_bytes().is_some());
        let mut t = Trimmer::default();
        assert!(
            t.tick().is_none(),
            "the first reading only sets the low point"
        );
        assert!(t.low.is_some() || cfg!(not(all(target_os = "linux", target_env = "gnu"))));
    }
}
