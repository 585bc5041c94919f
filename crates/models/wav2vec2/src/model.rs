//! Wav2Vec2: convolutional feature encoder, feature projection, weight-normed positional
//! convolution, transformer encoder (post-LN or "stable" pre-LN) and the CTC head, as Wav2Vec2's
//! description ([`crate::describe`]) run by the shared burn trunk executor.

use std::sync::Arc;

use burn::tensor::{backend::Backend, Tensor, TensorData};
use ipfs_accelerate_core::{EncoderHead, Error, Result, TensorSource};
use ipfs_accelerate_nn::{
    attention::ProjectionNames, transformer::PreLnNames, trunk::Trunk, VarBuilder,
};

use crate::config::Wav2Vec2Config;

/// PyTorch's default `eps` of `nn.GroupNorm` / `nn.LayerNorm`, used by the feature encoder.
pub(crate) const CONV_NORM_EPS: f64 = 1e-5;

/// The weight names of a transformer layer (`Wav2Vec2EncoderLayer[StableLayerNorm]`).
pub(crate) const LAYER_NAMES: PreLnNames<'static> = PreLnNames {
    norm1: "layer_norm",
    attention: ProjectionNames {
        q: "attention.q_proj",
        k: "attention.k_proj",
        v: "attention.v_proj",
        o: "attention.out_proj",
    },
    norm2: "final_layer_norm",
    fc1: "feed_forward.intermediate_dense",
    fc2: "feed_forward.output_dense",
};

/// Outputs of [`Wav2Vec2Model::forward`].
#[derive(Debug, Clone)]
pub struct Wav2Vec2Output<B: Backend> {
    /// `[batch, frames, hidden]`.
    pub last_hidden_state: Tensor<B, 3>,
    /// Per row, the number of frames that hold audio (all frames without an attention mask).
    pub frame_lengths: Vec<usize>,
}

/// `Wav2Vec2Model`: feature encoder, projection and transformer encoder, with the CTC head
/// when loaded by [`Wav2Vec2::load`] from a checkpoint that has one.
pub struct Wav2Vec2Model<B: Backend> {
    trunk: Trunk<B>,
    config: Wav2Vec2Config,
    device: B::Device,
}

impl<B: Backend> Wav2Vec2Model<B> {
    /// Loads the model from `vb` (rooted where `feature_extractor.` and `encoder.` live),
    /// without a head.
    pub fn load(vb: &VarBuilder<B>, c: &Wav2Vec2Config) -> Result<Self> {
        Self::described(vb, c, None)
    }

    /// The description read by `vb`, with `head`, on the trunk executor.
    fn described(
        vb: &VarBuilder<B>,
        c: &Wav2Vec2Config,
        head: Option<EncoderHead<ipfs_accelerate_nn::Linear<B>>>,
    ) -> Result<Self> {
        Ok(Wav2Vec2Model {
            trunk: Trunk::new(crate::describe(vb, c, head)?, vb.device())?,
            config: c.clone(),
            device: vb.device().clone(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &Wav2Vec2Config {
        &self.config
    }

    /// Runs the model on `input_values` (row-major `[batch, samples]`). `attention_mask` (same
    /// layout, 1 = sample, 0 = padding) is reduced to frames as HF does: padded frames are zeroed
    /// before the positional convolution and masked as attention keys.
    pub fn forward(
        &self,
        input_values: &[f32],
        batch: usize,
        attention_mask: Option<&[i64]>,
    ) -> Result<Wav2Vec2Output<B>> {
        if batch == 0 || input_values.is_empty() || !input_values.len().is_multiple_of(batch) {
            return Err(Error::InvalidInput(format!(
                "input_values: {} samples do not form {batch} non-empty rows",
                input_values.len()
            )));
        }
        let samples = input_values.len() / batch;
        if let Some(i) = input_values.iter().position(|v| !v.is_finite()) {
            return Err(Error::InvalidInput(format!(
                "input_values[{i}] is not finite ({})",
                input_values[i]
            )));
        }
        let frames = self.config.output_frames(samples).ok_or_else(|| {
            Error::InvalidInput(format!(
                "{samples} samples are shorter than the feature encoder's receptive field"
            ))
        })?;
        let frame_lengths = match attention_mask {
            None => vec![frames; batch],
            Some(m) if m.len() != input_values.len() => {
                return Err(Error::InvalidInput(format!(
                    "attention_mask has {} values, input_values {}",
                    m.len(),
                    input_values.len()
                )))
            }
            Some(m) => m
                .chunks(samples)
                .enumerate()
                .map(|(row, r)| {
                    let len = r.iter().filter(|&&v| v != 0).count();
                    self.config.output_frames(len).ok_or_else(|| {
                        Error::InvalidInput(format!(
                            "row {row} has {len} unmasked samples, fewer than one frame's receptive field"
                        ))
                    })
                })
                .collect::<Result<Vec<_>>>()?,
        };
        let x = Tensor::<B, 2>::from_data(
            TensorData::new(input_values.to_vec(), [batch, samples]),
            &self.device,
        );
        let x = self
            .trunk
            .forward_waveform(x, &frame_lengths)?
            .last_hidden_state;
        Ok(Wav2Vec2Output {
            last_hidden_state: x,
            frame_lengths,
        })
    }
}

/// A Wav2Vec2 checkpoint: the bare model, or `Wav2Vec2ForCTC` with its `lm_head`.
pub struct Wav2Vec2<B: Backend> {
    /// The model, with the CTC head in its description when the checkpoint has one.
    pub model: Wav2Vec2Model<B>,
}

impl<B: Backend> Wav2Vec2<B> {
    /// Loads from a weight source: tensors under `wav2vec2.` with `lm_head` (CTC) or unprefixed
    /// (bare `Wav2Vec2Model`).
    pub fn load(
        source: Arc<dyn TensorSource>,
        config: &Wav2Vec2Config,
        device: &B::Device,
    ) -> Result<Self> {
        let prefix = crate::spec::model_prefix(source.as_ref());
        let root = VarBuilder::<B>::new(source, device);
        let base = if prefix.is_empty() {
            root.clone()
        } else {
            root.pp(prefix)
        };
        let head = crate::ctc_head(&root, config)?;
        Ok(Wav2Vec2 {
            model: Wav2Vec2Model::described(&base, config, head)?,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &Wav2Vec2Config {
        self.model.config()
    }

    /// CTC logits `[batch, frames, vocab]`, when the checkpoint has a CTC head.
    pub fn ctc_logits(&self, hidden: Tensor<B, 3>) -> Option<Tensor<B, 3>> {
        match &self.model.trunk.spec().head {
            Some(EncoderHead::EveryToken(head)) => Some(head.forward(hidden)),
            _ => None,
        }
    }
}
