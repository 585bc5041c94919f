//! Weights kept in their ggml (GGUF) block layout: a [`GgmlWeight`] holds the blocks as the file
//! stores them (usually a zero-copy slice of the memory map), a linear layer multiplies by them
//! with `ipfs-accelerate-kernels`' [`linear_ggml`](ipfs_accelerate_kernels::linear_ggml)
//! (activations quantized to int8 per block for few rows, dequantized panels for many), and an
//! embedding lookup dequantizes only the rows it reads. No f32 copy of the weight is built,
//! except by the generic paths that ask for one
//! ([`LinearWeight::matrix`](crate::LinearWeight::matrix)).
//!
//! # When weights are kept this way
//!
//! [`VarBuilder`](crate::VarBuilder) keeps a weight as blocks when all of these hold:
//! - the backend is burn-flex with the CPU kernels on ([`crate::fast`]);
//! - the source hands the weight over as blocks
//!   ([`TensorSource::quantized_blocks`](ipfs_accelerate_core::TensorSource::quantized_blocks):
//!   GGUF files, every block format but F32);
//! - for a linear layer, no other form is asked: a calibration ([`crate::gptq`]) wins, then the
//!   load's [`WeightQuantization`](crate::WeightQuantization) (int8 / int4 are re-quantized from
//!   the dequantized values, as before), and only `None` keeps the file's blocks (also inside
//!   [`with_bf16_linears`](crate::fast::with_bf16_linears): the blocks are smaller than bf16).
//!
//! Embedding tables ([`Embedding`](crate::Embedding)) are kept as blocks under the first two
//! conditions, whatever the quantization (which covers linear layers only); a tied output
//! projection ([`Embedding::tied_head`](crate::Embedding::tied_head)) then shares them.
//!
//! The only difference next to the dequantized f32 weight is the kernels' rounding of the
//! activations to int8 (at most half a step per value, as llama.cpp does) for products of fewer
//! than [`PANEL_MIN_ROWS`](ipfs_accelerate_kernels::PANEL_MIN_ROWS) rows.

use burn::tensor::{backend::Backend, Tensor};
use bytes::Bytes;
use ipfs_accelerate_core::{Error, QuantizedBlocks, Result};
use ipfs_accelerate_kernels::{dequantize_row, BlockType, GgmlBlocks};

/// A `[n, k]` weight (n rows of k values: PyTorch's `[out, in]`) in a ggml block format, checked
/// once: the type is one the kernels read and the bytes are exactly `n` rows of whole blocks.
/// Clones share the bytes.
#[derive(Debug, Clone)]
pub struct GgmlWeight {
    ty: BlockType,
    data: Bytes,
    n: usize,
    k: usize,
}

impl GgmlWeight {
    /// Checks `blocks` of the tensor `name` (named in the errors, with its type).
    pub fn new(name: &str, blocks: QuantizedBlocks) -> Result<Self> {
        let ty = BlockType::from_id(blocks.ggml_type).ok_or_else(|| {
            Error::InvalidInput(format!(
                "tensor `{name}`: ggml type {} is not a block format the CPU kernels read",
                blocks.ggml_type
            ))
        })?;
        let [n, k] = blocks.shape;
        GgmlBlocks::new(ty, &blocks.data, n, k)
            .map_err(|e| Error::InvalidInput(format!("tensor `{name}` ({ty}, [{n}, {k}]): {e}")))?;
        Ok(GgmlWeight {
            ty,
            data: blocks.data,
            n,
            k,
        })
    }

    /// The block format.
    pub fn ty(&self) -> BlockType {
        self.ty
    }

    /// Rows (out-features, or table entries).
    pub fn n(&self) -> usize {
        self.n
    }

    /// Values per row (in-features, or the embedding width).
    pub fn k(&self) -> usize {
        self.k
    }

    /// The bytes as kept.
    pub fn data(&self) -> &Bytes {
        &self.data
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    /// The kernels' view of the blocks (`None` never happens: the shape was checked in
    /// [`new`](Self::new)).
    pub fn blocks(&self) -> Option<GgmlBlocks<'_>> {
        GgmlBlocks::new(self.ty, &self.data, self.n, self.k).ok()
    }

    /// Row `row` dequantized into `out` (`k` values); zeros for a row out of range.
    pub fn dequantize_row_into(&self, row: usize, out: &mut [f32]) {
        let bytes = self
            .blocks()
            .and_then(|b| b.rows(row, row.saturating_add(1)));
        match bytes {
            Some(b) if out.len() == self.k && dequantize_row(self.ty, b, out).is_ok() => {}
            _ => out.fill(0.0),
        }
    }

    /// Every value, row-major `[n, k]` (NaN if the blocks could not be read, which the check in
    /// [`new`](Self::new) rules out).
    pub fn dequantize(&self) -> Vec<f32> {
        match self.blocks() {
            Some(b) => b.dequantize(),
            None => vec![f32::NAN; self.n * self.k],
        }
    }

    /// The f32 `[k, n]` matrix a generic linear forward multiplies by (the transposed weight).
    pub(crate) fn matrix<B: Backend>(&self, device: &B::Device) -> Tensor<B, 2> {
        crate::quant::in_out_matrix(&self.dequantize(), self.n, self.k, device)
    }

    /// The rows `ids` dequantized: `[ids.len(), k]` values (zeros for ids out of range).
    pub fn gather(&self, ids: &[i64]) -> Vec<f32> {
        let mut out = vec![0f32; ids.len() * self.k];
        for (&id, dst) in ids.iter().zip(out.chunks_exact_mut(self.k.max(1))) {
            match usize::try_from(id) {
                Ok(row) if row < self.n => self.dequantize_row_into(row, dst),
                _ => dst.fill(0.0),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use burn::tensor::{Int, TensorData};
    use ipfs_accelerate_core::{HostTensor, TensorSource};

    use super::*;
    use crate::WeightQuantization;
    use crate::{load_scope, Embedding, Linear, LinearWeight, LoadSettings, VarBuilder};

    type Flex = burn_flex::Flex;

    /// Q8_0 blocks of `[n, k]` values `(i * 7 % 23) - 11` times a power-of-two scale per row, so
    /// the dequantized values are exact.
    fn q8_0(n: usize, k: usize) -> (Vec<u8>, Vec<f32>) {
        let mut data = Vec::new();
        let mut values = Vec::new();
        for r in 0..n {
            let scale = 2f32.powi(-(r as i32 % 4) - 3);
            for b in 0..k / 32 {
                // f16 bits of the scale (a power of two: exponent only).
                let e = (scale.log2() as i32 + 15) as u16;
                data.extend_from_slice(&(e << 10).to_le_bytes());
                for j in 0..32 {
                    let q = (((r * k + b * 32 + j) * 7 % 23) as i32 - 11) as i8;
                    data.push(q as u8);
                    values.push(f32::from(q) * scale);
                }
            }
        }
        (data, values)
    }

    fn blocks(data: Vec<u8>, n: usize, k: usize) -> QuantizedBlocks {
        QuantizedBlocks {
            ggml_type: BlockType::Q8_0.id(),
            data: data.into(),
            shape: [n, k],
        }
    }

    /// A source serving one `[n, k]` Q8_0 weight under `name`, as blocks and as f32.
    struct Blocks {
        name: &'static str,
        data: Vec<u8>,
        values: Vec<f32>,
        shape: [usize; 2],
    }

    impl TensorSource for Blocks {
        fn source_name(&self) -> String {
            "blocks".into()
        }
        fn contains(&self, name: &str) -> bool {
            name == self.name
        }
        fn shape_of(&self, name: &str) -> Option<Vec<usize>> {
            self.contains(name).then(|| self.shape.to_vec())
        }
        fn tensor(&self, name: &str) -> Result<HostTensor> {
            if !self.contains(name) {
                return Err(Error::MissingTensor {
                    name: name.into(),
                    source_name: self.source_name(),
                });
            }
            HostTensor::from_f32(self.shape.to_vec(), &self.values)
        }
        fn names(&self) -> Vec<String> {
            vec![self.name.into()]
        }
        fn quantized_blocks(&self, name: &str) -> Result<Option<QuantizedBlocks>> {
            Ok(self
                .contains(name)
                .then(|| blocks(self.data.clone(), self.shape[0], self.shape[1])))
        }
    }

    #[test]
    fn builders_keep_offered_blocks_unless_another_form_is_asked() {
        let (n, k) = (6, 64);
        let (data, values) = q8_0(n, k);
        let device = Default::default();
        let source = |name| -> Arc<dyn TensorSource> {
            Arc::new(Blocks {
                name,
                data: data.clone(),
                values: values.clone(),
                shape: [n, k],
            })
        };
        let vb = |name| VarBuilder::<Flex>::new(source(name), &device);

        // A linear layer: the blocks, counted as quantized.
        let (layer, loaded) = load_scope(LoadSettings::default(), || {
            Linear::load(&vb("proj.weight").pp("proj"), k, n, false).unwrap()
        });
        let kept = layer.weight().ggml().expect("kept as blocks");
        assert_eq!(kept.data()[..], data[..]);
        let stats = loaded.stats();
        assert_eq!(
            (stats.linear_quantized, stats.linear_bytes),
            (1, data.len() as u64)
        );
        // Int8 asked: re-quantized from the values, as before.
        let int8 = WeightQuantization::Int8 { block_size: 32 };
        let (layer, _) = load_scope(LoadSettings::default().quantize(int8), || {
            Linear::load(&vb("proj.weight").pp("proj"), k, n, false).unwrap()
        });
        assert!(layer.weight().ggml().is_none());
        assert_eq!(layer.quantization(), int8);
        // A shape other than the model's is an error naming the tensor.
        let err = Linear::load(&vb("proj.weight").pp("proj"), n, k, false).unwrap_err();
        assert!(err.to_string().contains("proj.weight"), "{err}");

        // An embedding table (whatever the quantization) and its tied head share the blocks.
        let (embed, _) = load_scope(LoadSettings::default().quantize(int8), || {
            Embedding::load(&vb("emb.weight").pp("emb"), n, k).unwrap()
        });
        let table = embed
            .ggml()
            .and_then(LinearWeight::ggml)
            .expect("kept as blocks");
        assert_eq!(embed.bytes(), data.len());
        let head = embed.tied_head();
        let shared = head.weight().ggml().map(|g| g.data().as_ptr());
        assert_eq!(shared, Some(table.data().as_ptr()));
        let ids =
            Tensor::<Flex, 2, Int>::from_data(TensorData::new(vec![5i64, 0], [1, 2]), &device);
        let rows = crate::quant::to_f32_vec(embed.forward(ids)).unwrap();
        assert_eq!(&rows[..k], &values[5 * k..6 * k]);
        assert_eq!(&rows[k..], &values[..k]);
        assert_eq!(
            crate::quant::to_f32_vec(embed.weight().clone()).unwrap(),
            values
        );
    }

    #[test]
    fn bad_blocks_are_typed_errors_naming_the_tensor() {
        let (data, _) = q8_0(3, 64);
        let short = blocks(data[..data.len() - 1].to_vec(), 3, 64);
        let err = GgmlWeight::new("w.weight", short).unwrap_err().to_string();
        assert!(err.contains("w.weight") && err.contains("q8_0"), "{err}");
        let partial = blocks(data.clone(), 6, 32 + 16);
        let err = GgmlWeight::new("w.weight", partial)
            .unwrap_err()
            .to_string();
        assert!(err.contains("whole number"), "{err}");
        let mut unknown = blocks(data, 3, 64);
        unknown.ggml_type = 4;
        let err = GgmlWeight::new("w.weight", unknown)
            .unwrap_err()
            .to_string();
        assert!(err.contains("ggml type 4"), "{err}");
    }

    #[test]
    fn rows_matrix_and_linear_agree_with_the_values() {
        let (n, k) = (5, 64);
        let (data, values) = q8_0(n, k);
        let w = GgmlWeight::new("w", blocks(data, n, k)).unwrap();
        assert_eq!(w.dequantize(), values);
        assert_eq!(w.bytes(), n * 2 * 34);
        let rows = w.gather(&[4, 0, -1, 9]);
        assert_eq!(&rows[..k], &values[4 * k..5 * k]);
        assert_eq!(&rows[k..2 * k], &values[..k]);
        assert!(rows[2 * k..].iter().all(|&v| v == 0.0));

        let device = Default::default();
        let lw = LinearWeight::<Flex>::from_ggml(w.clone(), &device);
        assert_eq!(lw.bytes(), w.bytes());
        assert_eq!((lw.out_dim(), lw.in_dim()), (n, k));
        assert_eq!(lw.to_out_in_f32().unwrap(), values);
        // A forward on the blocks: within the int8 rounding of the activations (half a step per
        // value) of the product with the exact weight.
        let x: Vec<f32> = (0..2 * k).map(|i| ((i as f32) * 0.37).sin()).collect();
        let layer = Linear::from_weight(lw, None);
        let y = layer.forward(Tensor::<Flex, 2>::from_data(
            TensorData::new(x.clone(), [2, k]),
            &device,
        ));
        let y = crate::quant::to_f32_vec(y).unwrap();
        for r in 0..2 {
            let xr = &x[r * k..(r + 1) * k];
            for o in 0..n {
                let wr = &values[o * k..(o + 1) * k];
                let exact: f32 = xr.iter().zip(wr).map(|(a, b)| a * b).sum();
                let bound: f32 = xr
                    .chunks(32)
                    .zip(wr.chunks(32))
                    .map(|(xb, wb)| {
                        let d = xb.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
                        wb.iter().map(|v| v.abs()).sum::<f32>() * d / 2.0
                    })
                    .sum();
                let got = y[r * n + o];
                assert!(
                    (got - exact).abs() <= bound * 1.01 + 1e-5,
                    "row {r} out {o}: {got} vs {exact} (bound {bound})"
                );
            }
        }
    }
}
