//! How the benchmark code was compiled (captured by the crate's build script): every stored run
//! records it, and unoptimised numbers are flagged wherever they are shown.

/// Cargo's `PROFILE` of this crate's build: `release` for the release and bench profiles (and
/// custom profiles inheriting from them), `debug` otherwise.
pub const PROFILE: &str = env!("IPFS_ACCELERATE_BENCH_PROFILE");

/// Cargo's `OPT_LEVEL` of this crate's build (`0`–`3`, `s`, `z`). The workspace crates share it
/// (the dev profile builds them at 1, `--release` at 3).
pub const OPT_LEVEL: &str = env!("IPFS_ACCELERATE_BENCH_OPT_LEVEL");

/// Whether an opt-level counts as optimised (2, 3, `s`, `z`): numbers of lower levels are not
/// what a user of a release build sees.
pub fn is_optimized(opt_level: &str) -> bool {
    matches!(opt_level, "2" | "3" | "s" | "z")
}

/// Whether this binary's benchmark code is optimised ([`OPT_LEVEL`]).
pub fn this_build_optimized() -> bool {
    is_optimized(OPT_LEVEL)
}

/// The warning printed before measuring in an unoptimised build.
pub fn unoptimized_warning() -> String {
    format!(
        "warning: this is an unoptimised build (profile {PROFILE}, opt-level {OPT_LEVEL}): the \
         numbers are several times slower than a release build's and are stored flagged as such; \
         `cargo xtask bench` (without --dev) or `cargo run --release -p ipfs-accelerate-cli -- \
         bench` measure an optimised build"
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn optimisation_levels() {
        for level in ["2", "3", "s", "z"] {
            assert!(super::is_optimized(level), "{level}");
        }
        for level in ["0", "1", "unknown", ""] {
            assert!(!super::is_optimized(level), "{level}");
        }
        assert!(!super::PROFILE.is_empty() && !super::OPT_LEVEL.is_empty());
    }
}
