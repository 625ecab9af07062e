use std::hint::black_box;
use std::time::Instant;
fn main() {
    let t = Instant::now();
    for _ in 0..4096 {
        let v = black_box(vec![1u8; 262144]);
        black_box(&v);
    }
    println!("4096 x fresh 256K vec: {:?}", t.elapsed());
    let mut v = black_box(vec![0u8; 1 << 30]);
    let t = Instant::now();
    for i in (0..v.len()).step_by(4096) {
        v[i] = 1;
    }
    black_box(&v);
    println!("touch 1 GiB fresh: {:?}", t.elapsed());
    let t = Instant::now();
    for i in (0..v.len()).step_by(4096) {
        v[i] = 2;
    }
    black_box(&v);
    println!("touch 1 GiB again: {:?}", t.elapsed());
}
