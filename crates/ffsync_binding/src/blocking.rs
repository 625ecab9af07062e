//! Small blocking work (a stat, a directory read, a mkdir) run on libuv's pool instead of
//! the JS thread, without a task type per call.

use napi::bindgen_prelude::{Result, Task, ToNapiValue, TypeName};
use napi::Env;

type Work<T> = Box<dyn FnOnce() -> Result<T> + Send>;

/// A closure to run off the JS thread; its result is the promise's value.
pub struct Blocking<T>(Option<Work<T>>);

impl<T> Blocking<T> {
    pub fn new(work: impl FnOnce() -> Result<T> + Send + 'static) -> Self {
        Blocking(Some(Box::new(work)))
    }
}

impl<T: ToNapiValue + TypeName + Send + 'static> Task for Blocking<T> {
    type Output = T;
    type JsValue = T;

    fn compute(&mut self) -> Result<T> {
        match self.0.take() {
            Some(work) => work(),
            None => Err(napi::Error::from_reason("EUSAGE: blocking work ran twice")),
        }
    }

    fn resolve(&mut self, _env: Env, output: T) -> Result<T> {
        Ok(output)
    }
}
