//! ViT against the HF reference fixtures (`fixtures/vit/*` of the shared set, plus the
//! `vit/<variant>/` folders under the roots of `$IPFS_ACCELERATE_EXTRA_FIXTURES`): every output
//! within the tolerance of its meta.json on the CPU backend; bad input and bad checkpoints are
//! typed errors.

use ipfs_accelerate_core::JsonConfig;
use std::collections::BTreeMap;
use std::sync::Arc;

use burn_flex::Flex;
use ipfs_accelerate_conformance::{assert_checks, family_fixtures, verify_runner, Fixture};
use ipfs_accelerate_core::{
    BackendKind, Error, Family, HostTensor, ModelRunner, Result, TensorMap, TensorSource,
};
use ipfs_accelerate_io::SafeTensorsFile;
use ipfs_accelerate_vit::{VitConfig, VitFamily, VitRunner, VitTasks};

/// Every ViT fixture; none is a failure under `IPFS_ACCELERATE_REQUIRE_SHARED=1`.
fn variants(test: &str) -> Vec<Fixture> {
    let fixtures = family_fixtures(test, "vit");
    let required = std::env::var("IPFS_ACCELERATE_REQUIRE_SHARED").as_deref() == Ok("1");
    assert!(
        !(required && fixtures.is_empty()),
        "{test}: no vit fixtures"
    );
    fixtures
}

fn load(f: &Fixture) -> Box<dyn ModelRunner> {
    VitFamily::load::<Flex>(&f.dir, &Default::default(), BackendKind::Cpu).unwrap()
}

#[test]
fn outputs_match_hf_within_tolerance() {
    for f in variants("outputs_match_hf_within_tolerance") {
        let checks = verify_runner(&f, BackendKind::Cpu, load(&f).as_ref()).unwrap();
        println!("{checks:?}");
        assert_checks(&checks);
    }
}

#[test]
fn classify_ranks_labels_by_probability() {
    for f in variants("classify_ranks_labels_by_probability") {
        let config = VitConfig::from_file(&f.dir.join("config.json")).unwrap();
        if config.head() != ipfs_accelerate_vit::VitHead::ImageClassification {
            continue;
        }
        let runner =
            VitRunner::<Flex>::load_dir(&f.dir, &Default::default(), BackendKind::Cpu).unwrap();
        let pixels = f.inputs().unwrap()["pixel_values"].clone();
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
    for f in variants("other_image_sizes_interpolate_position_embeddings") {
        let runner = load(&f);
        let patch = VitConfig::from_file(&f.dir.join("config.json"))
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
    for f in variants("bad_pixel_values_are_typed_errors") {
        let runner = load(&f);
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
    for f in variants("broken_checkpoints_are_typed_errors") {
        let config = VitConfig::from_file(&f.dir.join("config.json")).unwrap();
        let open = || SafeTensorsFile::open(f.dir.join("model.safetensors")).unwrap();
        let load = |source: Edited| {
            VitRunner::<Flex>::load(
                Arc::new(source),
                &config,
                &Default::default(),
                BackendKind::Cpu,
            )
            .err()
        };
        let layer_weight = open()
            .names()
            .into_iter()
            .find(|n| n.ends_with("layernorm_before.weight"))
            .unwrap();
        let e = load(Edited {
            inner: open(),
            hide: layer_weight.clone(),
            replace: BTreeMap::new(),
        });
        assert!(matches!(e, Some(Error::MissingTensor { .. })), "{e:?}");
        let e = load(Edited {
            inner: open(),
            hide: String::new(),
            replace: BTreeMap::from([(
                layer_weight,
                HostTensor::from_f32(vec![1], &[1.0]).unwrap(),
            )]),
        });
        assert!(matches!(e, Some(Error::ShapeMismatch { .. })), "{e:?}");
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
