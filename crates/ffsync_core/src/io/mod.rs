//! Positional I/O: batched writes at offsets (io_uring on Linux when the kernel allows it,
//! pwrite / seek_write elsewhere), in-kernel range copies between files, and
//! copy-on-write clones where the filesystem has reflinks.

pub mod clone;
pub mod copy;
pub mod offset_io;
pub mod positional;
pub mod reserve;
#[cfg(target_os = "linux")]
mod uring;
pub mod write_turn;
pub mod writeback;

pub use clone::{clone_to_new, clone_to_new_at};
pub use copy::{copy_range, copy_range_in_turn};
pub use offset_io::{read_exact_at, write_at};
pub use positional::{hash_range, PositionalWriter};
pub use write_turn::WriteTurn;
pub use writeback::Writeback;
