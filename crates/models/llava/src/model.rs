//! `LlavaForConditionalGeneration` and `LlavaNextForConditionalGeneration`: the CLIP vision tower
//! read at `vision_feature_layer`, the two-layer projector, LLaVA-NeXT's anyres packing, and the
//! image features spliced into the LLaMA decoder's input embeddings.

use ipfs_accelerate_nn::ActivationForward;
use std::sync::Arc;

use burn::tensor::{backend::Backend, Tensor};
use ipfs_accelerate_clip::ClipVisionTransformer;
use ipfs_accelerate_core::{Error, HostTensor, Result, TensorSource};
use ipfs_accelerate_llama::LlamaModel;
use ipfs_accelerate_nn::{
    convert::int_tensor, vision::pixel_values, Activation, Linear, VarBuilder,
};

use crate::anyres::AnyresLayout;
use crate::config::{LlavaConfig, LlavaVariant, SelectStrategy};
use crate::names::LlavaWeights;

/// Token ids `[batch, seq]` (row-major) with an optional attention mask of the same shape: the
/// text side of [`LlavaModel::embed`] and [`LlavaModel::forward`].
#[derive(Debug, Clone, Copy)]
pub struct PromptTokens<'a> {
    /// The ids, `batch · seq` of them.
    pub ids: &'a [i64],
    /// Rows.
    pub batch: usize,
    /// Tokens per row.
    pub seq: usize,
    /// 1 for real tokens, 0 for padding; `None` is all ones.
    pub mask: Option<&'a [i64]>,
}

/// `LlavaMultiModalProjector`: `linear_2(act(linear_1(x)))`.
struct Projector<B: Backend> {
    linear_1: Linear<B>,
    act: Activation,
    linear_2: Linear<B>,
}

impl<B: Backend> Projector<B> {
    fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        self.linear_2
            .forward(self.act.forward(self.linear_1.forward(x)))
    }
}

/// A loaded LLaVA-1.5 or LLaVA-NeXT model.
pub struct LlavaModel<B: Backend> {
    vision: ClipVisionTransformer<B>,
    projector: Projector<B>,
    text: LlamaModel<B>,
    image_newline: Option<Tensor<B, 1>>,
    config: LlavaConfig,
    device: B::Device,
}

impl<B: Backend> LlavaModel<B> {
    /// Loads the weights of a checkpoint in either HF layout (see [`LlavaWeights`]).
    pub fn load(
        source: Arc<dyn TensorSource>,
        config: &LlavaConfig,
        device: &B::Device,
    ) -> Result<Self> {
        let weights: Arc<dyn TensorSource> = Arc::new(LlavaWeights::wrap(source));
        let vb = VarBuilder::<B>::new(weights.clone(), device);
        let vision = ClipVisionTransformer::load(&vb.pp("vision_tower"), &config.vision_config)?;
        let text_hidden = config.text_config.hidden_size;
        let features_in = config.vision_config.hidden_size * config.feature_layers().len();
        let p = vb.pp("multi_modal_projector");
        let bias = config.multimodal_projector_bias;
        let projector = Projector {
            linear_1: Linear::load(&p.pp("linear_1"), features_in, text_hidden, bias)?,
            act: config.projector_hidden_act,
            linear_2: Linear::load(&p.pp("linear_2"), text_hidden, text_hidden, bias)?,
        };
        let image_newline = match config.variant {
            LlavaVariant::Llava => None,
            LlavaVariant::LlavaNext => Some(vb.tensor("image_newline", [text_hidden])?),
        };
        Ok(LlavaModel {
            vision,
            projector,
            text: LlamaModel::load(weights, &config.text_config, device)?,
            image_newline,
            config: config.clone(),
            device: device.clone(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &LlavaConfig {
        &self.config
    }

    /// The language model.
    pub fn text(&self) -> &LlamaModel<B> {
        &self.text
    }

    /// The vision tower.
    pub fn vision(&self) -> &ClipVisionTransformer<B> {
        &self.vision
    }

    /// Projected features `[views, tokens, text_hidden]` of `views` `[views, 3, size, size]`:
    /// the vision hidden state(s) of `vision_feature_layer` (concatenated along the features),
    /// the class token dropped with the `default` strategy, through the projector.
    pub fn view_features(&self, views: Tensor<B, 4>) -> Result<Tensor<B, 3>> {
        let size = self.config.vision_config.image_size;
        let [_, _, h, w] = views.dims();
        if (h, w) != (size, size) {
            return Err(Error::InvalidInput(format!(
                "pixel_values of {h}x{w} pixels; the vision tower takes {size}x{size} views"
            )));
        }
        let mut selected = Vec::new();
        for layers in self.config.feature_layers() {
            let hidden = self.vision.hidden_state(views.clone(), layers)?;
            let tokens = hidden.dims()[1];
            selected.push(match self.config.vision_feature_select_strategy {
                SelectStrategy::Default => hidden.narrow(1, 1, tokens - 1),
                SelectStrategy::Full => hidden,
            });
        }
        Ok(self.projector.forward(Tensor::cat(selected, 2)))
    }

    /// Features per image, `[count, text_hidden]` each, in the order they replace the image
    /// tokens. LLaVA: `pixel_values` `[images, 3, size, size]`. LLaVA-NeXT: `pixel_values`
    /// `[images, views, 3, size, size]` (views beyond an image's own count are padding) or the
    /// views of all images concatenated `[total, 3, size, size]`, and `image_sizes` `[images, 2]`
    /// (original height, width).
    pub fn image_features(
        &self,
        pixels: &HostTensor,
        image_sizes: Option<&HostTensor>,
    ) -> Result<Vec<Tensor<B, 2>>> {
        let channels = self.config.vision_config.num_channels;
        match self.config.variant {
            LlavaVariant::Llava => {
                let views = pixel_values::<B>(pixels, channels, &self.device)?;
                let features = self.view_features(views)?;
                let [n, tokens, d] = features.dims();
                Ok((0..n)
                    .map(|i| features.clone().narrow(0, i, 1).reshape([tokens, d]))
                    .collect())
            }
            LlavaVariant::LlavaNext => {
                let (views, layouts) = anyres_views(&self.config, pixels, image_sizes)?;
                let features =
                    self.view_features(pixel_values::<B>(&views, channels, &self.device)?)?;
                let mut offset = 0;
                let mut out = Vec::with_capacity(layouts.len());
                for layout in &layouts {
                    let n = layout.views();
                    out.push(self.pack(features.clone().narrow(0, offset, n), layout)?);
                    offset += n;
                }
                Ok(out)
            }
        }
    }

    /// HF's `pack_image_features` for one image: its views' features gathered by
    /// [`AnyresLayout::packed_rows`] (`image_newline` where it says so).
    fn pack(&self, features: Tensor<B, 3>, layout: &AnyresLayout) -> Result<Tensor<B, 2>> {
        let newline = self
            .image_newline
            .clone()
            .ok_or_else(|| Error::Compute("LLaVA-NeXT model without image_newline".into()))?;
        let [views, tokens, d] = features.dims();
        let g = layout.grid;
        if views != layout.views() || tokens != g * g {
            return Err(Error::Compute(format!(
                "{views} views of {tokens} features do not form a {}x{} tile grid of {g}x{g} \
                 patches plus a base view",
                layout.tiles_high, layout.tiles_wide
            )));
        }
        let rows = views * tokens;
        let index: Vec<i64> = layout
            .packed_rows(tokens)
            .into_iter()
            .map(|r| r.unwrap_or(rows) as i64)
            .collect();
        let n = index.len();
        let all = Tensor::cat(
            vec![features.reshape([rows, d]), newline.reshape([1, d])],
            0,
        );
        Ok(all.select(0, int_tensor::<B, 1>(index, [n], &self.device)))
    }

    /// The decoder's input embeddings `[batch, seq, hidden]` for `ids` `[batch, seq]`: token
    /// embeddings with the positions holding `image_token_id` replaced, in order, by the rows of
    /// `features` (HF's `masked_scatter`). Positions where `mask` is 0 (padding) are never
    /// replaced. The number of image tokens must equal the number of feature rows.
    pub fn embed(
        &self,
        tokens: PromptTokens<'_>,
        features: &[Tensor<B, 2>],
    ) -> Result<Tensor<B, 3>> {
        let (ids, batch, seq, mask) = (tokens.ids, tokens.batch, tokens.seq, tokens.mask);
        let embeds = self.text.embed_tokens(ids, batch, seq)?;
        if features.is_empty() {
            return Ok(embeds);
        }
        let count: usize = features.iter().map(|f| f.dims()[0]).sum();
        let slots = crate::spec::image_slots(&self.config, ids, mask, count)?;
        let d = self.config.text_config.hidden_size;
        let rows = batch * seq;
        let mut index: Vec<i64> = (0..rows as i64).collect();
        for (k, &slot) in slots.iter().enumerate() {
            index[slot] = (rows + k) as i64;
        }
        let mut all = vec![embeds.reshape([rows, d])];
        all.extend(features.iter().cloned());
        let index = int_tensor::<B, 1>(index, [rows], &self.device);
        Ok(Tensor::cat(all, 0)
            .select(0, index)
            .reshape([batch, seq, d]))
    }

    /// Logits `[batch, seq, vocab]` of `ids` `[batch, seq]` with the image features spliced in
    /// (HF's forward: positions `0..seq`, `mask` `[batch, seq]` defaulting to ones).
    pub fn forward(
        &self,
        tokens: PromptTokens<'_>,
        features: &[Tensor<B, 2>],
    ) -> Result<Tensor<B, 3>> {
        let (batch, seq) = (tokens.batch, tokens.seq);
        let embeds = self.embed(
            PromptTokens {
                mask: None,
                ..tokens
            },
            features,
        )?;
        let positions: Vec<i64> = (0..batch).flat_map(|_| 0..seq as i64).collect();
        let ones;
        let mask = match tokens.mask {
            Some(m) => m,
            None => {
                ones = vec![1i64; batch * seq];
                &ones
            }
        };
        let hidden = self
            .text
            .forward_hidden_embeds(embeds, &positions, mask, None)?;
        Ok(self.text.logits(hidden))
    }
}

/// `image_sizes` `[images, 2]` as positive `(height, width)` pairs.
pub fn read_image_sizes(t: &HostTensor) -> Result<Vec<(usize, usize)>> {
    let &[n, 2] = t.shape() else {
        return Err(Error::InvalidInput(format!(
            "image_sizes must be [images, 2] (height, width), got {:?}",
            t.shape()
        )));
    };
    let v = t.to_i64_vec()?;
    let sizes: Vec<(usize, usize)> = v
        .chunks(2)
        .filter(|p| p[0] > 0 && p[1] > 0)
        .map(|p| (p[0] as usize, p[1] as usize))
        .collect();
    if sizes.len() != n || n == 0 {
        return Err(Error::InvalidInput(format!(
            "image_sizes {v:?} must hold at least one positive (height, width) pair"
        )));
    }
    Ok(sizes)
}

/// The views LLaVA-NeXT encodes and each image's layout: the layouts of `image_sizes` (`[images,
/// 2]`, required), and the views as [`gather_views`] takes them from `pixels`.
pub(crate) fn anyres_views(
    config: &LlavaConfig,
    pixels: &HostTensor,
    image_sizes: Option<&HostTensor>,
) -> Result<(HostTensor, Vec<AnyresLayout>)> {
    let sizes = image_sizes.ok_or_else(|| {
        Error::InvalidInput("LLaVA-NeXT needs `image_sizes` with `pixel_values`".into())
    })?;
    let layouts = read_image_sizes(sizes)?
        .into_iter()
        .map(|s| AnyresLayout::new(config, s))
        .collect::<Result<Vec<_>>>()?;
    Ok((gather_views(pixels, &layouts)?, layouts))
}

/// The views LLaVA-NeXT encodes, `[total, channels, h, w]`: each image's first
/// [`AnyresLayout::views`] views of a stacked `[images, views, channels, h, w]` input, or an
/// already concatenated `[total, channels, h, w]` one (checked against the total).
fn gather_views(pixels: &HostTensor, layouts: &[AnyresLayout]) -> Result<HostTensor> {
    if !pixels.dtype().is_float() {
        return Err(Error::InvalidInput(format!(
            "pixel_values must be floats, got {}",
            pixels.dtype()
        )));
    }
    let needed: usize = layouts.iter().map(AnyresLayout::views).sum();
    match *pixels.shape() {
        [images, stacked, c, h, w] => {
            if images != layouts.len() {
                return Err(Error::InvalidInput(format!(
                    "pixel_values hold {images} images, image_sizes {}",
                    layouts.len()
                )));
            }
            if let Some(l) = layouts.iter().find(|l| l.views() > stacked) {
                return Err(Error::InvalidInput(format!(
                    "an image needs {} anyres views (grid {:?}), pixel_values hold {stacked} per \
                     image",
                    l.views(),
                    l.resolution
                )));
            }
            let view = c * h * w;
            let values = pixels.to_f32_vec();
            let mut out = Vec::with_capacity(needed * view);
            for (i, l) in layouts.iter().enumerate() {
                let start = i * stacked * view;
                out.extend_from_slice(&values[start..start + l.views() * view]);
            }
            HostTensor::from_f32(vec![needed, c, h, w], &out)
        }
        [total, ..] if pixels.shape().len() == 4 => {
            if total != needed {
                return Err(Error::InvalidInput(format!(
                    "pixel_values hold {total} views, the images' anyres grids need {needed}"
                )));
            }
            Ok(pixels.clone())
        }
        _ => Err(Error::InvalidInput(format!(
            "LLaVA-NeXT pixel_values must be [images, views, channels, height, width], got {:?}",
            pixels.shape()
        ))),
    }
}
