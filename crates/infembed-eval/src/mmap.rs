//! The workspace's one `unsafe` call: mapping an index file into memory
//! ([`crate::EmbeddingIndex::open`]).
#![allow(unsafe_code)]

use std::fs::File;

/// Maps `file` read-only.
///
/// # Safety contract (why this is sound in practice, and what the caller accepts)
/// A mapping is only sound while nobody truncates or rewrites the file in place: the mapped
/// bytes would change under a shared borrow, or reading past a truncation would fault. infembed
/// never does either: every index file is written to a temporary file and renamed over the old
/// one ([`infembed_data::write_atomic`]), which leaves a mapped old file's bytes untouched. Other
/// programs that rewrite an index file in place while infembed searches it are outside that
/// contract, as with every program that maps its data files (the safetensors and faiss
/// `mmap` loaders make the same assumption).
pub(crate) fn map_read_only(file: &File) -> std::io::Result<memmap2::Mmap> {
    // SAFETY: read-only mapping of a file that infembed only ever replaces by rename (above).
    unsafe { memmap2::Mmap::map(file) }
}
