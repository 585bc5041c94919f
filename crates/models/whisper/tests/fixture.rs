//! Whisper against the HF reference fixtures `fixtures/whisper/*` (encoder output and logits
//! within the fixture's tolerance, greedy tokens exactly), cached vs. recomputed generation, bad
//! input, and the end-to-end path WAV → log-mel → tokens. Extra fixture roots are read from
//! `IPFS_ACCELERATE_EXTRA_FIXTURES`.

use std::io::Cursor;
use std::ops::ControlFlow;

use burn::tensor::{Tensor, TensorData};
use burn_flex::Flex;
use ipfs_accelerate_conformance::{assert_checks, family_fixtures, verify_runner};
use ipfs_accelerate_core::{BackendKind, Family, HostTensor, TensorMap, TensorSource};
use ipfs_accelerate_io::SafeTensorsFile;
use ipfs_accelerate_nn::generate::GenerationConfig;
use ipfs_accelerate_preprocess::audio::{decode_wav, WhisperFeatureConfig};
use ipfs_accelerate_whisper::{Suppression, TranscribeOptions, WhisperFamily, WhisperRunner};

fn runner(dir: &std::path::Path) -> WhisperRunner<Flex> {
    WhisperRunner::<Flex>::from_dir(dir, &Default::default(), BackendKind::Cpu).unwrap()
}

#[test]
fn matches_hf_reference() {
    for f in family_fixtures("matches_hf_reference", "whisper") {
        let model =
            WhisperFamily::load::<Flex>(&f.dir, &Default::default(), BackendKind::Cpu).unwrap();
        let checks = verify_runner(&f, BackendKind::Cpu, model.as_ref()).unwrap();
        println!("{checks:?}");
        assert_checks(&checks);
    }
}

/// The decoder on burn with an encoder engine in place of the burn encoder (the path `cuda`
/// takes with the cuBLAS engine): here the encoder spec executed by its f64 reference, so the
/// burn encoder's weights are never loaded and every fixture output still matches HF's.
#[test]
fn an_encoder_engine_replaces_the_burn_encoder() {
    use ipfs_accelerate_core::JsonConfig;
    for f in family_fixtures("an_encoder_engine_replaces_the_burn_encoder", "whisper") {
        if !f.dir.join("model.safetensors").is_file() {
            continue; // the feature extractor's fixture: no model
        }
        let config =
            ipfs_accelerate_whisper::WhisperConfig::from_file(&f.dir.join("config.json")).unwrap();
        let weights = ipfs_accelerate_io::open_weights(&f.dir).unwrap();
        let spec = ipfs_accelerate_whisper::encoder_spec(&config, weights.as_ref()).unwrap();
        let engine = ipfs_accelerate_conformance::SpecReference::new(spec).unwrap();
        let model = WhisperRunner::<Flex>::from_dir_with_encoder_engine(
            &f.dir,
            &Default::default(),
            BackendKind::Cpu,
            Box::new(engine),
        )
        .unwrap();
        assert!(model.model().encoder.is_none(), "{}", f.variant);
        let checks = verify_runner(&f, BackendKind::Cpu, &model).unwrap();
        assert!(
            checks.iter().any(|c| c.output == "logits"),
            "{}: {checks:?}",
            f.variant
        );
        assert_checks(&checks);
        // Without the engine, a model loaded without its encoder names why it cannot encode.
        let bare = ipfs_accelerate_whisper::Whisper::<Flex>::load_without_encoder(
            weights,
            &config,
            &Default::default(),
        )
        .unwrap();
        let features = Tensor::<Flex, 3>::zeros([1, config.num_mel_bins, 8], &Default::default());
        let e = bare.encode(features).unwrap_err().to_string();
        assert!(e.contains("without its encoder"), "{e}");
    }
}

#[test]
fn cached_generation_equals_full_recompute() {
    for f in family_fixtures("cached_generation_equals_full_recompute", "whisper") {
        let dir = &f.dir;
        let r = runner(dir);
        let reference = SafeTensorsFile::open(dir.join("reference.safetensors")).unwrap();
        let features = reference.tensor("input_features").unwrap();
        // Two rows: the fixture's features and a scaled copy, so the batch rows differ.
        let mut values = features.to_f32_vec();
        let second: Vec<f32> = values.iter().map(|v| v * 0.5 - 0.1).collect();
        values.extend(second);
        let [_, mels, frames] = <[usize; 3]>::try_from(features.shape()).unwrap();
        let x = Tensor::<Flex, 3>::from_data(
            TensorData::new(values, [2, mels, frames]),
            &Default::default(),
        );
        let model = r.model();
        let encoder = model.encode(x).unwrap();
        let start = model.config().decoder_start_token_id;
        let prompts = vec![vec![start], vec![start]];
        let config = GenerationConfig {
            max_new_tokens: 12,
            ..Default::default()
        };
        let run = |cache: bool| {
            model
                .generate_from_encoder(
                    encoder.clone(),
                    &prompts,
                    &config,
                    Suppression::default(),
                    cache,
                    |_, _| ControlFlow::Continue(()),
                )
                .unwrap()
        };
        let cached = run(true);
        assert_eq!(cached, run(false));
        assert_eq!(cached[0].len(), 12);
        // Suppression: a token banned at every step never appears; one banned at the start is not first.
        let first = cached[0][0];
        let banned = model
            .generate_from_encoder(
                encoder.clone(),
                &prompts,
                &config,
                Suppression {
                    always: vec![first],
                    at_begin: vec![cached[1][0]],
                },
                true,
                |_, _| ControlFlow::Continue(()),
            )
            .unwrap();
        assert!(!banned[0].contains(&first));
        assert_ne!(banned[1][0], cached[1][0]);
    }
}

#[test]
fn bad_inputs_are_errors() {
    for f in family_fixtures("bad_inputs_are_errors", "whisper") {
        let dir = &f.dir;
        let r = runner(dir);
        let reference = SafeTensorsFile::open(dir.join("reference.safetensors")).unwrap();
        let features = reference.tensor("input_features").unwrap();
        let run = |extra: Vec<(&str, HostTensor)>| {
            let mut m = TensorMap::new();
            m.insert("input_features".into(), features.clone());
            for (k, v) in extra {
                m.insert(k.into(), v);
            }
            ipfs_accelerate_core::ModelRunner::run(&r, &m)
        };
        let c = r.model().config().clone();
        // Out-of-range and over-long decoder ids, bad greedy steps, wrong feature shapes.
        let ids = |v: Vec<i64>| HostTensor::from_i64(vec![1, v.len()], &v).unwrap();
        assert!(run(vec![(
            "decoder_input_ids",
            ids(vec![1, c.vocab_size as i64])
        )])
        .is_err());
        assert!(run(vec![("decoder_input_ids", ids(vec![-1]))]).is_err());
        assert!(run(vec![(
            "decoder_input_ids",
            ids(vec![1; c.max_target_positions + 1])
        )])
        .is_err());
        assert!(run(vec![(
            "greedy_steps",
            HostTensor::from_i64(vec![1], &[c.max_target_positions as i64 + 1]).unwrap()
        )])
        .is_err());
        assert!(run(vec![(
            "greedy_steps",
            HostTensor::from_i64(vec![1], &[-3]).unwrap()
        )])
        .is_err());
        let mut m = TensorMap::new();
        m.insert(
            "input_features".into(),
            HostTensor::from_f32(vec![1, c.num_mel_bins, 7], &vec![0.0; c.num_mel_bins * 7])
                .unwrap(),
        );
        assert!(ipfs_accelerate_core::ModelRunner::run(&r, &m).is_err());
        assert!(ipfs_accelerate_core::ModelRunner::run(&r, &TensorMap::new()).is_err());
        // Audio errors.
        assert!(r.transcribe(&[], 16_000).is_err());
        assert!(r.transcribe(&[0.0, f32::NAN], 16_000).is_err());
        let strict = TranscribeOptions {
            resample: false,
            ..Default::default()
        };
        assert!(r.transcribe_with(&[0.1; 800], 8_000, &strict).is_err());
        // A missing tensor names itself.
        let tmp = tempfile::tempdir().unwrap();
        std::fs::copy(dir.join("config.json"), tmp.path().join("config.json")).unwrap();
        let src = SafeTensorsFile::open(dir.join("model.safetensors")).unwrap();
        let kept: Vec<(String, HostTensor)> = src
            .names()
            .into_iter()
            .filter(|n| !n.ends_with("encoder.conv2.bias"))
            .map(|n| (n.clone(), src.tensor(&n).unwrap()))
            .collect();
        write_safetensors(&tmp.path().join("model.safetensors"), &kept);
        let err =
            WhisperRunner::<Flex>::from_dir(tmp.path(), &Default::default(), BackendKind::Cpu)
                .err()
                .expect("a checkpoint without conv2.bias must not load");
        assert!(err.to_string().contains("conv2.bias"), "{err}");
    }
}

/// A float32 safetensors file (the format is an 8-byte header length, a JSON header, the data).
fn write_safetensors(path: &std::path::Path, tensors: &[(String, HostTensor)]) {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, t) in tensors {
        let bytes: Vec<u8> = t
            .to_f32_vec()
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": "F32", "shape": t.shape(), "data_offsets": [data.len(), data.len() + bytes.len()]}),
        );
        data.extend(bytes);
    }
    let mut h = serde_json::to_vec(&header).unwrap();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut file = (h.len() as u64).to_le_bytes().to_vec();
    file.extend(h);
    file.extend(data);
    std::fs::write(path, file).unwrap();
}

/// A 16-bit stereo WAV of a sine sweep at `rate` Hz.
fn sweep_wav(rate: u32, secs: f64) -> Vec<u8> {
    let spec = hound::WavSpec {
        channels: 2,
        sample_rate: rate,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut cur = Cursor::new(Vec::new());
    {
        let mut w = hound::WavWriter::new(&mut cur, spec).unwrap();
        let n = (secs * f64::from(rate)) as usize;
        for i in 0..n {
            let t = i as f64 / f64::from(rate);
            // 100 Hz rising to 3 kHz.
            let phase = 2.0 * std::f64::consts::PI * (100.0 * t + 1450.0 * t * t / secs);
            let v = (0.4 * phase.sin() * 32767.0) as i16;
            w.write_sample(v).unwrap();
            w.write_sample(v / 2).unwrap();
        }
        w.finalize().unwrap();
    }
    cur.into_inner()
}

#[test]
fn wav_to_tokens_end_to_end() {
    for f in family_fixtures("wav_to_tokens_end_to_end", "whisper") {
        let dir = &f.dir;
        let r = runner(dir);
        let c = r.model().config().clone();
        // Without a preprocessor_config.json the features are sized for the model.
        if !dir.join("preprocessor_config.json").is_file() {
            assert_eq!(
                r.feature_extractor().config(),
                &WhisperFeatureConfig::for_model(c.num_mel_bins, c.input_frames()).unwrap()
            );
        }
        let bytes = sweep_wav(16_000, 0.5);
        let audio = decode_wav(&bytes).unwrap();
        assert_eq!((audio.sample_rate, audio.channels), (16_000, 2));
        let options = TranscribeOptions {
            max_new_tokens: Some(10),
            ..Default::default()
        };
        let from_wav = r
            .transcribe_with(&audio.samples, audio.sample_rate, &options)
            .unwrap();
        assert_eq!(from_wav.prompt, vec![c.decoder_start_token_id]);
        assert!(!from_wav.tokens.is_empty() && from_wav.tokens.len() <= 10);
        assert_eq!(
            from_wav.text.is_some(),
            dir.join("tokenizer.json").is_file()
        );

        // The same features fed directly give the same tokens.
        let features = r
            .feature_extractor()
            .extract(&audio.samples, audio.sample_rate)
            .unwrap();
        let direct = r.transcribe_features(&features, &options).unwrap();
        assert_eq!(direct.tokens, from_wav.tokens);
        // And so does the ModelRunner path (greedy from the start token, no stop token) for as many
        // tokens as the transcription produced before its end-of-text.
        let mut m = TensorMap::new();
        m.insert(
            "input_features".into(),
            HostTensor::from_f32(vec![1, features.mels, features.frames], &features.data).unwrap(),
        );
        let n = from_wav.tokens.len();
        m.insert(
            "greedy_steps".into(),
            HostTensor::from_i64(vec![1], &[n as i64]).unwrap(),
        );
        let out = ipfs_accelerate_core::ModelRunner::run(&r, &m).unwrap();
        let greedy = out["greedy_tokens"].to_token_ids().unwrap();
        assert_eq!(greedy, from_wav.tokens);

        // 44.1 kHz audio is resampled on the way in.
        let hi = decode_wav(&sweep_wav(44_100, 0.5)).unwrap();
        let resampled = r
            .transcribe_with(&hi.samples, hi.sample_rate, &options)
            .unwrap();
        assert!(!resampled.tokens.is_empty());
    }
}

/// Language detection, on a multilingual copy of each fixture (six ordinary tokens named as
/// languages, tasks and `<|notimestamps|>` in its generation config): the detected language is
/// the one HF's first-step logits (the fixture's reference, float64) rank first among the
/// language tokens, and the transcription that goes on with the detection's decoder gives the
/// same tokens as one given that language (a fresh decoder over the whole prompt) and as one
/// without a KV cache.
#[test]
fn language_detection_follows_hf_and_goes_on_with_its_decoder() {
    let mut checked = 0;
    for f in family_fixtures(
        "language_detection_follows_hf_and_goes_on_with_its_decoder",
        "whisper",
    ) {
        if !f.dir.join("model.safetensors").is_file() {
            continue; // the feature extractor's fixture: no model
        }
        let reference = SafeTensorsFile::open(f.dir.join("reference.safetensors")).unwrap();
        let ids = reference.tensor("decoder_input_ids").unwrap();
        let c = runner(&f.dir).model().config().clone();
        if ids.to_token_ids().unwrap()[0] != c.decoder_start_token_id {
            continue; // HF's first logits are not those after the start token alone
        }
        let hf_logits = reference.tensor("logits").unwrap().to_f64_vec();
        let vocab = c.vocab_size;
        let specials = [
            Some(c.decoder_start_token_id),
            c.eos_token_id,
            c.pad_token_id,
        ];
        let free: Vec<u32> = (0..vocab as u32)
            .filter(|t| !specials.contains(&Some(*t)))
            .take(6)
            .collect();
        let names = ["<|en|>", "<|de|>", "<|fr|>"];
        let expected = (0..3)
            .max_by(|&a, &b| hf_logits[free[a] as usize].total_cmp(&hf_logits[free[b] as usize]))
            .unwrap();

        let dir = tempfile::tempdir().unwrap();
        for entry in std::fs::read_dir(&f.dir).unwrap() {
            let path = entry.unwrap().path();
            std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
        }
        let generation = dir.path().join("generation_config.json");
        let mut g: serde_json::Value = match std::fs::read(&generation) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap(),
            Err(_) => serde_json::json!({}),
        };
        g["is_multilingual"] = true.into();
        g["lang_to_id"] =
            serde_json::json!({names[0]: free[0], names[1]: free[1], names[2]: free[2]});
        g["task_to_id"] = serde_json::json!({"transcribe": free[3], "translate": free[4]});
        g["no_timestamps_token_id"] = free[5].into();
        std::fs::write(&generation, serde_json::to_vec(&g).unwrap()).unwrap();

        let r = runner(dir.path());
        let input = reference.tensor("input_features").unwrap();
        let [_, mels, frames] = <[usize; 3]>::try_from(input.shape()).unwrap();
        let features = ipfs_accelerate_preprocess::audio::LogMel {
            mels,
            frames,
            data: input.to_f32_vec(),
            truncated: false,
        };
        let options = |language: Option<&str>, use_cache: bool| TranscribeOptions {
            language: language.map(str::to_string),
            max_new_tokens: Some(8),
            use_cache,
            ..Default::default()
        };
        let detected = r
            .transcribe_features(&features, &options(None, true))
            .unwrap();
        assert_eq!(
            detected.prompt,
            vec![c.decoder_start_token_id, free[expected], free[3], free[5]],
            "{}",
            f.variant
        );
        let given = r
            .transcribe_features(&features, &options(Some(names[expected]), true))
            .unwrap();
        assert_eq!(given.prompt, detected.prompt);
        assert_eq!(given.tokens, detected.tokens, "{}", f.variant);
        let uncached = r
            .transcribe_features(&features, &options(None, false))
            .unwrap();
        assert_eq!(uncached.tokens, detected.tokens, "{}", f.variant);
        assert!(!detected.tokens.is_empty());
        checked += 1;
    }
    assert!(
        checked > 0,
        "no fixture starts its decoder at the start token"
    );
}
