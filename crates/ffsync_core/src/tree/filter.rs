//! Exclude rules for directory-tree sync (rsync's `--exclude` / `--exclude-from`).
//!
//! The glob grammar itself is globset's (`*`, `?`, `**`, `[a-z]`, `[!a-z]`, `\` escapes, and
//! globset's `{a,b}` alternates), compiled with `literal_separator` so `*`, `?` and classes
//! never match `/`. This module adds the rule layer on top:
//!
//! - a pattern containing a `/` other than a trailing one is anchored at the tree root and
//!   matched against the whole relative path (a leading `/` means the same thing); otherwise it
//!   is matched against the basename, at any depth;
//! - a trailing `/` restricts the rule to directories;
//! - a leading `!` re-includes;
//! - the first matching rule decides; no matching rule means included.
//!
//! Paths are matched as bytes (names may be non-UTF-8 on Linux): as in rsync, `?` matches one
//! byte and a class matches one byte (a non-ASCII character in a class matches any one of its
//! UTF-8 bytes), while `*` spans any bytes but `/`. Rules are not applied to ancestors: a walker
//! is expected to skip the contents of an excluded directory itself.

use globset::{Candidate, Glob, GlobBuilder, GlobSet, GlobSetBuilder};

use crate::error::CoreError;

/// Most patterns a filter may carry (checked by [`Filter::new`] and [`Filter::decode`]).
const MAX_PATTERNS: usize = 4096;
/// Largest wire form of a filter, in bytes.
const MAX_WIRE_BYTES: usize = 64 * 1024;

#[derive(Debug, Clone)]
struct Rule {
    /// This rule's glob alone. A one-glob `GlobSet` rather than a `GlobMatcher`: building it
    /// reports regex failures instead of panicking, and literal / extension globs skip the regex.
    matcher: GlobSet,
    /// `!pattern`: a match re-includes.
    negate: bool,
    /// `pattern/`: only directories can match.
    dir_only: bool,
    /// Matched against the whole relative path rather than the basename.
    anchored: bool,
}

/// An ordered list of exclude / re-include rules. Cheap to query: every glob is compiled once,
/// and a path that no rule can match is rejected by one `GlobSet` probe per form (whole path,
/// basename) without allocating.
#[derive(Debug, Clone)]
pub struct Filter {
    patterns: Vec<String>,
    rules: Vec<Rule>,
    /// Union of the anchored rules' globs: a quick "can anything match the whole path?".
    anchored_set: GlobSet,
    /// Union of the basename rules' globs.
    base_set: GlobSet,
}

impl Filter {
    /// Compiles `patterns` (in order; the first matching rule wins).
    ///
    /// Fails with a usage error naming the pattern when one is empty, is a bare `!` (or reduces
    /// to nothing, like `/`), contains a newline, or is not a valid glob; also when there are
    /// more than 4096 patterns or their wire form would exceed 64 KiB, so that whatever `new`
    /// accepts, [`Filter::decode`] accepts too.
    pub fn new(patterns: &[String]) -> crate::Result<Filter> {
        if patterns.len() > MAX_PATTERNS {
            return Err(CoreError::Usage(format!(
                "too many exclude patterns ({}; the limit is {MAX_PATTERNS})",
                patterns.len()
            )));
        }
        let wire_len = patterns.iter().map(|p| p.len()).sum::<usize>() + patterns.len().saturating_sub(1);
        if wire_len > MAX_WIRE_BYTES {
            return Err(CoreError::Usage(format!(
                "exclude patterns too long ({wire_len} bytes in all; the limit is {MAX_WIRE_BYTES})"
            )));
        }
        let mut rules = Vec::with_capacity(patterns.len());
        let mut anchored = GlobSetBuilder::new();
        let mut base = GlobSetBuilder::new();
        for pattern in patterns {
            let (rule, glob) = compile(pattern)?;
            if rule.anchored {
                anchored.add(glob);
            } else {
                base.add(glob);
            }
            rules.push(rule);
        }
        Ok(Filter {
            patterns: patterns.to_vec(),
            rules,
            anchored_set: build_set(anchored)?,
            base_set: build_set(base)?,
        })
    }

    /// A filter that excludes nothing.
    pub fn empty() -> Filter {
        Filter {
            patterns: Vec::new(),
            rules: Vec::new(),
            anchored_set: GlobSet::empty(),
            base_set: GlobSet::empty(),
        }
    }

    /// Lines of an --exclude-from file -> patterns (skips blanks and # comments).
    ///
    /// A trailing `\r` is stripped from each line, as is a leading byte-order mark. Lines that
    /// are empty or whitespace only are blank; a line whose first character is `#` is a comment.
    /// Other whitespace is kept: it is part of the pattern.
    pub fn patterns_from_text(text: &str) -> Vec<String> {
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        text.split('\n')
            .map(|line| line.strip_suffix('\r').unwrap_or(line))
            .filter(|line| !line.trim().is_empty() && !line.starts_with('#'))
            .map(str::to_owned)
            .collect()
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The patterns as given (they travel on the wire so both peers filter identically).
    pub fn patterns(&self) -> &[String] {
        &self.patterns
    }

    /// True when the first matching rule is an exclude. `rel` is the '/'-separated relative path.
    ///
    /// `rel` has no leading or trailing `/`; the empty path (the tree root) is never excluded.
    pub fn excluded(&self, rel: &[u8], is_dir: bool) -> bool {
        self.decide(rel, is_dir).unwrap_or(false)
    }

    /// The first matching rule's verdict (`Some(true)`: excluded, `Some(false)`: included),
    /// or `None` when no rule matches, so a later list (a directory's merge file) may decide.
    pub fn decide(&self, rel: &[u8], is_dir: bool) -> Option<bool> {
        if self.rules.is_empty() || rel.is_empty() {
            return None;
        }
        let full = (!self.anchored_set.is_empty()).then(|| Candidate::from_bytes(rel));
        let base = (!self.base_set.is_empty()).then(|| Candidate::from_bytes(basename(rel)));
        let any = full.as_ref().is_some_and(|c| self.anchored_set.is_match_candidate(c))
            || base.as_ref().is_some_and(|c| self.base_set.is_match_candidate(c));
        if !any {
            return None;
        }
        for rule in &self.rules {
            if rule.dir_only && !is_dir {
                continue;
            }
            let candidate = if rule.anchored { &full } else { &base };
            if candidate.as_ref().is_some_and(|c| rule.matcher.is_match_candidate(c)) {
                return Some(!rule.negate);
            }
        }
        None
    }

    /// Wire form: patterns joined by '\n' (patterns never contain '\n'; reject one that does in new()).
    pub fn encode(&self) -> Vec<u8> {
        self.patterns.join("\n").into_bytes()
    }

    /// Inverse of [`Filter::encode`]. Anything wrong with `buf` (over 64 KiB, non-UTF-8, more
    /// than 4096 patterns, an invalid pattern) is a malformed-input error.
    pub fn decode(buf: &[u8]) -> crate::Result<Filter> {
        const WHAT: &str = "exclude filter";
        if buf.is_empty() {
            return Ok(Filter::empty());
        }
        if buf.len() > MAX_WIRE_BYTES {
            return Err(CoreError::malformed(
                WHAT,
                format!("{} bytes (the limit is {MAX_WIRE_BYTES})", buf.len()),
            ));
        }
        let text = std::str::from_utf8(buf).map_err(|e| CoreError::malformed(WHAT, format!("not UTF-8: {e}")))?;
        let count = text.split('\n').count();
        if count > MAX_PATTERNS {
            return Err(CoreError::malformed(
                WHAT,
                format!("{count} patterns (the limit is {MAX_PATTERNS})"),
            ));
        }
        let patterns: Vec<String> = text.split('\n').map(str::to_owned).collect();
        Filter::new(&patterns).map_err(|e| CoreError::malformed(WHAT, e.to_string()))
    }
}

/// Parses one pattern into its rule and the glob (for the prefilter set).
fn compile(pattern: &str) -> crate::Result<(Rule, Glob)> {
    let usage = |why: &str| CoreError::Usage(format!("invalid exclude pattern {pattern:?}: {why}"));
    if pattern.is_empty() {
        return Err(usage("empty pattern"));
    }
    if pattern.contains('\n') {
        return Err(usage("contains a newline"));
    }
    let (negate, body) = match pattern.strip_prefix('!') {
        Some(rest) => (true, rest),
        None => (false, pattern),
    };
    let trimmed = body.trim_end_matches('/');
    let dir_only = trimmed.len() != body.len();
    let anchored = trimmed.contains('/');
    let glob_text = trimmed.trim_start_matches('/');
    if glob_text.is_empty() {
        return Err(usage("nothing to match"));
    }
    let glob = GlobBuilder::new(glob_text)
        .literal_separator(true)
        .backslash_escape(true)
        .case_insensitive(false)
        .empty_alternates(false)
        .build()
        .map_err(|e| usage(&e.kind().to_string()))?;
    let matcher = GlobSetBuilder::new()
        .add(glob.clone())
        .build()
        .map_err(|e| usage(&e.kind().to_string()))?;
    let rule = Rule {
        matcher,
        negate,
        dir_only,
        anchored,
    };
    Ok((rule, glob))
}

fn build_set(builder: GlobSetBuilder) -> crate::Result<GlobSet> {
    builder
        .build()
        .map_err(|e| CoreError::Usage(format!("invalid exclude patterns: {e}")))
}

/// The last '/'-separated component of `rel` (all of it when there is no '/').
fn basename(rel: &[u8]) -> &[u8] {
    match rel.iter().rposition(|&b| b == b'/') {
        Some(i) => &rel[i + 1..],
        None => rel,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(patterns: &[&str]) -> Filter {
        let owned: Vec<String> = patterns.iter().map(|p| p.to_string()).collect();
        Filter::new(&owned).unwrap_or_else(|e| panic!("{patterns:?}: {e}"))
    }

    fn new_err(patterns: &[&str]) -> CoreError {
        let owned: Vec<String> = patterns.iter().map(|p| p.to_string()).collect();
        match Filter::new(&owned) {
            Ok(_) => panic!("{patterns:?} should be rejected"),
            Err(e) => e,
        }
    }

    /// Each case: patterns, relative path, is_dir, expected `excluded`.
    type Case = (&'static [&'static str], &'static [u8], bool, bool);

    fn run(cases: &[Case]) {
        for &(patterns, rel, is_dir, want) in cases {
            let f = filter(patterns);
            assert_eq!(
                f.excluded(rel, is_dir),
                want,
                "patterns {patterns:?}, path {:?} (dir: {is_dir})",
                String::from_utf8_lossy(rel)
            );
        }
    }

    #[test]
    fn star_and_question_never_cross_slash() {
        run(&[
            (&["*.log"], b"a.log", false, true),
            (&["*.log"], b"deep/dir/a.log", false, true),
            (&["*.log"], b"a.log.txt", false, false),
            (&["a*b"], b"a/b", false, false),
            (&["a*b"], b"axyzb", false, true),
            (&["a*b"], b"ab", false, true),
            (&["/a*b"], b"a/b", false, false),
            (&["x/a*"], b"x/a/b", false, false),
            (&["x/a*"], b"x/abc", false, true),
            (&["a?b"], b"a/b", false, false),
            (&["a?b"], b"acb", false, true),
            (&["a?b"], b"ab", false, false),
            (&["a?b"], b"accb", false, false),
            (&["x/a?b"], b"x/a/b", false, false),
            (&["?"], b"z", false, true),
            (&["?"], b"zz", false, false),
            // `?` is one byte, as in rsync: a two-byte UTF-8 character needs two
            (&["?"], "\u{e9}".as_bytes(), false, false),
            (&["??"], "\u{e9}".as_bytes(), false, true),
            (&["*"], b"anything", false, true),
            (&["*"], b"deep/anything", true, true),
            (&["/*"], b"top", false, true),
            (&["/*"], b"top/child", false, false),
        ]);
    }

    #[test]
    fn double_star() {
        run(&[
            // middle: zero or more segments
            (&["a/**/b"], b"a/b", false, true),
            (&["a/**/b"], b"a/x/b", false, true),
            (&["a/**/b"], b"a/x/y/b", false, true),
            (&["a/**/b"], b"a/x/y/c", false, false),
            (&["a/**/b"], b"z/a/b", false, false),
            (&["a/**/b"], b"ab", false, false),
            // start: any depth, including the root
            (&["**/x"], b"x", false, true),
            (&["**/x"], b"a/x", false, true),
            (&["**/x"], b"a/b/c/x", true, true),
            (&["**/x"], b"a/xx", false, false),
            (&["**/x"], b"x/a", false, false),
            (&["**/*.o"], b"a/b/c.o", false, true),
            // end: everything under dir, but not dir itself
            (&["dir/**"], b"dir/a", false, true),
            (&["dir/**"], b"dir/a/b/c", false, true),
            (&["dir/**"], b"dir/sub", true, true),
            (&["dir/**"], b"dir", true, false),
            (&["dir/**"], b"other/dir/a", false, false),
            (&["dir/**"], b"dirx/a", false, false),
            // `**` alone matches everything
            (&["**"], b"a", false, true),
            (&["**"], b"a/b/c", false, true),
        ]);
    }

    #[test]
    fn anchoring() {
        run(&[
            // unanchored: the basename at any depth
            (&["build"], b"build", true, true),
            (&["build"], b"sub/build", true, true),
            (&["build"], b"a/b/build", false, true),
            (&["build"], b"builder", true, false),
            (&["build"], b"build/x", false, false),
            // leading slash: the root only
            (&["/build"], b"build", true, true),
            (&["/build"], b"sub/build", true, false),
            // an inner slash anchors, with or without a leading one
            (&["src/*.rs"], b"src/main.rs", false, true),
            (&["src/*.rs"], b"src/a/b.rs", false, false),
            (&["src/*.rs"], b"x/src/main.rs", false, false),
            (&["/src/*.rs"], b"src/main.rs", false, true),
            (&["/src/*.rs"], b"x/src/main.rs", false, false),
            (&["a/b"], b"a/b", false, true),
            (&["a/b"], b"z/a/b", false, false),
            // only a trailing slash does not anchor
            (&["build/"], b"sub/build", true, true),
            (&["/build/"], b"sub/build", true, false),
            (&["/build/"], b"build", true, true),
        ]);
    }

    #[test]
    fn dir_only() {
        run(&[
            (&["cache/"], b"cache", true, true),
            (&["cache/"], b"cache", false, false),
            (&["cache/"], b"a/cache", true, true),
            (&["cache/"], b"a/cache", false, false),
            (&["a/cache/"], b"a/cache", true, true),
            (&["a/cache/"], b"a/cache", false, false),
            (&["*.d/"], b"x/conf.d", true, true),
            (&["*.d/"], b"x/conf.d", false, false),
            (&["cache//"], b"cache", true, true),
            (&["**/"], b"a/b", true, true),
            (&["**/"], b"a/b", false, false),
            // a dir-only re-include does not shield files
            (&["!keep/", "keep"], b"keep", false, true),
            (&["!keep/", "keep"], b"keep", true, false),
        ]);
    }

    #[test]
    fn negation_and_first_match_wins() {
        run(&[
            (&["!keep.log", "*.log"], b"keep.log", false, false),
            (&["!keep.log", "*.log"], b"d/keep.log", false, false),
            (&["!keep.log", "*.log"], b"other.log", false, true),
            (&["!keep.log", "*.log"], b"file.txt", false, false),
            // later re-include cannot undo an earlier exclude
            (&["*.log", "!keep.log"], b"keep.log", false, true),
            // a lone re-include just includes
            (&["!*.c"], b"a.c", false, false),
            (&["!/src/keep.rs", "/src/*"], b"src/keep.rs", false, false),
            (&["!/src/keep.rs", "/src/*"], b"src/other.rs", false, true),
            (&["!*.rs", "src/**"], b"src/a/b.rs", false, false),
            (&["!*.rs", "src/**"], b"src/a/b.c", false, true),
            // no match: included
            (&["*.o", "tmp/"], b"main.c", false, false),
            (&["*.o", "tmp/"], b"tmp", false, false),
            // escaped `!` is a literal
            (&["\\!bang"], b"!bang", false, true),
            (&["\\!bang"], b"bang", false, false),
        ]);
    }

    #[test]
    fn character_classes() {
        run(&[
            (&["[a-c]x"], b"bx", false, true),
            (&["[a-c]x"], b"dx", false, false),
            (&["[!a-c]x"], b"dx", false, true),
            (&["[!a-c]x"], b"bx", false, false),
            (&["[^a-c]x"], b"dx", false, true),
            (&["file[0-9].txt"], b"d/file7.txt", false, true),
            (&["file[0-9].txt"], b"d/fileA.txt", false, false),
            (&["[ab][!0-9]"], b"ax", false, true),
            (&["[ab][!0-9]"], b"a1", false, false),
            // classes never match '/'
            (&["x/a[!b]c"], b"x/a/c", false, false),
            (&["x/a[!b]c"], b"x/azc", false, true),
            (&["x/a[+-0]c"], b"x/a/c", false, false),
            // escapes
            (&["\\*"], b"*", false, true),
            (&["\\*"], b"a", false, false),
            (&["\\[x\\]"], b"[x]", false, true),
        ]);
    }

    #[test]
    fn non_utf8_names() {
        run(&[
            (&["*.log"], b"\xff\xfe.log", false, true),
            (&["*.log"], b"d\xff/x.log", false, true),
            (&["a*b"], b"a\xffb", false, true),
            (&["a*b"], b"a\xff/b", false, false),
            (&["a?b"], b"a\xffb", false, true),
            (&["a?b"], b"a\xff\xfeb", false, false),
            (&["a??b"], b"a\xff\xfeb", false, true),
            (&["?"], b"\xc3", false, true),
            (&["?"], b"\xc3\xa9\xff", false, false),
            (&["???"], b"\xc3\xa9\xff", false, true),
            (&["[\u{e9}]"], b"\xa9", false, true),
            (&["[!a-z]x"], b"\x80x", false, true),
            (&["*"], b"\x80\x80", false, true),
            (&["[!a]"], b"\xff", false, true),
            (&["x/*"], b"x/\xff", false, true),
            (&["x/*"], b"\xff/x", false, false),
            (&["**/y"], b"\xff/\xfe/y", false, true),
            (&["dir/**"], b"dir/\xff\xfe", false, true),
            (&["name"], b"\xff/name", true, true),
            (&["name"], b"name\xff", true, false),
            (&["!\u{e9}*", "*"], "\u{e9}t\u{e9}".as_bytes(), false, false),
            (&["!\u{e9}*", "*"], b"\xe9t\xe9", false, true),
        ]);
    }

    #[test]
    fn root_and_empty_filter() {
        let f = Filter::empty();
        assert!(f.is_empty());
        assert!(f.patterns().is_empty());
        assert!(!f.excluded(b"anything", false));
        assert!(!f.excluded(b"a/b", true));
        assert!(filter(&[]).is_empty());
        let all = filter(&["*"]);
        assert!(!all.is_empty());
        assert!(!all.excluded(b"", true), "the root is never excluded");
    }

    #[test]
    fn invalid_patterns_are_usage_errors() {
        for bad in [
            &["["][..],
            &["a[b"],
            &["ok", "[!"],
            &["[z-a]"],
            &["a\\"],
            &["{a,b"],
            &[""],
            &["!"],
            &["/"],
            &["!/"],
            &["//"],
            &["a\nb"],
        ] {
            let e = new_err(bad);
            assert_eq!(e.code(), "EUSAGE", "{bad:?}: {e}");
            let offender = bad.iter().find(|p| *p != &"ok").unwrap();
            assert!(
                e.to_string().contains(&format!("{offender:?}")),
                "{bad:?}: message {e} should name the pattern"
            );
        }
    }

    #[test]
    fn limits() {
        let many: Vec<String> = (0..=MAX_PATTERNS).map(|i| format!("p{i}")).collect();
        assert_eq!(Filter::new(&many).unwrap_err().code(), "EUSAGE");
        assert!(Filter::new(&many[..MAX_PATTERNS]).is_ok());
        let long = vec!["x".repeat(MAX_WIRE_BYTES + 1)];
        assert_eq!(Filter::new(&long).unwrap_err().code(), "EUSAGE");
        let exact = vec!["x".repeat(MAX_WIRE_BYTES)];
        let f = Filter::new(&exact).unwrap();
        assert_eq!(Filter::decode(&f.encode()).unwrap().patterns(), &exact[..]);
    }

    #[test]
    fn patterns_from_text() {
        let cases: &[(&str, &[&str])] = &[
            ("", &[]),
            ("\n\n", &[]),
            ("*.o\n", &["*.o"]),
            ("*.o", &["*.o"]),
            (
                "# comment\n*.o\n\n  \n!keep.o\r\nbuild/\r\n",
                &["*.o", "!keep.o", "build/"],
            ),
            ("a\r\nb\rc\r", &["a", "b\rc"]),
            ("\u{feff}first\nsecond", &["first", "second"]),
            ("#only comments\n#\n", &[]),
            (" #not a comment\n", &[" #not a comment"]),
            ("trailing space \n", &["trailing space "]),
            ("\t\r\n", &[]),
        ];
        for &(text, want) in cases {
            assert_eq!(Filter::patterns_from_text(text), want, "{text:?}");
        }
        let f = Filter::new(&Filter::patterns_from_text("# x\n!keep.log\n*.log\r\n")).unwrap();
        assert!(f.excluded(b"a.log", false));
        assert!(!f.excluded(b"keep.log", false));
    }

    #[test]
    fn encode_decode_round_trip() {
        let sets: &[&[&str]] = &[
            &[],
            &["*.o"],
            &[
                "!keep.log",
                "*.log",
                "/build/",
                "a/**/b",
                "[!a-z]?",
                "caf\u{e9}",
                " spaced ",
            ],
        ];
        for &patterns in sets {
            let f = filter(patterns);
            let wire = f.encode();
            assert_eq!(wire, patterns.join("\n").as_bytes());
            let g = Filter::decode(&wire).unwrap();
            assert_eq!(g.patterns(), f.patterns());
            assert_eq!(g.is_empty(), patterns.is_empty());
            for (rel, is_dir) in [
                (&b"x/keep.log"[..], false),
                (b"y.log", false),
                (b"build", true),
                (b"a/b", false),
            ] {
                assert_eq!(g.excluded(rel, is_dir), f.excluded(rel, is_dir));
            }
        }
    }

    #[test]
    fn decode_rejects_bad_input() {
        let bad: Vec<Vec<u8>> = vec![
            b"*.o\n\xff".to_vec(),
            b"a\n\nb".to_vec(),
            b"\n".to_vec(),
            b"[".to_vec(),
            vec![b'x'; MAX_WIRE_BYTES + 1],
            "p\n".repeat(MAX_PATTERNS).into_bytes(), // 4097 fields, the last one empty
            ["p"; MAX_PATTERNS + 1].join("\n").into_bytes(),
        ];
        for buf in bad {
            let e = Filter::decode(&buf)
                .err()
                .unwrap_or_else(|| panic!("{} bytes accepted", buf.len()));
            assert_eq!(e.code(), "EMALFORMED", "{e}");
        }
        assert!(Filter::decode(b"").unwrap().is_empty());
        assert_eq!(
            Filter::decode(["p"; MAX_PATTERNS].join("\n").as_bytes())
                .unwrap()
                .patterns()
                .len(),
            MAX_PATTERNS
        );
    }
}
