//! `ipfs-accelerate serve` as users run it: the binary on a free loopback port, the official
//! `openai` Python client against it, and SIGTERM ending it cleanly.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::cli;
use serde_json::Value;

/// A running `serve` child and the address it printed.
struct Served {
    child: Child,
    address: String,
    log: std::sync::mpsc::Receiver<String>,
}

fn serve(args: &[&str]) -> Served {
    let child = cli()
        .arg("serve")
        .args(["--port", "0"])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut child = child;
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let (tx, log) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut served = Served {
        child,
        address: String::new(),
        log,
    };
    let started = Instant::now();
    loop {
        let line = served
            .log
            .recv_timeout(Duration::from_secs(600).saturating_sub(started.elapsed()))
            .unwrap_or_else(|_| panic!("serve {args:?} never printed its address"));
        if let Some(address) = line.strip_prefix("listening on http://") {
            served.address = address.to_string();
            return served;
        }
    }
}

impl Drop for Served {
    /// A test that fails midway still ends its server.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A minimal HTTP/1.1 exchange: (status, body).
fn http(address: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(address).unwrap();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response[9..12].parse().unwrap();
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

#[cfg(unix)]
fn terminate(child: &mut Child) -> std::process::ExitStatus {
    let pid = i32::try_from(child.id()).unwrap();
    // SAFETY: kill(2) with a valid pid of our own child and a standard signal has no memory effects.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "serve did not stop after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(unix)]
#[test]
fn serve_answers_then_stops_cleanly_on_sigterm() {
    let mut served = serve(&["--model", "embedded"]);
    let (status, body) = http(
        &served.address,
        "POST",
        "/v1/embeddings",
        r#"{"model": "embedded", "input": ["A man is playing a guitar."]}"#,
    );
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["data"][0]["embedding"].as_array().unwrap().len(), 384);
    let (status, _) = http(&served.address, "GET", "/health", "");
    assert_eq!(status, 200);
    let status = terminate(&mut served.child);
    assert!(status.success(), "serve exited with {status}");
    let log: Vec<String> = served.log.try_iter().collect();
    assert!(log.iter().any(|l| l == "stopped"), "{log:?}");
}

#[test]
fn serve_refuses_a_bad_replica_list_and_a_duplicate_name() {
    let out = cli()
        .args(["serve", "--port", "0", "--replicas", "cpu:zero"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a count"));
    let out = cli()
        .args([
            "serve", "--port", "0", "--model", "embedded", "--model", "embedded",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("two models are named"));
    let out = cli()
        .args(["embed", "x", "--model", "embedded", "--model", "embedded"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("only `serve` takes several"));
}

/// The peers' Python (`ipfs_accelerate_bench::peers::python`) when it has the `openai` package.
fn openai_python() -> Option<PathBuf> {
    let python = ipfs_accelerate_bench::peers::python();
    let has_openai = std::process::Command::new(&python)
        .args(["-c", "import openai"])
        .status()
        .is_ok_and(|s| s.success());
    let required = std::env::var("IPFS_ACCELERATE_REQUIRE_OPENAI").as_deref() == Ok("1");
    if !has_openai {
        assert!(
            !required,
            "{} has no `openai` package (cargo xtask fetch-peers --only openai)",
            python.display()
        );
        eprintln!("skipped: no python with the openai package");
        return None;
    }
    Some(python)
}

#[cfg(unix)]
#[test]
fn the_openai_python_client_gets_the_library_answers() {
    let Some(python) = openai_python() else {
        return;
    };
    let Some(shared) = ipfs_accelerate_conformance::shared_dir("the_openai_python_client") else {
        return;
    };
    let sentences = shared.join("refs/minilm_public_sentences.txt");
    let gguf = shared.join("models/SmolLM2-135M-Instruct-GGUF/SmolLM2-135M-Instruct.Q4_1.gguf");
    let smol = format!("smol={}", gguf.display());
    let mut served = serve(&["--model", "embedded", "--model", &smol]);
    let out = std::process::Command::new(&python)
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tools/openai_client_check.py"
        ))
        .arg("--base-url")
        .arg(format!("http://{}/v1", served.address))
        .args([
            "--embed-model",
            "embedded",
            "--chat-model",
            "smol",
            "--sentences",
        ])
        .arg(&sentences)
        .output()
        .unwrap();
    let transcript = String::from_utf8_lossy(&out.stderr);
    eprintln!("{transcript}");
    assert!(out.status.success(), "{transcript}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();

    let texts: Vec<String> = std::fs::read_to_string(&sentences)
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let pipe = ipfs_accelerate::Pipeline::builder(ipfs_accelerate::EMBEDDED_SPEC)
        .task(ipfs_accelerate::Task::Embed)
        .backends([ipfs_accelerate::BackendKind::Cpu])
        .env_override(false)
        .build()
        .unwrap();
    let expected = pipe.embed(&refs, true).unwrap().value;
    let got = v["embeddings"].as_array().unwrap();
    assert_eq!(got.len(), expected.len());
    for (g, e) in got.iter().zip(&expected) {
        let g: Vec<f32> = g
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect();
        let worst = g
            .iter()
            .zip(e)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(worst <= 1e-5, "embedding differs by {worst}");
    }
    assert_eq!(
        v["chat_stream"], v["chat"],
        "the stream does not reassemble"
    );
    assert!(!v["chat"].as_str().unwrap().is_empty());
    assert_eq!(v["unknown_model_error"], 404);
    let status = terminate(&mut served.child);
    assert!(status.success());
}
