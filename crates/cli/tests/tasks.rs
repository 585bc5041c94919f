//! The task sub-commands (`transcribe`, `t2t`, `classify-image`, `zero-shot`, `detect`) run as a
//! user would, on the HF fixture checkpoints (copied into a temporary folder and given a small
//! word-level tokenizer where the command needs one), against the library's own results.

mod common;

use std::path::{Path, PathBuf};

use common::{fixture_copy, fixture_copy_with, run_fails, run_ok, sweep_wav, write_tokenizer};

use ipfs_accelerate::LoadOptions;
use ipfs_accelerate_conformance::shared_dir;
use serde_json::{json, Value};

/// The checkpoint's config.json (its `text_config` when it has one).
fn text_config(dir: &Path) -> Value {
    let config: Value =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    match config.get("text_config") {
        Some(t) if t.is_object() => t.clone(),
        _ => config,
    }
}

/// Writes a word-level tokenizer sized and numbered as the checkpoint's (text) config says:
/// `vocab_size`, and the `(name, config key, default id)` special tokens; the post-processor puts
/// the specials named in `before` / `after` around the text. `<unk>` takes the lowest free id.
fn write_config_tokenizer(
    dir: &Path,
    specials: &[(&str, &str, u64)],
    before: &[&str],
    after: &[&str],
    extra: &[(&str, u32)],
) {
    let config = text_config(dir);
    let vocab = config["vocab_size"].as_u64().unwrap() as usize;
    let mut ids: Vec<(String, u32)> = Vec::new();
    for (name, key, default) in specials {
        let id = config[*key].as_u64().unwrap_or(*default) as u32;
        if !ids.iter().any(|(_, i)| *i == id) {
            ids.push((name.to_string(), id));
        }
    }
    for (name, id) in extra {
        ids.push((name.to_string(), *id));
    }
    let unk = (0..vocab as u32)
        .find(|i| !ids.iter().any(|(_, j)| j == i))
        .unwrap();
    ids.insert(0, ("<unk>".into(), unk));
    let refs: Vec<(&str, u32)> = ids.iter().map(|(n, i)| (n.as_str(), *i)).collect();
    let named = |list: &[&str]| -> Vec<String> {
        list.iter()
            .filter_map(|t| {
                refs.iter()
                    .find(|(n, _)| n == t)
                    .map(|(n, _)| n.to_string())
            })
            .collect()
    };
    let (b, a) = (named(before), named(after));
    let b: Vec<&str> = b.iter().map(String::as_str).collect();
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    write_tokenizer(dir, vocab, &refs, &b, &a);
}

/// The checkpoint's whole config.json.
fn text_config_root(dir: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap()
}

/// CLIP's special tokens (also X-CLIP's text tower).
const CLIP_SPECIALS: &[(&str, &str, u64)] = &[
    ("<|startoftext|>", "bos_token_id", 49406),
    ("<|endoftext|>", "eos_token_id", 49407),
    ("<pad>", "pad_token_id", 1),
];

fn image_png(shared: &Path) -> PathBuf {
    shared.join("fixtures/image_processors/image.png")
}

#[test]
fn transcribe_whisper_and_wav2vec2_from_a_wav_file() {
    let Some(shared) = shared_dir("transcribe_whisper_and_wav2vec2_from_a_wav_file") else {
        return;
    };
    let wav_dir = tempfile::tempdir().unwrap();
    let wav = wav_dir.path().join("sweep.wav");
    sweep_wav(&wav);
    for (family, variant) in [("whisper", "base"), ("wav2vec2", "ctc")] {
        let model = fixture_copy(&shared, family, variant);
        let m = model.path().to_str().unwrap();
        let out = run_ok(&[
            "transcribe",
            "--model",
            m,
            "--json",
            "--max-new-tokens",
            "5",
            wav.to_str().unwrap(),
        ]);
        let printed: Value = serde_json::from_str(&out).unwrap();
        let asr = {
            let mut t =
                ipfs_accelerate::speech::Transcriber::load(m, &LoadOptions::default()).unwrap();
            t.max_new_tokens = Some(5);
            t
        };
        assert_eq!(asr.family(), family);
        let direct = asr.transcribe_file(&wav).unwrap().value;
        let tokens: Vec<i64> = serde_json::from_value(printed["tokens"].clone()).unwrap();
        assert_eq!(tokens, direct.tokens, "{family}");
        assert!(!tokens.is_empty(), "{family}");
        assert!((printed["duration_s"].as_f64().unwrap() - 1.5).abs() < 1e-3);
    }
    // Not a WAV file: a clean error naming the problem.
    let model = fixture_copy(&shared, "whisper", "base");
    let junk = wav_dir.path().join("junk.wav");
    std::fs::write(&junk, b"definitely not RIFF").unwrap();
    let m = model.path().to_str().unwrap();
    run_fails(
        &["transcribe", "--model", m, junk.to_str().unwrap()],
        "junk.wav",
    );
}

#[test]
fn t2t_generates_with_the_t5_tokenizer_and_needs_one() {
    let Some(shared) = shared_dir("t2t_generates_with_the_t5_tokenizer_and_needs_one") else {
        return;
    };
    let model = fixture_copy(&shared, "t5", "t5");
    let m = model.path().to_str().unwrap();
    run_fails(&["t2t", "--model", m, "w5 w7 w9"], "tokenizer.json");
    write_config_tokenizer(
        model.path(),
        &[("<pad>", "pad_token_id", 0), ("</s>", "eos_token_id", 1)],
        &[],
        &["</s>"],
        &[],
    );
    let printed = run_ok(&[
        "t2t",
        "--model",
        m,
        "--max-new-tokens",
        "6",
        "w5 w7 w9",
        "w11 w3",
    ]);
    let t5 = ipfs_accelerate::text2text::Text2Text::load(m, &LoadOptions::default()).unwrap();
    let direct = t5.generate(&["w5 w7 w9", "w11 w3"], 6).unwrap().value;
    assert_eq!(printed.lines().collect::<Vec<_>>(), direct);
}

#[test]
fn classify_image_zero_shot_and_detect_on_an_image_file() {
    let Some(shared) = shared_dir("classify_image_zero_shot_and_detect_on_an_image_file") else {
        return;
    };
    let image = image_png(&shared);
    let img = image.to_str().unwrap();

    let vit = fixture_copy_with(
        &shared,
        "vit",
        "image_classification",
        "ForImageClassification",
    );
    let out: Value = serde_json::from_str(&run_ok(&[
        "classify-image",
        "--model",
        vit.path().to_str().unwrap(),
        "--top-k",
        "2",
        img,
        img,
    ]))
    .unwrap();
    let rows = out.as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0], rows[1]);
    let scores: Vec<f64> = rows[0]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["score"].as_f64().unwrap())
        .collect();
    assert_eq!(scores.len(), 2);
    assert!(scores[0] >= scores[1] && scores[0] <= 1.0);
    let label = rows[0][0]["label"].as_str().unwrap();
    assert!(label.starts_with("LABEL_"), "{label}");
    let classifier = ipfs_accelerate::vision::ImageClassifier::load(
        vit.path().to_str().unwrap(),
        &LoadOptions::default(),
    )
    .unwrap();
    let direct = classifier.classify_files(&[&image], 2).unwrap().value;
    assert_eq!(direct[0][0].label, label);
    assert!((f64::from(direct[0][0].score) - scores[0]).abs() < 1e-6);

    let clip = fixture_copy(&shared, "clip", "base");
    write_config_tokenizer(
        clip.path(),
        CLIP_SPECIALS,
        &["<|startoftext|>"],
        &["<|endoftext|>"],
        &[],
    );
    let c = clip.path().to_str().unwrap();
    // The CLI's zero-shot on the global `--backend` list given first (none: the default).
    let zero_shot_cli = |backend: &[&str]| -> Value {
        let mut args = backend.to_vec();
        args.extend(["zero-shot", "--model", c, "--labels", "w4,w9 w10,w20"]);
        args.extend(["--template", "{}", img]);
        serde_json::from_str(&run_ok(&args)).unwrap()
    };
    let out = zero_shot_cli(&[]);
    let labels = out[0].as_array().unwrap();
    assert_eq!(labels.len(), 3);
    let total: f64 = labels.iter().map(|l| l["score"].as_f64().unwrap()).sum();
    assert!((total - 1.0).abs() < 1e-4, "{out}");
    let zs = ipfs_accelerate::vision::ZeroShotClassifier::load(c, &LoadOptions::default()).unwrap();
    let images = ipfs_accelerate::vision::load_images(&[&image]).unwrap();
    let direct = zs
        .classify(&images, &["w4", "w9 w10", "w20"], "{}")
        .unwrap()
        .value;
    assert_eq!(labels[0]["label"], direct[0][0].label);
    assert!((labels[0]["score"].as_f64().unwrap() - f64::from(direct[0][0].score)).abs() < 1e-6);
    run_fails(&["zero-shot", "--model", c, "--labels", ",", img], "labels");
    // Image search with CLIP's embeddings: zero-shot's probabilities are softmax(scale · cosine)
    // of the same image and text embeddings.
    let texts = ["w4", "w9 w10", "w20"];
    let image_embeds = zs.embed_images(&images).unwrap().value;
    let text_embeds = zs.embed_texts(&texts).unwrap().value;
    assert_eq!((image_embeds.len(), text_embeds.len()), (1, 3));
    let cosine = |a: &[f32], b: &[f32]| {
        let dot: f64 = a
            .iter()
            .zip(b)
            .map(|(x, y)| f64::from(*x) * f64::from(*y))
            .sum();
        let norm = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
        dot / (norm(a) * norm(b))
    };
    let cos: Vec<f64> = text_embeds
        .iter()
        .map(|t| cosine(&image_embeds[0], t))
        .collect();
    let prob = |l: &str| f64::from(direct[0].iter().find(|x| x.label == l).unwrap().score);
    let probs: Vec<f64> = texts.iter().map(|l| prob(l)).collect();
    let (hi, lo) = (0..3).fold((0, 0), |(hi, lo), i| {
        (
            if cos[i] > cos[hi] { i } else { hi },
            if cos[i] < cos[lo] { i } else { lo },
        )
    });
    assert!(
        cos[hi] - cos[lo] > 1e-3,
        "the labels' cosines do not differ: {cos:?}"
    );
    let scale = (probs[hi].ln() - probs[lo].ln()) / (cos[hi] - cos[lo]);
    let z: f64 = cos.iter().map(|c| (scale * c).exp()).sum();
    for (c, p) in cos.iter().zip(&probs) {
        assert!(
            ((scale * c).exp() / z - p).abs() < 1e-3,
            "{cos:?} {probs:?}"
        );
    }
    // The same on ONNX Runtime (the checkpoint's export), when it is installed.
    let onnx = ipfs_accelerate::BackendKind::Onnx(ipfs_accelerate::ExecutionProvider::Cpu);
    let ort = matches!(
        ipfs_accelerate::selector().probe(onnx),
        ipfs_accelerate::Availability::Available(_)
    );
    assert!(
        ort || std::env::var("IPFS_ACCELERATE_REQUIRE_ONNX").as_deref() != Ok("1"),
        "ONNX Runtime required"
    );
    if ort {
        std::fs::copy(
            shared.join("fixtures/clip/base/model.onnx"),
            clip.path().join("model.onnx"),
        )
        .unwrap();
        // ONNX Runtime's CPU and OpenVINO providers, then the browser's WebNN when the build has
        // it and the browser is installed: the library and the CLI on each.
        let mut kinds = vec![onnx];
        let openvino =
            ipfs_accelerate::BackendKind::Onnx(ipfs_accelerate::ExecutionProvider::OpenVino);
        if matches!(
            ipfs_accelerate::selector().probe(openvino),
            ipfs_accelerate::Availability::Available(_)
        ) {
            kinds.push(openvino);
        }
        if let Ok(webnn) = "webnn".parse::<ipfs_accelerate::BackendKind>() {
            if matches!(
                ipfs_accelerate::selector().probe(webnn),
                ipfs_accelerate::Availability::Available(_)
            ) {
                kinds.push(webnn);
            }
        }
        let diff = |a: &[f32], b: &[f32]| {
            a.iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0f32, f32::max)
        };
        for kind in kinds {
            let bar = common::graph_bar(kind);
            let options = LoadOptions {
                backends: Some(vec![kind]),
                ..Default::default()
            };
            let graph = ipfs_accelerate::vision::ZeroShotClassifier::load(c, &options).unwrap();
            assert_eq!(graph.selection().device.kind, kind);
            let on_graph = graph.classify(&images, &texts, "{}").unwrap().value;
            for (a, b) in on_graph[0].iter().zip(&direct[0]) {
                assert_eq!(a.label, b.label, "{kind}");
                assert!(
                    (a.score - b.score).abs() < bar,
                    "{kind}: {} vs {}",
                    a.score,
                    b.score
                );
            }
            let g_images = graph.embed_images(&images).unwrap().value;
            assert!(diff(&g_images[0], &image_embeds[0]) < bar, "{kind}");
            let g_texts = graph.embed_texts(&texts).unwrap().value;
            for (a, b) in g_texts.iter().zip(&text_embeds) {
                assert!(diff(a, b) < bar, "{kind}");
            }
            let name = kind.to_string();
            let cli = zero_shot_cli(&["--backend", &name]);
            assert_eq!(cli[0][0]["label"], direct[0][0].label, "CLI on {kind}");
        }
    }

    let detr = fixture_copy(&shared, "detr", "object_detection");
    let drawn = tempfile::tempdir().unwrap();
    let png = drawn.path().join("boxes.png");
    let out: Value = serde_json::from_str(&run_ok(&[
        "detect",
        "--model",
        detr.path().to_str().unwrap(),
        "--threshold",
        "0.0",
        "--draw",
        png.to_str().unwrap(),
        img,
    ]))
    .unwrap();
    let dets = out[0].as_array().unwrap();
    assert!(!dets.is_empty());
    let (w, h) = image::image_dimensions(&image).unwrap();
    for d in dets {
        let b: Vec<f64> = serde_json::from_value(d["box_xyxy"].clone()).unwrap();
        assert!(b[0] <= b[2] && b[1] <= b[3], "{d}");
        assert!(d["label"].is_string());
    }
    assert_eq!(image::image_dimensions(&png).unwrap(), (w, h));
    assert_ne!(
        image::open(&png).unwrap().to_rgb8().into_raw(),
        image::open(&image).unwrap().to_rgb8().into_raw(),
        "boxes were drawn"
    );
}

#[test]
fn task_commands_need_a_model_of_their_family() {
    run_fails(&["classify-image", "nothing.png"], "--model");
    let tmp = tempfile::tempdir().unwrap();
    run_fails(
        &["detect", "--model", tmp.path().to_str().unwrap(), "x.png"],
        "config.json",
    );
}

#[test]
fn describe_image_classify_video_and_classify_audio() {
    let Some(shared) = shared_dir("describe_image_classify_video_and_classify_audio") else {
        return;
    };
    let image = image_png(&shared);
    let img = image.to_str().unwrap();
    let opts = LoadOptions::default();

    // LLaVA-1.5: no chat template → "USER: <image>\n{question} ASSISTANT:".
    let llava = fixture_copy(&shared, "llava", "base");
    let config: Value =
        serde_json::from_slice(&std::fs::read(llava.path().join("config.json")).unwrap()).unwrap();
    let image_token = config["image_token_id"]
        .as_u64()
        .or(config["image_token_index"].as_u64())
        .unwrap() as u32;
    write_config_tokenizer(
        llava.path(),
        &[("<s>", "bos_token_id", 1)],
        &["<s>"],
        &[],
        &[("<image>", image_token)],
    );
    let side = config["vision_config"]["image_size"].as_u64().unwrap();
    let pre = json!({ "image_processor_type": "CLIPImageProcessor", "size": { "shortest_edge": side },
        "crop_size": { "height": side, "width": side }, "do_center_crop": true, "resample": 3 });
    std::fs::write(
        llava.path().join("preprocessor_config.json"),
        pre.to_string(),
    )
    .unwrap();
    let l = llava.path().to_str().unwrap();
    let printed = run_ok(&[
        "describe-image",
        "--model",
        l,
        "--prompt",
        "w5 w6",
        "--max-new-tokens",
        "4",
        img,
    ]);
    let describer = ipfs_accelerate::multimodal::ImageDescriber::load(l, &opts).unwrap();
    let direct = describer
        .describe_files(&[&image], "w5 w6", 4, |_| {})
        .unwrap()
        .value;
    assert_eq!(direct.token_ids.len(), 4);
    // In memory, the same tokens.
    let decoded = ipfs_accelerate::vision::load_images(&[&image]).unwrap();
    let in_memory = describer.describe(&decoded, "w5 w6", 4, |_| {}).unwrap();
    assert_eq!(in_memory.value.token_ids, direct.token_ids);
    assert_eq!(printed.trim_end_matches('\n'), direct.text);
    run_fails(
        &["describe-image", "--model", l, "--prompt", " ", img],
        "empty prompt",
    );

    // X-CLIP: 6 frame files, the model's 4 sampled from them.
    let xclip = fixture_copy(&shared, "xclip", "base");
    write_config_tokenizer(
        xclip.path(),
        CLIP_SPECIALS,
        &["<|startoftext|>"],
        &["<|endoftext|>"],
        &[],
    );
    let frames_dir = tempfile::tempdir().unwrap();
    let source = image::open(&image).unwrap().to_rgb8();
    let frames: Vec<String> = (0..6)
        .map(|i| {
            let path = frames_dir.path().join(format!("frame{i}.png"));
            image::imageops::rotate180(
                &image::imageops::crop_imm(&source, i * 3, i * 2, 40, 30).to_image(),
            )
            .save(&path)
            .unwrap();
            path.to_str().unwrap().to_string()
        })
        .collect();
    let x = xclip.path().to_str().unwrap();
    let mut args = vec![
        "classify-video",
        "--model",
        x,
        "--labels",
        "w3 w4,w9,w60 w61 w62",
    ];
    args.extend(frames.iter().map(String::as_str));
    let out: Value = serde_json::from_str(&run_ok(&args)).unwrap();
    let classifier = ipfs_accelerate::multimodal::VideoClassifier::load(x, &opts).unwrap();
    let frames_wanted = text_config_root(xclip.path())["vision_config"]["num_frames"]
        .as_u64()
        .unwrap_or(8);
    assert_eq!(classifier.frames_per_video() as u64, frames_wanted);
    let direct = classifier
        .classify_files(&frames, &["w3 w4", "w9", "w60 w61 w62"], "{}")
        .unwrap()
        .value;
    // Decoded frames give the same probabilities as the files.
    let decoded = ipfs_accelerate::vision::load_images(&frames).unwrap();
    let in_memory = classifier
        .classify(&decoded, &["w3 w4", "w9", "w60 w61 w62"], "{}")
        .unwrap()
        .value;
    assert_eq!(in_memory, direct);
    assert_eq!(out.as_array().unwrap().len(), 3);
    assert_eq!(out[0]["label"], direct[0].label);
    assert!((out[0]["score"].as_f64().unwrap() - f64::from(direct[0].score)).abs() < 1e-6);
    let total: f64 = out
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["score"].as_f64().unwrap())
        .sum();
    assert!((total - 1.0).abs() < 1e-4);

    // CLAP: a WAV at another rate, RoBERTa-style special tokens.
    let clap = fixture_copy(&shared, "clap", "base");
    write_config_tokenizer(
        clap.path(),
        &[
            ("<s>", "bos_token_id", 0),
            ("<pad>", "pad_token_id", 1),
            ("</s>", "eos_token_id", 2),
        ],
        &["<s>"],
        &["</s>"],
        &[],
    );
    let wav = frames_dir.path().join("sweep.wav");
    sweep_wav(&wav);
    let c = clap.path().to_str().unwrap();
    let out: Value = serde_json::from_str(&run_ok(&[
        "classify-audio",
        "--model",
        c,
        "--labels",
        "w10,w11 w12",
        "--template",
        "w5 {}",
        wav.to_str().unwrap(),
    ]))
    .unwrap();
    let classifier = ipfs_accelerate::multimodal::AudioClassifier::load(c, &opts).unwrap();
    let direct = classifier
        .classify_file(&wav, &["w10", "w11 w12"], "w5 {}")
        .unwrap()
        .value;
    let pcm = ipfs_accelerate::load_audio(&wav).unwrap();
    let in_memory = classifier
        .classify(&pcm, &["w10", "w11 w12"], "w5 {}")
        .unwrap()
        .value;
    assert_eq!(in_memory, direct);
    assert_eq!(out[0]["label"], direct[0].label);
    assert!((out[0]["score"].as_f64().unwrap() - f64::from(direct[0].score)).abs() < 1e-6);
    // CLAP's embeddings: the label zero-shot ranks first has the larger cosine with the audio.
    let audio = classifier.embed_audio_file(&wav).unwrap().value;
    assert_eq!(classifier.embed_audio(&pcm).unwrap().value, audio);
    let texts = classifier
        .embed_texts(&["w5 w10", "w5 w11 w12"])
        .unwrap()
        .value;
    let cosine = |a: &[f32], b: &[f32]| {
        let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
        dot / (a.iter().map(|x| x * x).sum::<f32>() * b.iter().map(|x| x * x).sum::<f32>()).sqrt()
    };
    let (c0, c1) = (cosine(&audio, &texts[0]), cosine(&audio, &texts[1]));
    let top = if c0 > c1 { "w10" } else { "w11 w12" };
    assert_eq!(direct[0].label, top, "cosines {c0} {c1}");
    // A PNG is not a WAV.
    run_fails(
        &["classify-audio", "--model", c, "--labels", "w10", img],
        "image.png",
    );
}
