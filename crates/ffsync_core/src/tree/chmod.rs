//! rsync's `--chmod=CHMOD`: permission changes the sender applies to the modes it lists, as
//! if its files had them (rsync's chmod.c). Comma-separated clauses, each optionally led by
//! `D` (directories only) or `F` (files only), then either an octal mode (`F644`) or
//! `[ugoa]*`, one of `-+=` and `[rwxXst]*` (`Du=rwx,go=rx`, `a+X`, `u+x,u-w`; like rsync, one
//! operator per clause).
//! No `who` means `a` (rsync does not apply a umask here). `X` adds execute for directories
//! and for files that already have an execute bit.

use crate::error::CoreError;

const WHO_U: u32 = 0o4700;
const WHO_G: u32 = 0o2070;
const WHO_O: u32 = 0o1007;

#[derive(Clone, Debug, PartialEq, Eq)]
enum Change {
    /// Replace the permission bits.
    Octal(u32),
    /// `op` over the `who` mask with these permission letters.
    Symbolic { who: u32, op: u8, perms: u32, big_x: bool },
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Clause {
    dirs: bool,
    files: bool,
    changes: Vec<Change>,
}

/// Parsed `--chmod` rules, applied in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChmodRules(Vec<Clause>);

impl ChmodRules {
    /// Parse one or more `--chmod` values (each comma-separated). An error names the clause.
    pub fn parse(spec: &str) -> Result<Self, CoreError> {
        let mut clauses = Vec::new();
        for raw in spec.split(',').map(str::trim).filter(|c| !c.is_empty()) {
            clauses.push(parse_clause(raw).ok_or_else(|| {
                CoreError::Usage(format!(
                    "--chmod: cannot parse '{raw}' (expected e.g. Du=rwx,Fgo=r, a+X or F644)"
                ))
            })?);
        }
        Ok(ChmodRules(clauses))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The permission bits (`0o7777`) after the rules, for a directory or a regular file.
    pub fn apply(&self, mode: u32, is_dir: bool) -> u32 {
        let mut m = mode & 0o7777;
        for c in &self.0 {
            if (is_dir && !c.dirs) || (!is_dir && !c.files) {
                continue;
            }
            for ch in &c.changes {
                m = match *ch {
                    Change::Octal(v) => v,
                    Change::Symbolic { who, op, perms, big_x } => {
                        let x = if big_x && (is_dir || m & 0o111 != 0) { 0o111 } else { 0 };
                        let bits = (perms | x) & who;
                        match op {
                            b'+' => m | bits,
                            b'-' => m & !bits,
                            _ => (m & !who) | bits,
                        }
                    }
                };
            }
        }
        m & 0o7777
    }
}

fn parse_clause(raw: &str) -> Option<Clause> {
    let b = raw.as_bytes();
    let (dirs, files, rest) = match b.first()? {
        b'D' => (true, false, &b[1..]),
        b'F' => (false, true, &b[1..]),
        _ => (true, true, b),
    };
    if !rest.is_empty() && rest.iter().all(|c| c.is_ascii_digit()) {
        let v = u32::from_str_radix(std::str::from_utf8(rest).ok()?, 8).ok()?;
        return (v <= 0o7777).then(|| Clause {
            dirs,
            files,
            changes: vec![Change::Octal(v)],
        });
    }
    let mut i = 0;
    let mut who = 0;
    while i < rest.len() && matches!(rest[i], b'u' | b'g' | b'o' | b'a') {
        who |= match rest[i] {
            b'u' => WHO_U,
            b'g' => WHO_G,
            b'o' => WHO_O,
            _ => WHO_U | WHO_G | WHO_O,
        };
        i += 1;
    }
    if who == 0 {
        who = WHO_U | WHO_G | WHO_O;
    }
    let mut changes = Vec::new();
    while i < rest.len() {
        let op = rest[i];
        if !matches!(op, b'+' | b'-' | b'=') {
            return None;
        }
        i += 1;
        let (mut perms, mut big_x) = (0, false);
        while i < rest.len() && !matches!(rest[i], b'+' | b'-' | b'=') {
            perms |= match rest[i] {
                b'r' => 0o444,
                b'w' => 0o222,
                b'x' => 0o111,
                b'X' => {
                    big_x = true;
                    0
                }
                b's' => 0o6000,
                b't' => 0o1000,
                _ => return None,
            };
            i += 1;
        }
        changes.push(Change::Symbolic { who, op, perms, big_x });
        if i < rest.len() {
            return None; // rsync takes one operator per clause: `u+x-w` is an error there too
        }
    }
    (!changes.is_empty()).then_some(Clause { dirs, files, changes })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each case as rsync 3.x applies it (checked with `rsync -a --chmod=…` on the same modes).
    #[test]
    fn rules_apply_as_rsync_applies_them() {
        // (rules, [dir 0o755, file 0o640, dir 0o700, file 0o755]) as rsync left them
        let cases: [(&str, [u32; 4]); 6] = [
            ("Du=rwx,Dgo=rx,Fu=rw,Fgo=r", [0o755, 0o644, 0o755, 0o644]),
            ("u+x", [0o755, 0o740, 0o700, 0o755]),
            ("g-w,o=", [0o750, 0o640, 0o700, 0o750]),
            ("F644,D755", [0o755, 0o644, 0o755, 0o644]),
            ("a+X", [0o755, 0o640, 0o711, 0o755]),
            ("ug=rwX", [0o775, 0o660, 0o770, 0o775]),
        ];
        for (spec, want) in cases {
            let r = ChmodRules::parse(spec).unwrap();
            let got = [
                r.apply(0o755, true),
                r.apply(0o640, false),
                r.apply(0o700, true),
                r.apply(0o755, false),
            ];
            assert_eq!(got, want, "{spec}");
        }
    }

    #[test]
    fn special_bits_and_clauses_in_order() {
        let r = ChmodRules::parse("u+x,u-w,g+s,o+t").unwrap();
        assert_eq!(r.apply(0o644, false), 0o3544);
        assert!(ChmodRules::parse("").unwrap().is_empty());
    }

    #[test]
    fn malformed_rules_are_usage_errors_naming_the_clause() {
        for bad in ["u", "Q+x", "u+q", "F9", "D77777", "u+x,zz", "u+x-w"] {
            let e = ChmodRules::parse(bad).unwrap_err();
            assert_eq!(e.code(), "EUSAGE", "{bad}");
        }
        assert!(ChmodRules::parse("u+x,zz").unwrap_err().to_string().contains("'zz'"));
    }
}
