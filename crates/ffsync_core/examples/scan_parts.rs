//! Breakdown of scan cost on one core: FastCDC cut points alone vs BLAKE3 alone.
use fastcdc::v2020::FastCDC;
use std::time::Instant;
fn main() {
    let path = std::env::args().nth(1).unwrap();
    let data = std::fs::read(path).unwrap();
    let d = &data[..512 << 20];
    let t = Instant::now();
    let n = FastCDC::new(d, 65536, 262144, 1048576).count();
    let s = t.elapsed().as_secs_f64();
    println!("fastcdc 1 core: {:.2} GB/s ({n} chunks)", d.len() as f64 / s / 1e9);
    let t = Instant::now();
    let mut x = 0u8;
    for c in d.chunks(262144) {
        x ^= blake3::hash(c).as_bytes()[0];
    }
    let s = t.elapsed().as_secs_f64();
    println!("blake3 1 core: {:.2} GB/s ({x})", d.len() as f64 / s / 1e9);
}
