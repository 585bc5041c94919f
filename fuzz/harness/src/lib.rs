//! # ipfs-accelerate-fuzz-harness
//!
//! The bodies of the fuzz targets in `fuzz/fuzz_targets/`: each function takes untrusted bytes and
//! drives them through the public API exactly as a loader does (parse, then read everything the
//! parse promises). Errors are the expected outcome for most inputs and are dropped; a panic, an
//! abort, a hang or an unbounded allocation is a finding.
//!
//! The same functions run on stable in `tests/regressions.rs` over every file in `fuzz/seeds/` and
//! `fuzz/regressions/`, so a fixed finding stays fixed without a nightly toolchain.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use ipfs_accelerate_core::{JsonConfig, TensorSource};
use ipfs_accelerate_io::{GgufFile, SafeTensorsFile, WeightStore, SCALE_SUFFIX};
use ipfs_accelerate_preprocess::audio::{
    conform_rate, decode_wav, ClapFeatureConfig, ClapFeatureExtractor, Wav2Vec2FeatureConfig,
    Wav2Vec2FeatureExtractor, WhisperFeatureConfig, WhisperFeatureExtractor,
};
use ipfs_accelerate_preprocess::image::{
    decode_image, ImageProcessor, ImageProcessorConfig, ProcessorKind, RgbImage,
};

/// A harness: untrusted bytes in, nothing out (a panic, hang or runaway allocation is the finding).
pub type Harness = fn(&[u8]);

/// The targets, by name: the directories under `fuzz/seeds/` and `fuzz/regressions/`.
pub const TARGETS: [(&str, Harness); 5] = [
    ("safetensors_header", safetensors_header),
    ("gguf", gguf),
    ("config", config),
    ("chat_template", chat_template),
    ("media", media),
];

/// The harness of `target` (one of [`TARGETS`]).
pub fn target(name: &str) -> Option<Harness> {
    TARGETS.iter().find(|(n, _)| *n == name).map(|(_, f)| *f)
}

/// A short text with ASCII, digits, punctuation, whitespace runs and multi-byte characters.
const SAMPLE_TEXT: &str = "Hello world, 123!  ünïcödé 漢字 🙂\n\tend";

/// `model.safetensors` bytes: [`SafeTensorsFile::from_bytes`], then every tensor (raw and
/// dequantised, with its int8 scales), then the same file through a [`WeightStore`] as
/// `open_weights` serves it.
pub fn safetensors_header(data: &[u8]) {
    let bytes = Bytes::copy_from_slice(data);
    let Ok(file) = SafeTensorsFile::from_bytes("fuzz.safetensors", bytes.clone()) else {
        return;
    };
    let _ = file.metadata().len();
    for name in file.names() {
        let _ = file.shape_of(&name);
        if let Ok(raw) = file.raw(&name) {
            let _ = raw.to_f32_vec();
        }
        let _ = file.raw(&format!("{name}{SCALE_SUFFIX}"));
        if let Ok(t) = file.tensor(&name) {
            let _ = t.to_f32_vec();
            let _ = t.to_i64_vec();
        }
    }
    let Ok(store) = WeightStore::from_files(vec![file]) else {
        return;
    };
    let source = store.into_source();
    for name in source.names() {
        if let Ok(t) = source.tensor(&name) {
            let _ = t.to_f32_vec();
        }
    }
}

/// A `.gguf` image: [`GgufFile::from_bytes`], every tensor (raw, dequantised and as a
/// [`TensorSource`]), the tokenizer from the metadata (encoding and decoding a sample text), the
/// special tokens and chat template as the text generator reads them, and the LLaMA / Qwen2
/// configuration with its weights under HF names.
pub fn gguf(data: &[u8]) {
    let Ok(file) = GgufFile::from_bytes("fuzz.gguf", Bytes::copy_from_slice(data)) else {
        return;
    };
    let _ = (file.version(), file.architecture(), file.alignment());
    for value in file.metadata().values() {
        let _ = (
            value.as_u64(),
            value.as_f64(),
            value.as_str(),
            value.type_name(),
        );
    }
    for info in file.tensor_infos() {
        let _ = info.n_elements();
        let _ = file.raw_tensor(&info.name);
        let _ = file.dequantize_tensor(&info.name);
        if let Ok(t) = file.tensor(&info.name) {
            let _ = t.to_f32_vec();
        }
    }
    // TextGenerator::load on a .gguf file.
    let special = file.special_tokens();
    if let Ok(tokenizer) = file.tokenizer() {
        let name_of = |id: Option<u32>| id.and_then(|i| tokenizer.id_to_token(i));
        let (bos, eos) = (name_of(special.bos), name_of(special.eos));
        if let Ok(enc) = tokenizer.encode(SAMPLE_TEXT, true) {
            let _ = tokenizer.decode(enc.get_ids(), true);
            let _ = tokenizer.decode(enc.get_ids(), false);
        }
        if let Some(template) = file.chat_template() {
            let _ = ipfs_accelerate_llava::render_chat_template(
                template,
                SAMPLE_TEXT,
                0,
                bos.as_deref(),
                eos.as_deref(),
            );
        }
    }
    // The LLaMA / Qwen2 loader: configuration from the metadata, weights under HF names.
    let Ok(config) = ipfs_accelerate_llama::LlamaConfig::from_gguf(&file) else {
        return;
    };
    let _ = (config.rope(), config.eos_token_ids(), config.head_dim());
    let weights = ipfs_accelerate_llama::GgufWeights::new(Arc::new(file), &config);
    for name in weights.names() {
        let _ = weights.shape_of(&name);
        let _ = weights.tensor(&name);
    }
}

/// A small fixed image for the processors a `preprocessor_config.json` configures.
fn small_image() -> &'static RgbImage {
    static IMAGE: OnceLock<RgbImage> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let (w, h) = (13, 7);
        let data = (0..w * h * 3).map(|i| (i * 37 % 256) as u8).collect();
        RgbImage::new(w, h, data).expect("a 13x7 RGB buffer has 273 bytes")
    })
}

/// A 0.1 s waveform (1600 samples) for the extractors a `preprocessor_config.json` configures.
fn short_waveform() -> &'static [f32] {
    static WAVE: OnceLock<Vec<f32>> = OnceLock::new();
    WAVE.get_or_init(|| (0..1600).map(|i| (i as f32 * 0.05).sin() * 0.5).collect())
}

/// `config.json` (and `1_Pooling/config.json`, `preprocessor_config.json`) text: the same bytes
/// through every family's config parser and the accessors its loader calls next, the
/// sentence-transformers pooling config, and the image / audio processor configs — each then
/// applied to a small fixed input, as a pipeline does right after loading.
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let origin = Path::new("config.json");
    let first_labels = 4;

    if let Ok(c) = ipfs_accelerate_bert::BertConfig::from_json(text, origin) {
        let _ = (c.head(), c.head_dim());
        for i in 0..c.num_labels().min(first_labels) {
            let _ = c.label(i);
        }
    }
    let _ = ipfs_accelerate_bert::tasks::Pooling::from_config_json(text, origin);

    for arch in [
        ipfs_accelerate_llama::Architecture::Llama,
        ipfs_accelerate_llama::Architecture::Qwen2,
    ] {
        if let Ok(c) = ipfs_accelerate_llama::LlamaConfig::from_json(text, origin, arch) {
            let _ = (c.rope(), c.sliding_window(), c.eos_token_ids());
            let _ = (c.attention_biases(), c.mlp_biases(), c.kv_heads());
            for i in 0..c.num_hidden_layers.min(4) {
                let _ = c.layer_window(i);
            }
        }
    }

    if let Ok(c) = ipfs_accelerate_t5::T5Config::from_json(text, origin) {
        let _ = (c.inner_dim(), c.start_token());
        let _ = c.generation_config(16);
    }

    if let Ok(c) = ipfs_accelerate_vit::VitConfig::from_json(text, origin) {
        let _ = (c.head(), c.patch(), c.grid());
        for i in 0..c.num_labels().min(first_labels) {
            let _ = c.label(i);
        }
    }

    if let Ok(c) = ipfs_accelerate_wav2vec2::Wav2Vec2Config::from_json(text, origin) {
        let _ = c.has_ctc_head();
        for samples in [0, 399, 400, 16_000] {
            let _ = c.output_frames(samples);
        }
    }

    if let Ok(c) = ipfs_accelerate_whisper::WhisperConfig::from_json(text, origin) {
        // WhisperRunner::from_dir without a preprocessor_config.json.
        if let Ok(fc) = WhisperFeatureConfig::for_model(c.num_mel_bins, c.input_frames()) {
            let rate = fc.sampling_rate;
            if let Ok(fe) = WhisperFeatureExtractor::new(fc) {
                let _ = fe.extract(short_waveform(), rate);
            }
        }
    }

    if let Ok(c) = ipfs_accelerate_clip::ClipConfig::from_json(text, origin) {
        let _ = c.vision_config.grid();
    }

    if let Ok(c) = ipfs_accelerate_clap::ClapConfig::from_json(text, origin) {
        let _ = (c.audio_config.geometry(), c.text_config.pad_id());
        // No preprocessor_config.json in this (absent) folder: features sized for the model.
        let no_dir = Path::new("/nonexistent/ipfs-accelerate-fuzz");
        if let Ok(fe) = ipfs_accelerate_clap::feature_extractor_for(no_dir, &c) {
            let rate = fe.config().sampling_rate;
            let _ = fe.extract(short_waveform(), rate);
        }
    }

    if let Ok(c) = ipfs_accelerate_detr::DetrConfig::from_json(text, origin) {
        if let Ok(backbone) = c.backbone() {
            let _ = (backbone.out_stage(), backbone.stage_names());
            for i in 0..backbone.num_stages().min(8) {
                let _ = backbone.channels_of(i);
            }
        }
        for i in 0..c.num_labels().min(first_labels) {
            let _ = c.label(i);
        }
    }

    for variant in [
        ipfs_accelerate_llava::LlavaVariant::Llava,
        ipfs_accelerate_llava::LlavaVariant::LlavaNext,
    ] {
        if let Ok(c) = ipfs_accelerate_llava::LlavaConfig::from_json_as(text, origin, variant) {
            let _ = (c.grid(), c.feature_layers(), c.tokens_per_view());
            let _ = c.text_config.eos_token_ids();
        }
    }

    if let Ok(c) = ipfs_accelerate_xclip::XclipConfig::from_json(text, origin) {
        let _ = c.clip_text_config();
    }

    // preprocessor_config.json: image processors, then the audio feature extractors.
    let pre = "preprocessor_config.json";
    if let Ok(c) = ImageProcessorConfig::from_json(text, pre) {
        let _ = c.normalization();
        let _ = ImageProcessor::new(c).preprocess(std::slice::from_ref(small_image()));
    }
    if let Ok(c) = WhisperFeatureConfig::from_json(text, pre) {
        let rate = c.sampling_rate;
        if let Ok(fe) = WhisperFeatureExtractor::new(c) {
            let _ = fe.extract(short_waveform(), rate);
        }
    }
    if let Ok(c) = Wav2Vec2FeatureConfig::from_json(text, pre) {
        let rate = c.sampling_rate;
        let _ = Wav2Vec2FeatureExtractor::new(c).extract(&[short_waveform()], rate);
    }
    if let Ok(c) = ClapFeatureConfig::from_json(text, pre) {
        let rate = c.sampling_rate;
        if let Ok(fe) = ClapFeatureExtractor::new(c) {
            let _ = fe.extract(short_waveform(), rate);
        }
    }
}

/// A chat template and a user message: the first byte is the number of images (0 to 3), the rest
/// is `template NUL text` (text empty without a NUL), rendered as the generation paths do
/// (`render_chat_template`: one user turn, generation prompt, BOS / EOS strings).
pub fn chat_template(data: &[u8]) {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let images = usize::from(first % 4);
    let (template, text) = match rest.iter().position(|&b| b == 0) {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &[][..]),
    };
    let template = String::from_utf8_lossy(template);
    let text = String::from_utf8_lossy(text);
    let _ = ipfs_accelerate_llava::render_chat_template(
        &template,
        &text,
        images,
        Some("<s>"),
        Some("</s>"),
    );
}

/// Whisper's, Wav2Vec2's and CLAP's feature extractors.
type AudioExtractors = (
    WhisperFeatureExtractor,
    Wav2Vec2FeatureExtractor,
    ClapFeatureExtractor,
);

/// The default extractors of Whisper (16 kHz), Wav2Vec2 (16 kHz) and CLAP (48 kHz).
fn audio_extractors() -> &'static AudioExtractors {
    static EXTRACTORS: OnceLock<AudioExtractors> = OnceLock::new();
    EXTRACTORS.get_or_init(|| {
        (
            WhisperFeatureExtractor::new(WhisperFeatureConfig::default())
                .expect("Whisper's default feature config is valid"),
            Wav2Vec2FeatureExtractor::new(Wav2Vec2FeatureConfig::default()),
            ClapFeatureExtractor::new(ClapFeatureConfig::default())
                .expect("CLAP's default feature config is valid"),
        )
    })
}

/// The processors of CLIP, ViT, DETR and LLaVA-NeXT with their class defaults.
fn image_processors() -> &'static [ImageProcessor] {
    static PROCESSORS: OnceLock<Vec<ImageProcessor>> = OnceLock::new();
    PROCESSORS.get_or_init(|| {
        [
            ProcessorKind::Clip,
            ProcessorKind::Vit,
            ProcessorKind::Detr,
            ProcessorKind::LlavaNext,
        ]
        .into_iter()
        .map(|k| ImageProcessor::new(ImageProcessorConfig::defaults(k)))
        .collect()
    })
}

/// A media file: WAV (`RIFF` magic) decoded, resampled to each extractor's rate and turned into
/// Whisper log-mel, Wav2Vec2 and CLAP features as the speech / audio pipelines do; anything else
/// decoded as PNG / JPEG and run through the CLIP, ViT, DETR and LLaVA-NeXT processors.
pub fn media(data: &[u8]) {
    if data.starts_with(b"RIFF") {
        let Ok(audio) = decode_wav(data) else {
            return;
        };
        let _ = audio.duration_secs();
        let (whisper, wav2vec2, clap) = audio_extractors();
        let rate = whisper.config().sampling_rate;
        if let Ok(s) = conform_rate(&audio.samples, audio.sample_rate, rate, true) {
            let _ = whisper.extract(&s, rate);
        }
        let rate = wav2vec2.config().sampling_rate;
        if let Ok(s) = conform_rate(&audio.samples, audio.sample_rate, rate, true) {
            let _ = wav2vec2.extract(&[&s], rate);
        }
        let rate = clap.config().sampling_rate;
        if let Ok(s) = conform_rate(&audio.samples, audio.sample_rate, rate, true) {
            let _ = clap.extract(&s, rate);
        }
    } else {
        let Ok(image) = decode_image(data) else {
            return;
        };
        for p in image_processors() {
            let _ = p.preprocess(std::slice::from_ref(&image));
        }
    }
}
