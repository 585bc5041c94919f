//! Reading a checkpoint's trunk into the backend-neutral [`EncoderSpec`] pieces
//! (`ipfs_accelerate_core::encoder`), through the same name tables the burn modules load with, so
//! a family's names are written once for both executors.

use ipfs_accelerate_core::{
    DenseWeights, EncoderActivation, EncoderLayerWeights, Error, GatedActivation, NormWeights,
    Result, TensorSource,
};

use crate::{transformer::PreLnNames, Activation};

/// Reads f32 copies of a checkpoint's tensors under a prefix (`"vit."`, `""`).
pub struct SpecReader<'a> {
    source: &'a dyn TensorSource,
    prefix: String,
}

impl<'a> SpecReader<'a> {
    /// A reader of `source`'s tensors under `prefix` (`""`, or a dotted path such as `"vit"`).
    pub fn new(source: &'a dyn TensorSource, prefix: &str) -> Self {
        SpecReader {
            source,
            prefix: if prefix.is_empty() {
                String::new()
            } else {
                format!("{prefix}.")
            },
        }
    }

    /// The reader of the tensors under `name` (`pp` as in `VarBuilder`).
    pub fn pp(&self, name: &str) -> SpecReader<'a> {
        SpecReader {
            source: self.source,
            prefix: format!("{}{name}.", self.prefix),
        }
    }

    /// Whether the checkpoint holds `name`.
    pub fn has(&self, name: &str) -> bool {
        self.source.contains(&format!("{}{name}", self.prefix))
    }

    /// `name` as f32 values, checked to be of `shape`.
    pub fn read(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let full = format!("{}{name}", self.prefix);
        Ok(self.source.tensor_shaped(&full, shape)?.to_f32_vec())
    }

    /// The dense layer `name` (`[out, in]` weight), with its bias, or zeros where `bias` is false.
    pub fn dense_with(
        &self,
        name: &str,
        out: usize,
        inp: usize,
        bias: bool,
    ) -> Result<DenseWeights> {
        Ok(DenseWeights {
            out_features: out,
            in_features: inp,
            weight: self.read(&format!("{name}.weight"), &[out, inp])?,
            bias: if bias {
                self.read(&format!("{name}.bias"), &[out])?
            } else {
                vec![0.0; out]
            },
        })
    }

    /// The dense layer `name` with its bias.
    pub fn dense(&self, name: &str, out: usize, inp: usize) -> Result<DenseWeights> {
        self.dense_with(name, out, inp, true)
    }

    /// The vector `name.weight` of width `h` (an RMSNorm's scale).
    pub fn scale(&self, name: &str, h: usize) -> Result<Vec<f32>> {
        self.read(&format!("{name}.weight"), &[h])
    }

    /// The layer norm `name` of width `h`.
    pub fn norm(&self, name: &str, h: usize) -> Result<NormWeights> {
        Ok(NormWeights {
            gamma: self.scale(name, h)?,
            beta: self.read(&format!("{name}.bias"), &[h])?,
        })
    }

    /// One pre-norm layer (`names` under this reader's prefix) as the spec's layer: the norm
    /// before attention is `attention_norm`, the one before the MLP `output_norm`.
    pub fn pre_ln_layer(
        &self,
        names: &PreLnNames<'_>,
        hidden: usize,
        intermediate: usize,
        qkv_bias: bool,
    ) -> Result<EncoderLayerWeights> {
        let (h, i) = (hidden, intermediate);
        let a = &names.attention;
        Ok(EncoderLayerWeights {
            query: self.dense_with(a.q, h, h, qkv_bias)?,
            key: self.dense_with(a.k, h, h, qkv_bias)?,
            value: self.dense_with(a.v, h, h, qkv_bias)?,
            attention_output: self.dense(a.o, h, h)?,
            attention_norm: self.norm(names.norm1, h)?,
            intermediate: self.dense(names.fc1, i, h)?,
            output: self.dense(names.fc2, h, i)?,
            output_norm: self.norm(names.norm2, h)?,
        })
    }
}

/// The spec's name for a feed-forward activation, or an [`Error::InvalidInput`] naming one it
/// has none for (such checkpoints run on the burn modules).
pub fn encoder_activation(act: Activation) -> Result<EncoderActivation> {
    Ok(match act {
        Activation::Gelu => EncoderActivation::Gelu,
        Activation::GeluTanh => EncoderActivation::GeluTanh,
        Activation::Relu => EncoderActivation::Relu,
        other => {
            return Err(Error::InvalidInput(format!(
                "the encoder spec has no activation {other:?}"
            )))
        }
    })
}

/// The decoder spec's name for a gated MLP's activation, or an [`Error::InvalidInput`] naming one
/// it has none for.
pub fn gated_activation(act: Activation) -> Result<GatedActivation> {
    Ok(match act {
        Activation::Silu => GatedActivation::Silu,
        Activation::GeluTanh => GatedActivation::GeluTanh,
        Activation::Gelu => GatedActivation::Gelu,
        other => {
            return Err(Error::InvalidInput(format!(
                "the decoder spec has no gated activation {other:?}"
            )))
        }
    })
}
