//! ViT against the HF reference fixtures (`fixtures/vit/*`): every output within the tolerance of
//! its meta.json on the CPU backend; bad input and bad checkpoints are typed errors.

use ipfs_accelerate_core::JsonConfig;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use burn_flex::Flex;
use ipfs_accelerate_core::{
    BackendKind, Error, Family, HostTensor, ModelRunner, Result, TensorMap, TensorSource,
};
use ipfs_accelerate_io::SafeTensorsFile;
use ipfs_accelerate_vit::{VitConfig, VitFamily, VitRunner, VitTasks};

fn variants(test: &str) -> Vec<PathBuf> {
    let shared = std::env::var_os("IPFS_ACCELERATE_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../../shared"));
    let root = shared.join("fixtures/vit");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    dirs.retain(|d| d.join("meta.json").is_file());
    dirs.sort();
    if dirs.is_empty() {
        if std::env::var("IPFS_ACCELERATE_REQUIRE_SHARED").as_deref() == Ok("1") {
            panic!("{test}: no fixtures under {}", root.display());
        }
        eprintln!(
            "skipped {test}: needs fixtures under {} (set IPFS_ACCELERATE_SHARED)",
            root.display()
        );
    }
    dirs
}

fn meta(dir: &std::path::Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("meta.json")).unwrap()).unwrap()
}

fn inputs(dir: &std::path::Path) -> TensorMap {
    let reference = SafeTensorsFile::open(dir.join("reference.safetensors")).unwrap();
    meta(dir)["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            let n = n.as_str().unwrap();
            (n.to_string(), reference.tensor(n).unwrap())
        })
        .collect()
}

fn load(dir: &std::path::Path) -> Box<dyn ModelRunner> {
    VitFamily::load::<Flex>(dir, &Default::default(), BackendKind::Cpu).unwrap()
}

#[test]
fn outputs_match_hf_within_tolerance() {
    for dir in variants("outputs_match_hf_within_tolerance") {
        let meta = meta(&dir);
        let reference = SafeTensorsFile::open(dir.join("reference.safetensors")).unwrap();
        let out = load(&dir).run(&inputs(&dir)).unwrap();
        for name in meta["outputs"].as_array().unwrap() {
            let name = name.as_str().unwrap();
            let want = reference.tensor(name).unwrap().to_f64_vec();
            let got = out.get(name).unwrap_or_else(|| panic!("{name} missing"));
            assert_eq!(got.shape(), reference.tensor(name).unwrap().shape());
            let (num, den) = got
                .to_f64_vec()
                .iter()
                .zip(&want)
                .fold((0.0, 0.0), |(n, d), (a, b)| {
                    (n + (a - b) * (a - b), d + b * b)
                });
            let rel = (num / den).sqrt();
            let tol = meta["tolerance"][name].as_f64().unwrap_or(1e-4);
            println!(
                "{}: {name} rel error {rel:.3e} (tolerance {tol:.0e})",
                dir.display()
            );
            assert!(rel <= tol, "{name}: {rel} > {tol}");
        }
    }
}

#[test]
fn classify_ranks_labels_by_probability() {
    for dir in variants("classify_ranks_labels_by_probability") {
        let config = VitConfig::from_file(&dir.join("config.json")).unwrap();
        if config.head() != ipfs_accelerate_vit::VitHead::ImageClassification {
            continue;
        }
        let runner =
            VitRunner::<Flex>::load_dir(&dir, &Default::default(), BackendKind::Cpu).unwrap();
        let pixels = inputs(&dir)["pixel_values"].clone();
        let top = runner.classify(&pixels, 3).unwrap();
        assert_eq!(top.len(), pixels.shape()[0]);
        for row in &top {
            assert_eq!(row.len(), 3.min(config.num_labels()));
            assert!(row.windows(2).all(|w| w[0].score >= w[1].score));
            assert_eq!(row[0].label, config.label(row[0].index));
        }
        let all = runner.classify(&pixels, usize::MAX).unwrap();
        let total: f32 = all[0].iter().map(|p| p.score).sum();
        assert!((total - 1.0).abs() < 1e-5);
    }
}

#[test]
fn other_image_sizes_interpolate_position_embeddings() {
    for dir in variants("other_image_sizes_interpolate_position_embeddings") {
        let runner = load(&dir);
        let patch = VitConfig::from_file(&dir.join("config.json"))
            .unwrap()
            .patch();
        let (h, w) = (patch * 3, patch * 5);
        let px = HostTensor::from_f32(vec![1, 3, h, w], &vec![0.25; 3 * h * w]).unwrap();
        let out = runner
            .run(&TensorMap::from([("pixel_values".to_string(), px)]))
            .unwrap();
        if let Some(t) = out.get("last_hidden_state") {
            assert_eq!(t.shape()[1], 1 + 15);
        }
    }
}

#[test]
fn bad_pixel_values_are_typed_errors() {
    for dir in variants("bad_pixel_values_are_typed_errors") {
        let runner = load(&dir);
        let run = |t: HostTensor| runner.run(&TensorMap::from([("pixel_values".to_string(), t)]));
        for bad in [
            HostTensor::from_f32(vec![1, 2, 32, 32], &vec![0.0; 2 * 32 * 32]).unwrap(),
            HostTensor::from_f32(vec![3, 32, 32], &vec![0.0; 3 * 32 * 32]).unwrap(),
            HostTensor::from_f32(vec![0, 3, 32, 32], &[]).unwrap(),
            HostTensor::from_f32(vec![1, 3, 2, 2], &[0.0; 12]).unwrap(),
            HostTensor::from_f32(vec![1, 3, 1, 1], &[f32::NAN, 0.0, 0.0]).unwrap(),
            HostTensor::from_i64(vec![1, 3, 1, 1], &[1, 2, 3]).unwrap(),
        ] {
            let shape = bad.shape().to_vec();
            assert!(matches!(run(bad), Err(Error::InvalidInput(_))), "{shape:?}");
        }
        assert!(matches!(
            runner.run(&TensorMap::new()),
            Err(Error::InvalidInput(_))
        ));
    }
}

/// The fixture's weights with one tensor hidden or replaced.
struct Edited {
    inner: SafeTensorsFile,
    hide: String,
    replace: BTreeMap<String, HostTensor>,
}

impl TensorSource for Edited {
    fn source_name(&self) -> String {
        "edited".into()
    }
    fn contains(&self, name: &str) -> bool {
        name != self.hide && (self.replace.contains_key(name) || self.inner.contains(name))
    }
    fn shape_of(&self, name: &str) -> Option<Vec<usize>> {
        self.tensor(name).ok().map(|t| t.shape().to_vec())
    }
    fn tensor(&self, name: &str) -> Result<HostTensor> {
        if name == self.hide {
            return Err(Error::MissingTensor {
                name: name.into(),
                source_name: self.source_name(),
            });
        }
        match self.replace.get(name) {
            Some(t) => Ok(t.clone()),
            None => self.inner.tensor(name),
        }
    }
    fn names(&self) -> Vec<String> {
        self.inner
            .names()
            .into_iter()
            .filter(|n| *n != self.hide)
            .collect()
    }
}

#[test]
fn broken_checkpoints_are_typed_errors() {
    for dir in variants("broken_checkpoints_are_typed_errors") {
        let config = VitConfig::from_file(&dir.join("config.json")).unwrap();
        let open = || SafeTensorsFile::open(dir.join("model.safetensors")).unwrap();
        let layer_weight = open()
            .names()
            .into_iter()
            .find(|n| n.ends_with("layernorm_before.weight"))
            .unwrap();
        let missing = Edited {
            inner: open(),
            hide: layer_weight.clone(),
            replace: BTreeMap::new(),
        };
        let e = VitRunner::<Flex>::load(
            Arc::new(missing),
            &config,
            &Default::default(),
            BackendKind::Cpu,
        );
        assert!(
            matches!(e, Err(Error::MissingTensor { .. })),
            "{:?}",
            e.err()
        );
        let wrong = Edited {
            inner: open(),
            hide: String::new(),
            replace: BTreeMap::from([(
                layer_weight,
                HostTensor::from_f32(vec![1], &[1.0]).unwrap(),
            )]),
        };
        let e = VitRunner::<Flex>::load(
            Arc::new(wrong),
            &config,
            &Default::default(),
            BackendKind::Cpu,
        );
        assert!(
            matches!(e, Err(Error::ShapeMismatch { .. })),
            "{:?}",
            e.err()
        );
    }
}

#[test]
fn invalid_configs_are_typed_errors() {
    let origin = std::path::Path::new("config.json");
    for bad in [
        r#"{"hidden_size": 30, "num_attention_heads": 4}"#,
        r#"{"patch_size": 0}"#,
        r#"{"patch_size": [8, 4]}"#,
        r#"{"image_size": 4, "patch_size": 8}"#,
        r#"{"hidden_act": "nope"}"#,
        r#"{"hidden_size": "big"}"#,
    ] {
        assert!(
            matches!(
                VitConfig::from_json(bad, origin),
                Err(Error::InvalidConfig { .. })
            ),
            "{bad}"
        );
    }
}
