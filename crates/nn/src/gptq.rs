//! Calibrated 4-bit quantization of linear layers: GPTQ (Frantar et al. 2022, "GPTQ: Accurate
//! Post-Training Quantization for Generative Pre-trained Transformers").
//!
//! Round-to-nearest ([`crate::quant`]) rounds each weight on its own. GPTQ rounds the weights of
//! a layer one input column at a time and moves each rounding error onto the columns not yet
//! rounded, weighted by how the layer's inputs correlate, so that the layer's *outputs* on real
//! inputs change as little as possible: it minimises `‖X Wᵀ − X Ŵᵀ‖²` over the calibration inputs
//! `X`, through their Gram matrix `H = Xᵀ X`. The result is kept in the same int4 format as
//! round-to-nearest (one f32 scale per block of `block_size` in-features of one output, packed
//! nibbles; [`Int4Weight`]), so memory and every backend's forward are unchanged.
//!
//! Three steps, each usable on its own:
//!
//! 1. **Statistics.** [`calibration_scope`] runs a closure (the float model on calibration
//!    inputs) and records, for every [`Linear`](crate::Linear) loaded by a `VarBuilder` that runs
//!    inside it on this thread, the Gram matrix of its inputs (f64 `[in, in]`) and its float
//!    weight, keyed by the weight's name in the source (as [`LoadedWeights`
//!    ](crate::LoadedWeights) names it). Outside a scope a forward pays one thread-local read.
//! 2. **Solve.** [`gptq_int4`] quantizes one layer from its weight and statistics.
//! 3. **Load.** [`calibrate`] does both for a whole model (float, then optionally layer group by
//!    layer group on the partly quantized model) and returns [`CalibratedWeights`]; a load with
//!    [`LoadSettings::calibrated`](crate::LoadSettings::calibrated) keeps those layers as their
//!    codes and scales.
//!
//! # The solver
//!
//! `H` is damped by `λ = damp · mean(diag H)` (inputs that never fired get `H_ii = 1`). With `U`
//! the upper Cholesky factor of `H⁻¹` (computed as `J L⁻¹ J`, `L` the lower Cholesky factor of
//! `J H J`, `J` the reversal), column `c` of every row is rounded to `q` with its block's scale
//! and the error `e = (w_c − q) / U_cc` is subtracted as `w_{c+1..} −= e · U_{c, c+1..}`. Rows
//! are independent and solved in parallel. Each block's scale is chosen when the block starts,
//! from the error-updated weights ([`ScaleSearch`]); with [`GptqOptions::act_order`] columns are
//! visited by decreasing `H_ii` and the scales are fixed up front from the original weights
//! (static groups), so blocks stay contiguous in the stored layout. With `H = I` and
//! [`ScaleSearch::AbsMax`] / [`Int4Levels::Symmetric`] the result is round-to-nearest exactly.
//!
//! ```
//! use burn_flex::Flex;
//! use ipfs_accelerate_nn::gptq::{gptq_int4, GptqOptions, LayerInputs};
//! use ipfs_accelerate_nn::quant::{Int4Weight, LinearWeight};
//!
//! // A [4, 64] layer and 100 inputs whose features come in correlated pairs.
//! let (out, n) = (4, 64);
//! let w: Vec<f32> = (0..out * n).map(|i| (i as f32 * 0.37).sin()).collect();
//! let x: Vec<f64> = (0..100 * n).map(|i| ((i / 2) as f64 * 0.71).cos()).collect();
//! let mut gram = vec![0f64; n * n];
//! for row in x.chunks(n) {
//!     for i in 0..n {
//!         for j in 0..n {
//!             gram[i * n + j] += row[i] * row[j];
//!         }
//!     }
//! }
//! let inputs = LayerInputs::from_gram(gram, 100, w.clone(), out)?;
//! let q: Int4Weight = gptq_int4(&w, out, n, 32, &inputs, &GptqOptions::default())?;
//! assert_eq!((q.codes.len(), q.scales.len()), (out * n, out * 2));
//! // Kept exactly as round-to-nearest int4 weights are: packed nibbles and f32 scales.
//! let kept = LinearWeight::<Flex>::from_int4(&q, &Default::default())?;
//! assert_eq!(kept.bytes(), out * n / 2 + out * 2 * 4);
//! # Ok::<(), ipfs_accelerate_core::Error>(())
//! ```

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use burn::tensor::{backend::Backend, Tensor, TensorData};
use ipfs_accelerate_core::{Error, Result};
use rayon::prelude::*;

use crate::quant::{quantize_code, to_f32_vec, Int4Weight, LinearWeight};
use crate::weights::{load_scope, LoadSettings};
use crate::WeightQuantization;

/// The 4-bit codes a block may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Int4Levels {
    /// -7..=7 with a positive scale, `max|w| / 7` before any clipping: what round-to-nearest
    /// uses.
    Symmetric,
    /// -8..=7 with a signed scale that maps the block's largest-magnitude weight to -8 (as
    /// GGML's Q4_0): one more level, a step of `max|w| / 8`. Still no zero point; the stored
    /// format and the unpacking are the same.
    #[default]
    Full,
}

/// How a block's scale is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ScaleSearch {
    /// The largest magnitude maps to the largest code (no clipping).
    AbsMax,
    /// The scale among `max|w|·(1 − k/20)`, `k = 0..=10` (clipping up to half the range) with the
    /// least squared rounding error of the block's weights.
    Mse,
    /// The same candidates, judged by the error GPTQ itself minimises: the block is quantized
    /// with error feedback inside it for each candidate, and the one with the least
    /// `Σ ((w − q) / U_cc)²` wins. With [`GptqOptions::act_order`] (static scales), the squared
    /// error weighted by `H_ii` instead.
    #[default]
    GptqLoss,
}

/// Settings of the GPTQ solver and of [`calibrate`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GptqOptions {
    /// Damping: `λ = damp · mean(diag H)` is added to `H`'s diagonal (GPTQ's paper uses 0.01;
    /// 0.1 is better with the few thousand calibration tokens a small corpus gives).
    pub damp: f64,
    /// The codes a block may use.
    pub levels: Int4Levels,
    /// How each block's scale is chosen.
    pub scale_search: ScaleSearch,
    /// Visit columns by decreasing `H_ii` ("act-order"), with static per-block scales.
    pub act_order: bool,
    /// [`calibrate`]: quantize one group of layers at a time (layers that read the same input),
    /// recording each group's inputs on the model whose earlier layers are already quantized,
    /// instead of recording every layer's inputs once on the float model. One calibration pass
    /// (and one load) per group.
    pub sequential: bool,
}

impl Default for GptqOptions {
    fn default() -> Self {
        GptqOptions {
            damp: 0.1,
            levels: Int4Levels::Full,
            scale_search: ScaleSearch::GptqLoss,
            act_order: false,
            sequential: false,
        }
    }
}

impl GptqOptions {
    /// Checks the damping (finite, positive).
    pub fn validate(&self) -> Result<()> {
        if !(self.damp.is_finite() && self.damp > 0.0) {
            return Err(Error::InvalidInput(format!(
                "GPTQ damping must be a positive number, got {}",
                self.damp
            )));
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Statistics
// ---------------------------------------------------------------------------------------------

/// Rows gathered before they are added to a Gram matrix in one product.
const FLUSH_ROWS: usize = 512;

/// What a calibration recorded for one linear layer: its float weight and the Gram matrix of
/// its inputs.
#[derive(Debug, Clone)]
pub struct LayerInputs {
    in_dim: usize,
    out_dim: usize,
    rows: u64,
    gram: Vec<f64>,
    weight: Vec<f32>,
    pending: Vec<f32>,
}

impl LayerInputs {
    /// In-features.
    pub fn in_dim(&self) -> usize {
        self.in_dim
    }

    /// Out-features.
    pub fn out_dim(&self) -> usize {
        self.out_dim
    }

    /// Input rows (tokens) seen.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// `Σ xᵀx` over every input row, row-major `[in, in]`.
    pub fn gram(&self) -> &[f64] {
        &self.gram
    }

    /// The float weight the layer ran with, row-major `[out, in]`.
    pub fn weight(&self) -> &[f32] {
        &self.weight
    }

    /// A layer with Gram matrix `gram` over `rows` inputs (for callers that gather inputs
    /// themselves) and weight `weight` `[out, in]`.
    pub fn from_gram(gram: Vec<f64>, rows: u64, weight: Vec<f32>, out_dim: usize) -> Result<Self> {
        let in_dim = (gram.len() as f64).sqrt() as usize;
        if in_dim * in_dim != gram.len() || weight.len() != out_dim * in_dim {
            return Err(Error::InvalidInput(format!(
                "a Gram matrix of {} values and a weight of {} values are not [in, in] and \
                 [{out_dim}, in]",
                gram.len(),
                weight.len()
            )));
        }
        Ok(LayerInputs {
            in_dim,
            out_dim,
            rows,
            gram,
            weight,
            pending: Vec::new(),
        })
    }

    fn add(&mut self, x: &[f32]) -> Result<()> {
        self.pending.extend_from_slice(x);
        self.rows += (x.len() / self.in_dim.max(1)) as u64;
        if self.pending.len() >= FLUSH_ROWS * self.in_dim {
            self.flush()?;
        }
        Ok(())
    }

    /// Adds the pending rows' `xᵀx` (one f32 product on the CPU backend) to the f64 Gram matrix.
    fn flush(&mut self) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let n = self.in_dim;
        let rows = self.pending.len() / n;
        let x: Tensor<burn_flex::Flex, 2> = Tensor::from_data(
            TensorData::new(std::mem::take(&mut self.pending), [rows, n]),
            &Default::default(),
        );
        let product = to_f32_vec(x.clone().transpose().matmul(x))?;
        self.gram
            .iter_mut()
            .zip(product)
            .for_each(|(a, b)| *a += f64::from(b));
        Ok(())
    }
}

/// The inputs a [`calibration_scope`] recorded, by linear weight name.
#[derive(Debug, Default)]
pub struct Calibration {
    order: Vec<String>,
    layers: HashMap<String, LayerInputs>,
    error: Option<Error>,
}

impl Calibration {
    /// The recorded layers, by weight name.
    pub fn layers(&self) -> &HashMap<String, LayerInputs> {
        &self.layers
    }

    /// One layer's record.
    pub fn get(&self, name: &str) -> Option<&LayerInputs> {
        self.layers.get(name)
    }

    /// Weight names in the order their layers first ran.
    pub fn order(&self) -> &[String] {
        &self.order
    }

    /// The record, or the first error met while recording (an input that could not be read back
    /// from the device).
    pub fn into_result(self) -> Result<Self> {
        match self.error {
            Some(e) => Err(e),
            None => Ok(self),
        }
    }
}

thread_local! {
    static DEPTH: Cell<usize> = const { Cell::new(0) };
    static RECORDERS: RefCell<Vec<Calibration>> = const { RefCell::new(Vec::new()) };
}

/// Pops the recorder pushed by [`calibration_scope`], also when the closure panics.
struct PopOnDrop;

impl Drop for PopOnDrop {
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
    }
}

/// Runs `run` and records, for every float [`Linear`](crate::Linear) that was loaded by a
/// `VarBuilder` and runs on this thread inside it, the Gram matrix of its inputs and its weight
/// (see the [module documentation](self)). Scopes nest; the innermost records.
pub fn calibration_scope<T>(run: impl FnOnce() -> T) -> (T, Calibration) {
    RECORDERS.with(|r| r.borrow_mut().push(Calibration::default()));
    DEPTH.with(|d| d.set(d.get() + 1));
    let guard = PopOnDrop;
    let out = run();
    drop(guard);
    let mut calibration = RECORDERS.with(|r| r.borrow_mut().pop()).unwrap_or_default();
    for layer in calibration.layers.values_mut() {
        if let Err(e) = layer.flush() {
            calibration.error.get_or_insert(e);
        }
    }
    (out, calibration)
}

/// Records `x` (`[rows, in]`), the input of the layer whose weight is `weight`, when a
/// [`calibration_scope`] is active on this thread. [`Linear`](crate::Linear)'s forward calls it.
pub(crate) fn observe<B: Backend>(weight: &LinearWeight<B>, x: &Tensor<B, 2>) {
    if DEPTH.with(Cell::get) == 0 {
        return;
    }
    let Some(name) = weight.name() else { return };
    if weight.quantization() != WeightQuantization::None || x.dims()[1] != weight.in_dim() {
        return;
    }
    let values = to_f32_vec(x.clone());
    RECORDERS.with(|r| {
        let mut recorders = r.borrow_mut();
        let Some(rec) = recorders.last_mut() else {
            return;
        };
        let values = match values {
            Ok(v) => v,
            Err(e) => {
                rec.error.get_or_insert(e);
                return;
            }
        };
        if !rec.layers.contains_key(name) {
            let w = match weight.to_out_in_f32() {
                Ok(w) => w,
                Err(e) => {
                    rec.error.get_or_insert(e);
                    return;
                }
            };
            let n = weight.in_dim();
            rec.order.push(name.to_string());
            rec.layers.insert(
                name.to_string(),
                LayerInputs {
                    in_dim: n,
                    out_dim: weight.out_dim(),
                    rows: 0,
                    gram: vec![0.0; n * n],
                    weight: w,
                    pending: Vec::new(),
                },
            );
        }
        if let Some(Err(e)) = rec.layers.get_mut(name).map(|l| l.add(&values)) {
            rec.error.get_or_insert(e);
        }
    });
}

// ---------------------------------------------------------------------------------------------
// The solver
// ---------------------------------------------------------------------------------------------

/// Rows solved together (each row of `U` is read once per tile).
const ROW_TILE: usize = 8;

/// Clipping candidates: `1 − k / CLIP_GRID` of the full-range scale for `k = 0..=CLIP_STEPS`.
const CLIP_GRID: usize = 20;
const CLIP_STEPS: usize = 10;

/// GPTQ-quantizes the row-major `[out, in]` `weight` to int4 blocks of `block_size` in-features,
/// minimising the output error on the inputs `inputs` recorded (see the
/// [module documentation](self)).
pub fn gptq_int4(
    weight: &[f32],
    out_dim: usize,
    in_dim: usize,
    block_size: usize,
    inputs: &LayerInputs,
    options: &GptqOptions,
) -> Result<Int4Weight> {
    options.validate()?;
    let q = WeightQuantization::Int4 { block_size };
    q.validate()?;
    let n = in_dim;
    if weight.len() != out_dim * n || inputs.in_dim != n || !q.fits(n) {
        return Err(Error::InvalidInput(format!(
            "GPTQ: a weight of {} values is not [{out_dim}, {n}] with whole blocks of {block_size} \
             and inputs of {} features",
            weight.len(),
            inputs.in_dim
        )));
    }
    if weight.iter().any(|w| !w.is_finite()) || inputs.gram.iter().any(|g| !g.is_finite()) {
        return Err(Error::InvalidInput(
            "GPTQ: the weight or the recorded inputs are not finite".into(),
        ));
    }
    let mut diag: Vec<f64> = (0..n).map(|i| inputs.gram[i * n + i]).collect();
    // Inputs that never fired: any value of theirs is as good; keep the weights, no feedback.
    for d in diag.iter_mut() {
        if *d <= 0.0 {
            *d = 1.0;
        }
    }
    let perm: Vec<usize> = if options.act_order {
        let mut p: Vec<usize> = (0..n).collect();
        p.sort_by(|&a, &b| diag[b].total_cmp(&diag[a]));
        p
    } else {
        (0..n).collect()
    };
    let u = inverse_upper_factor(&inputs.gram, &diag, &perm, options.damp)?;
    let lo = match options.levels {
        Int4Levels::Symmetric => -7,
        Int4Levels::Full => -8,
    };
    let blocks = n / block_size;
    let mut codes = vec![0i8; out_dim * n];
    let mut scales = vec![0f32; out_dim * blocks];
    let solver = RowSolver {
        n,
        block: block_size,
        u: &u,
        perm: &perm,
        diag: &diag,
        options,
        lo,
    };
    codes
        .par_chunks_mut(ROW_TILE * n)
        .zip(scales.par_chunks_mut(ROW_TILE * blocks))
        .zip(weight.par_chunks(ROW_TILE * n))
        .for_each(|((codes, scales), w)| solver.solve(w, codes, scales));
    Ok(Int4Weight {
        out_dim,
        in_dim: n,
        block_size,
        codes,
        scales,
    })
}

/// `U`, the upper Cholesky factor of `(H_p + λI)⁻¹` where `H_p` is `H` with rows and columns in
/// the order `perm` and the diagonal `diag`: `J L⁻¹ J` with `L` the lower factor of `J H_p J`.
/// Row-major `[n, n]` (zeros below the diagonal). Retries with ten times the damping (twice) when
/// `H` is not positive definite in floating point.
fn inverse_upper_factor(gram: &[f64], diag: &[f64], perm: &[usize], damp: f64) -> Result<Vec<f64>> {
    let n = perm.len();
    let mean = diag.iter().sum::<f64>() / n.max(1) as f64;
    // Row i of J H_p J is row perm[n-1-i] of H, columns in the same order.
    let rev: Vec<usize> = perm.iter().rev().copied().collect();
    let mut damp = damp;
    for _ in 0..3 {
        let lambda = damp * mean;
        let rows: Vec<Vec<f64>> = (0..n)
            .map(|i| {
                (0..=i)
                    .map(|j| {
                        let (a, b) = (rev[i], rev[j]);
                        let h = if a == b { diag[a] } else { gram[a * n + b] };
                        h + if i == j { lambda } else { 0.0 }
                    })
                    .collect()
            })
            .collect();
        if let Some(l) = cholesky_lower(rows) {
            let x = invert_lower(&l);
            let mut u = vec![0f64; n * n];
            for (i, row) in u.chunks_mut(n.max(1)).enumerate() {
                // U[i][j] = X[n-1-i][n-1-j] for j >= i.
                let xr = &x[n - 1 - i];
                for (j, v) in row.iter_mut().enumerate().skip(i) {
                    *v = xr[n - 1 - j];
                }
            }
            return Ok(u);
        }
        damp *= 10.0;
    }
    Err(Error::Compute(
        "GPTQ: the inputs' Gram matrix is not positive definite even with 100x the damping".into(),
    ))
}

/// Lower Cholesky factor of the symmetric matrix whose lower triangle is `rows` (row `i` holds
/// columns `0..=i`), in place; `None` when it is not positive definite.
fn cholesky_lower(mut rows: Vec<Vec<f64>>) -> Option<Vec<Vec<f64>>> {
    let n = rows.len();
    for j in 0..n {
        let (done, rest) = rows.split_at_mut(j);
        let _ = done;
        let (row_j, below) = rest.split_first_mut()?;
        let s = row_j[j] - dot(&row_j[..j], &row_j[..j]);
        if !(s > 0.0 && s.is_finite()) {
            return None;
        }
        let d = s.sqrt();
        row_j[j] = d;
        let lj = &row_j[..j];
        below.par_iter_mut().for_each(|row_i| {
            let v = (row_i[j] - dot(&row_i[..j], lj)) / d;
            row_i[j] = v;
        });
    }
    Some(rows)
}

/// The inverse of the lower-triangular `l` (row `i` holds columns `0..=i`), same layout.
fn invert_lower(l: &[Vec<f64>]) -> Vec<Vec<f64>> {
    let n = l.len();
    // Column-major copy of L (column b holds rows b..n) so each step reads contiguous memory.
    let cols: Vec<Vec<f64>> = (0..n).map(|b| (b..n).map(|m| l[m][b]).collect()).collect();
    // Row a of X = L⁻¹ solves Lᵀ x = e_a: x[a] = 1 / L_aa, then backwards
    // x[b] = −(Σ_{m=b+1..=a} L[m][b] x[m]) / L[b][b].
    (0..n)
        .into_par_iter()
        .map(|a| {
            let mut x = vec![0f64; a + 1];
            x[a] = 1.0 / l[a][a];
            for b in (0..a).rev() {
                let col = &cols[b][1..=a - b];
                x[b] = -dot(col, &x[b + 1..=a]) / l[b][b];
            }
            x
        })
        .collect()
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// What every tile of rows shares.
struct RowSolver<'a> {
    n: usize,
    block: usize,
    u: &'a [f64],
    perm: &'a [usize],
    diag: &'a [f64],
    options: &'a GptqOptions,
    lo: i8,
}

impl RowSolver<'_> {
    /// Quantizes a tile of rows (`w`: row-major `[rows, n]`) into `codes` and `scales`.
    fn solve(&self, w: &[f32], codes: &mut [i8], scales: &mut [f32]) {
        let (n, g) = (self.n, self.block);
        let rows = w.len() / n;
        let blocks = n / g;
        // The working rows, in the visiting order.
        let mut work: Vec<f64> = Vec::with_capacity(rows * n);
        for r in 0..rows {
            work.extend(self.perm.iter().map(|&c| f64::from(w[r * n + c])));
        }
        if self.options.act_order {
            // Static groups: every block's scale from the original weights.
            for r in 0..rows {
                for b in 0..blocks {
                    let range = b * g..(b + 1) * g;
                    let weights: Vec<f64> = range.clone().map(|c| self.diag[c]).collect();
                    let search = match self.options.scale_search {
                        ScaleSearch::GptqLoss => ScaleSearch::Mse,
                        s => s,
                    };
                    let weighted = self.options.scale_search == ScaleSearch::GptqLoss;
                    let values: Vec<f64> = w[r * n + b * g..r * n + (b + 1) * g]
                        .iter()
                        .map(|&v| f64::from(v))
                        .collect();
                    scales[r * blocks + b] = self.choose_scale(
                        &values,
                        search,
                        weighted.then_some(weights.as_slice()),
                        None,
                    );
                }
            }
        }
        let mut err = vec![0f64; rows];
        for c in 0..n {
            if !self.options.act_order && c % g == 0 {
                let ub = self.u_block(c);
                for r in 0..rows {
                    let values = &work[r * n + c..r * n + c + g];
                    let search = self.options.scale_search;
                    scales[r * blocks + c / g] = self.choose_scale(values, search, None, Some(&ub));
                }
            }
            let orig = self.perm[c];
            let ucc = self.u[c * n + c];
            for r in 0..rows {
                let s = scales[r * blocks + orig / g];
                let x = work[r * n + c];
                let q = quantize_code(x as f32, s, self.lo);
                codes[r * n + orig] = q;
                err[r] = (x - f64::from(q) * f64::from(s)) / ucc;
            }
            let urow = &self.u[c * n + c + 1..(c + 1) * n];
            for (r, e) in err.iter().enumerate() {
                if *e != 0.0 {
                    let dst = &mut work[r * n + c + 1..(r + 1) * n];
                    dst.iter_mut().zip(urow).for_each(|(d, u)| *d -= e * u);
                }
            }
        }
    }

    /// `U[c..c+g, c..c+g]`, row-major.
    fn u_block(&self, c: usize) -> Vec<f64> {
        let (n, g) = (self.n, self.block);
        (0..g)
            .flat_map(|i| self.u[(c + i) * n + c..(c + i) * n + c + g].iter().copied())
            .collect()
    }

    /// The scale of a block of `values` (f32 storage): the full-range scale, or the best clipped
    /// one by `search` (squared error, weighted by `weights` when given, or GPTQ's in-block loss
    /// with the block `ub` of `U`).
    fn choose_scale(
        &self,
        values: &[f64],
        search: ScaleSearch,
        weights: Option<&[f64]>,
        ub: Option<&[f64]>,
    ) -> f32 {
        // Computed in f32 as round-to-nearest does, so that `H = I` reproduces it exactly.
        let as32: Vec<f32> = values.iter().map(|&v| v as f32).collect();
        let (extreme, den) = match self.lo {
            -7 => (as32.iter().fold(0f32, |m, v| m.max(v.abs())), 7.0f32),
            _ => {
                let m = as32
                    .iter()
                    .copied()
                    .fold(0f32, |m, v| if v.abs() > m.abs() { v } else { m });
                (-m, 8.0)
            }
        };
        if extreme == 0.0 || !extreme.is_finite() {
            return 1.0;
        }
        let full = extreme / den;
        if search == ScaleSearch::AbsMax {
            return full;
        }
        let mut best = (f64::INFINITY, full);
        for k in 0..=CLIP_STEPS {
            let s = extreme * (1.0 - k as f32 / CLIP_GRID as f32) / den;
            let loss = match (search, ub) {
                (ScaleSearch::GptqLoss, Some(ub)) => self.block_loss(values, s, ub),
                _ => values
                    .iter()
                    .enumerate()
                    .map(|(i, &v)| {
                        let d = v - f64::from(quantize_code(v as f32, s, self.lo)) * f64::from(s);
                        d * d * weights.map_or(1.0, |w| w[i])
                    })
                    .sum(),
            };
            if loss < best.0 {
                best = (loss, s);
            }
        }
        best.1
    }

    /// GPTQ's loss `Σ e²` over one block quantized with scale `s` and error feedback inside it.
    fn block_loss(&self, values: &[f64], s: f32, ub: &[f64]) -> f64 {
        let g = values.len();
        let mut w = values.to_vec();
        let mut loss = 0.0;
        for j in 0..g {
            let q = quantize_code(w[j] as f32, s, self.lo);
            let e = (w[j] - f64::from(q) * f64::from(s)) / ub[j * g + j];
            loss += e * e;
            for (k, wk) in w.iter_mut().enumerate().skip(j + 1) {
                *wk -= e * ub[j * g + k];
            }
        }
        loss
    }
}

// ---------------------------------------------------------------------------------------------
// Whole models
// ---------------------------------------------------------------------------------------------

/// Int4 codes and scales a calibration chose, by linear weight name. Clones share them; a load
/// with [`LoadSettings::calibrated`](crate::LoadSettings::calibrated) keeps those layers so.
#[derive(Clone, Default)]
pub struct CalibratedWeights(Arc<Inner>);

#[derive(Default)]
struct Inner {
    id: u64,
    layers: HashMap<String, Int4Weight>,
}

impl CalibratedWeights {
    /// A set from `layers` (weight name → codes and scales).
    pub fn new(layers: HashMap<String, Int4Weight>) -> Self {
        static IDS: AtomicU64 = AtomicU64::new(1);
        CalibratedWeights(Arc::new(Inner {
            id: IDS.fetch_add(1, Ordering::Relaxed),
            layers,
        }))
    }

    /// The codes and scales of the weight named `name`.
    pub fn get(&self, name: &str) -> Option<&Int4Weight> {
        self.0.layers.get(name)
    }

    /// Number of layers.
    pub fn len(&self) -> usize {
        self.0.layers.len()
    }

    /// Whether it holds no layer.
    pub fn is_empty(&self) -> bool {
        self.0.layers.is_empty()
    }

    /// The layers' weight names (unordered).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.layers.keys().map(String::as_str)
    }

    /// A number that tells this set from the others of this process (registry entry names of
    /// the weights built from it).
    pub fn id(&self) -> u64 {
        self.0.id
    }
}

impl PartialEq for CalibratedWeights {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for CalibratedWeights {}

impl std::fmt::Debug for CalibratedWeights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CalibratedWeights")
            .field("id", &self.0.id)
            .field("layers", &self.0.layers.len())
            .finish()
    }
}

/// The block size of `q` when it can be calibrated (valid [`WeightQuantization::Int4`]); an error
/// naming the quantization otherwise.
pub fn calibration_block_size(q: WeightQuantization) -> Result<usize> {
    let WeightQuantization::Int4 { block_size } = q else {
        return Err(Error::InvalidInput(format!(
            "calibration (GPTQ) applies to int4 weights: add `.quantize(Int4 {{ .. }})` (got {q:?})"
        )));
    };
    q.validate()?;
    Ok(block_size)
}

/// Calibrates a model's linear layers for int4: loads it with `load` (inside a [`load_scope`]
/// with `settings`' residency and holder, float weights, unshared), runs the calibration inputs
/// through it with `run` inside a [`calibration_scope`], and GPTQ-quantizes every recorded layer
/// whose in-features fit `settings.quantization`'s block size ([`WeightQuantization::Int4`]
/// only). With [`GptqOptions::sequential`] it repeats load and run once per group of layers that
/// read the same input, in the order they run, each load keeping the groups already quantized.
/// Layers that never ran (a head the calibration does not use) are not in the result: a load
/// with it quantizes them to nearest.
pub fn calibrate<M, E: From<Error>>(
    settings: &LoadSettings,
    options: &GptqOptions,
    mut load: impl FnMut() -> std::result::Result<M, E>,
    mut run: impl FnMut(&M) -> std::result::Result<(), E>,
) -> std::result::Result<CalibratedWeights, E> {
    options.validate()?;
    let block_size = calibration_block_size(settings.quantization)?;
    let mut done: HashMap<String, Int4Weight> = HashMap::new();
    let mut calibrated = CalibratedWeights::new(HashMap::new());
    loop {
        let scoped = settings
            .clone()
            .quantize(WeightQuantization::None)
            .share(false)
            .calibrated(Some(calibrated.clone()));
        let (model, _loaded) = load_scope(scoped, &mut load);
        let model = model?;
        let (ran, record) = calibration_scope(|| run(&model));
        drop(model);
        ran?;
        let record = record.into_result()?;
        let pending: Vec<&String> = record
            .order()
            .iter()
            .filter(|name| !done.contains_key(*name))
            .filter(|name| {
                record
                    .get(name)
                    .is_some_and(|l| l.rows > 0 && l.in_dim.is_multiple_of(block_size))
            })
            .collect();
        let Some(first) = pending.first().and_then(|n| record.get(n)) else {
            break;
        };
        let group: Vec<&String> = if options.sequential {
            let same = |l: &LayerInputs| l.rows == first.rows && l.gram == first.gram;
            pending
                .into_iter()
                .filter(|n| record.get(n).is_some_and(same))
                .collect()
        } else {
            pending
        };
        let solved: Vec<(String, Int4Weight)> = group
            .par_iter()
            .map(|name| {
                let l = record.get(name).ok_or_else(|| {
                    Error::Compute(format!("calibration lost the record of `{name}`"))
                })?;
                let q = gptq_int4(&l.weight, l.out_dim, l.in_dim, block_size, l, options)?;
                Ok(((*name).clone(), q))
            })
            .collect::<Result<_>>()?;
        done.extend(solved);
        calibrated = CalibratedWeights::new(done.clone());
        if !options.sequential {
            break;
        }
    }
    Ok(calibrated)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Linear, VarBuilder};
    use ipfs_accelerate_core::{HostTensor, TensorSource};
    use rand::{Rng, SeedableRng};
    use std::collections::HashSet;

    type Flex = burn_flex::Flex;

    fn names_of(calibrated: &CalibratedWeights) -> HashSet<String> {
        calibrated.names().map(str::to_string).collect()
    }

    /// Named tensors in memory.
    struct Tensors(HashMap<String, HostTensor>);

    impl TensorSource for Tensors {
        fn source_name(&self) -> String {
            "test tensors".into()
        }
        fn contains(&self, name: &str) -> bool {
            self.0.contains_key(name)
        }
        fn shape_of(&self, name: &str) -> Option<Vec<usize>> {
            self.0.get(name).map(|t| t.shape().to_vec())
        }
        fn tensor(&self, name: &str) -> Result<HostTensor> {
            self.0
                .get(name)
                .cloned()
                .ok_or_else(|| Error::MissingTensor {
                    name: name.into(),
                    source_name: self.source_name(),
                })
        }
        fn names(&self) -> Vec<String> {
            self.0.keys().cloned().collect()
        }
    }

    fn gaussian(rng: &mut rand::rngs::StdRng) -> f64 {
        // Box–Muller.
        let (a, b): (f64, f64) = (rng.random::<f64>().max(1e-12), rng.random::<f64>());
        (-2.0 * a.ln()).sqrt() * (std::f64::consts::TAU * b).cos()
    }

    /// `rows` inputs of `n` features, correlated: a random mix of `n / 4` factors, plus noise
    /// and a few features of large magnitude (as transformer activations have).
    fn correlated_inputs(rng: &mut rand::rngs::StdRng, rows: usize, n: usize) -> Vec<f64> {
        let k = n / 4;
        let mix: Vec<f64> = (0..k * n).map(|_| gaussian(rng)).collect();
        let mut x = vec![0f64; rows * n];
        for r in 0..rows {
            let z: Vec<f64> = (0..k).map(|_| gaussian(rng)).collect();
            for j in 0..n {
                let mut v = 0.1 * gaussian(rng);
                for (f, zf) in z.iter().enumerate() {
                    v += zf * mix[f * n + j];
                }
                x[r * n + j] = v * if j % 17 == 3 { 6.0 } else { 1.0 };
            }
        }
        x
    }

    fn gram_of(x: &[f64], n: usize) -> Vec<f64> {
        let mut g = vec![0f64; n * n];
        for row in x.chunks(n) {
            for i in 0..n {
                for j in 0..n {
                    g[i * n + j] += row[i] * row[j];
                }
            }
        }
        g
    }

    /// `‖X Wᵀ − X Ŵᵀ‖²` (Frobenius).
    fn output_error(x: &[f64], w: &[f32], q: &[f32], out: usize, n: usize) -> f64 {
        let mut total = 0.0;
        for row in x.chunks(n) {
            for o in 0..out {
                let d: f64 = (0..n)
                    .map(|i| row[i] * f64::from(w[o * n + i] - q[o * n + i]))
                    .sum();
                total += d * d;
            }
        }
        total
    }

    #[test]
    fn gptq_beats_round_to_nearest_on_correlated_inputs() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let (out, n, rows, block) = (24, 64, 512, 16);
        let w: Vec<f32> = (0..out * n).map(|_| gaussian(&mut rng) as f32).collect();
        let x = correlated_inputs(&mut rng, rows, n);
        let inputs = LayerInputs::from_gram(gram_of(&x, n), rows as u64, w.clone(), out).unwrap();
        let rtn = Int4Weight::round_to_nearest(&w, out, n, block)
            .unwrap()
            .dequantize();
        let rtn_err = output_error(&x, &w, &rtn, out, n);
        for options in [
            GptqOptions::default(),
            GptqOptions {
                damp: 0.01,
                levels: Int4Levels::Symmetric,
                scale_search: ScaleSearch::AbsMax,
                ..Default::default()
            },
            GptqOptions {
                act_order: true,
                ..Default::default()
            },
            GptqOptions {
                scale_search: ScaleSearch::Mse,
                ..Default::default()
            },
        ] {
            let q = gptq_int4(&w, out, n, block, &inputs, &options).unwrap();
            q.validate().unwrap();
            let err = output_error(&x, &w, &q.dequantize(), out, n);
            eprintln!("{options:?}: output error {err:.3} vs round-to-nearest {rtn_err:.3}");
            assert!(
                err < 0.8 * rtn_err,
                "{options:?}: GPTQ error {err} vs round-to-nearest {rtn_err}"
            );
        }
    }

    #[test]
    fn identity_statistics_reproduce_round_to_nearest_exactly() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let (out, n, block) = (5, 96, 32);
        let mut w: Vec<f32> = (0..out * n).map(|_| gaussian(&mut rng) as f32).collect();
        // An all-zero block and a tie-prone block.
        w[n..n + block].iter_mut().for_each(|v| *v = 0.0);
        w[2 * n..2 * n + block]
            .iter_mut()
            .enumerate()
            .for_each(|(i, v)| *v = (i as f32 - 16.0) * 0.5);
        let eye: Vec<f64> = (0..n * n)
            .map(|i| if i / n == i % n { 1.0 } else { 0.0 })
            .collect();
        let inputs = LayerInputs::from_gram(eye, n as u64, w.clone(), out).unwrap();
        let options = GptqOptions {
            levels: Int4Levels::Symmetric,
            scale_search: ScaleSearch::AbsMax,
            ..Default::default()
        };
        let q = gptq_int4(&w, out, n, block, &inputs, &options).unwrap();
        let rtn = Int4Weight::round_to_nearest(&w, out, n, block).unwrap();
        assert_eq!(q, rtn);
        // And the full range maps each block's largest magnitude to -8 exactly.
        let full = GptqOptions {
            scale_search: ScaleSearch::AbsMax,
            ..Default::default()
        };
        let q = gptq_int4(&w, out, n, block, &inputs, &full).unwrap();
        for (b, chunk) in w.chunks(block).enumerate() {
            let (i, _) = chunk.iter().enumerate().fold((0, 0f32), |m, (i, v)| {
                if v.abs() > m.1.abs() {
                    (i, *v)
                } else {
                    m
                }
            });
            if chunk.iter().any(|v| *v != 0.0) {
                assert_eq!(q.codes[b * block + i], -8, "block {b}");
            }
        }
    }

    #[test]
    fn bad_shapes_and_options_are_typed_errors() {
        let w = vec![0.5f32; 4 * 32];
        let eye: Vec<f64> = (0..32 * 32)
            .map(|i| if i / 32 == i % 32 { 1.0 } else { 0.0 })
            .collect();
        let inputs = LayerInputs::from_gram(eye, 32, w.clone(), 4).unwrap();
        let o = GptqOptions::default();
        assert!(gptq_int4(&w, 4, 32, 24, &inputs, &o).is_err());
        assert!(gptq_int4(&w[..64], 4, 32, 32, &inputs, &o).is_err());
        assert!(gptq_int4(&w, 4, 32, 0, &inputs, &o).is_err());
        let nan = GptqOptions {
            damp: f64::NAN,
            ..o
        };
        assert!(gptq_int4(&w, 4, 32, 32, &inputs, &nan).is_err());
        assert!(LayerInputs::from_gram(vec![0.0; 10], 1, w, 4).is_err());
    }

    /// A two-layer MLP `[in] → [hidden] → [out]` as named tensors.
    fn mlp_source(rng: &mut rand::rngs::StdRng, n: usize, hidden: usize) -> Arc<dyn TensorSource> {
        let mut map = HashMap::new();
        let mut put = |name: &str, shape: Vec<usize>, rng: &mut rand::rngs::StdRng| {
            let len = shape.iter().product::<usize>();
            let v: Vec<f32> = (0..len).map(|_| 0.2 * gaussian(rng) as f32).collect();
            map.insert(name.to_string(), HostTensor::from_f32(shape, &v).unwrap());
        };
        put("up.weight", vec![hidden, n], rng);
        put("up.bias", vec![hidden], rng);
        put("down.weight", vec![n, hidden], rng);
        Arc::new(Tensors(map))
    }

    struct Mlp {
        up: Linear<Flex>,
        down: Linear<Flex>,
    }

    impl Mlp {
        fn load(source: &Arc<dyn TensorSource>, n: usize, hidden: usize) -> Result<Self> {
            let vb = VarBuilder::<Flex>::new(source.clone(), &Default::default());
            Ok(Mlp {
                up: Linear::load(&vb.pp("up"), n, hidden, true)?,
                down: Linear::load(&vb.pp("down"), hidden, n, false)?,
            })
        }

        fn forward(&self, x: Tensor<Flex, 2>) -> Tensor<Flex, 2> {
            self.down
                .forward(self.up.forward_act(x, crate::Activation::Gelu))
        }
    }

    fn tensor(x: &[f64], n: usize) -> Tensor<Flex, 2> {
        let v: Vec<f32> = x.iter().map(|&v| v as f32).collect();
        Tensor::from_data(TensorData::new(v, [x.len() / n, n]), &Default::default())
    }

    #[test]
    fn calibrating_a_model_records_its_inputs_and_lowers_its_output_error() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let (n, hidden) = (64, 96);
        let source = mlp_source(&mut rng, n, hidden);
        let calib = correlated_inputs(&mut rng, 256, n);
        let test = correlated_inputs(&mut rng, 128, n);
        let float = Mlp::load(&source, n, hidden).unwrap();

        // The recorder sees exactly the layer's inputs: here the first layer's are `calib`.
        let (_, record) = calibration_scope(|| float.forward(tensor(&calib, n)));
        let record = record.into_result().unwrap();
        assert_eq!(record.order(), ["up.weight", "down.weight"]);
        let up = record.get("up.weight").unwrap();
        assert_eq!((up.rows(), up.in_dim(), up.out_dim()), (256, n, hidden));
        let expected = gram_of(&calib, n);
        for (a, b) in up.gram().iter().zip(&expected) {
            assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{a} vs {b}");
        }
        assert_eq!(record.get("down.weight").unwrap().in_dim(), hidden);
        // No scope, no record (and nested scopes record in the innermost).
        let (_, outer) = calibration_scope(|| {
            let (_, inner) = calibration_scope(|| float.forward(tensor(&calib[..n], n)));
            assert_eq!(inner.layers().len(), 2);
        });
        assert!(outer.layers().is_empty());

        let reference = to_f32_vec(float.forward(tensor(&test, n))).unwrap();
        let q = WeightQuantization::Int4 { block_size: 32 };
        let error_of = |settings: LoadSettings| -> (f64, crate::WeightStats) {
            let (model, loaded) = load_scope(settings, || Mlp::load(&source, n, hidden));
            let got = to_f32_vec(model.unwrap().forward(tensor(&test, n))).unwrap();
            let err = got
                .iter()
                .zip(&reference)
                .map(|(a, b)| f64::from(a - b).powi(2))
                .sum::<f64>();
            (err, loaded.stats())
        };
        let (rtn, rtn_stats) = error_of(LoadSettings::default().quantize(q));
        assert_eq!(rtn_stats.linear_calibrated, 0);
        for options in [
            GptqOptions::default(),
            GptqOptions {
                sequential: true,
                ..Default::default()
            },
        ] {
            let settings = LoadSettings::default().quantize(q);
            let calibrated = calibrate(
                &settings,
                &options,
                || Mlp::load(&source, n, hidden),
                |m: &Mlp| {
                    m.forward(tensor(&calib, n));
                    Ok::<_, Error>(())
                },
            )
            .unwrap();
            assert_eq!(
                names_of(&calibrated),
                HashSet::from(["up.weight".to_string(), "down.weight".to_string()])
            );
            let (err, stats) = error_of(settings.calibrated(Some(calibrated)));
            eprintln!("{options:?}: output error {err:.4} vs round-to-nearest {rtn:.4}");
            assert_eq!(stats.linear_calibrated, 2);
            assert_eq!(stats.linear_quantized, 2);
            assert_eq!(stats.linear_bytes, rtn_stats.linear_bytes);
            assert!(err < 0.8 * rtn, "{options:?}: {err} vs {rtn}");
        }
        // Only int4 is calibrated.
        let int8 = LoadSettings::default().quantize(WeightQuantization::Int8 { block_size: 32 });
        let err = calibrate(
            &int8,
            &GptqOptions::default(),
            || Mlp::load(&source, n, hidden),
            |_: &Mlp| Ok::<_, Error>(()),
        )
        .unwrap_err();
        assert!(err.to_string().contains("int4"), "{err}");
    }
}
