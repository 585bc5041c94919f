//! CPU benchmarks of the generating, audio and vision families at real sizes with random weights
//! (no download; `RandomInit` makes every tensor the model asks for):
//!
//! - `whisper_logmel`: Whisper's log-mel front end on 30 s of audio.
//! - `image_preprocess`: ViT (bilinear 224²) and CLIP (bicubic shortest edge + crop) processors
//!   on one 640×480 image.
//! - `vit_base_224`: ViT-base/16 encoder (HF `ViTModel`, as `peer_bench_torch.py --model vit-base`)
//!   at batch 1 and 8.
//! - `whisper_tiny_encoder`: the encoder on 30 s (as `peer_bench_torch.py --model whisper-tiny`).
//! - `decode`: greedy tokens/s with the KV cache for whisper-base and t5-base (and the fixture-sized
//!   configs from `../shared/fixtures` when present): the encoder output is computed once outside
//!   the timing, each iteration generates 16 tokens without stopping at EOS.
//! - `llama_135m_{f32,int8}`: SmolLM2-135M shape with float or int8 weights (memory printed),
//!   prompt of 128 tokens: prefill (time to the first token) and 64 decode steps (tokens/s after the first), as `peer_bench_torch.py --model llama-135m
//!   --seq 128 --decode 64`.
//!
//! - `llava_fixture`: the LLaVA fixture checkpoint (when `../shared` is present): time to the first
//!   token (vision tower + projector + prefill) and tokens/s of 16 decode steps after it.
//! - `clap_htsat_base`: CLAP's audio embedding of a 10 s clip (48 kHz; features + HTSAT-base +
//!   projection) with the default (clap-htsat-unfused) configuration.
//!
//! `cargo bench -p ipfs-accelerate-benches --bench families_cpu [-- FILTER]`

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use burn::tensor::Tensor;
use burn_flex::Flex;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ipfs_accelerate_core::{BackendKind, HostTensor, JsonConfig, TensorSource};
use ipfs_accelerate_io::RandomInit;
use ipfs_accelerate_llama::{Architecture, LlamaConfig, LlamaRunner};
use ipfs_accelerate_nn::generate::{GenerationConfig, Sampling};
use ipfs_accelerate_preprocess::audio::{WhisperFeatureConfig, WhisperFeatureExtractor};
use ipfs_accelerate_preprocess::image::{
    ImageProcessor, ImageProcessorConfig, ProcessorKind, RgbImage,
};
use ipfs_accelerate_t5::{preset, T5Config, T5Inputs, T5};
use ipfs_accelerate_vit::{VitConfig, VitRunner};
use ipfs_accelerate_whisper::{Suppression, Whisper, WhisperConfig};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The config.json of a named configuration of the benchmark runner (`ipfs_accelerate_bench::configs`).
fn config_json(name: &str) -> &'static str {
    ipfs_accelerate_bench::configs::preset(name)
        .unwrap_or_else(|| panic!("no preset {name}"))
        .1
}

fn random() -> Arc<dyn TensorSource> {
    Arc::new(RandomInit::new(0, 0.02))
}

fn greedy(tokens: usize) -> GenerationConfig {
    GenerationConfig {
        max_new_tokens: tokens,
        sampling: Sampling::Greedy,
        stop_tokens: Vec::new(),
        ..Default::default()
    }
}

/// The fixture folder `family/variant` of the shared fixtures, when present.
fn fixture(family: &str, variant: &str) -> Option<PathBuf> {
    let root = std::env::var_os("IPFS_ACCELERATE_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared"));
    let dir = root.join("fixtures").join(family).join(variant);
    dir.join("config.json").is_file().then_some(dir)
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A 640×480 RGB gradient with some texture.
fn test_image() -> RgbImage {
    let (w, h) = (640, 480);
    let data = (0..h)
        .flat_map(|y| {
            (0..w).flat_map(move |x| {
                [
                    (x * 255 / w) as u8,
                    (y * 255 / h) as u8,
                    ((x * y) % 251) as u8,
                ]
            })
        })
        .collect();
    RgbImage::new(w, h, data).expect("valid image")
}

fn whisper_logmel(c: &mut Criterion) {
    let mut g = c.benchmark_group("whisper_logmel");
    g.sample_size(10);
    let fx =
        WhisperFeatureExtractor::new(WhisperFeatureConfig::for_model(80, 3000).unwrap()).unwrap();
    let samples: Vec<f32> = (0..480_000)
        .map(|i| (i as f32 * 0.031).sin() * 0.3 + (i as f32 * 0.0071).cos() * 0.2)
        .collect();
    g.throughput(Throughput::Elements(1));
    g.bench_function("30s_80bins", |b| {
        b.iter(|| fx.extract(&samples, 16_000).unwrap())
    });
    g.finish();
}

fn image_preprocess(c: &mut Criterion) {
    let mut g = c.benchmark_group("image_preprocess");
    let img = test_image();
    for (name, kind) in [
        ("vit_224", ProcessorKind::Vit),
        ("clip_224", ProcessorKind::Clip),
    ] {
        let p = ImageProcessor::new(ImageProcessorConfig::defaults(kind));
        g.throughput(Throughput::Elements(1));
        g.bench_function(name, |b| {
            b.iter(|| p.preprocess(std::slice::from_ref(&img)).unwrap())
        });
    }
    g.finish();
}

fn vit_base(c: &mut Criterion) {
    let mut g = c.benchmark_group("vit_base_224");
    g.sample_size(10);
    let config = VitConfig::from_json(config_json("vit-base"), Path::new("vit-base")).unwrap();
    let device = Default::default();
    let vit = VitRunner::<Flex>::load(random(), &config, &device, BackendKind::Cpu).unwrap();
    for batch in [1usize, 8] {
        let n = batch * 3 * 224 * 224;
        let values: Vec<f32> = (0..n).map(|i| ((i % 97) as f32 / 48.0) - 1.0).collect();
        let pixels = HostTensor::from_f32(vec![batch, 3, 224, 224], &values).unwrap();
        g.throughput(Throughput::Elements(batch as u64));
        g.bench_with_input(BenchmarkId::new("images", batch), &pixels, |b, p| {
            b.iter(|| {
                let out = vit.encode(p).unwrap();
                let _ = out.last_hidden_state.into_data();
            })
        });
    }
    g.finish();
}

fn whisper_mel(batch: usize, bins: usize, frames: usize) -> Tensor<Flex, 3> {
    let values: Vec<f32> = (0..batch * bins * frames)
        .map(|i| ((i % 113) as f32 / 113.0) - 0.5)
        .collect();
    Tensor::from_data(
        burn::tensor::TensorData::new(values, [batch, bins, frames]),
        &Default::default(),
    )
}

fn whisper_tiny_encoder(c: &mut Criterion) {
    let mut g = c.benchmark_group("whisper_tiny_encoder");
    g.sample_size(10);
    let config =
        WhisperConfig::from_json(config_json("whisper-tiny"), Path::new("whisper-tiny")).unwrap();
    let model = Whisper::<Flex>::load(random(), &config, &Default::default()).unwrap();
    let mel = whisper_mel(1, 80, 3000);
    g.throughput(Throughput::Elements(1));
    g.bench_function("30s", |b| {
        b.iter(|| {
            let _ = model.encode(mel.clone()).unwrap().into_data();
        })
    });
    g.finish();
}

const DECODE_TOKENS: usize = 16;

fn decode(c: &mut Criterion) {
    let mut g = c.benchmark_group("decode");
    g.sample_size(10);
    g.throughput(Throughput::Elements(DECODE_TOKENS as u64));
    let device = Default::default();

    let mut whispers = vec![(
        "whisper-base".to_string(),
        config_json("whisper-base").to_string(),
    )];
    if let Some(dir) = fixture("whisper", "base") {
        whispers.push(("whisper-fixture".into(), read(&dir.join("config.json"))));
    }
    for (name, json) in whispers {
        let config = WhisperConfig::from_json(&json, Path::new(&name)).unwrap();
        let model = Whisper::<Flex>::load(random(), &config, &device).unwrap();
        let encoder = model
            .encode(whisper_mel(1, config.num_mel_bins, config.input_frames()))
            .unwrap();
        let start = config.decoder_start_token_id;
        let prompt = vec![vec![start]];
        let gen = greedy(DECODE_TOKENS.min(config.max_target_positions));
        g.bench_function(BenchmarkId::new("whisper", &name), |b| {
            b.iter(|| {
                model
                    .generate_from_encoder(
                        encoder.clone(),
                        &prompt,
                        &gen,
                        Suppression::default(),
                        true,
                        |_, _| ControlFlow::Continue(()),
                    )
                    .unwrap()
            })
        });
    }

    let mut t5s: Vec<(String, T5Config)> = vec![("t5-base".into(), preset("t5-base").unwrap())];
    if let Some(dir) = fixture("t5", "t5") {
        let path = dir.join("config.json");
        t5s.push((
            "t5-fixture".into(),
            T5Config::from_json(&read(&path), &path).unwrap(),
        ));
    }
    for (name, config) in t5s {
        let model = T5::<Flex>::load(random(), &config, &device).unwrap();
        let seq = 32;
        let inputs = T5Inputs {
            batch: 1,
            seq,
            input_ids: (0..seq as i64)
                .map(|i| (i * 37 + 5) % config.vocab_size as i64)
                .collect(),
            attention_mask: vec![1; seq],
        };
        let encoder = model.encode(&inputs).unwrap();
        let gen = greedy(DECODE_TOKENS);
        g.bench_function(BenchmarkId::new("t5", &name), |b| {
            b.iter(|| {
                model
                    .generate_from_encoder(
                        encoder.clone(),
                        &inputs.attention_mask,
                        &gen,
                        true,
                        |_, _| ControlFlow::Continue(()),
                    )
                    .unwrap()
            })
        });
    }
    g.finish();
}

fn llama_135m(c: &mut Criterion) {
    use ipfs_accelerate_llama::TextGeneration;
    use ipfs_accelerate_nn::WeightQuantization;
    let config = LlamaConfig::from_json(
        config_json("llama-135m"),
        Path::new("smollm2-135m"),
        Architecture::Llama,
    )
    .unwrap();
    let prompt: Vec<u32> = (0..128u32).map(|i| (i * 379 + 11) % 49_152).collect();
    for (name, q) in [
        ("f32", WeightQuantization::None),
        ("int8", WeightQuantization::Int8 { block_size: 32 }),
    ] {
        let mut runner =
            LlamaRunner::<Flex>::load(random(), &config, &Default::default(), BackendKind::Cpu)
                .unwrap();
        TextGeneration::quantize(&mut runner, q).unwrap();
        eprintln!(
            "llama_135m_{name}: weights {:.1} MiB in memory",
            TextGeneration::weight_bytes(&runner) as f64 / (1u64 << 20) as f64
        );
        let mut g = c.benchmark_group(format!("llama_135m_{name}"));
        g.sample_size(10);
        bench_generation(&mut g, prompt.len(), 64, |n, on_token| {
            runner.generate(&prompt, &greedy(n), on_token).unwrap();
        });
        g.finish();
    }
}

/// Time to the first token and decode tokens/s of generation runs `run(max_new_tokens, on_token)`.
fn bench_generation(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    prompt_tokens: usize,
    decode: usize,
    run: impl Fn(usize, &mut dyn FnMut(u32) -> ControlFlow<()>),
) {
    g.throughput(Throughput::Elements(prompt_tokens as u64));
    g.bench_function("first_token", |b| {
        b.iter(|| run(1, &mut |_| ControlFlow::Continue(())))
    });
    g.throughput(Throughput::Elements(decode as u64 - 1));
    g.bench_function(format!("decode_{decode}"), |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let mut first: Option<Instant> = None;
                run(decode, &mut |_| {
                    first.get_or_insert_with(Instant::now);
                    ControlFlow::Continue(())
                });
                total += first.map(|t| t.elapsed()).unwrap_or_default();
            }
            total
        })
    });
}

fn llava_fixture(c: &mut Criterion) {
    use ipfs_accelerate_llava::{LlavaRunner, LlavaVariant};
    let Some(dir) = fixture("llava", "base") else {
        eprintln!("llava_fixture: ../shared/fixtures/llava/base not found, skipped");
        return;
    };
    let mut g = c.benchmark_group("llava_fixture");
    g.sample_size(10);
    let runner = LlavaRunner::<Flex>::load_dir(
        &dir,
        LlavaVariant::Llava,
        &Default::default(),
        BackendKind::Cpu,
    )
    .unwrap();
    let reference =
        ipfs_accelerate_io::SafeTensorsFile::open(dir.join("reference.safetensors")).unwrap();
    let ids = reference
        .tensor("input_ids")
        .unwrap()
        .to_token_ids()
        .unwrap();
    let pixels = reference.tensor("pixel_values").unwrap();
    bench_generation(&mut g, ids.len(), 16, |n, on_token| {
        runner
            .generate(&pixels, None, &ids, &greedy(n), on_token)
            .unwrap();
    });
    g.finish();
}

fn clap_htsat_base(c: &mut Criterion) {
    use ipfs_accelerate_clap::{feature_extractor_for, ClapConfig, ClapRunner, ClapTasks};
    let mut g = c.benchmark_group("clap_htsat_base");
    g.sample_size(10);
    let config = ClapConfig::from_json(
        r#"{"model_type":"clap","text_config":{},"audio_config":{}}"#,
        Path::new("clap-htsat-unfused"),
    )
    .unwrap();
    let extractor = feature_extractor_for(Path::new("/nonexistent"), &config).unwrap();
    let runner = ClapRunner::<Flex>::load(
        random(),
        &config,
        extractor,
        &Default::default(),
        BackendKind::Cpu,
    )
    .unwrap();
    let samples: Vec<f32> = (0..480_000)
        .map(|i| (i as f32 * 0.021).sin() * 0.3 + (i as f32 * 0.0043).cos() * 0.2)
        .collect();
    g.throughput(Throughput::Elements(1));
    g.bench_function("audio_embeds_10s", |b| {
        b.iter(|| {
            let features = runner.waveform_features(&samples, 48_000).unwrap();
            runner.audio_embeds(&features).unwrap()
        })
    });
    g.finish();
}

criterion_group!(
    benches,
    llava_fixture,
    clap_htsat_base,
    whisper_logmel,
    image_preprocess,
    vit_base,
    whisper_tiny_encoder,
    decode,
    llama_135m
);
criterion_main!(benches);
