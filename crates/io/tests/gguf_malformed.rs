//! GGUF images built byte by byte: valid ones parse (v2 and v3, every value type, nested arrays,
//! custom alignment), malformed ones give a typed error (never a panic or a huge allocation).

use bytes::Bytes;
use ipfs_accelerate_core::TensorSource;
use ipfs_accelerate_io::gguf::{GgmlType, GgufBuilder, GgufFile, GgufValue};
use ipfs_accelerate_io::IoError;

/// Little-endian byte assembler for GGUF images.
#[derive(Default, Clone)]
struct Img(Vec<u8>);

impl Img {
    fn header(version: u32, n_tensors: u64, n_kv: u64) -> Img {
        let mut i = Img(b"GGUF".to_vec());
        i.u32(version).u64(n_tensors).u64(n_kv);
        i
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
    fn str(&mut self, s: &[u8]) -> &mut Self {
        self.u64(s.len() as u64).bytes(s)
    }
    /// A string-valued key.
    fn kv_str(&mut self, k: &str, v: &[u8]) -> &mut Self {
        self.str(k.as_bytes()).u32(8).str(v)
    }
    fn kv_u32(&mut self, k: &str, v: u32) -> &mut Self {
        self.str(k.as_bytes()).u32(4).u32(v)
    }
    /// A tensor info with dims in GGUF order (`ne[0]` first).
    fn tensor(&mut self, name: &str, ne: &[u64], ty: u32, offset: u64) -> &mut Self {
        self.str(name.as_bytes()).u32(ne.len() as u32);
        for &d in ne {
            self.u64(d);
        }
        self.u32(ty).u64(offset)
    }
    fn pad(&mut self, align: usize) -> &mut Self {
        let n = self.0.len().next_multiple_of(align);
        self.0.resize(n, 0);
        self
    }
    fn f32s(&mut self, v: &[f32]) -> &mut Self {
        for x in v {
            self.0.extend_from_slice(&x.to_le_bytes());
        }
        self
    }
    fn done(&self) -> Bytes {
        Bytes::from(self.0.clone())
    }
}

/// A valid v3 file with one F32 tensor `w` of shape [2, 3] (ne = [3, 2]).
fn valid() -> Img {
    let mut i = Img::header(3, 1, 1);
    i.kv_str("general.architecture", b"llama")
        .tensor("w", &[3, 2], 0, 0)
        .pad(32)
        .f32s(&[1., 2., 3., 4., 5., 6.]);
    i
}

fn open(img: Bytes) -> Result<GgufFile, IoError> {
    GgufFile::from_bytes("test.gguf", img)
}

/// Asserts a MalformedGguf error whose reason contains `needle`.
fn malformed(img: Bytes, needle: &str) {
    match open(img) {
        Err(IoError::MalformedGguf { path, reason }) => {
            assert_eq!(path.to_str(), Some("test.gguf"));
            assert!(
                reason.contains(needle),
                "reason {reason:?} should mention {needle:?}"
            );
        }
        Err(other) => panic!("expected MalformedGguf({needle}), got {other}"),
        Ok(_) => panic!("expected MalformedGguf({needle}), the file parsed"),
    }
}

#[test]
fn valid_file_parses() {
    let f = open(valid().done()).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.architecture(), Some("llama"));
    assert_eq!(f.data_offset() % 32, 0);
    assert_eq!(f.shape_of("w"), Some(vec![2, 3]));
    assert_eq!(
        f.tensor("w").unwrap().to_f32_vec(),
        vec![1., 2., 3., 4., 5., 6.]
    );
    let err = f.tensor("missing").unwrap_err().to_string();
    assert!(err.contains("missing tensor `missing`"), "{err}");
}

#[test]
fn version_2_parses_and_1_is_rejected() {
    let mut v2 = valid();
    v2.0[4..8].copy_from_slice(&2u32.to_le_bytes());
    assert_eq!(open(v2.done()).unwrap().version(), 2);
    let mut v1 = valid();
    v1.0[4..8].copy_from_slice(&1u32.to_le_bytes());
    malformed(v1.done(), "version 1 is not supported");
    let mut v9 = valid();
    v9.0[4..8].copy_from_slice(&9u32.to_le_bytes());
    malformed(v9.done(), "unsupported GGUF version 9");
    let mut be = valid();
    be.0[4..8].copy_from_slice(&3u32.to_be_bytes());
    malformed(be.done(), "big-endian");
}

#[test]
fn bad_magic() {
    let mut i = valid();
    i.0[0..4].copy_from_slice(b"GGML");
    malformed(i.done(), "bad magic");
    malformed(Bytes::from_static(b""), "truncated");
}

#[test]
fn truncated_header() {
    let i = valid();
    for cut in [3, 6, 10, 20] {
        malformed(Bytes::from(i.0[..cut].to_vec()), "truncated");
    }
}

#[test]
fn truncated_metadata() {
    let i = valid();
    // Header is 24 bytes; the key/value follows.
    for cut in [
        24 + 4,
        24 + 8 + 10,
        24 + 8 + 20 + 2,
        24 + 8 + 20 + 4 + 8 + 2,
    ] {
        malformed(Bytes::from(i.0[..cut].to_vec()), "truncated");
    }
}

#[test]
fn truncated_tensor_infos_and_data() {
    let i = valid();
    let kv_end = 24 + 8 + 20 + 4 + 8 + 5;
    // Inside the tensor info: the name, the dims, the type, the offset.
    for cut in [
        kv_end + 4,
        kv_end + 8 + 1 + 4 + 8,
        kv_end + 8 + 1 + 4 + 16 + 2,
    ] {
        let err = open(Bytes::from(i.0[..cut].to_vec()));
        assert!(
            matches!(err, Err(IoError::MalformedGguf { .. })),
            "cut at {cut}"
        );
    }
    // Tensor data one byte short.
    malformed(Bytes::from(i.0[..i.0.len() - 1].to_vec()), "past the end");
    // Data section missing entirely.
    malformed(
        Bytes::from(i.0[..kv_end + 8 + 1 + 4 + 16 + 4 + 8].to_vec()),
        "past the end",
    );
}

#[test]
fn unknown_quant_type() {
    let mut i = Img::header(3, 1, 0);
    i.tensor("w", &[32], 4, 0).pad(32).bytes(&[0; 64]);
    malformed(i.done(), "unknown ggml type 4");
    let mut i = Img::header(3, 1, 0);
    i.tensor("w", &[32], 1000, 0).pad(32).bytes(&[0; 64]);
    malformed(i.done(), "unknown ggml type 1000");
}

#[test]
fn tensor_offset_out_of_range() {
    let mut i = Img::header(3, 1, 0);
    i.tensor("w", &[4], 0, 32).pad(32).f32s(&[1., 2., 3., 4.]);
    malformed(i.done(), "runs past the end");
    let mut i = Img::header(3, 1, 0);
    i.tensor("w", &[4], 0, u64::MAX - 31)
        .pad(32)
        .f32s(&[1., 2., 3., 4.]);
    malformed(i.done(), "runs past the end");
    let mut i = Img::header(3, 1, 0);
    i.tensor("w", &[4], 0, 4).pad(32).f32s(&[0.; 8]);
    malformed(i.done(), "not a multiple of the alignment");
}

#[test]
fn tensor_size_out_of_range() {
    // 2^40 x 2^40 elements overflow; 2^30 elements do not fit in the file.
    let mut i = Img::header(3, 1, 0);
    i.tensor("w", &[1 << 40, 1 << 40], 0, 0)
        .pad(32)
        .f32s(&[0.; 4]);
    malformed(i.done(), "too many elements");
    let mut i = Img::header(3, 1, 0);
    i.tensor("w", &[1 << 30], 0, 0).pad(32).f32s(&[0.; 4]);
    malformed(i.done(), "runs past the end");
    let mut i = Img::header(3, 1, 0);
    i.tensor("w", &[u64::MAX], 0, 0).pad(32);
    malformed(i.done(), "dimension 0");
    let mut i = Img::header(3, 1, 0);
    i.tensor("w", &[1, 1, 1, 1, 1], 0, 0).pad(32).f32s(&[0.]);
    malformed(i.done(), "5 dimensions");
    // A row that is not whole Q4_0 blocks.
    let mut i = Img::header(3, 1, 0);
    i.tensor("w", &[16, 2], 2, 0).pad(32).bytes(&[0; 64]);
    malformed(i.done(), "not a multiple of the q4_0 block size");
}

#[test]
fn absurd_counts() {
    malformed(Img::header(3, 1 << 60, 0).done(), "tensor count");
    malformed(Img::header(3, 0, 1 << 60).done(), "key/value count");
    // A 2^40-byte key.
    let mut i = Img::header(3, 0, 1);
    i.u64(1 << 40).bytes(b"general.name");
    malformed(i.done(), "claims 1099511627776 bytes");
    // A 2^40-byte string value.
    let mut i = Img::header(3, 0, 1);
    i.str(b"general.name").u32(8).u64(1 << 40).bytes(b"abc");
    malformed(i.done(), "claims 1099511627776 bytes");
    // An array of 2^60 u32.
    let mut i = Img::header(3, 0, 1);
    i.str(b"a").u32(9).u32(4).u64(1 << 60).u32(7);
    malformed(i.done(), "element count");
    // A tensor name of 2^40 bytes.
    let mut i = Img::header(3, 1, 0);
    i.u64(1 << 40).bytes(b"w").bytes(&[0; 64]);
    malformed(i.done(), "claims 1099511627776 bytes");
}

#[test]
fn non_utf8_strings() {
    let mut i = Img::header(3, 0, 1);
    i.kv_str("general.name", &[0x66, 0xff, 0xfe]);
    malformed(i.done(), "not valid UTF-8");
    let mut i = Img::header(3, 0, 1);
    i.str(&[0xc3, 0x28]).u32(4).u32(1);
    malformed(i.done(), "not valid UTF-8");
    let mut i = Img::header(3, 1, 0);
    i.u64(2).bytes(&[0x80, 0x80]).u32(1).u64(1).u32(0).u64(0);
    i.pad(32).f32s(&[0.]);
    malformed(i.done(), "not valid UTF-8");
}

#[test]
fn bad_metadata_values() {
    let mut i = Img::header(3, 0, 1);
    i.str(b"k").u32(13).u32(0);
    malformed(i.done(), "unknown value type 13");
    let mut i = Img::header(3, 0, 1);
    i.str(b"k").u32(7).bytes(&[2]);
    malformed(i.done(), "bool stored as 2");
    let mut i = Img::header(3, 0, 2);
    i.kv_u32("k", 1).kv_u32("k", 2);
    malformed(i.done(), "appears twice");
    // Arrays nested 100 deep.
    let mut i = Img::header(3, 0, 1);
    i.str(b"deep").u32(9);
    for _ in 0..100 {
        i.u32(9).u64(1);
    }
    i.u32(4).u64(0);
    malformed(i.done(), "deeper than");
    let mut i = Img::header(3, 0, 1);
    i.str(b"a").u32(9).u32(77).u64(0);
    malformed(i.done(), "unknown element type 77");
}

#[test]
fn bad_alignment_and_duplicate_tensors() {
    for (v, ty) in [(0u32, 4u32), (48, 4), (32, 5)] {
        let mut i = Img::header(3, 0, 1);
        i.str(b"general.alignment").u32(ty).u32(v);
        malformed(i.done(), "general.alignment");
    }
    let mut i = Img::header(3, 2, 0);
    i.tensor("w", &[1], 0, 0).tensor("w", &[1], 0, 32).pad(32);
    i.bytes(&[0; 64]);
    malformed(i.done(), "appears twice");
}

#[test]
fn custom_alignment_all_value_types_and_nested_arrays() {
    let mut b = GgufBuilder::new();
    b.version(2)
        .metadata("general.alignment", 64u32)
        .metadata("general.architecture", "qwen2")
        .metadata("u8", GgufValue::U8(200))
        .metadata("i8", GgufValue::I8(-3))
        .metadata("u16", GgufValue::U16(65000))
        .metadata("i16", GgufValue::I16(-30000))
        .metadata("u32", 4_000_000_000u32)
        .metadata("i32", -5i32)
        .metadata("u64", 1u64 << 40)
        .metadata("i64", -(1i64 << 40))
        .metadata("f32", 0.5f32)
        .metadata("f64", 0.25f64)
        .metadata("bool", true)
        .metadata("str", "héllo")
        .metadata(
            "nested",
            GgufValue::Array(vec![
                GgufValue::Array(vec![1u32.into(), 2u32.into()]),
                GgufValue::Array(vec![]),
            ]),
        )
        .metadata("strs", vec!["a", "b"]);
    b.tensor_f32("a", &[3], &[1., 2., 3.]).unwrap();
    b.tensor_f32("b", &[2, 2], &[4., 5., 6., 7.]).unwrap();
    let q8: Vec<u8> = [0x00, 0x3c] // f16 1.0
        .into_iter()
        .chain((0..32).map(|i| (i as i8 - 16) as u8))
        .collect();
    b.tensor("q", &[1, 32], GgmlType::Q8_0, q8).unwrap();
    assert!(b.tensor("bad", &[31], GgmlType::Q8_0, vec![0; 34]).is_err());
    let f = open(Bytes::from(b.to_bytes().unwrap())).unwrap();
    assert_eq!(f.version(), 2);
    assert_eq!(f.alignment(), 64);
    assert_eq!(f.data_offset() % 64, 0);
    assert_eq!(f.architecture(), Some("qwen2"));
    let m = f.metadata();
    assert_eq!(m["u8"], GgufValue::U8(200));
    assert_eq!(m["i8"].as_i64(), Some(-3));
    assert_eq!(m["i8"].as_u64(), None);
    assert_eq!(m["u16"].as_u64(), Some(65000));
    assert_eq!(m["i16"].as_f64(), Some(-30000.0));
    assert_eq!(m["u32"].as_u64(), Some(4_000_000_000));
    assert_eq!(m["i32"].as_i64(), Some(-5));
    assert_eq!(m["u64"].as_u64(), Some(1 << 40));
    assert_eq!(m["i64"].as_i64(), Some(-(1 << 40)));
    assert_eq!(m["f32"].as_f64(), Some(0.5));
    assert_eq!(m["f64"], GgufValue::F64(0.25));
    assert_eq!(m["bool"].as_bool(), Some(true));
    assert_eq!(m["str"].as_str(), Some("héllo"));
    let nested = m["nested"].as_array().unwrap();
    assert_eq!(nested[0].as_array().unwrap()[1].as_u64(), Some(2));
    assert!(nested[1].as_array().unwrap().is_empty());
    assert_eq!(m["strs"].as_array().unwrap()[1].as_str(), Some("b"));
    assert_eq!(f.tensor("a").unwrap().to_f32_vec(), vec![1., 2., 3.]);
    assert_eq!(f.shape_of("b"), Some(vec![2, 2]));
    assert_eq!(f.tensor("b").unwrap().to_f32_vec(), vec![4., 5., 6., 7.]);
    let q = f.tensor("q").unwrap();
    assert_eq!(q.shape(), &[1, 32]);
    assert_eq!(q.to_f32_vec()[0], -16.0);
    assert_eq!(f.raw_tensor("q").unwrap().1.len(), 34);
    for t in f.tensor_infos() {
        assert_eq!(t.offset % 64, 0);
    }
}

#[test]
fn tokenizer_metadata_errors_are_typed() {
    let no_tok = open(valid().done()).unwrap();
    assert!(matches!(
        no_tok.tokenizer(),
        Err(IoError::GgufTokenizer { .. })
    ));
    let build = |f: &dyn Fn(&mut GgufBuilder)| {
        let mut b = GgufBuilder::new();
        b.metadata("tokenizer.ggml.tokens", vec!["a", "b", "ab"])
            .metadata("tokenizer.ggml.merges", vec!["a b"]);
        f(&mut b);
        open(Bytes::from(b.to_bytes().unwrap()))
            .unwrap()
            .tokenizer()
    };
    let reason = |r: Result<tokenizers::Tokenizer, IoError>| match r {
        Err(IoError::GgufTokenizer { reason, .. }) => reason,
        Err(e) => panic!("untyped error {e}"),
        Ok(_) => panic!("tokenizer built"),
    };
    assert!(reason(build(&|b| {
        b.metadata("tokenizer.ggml.model", "rwkv");
    }))
    .contains("unsupported tokenizer model"));
    assert!(reason(build(&|b| {
        b.metadata("tokenizer.ggml.model", "gpt2")
            .metadata("tokenizer.ggml.pre", "mystery");
    }))
    .contains("unsupported pre-tokenizer"));
    assert!(reason(build(&|b| {
        b.metadata("tokenizer.ggml.model", "gpt2")
            .metadata("tokenizer.ggml.bos_token_id", 7u32);
    }))
    .contains("outside the vocabulary"));
    assert!(reason(build(&|b| {
        b.metadata("tokenizer.ggml.model", "llama")
            .metadata("tokenizer.ggml.scores", vec![0.0f32]);
    }))
    .contains("1 entries for 3 tokens"));
    assert!(reason(build(&|b| {
        b.metadata("tokenizer.ggml.model", "gpt2")
            .metadata("tokenizer.ggml.add_bos_token", true);
    }))
    .contains("no bos token id"));
    // A minimal gpt2 vocabulary works.
    let tok = build(&|b| {
        b.metadata("tokenizer.ggml.model", "gpt2");
    })
    .unwrap();
    assert_eq!(tok.encode("ab", false).unwrap().get_ids(), &[2]);
}

#[test]
fn sentencepiece_by_hand() {
    // ▁ a b ▁a ▁ab + bytes for 'c' (0x63): "ab c" → ▁ab ▁ <0x63>.
    let tokens = vec!["<unk>", "<s>", "</s>", "▁", "a", "b", "▁a", "▁ab", "<0x63>"];
    let scores = vec![0.0f32, 0.0, 0.0, -1.0, -2.0, -3.0, -0.5, -0.1, 0.0];
    let types = vec![2i32, 3, 3, 1, 1, 1, 1, 1, 6];
    let mut b = GgufBuilder::new();
    b.metadata("tokenizer.ggml.model", "llama")
        .metadata("tokenizer.ggml.tokens", tokens)
        .metadata("tokenizer.ggml.scores", scores)
        .metadata("tokenizer.ggml.token_type", types)
        .metadata("tokenizer.ggml.bos_token_id", 1u32)
        .metadata("tokenizer.ggml.eos_token_id", 2u32)
        .metadata("tokenizer.ggml.unknown_token_id", 0u32);
    let f = open(Bytes::from(b.to_bytes().unwrap())).unwrap();
    let s = f.special_tokens();
    assert!(s.add_bos && !s.add_eos);
    let tok = f.tokenizer().unwrap();
    let enc = tok.encode("ab c", true).unwrap();
    assert_eq!(enc.get_ids(), &[1, 7, 3, 8]);
    assert_eq!(tok.decode(enc.get_ids(), true).unwrap(), "ab c");
    // 'd' has no byte token: unknown.
    assert_eq!(tok.encode("ad", false).unwrap().get_ids(), &[6, 0]);
    // add_space_prefix = false: no leading ▁.
    b.metadata("tokenizer.ggml.add_space_prefix", false)
        .metadata("tokenizer.ggml.add_bos_token", false)
        .metadata("tokenizer.ggml.add_eos_token", true);
    let f = open(Bytes::from(b.to_bytes().unwrap())).unwrap();
    let tok = f.tokenizer().unwrap();
    assert_eq!(tok.encode("ab", true).unwrap().get_ids(), &[4, 5, 2]);
}

/// A hostile vocabulary costs no more than the limits allow: one 1 MB token (merge derivation is
/// quadratic in token length: it took ~2 minutes before the limit), many long tokens, or too many
/// tokens are typed errors, at once.
#[test]
fn hostile_vocabularies_are_refused_quickly() {
    use ipfs_accelerate_io::gguf::{MAX_TOKEN_BYTES, MAX_VOCABULARY};
    let reason = |tokens: Vec<String>| {
        let mut b = GgufBuilder::new();
        b.metadata("tokenizer.ggml.model", "llama")
            .metadata("tokenizer.ggml.tokens", tokens);
        match open(Bytes::from(b.to_bytes().unwrap()))
            .unwrap()
            .tokenizer()
        {
            Err(IoError::GgufTokenizer { reason, .. }) => reason,
            Err(e) => panic!("untyped error {e}"),
            Ok(_) => panic!("tokenizer built"),
        }
    };
    let one_mb = reason(vec!["a".into(), "a".repeat(1 << 20)]);
    assert!(one_mb.contains("bytes"), "{one_mb}");
    let edge = reason(vec!["a".into(), "a".repeat(MAX_TOKEN_BYTES + 1)]);
    assert!(edge.contains(&MAX_TOKEN_BYTES.to_string()), "{edge}");
    // 4096 tokens of 2 KiB each: every one under the length limit, too long in total.
    let total = reason(
        (0..4096)
            .map(|i| format!("{i:04}{}", "b".repeat(2048)))
            .collect(),
    );
    assert!(total.contains("too long in total"), "{total}");
    let many = reason((0..=MAX_VOCABULARY).map(|i| i.to_string()).collect());
    assert!(many.contains("more than"), "{many}");
}
