//! Rewriting a tree's index costs memory for what changed, not for the tree: the entries the
//! walk already knew are read in place from its manifest and merged with the session's new
//! claims as the file is written (decisions §87). Before, a 100,000-file tree's index was
//! gathered into a list of every entry and then one buffer of the whole file, ~20 MB more
//! resident at the end of each session. Its own test binary: the allocator below counts the
//! bytes live at once, for this process only.

use ffsync_core::file_identity::FileIdentity;
use ffsync_core::tree::index::{self, ClaimRef};
use std::alloc::{GlobalAlloc, Layout, System};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

struct Counting;
static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            let now = LIVE.fetch_add(l.size(), Ordering::Relaxed) + l.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) };
        LIVE.fetch_sub(l.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static A: Counting = Counting;

struct Claim {
    path: Vec<u8>,
    identity: FileIdentity,
    root: [u8; 32],
}

fn claim(i: u32, root: u8) -> Claim {
    Claim {
        // Tree order: "d0000/f00000" < "d0000/f00001" < ... as zero-padded names sort.
        path: format!("d{:04}/f{:05}.txt", i / 500, i).into_bytes(),
        identity: FileIdentity {
            size: u64::from(i),
            mtime_ns: 1_000_000_000,
            ctime_ns: 1,
            inode: u64::from(i),
            dev: 1,
        },
        root: [root; 32],
    }
}

fn refs(c: &[Claim]) -> impl Iterator<Item = ClaimRef<'_>> {
    c.iter().map(|c| ClaimRef {
        path: &c.path,
        identity: c.identity,
        root: c.root,
    })
}

#[test]
fn rewriting_a_large_index_does_not_hold_it_in_memory() {
    let dir = tempfile::tempdir().unwrap();
    let tree = Path::new("/a/tree/of/100000/files");
    const FILES: u32 = 100_000;
    // What the walk knew (here a list; in a session, the walk's manifest, already resident),
    // and 1% of the files changed this session.
    let known: Vec<Claim> = (0..FILES).map(|i| claim(i, 1)).collect();
    let changed: Vec<Claim> = (0..FILES).step_by(100).map(|i| claim(i, 2)).collect();
    let file_bytes: usize = known.iter().map(|c| 2 + c.path.len() + 40 + 32).sum();

    let before = LIVE.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    index::store(dir.path(), tree, || refs(&known), || refs(&changed)).unwrap();
    let extra = PEAK.load(Ordering::Relaxed) - before;
    assert!(
        extra < 1024 * 1024,
        "rewriting an index of {file_bytes} bytes held {extra} bytes more at its peak (expected: its write buffer, not the index)"
    );

    // And it is the index it should be: every known entry, the changed ones replaced.
    let idx = index::load(dir.path(), tree).expect("the index reads back");
    assert_eq!(idx.len(), FILES as usize);
    let mut c = idx.cursor();
    for i in (0..FILES).step_by(50) {
        let expect = if i % 100 == 0 { claim(i, 2) } else { claim(i, 1) };
        assert_eq!(
            c.root_for(&expect.path, &expect.identity),
            Some(expect.root),
            "entry {i}"
        );
    }
}
