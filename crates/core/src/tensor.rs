//! Host tensors: shape + dtype + shared bytes, the currency between files, models and callers.

use std::collections::BTreeMap;
use std::fmt;

use bytes::Bytes;
use half::{bf16, f16};

use crate::{Error, Result};

/// Element types a [`HostTensor`] can hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// 64-bit float.
    F64,
    /// 32-bit float.
    F32,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    BF16,
    /// 64-bit signed integer.
    I64,
    /// 32-bit signed integer.
    I32,
    /// 8-bit signed integer.
    I8,
    /// 8-bit unsigned integer.
    U8,
    /// Boolean stored as one byte.
    Bool,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::I8 | DType::U8 | DType::Bool => 1,
        }
    }

    /// Whether this is a floating-point type.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F64 | DType::F32 | DType::F16 | DType::BF16)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            DType::F64 => "f64",
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I64 => "i64",
            DType::I32 => "i32",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::Bool => "bool",
        };
        f.write_str(s)
    }
}

/// A tensor on the host: a shape, a dtype and little-endian bytes that may be shared
/// (for example a zero-copy slice of a memory-mapped weight file).
#[derive(Clone, PartialEq)]
pub struct HostTensor {
    shape: Vec<usize>,
    dtype: DType,
    data: Bytes,
}

impl fmt::Debug for HostTensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostTensor")
            .field("shape", &self.shape)
            .field("dtype", &self.dtype)
            .field("bytes", &self.data.len())
            .finish()
    }
}

impl HostTensor {
    /// Wraps bytes as a tensor, checking that their length matches `shape` and `dtype`.
    pub fn from_bytes(
        name: &str,
        shape: Vec<usize>,
        dtype: DType,
        data: Bytes,
    ) -> Result<HostTensor> {
        let expected = shape
            .iter()
            .try_fold(dtype.size(), |acc, &d| acc.checked_mul(d));
        if expected != Some(data.len()) {
            return Err(Error::BadTensorBytes {
                name: name.to_string(),
                len: data.len(),
                shape,
                dtype,
            });
        }
        Ok(HostTensor { shape, dtype, data })
    }

    /// A float32 tensor from values. Panics never: a length mismatch is an error.
    pub fn from_f32(shape: Vec<usize>, values: &[f32]) -> Result<HostTensor> {
        Self::from_bytes(
            "f32 values",
            shape,
            DType::F32,
            Bytes::copy_from_slice(bytemuck::cast_slice(values)),
        )
    }

    /// A tensor owning `values` (no copy), whose element type `dtype` names (a length or element
    /// size that does not fit `shape` and `dtype` is an error).
    pub fn from_vec<T: bytemuck::Pod + Send + Sync>(
        shape: Vec<usize>,
        dtype: DType,
        values: Vec<T>,
    ) -> Result<HostTensor> {
        /// Lets `Bytes` own a vector of plain values as its little-endian bytes.
        struct PodBytes<T>(Vec<T>);
        impl<T: bytemuck::Pod> AsRef<[u8]> for PodBytes<T> {
            fn as_ref(&self) -> &[u8] {
                bytemuck::cast_slice(&self.0)
            }
        }
        if std::mem::size_of::<T>() != dtype.size() {
            return Err(Error::BadTensorBytes {
                name: format!("{} values", std::any::type_name::<T>()),
                len: values.len() * std::mem::size_of::<T>(),
                shape,
                dtype,
            });
        }
        Self::from_bytes(
            "owned values",
            shape,
            dtype,
            Bytes::from_owner(PodBytes(values)),
        )
    }

    /// An int64 tensor from values.
    pub fn from_i64(shape: Vec<usize>, values: &[i64]) -> Result<HostTensor> {
        Self::from_bytes(
            "i64 values",
            shape,
            DType::I64,
            Bytes::copy_from_slice(bytemuck::cast_slice(values)),
        )
    }

    /// A float64 tensor from values.
    pub fn from_f64(shape: Vec<usize>, values: &[f64]) -> Result<HostTensor> {
        Self::from_bytes(
            "f64 values",
            shape,
            DType::F64,
            Bytes::copy_from_slice(bytemuck::cast_slice(values)),
        )
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The raw little-endian bytes (shared, cheap to clone).
    pub fn bytes(&self) -> &Bytes {
        &self.data
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Reinterprets the shape without touching the data (same element count).
    pub fn reshape(&self, shape: Vec<usize>) -> Result<HostTensor> {
        if shape.iter().product::<usize>() != self.numel() {
            return Err(Error::InvalidInput(format!(
                "cannot reshape {:?} into {:?}",
                self.shape, shape
            )));
        }
        Ok(HostTensor {
            shape,
            dtype: self.dtype,
            data: self.data.clone(),
        })
    }

    /// Checks that a float tensor holds no NaN or infinite value ([`Error::NonFinite`] naming
    /// `name` otherwise); integer tensors always pass.
    pub fn check_finite(&self, name: &str) -> Result<()> {
        let b = &self.data[..];
        // Non-finite values counted on the bits, without converting (all-ones exponents).
        let halves = |exponent: u16| {
            b.chunks_exact(2)
                .filter(|c| u16::from_le_bytes([c[0], c[1]]) & exponent == exponent)
                .count()
        };
        let count = match self.dtype {
            DType::F32 => b
                .chunks_exact(4)
                .filter(|c| !f32::from_le_bytes([c[0], c[1], c[2], c[3]]).is_finite())
                .count(),
            DType::F64 => b
                .chunks_exact(8)
                .filter(|c| !(f64::from_le_bytes(arr8(c)) as f32).is_finite())
                .count(),
            DType::F16 => halves(0x7C00),
            DType::BF16 => halves(0x7F80),
            _ => 0,
        };
        if count == 0 {
            return Ok(());
        }
        check_finite(&self.to_f32_vec(), name)
    }

    /// The values as an f32 slice without a copy, when the tensor holds f32 (and the bytes are
    /// aligned for it, on a little-endian machine); `None` otherwise ([`Self::to_f32_vec`] then).
    pub fn as_f32(&self) -> Option<&[f32]> {
        if self.dtype != DType::F32 || cfg!(target_endian = "big") {
            return None;
        }
        bytemuck::try_cast_slice(&self.data[..]).ok()
    }

    /// Values converted to f32 (floats are rounded, integers cast).
    pub fn to_f32_vec(&self) -> Vec<f32> {
        let b = &self.data[..];
        match self.dtype {
            DType::F32 => read_le(b, 4, |c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            DType::F64 => read_le(b, 8, |c| f64::from_le_bytes(arr8(c)) as f32),
            DType::F16 => read_le(b, 2, |c| f16::from_le_bytes([c[0], c[1]]).to_f32()),
            DType::BF16 => read_le(b, 2, |c| bf16::from_le_bytes([c[0], c[1]]).to_f32()),
            DType::I64 => read_le(b, 8, |c| i64::from_le_bytes(arr8(c)) as f32),
            DType::I32 => read_le(b, 4, |c| {
                i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f32
            }),
            DType::I8 => b.iter().map(|&v| v as i8 as f32).collect(),
            DType::U8 | DType::Bool => b.iter().map(|&v| v as f32).collect(),
        }
    }

    /// Values converted to f64.
    pub fn to_f64_vec(&self) -> Vec<f64> {
        match self.dtype {
            DType::F64 => read_le(&self.data, 8, |c| f64::from_le_bytes(arr8(c))),
            DType::I64 => read_le(&self.data, 8, |c| i64::from_le_bytes(arr8(c)) as f64),
            _ => self.to_f32_vec().into_iter().map(f64::from).collect(),
        }
    }

    /// Integer values as i64; float tensors are an error (they would silently truncate).
    pub fn to_i64_vec(&self) -> Result<Vec<i64>> {
        let b = &self.data[..];
        Ok(match self.dtype {
            DType::I64 => read_le(b, 8, |c| i64::from_le_bytes(arr8(c))),
            DType::I32 => read_le(b, 4, |c| {
                i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64
            }),
            DType::I8 => b.iter().map(|&v| v as i8 as i64).collect(),
            DType::U8 | DType::Bool => b.iter().map(|&v| v as i64).collect(),
            other => {
                return Err(Error::UnsupportedDType {
                    name: "integer input".into(),
                    dtype: other,
                    context: "is not an integer type".into(),
                })
            }
        })
    }

    /// The values as token ids (integer tensors only); a negative or too large value is
    /// [`Error::InvalidInput`].
    pub fn to_token_ids(&self) -> Result<Vec<u32>> {
        self.to_i64_vec()?
            .into_iter()
            .map(|v| {
                u32::try_from(v).map_err(|_| Error::InvalidInput(format!("{v} is not a token id")))
            })
            .collect()
    }
}

fn arr8(c: &[u8]) -> [u8; 8] {
    [c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]
}

fn read_le<T>(bytes: &[u8], width: usize, f: impl Fn(&[u8]) -> T) -> Vec<T> {
    bytes.chunks_exact(width).map(f).collect()
}

/// Named tensors, ordered by name.
pub type TensorMap = BTreeMap<String, HostTensor>;

/// The token inputs of a text model, row-major `[batch, seq]`, read from named host tensors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenBatch {
    /// Rows.
    pub batch: usize,
    /// Columns (padded length).
    pub seq: usize,
    /// Token ids.
    pub input_ids: Vec<i64>,
    /// 1 for tokens, 0 for padding.
    pub attention_mask: Vec<i64>,
}

impl TokenBatch {
    /// `input_ids` and `attention_mask` `[batch, seq]`, as [`TokenBatch::from_tensors`] reads
    /// them (the inputs of a text encoder's runner).
    pub fn to_tensors(&self) -> Result<TensorMap> {
        let shape = vec![self.batch, self.seq];
        Ok(TensorMap::from([
            (
                "input_ids".to_string(),
                HostTensor::from_i64(shape.clone(), &self.input_ids)?,
            ),
            (
                "attention_mask".to_string(),
                HostTensor::from_i64(shape, &self.attention_mask)?,
            ),
        ]))
    }

    /// `input_ids` `[batch, seq]` (required) and `attention_mask` of the same shape (ones when
    /// absent).
    pub fn from_tensors(inputs: &TensorMap) -> Result<Self> {
        let ids = inputs
            .get("input_ids")
            .ok_or_else(|| Error::InvalidInput("missing input `input_ids`".into()))?;
        let &[batch, seq] = ids.shape() else {
            return Err(Error::InvalidInput(format!(
                "input_ids must be [batch, seq], got {:?}",
                ids.shape()
            )));
        };
        let mut tokens = TokenBatch {
            batch,
            seq,
            input_ids: ids.to_i64_vec()?,
            attention_mask: Vec::new(),
        };
        tokens.attention_mask = tokens.optional(inputs, "attention_mask", 1)?;
        Ok(tokens)
    }

    /// Another `[batch, seq]` input (`token_type_ids`, ...), checked against the ids' shape;
    /// `fill` everywhere when absent.
    pub fn optional(&self, inputs: &TensorMap, name: &str, fill: i64) -> Result<Vec<i64>> {
        match inputs.get(name) {
            Some(t) if t.shape() == [self.batch, self.seq] => t.to_i64_vec(),
            Some(t) => Err(Error::InvalidInput(format!(
                "{name} has shape {:?}, input_ids [{}, {}]",
                t.shape(),
                self.batch,
                self.seq
            ))),
            None => Ok(vec![fill; self.batch * self.seq]),
        }
    }
}

/// A weight matrix in a ggml block format as the file stores it, handed over without
/// dequantizing ([`TensorSource::quantized_blocks`]).
#[derive(Debug, Clone)]
pub struct QuantizedBlocks {
    /// The ggml type id (`enum ggml_type`, as GGUF files write it).
    pub ggml_type: u32,
    /// Row-major `[rows, cols]`: each row is `cols / block_size` consecutive blocks, at any
    /// alignment (usually a zero-copy slice of a memory-mapped file).
    pub data: Bytes,
    /// `[rows, cols]`: PyTorch's `[out, in]` for a linear weight, `[vocab, dim]` for an
    /// embedding table.
    pub shape: [usize; 2],
}

/// Anything that serves named weight tensors: a safetensors file, a set of shards, a GGUF file.
pub trait TensorSource: Send + Sync {
    /// A short description (usually the file path) used in error messages.
    fn source_name(&self) -> String;
    /// Whether a tensor of this name exists.
    fn contains(&self, name: &str) -> bool;
    /// The tensor's shape, if present, without reading its data.
    fn shape_of(&self, name: &str) -> Option<Vec<usize>>;
    /// The tensor itself. Missing tensors are [`Error::MissingTensor`].
    fn tensor(&self, name: &str) -> Result<HostTensor>;
    /// Every tensor name.
    fn names(&self) -> Vec<String>;
    /// The tensor a model asks for with the shape it expects. Stored sources ignore `expected`
    /// (the caller checks it); generated ones (random initialisation for benchmarks) make a tensor
    /// of that shape.
    fn tensor_shaped(&self, name: &str, expected: &[usize]) -> Result<HostTensor> {
        let _ = expected;
        self.tensor(name)
    }
    /// A key that names the content: two sources with the same identity serve the same tensors
    /// under the same names (weight files: their canonical paths, sizes and modification times).
    /// Loaders share the weights of sources with equal identities; `None` (the default, for
    /// generated, in-memory or renaming sources) is never shared.
    fn identity(&self) -> Option<String> {
        None
    }
    /// The 2-D weight `name` as raw ggml blocks, when the source stores it quantized and can hand
    /// the blocks over as they are (GGUF); `Ok(None)` (the default) when it cannot, and the
    /// caller falls back to [`tensor`](Self::tensor). The values are those `tensor` serves.
    fn quantized_blocks(&self, name: &str) -> Result<Option<QuantizedBlocks>> {
        let _ = name;
        Ok(None)
    }
    /// [`quantized_blocks`](Self::quantized_blocks) of a weight the model expects to be `shape`:
    /// stored sources ignore the shape (the caller checks it); generated ones (random weights in
    /// a ggml format) make blocks of that shape.
    fn quantized_blocks_shaped(
        &self,
        name: &str,
        shape: [usize; 2],
    ) -> Result<Option<QuantizedBlocks>> {
        let _ = shape;
        self.quantized_blocks(name)
    }
}

/// Checks `values` (of an output described by `what`) for NaN and infinities
/// ([`Error::NonFinite`]).
pub fn check_finite(values: &[f32], what: &str) -> Result<()> {
    let count = values.iter().filter(|v| !v.is_finite()).count();
    if count == 0 {
        return Ok(());
    }
    Err(Error::NonFinite {
        output: what.to_string(),
        count,
        total: values.len(),
    })
}

/// A loaded model that maps named input tensors to named output tensors; the uniform interface
/// the conformance runner and the benchmark runner drive every family through. `Sync`: every call
/// takes `&self`, so one loaded model serves many threads.
pub trait ModelRunner: Send + Sync {
    /// The family (`bert`, `t5`, ...).
    fn family(&self) -> &str;
    /// The backend it runs on.
    fn backend(&self) -> crate::BackendKind;
    /// Runs the model on named inputs (HF names: `input_ids`, `attention_mask`, ...) and returns
    /// every output it computes under HF's names.
    fn run(&self, inputs: &TensorMap) -> Result<TensorMap>;
    /// Where the work of the runs so far actually executed, when the backend can tell (ONNX
    /// Runtime: nodes per execution provider); `None` otherwise.
    fn placement(&self) -> Option<String> {
        None
    }
    /// The engine behind the backend when it is not the family's burn model (`cublas`: the
    /// cuBLAS encoder of the `cuda` feature); benchmarks label their points with it.
    fn engine(&self) -> Option<&str> {
        None
    }
    /// Device memory this runner's engine holds, when it manages its own (an [`engine`](Self::engine)
    /// outside burn); `None` defers to the backend's allocator report.
    fn device_memory_in_use(&self) -> Option<u64> {
        None
    }
    /// Greedy generation of exactly `max_new_tokens` new tokens (no stop token, the KV cache
    /// where the family has one) for the one row of `inputs` (what [`run`](Self::run) takes:
    /// `input_ids` for an encoder-decoder, `input_features` for Whisper, `input_ids` and
    /// `pixel_values` for LLaVA), each new token handed to `on_token` as it is chosen. The
    /// benchmark runner times it (time to first token, decode speed). Families that do not
    /// generate answer [`Error::InvalidInput`].
    fn generate_ids(
        &self,
        inputs: &TensorMap,
        max_new_tokens: usize,
        on_token: &mut dyn FnMut(u32) -> std::ops::ControlFlow<()>,
    ) -> Result<Vec<u32>> {
        let _ = (inputs, max_new_tokens, on_token);
        Err(Error::InvalidInput(format!(
            "{} does not generate tokens",
            self.family()
        )))
    }
}

/// A boxed runner (an engine chosen at load time) is a runner: every method is forwarded.
impl<R: ModelRunner + ?Sized> ModelRunner for Box<R> {
    fn family(&self) -> &str {
        (**self).family()
    }
    fn backend(&self) -> crate::BackendKind {
        (**self).backend()
    }
    fn run(&self, inputs: &TensorMap) -> Result<TensorMap> {
        (**self).run(inputs)
    }
    fn placement(&self) -> Option<String> {
        (**self).placement()
    }
    fn engine(&self) -> Option<&str> {
        (**self).engine()
    }
    fn device_memory_in_use(&self) -> Option<u64> {
        (**self).device_memory_in_use()
    }
    fn generate_ids(
        &self,
        inputs: &TensorMap,
        max_new_tokens: usize,
        on_token: &mut dyn FnMut(u32) -> std::ops::ControlFlow<()>,
    ) -> Result<Vec<u32>> {
        (**self).generate_ids(inputs, max_new_tokens, on_token)
    }
}

/// A model family that can load a checkpoint folder (HF `config.json` plus weights) as a
/// [`ModelRunner`] on any burn backend. Each family crate implements it once on a unit struct; the
/// facade's conformance and benchmark runners dispatch to it by [`Family::NAME`].
pub trait Family {
    /// The family name as used in fixture folders and on the command line (`bert`, `llama`, ...).
    const NAME: &'static str;
    /// Loads the checkpoint in `dir` (its `config.json` and `model.safetensors` or shards) on `device`;
    /// `kind` is the backend the device belongs to, reported by [`ModelRunner::backend`].
    fn load<B: burn::tensor::backend::Backend>(
        dir: &std::path::Path,
        device: &B::Device,
        kind: crate::BackendKind,
    ) -> Result<Box<dyn ModelRunner>>;
}

#[cfg(test)]
mod owned_vector_tests {
    use super::*;

    #[test]
    fn owned_vectors_become_tensors_of_their_dtype_only() {
        let t = HostTensor::from_vec(vec![2], DType::F32, vec![1.5f32, -2.0]).unwrap();
        assert_eq!(t.to_f32_vec(), vec![1.5, -2.0]);
        let h = vec![half::f16::from_f32(0.5); 3];
        let t = HostTensor::from_vec(vec![3], DType::F16, h).unwrap();
        assert_eq!(t.to_f32_vec(), vec![0.5; 3]);
        assert!(HostTensor::from_vec(vec![2], DType::F16, vec![1.0f32, 2.0]).is_err());
        assert!(HostTensor::from_vec(vec![3], DType::F32, vec![1.0f32, 2.0]).is_err());
    }

    #[test]
    fn non_finite_values_are_found_in_every_float_dtype() {
        let values = [0.5f32, 1e38, -1e-8, 65504.0];
        let halves = |f: fn(f32) -> u16| values.iter().map(|&v| f(v)).collect::<Vec<u16>>();
        let f16s = halves(|v| half::f16::from_f32(v).to_bits());
        let bf16s = halves(|v| half::bf16::from_f32(v).to_bits());
        let tensors = [
            HostTensor::from_f32(vec![4], &values).unwrap(),
            HostTensor::from_vec(vec![4], DType::F16, f16s).unwrap(),
            HostTensor::from_vec(vec![4], DType::BF16, bf16s).unwrap(),
            HostTensor::from_f64(vec![4], &values.map(f64::from)).unwrap(),
        ];
        // 1e38 overflows f16 to infinity; the others hold it.
        let finite = [true, false, true, true];
        for (t, ok) in tensors.iter().zip(finite) {
            assert_eq!(t.check_finite("x").is_ok(), ok, "{}", t.dtype());
        }
        for nan in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let bits = |f: fn(f32) -> u16| vec![f(1.0), f(nan)];
            let t = [
                HostTensor::from_f32(vec![2], &[1.0, nan]).unwrap(),
                HostTensor::from_vec(
                    vec![2],
                    DType::F16,
                    bits(|v| half::f16::from_f32(v).to_bits()),
                )
                .unwrap(),
                HostTensor::from_vec(
                    vec![2],
                    DType::BF16,
                    bits(|v| half::bf16::from_f32(v).to_bits()),
                )
                .unwrap(),
                HostTensor::from_f64(vec![2], &[1.0, f64::from(nan)]).unwrap(),
            ];
            for t in &t {
                let e = t.check_finite("x").unwrap_err().to_string();
                assert!(e.contains('x'), "{e}");
            }
        }
        assert!(HostTensor::from_f64(vec![1], &[1e300])
            .unwrap()
            .check_finite("x")
            .is_err());
    }
}
