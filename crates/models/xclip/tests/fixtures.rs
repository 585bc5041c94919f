//! X-CLIP against the HF reference fixtures (`fixtures/xclip/*`) on the CPU backend, its task
//! APIs, and bad input / bad checkpoints as typed errors.

use std::path::Path;

use burn_flex::Flex;
use ipfs_accelerate_conformance::{
    assert_checks, assert_rows_match, assert_softmax_rows, family_fixtures, relative_error,
    verify_runner,
};
use ipfs_accelerate_core::{
    BackendKind, Error, Family, HostTensor, JsonConfig, ModelRunner, TensorMap, TensorSource,
};
use ipfs_accelerate_xclip::{ClipTextInputs, XclipConfig, XclipFamily, XclipRunner, XclipTasks};

fn runner(dir: &Path) -> XclipRunner<Flex> {
    XclipRunner::load_dir(dir, &Default::default(), BackendKind::Cpu).unwrap()
}

#[test]
fn outputs_match_hf_within_tolerance() {
    for f in family_fixtures("outputs_match_hf_within_tolerance", "xclip") {
        let model =
            XclipFamily::load::<Flex>(&f.dir, &Default::default(), BackendKind::Cpu).unwrap();
        let checks = verify_runner(&f, BackendKind::Cpu, model.as_ref()).unwrap();
        for c in &checks {
            println!(
                "xclip/{} {}: {:.3e} (tolerance {:.1e})",
                f.variant, c.output, c.rel_error, c.tolerance
            );
        }
        assert_checks(&checks);
    }
}

#[test]
fn task_apis_agree_with_the_model_outputs() {
    for f in family_fixtures("task_apis_agree_with_the_model_outputs", "xclip") {
        let xclip = runner(&f.dir);
        let inputs = f.inputs().unwrap();
        let reference = f.reference().unwrap();
        let labels = ClipTextInputs::from_tensors(&inputs).unwrap();
        let pixels = &inputs["pixel_values"];
        let full = xclip.run(&inputs).unwrap();
        // Video embeddings do not depend on the text.
        assert_rows_match(xclip.video_embeds(pixels).unwrap(), &full["video_embeds"]);
        let only_video: TensorMap = [("pixel_values".to_string(), pixels.clone())].into();
        let out = xclip.run(&only_video).unwrap();
        assert!(out.contains_key("video_embeds") && !out.contains_key("text_embeds"));
        // Probabilities are the softmax of HF's logits_per_video over the labels.
        let probs = xclip.classify_video(pixels, &labels).unwrap();
        assert_softmax_rows(&probs, &reference.tensor("logits_per_video").unwrap());
        // One video as [frames, 3, H, W] equals the first row of the batch.
        let s = pixels.shape();
        let per_video = s[1..].iter().product::<usize>();
        let first: Vec<f32> = pixels.to_f32_vec()[..per_video].to_vec();
        let one = HostTensor::from_f32(s[1..].to_vec(), &first).unwrap();
        let p1 = xclip.classify_video(&one, &labels).unwrap();
        assert_eq!(p1.len(), 1);
        for (a, b) in p1[0].iter().zip(&probs[0]) {
            assert!((a - b).abs() < 1e-5);
        }
        // Text embeddings are video-specific: the prompt generator gives each video its own.
        let text = full["text_embeds"].to_f64_vec();
        let per = text.len() / s[0];
        if s[0] > 1 {
            assert!(relative_error(&text[..per], &text[per..2 * per]) > 1e-6);
        }
    }
}

#[test]
fn bad_inputs_are_typed_errors() {
    for f in family_fixtures("bad_inputs_are_typed_errors", "xclip") {
        let xclip = runner(&f.dir);
        let inputs = f.inputs().unwrap();
        let pixels = inputs["pixel_values"].clone();
        let s = pixels.shape().to_vec();
        let (frames, c, h, w) = (s[1], s[2], s[3], s[4]);
        let frame = c * h * w;
        let vals = pixels.to_f32_vec();
        let video = |n: usize| {
            HostTensor::from_f32(
                vec![1, n, c, h, w],
                &vals
                    .iter()
                    .cycle()
                    .take(n * frame)
                    .copied()
                    .collect::<Vec<_>>(),
            )
            .unwrap()
        };
        let cfg = xclip.config().text_config.clone();
        let ids = |v: Vec<i64>, shape: Vec<usize>| HostTensor::from_i64(shape, &v).unwrap();
        let with = |extra: Vec<(&str, HostTensor)>| {
            let mut m = inputs.clone();
            for (k, v) in extra {
                m.insert(k.to_string(), v);
            }
            m
        };
        let too_long = cfg.max_position_embeddings + 1;
        let mut nan = vals.clone();
        nan[0] = f32::NAN;
        for case in [
            // Frame counts other than num_frames (HF cannot run them either).
            with(vec![("pixel_values", video(frames + 1))]),
            with(vec![("pixel_values", video(frames - 1))]),
            // Empty, wrongly ranked, wrong channels, non-finite pixels.
            with(vec![(
                "pixel_values",
                HostTensor::from_f32(vec![0, frames, c, h, w], &[]).unwrap(),
            )]),
            with(vec![(
                "pixel_values",
                HostTensor::from_f32(vec![frame], &vals[..frame]).unwrap(),
            )]),
            with(vec![(
                "pixel_values",
                HostTensor::from_f32(vec![1, frames, 1, c * h, w], &vals[..frames * frame])
                    .unwrap(),
            )]),
            with(vec![(
                "pixel_values",
                HostTensor::from_f32(s.clone(), &nan).unwrap(),
            )]),
            // Token ids out of range, empty, too long, mismatched mask.
            with(vec![
                ("input_ids", ids(vec![cfg.vocab_size as i64], vec![1, 1])),
                ("attention_mask", ids(vec![1], vec![1, 1])),
            ]),
            with(vec![
                ("input_ids", ids(vec![-1], vec![1, 1])),
                ("attention_mask", ids(vec![1], vec![1, 1])),
            ]),
            with(vec![
                ("input_ids", ids(vec![], vec![0, 3])),
                ("attention_mask", ids(vec![], vec![0, 3])),
            ]),
            with(vec![
                ("input_ids", ids(vec![0; too_long], vec![1, too_long])),
                ("attention_mask", ids(vec![1; too_long], vec![1, too_long])),
            ]),
            with(vec![("attention_mask", ids(vec![1], vec![1, 1]))]),
            // No video at all.
            [("input_ids".to_string(), inputs["input_ids"].clone())].into(),
        ] {
            let shapes: Vec<String> = case
                .iter()
                .map(|(k, v)| format!("{k}{:?}", v.shape()))
                .collect();
            assert!(
                matches!(xclip.run(&case), Err(Error::InvalidInput(_))),
                "{shapes:?}"
            );
        }
        // Task API: no labels, wrong frame count.
        let empty = ClipTextInputs {
            batch: 0,
            seq: 0,
            input_ids: vec![],
            attention_mask: vec![],
        };
        assert!(matches!(
            xclip.classify_video(&pixels, &empty),
            Err(Error::InvalidInput(_))
        ));
        let labels = ClipTextInputs::from_rows(&[vec![1, 2]]).unwrap();
        assert!(matches!(
            xclip.classify_video(&video(frames + 1), &labels),
            Err(Error::InvalidInput(_))
        ));
        assert!(matches!(
            xclip.video_embeds(&video(2 * frames)),
            Err(Error::InvalidInput(_))
        ));
    }
}

#[test]
fn broken_checkpoints_and_configs_are_typed_errors() {
    for f in family_fixtures("broken_checkpoints_and_configs_are_typed_errors", "xclip") {
        let config = XclipConfig::from_file(&f.dir.join("config.json")).unwrap();
        let load = |c: &XclipConfig| {
            let weights = ipfs_accelerate_io::open_weights(&f.dir).unwrap();
            XclipRunner::<Flex>::load(weights, c, &Default::default(), BackendKind::Cpu).err()
        };
        let mut more_frames = config.clone();
        more_frames.vision_config.num_frames += 1;
        let e = load(&more_frames);
        assert!(matches!(e, Some(Error::ShapeMismatch { .. })), "{e:?}");
        let mut deeper = config.clone();
        deeper.prompt_layers += 1;
        let e = load(&deeper);
        assert!(matches!(e, Some(Error::MissingTensor { .. })), "{e:?}");
        let mut deeper = config.clone();
        deeper.vision_config.mit_num_hidden_layers += 1;
        let e = load(&deeper);
        assert!(matches!(e, Some(Error::MissingTensor { .. })), "{e:?}");
        let weights = ipfs_accelerate_io::open_weights(&f.dir).unwrap();
        assert!(weights.contains("prompts_visual_projection"));
    }
    let origin = Path::new("config.json");
    for bad in [
        r#"{"vision_config": {}}"#,
        r#"{"text_config": {}}"#,
        r#"{"text_config": {"hidden_size": 10, "num_attention_heads": 3}, "vision_config": {}}"#,
        r#"{"text_config": {}, "vision_config": {"patch_size": 0}}"#,
        r#"{"text_config": {}, "vision_config": {"num_frames": 0}}"#,
        r#"{"text_config": {}, "vision_config": {"mit_hidden_size": 256}}"#,
        r#"{"text_config": {}, "vision_config": {"mit_num_attention_heads": 7}}"#,
        r#"{"text_config": {}, "vision_config": {}, "prompt_num_attention_heads": 0}"#,
        r#"{"text_config": {}, "vision_config": {}, "prompt_num_attention_heads": 7}"#,
        r#"{"text_config": {}, "vision_config": {}, "prompt_hidden_act": "nope"}"#,
    ] {
        assert!(
            matches!(
                XclipConfig::from_json(bad, origin),
                Err(Error::InvalidConfig { .. })
            ),
            "{bad}"
        );
    }
    let ok = XclipConfig::from_json(r#"{"text_config": {}, "vision_config": {}}"#, origin).unwrap();
    assert_eq!(ok.vision_config.num_frames, 8);
    assert_eq!(ok.vision_config.base.hidden_size, 768);
    assert_eq!(ok.clip_text_config().eos_token_id.first(), Some(2));
}

#[test]
fn pooling_uses_the_largest_id_as_hf_forces() {
    for f in family_fixtures("pooling_uses_the_largest_id_as_hf_forces", "xclip") {
        let xclip = runner(&f.dir);
        let text = ClipTextInputs::from_rows(&[vec![0, 5, 9, 5], vec![7, 1, 7, 1]]).unwrap();
        assert_eq!(xclip.model().text.pool_positions(&text), vec![2, 0]);
    }
}
