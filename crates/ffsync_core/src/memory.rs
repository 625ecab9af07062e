//! How the process allocator behaves under a sync's allocation pattern.
//!
//! A session allocates many short-lived buffers of 64 KiB–4 MiB (frames, chunk batches,
//! zstd windows, reconstruction buffers) from several threads. glibc's defaults fit that
//! badly: after the first large free it raises its mmap threshold (up to 32 MiB), so later
//! large buffers come from heap arenas and their memory is never handed back, and each
//! thread may get its own 64 MiB arena. On the artifact release tree that is 15–25 MiB of
//! peak RSS per peer for nothing (decisions §51).

/// Fix glibc's mmap threshold at 128 KiB (large buffers are mapped and returned on free),
/// trim the heap top past 128 KiB, and cap arenas at one per core (at least 2). Leaves alone
/// any of these the user set through glibc's `MALLOC_*_` environment variables. Other
/// platforms and C libraries: nothing to do.
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let unset = |name: &str| std::env::var_os(name).is_none();
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2)
            .max(2);
        // SAFETY: mallopt only changes allocator tunables; it is called at module load.
        unsafe {
            if unset("MALLOC_MMAP_THRESHOLD_") {
                libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
            }
            if unset("MALLOC_TRIM_THRESHOLD_") {
                libc::mallopt(libc::M_TRIM_THRESHOLD, 128 * 1024);
            }
            if unset("MALLOC_ARENA_MAX") {
                libc::mallopt(libc::M_ARENA_MAX, cores.min(i32::MAX as usize) as i32);
            }
        }
    }
}
