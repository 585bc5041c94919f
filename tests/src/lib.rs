//! Helpers of the integration tests: where the shared fixtures and models are.

use std::path::PathBuf;

/// The shared data directory: `$IPFS_ACCELERATE_SHARED`, else `../shared` beside the workspace.
/// `None` (the test prints that it is skipped, by name) when absent, unless
/// `IPFS_ACCELERATE_REQUIRE_SHARED=1` (CI), where absence is a failure.
pub fn shared_dir(test: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("IPFS_ACCELERATE_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared"));
    if dir.join("fixtures").is_dir() {
        return Some(dir);
    }
    if std::env::var("IPFS_ACCELERATE_REQUIRE_SHARED").as_deref() == Ok("1") {
        panic!(
            "{test}: shared data not found at {} (IPFS_ACCELERATE_REQUIRE_SHARED=1)",
            dir.display()
        );
    }
    eprintln!(
        "skipped {test}: needs the shared fixtures at {} (set IPFS_ACCELERATE_SHARED)",
        dir.display()
    );
    None
}

/// Cosine similarity.
pub fn cosine(a: &[f32], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * y).sum();
    let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| x * x).sum::<f64>().sqrt();
    dot / (na * nb)
}
