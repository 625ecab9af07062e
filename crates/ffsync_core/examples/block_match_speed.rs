//! The sender's block match against `fast_rsync::diff`, one thread, on real or generated data:
//! `cargo run --release -p ffsync_core --example block_match_speed -- [OLD NEW]`.
//! Without files: 32 MiB of random data against the signature of 32 MiB of other random data
//! (no block matches: the case of rebuilt binaries), then against an edited copy of itself.
//! Prints MB/s of each and checks that both write the same delta (docs/decisions.md §104).

use fast_rsync::{Signature, SignatureOptions};
use ffsync_core::block_match::BlockIndex;
use std::time::Instant;

/// Incompressible bytes from a seed (BLAKE3's extendable output).
fn random(len: usize, seed: u64) -> Vec<u8> {
    let mut out = vec![0u8; len];
    blake3::Hasher::new()
        .update(&seed.to_le_bytes())
        .finalize_xof()
        .fill(&mut out);
    out
}

fn compare(what: &str, old: &[u8], new: &[u8], block: u32) {
    let sig = Signature::calculate(
        old,
        SignatureOptions {
            block_size: block,
            crypto_hash_size: 4,
        },
    );
    let t = Instant::now();
    let indexed = sig.index();
    let mut theirs = Vec::new();
    fast_rsync::diff(&indexed, new, &mut theirs).expect("fast_rsync diff");
    let slow = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let ours = BlockIndex::new(sig.serialized().to_vec()).expect("signature");
    let mut mine = Vec::new();
    ours.diff(new, &mut mine);
    let fast = t.elapsed().as_secs_f64();
    let mb = new.len() as f64 / 1e6;
    println!(
        "{what}: {:.1} MB, block {block}: fast_rsync::diff {:.0} MB/s, block_match {:.0} MB/s ({:.1}x); delta {} bytes, {}",
        mb,
        mb / slow,
        mb / fast,
        slow / fast,
        mine.len(),
        if mine == theirs { "identical" } else { "DIFFERENT" }
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [old, new] = &args[..] {
        let (old, new) = (
            std::fs::read(old).expect("read OLD"),
            std::fs::read(new).expect("read NEW"),
        );
        for block in [2048, 8192] {
            compare("files", &old, &new, block);
        }
        return;
    }
    let old = random(32 << 20, 1);
    let other = random(32 << 20, 2);
    let mut edited = old.clone();
    for k in 0..64 {
        let at = k * (old.len() / 64) + 1000;
        edited[at..at + 4096].copy_from_slice(&other[at..at + 4096]);
    }
    for block in [2048, 8192] {
        compare("unrelated", &old, &other, block);
        compare("edited", &old, &edited, block);
    }
}
