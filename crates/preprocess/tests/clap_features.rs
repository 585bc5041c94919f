//! HF's `ClapFeatureExtractor` (transformers 5.23, `truncation="rand_trunc"`) on synthetic
//! waveforms: `tests/data/clap_features.safetensors` holds a 3000-sample and a 9500-sample
//! waveform (16 kHz, sines + chirp + noise) and HF's features for a window of 8000 samples, 32
//! Slaney mels over 50–8000 Hz, FFT 512, hop 160: the short one padded with `repeatpad`,
//! `repeat` and `pad`, the long one cropped at offset 1234 (HF's `np.random.randint` replaced
//! by that constant). Target: max |Δ| ≤ 1e-4 dB (float32 rounding reaches ~4e-6).

use std::path::Path;

use ipfs_accelerate_core::TensorSource;
use ipfs_accelerate_io::SafeTensorsFile;
use ipfs_accelerate_preprocess::audio::{ClapFeatureConfig, ClapFeatureExtractor, ClapPadding};

const CONFIG: &str = r#"{"feature_size": 32, "sampling_rate": 16000, "hop_length": 160,
    "max_length_s": 0.5, "fft_window_size": 512, "frequency_min": 50, "frequency_max": 8000,
    "truncation": "rand_trunc", "padding": "repeatpad", "top_db": null}"#;

fn max_abs(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
    got.iter()
        .zip(want)
        .map(|(a, b)| f64::from((a - b).abs()))
        .fold(0.0, f64::max)
}

#[test]
fn clap_features_match_hf_reference() {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/clap_features.safetensors");
    let reference = SafeTensorsFile::open(&data).unwrap();
    let get = |name: &str| reference.tensor(name).unwrap();
    let short = get("short").to_f32_vec();
    let long = get("long").to_f32_vec();
    let config = ClapFeatureConfig::from_json(CONFIG, "test config").unwrap();
    let mut worst = 0.0f64;
    for (padding, name) in [
        (ClapPadding::Repeatpad, "short_repeatpad"),
        (ClapPadding::Repeat, "short_repeat"),
        (ClapPadding::Pad, "short_pad"),
    ] {
        let fe = ClapFeatureExtractor::new(ClapFeatureConfig {
            padding,
            ..config.clone()
        })
        .unwrap();
        let got = fe.extract(&short, 16_000).unwrap();
        let want = get(name);
        assert_eq!(want.shape(), &[got.frames, got.mels], "{name}");
        assert!(!got.is_longer);
        let err = max_abs(&got.data, &want.to_f32_vec());
        println!("{name}: max |Δ| {err:.3e} dB");
        worst = worst.max(err);
    }
    let fe = ClapFeatureExtractor::new(config).unwrap();
    let got = fe.extract_cropped(&long, 16_000, 1234).unwrap();
    assert!(got.is_longer);
    let err = max_abs(&got.data, &get("long_offset_1234").to_f32_vec());
    println!("long cropped at 1234: max |Δ| {err:.3e} dB");
    worst = worst.max(err);
    assert!(worst <= 1e-4, "max |Δ| {worst} dB");
}
