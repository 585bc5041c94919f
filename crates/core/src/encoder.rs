//! A backend-neutral description of a transformer encoder trunk as host weights in HF's layouts:
//! token embeddings (BERT) or patch embeddings with a class token (ViT), post-norm or pre-norm
//! layers, an optional final norm, pooler and task head. Model crates build it from their
//! checkpoints (`ipfs_accelerate_bert::encoder_spec`, `ipfs_accelerate_vit::encoder_spec`);
//! engines that do not run through burn (the cuBLAS encoder of the `cuda` feature) consume it, so
//! the weight-name table stays in the model crate and the math of the block is written once in
//! the engine.
//!
//! The types are generic over how a dense layer (`D`), a norm (`N`) and a table of rows (`T`)
//! are held. Their defaults are host values ([`DenseWeights`], [`NormWeights`], `Vec<f32>`),
//! what engines and the f64 reference read; the burn executor (`ipfs_accelerate_nn::trunk`)
//! holds the same description with burn modules in their place, so a family describes its
//! trunk once for both.

use crate::{Error, QuantizedBlocks, Result};

/// An activation function, as HF configs name it in `hidden_act` / `hidden_activation` (parsed
/// from those strings); `ipfs_accelerate_nn::Activation` is this type, with its burn forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(try_from = "String")]
pub enum EncoderActivation {
    /// Exact GELU (erf).
    Gelu,
    /// GELU with the tanh approximation.
    GeluTanh,
    /// `max(0, x)`.
    Relu,
    /// `x · sigmoid(1.702 x)` (CLIP's `quick_gelu`).
    QuickGelu,
    /// `min(max(0, x), 6)`.
    Relu6,
    /// `x · sigmoid(x)` (`silu`, `swish`).
    Silu,
    /// The logistic sigmoid.
    Sigmoid,
    /// The hyperbolic tangent.
    Tanh,
    /// `x · tanh(softplus(x))`.
    Mish,
    /// `x` (`linear`).
    Identity,
}

impl std::str::FromStr for EncoderActivation {
    type Err = Error;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        Ok(match s {
            "gelu" | "gelu_python" => EncoderActivation::Gelu,
            "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" | "gelu_accurate" => {
                EncoderActivation::GeluTanh
            }
            "quick_gelu" => EncoderActivation::QuickGelu,
            "relu" => EncoderActivation::Relu,
            "relu6" => EncoderActivation::Relu6,
            "silu" | "swish" => EncoderActivation::Silu,
            "sigmoid" => EncoderActivation::Sigmoid,
            "tanh" => EncoderActivation::Tanh,
            "mish" => EncoderActivation::Mish,
            "linear" => EncoderActivation::Identity,
            other => {
                return Err(Error::InvalidInput(format!(
                    "unsupported activation `{other}`"
                )))
            }
        })
    }
}

impl TryFrom<String> for EncoderActivation {
    type Error = String;

    fn try_from(s: String) -> std::result::Result<Self, Self::Error> {
        s.parse().map_err(|e: Error| e.to_string())
    }
}

impl EncoderActivation {
    /// The activation of `x`, in f64 (the reference's arithmetic).
    pub fn apply(self, x: f64) -> f64 {
        match self {
            EncoderActivation::Gelu => 0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2)),
            EncoderActivation::GeluTanh => {
                let c = (2.0 / std::f64::consts::PI).sqrt();
                0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
            }
            EncoderActivation::Relu => x.max(0.0),
            EncoderActivation::QuickGelu => x / (1.0 + (-1.702 * x).exp()),
            EncoderActivation::Relu6 => x.clamp(0.0, 6.0),
            EncoderActivation::Silu => x / (1.0 + (-x).exp()),
            EncoderActivation::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            EncoderActivation::Tanh => x.tanh(),
            EncoderActivation::Mish => x * x.exp().ln_1p().tanh(),
            EncoderActivation::Identity => x,
        }
    }
}

/// The error function (Abramowitz and Stegun 7.1.26 is too coarse for a reference: this is the
/// series / continued fraction of W. J. Cody's `erf`, to about 1e-15).
fn erf(x: f64) -> f64 {
    if x.abs() < 2.0 {
        // Taylor series: erf(x) = 2/√π Σ (-1)^n x^(2n+1) / (n! (2n+1)).
        let (mut term, mut sum, x2) = (x, x, x * x);
        for n in 1..60 {
            term *= -x2 / n as f64;
            sum += term / (2 * n + 1) as f64;
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    } else {
        // erfc(x) = exp(-x²)/(x√π) · continued fraction, for |x| ≥ 2.
        let a = x.abs();
        let mut f = 0.0;
        for n in (1..80).rev() {
            f = (n as f64 / 2.0) / (a + f);
        }
        let erfc = (-a * a).exp() / std::f64::consts::PI.sqrt() / (a + f);
        (1.0 - erfc).copysign(x)
    }
}

/// A dense layer in HF's layout: `weight` is `[out, in]` row-major, `bias` is `[out]`. A layer
/// whose file stores it in a ggml block format may keep those blocks instead (`blocks`, with
/// `weight` empty) for engines that compute on them.
#[derive(Debug, Clone)]
pub struct DenseWeights {
    /// Output features.
    pub out_features: usize,
    /// Input features.
    pub in_features: usize,
    /// `[out, in]` row-major; empty when `blocks` holds the weight.
    pub weight: Vec<f32>,
    /// `[out]`.
    pub bias: Vec<f32>,
    /// The weight `[out, in]` in a ggml block format, as the file stores it.
    pub blocks: Option<QuantizedBlocks>,
}

impl PartialEq for DenseWeights {
    fn eq(&self, other: &Self) -> bool {
        let blocks = |d: &DenseWeights| {
            d.blocks
                .as_ref()
                .map(|b| (b.ggml_type, b.shape, b.data.clone()))
        };
        self.out_features == other.out_features
            && self.in_features == other.in_features
            && self.weight == other.weight
            && self.bias == other.bias
            && blocks(self) == blocks(other)
    }
}

impl DenseWeights {
    /// A layer of f32 values: `weight` `[out, in]` row-major, `bias` `[out]`.
    pub fn new(out_features: usize, in_features: usize, weight: Vec<f32>, bias: Vec<f32>) -> Self {
        DenseWeights {
            out_features,
            in_features,
            weight,
            bias,
            blocks: None,
        }
    }

    /// Bytes the layer takes as stored: its blocks (or f32 weight) and its f32 bias.
    pub fn stored_bytes(&self) -> usize {
        4 * (self.weight.len() + self.bias.len()) + self.blocks.as_ref().map_or(0, |b| b.data.len())
    }

    /// Checks that the buffers hold `[out, in]` and `[out]`; `name` says which layer.
    pub fn check(&self, name: &str, out_features: usize, in_features: usize) -> Result<()> {
        let shape_err = |what: &str, expected: Vec<usize>, len: usize| Error::ShapeMismatch {
            name: format!("{name}.{what}"),
            expected,
            actual: vec![len],
        };
        if self.out_features != out_features || self.in_features != in_features {
            return Err(Error::ShapeMismatch {
                name: format!("{name}.weight"),
                expected: vec![out_features, in_features],
                actual: vec![self.out_features, self.in_features],
            });
        }
        if let Some(blocks) = &self.blocks {
            if blocks.shape != [out_features, in_features] || !self.weight.is_empty() {
                return Err(Error::ShapeMismatch {
                    name: format!("{name}.weight (ggml type {})", blocks.ggml_type),
                    expected: vec![out_features, in_features],
                    actual: blocks.shape.to_vec(),
                });
            }
        } else if self.weight.len() != out_features * in_features {
            return Err(shape_err(
                "weight",
                vec![out_features * in_features],
                self.weight.len(),
            ));
        }
        if self.bias.len() != out_features {
            return Err(shape_err("bias", vec![out_features], self.bias.len()));
        }
        Ok(())
    }
}

/// A layer norm's scale and shift.
#[derive(Debug, Clone, PartialEq)]
pub struct NormWeights {
    /// Scale, `[hidden]`.
    pub gamma: Vec<f32>,
    /// Shift, `[hidden]`.
    pub beta: Vec<f32>,
}

/// One encoder layer: self-attention and a feed-forward block, each with a residual connection
/// and a layer norm, placed as [`EncoderSpec::norm`] says.
#[derive(Debug, Clone, PartialEq)]
pub struct EncoderLayerWeights<D = DenseWeights, N = NormWeights> {
    /// Query projection.
    pub query: D,
    /// Key projection.
    pub key: D,
    /// Value projection.
    pub value: D,
    /// Attention output projection.
    pub attention_output: D,
    /// Post-norm: the norm after the attention residual. Pre-norm: the norm before attention
    /// (ViT's `layernorm_before`).
    pub attention_norm: N,
    /// Feed-forward up projection.
    pub intermediate: D,
    /// Feed-forward down projection.
    pub output: D,
    /// Post-norm: the norm after the feed-forward residual. Pre-norm: the norm before the
    /// feed-forward block (ViT's `layernorm_after`).
    pub output_norm: N,
    /// Cross-frame messages exchanged before the attention (X-CLIP's vision layers), in a
    /// pre-norm trunk whose every layer has them.
    pub messages: Option<FrameMessages<D, N>>,
}

/// X-CLIP's cross-frame communication in a pre-norm layer: the inputs of one call are frames,
/// `frames` consecutive ones a video. Each frame's first token becomes a message
/// `m = fc(x[0])`; the messages of one video attend to each other, `m += attention(norm(m))`
/// (bidirectional, the layer's head count); each frame's attention then runs over its tokens and
/// its message (one more key; the message's own output is dropped), and the feed-forward block
/// over its tokens alone.
#[derive(Debug, Clone, PartialEq)]
pub struct FrameMessages<D = DenseWeights, N = NormWeights> {
    /// Frames per video.
    pub frames: usize,
    /// `message_fc`.
    pub fc: D,
    /// `message_ln`.
    pub norm: N,
    /// `message_attn`'s query projection (the first third of `in_proj`).
    pub query: D,
    /// Its key projection.
    pub key: D,
    /// Its value projection.
    pub value: D,
    /// `message_attn.out_proj`.
    pub output: D,
}

/// A task head over the final hidden states: one dense layer, and what it reads.
#[derive(Debug, Clone, PartialEq)]
pub enum EncoderHead<D = DenseWeights> {
    /// `logits = dense(h[:, 0])`, `[batch, labels]` (ViT's `classifier`).
    FirstToken(D),
    /// `logits = dense(pooler_output)`, `[batch, labels]` (BERT's sequence classification;
    /// needs the pooler).
    Pooled(D),
    /// `logits = dense(h)` on every token, `[batch, seq, labels]` (token classification).
    EveryToken(D),
    /// `dense(h)` on every token with two outputs, split into `start_logits` and `end_logits`,
    /// `[batch, seq]` each (extractive question answering).
    Span(D),
    /// `logits = down(activation(up(h)))` on every token, `[batch, seq, out]` (LLaVA's
    /// multimodal projector over the vision tower's features).
    EveryTokenMlp {
        /// The first layer, `hidden → inner`.
        up: D,
        /// Between the two.
        activation: EncoderActivation,
        /// The second layer, `inner → out`.
        down: D,
    },
}

impl<D> EncoderHead<D> {
    /// The head's (last) dense layer, whose outputs are the head's.
    pub fn dense(&self) -> &D {
        match self {
            EncoderHead::FirstToken(d)
            | EncoderHead::Pooled(d)
            | EncoderHead::EveryToken(d)
            | EncoderHead::Span(d)
            | EncoderHead::EveryTokenMlp { down: d, .. } => d,
        }
    }
}

/// Where a layer's norms sit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormPlacement {
    /// `x = norm(x + block(x))` (BERT).
    Post,
    /// `x = x + block(norm(x))` (ViT, CLIP, Whisper's encoder).
    Pre,
}

/// Word + absolute position (+ token type) embeddings (BERT; CLIP's text tower has no token
/// types).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenEmbeddings<T = Vec<f32>> {
    /// Vocabulary size (rows of `word`).
    pub vocab: usize,
    /// Longest sequence (rows of `position`).
    pub max_positions: usize,
    /// Segment types (rows of `token_type`); 0 when the model has no token type embeddings
    /// (then every `token_type_ids` value must be 0).
    pub type_vocab: usize,
    /// `[vocab, hidden]`.
    pub word: T,
    /// `[max_positions, hidden]`.
    pub position: T,
    /// `[type_vocab, hidden]`; `None` when `type_vocab` is 0.
    pub token_type: Option<T>,
    /// RoBERTa-family numbering (RoBERTa, XLM-R, CamemBERT, CLAP's text tower): the positions of
    /// each row count its tokens that are not `padding_idx` from `padding_idx + 1`, and those
    /// tokens take `padding_idx` ([`roberta_position_ids`]). `None`: positions `0..seq` (BERT).
    pub padding_idx: Option<i64>,
}

impl<T> TokenEmbeddings<T> {
    /// The position ids of row-major `ids` `[rows, seq]` by this table's numbering, each checked
    /// to be a row of the table ([`token_position_ids`]).
    pub fn position_ids(&self, ids: &[i64], seq: usize) -> Result<Vec<i64>> {
        token_position_ids(self.max_positions, self.padding_idx, ids, seq)
    }
}

/// The position ids of row-major `ids` `[rows, seq]`: `0..seq` in each row, or RoBERTa's
/// numbering when `padding_idx` is given ([`roberta_position_ids`]). A row that needs a position
/// beyond the `max_positions` rows of the table is an [`Error::InvalidInput`] naming the limit.
pub fn token_position_ids(
    max_positions: usize,
    padding_idx: Option<i64>,
    ids: &[i64],
    seq: usize,
) -> Result<Vec<i64>> {
    let positions = match padding_idx {
        Some(pad) => roberta_position_ids(ids, seq, pad),
        None => (0..ids.len()).map(|m| (m % seq.max(1)) as i64).collect(),
    };
    let limit = max_positions as i64;
    if let Some(p) = positions.iter().find(|&&p| p < 0 || p >= limit) {
        let first = padding_idx.map_or(0, |pad| pad + 1);
        return Err(Error::InvalidInput(format!(
            "a row of {seq} tokens needs position {p}, beyond the model's {limit} \
             max_position_embeddings (positions start at {first}; truncate the text)"
        )));
    }
    Ok(positions)
}

/// RoBERTa's `create_position_ids_from_input_ids`: row-major `ids` `[batch, seq]` → positions
/// counting the tokens of each row that are not `padding_idx` from `padding_idx + 1`, padding
/// tokens keeping `padding_idx` (fairseq's `make_positions`).
pub fn roberta_position_ids(ids: &[i64], seq: usize, padding_idx: i64) -> Vec<i64> {
    let mut out = Vec::with_capacity(ids.len());
    for row in ids.chunks(seq.max(1)) {
        let mut count = 0;
        out.extend(row.iter().map(|&id| {
            if id == padding_idx {
                padding_idx
            } else {
                count += 1;
                count + padding_idx
            }
        }));
    }
    out
}

/// Non-overlapping square patches of an image projected to the hidden size (a convolution with
/// stride = kernel = `patch`, run as one matrix product), a class token in front, and learned
/// position embeddings (ViT).
#[derive(Debug, Clone, PartialEq)]
pub struct PatchEmbeddings<D = DenseWeights, T = Vec<f32>> {
    /// Input channels.
    pub channels: usize,
    /// Patch side in pixels.
    pub patch: usize,
    /// Image `(height, width)` the position embeddings were trained for; inputs must match it.
    pub image: (usize, usize),
    /// The projection as `[hidden, channels · patch · patch]` (the convolution's
    /// `[hidden, channels, patch, patch]` weight) and its bias.
    pub projection: D,
    /// `[hidden]`: the class token.
    pub class: T,
    /// `[1 + patches, hidden]`: position embeddings, the class token's first.
    pub position: T,
}

impl<D, T> PatchEmbeddings<D, T> {
    /// Patches per image: `(height / patch) · (width / patch)`.
    pub fn patches(&self) -> usize {
        let p = self.patch.max(1);
        (self.image.0 / p) * (self.image.1 / p)
    }

    /// Tokens per image: the class token and the patches.
    pub fn tokens(&self) -> usize {
        1 + self.patches()
    }
}

/// A 1-D convolution over frames: `conv` holds the `[out, in, kernel]` weight as
/// `[out, in · kernel]` rows (an im2col row's order) and its bias; zero `padding` on both sides.
#[derive(Debug, Clone, PartialEq)]
pub struct FrameConv<D = DenseWeights> {
    /// The weight as a dense layer and the bias.
    pub conv: D,
    /// Kernel width in frames.
    pub kernel: usize,
    /// Stride in frames.
    pub stride: usize,
    /// Zero frames added before the first and after the last.
    pub padding: usize,
}

impl FrameConv {
    /// Input channels: the weight's inputs per kernel tap.
    pub fn in_channels(&self) -> usize {
        self.conv.in_features / self.kernel.max(1)
    }
}

impl<D> FrameConv<D> {
    /// Output frames for `frames` input frames (0 when the input is shorter than the kernel).
    pub fn out_frames(&self, frames: usize) -> usize {
        conv_out_frames(frames, self.kernel, self.stride, self.padding)
    }
}

/// Output frames of a 1-D convolution of `kernel` taps at `stride` over `frames` frames with
/// `padding` zero frames on both sides (0 when the padded input is shorter than the kernel).
pub fn conv_out_frames(frames: usize, kernel: usize, stride: usize, padding: usize) -> usize {
    (frames + 2 * padding)
        .checked_sub(kernel)
        .map_or(0, |n| n / stride.max(1) + 1)
}

/// Feature frames (Whisper's log-mel `[batch, channels, frames]`) through a convolutional front
/// end: each convolution followed by `activation`, the last one's output read as `[tokens,
/// hidden]`, plus learned position embeddings.
#[derive(Debug, Clone, PartialEq)]
pub struct FrameEmbeddings<D = DenseWeights, T = Vec<f32>> {
    /// Feature channels (mel bins).
    pub channels: usize,
    /// Input frames; inputs must have exactly this many (HF pads log-mels to it).
    pub frames: usize,
    /// The convolutions, first to last.
    pub convs: Vec<FrameConv<D>>,
    /// The activation after each convolution.
    pub activation: EncoderActivation,
    /// `[tokens, hidden]`: position embeddings.
    pub position: T,
}

impl<D, T> FrameEmbeddings<D, T> {
    /// Tokens per input: the last convolution's output frames.
    pub fn tokens(&self) -> usize {
        self.convs.iter().fold(self.frames, |n, c| c.out_frames(n))
    }
}

/// How a [`WaveformEmbeddings`] convolution's output is normed (epsilon
/// [`WaveformEmbeddings::conv_eps`]).
#[derive(Debug, Clone, PartialEq)]
pub enum ConvNorm<N = NormWeights> {
    /// Each channel over the frames: a GroupNorm with one group per channel (Wav2Vec2's first
    /// convolution when `feat_extract_norm` is `group`).
    Channel(N),
    /// Each frame over the channels: a LayerNorm (every convolution when `feat_extract_norm` is
    /// `layer`).
    Frame(N),
}

impl<N> ConvNorm<N> {
    /// The norm's scale and shift.
    pub fn weights(&self) -> &N {
        match self {
            ConvNorm::Channel(n) | ConvNorm::Frame(n) => n,
        }
    }
}

/// A grouped convolution over the tokens whose output is added to them, as relative positions
/// (Wav2Vec2's `pos_conv_embed`): `kernel / 2` zero tokens on both sides, the last output
/// dropped when the kernel is even (so as many outputs as tokens), then the activation.
#[derive(Debug, Clone, PartialEq)]
pub struct PositionConv<D = DenseWeights> {
    /// The `[hidden, hidden / groups, kernel]` weight (weight norm already folded) as
    /// `[hidden, hidden / groups · kernel]` rows, channel-major then tap, and the bias.
    pub conv: D,
    /// Kernel width in tokens.
    pub kernel: usize,
    /// Channel groups: output channel `o` reads the inputs of its group only.
    pub groups: usize,
}

/// Raw audio (`input_values`, `[batch, samples]`) through strided convolutions (each normed as
/// [`ConvNorm`] says, then the activation), a LayerNorm and a projection to the hidden size,
/// plus a [`PositionConv`] of the projected tokens (Wav2Vec2's feature encoder and projection).
#[derive(Debug, Clone, PartialEq)]
pub struct WaveformEmbeddings<D = DenseWeights, N = NormWeights> {
    /// The convolutions, first (one input channel) to last, without padding.
    pub convs: Vec<FrameConv<D>>,
    /// The norm of each convolution's output, one entry per convolution.
    pub norms: Vec<Option<ConvNorm<N>>>,
    /// The convolution norms' epsilon.
    pub conv_eps: f32,
    /// The activation after each convolution and after the position convolution.
    pub activation: EncoderActivation,
    /// LayerNorm over the last convolution's channels (epsilon [`EncoderSpec::eps`]).
    pub projection_norm: N,
    /// `[hidden, channels]`: the feature projection.
    pub projection: D,
    /// The relative positions added to the projected tokens.
    pub position: PositionConv<D>,
}

impl<D, N> WaveformEmbeddings<D, N> {
    /// Tokens for `samples` samples (0 when the input is shorter than the convolutions' reach).
    pub fn tokens(&self, samples: usize) -> usize {
        self.convs.iter().fold(samples, |n, c| c.out_frames(n))
    }
}

impl WaveformEmbeddings {
    /// Channels of the last convolution's output.
    pub fn channels(&self) -> usize {
        self.convs.last().map_or(0, |c| c.conv.out_features)
    }
}

/// Rows embedded elsewhere (`inputs_embeds`, `[batch, tokens, hidden]`: X-CLIP's frame
/// embeddings entering its multi-frame integration transformer), plus learned position
/// embeddings.
#[derive(Debug, Clone, PartialEq)]
pub struct RowEmbeddings<T = Vec<f32>> {
    /// Rows per input; inputs must have exactly this many.
    pub tokens: usize,
    /// `[tokens, hidden]`: position embeddings.
    pub position: T,
}

/// What the encoder reads.
#[derive(Debug, Clone, PartialEq)]
pub enum EncoderInput<D = DenseWeights, N = NormWeights, T = Vec<f32>> {
    /// Token ids (`input_ids`, `token_type_ids`, `attention_mask`).
    Tokens(TokenEmbeddings<T>),
    /// Images (`pixel_values`, `[batch, channels, height, width]`).
    Patches(PatchEmbeddings<D, T>),
    /// Feature frames (`input_features`, `[batch, channels, frames]`).
    Frames(FrameEmbeddings<D, T>),
    /// Raw audio samples (`input_values`, `[batch, samples]`).
    Waveform(WaveformEmbeddings<D, N>),
    /// Embedded rows (`inputs_embeds`, `[batch, tokens, hidden]`).
    Rows(RowEmbeddings<T>),
}

/// A transformer encoder trunk: embeddings, an optional norm after them, post-norm or pre-norm
/// layers, an optional final norm, an optional `tanh(dense(h[:, 0]))` pooler and an optional task
/// head ([`EncoderHead`]).
#[derive(Debug, Clone, PartialEq)]
pub struct EncoderSpec<D = DenseWeights, N = NormWeights, T = Vec<f32>> {
    /// The family it came from (`bert`, `vit`), for runners and messages.
    pub family: String,
    /// Hidden size.
    pub hidden: usize,
    /// Attention heads.
    pub heads: usize,
    /// Feed-forward size.
    pub intermediate: usize,
    /// Layer norm epsilon.
    pub eps: f32,
    /// Feed-forward activation.
    pub activation: EncoderActivation,
    /// The embeddings.
    pub input: EncoderInput<D, N, T>,
    /// Norm after the embeddings (BERT's `embeddings.LayerNorm`).
    pub embedding_norm: Option<N>,
    /// Where each layer's norms sit.
    pub norm: NormPlacement,
    /// The layers, in order.
    pub layers: Vec<EncoderLayerWeights<D, N>>,
    /// Norm over the last layer's output (ViT's `layernorm`).
    pub final_norm: Option<N>,
    /// The pooler, when the checkpoint has one.
    pub pooler: Option<Pooler<D>>,
    /// The task head, when the checkpoint has one.
    pub head: Option<EncoderHead<D>>,
    /// Whether attention is causal on top of the padding mask: token `i` sees keys `0..=i`
    /// (CLIP's text tower).
    pub causal: bool,
    /// A projection of one token per row, when the checkpoint has one (CLIP's
    /// `text_projection` / `visual_projection`).
    pub projection: Option<EncoderProjection<D, N>>,
}

/// `activation(dense(h[:, 0]))`: a pooler over each row's first token (BERT's and ViT's
/// `pooler.dense`, tanh unless the config says otherwise; ViT's may be narrower or wider than
/// the hidden size).
#[derive(Debug, Clone, PartialEq)]
pub struct Pooler<D = DenseWeights> {
    /// `[width, hidden]` and its bias.
    pub dense: D,
    /// Applied to its outputs.
    pub activation: EncoderActivation,
}

impl<D> Pooler<D> {
    /// `tanh(dense(h[:, 0]))`, BERT's pooler.
    pub fn tanh(dense: D) -> Self {
        Pooler {
            dense,
            activation: EncoderActivation::Tanh,
        }
    }
}

/// Which token of each row a projection reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PooledToken {
    /// The first token (a class token).
    First,
    /// The pooler's output (`tanh(pooler(first token))`; CLAP's text tower projects it). The
    /// spec must have a pooler, and the projection no norm.
    Pooler,
    /// The first position holding this id, or position 0 when the row has none (CLIP's
    /// `(input_ids == eos_token_id).argmax(-1)`).
    FirstOf(i64),
    /// The first position of the row's largest id (CLIP's legacy `input_ids.argmax(-1)`, for
    /// checkpoints whose `eos_token_id` is 2).
    LargestId,
}

impl PooledToken {
    /// The position read in each row of `ids` (`[rows, seq]` row-major).
    pub fn positions(self, ids: &[i64], seq: usize) -> Vec<usize> {
        ids.chunks(seq.max(1))
            .map(|row| {
                let key = |id: i64| match self {
                    PooledToken::First | PooledToken::Pooler => 0,
                    PooledToken::FirstOf(eos) => (id == eos) as i64,
                    PooledToken::LargestId => id,
                };
                let best = row.iter().map(|&id| key(id)).max().unwrap_or(0);
                row.iter().position(|&id| key(id) == best).unwrap_or(0)
            })
            .collect()
    }
}

/// `dense(norm(h[b, token(b)]))`: one token per row projected, after an optional norm of that
/// token (CLIP: the text tower reads its final-normed end-of-text token; the vision tower applies
/// `post_layernorm` to the class token).
#[derive(Debug, Clone, PartialEq)]
pub struct EncoderProjection<D = DenseWeights, N = NormWeights> {
    /// The HF output name of the result (`text_embeds`, `image_embeds`).
    pub output: String,
    /// Which token it reads.
    pub token: PooledToken,
    /// The norm applied to that token first.
    pub norm: Option<N>,
    /// A dense layer and activation before `dense` (CLAP's `linear1` and ReLU); `None`: `dense`
    /// reads the token.
    pub hidden: Option<ProjectionLayer<D>>,
    /// The projection (zero bias where the checkpoint has none).
    pub dense: D,
}

/// One dense layer and its activation, inside a projection.
#[derive(Debug, Clone, PartialEq)]
pub struct ProjectionLayer<D = DenseWeights> {
    /// The layer.
    pub dense: D,
    /// Its activation.
    pub activation: EncoderActivation,
}

impl<D, N, T> EncoderSpec<D, N, T> {
    /// Frames per video when the layers exchange cross-frame messages ([`FrameMessages`]): the
    /// inputs of a call must then be whole videos.
    pub fn frames_per_input(&self) -> Option<usize> {
        self.layers
            .iter()
            .find_map(|l| l.messages.as_ref().map(|m| m.frames))
    }
}

impl EncoderSpec {
    /// Checks every size against the dimensions, naming the first buffer that does not fit.
    pub fn validate(&self) -> Result<()> {
        let (h, i) = (self.hidden, self.intermediate);
        let bad = |reason: String| {
            Err(Error::InvalidInput(format!(
                "{} encoder: {reason}",
                self.family
            )))
        };
        if h == 0 || self.heads == 0 || i == 0 {
            return bad("hidden, heads and intermediate must be positive".into());
        }
        if !h.is_multiple_of(self.heads) {
            return bad(format!(
                "hidden size {h} is not divisible by {} heads",
                self.heads
            ));
        }
        let check_norm = |name: String, n: &NormWeights| {
            if n.gamma.len() != h || n.beta.len() != h {
                return Err(Error::ShapeMismatch {
                    name,
                    expected: vec![h],
                    actual: vec![n.gamma.len(), n.beta.len()],
                });
            }
            Ok(())
        };
        let check_rows = |name: &str, v: &Vec<f32>, rows: usize| {
            if v.len() != rows * h {
                return Err(Error::ShapeMismatch {
                    name: format!("embeddings.{name}"),
                    expected: vec![rows, h],
                    actual: vec![v.len()],
                });
            }
            Ok(())
        };
        match &self.input {
            EncoderInput::Tokens(t) => {
                if t.vocab == 0 || t.max_positions == 0 {
                    return bad("vocabulary and positions must be positive".into());
                }
                check_rows("word_embeddings", &t.word, t.vocab)?;
                check_rows("position_embeddings", &t.position, t.max_positions)?;
                match &t.token_type {
                    Some(types) if t.type_vocab > 0 => {
                        check_rows("token_type_embeddings", types, t.type_vocab)?
                    }
                    None if t.type_vocab == 0 => {}
                    _ => {
                        return bad(format!(
                            "{} token types and {} table",
                            t.type_vocab,
                            if t.token_type.is_some() { "a" } else { "no" }
                        ))
                    }
                }
            }
            EncoderInput::Patches(p) => {
                let (ih, iw) = p.image;
                if p.channels == 0 || p.patch == 0 || ih == 0 || iw == 0 {
                    return bad("channels, patch and image sizes must be positive".into());
                }
                if !ih.is_multiple_of(p.patch) || !iw.is_multiple_of(p.patch) {
                    return bad(format!(
                        "image {ih}x{iw} is not a whole number of {} pixel patches",
                        p.patch
                    ));
                }
                p.projection.check(
                    "embeddings.patch_embeddings.projection",
                    h,
                    p.channels * p.patch * p.patch,
                )?;
                check_rows("cls_token", &p.class, 1)?;
                check_rows("position_embeddings", &p.position, p.tokens())?;
            }
            EncoderInput::Frames(f) => {
                if f.channels == 0 || f.frames == 0 || f.convs.is_empty() {
                    return bad("channels, frames and convolutions must be positive".into());
                }
                let mut channels = f.channels;
                let mut frames = f.frames;
                for (n, c) in f.convs.iter().enumerate() {
                    if c.kernel == 0 || c.stride == 0 {
                        return bad(format!("convolution {n} has a zero kernel or stride"));
                    }
                    let out = if n + 1 == f.convs.len() {
                        h
                    } else {
                        c.conv.out_features
                    };
                    c.conv
                        .check(&format!("conv{}", n + 1), out, channels * c.kernel)?;
                    frames = c.out_frames(frames);
                    if frames == 0 {
                        return bad(format!(
                            "{} frames leave nothing after convolution {n}",
                            f.frames
                        ));
                    }
                    channels = out;
                }
                check_rows("embed_positions", &f.position, frames)?;
            }
            EncoderInput::Waveform(w) => {
                if w.convs.is_empty() || w.norms.len() != w.convs.len() {
                    return bad(format!(
                        "{} convolutions with {} norms",
                        w.convs.len(),
                        w.norms.len()
                    ));
                }
                let mut channels = 1;
                for (n, (c, norm)) in w.convs.iter().zip(&w.norms).enumerate() {
                    if c.kernel == 0 || c.stride == 0 || c.padding != 0 {
                        return bad(format!(
                            "convolution {n} needs a positive kernel and stride and no padding"
                        ));
                    }
                    let out = c.conv.out_features;
                    let name = format!("feature_extractor.conv_layers.{n}");
                    c.conv
                        .check(&format!("{name}.conv"), out, channels * c.kernel)?;
                    if let Some(norm) = norm {
                        let g = norm.weights();
                        if g.gamma.len() != out || g.beta.len() != out {
                            return Err(Error::ShapeMismatch {
                                name: format!("{name}.layer_norm"),
                                expected: vec![out],
                                actual: vec![g.gamma.len(), g.beta.len()],
                            });
                        }
                    }
                    channels = out;
                }
                let n = &w.projection_norm;
                if n.gamma.len() != channels || n.beta.len() != channels {
                    return Err(Error::ShapeMismatch {
                        name: "feature_projection.layer_norm".into(),
                        expected: vec![channels],
                        actual: vec![n.gamma.len(), n.beta.len()],
                    });
                }
                w.projection
                    .check("feature_projection.projection", h, channels)?;
                let p = &w.position;
                if p.kernel == 0 || p.groups == 0 || !h.is_multiple_of(p.groups) {
                    return bad(format!(
                        "a position convolution of kernel {} in {} groups over {h} channels",
                        p.kernel, p.groups
                    ));
                }
                p.conv
                    .check("pos_conv_embed.conv", h, h / p.groups * p.kernel)?;
            }
            EncoderInput::Rows(r) => {
                if r.tokens == 0 {
                    return bad("rows per input must be positive".into());
                }
                check_rows("position_embedding", &r.position, r.tokens)?;
            }
        }
        if let Some(n) = &self.embedding_norm {
            check_norm("embeddings.LayerNorm".into(), n)?;
        }
        for (n, l) in self.layers.iter().enumerate() {
            let p = format!("layer.{n}");
            l.query.check(&format!("{p}.query"), h, h)?;
            l.key.check(&format!("{p}.key"), h, h)?;
            l.value.check(&format!("{p}.value"), h, h)?;
            l.attention_output
                .check(&format!("{p}.attention.output"), h, h)?;
            l.intermediate.check(&format!("{p}.intermediate"), i, h)?;
            l.output.check(&format!("{p}.output"), h, i)?;
            check_norm(format!("{p}.attention.LayerNorm"), &l.attention_norm)?;
            check_norm(format!("{p}.output.LayerNorm"), &l.output_norm)?;
            if let Some(m) = &l.messages {
                m.fc.check(&format!("{p}.message_fc"), h, h)?;
                check_norm(format!("{p}.message_ln"), &m.norm)?;
                for (name, d) in [
                    ("query", &m.query),
                    ("key", &m.key),
                    ("value", &m.value),
                    ("out_proj", &m.output),
                ] {
                    d.check(&format!("{p}.message_attn.{name}"), h, h)?;
                }
                if m.frames == 0 {
                    return bad(format!("{p}: messages among videos of 0 frames"));
                }
            }
        }
        if let Some(frames) = self.frames_per_input() {
            if self.norm != NormPlacement::Pre || self.causal {
                return bad("cross-frame messages need a bidirectional pre-norm trunk".into());
            }
            let all = self
                .layers
                .iter()
                .all(|l| l.messages.as_ref().is_some_and(|m| m.frames == frames));
            if !all {
                return bad(
                    "cross-frame messages must be in every layer, with one frame count".into(),
                );
            }
        }
        if let Some(n) = &self.final_norm {
            check_norm("layernorm".into(), n)?;
        }
        // The width of the pooled output, which a pooled head or projection reads.
        let pooled = self.pooler.as_ref().map_or(h, |p| p.dense.out_features);
        if let Some(p) = &self.pooler {
            if pooled == 0 {
                return bad("the pooler has no outputs".into());
            }
            p.dense.check("pooler.dense", pooled, h)?;
        }
        if let Some(p) = &self.projection {
            if p.dense.out_features == 0 {
                return bad("the projection has no outputs".into());
            }
            let read = if p.token == PooledToken::Pooler {
                pooled
            } else {
                h
            };
            let inner = match &p.hidden {
                Some(l) => {
                    if l.dense.out_features == 0 {
                        return bad("the projection's hidden layer has no outputs".into());
                    }
                    l.dense
                        .check(&format!("{}.hidden", p.output), l.dense.out_features, read)?;
                    l.dense.out_features
                }
                None => read,
            };
            p.dense.check(&p.output, p.dense.out_features, inner)?;
            if let Some(n) = &p.norm {
                check_norm(format!("{}.norm", p.output), n)?;
            }
            if p.token == PooledToken::Pooler && (self.pooler.is_none() || p.norm.is_some()) {
                return bad("a projection of the pooled output needs a pooler and no norm".into());
            }
        }
        if self.causal && !matches!(self.input, EncoderInput::Tokens(_)) {
            return bad("causal attention over image patches, feature frames or audio".into());
        }
        if let Some(head) = &self.head {
            let c = head.dense();
            if c.out_features == 0 {
                return bad("the classifier has no labels".into());
            }
            match head {
                EncoderHead::EveryTokenMlp { up, down, .. } => {
                    if up.out_features == 0 {
                        return bad("the head's first layer has no outputs".into());
                    }
                    up.check("head.up", up.out_features, h)?;
                    down.check("head.down", c.out_features, up.out_features)?;
                }
                EncoderHead::Pooled(_) if self.pooler.is_none() => {
                    return bad("a head over the pooled output needs a pooler".into());
                }
                EncoderHead::Pooled(_) => c.check("classifier", c.out_features, pooled)?,
                EncoderHead::Span(_) if c.out_features != 2 => {
                    return bad(format!(
                        "a span head has 2 outputs (start, end), not {}",
                        c.out_features
                    ));
                }
                _ => c.check("classifier", c.out_features, h)?,
            }
        }
        Ok(())
    }

    /// Size of one attention head.
    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads.max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dense(out: usize, inp: usize) -> DenseWeights {
        DenseWeights::new(out, inp, vec![0.0; out * inp], vec![0.0; out])
    }

    fn norm(h: usize) -> NormWeights {
        NormWeights {
            gamma: vec![1.0; h],
            beta: vec![0.0; h],
        }
    }

    fn spec(h: usize, i: usize) -> EncoderSpec {
        EncoderSpec {
            family: "bert".into(),
            hidden: h,
            heads: 2,
            intermediate: i,
            eps: 1e-12,
            activation: EncoderActivation::Gelu,
            input: EncoderInput::Tokens(TokenEmbeddings {
                vocab: 5,
                max_positions: 4,
                type_vocab: 2,
                word: vec![0.0; 5 * h],
                position: vec![0.0; 4 * h],
                token_type: Some(vec![0.0; 2 * h]),
                padding_idx: None,
            }),
            embedding_norm: Some(norm(h)),
            norm: NormPlacement::Post,
            layers: vec![EncoderLayerWeights {
                query: dense(h, h),
                key: dense(h, h),
                value: dense(h, h),
                attention_output: dense(h, h),
                attention_norm: norm(h),
                intermediate: dense(i, h),
                output: dense(h, i),
                output_norm: norm(h),
                messages: None,
            }],
            final_norm: None,
            pooler: Some(Pooler::tanh(dense(h, h))),
            head: None,
            causal: false,
            projection: None,
        }
    }

    /// Rows embedded elsewhere need a position row per token, and a reference input of
    /// exactly that many rows per input.
    #[test]
    fn row_inputs_are_checked() {
        let h = 8;
        let with = |tokens: usize, rows: usize| EncoderSpec {
            input: EncoderInput::Rows(RowEmbeddings {
                tokens,
                position: vec![0.5; rows * h],
            }),
            embedding_norm: None,
            pooler: None,
            ..spec(h, 16)
        };
        let good = with(3, 3);
        good.validate().unwrap();
        assert!(with(3, 2).validate().is_err());
        assert!(with(0, 0).validate().is_err());
        let values = vec![0.25f32; 2 * 3 * h];
        let out = good
            .reference_forward(&crate::ReferenceInput::Rows {
                batch: 2,
                values: &values,
            })
            .unwrap();
        assert_eq!(out.last_hidden_state.len(), 2 * 3 * h);
        let short = crate::ReferenceInput::Rows {
            batch: 2,
            values: &values[h..],
        };
        assert!(good.reference_forward(&short).is_err());
    }

    /// Whisper's front end on 5 channels × 12 frames: kernel 3, padding 1, strides 1 and 2 give
    /// 12 then 6 tokens; a wrong position table, a kernel longer than the input and causal
    /// attention are refused.
    #[test]
    fn frame_inputs_count_their_tokens_and_are_checked() {
        let h = 8;
        let conv = |inp: usize, stride: usize| FrameConv {
            conv: dense(h, inp * 3),
            kernel: 3,
            stride,
            padding: 1,
        };
        let frames = FrameEmbeddings {
            channels: 5,
            frames: 12,
            convs: vec![conv(5, 1), conv(h, 2)],
            activation: EncoderActivation::Gelu,
            position: vec![0.0; 6 * h],
        };
        assert_eq!(frames.convs[0].out_frames(12), 12);
        assert_eq!(frames.convs[1].out_frames(12), 6);
        assert_eq!(frames.tokens(), 6);
        let with = |f: FrameEmbeddings| EncoderSpec {
            input: EncoderInput::Frames(f),
            norm: NormPlacement::Pre,
            final_norm: Some(norm(h)),
            ..spec(h, 2 * h)
        };
        with(frames.clone()).validate().unwrap();
        let short = FrameEmbeddings {
            position: vec![0.0; 5 * h],
            ..frames.clone()
        };
        assert!(with(short).validate().is_err());
        let tiny = FrameConv {
            kernel: 9,
            padding: 0,
            conv: dense(h, 5 * 9),
            stride: 1,
        };
        assert_eq!(tiny.out_frames(4), 0);
        let none_left = FrameEmbeddings {
            frames: 4,
            convs: vec![tiny],
            ..frames.clone()
        };
        assert!(with(none_left).validate().is_err());
        let causal = EncoderSpec {
            causal: true,
            ..with(frames)
        };
        assert!(causal.validate().is_err());
    }

    /// Wav2Vec2's front end: kernels 10 and 3, strides 5 and 2 turn 400 samples into 79, then
    /// 39 tokens; a missing norm entry, padding, a norm of the wrong width and groups that do not
    /// divide the hidden size are refused.
    #[test]
    fn waveform_inputs_count_their_tokens_and_are_checked() {
        let (h, c) = (8, 6);
        let conv = |inp: usize, kernel: usize, stride: usize| FrameConv {
            conv: dense(c, inp * kernel),
            kernel,
            stride,
            padding: 0,
        };
        let norm_c = NormWeights {
            gamma: vec![1.0; c],
            beta: vec![0.0; c],
        };
        let wave = WaveformEmbeddings {
            convs: vec![conv(1, 10, 5), conv(c, 3, 2)],
            norms: vec![Some(ConvNorm::Channel(norm_c.clone())), None],
            conv_eps: 1e-5,
            activation: EncoderActivation::Gelu,
            projection_norm: norm_c.clone(),
            projection: dense(h, c),
            position: PositionConv {
                conv: dense(h, h / 2 * 4),
                kernel: 4,
                groups: 2,
            },
        };
        assert_eq!(wave.tokens(400), 39);
        assert_eq!(wave.tokens(9), 0);
        assert_eq!(wave.channels(), c);
        let with = |w: WaveformEmbeddings| EncoderSpec {
            input: EncoderInput::Waveform(w),
            ..spec(h, 2 * h)
        };
        with(wave.clone()).validate().unwrap();
        let mut bad = vec![
            WaveformEmbeddings {
                norms: vec![None],
                ..wave.clone()
            },
            WaveformEmbeddings {
                norms: vec![Some(ConvNorm::Frame(norm(h))), None],
                ..wave.clone()
            },
        ];
        let mut padded = wave.clone();
        padded.convs[0].padding = 1;
        bad.push(padded);
        let mut groups = wave.clone();
        groups.position.groups = 3;
        bad.push(groups);
        for w in bad {
            assert!(with(w.clone()).validate().is_err(), "{w:?}");
        }
    }

    /// A ViT-shaped spec: 3 channels, 4-pixel patches of an 8 × 12 image (6 patches).
    fn patch_spec(h: usize) -> EncoderSpec {
        EncoderSpec {
            family: "vit".into(),
            input: EncoderInput::Patches(PatchEmbeddings {
                channels: 3,
                patch: 4,
                image: (8, 12),
                projection: dense(h, 48),
                class: vec![0.0; h],
                position: vec![0.0; 7 * h],
            }),
            embedding_norm: None,
            norm: NormPlacement::Pre,
            final_norm: Some(norm(h)),
            head: Some(EncoderHead::FirstToken(dense(3, h))),
            ..spec(h, 2 * h)
        }
    }

    #[test]
    fn a_patch_spec_validates_and_counts_its_tokens() {
        let s = patch_spec(8);
        s.validate().unwrap();
        let EncoderInput::Patches(p) = &s.input else {
            unreachable!()
        };
        assert_eq!((p.patches(), p.tokens()), (6, 7));
    }

    #[test]
    fn misshaped_patch_embeddings_are_named() {
        let mut s = patch_spec(8);
        if let EncoderInput::Patches(p) = &mut s.input {
            p.position.truncate(6 * 8);
        }
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("embeddings.position_embeddings"), "{e}");
        let mut s = patch_spec(8);
        if let EncoderInput::Patches(p) = &mut s.input {
            p.image = (8, 10);
        }
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("whole number"), "{e}");
        let mut s = patch_spec(8);
        s.head = Some(EncoderHead::FirstToken(dense(3, 4)));
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("classifier"), "{e}");
    }

    #[test]
    fn heads_that_cannot_run_are_refused() {
        let mut s = spec(8, 16);
        s.head = Some(EncoderHead::Span(dense(3, 8)));
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("span head has 2 outputs"), "{e}");
        s.head = Some(EncoderHead::Pooled(dense(3, 8)));
        s.validate().unwrap();
        s.pooler = None;
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("needs a pooler"), "{e}");
        s.head = Some(EncoderHead::EveryToken(dense(5, 8)));
        s.validate().unwrap();
    }

    #[test]
    fn a_consistent_spec_validates() {
        spec(8, 16).validate().unwrap();
    }

    #[test]
    fn a_misshaped_layer_is_named() {
        let mut s = spec(8, 16);
        s.layers[0].intermediate = dense(16, 4);
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("layer.0.intermediate.weight"), "{e}");
        let mut s = spec(8, 16);
        s.layers[0].output_norm.beta.pop();
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("layer.0.output.LayerNorm"), "{e}");
    }

    #[test]
    fn heads_must_divide_hidden() {
        let mut s = spec(8, 16);
        s.heads = 3;
        assert!(s.validate().unwrap_err().to_string().contains("divisible"));
    }
}
