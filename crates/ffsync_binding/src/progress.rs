//! A ticker thread that forwards a byte count (read through a closure) to a JavaScript callback at most
//! every PERIOD, and once more when stopped, so the JS thread sees bounded traffic.

use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode};
use napi::Status;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub type ProgressFn = ThreadsafeFunction<f64, (), f64, Status, false, true>;

const PERIOD: Duration = Duration::from_millis(100);

pub struct Ticker {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Ticker {
    pub fn start(read: impl Fn() -> u64 + Send + 'static, callback: Option<ProgressFn>) -> Ticker {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = callback.map(|cb| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut last = u64::MAX;
                loop {
                    let done = stop.load(Ordering::Acquire);
                    let v = read();
                    if v != last {
                        cb.call(v as f64, ThreadsafeFunctionCallMode::NonBlocking);
                        last = v;
                    }
                    if done {
                        break;
                    }
                    std::thread::park_timeout(PERIOD);
                }
            })
        });
        Ticker { stop, thread }
    }

    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.stop();
    }
}
