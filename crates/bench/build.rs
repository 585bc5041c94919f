//! Records the Cargo profile and opt-level this crate is compiled with, so every stored benchmark
//! run says whether it measured an optimised build (`crate::build`).

fn main() {
    for (var, name) in [
        ("PROFILE", "IPFS_ACCELERATE_BENCH_PROFILE"),
        ("OPT_LEVEL", "IPFS_ACCELERATE_BENCH_OPT_LEVEL"),
        ("DEBUG", "IPFS_ACCELERATE_BENCH_DEBUG"),
    ] {
        let value = std::env::var(var).unwrap_or_else(|_| "unknown".into());
        println!("cargo:rustc-env={name}={value}");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
