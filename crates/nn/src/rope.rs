//! Rotary position embeddings (RoPE) as HF's `*RotaryEmbedding` modules compute them: inverse
//! frequencies from `rope_theta` (optionally rescaled: `linear`, `dynamic` NTK, `llama3`), cos / sin
//! tables for given position ids, and `rotate_half` application to query / key heads (optionally
//! only on the first `rotary_dim` features of each head, the rest passing through).
//!
//! The frequencies are computed in f32 in the same order of operations as PyTorch does, so the
//! angles match HF's bit for bit up to the last-ulp differences of `pow` / `cos` implementations.

use std::borrow::Cow;

use burn::tensor::{backend::Backend, Tensor, TensorData};
use ipfs_accelerate_core::{Error, Result};

/// How the inverse frequencies are rescaled (HF's `rope_type`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE (`default`).
    None,
    /// Position interpolation (`linear`): every inverse frequency divided by `factor`.
    Linear {
        /// Scaling factor.
        factor: f64,
    },
    /// Dynamic NTK scaling (`dynamic`): the base grows with the sequence length once it passes
    /// `max_position_embeddings`.
    Dynamic {
        /// Scaling factor.
        factor: f64,
        /// The length beyond which the base is rescaled.
        max_position_embeddings: usize,
    },
    /// LLaMA 3.1's frequency-dependent scaling (`llama3`).
    Llama3 {
        /// Scaling of low frequencies.
        factor: f64,
        /// Wavelengths above `original / low_freq_factor` are divided by `factor`.
        low_freq_factor: f64,
        /// Wavelengths below `original / high_freq_factor` are kept.
        high_freq_factor: f64,
        /// Context length of pre-training.
        original_max_position_embeddings: usize,
    },
}

/// A resolved rotary embedding: base, widths and scaling.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeConfig {
    /// The base wavelength (`rope_theta`).
    pub theta: f64,
    /// Width of one attention head.
    pub head_dim: usize,
    /// Leading features of each head that are rotated (even, ≤ `head_dim`); the rest pass through.
    pub rotary_dim: usize,
    /// Frequency rescaling.
    pub scaling: RopeScaling,
}

impl RopeConfig {
    /// Plain RoPE over whole heads.
    pub fn new(theta: f64, head_dim: usize) -> Self {
        RopeConfig {
            theta,
            head_dim,
            rotary_dim: head_dim,
            scaling: RopeScaling::None,
        }
    }

    /// Checks the values are usable.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::InvalidInput(format!("rotary embedding: {m}")));
        if !(self.theta.is_finite() && self.theta > 0.0) {
            return bad(format!("rope_theta must be > 0, got {}", self.theta));
        }
        if self.rotary_dim == 0
            || !self.rotary_dim.is_multiple_of(2)
            || self.rotary_dim > self.head_dim
        {
            return bad(format!(
                "rotary dimension {} must be even, positive and at most head_dim {}",
                self.rotary_dim, self.head_dim
            ));
        }
        let positive = |name: &str, v: f64| -> Result<()> {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(Error::InvalidInput(format!(
                    "rotary embedding: `{name}` must be > 0, got {v}"
                )))
            }
        };
        match self.scaling {
            RopeScaling::None => {}
            RopeScaling::Linear { factor } => positive("factor", factor)?,
            RopeScaling::Dynamic {
                factor,
                max_position_embeddings,
            } => {
                positive("factor", factor)?;
                if max_position_embeddings == 0 {
                    return bad("dynamic scaling needs max_position_embeddings > 0".into());
                }
                if self.rotary_dim <= 2 {
                    return bad("dynamic scaling needs a rotary dimension above 2".into());
                }
            }
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                positive("factor", factor)?;
                positive("low_freq_factor", low_freq_factor)?;
                positive("high_freq_factor", high_freq_factor)?;
                if high_freq_factor == low_freq_factor {
                    return bad("llama3 scaling needs high_freq_factor != low_freq_factor".into());
                }
                if original_max_position_embeddings == 0 {
                    return bad("llama3 scaling needs original_max_position_embeddings > 0".into());
                }
            }
        }
        Ok(())
    }
}

/// The RoPE fields of an HF `config.json`, in either spelling: transformers ≥ 5's
/// `rope_parameters` dict, or the older top-level `rope_theta` plus a `rope_scaling` dict (whose
/// kind may be named `type`). Deserialize the dict with this type and merge with
/// [`RopeParameters::standardize`].
#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize)]
pub struct RopeParameters {
    /// `default`, `linear`, `dynamic`, `llama3`, ...
    #[serde(default)]
    pub rope_type: Option<String>,
    /// The legacy spelling of `rope_type`.
    #[serde(default, rename = "type")]
    pub legacy_type: Option<String>,
    /// Base wavelength.
    #[serde(default)]
    pub rope_theta: Option<f64>,
    /// Scaling factor (`linear`, `dynamic`, `llama3`).
    #[serde(default)]
    pub factor: Option<f64>,
    /// `llama3` low-frequency factor.
    #[serde(default)]
    pub low_freq_factor: Option<f64>,
    /// `llama3` high-frequency factor.
    #[serde(default)]
    pub high_freq_factor: Option<f64>,
    /// `llama3` pre-training context.
    #[serde(default)]
    pub original_max_position_embeddings: Option<usize>,
    /// Fraction of each head that is rotated.
    #[serde(default)]
    pub partial_rotary_factor: Option<f64>,
}

/// HF's base wavelength when a config names none.
pub const DEFAULT_ROPE_THETA: f64 = 10_000.0;

impl RopeParameters {
    /// Merges the spellings as transformers' `convert_rope_params_to_dict` does: `rope_scaling`
    /// wins over `rope_parameters`; `rope_theta` and `partial_rotary_factor` fill in from the
    /// top level of the config when the dict lacks them (theta defaulting to 10000).
    pub fn standardize(
        rope_parameters: Option<&RopeParameters>,
        rope_scaling: Option<&RopeParameters>,
        rope_theta: Option<f64>,
        partial_rotary_factor: Option<f64>,
    ) -> RopeParameters {
        let mut p = rope_scaling
            .or(rope_parameters)
            .cloned()
            .unwrap_or_default();
        p.rope_theta = p.rope_theta.or(rope_theta).or(Some(DEFAULT_ROPE_THETA));
        p.partial_rotary_factor = p.partial_rotary_factor.or(partial_rotary_factor);
        p
    }

    /// The kind (`rope_type`, else `type`, else `default`).
    pub fn kind(&self) -> &str {
        self.rope_type
            .as_deref()
            .or(self.legacy_type.as_deref())
            .unwrap_or("default")
    }

    /// The resolved configuration for heads of `head_dim` in a model whose config says
    /// `max_position_embeddings`. The rotary width is `int(head_dim * partial_rotary_factor)` as HF's
    /// scaled initialisers compute it. Unsupported kinds and missing factors are errors.
    pub fn resolve(&self, head_dim: usize, max_position_embeddings: usize) -> Result<RopeConfig> {
        let theta = self.rope_theta.unwrap_or(DEFAULT_ROPE_THETA);
        let partial = self.partial_rotary_factor.unwrap_or(1.0);
        if !(partial.is_finite() && partial > 0.0 && partial <= 1.0) {
            return Err(Error::InvalidInput(format!(
                "partial_rotary_factor must be in (0, 1], got {partial}"
            )));
        }
        let kind = self.kind();
        let need = |name: &str, v: Option<f64>| {
            v.ok_or_else(|| {
                Error::InvalidInput(format!(
                    "rope_type `{kind}` needs `{name}` in rope_parameters"
                ))
            })
        };
        let scaling = match kind {
            "default" => RopeScaling::None,
            "linear" => RopeScaling::Linear {
                factor: need("factor", self.factor)?,
            },
            "dynamic" => RopeScaling::Dynamic {
                factor: need("factor", self.factor)?,
                max_position_embeddings,
            },
            "llama3" => RopeScaling::Llama3 {
                factor: need("factor", self.factor)?,
                low_freq_factor: need("low_freq_factor", self.low_freq_factor)?,
                high_freq_factor: need("high_freq_factor", self.high_freq_factor)?,
                original_max_position_embeddings: self
                    .original_max_position_embeddings
                    .unwrap_or(max_position_embeddings),
            },
            other => {
                return Err(Error::InvalidInput(format!(
                    "rope_type `{other}` is not supported (default, linear, dynamic, llama3 are)"
                )))
            }
        };
        let config = RopeConfig {
            theta,
            head_dim,
            rotary_dim: (head_dim as f64 * partial) as usize,
            scaling,
        };
        config.validate()?;
        Ok(config)
    }
}

/// Rotary embeddings of one model: inverse frequencies plus cos / sin tables on demand.
#[derive(Debug, Clone)]
pub struct RotaryEmbedding {
    config: RopeConfig,
    inv_freq: Vec<f32>,
}

/// `1 / base^(2i / dim)` for `i < dim / 2`, in f32 as PyTorch computes it.
fn base_inv_freq(base: f32, dim: usize) -> Vec<f32> {
    (0..dim)
        .step_by(2)
        .map(|i| 1.0 / base.powf(i as f32 / dim as f32))
        .collect()
}

impl RotaryEmbedding {
    /// Precomputes the inverse frequencies of `config`.
    pub fn new(config: RopeConfig) -> Result<Self> {
        config.validate()?;
        let dim = config.rotary_dim;
        let mut inv_freq = base_inv_freq(config.theta as f32, dim);
        match config.scaling {
            RopeScaling::None | RopeScaling::Dynamic { .. } => {}
            RopeScaling::Linear { factor } => {
                let factor = factor as f32;
                inv_freq.iter_mut().for_each(|f| *f /= factor);
            }
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                let (factor, low, high) = (
                    factor as f32,
                    low_freq_factor as f32,
                    high_freq_factor as f32,
                );
                let old = original_max_position_embeddings as f32;
                let (low_wavelen, high_wavelen) = (old / low, old / high);
                for f in inv_freq.iter_mut() {
                    let wavelen = 2.0 * std::f32::consts::PI / *f;
                    let scaled = if wavelen > low_wavelen {
                        *f / factor
                    } else {
                        *f
                    };
                    *f = if wavelen < high_wavelen || wavelen > low_wavelen {
                        scaled
                    } else {
                        let smooth = (old / wavelen - low) / (high - low);
                        (1.0 - smooth) * scaled / factor + smooth * scaled
                    };
                }
            }
        }
        Ok(RotaryEmbedding { config, inv_freq })
    }

    /// The configuration.
    pub fn config(&self) -> &RopeConfig {
        &self.config
    }

    /// The inverse frequencies used for a call whose largest position is `seq_len - 1`
    /// (only `dynamic` scaling depends on it: HF recomputes the base from
    /// `max(seq_len, max_position_embeddings)`).
    pub fn inv_freq(&self, seq_len: usize) -> Cow<'_, [f32]> {
        match self.config.scaling {
            RopeScaling::Dynamic {
                factor,
                max_position_embeddings,
            } if seq_len > max_position_embeddings => {
                let dim = self.config.rotary_dim as f32;
                let factor = factor as f32;
                let ratio = factor * seq_len as f32 / max_position_embeddings as f32;
                let base =
                    self.config.theta as f32 * (ratio - (factor - 1.0)).powf(dim / (dim - 2.0));
                Cow::Owned(base_inv_freq(base, self.config.rotary_dim))
            }
            _ => Cow::Borrowed(&self.inv_freq),
        }
    }

    /// Cos and sin tables `[batch, 1, seq, rotary_dim]` for row-major position ids `[batch, seq]`
    /// (HF's `emb = cat(freqs, freqs)`), ready to broadcast over heads. Negative positions or a
    /// wrong count are errors.
    pub fn cos_sin<B: Backend>(
        &self,
        positions: &[i64],
        batch: usize,
        seq: usize,
        device: &B::Device,
    ) -> Result<(Tensor<B, 4>, Tensor<B, 4>)> {
        if positions.len() != batch * seq {
            return Err(Error::InvalidInput(format!(
                "{} position ids for [{batch}, {seq}]",
                positions.len()
            )));
        }
        if let Some(bad) = positions.iter().find(|&&p| p < 0) {
            return Err(Error::InvalidInput(format!("negative position id {bad}")));
        }
        let max = positions.iter().copied().max().unwrap_or(0) as usize;
        let inv_freq = self.inv_freq(max + 1);
        let dim = self.config.rotary_dim;
        let mut cos = Vec::with_capacity(positions.len() * dim);
        let mut sin = Vec::with_capacity(positions.len() * dim);
        let mut angles = vec![0f32; dim / 2];
        for &p in positions {
            for (a, f) in angles.iter_mut().zip(inv_freq.iter()) {
                *a = p as f32 * f;
            }
            for _ in 0..2 {
                cos.extend(angles.iter().map(|a| f64::from(*a).cos() as f32));
                sin.extend(angles.iter().map(|a| f64::from(*a).sin() as f32));
            }
        }
        let shape = [batch, 1, seq, dim];
        Ok((
            Tensor::from_data(TensorData::new(cos, shape), device),
            Tensor::from_data(TensorData::new(sin, shape), device),
        ))
    }

    /// Rotates heads `x` `[batch, heads, seq, head_dim]` with tables from
    /// [`RotaryEmbedding::cos_sin`]: `x * cos + rotate_half(x) * sin` on the first `rotary_dim`
    /// features, the remaining ones unchanged.
    pub fn apply<B: Backend>(
        &self,
        x: Tensor<B, 4>,
        cos: &Tensor<B, 4>,
        sin: &Tensor<B, 4>,
    ) -> Tensor<B, 4> {
        let head_dim = x.dims()[3];
        let dim = self.config.rotary_dim.min(head_dim);
        let (rot, pass) = if dim < head_dim {
            (
                x.clone().narrow(3, 0, dim),
                Some(x.narrow(3, dim, head_dim - dim)),
            )
        } else {
            (x, None)
        };
        let rotated = rotate_half(rot.clone());
        let out = rot * cos.clone() + rotated * sin.clone();
        match pass {
            Some(pass) => Tensor::cat(vec![out, pass], 3),
            None => out,
        }
    }
}

/// `cat(-x2, x1)` of the two halves of the last dimension (HF's `rotate_half`).
pub fn rotate_half<B: Backend>(x: Tensor<B, 4>) -> Tensor<B, 4> {
    let half = x.dims()[3] / 2;
    let x1 = x.clone().narrow(3, 0, half);
    let x2 = x.narrow(3, half, half);
    Tensor::cat(vec![x2.neg(), x1], 3)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn_flex::Flex;

    fn values(t: Tensor<Flex, 4>) -> Vec<f32> {
        t.into_data().to_vec().unwrap()
    }

    #[test]
    fn rotation_matches_the_complex_formula() {
        let dev = Default::default();
        let rope = RotaryEmbedding::new(RopeConfig::new(100.0, 4)).unwrap();
        let x: Vec<f32> = vec![1.0, 2.0, 3.0, 4.0, 0.5, -1.0, 2.0, 0.25];
        let xt = Tensor::<Flex, 4>::from_data(TensorData::new(x.clone(), [1, 1, 2, 4]), &dev);
        let (cos, sin) = rope.cos_sin::<Flex>(&[0, 3], 1, 2, &dev).unwrap();
        let out = values(rope.apply(xt, &cos, &sin));
        // Pairs (i, i + half) rotate by position * 100^(-2i/4).
        for (row, pos) in [(0usize, 0f64), (1, 3.0)] {
            for i in 0..2 {
                let theta = pos * 100f64.powf(-(2.0 * i as f64) / 4.0);
                let (a, b) = (x[row * 4 + i] as f64, x[row * 4 + i + 2] as f64);
                let ra = a * theta.cos() - b * theta.sin();
                let rb = b * theta.cos() + a * theta.sin();
                assert!((out[row * 4 + i] as f64 - ra).abs() < 1e-5);
                assert!((out[row * 4 + i + 2] as f64 - rb).abs() < 1e-5);
            }
        }
    }

    #[test]
    fn partial_rotation_passes_the_tail_through() {
        let dev = Default::default();
        let config = RopeConfig {
            rotary_dim: 2,
            ..RopeConfig::new(10_000.0, 4)
        };
        let rope = RotaryEmbedding::new(config).unwrap();
        let xt = Tensor::<Flex, 4>::from_data(
            TensorData::new(vec![1.0f32, 0.0, 7.0, 8.0], [1, 1, 1, 4]),
            &dev,
        );
        let (cos, sin) = rope.cos_sin::<Flex>(&[2], 1, 1, &dev).unwrap();
        let out = values(rope.apply(xt, &cos, &sin));
        assert!((out[0] - 2f32.cos()).abs() < 1e-6);
        assert!((out[1] - 2f32.sin()).abs() < 1e-6);
        assert_eq!(&out[2..], &[7.0, 8.0]);
    }

    #[test]
    fn scalings_follow_hf() {
        let base = base_inv_freq(10_000.0, 8);
        let linear = RotaryEmbedding::new(RopeConfig {
            scaling: RopeScaling::Linear { factor: 4.0 },
            ..RopeConfig::new(10_000.0, 8)
        })
        .unwrap();
        for (a, b) in linear.inv_freq(1).iter().zip(&base) {
            assert_eq!(*a, b / 4.0);
        }
        let dynamic = RotaryEmbedding::new(RopeConfig {
            scaling: RopeScaling::Dynamic {
                factor: 2.0,
                max_position_embeddings: 16,
            },
            ..RopeConfig::new(10_000.0, 8)
        })
        .unwrap();
        assert_eq!(&*dynamic.inv_freq(16), &base[..]);
        // seq 32: base * (2 * 32 / 16 - 1)^(8 / 6)
        let grown = 10_000f64 * 3f64.powf(8.0 / 6.0);
        let want = 1.0 / grown.powf(2.0 / 8.0);
        assert!((f64::from(dynamic.inv_freq(32)[1]) - want).abs() / want < 1e-5);
        let llama3 = RotaryEmbedding::new(RopeConfig {
            scaling: RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 64,
            },
            ..RopeConfig::new(10_000.0, 8)
        })
        .unwrap();
        // wavelengths 2π·[1, 10, 100, 1000] against 64/4 and 64/1: kept, smoothed, divided ×2.
        let f = llama3.inv_freq(1);
        assert_eq!(f[0], base[0]);
        assert_eq!(f[2], base[2] / 8.0);
        assert_eq!(f[3], base[3] / 8.0);
        let wavelen = 2.0 * std::f32::consts::PI / base[1];
        let smooth = (64.0 / wavelen - 1.0) / 3.0;
        let want = (1.0 - smooth) * base[1] / 8.0 + smooth * base[1];
        assert!((f[1] - want).abs() < 1e-9);
        assert!(f[1] < base[1] && f[1] > base[1] / 8.0);
    }

    #[test]
    fn parameters_resolve_and_reject() {
        let legacy = RopeParameters {
            legacy_type: Some("linear".into()),
            factor: Some(2.0),
            ..Default::default()
        };
        let p = RopeParameters::standardize(None, Some(&legacy), Some(500.0), None);
        let c = p.resolve(8, 128).unwrap();
        assert_eq!(c.theta, 500.0);
        assert_eq!(c.scaling, RopeScaling::Linear { factor: 2.0 });
        let none = RopeParameters::standardize(None, None, None, None);
        assert_eq!(none.resolve(8, 128).unwrap(), RopeConfig::new(10_000.0, 8));
        let kind = |k: &str| RopeParameters {
            rope_type: Some(k.into()),
            ..Default::default()
        };
        let yarn = kind("yarn");
        assert!(yarn.resolve(8, 128).is_err());
        let no_factor = kind("dynamic");
        assert!(no_factor.resolve(8, 128).is_err());
        assert!(RopeParameters::default().resolve(7, 128).is_err());
    }
}
