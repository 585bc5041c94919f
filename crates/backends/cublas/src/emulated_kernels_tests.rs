//! The decoder's weight kernels (`gemv_*`, `dequant_*` of decoder.cu) run on the host: the whole
//! f32 kernel source compiled by the host's C++ compiler against `host_emulation.h` (a block's
//! threads as std::threads, barriers for `__syncthreads` and the warp shuffles), then compared
//! with products computed here from the reference dequantisation. It checks the kernels' logic
//! for dense rows and every block format — units, the RMSNorm prologue, bias and residual
//! epilogues, a part's column offset and output stride, rows past a block's last warp — without
//! a GPU (the f16 storage and the device's scheduling are not covered).

use std::path::Path;
use std::process::{Command, Stdio};

use crate::compile::{kernel_source, KernelSet};
use crate::decoder::BLOCK_FORMATS;
use crate::engine::Elem;
use crate::ggml_blocks_tests::{f16_fields, random_rows};
use ipfs_accelerate_kernels::{dequantize_row, BlockType};

const HARNESS: &str = r#"
typedef void (*Gemv)(const unsigned char*, long long, const T*, int, int, int, int, const T*,
                     const T*, float, const T*, const T*, T*, int, int, int, int);
typedef void (*Deq)(const unsigned char*, long long, const int*, int, int, T*);
static Gemv gemvs[] = {gemv_dense, gemv_q8_0, gemv_q4_0, gemv_q4_1, gemv_q5_0,
                       gemv_q5_1,  gemv_q4_k, gemv_q5_k, gemv_q6_k};
static Gemv gemv1s[] = {gemv1_dense, gemv1_q8_0, gemv1_q4_0, gemv1_q4_1, gemv1_q5_0,
                        gemv1_q5_1,  gemv1_q4_k, gemv1_q5_k, gemv1_q6_k};
static Deq deqs[] = {dequant_dense, dequant_q8_0, dequant_q4_0, dequant_q4_1, dequant_q5_0,
                     dequant_q5_1,  dequant_q4_k, dequant_q5_k, dequant_q6_k};
static T* to_t(const float* v, size_t n) {
    T* t = (T*)aligned_alloc(64, (n * sizeof(T) + 63) / 64 * 64);
    for (size_t i = 0; i < n; ++i) t[i] = st(v[i]);
    return t;
}
static void put(const T* v, size_t n) {
    for (size_t i = 0; i < n; ++i) {
        float f = ld(v[i]);
        fwrite(&f, sizeof(float), 1, stdout);
    }
}
int main(void) {
    // format, out, k, rows, x_stride, y_stride, y_offset, gamma, bias, in_place, split, gated,
    // beta (LayerNorm), act
    int* h = take<int>(14);
    long long row_bytes = *take<long long>(1);
    int f = h[0], out = h[1], k = h[2], rows = h[3], xs = h[4], ys = h[5], off = h[6];
    unsigned char* w = (unsigned char*)aligned_alloc(64, ((size_t)out * row_bytes + 63) / 64 * 64);
    if (fread(w, 1, (size_t)out * row_bytes, stdin) != (size_t)out * row_bytes) exit(3);
    T* x = to_t(take<float>((size_t)rows * xs), (size_t)rows * xs);
    T* gamma = to_t(take<float>(k), k);
    T* beta = to_t(take<float>(k), k);
    T* bias = to_t(take<float>(out), out);
    T* y = to_t(take<float>((size_t)rows * ys), (size_t)rows * ys);
    int n_ids = *take<int>(1);
    int* ids = take<int>(n_ids);
    // Gated: the first 2 * (out / 2) rows are out / 2 gate rows, then as many up rows.
    int split = h[10], gated = h[11];
    int outputs = gated < 0 ? out : out / 2, per_block = gated < 0 ? 8 / split : 4 / split;
    emu_launch({(unsigned)((outputs + per_block - 1) / per_block), 1, 1}, {256, 1, 1}, [&] {
        // The wide dense kernels for a LayerNorm prologue or an activation epilogue.
        Gemv g = h[12] || h[13] >= 0 ? (rows == 1 ? gemv1_wide_dense : gemv_wide_dense)
                                     : (rows == 1 ? gemv1s : gemvs)[f];
        g(w, row_bytes, x, xs, rows, outputs, k, h[7] ? gamma : nullptr, h[12] ? beta : nullptr,
          1e-6f, h[8] ? bias : nullptr, h[9] ? y + off : nullptr, y + off, ys, split, gated, h[13]);
    });
    put(y, (size_t)rows * ys);
    T* d = (T*)calloc((size_t)n_ids * k, sizeof(T));
    int unit = f == 0 ? (int)VEC : 8;
    emu_launch({(unsigned)n_ids, (unsigned)((k / unit + 255) / 256), 1}, {256, 1, 1},
               [&] { deqs[f](w, row_bytes, ids, 0, k, d); });
    put(d, (size_t)n_ids * k);
    return 0;
}
"#;

/// The f16 storage's `ld` / `st` on the host (the device's are PTX conversions): IEEE half,
/// rounded to nearest even.
const HOST_F16_PREFIX: &str = r#"
typedef unsigned short T;
static inline float ld(T h) { return emu_f16_value(h); }
static inline T st(float f) { return emu_f16_bits(f); }
"#;

/// What every harness reads its input with: `n` values of `V` from stdin.
const HARNESS_INPUT: &str = r#"
#include <stdio.h>
#include <stdlib.h>
template <class V> static V* take(size_t n) {
    V* p = (V*)malloc(n * sizeof(V) + 16);
    if (fread(p, sizeof(V), n, stdin) != n) exit(3);
    return p;
}
"#;

/// The f32 kernel source on the host with `harness` (its `main`): the emulation first, the
/// dynamic shared memory a static.
fn build<T: Elem>(dir: &Path, harness: &str) -> Option<std::path::PathBuf> {
    let every = KernelSet {
        encoder: true,
        decoder: Some(&BLOCK_FORMATS),
    };
    let source = kernel_source::<T>(every)
        .replace(
            "extern __shared__ float dynamic_shared[];",
            "static float dynamic_shared[1 << 16];",
        )
        .replace(<half::f16 as Elem>::PREFIX, HOST_F16_PREFIX);
    let file = dir.join("emulated.cpp");
    let text = format!(
        "{}\n{source}\n{HARNESS_INPUT}\n{harness}",
        include_str!("host_emulation.h")
    );
    std::fs::write(&file, text).unwrap();
    let exe = dir.join("emulated");
    let compiler = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let out = Command::new(&compiler)
        .args(["-std=c++20", "-O1", "-w", "-pthread", "-ffp-contract=off"])
        .arg(&file)
        .arg("-o")
        .arg(&exe)
        .output();
    match out {
        Ok(o) if o.status.success() => Some(exe),
        Ok(o) => panic!(
            "{compiler} failed on the emulated kernels: {}",
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => {
            eprintln!("skipped: no C++ compiler `{compiler}` ({e})");
            None
        }
    }
}

/// The kernels in storage `T` with the harness's input helpers and another `main`.
fn build_main<T: Elem>(dir: &Path, main: &str) -> Option<std::path::PathBuf> {
    let helpers = &HARNESS[..HARNESS.find("int main(void)").unwrap()];
    build::<T>(dir, &format!("{helpers}\n{main}"))
}

/// The softmax of `row` over the keys `visible`, as `len` values (0 for the others).
fn softmax_over(row: &[f32], visible: &[usize], len: usize) -> Vec<f64> {
    let mx = visible
        .iter()
        .map(|&j| f64::from(row[j]))
        .fold(f64::MIN, f64::max);
    let total: f64 = visible
        .iter()
        .map(|&j| (f64::from(row[j]) - mx).exp())
        .sum();
    (0..len)
        .map(|j| {
            if visible.contains(&j) {
                (f64::from(row[j]) - mx).exp() / total
            } else {
                0.0
            }
        })
        .collect()
}

/// Runs the harness on `input`; its output as f32 values.
fn run(exe: &Path, input: &[u8], what: &str) -> Vec<f32> {
    run_raw(exe, input, what)
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// The bytes a harness writes for `input`.
fn run_raw(exe: &Path, input: &[u8], what: &str) -> Vec<u8> {
    let mut child = Command::new(exe)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), input).unwrap();
    let result = child.wait_with_output().unwrap();
    assert!(result.status.success(), "{what}: {}", result.status);
    result.stdout
}

/// Asserts that a kernel's `a` is within 1e-5 (relative, plus 1e-5 absolute) of the definition's
/// `b`.
fn close(a: f32, b: f64, what: &str) {
    assert!(
        (f64::from(a) - b).abs() <= 1e-5 * (1.0 + b.abs()),
        "{what}: {a} against {b}"
    );
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    }
    fn vec(&mut self, n: usize, scale: f32, shift: f32) -> Vec<f32> {
        (0..n).map(|_| shift + scale * self.next()).collect()
    }
}

/// One case: a part of `out` rows written at column `off` of rows `y_stride` wide, `split` warps
/// per output; `gated`: SiLU(gate) × up of the first `out / 2` rows and the next as many;
/// `layer_norm`: the prologue is a LayerNorm (with a shift) instead of an RMSNorm; `gelu`: the
/// epilogue applies exact GELU (both on the wide dense kernels).
struct Case {
    split: i32,
    rows: usize,
    x_stride: usize,
    y_stride: usize,
    off: usize,
    gamma: bool,
    bias: bool,
    in_place: bool,
    gated: bool,
    layer_norm: bool,
    gelu: bool,
}

#[test]
fn weight_kernels_compute_the_product_of_every_storage_f32() {
    check_weight_kernels::<f32>(1e-5);
}

/// In f16 storage the inputs, the normalised activations and the outputs are rounded to f16 (the
/// reference takes the rounded inputs; the bar covers the rest).
#[test]
fn weight_kernels_compute_the_product_of_every_storage_f16() {
    check_weight_kernels::<half::f16>(4e-3);
}

/// `v` as the storage type `T` stores it.
fn stored<T: Elem>(v: f32) -> f32 {
    T::to_f32_vec(&[T::from_f32(v)])[0]
}

fn check_weight_kernels<T: Elem>(bar: f64) {
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = build::<T>(dir.path(), HARNESS) else {
        return;
    };
    let size = std::mem::size_of::<T>();
    // 21 rows: every split but 8 leaves warps past the end in its last block (they only add to
    // the split's barrier). 1280 columns: whole batches of loads and a remainder at split 1 (and
    // at split 2 for f32's 4-value units), a remainder alone at larger splits.
    let (out, k) = (21, 1280);
    // (split, rows, x_stride, y_stride, off, gamma, bias, in_place, gated, layer_norm, gelu)
    let cases = [
        (1, 1, k, out, 0, false, false, false, false, false, false),
        (2, 2, k, out, 0, true, true, false, false, false, false),
        (
            4,
            3,
            k + 8,
            out + 20,
            12,
            true,
            true,
            true,
            false,
            false,
            false,
        ),
        (8, 8, k, out + 4, 4, true, false, false, false, false, false),
        (1, 3, k, out, 0, true, true, false, true, false, false),
        (
            4,
            1,
            k,
            out / 2 + 3,
            3,
            true,
            false,
            false,
            true,
            false,
            false,
        ),
        (2, 1, k, out, 0, true, true, false, false, true, true),
        (
            1,
            3,
            k + 8,
            out + 2,
            2,
            true,
            true,
            true,
            false,
            true,
            false,
        ),
        (4, 2, k, out, 0, false, true, false, false, false, true),
    ]
    .map(
        |(split, rows, x_stride, y_stride, off, gamma, bias, in_place, gated, layer_norm, gelu)| {
            Case {
                split,
                rows,
                x_stride,
                y_stride,
                off,
                gamma,
                bias,
                in_place,
                gated,
                layer_norm,
                gelu,
            }
        },
    );
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    // (name, ggml id) of every storage, dense first, in the harness's order.
    let storages: Vec<(&str, Option<u32>)> = std::iter::once(("dense", None))
        .chain(BLOCK_FORMATS.iter().map(|f| (f.name, Some(f.id))))
        .collect();
    for (index, (name, id)) in storages.iter().enumerate() {
        let (bytes, weights, row_bytes) = match id {
            None => {
                let w: Vec<f32> = rng
                    .vec(out * k, 0.2, 0.0)
                    .into_iter()
                    .map(stored::<T>)
                    .collect();
                let b: Vec<u8> = bytemuck::cast_slice(&T::from_f32_slice(&w)).to_vec();
                (b, w, size * k)
            }
            Some(id) => {
                let f = BLOCK_FORMATS.iter().find(|f| f.id == *id).unwrap();
                let mut data = random_rows(*id, f.block, f.bytes, out, k, 7 + index as u64);
                if size == 2 {
                    // Scales of up to 2 make products past f16's range: 1/64 of them.
                    for block in data.chunks_mut(f.bytes) {
                        for &at in f16_fields(*id) {
                            let v = half::f16::from_le_bytes([block[at], block[at + 1]]);
                            let scaled = half::f16::from_f32(v.to_f32() / 64.0).to_le_bytes();
                            block[at..at + 2].copy_from_slice(&scaled);
                        }
                    }
                }
                let rb = f.row_bytes(k).unwrap();
                let ty = BlockType::from_id(*id).unwrap();
                let mut w = vec![0f32; out * k];
                for (row, b) in w.chunks_mut(k).zip(data.chunks(rb)) {
                    dequantize_row(ty, b, row).unwrap();
                }
                (data, w, rb)
            }
        };
        for (ci, c) in cases.iter().enumerate() {
            if (c.layer_norm || c.gelu) && id.is_some() {
                continue; // the wide kernels read dense rows only
            }
            let mut values = |n, scale, shift| -> Vec<f32> {
                rng.vec(n, scale, shift)
                    .into_iter()
                    .map(stored::<T>)
                    .collect()
            };
            let x = values(c.rows * c.x_stride, 2.0, 0.0);
            // A gated product multiplies two sums: smaller scales keep it inside f16's range.
            let gamma = if c.gated {
                values(k, 0.05, 0.1)
            } else {
                values(k, 0.5, 1.0)
            };
            let beta = values(k, 1.0, 0.0);
            let bias = values(out, 1.0, 0.0);
            let y0 = values(c.rows * c.y_stride, 1.0, 0.0);
            let ids: Vec<i32> = vec![5, 0, (out - 1) as i32];
            let mut input = Vec::new();
            let header = [
                index as i32,
                out as i32,
                k as i32,
                c.rows as i32,
                c.x_stride as i32,
                c.y_stride as i32,
                c.off as i32,
                c.gamma as i32,
                c.bias as i32,
                c.in_place as i32,
                c.split,
                if c.gated { 5 } else { -1 },
                c.layer_norm as i32,
                if c.gelu { 0 } else { -1 },
            ];
            header.iter().for_each(|v| input.extend(v.to_le_bytes()));
            input.extend((row_bytes as i64).to_le_bytes());
            input.extend(&bytes);
            for v in x.iter().chain(&gamma).chain(&beta).chain(&bias).chain(&y0) {
                input.extend(v.to_le_bytes());
            }
            input.extend((ids.len() as i32).to_le_bytes());
            ids.iter().for_each(|v| input.extend(v.to_le_bytes()));
            let got = run(&exe, &input, name);
            let (y, rows_out) = got.split_at(c.rows * c.y_stride);
            // The product from the reference values, in f64.
            let mut want: Vec<f64> = y0.iter().map(|&v| f64::from(v)).collect();
            for r in 0..c.rows {
                let xr = &x[r * c.x_stride..r * c.x_stride + k];
                let xn: Vec<f64> = if c.gamma && c.layer_norm {
                    let mean = xr.iter().map(|&v| f64::from(v)).sum::<f64>() / k as f64;
                    let var = xr
                        .iter()
                        .map(|&v| (f64::from(v) - mean).powi(2))
                        .sum::<f64>()
                        / k as f64;
                    let inv = 1.0 / (var + 1e-6).sqrt();
                    xr.iter()
                        .zip(&gamma)
                        .zip(&beta)
                        .map(|((&v, &g), &b)| {
                            (f64::from(v) - mean) * inv * f64::from(g) + f64::from(b)
                        })
                        .collect()
                } else if c.gamma {
                    let ss: f64 = xr.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
                    let inv = 1.0 / (ss / k as f64 + 1e-6).sqrt();
                    xr.iter()
                        .zip(&gamma)
                        .map(|(&v, &g)| f64::from(v) * inv * f64::from(g))
                        .collect()
                } else {
                    xr.iter().map(|&v| f64::from(v)).collect()
                };
                let linear = |o: usize| -> f64 {
                    let dot: f64 = weights[o * k..(o + 1) * k]
                        .iter()
                        .zip(&xn)
                        .map(|(&w, &v)| f64::from(w) * v)
                        .sum();
                    let v = dot + if c.bias { f64::from(bias[o]) } else { 0.0 };
                    if c.gelu {
                        ipfs_accelerate_core::GatedActivation::Gelu.apply(v)
                    } else {
                        v
                    }
                };
                if c.gated {
                    let pairs = out / 2;
                    for j in 0..pairs {
                        let (g, u) = (linear(j), linear(pairs + j));
                        want[r * c.y_stride + c.off + j] = g / (1.0 + (-g).exp()) * u;
                    }
                    continue;
                }
                for o in 0..out {
                    let at = r * c.y_stride + c.off + o;
                    want[at] = if c.in_place {
                        want[at] + linear(o)
                    } else {
                        linear(o)
                    };
                }
            }
            let scale = want.iter().fold(1.0f64, |m, v| m.max(v.abs()));
            let worst = y
                .iter()
                .zip(&want)
                .map(|(&g, &w)| (f64::from(g) - w).abs())
                .fold(0.0, f64::max);
            assert!(
                worst <= bar * scale,
                "{name} case {ci}: worst difference {worst} (scale {scale})"
            );
            for (i, &id) in ids.iter().enumerate() {
                let row = &rows_out[i * k..(i + 1) * k];
                let want: Vec<f32> = weights[id as usize * k..(id as usize + 1) * k]
                    .iter()
                    .map(|&w| stored::<T>(w))
                    .collect();
                assert_eq!(row, &want[..], "{name} row {id}");
            }
        }
    }
}

const ATTENTION_HARNESS: &str = r#"
int main(void) {
    // scalar, heads, kv_heads, head_dim, n_new, cap, past, batch, window, threads, keys, split_keys,
    // mode (0 self, 1 relative causal, 2 relative bidirectional, 3 cross, 4 cross with a mask)
    int* h = take<int>(13);
    float scale = *take<float>(1);
    int heads = h[1], kv = h[2], hd = h[3], n_new = h[4], cap = h[5], batch = h[7], mode = h[12];
    float* q = take<float>((size_t)batch * n_new * heads * hd);
    float* k = take<float>((size_t)batch * kv * cap * hd);
    float* v = take<float>((size_t)batch * kv * cap * hd);
    int* mask = take<int>((size_t)batch * cap);
    int* rel_bucket = take<int>(2 * cap - 1);
    float* rel_table = take<float>(8 * heads);
    float* out = (float*)calloc((size_t)batch * n_new * heads * hd, sizeof(float));
    int past = h[6], keys = h[10], per = h[11];
    EmuDim grid = {(unsigned)n_new, (unsigned)heads, (unsigned)batch}, block = {(unsigned)h[9], 1, 1};
    if (mode == 0) {
        // Causal over the cache; with `per` > 0 its keys in splits of `per` (of the `cap`
        // columns, as a captured decoding step has them), joined by cross_combine.
        int splits = per > 0 ? (cap + per - 1) / per : 1, rows = batch * n_new;
        float* parts = per > 0 ? (float*)calloc((size_t)rows * heads * splits * (hd + 2), 4) : nullptr;
        grid.x = n_new * splits;
        emu_launch(grid, block, [&] {
            (h[0] ? cached_attention_scalar : cached_attention)(q, k, v, mask, &past, heads, kv, hd,
                                                               n_new, cap, h[8], scale, per, parts,
                                                               out);
        });
        if (parts)
            emu_launch({(unsigned)rows, (unsigned)heads, 1}, block,
                       [&] { cross_combine(parts, heads, hd, splits, out); });
    } else if (mode <= 2) {
        emu_launch(grid, block, [&] {
            (h[0] ? relative_attention_scalar : relative_attention)(
                q, k, v, mask, &past, heads, hd, n_new, cap, mode == 1, rel_bucket, rel_table,
                cap - 1, scale, out);
        });
    } else {
        // Cross-attention (kv == heads, cap == keys) in splits of `per` keys, then their join.
        int splits = (keys + per - 1) / per, rows = batch * n_new;
        float* parts = splits > 1 ? (float*)calloc((size_t)rows * heads * splits * (hd + 2), 4) : nullptr;
        grid.x = n_new * splits;
        emu_launch(grid, block, [&] {
            (h[0] ? cross_attention_scalar : cross_attention)(q, k, v, mode == 4 ? mask : nullptr, heads,
                                                              hd, n_new, keys, per, scale, parts, out);
        });
        if (parts)
            emu_launch({(unsigned)rows, (unsigned)heads, 1}, block,
                       [&] { cross_combine(parts, heads, hd, splits, out); });
    }
    fwrite(out, sizeof(float), (size_t)batch * n_new * heads * hd, stdout);
    return 0;
}
"#;

/// Which attention kernel a case runs.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Attention {
    /// `cached_attention`: causal over the cache.
    Causal,
    /// `relative_attention` with `causal` 1 or 0 (T5's decoder and encoder).
    Relative { causal: bool },
    /// `cross_attention`: every key (of a masked row, only its tokens).
    Cross { masked: bool },
}

/// The cached, relative and cross attention kernels (16-byte packs and single values) against
/// attention computed here: grouped-query heads, a context longer than a block's chunk, several
/// new columns, padding (a row whose keys are all masked gets zeros), a sliding window, T5's
/// relative position bias (causal and bidirectional), and cross-attention over every key or the
/// unmasked ones, in one split or several joined by `cross_combine`; the causal kernel also with
/// the cache's columns split (a decoding step's flash-decoding, splits past a query empty).
#[test]
fn attention_kernels_match_the_definition() {
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = build::<f32>(dir.path(), ATTENTION_HARNESS) else {
        return;
    };
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let (causal, bidirectional) = (
        Attention::Relative { causal: true },
        Attention::Relative { causal: false },
    );
    // (scalar kernel, head size, window, kind, keys per split: of a cross-attention, or of the
    // cache of a causal one)
    for (scalar, hd, window, kind, per) in [
        (false, 64, 0, Attention::Causal, 0),
        (false, 64, 0, Attention::Causal, 64),
        (true, 18, 0, Attention::Causal, 0),
        (true, 18, 0, Attention::Causal, 100),
        (true, 64, 50, Attention::Causal, 0),
        (false, 32, 7, Attention::Causal, 0),
        (false, 32, 7, Attention::Causal, 64),
        (false, 64, 0, causal, 0),
        (true, 18, 0, bidirectional, 0),
        (false, 64, 0, Attention::Cross { masked: false }, 300),
        (false, 64, 0, Attention::Cross { masked: false }, 70),
        (true, 18, 0, Attention::Cross { masked: true }, 128),
        (false, 64, 0, Attention::Cross { masked: true }, 300),
    ] {
        // Every kind but the cached one reads as many key / value heads as query heads;
        // cross-attention `keys` of each.
        let (heads, n_new, past, batch, cap) = (6, 3, 280, 3, 300);
        let kv = if kind == Attention::Causal { 2 } else { heads };
        let keys = if matches!(kind, Attention::Cross { .. }) {
            cap
        } else {
            0
        };
        let threads = crate::decoder::attention_threads(hd) as i32;
        let scale = 1.0 / (hd as f32).sqrt();
        let q = rng.vec(batch * n_new * heads * hd, 2.0, 0.0);
        let k = rng.vec(batch * kv * cap * hd, 2.0, 0.0);
        let v = rng.vec(batch * kv * cap * hd, 2.0, 0.0);
        // Row 0: every key; row 1: left padding and holes; row 2: nothing visible.
        let mask: Vec<i32> = (0..batch * cap)
            .map(|i| {
                let (b, j) = (i / cap, i % cap);
                match b {
                    0 => 1,
                    1 => i32::from(j >= 40 && j % 7 != 3),
                    _ => 0,
                }
            })
            .collect();
        // T5's buckets (8, up to distance 20) of distances -(cap - 1)..=cap - 1.
        let bidir = kind == bidirectional;
        let reach = cap as i64 - 1;
        let rel_bucket: Vec<i32> = (-reach..=reach)
            .map(|d| {
                ipfs_accelerate_core::decoder::relative_position_bucket(d, bidir, 8, 20) as i32
            })
            .collect();
        let rel_table = rng.vec(8 * heads, 4.0, 0.0);
        let mode = match kind {
            Attention::Causal => 0,
            Attention::Relative { causal: true } => 1,
            Attention::Relative { causal: false } => 2,
            Attention::Cross { masked: false } => 3,
            Attention::Cross { masked: true } => 4,
        };
        let mut input = Vec::new();
        let header = [
            i32::from(scalar),
            heads as i32,
            kv as i32,
            hd as i32,
            n_new as i32,
            cap as i32,
            past as i32,
            batch as i32,
            window,
            threads,
            keys as i32,
            per,
            mode,
        ];
        header.iter().for_each(|v| input.extend(v.to_le_bytes()));
        input.extend(scale.to_le_bytes());
        for x in q.iter().chain(&k).chain(&v) {
            input.extend(x.to_le_bytes());
        }
        for m in mask.iter().chain(&rel_bucket) {
            input.extend(m.to_le_bytes());
        }
        rel_table.iter().for_each(|x| input.extend(x.to_le_bytes()));
        let got = run(&exe, &input, "attention");
        let mut worst = 0f64;
        for b in 0..batch {
            for i in 0..n_new {
                let qpos = past + i;
                let col = match kind {
                    Attention::Cross { .. } => keys - 1,
                    Attention::Relative { causal: false } => past + n_new - 1,
                    _ => qpos,
                };
                let masked = kind != Attention::Cross { masked: false };
                for h in 0..heads {
                    let kvh = h / (heads / kv);
                    let first = if window > 0 {
                        (col + 1).saturating_sub(window as usize)
                    } else {
                        0
                    };
                    let qr = &q[((b * n_new + i) * heads + h) * hd..][..hd];
                    let cache = |c: &[f32], j: usize| -> Vec<f64> {
                        c[((b * kv + kvh) * cap + j) * hd..][..hd]
                            .iter()
                            .map(|&x| f64::from(x))
                            .collect()
                    };
                    let seen: Vec<usize> = (first..=col)
                        .filter(|&j| !masked || mask[b * cap + j] != 0)
                        .collect();
                    let scores: Vec<f64> = seen
                        .iter()
                        .map(|&j| {
                            let dot: f64 = cache(&k, j)
                                .iter()
                                .zip(qr)
                                .map(|(a, &b)| a * f64::from(b))
                                .sum();
                            let bias = match kind {
                                Attention::Relative { .. } => {
                                    let d = j as i64 - qpos as i64;
                                    f64::from(
                                        rel_table
                                            [rel_bucket[(d + reach) as usize] as usize * heads + h],
                                    )
                                }
                                _ => 0.0,
                            };
                            dot * f64::from(scale) + bias
                        })
                        .collect();
                    let mx = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = scores.iter().map(|s| (s - mx).exp()).collect();
                    let z: f64 = e.iter().sum();
                    let mut want = vec![0f64; hd];
                    for (&j, p) in seen.iter().zip(&e) {
                        for (w, x) in want.iter_mut().zip(cache(&v, j)) {
                            *w += p / z * x;
                        }
                    }
                    let at = ((b * n_new + i) * heads + h) * hd;
                    for (d, w) in want.iter().enumerate() {
                        worst = worst.max((f64::from(got[at + d]) - w).abs());
                    }
                }
            }
        }
        assert!(
            worst <= 1e-5,
            "{kind:?}, scalar {scalar}, head {hd}, window {window}, split {per}: worst difference {worst}"
        );
    }
}

const STEP_HARNESS: &str = r#"
int main(void) {
    // rows, hidden, heads, kv_heads, head_dim, n_new, cap, past, inter, rotate, layer_norm, gated
    int* h = take<int>(12);
    int rows = h[0], hid = h[1], heads = h[2], kv = h[3], hd = h[4], n_new = h[5], cap = h[6];
    int past = h[7], inter = h[8], batch = rows / n_new, width = (heads + 2 * kv) * hd;
    float* qkv = take<float>((size_t)rows * width);
    float* bias = take<float>(width);
    int* pos = take<int>(rows);
    float* inv_freq = take<float>(hd / 2);
    float* x = take<float>((size_t)rows * hid);
    float* y = take<float>((size_t)rows * hid);
    float* gamma = take<float>(hid);
    float* beta = take<float>(hid);
    float* gu = take<float>((size_t)rows * 2 * inter);
    float* table = take<float>((size_t)64 * hid);
    float* q = (float*)calloc((size_t)rows * heads * hd, 4);
    float* kc = (float*)calloc((size_t)batch * kv * cap * hd, 4);
    float* vc = (float*)calloc((size_t)batch * kv * cap * hd, 4);
    float* normed = (float*)calloc((size_t)rows * hid, 4);
    float* act = (float*)calloc((size_t)rows * inter, 4);
    emu_launch({(unsigned)rows, (unsigned)(heads + 2 * kv), 1}, {(unsigned)hd / 2, 1, 1}, [&] {
        rope_split(qkv, bias, h[9] ? pos : nullptr, h[9] ? inv_freq : nullptr, &past, heads, kv,
                   hd, n_new, cap, q, kc, vc);
    });
    emu_launch({(unsigned)rows, 1, 1}, {256, 1, 1}, [&] {
        residual_norm(y, nullptr, x, gamma, h[10] ? beta : nullptr, 1e-6f, hid, normed);
    });
    emu_launch({(unsigned)rows, (unsigned)(inter + 255) / 256, 1}, {256, 1, 1},
               [&] { mlp_act(gu, nullptr, inter, h[11] ? 5 : 0, h[11], act); });
    emu_launch({(unsigned)rows, (unsigned)(hid + 255) / 256, 1}, {256, 1, 1},
               [&] { add_positions(pos, table, hid, y); });
    fwrite(q, 4, (size_t)rows * heads * hd, stdout);
    fwrite(kc, 4, (size_t)batch * kv * cap * hd, stdout);
    fwrite(vc, 4, (size_t)batch * kv * cap * hd, stdout);
    fwrite(x, 4, (size_t)rows * hid, stdout);
    fwrite(normed, 4, (size_t)rows * hid, stdout);
    fwrite(act, 4, (size_t)rows * inter, stdout);
    fwrite(y, 4, (size_t)rows * hid, stdout);
    return 0;
}
"#;

/// The rest of a decoding step's kernels against their definitions: `rope_split` (bias, HF's
/// rotate_half RoPE on q and k or none for learned positions, k and v into the cache at column
/// past + i of their batch row), `residual_norm` (the residual add then RMSNorm or LayerNorm),
/// `mlp_act` (SiLU of the gate times up, or GELU of up alone) and `add_positions` (a learned
/// position's row added).
#[test]
fn rope_norm_and_mlp_activation_match_their_definitions() {
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = build::<f32>(dir.path(), STEP_HARNESS) else {
        return;
    };
    // (rotate, layer norm, gated): LLaMA's kernels, then Whisper's.
    for (rotate, layer_norm, gated) in [(true, false, true), (false, true, false)] {
        check_step_kernels(&exe, rotate, layer_norm, gated);
    }
}

fn check_step_kernels(exe: &Path, rotate: bool, layer_norm: bool, gated: bool) {
    let what = format!("rotate {rotate}, layer norm {layer_norm}, gated {gated}");
    let (batch, n_new, hid, heads, kv, hd, cap, past, inter) = (2, 3, 96, 4, 2, 16, 10, 5, 300);
    let rows = batch * n_new;
    let width = (heads + 2 * kv) * hd;
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let qkv = rng.vec(rows * width, 2.0, 0.0);
    let bias = rng.vec(width, 1.0, 0.0);
    let pos: Vec<i32> = (0..rows as i32).map(|r| 3 + 7 * r).collect();
    let inv_freq: Vec<f32> = (0..hd / 2)
        .map(|i| 10000f32.powf(-2.0 * i as f32 / hd as f32))
        .collect();
    let x = rng.vec(rows * hid, 2.0, 0.5);
    let y = rng.vec(rows * hid, 2.0, 0.0);
    let gamma = rng.vec(hid, 0.5, 1.0);
    let beta = rng.vec(hid, 1.0, 0.0);
    let gu = rng.vec(rows * 2 * inter, 8.0, 0.0);
    let table = rng.vec(64 * hid, 1.0, 0.0);
    let mut input = Vec::new();
    let header = [rows, hid, heads, kv, hd, n_new, cap, past, inter];
    for v in header
        .into_iter()
        .chain([rotate, layer_norm, gated].map(usize::from))
    {
        input.extend((v as i32).to_le_bytes());
    }
    for v in qkv.iter().chain(&bias) {
        input.extend(v.to_le_bytes());
    }
    pos.iter().for_each(|p| input.extend(p.to_le_bytes()));
    let floats = [&inv_freq, &x, &y, &gamma, &beta, &gu, &table];
    for v in floats.into_iter().flatten() {
        input.extend(v.to_le_bytes());
    }
    let got = run(exe, &input, "step kernels");
    let cache_len = batch * kv * cap * hd;
    let (q, rest) = got.split_at(rows * heads * hd);
    let (kc, rest) = rest.split_at(cache_len);
    let (vc, rest) = rest.split_at(cache_len);
    let (x_out, rest) = rest.split_at(rows * hid);
    let (normed, rest) = rest.split_at(rows * hid);
    let (act, positioned) = rest.split_at(rows * inter);
    for r in 0..rows {
        let (b, i) = (r / n_new, r % n_new);
        for slot in 0..heads + 2 * kv {
            let src: Vec<f64> = (0..hd)
                .map(|d| f64::from(qkv[r * width + slot * hd + d]) + f64::from(bias[slot * hd + d]))
                .collect();
            let rotated: Vec<f64> = if rotate && slot < heads + kv {
                (0..hd)
                    .map(|d| {
                        let f = d % (hd / 2);
                        let a = f64::from(pos[r] as f32 * inv_freq[f]);
                        let (c, s) = (a.cos(), a.sin());
                        if d < hd / 2 {
                            src[d] * c - src[d + hd / 2] * s
                        } else {
                            src[d] * c + src[d - hd / 2] * s
                        }
                    })
                    .collect()
            } else {
                src
            };
            for (d, want) in rotated.iter().enumerate() {
                let got = if slot < heads {
                    q[(r * heads + slot) * hd + d]
                } else {
                    let (cache, kvh) = if slot < heads + kv {
                        (kc, slot - heads)
                    } else {
                        (vc, slot - heads - kv)
                    };
                    cache[((b * kv + kvh) * cap + past + i) * hd + d]
                };
                close(
                    got,
                    *want,
                    &format!("{what}: row {r} slot {slot} feature {d}"),
                );
            }
        }
        let sum: Vec<f64> = (0..hid)
            .map(|c| f64::from(x[r * hid + c]) + f64::from(y[r * hid + c]))
            .collect();
        let mean = if layer_norm {
            sum.iter().sum::<f64>() / hid as f64
        } else {
            0.0
        };
        let inv =
            1.0 / (sum.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / hid as f64 + 1e-6).sqrt();
        for c in 0..hid {
            close(x_out[r * hid + c], sum[c], "residual");
            let shift = if layer_norm { f64::from(beta[c]) } else { 0.0 };
            let want = (sum[c] - mean) * inv * f64::from(gamma[c]) + shift;
            close(normed[r * hid + c], want, &format!("{what}: norm"));
            let p = f64::from(table[pos[r] as usize * hid + c]);
            close(
                positioned[r * hid + c],
                f64::from(y[r * hid + c]) + p,
                "positions",
            );
        }
        for c in 0..inter {
            let want = if gated {
                let g = f64::from(gu[r * 2 * inter + c]);
                let u = f64::from(gu[r * 2 * inter + inter + c]);
                g / (1.0 + (-g).exp()) * u
            } else {
                ipfs_accelerate_core::GatedActivation::Gelu.apply(f64::from(gu[r * inter + c]))
            };
            close(act[r * inter + c], want, &format!("{what}: mlp act"));
        }
    }
    // Columns of the cache no row wrote stay as they were (zeros).
    assert!(kc[..past * hd].iter().all(|&v| v == 0.0));
}

const ENCODER_HARNESS: &str = r#"
int main(void) {
    int* d = take<int>(4);  // batch, seq, hidden, heads
    int batch = d[0], seq = d[1], hid = d[2], heads = d[3], rows = batch * seq;
    int ks = (seq + 7) / 8 * 8;  // score rows padded as the engine pads them
    size_t score_n = (size_t)batch * heads * seq * ks;
    int* ids = take<int>(rows);
    int* mask = take<int>(rows);
    int* pooled = take<int>(batch);
    int* positions = take<int>(rows);
    T* word = to_t(take<float>((size_t)8 * hid), (size_t)8 * hid);
    T* pos = to_t(take<float>((size_t)seq * hid), (size_t)seq * hid);
    float* scores_f = take<float>(score_n);
    T* y = to_t(take<float>((size_t)rows * hid), (size_t)rows * hid);
    T* bias = to_t(take<float>(hid), hid);
    int* types = (int*)calloc(rows, sizeof(int));
    T* zero_type = (T*)calloc(hid, sizeof(T));
    T* emb = (T*)calloc((size_t)rows * hid, sizeof(T));
    float eps = 1e-5f;
    int no = 0, causal = 1;
    emu_launch({(unsigned)rows, 1, 1}, {64, 1, 1}, [&] {
        embeddings(ids, types, positions, word, pos, zero_type, word, word, eps, hid, no, emb);
    });
    put(emb, (size_t)rows * hid);
    T* block_scores = to_t(scores_f, score_n);
    long long score_rows = (long long)batch * heads * seq;
    emu_launch({(unsigned)score_rows, 1, 1}, {32, 1, 1},
               [&] { masked_softmax(block_scores, mask, heads, seq, seq, ks, causal); });
    put(block_scores, score_n);
    T* warp_scores = to_t(scores_f, score_n);
    emu_launch({(unsigned)((score_rows + 3) / 4), 1, 1}, {32, 4, 1}, [&] {
        masked_softmax_warp(warp_scores, mask, heads, seq, seq, ks, score_rows, causal);
    });
    put(warp_scores, score_n);
    emu_launch({(unsigned)rows, (unsigned)((hid + 255) / 256), 1}, {256, 1, 1},
               [&] { bias_act(y, bias, hid, 6); });
    put(y, (size_t)rows * hid);
    T* gathered = (T*)calloc((size_t)batch * hid, sizeof(T));
    emu_launch({(unsigned)batch, (unsigned)((hid + 255) / 256), 1}, {256, 1, 1},
               [&] { gather_rows(pooled, y, hid, gathered); });
    put(gathered, (size_t)batch * hid);
    return 0;
}
"#;

/// The kernels CLIP's towers added to the encoder, against their definitions: token embeddings
/// without a norm or token types (at any position ids), the causal padding-masked softmax (block and warp forms; a
/// query whose only earlier key is padding sees the keys up to its own, as HF's additive mask
/// gives), quick-GELU, and the row gather a projection reads its token with.
#[test]
fn clip_encoder_kernels_match_their_definitions() {
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = build_main::<f32>(dir.path(), ENCODER_HARNESS) else {
        return;
    };
    let (batch, seq, hid, heads) = (2usize, 5usize, 40usize, 2usize);
    let rows = batch * seq;
    let mut rng = Rng(0x0bad_5eed_1234_4321);
    let ids: Vec<i32> = (0..rows as i32).map(|r| (r * 5) % 8).collect();
    // Row 0 is right-padded; row 1 starts with padding (its first query sees no key).
    let mask: Vec<i32> = vec![1, 1, 1, 0, 0, 0, 1, 1, 1, 1];
    let pooled: Vec<i32> = vec![2, seq as i32 + 3];
    // Any row of the table (RoBERTa numbers from padding_idx + 1, and padding keeps it).
    let positions: Vec<i32> = (0..rows as i32).map(|m| (m * 3 + 1) % seq as i32).collect();
    let word = rng.vec(8 * hid, 2.0, 0.0);
    let pos = rng.vec(seq * hid, 2.0, 0.0);
    // Score rows padded to a multiple of 8, as the engine lays them out.
    let ks = seq.next_multiple_of(8);
    let scores = rng.vec(batch * heads * seq * ks, 6.0, 0.0);
    let y = rng.vec(rows * hid, 8.0, 0.0);
    let bias = rng.vec(hid, 1.0, 0.0);
    let mut input = Vec::new();
    for v in [batch, seq, hid, heads] {
        input.extend((v as i32).to_le_bytes());
    }
    for v in ids.iter().chain(&mask).chain(&pooled).chain(&positions) {
        input.extend(v.to_le_bytes());
    }
    for v in word
        .iter()
        .chain(&pos)
        .chain(&scores)
        .chain(&y)
        .chain(&bias)
    {
        input.extend(v.to_le_bytes());
    }
    let got = run(&exe, &input, "encoder kernels");
    let n = scores.len();
    let (emb, rest) = got.split_at(rows * hid);
    let (block_sm, rest) = rest.split_at(n);
    let (warp_sm, rest) = rest.split_at(n);
    let (act, gathered) = rest.split_at(rows * hid);
    for m in 0..rows {
        for c in 0..hid {
            let want =
                f64::from(word[ids[m] as usize * hid + c] + pos[positions[m] as usize * hid + c]);
            close(emb[m * hid + c], want, "embeddings");
        }
    }
    for r in 0..batch * heads * seq {
        let (b, i) = (r / (heads * seq), r % seq);
        let visible: Vec<usize> = (0..=i).filter(|&j| mask[b * seq + j] != 0).collect();
        let visible = if visible.is_empty() {
            (0..=i).collect()
        } else {
            visible
        };
        let row = &scores[r * ks..r * ks + seq];
        for (j, &want) in softmax_over(row, &visible, ks).iter().enumerate() {
            close(
                block_sm[r * ks + j],
                want,
                &format!("softmax row {r} key {j}"),
            );
            close(
                warp_sm[r * ks + j],
                want,
                &format!("warp softmax row {r} key {j}"),
            );
        }
    }
    for m in 0..rows {
        for c in 0..hid {
            let v = f64::from(y[m * hid + c]) + f64::from(bias[c]);
            close(
                act[m * hid + c],
                v / (1.0 + (-1.702 * v).exp()),
                "quick gelu",
            );
        }
    }
    for (b, &p) in pooled.iter().enumerate() {
        for c in 0..hid {
            assert_eq!(gathered[b * hid + c], act[p as usize * hid + c], "gather");
        }
    }
}

const FRAMES_HARNESS: &str = r#"
// rows [n, k] · w [out, k]ᵀ on the host (the engine's cuBLAS product).
static T* product(const T* rows, const T* w, int n, int k, int out) {
    T* y = (T*)calloc((size_t)n * out, sizeof(T));
    for (int r = 0; r < n; ++r)
        for (int o = 0; o < out; ++o) {
            float s = 0.f;
            for (int j = 0; j < k; ++j) s += ld(rows[(size_t)r * k + j]) * ld(w[(size_t)o * k + j]);
            y[(size_t)r * out + o] = st(s);
        }
    return y;
}
int main(void) {
    int* d = take<int>(4);  // batch, channels, frames, hidden
    int batch = d[0], ch = d[1], frames = d[2], hid = d[3];
    // conv1: ch → hid, kernel 3, stride 1, padding 1; conv2: hid → hid, kernel 3, stride 2,
    // padding 1 (Whisper's front end).
    int f1 = frames, f2 = (frames + 2 - 3) / 2 + 1;
    T* x = to_t(take<float>((size_t)batch * ch * frames), (size_t)batch * ch * frames);
    T* w1 = to_t(take<float>((size_t)hid * ch * 3), (size_t)hid * ch * 3);
    T* b1 = to_t(take<float>(hid), hid);
    T* w2 = to_t(take<float>((size_t)hid * hid * 3), (size_t)hid * hid * 3);
    T* b2 = to_t(take<float>(hid), hid);
    T* pos = to_t(take<float>((size_t)f2 * hid), (size_t)f2 * hid);
    int rows1 = batch * f1, cols1 = ch * 3, rows2 = batch * f2, cols2 = hid * 3;
    T* win1 = (T*)calloc((size_t)rows1 * cols1, sizeof(T));
    emu_launch({(unsigned)rows1, (unsigned)((cols1 + 255) / 256), 1}, {256, 1, 1}, [&] {
        frame_rows(x, (long long)ch * frames, frames, 1, ch, frames, 3, 1, 1, f1, win1);
    });
    T* y1 = product(win1, w1, rows1, cols1, hid);
    emu_launch({(unsigned)rows1, (unsigned)((hid + 255) / 256), 1}, {256, 1, 1},
               [&] { bias_act(y1, b1, hid, 0); });
    T* win2 = (T*)calloc((size_t)rows2 * cols2, sizeof(T));
    emu_launch({(unsigned)rows2, (unsigned)((cols2 + 255) / 256), 1}, {256, 1, 1}, [&] {
        frame_rows(y1, (long long)hid * f1, 1, hid, hid, f1, 3, 2, 1, f2, win2);
    });
    T* y2 = product(win2, w2, rows2, cols2, hid);
    T* out = (T*)calloc((size_t)rows2 * hid, sizeof(T));
    emu_launch({(unsigned)rows2, (unsigned)((hid + 255) / 256), 1}, {256, 1, 1},
               [&] { frame_embeddings(y2, b2, pos, f2, hid, 0, out); });
    put(out, (size_t)rows2 * hid);
    return 0;
}
"#;

/// A 1-D convolution in f64 over `x` `[frames][channels]` with the weight's rows in (channel,
/// tap) order, then GELU (erf).
fn conv_gelu(
    x: &[Vec<f64>],
    w: &[f32],
    b: &[f32],
    (kernel, stride, padding): (usize, usize, usize),
) -> Vec<Vec<f64>> {
    let channels = x[0].len();
    let out = b.len();
    let frames = (x.len() + 2 * padding - kernel) / stride + 1;
    (0..frames)
        .map(|t| {
            (0..out)
                .map(|o| {
                    let mut s = f64::from(b[o]);
                    for c in 0..channels {
                        for tap in 0..kernel {
                            let at = (t * stride + tap).checked_sub(padding);
                            if let Some(v) = at.and_then(|a| x.get(a)) {
                                s += v[c] * f64::from(w[(o * channels + c) * kernel + tap]);
                            }
                        }
                    }
                    ipfs_accelerate_core::EncoderActivation::Gelu.apply(s)
                })
                .collect()
        })
        .collect()
}

/// Whisper's front end on the engine's kernels (`frame_rows` over channel-major features and over
/// a frame-major convolution output, the products on the host, `bias_act`, `frame_embeddings`)
/// against the convolutions' definition: padding at both ends, stride 2, an odd frame count.
#[test]
fn frame_kernels_compute_the_convolutional_front_end() {
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = build_main::<f32>(dir.path(), FRAMES_HARNESS) else {
        return;
    };
    let (batch, ch, frames, hid) = (2usize, 5usize, 9usize, 12usize);
    let f2 = (frames + 2 - 3) / 2 + 1;
    let mut rng = Rng(0x5eed_f4a3_0000_0017);
    let x = rng.vec(batch * ch * frames, 2.0, 0.0);
    let w1 = rng.vec(hid * ch * 3, 1.0, 0.0);
    let b1 = rng.vec(hid, 0.5, 0.0);
    let w2 = rng.vec(hid * hid * 3, 0.5, 0.0);
    let b2 = rng.vec(hid, 0.5, 0.0);
    let pos = rng.vec(f2 * hid, 1.0, 0.0);
    let mut input = Vec::new();
    for v in [batch, ch, frames, hid] {
        input.extend((v as i32).to_le_bytes());
    }
    for v in x
        .iter()
        .chain(&w1)
        .chain(&b1)
        .chain(&w2)
        .chain(&b2)
        .chain(&pos)
    {
        input.extend(v.to_le_bytes());
    }
    let got = run(&exe, &input, "frame kernels");
    assert_eq!(got.len(), batch * f2 * hid);
    for b in 0..batch {
        let features: Vec<Vec<f64>> = (0..frames)
            .map(|t| {
                (0..ch)
                    .map(|c| f64::from(x[(b * ch + c) * frames + t]))
                    .collect()
            })
            .collect();
        let h1 = conv_gelu(&features, &w1, &b1, (3, 1, 1));
        let h2 = conv_gelu(&h1, &w2, &b2, (3, 2, 1));
        for (t, row) in h2.iter().enumerate() {
            for (c, v) in row.iter().enumerate() {
                let want = v + f64::from(pos[t * hid + c]);
                close(
                    got[(b * f2 + t) * hid + c],
                    want,
                    &format!("input {b} frame {t} channel {c}"),
                );
            }
        }
    }
}

const CHANNEL_NORM_HARNESS: &str = r#"
int main(void) {
    int* d = take<int>(3);  // batch, frames, channels
    int batch = d[0], frames = d[1], ch = d[2];
    size_t n = (size_t)batch * frames * ch;
    T* y = to_t(take<float>(n), n);
    T* bias = to_t(take<float>(ch), ch);
    T* gamma = to_t(take<float>(ch), ch);
    T* beta = to_t(take<float>(ch), ch);
    emu_launch({(unsigned)batch, (unsigned)((ch + 31) / 32), 1}, {32, CHANNEL_NORM_ROWS, 1},
               [&] { channel_norm_act(y, bias, gamma, beta, frames, ch, 1e-5f, 0); });
    put(y, n);
    return 0;
}
"#;

/// Wav2Vec2's per-channel GroupNorm (`channel_norm_act`) against its definition in f64: bias,
/// each (input, channel) normed over its frames, scale, shift, GELU; 40 channels (a partial
/// block of 32) and 37 frames (not a multiple of the block's 16 rows).
#[test]
fn channel_norm_normalises_each_channel_over_its_frames() {
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = build_main::<f32>(dir.path(), CHANNEL_NORM_HARNESS) else {
        return;
    };
    let (batch, frames, ch) = (2usize, 37usize, 40usize);
    let mut rng = Rng(0x5eed_c4a7_0000_0031);
    let y = rng.vec(batch * frames * ch, 3.0, 0.5);
    let bias = rng.vec(ch, 1.0, 0.0);
    let gamma = rng.vec(ch, 1.0, 1.0);
    let beta = rng.vec(ch, 0.5, 0.0);
    let mut input = Vec::new();
    for v in [batch, frames, ch] {
        input.extend((v as i32).to_le_bytes());
    }
    for v in y.iter().chain(&bias).chain(&gamma).chain(&beta) {
        input.extend(v.to_le_bytes());
    }
    let got = run(&exe, &input, "channel norm");
    assert_eq!(got.len(), y.len());
    for b in 0..batch {
        for c in 0..ch {
            let at = |t: usize| (b * frames + t) * ch + c;
            let column: Vec<f64> = (0..frames)
                .map(|t| f64::from(y[at(t)]) + f64::from(bias[c]))
                .collect();
            let mean = column.iter().sum::<f64>() / frames as f64;
            let var = column.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / frames as f64;
            for (t, v) in column.iter().enumerate() {
                let normed =
                    (v - mean) / (var + 1e-5).sqrt() * f64::from(gamma[c]) + f64::from(beta[c]);
                let want = ipfs_accelerate_core::EncoderActivation::Gelu.apply(normed);
                close(
                    got[at(t)],
                    want,
                    &format!("input {b} channel {c} frame {t}"),
                );
            }
        }
    }
}

const ARGMAX_HARNESS: &str = r#"
int main(void) {
    int* d = take<int>(2);  // rows, vocab
    int rows = d[0], vocab = d[1];
    T* logits = to_t(take<float>((size_t)rows * vocab), (size_t)rows * vocab);
    int* out = (int*)calloc(rows, sizeof(int));
    emu_launch({(unsigned)rows, 1, 1}, {ARGMAX_THREADS, 1, 1},
               [&] { argmax_rows(logits, vocab, out); });
    for (int r = 0; r < rows; ++r) {
        float f = (float)out[r];
        fwrite(&f, sizeof(float), 1, stdout);
    }
    return 0;
}
"#;

/// Greedy decoding's `argmax_rows` against the host's argmax (the first index of the largest
/// value): ties across threads' strides, a maximum in the last column, a row of -inf (index 0)
/// and a row with NaN (-1).
#[test]
fn argmax_rows_picks_the_first_largest_value() {
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = build_main::<f32>(dir.path(), ARGMAX_HARNESS) else {
        return;
    };
    let vocab = 1000usize;
    let mut rng = Rng(0xa4a3_0000_1111_2222);
    let mut rows: Vec<Vec<f32>> = (0..3).map(|_| rng.vec(vocab, 4.0, 0.0)).collect();
    // Ties: the same maximum at columns 700 (a late stride) and 300.
    rows[0][700] = 9.0;
    rows[0][300] = 9.0;
    rows[1][vocab - 1] = 5.0;
    rows.push(vec![f32::NEG_INFINITY; vocab]);
    let mut nan = rng.vec(vocab, 1.0, 0.0);
    nan[517] = f32::NAN;
    rows.push(nan);
    let mut input = Vec::new();
    for v in [rows.len(), vocab] {
        input.extend((v as i32).to_le_bytes());
    }
    for v in rows.iter().flatten() {
        input.extend(v.to_le_bytes());
    }
    let got = run(&exe, &input, "argmax_rows");
    let want: Vec<f32> = rows[..4]
        .iter()
        // The host's greedy pick: the first index of the largest value.
        .map(|r| (0..vocab).fold(0, |best, i| if r[i] > r[best] { i } else { best }) as f32)
        .chain([-1.0])
        .collect();
    assert_eq!(got, want);
    assert_eq!(got[0], 300.0);
}

const SAMPLE_HARNESS: &str = r#"
int main(void) {
    int* d = take<int>(3);  // rows, vocab, penalised tokens in all
    int rows = d[0], vocab = d[1], n_tokens = d[2];
    int* offsets = take<int>(rows + 1);
    int* tokens = take<int>(n_tokens);
    float* penalties = take<float>(rows);
    float* temperatures = take<float>(rows);
    T* logits = to_t(take<float>((size_t)rows * vocab), (size_t)rows * vocab);
    int chunks = (vocab + SAMPLE_CHUNK - 1) / SAMPLE_CHUNK;
    float* scores = (float*)calloc((size_t)rows * vocab, sizeof(float));
    unsigned long long* top =
        (unsigned long long*)calloc((size_t)rows * chunks * SAMPLE_TOP, sizeof(unsigned long long));
    int* nan = (int*)calloc((size_t)rows * chunks, sizeof(int));
    size_t n_out = (size_t)rows * (SAMPLE_TOP + 2);
    unsigned long long* out = (unsigned long long*)calloc(n_out, sizeof(unsigned long long));
    emu_launch({(unsigned)chunks, (unsigned)rows, 1}, {SAMPLE_THREADS, 1, 1}, [&] {
        sample_chunks(logits, vocab, offsets, tokens, penalties, scores, top, nan);
    });
    emu_launch({(unsigned)rows, 1, 1}, {SAMPLE_THREADS, 1, 1},
               [&] { sample_merge(top, nan, chunks, scores, vocab, temperatures, out); });
    fwrite(out, sizeof(unsigned long long), n_out, stdout);
    fwrite(scores, sizeof(float), (size_t)rows * vocab, stdout);
    return 0;
}
"#;

/// Sampling's `sample_chunks` + `sample_merge` against the host sampler's definitions: the
/// penalty on each listed token once (in f32), the 64 most likely tokens in `total_cmp` order
/// with ties by the lower token (across chunks, at chunk edges, -0.0 after +0.0), the softmax
/// total in f64, and a row with NaN flagged.
#[test]
fn sample_kernels_keep_the_hosts_order() {
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = build_main::<f32>(dir.path(), SAMPLE_HARNESS) else {
        return;
    };
    let vocab = 9000usize; // three chunks, the last one partial
    let mut rng = Rng(0x5a3b_1e00_7777_0101);
    let mut rows: Vec<Vec<f32>> = (0..4).map(|_| rng.vec(vocab, 8.0, 0.0)).collect();
    // Ties across chunks and threads; signed zeros; a maximum at a chunk's edge.
    for c in [4095, 4096, 100, 8999] {
        rows[0][c] = 5.0;
    }
    rows[1].iter_mut().for_each(|v| *v = -v.abs() - 1.0);
    rows[1][10] = 0.0;
    rows[1][11] = -0.0;
    rows[1][12] = 0.0;
    rows[3][6000] = f32::NAN;
    let penalised: Vec<Vec<u32>> = vec![vec![100, 4095, 4096, 7000], vec![], vec![3, 8999], vec![]];
    let penalties = [1.7f32, 1.0, 0.5, 1.3];
    let temperatures = [0.8f32, 0.0, 1.5, 1.0];
    let mut input = Vec::new();
    let total_tokens: usize = penalised.iter().map(Vec::len).sum();
    for v in [rows.len(), vocab, total_tokens] {
        input.extend((v as i32).to_le_bytes());
    }
    let mut offset = 0i32;
    input.extend(offset.to_le_bytes());
    for p in &penalised {
        offset += p.len() as i32;
        input.extend(offset.to_le_bytes());
    }
    for t in penalised.iter().flatten() {
        input.extend((*t as i32).to_le_bytes());
    }
    for v in penalties
        .iter()
        .chain(&temperatures)
        .chain(rows.iter().flatten())
    {
        input.extend(v.to_le_bytes());
    }
    let raw = run_raw(&exe, &input, "sample kernels");
    let per_row = crate::decoder::TOP_TOKENS + 2;
    let (keys, scores) = raw.split_at(rows.len() * per_row * 8);
    let keys: Vec<u64> = keys
        .chunks_exact(8)
        .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let scores: Vec<f32> = scores
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    for (r, row) in rows.iter().enumerate() {
        let got = &keys[r * per_row..(r + 1) * per_row];
        let mut want = row.clone();
        for &t in &penalised[r] {
            let l = &mut want[t as usize];
            *l = if *l < 0.0 {
                *l * penalties[r]
            } else {
                *l / penalties[r]
            };
        }
        let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(
            same(&scores[r * vocab..(r + 1) * vocab], &want),
            "row {r}'s scores"
        );
        if r == 3 {
            assert_eq!(got[per_row - 1], 1, "the NaN row is flagged");
            continue;
        }
        assert_eq!(got[per_row - 1], 0, "row {r} has no NaN");
        let mut order: Vec<usize> = (0..vocab).collect();
        order.sort_by(|&a, &b| want[b].total_cmp(&want[a]).then(a.cmp(&b)));
        let top: Vec<(u32, f32)> = got[..per_row - 2]
            .iter()
            .map(|&k| crate::decoder::top_entry(k))
            .collect();
        let expected: Vec<(u32, f32)> = order[..per_row - 2]
            .iter()
            .map(|&i| (i as u32, want[i]))
            .collect();
        assert_eq!(top.len(), expected.len());
        for (g, e) in top.iter().zip(&expected) {
            assert!(
                g.0 == e.0 && g.1.to_bits() == e.1.to_bits(),
                "row {r}: {g:?} against {e:?}"
            );
        }
        let total = f64::from_bits(got[per_row - 2]);
        if temperatures[r] > 0.0 {
            let t = temperatures[r];
            let max = want[order[0]] / t;
            let sum: f64 = want.iter().map(|&v| f64::from(v / t - max).exp()).sum();
            assert!(
                (total - sum).abs() <= 1e-12 * sum,
                "row {r}: {total} against {sum}"
            );
        } else {
            assert_eq!(total, 0.0);
        }
    }
    // Row 0: the unpenalised maximum in the last column (the others' ties were penalised).
    assert_eq!(crate::decoder::top_entry(keys[0]).0, 8999);
    assert_eq!(
        (
            crate::decoder::top_entry(keys[per_row]).0,
            crate::decoder::top_entry(keys[per_row + 1]).0
        ),
        (10, 12),
        "+0.0 before -0.0"
    );
}

const PADDED_SOFTMAX_HARNESS: &str = r#"
int main(void) {
    int* d = take<int>(3);  // rows (one head, one input), keys, row stride
    int rows = d[0], keys = d[1], stride = d[2];
    int* mask = take<int>(keys);
    float* scores_f = take<float>((size_t)rows * stride);
    T* block = to_t(scores_f, (size_t)rows * stride);
    emu_launch({(unsigned)rows, 1, 1}, {32, 1, 1},
               [&] { masked_softmax(block, mask, 1, rows, keys, stride, 0); });
    put(block, (size_t)rows * stride);
    T* warp = to_t(scores_f, (size_t)rows * stride);
    emu_launch({(unsigned)((rows + 3) / 4), 1, 1}, {32, 4, 1},
               [&] { masked_softmax_warp(warp, mask, 1, rows, keys, stride, (long long)rows, 0); });
    put(warp, (size_t)rows * stride);
    return 0;
}
"#;

/// The softmax over score rows padded past the keys (the engine pads them to a multiple of 8 for
/// aligned products): each row's keys as the unpadded softmax gives them, the padding written 0
/// whatever it held (block and warp forms).
#[test]
fn padded_score_rows_get_zeros_past_the_keys() {
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = build_main::<f32>(dir.path(), PADDED_SOFTMAX_HARNESS) else {
        return;
    };
    let (rows, keys, stride) = (5usize, 13usize, 16usize);
    let mut rng = Rng(0x7777_0000_abcd_0001);
    let mask: Vec<i32> = (0..keys as i32).map(|j| (j % 5 != 3) as i32).collect();
    let mut scores = rng.vec(rows * stride, 6.0, 0.0);
    for r in 0..rows {
        for j in keys..stride {
            scores[r * stride + j] = 1e4;
        }
    }
    let mut input = Vec::new();
    for v in [rows, keys, stride] {
        input.extend((v as i32).to_le_bytes());
    }
    for v in &mask {
        input.extend(v.to_le_bytes());
    }
    for v in &scores {
        input.extend(v.to_le_bytes());
    }
    let got = run(&exe, &input, "padded softmax");
    let (block, warp) = got.split_at(rows * stride);
    for r in 0..rows {
        let row = &scores[r * stride..r * stride + keys];
        let visible: Vec<usize> = (0..keys).filter(|&j| mask[j] != 0).collect();
        for (j, &want) in softmax_over(row, &visible, stride).iter().enumerate() {
            close(block[r * stride + j], want, &format!("row {r} column {j}"));
            close(
                warp[r * stride + j],
                want,
                &format!("warp row {r} column {j}"),
            );
        }
    }
}

const FLASH_HARNESS: &str = r#"
int main(void) {
    int* d = take<int>(5);  // batch, seq, heads, head size, causal
    int batch = d[0], seq = d[1], heads = d[2], size = d[3], causal = d[4];
    size_t hidden = (size_t)heads * size, tokens = (size_t)batch * seq;
    int* mask = take<int>(tokens);
    T* qkv = to_t(take<float>(tokens * 3 * hidden), tokens * 3 * hidden);
    T* bias = to_t(take<float>(3 * hidden), 3 * hidden);
    T* out = to_t(take<float>(tokens * hidden), tokens * hidden);
    float scale_log2 = 1.4426950408889634f / sqrtf((float)size);
    emu_launch({(unsigned)((seq + FLASH_ROWS - 1) / FLASH_ROWS), (unsigned)(batch * heads), 1},
               {FLASH_THREADS, 1, 1}, [&] {
        (size == 32 ? flash_attention_32 : flash_attention_64)(qkv, bias, mask, seq, heads,
                                                               scale_log2, causal, out);
    });
    put(out, tokens * hidden);
    return 0;
}
"#;

/// The fused attention (mma.sync and ldmatrix emulated in the PTX register layout) against the
/// definition in f64: q, k and v the (stored) projection plus its bias, softmax(q kᵀ / √d) over
/// the visible keys, times v (the kernel's operands are f16, so the bar is 4e-3). Head sizes 32 and
/// 64, sequences that end inside a tile and span several, padding holes in the mask, causal rows.
#[test]
fn fused_attention_matches_the_definition_f32() {
    check_fused_attention::<f32>();
}

/// As above with f16 storage (the engine's: the output pairs are stored as one word).
#[test]
fn fused_attention_matches_the_definition_f16() {
    check_fused_attention::<half::f16>();
}

fn check_fused_attention<T: Elem>() {
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = build_main::<T>(dir.path(), FLASH_HARNESS) else {
        return;
    };
    let mut rng = Rng(0x5eed_f1a5_0000_0007);
    for (batch, seq, heads, size, causal) in [
        (2usize, 77usize, 2usize, 64usize, false),
        (1, 130, 3, 32, true),
        (2, 5, 1, 64, true),
    ] {
        let hidden = heads * size;
        let tokens = batch * seq;
        // Input 0 sees every key; input 1 has holes and padding at the end (key 0 stays
        // visible, so no row is left without a key).
        let mask: Vec<i32> = (0..tokens)
            .map(|i| {
                let (b, j) = (i / seq, i % seq);
                i32::from(b == 0 || (j % 5 != 2 && j < seq - seq / 4))
            })
            .collect();
        let qkv = rng.vec(tokens * 3 * hidden, 4.0, 0.0);
        let bias = rng.vec(3 * hidden, 1.0, 0.0);
        let mut input = Vec::new();
        for v in [batch, seq, heads, size, usize::from(causal)] {
            input.extend((v as i32).to_le_bytes());
        }
        for v in &mask {
            input.extend(v.to_le_bytes());
        }
        for v in qkv
            .iter()
            .chain(&bias)
            .chain(&vec![7.0f32; tokens * hidden])
        {
            input.extend(v.to_le_bytes());
        }
        let got = run(&exe, &input, "fused attention");
        let part = |m: usize, which: usize, c: usize| {
            f64::from(stored::<T>(qkv[m * 3 * hidden + which * hidden + c]))
                + f64::from(stored::<T>(bias[which * hidden + c]))
        };
        let scale = 1.0 / (size as f64).sqrt();
        for b in 0..batch {
            for h in 0..heads {
                for i in 0..seq {
                    let visible: Vec<usize> = (0..seq)
                        .filter(|&j| mask[b * seq + j] != 0 && (!causal || j <= i))
                        .collect();
                    let scores: Vec<f64> = visible
                        .iter()
                        .map(|&j| {
                            (0..size)
                                .map(|d| {
                                    part(b * seq + i, 0, h * size + d)
                                        * part(b * seq + j, 1, h * size + d)
                                })
                                .sum::<f64>()
                                * scale
                        })
                        .collect();
                    let mx = scores.iter().copied().fold(f64::MIN, f64::max);
                    let weights: Vec<f64> = scores.iter().map(|s| (s - mx).exp()).collect();
                    let total: f64 = weights.iter().sum();
                    for d in 0..size {
                        let want: f64 = visible
                            .iter()
                            .zip(&weights)
                            .map(|(&j, w)| w / total * part(b * seq + j, 2, h * size + d))
                            .sum();
                        let at = (b * seq + i) * hidden + h * size + d;
                        assert!(
                            (f64::from(got[at]) - want).abs() <= 4e-3,
                            "batch {b} head {h} query {i} column {d} (seq {seq}, size {size}, \
                             causal {causal}): {} against {want}",
                            got[at]
                        );
                    }
                }
            }
        }
    }
}

const CACHED_FLASH_HARNESS: &str = r#"
int main(void) {
    int* h = take<int>(7);  // batch, heads, kv_heads, head_dim, n_new, cap, past
    int batch = h[0], heads = h[1], kv = h[2], hd = h[3], n_new = h[4], cap = h[5], past = h[6];
    size_t qn = (size_t)batch * n_new * heads * hd, cn = (size_t)batch * kv * cap * hd;
    T* q = to_t(take<float>(qn), qn);
    T* k = to_t(take<float>(cn), cn);
    T* v = to_t(take<float>(cn), cn);
    int* mask = take<int>((size_t)batch * cap);
    T* flash = to_t(take<float>(qn), qn);
    T* plain = to_t(take<float>(qn), qn);
    float scale = 1.f / sqrtf((float)hd);
    emu_launch({(unsigned)((n_new + FLASH_ROWS - 1) / FLASH_ROWS), (unsigned)(batch * heads), 1},
               {FLASH_THREADS, 1, 1}, [&] {
        (hd == 32 ? cached_flash_attention_32 : cached_flash_attention_64)(
            q, k, v, mask, past, n_new, heads, kv, cap, scale * 1.4426950408889634f, flash);
    });
    emu_launch({(unsigned)n_new, (unsigned)heads, (unsigned)batch}, {128, 1, 1}, [&] {
        cached_attention(q, k, v, mask, &past, heads, kv, hd, n_new, cap, 0, scale, 0, nullptr,
                         plain);
    });
    put(flash, qn);
    put(plain, qn);
    return 0;
}
"#;

/// The prefill's attention on tensor cores (`cached_flash_attention_*`, mma.sync and ldmatrix
/// emulated) against `cached_attention` (checked against the definition above) on the same f16
/// cache: grouped-query heads, columns cached before the call, several query and key tiles, a
/// left-padded row (whose padded queries see no key: zeros) and holes in the mask. The flash
/// kernel rounds the probabilities to f16 for the product with v, hence the bar of 4e-3.
#[test]
fn cached_flash_attention_matches_the_cached_kernel() {
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = build_main::<half::f16>(dir.path(), CACHED_FLASH_HARNESS) else {
        return;
    };
    let mut rng = Rng(0x0f1a_5bca_c4ed_0001);
    // (batch, heads, kv_heads, head_dim, new, cap, past)
    for (batch, heads, kv, hd, new, cap, past) in [
        (2usize, 4usize, 2usize, 64usize, 70usize, 80usize, 0usize),
        (1, 3, 1, 32, 20, 40, 13),
        (1, 2, 2, 64, 130, 136, 0),
    ] {
        let (qn, cn) = (batch * new * heads * hd, batch * kv * cap * hd);
        // Row 1 left-padded by 5 columns; holes every 7th column of row 0 after the first.
        let mask: Vec<i32> = (0..batch * cap)
            .map(|i| {
                let (b, j) = (i / cap, i % cap);
                i32::from(if b == 1 { j >= 5 } else { j == 0 || j % 7 != 3 })
            })
            .collect();
        let mut input = Vec::new();
        for v in [batch, heads, kv, hd, new, cap, past] {
            input.extend((v as i32).to_le_bytes());
        }
        let values = [
            rng.vec(qn, 4.0, 0.0),
            rng.vec(cn, 4.0, 0.0),
            rng.vec(cn, 2.0, 0.0),
        ];
        for v in values.iter().flatten() {
            input.extend(v.to_le_bytes());
        }
        for m in &mask {
            input.extend(m.to_le_bytes());
        }
        for v in std::iter::repeat_n(7.0f32, 2 * qn) {
            input.extend(v.to_le_bytes());
        }
        let got = run(&exe, &input, "cached flash attention");
        let (flash, plain) = got.split_at(qn);
        // Both wrote every value (the buffers start at 7), the padded queries' as zeros.
        assert!(flash.iter().chain(plain).all(|&v| v != 7.0));
        assert!(plain.iter().filter(|&&v| v != 0.0).count() > qn / 2);
        for (i, (f, p)) in flash.iter().zip(plain).enumerate() {
            assert!(
                (f - p).abs() <= 4e-3,
                "value {i} (batch {batch}, heads {heads}/{kv}, head {hd}, new {new}, past {past}): \
                 {f} against {p}"
            );
        }
    }
}

const MESSAGE_ROWS_HARNESS: &str = r#"
int main(void) {
    int* d = take<int>(3);  // images, tokens (class + patches), hidden
    int batch = d[0], tokens = d[1], hid = d[2], stride = tokens + 1;
    T* pe = to_t(take<float>((size_t)batch * (tokens - 1) * hid), (size_t)batch * (tokens - 1) * hid);
    T* bias = to_t(take<float>(hid), hid);
    T* cls = to_t(take<float>(hid), hid);
    T* pos = to_t(take<float>((size_t)tokens * hid), (size_t)tokens * hid);
    T* msg = to_t(take<float>((size_t)batch * hid), (size_t)batch * hid);
    int* rows = take<int>(batch);
    size_t n = (size_t)batch * stride * hid;
    T* out = to_t(take<float>(n), n);  // garbage in the message rows before the kernel
    emu_launch({(unsigned)(batch * stride), (unsigned)((hid + 255) / 256), 1}, {256, 1, 1},
               [&] { patch_embeddings(pe, bias, cls, pos, tokens, stride, hid, out); });
    put(out, n);
    emu_launch({(unsigned)batch, (unsigned)((hid + 255) / 256), 1}, {256, 1, 1},
               [&] { scatter_rows(rows, msg, hid, out); });
    put(out, n);
    return 0;
}
"#;

/// X-CLIP's message rows: the patch embeddings of images `tokens + 1` rows apart (class token,
/// patches plus bias, positions; zeros in each image's last row whatever it held), then
/// `scatter_rows` writing one message into each image's last row and nothing else.
#[test]
fn message_rows_are_zeroed_then_scattered_into() {
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = build_main::<f32>(dir.path(), MESSAGE_ROWS_HARNESS) else {
        return;
    };
    let (batch, tokens, hid) = (3usize, 5usize, 300usize);
    let stride = tokens + 1;
    let mut rng = Rng(0x3e55_a9e5_0000_0042);
    let pe = rng.vec(batch * (tokens - 1) * hid, 2.0, 0.0);
    let bias = rng.vec(hid, 1.0, 0.0);
    let cls = rng.vec(hid, 1.0, 0.0);
    let pos = rng.vec(tokens * hid, 1.0, 0.0);
    let msg = rng.vec(batch * hid, 3.0, 0.0);
    let rows: Vec<i32> = (0..batch).map(|b| (b * stride + tokens) as i32).collect();
    let before = rng.vec(batch * stride * hid, 9.0, 5.0);
    let mut input = Vec::new();
    for v in [batch, tokens, hid] {
        input.extend((v as i32).to_le_bytes());
    }
    for v in pe.iter().chain(&bias).chain(&cls).chain(&pos).chain(&msg) {
        input.extend(v.to_le_bytes());
    }
    for v in &rows {
        input.extend(v.to_le_bytes());
    }
    for v in &before {
        input.extend(v.to_le_bytes());
    }
    let got = run(&exe, &input, "message rows");
    let (embedded, scattered) = got.split_at(batch * stride * hid);
    for b in 0..batch {
        for s in 0..stride {
            for c in 0..hid {
                let at = (b * stride + s) * hid + c;
                let want = match s {
                    0 => cls[c] + pos[c],
                    s if s < tokens => {
                        pe[(b * (tokens - 1) + s - 1) * hid + c] + bias[c] + pos[s * hid + c]
                    }
                    _ => 0.0,
                };
                close(embedded[at], f64::from(want), "patch embeddings");
                let want = if s == tokens { msg[b * hid + c] } else { want };
                close(scattered[at], f64::from(want), "scattered message");
            }
        }
    }
}

const NORM_HARNESS: &str = r#"
int main(void) {
    int* d = take<int>(2);  // rows, hidden
    int rows = d[0], hid = d[1];
    size_t n = (size_t)rows * hid;
    T* y = to_t(take<float>(n), n);
    T* bias = to_t(take<float>(hid), hid);
    T* res = to_t(take<float>(n), n);
    T* gamma = to_t(take<float>(hid), hid);
    T* beta = to_t(take<float>(hid), hid);
    float eps = 1e-5f;
    unsigned threads = (unsigned)((hid / VEC + 31) / 32 * 32), blocks = (unsigned)((rows + 3) / 4);
    T* out = (T*)calloc(n, sizeof(T));
    // Post-norm: out = norm(y + bias + residual), a block per row, then a warp per row.
    emu_launch({(unsigned)rows, 1, 1}, {threads, 1, 1},
               [&] { bias_residual_norm_vec(y, bias, res, gamma, beta, eps, hid, out); });
    put(out, n);
    emu_launch({blocks, 1, 1}, {128, 1, 1},
               [&] { bias_residual_norm_warp(y, bias, res, gamma, beta, eps, hid, out, rows); });
    put(out, n);
    // Pre-norm: stream += y + bias, out = norm(stream); block, then warp (each on its own copy).
    for (int warp = 0; warp < 2; ++warp) {
        T* stream = (T*)malloc(n * sizeof(T));
        memcpy(stream, res, n * sizeof(T));
        if (warp)
            emu_launch({blocks, 1, 1}, {128, 1, 1},
                       [&] { add_norm_sum_warp(y, bias, stream, gamma, beta, eps, hid, out, rows); });
        else
            emu_launch({(unsigned)rows, 1, 1}, {threads, 1, 1},
                       [&] { add_norm_sum_vec(y, bias, stream, gamma, beta, eps, hid, out); });
        put(stream, n);
        put(out, n);
    }
    // The plain norm of y, a warp per row, in place.
    emu_launch({blocks, 1, 1}, {128, 1, 1},
               [&] { layer_norm_warp(y, gamma, beta, eps, hid, y, rows); });
    put(y, n);
    return 0;
}
"#;

/// The add + norm kernels a warp per row (`*_warp`) against their definitions and against the
/// block-per-row kernels they replace, in f32 and in f16 storage: post-norm (bias + residual),
/// pre-norm (the residual stream updated in place, the norm reading its rounded sum) and the
/// plain norm in place, at widths that leave lanes idle or give lanes unequal packs, and a row
/// count that leaves a block's last warps idle.
#[test]
fn warp_norms_match_the_definition_and_the_block_norms() {
    check_warp_norms::<f32>(1e-5);
    check_warp_norms::<half::f16>(4e-3);
}

fn check_warp_norms<T: Elem>(bar: f64) {
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = build_main::<T>(dir.path(), NORM_HARNESS) else {
        return;
    };
    let mut rng = Rng(0x0a0d_0e0f_1234_5678);
    let widest = 32 * 4 * crate::engine::vec_width::<T>();
    for (rows, hid) in [(6usize, 40usize), (5, widest - 8), (3, widest)] {
        let n = rows * hid;
        let st = |v: Vec<f32>| v.into_iter().map(stored::<T>).collect::<Vec<f32>>();
        let y = st(rng.vec(n, 4.0, 0.5));
        let bias = st(rng.vec(hid, 1.0, 0.0));
        let res = st(rng.vec(n, 4.0, -0.5));
        let gamma = st(rng.vec(hid, 1.0, 1.0));
        let beta = st(rng.vec(hid, 1.0, 0.0));
        let mut input = Vec::new();
        for v in [rows as i32, hid as i32] {
            input.extend(v.to_le_bytes());
        }
        for v in y.iter().chain(&bias).chain(&res).chain(&gamma).chain(&beta) {
            input.extend(v.to_le_bytes());
        }
        let got = run(&exe, &input, "norm kernels");
        assert_eq!(got.len(), 7 * n);
        let part = |i: usize| &got[i * n..(i + 1) * n];
        // The norm of `z` (each row), in f64.
        let norm = |z: &[f64]| -> Vec<f64> {
            z.chunks(hid)
                .flat_map(|row| {
                    let mean = row.iter().sum::<f64>() / hid as f64;
                    let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / hid as f64;
                    let inv = 1.0 / (var + 1e-5).sqrt();
                    row.iter()
                        .enumerate()
                        .map(|(c, v)| (v - mean) * inv * f64::from(gamma[c]) + f64::from(beta[c]))
                        .collect::<Vec<_>>()
                })
                .collect()
        };
        let sum: Vec<f64> = (0..n)
            .map(|i| f64::from(y[i]) + f64::from(bias[i % hid]) + f64::from(res[i]))
            .collect();
        // The pre-norm kernels store the sum in T and normalise that.
        let stored_sum: Vec<f64> = sum
            .iter()
            .map(|&v| f64::from(stored::<T>(v as f32)))
            .collect();
        let plain: Vec<f64> = y.iter().map(|&v| f64::from(v)).collect();
        let near = |a: &[f32], b: &[f64], what: &str| {
            for (i, (&a, &b)) in a.iter().zip(b).enumerate() {
                assert!(
                    (f64::from(a) - b).abs() <= bar * (1.0 + b.abs()),
                    "{what} ({rows} rows of {hid}), value {i}: {a} against {b}"
                );
            }
        };
        let post = norm(&sum);
        near(part(0), &post, "block post-norm");
        near(part(1), &post, "warp post-norm");
        for (k, what) in [(2, "block pre-norm"), (4, "warp pre-norm")] {
            near(part(k), &stored_sum, &format!("{what} stream"));
            near(part(k + 1), &norm(&stored_sum), what);
        }
        near(part(6), &norm(&plain), "warp norm in place");
    }
}

const ACTIVATION_HARNESS: &str = r#"
int main(void) {
    int* d = take<int>(2);  // cols and how many activations; then their codes
    int cols = d[0], n = d[1];
    int* codes = take<int>(n);
    T* bias = to_t(take<float>(cols), cols);
    float* x = take<float>((size_t)n * cols);
    for (int a = 0; a < n; ++a) {
        T* y = to_t(x + (size_t)a * cols, cols);
        emu_launch({1, 1, 1}, {(unsigned)cols, 1, 1}, [&] { bias_act(y, bias, cols, codes[a]); });
        put(y, cols);
    }
    return 0;
}
"#;

/// `bias_act` under every activation the encoder spec names, against the spec's f64 definition
/// (`EncoderActivation::apply`) of `x + bias`, over inputs from -8 to 8.
#[test]
fn every_encoder_activation_matches_its_definition() {
    use ipfs_accelerate_core::EncoderActivation as A;
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = build_main::<f32>(dir.path(), ACTIVATION_HARNESS) else {
        return;
    };
    let every = [
        A::Gelu,
        A::GeluTanh,
        A::Relu,
        A::QuickGelu,
        A::Relu6,
        A::Silu,
        A::Sigmoid,
        A::Tanh,
        A::Mish,
        A::Identity,
    ];
    let cols = 64usize;
    let mut rng = Rng(0x7a3c_0001_d00d_beef);
    let bias = rng.vec(cols, 1.0, 0.0);
    let x: Vec<f32> = (0..every.len() * cols)
        .map(|i| (i % cols) as f32 / cols as f32 * 16.0 - 8.0)
        .collect();
    let mut input = Vec::new();
    for v in [cols as i32, every.len() as i32]
        .into_iter()
        .chain(every.iter().map(|&a| crate::engine::Act::from(a) as i32))
    {
        input.extend(v.to_le_bytes());
    }
    for v in bias.iter().chain(&x) {
        input.extend(v.to_le_bytes());
    }
    let got = run(&exe, &input, "activations");
    for (a, act) in every.iter().enumerate() {
        for c in 0..cols {
            let v = f64::from(x[a * cols + c]) + f64::from(bias[c]);
            close(got[a * cols + c], act.apply(v), &format!("{act:?} of {v}"));
        }
    }
}
