//! Sets `cfg(embedded_assets)` when feature `embedded-default` is on and the embedded model's
//! files are in `assets/` (a clone of the repository). The published crate leaves them out
//! (crates.io takes 10 MB); its `embedded` model is then fetched from the hub on first use.

use std::path::Path;

const FILES: [&str; 4] = [
    "config.json",
    "tokenizer.json",
    "pooling_config.json",
    "model.safetensors",
];

fn main() {
    println!("cargo::rustc-check-cfg=cfg(embedded_assets)");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/all-MiniLM-L6-v2-int8");
    println!("cargo::rerun-if-changed={}", dir.display());
    let wanted = std::env::var_os("CARGO_FEATURE_EMBEDDED_DEFAULT").is_some();
    if wanted && FILES.iter().all(|f| dir.join(f).is_file()) {
        println!("cargo::rustc-cfg=embedded_assets");
    }
}
