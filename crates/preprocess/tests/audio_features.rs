//! HF's `WhisperFeatureExtractor` (transformers 5.23) on the shared fixture
//! `fixtures/whisper/feature_extractor`: the log-mel of its waveform within 1e-4 max |Δ|.

use ipfs_accelerate_core::TensorSource;
use ipfs_accelerate_io::SafeTensorsFile;
use ipfs_accelerate_preprocess::audio::{WhisperFeatureConfig, WhisperFeatureExtractor};

#[test]
fn whisper_log_mel_matches_hf_reference() {
    let Some(shared) =
        ipfs_accelerate_conformance::shared_dir("whisper_log_mel_matches_hf_reference")
    else {
        return;
    };
    let dir = shared.join("fixtures/whisper/feature_extractor");
    let config = WhisperFeatureConfig::from_file(&dir.join("preprocessor_config.json")).unwrap();
    let fe = WhisperFeatureExtractor::new(config.clone()).unwrap();
    let reference = SafeTensorsFile::open(dir.join("reference.safetensors")).unwrap();
    let waveform = reference.tensor("waveform").unwrap().to_f32_vec();
    let want = reference.tensor("input_features").unwrap();

    let got = fe.extract(&waveform, config.sampling_rate).unwrap();
    assert_eq!(
        want.shape(),
        &[1, got.mels, got.frames],
        "shape of input_features"
    );
    let want = want.to_f64_vec();
    let max = got
        .data
        .iter()
        .zip(&want)
        .map(|(a, b)| (f64::from(*a) - b).abs())
        .fold(0.0, f64::max);
    println!(
        "whisper log-mel [{}, {}]: max |Δ| {max:.3e}",
        got.mels, got.frames
    );
    assert!(max <= 1e-4, "max |Δ| {max}");
}
