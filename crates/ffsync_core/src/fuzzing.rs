//! Fuzz bodies for every decoder that parses untrusted bytes. Shared by the cargo-fuzz
//! targets (crates/ffsync_core/fuzz, coverage-guided, nightly) and by a bounded,
//! deterministic mutation run in `cargo test` (so every CI run exercises them).

use crate::chunk_batch;
use crate::index;
use crate::manifest::Manifest;
use crate::params::ChunkParams;
use crate::scan::manifest_of_bytes;

/// Decode never panics; whatever decodes re-encodes to the same bytes.
pub fn manifest_decode(data: &[u8]) {
    if let Ok(m) = Manifest::decode(data) {
        assert_eq!(m.encode(), data);
        assert_eq!(m.params, ChunkParams::for_file_size(m.size));
    }
    if let Ok(m) = Manifest::decode_local(data) {
        assert_eq!(m.encode(), data);
    }
}

pub fn index_decode(data: &[u8]) {
    if let Ok(e) = index::decode(data) {
        assert_eq!(e.manifest.size, e.identity.size);
    }
}

/// The previous frame's bytes [`chunk_batch_decode`] decodes against.
fn previous_frame() -> Vec<u8> {
    (0..40_000u32)
        .map(|i| (i.wrapping_mul(2246822519) >> 11) as u8)
        .collect()
}

/// A fixed small manifest, then the input as a DATA batch against it (after a previous frame,
/// so records that refer to it, encodings 8 and 9, are decoded too): decoding and
/// decompressing must never panic, and never yield a chunk of the wrong length.
pub fn chunk_batch_decode(data: &[u8]) {
    thread_local! {
        static MANIFEST: Manifest = {
            let bytes: Vec<u8> = (0..300_000u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
            manifest_of_bytes(&bytes, None, &crate::chunker::InMemory)
        };
    }
    MANIFEST.with(|m| {
        if let Ok(records) = chunk_batch::decode_after(data, m, || Ok(Some(previous_frame()))) {
            let mut buf = Vec::new();
            let base: Vec<u8> = (0..70_000u32).map(|i| (i.wrapping_mul(40503) >> 7) as u8).collect();
            let mut out = Vec::new();
            for r in records {
                if let Ok(raw) = r.raw(&mut buf) {
                    assert_eq!(raw.len(), m.chunks[r.index as usize].len as usize);
                }
                // Delta records: decompression is bounded and applying never writes more
                // than the chunk's length, whatever the peer sent.
                if let Ok(delta) = r.delta(&mut buf) {
                    if crate::refine::apply_into(&base, delta, r.raw_len as usize, &mut out).is_ok() {
                        assert_eq!(out.len(), r.raw_len as usize);
                    }
                }
            }
        }
        // The same bytes as a sender's hole list, and as a (damaged) in-place journal on
        // disk: refused or valid, never a panic; a valid hole list is ordered and in bounds.
        if let Ok(holes) = crate::sparse::decode(data, 1 << 30) {
            assert!(holes.windows(2).all(|w| w[0].end() < w[1].offset));
            assert!(holes.iter().all(|h| h.len > 0 && h.end() <= 1 << 30));
        }
        let _ = crate::restore::inplace::Journal::decode(data);
        // The same bytes as a refinement table from a receiver: refused or valid. Over each
        // valid run, the sender's block match writes a delta whose commands describe the probe
        // exactly, and every block it copies is one whose checksum and MD4 prefix are the
        // probe's bytes there (what a copy asserts), whatever the receiver's signature says.
        if let Ok(t) = crate::refine::RefineTable::decode(data, m) {
            let probe = refine_probe();
            let mut seen = std::collections::HashSet::new();
            for i in 0..m.chunks.len() as u32 {
                let Some(k) = t.run_of(i) else { continue };
                assert!((512..=128 * 1024).contains(&t.block_size(k)));
                if !seen.insert(k) {
                    continue;
                }
                let index = t.block_index(k);
                let mut delta = Vec::new();
                index.diff(&probe, &mut delta);
                let b = index.block_size() as u64;
                let mut at = 0u64;
                for c in crate::rsync_delta::delta_commands(&delta) {
                    match c.expect("the block match writes only what the parser reads") {
                        (Some(offset), len) => {
                            assert!(offset % b == 0 && len % b == 0 && len > 0);
                            for j in 0..len / b {
                                let window = &probe[(at + j * b) as usize..(at + (j + 1) * b) as usize];
                                assert!(index.block_matches((offset / b + j) as u32, window));
                            }
                            at += len;
                        }
                        (None, len) => at += len,
                    }
                }
                assert_eq!(at, probe.len() as u64);
            }
        }
    });
}

/// The sender's data the chunk-batch body matches a receiver's refinement tables against:
/// the start of the body's manifest bytes, a run of zeros, and more of them (its seed table
/// describes an edited copy of it, so blocks match, repeat and miss).
fn refine_probe() -> Vec<u8> {
    let bytes = |r: std::ops::Range<u32>| r.map(|i| (i.wrapping_mul(2654435761) >> 13) as u8);
    bytes(0..9_000)
        .chain(std::iter::repeat_n(0, 5_000))
        .chain(bytes(9_000..16_000))
        .collect()
}

/// Tree manifests from a peer: decode never panics; what decodes is in tree order with
/// safe paths and re-encodes to the same bytes; the compressed form is bounded.
pub fn tree_manifest_decode(data: &[u8]) {
    use crate::tree::manifest::TreeManifest;
    use crate::tree::path::{cmp_tree_path, is_valid_rel};
    if let Ok(m) = TreeManifest::decode(data.to_vec()) {
        assert_eq!(m.encoded(), data);
        for i in 1..m.len() {
            assert!(is_valid_rel(m.entry(i).path));
            assert_eq!(
                cmp_tree_path(m.entry(i - 1).path, m.entry(i).path),
                std::cmp::Ordering::Less
            );
        }
        let _ = m.find(b"a/b");
    }
    let _ = TreeManifest::decode_compressed(data, 1 << 20);
}

/// FILE_BATCH payloads, FILTER frames and attribute tables (TREE_ATTRS) from a peer:
/// never a panic, never content of another length than declared, and a table that
/// decodes re-encodes to the same bytes (nothing is silently dropped or invented).
pub fn tree_frames_decode(data: &[u8]) {
    if let Ok(mut records) = crate::tree::file_batch::decode(data) {
        // A stream that does not decode is an error, never a panic; then nothing is written.
        let inflated = crate::tree::file_batch::inflate_streams(&mut records).is_ok();
        for r in records.iter().filter(|_| inflated) {
            // content() checks the root itself; what must also hold is the declared length.
            if let Ok(bytes) = r.content() {
                assert_eq!(bytes.len(), r.raw_len as usize);
            }
        }
    }
    if let Ok(f) = crate::tree::filter::Filter::decode(data) {
        let _ = f.excluded(b"a/b.log", false);
    }
    if let Ok(t) = crate::tree::attrs::AttrTable::decode(data, 8) {
        assert_eq!(t.encode(), data);
    }
}

#[cfg(test)]
mod tests {
    //! A bounded, seeded mutation run of each fuzz body over valid seeds (the long,
    //! coverage-guided runs are `cargo +nightly fuzz run <target>`, see bench/README.md).
    use super::*;
    use crate::chunk_batch::CompressPolicy;
    use crate::file_identity::FileIdentity;
    use crate::testutil::pseudo_random;

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n.max(1) as u64) as usize
        }
    }

    /// Flip, overwrite, insert, delete and truncate at random, `rounds` times per seed.
    fn mutate_all(seed: &[u8], rounds: usize, body: fn(&[u8])) {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        body(seed);
        for _ in 0..rounds {
            let mut d = seed.to_vec();
            for _ in 0..1 + rng.below(4) {
                if d.is_empty() {
                    d.push(rng.next() as u8);
                    continue;
                }
                let at = rng.below(d.len());
                match rng.below(6) {
                    0 => d[at] ^= 1 << rng.below(8),
                    1 => d[at] = rng.next() as u8,
                    2 => d.insert(at, rng.next() as u8),
                    3 => {
                        d.remove(at);
                    }
                    4 => d.truncate(at),
                    _ => {
                        // Interesting 32-bit values at a random aligned spot (lengths, counts).
                        let v = [0u32, 1, 0xffff_ffff, 0x8000_0000, 65536, 1 << 20][rng.below(6)];
                        let at = at / 4 * 4;
                        if at + 4 <= d.len() {
                            d[at..at + 4].copy_from_slice(&v.to_le_bytes());
                        }
                    }
                }
            }
            body(&d);
        }
    }

    fn sample_manifest() -> Manifest {
        manifest_of_bytes(&pseudo_random(400_000, 17), None, &crate::chunker::InMemory)
    }

    #[test]
    fn manifest_decoder_survives_mutations() {
        mutate_all(&sample_manifest().encode(), 20_000, manifest_decode);
    }

    #[test]
    fn index_decoder_survives_mutations() {
        let m = sample_manifest();
        let id = FileIdentity {
            size: m.size,
            mtime_ns: 5,
            ctime_ns: 6,
            inode: 7,
            dev: 8,
        };
        mutate_all(
            &index::encode(std::path::Path::new("/x/y"), &id, &m, 99),
            5_000,
            index_decode,
        );
    }

    #[test]
    fn tree_decoders_survive_mutations() {
        use crate::tree::manifest::{Kind, NewEntry, TreeBuilder};
        let mut b = TreeBuilder::new();
        let e = |path: &'static [u8], kind, root: Option<[u8; 32]>| NewEntry {
            path,
            kind,
            flags: 0,
            mode: 0o644,
            size: if kind == Kind::File { 9 } else { 0 },
            mtime_ns: 1,
            root,
            link: b"",
        };
        b.push(&e(b"", Kind::Dir, None));
        b.push(&e(b"a", Kind::Dir, None));
        b.push(&e(b"a/b", Kind::File, Some([7; 32])));
        b.push(&e(b"c", Kind::File, None));
        let m = b.finish();
        mutate_all(m.encoded(), 20_000, tree_manifest_decode);
        mutate_all(&m.encode_compressed(), 5_000, tree_manifest_decode);
        let mut batch = Vec::new();
        crate::tree::file_batch::encode_record(
            1,
            crate::tree::file_batch::FileStatus::Ok,
            &pseudo_random(5000, 3),
            1,
            &mut batch,
        );
        crate::tree::file_batch::encode_record(2, crate::tree::file_batch::FileStatus::Ok, b"small", 1, &mut batch);
        mutate_all(&batch, 5_000, tree_frames_decode);
        // Stream records (BATCH_STREAM): a group of three files sharing one context.
        let files: Vec<_> = [
            pseudo_random(3000, 4),
            b"small small small small".repeat(40),
            pseudo_random(3000, 4),
        ]
        .into_iter()
        .enumerate()
        .map(|(i, data)| crate::tree::file_batch::BatchFile {
            action: i as u32,
            status: crate::tree::file_batch::FileStatus::Ok,
            data,
        })
        .collect();
        let streamed: Vec<u8> = crate::tree::file_batch::encode_batch(&files, 3, true).concat();
        mutate_all(&streamed, 5_000, tree_frames_decode);
        mutate_all(b"*.log\n!keep.log\n/build/\n**/gen/**", 5_000, tree_frames_decode);
        use crate::tree::attrs::{attr_flags, AttrTable, EntryAttrs};
        let table = AttrTable {
            flags: attr_flags::OWNER | attr_flags::GROUP | attr_flags::XATTRS,
            users: vec![(1000, b"ci".to_vec())],
            groups: vec![(1000, b"ci".to_vec())],
            entries: vec![(
                2,
                EntryAttrs {
                    uid: 1000,
                    gid: 1000,
                    xattrs: vec![(b"user.a".to_vec(), b"1".to_vec())],
                },
            )],
        };
        mutate_all(&table.encode(), 5_000, tree_frames_decode);
    }

    #[test]
    fn chunk_batch_decoder_survives_mutations() {
        let bytes: Vec<u8> = (0..300_000u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        let m = manifest_of_bytes(&bytes, None, &crate::chunker::InMemory);
        let p = CompressPolicy::new(1);
        let mut batch = Vec::new();
        for (i, c) in m.chunks.iter().enumerate() {
            p.encode_record(i as u32, &bytes[c.offset as usize..c.end() as usize], &mut batch);
        }
        mutate_all(&batch, 3_000, chunk_batch_decode);
        // A batch whose stream starts with the previous frame as history (encodings 8, 5).
        let p = CompressPolicy::with_stream(crate::chunk_batch::PREFIX_FROM_LEVEL, true);
        let history = previous_frame();
        let mut slots: Vec<Vec<u8>> = m
            .chunks
            .iter()
            .map(|c| {
                [
                    &[0u8; crate::chunk_batch::RECORD_HEADER][..],
                    &bytes[c.offset as usize..c.end() as usize],
                ]
                .concat()
            })
            .collect();
        let mut group: Vec<crate::chunk_batch::GroupSlot<'_>> = slots
            .iter_mut()
            .enumerate()
            .map(|(i, s)| (i as u32, &mut s[..], None))
            .collect();
        let lens = p.encode_groups(&mut group, Some(&history));
        let prefixed: Vec<u8> = slots.iter().zip(lens).flat_map(|(s, n)| s[..n].to_vec()).collect();
        let records = crate::chunk_batch::decode_after(&prefixed, &m, || Ok(Some(history.clone()))).unwrap();
        assert_eq!(records[0].encoding, crate::chunk_batch::ENC_PREFIX_STREAM_START);
        mutate_all(&prefixed, 2_000, chunk_batch_decode);
        // A receiver's refinement table (the body reads the same bytes as one): decoded, and
        // its runs indexed and matched by the sender's block match.
        let mut old = refine_probe();
        old[3_000..3_100].fill(1);
        old.splice(12_000..12_000, [0u8; 3_000]);
        let run = |first, count| crate::refine::RefineRun {
            first,
            count,
            source: 0,
            offset: 0,
            len: old.len() as u64,
        };
        let (table, _) = crate::refine::encode_table(&[run(0, 1), run(1, 1)], 65536, |_| Some(&old[..]));
        let t = crate::refine::RefineTable::decode(&table, &m).unwrap();
        let mut delta = Vec::new();
        t.block_index(0).diff(&refine_probe(), &mut delta);
        assert!(
            crate::rsync_delta::literal_len(&delta).unwrap() < 4_000,
            "the seed's runs match"
        );
        mutate_all(&table, 2_000, chunk_batch_decode);
    }
}
