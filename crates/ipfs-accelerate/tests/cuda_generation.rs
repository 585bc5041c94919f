//! Generation on the cuBLAS decoder engine (the `cuda` feature, on a machine with an NVIDIA GPU):
//! requests that join a running batch (continuous batching) get the tokens they get alone, and
//! tokens picked on the device (greedy, sampled, penalised) are the CPU sampler's picks from the
//! same logits; the public SmolLM2 GGUF, its blocks kept on the device, gives HF's greedy tokens.
//! Speech through `Transcriber` on the engines: Whisper's language detection and Wav2Vec2's
//! recognition on the cuBLAS encoder give the cpu backend's tokens. CLAP's text tower on the
//! cuBLAS encoder gives HF's `text_embeds`; X-CLIP's vision tower (cross-frame messages) on it
//! gives what its description computes in f64.
//! Needs the shared LLaMA fixture and model (`$IPFS_ACCELERATE_SHARED`); where there is no usable
//! GPU the tests say so and pass (the engine's host code has its own tests).
#![cfg(feature = "cuda")]

use std::ops::ControlFlow;
use std::path::PathBuf;

use ipfs_accelerate::text::{load_decoder, GenerationConfig, RowRequest, Sampling, TextGeneration};
use ipfs_accelerate::{BackendKind, Precision};

/// The shared folder (`$IPFS_ACCELERATE_SHARED`, else `../shared` beside the repository).
fn shared() -> PathBuf {
    std::env::var_os("IPFS_ACCELERATE_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared"))
}

/// The shared fixture folder `fixtures/<rel>`, or `None` (said on stderr) when it is missing.
fn shared_fixture(rel: &str) -> Option<PathBuf> {
    let dir = shared().join("fixtures").join(rel);
    if dir.join("config.json").exists() {
        Some(dir)
    } else {
        eprintln!("skipped: no shared fixture {rel} (set IPFS_ACCELERATE_SHARED)");
        None
    }
}

/// `n` samples at 16 kHz of two tones (`w1` and `w2` radians per sample).
fn two_tones(n: usize, w1: f32, w2: f32) -> ipfs_accelerate::Audio {
    ipfs_accelerate::Audio {
        samples: (0..n)
            .map(|i| (i as f32 * w1).sin() * 0.3 + (i as f32 * w2).cos() * 0.2)
            .collect(),
        sample_rate: 16_000,
        channels: 1,
        truncated: false,
    }
}

/// The tiny LLaMA fixture's checkpoint folder.
fn fixture() -> Option<PathBuf> {
    shared_fixture("llama/causal_lm")
}

/// The fixture on the cuBLAS decoder in `precision`, or `None` (said on stderr) without one.
fn engine_model(precision: Precision) -> Option<Box<dyn TextGeneration>> {
    let Some(dir) = fixture() else {
        eprintln!("skipped: no shared LLaMA fixture (set IPFS_ACCELERATE_SHARED)");
        return None;
    };
    match load_decoder(&dir, BackendKind::Cuda, precision) {
        Ok(model) if model.engine() == Some("cublas") => Some(model),
        Ok(_) => {
            eprintln!("skipped: the cuBLAS decoder is not usable here");
            None
        }
        Err(e) => {
            eprintln!("skipped: no CUDA device ({e})");
            None
        }
    }
}

fn sampled(temperature: f32, top_k: Option<usize>, top_p: Option<f32>) -> Sampling {
    Sampling::Sample {
        temperature,
        top_k,
        top_p,
    }
}

/// Greedy or sampled, with a penalty or without, `max` tokens, no stop token.
fn config(sampling: Sampling, penalty: f32, seed: u64, max: usize) -> GenerationConfig {
    GenerationConfig {
        max_new_tokens: max,
        sampling,
        repetition_penalty: penalty,
        stop_tokens: Vec::new(),
        seed,
    }
}

/// A prompt of `len` ids starting at `first`.
fn prompt(first: u32, len: usize, vocab: u32) -> Vec<u32> {
    (0..len as u32).map(|i| (first + 7 * i) % vocab).collect()
}

#[test]
fn requests_joining_a_running_batch_get_their_tokens_alone() {
    for precision in [Precision::F32, Precision::F16] {
        let Some(model) = engine_model(precision) else {
            return;
        };
        assert!(model.joins_running_batches());
        let vocab = model.config().vocab_size as u32;
        let greedy = |max| config(Sampling::Greedy, 1.0, 0, max);
        let request = |first, len, config| RowRequest {
            prompt: prompt(first, len, vocab),
            config,
        };
        let first = vec![
            request(5, 9, greedy(14)),
            request(11, 3, config(sampled(0.9, Some(20), None), 1.2, 4, 10)),
        ];
        // After the first step two join (one longer than every running row); when a row has
        // finished, none; then one that wants no token, one whose prompt the model rejects (an
        // empty one) and one more; then a last one.
        let mut arrivals = vec![
            vec![
                request(2, 17, greedy(6)),
                request(40, 4, config(sampled(1.0, None, Some(0.9)), 1.0, 9, 12)),
            ],
            vec![],
            vec![
                request(3, 5, greedy(0)),
                RowRequest {
                    prompt: Vec::new(),
                    config: greedy(3),
                },
                request(8, 2, greedy(20)),
            ],
            vec![request(1, 6, config(Sampling::Greedy, 1.5, 0, 5))],
        ]
        .into_iter();
        let mut all = first.clone();
        let mut done: Vec<Option<Result<Vec<u32>, String>>> = vec![None; 8];
        let mut streamed: Vec<Vec<u32>> = vec![Vec::new(); 8];
        model
            .generate_continuous(
                first,
                4,
                &mut |_| {
                    let got: Vec<RowRequest> = arrivals.next().unwrap_or_default();
                    all.extend(got.iter().cloned());
                    got
                },
                &mut |id, t| {
                    streamed[id].push(t);
                    ControlFlow::Continue(())
                },
                &mut |id, result| done[id] = Some(result.map_err(|e| e.to_string())),
            )
            .unwrap();
        assert_eq!(all.len(), 8, "every arrival was admitted");
        for (id, r) in all.iter().enumerate() {
            let got = done[id].clone().expect("every request ends");
            if r.prompt.is_empty() {
                assert!(got.is_err(), "request {id}: an empty prompt fails alone");
                continue;
            }
            let alone = model
                .generate_each(
                    std::slice::from_ref(&r.prompt),
                    std::slice::from_ref(&r.config),
                    &mut |_, _| ControlFlow::Continue(()),
                )
                .unwrap()
                .remove(0);
            let got = got.unwrap();
            assert_eq!(got, alone, "{precision:?}: request {id}");
            assert_eq!(got.len(), r.config.max_new_tokens, "request {id}");
            assert_eq!(streamed[id], got, "request {id} streamed its tokens");
        }
    }
}

#[test]
fn tokens_picked_on_the_device_are_the_cpu_samplers() {
    let Some(model) = engine_model(Precision::F32) else {
        return;
    };
    let vocab = model.config().vocab_size as u32;
    let prompts: Vec<Vec<u32>> = (0..3)
        .map(|r| prompt(3 + r, 5 + 4 * r as usize, vocab))
        .collect();
    let cases = [
        config(Sampling::Greedy, 1.3, 0, 24),
        config(sampled(0.8, Some(50), None), 1.1, 1, 24),
        config(sampled(0.7, None, Some(0.9)), 1.0, 2, 24),
        config(sampled(0.05, None, Some(0.9)), 1.2, 3, 24),
        config(sampled(1.3, Some(200), Some(0.5)), 1.0, 4, 24),
    ];
    let run = |device: bool| {
        // SAFETY (of the environment): the only test of this binary that reads the switch.
        std::env::set_var(
            "IPFS_ACCELERATE_CUDA_DEVICE_PICKS",
            if device { "1" } else { "0" },
        );
        let configs: Vec<GenerationConfig> = cases.to_vec();
        let mut rows = Vec::new();
        for c in &configs {
            let each = vec![c.clone(); prompts.len()];
            rows.push(
                model
                    .generate_each(&prompts, &each, &mut |_, _| ControlFlow::Continue(()))
                    .unwrap(),
            );
        }
        rows
    };
    let on_device = run(true);
    let on_host = run(false);
    std::env::remove_var("IPFS_ACCELERATE_CUDA_DEVICE_PICKS");
    for ((c, d), h) in cases.iter().zip(&on_device).zip(&on_host) {
        assert_eq!(d, h, "{c:?}");
        assert!(d.iter().all(|r| r.len() == 24));
    }
}

/// The i64 tensor `name` of a safetensors file's bytes.
fn i64_tensor(bytes: &[u8], name: &str) -> Vec<i64> {
    let file = safetensors::SafeTensors::deserialize(bytes).unwrap();
    let t = file.tensor(name).unwrap();
    assert_eq!(t.dtype(), safetensors::Dtype::I64, "{name}");
    t.data()
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

/// The public SmolLM2-135M-Instruct Q4_1 GGUF on the cuBLAS decoder (Q4_1 and Q8_0 blocks kept
/// on the device, dequantized in registers): "The capital of France is" gives the 16 greedy tokens
/// of HF's run on the dequantized weights (`refs/smollm2_public.safetensors`), in f32 and f16, as
/// the CPU does (`gguf_smollm2.rs`).
#[test]
fn public_smollm2_gguf_gives_hfs_greedy_tokens() {
    let root = shared();
    let gguf = root.join("models/SmolLM2-135M-Instruct-GGUF/SmolLM2-135M-Instruct.Q4_1.gguf");
    let Ok(refs) = std::fs::read(root.join("refs/smollm2_public.safetensors")) else {
        eprintln!("skipped: no shared SmolLM2 reference (set IPFS_ACCELERATE_SHARED)");
        return;
    };
    if !gguf.exists() {
        eprintln!("skipped: no shared SmolLM2 GGUF at {}", gguf.display());
        return;
    }
    let ids: Vec<u32> = i64_tensor(&refs, "input_ids")
        .into_iter()
        .map(|t| t as u32)
        .collect();
    let want: Vec<u32> = i64_tensor(&refs, "greedy_tokens")
        .into_iter()
        .map(|t| t as u32)
        .collect();
    for precision in [Precision::F32, Precision::F16] {
        let model = match load_decoder(&gguf, BackendKind::Cuda, precision) {
            Ok(model) if model.engine() == Some("cublas") => model,
            Ok(_) => {
                eprintln!("skipped: the cuBLAS decoder is not usable here");
                return;
            }
            Err(e) => {
                eprintln!("skipped: no CUDA device ({e})");
                return;
            }
        };
        let greedy = config(Sampling::Greedy, 1.0, 0, want.len());
        let got = model
            .generate(&ids, &greedy, &mut |_| ControlFlow::Continue(()))
            .unwrap();
        eprintln!("SmolLM2 Q4_1 on cuda {precision:?}: {got:?}");
        assert_eq!(got, want, "{precision:?}");
    }
}

/// Whisper on `cuda` (the cuBLAS encoder and decoder) and on `cpu`, on a multilingual copy of the
/// shared fixture (six ordinary tokens named as languages, tasks and `<|notimestamps|>`): the
/// transcription that detects its language (and goes on with the detection's decoder) gives the
/// tokens of one given that language, and the device gives the CPU's tokens. The times of a
/// detected and a given language are printed (the detection adds one decoder step per prompt
/// token, not a second encoder K/V).
#[test]
fn whisper_language_detection_on_the_engines_matches_the_cpu() {
    use ipfs_accelerate::speech::Transcriber;
    use ipfs_accelerate::LoadOptions;
    let Some(fixture) = shared_fixture("whisper/base") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(&fixture).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
    }
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture.join("config.json")).unwrap()).unwrap();
    let id = |k: &str| config[k].as_u64();
    let specials = [
        id("decoder_start_token_id"),
        id("eos_token_id"),
        id("pad_token_id"),
    ];
    let free: Vec<u64> = (0..config["vocab_size"].as_u64().unwrap())
        .filter(|t| !specials.contains(&Some(*t)))
        .take(6)
        .collect();
    let generation = dir.path().join("generation_config.json");
    let mut g: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&generation).unwrap()).unwrap();
    g["is_multilingual"] = true.into();
    g["lang_to_id"] = serde_json::json!({"<|en|>": free[0], "<|de|>": free[1], "<|fr|>": free[2]});
    g["task_to_id"] = serde_json::json!({"transcribe": free[3], "translate": free[4]});
    g["no_timestamps_token_id"] = free[5].into();
    std::fs::write(&generation, serde_json::to_vec(&g).unwrap()).unwrap();

    let audio = two_tones(8000, 0.07, 0.011);
    let path = dir.path().to_str().unwrap();
    let transcribe = |kind: BackendKind, language: Option<&str>| {
        let options = LoadOptions {
            backends: Some(vec![kind]),
            offline: true,
            ..Default::default()
        };
        let mut t = Transcriber::load(path, &options).ok()?;
        if t.selection().device.kind != kind {
            return None;
        }
        t.max_new_tokens = Some(8);
        t.language = language.map(str::to_string);
        t.transcribe(&audio).unwrap(); // warm-up
        let clock = std::time::Instant::now();
        let tokens = t.transcribe(&audio).unwrap().value.tokens;
        Some((tokens, clock.elapsed()))
    };
    let Some((detected, detect_time)) = transcribe(BackendKind::Cuda, None) else {
        eprintln!("skipped: Whisper does not load on cuda here");
        return;
    };
    let (on_cpu, _) = transcribe(BackendKind::Cpu, None).unwrap();
    assert_eq!(detected, on_cpu, "detected language: cuda vs cpu");
    let mut matched = false;
    for language in ["en", "de", "fr"] {
        let (given, given_time) = transcribe(BackendKind::Cuda, Some(language)).unwrap();
        let (given_cpu, _) = transcribe(BackendKind::Cpu, Some(language)).unwrap();
        assert_eq!(given, given_cpu, "{language}: cuda vs cpu");
        matched |= given == detected;
        println!(
            "whisper on cuda, 8 tokens: language detected {:.2} ms, given ({language}) {:.2} ms",
            detect_time.as_secs_f64() * 1e3,
            given_time.as_secs_f64() * 1e3
        );
    }
    assert!(
        matched,
        "the detected transcription is none of the given ones"
    );
}

/// Wav2Vec2 through `Transcriber` on `cuda` runs on the cuBLAS encoder (not burn's model) and
/// recognises the cpu backend's labels in f32; in f16 it runs there too (labels printed: a near
/// tie between two logits may round the other way).
#[test]
fn wav2vec2_transcription_on_the_cuda_encoder_matches_the_cpu() {
    use ipfs_accelerate::speech::Transcriber;
    use ipfs_accelerate::{Audio, LoadOptions};
    let Some(fixture) = shared_fixture("wav2vec2/ctc") else {
        return;
    };
    let path = fixture.to_str().unwrap();
    let audio = two_tones(32_000, 0.05, 0.0131);
    let load = |kind: BackendKind, precision: Precision| {
        let options = LoadOptions {
            backends: Some(vec![kind]),
            precision,
            offline: true,
            ..Default::default()
        };
        Transcriber::load(path, &options)
            .ok()
            .filter(|t| t.selection().device.kind == kind)
    };
    let on_cpu = load(BackendKind::Cpu, Precision::F32).unwrap();
    let expected = on_cpu.transcribe(&audio).unwrap().value.tokens;
    for precision in [Precision::F32, Precision::F16] {
        let Some(asr) = load(BackendKind::Cuda, precision) else {
            eprintln!("skipped: Wav2Vec2 does not load on cuda here");
            return;
        };
        assert_eq!(asr.engine(), Some("cublas"), "{precision}");
        asr.transcribe(&audio).unwrap(); // warm-up
        let clock = std::time::Instant::now();
        let tokens = asr.transcribe(&audio).unwrap().value.tokens;
        let took = clock.elapsed();
        println!(
            "wav2vec2 on cuda {precision}, 2 s: {:.2} ms, {} labels, equal to cpu's: {}",
            took.as_secs_f64() * 1e3,
            tokens.len(),
            tokens == expected
        );
        if precision == Precision::F32 {
            assert_eq!(tokens, expected, "cuda f32 vs cpu");
        }
        // A rate the extractor does not take, unresampled, is an error on the engine too.
        assert!(asr
            .transcribe(&Audio {
                sample_rate: 0,
                ..audio.clone()
            })
            .is_err());
    }
}

/// CLAP's text tower on the cuBLAS encoder (RoBERTa positions, the pooler, the two-layer
/// projection): the fixture's `text_embeds` within the bars of `verify` (2e-3 in f32, 1e-2 in
/// f16). Then CLAP through the facade on `cuda` says it encodes text there (f32 only: the burn
/// audio tower fixes the process's CubeCL precision; only text goes in, so it compiles nothing).
#[test]
fn clap_text_tower_on_the_cuda_encoder_gives_hfs_text_embeds() {
    use ipfs_accelerate::core::{JsonConfig, ModelRunner, TensorSource};
    let Some(fixture) = shared_fixture("clap/base") else {
        return;
    };
    let reference =
        ipfs_accelerate_io::SafeTensorsFile::open(fixture.join("reference.safetensors")).unwrap();
    let inputs: ipfs_accelerate::core::TensorMap = ["input_ids", "attention_mask"]
        .into_iter()
        .map(|n| (n.to_string(), reference.tensor(n).unwrap()))
        .collect();
    let want = reference.tensor("text_embeds").unwrap().to_f64_vec();
    let config = ipfs_accelerate_clap::ClapConfig::from_file(&fixture.join("config.json")).unwrap();
    let weights = ipfs_accelerate_io::open_weights(&fixture).unwrap();
    let spec = ipfs_accelerate_clap::text_encoder_spec(&config, weights).unwrap();
    for (precision, bar) in [(Precision::F32, 2e-3), (Precision::F16, 1e-2)] {
        let engine = match ipfs_accelerate_backend_cublas::EncoderRunner::load(&spec, precision) {
            Ok(e) => e,
            Err(e) => {
                eprintln!("skipped: the cuBLAS encoder does not load here ({e})");
                return;
            }
        };
        let embeds = engine.run(&inputs).unwrap()["text_embeds"].to_f64_vec();
        let got: Vec<f64> = embeds
            .chunks(config.projection_dim)
            .flat_map(|row| {
                let norm = row.iter().map(|v| v * v).sum::<f64>().sqrt();
                row.iter().map(move |v| v / norm)
            })
            .collect();
        let err = ipfs_accelerate_conformance::relative_error(&got, &want);
        println!("clap text_embeds on cuda {precision}: relative error {err:.2e} (bar {bar:e})");
        assert!(err < bar, "{precision}: {err:e}");
    }
    let runner = ipfs_accelerate::conformance::load_family_in(
        "clap",
        &fixture,
        BackendKind::Cuda,
        Precision::F32,
    )
    .unwrap();
    assert_eq!(runner.engine(), Some("cublas text tower"));
    let out = runner.run(&inputs).unwrap();
    let err = ipfs_accelerate_conformance::relative_error(&out["text_embeds"].to_f64_vec(), &want);
    println!("clap text_embeds through the facade on cuda f32: relative error {err:.2e}");
    assert!(err < 2e-3, "{err:e}");
}

/// X-CLIP's vision tower on the cuBLAS encoder (message rows, the messages' attention across a
/// video's frames) against its spec run in f64 by `SpecReference` (which the CPU tests check
/// against HF): `last_hidden_state` and `frame_embeds` within `verify`'s bars (2e-3 in f32, 1e-2
/// in f16). The shipped fixture (heads of 8: unfused attention), and in
/// `$IPFS_ACCELERATE_XCLIP_EXTRA` more checkpoint folders (heads of 64 take the fused kernel in
/// f16), each on two videos of pseudo-random frames. Then X-CLIP through the facade on `cuda`
/// says it runs its vision tower there.
#[test]
fn xclip_vision_tower_on_the_cuda_encoder_matches_its_description() {
    use ipfs_accelerate::core::{HostTensor, JsonConfig, ModelRunner, TensorMap};
    let Some(fixture) = shared_fixture("xclip/base") else {
        return;
    };
    let extra = std::env::var("IPFS_ACCELERATE_XCLIP_EXTRA").unwrap_or_default();
    let dirs = std::iter::once(fixture.clone()).chain(
        extra
            .split(':')
            .filter(|d| !d.is_empty())
            .map(PathBuf::from),
    );
    for dir in dirs {
        let config =
            ipfs_accelerate_xclip::XclipConfig::from_file(&dir.join("config.json")).unwrap();
        let weights = ipfs_accelerate_io::open_weights(&dir).unwrap();
        let spec = ipfs_accelerate_xclip::vision_encoder_spec(&config, weights.as_ref()).unwrap();
        let v = &config.vision_config;
        let (frames, side) = (2 * v.num_frames, v.base.image_size);
        let n = frames * 3 * side * side;
        let values: Vec<f32> = (0..n)
            .map(|i| ((i * 7919 % 1013) as f32 / 506.5) - 1.0)
            .collect();
        let inputs = TensorMap::from([(
            "pixel_values".to_string(),
            HostTensor::from_f32(vec![frames, 3, side, side], &values).unwrap(),
        )]);
        let reference = ipfs_accelerate_conformance::SpecReference::new(spec.clone())
            .unwrap()
            .run(&inputs)
            .unwrap();
        for (precision, bar) in [(Precision::F32, 2e-3), (Precision::F16, 1e-2)] {
            let engine = match ipfs_accelerate_backend_cublas::EncoderRunner::load(&spec, precision)
            {
                Ok(e) => e,
                Err(e) => {
                    eprintln!("skipped: the cuBLAS encoder does not load here ({e})");
                    return;
                }
            };
            let out = engine.run(&inputs).unwrap();
            for name in ["last_hidden_state", "frame_embeds"] {
                assert_eq!(out[name].shape(), reference[name].shape(), "{name}");
                let err = ipfs_accelerate_conformance::relative_error(
                    &out[name].to_f64_vec(),
                    &reference[name].to_f64_vec(),
                );
                println!(
                    "xclip vision {} ({} heads) on cuda {precision}: {name} relative error {err:.2e} (bar {bar:e})",
                    dir.display(),
                    v.base.num_attention_heads
                );
                assert!(err < bar, "{precision} {name}: {err:e}");
            }
            // Frames that are not whole videos are refused.
            let three = TensorMap::from([(
                "pixel_values".to_string(),
                HostTensor::from_f32(vec![3, 3, side, side], &values[..9 * side * side]).unwrap(),
            )]);
            assert!(engine.run(&three).is_err());
        }
    }
    let runner = ipfs_accelerate::conformance::load_family_in(
        "xclip",
        &fixture,
        BackendKind::Cuda,
        Precision::F32,
    )
    .unwrap();
    assert_eq!(
        runner.engine(),
        Some("cublas vision tower, cublas text tower")
    );
}
