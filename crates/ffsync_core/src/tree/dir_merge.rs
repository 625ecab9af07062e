//! Per-directory merge files (rsync's `dir-merge NAME`, the `:` filter rule): `-F` reads
//! `.rsync-filter` in every directory of the sender's tree, `-C` reads `.cvsignore`. The
//! rules of such a file apply to the directory it sits in (and, unless it is a no-inherit
//! file like `.cvsignore`, to everything below it), after the command line's rules, the
//! deepest directory's first.
//!
//! The sender's walk reads them as it lists each directory (tree/walk.rs) and re-anchors
//! each rule at the tree root ([`rebase`]), so the whole set can travel as one ordered list
//! in the FILTER frame: the receiver's walk then hides exactly what the sender's did, and
//! `--delete` never removes what a merge file excluded.

/// How one kind of merge file is read (rsync's rule modifiers).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirMerge {
    /// The file name looked for in each directory (`.rsync-filter`, `.cvsignore`).
    pub name: String,
    /// Rules apply below the directory too (rsync's default); `false` is the `n` modifier.
    pub inherit: bool,
    /// Split each line on whitespace into one pattern per word (`w`).
    pub word_split: bool,
    /// Lines are bare patterns of this kind (`-`: excludes, `+`: includes), not rules.
    pub bare: Option<bool>,
}

impl DirMerge {
    /// rsync's `-F`: `dir-merge /.rsync-filter`.
    pub fn rsync_filter() -> DirMerge {
        DirMerge {
            name: ".rsync-filter".into(),
            inherit: true,
            word_split: false,
            bare: None,
        }
    }

    /// rsync's `-C`: `:C` = `dir-merge,nw- .cvsignore`.
    pub fn cvsignore() -> DirMerge {
        DirMerge {
            name: ".cvsignore".into(),
            inherit: false,
            word_split: true,
            bare: Some(true),
        }
    }

    /// The patterns of one merge file (our syntax: `!` re-includes), relative to its
    /// directory, and a note for each line that cannot be honoured (named, skipped).
    pub fn parse(&self, text: &str) -> (Vec<String>, Vec<String>) {
        let mut out = Vec::new();
        let mut problems = Vec::new();
        for line in text.lines() {
            let line = line.strip_suffix('\r').unwrap_or(line);
            if let Some(exclude) = self.bare {
                let words: Vec<&str> = if self.word_split {
                    line.split_whitespace().collect()
                } else {
                    vec![line]
                };
                for w in words.into_iter().filter(|w| !w.is_empty()) {
                    if w == "!" {
                        out.clear(); // rsync: "!" clears the list so far
                    } else {
                        out.push(if exclude { w.to_string() } else { format!("!{w}") });
                    }
                }
                continue;
            }
            let t = line.trim_start();
            if t.is_empty() || t.starts_with('#') || t.starts_with(';') {
                continue;
            }
            if t == "!" {
                out.clear();
                continue;
            }
            match rule_of(t) {
                Some((true, pat)) => out.push(pat.to_string()),
                Some((false, pat)) => out.push(format!("!{pat}")),
                None => problems.push(format!(
                    "rule {t:?} is not supported in a per-directory merge file (only - and +); skipped"
                )),
            }
        }
        (out, problems)
    }
}

/// `- pat` / `exclude pat` → (true, pat); `+ pat` / `include pat` → (false, pat); else None.
fn rule_of(t: &str) -> Option<(bool, &str)> {
    for (prefix, exclude) in [("- ", true), ("+ ", false), ("exclude ", true), ("include ", false)] {
        if let Some(p) = t.strip_prefix(prefix) {
            return (!p.is_empty()).then_some((exclude, p));
        }
    }
    None
}

/// A merge-file pattern found in directory `dir` ('/'-separated, relative to the tree root)
/// re-anchored at the root: `/dir/pat` for a pattern with a `/` (anchored at its directory);
/// for a bare name, `/dir/**/name` (any depth below) or, without inheritance, `/dir/name`.
pub fn rebase(dir: &[u8], pattern: &str, inherit: bool) -> String {
    let (neg, body) = match pattern.strip_prefix('!') {
        Some(rest) => ("!", rest),
        None => ("", pattern),
    };
    let trimmed = body.trim_end_matches('/');
    let anchored = trimmed.contains('/');
    let tail = body.trim_start_matches('/');
    let mut prefix = String::new();
    for c in String::from_utf8_lossy(dir).chars() {
        if "*?[]{}\\!".contains(c) {
            prefix.push('\\');
        }
        prefix.push(c);
    }
    let at = if prefix.is_empty() {
        String::new()
    } else {
        format!("/{prefix}")
    };
    if anchored || !inherit {
        format!("{neg}{at}/{tail}")
    } else {
        format!("{neg}{at}/**/{tail}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::filter::Filter;

    #[test]
    fn rules_and_bare_words_parse_as_rsync_reads_them() {
        let (p, bad) =
            DirMerge::rsync_filter().parse("# comment\n- *.o\n+ keep.o\ninclude x\nexclude /build/\n\nP protected\n");
        assert_eq!(p, ["*.o", "!keep.o", "!x", "/build/"]);
        assert_eq!(bad.len(), 1, "{bad:?}");
        let (p, bad) = DirMerge::cvsignore().parse("a.tmp  b.log\n! \nc\n");
        assert!(bad.is_empty());
        assert_eq!(p, ["c"], "'!' clears what came before");
    }

    #[test]
    fn rebased_rules_match_what_they_matched_in_their_directory() {
        let f = Filter::new(&[
            rebase(b"src/a", "*.o", true),
            rebase(b"src/a", "/gen/", true),
            rebase(b"src/a", "!keep.o", true),
            rebase(b"lib", "*.tmp", false),
            rebase(b"we[ird]", "x", true),
        ])
        .unwrap();
        assert!(f.excluded(b"src/a/x.o", false));
        assert!(f.excluded(b"src/a/deep/er/x.o", false), "inherited below");
        assert!(!f.excluded(b"src/x.o", false), "not above its directory");
        assert!(f.excluded(b"src/a/gen", true));
        assert!(!f.excluded(b"src/a/deep/gen", true), "anchored at its directory");
        assert!(f.excluded(b"lib/t.tmp", false));
        assert!(!f.excluded(b"lib/sub/t.tmp", false), "no-inherit: that directory only");
        assert!(f.excluded(b"we[ird]/x", false), "directory names are escaped");
        assert!(!f.excluded(b"wei/x", false));
        assert_eq!(rebase(b"", "*.o", true), "/**/*.o");
    }
}
