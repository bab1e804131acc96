//! Elsewhere: real-time mode is refused as a whole, with one warning.

pub fn supported() -> Result<(), String> {
    Err("real-time mode (--realtime) is only supported on Linux; running in normal mode".into())
}

pub struct MemoryLock(());

impl MemoryLock {
    pub fn acquire(_whose: &str) -> Result<Self, String> {
        supported().map(|()| Self(()))
    }
}

pub fn set_fifo(_priority: u8) -> Result<(), String> {
    supported()
}

pub fn usable_cpus(_asked: &[usize]) -> (Vec<usize>, Option<String>) {
    (Vec::new(), supported().err())
}

pub fn pin(_cpus: &[usize]) -> Result<(), String> {
    supported()
}
