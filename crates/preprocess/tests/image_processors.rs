//! HF image processors (torchvision backend, transformers 5.23) on the shared fixture
//! `fixtures/image_processors`: pixel values within mean |Δ| ≤ 1e-2 and max |Δ| ≤ 0.1 after
//! normalisation, masks and image sizes exactly equal.

use ipfs_accelerate_core::{HostTensor, TensorSource};
use ipfs_accelerate_io::SafeTensorsFile;
use ipfs_accelerate_preprocess::image::{load_image, ImageProcessor, ProcessorKind};

fn compare_floats(name: &str, got: &HostTensor, want: &HostTensor) -> (f64, f64) {
    assert_eq!(got.shape(), want.shape(), "{name}: shape");
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    let diffs: Vec<f64> = g.iter().zip(&w).map(|(a, b)| (a - b).abs()).collect();
    let mean = diffs.iter().sum::<f64>() / diffs.len() as f64;
    let max = diffs.iter().cloned().fold(0.0, f64::max);
    println!("{name}: mean |Δ| {mean:.3e}, max |Δ| {max:.3e}");
    assert!(mean <= 1e-2 && max <= 0.1, "{name}: mean {mean}, max {max}");
    (mean, max)
}

#[test]
fn processors_match_hf_reference() {
    let Some(shared) = ipfs_accelerate_conformance::shared_dir("processors_match_hf_reference")
    else {
        return;
    };
    let dir = shared.join("fixtures/image_processors");
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("meta.json")).unwrap()).unwrap();
    let image = load_image(dir.join(meta["image"].as_str().unwrap())).unwrap();
    let reference = SafeTensorsFile::open(dir.join("reference.safetensors")).unwrap();
    let processors = meta["processors"].as_object().unwrap();
    assert!(!processors.is_empty());
    for (name, class) in processors {
        let processor =
            ImageProcessor::from_file(dir.join(name).join("preprocessor_config.json")).unwrap();
        assert_eq!(
            processor.config().kind,
            ProcessorKind::from_type_name(class.as_str().unwrap())
        );
        let out = processor.preprocess(std::slice::from_ref(&image)).unwrap();
        let tensors = out.into_tensor_map();
        let mut compared = 0;
        for key in reference.names() {
            let Some(output) = key.strip_prefix(&format!("{name}.")) else {
                continue;
            };
            let want = reference.tensor(&key).unwrap();
            let got = tensors
                .get(output)
                .unwrap_or_else(|| panic!("{key} not produced"));
            if want.dtype().is_float() {
                compare_floats(&key, got, &want);
            } else {
                assert_eq!(got.shape(), want.shape(), "{key}: shape");
                assert_eq!(
                    got.to_i64_vec().unwrap(),
                    want.to_i64_vec().unwrap(),
                    "{key}"
                );
            }
            compared += 1;
        }
        assert!(compared > 0, "no reference tensors for {name}");
    }
}
