//! What an [`EncoderSpec`] means, executed in plain f64 loops on the host: the reference the
//! engines that run the spec are tested against, and the check that a family's spec computes
//! its HF outputs (without a GPU). Slow by design; not an inference path.

use crate::encoder::{
    ConvNorm, DenseWeights, EncoderActivation, EncoderHead, EncoderInput, EncoderSpec, FrameConv,
    FrameMessages, NormPlacement, NormWeights, PooledToken, PositionConv, WaveformEmbeddings,
};
use crate::{Error, Result};

/// The inputs of [`EncoderSpec::reference_forward`].
#[derive(Debug, Clone, Copy)]
pub enum ReferenceInput<'a> {
    /// `[batch, seq]` token ids, token types and attention mask (1 = token, 0 = padding).
    Tokens {
        /// Rows.
        batch: usize,
        /// Columns.
        seq: usize,
        /// Token ids.
        ids: &'a [i64],
        /// Token types (all 0 for a model without them).
        types: &'a [i64],
        /// Attention mask.
        mask: &'a [i64],
    },
    /// `[batch, channels, height, width]` pixel values.
    Pixels {
        /// Images.
        batch: usize,
        /// Pixel values.
        values: &'a [f32],
    },
    /// `[batch, channels, frames]` feature frames.
    Frames {
        /// Inputs.
        batch: usize,
        /// Feature values.
        values: &'a [f32],
    },
    /// `[batch, samples]` audio samples.
    Samples {
        /// Inputs.
        batch: usize,
        /// Sample values.
        values: &'a [f32],
    },
    /// `[batch, tokens, hidden]` embedded rows.
    Rows {
        /// Inputs.
        batch: usize,
        /// Row values.
        values: &'a [f32],
    },
}

/// The outputs of [`EncoderSpec::reference_forward`], row-major f64.
#[derive(Debug, Clone, PartialEq)]
pub struct ReferenceOutput {
    /// `[batch, seq, hidden]`.
    pub last_hidden_state: Vec<f64>,
    /// `[batch, hidden]`, when the spec has a pooler.
    pub pooler_output: Option<Vec<f64>>,
    /// The head's outputs: `[batch, labels]` for first-token and pooled heads, `[batch, seq,
    /// labels]` for every-token and span heads.
    pub logits: Option<Vec<f64>>,
    /// `[batch, out]`, when the spec has a projection.
    pub projection: Option<Vec<f64>>,
}

/// `dense(x)` of one row.
pub(crate) fn dense(d: &DenseWeights, x: &[f64]) -> Vec<f64> {
    (0..d.out_features)
        .map(|o| {
            let w = &d.weight[o * d.in_features..(o + 1) * d.in_features];
            d.bias[o] as f64 + w.iter().zip(x).map(|(&w, &x)| w as f64 * x).sum::<f64>()
        })
        .collect()
}

/// `(x - mean) / sqrt(var + eps)` of one row.
fn standardize(eps: f32, x: &[f64]) -> impl Iterator<Item = f64> + '_ {
    let len = x.len() as f64;
    let mean = x.iter().sum::<f64>() / len;
    let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / len;
    let inv = 1.0 / (var + eps as f64).sqrt();
    x.iter().map(move |v| (v - mean) * inv)
}

/// Layer norm of one row.
pub(crate) fn norm(n: &NormWeights, eps: f32, x: &[f64]) -> Vec<f64> {
    standardize(eps, x)
        .enumerate()
        .map(|(i, v)| v * n.gamma[i] as f64 + n.beta[i] as f64)
        .collect()
}

/// `conv(x)` of one input: `x` `[frames][channels]`, the result `[out frames][out channels]`.
fn conv_frames(c: &FrameConv, x: &[Vec<f64>]) -> Vec<Vec<f64>> {
    let channels = c.in_channels();
    (0..c.out_frames(x.len()))
        .map(|t| {
            // The im2col row: channel-major, then kernel tap, as the weight's rows are laid out.
            let mut window = vec![0.0f64; channels * c.kernel];
            for tap in 0..c.kernel {
                let at = (t * c.stride + tap).checked_sub(c.padding);
                if let Some(frame) = at.and_then(|a| x.get(a)) {
                    for (ch, v) in frame.iter().enumerate() {
                        window[ch * c.kernel + tap] = *v;
                    }
                }
            }
            dense(&c.conv, &window)
        })
        .collect()
}

/// Applies `act` to every value.
fn activate(act: EncoderActivation, x: &mut [Vec<f64>]) {
    x.iter_mut().flatten().for_each(|v| *v = act.apply(*v));
}

/// Wav2Vec2's feature encoder, projection and relative positions of one input: `samples` in,
/// `[tokens][hidden]` out.
fn waveform_tokens(w: &WaveformEmbeddings, eps: f32, samples: &[f32]) -> Vec<Vec<f64>> {
    let mut x: Vec<Vec<f64>> = samples.iter().map(|&v| vec![v as f64]).collect();
    for (conv, n) in w.convs.iter().zip(&w.norms) {
        x = conv_frames(conv, &x);
        match n {
            Some(ConvNorm::Frame(n)) => x.iter_mut().for_each(|r| *r = norm(n, w.conv_eps, r)),
            Some(ConvNorm::Channel(n)) => {
                for ch in 0..conv.conv.out_features {
                    let column: Vec<f64> = x.iter().map(|r| r[ch]).collect();
                    let (g, b) = (n.gamma[ch] as f64, n.beta[ch] as f64);
                    for (r, v) in x.iter_mut().zip(standardize(w.conv_eps, &column)) {
                        r[ch] = v * g + b;
                    }
                }
            }
            None => {}
        }
        activate(w.activation, &mut x);
    }
    let mut x: Vec<Vec<f64>> = x
        .iter()
        .map(|r| dense(&w.projection, &norm(&w.projection_norm, eps, r)))
        .collect();
    let positions = position_conv(&w.position, w.activation, &x);
    for (r, p) in x.iter_mut().zip(positions) {
        r.iter_mut().zip(p).for_each(|(v, p)| *v += p);
    }
    x
}

/// `act(conv(x))` of a [`PositionConv`]: `x` `[tokens][hidden]`, as many tokens out.
fn position_conv(p: &PositionConv, act: EncoderActivation, x: &[Vec<f64>]) -> Vec<Vec<f64>> {
    let h = p.conv.out_features;
    let per_group = h / p.groups.max(1);
    let pad = p.kernel / 2;
    (0..x.len())
        .map(|t| {
            (0..h)
                .map(|o| {
                    let first = o / per_group * per_group;
                    let w = &p.conv.weight[o * per_group * p.kernel..][..per_group * p.kernel];
                    let mut sum = p.conv.bias[o] as f64;
                    for tap in 0..p.kernel {
                        let Some(frame) = (t + tap).checked_sub(pad).and_then(|a| x.get(a)) else {
                            continue;
                        };
                        for c in 0..per_group {
                            sum += w[c * p.kernel + tap] as f64 * frame[first + c];
                        }
                    }
                    act.apply(sum)
                })
                .collect()
        })
        .collect()
}

impl EncoderSpec {
    /// Runs the spec on `input` in f64 (weights in blocks are not read: such specs are refused).
    pub fn reference_forward(&self, input: &ReferenceInput<'_>) -> Result<ReferenceOutput> {
        self.validate()?;
        let h = self.hidden;
        let bad = |m: String| Err(Error::InvalidInput(format!("reference forward: {m}")));
        // x: [batch][seq][hidden]; keep: which keys each row may see.
        let (batch, seq, mut x, keep, ids) = match (input, &self.input) {
            (
                ReferenceInput::Tokens {
                    batch,
                    seq,
                    ids,
                    types,
                    mask,
                },
                EncoderInput::Tokens(t),
            ) => {
                let n = batch * seq;
                if ids.len() != n || types.len() != n || mask.len() != n {
                    return bad(format!("inputs do not hold [{batch}, {seq}] values"));
                }
                let positions = t.position_ids(ids, *seq)?;
                let mut x = vec![vec![vec![0.0f64; h]; *seq]; *batch];
                for (m, row) in x.iter_mut().flatten().enumerate() {
                    let (id, ty, s) = (ids[m] as usize, types[m] as usize, positions[m] as usize);
                    if id >= t.vocab || (ty > 0 && ty >= t.type_vocab) {
                        return bad(format!("token {id} / type {ty} out of range"));
                    }
                    for (c, v) in row.iter_mut().enumerate() {
                        *v = t.word[id * h + c] as f64 + t.position[s * h + c] as f64;
                        if let Some(types) = &t.token_type {
                            *v += types[ty * h + c] as f64;
                        }
                    }
                }
                (*batch, *seq, x, mask.to_vec(), Some(*ids))
            }
            (ReferenceInput::Pixels { batch, values }, EncoderInput::Patches(p)) => {
                let (ih, iw) = p.image;
                let (c, pp) = (p.channels, p.patch);
                if values.len() != batch * c * ih * iw {
                    return bad(format!(
                        "pixels do not hold [{batch}, {c}, {ih}, {iw}] values"
                    ));
                }
                let seq = p.tokens();
                let gw = iw / pp;
                let mut x = vec![vec![vec![0.0f64; h]; seq]; *batch];
                for (b, image) in x.iter_mut().enumerate() {
                    for (s, row) in image.iter_mut().enumerate() {
                        let v = if s == 0 {
                            p.class.iter().map(|&v| v as f64).collect()
                        } else {
                            let (gy, gx) = ((s - 1) / gw, (s - 1) % gw);
                            let mut patch = Vec::with_capacity(c * pp * pp);
                            for ch in 0..c {
                                for y in 0..pp {
                                    for xx in 0..pp {
                                        let at =
                                            ((b * c + ch) * ih + gy * pp + y) * iw + gx * pp + xx;
                                        patch.push(values[at] as f64);
                                    }
                                }
                            }
                            dense(&p.projection, &patch)
                        };
                        for (k, out) in row.iter_mut().enumerate() {
                            *out = v[k] + p.position[s * h + k] as f64;
                        }
                    }
                }
                (*batch, seq, x, vec![1; batch * seq], None)
            }
            (ReferenceInput::Frames { batch, values }, EncoderInput::Frames(f)) => {
                let (c, n) = (f.channels, f.frames);
                if values.len() != batch * c * n {
                    return bad(format!("features do not hold [{batch}, {c}, {n}] values"));
                }
                let seq = f.tokens();
                let x = (0..*batch)
                    .map(|b| {
                        let input = &values[b * c * n..(b + 1) * c * n];
                        let mut frames: Vec<Vec<f64>> = (0..n)
                            .map(|t| (0..c).map(|ch| input[ch * n + t] as f64).collect())
                            .collect();
                        for conv in &f.convs {
                            frames = conv_frames(conv, &frames);
                            activate(f.activation, &mut frames);
                        }
                        for (s, row) in frames.iter_mut().enumerate() {
                            for (k, v) in row.iter_mut().enumerate() {
                                *v += f.position[s * h + k] as f64;
                            }
                        }
                        frames
                    })
                    .collect();
                (*batch, seq, x, vec![1; batch * seq], None)
            }
            (ReferenceInput::Samples { batch, values }, EncoderInput::Waveform(w)) => {
                let samples = values.len() / (*batch).max(1);
                let seq = w.tokens(samples);
                if *batch == 0 || values.len() != batch * samples || seq == 0 {
                    return bad(format!(
                        "{} samples do not make {batch} rows long enough for one token",
                        values.len()
                    ));
                }
                let x = values
                    .chunks(samples)
                    .map(|row| waveform_tokens(w, self.eps, row))
                    .collect();
                (*batch, seq, x, vec![1; batch * seq], None)
            }
            (ReferenceInput::Rows { batch, values }, EncoderInput::Rows(r)) => {
                let seq = r.tokens;
                if values.len() != batch * seq * h {
                    return bad(format!("rows do not hold [{batch}, {seq}, {h}] values"));
                }
                let x = values
                    .chunks(seq * h)
                    .map(|input| {
                        input
                            .chunks(h)
                            .zip(r.position.chunks(h))
                            .map(|(row, position)| {
                                row.iter()
                                    .zip(position)
                                    .map(|(&v, &p)| v as f64 + p as f64)
                                    .collect()
                            })
                            .collect()
                    })
                    .collect();
                (*batch, seq, x, vec![1; batch * seq], None)
            }
            _ => return bad("the input is not the kind the spec reads".into()),
        };
        if self
            .layers
            .iter()
            .any(|l| l.query.blocks.is_some() || l.intermediate.blocks.is_some())
        {
            return bad("weights kept in blocks".into());
        }
        let eps = self.eps;
        if let Some(n) = &self.embedding_norm {
            for row in x.iter_mut().flatten() {
                *row = norm(n, eps, row);
            }
        }
        let heads = self.heads;
        let pre = self.norm == NormPlacement::Pre;
        for layer in &self.layers {
            // Cross-frame messages: one more key per input, from its video's frames.
            let messages = match &layer.messages {
                Some(m) => Some(frame_messages(m, eps, heads, &x)?),
                None => None,
            };
            for (b, rows) in x.iter_mut().enumerate() {
                let mut input: Vec<Vec<f64>> = rows
                    .iter()
                    .map(|r| {
                        if pre {
                            norm(&layer.attention_norm, eps, r)
                        } else {
                            r.clone()
                        }
                    })
                    .collect();
                if let Some(m) = &messages {
                    input.push(norm(&layer.attention_norm, eps, &m[b]));
                }
                let q: Vec<_> = input.iter().map(|r| dense(&layer.query, r)).collect();
                let k: Vec<_> = input.iter().map(|r| dense(&layer.key, r)).collect();
                let v: Vec<_> = input.iter().map(|r| dense(&layer.value, r)).collect();
                let ctx: Vec<Vec<f64>> = (0..seq)
                    .map(|i| {
                        let limit = if self.causal { i + 1 } else { seq };
                        let visible: Vec<usize> =
                            (0..limit).filter(|&j| keep[b * seq + j] != 0).collect();
                        // A query that sees no key attends to every key it may see, as HF's
                        // additive mask (the same large negative on every key) does.
                        let mut visible = if visible.is_empty() {
                            (0..limit).collect()
                        } else {
                            visible
                        };
                        // The frame's message is a key of every token.
                        visible.extend(seq..input.len());
                        attend(&q[i], &k, &v, &visible, heads)
                    })
                    .collect();
                for (row, c) in rows.iter_mut().zip(&ctx) {
                    let a = dense(&layer.attention_output, c);
                    let sum: Vec<f64> = row.iter().zip(&a).map(|(x, a)| x + a).collect();
                    *row = if pre {
                        sum
                    } else {
                        norm(&layer.attention_norm, eps, &sum)
                    };
                    let ffn_in = if pre {
                        norm(&layer.output_norm, eps, row)
                    } else {
                        row.clone()
                    };
                    let mut up = dense(&layer.intermediate, &ffn_in);
                    for u in &mut up {
                        *u = self.activation.apply(*u);
                    }
                    let down = dense(&layer.output, &up);
                    let sum: Vec<f64> = row.iter().zip(&down).map(|(x, d)| x + d).collect();
                    *row = if pre {
                        sum
                    } else {
                        norm(&layer.output_norm, eps, &sum)
                    };
                }
            }
        }
        if let Some(n) = &self.final_norm {
            for row in x.iter_mut().flatten() {
                *row = norm(n, eps, row);
            }
        }
        let pooled: Option<Vec<Vec<f64>>> = self.pooler.as_ref().map(|p| {
            x.iter()
                .map(|rows| {
                    let y = dense(&p.dense, &rows[0]).into_iter();
                    y.map(|v| p.activation.apply(v)).collect()
                })
                .collect()
        });
        let logits = self.head.as_ref().map(|head| match head {
            EncoderHead::FirstToken(d) => x.iter().flat_map(|rows| dense(d, &rows[0])).collect(),
            EncoderHead::Pooled(d) => pooled.iter().flatten().flat_map(|p| dense(d, p)).collect(),
            EncoderHead::EveryToken(d) | EncoderHead::Span(d) => {
                x.iter().flatten().flat_map(|r| dense(d, r)).collect()
            }
            EncoderHead::EveryTokenMlp {
                up,
                activation,
                down,
            } => x
                .iter()
                .flatten()
                .flat_map(|r| dense(down, &dense_act(up, *activation, r)))
                .collect(),
        });
        let projection = self.projection.as_ref().map(|p| {
            let positions = match ids {
                Some(ids) => p.token.positions(ids, seq),
                None => PooledToken::First.positions(&vec![0; batch * seq], seq),
            };
            x.iter()
                .zip(positions)
                .enumerate()
                .flat_map(|(b, (rows, t))| {
                    let v = match (&p.norm, p.token, &pooled) {
                        (_, PooledToken::Pooler, Some(pooled)) => pooled[b].clone(),
                        (Some(n), ..) => norm(n, eps, &rows[t]),
                        (None, ..) => rows[t].clone(),
                    };
                    let v = match &p.hidden {
                        Some(l) => dense_act(&l.dense, l.activation, &v),
                        None => v,
                    };
                    dense(&p.dense, &v)
                })
                .collect()
        });
        Ok(ReferenceOutput {
            last_hidden_state: x.into_iter().flatten().flatten().collect(),
            pooler_output: pooled.map(|p| p.into_iter().flatten().collect()),
            logits,
            projection,
        })
    }
}

/// `act(d(x))`.
fn dense_act(d: &DenseWeights, act: EncoderActivation, x: &[f64]) -> Vec<f64> {
    dense(d, x).into_iter().map(|v| act.apply(v)).collect()
}

/// The attention of query `q` over the keys `visible` of `k` / `v`, head by head (heads of
/// `q.len() / heads` values, scores scaled by the root of that), by the decoder reference's
/// [`attend`](crate::decoder_reference::attend).
fn attend(q: &[f64], k: &[Vec<f64>], v: &[Vec<f64>], visible: &[usize], heads: usize) -> Vec<f64> {
    let scale = 1.0 / ((q.len() / heads) as f64).sqrt();
    let keys: Vec<&[f64]> = visible.iter().map(|&j| k[j].as_slice()).collect();
    let values: Vec<&[f64]> = visible.iter().map(|&j| v[j].as_slice()).collect();
    crate::decoder_reference::attend(q, (&keys, &values), (heads, heads), scale, &|_, _| 0.0)
}

/// Each input's cross-frame message ([`FrameMessages`]) from the first token of every frame in
/// `x` `[inputs][seq][hidden]`: `fc(x[0])`, plus the attention of its video's messages.
fn frame_messages(
    m: &FrameMessages,
    eps: f32,
    heads: usize,
    x: &[Vec<Vec<f64>>],
) -> Result<Vec<Vec<f64>>> {
    if x.is_empty() || !x.len().is_multiple_of(m.frames) {
        return Err(Error::InvalidInput(format!(
            "reference forward: {} frames are not a whole number of {}-frame videos",
            x.len(),
            m.frames
        )));
    }
    let mut msgs: Vec<Vec<f64>> = x.iter().map(|rows| dense(&m.fc, &rows[0])).collect();
    let normed: Vec<Vec<f64>> = msgs.iter().map(|r| norm(&m.norm, eps, r)).collect();
    let q: Vec<_> = normed.iter().map(|r| dense(&m.query, r)).collect();
    let k: Vec<_> = normed.iter().map(|r| dense(&m.key, r)).collect();
    let v: Vec<_> = normed.iter().map(|r| dense(&m.value, r)).collect();
    for (i, msg) in msgs.iter_mut().enumerate() {
        let first = i / m.frames * m.frames;
        let video: Vec<usize> = (first..first + m.frames).collect();
        let out = dense(&m.output, &attend(&q[i], &k, &v, &video, heads));
        for (a, o) in msg.iter_mut().zip(out) {
            *a += o;
        }
    }
    Ok(msgs)
}
