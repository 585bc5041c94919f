//! The burn executor of a family's trunk description ([`EncoderSpec`]): the same description
//! the GPU engine and the f64 reference run, held with burn modules ([`Linear`], [`LayerNorm`],
//! [`Embedding`]) in place of host values and read through [`VarBuilder`] (so quantization,
//! ggml tables and shared tensors load as for any burn module). A family writes its trunk once,
//! generic over [`WeightReader`]; [`Trunk`] runs it on any burn backend.
//!
//! It runs every input of [`EncoderInput`]: token ids (BERT and the RoBERTa family; CLIP's
//! causal text tower), image patches (ViT, CLIP's vision tower; X-CLIP's, whose layers exchange
//! cross-frame messages), feature frames through convolutions (Whisper's encoder) and raw audio
//! through a convolutional feature encoder and a positional convolution (Wav2Vec2), rows
//! embedded elsewhere (X-CLIP's multi-frame integration transformer), then
//! post-norm or pre-norm layers, the final norm, the pooler, the task heads ([`head_logits`])
//! and, for the families to apply, projections ([`project`]). A convolution is held as the
//! description holds it, a dense layer over its flattened taps, and run as burn's convolution.

use burn::tensor::{backend::Backend, ops::ConvOptions, Int, Tensor, TensorData};
use ipfs_accelerate_core::{
    ConvNorm, EncoderHead, EncoderInput, EncoderLayerWeights, EncoderProjection, EncoderSpec,
    Error, FrameConv, FrameMessages, NormPlacement, Result,
};

use crate::attention::{merge_heads, padding_bias, sdpa, split_heads};
use crate::conv::load_weight_normed;
use crate::convert::int_tensor;
use crate::spec::WeightReader;
use crate::vision::{interpolate_positions, patch_rows};
use crate::ActivationForward;
use crate::{Activation, Embedding, LayerNorm, Linear, VarBuilder};

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
        Ok(Linear::from_tensors(weight, optional_bias(&vb, out, bias)?))
    }

    /// Kept float, as the convolution it is.
    fn weight_normed_conv(
        &self,
        name: &str,
        out: usize,
        [inp, kernel]: [usize; 2],
        dim: usize,
        bias: bool,
    ) -> Result<Linear<B>> {
        let vb = self.pp(name);
        let weight = load_weight_normed(&vb, [out, inp, kernel], dim)?.reshape([out, inp * kernel]);
        Ok(Linear::from_tensors(weight, optional_bias(&vb, out, bias)?))
    }
}

/// `bias` `[out]` under `vb` where `bias` is true.
fn optional_bias<B: Backend>(
    vb: &VarBuilder<B>,
    out: usize,
    bias: bool,
) -> Result<Option<Tensor<B, 1>>> {
    bias.then(|| vb.tensor("bias", [out])).transpose()
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
    /// The executor of `spec` on `device`. A description it cannot run (heads that do not
    /// divide the hidden size, a convolution whose taps are not whole kernels, cross-frame
    /// messages in only some layers, or outside a pre-norm trunk of image patches) is an
    /// [`Error::InvalidInput`] naming the piece.
    pub fn new(spec: BurnEncoderSpec<B>, device: &B::Device) -> Result<Self> {
        let bad = |what: String| {
            Err(Error::InvalidInput(format!(
                "{} encoder: {what}",
                spec.family
            )))
        };
        if spec.heads == 0 || !spec.hidden.is_multiple_of(spec.heads) {
            return bad(format!(
                "hidden size {} is not divisible by {} heads",
                spec.hidden, spec.heads
            ));
        }
        let convs: &[FrameConv<Linear<B>>] = match &spec.input {
            EncoderInput::Frames(f) => &f.convs,
            EncoderInput::Waveform(w) => &w.convs,
            _ => &[],
        };
        for c in convs {
            let taps = c.conv.weight().in_dim();
            if c.kernel == 0 || c.stride == 0 || !taps.is_multiple_of(c.kernel) {
                return bad(format!(
                    "a convolution of {taps} taps, kernel {} and stride {}",
                    c.kernel, c.stride
                ));
            }
        }
        if let EncoderInput::Waveform(w) = &spec.input {
            let p = &w.position;
            let (out, taps) = (p.conv.out_dim(), p.conv.weight().in_dim());
            if p.kernel == 0 || p.groups == 0 || !out.is_multiple_of(p.groups) {
                return bad(format!(
                    "a positional convolution of {out} channels in {} groups, kernel {}",
                    p.groups, p.kernel
                ));
            }
            if taps != out / p.groups * p.kernel || w.norms.len() != w.convs.len() {
                return bad(format!(
                    "a positional convolution of {taps} taps, or {} norms for {} convolutions",
                    w.norms.len(),
                    w.convs.len()
                ));
            }
        }
        if let Some(frames) = spec.frames_per_input() {
            let everywhere = spec.layers.iter().all(|l| l.messages.is_some());
            let patches = matches!(spec.input, EncoderInput::Patches(_));
            if frames == 0 || !everywhere || !patches || spec.norm != NormPlacement::Pre {
                return bad(format!(
                    "cross-frame messages of {frames} frames must be in every pre-norm layer of \
                     an image trunk"
                ));
            }
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
            return Err(self.other_inputs("token ids"));
        };
        let [batch, seq] = input_ids.dims();
        let mut x = t.word.forward(input_ids);
        if let Some(types) = &t.token_type {
            let ids = token_type_ids.unwrap_or_else(|| Tensor::zeros([batch, seq], &self.device));
            x = x + types.forward(ids);
        }
        let x = self.embedding_normed(x + t.position.forward(position_ids));
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
    /// embedding norm, the layers, the final norm and the pooler. With cross-frame messages,
    /// the images are videos' frames, those of one video adjacent, whole videos only.
    pub fn forward_patches(&self, pixel_values: Tensor<B, 4>) -> Result<TrunkOutput<B>> {
        let x = self.embed_patches(pixel_values)?;
        Ok(self.finish(self.layers(x, None)))
    }

    /// Feature frames `[batch, channels, frames]` (Whisper's log-mel) through the trunk: each
    /// convolution followed by the activation, its output read as tokens, the position
    /// embeddings added, then the embedding norm, the layers and the final norm. The frame
    /// count must be the description's (HF pads the log-mel to it).
    pub fn forward_frames(&self, features: Tensor<B, 3>) -> Result<TrunkOutput<B>> {
        let EncoderInput::Frames(f) = &self.spec.input else {
            return Err(self.other_inputs("feature frames"));
        };
        let [batch, channels, frames] = features.dims();
        if batch == 0 || channels != f.channels || frames != f.frames {
            return Err(Error::InvalidInput(format!(
                "input_features must be [batch ≥ 1, {}, {}] (pad the log-mel to {} frames), got {:?}",
                f.channels,
                f.frames,
                f.frames,
                features.dims()
            )));
        }
        let tokens = f.tokens();
        let positions = f.position.weight();
        if positions.dims()[0] < tokens {
            return Err(Error::InvalidInput(format!(
                "{} encoder: {} position embeddings for {tokens} tokens",
                self.spec.family,
                positions.dims()[0]
            )));
        }
        // Channels last from here: each convolution reads its windows in place.
        let mut x = features.swap_dims(1, 2);
        for c in &f.convs {
            let shape = [c.kernel, c.stride, c.padding, 1];
            x = conv_rows(&c.conv, x, shape, Some(f.activation));
        }
        let x = x + positions.clone().narrow(0, 0, tokens).unsqueeze::<3>();
        Ok(self.finish(self.layers(self.embedding_normed(x), None)))
    }

    /// Raw audio `[batch, samples]` (Wav2Vec2's `input_values`) through the trunk: the feature
    /// convolutions (each normed as the description says, then the activation), the projection
    /// norm and projection, the frames past each row's `frame_lengths` zeroed and masked as
    /// attention keys, the positional convolution added, then the embedding norm, the layers,
    /// the final norm.
    pub fn forward_waveform(
        &self,
        samples: Tensor<B, 2>,
        frame_lengths: &[usize],
    ) -> Result<TrunkOutput<B>> {
        let EncoderInput::Waveform(w) = &self.spec.input else {
            return Err(self.other_inputs("raw audio"));
        };
        let [batch, count] = samples.dims();
        let frames = w.tokens(count);
        if batch == 0 || frames == 0 || frame_lengths.len() != batch {
            return Err(Error::InvalidInput(format!(
                "{batch} rows of {count} samples ({frames} frames), {} frame lengths",
                frame_lengths.len()
            )));
        }
        if let Some(l) = frame_lengths.iter().find(|&&l| l == 0 || l > frames) {
            return Err(Error::InvalidInput(format!(
                "a row of {l} frames among rows of {frames}"
            )));
        }
        // Channels last, `[batch, samples, 1]`: each convolution reads its windows in place.
        let mut x: Tensor<B, 3> = samples.unsqueeze_dim(2);
        let act = w.activation;
        for (c, norm) in w.convs.iter().zip(&w.norms) {
            let shape = [c.kernel, c.stride, c.padding, 1];
            x = match norm {
                None => conv_rows(&c.conv, x, shape, Some(act)),
                Some(ConvNorm::Channel(n)) => {
                    n.forward_channels(conv_rows(&c.conv, x, shape, None), act)
                }
                Some(ConvNorm::Frame(n)) => {
                    act.forward(n.forward(conv_rows(&c.conv, x, shape, None)))
                }
            };
        }
        let mut x = w.projection.forward(w.projection_norm.forward(x));
        let bias = frame_lengths.iter().any(|&l| l < frames).then(|| {
            let mask: Vec<i64> = frame_lengths
                .iter()
                .flat_map(|&l| (0..frames).map(move |t| i64::from(t < l)))
                .collect();
            let keep: Vec<f32> = mask.iter().map(|&m| m as f32).collect();
            let keep =
                Tensor::<B, 2>::from_data(TensorData::new(keep, [batch, frames]), &self.device);
            x = x.clone() * keep.unsqueeze_dim::<3>(2);
            let heads = self.spec.heads;
            padding_bias::<B>(&mask, batch, frames, heads, frames, false, &self.device)
        });
        // "Same" padding; an even kernel's extra last output is dropped.
        let p = &w.position;
        let same = [p.kernel, 1, p.kernel / 2, p.groups];
        let positions = conv_rows(&p.conv, x.clone(), same, Some(act));
        let x = x + positions.narrow(1, 0, frames);
        Ok(self.finish(self.layers(self.embedding_normed(x), bias.as_ref())))
    }

    /// Embedded rows `[batch, tokens, hidden]` (X-CLIP's frame embeddings into its MIT) through
    /// the trunk: the position embeddings added, then the embedding norm, the layers and the
    /// final norm. The row count must be the description's.
    pub fn forward_rows(&self, rows: Tensor<B, 3>) -> Result<TrunkOutput<B>> {
        let EncoderInput::Rows(r) = &self.spec.input else {
            return Err(self.other_inputs("embedded rows"));
        };
        let [batch, tokens, hidden] = rows.dims();
        let positions = r.position.weight();
        if batch == 0 || tokens != r.tokens || hidden != self.spec.hidden {
            return Err(Error::InvalidInput(format!(
                "inputs_embeds must be [batch ≥ 1, {}, {}], got {:?}",
                r.tokens,
                self.spec.hidden,
                rows.dims()
            )));
        }
        if positions.dims() != [tokens, hidden] {
            return Err(Error::InvalidInput(format!(
                "{} encoder: position embeddings {:?} for rows of [{tokens}, {hidden}]",
                self.spec.family,
                positions.dims()
            )));
        }
        let x = rows + positions.clone().unsqueeze::<3>();
        Ok(self.finish(self.layers(self.embedding_normed(x), None)))
    }

    /// The error for inputs of another kind than the description's.
    fn other_inputs(&self, what: &str) -> Error {
        Error::InvalidInput(format!(
            "{} encoder: {what} given to an encoder of other inputs",
            self.spec.family
        ))
    }

    /// `x` through the embedding norm, where the description has one.
    fn embedding_normed(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        match &self.spec.embedding_norm {
            Some(norm) => norm.forward(x),
            None => x,
        }
    }

    /// The class token, projected patches and positions of images, after the embedding norm.
    fn embed_patches(&self, pixel_values: Tensor<B, 4>) -> Result<Tensor<B, 3>> {
        let EncoderInput::Patches(p) = &self.spec.input else {
            return Err(self.other_inputs("pixel values"));
        };
        let [batch, _, height, width] = pixel_values.dims();
        if let Some(frames) = self.spec.frames_per_input() {
            if batch == 0 || !batch.is_multiple_of(frames) {
                return Err(Error::InvalidInput(format!(
                    "{batch} frames are not a whole number of {frames}-frame videos"
                )));
            }
        }
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
        Ok(self.embedding_normed(x + positions.unsqueeze::<3>()))
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
        [query, key, value]: [&Linear<B>; 3],
        x: Tensor<B, 3>,
        bias: Option<&Tensor<B, 4>>,
    ) -> Tensor<B, 3> {
        let heads = self.spec.heads;
        let q = split_heads(query.forward(x.clone()), heads);
        let k = split_heads(key.forward(x.clone()), heads);
        let v = split_heads(value.forward(x), heads);
        merge_heads(sdpa(q, k, v, bias, None))
    }

    /// `x = norm(x + attention(x))`, then `norm(x + mlp(x))` (BERT).
    fn post_norm_layer(
        &self,
        l: &EncoderLayerWeights<Linear<B>, LayerNorm<B>>,
        x: Tensor<B, 3>,
        bias: Option<&Tensor<B, 4>>,
    ) -> Tensor<B, 3> {
        let ctx = self.attention([&l.query, &l.key, &l.value], x.clone(), bias);
        let x = l
            .attention_norm
            .forward(l.attention_output.forward_add(ctx, x));
        let inner = l.intermediate.forward_act(x.clone(), self.spec.activation);
        l.output_norm.forward(l.output.forward_add(inner, x))
    }

    /// `x = x + attention(norm(x))`, then `x + mlp(norm(x))` (ViT, CLIP, Whisper). With
    /// cross-frame messages (X-CLIP), each frame attends over its tokens and its video's
    /// message token ([`Trunk::messages`]), and the MLP runs on its tokens only.
    fn pre_norm_layer(
        &self,
        l: &EncoderLayerWeights<Linear<B>, LayerNorm<B>>,
        x: Tensor<B, 3>,
        bias: Option<&Tensor<B, 4>>,
    ) -> Tensor<B, 3> {
        let attend = |x: Tensor<B, 3>| {
            let ctx = self.attention(
                [&l.query, &l.key, &l.value],
                l.attention_norm.forward(x.clone()),
                bias,
            );
            l.attention_output.forward_add(ctx, x)
        };
        let x = match &l.messages {
            None => attend(x),
            Some(m) => {
                let seq = x.dims()[1];
                let with_message = Tensor::cat(vec![x.clone(), self.messages(m, &x)], 1);
                attend(with_message).narrow(1, 0, seq)
            }
        };
        let inner = l
            .intermediate
            .forward_act(l.output_norm.forward(x.clone()), self.spec.activation);
        l.output.forward_add(inner, x)
    }

    /// X-CLIP's message tokens `[videos · frames, 1, hidden]` of `x` (frames of one video
    /// adjacent): each frame's class token through `fc`, then the messages of one video
    /// attending to each other (normed first, a residual around).
    fn messages(
        &self,
        m: &FrameMessages<Linear<B>, LayerNorm<B>>,
        x: &Tensor<B, 3>,
    ) -> Tensor<B, 3> {
        let [rows, _, h] = x.dims();
        let msg =
            m.fc.forward(first_token(x))
                .reshape([rows / m.frames, m.frames, h]);
        let ctx = self.attention(
            [&m.query, &m.key, &m.value],
            m.norm.forward(msg.clone()),
            None,
        );
        m.output.forward_add(ctx, msg).reshape([rows, 1, h])
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

/// `act(conv(x))` for channels-last `x` `[batch, length, in]`: `conv` is a convolution held as
/// a dense layer over its flattened `[in / groups, kernel]` taps (the description's form of it),
/// `shape` its `[kernel, stride, padding, groups]`. Returns `[batch, length', out]`. On the
/// CPU backend one product reads the input's windows in place, with the bias and activation
/// in its output pass (`fast::conv1d`); elsewhere burn's convolution runs on the channels-first
/// view.
fn conv_rows<B: Backend>(
    conv: &Linear<B>,
    x: Tensor<B, 3>,
    shape: [usize; 4],
    act: Option<Activation>,
) -> Tensor<B, 3> {
    let w = conv.weight();
    let matrix = w.matrix();
    if let Some(y) = crate::fast::conv1d(&x, &matrix, conv.bias(), shape, act) {
        return y;
    }
    let [kernel, stride, padding, groups] = shape;
    let (out, taps) = (w.out_dim(), w.in_dim());
    let weight = matrix.transpose().reshape([out, taps / kernel, kernel]);
    let options = ConvOptions::new([stride], [padding], [1], groups);
    let y = crate::exact::conv1d(x.swap_dims(1, 2), weight, conv.bias().cloned(), options);
    let y = y.swap_dims(1, 2);
    match act {
        Some(act) => act.forward(y),
        None => y,
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

#[cfg(test)]
mod tests {
    use super::*;
    use burn_flex::Flex;

    fn values(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 31 + seed * 17) % 29) as f32 * 0.07 - 1.0)
            .collect()
    }

    /// The CPU's product over windows (channels last) against burn's convolution on the
    /// channels-first view, for Whisper's padded convolutions, Wav2Vec2's strided ones and its
    /// grouped positional one (an even kernel).
    #[test]
    fn windowed_convolutions_match_burns() {
        let dev = Default::default();
        // (batch, length, in, out, kernel, stride, padding, groups)
        let shapes = [
            (2, 23, 1, 6, 10, 5, 0, 1),
            (1, 19, 6, 8, 3, 2, 0, 1),
            (2, 12, 5, 7, 3, 1, 1, 1),
            (2, 11, 8, 8, 4, 1, 2, 4),
        ];
        for (batch, length, cin, out, kernel, stride, padding, groups) in shapes {
            let taps = cin / groups * kernel;
            let weight = Tensor::<Flex, 2>::from_data(
                TensorData::new(values(out * taps, 1), [out, taps]),
                &dev,
            );
            let bias = Tensor::<Flex, 1>::from_data(TensorData::new(values(out, 2), [out]), &dev);
            let conv = Linear::from_tensors(weight.clone(), Some(bias.clone()));
            let x = Tensor::<Flex, 3>::from_data(
                TensorData::new(values(batch * length * cin, 3), [batch, length, cin]),
                &dev,
            );
            let shape = [kernel, stride, padding, groups];
            let got = conv_rows(&conv, x.clone(), shape, Some(Activation::Gelu));
            let options = ConvOptions::new([stride], [padding], [1], groups);
            let burn_weight = weight.reshape([out, cin / groups, kernel]);
            let want =
                burn::tensor::module::conv1d(x.swap_dims(1, 2), burn_weight, Some(bias), options);
            let want = Activation::Gelu.forward(want.swap_dims(1, 2));
            assert_eq!(got.dims(), want.dims(), "{shape:?}");
            let diff = (got - want).abs().max().into_scalar();
            assert!(diff < 1e-5, "{shape:?}: {diff}");
        }
    }
}
