//! Work nobody waits for yet runs where it cannot slow down work somebody does wait for.
//!
//! A sender hashes the files its plan will probably need while the handshakes and the
//! receiver's manifest cross the network, and a receiver hashes its deltas' old versions
//! before their conversations ask (decisions §95). That work is a guess made with idle cores:
//! it must never take a core from the session's own work (the TLS handshake, triage, a
//! conversation's hashing and writing), least of all on a peer with one or two cores. So it
//! runs on a pool of its own whose threads the OS schedules only when a core would otherwise be
//! idle: `SCHED_IDLE` on Linux (and the idle I/O class for their reads), the background QoS
//! class on Apple's systems (which throttles their I/O too), the idle thread priority on
//! Windows. A thread lowered this way cannot be raised again without privileges (Linux treats
//! leaving `SCHED_IDLE` like lowering a nice value), which is why this is a pool of its own and
//! never libuv's or rayon's global one. Its work: a sender's files while the session is set
//! up, a receiver's old versions from triage on, and a `receive`'s target while it waits for
//! its sender (decisions §95, §96).

use std::sync::OnceLock;

static POOL: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();

/// Threads of the background pool: one per core, at most two (what the session's own
/// hashing uses at once on a small machine; more would only hold more files mapped).
fn width() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(2))
}

/// Run `work` on the background pool. Parallel iterators inside it run on the same pool, so
/// at the same priority. Where no pool could be started, `work` runs on a thread of its own,
/// lowered the same way.
pub fn spawn(work: impl FnOnce() + Send + 'static) {
    let pool = POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(width())
            .thread_name(|i| format!("ffsync-ahead-{i}"))
            .start_handler(|_| {
                lower_current_thread();
            })
            .build()
            .ok()
    });
    match pool {
        Some(p) => p.spawn(work),
        None => {
            // The work is a guess: if not even a thread can be had, it is skipped.
            let _ = std::thread::Builder::new().name("ffsync-ahead".into()).spawn(move || {
                lower_current_thread();
                work();
            });
        }
    }
}

/// Lower the calling thread to the system's idle (background) priority; false where the
/// system refused or has no such class (the work then runs at normal priority: still correct).
pub fn lower_current_thread() -> bool {
    imp::lower()
}

#[cfg(target_os = "linux")]
mod imp {
    /// `ioprio_set`'s target (linux/ioprio.h): a process or thread id, 0 = the calling thread.
    pub(super) const IOPRIO_WHO_PROCESS: libc::c_int = 1;
    /// The idle I/O class, in the value's top bits (`IOPRIO_PRIO_VALUE(IOPRIO_CLASS_IDLE, 0)`).
    pub(super) const IOPRIO_IDLE: libc::c_int = 3 << 13;

    pub fn lower() -> bool {
        let param = libc::sched_param { sched_priority: 0 };
        // The raw system call: musl's sched_setscheduler is a stub that fails (POSIX gives the
        // call per-process semantics; Linux applies it to the calling thread, pid 0).
        let cpu = unsafe {
            libc::syscall(
                libc::SYS_sched_setscheduler,
                0,
                libc::SCHED_IDLE,
                &param as *const libc::sched_param,
            ) == 0
        };
        // Its reads too, where the I/O scheduler has classes (BFQ; mq-deadline and none ignore
        // them): a `receive` hashing its target while it waits reads files from a cold disk
        // that other programs may be using. Best effort: an idle-class read that waits long
        // delays nothing the session waits for (decisions §96).
        unsafe {
            libc::syscall(libc::SYS_ioprio_set, IOPRIO_WHO_PROCESS, 0, IOPRIO_IDLE);
        }
        cpu
    }
}

#[cfg(target_vendor = "apple")]
mod imp {
    // <pthread/qos.h>; declared here rather than through libc, whose Apple QoS bindings have
    // moved between versions.
    extern "C" {
        fn pthread_set_qos_class_self_np(qos_class: u32, relative_priority: libc::c_int) -> libc::c_int;
    }
    const QOS_CLASS_BACKGROUND: u32 = 0x09;
    pub fn lower() -> bool {
        unsafe { pthread_set_qos_class_self_np(QOS_CLASS_BACKGROUND, 0) == 0 }
    }
}

#[cfg(windows)]
mod imp {
    use std::ffi::c_void;
    #[link(name = "kernel32")]
    extern "system" {
        fn GetCurrentThread() -> *mut c_void;
        fn SetThreadPriority(thread: *mut c_void, priority: i32) -> i32;
    }
    const THREAD_PRIORITY_IDLE: i32 = -15;
    pub fn lower() -> bool {
        unsafe { SetThreadPriority(GetCurrentThread(), THREAD_PRIORITY_IDLE) != 0 }
    }
}

#[cfg(not(any(target_os = "linux", target_vendor = "apple", windows)))]
mod imp {
    pub fn lower() -> bool {
        false
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use rayon::prelude::*;
    use std::sync::mpsc;

    /// The policy of the calling thread (pid 0 is the thread on Linux).
    fn policy() -> i32 {
        unsafe { libc::syscall(libc::SYS_sched_getscheduler, 0) as i32 }
    }

    #[test]
    fn work_and_its_parallel_iterators_run_at_idle_priority_off_the_callers_threads() {
        let caller = policy();
        let (tx, rx) = mpsc::channel();
        spawn(move || {
            let outer = (std::thread::current().name().map(str::to_owned), policy());
            // rayon's parallel iterators inside stay on this pool: every item at idle priority.
            let inner: Vec<(Option<String>, i32)> = (0..64)
                .into_par_iter()
                .map(|_| (std::thread::current().name().map(str::to_owned), policy()))
                .collect();
            tx.send((outer, inner)).unwrap();
        });
        let ((name, pol), inner) = rx.recv_timeout(std::time::Duration::from_secs(30)).unwrap();
        assert!(name.unwrap().starts_with("ffsync-ahead-"));
        assert_eq!(pol, libc::SCHED_IDLE);
        // And their reads in the idle I/O class.
        let (tx, rx) = mpsc::channel();
        spawn(move || {
            tx.send(unsafe { libc::syscall(libc::SYS_ioprio_get, imp::IOPRIO_WHO_PROCESS, 0) } as i32)
                .unwrap();
        });
        assert_eq!(
            rx.recv_timeout(std::time::Duration::from_secs(30)).unwrap(),
            imp::IOPRIO_IDLE
        );
        assert_ne!(
            unsafe { libc::syscall(libc::SYS_ioprio_get, imp::IOPRIO_WHO_PROCESS, 0) } as i32,
            imp::IOPRIO_IDLE,
            "the caller's own I/O class is left as it was"
        );
        for (n, p) in inner {
            assert!(n.unwrap().starts_with("ffsync-ahead-"));
            assert_eq!(p, libc::SCHED_IDLE);
        }
        // The caller's own thread is left as it was.
        assert_eq!(policy(), caller);
        assert_ne!(caller, libc::SCHED_IDLE);
    }
}
