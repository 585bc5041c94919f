//! Weight files as bytes: memory-mapped by default, read into memory on request.
//!
//! **The truncation hazard.** A memory-mapped file that another process truncates while it is in
//! use makes the next read of a lost page raise SIGBUS, which ends the process (no Rust error can
//! be returned from a page fault). Every mmap-based loader shares it (llama.cpp, safetensors,
//! candle). It needs a writer with permission to modify the weights, and it ends the process
//! rather than computing with wrong values, so mapping stays the default: it keeps a model's
//! weights out of the process's private memory (shared between processes, paged in on use).
//! Where weights live on storage that others can write to (a shared cache, a network mount),
//! set `IPFS_ACCELERATE_MMAP=0`: files are then read into memory once at load, their length
//! checked against their header, and a later truncation cannot touch the process.

use std::path::Path;

use bytes::Bytes;

use crate::IoError;

/// Whether weight files are memory-mapped (`IPFS_ACCELERATE_MMAP` is not `0` / `false` / `off`).
pub fn mmap_enabled() -> bool {
    !matches!(
        std::env::var("IPFS_ACCELERATE_MMAP").as_deref(),
        Ok("0" | "false" | "off")
    )
}

/// The bytes of `path`, mapped or read per [`mmap_enabled`], and the open file (for its identity).
pub(crate) fn file_bytes(path: &Path) -> Result<(Bytes, std::fs::File), IoError> {
    let mut file = std::fs::File::open(path).map_err(|e| IoError::read(path, e))?;
    if !mmap_enabled() {
        let mut data = Vec::new();
        std::io::Read::read_to_end(&mut file, &mut data).map_err(|e| IoError::read(path, e))?;
        return Ok((Bytes::from(data), file));
    }
    // SAFETY: the map is read-only. Its bytes can change or vanish only if another process
    // modifies or truncates the file while it is mapped: see the module documentation.
    let mmap =
        unsafe { memmap2::MmapOptions::new().map(&file) }.map_err(|e| IoError::read(path, e))?;
    Ok((Bytes::from_owner(mmap), file))
}
