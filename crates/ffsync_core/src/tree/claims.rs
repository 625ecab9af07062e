//! What a session learnt for the tree index: a file's content root at a stat identity, named
//! by the manifest entry that holds its path (a copy of the path would be an allocation per
//! file: a cold copy of 100,000 files makes 100,000 claims; decisions §87).

use super::index::ClaimRef;
use super::manifest::TreeManifest;
use super::path::cmp_tree_path;
use crate::file_identity::FileIdentity;

/// The manifest entry whose path a claim is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClaimedEntry {
    /// This side's walk: a sender's files, or a receiver's own files hashed for the peer.
    Own(u32),
    /// The sender's manifest, on a receiver: files it wrote or brought up to date.
    Senders(u32),
}

#[derive(Clone, Copy, Debug)]
pub struct Claim {
    pub entry: ClaimedEntry,
    pub identity: FileIdentity,
    pub root: [u8; 32],
}

/// The manifests a session's claims point into.
#[derive(Clone, Copy)]
pub struct ClaimPaths<'a> {
    pub own: &'a TreeManifest,
    /// The sender's manifest (the same as `own` on a sender).
    pub senders: &'a TreeManifest,
}

impl<'a> ClaimPaths<'a> {
    pub fn path(&self, c: &Claim) -> &'a [u8] {
        match c.entry {
            ClaimedEntry::Own(i) => self.own.entry(i as usize).path,
            ClaimedEntry::Senders(i) => self.senders.entry(i as usize).path,
        }
    }

    /// The order in which `claims` are in tree order; claims of one path stay in the order
    /// they were made, so the last made comes last (an index into the list, not a sorted copy
    /// of it: 4 bytes per claim instead of 80).
    pub fn tree_order(&self, claims: &[Claim]) -> Vec<u32> {
        let mut order: Vec<u32> = (0..claims.len() as u32).collect();
        order.sort_by(|&x, &y| cmp_tree_path(self.path(&claims[x as usize]), self.path(&claims[y as usize])));
        order
    }

    /// `claims` in `order`, as the index writes them.
    pub fn refs<'b>(&'b self, claims: &'b [Claim], order: &'b [u32]) -> impl Iterator<Item = ClaimRef<'a>> + 'b
    where
        'a: 'b,
    {
        order.iter().map(move |&k| {
            let c = &claims[k as usize];
            ClaimRef {
                path: self.path(c),
                identity: c.identity,
                root: c.root,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::manifest::{Kind, NewEntry, TreeBuilder};

    fn manifest(paths: &[&[u8]]) -> TreeManifest {
        let mut b = TreeBuilder::new();
        for p in paths {
            b.push(&NewEntry {
                path: p,
                kind: if p.is_empty() { Kind::Dir } else { Kind::File },
                flags: 0,
                mode: 0o644,
                size: 1,
                mtime_ns: 7,
                root: None,
                link: b"",
            });
        }
        b.finish()
    }

    fn claim(entry: ClaimedEntry, root: u8) -> Claim {
        Claim {
            entry,
            identity: FileIdentity {
                size: 1,
                mtime_ns: 7,
                ctime_ns: 7,
                inode: u64::from(root),
                dev: 1,
            },
            root: [root; 32],
        }
    }

    #[test]
    fn claims_of_both_manifests_come_out_in_tree_order_the_last_of_a_path_last() {
        // A receiver: its own walk (files it hashed for the peer) and the sender's manifest
        // (files it wrote), with paths in both.
        let own = manifest(&[b"", b"b", b"d"]);
        let senders = manifest(&[b"", b"a", b"b", b"c"]);
        let paths = ClaimPaths {
            own: &own,
            senders: &senders,
        };
        let claims = [
            claim(ClaimedEntry::Senders(3), 1), // c
            claim(ClaimedEntry::Own(1), 2),     // b, hashed first...
            claim(ClaimedEntry::Own(2), 3),     // d
            claim(ClaimedEntry::Senders(2), 4), // ...then b written: the later claim
            claim(ClaimedEntry::Senders(1), 5), // a
        ];
        let order = paths.tree_order(&claims);
        let got: Vec<(&[u8], u8)> = paths.refs(&claims, &order).map(|c| (c.path, c.root[0])).collect();
        assert_eq!(got, [(&b"a"[..], 5), (b"b", 2), (b"b", 4), (b"c", 1), (b"d", 3)]);
    }

    #[test]
    fn a_claim_holds_no_memory_of_its_own() {
        // `Copy`: no path, no allocation per file; 80 bytes for 100,000 files is 8 MB, where a
        // copied path cost ~128 bytes per file (96 and a malloc'd path).
        fn copy<T: Copy>() {}
        copy::<Claim>();
        assert!(
            std::mem::size_of::<Claim>() <= 80,
            "{} bytes",
            std::mem::size_of::<Claim>()
        );
    }
}
