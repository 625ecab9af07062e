//! Wire bytes of one file transfer with and without sub-chunk refinement, without a
//! transport: `cargo run --release -p ffsync_core --example refine_bytes -- OLD NEW`.
//! Prints the manifest, refinement table and DATA batch bytes, and how many chunks went
//! as deltas. Used to choose the refinement design (docs/decisions.md).

use ffsync_core::chunk_batch::{ENC_DELTA, ENC_DELTA_ZSTD, RECORD_HEADER};
use ffsync_core::chunk_source::ChunkSource;
use ffsync_core::restore::{LocalSource, Reconstruction};
use ffsync_core::scan::{scan_file, ScanOptions};
use std::path::Path;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [old, new] = &args[..] else {
        eprintln!("usage: refine_bytes OLD NEW");
        std::process::exit(1);
    };
    let dir = tempfile_dir();
    let target = dir.join("target");
    std::fs::copy(old, &target).expect("copy old");
    let s = scan_file(Path::new(new), &ScanOptions::default()).expect("scan new");
    let o = scan_file(&target, &ScanOptions::default()).expect("scan old");
    for refine in [false, true] {
        let r = Reconstruction::begin(
            &target,
            s.manifest.clone(),
            vec![LocalSource {
                path: target.clone(),
                manifest: o.manifest.clone(),
            }],
        )
        .expect("begin");
        let table = if refine {
            r.refinement().expect("refinement")
        } else {
            Vec::new()
        };
        let src = ChunkSource::open(Path::new(new), s.manifest.clone(), s.identity, 1, false).expect("open");
        if refine {
            src.set_refinement(&table).expect("table");
        }
        r.copy_local().expect("copy");
        let need = r.needed();
        let (mut data, mut deltas, mut delta_bytes, mut whole_bytes) = (0usize, 0, 0usize, 0usize);
        for group in need.chunks(8) {
            let (batch, _) = src.read_batch(group).expect("read");
            data += batch.len();
            let mut at = 0;
            while at < batch.len() {
                let enc = batch[at + 4];
                let plen = u32::from_le_bytes(batch[at + 9..at + 13].try_into().unwrap()) as usize;
                if enc == ENC_DELTA || enc == ENC_DELTA_ZSTD {
                    deltas += 1;
                    delta_bytes += plen;
                } else {
                    whole_bytes += plen;
                }
                at += RECORD_HEADER + plen;
            }
            r.write_batch(&batch).expect("write");
        }
        r.finish(None, None, None).expect("finish");
        assert_eq!(std::fs::read(&target).unwrap(), std::fs::read(new).unwrap());
        println!(
            "refine={refine}: manifest {} B, table {} B, data {} B ({} missing chunks: {} as deltas = {} B, others {} B), total {} B",
            s.manifest.encoded_len(),
            table.len(),
            data,
            need.len(),
            deltas,
            delta_bytes,
            whole_bytes,
            s.manifest.encoded_len() + table.len() + data
        );
        std::fs::copy(old, &target).expect("reset");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn tempfile_dir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("refine_bytes.{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}
