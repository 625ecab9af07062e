//! The tree walk: parallel (directories are read on every core by jwalk's rayon workers,
//! each child lstat'ed there) and streaming (entries arrive in tree order and are packed
//! straight into the manifest, never held as one object per path). Symlinks are recorded,
//! never followed; exclude rules prune whole directories before they are read.

use super::filter::Filter;
use super::index::{Claim, TreeIndex};
use super::manifest::{flags, Kind, NewEntry, TreeBuilder, TreeManifest};
use super::path::{is_under, join, name_bytes};
use crate::error::{CoreError, Result};
use crate::file_identity::FileIdentity;
use jwalk::{ClientState, Parallelism, WalkDirGeneric};
use std::fs::Metadata;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub struct WalkOptions<'a> {
    /// Rules both peers apply (the sender's, sent over the wire): matches are invisible.
    pub filter: &'a Filter,
    /// Receiver's own rules: matches (and everything below a matched directory) are
    /// listed but flagged PROTECTED, so they are never deleted.
    pub protect: Option<&'a Filter>,
    /// Roots recorded by an earlier session, trusted when the stat identity matches.
    pub index: Option<&'a TreeIndex>,
    /// Incremented per entry listed.
    pub progress: Option<&'a AtomicU64>,
}

/// A walked local tree: its manifest plus what only this machine needs.
pub struct LocalTree {
    pub root: PathBuf,
    pub manifest: TreeManifest,
    /// Stat identity per manifest entry (files only; default elsewhere).
    pub identities: Vec<FileIdentity>,
    /// Directories that could not be read and special files skipped, for the report.
    pub problems: Vec<String>,
    /// Files whose root came from the index.
    pub indexed_files: u64,
}

#[derive(Debug, Default)]
struct Walk;

/// Per child, computed on the worker thread that read its directory.
#[derive(Debug, Default)]
struct ChildInfo {
    rel: Vec<u8>,
    stat: Option<StatInfo>,
    excluded: bool,
}

#[derive(Debug)]
struct StatInfo {
    kind: Kind,
    mode: u32,
    mtime_ns: i64,
    identity: FileIdentity,
    link: Vec<u8>,
}

impl ClientState for Walk {
    type ReadDirState = ();
    type DirEntryState = ChildInfo;
}

fn stat_info(m: &Metadata, path: &Path) -> Option<StatInfo> {
    let ft = m.file_type();
    let kind = if ft.is_symlink() {
        Kind::Symlink
    } else if ft.is_dir() {
        Kind::Dir
    } else if ft.is_file() {
        Kind::File
    } else {
        return None; // fifo, socket, device: not synced (as rsync without --specials)
    };
    let identity = FileIdentity::of(m);
    let link = if kind == Kind::Symlink {
        std::fs::read_link(path).ok().map(|t| name_bytes(t.as_os_str()))?
    } else {
        Vec::new()
    };
    Some(StatInfo {
        kind,
        mode: mode_of(m),
        mtime_ns: identity.mtime_ns,
        identity,
        link,
    })
}

#[cfg(unix)]
fn mode_of(m: &Metadata) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    m.permissions().mode() & 0o7777
}

#[cfg(not(unix))]
fn mode_of(m: &Metadata) -> u32 {
    match (m.is_dir(), m.permissions().readonly()) {
        (true, _) => 0o755,
        (false, true) => 0o444,
        (false, false) => 0o644,
    }
}

fn rel_bytes(root: &Path, p: &Path) -> Vec<u8> {
    let rel = p.strip_prefix(root).unwrap_or(Path::new(""));
    let mut out = Vec::new();
    for c in rel.components() {
        if !out.is_empty() {
            out.push(b'/');
        }
        out.extend_from_slice(&name_bytes(c.as_os_str()));
    }
    out
}

/// Walk `root` (a directory; a symlink to one is followed for the root only, since the
/// user named it). Errors below the root are recorded, not fatal.
pub fn walk(root: &Path, o: &WalkOptions) -> Result<LocalTree> {
    let meta = std::fs::metadata(root).map_err(|e| CoreError::io(root, e))?;
    if !meta.is_dir() {
        return Err(CoreError::Usage(format!("{} is not a directory", root.display())));
    }
    let root_buf = root.to_path_buf();
    let filter = Arc::new(o.filter.clone());
    let walker = WalkDirGeneric::<Walk>::new(root)
        .skip_hidden(false)
        .follow_links(false)
        .sort(true)
        .parallelism(Parallelism::RayonDefaultPool {
            busy_timeout: Duration::from_secs(30),
        })
        .process_read_dir({
            let root = root_buf.clone();
            let filter = filter.clone();
            move |_depth, dir, _state, children| {
                let rel_dir = rel_bytes(&root, dir);
                for child in children.iter_mut().flatten() {
                    let mut rel = rel_dir.clone();
                    if !rel.is_empty() {
                        rel.push(b'/');
                    }
                    rel.extend_from_slice(&name_bytes(&child.file_name));
                    let is_dir = child.file_type.is_dir();
                    if filter.excluded(&rel, is_dir) {
                        child.client_state.excluded = true;
                        child.read_children_path = None;
                        continue;
                    }
                    let full = dir.join(&child.file_name);
                    child.client_state.stat = std::fs::symlink_metadata(&full).ok().and_then(|m| stat_info(&m, &full));
                    if !child.client_state.stat.as_ref().is_some_and(|s| s.kind == Kind::Dir) {
                        child.read_children_path = None;
                    }
                    child.client_state.rel = rel;
                }
                children.retain(|c| c.as_ref().map_or(true, |c| !c.client_state.excluded));
            }
        });

    let mut b = TreeBuilder::new();
    let mut identities = Vec::new();
    let mut problems = Vec::new();
    let mut cursor = o.index.map(|i| i.cursor());
    let mut indexed_files = 0;
    let mut protected_dir: Option<Vec<u8>> = None;
    for item in walker {
        let entry = match item {
            Ok(e) => e,
            Err(e) => {
                problems.push(format!("cannot read: {e}"));
                continue;
            }
        };
        let mut fl = 0;
        if entry.read_children_error.is_some() {
            fl |= flags::UNREADABLE;
            problems.push(format!(
                "cannot read directory {}: permission denied or vanished",
                entry.path().display()
            ));
        }
        if entry.depth == 0 {
            let id = FileIdentity::of(&meta);
            b.push(&NewEntry {
                path: b"",
                kind: Kind::Dir,
                flags: fl,
                mode: mode_of(&meta),
                size: 0,
                mtime_ns: id.mtime_ns,
                root: None,
                link: b"",
            });
            identities.push(FileIdentity::default());
            continue;
        }
        let info = entry.client_state;
        let Some(st) = info.stat else {
            // Vanished between listing and stat, or a special file: not part of the tree.
            if entry.file_type.is_file() || entry.file_type.is_dir() || entry.file_type.is_symlink() {
                continue;
            }
            problems.push(format!("skipping non-regular file {}", join(root, &info.rel).display()));
            continue;
        };
        if let Some(p) = o.protect {
            if protected_dir.as_ref().is_some_and(|d| !is_under(&info.rel, d)) {
                protected_dir = None;
            }
            if protected_dir.is_some() || p.excluded(&info.rel, st.kind == Kind::Dir) {
                fl |= flags::PROTECTED;
                if st.kind == Kind::Dir && protected_dir.is_none() {
                    protected_dir = Some(info.rel.clone());
                }
            }
        }
        let root = match (&mut cursor, st.kind) {
            (Some(c), Kind::File) => c.root_for(&info.rel, &st.identity),
            _ => None,
        };
        indexed_files += root.is_some() as u64;
        b.push(&NewEntry {
            path: &info.rel,
            kind: st.kind,
            flags: fl,
            mode: st.mode,
            size: match st.kind {
                Kind::File => st.identity.size,
                Kind::Symlink => st.link.len() as u64,
                Kind::Dir => 0,
            },
            mtime_ns: st.mtime_ns,
            root,
            link: &st.link,
        });
        identities.push(if st.kind == Kind::File {
            st.identity
        } else {
            FileIdentity::default()
        });
        if let Some(p) = o.progress {
            p.fetch_add(1, Ordering::Relaxed);
        }
    }
    Ok(LocalTree {
        root: root_buf,
        manifest: b.finish(),
        identities,
        problems,
        indexed_files,
    })
}

impl LocalTree {
    /// Index claims for every file whose root is known from the walk.
    pub fn claims(&self) -> Vec<Claim> {
        self.manifest
            .iter()
            .enumerate()
            .filter_map(|(i, e)| {
                e.root.map(|r| Claim {
                    path: e.path.to_vec(),
                    identity: self.identities[i],
                    root: *r,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn lists_in_tree_order_without_following_links_and_prunes_excludes() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        fs::create_dir_all(r.join("a/x")).unwrap();
        fs::write(r.join("a/x/f"), b"12345").unwrap();
        fs::write(r.join("a-b"), b"").unwrap();
        fs::create_dir(r.join("skip")).unwrap();
        fs::write(r.join("skip/inner"), b"z").unwrap();
        fs::write(r.join("k.log"), b"z").unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink(r.join("a"), r.join("link")).unwrap();
        let filter = Filter::new(&["skip/".to_string(), "*.log".to_string()]).unwrap();
        let t = walk(
            r,
            &WalkOptions {
                filter: &filter,
                protect: None,
                index: None,
                progress: None,
            },
        )
        .unwrap();
        let paths: Vec<String> = t
            .manifest
            .iter()
            .map(|e| String::from_utf8_lossy(e.path).into_owned())
            .collect();
        #[cfg(unix)]
        assert_eq!(paths, vec!["", "a", "a/x", "a/x/f", "a-b", "link"]);
        let f = t.manifest.entry(3);
        assert_eq!((f.kind, f.size), (Kind::File, 5));
        #[cfg(unix)]
        assert_eq!(t.manifest.entry(5).kind, Kind::Symlink);
        // What we produce, a peer accepts.
        TreeManifest::decode(t.manifest.encoded().to_vec()).unwrap();
    }

    #[test]
    fn protect_rules_flag_a_directory_and_everything_below_it() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        fs::create_dir_all(r.join("keep/deep")).unwrap();
        fs::write(r.join("keep/deep/f"), b"1").unwrap();
        fs::write(r.join("other"), b"1").unwrap();
        let protect = Filter::new(&["keep/".to_string()]).unwrap();
        let t = walk(
            r,
            &WalkOptions {
                filter: &Filter::empty(),
                protect: Some(&protect),
                index: None,
                progress: None,
            },
        )
        .unwrap();
        let flagged: Vec<bool> = t.manifest.iter().map(|e| e.has(flags::PROTECTED)).collect();
        assert_eq!(flagged, vec![false, true, true, true, false]);
    }
}
