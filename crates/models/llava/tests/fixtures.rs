//! LLaVA / LLaVA-NeXT against the HF reference fixtures (`fixtures/{llava,llava_next}/*`, plus any
//! roots in `$IPFS_ACCELERATE_EXTRA_FIXTURES`) on the CPU backend; KV-cache decoding against full
//! recompute; image-token expansion against the reference prompts; both weight layouts; bad input
//! and bad configs as typed errors.

use std::ops::ControlFlow;
use std::path::Path;
use std::sync::Arc;

use burn_flex::Flex;
use ipfs_accelerate_conformance::{assert_checks, family_fixtures, verify_runner, Fixture};
use ipfs_accelerate_core::{
    BackendKind, Error, Family, HostTensor, JsonConfig, ModelRunner, Result, TensorMap,
    TensorSource,
};
use ipfs_accelerate_llama::DecodeMode;
use ipfs_accelerate_llava::{
    LlavaConfig, LlavaFamily, LlavaNextFamily, LlavaRunner, LlavaVariant, LlavaWeights,
};
use ipfs_accelerate_nn::generate::GenerationConfig;

const FAMILIES: [(&str, LlavaVariant); 2] = [
    ("llava", LlavaVariant::Llava),
    ("llava_next", LlavaVariant::LlavaNext),
];

fn each_fixture(test: &str, mut f: impl FnMut(&Fixture, LlavaVariant)) -> usize {
    let mut n = 0;
    for (family, variant) in FAMILIES {
        for fixture in family_fixtures(test, family) {
            f(&fixture, variant);
            n += 1;
        }
    }
    n
}

fn runner(f: &Fixture, variant: LlavaVariant) -> LlavaRunner<Flex> {
    LlavaRunner::load_dir(&f.dir, variant, &Default::default(), BackendKind::Cpu).unwrap()
}

/// The number of greedy steps of a fixture (from meta.json, else the reference's shape).
fn steps(inputs: &TensorMap) -> usize {
    inputs
        .get("greedy_steps")
        .map(|t| t.to_i64_vec().unwrap()[0] as usize)
        .unwrap_or(6)
}

#[test]
fn outputs_match_hf_within_tolerance() {
    let n = each_fixture("outputs_match_hf_within_tolerance", |f, variant| {
        let device = Default::default();
        let model = match variant {
            LlavaVariant::Llava => LlavaFamily::load::<Flex>(&f.dir, &device, BackendKind::Cpu),
            LlavaVariant::LlavaNext => {
                LlavaNextFamily::load::<Flex>(&f.dir, &device, BackendKind::Cpu)
            }
        }
        .unwrap();
        let checks = verify_runner(f, BackendKind::Cpu, model.as_ref()).unwrap();
        eprintln!("{}/{}: {checks:?}", f.family, f.variant);
        assert_checks(&checks);
    });
    eprintln!("{n} llava / llava_next fixtures checked");
}

fn prompt_rows(inputs: &TensorMap) -> Vec<Vec<u32>> {
    let ids = &inputs["input_ids"];
    let seq = ids.shape()[1];
    ids.to_i64_vec()
        .unwrap()
        .chunks(seq)
        .map(|r| r.iter().map(|&t| t as u32).collect())
        .collect()
}

/// Image `i` of the fixture: its `pixel_values` (batch of one) and `image_sizes` row. The
/// fixtures hold one image per prompt row.
fn image(inputs: &TensorMap, i: usize) -> (HostTensor, Option<HostTensor>) {
    let p = &inputs["pixel_values"];
    let mut shape = p.shape().to_vec();
    let per: usize = shape[1..].iter().product();
    shape[0] = 1;
    let pixels = HostTensor::from_f32(shape, &p.to_f32_vec()[i * per..(i + 1) * per]).unwrap();
    let sizes = inputs.get("image_sizes").map(|s| {
        let v = s.to_i64_vec().unwrap();
        HostTensor::from_i64(vec![1, 2], &v[2 * i..2 * i + 2]).unwrap()
    });
    (pixels, sizes)
}

fn image_size(inputs: &TensorMap, i: usize) -> (usize, usize) {
    match inputs.get("image_sizes") {
        Some(s) => ipfs_accelerate_llava::read_image_sizes(s).unwrap()[i],
        None => {
            let p = inputs["pixel_values"].shape();
            (p[2], p[3])
        }
    }
}

#[test]
fn cache_decoding_equals_full_recompute_and_the_reference() {
    each_fixture("cache_decoding_equals_full_recompute", |f, variant| {
        let llava = runner(f, variant);
        let inputs = f.inputs().unwrap();
        let reference = f.reference().unwrap();
        let prompts = prompt_rows(&inputs);
        let n = steps(&inputs).max(12);
        let config = GenerationConfig {
            max_new_tokens: n,
            ..Default::default()
        };
        let run = |mode| {
            llava
                .generate_with(
                    Some(&inputs["pixel_values"]),
                    inputs.get("image_sizes"),
                    &prompts,
                    &config,
                    mode,
                    |_, _| ControlFlow::Continue(()),
                )
                .unwrap()
        };
        let cached = run(DecodeMode::Cached);
        let full = run(DecodeMode::Recompute);
        assert_eq!(cached, full, "{}: cache decode != recompute", f.family);
        // The task API (KV cache, one image and prompt at a time) reproduces HF's greedy tokens.
        let want = reference.tensor("greedy_tokens").unwrap();
        let k = want.shape()[1];
        let want = want.to_i64_vec().unwrap();
        assert_eq!(inputs["pixel_values"].shape()[0], prompts.len());
        for (row, prompt) in prompts.iter().enumerate() {
            let (pixels, sizes) = image(&inputs, row);
            let mut streamed = Vec::new();
            let got = llava
                .generate(
                    &pixels,
                    sizes.as_ref(),
                    prompt,
                    &GenerationConfig {
                        max_new_tokens: k,
                        ..Default::default()
                    },
                    |t| {
                        streamed.push(t);
                        ControlFlow::Continue(())
                    },
                )
                .unwrap();
            assert_eq!(got, streamed);
            let got: Vec<i64> = got.iter().map(|&t| i64::from(t)).collect();
            assert_eq!(got, want[row * k..(row + 1) * k], "{} row {row}", f.family);
        }
    });
}

#[test]
fn expansion_reproduces_the_reference_prompt() {
    each_fixture("expansion_reproduces_the_reference_prompt", |f, variant| {
        let llava = runner(f, variant);
        let inputs = f.inputs().unwrap();
        let image = llava.config().image_token_id as u32;
        for (row, full) in prompt_rows(&inputs).iter().enumerate() {
            // Collapse the run of image tokens back into one placeholder.
            let mut collapsed: Vec<u32> = Vec::new();
            for &t in full {
                if !(t == image && collapsed.last() == Some(&image)) {
                    collapsed.push(t);
                }
            }
            let size = image_size(&inputs, row);
            let expanded = llava.expand_image_tokens(&collapsed, &[size]).unwrap();
            assert_eq!(&expanded, full, "{} row {row}", f.family);
            if let Ok(count) = f.reference().unwrap().tensor("image_feature_count") {
                let want = count.to_i64_vec().unwrap()[row];
                assert_eq!(llava.image_token_count(size).unwrap() as i64, want);
            }
            // The placeholder count must match the image count.
            assert!(matches!(
                llava.expand_image_tokens(&collapsed, &[size, size]),
                Err(Error::InvalidInput(_))
            ));
        }
    });
}

#[test]
fn token_feature_mismatch_is_invalid_input() {
    each_fixture("token_feature_mismatch_is_invalid_input", |f, variant| {
        let llava = runner(f, variant);
        let inputs = f.inputs().unwrap();
        let image = llava.config().image_token_id;
        let ids = inputs["input_ids"].to_i64_vec().unwrap();
        let first = ids.iter().position(|&t| t == image).unwrap();
        // One image token fewer (replaced by a text token) and one more.
        let mut fewer = ids.clone();
        fewer[first] = (image + 1) % llava.config().text_config.vocab_size as i64;
        let mut more = ids.clone();
        let text_at = ids.iter().position(|&t| t != image).unwrap();
        more[text_at] = image;
        for bad in [fewer, more] {
            let mut map = inputs.clone();
            map.insert(
                "input_ids".into(),
                HostTensor::from_i64(inputs["input_ids"].shape().to_vec(), &bad).unwrap(),
            );
            let e = llava.run(&map);
            assert!(matches!(e, Err(Error::InvalidInput(_))), "{:?}", e.err());
            let e = llava.generate(
                &inputs["pixel_values"],
                inputs.get("image_sizes"),
                &bad.iter().map(|&t| t as u32).collect::<Vec<_>>(),
                &GenerationConfig::default(),
                |_| ControlFlow::Continue(()),
            );
            assert!(matches!(e, Err(Error::InvalidInput(_))), "{:?}", e.err());
        }
    });
}

#[test]
fn bad_inputs_are_typed_errors() {
    each_fixture("bad_inputs_are_typed_errors", |f, variant| {
        let llava = runner(f, variant);
        let inputs = f.inputs().unwrap();
        let vocab = llava.config().text_config.vocab_size as i64;
        let with = |name: &str, t: Option<HostTensor>| {
            let mut m = inputs.clone();
            match t {
                Some(t) => m.insert(name.to_string(), t),
                None => m.remove(name),
            };
            m
        };
        let pixels = &inputs["pixel_values"];
        let mut cases = vec![
            with("input_ids", None),
            with(
                "input_ids",
                Some(HostTensor::from_i64(vec![1, 1], &[vocab]).unwrap()),
            ),
            with(
                "input_ids",
                Some(HostTensor::from_i64(vec![1, 0], &[]).unwrap()),
            ),
            with(
                "attention_mask",
                Some(HostTensor::from_i64(vec![1, 1], &[1]).unwrap()),
            ),
            with(
                "greedy_steps",
                Some(HostTensor::from_i64(vec![1], &[-1]).unwrap()),
            ),
            // Views of the wrong size.
            with(
                "pixel_values",
                Some(pixels.reshape(swap_hw_shape(pixels)).unwrap()),
            ),
            with(
                "pixel_values",
                Some(HostTensor::from_f32(vec![1, 3], &[0.0; 3]).unwrap()),
            ),
        ];
        if variant == LlavaVariant::LlavaNext {
            cases.push(with("image_sizes", None));
            cases.push(with(
                "image_sizes",
                Some(HostTensor::from_i64(vec![1, 2], &[0, 5]).unwrap()),
            ));
            cases.push(with(
                "image_sizes",
                Some(HostTensor::from_i64(vec![1, 3], &[1, 2, 3]).unwrap()),
            ));
            cases.push(with(
                "image_sizes",
                Some(HostTensor::from_i64(vec![1, 2], &[1 << 40, 1 << 40]).unwrap()),
            ));
            // An image size whose grid needs more views than were given.
            let s = pixels.shape();
            let one_view = HostTensor::from_f32(
                vec![s[0], 1, s[2], s[3], s[4]],
                &pixels.to_f32_vec()[..s[2] * s[3] * s[4] * s[0]],
            )
            .unwrap();
            cases.push(with("pixel_values", Some(one_view)));
        }
        for (i, case) in cases.into_iter().enumerate() {
            let e = llava.run(&case);
            assert!(
                matches!(e, Err(Error::InvalidInput(_))),
                "{} case {i}: {:?}",
                f.family,
                e.map(|m| m.keys().cloned().collect::<Vec<_>>())
            );
        }
    });
}

/// A shape of the same element count whose views are not `size × size` (the last two dims
/// become `[h / 2, w * 2]`).
fn swap_hw_shape(t: &HostTensor) -> Vec<usize> {
    let mut s = t.shape().to_vec();
    let n = s.len();
    s[n - 2] /= 2;
    s[n - 1] *= 2;
    s
}

/// The fixture's weights renamed to another HF layout.
struct Renamed {
    inner: Arc<dyn TensorSource>,
    map: Vec<(String, String)>,
}

impl Renamed {
    fn new(inner: Arc<dyn TensorSource>, rename: impl Fn(&str) -> String) -> Self {
        let map = inner.names().into_iter().map(|n| (rename(&n), n)).collect();
        Renamed { inner, map }
    }

    fn stored(&self, name: &str) -> Option<&str> {
        self.map
            .iter()
            .find(|(new, _)| new == name)
            .map(|(_, old)| old.as_str())
    }
}

impl TensorSource for Renamed {
    fn source_name(&self) -> String {
        "renamed".into()
    }
    fn contains(&self, name: &str) -> bool {
        self.stored(name).is_some()
    }
    fn shape_of(&self, name: &str) -> Option<Vec<usize>> {
        self.inner.shape_of(self.stored(name)?)
    }
    fn tensor(&self, name: &str) -> Result<HostTensor> {
        match self.stored(name) {
            Some(n) => self.inner.tensor(n),
            None => Err(Error::MissingTensor {
                name: name.into(),
                source_name: "renamed".into(),
            }),
        }
    }
    fn names(&self) -> Vec<String> {
        self.map.iter().map(|(n, _)| n.clone()).collect()
    }
}

/// The layout transformers 5.x keeps in memory (`model.language_model.*`, `lm_head`, ...).
fn to_v5(name: &str) -> String {
    for (old, new) in [
        ("language_model.model.", "model.language_model."),
        ("language_model.lm_head.", "lm_head."),
        ("vision_tower.vision_model.", "model.vision_tower."),
        ("vision_tower.", "model.vision_tower."),
        ("multi_modal_projector.", "model.multi_modal_projector."),
        ("image_newline", "model.image_newline"),
    ] {
        if let Some(rest) = name.strip_prefix(old) {
            return format!("{new}{rest}");
        }
    }
    name.to_string()
}

/// The layout of the `llava-hf` checkpoints on the hub (`vision_tower.vision_model.*`).
fn to_hub(name: &str) -> String {
    let v5 = to_v5(name);
    for (new, old) in [
        ("model.language_model.", "language_model.model."),
        ("lm_head.", "language_model.lm_head."),
        ("model.vision_tower.", "vision_tower.vision_model."),
        ("model.multi_modal_projector.", "multi_modal_projector."),
        ("model.image_newline", "image_newline"),
    ] {
        if let Some(rest) = v5.strip_prefix(new) {
            return format!("{old}{rest}");
        }
    }
    v5
}

#[test]
fn every_weight_layout_gives_the_same_logits() {
    each_fixture("every_weight_layout_gives_the_same_logits", |f, variant| {
        let config = LlavaConfig::from_file_as(&f.dir.join("config.json"), variant).unwrap();
        let inputs = f.inputs().unwrap();
        let mut logits = Vec::new();
        for rename in [to_v5 as fn(&str) -> String, to_hub, |n: &str| n.to_string()] {
            let weights = Arc::new(Renamed::new(
                ipfs_accelerate_io::open_weights(&f.dir).unwrap(),
                rename,
            ));
            let r =
                LlavaRunner::<Flex>::load(weights, &config, &Default::default(), BackendKind::Cpu)
                    .unwrap();
            logits.push(r.run(&inputs).unwrap()["logits"].to_f32_vec());
        }
        assert_eq!(logits[0], logits[2]);
        assert_eq!(logits[1], logits[2]);
        // A missing tensor names what was looked for.
        let weights = ipfs_accelerate_io::open_weights(&f.dir).unwrap();
        let partial = Renamed::new(weights, |n| {
            if n.contains("linear_2.weight") {
                "gone".into()
            } else {
                n.to_string()
            }
        });
        let e = LlavaRunner::<Flex>::load(
            Arc::new(partial),
            &config,
            &Default::default(),
            BackendKind::Cpu,
        )
        .err()
        .unwrap();
        assert!(
            matches!(&e, Error::MissingTensor { name, .. } if name.contains("multi_modal_projector.linear_2.weight")),
            "{e}"
        );
        let weights = LlavaWeights::wrap(ipfs_accelerate_io::open_weights(&f.dir).unwrap());
        assert!(weights.candidates("image_newline").len() == 2);
    });
}

#[test]
fn invalid_configs_are_typed_errors() {
    let base = r#""text_config": {"vocab_size": 50, "hidden_size": 8, "intermediate_size": 16,
        "num_hidden_layers": 1, "num_attention_heads": 2},
        "vision_config": {"hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 2,
        "num_attention_heads": 2, "image_size": 16, "patch_size": 4}"#;
    let ok = format!(r#"{{"model_type": "llava_next", "image_token_index": 49, {base}}}"#);
    let origin = Path::new("config.json");
    let c = LlavaConfig::from_json(&ok, origin).unwrap();
    assert_eq!(c.variant, LlavaVariant::LlavaNext);
    assert_eq!(c.image_token_id, 49);
    assert_eq!(c.feature_layers(), vec![1]);
    for bad in [
        format!(r#"{{"model_type": "llava_next", "image_token_index": 50, {base}}}"#),
        format!(r#"{{"model_type": "vipllava", "image_token_index": 1, {base}}}"#),
        format!(r#"{{"image_token_index": 1, "vision_feature_layer": -4, {base}}}"#),
        format!(r#"{{"image_token_index": 1, "vision_feature_layer": [], {base}}}"#),
        format!(r#"{{"image_token_index": 1, "vision_feature_select_strategy": "cls", {base}}}"#),
        format!(
            r#"{{"model_type": "llava_next", "image_token_index": 1,
            "image_grid_pinpoints": [[16, 24]], {base}}}"#
        ),
        format!(
            r#"{{"model_type": "llava_next", "image_token_index": 1,
            "vision_feature_select_strategy": "full", {base}}}"#
        ),
        format!(r#"{{"image_token_index": 1, "projector_hidden_act": "nope", {base}}}"#),
        r#"{"text_config": {"model_type": "gemma"}}"#.to_string(),
        r#"{"text_config": {"model_type": "mistral"}}"#.to_string(),
        r#"{"vision_config": {"model_type": "siglip_vision_model"}}"#.to_string(),
        r#"{"text_config": 3}"#.to_string(),
        "[]".to_string(),
    ] {
        let e = LlavaConfig::from_json(&bad, origin);
        assert!(
            matches!(e, Err(Error::InvalidConfig { .. })),
            "{bad}: {:?}",
            e.map(|c| c.variant)
        );
    }
    // The variant a family asks for must match model_type.
    assert!(LlavaConfig::from_json_as(&ok, origin, LlavaVariant::Llava).is_err());
    // Mistral without a sliding window is a LLaMA decoder; defaults fill absent sizes.
    let mistral = r#"{"text_config": {"model_type": "mistral", "sliding_window": null,
        "vocab_size": 40000, "hidden_size": 64, "num_attention_heads": 16,
        "intermediate_size": 100, "num_hidden_layers": 1}}"#;
    let c = LlavaConfig::from_json(mistral, origin).unwrap();
    assert_eq!(c.text_config.kv_heads(), 8);
    assert_eq!(c.vision_config.image_size, 336);
    assert_eq!(c.image_token_id, 32000);
}

/// Stacks the fixture's first image twice (pixel_values and image_sizes).
fn two_copies(inputs: &TensorMap) -> (HostTensor, Option<HostTensor>) {
    let (p, s) = image(inputs, 0);
    let mut shape = p.shape().to_vec();
    shape[0] = 2;
    let v = p.to_f32_vec();
    let pixels = HostTensor::from_f32(shape, &[v.clone(), v].concat()).unwrap();
    let sizes = s.map(|s| {
        let v = s.to_i64_vec().unwrap();
        HostTensor::from_i64(vec![2, 2], &[v.clone(), v].concat()).unwrap()
    });
    (pixels, sizes)
}

#[test]
fn left_padded_batch_decodes_as_rows_alone() {
    each_fixture("left_padded_batch_decodes_as_rows_alone", |f, variant| {
        let llava = runner(f, variant);
        let inputs = f.inputs().unwrap();
        let full = prompt_rows(&inputs)[0].clone();
        let image_id = llava.config().image_token_id as u32;
        // A shorter second prompt: the text before the image dropped.
        let first = full.iter().position(|&t| t == image_id).unwrap();
        let short = full[first..].to_vec();
        assert!(short.len() < full.len());
        let prompts = vec![full, short];
        let (pixels, sizes) = two_copies(&inputs);
        let config = GenerationConfig {
            max_new_tokens: 8,
            ..Default::default()
        };
        let batched = llava
            .generate_with(
                Some(&pixels),
                sizes.as_ref(),
                &prompts,
                &config,
                DecodeMode::Cached,
                |_, _| ControlFlow::Continue(()),
            )
            .unwrap();
        let (one, one_size) = image(&inputs, 0);
        for (row, p) in prompts.iter().enumerate() {
            let alone = llava
                .generate(&one, one_size.as_ref(), p, &config, |_| {
                    ControlFlow::Continue(())
                })
                .unwrap();
            assert_eq!(batched[row], alone, "{} row {row}", f.family);
        }
    });
}

#[test]
fn hub_configs_resolve_as_hf() {
    // config.json of llava-hf/llava-1.5-7b-hf: the text sub-config leaves most sizes to
    // LlamaConfig's defaults.
    let vision = r#""vision_config": {"hidden_size": 1024, "image_size": 336,
        "intermediate_size": 4096, "model_type": "clip_vision_model", "num_attention_heads": 16,
        "num_hidden_layers": 24, "patch_size": 14, "projection_dim": 768, "vocab_size": 32000}"#;
    let v15 = format!(
        r#"{{"architectures": ["LlavaForConditionalGeneration"], "ignore_index": -100,
        "image_token_index": 32000, "model_type": "llava", "pad_token_id": 32001,
        "projector_hidden_act": "gelu", "text_config": {{"_name_or_path": "lmsys/vicuna-7b-v1.5",
        "architectures": ["LlamaForCausalLM"], "max_position_embeddings": 4096,
        "model_type": "llama", "rms_norm_eps": 1e-05, "torch_dtype": "float16",
        "vocab_size": 32064}}, "tie_word_embeddings": false, "torch_dtype": "float16",
        {vision}, "vision_feature_layer": -2, "vision_feature_select_strategy": "default",
        "vocab_size": 32064}}"#
    );
    let c = LlavaConfig::from_json_as(&v15, Path::new("v15"), LlavaVariant::Llava).unwrap();
    let t = &c.text_config;
    assert_eq!(
        (
            t.hidden_size,
            t.num_hidden_layers,
            t.intermediate_size,
            t.kv_heads()
        ),
        (4096, 32, 11008, 32)
    );
    assert_eq!(c.feature_layers(), vec![23]);
    assert_eq!(c.tokens_per_view(), 576);
    assert_eq!(t.eos_token_ids(), vec![2]);
    // llava-hf/llava-v1.6-mistral-7b-hf: a Mistral text model without a sliding window.
    let v16 = format!(
        r#"{{"architectures": ["LlavaNextForConditionalGeneration"],
        "image_grid_pinpoints": [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]],
        "image_token_index": 32000, "model_type": "llava_next", "projector_hidden_act": "gelu",
        "text_config": {{"architectures": ["MistralForCausalLM"], "intermediate_size": 14336,
        "max_position_embeddings": 32768, "model_type": "mistral", "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": null,
        "vocab_size": 32064}}, "tie_word_embeddings": false, "use_image_newline_parameter": true,
        {vision}, "vision_feature_layer": -2, "vision_feature_select_strategy": "default",
        "vocab_size": 32064}}"#
    );
    let c = LlavaConfig::from_json_as(&v16, Path::new("v16"), LlavaVariant::LlavaNext).unwrap();
    let t = &c.text_config;
    assert_eq!(
        (t.hidden_size, t.kv_heads(), t.intermediate_size),
        (4096, 8, 14336)
    );
    assert_eq!(t.max_position_embeddings(), 32768);
    assert!(!t.attention_biases().q && !t.mlp_biases());
    assert_eq!(c.image_grid_pinpoints.len(), 5);
}
