//! Weight quantization of [`Linear`](crate::Linear) layers: symmetric, per block of
//! `block_size` consecutive input features of one output (a row of PyTorch's `[out, in]` weight,
//! as GGUF's Q8_0 / Q4_0), kept quantized in memory and dequantized to f32 when a layer runs.
//!
//! - **Int8** on the CPU backend (burn-flex with the CPU kernels on, blocks a multiple of 4) is
//!   packed once for `ipfs-accelerate-kernels`' integer GEMM ([`PackedInt8`]: 1 byte per weight
//!   and an f32 scale per block, 1.125 bytes per weight with blocks of 32, outputs padded to
//!   panels of 32); a forward quantizes its activations per block of the same size and sums
//!   exactly in 32-bit integers (W8A8, as ONNX Runtime's dynamic quantization), never making an
//!   f32 copy of the weight. Elsewhere it uses burn's quantized tensors (`Q8S`, block level, native `i8` store:
//!   1.125 bytes per weight), which every burn backend implements; the backend dequantizes it.
//! - **Int4** uses this crate's packed format on every backend: eight 4-bit values per 32-bit word
//!   of a backend int tensor plus an f32 scale per block (0.625 bytes per weight with blocks of
//!   32), unpacked with the backend's bitwise ops at each forward. burn 0.21's own 4-bit scheme is
//!   no saving on the CPU backend: burn-flex stores `Q4S` one value per byte and rejects the
//!   packed stores (`QuantStore::PackedU32`), and burn exposes no per-backend probe for them.
//!
//! Values are `round(w / scale)` clamped to ±127 (int8) or ±7 (int4) with `scale = max|block| /
//! 127` (or `/ 7`): round-to-nearest. Calibrated int4 weights ([`crate::gptq`]) are kept in the
//! same format from the codes and scales GPTQ chose ([`Int4Weight`], [`LinearWeight::from_int4`]);
//! their codes may use the whole 4-bit range -8..=7 (stored as `q + 8` in `0..=15`, which the
//! unpacking reads unchanged).

use std::str::FromStr;
use std::sync::Arc;

use burn::tensor::quantization::{BlockSize, QuantLevel, QuantScheme, QuantStore, QuantValue};
use burn::tensor::{backend::Backend, ElementConversion, Int, Tensor, TensorData};
use ipfs_accelerate_core::{Error, Result};
use ipfs_accelerate_kernels::{PackedBf16, PackedInt8};

use crate::ggml::GgmlWeight;

/// How the weights of linear layers are kept in memory. Embeddings and norms stay float.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WeightQuantization {
    /// Float weights as loaded (f32).
    #[default]
    None,
    /// 8-bit symmetric integers, one f32 scale per `block_size` consecutive weights.
    Int8 {
        /// Weights per scale.
        block_size: usize,
    },
    /// 4-bit symmetric integers (values -7..=7), one f32 scale per `block_size` weights.
    Int4 {
        /// Weights per scale.
        block_size: usize,
    },
}

/// The default block of int4: 32 weights per scale, as GGUF's Q4_0 (and the smallest int8 block
/// [`WeightQuantization::fitted`] falls back to).
pub const DEFAULT_BLOCK_SIZE: usize = 32;

/// The default block of int8 (`int8` without `:block`): 128 weights per scale. Weights and
/// activations are quantized per block, and each block costs the integer kernel a conversion and
/// two float operations per row and output: blocks of 128 run MiniLM's linear layers ~10 %
/// faster than blocks of 32 with embeddings as close to f32 (`tests/quantize.rs`). A layer whose
/// in-features 128 does not divide takes the largest of 64 or 32 that does
/// ([`WeightQuantization::fitted`]).
pub const DEFAULT_INT8_BLOCK_SIZE: usize = 128;

impl WeightQuantization {
    /// burn's scheme for this setting (`None` for float weights). [`LinearWeight`] stores int8
    /// with it and int4 in its own packed format (see the module documentation).
    pub fn scheme(&self) -> Option<QuantScheme> {
        let (value, block) = match *self {
            WeightQuantization::None => return None,
            WeightQuantization::Int8 { block_size } => (QuantValue::Q8S, block_size),
            WeightQuantization::Int4 { block_size } => (QuantValue::Q4S, block_size),
        };
        Some(
            QuantScheme::default()
                .with_value(value)
                .with_store(QuantStore::Native)
                .with_level(QuantLevel::Block(BlockSize::new([block as u8]))),
        )
    }

    /// Weights per scale (0 for float weights).
    pub fn block_size(&self) -> usize {
        match *self {
            WeightQuantization::None => 0,
            WeightQuantization::Int8 { block_size } | WeightQuantization::Int4 { block_size } => {
                block_size
            }
        }
    }

    /// Checks the block size: 1 to 255 weights (burn's block sizes are bytes).
    pub fn validate(&self) -> Result<()> {
        let b = self.block_size();
        if *self != WeightQuantization::None && !(1..=255).contains(&b) {
            return Err(Error::InvalidInput(format!(
                "quantization block size must be within 1..=255, got {b}"
            )));
        }
        Ok(())
    }

    /// Bytes `elements` weights take in memory as [`LinearWeight`] keeps them: 4 per float
    /// weight; int8 one byte per value, int4 a 32-bit word per eight values; plus a 4-byte scale
    /// per block.
    pub fn bytes(&self, elements: usize) -> usize {
        match *self {
            WeightQuantization::None => elements * 4,
            WeightQuantization::Int8 { block_size } => elements + elements.div_ceil(block_size) * 4,
            WeightQuantization::Int4 { block_size } => {
                elements.div_ceil(8) * 4 + elements.div_ceil(block_size) * 4
            }
        }
    }

    /// This setting for a layer of `in_features` inputs: int8 blocks that do not divide them are
    /// halved down to [`DEFAULT_BLOCK_SIZE`] until one does (`int8:128` keeps a 576-wide layer in
    /// blocks of 64); everything else unchanged ([`fits`](Self::fits) then says whether it can
    /// be kept so).
    pub fn fitted(self, in_features: usize) -> WeightQuantization {
        let WeightQuantization::Int8 { mut block_size } = self else {
            return self;
        };
        while block_size > DEFAULT_BLOCK_SIZE
            && block_size.is_multiple_of(2)
            && !in_features.is_multiple_of(block_size)
        {
            block_size /= 2;
        }
        WeightQuantization::Int8 { block_size }
    }

    /// Whether a linear layer with `in_features` inputs can be kept this way: float always,
    /// quantized when the in-features are a multiple of the block size (blocks never straddle
    /// two outputs).
    pub fn fits(&self, in_features: usize) -> bool {
        match self.block_size() {
            0 => true,
            b => in_features.is_multiple_of(b),
        }
    }
}

impl FromStr for WeightQuantization {
    type Err = Error;

    /// `none`, `int8`, `int4`, optionally with a block size: `int8:64`.
    fn from_str(s: &str) -> Result<Self> {
        let (kind, block) = match s.split_once(':') {
            Some((k, b)) => (
                k,
                b.parse::<usize>().map_err(|_| {
                    Error::InvalidInput(format!("`{s}`: the block size must be an integer"))
                })?,
            ),
            None if s.eq_ignore_ascii_case("int8") || s.eq_ignore_ascii_case("q8") => {
                (s, DEFAULT_INT8_BLOCK_SIZE)
            }
            None => (s, DEFAULT_BLOCK_SIZE),
        };
        let q = match kind.to_ascii_lowercase().as_str() {
            "none" | "f32" => WeightQuantization::None,
            "int8" | "q8" => WeightQuantization::Int8 { block_size: block },
            "int4" | "q4" => WeightQuantization::Int4 { block_size: block },
            _ => {
                return Err(Error::InvalidInput(format!(
                    "unknown quantization `{s}` (none, int8, int4, optionally `:block_size`)"
                )))
            }
        };
        q.validate()?;
        Ok(q)
    }
}

/// A linear weight as 4-bit codes with one f32 scale per block of `block_size` consecutive
/// in-features of one output: weight `[o, i]` is `codes[o * in_dim + i] * scales[(o * in_dim + i)
/// / block_size]`. Codes are within -8..=7 (round-to-nearest uses -7..=7). This is what
/// [`LinearWeight`] keeps for [`WeightQuantization::Int4`], before packing.
#[derive(Debug, Clone, PartialEq)]
pub struct Int4Weight {
    /// Out-features (rows).
    pub out_dim: usize,
    /// In-features (columns); a multiple of `block_size`.
    pub in_dim: usize,
    /// In-features per scale.
    pub block_size: usize,
    /// `out_dim * in_dim` codes, row-major.
    pub codes: Vec<i8>,
    /// One scale per block, row-major (`out_dim * in_dim / block_size`).
    pub scales: Vec<f32>,
}

impl Int4Weight {
    /// Symmetric round-to-nearest of row-major `[out, in]` `values`: `scale = max|block| / 7`
    /// (1 for an all-zero block), `code = round(w / scale)` clamped to ±7.
    pub fn round_to_nearest(
        values: &[f32],
        out_dim: usize,
        in_dim: usize,
        block_size: usize,
    ) -> Result<Self> {
        let q = WeightQuantization::Int4 { block_size };
        q.validate()?;
        if values.len() != out_dim * in_dim || !q.fits(in_dim) {
            return Err(Error::InvalidInput(format!(
                "{} values are not an [{out_dim}, {in_dim}] weight of whole blocks of {block_size}",
                values.len()
            )));
        }
        let mut codes = Vec::with_capacity(values.len());
        let mut scales = Vec::with_capacity(values.len() / block_size.max(1));
        for chunk in values.chunks(block_size) {
            let alpha = chunk.iter().fold(0f32, |m, v| m.max(v.abs()));
            let scale = if alpha > 0.0 && alpha.is_finite() {
                alpha / 7.0
            } else {
                1.0
            };
            scales.push(scale);
            codes.extend(chunk.iter().map(|&x| quantize_code(x, scale, -7)));
        }
        Ok(Int4Weight {
            out_dim,
            in_dim,
            block_size,
            codes,
            scales,
        })
    }

    /// Checks the sizes and the code range.
    pub fn validate(&self) -> Result<()> {
        WeightQuantization::Int4 {
            block_size: self.block_size,
        }
        .validate()?;
        let n = self.out_dim * self.in_dim;
        if self.codes.len() != n
            || !self.in_dim.is_multiple_of(self.block_size)
            || self.scales.len() != n / self.block_size
        {
            return Err(Error::InvalidInput(format!(
                "int4 weight [{}, {}] with blocks of {} has {} codes and {} scales",
                self.out_dim,
                self.in_dim,
                self.block_size,
                self.codes.len(),
                self.scales.len()
            )));
        }
        if let Some(c) = self.codes.iter().find(|c| !(-8..=7).contains(*c)) {
            return Err(Error::InvalidInput(format!(
                "int4 code {c} is outside -8..=7"
            )));
        }
        Ok(())
    }

    /// The weight values, row-major `[out, in]` (`code * scale`).
    pub fn dequantize(&self) -> Vec<f32> {
        self.codes
            .iter()
            .enumerate()
            .map(|(i, &c)| f32::from(c) * self.scales[i / self.block_size])
            .collect()
    }
}

/// Symmetric round-to-nearest int8 codes and scales of row-major `values` in blocks of `block`
/// consecutive values: `scale = max|block| / 127` (1 for an all-zero or non-finite block),
/// `code = round(w / scale)` within ±127.
fn round_to_nearest_int8(values: &[f32], block: usize) -> (Vec<i8>, Vec<f32>) {
    let mut codes = Vec::with_capacity(values.len());
    let mut scales = Vec::with_capacity(values.len() / block.max(1) + 1);
    for chunk in values.chunks(block.max(1)) {
        let alpha = chunk.iter().fold(0f32, |m, v| m.max(v.abs()));
        let scale = if alpha > 0.0 && alpha.is_finite() {
            alpha / 127.0
        } else {
            1.0
        };
        scales.push(scale);
        codes.extend(
            chunk
                .iter()
                .map(|&x| (x / scale).round().clamp(-127.0, 127.0) as i8),
        );
    }
    (codes, scales)
}

/// `round(x / scale)` clamped to `lo..=7`, computed in f32 as round-to-nearest does.
pub(crate) fn quantize_code(x: f32, scale: f32, lo: i8) -> i8 {
    (x / scale).round().clamp(f32::from(lo), 7.0) as i8
}

/// The weight matrix of a linear layer as it is kept in memory: f32, int8 blocks (burn quantized
/// tensor) or int4 blocks (packed nibbles). Clones share the storage.
#[derive(Debug, Clone)]
pub struct LinearWeight<B: Backend> {
    store: Store<B>,
    in_dim: usize,
    out_dim: usize,
    quantization: WeightQuantization,
    /// The weight's name in its source (set when a `VarBuilder` loads it), which calibration
    /// ([`crate::gptq`]) records its layer's inputs under.
    name: Option<Arc<str>>,
}

#[derive(Debug, Clone)]
enum Store<B: Backend> {
    /// f32 `[in, out]`, contiguous, so the matmul reads it row-major.
    Float(Tensor<B, 2>),
    /// A burn `Q8S` tensor `[out, in]`, blocks along the in-features.
    Int8(Tensor<B, 2>),
    /// Int8 codes packed for the CPU kernel (burn-flex only; see the module documentation).
    PackedInt8 {
        packed: Arc<PackedInt8>,
        device: B::Device,
    },
    /// A float weight kept as bf16 for the CPU kernel (inside
    /// [`crate::fast::with_bf16_linears`]).
    PackedBf16 {
        packed: Arc<PackedBf16>,
        device: B::Device,
    },
    /// Packed int4: value `i` of the row-major `[out, in]` matrix is nibble `i / words` of word
    /// `i % words` (planes of `words` values, so unpacking is eight shifts and a concatenation),
    /// stored as `q + 8` in `1..=15`; `scales` has one f32 per block.
    Int4 {
        words: Tensor<B, 1, Int>,
        scales: Tensor<B, 1>,
    },
    /// ggml blocks as the file stores them, for the CPU kernels (see [`crate::ggml`]).
    Ggml {
        weight: GgmlWeight,
        device: B::Device,
    },
}

impl<B: Backend> LinearWeight<B> {
    /// A float weight from PyTorch's `[out, in]` layout (kept transposed, made contiguous).
    pub fn float(weight_out_in: Tensor<B, 2>) -> Self {
        let [out_dim, in_dim] = weight_out_in.dims();
        let weight = weight_out_in.transpose();
        // Materialise the transposed layout once so every forward reads contiguous memory.
        let weight = Tensor::from_data(weight.to_data(), &weight.device());
        LinearWeight {
            store: Store::Float(weight),
            in_dim,
            out_dim,
            quantization: WeightQuantization::None,
            name: None,
        }
    }

    /// Builds the weight kept as `q` from row-major `[out, in]` f32 `values`. Quantized, the
    /// in-features must be a multiple of the block size ([`WeightQuantization::fits`]).
    pub fn from_out_in(
        values: &[f32],
        out_dim: usize,
        in_dim: usize,
        q: WeightQuantization,
        device: &B::Device,
    ) -> Result<Self> {
        q.validate()?;
        if values.len() != out_dim * in_dim {
            return Err(Error::InvalidInput(format!(
                "a linear weight of {} values is not [{out_dim}, {in_dim}]",
                values.len()
            )));
        }
        if !q.fits(in_dim) {
            return Err(Error::InvalidInput(format!(
                "a linear layer with {in_dim} in-features is not a multiple of the quantization \
                 block size {}",
                q.block_size()
            )));
        }
        crate::fast::warn_if_amx_refused();
        let store = match q {
            WeightQuantization::None if crate::fast::bf16_linears::<B>() => {
                match PackedBf16::new(values, out_dim, in_dim) {
                    Some(packed) => Store::PackedBf16 {
                        packed: Arc::new(packed),
                        device: device.clone(),
                    },
                    None => {
                        return Err(Error::InvalidInput(format!(
                            "a [{out_dim}, {in_dim}] linear weight is too large to pack as bf16"
                        )))
                    }
                }
            }
            WeightQuantization::None => {
                Store::Float(in_out_matrix(values, out_dim, in_dim, device))
            }
            WeightQuantization::Int8 { block_size } if crate::fast::int8_kernel::<B>() => {
                let (codes, scales) = round_to_nearest_int8(values, block_size);
                match PackedInt8::new(&codes, &scales, out_dim, in_dim, block_size) {
                    Some(packed) => Store::PackedInt8 {
                        packed: Arc::new(packed),
                        device: device.clone(),
                    },
                    None => Self::burn_int8(values, out_dim, in_dim, q, device)?,
                }
            }
            WeightQuantization::Int8 { .. } => Self::burn_int8(values, out_dim, in_dim, q, device)?,
            WeightQuantization::Int4 { block_size } => {
                let int4 = Int4Weight::round_to_nearest(values, out_dim, in_dim, block_size)?;
                return Self::from_int4(&int4, device);
            }
        };
        Ok(LinearWeight {
            store,
            in_dim,
            out_dim,
            quantization: q,
            name: None,
        })
    }

    /// Row-major `[out, in]` `values` as a burn `Q8S` tensor.
    fn burn_int8(
        values: &[f32],
        out_dim: usize,
        in_dim: usize,
        q: WeightQuantization,
        device: &B::Device,
    ) -> Result<Store<B>> {
        let scheme = q
            .scheme()
            .ok_or_else(|| Error::InvalidInput("int8 quantization has no burn scheme".into()))?;
        let w: Tensor<B, 2> =
            Tensor::from_data(TensorData::new(values.to_vec(), [out_dim, in_dim]), device);
        Ok(Store::Int8(w.quantize_dynamic(&scheme)))
    }

    /// Keeps `w`'s codes and scales as they are, packed (the [`WeightQuantization::Int4`] form,
    /// whatever chose them: round-to-nearest or a calibration such as [`crate::gptq`]).
    pub fn from_int4(w: &Int4Weight, device: &B::Device) -> Result<Self> {
        w.validate()?;
        let words = pack_codes(&w.codes);
        let (n, s) = (words.len(), w.scales.len());
        Ok(LinearWeight {
            store: Store::Int4 {
                words: Tensor::from_data(TensorData::new(words, [n]), device),
                scales: Tensor::from_data(TensorData::new(w.scales.clone(), [s]), device),
            },
            in_dim: w.in_dim,
            out_dim: w.out_dim,
            quantization: WeightQuantization::Int4 {
                block_size: w.block_size,
            },
            name: None,
        })
    }

    /// Keeps `weight`'s ggml blocks as they are (see [`crate::ggml`]); its rows are the
    /// out-features. [`quantization`](Self::quantization) reads `None`: no
    /// [`WeightQuantization`] describes it ([`ggml`](Self::ggml) does).
    pub fn from_ggml(weight: GgmlWeight, device: &B::Device) -> Self {
        LinearWeight {
            in_dim: weight.k(),
            out_dim: weight.n(),
            store: Store::Ggml {
                weight,
                device: device.clone(),
            },
            quantization: WeightQuantization::None,
            name: None,
        }
    }

    /// The ggml blocks, when it is kept that way.
    pub fn ggml(&self) -> Option<&GgmlWeight> {
        match &self.store {
            Store::Ggml { weight, .. } => Some(weight),
            _ => None,
        }
    }

    /// The same weight (sharing the storage) recorded under `name`, its name in the source.
    pub fn with_name(mut self, name: &str) -> Self {
        self.name = Some(Arc::from(name));
        self
    }

    /// Its name in the source, when a `VarBuilder` loaded it.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// This weight kept as `q` instead (from a float weight; a quantized one is an error).
    pub fn quantized(&self, q: WeightQuantization) -> Result<Self> {
        if self.quantization != WeightQuantization::None {
            return Err(Error::InvalidInput(
                "the layer is already quantized: quantize float weights only".into(),
            ));
        }
        if q == WeightQuantization::None {
            return Ok(self.clone());
        }
        let values = self.to_out_in_f32()?;
        let mut kept = Self::from_out_in(&values, self.out_dim, self.in_dim, q, &self.device())?;
        kept.name = self.name.clone();
        Ok(kept)
    }

    pub(crate) fn device(&self) -> B::Device {
        match &self.store {
            Store::Float(t) | Store::Int8(t) => t.device(),
            Store::Int4 { scales, .. } => scales.device(),
            Store::PackedInt8 { device, .. }
            | Store::PackedBf16 { device, .. }
            | Store::Ggml { device, .. } => device.clone(),
        }
    }

    /// In-features.
    pub fn in_dim(&self) -> usize {
        self.in_dim
    }

    /// Out-features.
    pub fn out_dim(&self) -> usize {
        self.out_dim
    }

    /// How it is kept.
    pub fn quantization(&self) -> WeightQuantization {
        self.quantization
    }

    /// Bytes of the tensors it holds (element count times the stored element size, plus the f32
    /// scales of a quantized weight).
    pub fn bytes(&self) -> usize {
        let size = |numel: usize, dtype: burn::tensor::DType| numel * dtype.size();
        match &self.store {
            Store::Float(t) => size(t.shape().num_elements(), t.dtype()),
            Store::Int8(t) => {
                let n = t.shape().num_elements();
                size(n, t.dtype()) + n.div_ceil(self.quantization.block_size()) * 4
            }
            Store::Int4 { words, scales } => {
                size(words.shape().num_elements(), words.dtype())
                    + size(scales.shape().num_elements(), scales.dtype())
            }
            Store::PackedInt8 { packed, .. } => packed.bytes(),
            Store::PackedBf16 { packed, .. } => packed.bytes(),
            Store::Ggml { weight, .. } => weight.bytes(),
        }
    }

    /// The float weight kept as bf16 for the CPU kernel, when it is kept that way.
    pub fn packed_bf16(&self) -> Option<&PackedBf16> {
        match &self.store {
            Store::PackedBf16 { packed, .. } => Some(packed),
            _ => None,
        }
    }

    /// The int8 weight packed for the CPU kernel, when it is kept that way.
    pub fn packed_int8(&self) -> Option<&PackedInt8> {
        match &self.store {
            Store::PackedInt8 { packed, .. } => Some(packed),
            _ => None,
        }
    }

    /// The f32 `[in, out]` matrix a forward multiplies by (dequantized when quantized).
    pub fn matrix(&self) -> Tensor<B, 2> {
        match &self.store {
            Store::Float(t) => t.clone(),
            Store::Ggml { weight, device } => weight.matrix(device),
            Store::Int8(q) => q.clone().dequantize().transpose(),
            Store::PackedInt8 { packed, device } => {
                let (codes, scales) = packed.unpack();
                let blocks = self.in_dim.div_ceil(packed.block()).max(1);
                let values: Vec<f32> = codes
                    .iter()
                    .enumerate()
                    .map(|(j, &c)| {
                        let (o, i) = (j / self.in_dim, j % self.in_dim);
                        f32::from(c) * scales[o * blocks + i / packed.block()]
                    })
                    .collect();
                in_out_matrix(&values, self.out_dim, self.in_dim, device)
            }
            Store::PackedBf16 { packed, device } => {
                in_out_matrix(&packed.unpack(), self.out_dim, self.in_dim, device)
            }
            Store::Int4 { words, scales } => {
                let n = self.in_dim * self.out_dim;
                let block = self.quantization.block_size().max(1);
                let planes: Vec<Tensor<B, 1, Int>> = (0..8)
                    .map(|k| {
                        words
                            .clone()
                            .bitwise_right_shift_scalar((4 * k).elem::<B::IntElem>())
                            .bitwise_and_scalar(15.elem::<B::IntElem>())
                    })
                    .collect();
                let values = Tensor::cat(planes, 0)
                    .narrow(0, 0, n)
                    .float()
                    .sub_scalar(8.0);
                let blocks = n / block;
                values
                    .reshape([blocks, block])
                    .mul(scales.clone().reshape([blocks, 1]))
                    .reshape([self.out_dim, self.in_dim])
                    .transpose()
            }
        }
    }

    /// The weight as row-major `[out, in]` f32 values (dequantized when quantized).
    pub fn to_out_in_f32(&self) -> Result<Vec<f32>> {
        to_f32_vec(self.matrix().transpose())
    }
}

/// The `[in, out]` matrix a forward multiplies by, from row-major `[out, in]` `values`.
pub(crate) fn in_out_matrix<B: Backend>(
    values: &[f32],
    out_dim: usize,
    in_dim: usize,
    device: &B::Device,
) -> Tensor<B, 2> {
    let mut t = vec![0f32; values.len()];
    for (o, row) in values.chunks_exact(in_dim.max(1)).enumerate() {
        for (i, &v) in row.iter().enumerate() {
            t[i * out_dim + o] = v;
        }
    }
    Tensor::from_data(TensorData::new(t, [in_dim, out_dim]), device)
}

/// Reads a float tensor back to the host as f32 values.
pub(crate) fn to_f32_vec<B: Backend, const D: usize>(t: Tensor<B, D>) -> Result<Vec<f32>> {
    t.try_into_data()
        .map_err(|e| Error::Compute(format!("reading a weight back: {e:?}")))?
        .convert::<f32>()
        .to_vec::<f32>()
        .map_err(|e| Error::Compute(format!("reading a weight back: {e:?}")))
}

/// Packs int4 `codes` (-8..=7, row-major) as the planar words described on [`LinearWeight`]:
/// `code + 8` in nibble `i / words` of word `i % words`.
fn pack_codes(codes: &[i8]) -> Vec<i32> {
    let words = codes.len().div_ceil(8).max(1);
    let mut packed = vec![0u32; words];
    for (i, &c) in codes.iter().enumerate() {
        let q = (i32::from(c) + 8) as u32 & 15;
        packed[i % words] |= q << (4 * (i / words));
    }
    packed.into_iter().map(|w| w as i32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_counts_bytes() {
        assert_eq!(
            "int8".parse::<WeightQuantization>().unwrap(),
            WeightQuantization::Int8 { block_size: 128 }
        );
        assert_eq!(
            "int4".parse::<WeightQuantization>().unwrap(),
            WeightQuantization::Int4 { block_size: 32 }
        );
        assert_eq!(
            "int4:64".parse::<WeightQuantization>().unwrap(),
            WeightQuantization::Int4 { block_size: 64 }
        );
        assert!("int8:0".parse::<WeightQuantization>().is_err());
        assert!("int8:x".parse::<WeightQuantization>().is_err());
        assert!("fp8".parse::<WeightQuantization>().is_err());
        assert_eq!(WeightQuantization::None.bytes(64), 256);
        assert_eq!(
            WeightQuantization::Int8 { block_size: 32 }.bytes(64),
            64 + 8
        );
        assert_eq!(
            WeightQuantization::Int4 { block_size: 32 }.bytes(64),
            32 + 8
        );
        assert!(WeightQuantization::Int4 { block_size: 32 }.fits(64));
        let int8: WeightQuantization = "int8".parse().unwrap();
        assert_eq!(int8, WeightQuantization::Int8 { block_size: 128 });
        assert_eq!(int8.fitted(384), int8);
        assert_eq!(
            int8.fitted(576),
            WeightQuantization::Int8 { block_size: 64 }
        );
        assert_eq!(int8.fitted(96), WeightQuantization::Int8 { block_size: 32 });
        assert!(!int8.fitted(100).fits(100));
        let int4 = WeightQuantization::Int4 { block_size: 32 };
        assert_eq!(int4.fitted(48), int4);
        assert!(!WeightQuantization::Int4 { block_size: 32 }.fits(48));
        assert!(WeightQuantization::None.fits(7));
    }

    type Flex = burn_flex::Flex;

    /// A `[out, in]` weight with values of several magnitudes, zero blocks and an odd size.
    fn weight(out_dim: usize, in_dim: usize) -> Vec<f32> {
        (0..out_dim * in_dim)
            .map(|i| {
                if i / in_dim == 1 {
                    0.0
                } else {
                    ((i as f32) * 0.731).sin() * (1.0 + (i % 7) as f32)
                }
            })
            .collect()
    }

    #[test]
    fn kept_weights_round_trip_within_half_a_step_and_take_the_stated_bytes() {
        let device = Default::default();
        // 5 × 24: the packed int4 words (15) do not fill a whole plane evenly.
        let (out_dim, in_dim) = (5, 24);
        let w = weight(out_dim, in_dim);
        for (q, steps) in [
            (WeightQuantization::None, 0.0),
            (WeightQuantization::Int8 { block_size: 8 }, 127.0),
            (WeightQuantization::Int4 { block_size: 8 }, 7.0),
            (WeightQuantization::Int4 { block_size: 24 }, 7.0),
        ] {
            let kept = LinearWeight::<Flex>::from_out_in(&w, out_dim, in_dim, q, &device).unwrap();
            let back = kept.to_out_in_f32().unwrap();
            let block = q.block_size().max(1);
            for (b, (orig, got)) in w.chunks(block).zip(back.chunks(block)).enumerate() {
                let alpha = orig.iter().fold(0f32, |m, v| m.max(v.abs()));
                // Rounding to the nearest step: at most half a step (scale / 2) off.
                let tol = if steps > 0.0 {
                    alpha / steps / 2.0 + 1e-6
                } else {
                    0.0
                };
                for (x, y) in orig.iter().zip(got) {
                    assert!((x - y).abs() <= tol, "{q:?} block {b}: {x} vs {y}");
                }
            }
            match kept.packed_int8() {
                // Packed for the CPU kernel: panels of 16 outputs, VNNI offsets.
                Some(packed) => assert_eq!(kept.bytes(), packed.bytes(), "{q:?}"),
                None => assert_eq!(kept.bytes(), q.bytes(out_dim * in_dim), "{q:?}"),
            }
            // The forward matrix is the transposed weight.
            let m = to_f32_vec(kept.matrix()).unwrap();
            assert_eq!(m[out_dim + 2], back[2 * in_dim + 1], "{q:?}");
        }
        // Int4 really is smaller than int8 (0.625 vs 1.125 bytes per weight at block 32).
        let (o, i) = (64, 256);
        let w = weight(o, i);
        let bytes = |q| {
            LinearWeight::<Flex>::from_out_in(&w, o, i, q, &device)
                .unwrap()
                .bytes()
        };
        assert_eq!(bytes(WeightQuantization::None), o * i * 4);
        // Int8: 1.125 bytes per weight, in burn's format and packed for the CPU kernel alike (64
        // outputs fill whole panels).
        let int8 = bytes(WeightQuantization::Int8 { block_size: 32 });
        assert!(int8 >= o * i * 9 / 8 && int8 <= o * i * 5 / 4, "{int8}");
        assert_eq!(
            bytes(WeightQuantization::Int4 { block_size: 32 }),
            o * i * 5 / 8
        );
    }

    #[test]
    fn unfit_shapes_and_double_quantization_are_typed_errors() {
        let device = Default::default();
        let w = weight(3, 12);
        let q = WeightQuantization::Int4 { block_size: 8 };
        let err = LinearWeight::<Flex>::from_out_in(&w, 3, 12, q, &device).unwrap_err();
        assert!(err.to_string().contains("block size"), "{err}");
        let err = LinearWeight::<Flex>::from_out_in(&w, 4, 12, WeightQuantization::None, &device)
            .unwrap_err();
        assert!(matches!(err, Error::InvalidInput(_)), "{err}");
        let kept = LinearWeight::<Flex>::from_out_in(
            &w,
            3,
            12,
            WeightQuantization::Int8 { block_size: 4 },
            &device,
        )
        .unwrap();
        assert!(kept.quantized(q).is_err());
    }
}
