//! X-CLIP: the cross-frame vision tower, the multi-frame integration transformer, the
//! video-specific prompt generator and the video-text logits (HF's `XCLIPModel`).

use std::sync::Arc;

use burn::tensor::{backend::Backend, Tensor};
use ipfs_accelerate_clip::{l2_normalize, load_logit_scale, ClipTextInputs, ClipTextTransformer};
use ipfs_accelerate_core::{Error, Result, TensorSource};
use ipfs_accelerate_nn::{
    attention::{AttentionConfig, MultiHeadAttention, ProjectionBias, ProjectionNames},
    exact,
    transformer::Mlp,
    trunk::{first_token, project, Trunk},
    LayerNorm, Linear, VarBuilder,
};

use crate::XclipConfig;

/// Outputs of [`XclipVisionTransformer::forward`].
#[derive(Debug, Clone)]
pub struct XclipVisionOutput<B: Backend> {
    /// `[videos · frames, 1 + patches, hidden]` (no final norm, as HF).
    pub last_hidden_state: Tensor<B, 3>,
    /// `[videos · frames, projection_dim]`: each frame's class token through `post_layernorm`
    /// and `visual_projection`.
    pub frame_embeds: Tensor<B, 2>,
}

/// `XCLIPVisionTransformer` and `visual_projection`: CLIP vision embeddings per frame,
/// `pre_layernorm`, cross-frame encoder layers (each frame's class token becomes a message
/// token, the messages of one video attend to each other, every frame self-attends over its
/// tokens plus its message token, the MLP runs on its tokens only), `post_layernorm` and the
/// projection of the class tokens: X-CLIP's vision description ([`crate::describe_vision`]) run
/// by the shared burn trunk executor.
pub struct XclipVisionTransformer<B: Backend> {
    trunk: Trunk<B>,
    frames: usize,
}

impl<B: Backend> XclipVisionTransformer<B> {
    /// Loads the tower (HF's `vision_model`) and `visual_projection` under `root`, the
    /// checkpoint's root.
    pub fn load(root: &VarBuilder<B>, config: &XclipConfig) -> Result<Self> {
        Ok(XclipVisionTransformer {
            trunk: Trunk::new(crate::describe_vision(root, config)?, root.device())?,
            frames: config.vision_config.num_frames,
        })
    }

    /// Frames per video the tower was built for.
    pub fn frames(&self) -> usize {
        self.frames
    }

    /// `pixel_values` `[videos · frames, channels, height, width]` (frames of one video
    /// adjacent) through the tower. Images of another size than the configured one get
    /// bicubically interpolated position embeddings (HF's `interpolate_pos_encoding=True`).
    pub fn forward(&self, pixel_values: Tensor<B, 4>) -> Result<XclipVisionOutput<B>> {
        let out = self.trunk.forward_patches(pixel_values)?;
        let projection = self.trunk.spec().projection.as_ref().ok_or_else(|| {
            Error::InvalidInput("the X-CLIP vision description has no projection".into())
        })?;
        Ok(XclipVisionOutput {
            frame_embeds: project(projection, first_token(&out.last_hidden_state)),
            last_hidden_state: out.last_hidden_state,
        })
    }
}

/// `XCLIPMultiframeIntegrationTransformer`: learned frame positions, a CLIP encoder, a residual
/// around it and the mean over frames; its description ([`crate::describe_mit`]) run by the
/// shared burn trunk executor.
struct Mit<B: Backend> {
    trunk: Trunk<B>,
}

impl<B: Backend> Mit<B> {
    fn load(root: &VarBuilder<B>, config: &XclipConfig) -> Result<Self> {
        Ok(Mit {
            trunk: Trunk::new(crate::describe_mit(root, config)?, root.device())?,
        })
    }

    /// `[videos, frames, hidden]` → pooled `[videos, hidden]`.
    fn forward(&self, x: Tensor<B, 3>) -> Result<Tensor<B, 2>> {
        let y = self.trunk.forward_rows(x.clone())?.last_hidden_state + x;
        Ok(y.mean_dim(1).squeeze_dim(1))
    }
}

/// `PromptGeneratorLayer`: the text attends to the visual tokens, then an MLP, both pre-norm
/// with residuals.
struct PromptLayer<B: Backend> {
    cross_attn: MultiHeadAttention<B>,
    norm1: LayerNorm<B>,
    norm3: LayerNorm<B>,
    mlp: Mlp<B>,
}

impl<B: Backend> PromptLayer<B> {
    fn load(vb: &VarBuilder<B>, config: &XclipConfig) -> Result<Self> {
        let p = config.projection_dim;
        let eps = config.text_config.layer_norm_eps;
        let names = ProjectionNames {
            q: "q_proj",
            k: "k_proj",
            v: "v_proj",
            o: "proj",
        };
        let bias = ProjectionBias {
            o: true,
            ..ProjectionBias::NONE
        };
        Ok(PromptLayer {
            cross_attn: MultiHeadAttention::load(
                &vb.pp("cross_attn"),
                AttentionConfig::new(p, config.prompt_num_attention_heads, bias),
                names,
            )?,
            norm1: LayerNorm::load(&vb.pp("norm1"), p, eps)?,
            norm3: LayerNorm::load(&vb.pp("norm3"), p, eps)?,
            mlp: Mlp::load(
                &vb.pp("mlp"),
                ("0", "3"),
                p,
                4 * p,
                config.prompt_hidden_act,
            )?,
        })
    }

    fn forward(&self, text: Tensor<B, 3>, visual: Tensor<B, 3>) -> Tensor<B, 3> {
        let q = self.norm1.forward(text.clone());
        let text = text + self.cross_attn.forward_qkv(q, visual.clone(), visual, None);
        text.clone() + self.mlp.forward(self.norm3.forward(text))
    }
}

/// `XCLIPPromptGenerator` (the original `VideoSpecificPrompt`): `alpha · decoder(text, ln(visual))`.
struct PromptGenerator<B: Backend> {
    layernorm: LayerNorm<B>,
    layers: Vec<PromptLayer<B>>,
    alpha: Tensor<B, 1>,
}

impl<B: Backend> PromptGenerator<B> {
    fn load(vb: &VarBuilder<B>, config: &XclipConfig) -> Result<Self> {
        let p = config.projection_dim;
        let layers = (0..config.prompt_layers)
            .map(|i| PromptLayer::load(&vb.pp(format!("decoder.{i}")), config))
            .collect::<Result<Vec<_>>>()?;
        Ok(PromptGenerator {
            layernorm: LayerNorm::load(
                &vb.pp("layernorm"),
                p,
                config.vision_config.base.layer_norm_eps,
            )?,
            layers,
            alpha: vb.tensor("alpha", [p])?,
        })
    }

    /// `text` `[videos, texts, dim]`, `visual` `[videos, patches, dim]`.
    fn forward(&self, mut text: Tensor<B, 3>, visual: Tensor<B, 3>) -> Tensor<B, 3> {
        let visual = self.layernorm.forward(visual);
        for layer in &self.layers {
            text = layer.forward(text, visual.clone());
        }
        text * self.alpha.clone().unsqueeze::<3>()
    }
}

/// What the vision side gives the rest of the model.
#[derive(Debug, Clone)]
pub struct XclipVideoFeatures<B: Backend> {
    /// HF's `get_video_features`: the MIT's pooled output `[videos, projection_dim]`, not
    /// normalised.
    pub video_embeds: Tensor<B, 2>,
    /// The prompt generator's visual tokens `[videos, patches, projection_dim]`: the patch tokens
    /// of the vision tower's last hidden state through `prompts_visual_layernorm` and
    /// `prompts_visual_projection`, averaged over frames.
    pub img_features: Tensor<B, 3>,
}

/// Outputs of [`XclipModel::forward`], as HF's `XCLIPOutput`.
#[derive(Debug, Clone)]
pub struct XclipOutput<B: Backend> {
    /// `[videos, texts, projection_dim]`: every text with its video-specific prompt, normalised.
    pub text_embeds: Tensor<B, 3>,
    /// `[videos, projection_dim]`, normalised.
    pub video_embeds: Tensor<B, 2>,
    /// `[videos, texts]`: `exp(logit_scale) · video · text`.
    pub logits_per_video: Tensor<B, 2>,
    /// `[texts, videos]`, the transpose.
    pub logits_per_text: Tensor<B, 2>,
}

/// `XCLIPModel`: the CLIP text tower, the cross-frame vision tower, both projections, the MIT,
/// the prompt generator and the logit scale.
pub struct XclipModel<B: Backend> {
    /// The text tower (CLIP's, pooled at the largest token id).
    pub text: ClipTextTransformer<B>,
    /// The vision tower.
    pub vision: XclipVisionTransformer<B>,
    text_projection: Linear<B>,
    prompts_visual_layernorm: LayerNorm<B>,
    /// `[vision_hidden, projection_dim]`, applied as `x @ W` (an `nn.Parameter`, not a Linear).
    prompts_visual_projection: Tensor<B, 2>,
    mit: Mit<B>,
    prompts_generator: PromptGenerator<B>,
    logit_scale: f32,
    config: XclipConfig,
}

impl<B: Backend> XclipModel<B> {
    /// Loads an `XCLIPModel` checkpoint.
    pub fn load(
        source: Arc<dyn TensorSource>,
        config: &XclipConfig,
        device: &B::Device,
    ) -> Result<Self> {
        let logit_scale = load_logit_scale(source.as_ref())?;
        let vb = VarBuilder::<B>::new(source, device);
        let p = config.projection_dim;
        let (ht, hv) = (
            config.text_config.hidden_size,
            config.vision_config.base.hidden_size,
        );
        let eps = config.vision_config.base.layer_norm_eps;
        Ok(XclipModel {
            text: ClipTextTransformer::load(&vb.pp("text_model"), &config.clip_text_config())?,
            vision: XclipVisionTransformer::load(&vb, config)?,
            text_projection: Linear::load(&vb.pp("text_projection"), ht, p, false)?,
            prompts_visual_layernorm: LayerNorm::load(&vb.pp("prompts_visual_layernorm"), hv, eps)?,
            prompts_visual_projection: vb.tensor("prompts_visual_projection", [hv, p])?,
            mit: Mit::load(&vb, config)?,
            prompts_generator: PromptGenerator::load(&vb.pp("prompts_generator"), config)?,
            logit_scale,
            config: config.clone(),
        })
    }

    /// The parsed `config.json`.
    pub fn config(&self) -> &XclipConfig {
        &self.config
    }

    /// The logit temperature `exp(logit_scale)` read from the checkpoint.
    pub fn logit_temperature(&self) -> f32 {
        self.logit_scale.exp()
    }

    /// HF's `get_text_features`: projected pooled text `[texts, projection_dim]` (not
    /// normalised, no video prompt).
    pub fn text_features(&self, inputs: &ClipTextInputs) -> Result<Tensor<B, 2>> {
        let (_, pooled) = self.text.forward(inputs)?;
        Ok(self.text_projection.forward(pooled))
    }

    /// The vision side of `pixel_values` `[videos, frames, channels, height, width]`; `frames`
    /// must be the configured `num_frames` (the cross-frame attention and the MIT positions are
    /// built for it).
    pub fn video_features(&self, pixel_values: Tensor<B, 5>) -> Result<XclipVideoFeatures<B>> {
        let [b, t, c, h, w] = pixel_values.dims();
        let frames = self.vision.frames();
        if t != frames {
            return Err(Error::InvalidInput(format!(
                "videos of {t} frames given, the model takes exactly {frames} (num_frames)"
            )));
        }
        let out = self
            .vision
            .forward(pixel_values.reshape([b * t, c, h, w]))?;
        self.video_features_of(out.last_hidden_state, out.frame_embeds, b)
    }

    /// [`XclipModel::video_features`] from the vision tower's outputs computed elsewhere (an
    /// engine running [`crate::vision_encoder_spec`]): `last_hidden_state` `[videos · frames,
    /// 1 + patches, hidden]` and `frame_embeds` `[videos · frames, projection_dim]`, each
    /// frame's class token through `post_layernorm` and `visual_projection`.
    pub fn video_features_of(
        &self,
        last_hidden_state: Tensor<B, 3>,
        frame_embeds: Tensor<B, 2>,
        videos: usize,
    ) -> Result<XclipVideoFeatures<B>> {
        let (b, t) = (videos, self.vision.frames());
        let p = self.config.projection_dim;
        let [rows, n1, hv] = last_hidden_state.dims();
        if rows != b * t || frame_embeds.dims() != [b * t, p] || n1 < 2 {
            return Err(Error::InvalidInput(format!(
                "vision outputs [{rows}, {n1}, {hv}] and {:?} are not {b} videos of {t} frames",
                frame_embeds.dims()
            )));
        }
        let cls = frame_embeds.reshape([b, t, p]);
        let video_embeds = self.mit.forward(cls)?;
        let patches = last_hidden_state.narrow(1, 1, n1 - 1);
        let img: Tensor<B, 2> = self
            .prompts_visual_layernorm
            .forward(patches)
            .reshape([b * t * (n1 - 1), hv]);
        let img_features = exact::matmul(img, self.prompts_visual_projection.clone())
            .reshape([b, t, n1 - 1, p])
            .mean_dim(1)
            .squeeze_dim(1);
        Ok(XclipVideoFeatures {
            video_embeds,
            img_features,
        })
    }

    /// Every video against every text: video-specific text prompts, normalised embeddings and
    /// `logits_per_video` (HF's `XCLIPModel.forward`).
    pub fn forward(
        &self,
        inputs: &ClipTextInputs,
        pixel_values: Tensor<B, 5>,
    ) -> Result<XclipOutput<B>> {
        let video = self.video_features(pixel_values)?;
        self.forward_with(self.text_features(inputs)?, video)
    }

    /// [`XclipModel::forward`] of text features `[texts, projection_dim]`
    /// ([`XclipModel::text_features`]) and video features already computed.
    pub fn forward_with(
        &self,
        text: Tensor<B, 2>,
        video: XclipVideoFeatures<B>,
    ) -> Result<XclipOutput<B>> {
        let [b, _, p] = video.img_features.dims();
        if text.dims()[1] != p {
            return Err(Error::InvalidInput(format!(
                "text features of width {} against videos of {p}",
                text.dims()[1]
            )));
        }
        let k = text.dims()[0];
        let text = text.unsqueeze::<3>().expand([b, k, p]);
        let text = text.clone() + self.prompts_generator.forward(text, video.img_features);
        let text_embeds = l2_normalize(text.reshape([b * k, p])).reshape([b, k, p]);
        let video_embeds = l2_normalize(video.video_embeds);
        let logits_per_video =
            exact::matmul(text_embeds.clone(), video_embeds.clone().reshape([b, p, 1]))
                .reshape([b, k])
                .mul_scalar(self.logit_temperature());
        Ok(XclipOutput {
            logits_per_text: logits_per_video.clone().transpose(),
            logits_per_video,
            text_embeds,
            video_embeds,
        })
    }
}
