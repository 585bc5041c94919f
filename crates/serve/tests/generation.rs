//! Completions and chat completions on SmolLM2 (the GGUF in `../shared/models`): the library's
//! text, streaming that reassembles to the non-streamed text, stop strings, and a client that
//! hangs up mid-stream cancelling its generation.

mod common;

use std::time::{Duration, Instant};

use common::{options, Running};
use futures_util::StreamExt;
use ipfs_accelerate::text::{GenerateOptions, TextGenerator};
use ipfs_accelerate::BackendKind;
use ipfs_accelerate_conformance::shared_dir;
use serde_json::{json, Value};

fn smollm(test: &str) -> Option<String> {
    let path =
        shared_dir(test)?.join("models/SmolLM2-135M-Instruct-GGUF/SmolLM2-135M-Instruct.Q4_1.gguf");
    Some(path.to_string_lossy().into_owned())
}

/// The library's generator of `gguf` on the cpu, as the server loads it.
fn cpu_generator(gguf: &str) -> TextGenerator {
    TextGenerator::load(
        gguf,
        &ipfs_accelerate::LoadOptions {
            backends: Some(vec![BackendKind::Cpu]),
            offline: true,
            ..Default::default()
        },
    )
    .unwrap()
}

/// The body of a streamed greedy completion of `prompt` by the served `smol`.
async fn stream_completion(
    client: &reqwest::Client,
    server: &Running,
    prompt: &str,
    max_tokens: usize,
) -> impl futures_util::Stream<Item = reqwest::Result<axum::body::Bytes>> {
    let body = json!({ "model": "smol", "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0, "stream": true });
    let r = client
        .post(server.url("/v1/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    r.bytes_stream()
}

/// The `data:` payloads of a server-sent-event body.
fn sse_data(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: ").or_else(|| l.strip_prefix("data:")))
        .map(str::to_string)
        .collect()
}

async fn post(client: &reqwest::Client, url: &str, body: Value) -> (u16, String) {
    let r = client.post(url).json(&body).send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_and_chat_match_the_library_and_streams_reassemble() {
    let Some(gguf) = smollm("completions_and_chat") else {
        return;
    };
    let server = Running::start(options(&[&format!("smol={gguf}")])).await;
    let client = reqwest::Client::new();

    // Greedy completion = the library's greedy text for the same prompt.
    let generator = cpu_generator(&gguf);
    let expected = generator
        .generate(
            "The capital of France is",
            &GenerateOptions {
                max_new_tokens: 8,
                ..GenerateOptions::default()
            },
            |_| {},
        )
        .unwrap()
        .value;
    drop(generator);
    let (status, body) = post(
        &client,
        &server.url("/v1/completions"),
        json!({ "model": "smol", "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0 }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["text"], expected.text.as_str());
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 8);
    assert_eq!(v["usage"]["prompt_tokens"], expected.prompt_ids.len());

    // A stop string cuts the text before it and ends with finish_reason `stop`.
    let stop = expected
        .text
        .trim_start()
        .chars()
        .nth(2)
        .unwrap()
        .to_string();
    let (status, body) = post(
        &client,
        &server.url("/v1/completions"),
        json!({ "model": "smol", "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0, "stop": [stop] }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    let cut = &expected.text[..expected.text.find(stop.as_str()).unwrap()];
    assert_eq!(v["choices"][0]["text"], cut);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");

    // Sampled chat, same seed: the stream's deltas reassemble to the non-streamed message.
    let request = json!({
        "model": "smol",
        "messages": [
            { "role": "system", "content": "You are brief." },
            { "role": "user", "content": "Name a colour." }
        ],
        "max_tokens": 12,
        "temperature": 0.8,
        "top_p": 0.95,
        "seed": 7,
    });
    let (status, body) = post(
        &client,
        &server.url("/v1/chat/completions"),
        request.clone(),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let whole: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(whole["object"], "chat.completion");
    assert_eq!(whole["choices"][0]["message"]["role"], "assistant");
    let text = whole["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(!text.is_empty());

    let mut streamed_request = request.clone();
    streamed_request["stream"] = json!(true);
    streamed_request["stream_options"] = json!({ "include_usage": true });
    let r = client
        .post(server.url("/v1/chat/completions"))
        .json(&streamed_request)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let events = sse_data(&r.text().await.unwrap());
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let mut reassembled = String::new();
    let mut finish = None;
    for c in &chunks {
        assert_eq!(c["object"], "chat.completion.chunk");
        if let Some(choice) = c["choices"].get(0) {
            if let Some(t) = choice["delta"]["content"].as_str() {
                reassembled.push_str(t);
            }
            if let Some(f) = choice["finish_reason"].as_str() {
                finish = Some(f.to_string());
            }
        }
    }
    assert_eq!(reassembled, text);
    assert_eq!(
        finish.as_deref(),
        whole["choices"][0]["finish_reason"].as_str()
    );
    assert_eq!(chunks.last().unwrap()["usage"], whole["usage"]);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_hanging_up_mid_stream_stops_its_generation() {
    let Some(gguf) = smollm("hang_up") else {
        return;
    };
    let server = Running::start(options(&[&format!("smol={gguf}")])).await;
    let client = reqwest::Client::new();
    let mut body = stream_completion(&client, &server, "Once upon a time", 400).await;
    let first = body.next().await.unwrap().unwrap();
    assert!(!first.is_empty());
    drop(body);

    // The replica frees up without generating the remaining tokens.
    let started = Instant::now();
    loop {
        let health: Value = common::get_json(&client, &server.url("/health")).await;
        if health["models"][0]["replicas"][0]["queue_depth"] == 0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "the generation never stopped"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let metrics = common::get_text(&client, &server.url("/metrics")).await;
    let generated: f64 = metrics
        .lines()
        .find(|l| l.starts_with("ipfs_accelerate_generated_tokens_total{model=\"smol\"}"))
        .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
        .unwrap_or(0.0);
    assert!(
        generated < 400.0,
        "{generated} tokens generated for a client that left"
    );

    // And it still answers.
    let (status, body) = post(
        &client,
        &server.url("/v1/completions"),
        json!({ "model": "smol", "prompt": "Hi", "max_tokens": 2 }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drains_a_stream_in_flight() {
    let Some(gguf) = smollm("shutdown") else {
        return;
    };
    let server = Running::start(options(&[&format!("smol={gguf}")])).await;
    let client = reqwest::Client::new();
    let mut body = stream_completion(&client, &server, "The capital of France is", 12).await;
    let mut text = String::from_utf8(body.next().await.unwrap().unwrap().to_vec()).unwrap();
    let base = server.base.clone();
    let stopping = tokio::spawn(server.shutdown());
    while let Some(chunk) = body.next().await {
        text.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
    }
    stopping.await.unwrap();
    let events = sse_data(&text);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{text}");
    let finish: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    assert!(client.get(format!("{base}/health")).send().await.is_err());
}

/// Concurrent completions decode together (one batch per step; `/metrics` counts a batch of
/// more than one) and each answer is the library's text for its prompt alone: greedy, and
/// seeded sampling with its own seed. A bad request in the crowd fails alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_completions_decode_together_and_match_alone() {
    let Some(gguf) = smollm("concurrent_completions") else {
        return;
    };
    let prompts = [
        "The capital of France is",
        "Water boils at",
        "My favourite colour is",
        "Once upon a time",
    ];
    let gen_options = |i: usize| GenerateOptions {
        max_new_tokens: 10,
        sampling: if i.is_multiple_of(2) {
            ipfs_accelerate::text::Sampling::Greedy
        } else {
            ipfs_accelerate::text::Sampling::Sample {
                temperature: 0.9,
                top_k: None,
                top_p: None,
            }
        },
        seed: 11 + i as u64,
        ..GenerateOptions::default()
    };
    let generator = cpu_generator(&gguf);
    let alone: Vec<String> = (0..prompts.len())
        .map(|i| {
            generator
                .generate(prompts[i], &gen_options(i), |_| {})
                .unwrap()
                .value
                .text
        })
        .collect();
    // The library's batch gives the same texts.
    let requests: Vec<(&str, GenerateOptions)> = (0..prompts.len())
        .map(|i| (prompts[i], gen_options(i)))
        .collect();
    let pairs: Vec<(&str, &GenerateOptions)> = requests.iter().map(|(p, o)| (*p, o)).collect();
    let together: Vec<String> = generator
        .generate_many(&pairs, |_, _| std::ops::ControlFlow::Continue(()))
        .unwrap()
        .into_iter()
        .map(|o| o.value.text)
        .collect();
    assert_eq!(together, alone);
    drop(generator);

    let mut opts = options(&[&format!("smol={gguf}")]);
    opts.batching.max_wait = Duration::from_millis(300);
    let server = Running::start(opts).await;
    let client = reqwest::Client::new();
    let body = |i: usize, prompt: &str| {
        json!({ "model": "smol", "prompt": prompt, "max_tokens": 10,
                "temperature": if i.is_multiple_of(2) { 0.0 } else { 0.9 }, "seed": 11 + i })
    };
    let send = |bodies: Vec<Value>| {
        bodies
            .into_iter()
            .map(|b| {
                let (client, url) = (client.clone(), server.url("/v1/completions"));
                tokio::spawn(async move { post(&client, &url, b).await })
            })
            .collect::<Vec<_>>()
    };
    let batch_count = |metrics: &str| -> f64 {
        metrics
            .lines()
            .find(|l| l.starts_with("ipfs_accelerate_batch_size_sum"))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // Four at once: one batch of four (the worker waits up to 300 ms for the others).
    let tasks = send((0..prompts.len()).map(|i| body(i, prompts[i])).collect());
    for (i, t) in tasks.into_iter().enumerate() {
        let (status, text) = t.await.unwrap();
        assert_eq!(status, 200, "{text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["choices"][0]["text"], alone[i].as_str(), "request {i}");
    }
    let metrics = common::get_text(&client, &server.url("/metrics")).await;
    assert!(
        batch_count(&metrics) >= 4.0,
        "the four requests were not decoded together:\n{metrics}"
    );
    // Two good requests and one too long for the model: it fails alone, they are answered.
    let mut bodies = vec![body(0, prompts[0]), body(1, prompts[1])];
    bodies.push(json!({ "model": "smol", "prompt": "word ".repeat(9000), "max_tokens": 4 }));
    let mut results = Vec::new();
    for t in send(bodies) {
        results.push(t.await.unwrap());
    }
    assert_eq!(results[2].0, 400, "{}", results[2].1);
    for (i, (status, text)) in results[..2].iter().enumerate() {
        assert_eq!(*status, 200, "{text}");
        let v: Value = serde_json::from_str(text).unwrap();
        assert_eq!(v["choices"][0]["text"], alone[i].as_str(), "request {i}");
    }
    server.shutdown().await;
}

/// Continuous batching: a request that arrives while another decodes joins the running batch
/// instead of waiting for it to end — a short completion sent mid-way through a long stream is
/// answered before the stream ends — and both get the library's text for their prompt alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_arriving_mid_decode_joins_the_running_batch() {
    let Some(gguf) = smollm("continuous_batching") else {
        return;
    };
    let (long_prompt, long_tokens) = ("Once upon a time", 96);
    let (short_prompt, short_tokens) = ("The capital of France is", 4);
    let greedy = |n| GenerateOptions {
        max_new_tokens: n,
        ..GenerateOptions::default()
    };
    let generator = cpu_generator(&gguf);
    assert!(generator.joins_running_batches());
    let long_alone = generator
        .generate(long_prompt, &greedy(long_tokens), |_| {})
        .unwrap()
        .value;
    // The long completion must outlast the short one for the order below to mean anything.
    assert!(long_alone.token_ids.len() >= 48, "{long_alone:?}");
    let short_alone = generator
        .generate(short_prompt, &greedy(short_tokens), |_| {})
        .unwrap()
        .value
        .text;
    drop(generator);

    let server = Running::start(options(&[&format!("smol={gguf}")])).await;
    let client = reqwest::Client::new();
    let mut stream = stream_completion(&client, &server, long_prompt, long_tokens).await;
    let mut long_body = String::from_utf8(stream.next().await.unwrap().unwrap().to_vec()).unwrap();
    let long_task = tokio::spawn(async move {
        while let Some(chunk) = stream.next().await {
            long_body.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
        }
        (long_body, Instant::now())
    });
    let (status, short_body) = post(
        &client,
        &server.url("/v1/completions"),
        json!({ "model": "smol", "prompt": short_prompt, "max_tokens": short_tokens,
                "temperature": 0 }),
    )
    .await;
    let short_done = Instant::now();
    assert_eq!(status, 200, "{short_body}");
    let (long_body, long_done) = long_task.await.unwrap();
    assert!(
        short_done < long_done,
        "the short request waited for the long stream to end"
    );
    let short: Value = serde_json::from_str(&short_body).unwrap();
    assert_eq!(short["choices"][0]["text"], short_alone.as_str());
    let long_text: String = sse_data(&long_body)
        .iter()
        .filter(|d| d.as_str() != "[DONE]")
        .map(|d| {
            let v: Value = serde_json::from_str(d).unwrap();
            v["choices"][0]["text"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    assert_eq!(long_text, long_alone.text);
    let metrics = common::get_text(&client, &server.url("/metrics")).await;
    assert!(
        metrics.contains("ipfs_accelerate_generation_joins_total{model=\"smol\"} 1"),
        "the short request is not counted as a join:\n{metrics}"
    );
    server.shutdown().await;
}
