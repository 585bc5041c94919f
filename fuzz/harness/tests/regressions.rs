//! The fuzz corpora that stay: every file in `fuzz/seeds/<target>/` and `fuzz/regressions/<target>/`
//! runs through the same harness function the fuzz target calls, on stable, in
//! `cargo test --workspace`. A panic fails the test (the file being run is printed first).
//! Reproducers of findings that are not fixed yet are listed in [`UNFIXED`]: skipped here and run by
//! their own ignored test.

use std::path::{Path, PathBuf};

use ipfs_accelerate_fuzz_harness::{target, TARGETS};

/// Reproducers (relative to `fuzz/`) of findings still open, each with an ignored test below.
const UNFIXED: &[&str] = &[
    // finding 3
    "regressions/media/png_65mp_gray_64kb.png",
];

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the harness lives in fuzz/harness")
        .to_path_buf()
}

/// The files of `fuzz/<kind>/<target>/`, sorted (none when the folder does not exist).
fn files(kind: &str, target: &str) -> Vec<PathBuf> {
    let dir = fuzz_dir().join(kind).join(target);
    let mut out: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_file())
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

fn run(relative: &str) {
    let (target_name, _) = relative
        .trim_start_matches("regressions/")
        .split_once('/')
        .expect("regressions/<target>/<file>");
    let harness = target(target_name).expect("a known target");
    let data = std::fs::read(fuzz_dir().join(relative)).expect("the reproducer is readable");
    harness(&data);
}

#[test]
fn seeds_and_fixed_regressions() {
    let fuzz = fuzz_dir();
    for (name, harness) in TARGETS {
        let seeds = files("seeds", name);
        assert!(!seeds.is_empty(), "fuzz/seeds/{name}/ has no seeds");
        for path in seeds.iter().chain(&files("regressions", name)) {
            let relative = path
                .strip_prefix(&fuzz)
                .expect("under fuzz/")
                .to_string_lossy()
                .replace('\\', "/");
            if UNFIXED.contains(&relative.as_str()) {
                continue;
            }
            eprintln!("{name}: {relative}");
            let data = std::fs::read(path).expect("a readable corpus file");
            harness(&data);
        }
    }
}

#[test]
fn unfixed_list_names_existing_files() {
    for relative in UNFIXED {
        assert!(
            fuzz_dir().join(relative).is_file(),
            "{relative} is listed as unfixed but missing"
        );
    }
}

// Findings still open (see fuzz/README.md): `cargo test -p ipfs-accelerate-fuzz-harness -- --ignored`.

#[test]
#[ignore = "finding 3: a 64 KB PNG declaring 16384x4000 (65 MP, inside the 64 Mi pixel limit) takes about 12 s through the four processors (test profile)"]
fn finding_3_png_65mp_gray_64kb() {
    run("regressions/media/png_65mp_gray_64kb.png");
}
