//! CLAP's audio tower without fusion (`ClapAudioEncoder`, HTSAT): batch norm over the mel bins,
//! the spectrogram folded into a `spec_size × spec_size` image (`reshape_mel2img`, bicubic resize
//! with `align_corners=True` when it is shorter), a convolutional patch embedding, Swin stages
//! (window attention with a relative position bias table, shifted windows with HF's region mask,
//! patch merging), a final layer norm and the mean over all tokens (HF's `avgpool` of the
//! regrouped grid, the `pooler_output`).

use burn::tensor::{backend::Backend, Tensor, TensorData};
use ipfs_accelerate_core::{Error, Result};
use ipfs_accelerate_nn::{
    attention::{sdpa, AttentionConfig, MultiHeadAttention, ProjectionBias, ProjectionNames},
    conv::{Conv2d, ConvParams, FrozenBatchNorm},
    transformer::Mlp,
    vision::bicubic_matrix_align_corners,
    LayerNorm, Linear, VarBuilder,
};

use crate::config::{ClapAudioConfig, HtsatGeometry};

/// `nn.LayerNorm`'s default epsilon, used by HTSAT's patch, merging and final norms.
const TORCH_LN_EPS: f64 = 1e-5;
/// `nn.BatchNorm2d`'s default epsilon.
const TORCH_BN_EPS: f64 = 1e-5;
/// The score HF adds between tokens of different regions of a shifted window.
const SHIFT_MASK: f32 = -100.0;

/// Swin's `relative_position_index` for a `window × window` window: `[N · N]` row-major indices
/// into the `(2w − 1)²` bias table (HF's `create_relative_position_index`).
pub fn relative_position_index(window: usize) -> Vec<i64> {
    let n = window * window;
    let w = window as i64;
    let mut index = Vec::with_capacity(n * n);
    for i in 0..n as i64 {
        for j in 0..n as i64 {
            let dh = i / w - j / w + w - 1;
            let dw = i % w - j % w + w - 1;
            index.push(dh * (2 * w - 1) + dw);
        }
    }
    index
}

/// HF's `get_attn_mask` for a `height × width` grid (already padded to whole windows) cut into
/// `window`-sized windows after a cyclic shift of `shift`: `[windows, N, N]` row-major, 0 within
/// a region and −100 across regions.
pub fn shifted_window_mask(height: usize, width: usize, window: usize, shift: usize) -> Vec<f32> {
    let region = |i: usize, len: usize| (i >= len - window) as usize + (i >= len - shift) as usize;
    let (rows, cols) = (height / window, width / window);
    let n = window * window;
    let mut mask = Vec::with_capacity(rows * cols * n * n);
    for wr in 0..rows {
        for wc in 0..cols {
            let labels: Vec<usize> = (0..n)
                .map(|t| {
                    let (h, w) = (wr * window + t / window, wc * window + t % window);
                    region(h, height) * 3 + region(w, width)
                })
                .collect();
            for a in &labels {
                mask.extend(labels.iter().map(|b| if a == b { 0.0 } else { SHIFT_MASK }));
            }
        }
    }
    mask
}

/// `[batch, H, W, C]` → windows `[batch · windows, window², C]` (HF's `window_partition`).
fn partition<B: Backend>(x: Tensor<B, 4>, window: usize) -> Tensor<B, 3> {
    let [b, h, w, c] = x.dims();
    x.reshape([b, h / window, window, w / window, window, c])
        .permute([0, 1, 3, 2, 4, 5])
        .reshape([b * (h / window) * (w / window), window * window, c])
}

/// Windows `[batch · windows, window², C]` back to `[batch, H, W, C]` (HF's `window_reverse`).
fn unpartition<B: Backend>(x: Tensor<B, 3>, window: usize, h: usize, w: usize) -> Tensor<B, 4> {
    let [bw, _, c] = x.dims();
    let b = bw / ((h / window) * (w / window)).max(1);
    x.reshape([b, h / window, w / window, window, window, c])
        .permute([0, 1, 3, 2, 4, 5])
        .reshape([b, h, w, c])
}

/// One Swin block (`ClapAudioLayer`): `x + attn(windows(ln(x)))`, then `h + mlp(ln(h))`.
struct SwinBlock<B: Backend> {
    norm_before: LayerNorm<B>,
    attention: MultiHeadAttention<B>,
    norm_after: LayerNorm<B>,
    mlp: Mlp<B>,
    resolution: (usize, usize),
    window: usize,
    shift: usize,
    /// Relative position bias plus the shift mask: `[windows or 1, heads, N, N]`.
    bias: Tensor<B, 4>,
}

impl<B: Backend> SwinBlock<B> {
    #[allow(clippy::too_many_arguments)]
    fn load(
        vb: &VarBuilder<B>,
        config: &ClapAudioConfig,
        dim: usize,
        mlp_dim: usize,
        heads: usize,
        resolution: (usize, usize),
        shifted: bool,
    ) -> Result<Self> {
        let (h, w) = resolution;
        // HF's `set_shift_and_window_size`: no shift when the grid fits one window (the config
        // check rules out grids smaller than the window).
        let window = config.window_size;
        let shift = if h.min(w) <= window || !shifted {
            0
        } else {
            window / 2
        };
        let attn = vb.pp("attention");
        let bias = ProjectionBias::qkv(config.qkv_bias);
        let attention = MultiHeadAttention::load(
            &attn,
            AttentionConfig::new(dim, heads, bias),
            ProjectionNames {
                q: "self.query",
                k: "self.key",
                v: "self.value",
                o: "output.dense",
            },
        )?;
        let n = window * window;
        let side = 2 * window - 1;
        let table: Tensor<B, 2> =
            attn.tensor("self.relative_position_bias_table", [side * side, heads])?;
        let device = vb.device();
        let index = Tensor::from_data(
            TensorData::new(relative_position_index(window), [n * n]),
            device,
        );
        let relative: Tensor<B, 4> = table
            .select(0, index)
            .reshape([n, n, heads])
            .permute([2, 0, 1])
            .unsqueeze();
        let bias = if shift > 0 {
            let (hp, wp) = (h.div_ceil(window) * window, w.div_ceil(window) * window);
            let windows = (hp / window) * (wp / window);
            let mask: Tensor<B, 4> = Tensor::from_data(
                TensorData::new(
                    shifted_window_mask(hp, wp, window, shift),
                    [windows, 1, n, n],
                ),
                device,
            );
            mask + relative
        } else {
            relative
        };
        Ok(SwinBlock {
            norm_before: LayerNorm::load(&vb.pp("layernorm_before"), dim, config.layer_norm_eps)?,
            attention,
            norm_after: LayerNorm::load(&vb.pp("layernorm_after"), dim, config.layer_norm_eps)?,
            mlp: Mlp::load(
                vb,
                ("intermediate.dense", "output.dense"),
                dim,
                mlp_dim,
                config.hidden_act,
            )?,
            resolution,
            window,
            shift,
            bias,
        })
    }

    fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let [b, _, c] = x.dims();
        let (h, w) = self.resolution;
        let window = self.window;
        let mut grid = self.norm_before.forward(x.clone()).reshape([b, h, w, c]);
        let (hp, wp) = (h.div_ceil(window) * window, w.div_ceil(window) * window);
        if (hp, wp) != (h, w) {
            grid = grid.pad([(0, hp - h), (0, wp - w), (0, 0)], 0.0);
        }
        // burn's `roll(s)` moves element `i + s` to `i`, i.e. torch's `roll(-s)`: this is HF's
        // `torch.roll(x, (-shift, -shift))`, and the one after attention undoes it.
        let shift = self.shift as i64;
        if shift > 0 {
            grid = grid.roll(&[shift, shift], &[1, 2]);
        }
        let windows = partition(grid, window);
        let q = self.attention.project_q(windows.clone());
        let (k, v) = self.attention.project_kv(windows);
        let bias = if self.bias.dims()[0] > 1 {
            self.bias.clone().repeat_dim(0, b)
        } else {
            self.bias.clone()
        };
        let heads = sdpa(q, k, v, Some(&bias), None);
        let mut grid = unpartition(self.attention.output(heads), window, hp, wp);
        if shift > 0 {
            grid = grid.roll(&[-shift, -shift], &[1, 2]);
        }
        if (hp, wp) != (h, w) {
            grid = grid.slice([0..b, 0..h, 0..w, 0..c]);
        }
        let x = x + grid.reshape([b, h * w, c]);
        x.clone() + self.mlp.forward(self.norm_after.forward(x))
    }
}

/// `ClapAudioPatchMerging`: 2×2 neighbours concatenated (HF's order), layer norm, linear `4C → 2C`.
struct PatchMerging<B: Backend> {
    norm: LayerNorm<B>,
    reduction: Linear<B>,
}

impl<B: Backend> PatchMerging<B> {
    fn load(vb: &VarBuilder<B>, dim: usize) -> Result<Self> {
        Ok(PatchMerging {
            norm: LayerNorm::load(&vb.pp("norm"), 4 * dim, TORCH_LN_EPS)?,
            reduction: Linear::load(&vb.pp("reduction"), 4 * dim, 2 * dim, false)?,
        })
    }

    /// `[b, h·w, c]` on an `h × w` grid (both even) → `[b, h/2 · w/2, 2c]`.
    fn forward(&self, x: Tensor<B, 3>, (h, w): (usize, usize)) -> Tensor<B, 3> {
        let [b, _, c] = x.dims();
        // torch.cat([x[:, r::2, c::2] for c in 0..2 for r in 0..2]): column parity outer.
        let merged = x
            .reshape([b, h / 2, 2, w / 2, 2, c])
            .permute([0, 1, 3, 4, 2, 5])
            .reshape([b, (h / 2) * (w / 2), 4 * c]);
        self.reduction.forward(self.norm.forward(merged))
    }
}

struct Stage<B: Backend> {
    blocks: Vec<SwinBlock<B>>,
    merge: Option<PatchMerging<B>>,
    resolution: (usize, usize),
}

/// `ClapAudioEncoder` without fusion; see the module docs.
pub struct HtsatEncoder<B: Backend> {
    batch_norm: FrozenBatchNorm<B>,
    patch_embed: Conv2d<B>,
    patch_norm: Option<LayerNorm<B>>,
    stages: Vec<Stage<B>>,
    norm: LayerNorm<B>,
    geometry: HtsatGeometry,
    config: ClapAudioConfig,
}

impl<B: Backend> HtsatEncoder<B> {
    /// Loads the encoder under `vb` (HF's `audio_model.audio_encoder`).
    pub fn load(vb: &VarBuilder<B>, config: &ClapAudioConfig) -> Result<Self> {
        let geometry = config.geometry()?;
        let pe = vb.pp("patch_embed");
        let params = ConvParams {
            stride: geometry.stride,
            padding: geometry.padding,
            ..ConvParams::default()
        };
        let patch_embed = Conv2d::load(
            &pe.pp("proj"),
            config.patch_embed_input_channels,
            config.patch_embeds_hidden_size,
            geometry.patch,
            params,
        )?;
        let patch_norm = config
            .enable_patch_layer_norm
            .then(|| {
                LayerNorm::load(
                    &pe.pp("norm"),
                    config.patch_embeds_hidden_size,
                    TORCH_LN_EPS,
                )
            })
            .transpose()?;
        let count = config.depths.len();
        let mut stages = Vec::with_capacity(count);
        for (i, &depth) in config.depths.iter().enumerate() {
            let sv = vb.pp(format!("layers.{i}"));
            let (dim, res) = (geometry.dims[i], geometry.resolutions[i]);
            let heads = config.num_attention_heads[i];
            let blocks = (0..depth)
                .map(|j| {
                    SwinBlock::load(
                        &sv.pp(format!("blocks.{j}")),
                        config,
                        dim,
                        geometry.mlp_dims[i],
                        heads,
                        res,
                        j % 2 == 1,
                    )
                })
                .collect::<Result<Vec<_>>>()?;
            let merge = (i + 1 < count)
                .then(|| PatchMerging::load(&sv.pp("downsample"), dim))
                .transpose()?;
            stages.push(Stage {
                blocks,
                merge,
                resolution: res,
            });
        }
        Ok(HtsatEncoder {
            batch_norm: FrozenBatchNorm::load(
                &vb.pp("batch_norm"),
                config.num_mel_bins,
                TORCH_BN_EPS,
            )?,
            patch_embed,
            patch_norm,
            stages,
            norm: LayerNorm::load(&vb.pp("norm"), config.hidden_size, TORCH_LN_EPS)?,
            geometry,
            config: config.clone(),
        })
    }

    /// The derived geometry (resize targets, stage grids).
    pub fn geometry(&self) -> &HtsatGeometry {
        &self.geometry
    }

    /// Checks the shape of `input_features` `[batch, channels, frames, mels]` against the
    /// config as HF's forward would (errors instead of exceptions).
    pub fn check_input(&self, dims: [usize; 4]) -> Result<()> {
        let [b, c, t, f] = dims;
        let g = &self.geometry;
        let bad = |why: String| {
            Err(Error::InvalidInput(format!(
                "input_features of shape {dims:?}: {why}"
            )))
        };
        if b == 0 || t == 0 {
            return bad("no audio (empty batch or no frames)".into());
        }
        if c != self.config.patch_embed_input_channels {
            return bad(format!(
                "expected {} channel(s) (the feature extractor's non-fusion output)",
                self.config.patch_embed_input_channels
            ));
        }
        if f != self.config.num_mel_bins {
            return bad(format!("expected {} mel bins", self.config.num_mel_bins));
        }
        if t > g.spec_width {
            return bad(format!(
                "more than the model's {} frames (spec_size · freq_ratio)",
                g.spec_width
            ));
        }
        if t < g.spec_width && f < g.spec_height {
            return bad(format!(
                "HF resizes only one axis when both frames < {} and mels < {}",
                g.spec_width, g.spec_height
            ));
        }
        Ok(())
    }

    /// HF's `reshape_mel2img`: `[b, c, t, f]` (after batch norm) resized bicubically to
    /// `spec_width` frames / `spec_height` bins where shorter, then folded to
    /// `[b, c, spec_size, spec_size]`.
    fn mel_to_image(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let g = &self.geometry;
        let [b, c, t, f] = x.dims();
        let device = x.device();
        let resize = |x: Tensor<B, 2>, from: usize, to: usize| {
            let m: Tensor<B, 2> = Tensor::from_data(
                TensorData::new(bicubic_matrix_align_corners(from, to), [to, from]),
                &device,
            );
            ipfs_accelerate_nn::exact::matmul(x, m.transpose())
        };
        let mut x = x;
        if t < g.spec_width {
            let along_time = x.swap_dims(2, 3).reshape([b * c * f, t]);
            x = resize(along_time, t, g.spec_width)
                .reshape([b, c, f, g.spec_width])
                .swap_dims(2, 3);
        }
        if f < g.spec_height {
            let [_, _, t, _] = x.dims();
            x = resize(x.reshape([b * c * t, f]), f, g.spec_height).reshape([
                b,
                c,
                t,
                g.spec_height,
            ]);
        }
        let [_, _, time, freq] = x.dims();
        let r = g.freq_ratio;
        x.reshape([b, c * r, time / r, freq])
            .swap_dims(2, 3)
            .reshape([b, c, freq * r, time / r])
    }

    /// `input_features` `[batch, channels, frames, mels]` → the pooled output
    /// `[batch, hidden_size]` (HF's `pooler_output`). Check the shape with
    /// [`HtsatEncoder::check_input`] first.
    pub fn forward(&self, input_features: Tensor<B, 4>) -> Result<Tensor<B, 2>> {
        self.check_input(input_features.dims())?;
        // BatchNorm2d over the mel bins: channels on dimension 1 after transpose(1, 3).
        let x = self
            .batch_norm
            .forward(input_features.swap_dims(1, 3))
            .swap_dims(1, 3);
        let image = self.mel_to_image(x);
        let patches = self.patch_embed.forward(image);
        let [b, e, gh, gw] = patches.dims();
        let mut x = patches.reshape([b, e, gh * gw]).swap_dims(1, 2);
        if let Some(norm) = &self.patch_norm {
            x = norm.forward(x);
        }
        for stage in &self.stages {
            for block in &stage.blocks {
                x = block.forward(x);
            }
            if let Some(merge) = &stage.merge {
                x = merge.forward(x, stage.resolution);
            }
        }
        let x = self.norm.forward(x);
        let [b, _, c] = x.dims();
        Ok(x.mean_dim(1).reshape([b, c]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_index_matches_hf_for_window_2() {
        // torch: ClapAudioSelfAttention(window_size=2).create_relative_position_index()
        assert_eq!(
            relative_position_index(2),
            vec![4, 3, 1, 0, 5, 4, 2, 1, 7, 6, 4, 3, 8, 7, 5, 4]
        );
    }

    #[test]
    fn align_corners_resize_matches_torch() {
        // torch F.interpolate(x, size, mode="bicubic", align_corners=True) along one axis.
        let apply = |x: &[f32], out: usize| -> Vec<f32> {
            let m = bicubic_matrix_align_corners(x.len(), out);
            m.chunks(x.len())
                .map(|row| row.iter().zip(x).map(|(w, v)| w * v).sum())
                .collect()
        };
        let cases: [(&[f32], &[f32]); 3] = [
            (
                &[1.0, 2.0, 4.0, 8.0],
                &[1.0, 1.396, 2.352001, 3.288002, 5.768002, 8.0],
            ),
            (&[1.0, -2.0, 4.0, 8.0, 3.0], &[1.0, 4.0, 3.0]),
            (&[1.0, -2.0, 4.0, 8.0, 3.0], &[1.0]),
        ];
        for (x, want) in cases {
            let got = apply(x, want.len());
            for (g, w) in got.iter().zip(want) {
                assert!((g - w).abs() < 1e-5, "{got:?} vs {want:?}");
            }
        }
    }

    #[test]
    fn shift_mask_separates_regions() {
        // 4×4 grid, window 2, shift 1: the last window mixes four regions.
        let m = shifted_window_mask(4, 4, 2, 1);
        assert_eq!(m.len(), 4 * 16);
        assert!(m[..16].iter().all(|v| *v == 0.0));
        let last = &m[48..];
        for i in 0..4 {
            for j in 0..4 {
                assert_eq!(last[i * 4 + j], if i == j { 0.0 } else { -100.0 });
            }
        }
    }
}
