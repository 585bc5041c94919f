//! The user flow on the fixture checkpoints with a small word-level tokenizer, an image processor
//! config and LLaVA-1.5's chat template written beside them: chat prompt → tokens → `<image>`
//! expanded for the image → generation. And LLaVA-NeXT's image-token counts for the real
//! `llava-v1.6` geometry (336-pixel views, 14-pixel patches, the default pinpoints) against HF's
//! `LlavaNextProcessor._get_number_of_features`.

use std::ops::ControlFlow;
use std::path::Path;

use burn_flex::Flex;
use ipfs_accelerate_conformance::family_fixtures;
use ipfs_accelerate_core::{BackendKind, Error, JsonConfig};
use ipfs_accelerate_llava::{
    AnyresLayout, LlavaConfig, LlavaProcessor, LlavaRunner, LlavaTasks, LlavaVariant,
};
use ipfs_accelerate_nn::generate::GenerationConfig;
use ipfs_accelerate_preprocess::image::RgbImage;
use serde_json::json;

const LLAVA_15_TEMPLATE: &str = "{% for message in messages %}{% if message['role'] != 'system' %}{{ message['role'].upper() + ': '}}{% endif %}{# Render all images first #}{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}{% endfor %}{# Render all text next #}{% if message['role'] != 'assistant' %}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] + ' '}}{% endfor %}{% else %}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{% generation %}{{ content['text'] + ' '}}{% endgeneration %}{% endfor %}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}";

/// Copies a fixture checkpoint and adds the processor files.
fn model_dir(fixture: &Path, config: &LlavaConfig) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for f in ["config.json", "model.safetensors", "generation_config.json"] {
        if fixture.join(f).is_file() {
            std::fs::copy(fixture.join(f), dir.path().join(f)).unwrap();
        }
    }
    let image = config.image_token_id;
    let words = ["USER", ":", "ASSISTANT", "what", "is", "this", "?"];
    let mut vocab = serde_json::Map::new();
    vocab.insert("<unk>".into(), json!(0));
    vocab.insert("<s>".into(), json!(1));
    vocab.insert("<image>".into(), json!(image));
    for (i, w) in words.iter().enumerate() {
        vocab.insert(w.to_string(), json!(3 + i));
    }
    let special = |id: i64, content: &str| {
        json!({"id": id, "content": content, "single_word": false, "lstrip": false,
               "rstrip": false, "normalized": false, "special": true})
    };
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [special(1, "<s>"), special(image, "<image>")],
        "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}
    });
    let size = config.vision_config.image_size;
    let mut pre = json!({
        "image_processor_type": "CLIPImageProcessor",
        "size": {"shortest_edge": size},
        "crop_size": {"height": size, "width": size},
        "do_center_crop": true, "resample": 3
    });
    if config.variant == LlavaVariant::LlavaNext {
        pre["image_processor_type"] = json!("LlavaNextImageProcessor");
        pre["image_grid_pinpoints"] = json!(config
            .image_grid_pinpoints
            .iter()
            .map(|&(h, w)| [h, w])
            .collect::<Vec<_>>());
    }
    let write = |name: &str, v: serde_json::Value| {
        std::fs::write(dir.path().join(name), v.to_string()).unwrap();
    };
    write("tokenizer.json", tokenizer);
    write("preprocessor_config.json", pre);
    write(
        "chat_template.json",
        json!({ "chat_template": LLAVA_15_TEMPLATE }),
    );
    write(
        "tokenizer_config.json",
        json!({"bos_token": "<s>", "eos_token": "</s>"}),
    );
    dir
}

fn picture(width: usize, height: usize) -> RgbImage {
    let data = (0..width * height * 3)
        .map(|i| ((i * 37 + i / 7) % 251) as u8)
        .collect();
    RgbImage::new(width, height, data).unwrap()
}

#[test]
fn describe_an_image_from_a_model_folder() {
    for (family, variant) in [
        ("llava", LlavaVariant::Llava),
        ("llava_next", LlavaVariant::LlavaNext),
    ] {
        for f in family_fixtures("describe_an_image_from_a_model_folder", family) {
            let config = LlavaConfig::from_file_as(&f.dir.join("config.json"), variant).unwrap();
            let dir = model_dir(&f.dir, &config);
            let model = LlavaRunner::<Flex>::load_dir(
                dir.path(),
                variant,
                &Default::default(),
                BackendKind::Cpu,
            )
            .unwrap();
            let processor = LlavaProcessor::from_dir(dir.path()).unwrap();
            let prompt = processor.chat_prompt("what is this?", 1).unwrap();
            assert_eq!(prompt, "USER: <image>\nwhat is this? ASSISTANT:");
            let image = config.image_token_id as u32;
            assert_eq!(
                processor.encode(&prompt).unwrap(),
                vec![1, 3, 4, image, 6, 7, 8, 9, 5, 4]
            );
            // A wide and a tall picture (LLaVA-NeXT counts differ with the aspect ratio).
            for (w, h) in [(61, 37), (30, 70)] {
                let inputs = processor
                    .prepare(&model, &[picture(w, h)], &prompt)
                    .unwrap();
                let count = model.image_token_count((h, w)).unwrap();
                let n = inputs.input_ids.iter().filter(|&&t| t == image).count();
                assert_eq!(n, count, "{family} {w}x{h}");
                assert_eq!(inputs.input_ids.len(), 9 + count);
                let pixels = inputs.pixel_values.as_ref().unwrap();
                match variant {
                    LlavaVariant::Llava => assert_eq!(pixels.shape()[0], 1),
                    LlavaVariant::LlavaNext => {
                        assert_eq!(inputs.image_sizes.as_ref().unwrap().shape(), &[1, 2]);
                        assert_eq!(pixels.shape().len(), 5);
                    }
                }
                let config = GenerationConfig {
                    max_new_tokens: 3,
                    ..model.default_generation_config()
                };
                let mut streamed = 0;
                let out = LlavaTasks::generate(&model, &inputs, &config, &mut |_| {
                    streamed += 1;
                    ControlFlow::Continue(())
                })
                .unwrap();
                assert!(!out.is_empty() && out.len() <= 3 && streamed == out.len());
                processor.decode(&out).unwrap();
            }
            // Two placeholders for one image, an empty prompt: typed errors.
            let two = processor.chat_prompt("what is this?", 2).unwrap();
            assert!(matches!(
                processor.prepare(&model, &[picture(40, 40)], &two),
                Err(Error::InvalidInput(_))
            ));
            assert!(matches!(
                processor.prepare(&model, &[picture(40, 40)], ""),
                Err(Error::InvalidInput(_))
            ));
        }
    }
}

#[test]
fn anyres_counts_match_hf_processor_at_llava_v16_sizes() {
    // No vision_config: LLaVA's defaults (336-pixel views, 14-pixel patches) and the default
    // pinpoints, as llava-v1.6 checkpoints use them.
    let config = LlavaConfig::from_json(
        r#"{"model_type": "llava_next", "image_token_index": 32000,
            "text_config": {"vocab_size": 32064}}"#,
        Path::new("config.json"),
    )
    .unwrap();
    // (height, width, LlavaNextProcessor._get_number_of_features(h, w, 336, 336) - 1) with
    // patch_size 14 and num_additional_image_tokens 1, computed with transformers 5.23.
    let hf = [
        (480, 640, 2340),
        (640, 480, 2352),
        (336, 336, 1176),
        (1080, 1920, 1948),
        (37, 61, 1560),
        (1000, 50, 936),
        (50, 1000, 868),
        (799, 801, 2928),
        (223, 900, 1890),
        (2000, 2000, 2928),
        (994, 2447, 2040),
        (2249, 554, 1944),
        (1535, 2493, 2046),
        (1961, 2399, 2536),
        (288, 2500, 1160),
        (73, 1941, 722),
        (1082, 2276, 1800),
        (979, 805, 2544),
        (1946, 2235, 2634),
        (2271, 1971, 2640),
    ];
    for (h, w, want) in hf {
        let layout = AnyresLayout::new(&config, (h, w)).unwrap();
        assert_eq!(
            layout.feature_count(config.tokens_per_view()),
            want,
            "{h}x{w}"
        );
    }
    assert!(AnyresLayout::new(&config, (0, 5)).is_err());
}
