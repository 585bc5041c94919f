//! Times the int8 linear kernel against the f32 and bf16 ones on the shapes of all-MiniLM-L6-v2
//! at batch 8 × seq 128 (1024 rows) on 2 rayon threads:
//! `cargo run --release -p ipfs-accelerate-kernels --example int8_linear --features gemm/x86-v4`.
//! Prints the median, fastest and slowest of 15 runs per shape and kernel (the kernels take
//! turns, so a busy machine slows them alike).
//!
//! `INT8_ROWS` sets the rows (1 times the decode GEMV), `INT8_SHAPES=384x1152,...` the k × n
//! shapes, `INT8_BLOCK` the weight's block size (32), `INT8_THREADS` the threads,
//! `INT8_REPEATS` the runs, and `INT8_ALL=1` also times the fallback int8 kernels; `INT8_CPU=1`
//! (Linux) times the process' CPU time instead of the wall clock, which other processes slow
//! less (with `INT8_THREADS=1`: the work of one thread). As in the
//! bf16 example, `--features gemm/x86-v4` gives the f32 layer gemm's AVX-512 kernels, as the
//! application runs it.

use std::time::Instant;

use ipfs_accelerate_kernels::{
    linear, linear_bf16, linear_int8, Bf16Isa, Epilogue, Int8Isa, PackedBf16, PackedInt8,
};

/// Median, min and max of `t` (milliseconds).
fn stats(t: &mut [f64]) -> (f64, f64, f64) {
    t.sort_by(f64::total_cmp);
    (t[t.len() / 2], t[0], t[t.len() - 1])
}

#[cfg(target_os = "linux")]
mod cpu {
    #[repr(C)]
    struct Timespec {
        sec: i64,
        nsec: i64,
    }
    extern "C" {
        fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
    }
    /// The CPU time of the whole process, in milliseconds.
    pub fn ms() -> f64 {
        const CLOCK_PROCESS_CPUTIME_ID: i32 = 2;
        let mut ts = Timespec { sec: 0, nsec: 0 };
        // SAFETY: `ts` is a valid `struct timespec` for the call to fill.
        unsafe { clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
        ts.sec as f64 * 1e3 + ts.nsec as f64 / 1e6
    }
}

fn time_ms(f: &mut dyn FnMut(), cpu: bool) -> f64 {
    #[cfg(target_os = "linux")]
    if cpu {
        let s = cpu::ms();
        f();
        return cpu::ms() - s;
    }
    let _ = cpu;
    let s = Instant::now();
    f();
    s.elapsed().as_secs_f64() * 1e3
}

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    rayon::ThreadPoolBuilder::new()
        .num_threads(env("INT8_THREADS", 2))
        .build_global()
        .expect("the global rayon pool is set once");
    let repeats = env("INT8_REPEATS", 15).max(1);
    let rows = env("INT8_ROWS", 1024);
    let block = env("INT8_BLOCK", 32);
    let all = std::env::var_os("INT8_ALL").is_some();
    let cpu = std::env::var_os("INT8_CPU").is_some();
    let isas: Vec<Int8Isa> = if all {
        Int8Isa::ALL
            .into_iter()
            .rev()
            .filter(|i| i.available())
            .collect()
    } else {
        vec![Int8Isa::detect()]
    };
    println!(
        "rows {rows}, threads {}, int8 {isas:?} (blocks of {block}), bf16 {}, {repeats} runs each; \
         {} ms as median (min..max)",
        rayon::current_num_threads(),
        Bf16Isa::detect().name(),
        if cpu { "CPU" } else { "wall" }
    );
    println!(
        "{:>10} | {:>24} | {:>24} | {:>24} | {:>8} | {:>8} | {:>6}",
        "k x n", "f32 (gemm)", "bf16", "int8", "f32/int8", "bf16/int8", "GMAC/s"
    );
    // `INT8_SHAPES=KxN,KxN` replaces the shapes.
    let shapes: Vec<(usize, usize)> = match std::env::var("INT8_SHAPES") {
        Ok(v) => v
            .split(',')
            .filter_map(|s| {
                let (k, n) = s.split_once('x')?;
                Some((k.trim().parse().ok()?, n.trim().parse().ok()?))
            })
            .collect(),
        Err(_) => vec![(384, 1152), (384, 384), (384, 1536), (1536, 384)],
    };
    for (k, n) in shapes {
        let x: Vec<f32> = (0..rows * k)
            .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
            .collect();
        // The caller's f32 weight layout: [k, n].
        let w: Vec<f32> = (0..k * n)
            .map(|i| ((i * 104_729) % 997) as f32 / 5000.0 - 0.1)
            .collect();
        let codes: Vec<i8> = (0..n * k).map(|i| ((i * 31) % 255) as i32 as i8).collect();
        let scales = vec![0.01f32; n * k.div_ceil(block)];
        let bf16 = PackedBf16::from_kn(&w, k, n).expect("bf16 weight");
        let int8: Vec<PackedInt8> = isas
            .iter()
            .map(|&isa| PackedInt8::with_isa(&codes, &scales, n, k, block, isa).expect("int8"))
            .collect();
        let mut kernels: Vec<Box<dyn FnMut() + '_>> = vec![
            Box::new(|| {
                std::hint::black_box(linear(&x, rows, k, &w, n, Epilogue::default()));
            }),
            Box::new(|| {
                std::hint::black_box(linear_bf16(&x, rows, k, &bf16, Epilogue::default()));
            }),
        ];
        for p in &int8 {
            let x = &x;
            kernels.push(Box::new(move || {
                std::hint::black_box(linear_int8(x, rows, p, Epilogue::default()));
            }));
        }
        let mut times = vec![Vec::new(); kernels.len()];
        for f in kernels.iter_mut() {
            f();
        }
        for _ in 0..repeats {
            for (f, t) in kernels.iter_mut().zip(times.iter_mut()) {
                t.push(time_ms(f.as_mut(), cpu));
            }
        }
        let s: Vec<(f64, f64, f64)> = times.iter_mut().map(|t| stats(t)).collect();
        // Four decimals (tenths of a microsecond) for the decode's small products.
        let cell = |(m, lo, hi): (f64, f64, f64)| {
            if m < 0.1 {
                format!("{m:.4} ({lo:.4}..{hi:.4})")
            } else {
                format!("{m:.3} ({lo:.3}..{hi:.3})")
            }
        };
        let gmac = (rows * k * n) as f64 / 1e9;
        for (i, isa) in isas.iter().enumerate() {
            let int8 = s[2 + i];
            let label = if i == 0 {
                format!("{k}x{n}")
            } else {
                format!("{isa:?}")
            };
            let (f32_cell, bf16_cell) = if i == 0 {
                (cell(s[0]), cell(s[1]))
            } else {
                (String::new(), String::new())
            };
            println!(
                "{label:>10} | {f32_cell:>24} | {bf16_cell:>24} | {:>24} | {:>7.2}x | {:>8.2}x | {:>6.1}",
                cell(int8),
                s[0].0 / int8.0,
                s[1].0 / int8.0,
                gmac / int8.0 * 1e3
            );
        }
    }
}
