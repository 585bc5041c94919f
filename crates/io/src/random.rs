//! Random weights for a named configuration: benchmarks and tests that need a model of real size
//! but no download.

use std::collections::BTreeMap;

use ipfs_accelerate_core::{Error, HostTensor, QuantizedBlocks, Result, TensorSource};
use ipfs_accelerate_kernels::{dequantize_row, quantize_row, BlockType};

/// A weight source that serves deterministic pseudo-random f32 tensors for a fixed table of names
/// and shapes (normal-ish values with standard deviation `std`; LayerNorm-style `weight`s of rank 1
/// are ones, biases zeros, as a freshly initialised HF model).
pub struct RandomWeights {
    shapes: BTreeMap<String, Vec<usize>>,
    seed: u64,
    std: f32,
}

impl RandomWeights {
    /// A source for `shapes`, seeded.
    pub fn new(
        shapes: impl IntoIterator<Item = (String, Vec<usize>)>,
        seed: u64,
        std: f32,
    ) -> Self {
        RandomWeights {
            shapes: shapes.into_iter().collect(),
            seed,
            std,
        }
    }

    /// Total number of parameters.
    pub fn num_params(&self) -> usize {
        self.shapes
            .values()
            .map(|s| s.iter().fold(1usize, |a, &d| a.saturating_mul(d)))
            .fold(0usize, usize::saturating_add)
    }
}

impl TensorSource for RandomWeights {
    fn source_name(&self) -> String {
        format!("random weights (seed {})", self.seed)
    }

    fn contains(&self, name: &str) -> bool {
        self.shapes.contains_key(name)
    }

    fn shape_of(&self, name: &str) -> Option<Vec<usize>> {
        self.shapes.get(name).cloned()
    }

    fn tensor(&self, name: &str) -> Result<HostTensor> {
        let shape = self.shapes.get(name).ok_or_else(|| Error::MissingTensor {
            name: name.to_string(),
            source_name: self.source_name(),
        })?;
        random_tensor(name, shape, self.seed, self.std)
    }

    fn names(&self) -> Vec<String> {
        self.shapes.keys().cloned().collect()
    }
}

/// A deterministic tensor for `name`: rank-1 biases zeros, rank-1 weights ones, a batch norm's
/// `running_mean` zeros and `running_var` ones (PyTorch's initial statistics: a random variance
/// would be negative, its square root NaN), else roughly normal values with standard deviation
/// `std`.
///
/// The element count is checked and the buffer reserved fallibly, so a configuration asking for
/// an impossible tensor is an error naming it rather than an abort.
fn random_tensor(name: &str, shape: &[usize], seed: u64, std: f32) -> Result<HostTensor> {
    let too_large = || {
        Error::InvalidInput(format!(
            "random tensor `{name}` of shape {shape:?} is too large to allocate"
        ))
    };
    let n = shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .filter(|n| n.checked_mul(4).is_some())
        .ok_or_else(too_large)?;
    let mut values: Vec<f32> = Vec::new();
    values.try_reserve_exact(n).map_err(|_| too_large())?;
    if shape.len() == 1 && (name.ends_with("bias") || name.ends_with("running_mean")) {
        values.resize(n, 0.0);
    } else if shape.len() == 1 && (name.ends_with("weight") || name.ends_with("running_var")) {
        values.resize(n, 1.0);
    } else {
        let mut state = seed ^ fnv1a(name);
        values.extend((0..n).map(|_| {
            // Sum of four uniforms: cheap, bounded, roughly normal (variance 1/3 → rescale).
            let s: f32 = (0..4).map(|_| next_unit(&mut state)).sum::<f32>() - 2.0;
            s * std * 1.732_050_8
        }));
    }
    HostTensor::from_f32(shape.to_vec(), &values)
}

/// Random initialisation of any model from its configuration alone: every tensor the model asks
/// for exists and has the shape it expects (see [`TensorSource::tensor_shaped`]), so benchmarks of
/// real-size configurations need neither a download nor a per-family table of shapes. Optional
/// tensors count as present; a tensor asked for without a shape is a scalar 0 (HF's logit scales).
///
/// With a ggml type ([`with_ggml_type`](Self::with_ggml_type), `"ggml_type"` in the marker file)
/// the 2-D `*.weight` tensors are stored in that format, as a GGUF file of that type would store
/// them (rows that are not whole blocks of a k-quant in llama.cpp's fallback, [`stored_type`]). Their blocks need the shape, which a generated source only
/// learns from the model: they are served by
/// [`quantized_blocks_shaped`](TensorSource::quantized_blocks_shaped), which the loaders call
/// with the shape they expect (as they call [`tensor_shaped`](TensorSource::tensor_shaped)),
/// rather than by the shapeless [`quantized_blocks`](TensorSource::quantized_blocks) (always
/// `None` here). Nothing is remembered between calls: the values are a pure function of the seed,
/// the name and the shape, so the source stays `Copy` and lock-free, and the blocks and the
/// values of a weight are regenerated alike whichever is asked first.
#[derive(Debug, Clone, Copy)]
pub struct RandomInit {
    seed: u64,
    std: f32,
    /// When set, 2-D `*.weight` tensors are served as blocks of this type (or of llama.cpp's
    /// fallback for rows that are not whole blocks, [`stored_type`]) as a GGUF file of that type
    /// stores them, and their values as the blocks dequantized.
    ggml: Option<BlockType>,
}

/// The ggml formats random weights can be stored in (`"ggml_type"` in the marker file).
pub const RANDOM_GGML_TYPES: [BlockType; 8] = ipfs_accelerate_kernels::QUANTIZED_FORMATS;

/// The format a GGUF writer stores a weight of `cols` columns in when `ty` is asked for: `ty` when
/// its rows are whole blocks, else llama.cpp's fallback for a k-quant whose rows are not whole
/// 256-weight super-blocks (`llama_tensor_get_type`: Q4_K → Q5_0, Q5_K → Q5_1, Q6_K → Q8_0;
/// Qwen2.5-0.5B's 896-wide rows), else none (f32).
pub fn stored_type(ty: BlockType, cols: usize) -> Option<BlockType> {
    let fallback = match ty {
        BlockType::Q4_K => BlockType::Q5_0,
        BlockType::Q5_K => BlockType::Q5_1,
        BlockType::Q6_K => BlockType::Q8_0,
        _ => ty,
    };
    [ty, fallback]
        .into_iter()
        .find(|t| cols.is_multiple_of(t.block_size()))
}

impl RandomInit {
    /// A source seeded with `seed`, weights of standard deviation `std` (HF uses 0.02).
    pub fn new(seed: u64, std: f32) -> Self {
        RandomInit {
            seed,
            std,
            ggml: None,
        }
    }

    /// The same source with its 2-D weights stored in ggml blocks of `ty` (one of
    /// [`RANDOM_GGML_TYPES`]; another type makes loading those weights an error):
    /// [`TensorSource::quantized_blocks_shaped`] serves the random values quantized to `ty`, and
    /// [`TensorSource::tensor_shaped`] those blocks dequantized, so every consumer sees one
    /// model.
    pub fn with_ggml_type(mut self, ty: BlockType) -> Self {
        self.ggml = Some(ty);
        self
    }

    /// The blocks of `name` when it is stored in the ggml format: a 2-D `*.weight` whose rows
    /// are whole blocks.
    fn blocks(&self, name: &str, shape: &[usize]) -> Result<Option<(BlockType, Vec<u8>)>> {
        use rayon::prelude::*;
        let Some(ty) = self.ggml else {
            return Ok(None);
        };
        let &[rows, cols] = shape else {
            return Ok(None);
        };
        if !name.ends_with(".weight") || rows == 0 || cols == 0 {
            return Ok(None);
        }
        let Some(ty) = stored_type(ty, cols) else {
            return Ok(None);
        };
        let values = random_tensor(name, shape, self.seed, self.std)?.to_f32_vec();
        let rows: Vec<Vec<u8>> = values
            .par_chunks(cols)
            .map(|row| quantize_row(ty, row))
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| Error::InvalidInput(format!("random `{name}` as {}: {e}", ty.name())))?;
        Ok(Some((ty, rows.concat())))
    }

    /// Reads `{"seed": N, "std": X, "ggml_type": "q4_k"}` (all optional: seed 0, std 0.02, f32
    /// weights) from a [`crate::RANDOM_INIT_FILE`]; `ggml_type` names one of
    /// [`RANDOM_GGML_TYPES`], in any case.
    pub fn from_file(path: &std::path::Path) -> std::result::Result<Self, crate::IoError> {
        let text = std::fs::read_to_string(path).map_err(|e| crate::IoError::read(path, e))?;
        let bad = |reason: String| crate::IoError::InvalidConfig {
            path: path.to_path_buf(),
            reason,
        };
        let value: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        let seed = match value.get("seed") {
            None => 0,
            Some(v) => v
                .as_u64()
                .ok_or_else(|| bad("`seed` must be a non-negative integer".into()))?,
        };
        let std = match value.get("std") {
            None => 0.02,
            Some(v) => v
                .as_f64()
                .filter(|s| s.is_finite() && *s > 0.0)
                .ok_or_else(|| bad("`std` must be a positive number".into()))?
                as f32,
        };
        let init = RandomInit::new(seed, std);
        match value.get("ggml_type") {
            None => Ok(init),
            Some(v) => {
                let names = || {
                    RANDOM_GGML_TYPES
                        .map(|t| t.name().to_ascii_lowercase())
                        .join(", ")
                };
                let ty = v
                    .as_str()
                    .and_then(|n| {
                        RANDOM_GGML_TYPES
                            .into_iter()
                            .find(|t| t.name().eq_ignore_ascii_case(n))
                    })
                    .ok_or_else(|| bad(format!("`ggml_type` {v} is not one of {}", names())))?;
                Ok(init.with_ggml_type(ty))
            }
        }
    }
}

impl TensorSource for RandomInit {
    fn source_name(&self) -> String {
        format!("random initialisation (seed {})", self.seed)
    }

    fn contains(&self, _name: &str) -> bool {
        true
    }

    fn shape_of(&self, _name: &str) -> Option<Vec<usize>> {
        None
    }

    /// A request without a shape is for a scalar (HF's `logit_scale` parameters): 0.
    fn tensor(&self, _name: &str) -> Result<HostTensor> {
        HostTensor::from_f32(vec![], &[0.0])
    }

    fn names(&self) -> Vec<String> {
        Vec::new()
    }

    fn tensor_shaped(&self, name: &str, expected: &[usize]) -> Result<HostTensor> {
        match self.blocks(name, expected)? {
            None => random_tensor(name, expected, self.seed, self.std),
            Some((ty, data)) => {
                let cols = expected[1];
                let row_bytes = data.len() / expected[0];
                let mut values = vec![0f32; expected[0] * cols];
                for (row, bytes) in values.chunks_mut(cols).zip(data.chunks(row_bytes)) {
                    dequantize_row(ty, bytes, row)
                        .map_err(|e| Error::InvalidInput(format!("random `{name}`: {e}")))?;
                }
                HostTensor::from_f32(expected.to_vec(), &values)
            }
        }
    }

    fn quantized_blocks_shaped(
        &self,
        name: &str,
        shape: [usize; 2],
    ) -> Result<Option<QuantizedBlocks>> {
        Ok(self
            .blocks(name, &shape)?
            .map(|(ty, data)| QuantizedBlocks {
                ggml_type: ty.id(),
                data: data.into(),
                shape,
            }))
    }
}

fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

fn next_unit(state: &mut u64) -> f32 {
    // splitmix64
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z >> 40) as f32 / (1u64 << 24) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn init_from(json: &str) -> std::result::Result<RandomInit, crate::IoError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(crate::RANDOM_INIT_FILE);
        std::fs::write(&path, json).unwrap();
        RandomInit::from_file(&path)
    }

    #[test]
    fn batch_norm_statistics_start_as_pytorchs() {
        let init = init_from(r#"{"seed": 3, "std": 0.5}"#).unwrap();
        let stats = |name: &str| init.tensor_shaped(name, &[8]).unwrap().to_f32_vec();
        let prefix = "backbone.conv_encoder.model.encoder.stages.0.layers.0.shortcut.normalization";
        assert_eq!(stats(&format!("{prefix}.running_var")), vec![1.0; 8]);
        assert_eq!(stats(&format!("{prefix}.running_mean")), vec![0.0; 8]);
        let conv = init
            .tensor_shaped("backbone.embedder.convolution.weight", &[4, 3, 7, 7])
            .unwrap()
            .to_f32_vec();
        assert!(conv.iter().any(|&v| v < 0.0) && conv.iter().any(|&v| v > 0.0));
    }

    #[test]
    fn the_marker_names_a_ggml_type() {
        let init = init_from(r#"{"seed": 3, "std": 0.5, "ggml_type": "Q4_K"}"#).unwrap();
        assert_eq!(
            (init.seed, init.std, init.ggml),
            (3, 0.5, Some(BlockType::Q4_K))
        );
        for ty in RANDOM_GGML_TYPES {
            for name in [
                ty.name().to_ascii_lowercase(),
                ty.name().to_ascii_uppercase(),
            ] {
                let json = format!(r#"{{"ggml_type": "{name}"}}"#);
                assert_eq!(init_from(&json).unwrap().ggml, Some(ty), "{name}");
            }
        }
        assert_eq!(init_from(r#"{"seed": 3}"#).unwrap().ggml, None);
        for bad in [r#""q2_k""#, r#""f16""#, r#""q4""#, "12", "null"] {
            let json = format!(r#"{{"ggml_type": {bad}}}"#);
            let err = init_from(&json).err().unwrap();
            assert!(
                matches!(err, crate::IoError::InvalidConfig { .. }),
                "{bad}: {err}"
            );
            let msg = err.to_string();
            assert!(msg.contains("ggml_type") && msg.contains(bad), "{msg}");
            let accepted = "q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k";
            assert!(msg.contains(accepted), "{msg}");
        }
    }

    #[test]
    fn weights_in_blocks_are_the_values_it_serves() {
        let (rows, cols) = (3, 512);
        let name = "model.layers.0.mlp.up_proj.weight";
        let plain = RandomInit::new(5, 0.02)
            .tensor_shaped(name, &[rows, cols])
            .unwrap()
            .to_f32_vec();
        for ty in RANDOM_GGML_TYPES {
            let init = RandomInit::new(5, 0.02).with_ggml_type(ty);
            let blocks = init
                .quantized_blocks_shaped(name, [rows, cols])
                .unwrap()
                .unwrap();
            assert_eq!(blocks.ggml_type, ty.id());
            assert_eq!(blocks.shape, [rows, cols]);
            // The blocks are the random values quantized, row by row ...
            let row_bytes = ty.bytes_for(cols).unwrap();
            assert_eq!(blocks.data.len(), rows * row_bytes, "{ty}");
            let want: Vec<u8> = plain
                .chunks(cols)
                .flat_map(|row| quantize_row(ty, row).unwrap())
                .collect();
            assert_eq!(&blocks.data[..], &want[..], "{ty}");
            // ... and the values served are exactly those blocks dequantized.
            let mut dequantized = vec![0f32; rows * cols];
            for (row, bytes) in dequantized
                .chunks_mut(cols)
                .zip(blocks.data.chunks(row_bytes))
            {
                dequantize_row(ty, bytes, row).unwrap();
            }
            let served = init.tensor_shaped(name, &[rows, cols]).unwrap();
            assert_eq!(served.shape(), &[rows, cols]);
            assert_eq!(served.to_f32_vec(), dequantized, "{ty}");
            let err = plain
                .iter()
                .zip(&dequantized)
                .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(err > 0.0 && err < 0.02, "{ty}: {err}");
        }
    }

    /// Rows that are not whole super-blocks of a k-quant are stored as llama.cpp stores them.
    #[test]
    fn k_quant_rows_of_partial_super_blocks_take_llama_cpp_fallbacks() {
        for (ty, cols, want) in [
            (BlockType::Q4_K, 896, Some(BlockType::Q5_0)),
            (BlockType::Q5_K, 96, Some(BlockType::Q5_1)),
            (BlockType::Q6_K, 32, Some(BlockType::Q8_0)),
            (BlockType::Q4_K, 512, Some(BlockType::Q4_K)),
            (BlockType::Q4_0, 96, Some(BlockType::Q4_0)),
            (BlockType::Q4_K, 100, None),
        ] {
            assert_eq!(stored_type(ty, cols), want, "{ty} over {cols}");
            let blocks = RandomInit::new(5, 0.02)
                .with_ggml_type(ty)
                .quantized_blocks_shaped("model.layers.0.mlp.up_proj.weight", [2, cols])
                .unwrap();
            assert_eq!(
                blocks.map(|b| b.ggml_type),
                want.map(|t| t.id()),
                "{ty} over {cols}"
            );
        }
    }

    #[test]
    fn other_tensors_stay_f32() {
        let init = RandomInit::new(5, 0.02).with_ggml_type(BlockType::Q4_K);
        let plain = RandomInit::new(5, 0.02);
        // Without a shape there are no blocks (the loaders ask with one).
        let name = "model.layers.0.mlp.up_proj.weight";
        assert!(init.quantized_blocks(name).unwrap().is_none());
        // 2-D tensors that are not `*.weight` or whose rows are not whole blocks.
        for (name, shape) in [
            ("model.layers.0.mlp.down_proj.weight", [4, 100]),
            ("model.layers.0.self_attn.rel_bias", [4, 256]),
            ("model.layers.0.mlp.up_proj.weight", [0, 256]),
        ] {
            assert!(
                init.quantized_blocks_shaped(name, shape).unwrap().is_none(),
                "{name} {shape:?}"
            );
            assert_eq!(
                init.tensor_shaped(name, &shape).unwrap().to_f32_vec(),
                plain.tensor_shaped(name, &shape).unwrap().to_f32_vec(),
                "{name} {shape:?}"
            );
        }
        // 1-D and other ranks: norms (ones), biases (zeros), random vectors, 3-D tensors.
        for (name, shape) in [
            ("model.norm.weight", vec![512]),
            ("model.layers.0.self_attn.q_proj.bias", vec![512]),
            ("model.layers.0.conv.weight", vec![2, 4, 256]),
        ] {
            assert!(init.blocks(name, &shape).unwrap().is_none(), "{name}");
            assert_eq!(
                init.tensor_shaped(name, &shape).unwrap().to_f32_vec(),
                plain.tensor_shaped(name, &shape).unwrap().to_f32_vec(),
                "{name}"
            );
        }
        // No type, no blocks.
        assert!(plain
            .quantized_blocks_shaped(name, [4, 256])
            .unwrap()
            .is_none());
    }
}
