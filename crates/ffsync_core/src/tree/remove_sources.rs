//! rsync's `--remove-source-files`, on the sender once the receiver has reported a session in
//! which every file was synced: each non-directory on the sender's list that the receiver now
//! holds (sent, or found the same there) is removed. Directories stay, as in rsync.
//!
//! The walk's listing is no proof of what is on disk when we remove: each name is resolved
//! beneath the root handle (a link planted on the way is not followed) and removed only if
//! it is still the entry that was listed (kind, size, mtime, inode). One that changed since
//! is kept and named, in rsync's words, so a file written during the sync is never lost.

use super::manifest::Kind;
use super::path::display;
use super::sync::{Outcome, TreeSync};
use super::triage::Op;
use crate::beneath::{Dir, Kind as DiskKind};
use std::collections::HashSet;

impl TreeSync {
    /// Remove the synced source files and symlinks (see the module doc). `files` counts the
    /// removals; `warnings` names each entry kept because it changed, `errors` each removal
    /// that failed.
    pub fn remove_sources(&self) -> Outcome {
        let mut out = Outcome::default();
        let plan = self.plan();
        // Left as they were on purpose (options), or not readable here: not synced.
        let mut kept: HashSet<u32> = plan.left_alone.iter().copied().collect();
        kept.extend(plan.actions.iter().filter(|a| a.op == Op::Skip).map(|a| a.sender_entry));
        let root = match Dir::open_root(&self.local.root) {
            Ok(d) => d,
            Err(e) => {
                out.errors
                    .push(format!("cannot open {}: {e}", self.local.root.display()));
                return out;
            }
        };
        let m = &self.local.manifest;
        for i in 0..m.len() {
            let e = m.entry(i);
            if e.kind == Kind::Dir || kept.contains(&(i as u32)) {
                continue;
            }
            let shown = display(e.path);
            let listed = self.local.identity(i);
            let (dir, name) = match root.parent_of(e.path) {
                Ok(x) => x,
                Err(err) => {
                    out.errors.push(format!("cannot remove source {shown}: {err}"));
                    continue;
                }
            };
            match dir.lstat(&name) {
                Ok(Some(now))
                    if now.kind == disk_kind(e.kind)
                        && now.size == listed.size
                        && now.mtime_ns == listed.mtime_ns
                        // (Windows reports no inode through this call.)
                        && (now.ino == listed.inode || now.ino == 0) =>
                {
                    match dir.unlink(&name) {
                        Ok(()) => out.files += 1,
                        Err(err) => out.errors.push(format!("cannot remove source {shown}: {err}")),
                    }
                }
                Ok(Some(_)) => out
                    .warnings
                    .push(format!("Skipping sender remove for changed file: {shown}")),
                // Gone already: nothing to remove.
                Ok(None) => {}
                Err(err) => out.errors.push(format!("cannot remove source {shown}: {err}")),
            }
        }
        out
    }
}

fn disk_kind(k: Kind) -> DiskKind {
    match k {
        Kind::File => DiskKind::File,
        Kind::Dir => DiskKind::Dir,
        Kind::Symlink => DiskKind::Symlink,
    }
}
