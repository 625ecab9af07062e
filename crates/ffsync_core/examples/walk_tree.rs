//! Time the tree walk: `cargo run --release -p ffsync_core --example walk_tree -- DIR [STATE_DIR]`
use ffsync_core::tree::{filter::Filter, index, walk};
use std::path::Path;
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let root = Path::new(&args[1]);
    let idx = args.get(2).and_then(|s| index::load(Path::new(s), root));
    for _ in 0..3 {
        let t = Instant::now();
        let filter = Filter::empty();
        let tree = walk::walk(
            root,
            &walk::WalkOptions {
                filter: &filter,
                protect: None,
                index: idx.as_ref(),
                progress: None,
                one_file_system: false,
                skip_symlinks: false,
                copy_links: false,
                dir_merge: &[],
                select: None,
                chmod: None,
                prune_empty_dirs: false,
            },
        )
        .unwrap();
        let walked = t.elapsed();
        let wire = tree.manifest.encode_compressed();
        println!(
            "{} entries, {} indexed: walk {:?}, encode {:?} ({} bytes raw, {} wire)",
            tree.manifest.len(),
            tree.indexed_files,
            walked,
            t.elapsed() - walked,
            tree.manifest.encoded().len(),
            wire.len()
        );
    }
}
