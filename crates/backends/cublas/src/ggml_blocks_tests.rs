//! `ggml_blocks.cuh` compiled on the host (it is plain C++ outside NVRTC) and run against the
//! reference dequantisation of every block format the decoder reads
//! (`ipfs_accelerate_kernels::dequantize_row`, bit-exact with ggml's): the block reader of the
//! GPU kernels is checked without a GPU.

use std::path::Path;
use std::process::Command;

use crate::decoder::BLOCK_FORMATS;
use ipfs_accelerate_kernels::{dequantize_row, BlockType};

/// Byte offsets of the f16 fields of a block (scales, minimums): set to finite values.
pub(crate) fn f16_fields(id: u32) -> &'static [usize] {
    match id {
        2 | 6 | 8 => &[0],
        3 | 7 | 12 | 13 => &[0, 2],
        14 => &[208],
        _ => unreachable!("not a decoder format: {id}"),
    }
}

/// `rows` rows of `k` weights of random blocks whose f16 fields are finite.
pub(crate) fn random_rows(
    id: u32,
    block: usize,
    bytes: usize,
    rows: usize,
    k: usize,
    seed: u64,
) -> Vec<u8> {
    let mut state = seed | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let blocks = rows * k / block;
    let mut data: Vec<u8> = (0..blocks * bytes).map(|_| next() as u8).collect();
    for b in 0..blocks {
        for &at in f16_fields(id) {
            // ±[2^-10, 2): normal halves of both signs.
            let sign = if next() & 1 == 0 { 1.0 } else { -1.0 };
            let v = sign * (2f32).powf((next() % 1100) as f32 / 100.0 - 10.0);
            let h = half::f16::from_f32(v).to_bits().to_le_bytes();
            data[b * bytes + at..b * bytes + at + 2].copy_from_slice(&h);
        }
    }
    data
}

const HARNESS: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include BLOCKS_HEADER
// stdin: fmt, k, rows, then the rows' bytes; stdout: rows * k floats, unit by unit.
int main(void) {
    int fmt, k, rows;
    long long row_bytes;
    if (fread(&fmt, 4, 1, stdin) != 1 || fread(&k, 4, 1, stdin) != 1 ||
        fread(&rows, 4, 1, stdin) != 1 || fread(&row_bytes, 8, 1, stdin) != 1) return 2;
    unsigned char* data = (unsigned char*)malloc((size_t)(rows * row_bytes));
    if (fread(data, 1, (size_t)(rows * row_bytes), stdin) != (size_t)(rows * row_bytes)) return 3;
    for (int r = 0; r < rows; ++r)
        for (int u = 0; u < k / 8; ++u) {
            float w[8];
            if (!ggml_unit(fmt, data + r * row_bytes, u, w)) return 4;
            fwrite(w, 4, 8, stdout);
        }
    return 0;
}
"#;

/// Compiles the harness with the host's C++ compiler (`None`: no compiler, the test is skipped).
fn build_harness(dir: &Path) -> Option<std::path::PathBuf> {
    let header = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/ggml_blocks.cuh");
    let source = dir.join("harness.cpp");
    std::fs::write(&source, HARNESS).unwrap();
    let exe = dir.join("harness");
    let compiler = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let status = Command::new(&compiler)
        .args(["-O1", "-ffp-contract=off", "-std=c++14"])
        .arg(format!("-DBLOCKS_HEADER=\"{}\"", header.display()))
        .arg(&source)
        .arg("-o")
        .arg(&exe)
        .status();
    match status {
        Ok(s) if s.success() => Some(exe),
        Ok(s) => panic!("{compiler} failed on ggml_blocks.cuh: {s}"),
        Err(e) => {
            eprintln!("skipped: no C++ compiler `{compiler}` ({e})");
            None
        }
    }
}

#[test]
fn block_reader_matches_the_reference_dequantisation() {
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = build_harness(dir.path()) else {
        return;
    };
    for (i, f) in BLOCK_FORMATS.iter().enumerate() {
        let (rows, k) = (3, 2 * f.block);
        let data = random_rows(f.id, f.block, f.bytes, rows, k, 0x9e37_79b9 + i as u64);
        let row_bytes = f.row_bytes(k).unwrap();
        let mut input = Vec::new();
        for v in [f.id as i32, k as i32, rows as i32] {
            input.extend_from_slice(&v.to_le_bytes());
        }
        input.extend_from_slice(&(row_bytes as i64).to_le_bytes());
        input.extend_from_slice(&data);
        let mut child = Command::new(&exe)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(child.stdin.as_mut().unwrap(), &input).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{}: harness {}", f.name, out.status);
        let got: Vec<f32> = out
            .stdout
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let ty = BlockType::from_id(f.id).unwrap();
        assert_eq!(ty.block_size(), f.block, "{}", f.name);
        assert_eq!(ty.type_size(), f.bytes, "{}", f.name);
        let mut want = vec![0f32; rows * k];
        for (r, row) in want.chunks_mut(k).enumerate() {
            dequantize_row(ty, &data[r * row_bytes..(r + 1) * row_bytes], row).unwrap();
        }
        assert_eq!(got.len(), want.len(), "{}", f.name);
        let bad = got
            .iter()
            .zip(&want)
            .position(|(g, w)| g.to_bits() != w.to_bits());
        assert!(
            bad.is_none(),
            "{}: weight {} is {} where the reference gives {}",
            f.name,
            bad.unwrap(),
            got[bad.unwrap()],
            want[bad.unwrap()]
        );
    }
}
