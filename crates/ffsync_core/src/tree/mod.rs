//! Directory trees: walk, exclude rules, tree manifests, triage, the per-tree index,
//! small-file batches, and one peer's execution of a tree sync.

pub mod attrs;
pub mod chmod;
pub mod claims;
pub mod dir_merge;
pub mod file_batch;
pub mod filter;
pub mod index;
pub mod itemize;
pub mod manifest;
pub mod open;
pub mod path;
pub mod plan_counts;
pub mod remove_sources;
pub mod selection;
pub mod sync;
pub mod triage;
pub mod walk;
