//! The `ipfs-accelerate` binary, run as a user would, on the embedded default model.

use std::process::Command;

fn cli() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ipfs-accelerate"));
    c.env_remove("IPFS_ACCELERATE_BACKENDS")
        .env_remove("IPFS_ACCELERATE_MODEL");
    c
}

/// Runs the binary with `args`, asserting that it succeeds.
fn run_ok(args: &[&str]) -> std::process::Output {
    let out = cli().args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn embed_prints_one_vector_per_text() {
    let out = run_ok(&["embed", "--normalize", "Hello, world!", "Rust is fast."]);
    let v: Vec<Vec<f32>> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v.len(), 2);
    assert_eq!(v[0].len(), 384);
    let norm: f32 = v[0].iter().map(|x| x * x).sum();
    assert!((norm - 1.0).abs() < 1e-4);
}

#[test]
fn similarity_matrix_and_metrics() {
    let out = run_ok(&[
        "embed",
        "--similarity",
        "--metrics",
        "--backend",
        "cuda,cpu",
        "A man is playing a guitar.",
        "Someone plays music.",
        "The stock market fell.",
    ]);
    let m: Vec<Vec<f32>> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(m.len(), 3);
    assert!((m[1][1] - 1.0).abs() < 1e-4);
    assert!(m[0][1] > m[0][2]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("inference") && err.contains("backend      cpu"),
        "{err}"
    );
    assert!(err.contains("skipped backend cuda"), "{err}");
}

#[test]
fn devices_lists_every_backend_without_panicking() {
    let out = cli().arg("devices").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for name in [
        "cpu",
        "cuda",
        "rocm",
        "metal",
        "wgpu",
        "webgpu",
        "onnx-openvino",
        "webnn",
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(name)),
            "{name} missing:\n{text}"
        );
    }
    assert!(text
        .lines()
        .any(|l| l.starts_with("cpu") && l.contains("available")));
    let json = cli().args(["devices", "--json"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert!(v.as_array().unwrap().len() >= 8);
}

#[test]
fn bad_model_and_empty_text_fail_cleanly() {
    let out = cli()
        .args(["--offline", "--model", "/nonexistent/model", "embed", "x"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with("error:") && err.contains("/nonexistent/model"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");

    let out = cli().args(["embed", ""]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("empty"), "{err}");
}

/// The SmolLM2 GGUF in ../shared, when present.
fn smollm2() -> Option<std::path::PathBuf> {
    let shared = std::env::var_os("IPFS_ACCELERATE_SHARED")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared")
        });
    let gguf = shared.join("models/SmolLM2-135M-Instruct-GGUF/SmolLM2-135M-Instruct.Q4_1.gguf");
    if gguf.is_file() {
        return Some(gguf);
    }
    assert!(
        std::env::var("IPFS_ACCELERATE_REQUIRE_SHARED").as_deref() != Ok("1"),
        "{} missing (IPFS_ACCELERATE_REQUIRE_SHARED=1)",
        gguf.display()
    );
    eprintln!("skipped: needs {}", gguf.display());
    None
}

#[test]
fn generate_streams_exactly_the_greedy_continuation_from_a_gguf() {
    let Some(gguf) = smollm2() else { return };
    let out = run_ok(&[
        "generate",
        "--model",
        gguf.to_str().unwrap(),
        "--max-new-tokens",
        "16",
        "--ignore-eos",
        "--metrics",
        "The capital of France is",
    ]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        " Paris.\n\nThe answer is: 2018-01"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("16 new tokens at"), "{err}");
}

#[test]
fn generate_rejects_an_empty_prompt_and_the_embedded_encoder() {
    let Some(gguf) = smollm2() else { return };
    let out = cli()
        .args(["generate", "--model", gguf.to_str().unwrap(), ""])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("empty prompt"));
    let out = cli().args(["generate", "hello"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("decoder LM"));
}

#[test]
fn generate_with_int8_weights_keeps_the_answer_and_reports_the_memory() {
    let Some(gguf) = smollm2() else { return };
    let model = gguf.to_str().unwrap();
    let args = [
        "generate",
        "--model",
        model,
        "--max-new-tokens",
        "3",
        "--quantize",
        "int8",
    ];
    let out = run_ok(&[&args[..], &["--metrics", "The capital of France is"]].concat());
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with(" Paris"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    let line = err
        .lines()
        .find(|l| l.starts_with("weights"))
        .expect("weight memory line");
    let mib: Vec<f64> = line
        .split_whitespace()
        .filter_map(|w| w.trim_start_matches('(').parse().ok())
        .collect();
    assert_eq!(mib.len(), 2, "{line}");
    assert!(mib[0] < mib[1] * 0.6, "{line}");
    let out = cli()
        .args([
            "generate",
            "--model",
            gguf.to_str().unwrap(),
            "--quantize",
            "int3",
            "hi",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown quantization"));
}

/// `-` reads the texts from stdin and `--file` from a file, one per line (blank lines skipped);
/// the result equals giving them as arguments.
#[test]
fn embed_reads_stdin_and_files_line_by_line() {
    use std::io::Write;
    let direct = run_ok(&["embed", "first line", "second line"]).stdout;
    let mut child = cli()
        .args(["embed", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"first line\n\nsecond line\r\n")
        .unwrap();
    let piped = child.wait_with_output().unwrap();
    assert!(
        piped.status.success(),
        "{}",
        String::from_utf8_lossy(&piped.stderr)
    );
    assert_eq!(piped.stdout, direct, "stdin");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("texts.txt");
    std::fs::write(&file, "second line\n").unwrap();
    let from_file = run_ok(&["embed", "first line", "--file", file.to_str().unwrap()]).stdout;
    assert_eq!(from_file, direct, "--file");
    // An empty stdin, or a missing file: a clear error, nothing printed.
    let out = cli()
        .args(["embed", "-"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success() && out.stdout.is_empty());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no input"));
    let out = cli()
        .args(["embed", "--file", "/nonexistent/texts.txt"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/texts.txt"));
}

/// The global flags sit under their own heading, and `generate --help` shows no default model
/// it would reject.
#[test]
fn help_separates_global_options_and_shows_honest_defaults() {
    let out = run_ok(&["generate", "--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("Global options:"), "{help}");
    assert!(!help.contains("[default: embedded]"), "{help}");
    let options = help.split("Global options:").next().unwrap();
    assert!(!options.contains("--quantize"), "{help}");
}

/// `--format json` prints one document with the result and the metrics; `--format text` one line
/// per item.
#[test]
fn format_json_and_text() {
    let out = run_ok(&["embed", "--format", "json", "one", "two"]);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["model"], "embedded");
    assert_eq!(doc["result"].as_array().unwrap().len(), 2);
    assert!(doc["metrics"]["total_ms"].as_f64().unwrap() > 0.0);
    assert_eq!(doc["metrics"]["items"], 2);
    let out = run_ok(&["embed", "--format", "text", "one", "two"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert_eq!(lines[0].split(' ').count(), 384);
    let Some(gguf) = smollm2() else { return };
    let out = run_ok(&[
        "generate",
        "--model",
        gguf.to_str().unwrap(),
        "--max-new-tokens",
        "4",
        "--format",
        "json",
        "The capital of France is",
    ]);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(doc["result"]["text"]
        .as_str()
        .unwrap()
        .starts_with(" Paris"));
    assert_eq!(doc["result"]["token_ids"].as_array().unwrap().len(), 4);
    assert!(doc["metrics"]["backend"].is_string());
}
