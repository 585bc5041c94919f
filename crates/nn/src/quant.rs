//! Weight quantization of [`Linear`](crate::Linear) layers: symmetric, per block of consecutive
//! weights, kept quantized in memory through burn's quantized tensors and dequantized by the
//! backend when a layer runs.

use std::str::FromStr;

use burn::tensor::quantization::{BlockSize, QuantLevel, QuantScheme, QuantStore, QuantValue};
use ipfs_accelerate_core::{Error, Result};

/// How the weights of linear layers are kept in memory. Embeddings and norms stay float.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WeightQuantization {
    /// Float weights as loaded (f32).
    #[default]
    None,
    /// 8-bit symmetric integers, one f32 scale per `block_size` consecutive weights.
    Int8 {
        /// Weights per scale.
        block_size: usize,
    },
    /// 4-bit symmetric integers (values -7..=7), one f32 scale per `block_size` weights.
    Int4 {
        /// Weights per scale.
        block_size: usize,
    },
}

/// The default block: 32 weights per scale, as GGUF's Q8_0 / Q4_0.
pub const DEFAULT_BLOCK_SIZE: usize = 32;

impl WeightQuantization {
    /// burn's scheme for this setting (`None` for float weights).
    pub fn scheme(&self) -> Option<QuantScheme> {
        let (value, block) = match *self {
            WeightQuantization::None => return None,
            WeightQuantization::Int8 { block_size } => (QuantValue::Q8S, block_size),
            WeightQuantization::Int4 { block_size } => (QuantValue::Q4S, block_size),
        };
        Some(
            QuantScheme::default()
                .with_value(value)
                .with_store(QuantStore::Native)
                .with_level(QuantLevel::Block(BlockSize::new([block as u8]))),
        )
    }

    /// Weights per scale (0 for float weights).
    pub fn block_size(&self) -> usize {
        match *self {
            WeightQuantization::None => 0,
            WeightQuantization::Int8 { block_size } | WeightQuantization::Int4 { block_size } => {
                block_size
            }
        }
    }

    /// Checks the block size: 1 to 255 weights (burn's block sizes are bytes).
    pub fn validate(&self) -> Result<()> {
        let b = self.block_size();
        if *self != WeightQuantization::None && !(1..=255).contains(&b) {
            return Err(Error::InvalidInput(format!(
                "quantization block size must be within 1..=255, got {b}"
            )));
        }
        Ok(())
    }

    /// Bytes `elements` weights take in memory: 4 per float weight; quantized, one byte per
    /// value (burn stores 8- and 4-bit values natively as `i8` on the CPU backend, so 4-bit saves
    /// no more than 8-bit there) plus a 4-byte scale per block.
    pub fn bytes(&self, elements: usize) -> usize {
        match self.block_size() {
            0 => elements * 4,
            b => elements + elements.div_ceil(b) * 4,
        }
    }
}

impl FromStr for WeightQuantization {
    type Err = Error;

    /// `none`, `int8`, `int4`, optionally with a block size: `int8:64`.
    fn from_str(s: &str) -> Result<Self> {
        let (kind, block) = match s.split_once(':') {
            Some((k, b)) => (
                k,
                b.parse::<usize>().map_err(|_| {
                    Error::InvalidInput(format!("`{s}`: the block size must be an integer"))
                })?,
            ),
            None => (s, DEFAULT_BLOCK_SIZE),
        };
        let q = match kind.to_ascii_lowercase().as_str() {
            "none" | "f32" => WeightQuantization::None,
            "int8" | "q8" => WeightQuantization::Int8 { block_size: block },
            "int4" | "q4" => WeightQuantization::Int4 { block_size: block },
            _ => {
                return Err(Error::InvalidInput(format!(
                    "unknown quantization `{s}` (none, int8, int4, optionally `:block_size`)"
                )))
            }
        };
        q.validate()?;
        Ok(q)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_counts_bytes() {
        assert_eq!(
            "int8".parse::<WeightQuantization>().unwrap(),
            WeightQuantization::Int8 { block_size: 32 }
        );
        assert_eq!(
            "int4:64".parse::<WeightQuantization>().unwrap(),
            WeightQuantization::Int4 { block_size: 64 }
        );
        assert!("int8:0".parse::<WeightQuantization>().is_err());
        assert!("int8:x".parse::<WeightQuantization>().is_err());
        assert!("fp8".parse::<WeightQuantization>().is_err());
        assert_eq!(WeightQuantization::None.bytes(64), 256);
        assert_eq!(
            WeightQuantization::Int8 { block_size: 32 }.bytes(64),
            64 + 8
        );
    }
}
