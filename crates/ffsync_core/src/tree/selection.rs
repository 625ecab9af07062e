//! rsync's `--files-from` on the sender's walk: only the listed paths, the directories on
//! the way to them (rsync's implied directories, with their own attributes), a directory's
//! own entries when it is listed with a trailing `/` (rsync's implied `--dirs`), and, with
//! `-r`, everything below a listed directory. The list is a set, so a walk checks each name in
//! constant time however long the list is (a filter rule per path would not scale, and would
//! have to travel in FILTER).

use std::collections::HashSet;

#[derive(Debug, Clone, Default)]
pub struct Selection {
    listed: HashSet<Vec<u8>>,
    on_the_way: HashSet<Vec<u8>>,
    /// Listed as `dir/` (or `dir/.`): its entries too, one level.
    contents: HashSet<Vec<u8>>,
    recursive: bool,
}

impl Selection {
    /// Each line a path relative to the source root (a leading `/`, `./` components and a
    /// trailing `/` are ignored, as rsync ignores them); blank lines and lines starting with
    /// `#` or `;` are skipped. A path with a `..` component is refused (returned as a note):
    /// it would name something outside the tree.
    pub fn new(lines: &[String], recursive: bool) -> (Selection, Vec<String>) {
        let mut s = Selection {
            recursive,
            ..Selection::default()
        };
        let mut notes = Vec::new();
        for line in lines {
            if line.trim().is_empty() || line.starts_with('#') || line.starts_with(';') {
                continue;
            }
            let parts: Vec<&str> = line.split('/').filter(|c| !c.is_empty() && *c != ".").collect();
            if parts.contains(&"..") {
                notes.push(format!("--files-from: {line:?} leaves the source directory; skipped"));
                continue;
            }
            for k in 1..parts.len() {
                s.on_the_way.insert(parts[..k].join("/").into_bytes());
            }
            let path = parts.join("/").into_bytes();
            if line.ends_with('/') || line.ends_with("/.") || line == "." {
                s.contents.insert(path.clone());
            }
            s.listed.insert(path);
        }
        (s, notes)
    }

    /// Everything in directory `rel_dir` is selected: it is, or lies below, a listed
    /// directory, and the walk recurses (-r).
    pub fn all_of(&self, rel_dir: &[u8]) -> bool {
        if !self.recursive {
            return false;
        }
        if self.listed.contains(rel_dir) || self.listed.contains(&b""[..]) {
            return true;
        }
        rel_dir
            .iter()
            .enumerate()
            .filter(|(_, b)| **b == b'/')
            .any(|(i, _)| self.listed.contains(&rel_dir[..i]))
    }

    /// Whether the walk keeps `rel`, a child of a directory for which `all_of` said `all`.
    pub fn keeps(&self, rel: &[u8], all: bool) -> bool {
        let parent = rel.iter().rposition(|b| *b == b'/').map_or(&b""[..], |i| &rel[..i]);
        all || self.listed.contains(rel) || self.on_the_way.contains(rel) || self.contents.contains(parent)
    }

    /// The listed paths, for the check that each exists.
    pub fn listed(&self) -> impl Iterator<Item = &[u8]> {
        self.listed.iter().map(Vec::as_slice)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listed_paths_their_directories_and_with_r_what_is_below() {
        let lines: Vec<String> = ["/a/b/c.txt", "./d/", "# comment", "", "e//f", "../x"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let (s, notes) = Selection::new(&lines, false);
        assert_eq!(notes.len(), 1, "{notes:?}");
        for kept in ["a", "a/b", "a/b/c.txt", "d", "e", "e/f"] {
            assert!(s.keeps(kept.as_bytes(), false), "{kept}");
        }
        assert!(!s.keeps(b"a/other", false));
        assert!(
            s.keeps(b"d/x", false) && s.keeps(b"d/sub", false),
            "listed as d/: its entries too"
        );
        assert!(!s.keeps(b"d/sub/y", false), "one level");
        assert!(!s.keeps(b"e/f/g", false), "listed without a slash: only itself");
        assert!(!s.all_of(b"d"), "without -r a listed directory is not recursed");
        let (r, _) = Selection::new(&lines, true);
        assert!(r.all_of(b"d") && r.all_of(b"d/deep/er"));
        assert!(!r.all_of(b"a") && !r.all_of(b"dd"));
    }
}
