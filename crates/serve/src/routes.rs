//! The HTTP endpoints.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, MatchedPath, Multipart, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::stream::{self, Stream, StreamExt};
use ipfs_accelerate::text::{ChatMessage, GenerateOptions, Sampling};
use serde_json::json;
use tokio::sync::{mpsc, oneshot};

use crate::engine::{Engine, ModelKind};
use crate::error::ApiError;
use crate::generate::{Event, Finish, GenerateJob, Prompt};
use crate::pool::{Call, EncodeJob, EncodeTask, Envelope, Pool, Work};
use crate::wire::*;
use crate::Server;

/// The model a response was for, read by the request-metrics layer.
#[derive(Clone)]
struct ModelLabel(String);

/// The server's router: every endpoint, the API-key check on the `/v1`, `/embed` and `/predict`
/// routes (not on `/health` and `/metrics`), the body limit, and request metrics. Mount it in
/// your own axum application, or run it with [`crate::serve`].
pub fn router(server: Arc<Server>) -> Router {
    let api = Router::new()
        .route("/v1/models", get(list_models))
        .route("/v1/embeddings", post(embeddings))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/audio/transcriptions", post(transcriptions))
        .route("/v1/images/classifications", post(image_classifications))
        .route("/v1/images/detections", post(image_detections))
        .route("/v1/images/zero-shot", post(image_zero_shot))
        .route("/embed", post(tei_embed))
        .route("/predict", post(tei_predict))
        .route_layer(middleware::from_fn_with_state(server.clone(), authorize));
    Router::new()
        .merge(api)
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(server.clone(), observe))
        .layer(DefaultBodyLimit::max(server.options.max_body_bytes))
        .with_state(server)
}

async fn authorize(
    State(server): State<Arc<Server>>,
    headers: HeaderMap,
    request: Request,
    next: Next,
) -> Response {
    if let Some(key) = &server.options.api_key {
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or_default();
        if !constant_time_eq(given.as_bytes(), key.as_bytes()) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(request).await
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// Counts and times every request by endpoint, model and status.
async fn observe(State(server): State<Arc<Server>>, request: Request, next: Next) -> Response {
    let endpoint = request
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "unmatched".into());
    let started = Instant::now();
    server.metrics.in_flight(1.0);
    let response = next.run(request).await;
    server.metrics.in_flight(-1.0);
    let model = response
        .extensions()
        .get::<ModelLabel>()
        .map(|m| m.0.clone())
        .unwrap_or_default();
    server.metrics.observe_request(
        &endpoint,
        &model,
        response.status().as_u16(),
        started.elapsed(),
    );
    response
}

async fn not_found() -> ApiError {
    ApiError {
        status: StatusCode::NOT_FOUND,
        ..ApiError::bad_request(
            "no such endpoint (see GET /v1/models, POST /v1/embeddings, /v1/completions, \
             /v1/chat/completions, /v1/audio/transcriptions, /v1/images/{classifications,\
             detections,zero-shot}, /embed, /predict, GET /health, /metrics)",
        )
    }
}

/// Parses a JSON body; a body over the limit is 413, malformed JSON 400 naming the problem.
fn parse<T: serde::de::DeserializeOwned>(
    body: Result<Bytes, BytesRejection>,
) -> Result<T, ApiError> {
    let bytes = body.map_err(|rejection| {
        let status = rejection.status();
        let message = rejection.body_text();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large(message)
        } else {
            ApiError {
                status,
                ..ApiError::bad_request(message)
            }
        }
    })?;
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))
}

fn with_model(model: &str, response: impl IntoResponse) -> Response {
    let mut response = response.into_response();
    response
        .extensions_mut()
        .insert(ModelLabel(model.to_string()));
    response
}

impl Server {
    /// The pool serving `name` as a `kind` model.
    fn pool(&self, name: &str, kind: ModelKind, endpoint: &str) -> Result<Arc<Pool>, ApiError> {
        let pool = self
            .pools
            .iter()
            .find(|p| p.name == name)
            .ok_or_else(|| ApiError::unknown_model(name, &self.model_names()))?;
        if pool.kind != kind {
            return Err(ApiError::wrong_task(name, pool.kind.name(), endpoint));
        }
        Ok(pool.clone())
    }

    /// The pool of `name`, or the first `kind` model when no name is given (TEI requests).
    fn pool_or_default(
        &self,
        name: Option<&str>,
        kind: ModelKind,
        endpoint: &str,
    ) -> Result<Arc<Pool>, ApiError> {
        match name {
            Some(n) => self.pool(n, kind, endpoint),
            None => self
                .pools
                .iter()
                .find(|p| p.kind == kind)
                .cloned()
                .ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "no {} model is served; {endpoint} needs one",
                        kind.name()
                    ))
                }),
        }
    }

    fn model_names(&self) -> Vec<String> {
        self.pools.iter().map(|p| p.name.clone()).collect()
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.options.request_timeout
    }

    fn submit(&self, pool: &Pool, work: Work) -> Result<Instant, ApiError> {
        let deadline = self.deadline();
        pool.submit(Envelope::new(work, deadline))
            .map_err(|refused| refused.0)?;
        Ok(deadline)
    }

    /// Waits for a one-shot answer until the deadline (dropping the receiver on timeout, which the
    /// worker sees and skips the request).
    async fn answer<T>(
        &self,
        deadline: Instant,
        rx: oneshot::Receiver<Result<T, ApiError>>,
    ) -> Result<T, ApiError> {
        match tokio::time::timeout_at(deadline.into(), rx).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(ApiError::internal(
                "the replica dropped the request without an answer",
            )),
            Err(_) => Err(ApiError::timeout(
                self.options.request_timeout.as_secs_f64(),
            )),
        }
    }

    /// Checks a request's texts against the limits; counts their tokens with the model's
    /// tokenizer and refuses over-long ones unless `truncate`.
    fn check_texts(
        &self,
        pool: &Pool,
        texts: &[String],
        truncate: bool,
    ) -> Result<usize, ApiError> {
        if texts.is_empty() {
            return Err(ApiError::bad_request("the input holds no text"));
        }
        if texts.len() > self.options.max_inputs {
            return Err(ApiError::too_large(format!(
                "{} inputs in one request; the server takes at most {} (--max-inputs)",
                texts.len(),
                self.options.max_inputs
            )));
        }
        for (i, t) in texts.iter().enumerate() {
            if t.is_empty() {
                return Err(ApiError::bad_request(format!(
                    "input {i} is an empty string"
                )));
            }
            if t.len() > self.options.max_input_bytes {
                return Err(ApiError::too_large(format!(
                    "input {i} is {} bytes; the server takes at most {} per input (--max-input-bytes)",
                    t.len(),
                    self.options.max_input_bytes
                )));
            }
        }
        let Engine::Encoder(pipe) = pool.engine() else {
            return Ok(0);
        };
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let encoded = pipe
            .tokenizer()
            .encode_batch(&refs)
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        if !truncate {
            if let Some(i) = encoded.truncated.iter().position(|t| *t) {
                return Err(ApiError::too_large(format!(
                    "input {i} is longer than the model's {} tokens; send `truncate: true` to cut it",
                    pipe.tokenizer().max_len()
                )));
            }
        }
        Ok(encoded.attention_mask.iter().filter(|m| **m != 0).count())
    }

    /// Generation options from a request's sampling fields.
    fn generation(
        &self,
        fields: &SamplingFields,
        default_max_tokens: usize,
    ) -> Result<(GenerateOptions, Vec<String>), ApiError> {
        if fields.n.is_some_and(|n| n != 1) {
            return Err(ApiError::bad_request("only n = 1 is supported"));
        }
        let max_new_tokens = fields
            .max_completion_tokens
            .or(fields.max_tokens)
            .unwrap_or(default_max_tokens);
        if max_new_tokens == 0 || max_new_tokens > self.options.max_tokens_limit {
            return Err(ApiError::bad_request(format!(
                "max_tokens must be between 1 and {} (--max-tokens-limit)",
                self.options.max_tokens_limit
            )));
        }
        let temperature = fields.temperature.unwrap_or(1.0);
        if !(0.0..=2.0).contains(&temperature) {
            return Err(ApiError::bad_request("temperature must be between 0 and 2"));
        }
        let top_p = fields.top_p.unwrap_or(1.0);
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(ApiError::bad_request("top_p must be in (0, 1]"));
        }
        let repetition_penalty = fields.repetition_penalty.unwrap_or(1.0);
        if !(repetition_penalty > 0.0 && repetition_penalty.is_finite()) {
            return Err(ApiError::bad_request("repetition_penalty must be positive"));
        }
        let stop = fields
            .stop
            .clone()
            .map(OneOrMany::into_vec)
            .unwrap_or_default();
        if stop.len() > 4 {
            return Err(ApiError::bad_request("stop holds at most 4 strings"));
        }
        let sampling = if temperature == 0.0 || fields.top_k == Some(1) {
            Sampling::Greedy
        } else {
            Sampling::Sample {
                temperature,
                top_k: fields.top_k,
                top_p: (top_p < 1.0).then_some(top_p),
            }
        };
        let seed = fields.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0)
        });
        Ok((
            GenerateOptions {
                max_new_tokens,
                sampling,
                repetition_penalty,
                seed,
                chat: false,
                stop_at_eos: true,
            },
            stop,
        ))
    }

    fn next_id(&self, prefix: &str) -> String {
        let n = self
            .request_ids
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        format!("{prefix}-{:x}{n:08x}", self.started_unix)
    }
}

async fn list_models(State(server): State<Arc<Server>>) -> Json<serde_json::Value> {
    let data: Vec<serde_json::Value> = server
        .pools
        .iter()
        .map(|p| {
            json!({
                "id": p.name,
                "object": "model",
                "created": server.started_unix,
                "owned_by": "ipfs-accelerate",
                "kind": p.kind,
                "backends": p.replicas.iter().map(|r| r.backend.clone()).collect::<Vec<_>>(),
            })
        })
        .collect();
    Json(json!({ "object": "list", "data": data }))
}

async fn health(State(server): State<Arc<Server>>) -> Response {
    let mut all_ok = true;
    let models: Vec<serde_json::Value> = server
        .pools
        .iter()
        .map(|p| {
            let healthy = p.healthy();
            all_ok &= healthy > 0;
            json!({
                "name": p.name,
                "kind": p.kind,
                "healthy_replicas": healthy,
                "replicas": p.replicas.iter().map(|r| json!({
                    "index": r.index,
                    "backend": r.backend,
                    "healthy": r.failure().is_none(),
                    "reason": r.failure(),
                    "queue_depth": r.depth(),
                    "served": r.served(),
                    "ms_per_item": r.time_per_item().as_secs_f64() * 1e3,
                })).collect::<Vec<_>>(),
                "not_loaded": p.not_loaded.iter().map(|(b, why)| json!({"backend": b, "reason": why})).collect::<Vec<_>>(),
            })
        })
        .collect();
    let status = if all_ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = json!({
        "status": if all_ok { "ok" } else { "unavailable" },
        "models": models,
    });
    (status, Json(body)).into_response()
}

async fn metrics(State(server): State<Arc<Server>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        server.metrics.render(&server.pools),
    )
        .into_response()
}

/// Embeds `texts` on `pool` (batched with other requests).
async fn embed_texts(
    server: &Server,
    pool: &Pool,
    texts: Vec<String>,
    normalize: bool,
) -> Result<Vec<Vec<f32>>, ApiError> {
    let (reply, rx) = oneshot::channel();
    let work = Work::Encode(EncodeJob {
        texts,
        task: EncodeTask::Embed { normalize, reply },
    });
    let deadline = server.submit(pool, work)?;
    server.answer(deadline, rx).await
}

async fn embeddings(
    State(server): State<Arc<Server>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let request: EmbeddingsRequest = parse(body)?;
    let pool = server.pool(&request.model, ModelKind::Encoder, "/v1/embeddings")?;
    let texts = match request.input {
        EmbeddingInput::Text(t) => t.into_vec(),
        EmbeddingInput::Tokens(_) => {
            return Err(ApiError::bad_request(
                "token-id input is not supported by this server: send the text",
            ))
        }
    };
    let base64 = match request.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "encoding_format `{other}`: use `float` or `base64`"
            )))
        }
    };
    if let (Some(d), Engine::Encoder(p)) = (request.dimensions, pool.engine()) {
        if d != p.config().hidden_size {
            return Err(ApiError::bad_request(format!(
                "dimensions {d}: this model's embeddings have {} (shortening is not supported)",
                p.config().hidden_size
            )));
        }
    }
    let tokens = server.check_texts(&pool, &texts, request.truncate)?;
    let vectors = embed_texts(&server, &pool, texts, true).await?;
    let data = vectors
        .into_iter()
        .enumerate()
        .map(|(index, v)| EmbeddingData {
            object: "embedding",
            index,
            embedding: if base64 {
                Embedding::Base64(base64_f32(&v))
            } else {
                Embedding::Float(v)
            },
        })
        .collect();
    let body = EmbeddingsResponse {
        object: "list",
        data,
        model: pool.name.clone(),
        usage: Usage {
            prompt_tokens: tokens,
            completion_tokens: None,
            total_tokens: tokens,
        },
    };
    Ok(with_model(&pool.name, Json(body)))
}

fn base64_f32(v: &[f32]) -> String {
    use base64::Engine as _;
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

async fn tei_embed(
    State(server): State<Arc<Server>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let request: TeiEmbedRequest = parse(body)?;
    let pool = server.pool_or_default(request.model.as_deref(), ModelKind::Encoder, "/embed")?;
    let texts = request.inputs.into_vec();
    server.check_texts(&pool, &texts, request.truncate)?;
    let vectors = embed_texts(&server, &pool, texts, request.normalize).await?;
    Ok(with_model(&pool.name, Json(vectors)))
}

async fn tei_predict(
    State(server): State<Arc<Server>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let request: TeiPredictRequest = parse(body)?;
    let pool = server.pool_or_default(request.model.as_deref(), ModelKind::Encoder, "/predict")?;
    if !pool.classifies {
        return Err(ApiError::bad_request(format!(
            "model `{}` has no sequence-classification head; /predict needs one",
            pool.name
        )));
    }
    let single = matches!(request.inputs, OneOrMany::One(_));
    let texts = request.inputs.into_vec();
    server.check_texts(&pool, &texts, request.truncate)?;
    let (reply, rx) = oneshot::channel();
    let work = Work::Encode(EncodeJob {
        texts,
        task: EncodeTask::Predict { reply },
    });
    let deadline = server.submit(&pool, work)?;
    let mut labels = server.answer(deadline, rx).await?;
    let body = if single {
        json!(labels.pop().unwrap_or_default())
    } else {
        json!(labels)
    };
    Ok(with_model(&pool.name, Json(body)))
}

/// Starts a generation; the receiver gets its events.
fn start_generation(
    server: &Server,
    pool: &Pool,
    prompt: Prompt,
    fields: &SamplingFields,
    default_max_tokens: usize,
) -> Result<(mpsc::UnboundedReceiver<Event>, Instant), ApiError> {
    let (options, stop) = server.generation(fields, default_max_tokens)?;
    let (tx, rx) = mpsc::unbounded_channel();
    let job = GenerateJob::new(
        prompt,
        options,
        stop,
        tx,
        server.options.request_timeout.as_secs_f64(),
    );
    let deadline = server.submit(pool, Work::Generate(job))?;
    Ok((rx, deadline))
}

/// Collects a whole generation (non-streamed requests).
async fn collect(
    server: &Server,
    mut rx: mpsc::UnboundedReceiver<Event>,
    deadline: Instant,
) -> Result<(String, Finish), ApiError> {
    let mut text = String::new();
    let work = async {
        while let Some(event) = rx.recv().await {
            match event {
                Event::Text(t) => text.push_str(&t),
                Event::Done(f) => return Ok(f),
                Event::Error(e) => return Err(e),
            }
        }
        Err(ApiError::internal("the generation ended without an answer"))
    };
    match tokio::time::timeout_at(deadline.into(), work).await {
        Ok(Ok(finish)) => Ok((text, finish)),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(ApiError::timeout(
            server.options.request_timeout.as_secs_f64(),
        )),
    }
}

fn usage(f: &Finish) -> Usage {
    Usage {
        prompt_tokens: f.prompt_tokens,
        completion_tokens: Some(f.completion_tokens),
        total_tokens: f.prompt_tokens + f.completion_tokens,
    }
}

/// Server-sent events of a generation in OpenAI's chunk format: `chunk(text, finish)` builds each
/// chunk; a `data: [DONE]` line ends the stream (after an error chunk on failure).
fn sse(
    rx: mpsc::UnboundedReceiver<Event>,
    first: Option<serde_json::Value>,
    include_usage: bool,
    chunk: impl Fn(Option<&str>, Option<&'static str>, Option<Usage>) -> serde_json::Value
        + Send
        + Sync
        + 'static,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let head = stream::iter(first.map(|v| Ok(SseEvent::default().data(v.to_string()))));
    let chunk = Arc::new(chunk);
    let body = stream::unfold((rx, false), move |(mut rx, finished)| {
        let chunk = chunk.clone();
        async move {
            if finished {
                return None;
            }
            let (lines, done) = match rx.recv().await {
                Some(Event::Text(t)) => (vec![chunk(Some(&t), None, None).to_string()], false),
                Some(Event::Done(f)) => {
                    let mut lines = vec![chunk(None, Some(f.reason), None).to_string()];
                    if include_usage {
                        lines.push(chunk(None, None, Some(usage(&f))).to_string());
                    }
                    lines.push("[DONE]".to_string());
                    (lines, true)
                }
                Some(Event::Error(e)) => (vec![e.body().to_string(), "[DONE]".to_string()], true),
                None => (vec!["[DONE]".to_string()], true),
            };
            Some((
                stream::iter(lines.into_iter().map(|l| Ok(SseEvent::default().data(l)))),
                (rx, done),
            ))
        }
    })
    .flatten();
    Sse::new(head.chain(body)).keep_alive(KeepAlive::default())
}

async fn completions(
    State(server): State<Arc<Server>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let request: CompletionRequest = parse(body)?;
    let pool = server.pool(&request.model, ModelKind::Generator, "/v1/completions")?;
    let mut prompts = request.prompt.into_vec();
    if prompts.len() != 1 {
        return Err(ApiError::bad_request("prompt must be one string"));
    }
    let prompt = prompts.remove(0);
    if prompt.len() > server.options.max_input_bytes {
        return Err(ApiError::too_large(format!(
            "the prompt is {} bytes; the server takes at most {} (--max-input-bytes)",
            prompt.len(),
            server.options.max_input_bytes
        )));
    }
    let (rx, deadline) =
        start_generation(&server, &pool, Prompt::Text(prompt), &request.sampling, 16)?;
    let id = server.next_id("cmpl");
    let created = now_unix();
    let model = pool.name.clone();
    if request.sampling.stream {
        let include_usage = request
            .sampling
            .stream_options
            .is_some_and(|o| o.include_usage);
        let chunk = move |text: Option<&str>,
                          finish: Option<&'static str>,
                          usage: Option<Usage>| {
            let choices = if usage.is_some() {
                json!([])
            } else {
                json!([{ "text": text.unwrap_or(""), "index": 0, "logprobs": null, "finish_reason": finish }])
            };
            let mut v = json!({ "id": id, "object": "text_completion", "created": created, "model": model, "choices": choices });
            if let Some(u) = usage {
                v["usage"] = json!(u);
            }
            v
        };
        return Ok(with_model(&pool.name, sse(rx, None, include_usage, chunk)));
    }
    let (text, finish) = collect(&server, rx, deadline).await?;
    let body = json!({
        "id": id,
        "object": "text_completion",
        "created": created,
        "model": pool.name,
        "choices": [{ "text": text, "index": 0, "logprobs": null, "finish_reason": finish.reason }],
        "usage": usage(&finish),
    });
    Ok(with_model(&pool.name, Json(body)))
}

/// A request's messages as the chat template takes them.
fn chat_messages(
    messages: Vec<RequestMessage>,
    max_bytes: usize,
) -> Result<Vec<ChatMessage>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::bad_request("messages is empty"));
    }
    let mut total = 0usize;
    messages
        .into_iter()
        .enumerate()
        .map(|(i, m)| {
            let role = match m.role.as_str() {
                "developer" => "system".to_string(),
                "system" | "user" | "assistant" => m.role,
                other => {
                    return Err(ApiError::bad_request(format!(
                        "messages[{i}].role `{other}`: use system, user or assistant"
                    )))
                }
            };
            let content = match m.content {
                None => String::new(),
                Some(Content::Text(t)) => t,
                Some(Content::Parts(parts)) => {
                    let mut text = String::new();
                    for p in parts {
                        match (p.kind.as_str(), p.text) {
                            ("text", Some(t)) => text.push_str(&t),
                            (kind, _) => {
                                return Err(ApiError::bad_request(format!(
                                    "messages[{i}]: content parts of type `{kind}` are not supported (text only)"
                                )))
                            }
                        }
                    }
                    text
                }
            };
            total += content.len();
            if total > max_bytes {
                return Err(ApiError::too_large(format!(
                    "the messages hold more than {max_bytes} bytes (--max-input-bytes)"
                )));
            }
            Ok(ChatMessage { role, content })
        })
        .collect()
}

async fn chat_completions(
    State(server): State<Arc<Server>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let request: ChatRequest = parse(body)?;
    let pool = server.pool(&request.model, ModelKind::Generator, "/v1/chat/completions")?;
    let messages = chat_messages(request.messages, server.options.max_input_bytes)?;
    let default_max = server.options.default_max_tokens;
    let (rx, deadline) = start_generation(
        &server,
        &pool,
        Prompt::Chat(messages),
        &request.sampling,
        default_max,
    )?;
    let id = server.next_id("chatcmpl");
    let created = now_unix();
    let model = pool.name.clone();
    if request.sampling.stream {
        let include_usage = request
            .sampling
            .stream_options
            .is_some_and(|o| o.include_usage);
        let envelope = {
            let (id, model) = (id.clone(), model.clone());
            move |choices: serde_json::Value| json!({ "id": id, "object": "chat.completion.chunk", "created": created, "model": model, "choices": choices })
        };
        let first = envelope(
            json!([{ "index": 0, "delta": { "role": "assistant", "content": "" }, "logprobs": null, "finish_reason": null }]),
        );
        let chunk = move |text: Option<&str>,
                          finish: Option<&'static str>,
                          usage: Option<Usage>| {
            if let Some(u) = usage {
                let mut v = envelope(json!([]));
                v["usage"] = json!(u);
                return v;
            }
            let delta = match text {
                Some(t) => json!({ "content": t }),
                None => json!({}),
            };
            envelope(
                json!([{ "index": 0, "delta": delta, "logprobs": null, "finish_reason": finish }]),
            )
        };
        return Ok(with_model(
            &pool.name,
            sse(rx, Some(first), include_usage, chunk),
        ));
    }
    let (text, finish) = collect(&server, rx, deadline).await?;
    let body = json!({
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{
            "index": 0,
            "message": { "role": "assistant", "content": text },
            "logprobs": null,
            "finish_reason": finish.reason,
        }],
        "usage": usage(&finish),
    });
    Ok(with_model(&pool.name, Json(body)))
}

/// The fields of a multipart form: the `file` bytes and the text fields.
struct Form {
    file: Option<Bytes>,
    fields: Vec<(String, String)>,
}

impl Form {
    async fn read(
        multipart: Result<Multipart, axum::extract::multipart::MultipartRejection>,
    ) -> Result<Form, ApiError> {
        let mut multipart = multipart.map_err(|e| ApiError {
            status: e.status(),
            ..ApiError::bad_request(e.body_text())
        })?;
        let mut form = Form {
            file: None,
            fields: Vec::new(),
        };
        let bad = |e: axum::extract::multipart::MultipartError| {
            let status = e.status();
            let message = format!("reading the multipart form: {}", e.body_text());
            if status == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::too_large(message)
            } else {
                ApiError::bad_request(message)
            }
        };
        while let Some(field) = multipart.next_field().await.map_err(bad)? {
            let name = field.name().unwrap_or_default().to_string();
            if name == "file" {
                form.file = Some(field.bytes().await.map_err(bad)?);
            } else {
                let value = field.text().await.map_err(bad)?;
                form.fields.push((name, value));
            }
        }
        Ok(form)
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn require(&self, name: &str) -> Result<&str, ApiError> {
        self.get(name)
            .ok_or_else(|| ApiError::bad_request(format!("the form has no `{name}` field")))
    }

    fn file(&self) -> Result<&Bytes, ApiError> {
        self.file
            .as_ref()
            .ok_or_else(|| ApiError::bad_request("the form has no `file` field"))
    }

    fn number<T: std::str::FromStr>(&self, name: &str, default: T) -> Result<T, ApiError> {
        match self.get(name) {
            None => Ok(default),
            Some(v) => v
                .trim()
                .parse()
                .map_err(|_| ApiError::bad_request(format!("`{name}`: `{v}` is not a number"))),
        }
    }
}

/// Runs `run` on a replica of `pool` alone (not batched) and waits for its answer.
async fn single<T: Send + 'static>(
    server: &Server,
    pool: &Pool,
    run: impl FnMut(&Engine) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let (reply, rx) = oneshot::channel();
    let work = Work::Single(Box::new(Call {
        run,
        reply: Some(reply),
    }));
    let deadline = server.submit(pool, work)?;
    server.answer(deadline, rx).await
}

fn decode_image(bytes: &[u8]) -> Result<ipfs_accelerate_preprocess::image::RgbImage, ApiError> {
    ipfs_accelerate_preprocess::image::decode_image(bytes)
        .map_err(|e| ApiError::bad_request(format!("the uploaded image: {e}")))
}

async fn transcriptions(
    State(server): State<Arc<Server>>,
    multipart: Result<Multipart, axum::extract::multipart::MultipartRejection>,
) -> Result<Response, ApiError> {
    let form = Form::read(multipart).await?;
    let pool = server.pool(
        form.require("model")?,
        ModelKind::Speech,
        "/v1/audio/transcriptions",
    )?;
    if form.get("language").is_some_and(|l| !l.is_empty()) {
        return Err(ApiError::bad_request(
            "`language` per request is not supported: the served model detects it (Whisper) or has one (Wav2Vec2)",
        ));
    }
    let format = form.get("response_format").unwrap_or("json").to_string();
    if !matches!(format.as_str(), "json" | "text" | "verbose_json") {
        return Err(ApiError::bad_request(format!(
            "response_format `{format}`: use json, text or verbose_json"
        )));
    }
    let audio = ipfs_accelerate_preprocess::audio::decode_wav(form.file()?)
        .map_err(|e| ApiError::bad_request(format!("the uploaded audio (WAV): {e}")))?;
    let transcript = single(&server, &pool, move |engine| match engine {
        Engine::Speech(asr) => Ok(asr.transcribe(&audio)?.value),
        _ => Err(ApiError::internal("speech work on another kind of replica")),
    })
    .await?;
    let response = match format.as_str() {
        "text" => transcript.text.into_response(),
        "verbose_json" => Json(json!({
            "task": "transcribe",
            "duration": transcript.duration_s,
            "text": transcript.text,
            "truncated": transcript.truncated,
        }))
        .into_response(),
        _ => Json(json!({ "text": transcript.text })).into_response(),
    };
    Ok(with_model(&pool.name, response))
}

/// An image task: reads the form, picks the `kind` model it names, decodes `file`, reads the
/// task's own fields with `params`, runs `run` on a replica, and answers `{"model", key: result}`.
async fn image_task<T, P>(
    server: &Server,
    multipart: Result<Multipart, axum::extract::multipart::MultipartRejection>,
    (kind, endpoint, key): (ModelKind, &str, &str),
    params: impl FnOnce(&Form) -> Result<P, ApiError>,
    run: fn(&Engine, &ipfs_accelerate_preprocess::image::RgbImage, &P) -> Result<Vec<T>, ApiError>,
) -> Result<Response, ApiError>
where
    T: serde::Serialize + Send + 'static,
    P: Send + 'static,
{
    let form = Form::read(multipart).await?;
    let pool = server.pool(form.require("model")?, kind, endpoint)?;
    let params = params(&form)?;
    let image = decode_image(form.file()?)?;
    let result = single(server, &pool, move |engine| run(engine, &image, &params)).await?;
    let mut body = json!({ "model": pool.name });
    body[key] = json!(result);
    Ok(with_model(&pool.name, Json(body)))
}

fn wrong_replica() -> ApiError {
    ApiError::internal("image work on another kind of replica")
}

async fn image_classifications(
    State(server): State<Arc<Server>>,
    multipart: Result<Multipart, axum::extract::multipart::MultipartRejection>,
) -> Result<Response, ApiError> {
    let task = (
        ModelKind::ImageClassifier,
        "/v1/images/classifications",
        "predictions",
    );
    image_task(
        &server,
        multipart,
        task,
        |f| f.number("top_k", 5usize),
        |engine, image, top_k| match engine {
            Engine::ImageClassifier(m) => Ok(m
                .classify(std::slice::from_ref(image), *top_k)?
                .value
                .into_iter()
                .next()
                .unwrap_or_default()),
            _ => Err(wrong_replica()),
        },
    )
    .await
}

async fn image_detections(
    State(server): State<Arc<Server>>,
    multipart: Result<Multipart, axum::extract::multipart::MultipartRejection>,
) -> Result<Response, ApiError> {
    let task = (ModelKind::Detector, "/v1/images/detections", "detections");
    image_task(
        &server,
        multipart,
        task,
        |f| f.number("threshold", 0.9f64),
        |engine, image, threshold| match engine {
            Engine::Detector(m) => Ok(m
                .detect(std::slice::from_ref(image), *threshold)?
                .value
                .into_iter()
                .next()
                .unwrap_or_default()),
            _ => Err(wrong_replica()),
        },
    )
    .await
}

/// The labels and template of a zero-shot request.
fn zero_shot_fields(form: &Form) -> Result<(Vec<String>, String), ApiError> {
    let labels: Vec<String> = form
        .require("labels")?
        .split(',')
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect();
    if labels.is_empty() || labels.len() > 256 {
        return Err(ApiError::bad_request(
            "`labels`: 1 to 256 comma-separated labels",
        ));
    }
    let template = form
        .get("template")
        .unwrap_or("a photo of a {}")
        .to_string();
    Ok((labels, template))
}

async fn image_zero_shot(
    State(server): State<Arc<Server>>,
    multipart: Result<Multipart, axum::extract::multipart::MultipartRejection>,
) -> Result<Response, ApiError> {
    let task = (ModelKind::ZeroShotImage, "/v1/images/zero-shot", "scores");
    image_task(
        &server,
        multipart,
        task,
        zero_shot_fields,
        |engine, image, (labels, template)| match engine {
            Engine::ZeroShotImage(m) => {
                let refs: Vec<&str> = labels.iter().map(String::as_str).collect();
                Ok(m.classify(std::slice::from_ref(image), &refs, template)?
                    .value
                    .into_iter()
                    .next()
                    .unwrap_or_default())
            }
            _ => Err(wrong_replica()),
        },
    )
    .await
}
