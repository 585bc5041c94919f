//! SmolLM2-135M-Instruct from its Q4_1 GGUF against HF transformers' references
//! (`refs/smollm2_public.safetensors`): prompt logits within 1e-3 relative error and 16 greedy
//! tokens identical. Skipped, by name, when the shared model or refs are absent.

use std::ops::ControlFlow;
use std::path::PathBuf;

use burn_flex::Flex;
use ipfs_accelerate_core::{BackendKind, HostTensor, ModelRunner, TensorMap, TensorSource};
use ipfs_accelerate_io::{gguf::GgufFile, SafeTensorsFile};
use ipfs_accelerate_llama::{Architecture, LlamaConfig, LlamaRunner, TextGeneration};
use ipfs_accelerate_nn::generate::GenerationConfig;

/// The shared data folder when it holds the SmolLM2 GGUF and its references (see
/// `ipfs_accelerate_conformance::shared_dir`); `None` (skipped, by name) when they are absent.
fn shared() -> Option<PathBuf> {
    let root = ipfs_accelerate_conformance::shared_dir("smollm2_q4_1_matches_hf")?;
    let needed = [
        "models/SmolLM2-135M-Instruct-GGUF/SmolLM2-135M-Instruct.Q4_1.gguf",
        "refs/smollm2_public.safetensors",
    ];
    let missing: Vec<&str> = needed
        .into_iter()
        .filter(|f| !root.join(f).is_file())
        .collect();
    if missing.is_empty() {
        return Some(root);
    }
    let why = format!("needs {missing:?} under {}", root.display());
    let required = std::env::var_os("IPFS_ACCELERATE_REQUIRE_SHARED").is_some_and(|v| v == "1");
    assert!(!required, "smollm2_q4_1_matches_hf: {why}");
    eprintln!("skipped smollm2_q4_1_matches_hf: {why}");
    None
}

#[test]
fn smollm2_q4_1_matches_hf() {
    let Some(root) = shared() else { return };
    let gguf = root.join("models/SmolLM2-135M-Instruct-GGUF/SmolLM2-135M-Instruct.Q4_1.gguf");
    let refs = SafeTensorsFile::open(root.join("refs/smollm2_public.safetensors")).unwrap();

    let file = GgufFile::open(&gguf).unwrap();
    let config = LlamaConfig::from_gguf(&file).unwrap();
    assert_eq!(config.architecture, Architecture::Llama);
    assert_eq!(config.num_hidden_layers, 30);
    assert_eq!(
        (config.num_attention_heads, config.kv_heads()),
        (9, 3),
        "SmolLM2-135M: 9 query / 3 key-value heads"
    );
    assert!(config.tie_word_embeddings);

    let runner =
        LlamaRunner::<Flex>::from_gguf(&gguf, &Default::default(), BackendKind::Cpu).unwrap();
    assert!(runner
        .chat_template()
        .is_some_and(|t| t.contains("im_start")));

    let ids = refs.raw("input_ids").unwrap();
    let mut inputs = TensorMap::new();
    inputs.insert("input_ids".into(), ids.clone());
    let logits = runner.run(&inputs).unwrap()["logits"].to_f64_vec();
    let want = refs.raw("logits").unwrap().to_f64_vec();
    assert_eq!(logits.len(), want.len());
    let diff: f64 = logits.iter().zip(&want).map(|(a, b)| (a - b).powi(2)).sum();
    let norm: f64 = want.iter().map(|b| b * b).sum();
    let rel = (diff / norm).sqrt();
    eprintln!("SmolLM2 Q4_1 prompt logits: relative error {rel:.3e} (bar 1e-3)");
    assert!(rel <= 1e-3, "relative error {rel}");

    let want_tokens = refs.raw("greedy_tokens").unwrap().to_i64_vec().unwrap();
    let prompt = ids.to_token_ids().unwrap();
    let config = GenerationConfig {
        max_new_tokens: want_tokens.len(),
        ..GenerationConfig::default()
    };
    let mut streamed = 0;
    let tokens = TextGeneration::generate(&runner, &prompt, &config, &mut |_| {
        streamed += 1;
        ControlFlow::Continue(())
    })
    .unwrap();
    let tokens: Vec<i64> = tokens.into_iter().map(i64::from).collect();
    assert_eq!(tokens, want_tokens);
    assert_eq!(streamed, want_tokens.len());
    let text = file
        .tokenizer()
        .unwrap()
        .decode(&tokens.iter().map(|&t| t as u32).collect::<Vec<_>>(), false)
        .unwrap();
    eprintln!("SmolLM2 greedy (KV cache): {text:?}");

    // The GGUF view under HF names: un-permuted q / k, no `lm_head` (tied).
    let weights =
        ipfs_accelerate_llama::GgufWeights::new(std::sync::Arc::new(file), runner.config());
    assert!(weights.contains("model.layers.0.self_attn.q_proj.weight"));
    assert!(!weights.contains("lm_head.weight"));
    let q: HostTensor = weights
        .tensor("model.layers.29.self_attn.k_proj.weight")
        .unwrap();
    assert_eq!(q.shape(), &[192, 576]);
}
