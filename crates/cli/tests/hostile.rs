//! Hostile model folders and requests, run through the binary as a user would: each case must end
//! in a typed `error:` line (exit status 1), never a panic, an abort or a runaway allocation. The
//! files are generated at test time from the tiny BERT fixture; the peak memory of every child
//! process is measured and bounded.

mod common;

use std::io::Read;
use std::path::Path;
use std::process::Stdio;

use common::{cli, fixture_copy, write_bert_tokenizer};
use ipfs_accelerate_conformance::shared_dir;
use serde_json::{json, Value};

/// A working tiny BERT embedder: the bert/base fixture plus a word-level tokenizer over its
/// 99-token vocabulary (`w4 w5 ...` are words).
fn tiny_bert(shared: &Path) -> tempfile::TempDir {
    let dir = fixture_copy(shared, "bert", "base");
    write_bert_tokenizer(dir.path());
    dir
}

fn embed(dir: &Path) -> std::process::Output {
    cli()
        .args(["embed", "w4 w5 w6", "--model"])
        .arg(dir)
        .output()
        .unwrap()
}

/// The case failed as it should: exit status 1, `error:` with `needle`, no panic.
fn assert_typed_failure(case: &str, out: &std::process::Output, needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{case}: expected exit status 1, got {:?}: {err}",
        out.status
    );
    assert!(
        err.contains("error:") && err.contains(needle) && !err.contains("panicked"),
        "{case}: expected an error mentioning `{needle}`, got: {err}"
    );
}

fn edit_json(path: &Path, edit: impl FnOnce(&mut Value)) {
    let mut v: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(path, v.to_string()).unwrap();
}

/// The data range of tensor `name` in a safetensors file.
fn tensor_range(bytes: &[u8], name: &str) -> std::ops::Range<usize> {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let o = &header[name]["data_offsets"];
    8 + n + o[0].as_u64().unwrap() as usize..8 + n + o[1].as_u64().unwrap() as usize
}

/// Replaces the header of a safetensors file (data kept), as a hostile writer would.
fn with_header(bytes: &[u8], edit: impl FnOnce(&mut Value)) -> Vec<u8> {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    edit(&mut header);
    let mut h = header.to_string().into_bytes();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend_from_slice(&bytes[8 + n..]);
    out
}

/// The largest resident set of any child process waited for so far, in bytes.
fn children_peak_rss() -> u64 {
    // SAFETY: getrusage only writes into the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) };
    usage.ru_maxrss as u64 * 1024
}

type Case = (&'static str, &'static str, Box<dyn Fn(&Path)>);

fn config_case(name: &'static str, needle: &'static str, key: &'static str, value: Value) -> Case {
    (
        name,
        needle,
        Box::new(move |d: &Path| {
            let value = value.clone();
            edit_json(&d.join("config.json"), |c| c[key] = value)
        }),
    )
}

fn weights_case(name: &'static str, needle: &'static str, f: fn(Vec<u8>) -> Vec<u8>) -> Case {
    (
        name,
        needle,
        Box::new(move |d: &Path| {
            let p = d.join("model.safetensors");
            let bytes = f(std::fs::read(&p).unwrap());
            std::fs::write(p, bytes).unwrap();
        }),
    )
}

fn file_case(
    name: &'static str,
    needle: &'static str,
    file: &'static str,
    text: &'static str,
) -> Case {
    (
        name,
        needle,
        Box::new(move |d: &Path| {
            let p = d.join(file);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }),
    )
}

/// Fills one tensor with a float bit pattern (NaN, infinity).
fn poison(bytes: Vec<u8>, value: f32) -> Vec<u8> {
    let mut bytes = bytes;
    let range = tensor_range(&bytes, "encoder.layer.0.attention.self.query.weight");
    for chunk in bytes[range].chunks_exact_mut(4) {
        chunk.copy_from_slice(&value.to_le_bytes());
    }
    bytes
}

fn shard_index(target: &'static str) -> Box<dyn Fn(&Path)> {
    Box::new(move |d: &Path| {
        let weights = d.join("model.safetensors");
        let outside = d.parent().unwrap().join(format!(
            "outside-{}.safetensors",
            d.file_name().unwrap().to_string_lossy()
        ));
        std::fs::rename(&weights, &outside).unwrap();
        let target = if target == "ABSOLUTE" {
            outside.display().to_string()
        } else {
            target.replace("OUTSIDE", &outside.file_name().unwrap().to_string_lossy())
        };
        let index = json!({ "weight_map": { "embeddings.word_embeddings.weight": target } });
        std::fs::write(d.join("model.safetensors.index.json"), index.to_string()).unwrap();
    })
}

fn cases() -> Vec<Case> {
    let big = json!(1u64 << 62);
    vec![
        // config.json
        config_case(
            "intermediate_size 2^62",
            "beyond",
            "intermediate_size",
            big.clone(),
        ),
        config_case("vocab_size 2^62", "beyond", "vocab_size", big.clone()),
        config_case(
            "hidden_size 2^40",
            "beyond",
            "hidden_size",
            json!(1u64 << 40),
        ),
        config_case(
            "max_position_embeddings 2^62",
            "beyond",
            "max_position_embeddings",
            big,
        ),
        config_case("hidden_size 0", "must be positive", "hidden_size", json!(0)),
        config_case(
            "num_attention_heads 0",
            "must be positive",
            "num_attention_heads",
            json!(0),
        ),
        config_case(
            "heads not dividing hidden",
            "divisible",
            "num_attention_heads",
            json!(5),
        ),
        config_case("hidden_size negative", "config", "hidden_size", json!(-32)),
        config_case(
            "hidden_size fractional",
            "config",
            "hidden_size",
            json!(1.5),
        ),
        config_case("hidden_size a string", "config", "hidden_size", json!("32")),
        config_case(
            "layer_norm_eps negative",
            "layer_norm_eps",
            "layer_norm_eps",
            json!(-1.0),
        ),
        config_case(
            "relative positions",
            "position_embedding_type",
            "position_embedding_type",
            json!("relative_key"),
        ),
        config_case(
            "max_position_embeddings 1",
            "special tokens",
            "max_position_embeddings",
            json!(1),
        ),
        config_case(
            "max_position_embeddings 2",
            "special tokens",
            "max_position_embeddings",
            json!(2),
        ),
        file_case(
            "config not JSON",
            "config",
            "config.json",
            "{ this is not json",
        ),
        file_case("config an array", "model_type", "config.json", "[1, 2, 3]"),
        file_case("config empty", "config", "config.json", ""),
        // sentence-transformers files
        file_case(
            "max_seq_length 0",
            "special tokens",
            "sentence_bert_config.json",
            r#"{"max_seq_length": 0}"#,
        ),
        file_case(
            "max_seq_length 1",
            "special tokens",
            "sentence_bert_config.json",
            r#"{"max_seq_length": 1}"#,
        ),
        file_case(
            "pooling config garbage",
            "error",
            "1_Pooling/config.json",
            "not json",
        ),
        // tokenizer.json
        file_case("tokenizer not JSON", "tokenizer", "tokenizer.json", "{"),
        file_case(
            "tokenizer without model",
            "tokenizer",
            "tokenizer.json",
            r#"{"version": "1.0"}"#,
        ),
        // model.safetensors
        weights_case("weights empty", "safetensors", |_| Vec::new()),
        weights_case("weights truncated", "safetensors", |b| {
            b[..b.len() / 2].to_vec()
        }),
        weights_case("weights 7 bytes", "safetensors", |b| b[..7].to_vec()),
        weights_case("header length past the file", "safetensors", |mut b| {
            b[..8].copy_from_slice(&(1u64 << 40).to_le_bytes());
            b
        }),
        weights_case("header not JSON", "safetensors", |mut b| {
            b[8] = b'#';
            b
        }),
        weights_case("offsets near 2^64", "safetensors", |b| {
            with_header(&b, |h| {
                h["embeddings.word_embeddings.weight"]["data_offsets"] = json!([0u64, u64::MAX - 7])
            })
        }),
        weights_case("unsupported dtype", "safetensors", |b| {
            with_header(&b, |h| {
                h["embeddings.word_embeddings.weight"]["dtype"] = json!("C64")
            })
        }),
        weights_case("wrong shape", "embeddings.word_embeddings.weight", |b| {
            with_header(&b, |h| {
                h["embeddings.word_embeddings.weight"]["shape"] = json!([32, 99])
            })
        }),
        weights_case(
            "integer weights",
            "embeddings.word_embeddings.weight",
            |b| {
                with_header(&b, |h| {
                    h["embeddings.word_embeddings.weight"]["dtype"] = json!("I32")
                })
            },
        ),
        weights_case(
            "missing tensor",
            "encoder.layer.0.attention.self.query.weight",
            |b| {
                with_header(&b, |h| {
                    let obj = h.as_object_mut().unwrap();
                    let info = obj
                        .remove("encoder.layer.0.attention.self.query.weight")
                        .unwrap();
                    obj.insert("renamed".into(), info);
                })
            },
        ),
        weights_case("NaN weights", "non-finite", |b| poison(b, f32::NAN)),
        weights_case("infinite weights", "non-finite", |b| {
            poison(b, f32::INFINITY)
        }),
        // shard indexes naming files outside the folder
        ("shard ../", "refusing file name", shard_index("../OUTSIDE")),
        (
            "shard absolute",
            "refusing file name",
            shard_index("ABSOLUTE"),
        ),
        (
            "shard sub/../../",
            "refusing file name",
            shard_index("sub/../../OUTSIDE"),
        ),
        (
            "shard index not JSON",
            "safetensors",
            Box::new(|d: &Path| {
                std::fs::remove_file(d.join("model.safetensors")).unwrap();
                std::fs::write(d.join("model.safetensors.index.json"), "{").unwrap();
            }),
        ),
        (
            "shard index without weight_map",
            "weight_map",
            Box::new(|d: &Path| {
                std::fs::remove_file(d.join("model.safetensors")).unwrap();
                std::fs::write(d.join("model.safetensors.index.json"), "{}").unwrap();
            }),
        ),
    ]
}

#[test]
fn hostile_model_folders_end_in_typed_errors() {
    let Some(shared) = shared_dir("hostile_model_folders_end_in_typed_errors") else {
        return;
    };
    // The untouched folder works (so every failure below is the case's doing).
    let ok = tiny_bert(&shared);
    let out = embed(ok.path());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cases = cases();
    for (name, needle, make) in &cases {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("model");
        std::fs::create_dir(&dir).unwrap();
        for entry in std::fs::read_dir(ok.path()).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
        }
        make(&dir);
        assert_typed_failure(name, &embed(&dir), needle);
    }
    let peak = children_peak_rss();
    eprintln!(
        "{} hostile model folders: typed errors; peak child RSS {:.0} MiB",
        cases.len(),
        peak as f64 / (1u64 << 20) as f64
    );
    assert!(peak < 1 << 30, "a child process peaked at {peak} bytes");
}

#[test]
fn hostile_requests_end_in_typed_errors() {
    let Some(shared) = shared_dir("hostile_requests_end_in_typed_errors") else {
        return;
    };
    let dir = tiny_bert(&shared);
    let model = dir.path().to_str().unwrap();
    // 90 kB: under the 128 kB a single command-line argument may have.
    let long = "w7 ".repeat(30_000);
    let requests: Vec<(&str, Vec<&str>, &str)> = vec![
        ("empty text", vec!["embed", "", "--model", model], "empty"),
        (
            "blank text",
            vec!["embed", "   ", "--model", model],
            "empty",
        ),
        (
            "unknown backend",
            vec!["embed", "w4", "--model", model, "--backend", "quantum"],
            "quantum",
        ),
        (
            "revision escaping the cache",
            vec!["embed", "w4", "--model", "org/name@../../../../tmp"],
            "refusing revision",
        ),
        (
            "hub id with three parts",
            vec!["embed", "w4", "--model", "a/b/c"],
            "refusing model id",
        ),
        (
            "hub id with ..",
            vec!["embed", "w4", "--model", "org/na..me"],
            "refusing model id",
        ),
        (
            "missing folder",
            vec!["embed", "w4", "--model", "./no/such/dir"],
            "no such directory",
        ),
        (
            "bad quantization",
            vec!["embed", "w4", "--model", model, "--quantize", "int3"],
            "int3",
        ),
    ];
    for (name, args, needle) in &requests {
        let out = cli().args(args).output().unwrap();
        assert_typed_failure(name, &out, needle);
    }
    // Over-long input is truncated to the model's length, not an error.
    let out = cli()
        .args(["embed", &long, "--model", model])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `embed ... | head -c 10`: the reader hangs up early; the CLI ends quietly (SIGPIPE, as Unix
/// tools do) instead of panicking on the broken pipe.
#[cfg(unix)]
#[test]
fn a_closed_stdout_ends_the_cli_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let Some(shared) = shared_dir("a_closed_stdout_ends_the_cli_quietly") else {
        return;
    };
    let dir = tiny_bert(&shared);
    let texts: Vec<String> = (0..1000).map(|i| format!("w{} w5", 4 + i % 90)).collect();
    let mut child = cli()
        .arg("embed")
        .args(&texts)
        .arg("--model")
        .arg(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 10];
    child.stdout.take().unwrap().read_exact(&mut first).unwrap();
    // The pipe's read end is closed here; the CLI is still writing.
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let status = child.wait().unwrap();
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        status.success() || status.signal() == Some(libc::SIGPIPE),
        "{status:?}: {err}"
    );
}
