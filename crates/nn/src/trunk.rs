//! The burn executor of a family's trunk description ([`EncoderSpec`]): the same description
//! the GPU engine and the f64 reference run, held with burn modules ([`Linear`], [`LayerNorm`],
//! [`Embedding`]) in place of host values and read through [`VarBuilder`] (so quantization,
//! ggml tables and shared tensors load as for any burn module). A family writes its trunk once,
//! generic over [`WeightReader`]; [`Trunk`] runs it on any burn backend.
//!
//! It runs token inputs (BERT and the RoBERTa family; CLIP's causal text tower) and image
//! patches (ViT, CLIP's vision tower) through post-norm or pre-norm layers, the final norm, the
//! pooler, the task heads ([`head_logits`]) and, for the families to apply, projections
//! ([`project`]); the other inputs of
//! [`EncoderInput`] are run by the families' own burn modules for now, and [`Trunk::new`] says
//! so for a description it cannot run.

use burn::tensor::{backend::Backend, Int, Tensor};
use ipfs_accelerate_core::{
    EncoderHead, EncoderInput, EncoderLayerWeights, EncoderProjection, EncoderSpec, Error,
    NormPlacement, Result,
};

use crate::attention::{merge_heads, padding_bias, sdpa, split_heads};
use crate::convert::int_tensor;
use crate::spec::WeightReader;
use crate::vision::{interpolate_positions, patch_rows};
use crate::ActivationForward;
use crate::{Embedding, LayerNorm, Linear, VarBuilder};

/// A trunk description held as burn modules.
pub type BurnEncoderSpec<B> = EncoderSpec<Linear<B>, LayerNorm<B>, Embedding<B>>;

impl<B: Backend> WeightReader for VarBuilder<B> {
    type Dense = Linear<B>;
    type Norm = LayerNorm<B>;
    type Table = Embedding<B>;

    fn under(&self, name: &str) -> Self {
        self.pp(name)
    }

    fn holds(&self, name: &str) -> bool {
        self.contains(name)
    }

    fn linear(&self, name: &str, out: usize, inp: usize, bias: bool) -> Result<Linear<B>> {
        Linear::load(&self.pp(name), inp, out, bias)
    }

    fn layer_norm(&self, name: &str, h: usize, eps: f64) -> Result<LayerNorm<B>> {
        LayerNorm::load(&self.pp(name), h, eps)
    }

    /// A 2-D `….weight` is an embedding table ([`Embedding::load`]: ggml blocks where the
    /// source keeps them); any other tensor is read as f32 rows.
    fn table(&self, name: &str, shape: &[usize]) -> Result<Embedding<B>> {
        if let (Some(module), [rows, cols]) = (name.strip_suffix(".weight"), shape) {
            return Embedding::load(&self.pp(module), *rows, *cols);
        }
        let cols = shape.last().copied().unwrap_or(1);
        let rows = shape[..shape.len().saturating_sub(1)].iter().product();
        let rows_of = |t: Tensor<B, 2>| Embedding::from_table(t);
        Ok(match *shape {
            [n] => rows_of(self.tensor::<1>(name, [n])?.reshape([1, n])),
            [a, b] => rows_of(self.tensor::<2>(name, [a, b])?),
            [a, b, c] => rows_of(self.tensor::<3>(name, [a, b, c])?.reshape([rows, cols])),
            _ => {
                return Err(Error::InvalidInput(format!(
                    "`{}`: a table of rank {} (1 to 3 are read)",
                    self.path(name),
                    shape.len()
                )))
            }
        })
    }

    /// Kept float, as the convolution it is.
    fn flattened(&self, name: &str, out: usize, taps: &[usize], bias: bool) -> Result<Linear<B>> {
        let vb = self.pp(name);
        let inp: usize = taps.iter().product();
        let weight: Tensor<B, 2> = match *taps {
            [a] => vb.tensor::<2>("weight", [out, a])?,
            [a, b] => vb.tensor::<3>("weight", [out, a, b])?.reshape([out, inp]),
            [a, b, c] => vb
                .tensor::<4>("weight", [out, a, b, c])?
                .reshape([out, inp]),
            _ => {
                return Err(Error::InvalidInput(format!(
                    "`{}`: a weight of {} taps dimensions (1 to 3 are read)",
                    vb.path("weight"),
                    taps.len()
                )))
            }
        };
        let bias = if bias {
            Some(vb.tensor("bias", [out])?)
        } else {
            None
        };
        Ok(Linear::from_tensors(weight, bias))
    }
}

/// What [`Trunk`] returns.
#[derive(Debug, Clone)]
pub struct TrunkOutput<B: Backend> {
    /// `[batch, seq, hidden]`, after the final norm where the description has one.
    pub last_hidden_state: Tensor<B, 3>,
    /// `[batch, width]`: `activation(pooler(first token))`, when the description has a pooler.
    pub pooler_output: Option<Tensor<B, 2>>,
}

/// The logits a task head ([`EncoderHead`]) produces.
#[derive(Debug, Clone)]
pub enum HeadLogits<B: Backend> {
    /// `[batch, labels]`.
    Sequence(Tensor<B, 2>),
    /// `[batch, seq, labels]`.
    Token(Tensor<B, 3>),
    /// `[batch, seq]` each.
    Span {
        /// Start logits.
        start: Tensor<B, 2>,
        /// End logits.
        end: Tensor<B, 2>,
    },
}

/// A trunk description run on a burn backend.
#[derive(Debug, Clone)]
pub struct Trunk<B: Backend> {
    spec: BurnEncoderSpec<B>,
    device: B::Device,
}

impl<B: Backend> Trunk<B> {
    /// The executor of `spec` on `device`. A description whose input or layers this executor
    /// does not run (frames, waveforms, cross-frame messages) is an [`Error::InvalidInput`]
    /// naming the piece.
    pub fn new(spec: BurnEncoderSpec<B>, device: &B::Device) -> Result<Self> {
        let refuse = |what: &str| {
            Err(Error::InvalidInput(format!(
                "the burn trunk executor does not run {what} ({} encoder)",
                spec.family
            )))
        };
        if spec.heads == 0 || !spec.hidden.is_multiple_of(spec.heads) {
            return Err(Error::InvalidInput(format!(
                "{} encoder: hidden size {} is not divisible by {} heads",
                spec.family, spec.hidden, spec.heads
            )));
        }
        if !matches!(
            spec.input,
            EncoderInput::Tokens(_) | EncoderInput::Patches(_)
        ) {
            return refuse("inputs other than tokens and image patches");
        }
        if spec.frames_per_input().is_some() {
            return refuse("cross-frame messages");
        }
        Ok(Trunk {
            spec,
            device: device.clone(),
        })
    }

    /// The description.
    pub fn spec(&self) -> &BurnEncoderSpec<B> {
        &self.spec
    }

    /// The word table, for token inputs.
    pub fn word_table(&self) -> Option<&Embedding<B>> {
        match &self.spec.input {
            EncoderInput::Tokens(t) => Some(&t.word),
            _ => None,
        }
    }

    /// The token-type table, for token inputs with token types.
    pub fn token_type_table(&self) -> Option<&Embedding<B>> {
        match &self.spec.input {
            EncoderInput::Tokens(t) => t.token_type.as_ref(),
            _ => None,
        }
    }

    /// Token inputs `[batch, seq]` through the trunk: `word + token_type + position` (segment 0
    /// where `token_type_ids` is `None`), the
    /// embedding norm, the layers (a padding mask from `attention_mask`, row-major on the host,
    /// 1 = token; causal where the description says so), the final norm and the pooler. The
    /// caller has checked the ids against the tables.
    pub fn forward_tokens(
        &self,
        input_ids: Tensor<B, 2, Int>,
        attention_mask: &[i64],
        token_type_ids: Option<Tensor<B, 2, Int>>,
        position_ids: Tensor<B, 2, Int>,
    ) -> Result<TrunkOutput<B>> {
        let EncoderInput::Tokens(t) = &self.spec.input else {
            return Err(Error::InvalidInput(format!(
                "{} encoder: token ids given to an encoder of other inputs",
                self.spec.family
            )));
        };
        let [batch, seq] = input_ids.dims();
        let mut x = t.word.forward(input_ids);
        if let Some(types) = &t.token_type {
            let ids = token_type_ids.unwrap_or_else(|| Tensor::zeros([batch, seq], &self.device));
            x = x + types.forward(ids);
        }
        let mut x = x + t.position.forward(position_ids);
        if let Some(norm) = &self.spec.embedding_norm {
            x = norm.forward(x);
        }
        // No padding (one text, or texts of equal length) and no causal mask: nothing to add.
        let bias = (attention_mask.contains(&0) || self.spec.causal).then(|| {
            padding_bias::<B>(
                attention_mask,
                batch,
                seq,
                self.spec.heads,
                seq,
                self.spec.causal,
                &self.device,
            )
        });
        Ok(self.finish(self.layers(x, bias.as_ref())))
    }

    /// Images `[batch, channels, height, width]` through the trunk: patches projected, the class
    /// token in front, position embeddings added (bicubically interpolated for images of
    /// another size than the description's, HF's `interpolate_pos_encoding=True`), the
    /// embedding norm, the layers, the final norm and the pooler.
    pub fn forward_patches(&self, pixel_values: Tensor<B, 4>) -> Result<TrunkOutput<B>> {
        let x = self.embed_patches(pixel_values)?;
        Ok(self.finish(self.layers(x, None)))
    }

    /// The class token, projected patches and positions of images, after the embedding norm.
    fn embed_patches(&self, pixel_values: Tensor<B, 4>) -> Result<Tensor<B, 3>> {
        let EncoderInput::Patches(p) = &self.spec.input else {
            return Err(Error::InvalidInput(format!(
                "{} encoder: pixel values given to an encoder of other inputs",
                self.spec.family
            )));
        };
        let [batch, _, height, width] = pixel_values.dims();
        let (rows, (gh, gw)) = patch_rows(pixel_values, p.channels, p.patch)?;
        let h = self.spec.hidden;
        let patches = p.projection.forward(rows).reshape([batch, gh * gw, h]);
        let class = p.class.weight().clone().reshape([1, 1, h]);
        let x = Tensor::cat(vec![class.expand([batch, 1, h]), patches], 1);
        let positions = p.position.weight().clone();
        let positions = if (height, width) == p.image {
            positions
        } else {
            interpolate_positions(positions, gh, gw)?
        };
        let x = x + positions.unsqueeze::<3>();
        Ok(match &self.spec.embedding_norm {
            Some(norm) => norm.forward(x),
            None => x,
        })
    }

    /// HF's `hidden_states[layers]` of images: the embeddings (after the embedding norm)
    /// through the first `layers` layers, no final norm (LLaVA reads a tower's layer −2).
    pub fn patches_hidden_state(
        &self,
        pixel_values: Tensor<B, 4>,
        layers: usize,
    ) -> Result<Tensor<B, 3>> {
        if layers > self.spec.layers.len() {
            return Err(Error::InvalidInput(format!(
                "hidden state {layers} requested from a {}-layer {} encoder",
                self.spec.layers.len(),
                self.spec.family
            )));
        }
        let x = self.embed_patches(pixel_values)?;
        Ok(self.layers_upto(x, None, layers))
    }

    /// `x` `[batch, seq, hidden]` through every layer.
    fn layers(&self, x: Tensor<B, 3>, bias: Option<&Tensor<B, 4>>) -> Tensor<B, 3> {
        self.layers_upto(x, bias, self.spec.layers.len())
    }

    /// `x` through the first `n` layers.
    fn layers_upto(
        &self,
        mut x: Tensor<B, 3>,
        bias: Option<&Tensor<B, 4>>,
        n: usize,
    ) -> Tensor<B, 3> {
        for layer in self.spec.layers.iter().take(n) {
            x = match self.spec.norm {
                NormPlacement::Post => self.post_norm_layer(layer, x, bias),
                NormPlacement::Pre => self.pre_norm_layer(layer, x, bias),
            };
        }
        x
    }

    /// `softmax(q kᵀ / √d + bias) v` of `x`'s projections, heads merged, before the output
    /// projection.
    fn attention(
        &self,
        l: &EncoderLayerWeights<Linear<B>, LayerNorm<B>>,
        x: Tensor<B, 3>,
        bias: Option<&Tensor<B, 4>>,
    ) -> Tensor<B, 3> {
        let heads = self.spec.heads;
        let q = split_heads(l.query.forward(x.clone()), heads);
        let k = split_heads(l.key.forward(x.clone()), heads);
        let v = split_heads(l.value.forward(x), heads);
        merge_heads(sdpa(q, k, v, bias, None))
    }

    /// `x = norm(x + attention(x))`, then `norm(x + mlp(x))` (BERT).
    fn post_norm_layer(
        &self,
        l: &EncoderLayerWeights<Linear<B>, LayerNorm<B>>,
        x: Tensor<B, 3>,
        bias: Option<&Tensor<B, 4>>,
    ) -> Tensor<B, 3> {
        let ctx = self.attention(l, x.clone(), bias);
        let x = l
            .attention_norm
            .forward(l.attention_output.forward_add(ctx, x));
        let inner = l.intermediate.forward_act(x.clone(), self.spec.activation);
        l.output_norm.forward(l.output.forward_add(inner, x))
    }

    /// `x = x + attention(norm(x))`, then `x + mlp(norm(x))` (ViT, CLIP).
    fn pre_norm_layer(
        &self,
        l: &EncoderLayerWeights<Linear<B>, LayerNorm<B>>,
        x: Tensor<B, 3>,
        bias: Option<&Tensor<B, 4>>,
    ) -> Tensor<B, 3> {
        let ctx = self.attention(l, l.attention_norm.forward(x.clone()), bias);
        let x = l.attention_output.forward_add(ctx, x);
        let inner = l
            .intermediate
            .forward_act(l.output_norm.forward(x.clone()), self.spec.activation);
        l.output.forward_add(inner, x)
    }

    /// The final norm and the pooler over the last layer's output.
    fn finish(&self, x: Tensor<B, 3>) -> TrunkOutput<B> {
        let x = match &self.spec.final_norm {
            Some(norm) => norm.forward(x),
            None => x,
        };
        let pooler_output = self
            .spec
            .pooler
            .as_ref()
            .map(|p| p.activation.forward(p.dense.forward(first_token(&x))));
        TrunkOutput {
            last_hidden_state: x,
            pooler_output,
        }
    }
}

/// Row `positions[b]` of each `[batch, seq, hidden]` row of `x`: `[batch, hidden]`. A position
/// past the sequence, or a count other than the batch, is an error.
pub fn gather_tokens<B: Backend>(x: &Tensor<B, 3>, positions: &[usize]) -> Result<Tensor<B, 2>> {
    let [batch, seq, hidden] = x.dims();
    if positions.len() != batch || positions.iter().any(|&p| p >= seq) {
        return Err(Error::InvalidInput(format!(
            "token positions {positions:?} for {batch} rows of {seq} tokens"
        )));
    }
    let rows: Vec<i64> = positions
        .iter()
        .enumerate()
        .map(|(r, &p)| (r * seq + p) as i64)
        .collect();
    let device = x.device();
    Ok(x.clone()
        .reshape([batch * seq, hidden])
        .select(0, int_tensor::<B, 1>(rows, [batch], &device)))
}

/// `p` over one token per row `[rows, hidden]`: its norm, its hidden layer and activation,
/// then its dense layer (CLIP's `post_layernorm` and `visual_projection`).
pub fn project<B: Backend>(
    p: &EncoderProjection<Linear<B>, LayerNorm<B>>,
    token: Tensor<B, 2>,
) -> Tensor<B, 2> {
    let x = match &p.norm {
        Some(norm) => norm.forward(token),
        None => token,
    };
    let x = match &p.hidden {
        Some(l) => l.dense.forward_act(x, l.activation),
        None => x,
    };
    p.dense.forward(x)
}

/// `x[:, 0]` of `[batch, seq, hidden]`: each row's first (class) token.
pub fn first_token<B: Backend>(x: &Tensor<B, 3>) -> Tensor<B, 2> {
    let [batch, _, hidden] = x.dims();
    x.clone().narrow(1, 0, 1).reshape([batch, hidden])
}

/// `head` over a trunk's outputs; `None` for a pooled head without a pooler output.
pub fn head_logits<B: Backend>(
    head: &EncoderHead<Linear<B>>,
    out: &TrunkOutput<B>,
) -> Option<HeadLogits<B>> {
    let h = || out.last_hidden_state.clone();
    Some(match head {
        EncoderHead::FirstToken(d) => HeadLogits::Sequence(d.forward(first_token(&h()))),
        EncoderHead::Pooled(d) => HeadLogits::Sequence(d.forward(out.pooler_output.clone()?)),
        EncoderHead::EveryToken(d) => HeadLogits::Token(d.forward(h())),
        EncoderHead::Span(d) => {
            let logits = d.forward(h());
            let [b, s, _] = logits.dims();
            let start = logits.clone().narrow(2, 0, 1).reshape([b, s]);
            let end = logits.narrow(2, 1, 1).reshape([b, s]);
            HeadLogits::Span { start, end }
        }
        EncoderHead::EveryTokenMlp {
            up,
            activation,
            down,
        } => HeadLogits::Token(down.forward(up.forward_act(h(), *activation))),
    })
}
