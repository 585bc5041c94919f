//! The ViT encoder and its image-classification head.

use std::sync::Arc;

use burn::tensor::{backend::Backend, Tensor};
use ipfs_accelerate_core::{Error, Result, TensorSource};
use ipfs_accelerate_nn::{
    attention::ProjectionBias,
    transformer::{PreLnConfig, PreLnEncoder, PreLnNames},
    vision::{ClassPatchEmbedding, PatchEmbedding},
    Activation, LayerNorm, Linear, VarBuilder,
};

use crate::{VitConfig, VitHead};

/// Where a checkpoint keeps the encoder: the `vit.` prefix of task heads, and the layer layout
/// (`encoder.layer.N` as `save_pretrained` writes it, or transformers 5's `layers.N` modules).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VitLayout {
    /// `"vit"` or `""`.
    pub prefix: &'static str,
    /// `"encoder.layer"` or `"layers"`.
    pub layers: &'static str,
    /// Names inside one layer.
    pub names: PreLnNames<'static>,
}

impl VitLayout {
    /// Detects the layout of `source`.
    pub fn detect(source: &dyn TensorSource) -> VitLayout {
        let prefix = if source.contains("vit.embeddings.cls_token") {
            "vit"
        } else {
            ""
        };
        let p = if prefix.is_empty() { "" } else { "vit." };
        if source.contains(&format!("{p}layers.0.layernorm_before.weight")) {
            VitLayout {
                prefix,
                layers: "layers",
                names: PreLnNames::VIT_MODULES,
            }
        } else {
            VitLayout {
                prefix,
                layers: "encoder.layer",
                names: PreLnNames::VIT,
            }
        }
    }
}

/// `ViTEmbeddings`: CLS token, patch embeddings and position embeddings.
fn load_embeddings<B: Backend>(
    vb: &VarBuilder<B>,
    c: &VitConfig,
) -> Result<ClassPatchEmbedding<B>> {
    let (rows, cols) = c.grid();
    let h = c.hidden_size;
    let cls: Tensor<B, 3> = vb.tensor("cls_token", [1, 1, h])?;
    let positions: Tensor<B, 3> = vb.tensor("position_embeddings", [1, rows * cols + 1, h])?;
    let patches = PatchEmbedding::load(
        &vb.pp("patch_embeddings.projection"),
        c.num_channels,
        h,
        c.patch(),
        true,
    )?;
    Ok(ClassPatchEmbedding::new(
        cls.reshape([h]),
        patches,
        positions.reshape([rows * cols + 1, h]),
        c.image_size.hw(),
    ))
}

/// Outputs of the bare encoder.
#[derive(Debug, Clone)]
pub struct VitOutput<B: Backend> {
    /// `[batch, 1 + patches, hidden]` after the final layer norm.
    pub last_hidden_state: Tensor<B, 3>,
    /// `[batch, pooler_output_size]`: act(dense(CLS)), when the checkpoint has a pooler.
    pub pooler_output: Option<Tensor<B, 2>>,
}

/// `ViTModel`: embeddings, pre-LN encoder, final layer norm and the optional pooler.
pub struct VitModel<B: Backend> {
    embeddings: ClassPatchEmbedding<B>,
    encoder: PreLnEncoder<B>,
    layernorm: LayerNorm<B>,
    pooler: Option<(Linear<B>, Activation)>,
    config: VitConfig,
}

impl<B: Backend> VitModel<B> {
    /// Loads the encoder from `vb` (rooted where `embeddings.` lives) in `layout`.
    pub fn load(vb: &VarBuilder<B>, config: &VitConfig, layout: &VitLayout) -> Result<Self> {
        let c = config;
        let bias = ProjectionBias::qkv(c.qkv_bias);
        let layer = PreLnConfig {
            hidden: c.hidden_size,
            heads: c.num_attention_heads,
            intermediate: c.intermediate_size,
            act: c.hidden_act,
            eps: c.layer_norm_eps,
            bias,
        };
        let pooler = if vb.contains("pooler.dense.weight") {
            let out = c.pooler_output_size.unwrap_or(c.hidden_size);
            Some((
                Linear::load(&vb.pp("pooler.dense"), c.hidden_size, out, true)?,
                c.pooler_act,
            ))
        } else {
            None
        };
        Ok(VitModel {
            embeddings: load_embeddings(&vb.pp("embeddings"), c)?,
            encoder: PreLnEncoder::load(
                &vb.pp(layout.layers),
                c.num_hidden_layers,
                &layer,
                &layout.names,
            )?,
            layernorm: LayerNorm::load(&vb.pp("layernorm"), c.hidden_size, c.layer_norm_eps)?,
            pooler,
            config: c.clone(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &VitConfig {
        &self.config
    }

    /// Whether the checkpoint has a pooler.
    pub fn has_pooler(&self) -> bool {
        self.pooler.is_some()
    }

    /// Runs the encoder on `[batch, channels, height, width]` pixel values; images of another
    /// size than the configured one get bicubically interpolated position embeddings (HF's
    /// `interpolate_pos_encoding=True`).
    pub fn forward(&self, pixel_values: Tensor<B, 4>) -> Result<VitOutput<B>> {
        let x = self.embeddings.forward(pixel_values)?;
        let x = self.layernorm.forward(self.encoder.forward(x, None));
        let pooler_output = self
            .pooler
            .as_ref()
            .map(|(dense, act)| act.forward(dense.forward(cls(&x))));
        Ok(VitOutput {
            last_hidden_state: x,
            pooler_output,
        })
    }
}

/// The first token of every row: `[batch, seq, hidden]` → `[batch, hidden]`.
fn cls<B: Backend>(x: &Tensor<B, 3>) -> Tensor<B, 2> {
    let [b, _, h] = x.dims();
    x.clone().narrow(1, 0, 1).reshape([b, h])
}

/// A ViT checkpoint with whichever head its config names.
pub struct Vit<B: Backend> {
    /// The encoder.
    pub model: VitModel<B>,
    head: VitHead,
    classifier: Option<Linear<B>>,
}

impl<B: Backend> Vit<B> {
    /// Loads encoder and head from a weight source.
    pub fn load(
        source: Arc<dyn TensorSource>,
        config: &VitConfig,
        device: &B::Device,
    ) -> Result<Self> {
        let layout = VitLayout::detect(source.as_ref());
        let root = VarBuilder::<B>::new(source, device);
        let model = VitModel::load(&root.pp(layout.prefix), config, &layout)?;
        let head = config.head();
        let classifier = match head {
            VitHead::ImageClassification if config.num_labels() > 0 => Some(Linear::load(
                &root.pp("classifier"),
                config.hidden_size,
                config.num_labels(),
                true,
            )?),
            _ => None,
        };
        Ok(Vit {
            model,
            head,
            classifier,
        })
    }

    /// The head.
    pub fn head(&self) -> VitHead {
        self.head
    }

    /// The configuration.
    pub fn config(&self) -> &VitConfig {
        self.model.config()
    }

    /// `ViTForImageClassification` logits `[batch, labels]` from the encoder output (the
    /// final-normed CLS token through the classifier; the CLS token itself when the config has
    /// no labels). An error for a bare `ViTModel`.
    pub fn logits(&self, out: &VitOutput<B>) -> Result<Tensor<B, 2>> {
        if self.head != VitHead::ImageClassification {
            return Err(Error::InvalidInput(
                "this checkpoint is a bare ViTModel: it has no classification head".into(),
            ));
        }
        let first = cls(&out.last_hidden_state);
        Ok(match &self.classifier {
            Some(c) => c.forward(first),
            None => first,
        })
    }
}
