//! rsync's `--itemize-changes` (`-i`) lines for a tree plan: `YXcstpoguax name`, as rsync's
//! `log.c` prints `%i %n%L`. Y is the update type (`<` sent to the remote side, `>`
//! received here, `c` created locally: directories and symlinks, `.` attributes only, `*`
//! a message such as `*deleting`); X the file type (`f`, `d`, `L`); then one letter per
//! attribute that differs (`c` checksum, `s` size, `t` time, `p` permissions), `+` for
//! all of them on a new item, `.` for one that is the same. Owner, group, ACL and xattr
//! columns stay `.` (owners and xattrs travel in their own table, not in the plan).

use super::manifest::{EntryRef, Kind, TreeManifest};
use super::path::display;
use super::triage::{action_flags, Op, Plan, NONE};
use std::cmp::Ordering;

/// Which way file data moves, seen from the side that prints (rsync's Y column for files).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// This side receives (local sync, pull): `>`.
    Received,
    /// This side sends to a remote receiver (push): `<`.
    Sent,
}

const NEW: &str = "+++++++++";

/// One line per action that changes something, in the sender's tree order as rsync lists
/// them (a directory, then what is in it), deletions last (they happen last here, as with
/// rsync's --delete-after); the root directory is `./`.
/// `root_created`: the receiver created the tree's root for this session (it walks an
/// empty directory then, so only the caller knows): listed first as `cd+++++++++ ./`.
pub fn itemize(plan: &Plan, s: &TreeManifest, r: &TreeManifest, direction: Direction, root_created: bool) -> String {
    let file_y = match direction {
        Direction::Received => '>',
        Direction::Sent => '<',
    };
    // (path for ordering, is a directory, deletion?, line)
    let mut lines: Vec<(&[u8], bool, bool, String)> = Vec::new();
    if root_created {
        lines.push((b"", true, false, format!("cd{NEW} ./")));
    }
    for a in &plan.actions {
        let se = |a: &super::triage::Action| s.entry(a.sender_entry as usize);
        let old = |a: &super::triage::Action| {
            (a.receiver_entry != NONE && a.flags & action_flags::REPLACE == 0)
                .then(|| r.entry(a.receiver_entry as usize))
        };
        let line = match a.op {
            Op::Mkdir => format!("cd{NEW} {}", name(&se(a))),
            Op::LocalCopy => format!("{file_y}f{NEW} {}", name(&se(a))),
            Op::Transfer => match old(a) {
                None => format!("{file_y}f{NEW} {}", name(&se(a))),
                Some(re) => format!("{file_y}f{} {}", changed(&se(a), &re, true), name(&se(a))),
            },
            Op::Symlink => {
                let e = se(a);
                let attrs = match old(a) {
                    None => NEW.to_string(),
                    Some(re) => changed(&e, &re, false),
                };
                format!("cL{attrs} {} -> {}", name(&e), display(e.link))
            }
            Op::FileMeta => match old(a) {
                Some(re) => format!(".f{} {}", changed(&se(a), &re, false), name(&se(a))),
                None => continue,
            },
            Op::DirMeta if root_created && a.sender_entry == 0 => continue,
            Op::DirMeta => match old(a) {
                // A directory whose own time or mode differs; one that only had entries
                // created in it is restamped silently, as rsync does.
                Some(re) if re.kind == Kind::Dir => {
                    let attrs = changed(&se(a), &re, false);
                    if attrs.bytes().all(|b| b == b'.') {
                        continue;
                    }
                    format!(".d{attrs} {}", name(&se(a)))
                }
                _ => continue,
            },
            Op::Delete => format!("*deleting   {}", name(&r.entry(a.receiver_entry as usize))),
            Op::Skip => continue,
        };
        let (e, deletion) = match a.op {
            Op::Delete => (r.entry(a.receiver_entry as usize), true),
            _ => (s.entry(a.sender_entry as usize), false),
        };
        lines.push((e.path, e.kind == Kind::Dir, deletion, line));
    }
    // Deletions keep the plan's order (contents before their directory).
    lines.sort_by(|x, y| {
        x.2.cmp(&y.2).then_with(|| {
            if x.2 {
                Ordering::Equal
            } else {
                rsync_order((x.0, x.1), (y.0, y.1))
            }
        })
    });
    let mut out = String::new();
    for (_, _, _, l) in lines {
        out.push_str(&l);
        out.push('\n');
    }
    out
}

/// rsync's list order: a directory, then its files and symlinks (by name), then its
/// subdirectories (by name), each followed by what is in it.
fn rsync_order(a: (&[u8], bool), b: (&[u8], bool)) -> Ordering {
    let (ac, bc): (Vec<&[u8]>, Vec<&[u8]>) = (parts(a.0), parts(b.0));
    for k in 0..ac.len().min(bc.len()) {
        if ac[k] != bc[k] {
            // At this level, is each side a directory (more below it, or itself one)?
            let a_dir = k + 1 < ac.len() || a.1;
            let b_dir = k + 1 < bc.len() || b.1;
            return a_dir.cmp(&b_dir).then_with(|| ac[k].cmp(bc[k]));
        }
    }
    ac.len().cmp(&bc.len()) // an ancestor before what is in it
}

fn parts(p: &[u8]) -> Vec<&[u8]> {
    if p.is_empty() {
        Vec::new()
    } else {
        p.split(|&c| c == b'/').collect()
    }
}

/// The nine attribute columns for an item that exists on both sides.
fn changed(s: &EntryRef, r: &EntryRef, content_changed: bool) -> String {
    // rsync compares no size for a symlink: a new target shows as `c` alone.
    let size = s.kind != Kind::Symlink && s.size != r.size;
    let time = s.mtime_ns != r.mtime_ns;
    let perms = s.kind != Kind::Symlink && (s.mode & 0o7777) != (r.mode & 0o7777);
    // `c`: the content differs where size and time could not tell (a symlink's target, or a
    // file our content roots caught with the same size and time).
    let checksum = if s.kind == Kind::Symlink {
        s.link != r.link
    } else {
        content_changed && !size && !time
    };
    let mut c = String::with_capacity(9);
    c.push(if checksum { 'c' } else { '.' });
    c.push(if size { 's' } else { '.' });
    c.push(if time { 't' } else { '.' });
    c.push(if perms { 'p' } else { '.' });
    c.push_str(".....");
    c
}

/// rsync's `%n`: the path, `./` for the root, a trailing `/` on directories.
fn name(e: &EntryRef) -> String {
    match (e.path.is_empty(), e.kind == Kind::Dir) {
        (true, _) => "./".to_string(),
        (false, true) => format!("{}/", display(e.path)),
        (false, false) => display(e.path),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::manifest::{NewEntry, TreeBuilder};
    use crate::tree::triage::{triage, TriageOptions};

    fn tree(entries: &[(&str, Kind, u64, i64, u32, &str)]) -> TreeManifest {
        let mut b = TreeBuilder::default();
        for &(p, kind, size, mtime_ns, mode, link) in entries {
            b.push(&NewEntry {
                path: p.as_bytes(),
                kind,
                flags: 0,
                mode,
                size,
                mtime_ns,
                root: None,
                link: link.as_bytes(),
            });
        }
        b.finish()
    }

    #[test]
    fn new_changed_attribute_only_and_deleted_items_read_like_rsync() {
        use Kind::*;
        let s = tree(&[
            ("", Dir, 0, 5, 0o755, ""),
            ("a", File, 10, 1, 0o644, ""),
            ("b", File, 20, 2, 0o644, ""),
            ("c", File, 30, 3, 0o600, ""),
            ("d", Dir, 0, 4, 0o755, ""),
            ("d/l", Symlink, 0, 4, 0o777, "../a"),
            ("m", Symlink, 0, 4, 0o777, "new-target"),
        ]);
        let r = tree(&[
            ("", Dir, 0, 5, 0o755, ""),
            ("b", File, 21, 1, 0o644, ""),
            ("c", File, 30, 3, 0o644, ""),
            ("m", Symlink, 0, 4, 0o777, "old"),
            ("x", File, 1, 1, 0o644, ""),
        ]);
        let none = Default::default();
        let plan = triage(
            &s,
            &r,
            &none,
            &none,
            TriageOptions {
                delete: true,
                ..Default::default()
            },
        );
        let mut got: Vec<String> = itemize(&plan, &s, &r, Direction::Received, false)
            .lines()
            .map(String::from)
            .collect();
        got.sort();
        let mut want = vec![
            ">f+++++++++ a",
            ">f.st...... b",
            ".f...p..... c",
            "cd+++++++++ d/",
            "cL+++++++++ d/l -> ../a",
            "cLc........ m -> new-target",
            "*deleting   x",
        ];
        want.sort();
        assert_eq!(got, want);
        assert!(itemize(&plan, &s, &r, Direction::Sent, false).contains("<f+++++++++ a\n"));
        // A root created for this session leads, whatever its times.
        let fresh = itemize(&plan, &s, &r, Direction::Received, true);
        assert!(
            fresh.starts_with("cd+++++++++ ./\n") && fresh.lines().filter(|l| l.ends_with(" ./")).count() == 1,
            "{fresh}"
        );
    }
}
