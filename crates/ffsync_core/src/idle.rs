//! Idle lists: values whose memory is worth keeping between uses (zstd contexts, batch
//! buffers). Fresh memory of that size is anonymous pages the kernel zeroes, maps and later
//! unmaps again, one page fault per 4 KiB; a value given back is taken by the next user
//! instead (decisions §67, §68). Each list keeps at most `cap` values, so a process holds no
//! more than it used at once.

use std::sync::Mutex;

/// A value that can go back to its freshly created state.
pub trait Recyclable {
    fn create() -> Self;
    /// Make the value as good as new for its next user; false: drop it instead.
    fn reset_for_reuse(&mut self) -> bool;
}

/// A batch buffer: its old bytes are overwritten by the next encode
/// (`CompressPolicy::encode_batch_into`), so it is kept as it is.
impl Recyclable for Vec<u8> {
    fn create() -> Self {
        Vec::new()
    }
    fn reset_for_reuse(&mut self) -> bool {
        true
    }
}

pub struct Idle<T> {
    values: Mutex<Vec<T>>,
    cap: usize,
}

impl<T: Recyclable> Idle<T> {
    pub const fn new(cap: usize) -> Self {
        Idle {
            values: Mutex::new(Vec::new()),
            cap,
        }
    }

    /// A value given back earlier, or a new one.
    pub fn take(&self) -> T {
        let idle = self.values.lock().unwrap_or_else(|e| e.into_inner()).pop();
        idle.unwrap_or_else(T::create)
    }

    /// Keep `v` for the next `take` (reset first; one that does not reset is dropped).
    pub fn give(&self, mut v: T) {
        if !v.reset_for_reuse() {
            return;
        }
        let mut idle = self.values.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < self.cap {
            idle.push(v);
        }
    }

    /// How many are kept now.
    pub fn kept(&self) -> usize {
        self.values.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}
