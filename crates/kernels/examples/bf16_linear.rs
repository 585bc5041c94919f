//! Times the f32, bf16 and int8 linear kernels on the shapes of all-MiniLM-L6-v2 at batch 8 ×
//! seq 128 (1024 rows) on 2 rayon threads (`BF16_THREADS` to change):
//! `cargo run --release -p ipfs-accelerate-kernels --example bf16_linear`.
//! Prints the median, fastest and slowest of 15 runs per shape and kernel (the kernels take
//! turns, so a busy machine slows them alike).
//!
//! Built alone, this crate's gemm has only its AVX2 f32 kernels; in the application burn-flex
//! turns on gemm's `x86-v4` feature (its AVX-512 kernels). Add `--features gemm/x86-v4` to time
//! the f32 layer as the application runs it. `BF16_ALL=1` also times the fallback bf16
//! kernels; `BF16_REPEATS` sets the number of runs.

use std::time::Instant;

use ipfs_accelerate_kernels::{
    linear, linear_bf16, linear_int8, Bf16Isa, Epilogue, Int8Isa, PackedBf16, PackedInt8,
};

/// Median, min and max of `t` (milliseconds).
fn stats(t: &mut [f64]) -> (f64, f64, f64) {
    t.sort_by(f64::total_cmp);
    (t[t.len() / 2], t[0], t[t.len() - 1])
}

fn time_ms(f: &mut dyn FnMut()) -> f64 {
    let s = Instant::now();
    f();
    s.elapsed().as_secs_f64() * 1e3
}

fn main() {
    let threads: usize = std::env::var("BF16_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build_global()
        .expect("the global rayon pool is set once");
    let repeats: usize = std::env::var("BF16_REPEATS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(15);
    let all = std::env::var_os("BF16_ALL").is_some();
    let rows = 1024;
    println!(
        "rows {rows}, threads {}, bf16 kernel {}, {repeats} runs each; ms as median (min..max)",
        rayon::current_num_threads(),
        Bf16Isa::detect().name()
    );
    println!(
        "{:>14} | {:>24} | {:>24} | {:>24} | {:>7} | {:>7}",
        "k x n", "f32 (gemm)", "bf16", "int8", "f32/bf16", "bf16 GMAC/s"
    );
    for (k, n) in [(384, 1152), (384, 384), (384, 1536), (1536, 384)] {
        let x: Vec<f32> = (0..rows * k)
            .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
            .collect();
        // The caller's weight layout: [k, n].
        let w: Vec<f32> = (0..k * n)
            .map(|i| ((i * 104_729) % 997) as f32 / 5000.0 - 0.1)
            .collect();
        let codes: Vec<i8> = (0..n * k).map(|i| ((i * 31) % 255) as i32 as i8).collect();
        let scales = vec![0.01f32; n * k / 32];
        let int8 = PackedInt8::new(&codes, &scales, n, k, 32).expect("int8 weight");
        let mut bf16: Vec<PackedBf16> = Vec::new();
        for isa in Bf16Isa::ALL.into_iter().rev() {
            if let Some(p) = PackedBf16::from_kn_with_isa(&w, k, n, isa) {
                bf16.push(p);
                if !all {
                    break;
                }
            }
        }
        let mut kernels: Vec<(String, Box<dyn FnMut() + '_>)> = vec![
            (
                "f32".into(),
                Box::new(|| {
                    std::hint::black_box(linear(&x, rows, k, &w, n, Epilogue::default()));
                }),
            ),
            (
                "int8".into(),
                Box::new(|| {
                    std::hint::black_box(linear_int8(&x, rows, &int8, Epilogue::default()));
                }),
            ),
        ];
        for p in &bf16 {
            let x = &x;
            kernels.push((
                p.isa().name().into(),
                Box::new(move || {
                    std::hint::black_box(linear_bf16(x, rows, k, p, Epilogue::default()));
                }),
            ));
        }
        let mut times = vec![Vec::new(); kernels.len()];
        for (_, f) in kernels.iter_mut() {
            f();
        }
        for _ in 0..repeats {
            for ((_, f), t) in kernels.iter_mut().zip(times.iter_mut()) {
                t.push(time_ms(f.as_mut()));
            }
        }
        let s: Vec<(f64, f64, f64)> = times.iter_mut().map(|t| stats(t)).collect();
        let cell = |(m, lo, hi): (f64, f64, f64)| format!("{m:.3} ({lo:.3}..{hi:.3})");
        let gmac = (rows * k * n) as f64 / 1e9;
        println!(
            "{:>14} | {:>24} | {:>24} | {:>24} | {:>7.2}x | {:>7.1}",
            format!("{k}x{n}"),
            cell(s[0]),
            cell(s[2]),
            cell(s[1]),
            s[0].0 / s[2].0,
            gmac / s[2].0 * 1e3
        );
        for (i, (name, _)) in kernels.iter().enumerate().skip(3) {
            println!(
                "{:>14}   bf16 {name}: {} = {:.2}x of f32",
                "",
                cell(s[i]),
                s[0].0 / s[i].0
            );
        }
    }
    let _ = Int8Isa::detect();
}
