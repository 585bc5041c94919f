//! The server's endpoints over loopback: answers equal the library's, errors have OpenAI's shape
//! and the right status, limits hold, and the server keeps serving after each bad request.

mod common;

use std::time::Duration;

use common::{max_abs_diff, options, sentences, Running};
use ipfs_accelerate::{BackendKind, Pipeline, Task, EMBEDDED_SPEC};
use serde_json::{json, Value};

fn library_embeddings(texts: &[String]) -> Vec<Vec<f32>> {
    let pipe = Pipeline::builder(EMBEDDED_SPEC)
        .task(Task::Embed)
        .backends([BackendKind::Cpu])
        .env_override(false)
        .build()
        .unwrap();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    pipe.embed(&refs, true).unwrap().value
}

fn vectors(v: &Value) -> Vec<Vec<f32>> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|row| {
            row.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect()
        })
        .collect()
}

fn from_base64(s: &str) -> Vec<f32> {
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD.decode(s).unwrap();
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

async fn post(client: &reqwest::Client, url: &str, body: Value) -> (u16, Value) {
    let r = client.post(url).json(&body).send().await.unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// Asserts an OpenAI-shaped error with `status` whose message contains `needle`.
fn assert_error(got: (u16, Value), status: u16, needle: &str) {
    assert_eq!(got.0, status, "{}", got.1);
    let message = got.1["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(needle),
        "{status}: `{message}` lacks `{needle}`"
    );
    assert!(got.1["error"]["type"].is_string(), "{}", got.1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embeddings_equal_the_library_in_every_format() {
    let server = Running::start(options(&["embedded"])).await;
    let client = reqwest::Client::new();
    let texts = sentences("embeddings_equal_the_library");
    let expected = library_embeddings(&texts);

    let (status, body) = post(
        &client,
        &server.url("/v1/embeddings"),
        json!({ "model": "embedded", "input": texts }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], "list");
    assert_eq!(body["model"], "embedded");
    assert!(body["usage"]["prompt_tokens"].as_u64().unwrap() > texts.len() as u64);
    let data = body["data"].as_array().unwrap();
    let got: Vec<Vec<f32>> = data
        .iter()
        .enumerate()
        .map(|(i, d)| {
            assert_eq!(d["index"], i);
            assert_eq!(d["object"], "embedding");
            vectors(&json!([d["embedding"]])).remove(0)
        })
        .collect();
    assert!(max_abs_diff(&got, &expected) <= 1e-5);

    let (status, body) = post(
        &client,
        &server.url("/v1/embeddings"),
        json!({ "model": "embedded", "input": texts, "encoding_format": "base64" }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let got: Vec<Vec<f32>> = body["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| from_base64(d["embedding"].as_str().unwrap()))
        .collect();
    assert!(max_abs_diff(&got, &expected) <= 1e-5);

    // text-embeddings-inference's /embed: one string or a list, normalised by default.
    let (status, body) = post(&client, &server.url("/embed"), json!({ "inputs": texts })).await;
    assert_eq!(status, 200, "{body}");
    assert!(max_abs_diff(&vectors(&body), &expected) <= 1e-5);
    let (status, body) = post(
        &client,
        &server.url("/embed"),
        json!({ "inputs": texts[0] }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(max_abs_diff(&vectors(&body), &expected[..1]) <= 1e-5);
    let (status, body) = post(
        &client,
        &server.url("/embed"),
        json!({ "inputs": texts[0], "normalize": false }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let norm: f32 = vectors(&body)[0].iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!(
        (norm - 1.0).abs() > 1e-3,
        "normalize: false gave a unit vector"
    );

    let (status, body) = post(&client, &server.url("/v1/models"), json!({})).await;
    assert_eq!(status, 405, "{body}");
    let models: Value = common::get_json(&client, &server.url("/v1/models")).await;
    assert_eq!(models["data"][0]["id"], "embedded");
    assert_eq!(models["data"][0]["kind"], "encoder");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_typed_errors_and_the_server_keeps_serving() {
    let mut opts = options(&["embedded"]);
    opts.max_inputs = 4;
    opts.max_body_bytes = 64 * 1024;
    let server = Running::start(opts).await;
    let client = reqwest::Client::new();
    let url = server.url("/v1/embeddings");
    let ok = json!({ "model": "embedded", "input": "still serving" });

    let cases: Vec<(Value, u16, &str)> = vec![
        (
            json!({ "model": "nope", "input": "x" }),
            404,
            "not served here",
        ),
        (json!({ "model": "embedded", "input": [] }), 400, "no text"),
        (
            json!({ "model": "embedded", "input": "" }),
            400,
            "empty string",
        ),
        (
            json!({ "model": "embedded", "input": [1, 2, 3] }),
            400,
            "token-id input",
        ),
        (
            json!({ "model": "embedded", "input": ["a", "b", "c", "d", "e"] }),
            413,
            "at most 4",
        ),
        (
            json!({ "model": "embedded", "input": "x", "encoding_format": "hex" }),
            400,
            "encoding_format",
        ),
        (
            json!({ "model": "embedded", "input": "x", "dimensions": 3 }),
            400,
            "dimensions",
        ),
        (json!({ "input": "x" }), 400, "model"),
        (
            json!({ "model": "embedded", "input": "word ".repeat(600) }),
            413,
            "truncate",
        ),
    ];
    for (body, status, needle) in cases {
        assert_error(post(&client, &url, body.clone()).await, status, needle);
        let (s, b) = post(&client, &url, ok.clone()).await;
        assert_eq!(s, 200, "after {body}: {b}");
    }
    // Over-long input is cut when asked.
    let (s, b) = post(
        &client,
        &url,
        json!({ "model": "embedded", "input": "word ".repeat(600), "truncate": true }),
    )
    .await;
    assert_eq!(s, 200, "{b}");

    // Malformed JSON, a body over the limit, a wrong content, an unknown route, a wrong task.
    let r = client
        .post(&url)
        .header("content-type", "application/json")
        .body("{\"model\": \"embedded\", \"input\": ")
        .send()
        .await
        .unwrap();
    let got = (r.status().as_u16(), r.json::<Value>().await.unwrap());
    assert_error(got, 400, "invalid JSON");
    let big = json!({ "model": "embedded", "input": "x".repeat(100 * 1024) });
    let r = client.post(&url).json(&big).send().await.unwrap();
    let got = (r.status().as_u16(), r.json::<Value>().await.unwrap());
    assert_error(got, 413, "");
    assert_error(
        post(&client, &server.url("/v1/nothing"), json!({})).await,
        404,
        "no such endpoint",
    );
    assert_error(
        post(
            &client,
            &server.url("/v1/chat/completions"),
            json!({ "model": "embedded", "messages": [{ "role": "user", "content": "hi" }] }),
        )
        .await,
        400,
        "encoder model",
    );
    assert_error(
        post(&client, &server.url("/predict"), json!({ "inputs": "hi" })).await,
        400,
        "sequence-classification head",
    );
    let (s, _) = post(&client, &url, ok).await;
    assert_eq!(s, 200);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_key_guards_the_api_but_not_health() {
    let mut opts = options(&["embedded"]);
    opts.api_key = Some("s3cret".into());
    let server = Running::start(opts).await;
    let client = reqwest::Client::new();
    let body = json!({ "model": "embedded", "input": "hello" });
    let url = server.url("/v1/embeddings");
    let r = client.post(&url).json(&body).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let r = client
        .post(&url)
        .bearer_auth("wrong")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_error(
        (r.status().as_u16(), r.json().await.unwrap()),
        401,
        "API key",
    );
    let r = client
        .post(&url)
        .bearer_auth("s3cret")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let r = client.get(server.url("/health")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_answers_503_with_retry_after_and_recovers() {
    let mut opts = options(&["embedded"]);
    opts.queue_capacity = 1;
    opts.batching.enabled = false;
    let server = Running::start(opts).await;
    let client = reqwest::Client::new();
    let texts: Vec<String> = (0..200)
        .map(|i| {
            format!("sentence number {i} about nothing in particular, long enough to take a while")
        })
        .collect();
    let mut tasks = Vec::new();
    for _ in 0..12 {
        let client = client.clone();
        let url = server.url("/v1/embeddings");
        let body = json!({ "model": "embedded", "input": texts });
        tasks.push(tokio::spawn(async move {
            let r = client.post(&url).json(&body).send().await.unwrap();
            let retry = r.headers().get("retry-after").is_some();
            (r.status().as_u16(), retry)
        }));
    }
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.unwrap());
    }
    let refused = statuses.iter().filter(|(s, _)| *s == 503).count();
    assert!(refused > 0, "no request was refused: {statuses:?}");
    assert!(statuses
        .iter()
        .all(|(s, retry)| *s == 200 || (*s == 503 && *retry)));
    let (s, _) = post(
        &client,
        &server.url("/v1/embeddings"),
        json!({ "model": "embedded", "input": "after the storm" }),
    )
    .await;
    assert_eq!(s, 200);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_metrics_describe_the_replicas() {
    let server = Running::start(options(&["embedded"])).await;
    let client = reqwest::Client::new();
    let (s, _) = post(
        &client,
        &server.url("/v1/embeddings"),
        json!({ "model": "embedded", "input": ["a", "b"] }),
    )
    .await;
    assert_eq!(s, 200);
    let health: Value = common::get_json(&client, &server.url("/health")).await;
    assert_eq!(health["status"], "ok");
    let replica = &health["models"][0]["replicas"][0];
    assert_eq!(replica["backend"], "cpu");
    assert_eq!(replica["healthy"], true);
    let metrics = common::get_text(&client, &server.url("/metrics")).await;
    for name in [
        "ipfs_accelerate_requests_total{endpoint=\"/v1/embeddings\",model=\"embedded\",status=\"200\"} 1",
        "ipfs_accelerate_request_duration_seconds_bucket",
        "ipfs_accelerate_batch_size_sum{model=\"embedded\"} 2",
        "ipfs_accelerate_queue_depth{backend=\"cpu\",model=\"embedded\",replica=\"0\"} 0",
        "ipfs_accelerate_replica_healthy",
    ] {
        assert!(metrics.contains(name), "{name} missing from\n{metrics}");
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_the_load_and_an_unusable_backend_is_listed_with_its_reason() {
    let mut opts = options(&["embedded"]);
    opts.replicas = ipfs_accelerate_serve::ReplicaSpec::parse_list("cpu:2,cuda:1").unwrap();
    opts.batching.enabled = false;
    let server = Running::start(opts).await;
    let client = reqwest::Client::new();
    let mut tasks = Vec::new();
    for i in 0..32 {
        let (client, url) = (client.clone(), server.url("/v1/embeddings"));
        tasks.push(tokio::spawn(async move {
            let body =
                json!({ "model": "embedded", "input": format!("sentence {i} of a small crowd") });
            client
                .post(&url)
                .json(&body)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), 200);
    }
    let health: Value = common::get_json(&client, &server.url("/health")).await;
    let model = &health["models"][0];
    assert_eq!(model["healthy_replicas"], 2, "{health}");
    for r in model["replicas"].as_array().unwrap() {
        assert!(
            r["served"].as_u64().unwrap() > 0,
            "a replica got no work: {health}"
        );
    }
    let not_loaded = &model["not_loaded"][0];
    assert_eq!(not_loaded["backend"], "cuda", "{health}");
    assert!(!not_loaded["reason"].as_str().unwrap().is_empty());
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uploaded_image_is_classified_as_the_library_classifies_it() {
    let Some(shared) = ipfs_accelerate_conformance::shared_dir("image_classification") else {
        return;
    };
    let model = shared.join("fixtures/vit/image_classification");
    let image = shared.join("fixtures/image_processors/image.png");
    let server = Running::start(options(&[&format!("vit={}", model.display())])).await;
    let library = ipfs_accelerate::vision::ImageClassifier::load(
        &model.to_string_lossy(),
        &ipfs_accelerate::LoadOptions {
            backends: Some(vec![BackendKind::Cpu]),
            offline: true,
            ..Default::default()
        },
    )
    .unwrap();
    let expected = library
        .classify_files(&[&image], 2)
        .unwrap()
        .value
        .remove(0);
    let client = reqwest::Client::new();
    let form = reqwest::multipart::Form::new()
        .text("model", "vit")
        .text("top_k", "2")
        .part(
            "file",
            reqwest::multipart::Part::bytes(std::fs::read(&image).unwrap()).file_name("image.png"),
        );
    let r = client
        .post(server.url("/v1/images/classifications"))
        .multipart(form)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let v: Value = r.json().await.unwrap();
    let got = v["predictions"].as_array().unwrap();
    assert_eq!(got.len(), expected.len());
    for (g, e) in got.iter().zip(&expected) {
        assert_eq!(g["label"], e.label.as_str());
        assert!((g["score"].as_f64().unwrap() as f32 - e.score).abs() <= 1e-6);
    }
    // Not an image: a typed 400; a form without the file: 400 naming it.
    let form = reqwest::multipart::Form::new().text("model", "vit").part(
        "file",
        reqwest::multipart::Part::bytes(b"not a png".to_vec()),
    );
    let r = client
        .post(server.url("/v1/images/classifications"))
        .multipart(form)
        .send()
        .await
        .unwrap();
    assert_error(
        (r.status().as_u16(), r.json().await.unwrap()),
        400,
        "uploaded image",
    );
    let form = reqwest::multipart::Form::new().text("model", "vit");
    let r = client
        .post(server.url("/v1/images/classifications"))
        .multipart(form)
        .send()
        .await
        .unwrap();
    assert_error(
        (r.status().as_u16(), r.json().await.unwrap()),
        400,
        "`file`",
    );
    server.shutdown().await;
}
