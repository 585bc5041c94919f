//! `DetrForObjectDetection`: ResNet backbone → 1x1 input projection → transformer encoder over the
//! flattened feature map (2-D position embeddings added to queries and keys) → decoder over learned
//! object queries → class logits and sigmoid boxes.

use ipfs_accelerate_nn::ActivationForward;
use std::sync::Arc;

use burn::tensor::{activation, backend::Backend, Tensor, TensorData};
use ipfs_accelerate_core::{Error, Result, TensorSource};
use ipfs_accelerate_nn::{
    attention::{
        padding_bias, AttentionConfig, MultiHeadAttention, ProjectionBias, ProjectionNames,
    },
    conv::{Conv2d, ConvParams},
    Activation, LayerNorm, Linear, VarBuilder,
};

use crate::backbone::ResNetBackbone;
use crate::config::{DetrConfig, LAYER_NORM_EPS};
use crate::position::{downsample_mask, sine_position_embedding};

/// Attention with DETR's projection names: `q_proj`, `k_proj`, `v_proj` and `out_proj` as
/// checkpoints store them (`o_proj` in transformers 5's module layout).
fn load_attention<B: Backend>(
    vb: &VarBuilder<B>,
    hidden: usize,
    heads: usize,
) -> Result<MultiHeadAttention<B>> {
    let names = if vb.contains("o_proj.weight") {
        ProjectionNames::O_PROJ
    } else {
        ProjectionNames::OUT_PROJ
    };
    let config = AttentionConfig::new(hidden, heads, ProjectionBias::ALL);
    MultiHeadAttention::load(vb, config, names)
}

/// `DetrMLP`: fc1 → activation → fc2 (stored as `fc1` / `fc2`, or `mlp.fc1` / `mlp.fc2`).
struct FeedForward<B: Backend> {
    fc1: Linear<B>,
    fc2: Linear<B>,
    act: Activation,
}

impl<B: Backend> FeedForward<B> {
    fn load(layer: &VarBuilder<B>, d: usize, ffn: usize, act: Activation) -> Result<Self> {
        let vb = if layer.contains("mlp.fc1.weight") {
            layer.pp("mlp")
        } else {
            layer.clone()
        };
        Ok(FeedForward {
            fc1: Linear::load(&vb.pp("fc1"), d, ffn, true)?,
            fc2: Linear::load(&vb.pp("fc2"), ffn, d, true)?,
            act,
        })
    }

    fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        self.fc2.forward(self.act.forward(self.fc1.forward(x)))
    }
}

/// `DetrEncoderLayer` (post-norm).
struct EncoderLayer<B: Backend> {
    self_attn: MultiHeadAttention<B>,
    self_attn_norm: LayerNorm<B>,
    ffn: FeedForward<B>,
    final_norm: LayerNorm<B>,
}

impl<B: Backend> EncoderLayer<B> {
    fn load(vb: &VarBuilder<B>, c: &DetrConfig) -> Result<Self> {
        let d = c.d_model;
        Ok(EncoderLayer {
            self_attn: load_attention(&vb.pp("self_attn"), d, c.encoder_attention_heads)?,
            self_attn_norm: LayerNorm::load(&vb.pp("self_attn_layer_norm"), d, LAYER_NORM_EPS)?,
            ffn: FeedForward::load(vb, d, c.encoder_ffn_dim, c.activation_function)?,
            final_norm: LayerNorm::load(&vb.pp("final_layer_norm"), d, LAYER_NORM_EPS)?,
        })
    }

    fn forward(
        &self,
        x: Tensor<B, 3>,
        pos: &Tensor<B, 3>,
        bias: Option<&Tensor<B, 4>>,
    ) -> Tensor<B, 3> {
        let qk = x.clone() + pos.clone();
        let attn = self.self_attn.forward_qkv(qk.clone(), qk, x.clone(), bias);
        let x = self.self_attn_norm.forward(x + attn);
        self.final_norm.forward(x.clone() + self.ffn.forward(x))
    }
}

/// `DetrDecoderLayer` (post-norm): self-attention over the queries, cross-attention to the
/// encoder output, feed-forward.
struct DecoderLayer<B: Backend> {
    self_attn: MultiHeadAttention<B>,
    self_attn_norm: LayerNorm<B>,
    cross_attn: MultiHeadAttention<B>,
    cross_attn_norm: LayerNorm<B>,
    ffn: FeedForward<B>,
    final_norm: LayerNorm<B>,
}

impl<B: Backend> DecoderLayer<B> {
    fn load(vb: &VarBuilder<B>, c: &DetrConfig) -> Result<Self> {
        let d = c.d_model;
        let heads = c.decoder_attention_heads;
        Ok(DecoderLayer {
            self_attn: load_attention(&vb.pp("self_attn"), d, heads)?,
            self_attn_norm: LayerNorm::load(&vb.pp("self_attn_layer_norm"), d, LAYER_NORM_EPS)?,
            cross_attn: load_attention(&vb.pp("encoder_attn"), d, heads)?,
            cross_attn_norm: LayerNorm::load(&vb.pp("encoder_attn_layer_norm"), d, LAYER_NORM_EPS)?,
            ffn: FeedForward::load(vb, d, c.decoder_ffn_dim, c.activation_function)?,
            final_norm: LayerNorm::load(&vb.pp("final_layer_norm"), d, LAYER_NORM_EPS)?,
        })
    }

    fn forward(
        &self,
        x: Tensor<B, 3>,
        query_pos: &Tensor<B, 3>,
        memory: &Tensor<B, 3>,
        memory_keys: &Tensor<B, 3>,
        cross_bias: Option<&Tensor<B, 4>>,
    ) -> Tensor<B, 3> {
        let qk = x.clone() + query_pos.clone();
        let attn = self.self_attn.forward_qkv(qk.clone(), qk, x.clone(), None);
        let x = self.self_attn_norm.forward(x + attn);
        let q = x.clone() + query_pos.clone();
        let attn = self
            .cross_attn
            .forward_qkv(q, memory_keys.clone(), memory.clone(), cross_bias);
        let x = self.cross_attn_norm.forward(x + attn);
        self.final_norm.forward(x.clone() + self.ffn.forward(x))
    }
}

/// DETR's 2-D position embeddings of the feature map.
enum PositionEmbedding<B: Backend> {
    /// `DetrSinePositionEmbedding(d_model / 2, normalize=True)`, computed from the mask.
    Sine,
    /// `DetrLearnedPositionEmbedding`: row and column tables of 50 entries.
    Learned {
        rows: Tensor<B, 2>,
        cols: Tensor<B, 2>,
    },
}

/// The outputs of [`Detr::forward`].
#[derive(Debug, Clone)]
pub struct DetrOutput<B: Backend> {
    /// Class logits `[batch, queries, num_labels + 1]` (the last class is "no object").
    pub logits: Tensor<B, 3>,
    /// Boxes `[batch, queries, 4]` as (center x, center y, width, height), relative to the image.
    pub pred_boxes: Tensor<B, 3>,
    /// Decoder output `[batch, queries, d_model]`.
    pub last_hidden_state: Tensor<B, 3>,
}

/// `DetrForObjectDetection` with an HF ResNet backbone.
pub struct Detr<B: Backend> {
    backbone: ResNetBackbone<B>,
    input_projection: Conv2d<B>,
    position: PositionEmbedding<B>,
    query_position: Tensor<B, 2>,
    encoder: Vec<EncoderLayer<B>>,
    decoder: Vec<DecoderLayer<B>>,
    decoder_norm: LayerNorm<B>,
    class_head: Linear<B>,
    bbox_head: [Linear<B>; 3],
    config: DetrConfig,
    device: B::Device,
}

/// The prefix of DetrForObjectDetection's tensors: empty, or `detr` when the detection model is
/// stored inside a `DetrForSegmentation` checkpoint.
fn root_prefix(source: &dyn TensorSource) -> &'static str {
    if source.contains("detr.class_labels_classifier.weight") {
        "detr"
    } else {
        ""
    }
}

impl<B: Backend> Detr<B> {
    /// Loads the checkpoint's tensors (HF names: the legacy `model.backbone.conv_encoder.model.*`,
    /// `out_proj`, `fc1` layout that `save_pretrained` writes, or transformers 5's module layout).
    pub fn load(
        source: Arc<dyn TensorSource>,
        config: &DetrConfig,
        device: &B::Device,
    ) -> Result<Self> {
        let root = VarBuilder::<B>::new(source.clone(), device).pp(root_prefix(source.as_ref()));
        let m = root.pp("model");
        let bb = config.backbone()?;
        let bb_vb =
            if m.contains("backbone.conv_encoder.model.embedder.embedder.convolution.weight") {
                m.pp("backbone.conv_encoder.model")
            } else {
                m.pp("backbone.model")
            };
        let backbone = ResNetBackbone::load(&bb_vb, bb)?;
        let d = config.d_model;
        let input_projection = Conv2d::load(
            &m.pp("input_projection"),
            backbone.out_channels(),
            d,
            [1, 1],
            ConvParams::default(),
        )?;
        let position = match config.position_embedding_type.as_str() {
            "learned" => {
                let table = |name: &str| {
                    m.tensor_first_of(
                        &[
                            &format!("position_embedding.{name}.weight"),
                            &format!("backbone.position_embedding.{name}.weight"),
                        ],
                        [50, d / 2],
                    )
                };
                PositionEmbedding::Learned {
                    rows: table("row_embeddings")?,
                    cols: table("column_embeddings")?,
                }
            }
            _ => PositionEmbedding::Sine,
        };
        let query_position =
            m.tensor("query_position_embeddings.weight", [config.num_queries, d])?;
        let encoder = (0..config.encoder_layers)
            .map(|i| EncoderLayer::load(&m.pp(format!("encoder.layers.{i}")), config))
            .collect::<Result<Vec<_>>>()?;
        let decoder = (0..config.decoder_layers)
            .map(|i| DecoderLayer::load(&m.pp(format!("decoder.layers.{i}")), config))
            .collect::<Result<Vec<_>>>()?;
        let decoder_norm = LayerNorm::load(&m.pp("decoder.layernorm"), d, LAYER_NORM_EPS)?;
        let class_head = Linear::load(
            &root.pp("class_labels_classifier"),
            d,
            config.num_labels() + 1,
            true,
        )?;
        let bbox = root.pp("bbox_predictor.layers");
        let bbox_head = [
            Linear::load(&bbox.pp("0"), d, d, true)?,
            Linear::load(&bbox.pp("1"), d, d, true)?,
            Linear::load(&bbox.pp("2"), d, 4, true)?,
        ];
        Ok(Detr {
            backbone,
            input_projection,
            position,
            query_position,
            encoder,
            decoder,
            decoder_norm,
            class_head,
            bbox_head,
            config: config.clone(),
            device: device.clone(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &DetrConfig {
        &self.config
    }

    /// The device the weights live on.
    pub fn device(&self) -> &B::Device {
        &self.device
    }

    /// Input channels the backbone expects.
    pub fn in_channels(&self) -> usize {
        self.backbone.in_channels()
    }

    /// Runs the model on `pixel_values` `[batch, channels, height, width]` with `pixel_mask`
    /// (row-major `[batch, height, width]` on the host, non-zero for real pixels and 0 for
    /// padding; `None` means no padding).
    pub fn forward(
        &self,
        pixel_values: Tensor<B, 4>,
        pixel_mask: Option<&[i64]>,
    ) -> Result<DetrOutput<B>> {
        let [batch, _, height, width] = pixel_values.dims();
        if let Some(mask) = pixel_mask {
            if mask.len() != batch * height * width {
                return Err(Error::InvalidInput(format!(
                    "pixel_mask holds {} values, pixel_values needs [{batch}, {height}, {width}]",
                    mask.len()
                )));
            }
        }
        let features = self.backbone.forward(pixel_values)?;
        let [_, _, fh, fw] = features.dims();
        let seq = fh * fw;
        let mask = match pixel_mask {
            Some(m) => downsample_mask(m, batch, [height, width], [fh, fw]),
            None => vec![1; batch * seq],
        };
        let d = self.config.d_model;
        let x: Tensor<B, 3> = self
            .input_projection
            .forward(features)
            .reshape([batch, d, seq])
            .swap_dims(1, 2);
        let pos = self.position_embeddings(&mask, batch, [fh, fw])?;
        let padded = mask.contains(&0);
        let enc_bias = padded.then(|| {
            let heads = self.config.encoder_attention_heads;
            padding_bias::<B>(&mask, batch, seq, heads, seq, false, &self.device)
        });
        let memory = self
            .encoder
            .iter()
            .fold(x, |h, layer| layer.forward(h, &pos, enc_bias.as_ref()));

        let queries = self.config.num_queries;
        let query_pos: Tensor<B, 3> = self
            .query_position
            .clone()
            .unsqueeze_dim::<3>(0)
            .expand([batch, queries, d]);
        let cross_bias = padded.then(|| {
            let heads = self.config.decoder_attention_heads;
            padding_bias::<B>(&mask, batch, seq, heads, queries, false, &self.device)
        });
        let memory_keys = memory.clone() + pos;
        let h = Tensor::<B, 3>::zeros([batch, queries, d], &self.device);
        let h = self.decoder.iter().fold(h, |h, layer| {
            layer.forward(h, &query_pos, &memory, &memory_keys, cross_bias.as_ref())
        });
        let h = self.decoder_norm.forward(h);

        let logits = self.class_head.forward(h.clone());
        let [l0, l1, l2] = &self.bbox_head;
        let b = activation::relu(l0.forward(h.clone()));
        let b = activation::relu(l1.forward(b));
        let pred_boxes = activation::sigmoid(l2.forward(b));
        Ok(DetrOutput {
            logits,
            pred_boxes,
            last_hidden_state: h,
        })
    }

    /// Position embeddings `[batch, h * w, d_model]` of a `[h, w]` feature map with `mask`
    /// `[batch, h * w]`.
    fn position_embeddings(
        &self,
        mask: &[i64],
        batch: usize,
        [h, w]: [usize; 2],
    ) -> Result<Tensor<B, 3>> {
        let d = self.config.d_model;
        match &self.position {
            PositionEmbedding::Sine => {
                let values = sine_position_embedding(mask, batch, [h, w], d / 2);
                Ok(Tensor::from_data(
                    TensorData::new(values, [batch, h * w, d]),
                    &self.device,
                ))
            }
            PositionEmbedding::Learned { rows, cols } => {
                let max = rows.dims()[0];
                if h > max || w > max {
                    return Err(Error::InvalidInput(format!(
                        "feature map {h}x{w} is larger than the {max} learned positions per axis"
                    )));
                }
                let f = d / 2;
                let x_emb = cols
                    .clone()
                    .narrow(0, 0, w)
                    .unsqueeze_dim::<3>(0)
                    .expand([h, w, f]);
                let y_emb = rows
                    .clone()
                    .narrow(0, 0, h)
                    .unsqueeze_dim::<3>(1)
                    .expand([h, w, f]);
                let pos: Tensor<B, 3> = Tensor::cat(vec![x_emb, y_emb], 2).reshape([1, h * w, d]);
                Ok(pos.expand([batch, h * w, d]))
            }
        }
    }
}
