//! GGUF reading against references: bit-exact dequantisation vectors from the `gguf` Python
//! package (tests/data/make_gguf_vectors.py), tokenizers compared with transformers' GGUF
//! conversion, and the real SmolLM2 Q4_1 file from the shared data (skipped when absent).

use std::path::{Path, PathBuf};

use ipfs_accelerate_core::{DType, TensorSource};
use ipfs_accelerate_io::gguf::{dequantize, GgmlType, GgufFile};
use ipfs_accelerate_io::SafeTensorsFile;

/// A file of tests/data, or of `$IPFS_ACCELERATE_GGUF_VECTORS` (another set written by
/// make_gguf_vectors.py with GGUF_VECTORS_OUT / GGUF_VECTORS_SEED).
fn data(name: &str) -> PathBuf {
    std::env::var_os("IPFS_ACCELERATE_GGUF_VECTORS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data"))
        .join(name)
}

/// The shared data folder: `$IPFS_ACCELERATE_SHARED`, else `../shared` beside the workspace;
/// `None` (printing why) when `file` is not in it, a failure when
/// `IPFS_ACCELERATE_REQUIRE_SHARED=1`.
fn shared_file(test: &str, file: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("IPFS_ACCELERATE_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared"));
    let path = dir.join(file);
    if path.is_file() {
        return Some(path);
    }
    assert!(
        std::env::var("IPFS_ACCELERATE_REQUIRE_SHARED").as_deref() != Ok("1"),
        "{test}: {} not found (IPFS_ACCELERATE_REQUIRE_SHARED=1)",
        path.display()
    );
    eprintln!(
        "skipped {test}: needs {} (set IPFS_ACCELERATE_SHARED)",
        path.display()
    );
    None
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn dequantization_is_bit_exact_with_the_reference() {
    let f = GgufFile::open(data("dequant_vectors.gguf")).unwrap();
    let expected_types = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q8_K,
        GgmlType::IQ4_NL,
        GgmlType::IQ4_XS,
    ];
    for ty in expected_types {
        let q_name = format!("{}.q", ty.name().to_lowercase());
        let e_name = format!("{}.expected", ty.name().to_lowercase());
        let (stored_ty, raw) = f.raw_tensor(&q_name).unwrap();
        assert_eq!(stored_ty, ty, "{q_name}");
        let info = f.tensor_info(&q_name).unwrap();
        assert_eq!(f.tensor_info(&e_name).unwrap().ggml_type, GgmlType::F32);
        let expected = f.tensor(&e_name).unwrap();
        assert_eq!(expected.shape(), info.shape.as_slice(), "{q_name}");
        let want = bits(&expected.to_f32_vec());

        let got = dequantize(ty, raw, info.n_elements()).unwrap();
        let got = bits(&got);
        let mismatches = got.iter().zip(&want).filter(|(a, b)| a != b).count();
        assert_eq!(
            mismatches,
            0,
            "{ty}: {mismatches} of {} values differ",
            want.len()
        );

        // Through TensorSource as well.
        let t = f.tensor(&q_name).unwrap();
        assert_eq!(t.dtype(), DType::F32);
        assert_eq!(t.shape(), info.shape.as_slice());
        assert_eq!(bits(&t.to_f32_vec()), want, "{ty} via TensorSource");
    }
}

#[test]
fn dequantization_rejects_partial_blocks() {
    let f = GgufFile::open(data("dequant_vectors.gguf")).unwrap();
    let (ty, raw) = f.raw_tensor("q4_k.q").unwrap();
    assert!(dequantize(ty, &raw[..raw.len() - 1], 1024).is_err());
    assert!(dequantize(ty, raw, 1023).is_err());
    assert!(dequantize(ty, raw, 768).is_err());
}

/// One reference case written by make_gguf_vectors.py.
struct Case {
    text: String,
    ids: Vec<u32>,
    decoded: String,
    decoded_skip_special: String,
}

fn cases(name: &str) -> Vec<Case> {
    let text = std::fs::read_to_string(data(name)).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|c| Case {
            text: c["text"].as_str().unwrap().to_string(),
            ids: c["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i.as_u64().unwrap() as u32)
                .collect(),
            decoded: c["decoded"].as_str().unwrap().to_string(),
            decoded_skip_special: c["decoded_skip_special"].as_str().unwrap().to_string(),
        })
        .collect()
}

fn check_tokenizer(gguf: &str, json: &str) {
    let f = GgufFile::open(data(gguf)).unwrap();
    let tok = f.tokenizer().unwrap();
    for c in cases(json) {
        let enc = tok.encode(c.text.as_str(), true).unwrap();
        assert_eq!(
            enc.get_ids(),
            c.ids.as_slice(),
            "{gguf}: encode {:?}",
            c.text
        );
        let dec = tok.decode(&c.ids, false).unwrap();
        assert_eq!(dec, c.decoded, "{gguf}: decode {:?}", c.ids);
        let dec = tok.decode(&c.ids, true).unwrap();
        assert_eq!(
            dec, c.decoded_skip_special,
            "{gguf}: decode skipping specials {:?}",
            c.ids
        );
    }
}

#[test]
fn sentencepiece_tokenizer_matches_transformers() {
    check_tokenizer("tokenizer_llama.gguf", "tokenizer_llama.json");
    let f = GgufFile::open(data("tokenizer_llama.gguf")).unwrap();
    let s = f.special_tokens();
    assert_eq!(
        (s.bos, s.eos, s.unk, s.pad),
        (Some(1), Some(2), Some(0), None)
    );
    assert!(s.add_bos && !s.add_eos);
}

#[test]
fn llama3_bpe_tokenizer_matches_transformers() {
    check_tokenizer("tokenizer_llama-bpe.gguf", "tokenizer_llama-bpe.json");
}

#[test]
fn qwen2_bpe_tokenizer_matches_transformers() {
    check_tokenizer("tokenizer_qwen2.gguf", "tokenizer_qwen2.json");
}

const SMOLLM: &str = "models/SmolLM2-135M-Instruct-GGUF/SmolLM2-135M-Instruct.Q4_1.gguf";

/// `sum((bits[i] as u64) * (i + 1))` with wrap-around: a whole-tensor bit-exact fingerprint.
fn fingerprint(v: &[f32]) -> u64 {
    v.iter().enumerate().fold(0u64, |acc, (i, x)| {
        acc.wrapping_add((x.to_bits() as u64).wrapping_mul(i as u64 + 1))
    })
}

#[test]
fn smollm2_file_parses_and_dequantizes() {
    let Some(path) = shared_file("smollm2_file_parses_and_dequantizes", SMOLLM) else {
        return;
    };
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.architecture(), Some("llama"));
    assert_eq!(f.alignment(), 32);
    let blocks = f.get("llama.block_count").and_then(|v| v.as_u64()).unwrap() as usize;
    let hidden = f
        .get("llama.embedding_length")
        .and_then(|v| v.as_u64())
        .unwrap() as usize;
    let ffn = f
        .get("llama.feed_forward_length")
        .and_then(|v| v.as_u64())
        .unwrap() as usize;
    let heads = f
        .get("llama.attention.head_count")
        .and_then(|v| v.as_u64())
        .unwrap() as usize;
    let kv_heads = f
        .get("llama.attention.head_count_kv")
        .and_then(|v| v.as_u64())
        .unwrap() as usize;
    let vocab = f
        .get("tokenizer.ggml.tokens")
        .and_then(|v| v.as_array())
        .unwrap()
        .len();
    assert_eq!((blocks, hidden, vocab), (30, 576, 49152));
    // token_embd + output_norm + 9 per block (tied embeddings: no output.weight).
    assert_eq!(f.tensor_infos().len(), 2 + 9 * blocks);
    assert_eq!(f.names().len(), f.tensor_infos().len());
    assert_eq!(f.shape_of("token_embd.weight"), Some(vec![vocab, hidden]));
    let kv = hidden / heads * kv_heads;
    for (name, shape) in [
        ("blk.0.attn_q.weight", vec![hidden, hidden]),
        ("blk.0.attn_k.weight", vec![kv, hidden]),
        ("blk.0.attn_v.weight", vec![kv, hidden]),
        ("blk.0.attn_output.weight", vec![hidden, hidden]),
        ("blk.0.ffn_gate.weight", vec![ffn, hidden]),
        ("blk.0.ffn_up.weight", vec![ffn, hidden]),
        ("blk.29.ffn_down.weight", vec![hidden, ffn]),
        ("blk.0.attn_norm.weight", vec![hidden]),
        ("output_norm.weight", vec![hidden]),
    ] {
        assert_eq!(f.shape_of(name), Some(shape), "{name}");
    }
    let (ty, raw) = f.raw_tensor("token_embd.weight").unwrap();
    assert_eq!(ty, GgmlType::Q8_0);
    assert_eq!(raw.len(), vocab * hidden / 32 * 34);
    assert_eq!(
        f.tensor_info("blk.0.attn_q.weight").unwrap().ggml_type,
        GgmlType::Q4_1
    );
    assert_eq!(
        f.tensor_info("output_norm.weight").unwrap().ggml_type,
        GgmlType::F32
    );

    // Fingerprints of gguf-python's dequantisation (gguf 0.19 quants.dequantize) of this file.
    for (name, want, first) in [
        (
            "token_embd.weight",
            0x779f_e7cb_39c5_bf80u64,
            -0.106_544_49f32,
        ),
        ("blk.0.attn_q.weight", 0x4985_974a_fd7c_1a00, -0.096_313_48),
        (
            "blk.29.ffn_down.weight",
            0xbbdb_33a3_63dc_2000,
            -0.273_315_43,
        ),
        ("output_norm.weight", 0xa28b_a9da_0000, 1.757_812_5),
    ] {
        let t = f.tensor(name).unwrap();
        assert_eq!(t.dtype(), DType::F32);
        let v = t.to_f32_vec();
        assert!((v[0] - first).abs() < 1e-6, "{name}: {} vs {first}", v[0]);
        assert_eq!(fingerprint(&v), want, "{name}");
    }
    assert!(f.tensor("nope.weight").is_err());
}

/// The decode kernels of `ipfs-accelerate-kernels` on this file's weights, read in place: each
/// output within the bound of the activation rounding (half a step of each 32- or 256-value
/// block) of the f64 product of the dequantized weight.
#[test]
fn smollm2_linear_runs_on_the_quantized_weights() {
    use ipfs_accelerate_kernels::{linear_ggml, Epilogue, GgmlBlocks};
    let Some(path) = shared_file("smollm2_linear_runs_on_the_quantized_weights", SMOLLM) else {
        return;
    };
    let f = GgufFile::open(&path).unwrap();
    for name in [
        "blk.0.attn_q.weight",
        "blk.0.attn_k.weight",
        "blk.5.ffn_down.weight",
        "blk.29.ffn_up.weight",
        "token_embd.weight",
    ] {
        let (ty, raw) = f.raw_tensor(name).unwrap();
        let shape = f.shape_of(name).unwrap();
        let (n, k) = (shape[0], shape[1]);
        let bt = ty.block_type().unwrap();
        let w = GgmlBlocks::new(bt, raw, n, k).unwrap();
        let deq = f.dequantize_tensor(name).unwrap();
        let act_block = if bt.block_size() == 256 { 256 } else { 32 };
        for rows in [1, 3] {
            let x: Vec<f32> = (0..rows * k)
                .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
                .collect();
            let y = linear_ggml(&x, rows, k, &w, Epilogue::default());
            for r in 0..rows {
                let xr = &x[r * k..(r + 1) * k];
                let steps: Vec<f64> = xr
                    .chunks(act_block)
                    .map(|b| f64::from(b.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0))
                    .collect();
                for j in (0..n).step_by(n / 97 + 1) {
                    let wr = &deq[j * k..(j + 1) * k];
                    let (mut want, mut bound, mut mag) = (0f64, 0f64, 0f64);
                    for (i, (&wi, &xi)) in wr.iter().zip(xr).enumerate() {
                        want += f64::from(wi) * f64::from(xi);
                        bound += f64::from(wi.abs()) * steps[i / act_block] / 2.0;
                        mag += f64::from(wi.abs()) * (f64::from(xi.abs()) + steps[i / act_block]);
                    }
                    let got = f64::from(y[r * n + j]);
                    // f32 rounding of sums over k <= 1536 values: (k + 16)·2^-24 < 1e-4.
                    let tol = bound + 1e-4 * mag;
                    assert!(
                        (got - want).abs() <= tol,
                        "{name} ({ty}) row {r} out {j}: {got} vs {want} (bound {tol})"
                    );
                }
            }
        }
    }
}

#[test]
fn smollm2_tokenizer_matches_the_reference() {
    let Some(path) = shared_file("smollm2_tokenizer_matches_the_reference", SMOLLM) else {
        return;
    };
    let Some(refs) = shared_file(
        "smollm2_tokenizer_matches_the_reference",
        "refs/smollm2_public.safetensors",
    ) else {
        return;
    };
    let f = GgufFile::open(&path).unwrap();
    let refs = SafeTensorsFile::open(&refs).unwrap();
    let tok = f.tokenizer().unwrap();
    let special = f.special_tokens();
    assert_eq!(special.bos, Some(1));
    assert_eq!(special.eos, Some(2));
    assert!(!special.add_bos);

    let want = refs.tensor("input_ids").unwrap().to_token_ids().unwrap();
    let enc = tok.encode("The capital of France is", true).unwrap();
    assert_eq!(enc.get_ids(), want.as_slice());

    let greedy = refs
        .tensor("greedy_tokens")
        .unwrap()
        .to_token_ids()
        .unwrap();
    assert_eq!(greedy.len(), 16);
    let text = tok.decode(&greedy, true).unwrap();
    assert_eq!(text, " Paris.\n\nThe answer is: 2018-01");
    // Digits are split one by one (SmolLM's pre-tokenizer), so the text encodes back to the ids.
    let back = tok.encode(text.as_str(), false).unwrap();
    assert_eq!(back.get_ids(), greedy.as_slice());

    // Control tokens stay whole; the chat template is there.
    let chat = tok.encode("<|im_start|>user\nHi<|im_end|>", false).unwrap();
    assert_eq!(chat.get_ids()[0], 1);
    assert_eq!(*chat.get_ids().last().unwrap(), 2);
    assert!(f.chat_template().unwrap().contains("<|im_start|>"));
}

/// `quantized_blocks` hands over the 2-D block-format tensors as slices of the file's bytes, and
/// nothing for F32, 1-D or missing tensors.
#[test]
fn quantized_blocks_are_the_stored_bytes() {
    use ipfs_accelerate_io::gguf::GgufBuilder;
    // Two rows of one Q8_0 block each (f16 scale 1.0, values 0..32), an F32 matrix and a vector.
    let mut q8 = Vec::new();
    for _ in 0..2 {
        q8.extend_from_slice(&0x3c00u16.to_le_bytes());
        q8.extend(0..32u8);
    }
    let mut b = GgufBuilder::new();
    b.tensor("w.weight", &[2, 32], GgmlType::Q8_0, q8.clone())
        .unwrap()
        .tensor_f32("f.weight", &[2, 2], &[1.0, 2.0, 3.0, 4.0])
        .unwrap()
        .tensor("v.weight", &[32], GgmlType::Q8_0, q8[..34].to_vec())
        .unwrap();
    let f = GgufFile::from_bytes("blocks.gguf", b.to_bytes().unwrap().into()).unwrap();
    let blocks = f.quantized_blocks("w.weight").unwrap().unwrap();
    assert_eq!(blocks.ggml_type, GgmlType::Q8_0.id());
    assert_eq!(blocks.shape, [2, 32]);
    assert_eq!(&blocks.data[..], &q8[..]);
    let (_, raw) = f.raw_tensor("w.weight").unwrap();
    assert_eq!(
        blocks.data.as_ptr(),
        raw.as_ptr(),
        "a slice of the file, not a copy"
    );
    for none in ["f.weight", "v.weight", "missing.weight"] {
        assert!(f.quantized_blocks(none).unwrap().is_none(), "{none}");
    }
}
