//! `cargo run --release -p ffsync_core --example scan_throughput -- FILE`
//! Prints scan throughput (chunking + BLAKE3, all cores) for a file already in page cache.
use ffsync_core::scan::MappedFile;
use std::time::Instant;

fn main() {
    let path = std::env::args().nth(1).expect("usage: scan_throughput FILE");
    let f = MappedFile::open(std::path::Path::new(&path)).unwrap();
    let _ = f.manifest(None); // warm the page cache
    let t = Instant::now();
    let m = f.manifest(None);
    let s = t.elapsed().as_secs_f64();
    println!(
        "{} bytes, {} chunks, {:.3} s, {:.2} GB/s, root {}",
        m.size,
        m.chunks.len(),
        s,
        m.size as f64 / s / 1e9,
        m.root_hex()
    );
}
