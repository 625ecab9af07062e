//! `--inplace`: for files too big to duplicate, the result is written into the target
//! itself — but never half-written silently. The restorer stages every chunk that is not
//! already at its place in the target (received, copied from elsewhere, delta-applied) in a
//! sparse side file and verifies it there, exactly as out of place. Only then does it commit:
//!
//! 1. write a **redo journal** `.<name>.ffsync-journal` (the sender's manifest, mtime and
//!    mode, the staged ranges, the staging file's name; BLAKE3-checksummed) to a temporary
//!    name, fsync it, rename it into place and fsync the directory — from here on the commit
//!    is decided;
//! 2. copy the staged ranges into the target at their offsets, set its length, re-verify the
//!    ranges, apply mtime and mode, fsync;
//! 3. remove the staging file and the journal.
//!
//! A crash before step 1 leaves the target untouched (the staging file is an ordinary
//! partial). A crash in step 2 leaves a journal: the next run that touches the target
//! (`recover`, called before anything looks at it) redoes step 2 — copying staged bytes
//! again is idempotent — verifies the whole target against the journal's manifest, and
//! finishes; if the staged data is gone or does not verify, it says so and how to repair.

use crate::beneath::Target;
use crate::error::{CoreError, Result};
use crate::io::copy_range;
use crate::manifest::{u32_at, Manifest};
use std::fs::File;
use std::path::{Path, PathBuf};

pub const JOURNAL_SUFFIX: &str = ".ffsync-journal";
const MAGIC: &[u8; 4] = b"FFJ1";

/// The journal of an in-place commit of `target`.
pub fn journal_path(target: &Path) -> PathBuf {
    let mut name = crate::restore::staging::partial_stem(target);
    name.extend_from_slice(JOURNAL_SUFFIX.as_bytes());
    target.with_file_name(crate::tree::path::os_name(&name))
}

/// The journal of `target`, a sibling in its directory handle.
pub fn journal_of(target: &Target) -> Target {
    let mut name = crate::restore::staging::partial_stem(Path::new(&target.name));
    name.extend_from_slice(JOURNAL_SUFFIX.as_bytes());
    target.sibling(crate::tree::path::os_name(&name))
}

fn user_target(target: &Path) -> Result<Target> {
    Target::from_user_path(target).map_err(|e| CoreError::io(target, e))
}

/// What a commit writes where: `ranges` of `staged` go to the same offsets of the target.
pub struct Journal {
    pub manifest: Manifest,
    pub mtime_ns: Option<i64>,
    pub mode: Option<u32>,
    /// File name of the staging file (same directory as the target).
    pub staged_name: Vec<u8>,
    pub ranges: Vec<(u64, u64)>,
}

impl Journal {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = MAGIC.to_vec();
        b.push(self.mtime_ns.is_some() as u8);
        b.extend_from_slice(&self.mtime_ns.unwrap_or(0).to_le_bytes());
        b.push(self.mode.is_some() as u8);
        b.extend_from_slice(&self.mode.unwrap_or(0).to_le_bytes());
        let m = self.manifest.encode();
        b.extend_from_slice(&(m.len() as u32).to_le_bytes());
        b.extend_from_slice(&m);
        b.extend_from_slice(&(self.staged_name.len() as u32).to_le_bytes());
        b.extend_from_slice(&self.staged_name);
        b.extend_from_slice(&(self.ranges.len() as u32).to_le_bytes());
        for (o, l) in &self.ranges {
            b.extend_from_slice(&o.to_le_bytes());
            b.extend_from_slice(&l.to_le_bytes());
        }
        let sum = *blake3::hash(&b).as_bytes();
        b.extend_from_slice(&sum);
        b
    }

    pub fn decode(buf: &[u8]) -> Result<Journal> {
        let bad = |r: &str| CoreError::malformed("in-place journal", r.to_string());
        if buf.len() < 4 + 32 || &buf[..4] != MAGIC {
            return Err(bad("not a journal"));
        }
        let (body, sum) = buf.split_at(buf.len() - 32);
        if blake3::hash(body).as_bytes() != sum {
            return Err(bad("checksum mismatch (damaged)"));
        }
        let mut at = 4;
        let take = |at: &mut usize, n: usize| -> Result<&[u8]> {
            let s = body.get(*at..*at + n).ok_or_else(|| bad("truncated"))?;
            *at += n;
            Ok(s)
        };
        let has_mtime = take(&mut at, 1)?[0] != 0;
        let mtime = i64::from_le_bytes(take(&mut at, 8)?.try_into().unwrap());
        let has_mode = take(&mut at, 1)?[0] != 0;
        let mode = u32::from_le_bytes(take(&mut at, 4)?.try_into().unwrap());
        let mlen = u32_at(take(&mut at, 4)?, 0) as usize;
        let manifest = Manifest::decode(take(&mut at, mlen)?)?;
        let nlen = u32_at(take(&mut at, 4)?, 0) as usize;
        let staged_name = take(&mut at, nlen)?.to_vec();
        let count = u32_at(take(&mut at, 4)?, 0) as usize;
        let mut ranges = Vec::with_capacity(count.min(1 << 20));
        for _ in 0..count {
            let r = take(&mut at, 16)?;
            ranges.push((
                u64::from_le_bytes(r[..8].try_into().unwrap()),
                u64::from_le_bytes(r[8..].try_into().unwrap()),
            ));
        }
        if at != body.len()
            || ranges
                .iter()
                .any(|&(o, l)| o.checked_add(l).is_none_or(|e| e > manifest.size))
        {
            return Err(bad("inconsistent ranges"));
        }
        Ok(Journal {
            manifest,
            mtime_ns: has_mtime.then_some(mtime),
            mode: has_mode.then_some(mode),
            staged_name,
            ranges,
        })
    }
}

/// Step 1: make the commit durable-decided.
pub fn write_journal(target: &Path, journal: &Journal) -> Result<()> {
    write_journal_at(&user_target(target)?, journal)
}

/// As [`write_journal`], in the target's directory handle.
pub fn write_journal_at(target: &Target, journal: &Journal) -> Result<()> {
    let path = journal_of(target);
    let mut tmp_name = path.name_bytes();
    tmp_name.extend_from_slice(b".tmp");
    let tmp = path.sibling(crate::tree::path::os_name(&tmp_name));
    let _ = tmp.unlink();
    let f = tmp.create_new(0o600).map_err(|e| CoreError::io(tmp.shown(), e))?;
    crate::io::write_at(&f, &journal.encode(), 0).map_err(|e| CoreError::io(tmp.shown(), e))?;
    f.sync_all().map_err(|e| CoreError::io(tmp.shown(), e))?;
    tmp.rename_to(&path).map_err(|e| CoreError::io(path.shown(), e))?;
    // The journal must exist after a crash before step 2 touches the target: its name's
    // durability is part of the guarantee.
    target.dir.sync_entries().map_err(|e| CoreError::io(path.shown(), e))?;
    Ok(())
}

/// Step 2 (also the redo of a recovery): staged ranges into the target, length, metadata,
/// fsync. `verify` re-hashes the target's chunks that the ranges touched.
pub fn apply(target: &Path, staged: &File, journal: &Journal) -> Result<File> {
    apply_at(&user_target(target)?, staged, journal)
}

/// As [`apply`]: the target opened through its directory handle, never through a link.
pub fn apply_at(target_at: &Target, staged: &File, journal: &Journal) -> Result<File> {
    let shown = target_at.shown();
    let target = shown.as_path();
    let t = target_at.open_rw().map_err(|e| CoreError::io(target, e))?;
    let crash_after = test_crash_after();
    for (k, &(off, len)) in journal.ranges.iter().enumerate() {
        if crash_after == Some(k) {
            // Test hook (FFSYNC_TEST_INPLACE_CRASH_AFTER): die like a killed process would.
            let _ = t.sync_all();
            std::process::abort();
        }
        copy_range(staged, off, &t, off, len).map_err(|e| CoreError::io(target, e))?;
    }
    t.set_len(journal.manifest.size).map_err(|e| CoreError::io(target, e))?;
    super::durable::apply_metadata(&t, target, journal.mtime_ns, journal.mode)?;
    t.sync_all().map_err(|e| CoreError::io(target, e))?;
    Ok(t)
}

/// Step 3.
pub fn finish_at(target: &Target, staged: &Target) {
    // Clean-up only: the target is complete and durable (step 2). If these removals are lost
    // in a crash, the next run finds the journal and redoes step 2, which is idempotent.
    let _ = staged.unlink();
    let _ = journal_of(target).unlink();
    let _ = target.dir.sync();
}

fn test_crash_after() -> Option<usize> {
    std::env::var("FFSYNC_TEST_INPLACE_CRASH_AFTER").ok()?.parse().ok()
}

/// Complete an interrupted in-place commit of `target`, if there is one. `Ok(None)`: no
/// journal. `Ok(Some(message))`: completed and verified. `Err`: the journal could not be
/// completed; the journal is removed so the next run re-syncs, and the error says the target
/// may be inconsistent.
pub fn recover(target: &Path) -> Result<Option<String>> {
    recover_at(&user_target(target)?)
}

/// As [`recover`], in the target's directory handle.
pub fn recover_at(target_at: &Target) -> Result<Option<String>> {
    let shown = target_at.shown();
    let target = shown.as_path();
    let jp = journal_of(target_at);
    let Ok(buf) = jp.open_read().and_then(|f| {
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut &f, &mut v).map(|_| v)
    }) else {
        return Ok(None);
    };
    let fail = |why: String| -> Result<Option<String>> {
        let _ = jp.unlink();
        Err(CoreError::VerifyFailed(format!(
            "an interrupted --inplace sync of {} could not be completed ({why}); the file may be half-written: sync it again (without --inplace to be safe)",
            target.display()
        )))
    };
    let journal = match Journal::decode(&buf) {
        Ok(j) => j,
        Err(e) => return fail(e.to_string()),
    };
    if journal.staged_name.is_empty() || journal.staged_name.contains(&b'/') {
        return fail("the journal names no staging file beside the target".into());
    }
    let staged_at = target_at.sibling(crate::tree::path::os_name(&journal.staged_name));
    let staged = match staged_at.open_read() {
        Ok(f) => f,
        Err(e) => return fail(format!("staged data {}: {e}", staged_at.shown().display())),
    };
    let t = match apply_at(target_at, &staged, &journal) {
        Ok(t) => t,
        Err(e) => return fail(e.to_string()),
    };
    let mapped = match crate::scan::MappedFile::from_open(target, t) {
        Ok(m) => m,
        Err(e) => return fail(e.to_string()),
    };
    if mapped.manifest_with(journal.manifest.params, None).root != journal.manifest.root {
        return fail("the result does not match the sender's content root".into());
    }
    finish_at(target_at, &staged_at);
    Ok(Some(format!(
        "completed an interrupted --inplace sync of {} (verified)",
        target.display()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunker::InMemory;
    use crate::scan::manifest_of_bytes;

    #[test]
    fn journal_round_trip_and_damage() {
        let m = manifest_of_bytes(&crate::testutil::pseudo_random(200_000, 1), None, &InMemory);
        let j = Journal {
            manifest: m,
            mtime_ns: Some(-5),
            mode: None,
            staged_name: b".x.ffsync-part".to_vec(),
            ranges: vec![(0, 10), (100, 50)],
        };
        let b = j.encode();
        let d = Journal::decode(&b).unwrap();
        assert_eq!(
            (d.mtime_ns, d.mode, d.ranges.clone(), d.staged_name.clone()),
            (Some(-5), None, j.ranges.clone(), j.staged_name.clone())
        );
        for k in [0, 5, b.len() / 2, b.len() - 1] {
            let mut bad = b.clone();
            bad[k] ^= 1;
            assert!(Journal::decode(&bad).is_err(), "flip at {k}");
        }
        assert!(Journal::decode(&b[..b.len() - 3]).is_err());
    }
}
