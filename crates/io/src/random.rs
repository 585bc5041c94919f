//! Random weights for a named configuration: benchmarks and tests that need a model of real size
//! but no download.

use std::collections::BTreeMap;

use ipfs_accelerate_core::{Error, HostTensor, Result, TensorSource};

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

/// A deterministic tensor for `name`: rank-1 biases zeros, rank-1 weights ones, else roughly normal
/// values with standard deviation `std`.
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
    if shape.len() == 1 && name.ends_with("bias") {
        values.resize(n, 0.0);
    } else if shape.len() == 1 && name.ends_with("weight") {
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
#[derive(Debug, Clone, Copy)]
pub struct RandomInit {
    seed: u64,
    std: f32,
}

impl RandomInit {
    /// A source seeded with `seed`, weights of standard deviation `std` (HF uses 0.02).
    pub fn new(seed: u64, std: f32) -> Self {
        RandomInit { seed, std }
    }

    /// Reads `{"seed": N, "std": X}` (both optional: seed 0, std 0.02) from a
    /// [`crate::RANDOM_INIT_FILE`].
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
        Ok(RandomInit::new(seed, std))
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
        random_tensor(name, expected, self.seed, self.std)
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
