//! # ipfs-accelerate-serve
//!
//! An HTTP server for ipfs-accelerate models, so that any language, and many callers at once,
//! can use one loaded model:
//!
//! - OpenAI-compatible: `GET /v1/models`, `POST /v1/embeddings`, `/v1/completions`,
//!   `/v1/chat/completions` (server-sent events with `stream: true`), `/v1/audio/transcriptions`;
//! - text-embeddings-inference-compatible: `POST /embed`, `/predict`;
//! - the image tasks: `POST /v1/images/classifications`, `/v1/images/detections`,
//!   `/v1/images/zero-shot` (multipart uploads, as `/v1/audio/transcriptions`);
//! - `GET /health` (replicas, their queues, and why any was taken out) and `GET /metrics`
//!   (Prometheus text).
//!
//! Concurrent encoder requests are merged into one forward (see [`pool`]); a model may have
//! replicas on several backends, and requests go to the one expected to answer first.
//!
//! ```no_run
//! use ipfs_accelerate_serve::{ModelSpec, ServeOptions, Server};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let options = ServeOptions {
//!     models: vec![ModelSpec::parse("embedded")?],
//!     ..ServeOptions::default()
//! };
//! let server = Server::load(options)?;
//! // Mount `router` in your own axum application, or run it alone:
//! let app = ipfs_accelerate_serve::router(server.clone());
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! ipfs_accelerate_serve::serve(server, listener, ipfs_accelerate_serve::shutdown_signal()).await?;
//! # drop(app);
//! # Ok(())
//! # }
//! ```

mod engine;
mod error;
mod generate;
mod metrics;
pub mod pool;
mod routes;
pub mod wire;

use std::future::{Future, IntoFuture};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use ipfs_accelerate::{BackendKind, LoadOptions, Precision, WeightQuantization};

pub use engine::{Engine, ModelKind};
pub use error::ApiError;
pub use metrics::Metrics;
pub use pool::{Batching, Pool};
pub use routes::router;

/// A model to serve: the name requests use, and where it comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelSpec {
    /// The `model` field requests name it by.
    pub name: String,
    /// `embedded`, a `.gguf` file, a checkpoint folder or a hub id.
    pub source: String,
}

impl ModelSpec {
    /// `NAME=SOURCE`, or `SOURCE` alone (named by its last path component without a `.gguf`
    /// extension; a hub id keeps its `org/name`).
    pub fn parse(spec: &str) -> Result<ModelSpec, ServeError> {
        let (name, source) = match spec.split_once('=') {
            Some((n, s)) => (n.trim().to_string(), s.trim().to_string()),
            None => {
                let source = spec.trim().to_string();
                let path = std::path::Path::new(&source);
                let name = if path.exists() {
                    let stem = if path.is_file() {
                        path.file_stem()
                    } else {
                        path.file_name()
                    };
                    stem.map(|s| s.to_string_lossy().into_owned())
                        .unwrap_or_else(|| source.clone())
                } else {
                    source.clone()
                };
                (name, source)
            }
        };
        if name.is_empty() || source.is_empty() {
            return Err(ServeError::InvalidSpec(format!(
                "model `{spec}`: expected NAME=SOURCE or SOURCE"
            )));
        }
        Ok(ModelSpec { name, source })
    }
}

/// `BACKEND:COUNT` replicas of every model (`cpu:2`, `onnx-cpu:1`, `cuda:1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaSpec {
    /// The backend they run on.
    pub backend: BackendKind,
    /// How many.
    pub count: usize,
}

impl ReplicaSpec {
    /// Parses a comma-separated list (`cuda:1,cpu:1`; a missing count is 1).
    pub fn parse_list(list: &str) -> Result<Vec<ReplicaSpec>, ServeError> {
        list.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|item| {
                let (backend, count) = match item.rsplit_once(':') {
                    Some((b, c)) => (
                        b,
                        c.parse::<usize>().map_err(|_| {
                            ServeError::InvalidSpec(format!(
                                "replicas `{item}`: `{c}` is not a count"
                            ))
                        })?,
                    ),
                    None => (item, 1),
                };
                let backend = backend
                    .parse::<BackendKind>()
                    .map_err(|e| ServeError::InvalidSpec(format!("replicas `{item}`: {e}")))?;
                if count == 0 || count > 64 {
                    return Err(ServeError::InvalidSpec(format!(
                        "replicas `{item}`: the count must be 1 to 64"
                    )));
                }
                Ok(ReplicaSpec { backend, count })
            })
            .collect()
    }
}

/// Why a server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A `--model` or `--replicas` value is malformed.
    #[error("{0}")]
    InvalidSpec(String),
    /// No replica of a model could be loaded.
    #[error("model `{model}` could not be loaded: {reasons}")]
    Load {
        /// The model's name.
        model: String,
        /// Each attempt's error.
        reasons: String,
    },
    /// Binding or serving failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// What a server runs and its limits.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The models, each under its name.
    pub models: Vec<ModelSpec>,
    /// Replicas of every model; empty: one, on the first usable backend of `backends`.
    pub replicas: Vec<ReplicaSpec>,
    /// Backend preference when `replicas` is empty (`None`: the default preferences).
    pub backends: Option<Vec<BackendKind>>,
    /// Never download.
    pub offline: bool,
    /// Keep linear weights quantized (int8 / int4).
    pub quantization: WeightQuantization,
    /// The float type to compute in.
    pub precision: Precision,
    /// Required as `Authorization: Bearer <key>` on the API routes when set.
    pub api_key: Option<String>,
    /// How encoder requests are merged.
    pub batching: Batching,
    /// Requests queued per replica at most; beyond, 503 with `Retry-After`.
    pub queue_capacity: usize,
    /// Request body bytes at most (413 beyond).
    pub max_body_bytes: usize,
    /// Texts per embeddings / predict request at most.
    pub max_inputs: usize,
    /// Bytes per text, prompt or conversation at most.
    pub max_input_bytes: usize,
    /// `max_tokens` a request may ask for at most.
    pub max_tokens_limit: usize,
    /// `max_tokens` of a chat request that gives none (completions default to 16, as OpenAI).
    pub default_max_tokens: usize,
    /// A request still unanswered after this gets 504 (its generation is stopped).
    pub request_timeout: Duration,
    /// After SIGTERM / Ctrl-C, in-flight requests get this long to finish.
    pub shutdown_timeout: Duration,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            models: Vec::new(),
            replicas: Vec::new(),
            backends: None,
            offline: false,
            quantization: WeightQuantization::None,
            precision: Precision::F32,
            api_key: None,
            batching: Batching {
                enabled: true,
                max_batch: 64,
                max_wait: Duration::from_millis(5),
                max_generations: 8,
                continuous: true,
            },
            queue_capacity: 1024,
            max_body_bytes: 32 << 20,
            max_inputs: 1024,
            max_input_bytes: 1 << 20,
            max_tokens_limit: 4096,
            default_max_tokens: 256,
            request_timeout: Duration::from_secs(300),
            shutdown_timeout: Duration::from_secs(30),
        }
    }
}

/// A running server's models, limits and metrics.
pub struct Server {
    pools: Vec<Arc<Pool>>,
    options: ServeOptions,
    metrics: Arc<Metrics>,
    started_unix: u64,
    request_ids: AtomicU64,
}

impl Server {
    /// Loads every model's replicas (blocking; minutes for large checkpoints) and starts their
    /// workers. A replica whose backend cannot load it is skipped with the reason (`/health`
    /// lists it); a model with no replica loaded is an error.
    pub fn load(options: ServeOptions) -> Result<Arc<Server>, ServeError> {
        if options.models.is_empty() {
            return Err(ServeError::InvalidSpec("no model to serve".into()));
        }
        let mut names = std::collections::HashSet::new();
        for m in &options.models {
            if !names.insert(m.name.as_str()) {
                return Err(ServeError::InvalidSpec(format!(
                    "two models are named `{}`: name them with NAME=SOURCE",
                    m.name
                )));
            }
        }
        let metrics = Arc::new(Metrics::new());
        let mut pools = Vec::new();
        for spec in &options.models {
            let kind =
                ModelKind::of(&spec.source, options.offline).map_err(|e| ServeError::Load {
                    model: spec.name.clone(),
                    reasons: e.to_string(),
                })?;
            let attempts: Vec<(String, Option<Vec<BackendKind>>)> = if options.replicas.is_empty() {
                vec![("default".into(), options.backends.clone())]
            } else {
                options
                    .replicas
                    .iter()
                    .flat_map(|r| {
                        std::iter::repeat_n((r.backend.to_string(), Some(vec![r.backend])), r.count)
                    })
                    .collect()
            };
            let mut engines = Vec::new();
            let mut not_loaded = Vec::new();
            for (label, backends) in attempts {
                let load = LoadOptions {
                    backends,
                    offline: options.offline,
                    quantization: options.quantization,
                    share_weights: true,
                    precision: options.precision,
                    ..Default::default()
                };
                tracing::info!(model = %spec.name, source = %spec.source, replica = %label, "loading");
                match Engine::load(kind, &spec.source, &load) {
                    Ok(engine) => engines.push(engine),
                    Err(e) => {
                        tracing::warn!(model = %spec.name, replica = %label, error = %e, "replica not loaded");
                        not_loaded.push((label, e.to_string()));
                    }
                }
            }
            if engines.is_empty() {
                return Err(ServeError::Load {
                    model: spec.name.clone(),
                    reasons: not_loaded
                        .iter()
                        .map(|(b, e)| format!("{b}: {e}"))
                        .collect::<Vec<_>>()
                        .join("; "),
                });
            }
            pools.push(Pool::start(
                spec.name.clone(),
                kind,
                engines,
                not_loaded,
                pool::PoolSettings {
                    batching: options.batching,
                    queue_capacity: options.queue_capacity,
                    metrics: metrics.clone(),
                },
            ));
        }
        Ok(Arc::new(Server {
            pools,
            options,
            metrics,
            started_unix: wire::now_unix(),
            request_ids: AtomicU64::new(0),
        }))
    }

    /// The served models.
    pub fn pools(&self) -> &[Arc<Pool>] {
        &self.pools
    }

    /// The options it runs with.
    pub fn options(&self) -> &ServeOptions {
        &self.options
    }
}

/// Serves `server` on `listener` until `shutdown` completes; then stops accepting connections and
/// gives in-flight requests up to `shutdown_timeout` to finish.
pub async fn serve(
    server: Arc<Server>,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let grace = server.options.shutdown_timeout;
    let (stopping_tx, stopping_rx) = tokio::sync::oneshot::channel::<()>();
    let app = router(server);
    let signal = async move {
        shutdown.await;
        tracing::info!("shutting down: draining in-flight requests");
        let _ = stopping_tx.send(());
    };
    let serving = axum::serve(listener, app).with_graceful_shutdown(signal);
    let serving = std::pin::pin!(serving.into_future());
    tokio::select! {
        result = serving => Ok(result?),
        () = async {
            let _ = stopping_rx.await;
            tokio::time::sleep(grace).await;
        } => {
            tracing::warn!("in-flight requests did not finish within {grace:?}; exiting");
            Ok(())
        }
    }
}

/// Completes on Ctrl-C or (on Unix) SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}
