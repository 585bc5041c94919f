//! The ViT encoder and its image-classification head.

use std::sync::Arc;

use burn::tensor::{backend::Backend, Tensor};
use ipfs_accelerate_core::{EncoderHead, Error, Result, TensorSource};
use ipfs_accelerate_nn::{
    transformer::PreLnNames,
    trunk::{first_token, head_logits, HeadLogits, Trunk, TrunkOutput},
    Linear, VarBuilder,
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

/// Outputs of the bare encoder: `last_hidden_state` `[batch, 1 + patches, hidden]` after the
/// final layer norm and, when the checkpoint has a pooler, `pooler_output`
/// `[batch, pooler_output_size]` (act(dense(CLS))).
pub type VitOutput<B> = TrunkOutput<B>;

/// `ViTModel`: embeddings, pre-LN encoder, final layer norm and the optional pooler: ViT's
/// description ([`crate::encoder_spec::describe`]) run by the shared burn trunk executor.
pub struct VitModel<B: Backend> {
    trunk: Trunk<B>,
    config: VitConfig,
}

impl<B: Backend> VitModel<B> {
    /// Loads the encoder from `vb` (rooted where `embeddings.` lives) in `layout`.
    pub fn load(vb: &VarBuilder<B>, config: &VitConfig, layout: &VitLayout) -> Result<Self> {
        let spec = crate::encoder_spec::describe(vb, config, layout)?;
        Ok(VitModel {
            trunk: Trunk::new(spec, vb.device())?,
            config: config.clone(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &VitConfig {
        &self.config
    }

    /// Whether the checkpoint has a pooler.
    pub fn has_pooler(&self) -> bool {
        self.trunk.spec().pooler.is_some()
    }

    /// Runs the encoder on `[batch, channels, height, width]` pixel values; images of another
    /// size than the configured one get bicubically interpolated position embeddings (HF's
    /// `interpolate_pos_encoding=True`).
    pub fn forward(&self, pixel_values: Tensor<B, 4>) -> Result<VitOutput<B>> {
        self.trunk.forward_patches(pixel_values)
    }
}

/// A ViT checkpoint with whichever head its config names.
pub struct Vit<B: Backend> {
    /// The encoder.
    pub model: VitModel<B>,
    head: VitHead,
    classifier: Option<EncoderHead<Linear<B>>>,
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
        let classifier = crate::encoder_spec::describe_head(&root, config)?;
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
        Ok(match &self.classifier {
            Some(head) => match head_logits(head, out) {
                Some(HeadLogits::Sequence(l)) => l,
                _ => {
                    return Err(Error::InvalidInput(
                        "ViT's classifier gives one row of logits per image".into(),
                    ))
                }
            },
            None => first_token(&out.last_hidden_state),
        })
    }
}
