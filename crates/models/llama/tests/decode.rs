//! KV-cache decoding against full recompute, left padding against unpadded rows, and bad input,
//! on small random-weight models (no files needed).

use std::ops::ControlFlow;
use std::path::Path;
use std::sync::Arc;

use burn_flex::Flex;
use ipfs_accelerate_core::HostTensor;
use ipfs_accelerate_core::{BackendKind, ModelRunner, TensorMap};
use ipfs_accelerate_io::RandomWeights;
use ipfs_accelerate_llama::{
    Architecture, DecodeMode, LlamaConfig, LlamaDecoder, LlamaModel, LlamaRunner,
};
use ipfs_accelerate_nn::generate::{
    argmax, generate_continuous, GenerationConfig, RowDecoder, RowRequest, TokenDecoder,
};

const LLAMA: &str = r#"{"model_type": "llama", "vocab_size": 61, "hidden_size": 24,
    "intermediate_size": 40, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 64,
    "rope_parameters": {"rope_type": "llama3", "rope_theta": 500.0, "factor": 4.0,
    "low_freq_factor": 1.0, "high_freq_factor": 2.0, "original_max_position_embeddings": 16}}"#;

const QWEN2: &str = r#"{"model_type": "qwen2", "vocab_size": 53, "hidden_size": 16,
    "intermediate_size": 24, "num_hidden_layers": 3, "num_attention_heads": 2,
    "num_key_value_heads": 1, "max_position_embeddings": 64, "tie_word_embeddings": true,
    "use_sliding_window": true, "sliding_window": 3, "max_window_layers": 1,
    "rope_theta": 1000.0}"#;

fn model(json: &str, seed: u64) -> LlamaModel<Flex> {
    let config = LlamaConfig::from_json(json, Path::new("test"), Architecture::Llama).unwrap();
    let weights = RandomWeights::new(config.weight_shapes(), seed, 0.4);
    LlamaModel::load(Arc::new(weights), &config, &Default::default()).unwrap()
}

/// Feeds both decoders the recompute decoder's argmax tokens for `steps` steps and returns the
/// largest logit difference relative to the largest logit, and the tokens.
fn compare_modes(m: &LlamaModel<Flex>, prompts: &[Vec<u32>], steps: usize) -> (f32, Vec<Vec<u32>>) {
    let mut cached = LlamaDecoder::new(m, prompts, DecodeMode::Cached).unwrap();
    let mut full = LlamaDecoder::new(m, prompts, DecodeMode::Recompute).unwrap();
    let mut a = cached.prefill().unwrap();
    let mut b = full.prefill().unwrap();
    let vocab = m.vocab();
    let mut worst = 0f32;
    let mut tokens = vec![Vec::new(); prompts.len()];
    for step in 0..=steps {
        let scale = b.iter().fold(0f32, |s, v| s.max(v.abs()));
        let diff = a
            .iter()
            .zip(&b)
            .fold(0f32, |s, (x, y)| s.max((x - y).abs()));
        worst = worst.max(diff / scale);
        let next: Vec<u32> = b.chunks(vocab).map(argmax).collect();
        let next_cached: Vec<u32> = a.chunks(vocab).map(argmax).collect();
        assert_eq!(next, next_cached, "argmax differs at step {step}");
        if step == steps {
            break;
        }
        for (row, t) in next.iter().enumerate() {
            tokens[row].push(*t);
        }
        a = cached.step(&next).unwrap();
        b = full.step(&next).unwrap();
    }
    assert_eq!(cached.cache().seq_len(), cached.len());
    (worst, tokens)
}

#[test]
fn cache_matches_recompute_batch_of_one() {
    for (json, seed) in [(LLAMA, 1), (QWEN2, 2)] {
        let m = model(json, seed);
        let (worst, _) = compare_modes(&m, &[vec![3, 17, 5, 9, 44, 2]], 12);
        assert!(worst < 1e-5, "relative logit difference {worst}");
    }
}

#[test]
fn left_padded_batch_matches_rows_alone() {
    for (json, seed) in [(LLAMA, 3), (QWEN2, 4)] {
        let m = model(json, seed);
        let prompts = vec![vec![5, 8, 13, 21, 34], vec![7, 1], vec![40, 2, 9, 30]];
        let (worst, tokens) = compare_modes(&m, &prompts, 10);
        assert!(worst < 1e-5, "relative logit difference {worst}");
        // Every row of the padded batch decodes as it does alone.
        let config = GenerationConfig {
            max_new_tokens: 10,
            ..Default::default()
        };
        let batched = {
            let mut d = LlamaDecoder::new(&m, &prompts, DecodeMode::Cached).unwrap();
            ipfs_accelerate_nn::generate::generate(&mut d, &prompts, &config, |_, _| {
                ControlFlow::Continue(())
            })
            .unwrap()
        };
        assert_eq!(batched, tokens);
        for (row, p) in prompts.iter().enumerate() {
            let (_, alone) = compare_modes(&m, std::slice::from_ref(p), 10);
            assert_eq!(alone[0], tokens[row], "row {row}");
        }
        // Logits of the padded batch's real positions equal the row's own.
        let mut padded = LlamaDecoder::new(&m, &prompts, DecodeMode::Cached).unwrap();
        let batch_logits = padded.prefill().unwrap();
        for (row, p) in prompts.iter().enumerate() {
            let mut alone =
                LlamaDecoder::new(&m, std::slice::from_ref(p), DecodeMode::Cached).unwrap();
            let own = alone.prefill().unwrap();
            let v = m.vocab();
            let got = &batch_logits[row * v..(row + 1) * v];
            let diff = got
                .iter()
                .zip(&own)
                .fold(0f32, |s, (a, b)| s.max((a - b).abs()));
            assert!(diff < 1e-4, "row {row}: max diff {diff}");
        }
    }
}

/// Largest absolute difference of two logit rows (NaN when either holds one).
fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, |s, d| {
            if d.is_nan() || s.is_nan() {
                f32::NAN
            } else {
                s.max(d)
            }
        })
}

/// Continuous batching: rows that join a running batch (shorter or longer than its columns) and
/// rows that leave it decode as they do alone — the same logits bit for bit at each step (over
/// more than 16 columns, where the attention's sums would otherwise group a padded row's values
/// differently), and greedy tokens through `generate_continuous` with staggered arrivals (Qwen2's
/// sliding window included).
#[test]
fn rows_join_and_leave_a_running_batch() {
    for (json, seed) in [(LLAMA, 5), (QWEN2, 6)] {
        let m = model(json, seed);
        let v = m.vocab();
        // Logits: a long row, a short one joins, a longer one joins, the first leaves.
        let (long, short, longer) = (
            vec![5u32, 8, 13, 21, 34, 3],
            vec![7u32, 1],
            vec![
                40u32, 2, 9, 30, 11, 12, 50, 6, 4, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,
            ],
        );
        let mut alone: Vec<LlamaDecoder<Flex>> = [&long, &short, &longer]
            .iter()
            .map(|p| LlamaDecoder::new(&m, std::slice::from_ref(*p), DecodeMode::Cached).unwrap())
            .collect();
        let own: Vec<Vec<f32>> = alone.iter_mut().map(|d| d.prefill().unwrap()).collect();
        let mut d = LlamaDecoder::new(&m, std::slice::from_ref(&long), DecodeMode::Cached).unwrap();
        d.prefill().unwrap();
        let got = d.admit(std::slice::from_ref(&short)).unwrap();
        assert!(max_diff(&got, &own[1]) == 0.0);
        let step = d.step(&[1, 2]).unwrap();
        let want0 = alone[0].step(&[1]).unwrap();
        let want1 = alone[1].step(&[2]).unwrap();
        assert!(max_diff(&step[..v], &want0) == 0.0, "long row after a join");
        assert!(max_diff(&step[v..], &want1) == 0.0, "joined short row");
        let got = d.admit(std::slice::from_ref(&longer)).unwrap();
        assert!(max_diff(&got, &own[2]) == 0.0);
        assert_eq!(
            d.len(),
            longer.len(),
            "the batch was padded to the longer prompt"
        );
        d.retain(&[1, 2]).unwrap();
        assert_eq!(d.batch(), 2);
        assert_eq!(
            d.len(),
            longer.len(),
            "nothing to trim while the longer row stays"
        );
        let step = d.step(&[3, 4]).unwrap();
        let want1 = alone[1].step(&[3]).unwrap();
        let want2 = alone[2].step(&[4]).unwrap();
        assert!(
            max_diff(&step[..v], &want1) == 0.0,
            "short row after a leave"
        );
        assert!(
            max_diff(&step[v..], &want2) == 0.0,
            "longer row after a leave"
        );
        d.retain(&[0]).unwrap();
        assert_eq!(
            d.len(),
            short.len() + 2,
            "columns no row attends to are trimmed"
        );
        assert_eq!(d.cache().seq_len(), d.len());
        let step = d.step(&[5]).unwrap();
        assert!(max_diff(&step, &alone[1].step(&[5]).unwrap()) == 0.0);
        assert!(d.retain(&[1]).is_err(), "a row that is not there");
        assert!(
            d.admit(&[vec![3], vec![v as u32]]).is_err(),
            "a token outside the vocabulary"
        );
        assert_eq!(
            d.batch(),
            1,
            "a failed admission leaves the batch as it was"
        );
        // Two prompts admitted together: each gets its own logits, bit for bit.
        let pair = [long.clone(), vec![3u32, 4, 5]];
        let got = d.admit(&pair).unwrap();
        for (r, p) in pair.iter().enumerate() {
            let mut own =
                LlamaDecoder::new(&m, std::slice::from_ref(p), DecodeMode::Cached).unwrap();
            assert_eq!(
                max_diff(&got[r * v..(r + 1) * v], &own.prefill().unwrap()),
                0.0
            );
        }
        assert_eq!(d.batch(), 3);

        // Greedy tokens of staggered requests equal each one's alone.
        let request = |prompt: &[u32], n: usize| RowRequest {
            prompt: prompt.to_vec(),
            config: GenerationConfig {
                max_new_tokens: n,
                ..Default::default()
            },
        };
        let first = vec![request(&long, 6), request(&short, 3)];
        let mut arrivals = vec![
            vec![request(&longer, 5)],
            vec![],
            vec![request(&[9, 9, 9], 4), request(&[1], 7)],
            vec![request(&[20, 21, 22, 23], 2)],
        ]
        .into_iter();
        let mut queue: Vec<RowRequest> = Vec::new();
        let mut all = first.clone();
        let mut out: Vec<Option<Vec<u32>>> = vec![None; 6];
        let mut d =
            LlamaDecoder::new(&m, &[long.clone(), short.clone()], DecodeMode::Cached).unwrap();
        generate_continuous(
            &mut d,
            first,
            3,
            |free| {
                queue.extend(arrivals.next().unwrap_or_default());
                let got: Vec<RowRequest> = queue.drain(..free.min(queue.len())).collect();
                all.extend(got.iter().cloned());
                got
            },
            |_, _| ControlFlow::Continue(()),
            |id, tokens| out[id] = Some(tokens.unwrap()),
        )
        .unwrap();
        assert_eq!(all.len(), 6);
        for (id, r) in all.iter().enumerate() {
            let (_, want) =
                compare_modes(&m, std::slice::from_ref(&r.prompt), r.config.max_new_tokens);
            assert_eq!(out[id].as_ref(), Some(&want[0]), "request {id}");
        }
    }
}

/// A left-padded batch decodes each row bit for bit as the row alone, also past 16 columns and
/// with padding queries in the prefill (the attention kernel skips a row's padding keys and
/// queries; computed with them, a row's values group differently in the vectorised sums and
/// products, and an int8-activation model turns such last-bit differences into other tokens).
#[test]
fn left_padded_rows_decode_bit_for_bit_as_alone() {
    const PLAIN: &str = r#"{"model_type": "llama", "vocab_size": 61, "hidden_size": 24,
        "intermediate_size": 40, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 64}"#;
    let m = model(PLAIN, 3);
    let v = m.vocab();
    // Two rows past 16 columns; eight rows whose padded prefill has padding queries.
    let cases = (12..16).map(|grow| (2, grow)).chain([(8, 3)]);
    for (n, grow) in cases {
        let prompts: Vec<Vec<u32>> = (0..n)
            .map(|r| {
                (0..3 + grow * r)
                    .map(|i| ((100 + 37 * i + 11 * r) % v) as u32)
                    .collect()
            })
            .collect();
        let mut alone: Vec<LlamaDecoder<Flex>> = prompts
            .iter()
            .map(|p| LlamaDecoder::new(&m, std::slice::from_ref(p), DecodeMode::Cached).unwrap())
            .collect();
        let mut batch = LlamaDecoder::new(&m, &prompts, DecodeMode::Cached).unwrap();
        let mut got = batch.prefill().unwrap();
        let mut want: Vec<Vec<f32>> = alone.iter_mut().map(|d| d.prefill().unwrap()).collect();
        for step in 0..4u32 {
            for r in 0..n {
                assert_eq!(
                    max_diff(&got[r * v..(r + 1) * v], &want[r]),
                    0.0,
                    "{n} rows growing by {grow}: row {r} ({} tokens), step {step}",
                    prompts[r].len()
                );
            }
            let tokens: Vec<u32> = (0..n as u32).map(|r| (20 + r + step) % v as u32).collect();
            got = batch.step(&tokens).unwrap();
            want = (0..n)
                .map(|r| alone[r].step(&tokens[r..r + 1]).unwrap())
                .collect();
        }
    }
}

#[test]
fn runner_generates_and_streams() {
    let config = LlamaConfig::from_json(LLAMA, Path::new("test"), Architecture::Llama).unwrap();
    let weights = RandomWeights::new(config.weight_shapes(), 9, 0.4);
    let runner = LlamaRunner::<Flex>::load(
        Arc::new(weights),
        &config,
        &Default::default(),
        BackendKind::Cpu,
    )
    .unwrap();
    let mut streamed = Vec::new();
    let gen = GenerationConfig {
        max_new_tokens: 6,
        ..Default::default()
    };
    let out = runner
        .generate(&[4, 9, 16], &gen, |t| {
            streamed.push(t);
            if streamed.len() == 4 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })
        .unwrap();
    assert_eq!(out, streamed);
    assert_eq!(out.len(), 4);
    let full = runner
        .generate_with(&[vec![4, 9, 16]], &gen, DecodeMode::Recompute, |_, _| {
            ControlFlow::Continue(())
        })
        .unwrap();
    assert_eq!(&full[0][..4], &out[..]);
    // The runner's logits for the whole prompt end with the first generated token.
    let mut inputs = TensorMap::new();
    inputs.insert(
        "input_ids".into(),
        HostTensor::from_i64(vec![1, 3], &[4, 9, 16]).unwrap(),
    );
    let logits = runner.run(&inputs).unwrap()["logits"].to_f32_vec();
    let v = config.vocab_size;
    assert_eq!(argmax(&logits[2 * v..]), out[0]);
}

#[test]
fn bad_input_is_an_error() {
    let m = model(LLAMA, 5);
    assert!(LlamaDecoder::new(&m, &[], DecodeMode::Cached).is_err());
    assert!(LlamaDecoder::new(&m, &[vec![1], vec![]], DecodeMode::Cached).is_err());
    let mut d = LlamaDecoder::new(&m, &[vec![1, 2]], DecodeMode::Cached).unwrap();
    assert!(d.step(&[3]).is_err(), "step before prefill");
    d.prefill().unwrap();
    assert!(d.step(&[61]).is_err(), "token outside the vocabulary");
    assert!(d.step(&[1, 2]).is_err(), "wrong batch");
    assert!(d.step(&[3]).is_ok(), "state intact after rejected steps");
    let mut bad = LlamaDecoder::new(&m, &[vec![99]], DecodeMode::Cached).unwrap();
    assert!(bad.prefill().is_err());
    // Past the context of 64 positions.
    let mut long = LlamaDecoder::new(&m, &[vec![1; 65]], DecodeMode::Cached).unwrap();
    assert!(long.prefill().is_err());

    let config = LlamaConfig::from_json(LLAMA, Path::new("test"), Architecture::Llama).unwrap();
    let runner = LlamaRunner::<Flex>::load(
        Arc::new(RandomWeights::new(config.weight_shapes(), 5, 0.4)),
        &config,
        &Default::default(),
        BackendKind::Cpu,
    )
    .unwrap();
    let run = |pairs: Vec<(&str, HostTensor)>| {
        let map: TensorMap = pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        runner.run(&map)
    };
    let ids = HostTensor::from_i64(vec![1, 2], &[1, 2]).unwrap();
    assert!(run(vec![]).is_err());
    assert!(run(vec![(
        "input_ids",
        HostTensor::from_i64(vec![2], &[1, 2]).unwrap()
    )])
    .is_err());
    assert!(run(vec![(
        "input_ids",
        HostTensor::from_i64(vec![1, 0], &[]).unwrap()
    )])
    .is_err());
    assert!(run(vec![(
        "input_ids",
        HostTensor::from_f32(vec![1, 2], &[1.0, 2.0]).unwrap()
    )])
    .is_err());
    assert!(run(vec![
        ("input_ids", ids.clone()),
        (
            "attention_mask",
            HostTensor::from_i64(vec![1, 3], &[1, 1, 1]).unwrap()
        ),
    ])
    .is_err());
    assert!(
        run(vec![("greedy_prompt", ids.clone())]).is_err(),
        "no greedy_steps"
    );
    assert!(run(vec![
        ("greedy_prompt", ids.clone()),
        (
            "greedy_steps",
            HostTensor::from_i64(vec![1], &[-1]).unwrap()
        ),
    ])
    .is_err());
    let ok = run(vec![
        ("greedy_prompt", ids),
        ("greedy_steps", HostTensor::from_i64(vec![1], &[3]).unwrap()),
    ])
    .unwrap();
    assert_eq!(ok["greedy_tokens"].shape(), &[1, 3]);
}

#[test]
fn invalid_configs_are_errors() {
    let cases = [
        r#"{"vocab_size": 0, "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2}"#,
        r#"{"vocab_size": 5, "hidden_size": 9, "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2}"#,
        r#"{"vocab_size": 5, "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 3}"#,
        r#"{"vocab_size": 5, "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2, "rope_scaling": {"type": "yarn", "factor": 2.0}}"#,
        r#"{"vocab_size": 5, "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2, "rope_parameters": {"rope_type": "linear"}}"#,
        r#"{"model_type": "bert", "vocab_size": 5, "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2}"#,
        r#"{"vocab_size": 5}"#,
    ];
    for json in cases {
        assert!(
            LlamaConfig::from_json(json, Path::new("t"), Architecture::Llama).is_err(),
            "{json}"
        );
    }
    // A missing tensor is an error naming it.
    let config = LlamaConfig::from_json(LLAMA, Path::new("t"), Architecture::Llama).unwrap();
    let mut shapes = config.weight_shapes();
    shapes.retain(|(n, _)| n != "model.layers.1.mlp.up_proj.weight");
    let err = LlamaModel::<Flex>::load(
        Arc::new(RandomWeights::new(shapes, 0, 0.1)),
        &config,
        &Default::default(),
    )
    .err()
    .unwrap();
    assert!(
        err.to_string()
            .contains("model.layers.1.mlp.up_proj.weight"),
        "{err}"
    );
}

#[test]
fn prompt_embeddings_decode_as_their_tokens() {
    let m = model(LLAMA, 7);
    let prompts = vec![vec![5, 8, 13, 21], vec![7, 1]];
    for mode in [DecodeMode::Cached, DecodeMode::Recompute] {
        let mut plain = LlamaDecoder::new(&m, &prompts, mode).unwrap();
        let mut embedded = LlamaDecoder::new(&m, &prompts, mode).unwrap();
        let (ids, mask) = embedded.prompt_ids();
        assert_eq!(mask, vec![1, 1, 1, 1, 0, 0, 1, 1]);
        let embeds = m.embed_tokens(&ids, 2, 4).unwrap();
        assert!(embedded
            .set_prompt_embeds(embeds.clone().narrow(1, 0, 3))
            .is_err());
        embedded.set_prompt_embeds(embeds.clone()).unwrap();
        let mut a = plain.prefill().unwrap();
        let mut b = embedded.prefill().unwrap();
        for step in 0..5 {
            let diff = a
                .iter()
                .zip(&b)
                .fold(0f32, |s, (x, y)| s.max((x - y).abs()));
            assert!(diff < 1e-5, "{mode:?} step {step}: {diff}");
            let next: Vec<u32> = a.chunks(m.vocab()).map(argmax).collect();
            a = plain.step(&next).unwrap();
            b = embedded.step(&next).unwrap();
        }
        assert!(
            embedded.set_prompt_embeds(embeds).is_err(),
            "embeddings after prefill"
        );
    }
    assert!(m.embed_tokens(&[1, 2, 3], 2, 2).is_err());
    assert!(m.embed_tokens(&[61], 1, 1).is_err());
}
