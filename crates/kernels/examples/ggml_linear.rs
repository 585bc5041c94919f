//! Times decode GEMV (one activation row) on ggml weights kept in their block layout, on the
//! linear shapes of Qwen2.5-0.5B, against the f32 `linear` on the dequantized weight:
//! `cargo run --release -p ipfs-accelerate-kernels --example ggml_linear [-- --sweep]`.
//!
//! Per shape, format and thread count: the median, min and max of 11 runs and the weight bytes
//! read per second at the median. "hot" repeats one weight (it stays in cache when it fits);
//! "cold" reads 128 MiB of other memory before each run (untimed), so the weight streams from
//! DRAM as in token generation, where a model's weights do not fit in cache. `--sweep` also times the dot and the panel
//! paths over 1..256 rows; `--only NAME` keeps the shapes whose name contains NAME, `--threads
//! N` runs N threads only.

use std::time::Instant;

use ipfs_accelerate_kernels::{
    ggml_isa, linear, linear_ggml, linear_ggml_with, BlockType, Epilogue, GgmlBlocks, GgmlPath,
};

const REPEATS: usize = 11;

/// Median, min and max seconds of `REPEATS` runs of `f` after one warm-up, each run after
/// `prepare` (not timed).
fn time(mut prepare: impl FnMut(), mut f: impl FnMut()) -> (f64, f64, f64) {
    f();
    let mut t: Vec<f64> = (0..REPEATS)
        .map(|_| {
            prepare();
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(f64::total_cmp);
    (t[REPEATS / 2], t[0], t[REPEATS - 1])
}

/// A small deterministic generator (xorshift).
struct Gen(u64);
impl Gen {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn f32(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

/// Random `[n, k]` blocks of `ty` with finite scales of realistic size.
fn random_weight(ty: BlockType, n: usize, k: usize, g: &mut Gen) -> Vec<u8> {
    let ts = ty.type_size();
    let mut data: Vec<u8> = (0..n * k / ty.block_size() * ts)
        .map(|_| g.next() as u8)
        .collect();
    // f16 0.001..0.002 (exponent 5, random mantissa): scales; minimums likewise.
    let scale = |g: &mut Gen| (0x1400u16 | (g.next() as u16 & 0x3FF)).to_le_bytes();
    let fields: &[usize] = match ty {
        BlockType::Q4_0 | BlockType::Q5_0 | BlockType::Q8_0 => &[0],
        BlockType::Q4_1 | BlockType::Q5_1 | BlockType::Q4_K | BlockType::Q5_K => &[0, 2],
        BlockType::Q6_K => &[208],
        BlockType::Q3_K => &[108],
        BlockType::Q2_K => &[80, 82],
        BlockType::IQ4_XS | BlockType::IQ4_NL => &[0],
        _ => &[],
    };
    for blk in data.chunks_exact_mut(ts) {
        if ty == BlockType::F16 {
            blk.copy_from_slice(&scale(g));
        }
        for &at in fields {
            blk[at..at + 2].copy_from_slice(&scale(g));
        }
    }
    data
}

/// Reads and writes `buf` (more than the last-level cache) so that earlier data is evicted.
fn flush(buf: &mut [u64]) {
    for (i, v) in buf.iter_mut().enumerate() {
        *v = v.wrapping_add(i as u64);
    }
    std::hint::black_box(&buf);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let sweep = args.iter().any(|a| a == "--sweep");
    // `--only SUBSTRING`: the shapes whose name contains it; `--threads N`: only N threads.
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let only = arg("--only");
    let thread_counts: Vec<usize> = match arg("--threads").and_then(|t| t.parse().ok()) {
        Some(t) => vec![t],
        None => vec![1, 2],
    };
    let shapes = [
        ("ffn up/gate", 896usize, 4864usize),
        ("ffn down", 4864, 896),
        ("attn q/o", 896, 896),
        ("attn k/v", 896, 128),
        ("lm head", 896, 151_936),
    ];
    let types = [
        BlockType::Q4_K,
        BlockType::Q6_K,
        BlockType::Q5_0,
        BlockType::Q8_0,
        BlockType::Q4_1,
    ];
    let mut g = Gen(0x9E37_79B9_7F4A_7C15);
    let mut flusher = vec![0u64; (128 << 20) / 8];
    println!("ggml kernels: {:?}", ggml_isa());
    println!(
        "| shape (k→n) | weight | MB | threads | hot µs median (min–max) | hot GB/s | cold µs median (min–max) | cold GB/s |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (name, k, n) in shapes {
        if only.as_ref().is_some_and(|o| !name.contains(o.as_str())) {
            continue;
        }
        let x: Vec<f32> = (0..k).map(|_| g.f32()).collect();
        for ty in types.iter().copied().map(Some).chain([None]) {
            // None: the f32 `linear` on the dequantized, transposed weight (of the Q8_0 data).
            let fmt = ty.unwrap_or(BlockType::Q8_0);
            if !k.is_multiple_of(fmt.block_size()) {
                println!(
                    "| {name} {k}→{n} | {fmt} | – | – | not representable (k % {} ≠ 0) | | | |",
                    fmt.block_size()
                );
                continue;
            }
            let data = random_weight(fmt, n, k, &mut g);
            let w = GgmlBlocks::new(fmt, &data, n, k).expect("shape");
            let f32_w: Vec<f32> = if ty.is_none() {
                let d = w.dequantize();
                let mut t = vec![0f32; k * n];
                for j in 0..n {
                    for i in 0..k {
                        t[i * n + j] = d[j * k + i];
                    }
                }
                t
            } else {
                Vec::new()
            };
            let bytes = if ty.is_some() { data.len() } else { 4 * k * n };
            for &threads in &thread_counts {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .expect("thread pool");
                let run = || {
                    if ty.is_some() {
                        std::hint::black_box(linear_ggml(&x, 1, k, &w, Epilogue::default()));
                    } else {
                        std::hint::black_box(linear(&x, 1, k, &f32_w, n, Epilogue::default()));
                    }
                };
                let (hot, cold_t) =
                    pool.install(|| (time(|| {}, run), time(|| flush(&mut flusher), run)));
                let label = ty.map_or("f32 linear".to_string(), |t| t.name().to_string());
                let gbs = |t: f64| bytes as f64 / t / 1e9;
                println!(
                    "| {name} {k}→{n} | {label} | {:.1} | {threads} | {:.0} ({:.0}–{:.0}) | {:.1} | {:.0} ({:.0}–{:.0}) | {:.1} |",
                    bytes as f64 / 1e6,
                    hot.0 * 1e6,
                    hot.1 * 1e6,
                    hot.2 * 1e6,
                    gbs(hot.0),
                    cold_t.0 * 1e6,
                    cold_t.1 * 1e6,
                    cold_t.2 * 1e6,
                    gbs(cold_t.0),
                );
            }
        }
    }
    println!("\nother formats, ffn down 4864→896 (F16: dequantized rows and f32 dots; the rest: integer kernels)");
    println!("| weight | MB | threads | hot µs median (min–max) | hot GB/s | cold µs median (min–max) | cold GB/s |");
    println!("|---|---|---|---|---|---|---|");
    for ty in [
        BlockType::Q5_K,
        BlockType::Q3_K,
        BlockType::Q2_K,
        BlockType::IQ4_XS,
        BlockType::IQ4_NL,
        BlockType::F16,
    ] {
        let (k, n) = (4864, 896);
        let data = random_weight(ty, n, k, &mut g);
        let w = GgmlBlocks::new(ty, &data, n, k).expect("shape");
        let x: Vec<f32> = (0..k).map(|_| g.f32()).collect();
        for &threads in &thread_counts {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("thread pool");
            let run = || {
                std::hint::black_box(linear_ggml(&x, 1, k, &w, Epilogue::default()));
            };
            let (hot, cold) =
                pool.install(|| (time(|| {}, run), time(|| flush(&mut flusher), run)));
            let gbs = |t: f64| data.len() as f64 / t / 1e9;
            println!(
                "| {ty} | {:.1} | {threads} | {:.0} ({:.0}–{:.0}) | {:.1} | {:.0} ({:.0}–{:.0}) | {:.1} |",
                data.len() as f64 / 1e6,
                hot.0 * 1e6,
                hot.1 * 1e6,
                hot.2 * 1e6,
                gbs(hot.0),
                cold.0 * 1e6,
                cold.1 * 1e6,
                cold.2 * 1e6,
                gbs(cold.0),
            );
        }
    }
    if sweep {
        println!("\nrows sweep (µs median, all threads): dot path vs dequantized panels + gemm");
        println!("| weight | k→n | rows | dot | panels |");
        println!("|---|---|---|---|---|");
        for (ty, k, n) in [
            (BlockType::Q4_K, 4864, 896),
            (BlockType::Q8_0, 896, 4864),
            (BlockType::Q5_0, 896, 4864),
            (BlockType::Q6_K, 4864, 896),
        ] {
            let data = random_weight(ty, n, k, &mut g);
            let w = GgmlBlocks::new(ty, &data, n, k).expect("shape");
            for rows in [1, 2, 4, 8, 16, 32, 64, 128, 256] {
                let x: Vec<f32> = (0..rows * k).map(|_| g.f32()).collect();
                let run = |path| {
                    time(
                        || {},
                        || {
                            std::hint::black_box(linear_ggml_with(
                                &x,
                                rows,
                                k,
                                &w,
                                Epilogue::default(),
                                ggml_isa(),
                                path,
                            ));
                        },
                    )
                    .0
                };
                let (dot, panels) = (run(GgmlPath::Dot), run(GgmlPath::Panels));
                println!(
                    "| {ty} | {k}→{n} | {rows} | {:.0} | {:.0} |",
                    dot * 1e6,
                    panels * 1e6
                );
            }
        }
    }
}
