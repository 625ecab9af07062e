//! The core's modules depend on each other one way (issue 20): no file reaches, through
//! `crate::…` or `super::…` paths, a file that reaches it back, and inside `restore/` the layers
//! point down only (restorer → prefill, inplace, partial_dir → staging, durable). A grep of
//! the sources, not a compiler pass: each file's non-test code is scanned for module paths
//! (`crate::a::b`, `super::x`, grouped `crate::{a, b}`, and a parent's `child::…` such as its
//! `pub use child::Type` re-exports), each path resolved to the longest module file it names.
//! A re-export counts: a child that imports what its parent defines, while the parent
//! re-exports the child, is a loop between the two files.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Module path ("" for lib.rs, "restore::staging", …) of every source file.
fn modules() -> BTreeMap<String, PathBuf> {
    let mut out = BTreeMap::new();
    let mut stack = vec![src()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let rel = p.strip_prefix(src()).unwrap().with_extension("");
                let mut m = rel.to_string_lossy().replace('/', "::");
                if m == "lib" {
                    m.clear();
                } else if let Some(parent) = m.strip_suffix("::mod") {
                    m = parent.to_string();
                }
                out.insert(m, p);
            }
        }
    }
    out
}

/// The code of a file without its tests and comments.
fn code(p: &Path) -> String {
    let s = fs::read_to_string(p).unwrap();
    let cut = ["#[cfg(test)]", "#[cfg(all(test"]
        .iter()
        .filter_map(|m| s.find(m))
        .min()
        .unwrap_or(s.len());
    s[..cut]
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Each `prefix` occurrence followed by a `::`-separated path; `{a, b}` groups expand.
fn paths_after(code: &str, prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find(prefix) {
        let before = rest[..i].chars().last();
        rest = &rest[i + prefix.len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let word: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
            .collect();
        let word = word.trim_end_matches(':').to_string();
        // `crate::{a, b}` (no word before the group) as well as `crate::x::{a, b}`.
        let open = if word.is_empty() && rest.starts_with('{') {
            Some(1)
        } else if rest[word.len()..].starts_with("::{") {
            Some(word.len() + 3)
        } else {
            None
        };
        if let Some(open) = open {
            let group = &rest[open..];
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let item = item.trim().split(' ').next().unwrap_or("").trim_end_matches(':');
                if !item.is_empty() {
                    out.push(if word.is_empty() {
                        item.to_string()
                    } else {
                        format!("{word}::{item}")
                    });
                }
            }
        } else if !word.is_empty() {
            out.push(word);
        }
    }
    out
}

/// Whether `code` names `child::…` on its own (not as the tail of a longer path such as
/// `crate::x::child::…`).
fn names_child(code: &str, child: &str) -> bool {
    let needle = format!("{child}::");
    code.match_indices(&needle).any(|(i, _)| {
        code[..i]
            .chars()
            .last()
            .is_none_or(|c| !(c.is_alphanumeric() || c == '_' || c == ':'))
    })
}

fn resolve(mods: &BTreeMap<String, PathBuf>, path: &str) -> Option<String> {
    let parts: Vec<&str> = path.split("::").collect();
    (1..=parts.len())
        .rev()
        .map(|k| parts[..k].join("::"))
        .find(|m| mods.contains_key(m))
}

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let mods = modules();
    let mut g = BTreeMap::new();
    for (m, p) in &mods {
        let c = code(p);
        let parent = m.rsplit_once("::").map_or("", |(a, _)| a);
        let mut to = BTreeSet::new();
        for path in paths_after(&c, "crate::") {
            to.extend(resolve(&mods, &path));
        }
        for path in paths_after(&c, "super::") {
            let full = if parent.is_empty() {
                path
            } else {
                format!("{parent}::{path}")
            };
            to.extend(resolve(&mods, &full));
        }
        // A parent's `pub use child::…` (or any `child::…` path) depends on the child: with the
        // child's `super::…` back to what the parent defines, that is a loop between files.
        let prefix = if m.is_empty() { String::new() } else { format!("{m}::") };
        for child in mods.keys().filter_map(|k| k.strip_prefix(prefix.as_str())) {
            if !child.is_empty() && !child.contains("::") && names_child(&c, child) {
                to.insert(format!("{prefix}{child}"));
            }
        }
        to.remove(m);
        to.remove("");
        g.insert(m.clone(), to);
    }
    g
}

#[test]
fn no_file_of_the_core_reaches_back_to_itself() {
    let g = graph();
    assert!(g.len() > 40, "{} modules found", g.len());
    // Every cycle found, as the path that closes it.
    let mut cycles = Vec::new();
    for start in g.keys() {
        let mut stack = vec![(start.clone(), vec![start.clone()])];
        let mut seen = BTreeSet::new();
        while let Some((at, path)) = stack.pop() {
            for next in &g[&at] {
                if next == start {
                    cycles.push(format!("{} -> {start}", path.join(" -> ")));
                } else if seen.insert(next.clone()) {
                    let mut p = path.clone();
                    p.push(next.clone());
                    stack.push((next.clone(), p));
                }
            }
        }
    }
    assert!(cycles.is_empty(), "module cycles:\n{}", cycles.join("\n"));
}

#[test]
fn restore_layers_point_down() {
    let g = graph();
    let below = |m: &str, not: &[&str]| {
        for n in not {
            assert!(!g[m].contains(*n), "{m} must not depend on {n}: it sits below it");
        }
    };
    let upper = [
        "restore::restorer",
        "restore::prefill",
        "restore::inplace",
        "restore::partial_dir",
    ];
    below("restore::staging", &upper);
    below("restore::durable", &upper);
    below("restore::prefill", &["restore::restorer"]);
    below("restore::inplace", &["restore::restorer", "restore::prefill"]);
    below(
        "restore::partial_dir",
        &["restore::restorer", "restore::prefill", "restore::inplace"],
    );
    assert!(
        g["restore::restorer"].contains("restore::staging"),
        "the check sees the restorer's imports"
    );
}
