//! Wav2Vec2ForCTC against the HF reference fixtures `fixtures/wav2vec2/*` (float outputs within
//! the fixture's tolerance, CTC argmax exactly), attention masks, bad input, and transcription to
//! text through a vocabulary. Extra fixture roots are read from `IPFS_ACCELERATE_EXTRA_FIXTURES`;
//! `tests/fixtures` adds the layouts the shared set lacks (`tools/make_wav2vec2_fixture.py`: a
//! LayerNorm after every convolution, with post-norm or "stable" pre-norm layers).

use std::path::Path;

use burn_flex::Flex;
use ipfs_accelerate_conformance::{
    assert_checks, discover, family_fixtures, verify_runner, Fixture,
};
use ipfs_accelerate_core::JsonConfig;
use ipfs_accelerate_core::{BackendKind, Family, HostTensor, ModelRunner, TensorMap, TensorSource};
use ipfs_accelerate_wav2vec2::{ctc_collapse, Wav2Vec2Family, Wav2Vec2Runner, Wav2Vec2Tasks};

/// The shared fixtures (and `IPFS_ACCELERATE_EXTRA_FIXTURES`'), then this crate's own.
fn fixtures(test: &str) -> Vec<Fixture> {
    let mut all = family_fixtures(test, "wav2vec2");
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    all.extend(discover(&here, &["wav2vec2".to_string()]).unwrap());
    all
}

fn runner(dir: &Path) -> Wav2Vec2Runner<Flex> {
    Wav2Vec2Runner::<Flex>::from_dir(dir, &Default::default(), BackendKind::Cpu).unwrap()
}

#[test]
fn matches_hf_reference() {
    for f in fixtures("matches_hf_reference") {
        let model =
            Wav2Vec2Family::load::<Flex>(&f.dir, &Default::default(), BackendKind::Cpu).unwrap();
        let checks = verify_runner(&f, BackendKind::Cpu, model.as_ref()).unwrap();
        println!("{checks:?}");
        assert_checks(&checks);
    }
}

#[test]
fn attention_mask_is_respected() {
    for f in fixtures("attention_mask_is_respected") {
        let r = runner(&f.dir);
        let reference = f.reference().unwrap();
        let values = reference.tensor("input_values").unwrap();
        let samples = values.shape()[1];
        let row: Vec<f32> = values.to_f32_vec()[..samples].to_vec();
        let short = samples * 3 / 4;
        // Row 1 is the start of row 0 followed by zeros, marked as padding or not.
        let mut v = row.clone();
        v.extend(row[..short].iter().copied());
        v.extend(std::iter::repeat_n(0.0, samples - short));
        let run = |masked: bool| {
            let mut m = TensorMap::new();
            m.insert(
                "input_values".into(),
                HostTensor::from_f32(vec![2, samples], &v).unwrap(),
            );
            if masked {
                let mut mask = vec![1i64; samples + short];
                mask.extend(std::iter::repeat_n(0, samples - short));
                m.insert(
                    "attention_mask".into(),
                    HostTensor::from_i64(vec![2, samples], &mask).unwrap(),
                );
            }
            let out = r.run(&m).unwrap();
            // The CTC logits, or the hidden states of a checkpoint without a CTC head.
            out.get("logits")
                .unwrap_or(&out["last_hidden_state"])
                .to_f32_vec()
        };
        let (masked, open) = (run(true), run(false));
        let half = masked.len() / 2;
        let max_diff = |x: &[f32], y: &[f32]| {
            x.iter()
                .zip(y)
                .map(|(p, q)| (p - q).abs())
                .fold(0f32, f32::max)
        };
        // Row 0 has no padding: the mask of row 1 does not touch it. Row 1 changes with its mask.
        assert!(max_diff(&masked[..half], &open[..half]) < 1e-5);
        assert!(max_diff(&masked[half..], &open[half..]) > 1e-3);
    }
}

#[test]
fn bad_inputs_are_errors() {
    for f in family_fixtures("bad_inputs_are_errors", "wav2vec2") {
        let r = runner(&f.dir);
        let run = |m: TensorMap| r.run(&m);
        let one = |name: &str, t: HostTensor| {
            let mut m = TensorMap::new();
            m.insert(name.into(), t);
            m
        };
        // Missing, too short for one frame, NaN, mis-shaped mask, fully padded row.
        assert!(run(TensorMap::new()).is_err());
        assert!(run(one(
            "input_values",
            HostTensor::from_f32(vec![1, 3], &[0.0; 3]).unwrap()
        ))
        .is_err());
        let mut nan = vec![0.1f32; 1600];
        nan[7] = f32::NAN;
        assert!(run(one(
            "input_values",
            HostTensor::from_f32(vec![1, 1600], &nan).unwrap()
        ))
        .is_err());
        let mut m = one(
            "input_values",
            HostTensor::from_f32(vec![1, 1600], &[0.1; 1600]).unwrap(),
        );
        m.insert(
            "attention_mask".into(),
            HostTensor::from_i64(vec![1, 3], &[1, 1, 1]).unwrap(),
        );
        assert!(run(m).is_err());
        let mut m = one(
            "input_values",
            HostTensor::from_f32(vec![1, 1600], &[0.1; 1600]).unwrap(),
        );
        m.insert(
            "attention_mask".into(),
            HostTensor::from_i64(vec![1, 1600], &[0; 1600]).unwrap(),
        );
        assert!(run(m).is_err());
        assert!(r.transcribe(&[], 16_000).is_err());
        assert!(r.transcribe_with(&[0.1; 1600], 8_000, false).is_err());
    }
}

#[test]
fn transcribes_with_a_vocabulary() {
    for f in family_fixtures("transcribes_with_a_vocabulary", "wav2vec2") {
        let dir = &f.dir;
        if !f.meta().unwrap().outputs.iter().any(|o| o == "ctc_argmax") {
            continue; // no CTC head to transcribe with
        }
        let tmp = tempfile::tempdir().unwrap();
        for name in ["config.json", "model.safetensors"] {
            std::fs::copy(dir.join(name), tmp.path().join(name)).unwrap();
        }
        let config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap())
                .unwrap();
        let vocab_size = config["vocab_size"].as_u64().unwrap() as usize;
        // <pad>, <s>, </s>, <unk>, |, then letters.
        let mut vocab = serde_json::Map::new();
        for (i, t) in ["<pad>", "<s>", "</s>", "<unk>", "|"].iter().enumerate() {
            vocab.insert((*t).into(), i.into());
        }
        for i in 5..vocab_size {
            vocab.insert(
                char::from(b'A' + (i - 5) as u8 % 26).to_string() + &"'".repeat((i - 5) / 26),
                i.into(),
            );
        }
        std::fs::write(
            tmp.path().join("vocab.json"),
            serde_json::to_string(&vocab).unwrap(),
        )
        .unwrap();
        let r = runner(tmp.path());
        let samples: Vec<f32> = (0..3200)
            .map(|i| (i as f32 * 0.05).sin() * 0.3 + (i as f32 * 0.0131).cos() * 0.1)
            .collect();
        let t = r.transcribe(&samples, 16_000).unwrap();
        assert_eq!(t.ids, ctc_collapse(&t.frame_ids, 0));
        // The text is the collapsed path spelled through the vocabulary.
        let spelled: String = t
            .ids
            .iter()
            .map(|&id| {
                let tok = vocab
                    .iter()
                    .find(|(_, v)| v.as_i64() == Some(id))
                    .unwrap()
                    .0;
                if tok == "|" {
                    " ".to_string()
                } else {
                    tok.clone()
                }
            })
            .collect();
        assert_eq!(t.text.as_deref(), Some(spelled.trim()));
        // The ModelRunner path sees the same frames once the samples are normalised as the extractor does.
        let norm = r.feature_extractor().extract(&[&samples], 16_000).unwrap();
        let mut m = TensorMap::new();
        m.insert(
            "input_values".into(),
            HostTensor::from_f32(vec![1, norm.len], &norm.values).unwrap(),
        );
        let out = r.run(&m).unwrap();
        assert_eq!(out["ctc_argmax"].to_i64_vec().unwrap(), t.frame_ids);
        // 8 kHz audio is resampled on the way in.
        let resampled = r.transcribe(&samples[..1600], 8_000).unwrap();
        // Another executor of the spec (here its f64 reference; on cuda the cuBLAS encoder)
        // recognises the same frames, labels and text through `Wav2Vec2OnRunner`.
        let config =
            ipfs_accelerate_wav2vec2::Wav2Vec2Config::from_file(&tmp.path().join("config.json"))
                .unwrap();
        let weights = ipfs_accelerate_io::open_weights(tmp.path()).unwrap();
        let spec = ipfs_accelerate_wav2vec2::encoder_spec(&config, weights.as_ref()).unwrap();
        let on_spec = ipfs_accelerate_wav2vec2::Wav2Vec2OnRunner::from_dir(
            tmp.path(),
            Box::new(ipfs_accelerate_conformance::SpecReference::new(spec).unwrap()),
        )
        .unwrap();
        assert_eq!(on_spec.transcribe_with(&samples, 16_000, true).unwrap(), t);
        assert_eq!(
            on_spec
                .transcribe_with(&samples[..1600], 8_000, true)
                .unwrap(),
            resampled
        );
        // Another rate without resampling, and empty audio, are errors on both paths.
        assert!(on_spec.transcribe_with(&samples, 8_000, false).is_err());
        assert!(r.transcribe_with(&samples, 8_000, false).is_err());
        assert!(on_spec.transcribe_with(&[], 16_000, true).is_err());
    }
}

/// The backend-neutral spec (what the GPU engine executes) run by its f64 reference, with the CTC
/// argmax other executors add (`CtcArgmax`): the hidden states and CTC logits of each fixture
/// within HF's tolerance, and HF's `ctc_argmax` exactly. The burn model's weights are never
/// loaded here.
#[test]
fn encoder_spec_matches_hf_reference() {
    use ipfs_accelerate_core::JsonConfig;
    for f in fixtures("encoder_spec_matches_hf_reference") {
        let config =
            ipfs_accelerate_wav2vec2::Wav2Vec2Config::from_file(&f.dir.join("config.json"))
                .unwrap();
        let weights = ipfs_accelerate_io::open_weights(&f.dir).unwrap();
        let spec = ipfs_accelerate_wav2vec2::encoder_spec(&config, weights.as_ref()).unwrap();
        let engine = ipfs_accelerate_wav2vec2::CtcArgmax(Box::new(
            ipfs_accelerate_conformance::SpecReference::new(spec).unwrap(),
        ));
        let checks = verify_runner(&f, BackendKind::Cpu, &engine).unwrap();
        println!("{checks:?}");
        assert!(
            checks.iter().any(|c| c.output == "last_hidden_state"),
            "{}: {checks:?}",
            f.variant
        );
        assert_checks(&checks);
    }
}
