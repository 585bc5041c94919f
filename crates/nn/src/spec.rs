//! Reading a checkpoint's trunk into the backend-neutral [`EncoderSpec`](ipfs_accelerate_core::EncoderSpec) pieces
//! (`ipfs_accelerate_core::encoder`), through the same name tables the burn modules load with, so
//! a family's names are written once for both executors.

use ipfs_accelerate_core::{
    DType, DecoderSpec, DenseWeights, EncoderLayerWeights, Error, GatedActivation, NormWeights,
    QuantizedBlocks, Result, TensorSource,
};
/// The ggml block formats ([`quantize_dense`]'s target).
pub use ipfs_accelerate_kernels::BlockType;
use ipfs_accelerate_kernels::{dequantize_row, quantize_row};

use crate::{
    attention::{ProjectionBias, ProjectionNames},
    transformer::PreLnNames,
    Activation,
};

/// Reads a trunk's weights by name, as one kind of weights: host values ([`SpecReader`], what
/// engines and the f64 reference read) or burn modules ([`crate::VarBuilder`], what the burn
/// executor in [`crate::trunk`] runs). A family writes its trunk's description once, generic
/// over this trait, and each executor reads it through its own reader.
pub trait WeightReader: Sized {
    /// A dense layer.
    type Dense;
    /// A layer norm.
    type Norm;
    /// A table of rows: an embedding table, a class token, position embeddings.
    type Table;

    /// The reader of the tensors under `name` (a dotted path).
    fn under(&self, name: &str) -> Self;
    /// Whether the checkpoint holds the tensor `name`.
    fn holds(&self, name: &str) -> bool;
    /// The dense layer `name` (`[out, inp]` weight), with its bias where `bias` is true.
    fn linear(&self, name: &str, out: usize, inp: usize, bias: bool) -> Result<Self::Dense>;
    /// The layer norm `name` of width `h` (scale and shift), with epsilon `eps`.
    fn layer_norm(&self, name: &str, h: usize, eps: f64) -> Result<Self::Norm>;
    /// The tensor `name`, stored with `shape`, as a table of `[shape[..n-1].product(),
    /// shape[n-1]]` rows.
    fn table(&self, name: &str, shape: &[usize]) -> Result<Self::Table>;
    /// The layer `name` whose weight is stored `[out, taps…]` (a convolution such as a patch
    /// embedding's `[hidden, channels, patch, patch]`), as a dense layer over the flattened taps
    /// (`[out, taps.product()]`), with its bias where `bias` is true.
    fn flattened(&self, name: &str, out: usize, taps: &[usize], bias: bool) -> Result<Self::Dense>;
    /// [`WeightReader::flattened`] of a convolution `[out, in, kernel]` (`taps` = `[in,
    /// kernel]`) trained with weight norm over dimension `dim`: its magnitude and direction
    /// recombined (`g · v / ‖v‖`), or a plain `weight` as stored (Wav2Vec2's positional
    /// convolution).
    fn weight_normed_conv(
        &self,
        name: &str,
        out: usize,
        taps: [usize; 2],
        dim: usize,
        bias: bool,
    ) -> Result<Self::Dense>;
}

/// One pre-norm layer (`names` under `r`'s prefix) as the spec's layer: the norm before
/// attention is `attention_norm`, the one before the MLP `output_norm`; a projection without a
/// bias in `bias` has none (zeros, read as host values).
pub fn pre_norm_layer<R: WeightReader>(
    r: &R,
    names: &PreLnNames<'_>,
    (hidden, intermediate): (usize, usize),
    bias: ProjectionBias,
    eps: f64,
) -> Result<EncoderLayerWeights<R::Dense, R::Norm>> {
    let (h, i, a) = (hidden, intermediate, &names.attention);
    Ok(EncoderLayerWeights {
        query: r.linear(a.q, h, h, bias.q)?,
        key: r.linear(a.k, h, h, bias.k)?,
        value: r.linear(a.v, h, h, bias.v)?,
        attention_output: r.linear(a.o, h, h, bias.o)?,
        attention_norm: r.layer_norm(names.norm1, h, eps)?,
        intermediate: r.linear(names.fc1, i, h, true)?,
        output: r.linear(names.fc2, h, i, true)?,
        output_norm: r.layer_norm(names.norm2, h, eps)?,
        messages: None,
    })
}

impl WeightReader for SpecReader<'_> {
    type Dense = DenseWeights;
    type Norm = NormWeights;
    type Table = Vec<f32>;

    fn under(&self, name: &str) -> Self {
        self.pp(name)
    }

    fn holds(&self, name: &str) -> bool {
        self.has(name)
    }

    /// A layer without a bias gets zeros.
    fn linear(&self, name: &str, out: usize, inp: usize, bias: bool) -> Result<DenseWeights> {
        self.dense_with(name, out, inp, bias)
    }

    /// The epsilon is the spec's ([`ipfs_accelerate_core::EncoderSpec::eps`]).
    fn layer_norm(&self, name: &str, h: usize, _eps: f64) -> Result<NormWeights> {
        self.norm(name, h)
    }

    fn table(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        self.read(name, shape)
    }

    fn flattened(
        &self,
        name: &str,
        out: usize,
        taps: &[usize],
        bias: bool,
    ) -> Result<DenseWeights> {
        let shape: Vec<usize> = std::iter::once(out).chain(taps.iter().copied()).collect();
        let weight = self.read(&format!("{name}.weight"), &shape)?;
        let bias = self.bias_or_zeros(name, out, bias)?;
        Ok(DenseWeights::new(out, taps.iter().product(), weight, bias))
    }

    fn weight_normed_conv(
        &self,
        name: &str,
        out: usize,
        [inp, kernel]: [usize; 2],
        dim: usize,
        bias: bool,
    ) -> Result<DenseWeights> {
        let weight = self.pp(name).weight_normed(&[out, inp, kernel], dim)?;
        let bias = self.bias_or_zeros(name, out, bias)?;
        Ok(DenseWeights::new(out, inp * kernel, weight, bias))
    }
}

/// Reads f32 copies of a checkpoint's tensors under a prefix (`"vit."`, `""`), or (see
/// [`SpecReader::keeping_blocks`]) a dense layer's ggml blocks as the file stores them.
pub struct SpecReader<'a> {
    source: &'a dyn TensorSource,
    prefix: String,
    /// Which ggml types (ids) a dense layer's weight is kept in instead of read as f32.
    keep_blocks: Option<&'a (dyn Fn(u32) -> bool + Sync)>,
}

impl<'a> SpecReader<'a> {
    /// A reader of `source`'s tensors under `prefix` (`""`, or a dotted path such as `"vit"`).
    pub fn new(source: &'a dyn TensorSource, prefix: &str) -> Self {
        SpecReader {
            source,
            prefix: if prefix.is_empty() {
                String::new()
            } else {
                format!("{prefix}.")
            },
            keep_blocks: None,
        }
    }

    /// The same reader, keeping the weight of every dense layer (and embedding table) whose
    /// source stores it in a ggml block type `keep` accepts as those blocks
    /// ([`DenseWeights::blocks`]) instead of reading f32 values: an engine that computes on the
    /// blocks gets them without an f32 copy on the host.
    pub fn keeping_blocks(mut self, keep: &'a (dyn Fn(u32) -> bool + Sync)) -> Self {
        self.keep_blocks = Some(keep);
        self
    }

    /// The reader of the tensors under `name` (`pp` as in `VarBuilder`).
    pub fn pp(&self, name: &str) -> SpecReader<'a> {
        SpecReader {
            source: self.source,
            prefix: format!("{}{name}.", self.prefix),
            keep_blocks: self.keep_blocks,
        }
    }

    /// Whether the checkpoint holds `name`.
    pub fn has(&self, name: &str) -> bool {
        self.source.contains(&format!("{}{name}", self.prefix))
    }

    /// `name` as f32 values, checked to be of `shape`.
    pub fn read(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let full = format!("{}{name}", self.prefix);
        Ok(self.source.tensor_shaped(&full, shape)?.to_f32_vec())
    }

    /// The dense layer `name` (`[out, in]` weight), with its bias, or zeros where `bias` is false.
    pub fn dense_with(
        &self,
        name: &str,
        out: usize,
        inp: usize,
        bias: bool,
    ) -> Result<DenseWeights> {
        let bias = self.bias_or_zeros(name, out, bias)?;
        let mut dense = self.matrix(&format!("{name}.weight"), out, inp)?;
        dense.bias = bias;
        Ok(dense)
    }

    /// `name.bias` (`[out]`), or zeros where `bias` is false.
    fn bias_or_zeros(&self, name: &str, out: usize, bias: bool) -> Result<Vec<f32>> {
        if bias {
            self.read(&format!("{name}.bias"), &[out])
        } else {
            Ok(vec![0.0; out])
        }
    }

    /// The 2-D weight `name` `[out, in]` as a dense layer with a zero bias (an embedding table):
    /// its ggml blocks when the reader keeps that type, its f16 / bf16 values as stored (ggml's
    /// `F16` / `BF16`, the file's bytes: no f32 copy of a half-precision checkpoint) when it
    /// keeps those, else f32 values.
    pub fn matrix(&self, name: &str, out: usize, inp: usize) -> Result<DenseWeights> {
        let full = format!("{}{name}", self.prefix);
        let Some(keep) = self.keep_blocks else {
            return Ok(DenseWeights::new(
                out,
                inp,
                self.read(name, &[out, inp])?,
                vec![0.0; out],
            ));
        };
        let kept = |blocks: QuantizedBlocks| DenseWeights {
            blocks: Some(blocks),
            ..DenseWeights::new(out, inp, Vec::new(), vec![0.0; out])
        };
        if let Some(blocks) = self.source.quantized_blocks_shaped(&full, [out, inp])? {
            if blocks.shape != [out, inp] {
                return Err(Error::ShapeMismatch {
                    name: full,
                    expected: vec![out, inp],
                    actual: blocks.shape.to_vec(),
                });
            }
            if keep(blocks.ggml_type) {
                return Ok(kept(blocks));
            }
        }
        let host = self.source.tensor_shaped(&full, &[out, inp])?;
        if host.shape() != [out, inp] {
            return Err(Error::ShapeMismatch {
                name: full,
                expected: vec![out, inp],
                actual: host.shape().to_vec(),
            });
        }
        let half = match host.dtype() {
            DType::F16 => Some(BlockType::F16),
            DType::BF16 => Some(BlockType::BF16),
            _ => None,
        };
        if let Some(ty) = half.filter(|t| keep(t.id())) {
            return Ok(kept(QuantizedBlocks {
                ggml_type: ty.id(),
                data: host.bytes().clone(),
                shape: [out, inp],
            }));
        }
        Ok(DenseWeights::new(
            out,
            inp,
            host.to_f32_vec(),
            vec![0.0; out],
        ))
    }

    /// The dense layer `name` with its bias.
    pub fn dense(&self, name: &str, out: usize, inp: usize) -> Result<DenseWeights> {
        self.dense_with(name, out, inp, true)
    }

    /// The weight of the module under this reader, of `shape`, trained with weight norm over
    /// `dim`: magnitude `g` and direction `v` recombined as `g · v / ‖v‖` (the norm over every
    /// dimension but `dim`), or a plain `weight` as stored (what
    /// [`load_weight_normed`](crate::conv::load_weight_normed) loads for burn).
    pub fn weight_normed(&self, shape: &[usize], dim: usize) -> Result<Vec<f32>> {
        if dim >= shape.len() {
            return Err(Error::InvalidInput(format!(
                "weight norm of `{}weight` over dimension {dim} of a rank-{} weight",
                self.prefix,
                shape.len()
            )));
        }
        let Some((g, v)) = crate::conv::weight_norm_names(|name| self.has(name)) else {
            if self.has("weight") {
                return self.read("weight", shape);
            }
            return Err(crate::conv::missing_weight_normed(format!(
                "{}weight_g",
                self.prefix
            )));
        };
        let mut g_shape = vec![1; shape.len()];
        g_shape[dim] = shape[dim];
        let (g, mut v) = (self.read(g, &g_shape)?, self.read(v, shape)?);
        let inner: usize = shape[dim + 1..].iter().product();
        let along = |i: usize| (i / inner) % shape[dim];
        let mut sums = vec![0.0f64; shape[dim]];
        for (i, x) in v.iter().enumerate() {
            sums[along(i)] += (*x as f64) * (*x as f64);
        }
        for (i, x) in v.iter_mut().enumerate() {
            let j = along(i);
            *x = (g[j] as f64 * *x as f64 / sums[j].sqrt()) as f32;
        }
        Ok(v)
    }

    /// The vector `name.weight` of width `h` (an RMSNorm's scale).
    pub fn scale(&self, name: &str, h: usize) -> Result<Vec<f32>> {
        self.read(&format!("{name}.weight"), &[h])
    }

    /// The RMSNorm `name` of width `h` (a scale, no shift).
    pub fn rms_norm(&self, name: &str, h: usize) -> Result<NormWeights> {
        Ok(NormWeights {
            gamma: self.scale(name, h)?,
            beta: Vec::new(),
        })
    }

    /// The layer norm `name` of width `h`.
    pub fn norm(&self, name: &str, h: usize) -> Result<NormWeights> {
        Ok(NormWeights {
            gamma: self.scale(name, h)?,
            beta: self.read(&format!("{name}.bias"), &[h])?,
        })
    }

    /// An attention block's projections under this reader, named by `names`: query `[q_width,
    /// hidden]`, key and value `[kv_width, hidden]`, output `[hidden, q_width]`, in that order; a
    /// projection without a bias in `bias` gets zeros.
    pub fn attention(
        &self,
        names: &ProjectionNames<'_>,
        hidden: usize,
        (q_width, kv_width): (usize, usize),
        bias: ProjectionBias,
    ) -> Result<[DenseWeights; 4]> {
        Ok([
            self.dense_with(names.q, q_width, hidden, bias.q)?,
            self.dense_with(names.k, kv_width, hidden, bias.k)?,
            self.dense_with(names.v, kv_width, hidden, bias.v)?,
            self.dense_with(names.o, hidden, q_width, bias.o)?,
        ])
    }

    /// [`pre_norm_layer`] read as host values (the norms' epsilon is the spec's).
    pub fn pre_ln_layer(
        &self,
        names: &PreLnNames<'_>,
        hidden: usize,
        intermediate: usize,
        bias: ProjectionBias,
    ) -> Result<EncoderLayerWeights> {
        pre_norm_layer(self, names, (hidden, intermediate), bias, 0.0)
    }
}

/// The decoder spec's name for a gated MLP's activation, or an [`Error::InvalidInput`] naming one
/// it has none for.
pub fn gated_activation(act: Activation) -> Result<GatedActivation> {
    Ok(match act {
        Activation::Silu => GatedActivation::Silu,
        Activation::GeluTanh => GatedActivation::GeluTanh,
        Activation::Gelu => GatedActivation::Gelu,
        Activation::Relu => GatedActivation::Relu,
        other => {
            return Err(Error::InvalidInput(format!(
                "the decoder spec has no gated activation {other:?}"
            )))
        }
    })
}

/// `d` with its weight in ggml blocks of `ty`, quantized from its values (rows in parallel): what
/// an engine that computes on blocks gets for `--quantize`. A layer kept in another format (a
/// GGUF's blocks, a checkpoint's f16 / bf16) is re-quantized from its dequantized values, as the
/// CPU's load does; one already in `ty`, or whose inputs are not a whole number of `ty`'s blocks,
/// is returned unchanged.
pub fn quantize_dense(d: &DenseWeights, ty: BlockType) -> Result<DenseWeights> {
    use rayon::prelude::*;
    let k = d.in_features;
    let in_ty = d.blocks.as_ref().is_some_and(|b| b.ggml_type == ty.id());
    if in_ty || k == 0 || !k.is_multiple_of(ty.block_size()) {
        return Ok(d.clone());
    }
    let values = dense_values(d)?;
    let rows: Vec<Vec<u8>> = values
        .weight
        .par_chunks(k)
        .map(|row| quantize_row(ty, row))
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| Error::InvalidInput(format!("quantizing to {}: {e}", ty.name())))?;
    Ok(DenseWeights {
        blocks: Some(QuantizedBlocks {
            ggml_type: ty.id(),
            data: rows.concat().into(),
            shape: [d.out_features, k],
        }),
        ..DenseWeights::new(d.out_features, k, Vec::new(), d.bias.clone())
    })
}

/// `d` with f32 values: its blocks dequantized (as the CPU's reference reads them), or itself.
pub fn dense_values(d: &DenseWeights) -> Result<DenseWeights> {
    let Some(blocks) = &d.blocks else {
        return Ok(d.clone());
    };
    let bad = |reason: String| Error::InvalidInput(format!("ggml blocks: {reason}"));
    let ty = BlockType::from_id(blocks.ggml_type)
        .ok_or_else(|| bad(format!("unknown ggml type {}", blocks.ggml_type)))?;
    let mut weight = vec![0f32; d.out_features * d.in_features];
    let row_bytes = ty
        .bytes_for(d.in_features)
        .ok_or_else(|| bad(format!("{} inputs of {}", d.in_features, ty.name())))?;
    if blocks.data.len() != row_bytes * d.out_features {
        return Err(bad(format!(
            "{} bytes for [{}, {}] weights of {}",
            blocks.data.len(),
            d.out_features,
            d.in_features,
            ty.name()
        )));
    }
    for (row, data) in weight
        .chunks_mut(d.in_features.max(1))
        .zip(blocks.data.chunks(row_bytes.max(1)))
    {
        dequantize_row(ty, data, row).map_err(|e| bad(e.to_string()))?;
    }
    Ok(DenseWeights::new(
        d.out_features,
        d.in_features,
        weight,
        d.bias.clone(),
    ))
}

/// Every dense layer of `spec` (the embedding and head too) through `f`.
pub fn map_decoder_layers(
    spec: &mut DecoderSpec,
    f: impl Fn(&DenseWeights) -> Result<DenseWeights>,
) -> Result<()> {
    spec.embed = f(&spec.embed)?;
    for l in &mut spec.layers {
        let cross = l
            .cross
            .iter_mut()
            .flat_map(|c| [&mut c.query, &mut c.key, &mut c.value, &mut c.output]);
        for d in [&mut l.query, &mut l.key, &mut l.value, &mut l.output]
            .into_iter()
            .chain(cross)
            .chain(l.gate.as_mut())
            .chain([&mut l.up, &mut l.down])
        {
            *d = f(d)?;
        }
    }
    if let Some(head) = &mut spec.lm_head {
        *head = f(head)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ipfs_accelerate_core::HostTensor;

    /// One bf16 weight and one f32 weight.
    struct Halves;

    impl TensorSource for Halves {
        fn source_name(&self) -> String {
            "halves".into()
        }
        fn contains(&self, name: &str) -> bool {
            name == "a.weight" || name == "b.weight"
        }
        fn shape_of(&self, _: &str) -> Option<Vec<usize>> {
            Some(vec![2, 3])
        }
        fn tensor(&self, name: &str) -> Result<HostTensor> {
            // Exact in bf16: its bits are the f32's upper half.
            let values = [0.5f32, -1.25, 3.0, 0.0078125, 7.0, -0.0];
            match name {
                "a.weight" => {
                    let bytes: Vec<u8> = values
                        .iter()
                        .flat_map(|&v| ((v.to_bits() >> 16) as u16).to_le_bytes())
                        .collect();
                    HostTensor::from_bytes(name, vec![2, 3], DType::BF16, bytes.into())
                }
                _ => HostTensor::from_f32(vec![2, 3], &values),
            }
        }
        fn names(&self) -> Vec<String> {
            vec!["a.weight".into(), "b.weight".into()]
        }
    }

    /// A reader keeping BF16 hands the file's bytes over (they read back as the f32 reader's
    /// values); f32 tensors, and readers that keep nothing, give f32 values.
    #[test]
    fn half_precision_weights_are_kept_as_stored() {
        let keep = |id: u32| id == BlockType::BF16.id() || id == BlockType::F16.id();
        let kept = SpecReader::new(&Halves, "").keeping_blocks(&keep);
        let plain = SpecReader::new(&Halves, "");
        let a = kept.matrix("a.weight", 2, 3).unwrap();
        let blocks = a.blocks.as_ref().expect("kept as bf16");
        assert_eq!(blocks.ggml_type, BlockType::BF16.id());
        assert_eq!(
            blocks.data,
            Halves.tensor("a.weight").unwrap().bytes().clone()
        );
        assert!(a.weight.is_empty());
        assert_eq!(
            dense_values(&a).unwrap(),
            plain.matrix("a.weight", 2, 3).unwrap()
        );
        let b = kept.matrix("b.weight", 2, 3).unwrap();
        assert!(b.blocks.is_none() && b.weight.len() == 6);
        assert!(
            kept.matrix("a.weight", 3, 2).is_err(),
            "a shape mismatch is an error"
        );
    }

    /// `--quantize` applies to layers kept in another format too: re-quantized from their values
    /// (as the CPU's load does), while a layer already in the target format stays as it is.
    #[test]
    fn kept_layers_are_requantized_to_the_asked_format() {
        let keep = |id: u32| id == BlockType::BF16.id();
        let reader = SpecReader::new(&Halves, "").keeping_blocks(&keep);
        // Rows of 3: not whole Q8_0 blocks, so unchanged.
        let a = reader.matrix("a.weight", 2, 3).unwrap();
        assert_eq!(quantize_dense(&a, BlockType::Q8_0).unwrap(), a);
        // A wider bf16 layer (rows of 32) becomes Q8_0 from its values.
        let values: Vec<f32> = (0..64).map(|i| (i as f32 - 31.0) / 8.0).collect();
        let bytes: Vec<u8> = values
            .iter()
            .flat_map(|&v| ((v.to_bits() >> 16) as u16).to_le_bytes())
            .collect();
        let wide = DenseWeights {
            blocks: Some(QuantizedBlocks {
                ggml_type: BlockType::BF16.id(),
                data: bytes.into(),
                shape: [2, 32],
            }),
            ..DenseWeights::new(2, 32, Vec::new(), vec![0.0; 2])
        };
        let q = quantize_dense(&wide, BlockType::Q8_0).unwrap();
        assert_eq!(q.blocks.as_ref().unwrap().ggml_type, BlockType::Q8_0.id());
        let back = dense_values(&q).unwrap().weight;
        let worst = back
            .iter()
            .zip(&values)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(worst <= 4.0 / 220.0, "{worst}");
        assert_eq!(quantize_dense(&q, BlockType::Q8_0).unwrap(), q);
    }
}
