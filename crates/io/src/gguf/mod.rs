//! GGUF files (llama.cpp's single-file model format): metadata, tensor table, quantized tensor
//! data (dequantized bit-exactly as ggml does) and the tokenizer stored in the metadata.
//!
//! ```no_run
//! use ipfs_accelerate_core::TensorSource;
//! use ipfs_accelerate_io::gguf::GgufFile;
//!
//! let f = GgufFile::open("SmolLM2-135M-Instruct.Q4_1.gguf")?;
//! assert_eq!(f.architecture(), Some("llama"));
//! let emb = f.tensor("token_embd.weight")?; // F32, shape [vocab, hidden]
//! let ids = f.tokenizer()?.encode("The capital of France is", true);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Shapes are row-major (PyTorch order): GGUF's `ne` reversed. Tensor names are exactly as stored
//! (`blk.0.attn_q.weight`); no renaming and no un-permuting happens here — note that llama.cpp's
//! HF → GGUF converter permutes the rows of LLaMA's `attn_q` / `attn_k` weights (rotary halves
//! interleaved), which the model crate has to undo.

mod dequant;
mod reader;
mod tokenizer;
mod value;
mod writer;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use bytes::Bytes;
use ipfs_accelerate_core::{
    DType, Error, HostTensor, QuantizedBlocks, Result as CoreResult, TensorSource,
};
use ipfs_accelerate_kernels::BlockType;

use crate::IoError;

pub use dequant::{dequantize, GgmlType, QK_K};
pub use reader::{GgufTensorInfo, DEFAULT_ALIGNMENT, GGUF_MAGIC};
pub use tokenizer::{
    SpecialTokens, MAX_MERGE_WORK, MAX_TOKEN_BYTES, MAX_VOCABULARY, SUPPORTED_PRE,
};
pub use value::GgufValue;
pub use writer::GgufBuilder;

/// A GGUF file, memory-mapped (or held in memory) and validated once at open: every tensor's data
/// is known to lie inside the file.
pub struct GgufFile {
    name: String,
    data: Bytes,
    version: u32,
    metadata: BTreeMap<String, GgufValue>,
    tensors: Vec<GgufTensorInfo>,
    index: HashMap<String, usize>,
    alignment: u64,
    data_start: usize,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("name", &self.name)
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Memory-maps (see [`crate::mmap_enabled`]) and parses `path`. Anything malformed is an [`IoError::MalformedGguf`] naming
    /// the file and what is wrong.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, IoError> {
        let path = path.as_ref();
        let (data, _) = crate::mapped::file_bytes(path)?;
        Self::from_bytes(path.display().to_string(), data)
    }

    /// Parses a GGUF image held in memory; `name` is used in error messages.
    pub fn from_bytes(name: impl Into<String>, data: Bytes) -> Result<GgufFile, IoError> {
        let name = name.into();
        let parsed = reader::parse(&data).map_err(|reason| IoError::MalformedGguf {
            path: PathBuf::from(&name),
            reason,
        })?;
        let index = parsed
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(GgufFile {
            name,
            data,
            version: parsed.version,
            metadata: parsed.metadata,
            tensors: parsed.tensors,
            index,
            alignment: parsed.alignment,
            data_start: parsed.data_start,
        })
    }

    /// The path or name the file was opened with.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Every metadata key/value.
    pub fn metadata(&self) -> &BTreeMap<String, GgufValue> {
        &self.metadata
    }

    /// One metadata value.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.get(key)
    }

    /// `general.architecture` (`llama`, `qwen2`, ...).
    pub fn architecture(&self) -> Option<&str> {
        self.get("general.architecture").and_then(GgufValue::as_str)
    }

    /// The data-section alignment (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Byte offset of the data section in the file.
    pub fn data_offset(&self) -> usize {
        self.data_start
    }

    /// The tensor table, in file order.
    pub fn tensor_infos(&self) -> &[GgufTensorInfo] {
        &self.tensors
    }

    /// One tensor's entry.
    pub fn tensor_info(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.index.get(name).map(|&i| &self.tensors[i])
    }

    fn info_or_missing(&self, name: &str) -> Result<&GgufTensorInfo, IoError> {
        self.tensor_info(name).ok_or_else(|| {
            IoError::Core(Error::MissingTensor {
                name: name.to_string(),
                source_name: self.name.clone(),
            })
        })
    }

    fn range(&self, info: &GgufTensorInfo) -> std::ops::Range<usize> {
        // In range: checked when the file was parsed.
        let start = self.data_start + info.offset as usize;
        start..start + info.size
    }

    /// The tensor's bytes as stored (quantized blocks), for keeping weights quantized.
    pub fn raw_tensor(&self, name: &str) -> Result<(GgmlType, &[u8]), IoError> {
        let info = self.info_or_missing(name)?;
        Ok((info.ggml_type, &self.data[self.range(info)]))
    }

    /// Like [`raw_tensor`](Self::raw_tensor), as a shared zero-copy [`Bytes`] slice of the map.
    pub fn raw_tensor_bytes(&self, name: &str) -> Result<(GgmlType, Bytes), IoError> {
        let info = self.info_or_missing(name)?;
        Ok((info.ggml_type, self.data.slice(self.range(info))))
    }

    /// The tensor dequantized to f32 values in row-major order.
    pub fn dequantize_tensor(&self, name: &str) -> Result<Vec<f32>, IoError> {
        let info = self.info_or_missing(name)?;
        dequantize(
            info.ggml_type,
            &self.data[self.range(info)],
            info.n_elements(),
        )
        .map_err(|e| match e {
            IoError::Dequantize { ty, reason } => IoError::Dequantize {
                ty,
                reason: format!("tensor `{name}` in {}: {reason}", self.name),
            },
            other => other,
        })
    }

    /// A `tokenizers::Tokenizer` built from the `tokenizer.ggml.*` metadata (see the module
    /// docs of `tokenizer` for what is supported); BOS / EOS are added on encode with
    /// `add_special_tokens = true` as [`special_tokens`](Self::special_tokens) says.
    pub fn tokenizer(&self) -> Result<tokenizers::Tokenizer, IoError> {
        tokenizer::build(&self.metadata).map_err(|reason| IoError::GgufTokenizer {
            path: PathBuf::from(&self.name),
            reason,
        })
    }

    /// `tokenizer.chat_template` (a Jinja template).
    pub fn chat_template(&self) -> Option<&str> {
        self.get("tokenizer.chat_template")
            .and_then(GgufValue::as_str)
    }

    /// The special token ids (ids outside the vocabulary read as `None`) and add-bos / add-eos.
    pub fn special_tokens(&self) -> SpecialTokens {
        tokenizer::special_tokens(&self.metadata)
    }
}

impl TensorSource for GgufFile {
    fn source_name(&self) -> String {
        self.name.clone()
    }

    fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    fn shape_of(&self, name: &str) -> Option<Vec<usize>> {
        self.tensor_info(name).map(|t| t.shape.clone())
    }

    /// The tensor as an F32 [`HostTensor`] (F32 data is a zero-copy view, everything else is
    /// dequantized).
    fn tensor(&self, name: &str) -> CoreResult<HostTensor> {
        let info = self.info_or_missing(name)?;
        if info.ggml_type == GgmlType::F32 {
            return HostTensor::from_bytes(
                name,
                info.shape.clone(),
                DType::F32,
                self.data.slice(self.range(info)),
            );
        }
        let values = self.dequantize_tensor(name)?;
        HostTensor::from_f32(info.shape.clone(), &values)
    }

    fn names(&self) -> Vec<String> {
        self.tensors.iter().map(|t| t.name.clone()).collect()
    }

    /// A 2-D tensor in a block format the CPU kernels read (every one but F32, which
    /// [`tensor`](TensorSource::tensor) already serves without a copy) as a zero-copy slice of
    /// the map; `None` for other tensors.
    fn quantized_blocks(&self, name: &str) -> CoreResult<Option<QuantizedBlocks>> {
        let Some(info) = self.tensor_info(name) else {
            return Ok(None);
        };
        let (Some(ty), &[rows, cols]) = (info.ggml_type.block_type(), info.shape.as_slice()) else {
            return Ok(None);
        };
        if ty == BlockType::F32 {
            return Ok(None);
        }
        Ok(Some(QuantizedBlocks {
            ggml_type: ty.id(),
            data: self.data.slice(self.range(info)),
            shape: [rows, cols],
        }))
    }
}
