//! # ipfs-accelerate-io
//!
//! Where models come from and how their weights are read:
//!
//! - [`ModelSource`] / [`resolve`]: a local directory, the Hugging Face cache (`HF_HOME`,
//!   `HF_HUB_CACHE` / `HUGGINGFACE_HUB_CACHE`), or a hub download with a progress bar (resumable);
//!   offline, a missing file is an error naming it and the variable to point at a local copy.
//! - [`SafeTensorsFile`] / [`WeightStore`]: memory-mapped safetensors (single file or sharded with
//!   `model.safetensors.index.json`), zero-copy tensor views, F32/F16/BF16, and int8 blocks with scales
//!   (the compact form the embedded default model uses), dequantised on access.
//! - [`RandomWeights`]: deterministic random tensors for a named config (benchmarks, no download).
//! - [`RandomInit`]: random tensors of whatever shape the model asks for (any family, any config).
//! - [`NameMap`]: renames checkpoint tensor names (legacy `gamma`/`beta`, prefixes) for a family.
//! - [`GgufFile`] ([`gguf`]): memory-mapped GGUF files — metadata, tensor table, ggml
//!   dequantisation (F32/F16/BF16, Q4_0 … Q8_0, k-quants, IQ4), and the tokenizer in the metadata.
//! - [`mmap_enabled`]: weight files are memory-mapped unless `IPFS_ACCELERATE_MMAP=0` (read into
//!   memory instead: immune to another process truncating the file, see the `mapped` notes).

mod error;
pub mod gguf;
mod mapped;
mod names;
mod random;
mod safetensors_file;
mod source;

pub use error::IoError;
pub use gguf::{GgmlType, GgufFile, GgufTensorInfo, GgufValue, SpecialTokens};
pub use mapped::mmap_enabled;
pub use names::NameMap;
pub use random::{stored_type, RandomInit, RandomWeights, RANDOM_GGML_TYPES};
pub use safetensors_file::{quantize_blocks_i8, SafeTensorsFile, WeightStore, SCALE_SUFFIX};
pub use source::{
    check_file_name, check_model_id, check_revision, resolve, ModelFiles, ModelSource,
    ResolveOptions,
};

/// The file that marks a checkpoint folder as "configuration only, random weights": a folder with
/// `config.json` and this file (`{"seed": 0, "std": 0.02}`) instead of safetensors loads with
/// [`RandomInit`] (benchmarks of real-size configurations without a download).
pub const RANDOM_INIT_FILE: &str = "random_init.json";

/// Memory-maps the weights of a local checkpoint folder: `model.safetensors`, or the shards that
/// `model.safetensors.index.json` lists; a folder with [`RANDOM_INIT_FILE`] and no safetensors gets
/// seeded random weights of whatever shapes its config asks for.
pub fn open_weights(
    dir: &std::path::Path,
) -> Result<std::sync::Arc<dyn ipfs_accelerate_core::TensorSource>, IoError> {
    let files = ModelFiles::local(dir)?;
    let marker = dir.join(RANDOM_INIT_FILE);
    if marker.is_file()
        && !dir.join("model.safetensors").exists()
        && !dir.join("model.safetensors.index.json").exists()
    {
        return Ok(std::sync::Arc::new(RandomInit::from_file(&marker)?));
    }
    Ok(WeightStore::open(&files.weight_files()?)?.into_source())
}
