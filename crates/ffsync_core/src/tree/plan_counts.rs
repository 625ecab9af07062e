//! What a triaged plan does, counted: the figures both peers report (`--stats`, the summary
//! line, the JSON summary). Counted here, next to the plan, so a cargo test reaches them and
//! the binding only converts.

use super::sync::TreeSync;
use super::triage::{action_flags, Op};

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PlanCounts {
    pub mkdirs: u32,
    pub local_copies: u32,
    pub small_transfers: u32,
    pub large_transfers: u32,
    /// Bytes the transfers move (small files whole, large files' full sizes).
    pub transfer_bytes: u64,
    pub symlinks: u32,
    pub attrs_only: u32,
    pub deletes: u32,
    pub skipped: u32,
    pub unchanged_files: u64,
    pub decided_by_root: u64,
    pub kept_extraneous: u64,
    /// Files left alone because the receiver's copy is newer (-u).
    pub kept_newer: u64,
    /// Source files left alone by --max-size / --min-size.
    pub size_skipped: u64,
    /// Files and bytes of the sender's tree (after excludes).
    pub source_files: u64,
    pub source_bytes: u64,
    /// What the plan creates that the receiver lacks (rsync's "Number of created files").
    pub created_files: u64,
    pub created_dirs: u64,
    pub created_symlinks: u64,
}

impl TreeSync {
    /// The counts of the plan `triage` made.
    pub fn plan_counts(&self) -> PlanCounts {
        let plan = self.plan();
        let mut c = PlanCounts {
            unchanged_files: plan.unchanged_files,
            decided_by_root: plan.decided_by_root,
            kept_extraneous: plan.kept_extraneous,
            kept_newer: plan.kept_newer,
            size_skipped: plan.size_skipped,
            ..PlanCounts::default()
        };
        for a in &plan.actions {
            match a.op {
                Op::Mkdir => c.mkdirs += 1,
                Op::LocalCopy => c.local_copies += 1,
                Op::Transfer if a.flags & action_flags::SMALL != 0 => c.small_transfers += 1,
                Op::Transfer => c.large_transfers += 1,
                Op::Symlink => c.symlinks += 1,
                Op::FileMeta => c.attrs_only += 1,
                Op::Delete => c.deletes += 1,
                Op::Skip => c.skipped += 1,
                Op::DirMeta => {}
            }
        }
        c.transfer_bytes = self.large_transfers().iter().map(|l| l.size).sum::<u64>() + self.small_bytes();
        (c.source_files, c.source_bytes) = self.source_totals();
        let created = self.created();
        (c.created_files, c.created_dirs, c.created_symlinks) = (created.files, created.dirs, created.symlinks);
        c
    }
}
