//! Positional I/O: batched writes at offsets (io_uring on Linux when the kernel allows it,
//! pwrite / seek_write elsewhere) and in-kernel range copies between files.

pub mod copy;
pub mod positional;
#[cfg(target_os = "linux")]
mod uring;

pub use copy::copy_range;
pub use positional::{read_exact_at, write_at, PositionalWriter};
