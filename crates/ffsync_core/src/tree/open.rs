//! One peer's side of a tree sync, opened from its settings as the shell gives them: the
//! rules parsed (excludes, protect, --chmod, merge files, --files-from), the tree index
//! loaded, the tree walked, and what the walk and the selection noted gathered as problems.

use super::chmod::ChmodRules;
use super::dir_merge::DirMerge;
use super::filter::Filter;
use super::index;
use super::selection::Selection;
use super::sync::TreeSync;
use super::walk::{walk, WalkOptions};
use crate::error::Result;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;

/// What a peer walks and how (`send`/`receive`'s options and rsync's flags for the walk).
#[derive(Clone, Debug, Default)]
pub struct TreeSettings {
    /// Exclude patterns both peers apply (the sender's).
    pub excludes: Vec<String>,
    /// Receiver's own patterns: listed but protected from deletion.
    pub protect: Vec<String>,
    /// Where the tree index lives; `None` neither reads nor writes one.
    pub state_dir: Option<PathBuf>,
    /// Ignore the index (`--checksum`); a fresh one is still written.
    pub ignore_index: bool,
    pub is_sender: bool,
    /// rsync's -x.
    pub one_file_system: bool,
    /// Leave symlinks out, each noted (`sync` without -l).
    pub skip_symlinks: bool,
    /// rsync's -L (sender).
    pub copy_links: bool,
    /// rsync's --chmod rules (sender).
    pub chmod: Option<String>,
    /// rsync's -m (sender).
    pub prune_empty_dirs: bool,
    /// Per-directory merge files (sender).
    pub dir_merge: Vec<DirMerge>,
    /// rsync's --files-from lines (sender).
    pub files_from: Option<Vec<String>>,
    /// With `files_from`: recurse into listed directories.
    pub files_from_recursive: bool,
}

/// Walk `root` as `s` says; `progress` counts the entries listed. Malformed rules are errors
/// (nothing is walked); paths --files-from refuses are the session's problems (exit 23).
pub fn open_tree(root: &Path, s: &TreeSettings, progress: &AtomicU64) -> Result<TreeSync> {
    let filter = Filter::new(&s.excludes)?;
    let chmod = s.chmod.as_deref().map(ChmodRules::parse).transpose()?;
    let protect = if s.protect.is_empty() {
        None
    } else {
        Some(Filter::new(&s.protect)?)
    };
    let selection = s
        .files_from
        .as_ref()
        .map(|lines| Selection::new(lines, s.files_from_recursive));
    let idx = match (&s.state_dir, s.ignore_index) {
        (Some(d), false) => index::load(d, root),
        _ => None,
    };
    let mut local = walk(
        root,
        &WalkOptions {
            filter: &filter,
            protect: protect.as_ref(),
            index: idx.as_ref(),
            progress: Some(progress),
            one_file_system: s.one_file_system,
            skip_symlinks: s.skip_symlinks,
            copy_links: s.copy_links,
            chmod: chmod.as_ref(),
            prune_empty_dirs: s.prune_empty_dirs,
            dir_merge: &s.dir_merge,
            select: selection.as_ref().map(|(sel, _)| sel),
        },
    )?;
    local
        .problems
        .extend(selection.into_iter().flat_map(|(_, notes)| notes));
    Ok(TreeSync::new(local, s.is_sender, s.state_dir.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::sync::atomic::Ordering;

    #[test]
    fn walks_with_the_rules_given_and_gathers_the_selection_notes() {
        let d = tempfile::tempdir().unwrap();
        fs::create_dir(d.path().join("sub")).unwrap();
        fs::write(d.path().join("a.txt"), b"a").unwrap();
        fs::write(d.path().join("b.log"), b"b").unwrap();
        fs::write(d.path().join("sub/c.txt"), b"c").unwrap();
        let progress = AtomicU64::new(0);
        let s = TreeSettings {
            excludes: vec!["*.log".into()],
            is_sender: true,
            files_from: Some(vec!["a.txt".into(), "b.log".into(), "../out".into()]),
            ..Default::default()
        };
        let t = open_tree(d.path(), &s, &progress).unwrap();
        let listed: Vec<Vec<u8>> = t.local.manifest.iter().map(|e| e.path.to_vec()).collect();
        assert!(listed.contains(&b"a.txt".to_vec()));
        assert!(!listed.contains(&b"b.log".to_vec()), "excluded");
        assert!(!listed.contains(&b"sub/c.txt".to_vec()), "not selected");
        // Every entry below the root (the root itself is listed before the walk starts).
        assert_eq!(progress.load(Ordering::Relaxed), listed.len() as u64 - 1, "{listed:?}");
        assert!(
            t.problems().iter().any(|p| p.contains("..")),
            "the refused --files-from line is a problem: {:?}",
            t.problems()
        );
    }

    #[test]
    fn malformed_rules_are_errors_before_anything_is_walked() {
        let d = tempfile::tempdir().unwrap();
        let progress = AtomicU64::new(0);
        let bad_chmod = TreeSettings {
            chmod: Some("q+z".into()),
            ..Default::default()
        };
        assert!(open_tree(d.path(), &bad_chmod, &progress).is_err());
        assert_eq!(progress.load(Ordering::Relaxed), 0);
    }
}
