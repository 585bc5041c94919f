//! T5 against HF transformers: the shared fixtures (encoder states, logits, greedy tokens),
//! KV-cached decoding against full recompute, and typed errors for bad input.

use std::ops::ControlFlow;
use std::path::Path;
use std::sync::Arc;

use burn_flex::Flex;
use ipfs_accelerate_conformance::{assert_checks, family_fixtures, verify_runner, Fixture};
use ipfs_accelerate_core::{BackendKind, Error, Family, HostTensor, ModelRunner, TensorMap};
use ipfs_accelerate_io::RandomWeights;
use ipfs_accelerate_nn::{
    convert::float_to_vec,
    generate::{GenerationConfig, Sampling},
};
use ipfs_accelerate_t5::{names, T5Config, T5Family, T5Inputs, T5Runner, T5};

/// Every T5 fixture (shared set and `$IPFS_ACCELERATE_EXTRA_FIXTURES` roots); skipped, by name,
/// when there is no shared data, and a failure when there is none under
/// `IPFS_ACCELERATE_REQUIRE_SHARED=1`.
fn t5_fixtures(test: &str) -> Vec<Fixture> {
    let fixtures = family_fixtures(test, "t5");
    if fixtures.is_empty()
        && std::env::var_os("IPFS_ACCELERATE_REQUIRE_SHARED").is_some_and(|v| v == "1")
    {
        panic!("{test}: no T5 fixtures");
    }
    fixtures
}

#[test]
fn fixtures_match_hf() {
    for f in &t5_fixtures("fixtures_match_hf") {
        let runner = T5Family::load::<Flex>(&f.dir, &Default::default(), BackendKind::Cpu).unwrap();
        let checks = verify_runner(f, BackendKind::Cpu, runner.as_ref()).unwrap();
        eprintln!("{checks:?}");
        assert_checks(&checks);
    }
}

/// Cached decoding of the fixtures' `decoder_input_ids`, one token at a time, gives the logits of
/// the full forward, and cached greedy / sampled generation gives the tokens of full recompute.
#[test]
fn cached_decoding_matches_full_recompute_on_fixtures() {
    for f in t5_fixtures("cached_decoding_matches_full_recompute_on_fixtures") {
        let dir = &f.dir;
        let config = T5Config::from_file(&dir.join("config.json")).unwrap();
        let weights = ipfs_accelerate_io::open_weights(dir).unwrap();
        let model = T5::<Flex>::load(weights, &config, &Default::default()).unwrap();
        let fixture_inputs = f.inputs().unwrap();
        let inputs = T5Inputs::from_tensors(&fixture_inputs).unwrap();
        let dec = fixture_inputs["decoder_input_ids"].clone();
        let (batch, len) = (dec.shape()[0], dec.shape()[1]);
        let dec = dec.to_i64_vec().unwrap();
        let (encoder, full) = model.forward(&inputs, &dec, len).unwrap();
        let full = float_to_vec(full).unwrap();
        let vocab = config.vocab_size;

        let mut cache = model.new_cache();
        for pos in 0..len {
            let ids: Vec<i64> = (0..batch).map(|b| dec[b * len + pos]).collect();
            let hidden = model
                .decode(&ids, 1, &encoder, &inputs.attention_mask, Some(&mut cache))
                .unwrap();
            let step = float_to_vec(model.lm_logits(hidden)).unwrap();
            for b in 0..batch {
                let want = &full[(b * len + pos) * vocab..(b * len + pos + 1) * vocab];
                let got = &step[b * vocab..(b + 1) * vocab];
                let diff = got
                    .iter()
                    .zip(want)
                    .map(|(a, w)| (a - w).abs())
                    .fold(0f32, f32::max);
                assert!(
                    diff < 1e-4,
                    "{}: position {pos} row {b}: {diff}",
                    dir.display()
                );
            }
        }
        assert_eq!(cache.seq_len(), len);

        for sampling in [
            Sampling::Greedy,
            Sampling::Sample {
                temperature: 1.5,
                top_k: None,
                top_p: Some(0.95),
            },
        ] {
            let cfg = GenerationConfig {
                max_new_tokens: 12,
                sampling,
                seed: 3,
                ..Default::default()
            };
            let go = |use_cache| {
                model
                    .generate_inputs(&inputs, &cfg, use_cache, |_, _| ControlFlow::Continue(()))
                    .unwrap()
            };
            let cached = go(true);
            assert_eq!(cached, go(false), "{}: {sampling:?}", dir.display());
            assert!(cached.iter().all(|r| r.len() == 12));
        }
    }
}

/// A random model of other sizes (3 encoder / 2 decoder blocks, gated-silu, untied LM head).
fn random_model(gated: bool, seed: u64) -> T5<Flex> {
    let ffp = if gated { "gated-silu" } else { "relu" };
    let json = format!(
        r#"{{"vocab_size":53,"d_model":24,"d_kv":5,"d_ff":19,"num_layers":3,"num_decoder_layers":2,
            "num_heads":3,"relative_attention_num_buckets":10,"relative_attention_max_distance":9,
            "feed_forward_proj":"{ffp}","tie_word_embeddings":{},"decoder_start_token_id":0,
            "eos_token_id":1}}"#,
        !gated
    );
    let config = T5Config::from_json(&json, Path::new("random")).unwrap();
    let weights = RandomWeights::new(names::weight_shapes(&config, gated), seed, 0.4);
    T5::load(Arc::new(weights), &config, &Default::default()).unwrap()
}

#[test]
fn cached_generation_matches_full_recompute_on_random_models() {
    for (gated, seed) in [(true, 1), (false, 2)] {
        let model = random_model(gated, seed);
        let rows = vec![vec![5, 9, 13, 40, 2, 7, 8, 1], vec![3, 4, 50, 1]];
        let cfg = GenerationConfig {
            max_new_tokens: 20,
            ..Default::default()
        };
        let mut streamed = 0;
        let cached = model
            .generate(&rows, None, &cfg, |_, _| {
                streamed += 1;
                ControlFlow::Continue(())
            })
            .unwrap();
        assert_eq!(streamed, 40);
        let inputs = T5Inputs::from_rows(&rows, None, 0).unwrap();
        assert_eq!(inputs.attention_mask[8..], [1, 1, 1, 1, 0, 0, 0, 0]);
        let full = model
            .generate_inputs(&inputs, &cfg, false, |_, _| ControlFlow::Continue(()))
            .unwrap();
        assert_eq!(cached, full, "gated {gated}");
        // Padding must not change a row's result: row 1 alone gives the same tokens.
        let alone = model
            .generate(&rows[1..], None, &cfg, |_, _| ControlFlow::Continue(()))
            .unwrap();
        assert_eq!(alone[0], cached[1]);
    }
}

#[test]
fn stop_tokens_end_generation() {
    let model = random_model(true, 4);
    let rows = vec![vec![5, 9, 13]];
    let cfg = GenerationConfig {
        max_new_tokens: 6,
        ..Default::default()
    };
    let free = model
        .generate(&rows, None, &cfg, |_, _| ControlFlow::Continue(()))
        .unwrap();
    let stop = free[0][2];
    let cfg = GenerationConfig {
        stop_tokens: vec![stop],
        ..cfg
    };
    let stopped = model
        .generate(&rows, None, &cfg, |_, _| ControlFlow::Continue(()))
        .unwrap();
    let first = free[0].iter().position(|&t| t == stop).unwrap();
    assert_eq!(stopped[0], free[0][..=first].to_vec());
}

fn ids(shape: Vec<usize>, v: &[i64]) -> HostTensor {
    HostTensor::from_i64(shape, v).unwrap()
}

fn expect_invalid(result: ipfs_accelerate_core::Result<TensorMap>, what: &str) {
    match result {
        Err(Error::InvalidInput(msg)) => eprintln!("{what}: {msg}"),
        other => panic!("{what}: expected InvalidInput, got {other:?}"),
    }
}

#[test]
fn bad_input_is_a_typed_error() {
    let model = random_model(false, 5);
    let config = model.config().clone();
    let runner = T5Runner::<Flex>::load(
        Arc::new(RandomWeights::new(
            names::weight_shapes(&config, false),
            5,
            0.4,
        )),
        &config,
        &Default::default(),
        BackendKind::Cpu,
    )
    .unwrap();
    let run = |pairs: Vec<(&str, HostTensor)>| {
        let map: TensorMap = pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        runner.run(&map)
    };
    let good = ids(vec![1, 3], &[4, 5, 6]);
    assert!(run(vec![("input_ids", good.clone())]).is_ok());
    expect_invalid(run(vec![]), "missing input_ids");
    expect_invalid(run(vec![("input_ids", ids(vec![1, 0], &[]))]), "empty ids");
    expect_invalid(
        run(vec![("input_ids", ids(vec![0, 3], &[]))]),
        "empty batch",
    );
    expect_invalid(run(vec![("input_ids", ids(vec![3], &[1, 2, 3]))]), "rank 1");
    expect_invalid(
        run(vec![("input_ids", ids(vec![1, 3], &[4, 53, 6]))]),
        "id = vocab",
    );
    expect_invalid(
        run(vec![("input_ids", ids(vec![1, 3], &[4, -1, 6]))]),
        "negative id",
    );
    expect_invalid(
        run(vec![
            ("input_ids", good.clone()),
            ("attention_mask", ids(vec![1, 2], &[1, 1])),
        ]),
        "mask shape",
    );
    expect_invalid(
        run(vec![
            ("input_ids", good.clone()),
            ("attention_mask", ids(vec![1, 3], &[0, 0, 0])),
        ]),
        "all-padding row",
    );
    expect_invalid(
        run(vec![
            ("input_ids", good.clone()),
            ("decoder_input_ids", ids(vec![2, 1], &[0, 0])),
        ]),
        "decoder batch",
    );
    expect_invalid(
        run(vec![
            ("input_ids", good.clone()),
            ("decoder_input_ids", ids(vec![1, 2], &[0, 99])),
        ]),
        "decoder id out of range",
    );
    expect_invalid(
        run(vec![
            ("input_ids", good.clone()),
            ("decoder_input_ids", ids(vec![1, 0], &[])),
        ]),
        "empty decoder ids",
    );
    expect_invalid(
        run(vec![
            ("input_ids", good.clone()),
            ("greedy_steps", ids(vec![1], &[-2])),
        ]),
        "negative greedy_steps",
    );
    let float_ids = HostTensor::from_f32(vec![1, 3], &[4.0, 5.0, 6.0]).unwrap();
    assert!(run(vec![("input_ids", float_ids)]).is_err());

    // Row-based API.
    let cfg = GenerationConfig::default();
    let cont = |_: usize, _: u32| ControlFlow::Continue(());
    assert!(matches!(
        model.generate(&[], None, &cfg, cont),
        Err(Error::InvalidInput(_))
    ));
    assert!(matches!(
        model.generate(&[vec![]], None, &cfg, cont),
        Err(Error::InvalidInput(_))
    ));
    assert!(matches!(
        model.generate(
            &[vec![1, 2], vec![3]],
            Some(&[vec![1, 1], vec![1]]),
            &cfg,
            cont
        ),
        Err(Error::InvalidInput(_))
    ));
    let bad_sampling = GenerationConfig {
        sampling: Sampling::Sample {
            temperature: -1.0,
            top_k: None,
            top_p: None,
        },
        ..Default::default()
    };
    assert!(model
        .generate(&[vec![1, 2]], None, &bad_sampling, cont)
        .is_err());
}

#[test]
fn bad_checkpoints_are_typed_errors() {
    let model = random_model(true, 6);
    let config = model.config().clone();
    let device = Default::default();
    let shapes = names::weight_shapes(&config, true);
    // Every tensor is needed: dropping any one names it.
    for drop in [
        "decoder.block.1.layer.2.DenseReluDense.wi_1.weight",
        "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
        "decoder.final_layer_norm.weight",
        "shared.weight",
    ] {
        let kept = shapes.iter().filter(|(n, _)| n != drop).cloned();
        match T5::<Flex>::load(Arc::new(RandomWeights::new(kept, 1, 0.4)), &config, &device) {
            Err(Error::MissingTensor { name, .. }) => assert_eq!(name, drop),
            other => panic!("dropping {drop}: {:?}", other.err()),
        }
    }
    let mut wrong = shapes.clone();
    for (n, s) in wrong.iter_mut() {
        if n == "encoder.block.2.layer.0.SelfAttention.q.weight" {
            *s = vec![15, 23];
        }
    }
    assert!(matches!(
        T5::<Flex>::load(
            Arc::new(RandomWeights::new(wrong, 1, 0.4)),
            &config,
            &device
        ),
        Err(Error::ShapeMismatch { .. })
    ));

    // An invalid config.json in a checkpoint folder.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.json"),
        r#"{"vocab_size":10,"d_model":8,"feed_forward_proj":"gated-gelu-new"}"#,
    )
    .unwrap();
    match T5Family::load::<Flex>(dir.path(), &device, BackendKind::Cpu) {
        Err(Error::InvalidConfig { reason, .. }) => assert!(reason.contains("feed_forward_proj")),
        other => panic!("expected InvalidConfig, got {:?}", other.err()),
    }
}

/// A word-level tokenizer.json over `vocab` ids: `<pad>` 0, `</s>` 1, `<unk>` 2 (special), then
/// `w3` … `w{vocab-1}`.
fn word_tokenizer(vocab: usize) -> String {
    let mut words = vec![
        r#""<pad>":0"#.to_string(),
        r#""</s>":1"#.into(),
        r#""<unk>":2"#.into(),
    ];
    words.extend((3..vocab).map(|i| format!(r#""w{i}":{i}"#)));
    let special = |id: usize, content: &str| {
        format!(
            r#"{{"id":{id},"content":"{content}","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}}"#
        )
    };
    format!(
        r#"{{"version":"1.0","truncation":null,"padding":null,
            "added_tokens":[{},{},{}],"normalizer":null,"pre_tokenizer":{{"type":"Whitespace"}},
            "post_processor":null,"decoder":null,
            "model":{{"type":"WordLevel","vocab":{{{}}},"unk_token":"<unk>"}}}}"#,
        special(0, "<pad>"),
        special(1, "</s>"),
        special(2, "<unk>"),
        words.join(",")
    )
}

#[test]
fn text_to_text_goes_through_the_tokenizer() {
    let fixtures = t5_fixtures("text_to_text_goes_through_the_tokenizer");
    // The plain T5 variant when there is one, else any.
    let Some(f) = fixtures
        .iter()
        .find(|f| f.variant == "t5")
        .or(fixtures.first())
    else {
        return;
    };
    let src = &f.dir;
    let dir = tempfile::tempdir().unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
    }
    let config = T5Config::from_file(&src.join("config.json")).unwrap();
    std::fs::write(
        dir.path().join("tokenizer.json"),
        word_tokenizer(config.vocab_size),
    )
    .unwrap();
    let tasks =
        T5Family::load_tasks::<Flex>(dir.path(), &Default::default(), BackendKind::Cpu).unwrap();
    let cfg = GenerationConfig {
        max_new_tokens: 6,
        ..Default::default()
    };
    let texts = tasks.generate_text(&["w5 w17 w40", "w8"], &cfg).unwrap();
    // The same through ids: right-padded rows, no special tokens added by this tokenizer.
    let ids = tasks
        .generate(&[vec![5, 17, 40], vec![8]], None, &cfg, &mut |_, _| {
            ControlFlow::Continue(())
        })
        .unwrap();
    let words: Vec<String> = ids
        .iter()
        .map(|row| {
            row.iter()
                .filter(|&&t| t > 2)
                .map(|t| format!("w{t}"))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    assert_eq!(texts, words);
    assert!(matches!(
        tasks.generate_text(&[""], &cfg),
        Err(Error::InvalidInput(_))
    ));
    // Without a tokenizer.json, text input is a typed error.
    let bare = T5Family::load_tasks::<Flex>(src, &Default::default(), BackendKind::Cpu).unwrap();
    assert!(matches!(
        bare.generate_text(&["w5"], &cfg),
        Err(Error::InvalidInput(_))
    ));
}
