//! The engine behind the uniform [`ModelRunner`] interface: HF input names in, HF output names
//! out, every input checked before it reaches the GPU.

use cudarc::cublas::{CudaBlas, Gemm};
use ipfs_accelerate_core::{
    token_position_ids, BackendKind, EncoderInput, EncoderSpec, Error, HostTensor, ModelRunner,
    PooledToken, Precision, Result, TensorMap, TokenBatch,
};

use crate::engine::{Elem, Encoder, EncoderOutput, Floats, Input, Tokens};
use crate::{probe, EngineError};

/// An encoder of either storage type.
trait Forward: Send {
    fn forward(&self, input: &Input<'_>) -> Result<EncoderOutput, EngineError>;
    fn memory_in_use(&self) -> Option<u64>;
}

impl<T: Elem> Forward for Encoder<T>
where
    CudaBlas: Gemm<T>,
{
    fn forward(&self, input: &Input<'_>) -> Result<EncoderOutput, EngineError> {
        Encoder::forward(self, input)
    }
    fn memory_in_use(&self) -> Option<u64> {
        Encoder::memory_in_use(self)
    }
}

/// What the runner checks its inputs against.
enum Expects {
    Tokens {
        vocab: usize,
        type_vocab: usize,
        max_positions: usize,
        padding_idx: Option<i64>,
    },
    Pixels {
        channels: usize,
        image: (usize, usize),
    },
    Frames {
        channels: usize,
        frames: usize,
    },
    /// Audio samples of any length: the front end's (kernel, stride) pairs count its tokens.
    Samples {
        convs: Vec<(usize, usize)>,
    },
}

/// An [`EncoderSpec`] loaded on CUDA device 0 through cuBLAS, run as a [`ModelRunner`]: token
/// encoders take `input_ids`, `attention_mask`, `token_type_ids`; image encoders `pixel_values`
/// `[batch, channels, height, width]`; feature-frame encoders (Whisper's) `input_features`
/// `[batch, channels, frames]`; raw-audio encoders (Wav2Vec2's) `input_values` `[batch, samples]`
/// of equal, unpadded rows. Outputs (HF's names): `last_hidden_state`, and
/// `pooler_output` when the spec has a pooler; the head's `logits`, or for a span head
/// `start_logits` and `end_logits` (`[batch, seq]`, f32).
pub struct EncoderRunner {
    family: String,
    expects: Expects,
    precision: Precision,
    /// Whether the head's two outputs are start and end logits.
    span: bool,
    /// The projection's output name and the token it reads, when the spec has one.
    projection: Option<(String, PooledToken)>,
    /// One call at a time: the engine's stream and scratch buffers are shared by its calls.
    engine: std::sync::Mutex<Box<dyn Forward>>,
}

impl EncoderRunner {
    /// Probes libcuda / NVRTC / cuBLAS, checks `spec`, compiles the kernels and uploads the
    /// weights in `precision` (f32 or f16).
    pub fn load(spec: &EncoderSpec, precision: Precision) -> Result<Self, EngineError> {
        probe()?;
        let engine: Box<dyn Forward> = match precision {
            Precision::F32 => Box::new(Encoder::<f32>::load(spec, 0)?),
            Precision::F16 => Box::new(Encoder::<half::f16>::load(spec, 0)?),
            other => return Err(EngineError::Precision(other.name().into())),
        };
        let expects = match &spec.input {
            EncoderInput::Tokens(t) => Expects::Tokens {
                vocab: t.vocab,
                type_vocab: t.type_vocab,
                max_positions: t.max_positions,
                padding_idx: t.padding_idx,
            },
            EncoderInput::Patches(p) => Expects::Pixels {
                channels: p.channels,
                image: p.image,
            },
            EncoderInput::Frames(f) => Expects::Frames {
                channels: f.channels,
                frames: f.frames,
            },
            EncoderInput::Waveform(w) => Expects::Samples {
                convs: w.convs.iter().map(|c| (c.kernel, c.stride)).collect(),
            },
            EncoderInput::Rows(_) => return Err(crate::rows_refused()),
        };
        Ok(EncoderRunner {
            family: spec.family.clone(),
            expects,
            precision,
            span: matches!(spec.head, Some(ipfs_accelerate_core::EncoderHead::Span(_))),
            projection: spec
                .projection
                .as_ref()
                .map(|p| (p.output.clone(), p.token)),
            engine: std::sync::Mutex::new(engine),
        })
    }

    /// The precision it computes in.
    pub fn precision(&self) -> Precision {
        self.precision
    }
}

/// `values` as i32, each checked to be in `0..limit`.
fn checked_ids(name: &str, values: &[i64], limit: usize) -> Result<Vec<i32>> {
    values
        .iter()
        .map(|&v| {
            if v < 0 || v as u64 >= limit as u64 {
                Err(Error::InvalidInput(format!(
                    "{name} holds {v}, outside 0..{limit}"
                )))
            } else {
                Ok(v as i32)
            }
        })
        .collect()
}

impl ModelRunner for EncoderRunner {
    fn family(&self) -> &str {
        &self.family
    }

    fn backend(&self) -> BackendKind {
        BackendKind::Cuda
    }

    fn engine(&self) -> Option<&str> {
        Some("cublas")
    }

    fn device_memory_in_use(&self) -> Option<u64> {
        self.engine.lock().ok()?.memory_in_use()
    }

    fn run(&self, inputs: &TensorMap) -> Result<TensorMap> {
        let out = match &self.expects {
            Expects::Tokens {
                vocab,
                type_vocab,
                max_positions,
                padding_idx,
            } => {
                let t = TokenBatch::from_tensors(inputs)?;
                if t.batch == 0 || t.seq == 0 {
                    return Err(Error::InvalidInput(format!(
                        "empty input: input_ids is [{}, {}]",
                        t.batch, t.seq
                    )));
                }
                if t.seq > crate::engine::MAX_KEYS {
                    return Err(Error::InvalidInput(format!(
                        "sequence of {} tokens exceeds the cuBLAS encoder's {} keys per \
                         attention row",
                        t.seq,
                        crate::engine::MAX_KEYS
                    )));
                }
                let positions: Vec<i32> =
                    token_position_ids(*max_positions, *padding_idx, &t.input_ids, t.seq)?
                        .into_iter()
                        .map(|p| p as i32)
                        .collect();
                let types = t.optional(inputs, "token_type_ids", 0)?;
                let ids = checked_ids("input_ids", &t.input_ids, *vocab)?;
                // Without token types (type_vocab 0) every type must be 0: one zero row.
                let types = checked_ids("token_type_ids", &types, (*type_vocab).max(1))?;
                let mask: Vec<i32> = t.attention_mask.iter().map(|&m| (m != 0) as i32).collect();
                let pooled: Vec<i32> = self.projection.as_ref().map_or(Vec::new(), |(_, token)| {
                    token
                        .positions(&t.input_ids, t.seq)
                        .into_iter()
                        .map(|p| p as i32)
                        .collect()
                });
                self.forward(&Input::Tokens(Tokens {
                    batch: t.batch,
                    seq: t.seq,
                    ids: &ids,
                    types: &types,
                    positions: &positions,
                    mask: &mask,
                    pooled: &pooled,
                }))?
            }
            Expects::Pixels { channels, image } => {
                let (batch, values) = checked_floats(
                    inputs,
                    "pixel_values",
                    ["channels", "height", "width"],
                    [*channels, image.0, image.1],
                    "the checkpoint's image size",
                )?;
                self.forward(&Input::Pixels(Floats {
                    batch,
                    values: &values,
                }))?
            }
            Expects::Frames { channels, frames } => {
                let (batch, values) = checked_floats(
                    inputs,
                    "input_features",
                    ["channels", "frames"],
                    [*channels, *frames],
                    "the checkpoint's feature bins and frames",
                )?;
                self.forward(&Input::Frames(Floats {
                    batch,
                    values: &values,
                }))?
            }
            Expects::Samples { convs } => {
                let samples = inputs
                    .get("input_values")
                    .and_then(|t| t.shape().get(1).copied())
                    .unwrap_or(0);
                let (batch, values) = checked_floats(
                    inputs,
                    "input_values",
                    ["samples"],
                    [samples],
                    "rows of equal length",
                )?;
                let tokens = convs.iter().fold(samples, |n, &(k, s)| {
                    ipfs_accelerate_core::conv_out_frames(n, k, s, 0)
                });
                if tokens == 0 {
                    return Err(Error::InvalidInput(format!(
                        "{samples} samples are shorter than the feature encoder's receptive field"
                    )));
                }
                if tokens > crate::engine::MAX_KEYS {
                    return Err(Error::InvalidInput(format!(
                        "{samples} samples make {tokens} tokens, more than the cuBLAS encoder's {} \
                         keys per attention row",
                        crate::engine::MAX_KEYS
                    )));
                }
                if let Some(mask) = inputs.get("attention_mask") {
                    if mask.to_i64_vec()?.contains(&0) {
                        return Err(Error::InvalidInput(
                            "the cuBLAS encoder reads unpadded audio: an attention_mask with \
                             padding is not supported (batch rows of equal length)"
                                .into(),
                        ));
                    }
                }
                self.forward(&Input::Samples(Floats {
                    batch,
                    values: &values,
                }))?
            }
        };
        let mut map = TensorMap::new();
        map.insert("last_hidden_state".into(), out.last_hidden_state);
        if let Some(p) = out.pooler_output {
            map.insert("pooler_output".into(), p);
        }
        match out.logits {
            Some(l) if self.span => {
                // [batch, seq, 2] → start and end, [batch, seq] each.
                let shape = l.shape()[..l.shape().len() - 1].to_vec();
                let values = l.to_f32_vec();
                let (start, end): (Vec<f32>, Vec<f32>) =
                    values.chunks_exact(2).map(|p| (p[0], p[1])).unzip();
                map.insert(
                    "start_logits".into(),
                    HostTensor::from_f32(shape.clone(), &start)?,
                );
                map.insert("end_logits".into(), HostTensor::from_f32(shape, &end)?);
            }
            Some(l) => {
                map.insert("logits".into(), l);
            }
            None => {}
        }
        if let (Some((name, _)), Some(p)) = (&self.projection, out.projection) {
            map.insert(name.clone(), p);
        }
        Ok(map)
    }
}

impl EncoderRunner {
    fn forward(&self, input: &Input<'_>) -> Result<EncoderOutput> {
        let engine = self
            .engine
            .lock()
            .map_err(|_| Error::Compute("the cuBLAS encoder failed in another thread".into()))?;
        Ok(engine.forward(input)?)
    }
}

/// The float input `name` checked to be `[batch ≥ 1, item…]` (`dims` names the item's axes,
/// `trained` says where its sizes come from) with finite values: the batch and the values as
/// f32 (borrowed when the tensor holds f32).
fn checked_floats<'a, const N: usize>(
    inputs: &'a TensorMap,
    name: &str,
    dims: [&str; N],
    item: [usize; N],
    trained: &str,
) -> Result<(usize, std::borrow::Cow<'a, [f32]>)> {
    use rayon::prelude::*;
    let t = inputs
        .get(name)
        .ok_or_else(|| Error::InvalidInput(format!("missing input `{name}`")))?;
    let shape = t.shape();
    if shape.len() != N + 1 {
        return Err(Error::InvalidInput(format!(
            "{name} must be [batch, {}], got {shape:?}",
            dims.join(", ")
        )));
    }
    let batch = shape[0];
    if batch == 0 {
        return Err(Error::InvalidInput(format!(
            "empty input: {name} has no rows"
        )));
    }
    if shape[1..] != item {
        let sizes = |s: &[usize]| {
            s.iter()
                .map(|v| v.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        return Err(Error::InvalidInput(format!(
            "{name} is [{batch}, {}]; the cuBLAS encoder takes [batch, {}] ({trained})",
            sizes(&shape[1..]),
            sizes(&item)
        )));
    }
    let values = match t.as_f32() {
        Some(v) => std::borrow::Cow::Borrowed(v),
        None => std::borrow::Cow::Owned(t.to_f32_vec()),
    };
    const CHUNK: usize = 1 << 16;
    let bad = values
        .par_chunks(CHUNK)
        .enumerate()
        .find_map_first(|(i, c)| c.iter().position(|v| !v.is_finite()).map(|j| i * CHUNK + j));
    if let Some(i) = bad {
        return Err(Error::InvalidInput(format!(
            "{name} holds {} at index {i}",
            values[i]
        )));
    }
    Ok((batch, values))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_inputs_of_another_shape_or_not_finite_are_named_errors() {
        let pixels = |shape: Vec<usize>, fill: f32| {
            let n = shape.iter().product();
            let mut map = TensorMap::new();
            map.insert(
                "pixel_values".into(),
                HostTensor::from_f32(shape, &vec![fill; n]).unwrap(),
            );
            map
        };
        let checked_pixels = |map: &TensorMap, c, (h, w)| {
            checked_floats(
                map,
                "pixel_values",
                ["channels", "height", "width"],
                [c, h, w],
                "",
            )
            .map(|(b, v)| (b, v.into_owned()))
        };
        let ok = pixels(vec![2, 3, 4, 8], 0.5);
        let (batch, values) = checked_floats(
            &ok,
            "pixel_values",
            ["channels", "height", "width"],
            [3, 4, 8],
            "",
        )
        .unwrap();
        assert_eq!((batch, values.len()), (2, 2 * 3 * 4 * 8));
        assert!(
            matches!(values, std::borrow::Cow::Borrowed(_)),
            "f32 pixels are borrowed"
        );
        let e = checked_pixels(&pixels(vec![2, 3, 8, 8], 0.5), 3, (4, 8)).unwrap_err();
        assert!(e.to_string().contains("[batch, 3, 4, 8]"), "{e}");
        let e = checked_pixels(&pixels(vec![3, 4, 8], 0.5), 3, (4, 8)).unwrap_err();
        assert!(
            e.to_string().contains("[batch, channels, height, width]"),
            "{e}"
        );
        let e = checked_pixels(&pixels(vec![1, 3, 4, 8], f32::NAN), 3, (4, 8)).unwrap_err();
        assert!(e.to_string().contains("NaN at index 0"), "{e}");
        let e = checked_pixels(&TensorMap::new(), 3, (4, 8)).unwrap_err();
        assert!(e.to_string().contains("pixel_values"), "{e}");
    }

    #[test]
    fn ids_outside_the_vocabulary_are_named_errors() {
        assert_eq!(checked_ids("input_ids", &[0, 4], 5).unwrap(), vec![0, 4]);
        let e = checked_ids("input_ids", &[0, 5], 5)
            .unwrap_err()
            .to_string();
        assert!(e.contains("input_ids holds 5, outside 0..5"), "{e}");
        let e = checked_ids("token_type_ids", &[-1], 2)
            .unwrap_err()
            .to_string();
        assert!(e.contains("token_type_ids holds -1"), "{e}");
    }
}
