//! Progress for JavaScript: a byte count (read through a closure) forwarded to a JS callback at
//! most every PERIOD, and once more when stopped, so the JS thread sees bounded traffic.
//!
//! One ticker thread serves every counter of the process. A thread per counter would cost a
//! spawn when a transfer begins and a join when it ends, and the join runs on the JS thread,
//! which then waits until the ticker is scheduled: on a busy 2-core machine about a
//! millisecond per file of a tree (decisions §67).

use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode};
use napi::Status;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

pub type ProgressFn = ThreadsafeFunction<f64, (), f64, Status, false, true>;

const PERIOD: Duration = Duration::from_millis(100);

type Read = Box<dyn Fn() -> u64 + Send>;

/// One counter and its callback. Its lock is held while a value is read and queued, so
/// values reach JavaScript in the order they were read (the last one is the final count).
struct Counter {
    /// Both `None` once stopped: what they hold (e.g. a reconstruction and its files) is
    /// dropped by `stop` itself, and the ticker forgets the counter at its next pass.
    read: Option<Read>,
    callback: Option<ProgressFn>,
    last: u64,
}

impl Counter {
    fn report(&mut self) {
        if let (Some(read), Some(cb)) = (&self.read, &self.callback) {
            let v = read();
            if v != self.last {
                cb.call(v as f64, ThreadsafeFunctionCallMode::NonBlocking);
                self.last = v;
            }
        }
    }
}

struct Shared {
    counters: Mutex<Vec<Arc<Mutex<Counter>>>>,
    thread: std::thread::Thread,
}

fn shared() -> &'static Shared {
    static SHARED: OnceLock<Shared> = OnceLock::new();
    SHARED.get_or_init(|| {
        let thread = std::thread::Builder::new()
            .name("ffsync-progress".into())
            .spawn(|| loop {
                let s = shared();
                let live: Vec<Arc<Mutex<Counter>>> = {
                    let mut all = s.counters.lock().unwrap_or_else(|e| e.into_inner());
                    all.retain(|c| c.lock().map(|c| c.callback.is_some()).unwrap_or(false));
                    all.clone()
                };
                if live.is_empty() {
                    std::thread::park();
                    continue;
                }
                for c in &live {
                    if let Ok(mut c) = c.lock() {
                        c.report();
                    }
                }
                std::thread::park_timeout(PERIOD);
            })
            .expect("cannot start the progress thread");
        Shared {
            counters: Mutex::new(Vec::new()),
            thread: thread.thread().clone(),
        }
    })
}

pub struct Ticker {
    counter: Option<Arc<Mutex<Counter>>>,
}

impl Ticker {
    /// Report `read()` now and then every PERIOD until stopped. Without a callback, nothing.
    pub fn start(read: impl Fn() -> u64 + Send + 'static, callback: Option<ProgressFn>) -> Ticker {
        let Some(cb) = callback else {
            return Ticker { counter: None };
        };
        let counter = Arc::new(Mutex::new(Counter {
            read: Some(Box::new(read)),
            callback: Some(cb),
            last: u64::MAX,
        }));
        counter.lock().unwrap_or_else(|e| e.into_inner()).report();
        let s = shared();
        s.counters
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(counter.clone());
        s.thread.unpark();
        Ticker { counter: Some(counter) }
    }

    /// Report the final count (if it changed) and stop. Never waits for the ticker thread
    /// beyond the moment it may spend reporting this counter.
    pub fn stop(&mut self) {
        if let Some(c) = self.counter.take() {
            let mut c = c.lock().unwrap_or_else(|e| e.into_inner());
            c.report();
            c.read = None;
            c.callback = None;
        }
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.stop();
    }
}
