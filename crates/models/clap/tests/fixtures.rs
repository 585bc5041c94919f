//! CLAP against the HF reference fixtures (`fixtures/clap/*`) on the CPU backend, its task APIs
//! (including WAV input), and bad input / bad checkpoints as typed errors.

use std::path::Path;

use burn_flex::Flex;
use ipfs_accelerate_clap::{ClapConfig, ClapFamily, ClapRunner, ClapTasks};
use ipfs_accelerate_conformance::{
    assert_checks, assert_rows_match, assert_softmax_rows, family_fixtures, relative_error,
    verify_runner, without,
};
use ipfs_accelerate_core::{
    BackendKind, Error, Family, HostTensor, JsonConfig, ModelRunner, TensorMap, TensorSource,
    TokenBatch,
};
use ipfs_accelerate_preprocess::audio::{ClapFeatureConfig, ClapFeatureExtractor};

fn runner(dir: &Path) -> ClapRunner<Flex> {
    ClapRunner::load_dir(dir, &Default::default(), BackendKind::Cpu).unwrap()
}

#[test]
fn outputs_match_hf_within_tolerance() {
    for f in family_fixtures("outputs_match_hf_within_tolerance", "clap") {
        let model =
            ClapFamily::load::<Flex>(&f.dir, &Default::default(), BackendKind::Cpu).unwrap();
        let checks = verify_runner(&f, BackendKind::Cpu, model.as_ref()).unwrap();
        println!("{}: {checks:?}", f.dir.display());
        assert_checks(&checks);
    }
}

#[test]
fn task_apis_agree_with_the_model_outputs() {
    for f in family_fixtures("task_apis_agree_with_the_model_outputs", "clap") {
        let clap = runner(&f.dir);
        let inputs = f.inputs().unwrap();
        let reference = f.reference().unwrap();
        let text = TokenBatch::from_tensors(&inputs).unwrap();
        let features = &inputs["input_features"];
        let full = clap.run(&inputs).unwrap();
        assert_rows_match(clap.text_embeds(&text).unwrap(), &full["text_embeds"]);
        assert_rows_match(clap.audio_embeds(features).unwrap(), &full["audio_embeds"]);
        // logits_per_text uses logit_scale_t: against HF's embeddings and the checkpoint's scale.
        let (_, scale_t) = clap.model().logit_scales();
        let (t, a) = (
            reference.tensor("text_embeds").unwrap(),
            reference.tensor("audio_embeds").unwrap(),
        );
        let (n_t, n_a, d) = (t.shape()[0], a.shape()[0], t.shape()[1]);
        let (t, a) = (t.to_f64_vec(), a.to_f64_vec());
        let want: Vec<f64> = (0..n_t * n_a)
            .map(|k| {
                let (i, j) = (k / n_a, k % n_a);
                let dot: f64 = (0..d).map(|x| t[i * d + x] * a[j * d + x]).sum();
                dot * f64::from(scale_t)
            })
            .collect();
        let got = full["logits_per_text"].to_f64_vec();
        assert!(relative_error(&got, &want) < 1e-4);
        // Zero-shot probabilities are the softmax of HF's logits_per_audio over the labels.
        let probs = clap.zero_shot(features, &text).unwrap();
        assert_softmax_rows(&probs, &reference.tensor("logits_per_audio").unwrap());
        // One tower at a time.
        let only_text = without(&inputs, "input_features");
        let out = clap.run(&only_text).unwrap();
        assert!(out.contains_key("text_embeds") && !out.contains_key("audio_embeds"));
        let only_audio: TensorMap = [("input_features".to_string(), features.clone())].into();
        let out = clap.run(&only_audio).unwrap();
        assert!(out.contains_key("audio_embeds") && !out.contains_key("text_embeds"));
    }
}

/// An extractor whose frames fit the model: at most `spec_size · freq_ratio` frames.
fn fitting_extractor(clap: &ClapRunner<Flex>) -> ClapFeatureExtractor {
    let g = clap.model().audio.geometry();
    let mels = clap.config().audio_config.num_mel_bins;
    // spec_width - 1 frames exercise the bicubic resize along time; HF resizes only one axis, so
    // a model with fewer mels than spec_height needs exactly spec_width frames.
    let frames = if mels < g.spec_height {
        g.spec_width
    } else {
        g.spec_width - 1
    };
    let config = ClapFeatureConfig {
        feature_size: mels,
        sampling_rate: 16_000,
        hop_length: 160,
        fft_window_size: 400,
        frequency_max: 8000.0,
        // (frames - 1) · hop samples give `frames` frames.
        max_length_s: ((frames - 1) * 160) as f64 / 16_000.0,
        ..ClapFeatureConfig::default()
    };
    ClapFeatureExtractor::new(config).unwrap()
}

#[test]
fn wav_files_classify_through_the_feature_extractor() {
    for f in family_fixtures("wav_files_classify_through_the_feature_extractor", "clap") {
        let clap = runner(&f.dir);
        let default = ClapFeatureExtractor::new(ClapFeatureConfig {
            feature_size: clap.config().audio_config.num_mel_bins,
            ..ClapFeatureConfig::default()
        })
        .unwrap();
        let clap = clap.with_feature_extractor(default).unwrap();
        // A tone at 8 kHz, resampled to the extractor's 16 kHz.
        let dir = tempfile::tempdir().unwrap();
        let wav = dir.path().join("tone.wav");
        let spec = hound::WavSpec {
            channels: 1,
            sample_rate: 8000,
            bits_per_sample: 16,
            sample_format: hound::SampleFormat::Int,
        };
        let mut w = hound::WavWriter::create(&wav, spec).unwrap();
        for i in 0..4000 {
            let v = (i as f32 * 0.3).sin() * 0.5;
            w.write_sample((v * 32767.0) as i16).unwrap();
        }
        w.finalize().unwrap();
        // HF's default window (1001 frames at 48 kHz) does not fit a small test model: typed error.
        let ids = TokenBatch {
            batch: 2,
            seq: 3,
            input_ids: vec![0, 5, 2, 0, 7, 2],
            attention_mask: vec![1; 6],
        };
        let e = clap.classify_wav(&wav, &ids);
        let fits = clap.model().audio.geometry().spec_width >= 1001;
        assert!(fits || matches!(e, Err(Error::InvalidInput(_))), "{e:?}");
        let clap = {
            let fe = fitting_extractor(&clap);
            clap.with_feature_extractor(fe).unwrap()
        };
        let features = clap.wav_features(&wav).unwrap();
        let mels = clap.config().audio_config.num_mel_bins;
        let frames = clap.feature_extractor().config().num_frames();
        assert_eq!(features.shape(), &[1, 1, frames, mels]);
        let probs = clap.classify_wav(&wav, &ids).unwrap();
        assert_eq!(probs.len(), 2);
        assert!((probs.iter().sum::<f32>() - 1.0).abs() < 1e-5);
        let direct = clap.zero_shot(&features, &ids).unwrap();
        assert_eq!(direct[0], probs);
        // A missing file and a non-WAV file are typed errors.
        assert!(clap.wav_features(&dir.path().join("missing.wav")).is_err());
        std::fs::write(dir.path().join("bad.wav"), b"not a wav").unwrap();
        assert!(matches!(
            clap.wav_features(&dir.path().join("bad.wav")),
            Err(Error::InvalidInput(_))
        ));
        assert!(matches!(
            clap.waveform_features(&[], 16000),
            Err(Error::InvalidInput(_))
        ));
        let wrong = ClapFeatureExtractor::new(ClapFeatureConfig {
            feature_size: mels + 1,
            ..ClapFeatureConfig::default()
        })
        .unwrap();
        assert!(clap.with_feature_extractor(wrong).is_err());
    }
}

#[test]
fn bad_inputs_are_typed_errors() {
    for f in family_fixtures("bad_inputs_are_typed_errors", "clap") {
        let clap = runner(&f.dir);
        let cfg = clap.config().clone();
        let (tc, ac) = (&cfg.text_config, &cfg.audio_config);
        let g = clap.model().audio.geometry().clone();
        let ids = |v: Vec<i64>, shape: Vec<usize>| HostTensor::from_i64(shape, &v).unwrap();
        let feats = |shape: Vec<usize>| {
            let n = shape.iter().product::<usize>();
            HostTensor::from_f32(shape, &vec![0.5; n]).unwrap()
        };
        let run = |pairs: Vec<(&str, HostTensor)>| {
            clap.run(&pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
        };
        // Positions start at pad + 1: this many tokens overflow the position table.
        let too_long = tc.max_position_embeddings - tc.pad_id() as usize;
        let mels = ac.num_mel_bins;
        for case in [
            vec![("input_ids", ids(vec![tc.vocab_size as i64], vec![1, 1]))],
            vec![("input_ids", ids(vec![-1], vec![1, 1]))],
            vec![("input_ids", ids(vec![], vec![1, 0]))],
            vec![("input_ids", ids(vec![0; too_long], vec![1, too_long]))],
            vec![("input_ids", ids(vec![0, 1], vec![2]))],
            vec![
                ("input_ids", ids(vec![0, 3], vec![1, 2])),
                ("attention_mask", ids(vec![1], vec![1, 1])),
            ],
            vec![("input_features", feats(vec![1, 1, g.spec_width + 1, mels]))],
            vec![("input_features", feats(vec![1, 1, g.spec_width, mels + 1]))],
            vec![("input_features", feats(vec![1, 2, g.spec_width, mels]))],
            vec![("input_features", feats(vec![0, 1, g.spec_width, mels]))],
            vec![("input_features", feats(vec![1, 1, 0, mels]))],
            vec![("input_features", feats(vec![1, g.spec_width, mels]))],
            vec![],
        ] {
            let names: Vec<String> = case
                .iter()
                .map(|(k, v)| format!("{k}{:?}", v.shape()))
                .collect();
            assert!(
                matches!(run(case), Err(Error::InvalidInput(_))),
                "{names:?}"
            );
        }
        // The longest text that fits works.
        let fits = too_long - 1;
        let out = run(vec![("input_ids", ids(vec![0; fits], vec![1, fits]))]).unwrap();
        assert_eq!(out["text_embeds"].shape(), &[1, cfg.projection_dim]);
    }
}

#[test]
fn broken_checkpoints_and_configs_are_typed_errors() {
    for f in family_fixtures("broken_checkpoints_and_configs_are_typed_errors", "clap") {
        let config = ClapConfig::from_file(&f.dir.join("config.json")).unwrap();
        let extractor = || {
            ClapFeatureExtractor::new(ClapFeatureConfig {
                feature_size: config.audio_config.num_mel_bins,
                ..ClapFeatureConfig::default()
            })
            .unwrap()
        };
        let load = |c: &ClapConfig| {
            let weights = ipfs_accelerate_io::open_weights(&f.dir).unwrap();
            ClapRunner::<Flex>::load(
                weights,
                c,
                extractor(),
                &Default::default(),
                BackendKind::Cpu,
            )
            .err()
        };
        let mut wrong = config.clone();
        wrong.projection_dim += 1;
        let e = load(&wrong);
        assert!(matches!(e, Some(Error::ShapeMismatch { .. })), "{e:?}");
        let mut deeper = config.clone();
        deeper.text_config.num_hidden_layers += 1;
        let e = load(&deeper);
        assert!(matches!(e, Some(Error::MissingTensor { .. })), "{e:?}");
        let mut deeper = config.clone();
        *deeper.audio_config.depths.last_mut().unwrap() += 1;
        let e = load(&deeper);
        assert!(matches!(e, Some(Error::MissingTensor { .. })), "{e:?}");
    }
    let origin = Path::new("config.json");
    let ok_audio = r#""audio_config": {"spec_size": 64, "num_mel_bins": 16, "window_size": 4,
        "depths": [2, 2], "num_attention_heads": [2, 4], "patch_embeds_hidden_size": 16,
        "hidden_size": 32}"#;
    let good = format!(r#"{{"text_config": {{}}, {ok_audio}}}"#);
    assert!(ClapConfig::from_json(&good, origin).is_ok());
    // HF's defaults are laion/clap-htsat-unfused's geometry.
    let defaults = ClapConfig::from_json(r#"{"text_config": {}, "audio_config": {}}"#, origin)
        .unwrap()
        .audio_config
        .geometry()
        .unwrap();
    assert_eq!(
        (
            defaults.spec_width,
            defaults.spec_height,
            defaults.resolutions
        ),
        (1024, 64, vec![(64, 64), (32, 32), (16, 16), (8, 8)])
    );
    let with_audio = |extra: &str| {
        format!(
            r#"{{"text_config": {{}}, "audio_config": {{"spec_size": 64, "num_mel_bins": 16,
            "window_size": 4, "depths": [2, 2], "num_attention_heads": [2, 4],
            "patch_embeds_hidden_size": 16, "hidden_size": 32, {extra}}}}}"#
        )
    };
    let bad_audio = [
        r#""enable_fusion": true"#,
        r#""flatten_patch_embeds": false"#,
        r#""hidden_size": 31"#,
        r#""num_mel_bins": 65"#,
        r#""num_mel_bins": 20"#,
        r#""window_size": 16"#,
        r#""num_attention_heads": [3, 4]"#,
        r#""num_attention_heads": [2]"#,
        r#""patch_size": [4, 4, 4]"#,
        r#""patch_size": 2"#,
        r#""patch_stride": 3"#,
        r#""mlp_ratio": 0.0"#,
        r#""hidden_act": "nope""#,
    ];
    for bad in [
        r#"{"text_config": {}}"#.to_string(),
        format!(
            r#"{{"text_config": {{"hidden_size": 10, "num_attention_heads": 3}}, {ok_audio}}}"#
        ),
        format!(r#"{{"text_config": {{"pad_token_id": null}}, {ok_audio}}}"#),
        format!(r#"{{"text_config": {{"vocab_size": 1}}, {ok_audio}}}"#),
        format!(r#"{{"text_config": {{}}, {ok_audio}, "projection_dim": 0}}"#),
    ]
    .into_iter()
    .chain(bad_audio.into_iter().map(with_audio))
    {
        assert!(
            matches!(
                ClapConfig::from_json(&bad, origin),
                Err(Error::InvalidConfig { .. })
            ),
            "{bad}"
        );
    }
}
