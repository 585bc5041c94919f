//! Times the f32 and int8 linear kernels on the shapes of all-MiniLM-L6-v2 at batch 8 × seq 128
//! (1024 rows): `cargo run --release -p ipfs-accelerate-kernels --example int8_linear`.
//! Prints the fastest of 20 runs per shape and kernel.

use std::time::Instant;

use ipfs_accelerate_kernels::{linear, linear_int8, Epilogue, Int8Isa, PackedInt8};

fn median_ms(mut f: impl FnMut()) -> f64 {
    f();
    let mut t: Vec<f64> = (0..20)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[0]
}

fn main() {
    let rows = 1024;
    println!("threads {}", rayon::current_num_threads());
    for (k, n) in [(384, 384), (384, 1536), (1536, 384)] {
        let x: Vec<f32> = (0..rows * k)
            .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
            .collect();
        let w: Vec<f32> = (0..k * n)
            .map(|i| ((i * 104_729) % 997) as f32 / 5000.0 - 0.1)
            .collect();
        let codes: Vec<i8> = (0..n * k).map(|i| ((i * 31) % 255) as i32 as i8).collect();
        let scales = vec![0.01f32; n * k / 32];
        let f32_ms = median_ms(|| {
            std::hint::black_box(linear(&x, rows, k, &w, n, Epilogue::default()));
        });
        let gmac = (rows * k * n) as f64 / 1e9;
        print!(
            "{rows}x{k}x{n}: f32 {f32_ms:.3} ms ({:.1} GMAC/s)",
            gmac / f32_ms * 1e3
        );
        for isa in Int8Isa::ALL {
            let Some(p) = PackedInt8::with_isa(&codes, &scales, n, k, 32, isa) else {
                continue;
            };
            let ms = median_ms(|| {
                std::hint::black_box(linear_int8(&x, rows, &p, Epilogue::default()));
            });
            print!(" | {isa:?} {ms:.3} ms ({:.1} GMAC/s)", gmac / ms * 1e3);
        }
        println!();
    }
}
