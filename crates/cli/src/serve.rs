//! `ipfs-accelerate serve`: the HTTP server of `ipfs-accelerate-serve` on a tokio runtime.

use std::time::Duration;

use anyhow::Context;
use ipfs_accelerate_serve::{Batching, ModelSpec, ReplicaSpec, ServeOptions, Server};

use crate::{backend_list, quantization, Cli};

/// Options of `serve` (the models come from the global `--model`, repeated).
#[derive(clap::Args)]
pub(crate) struct ServeArgs {
    /// Address to bind (loopback by default; `0.0.0.0` to accept other machines).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: any free port; the address is printed).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Replicas of every model as BACKEND:COUNT, e.g. `cuda:1,cpu:1` (default: one on the first
    /// usable backend of `--backend`). Requests go to the replica expected to answer first.
    #[arg(long)]
    replicas: Option<String>,
    /// Require `Authorization: Bearer <KEY>` on the API routes (`/health` and `/metrics` stay open).
    #[arg(long, env = "IPFS_ACCELERATE_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Texts per batched encoder forward at most.
    #[arg(long, default_value_t = 64)]
    max_batch: usize,
    /// How long the first request of a batch waits for others, in milliseconds.
    #[arg(long, default_value_t = 5)]
    max_wait_ms: u64,
    /// Generation requests decoded together at most.
    #[arg(long, default_value_t = 8)]
    max_generations: usize,
    /// Static generation batches: a request that arrives while a batch decodes waits for the
    /// next batch instead of joining the running one between steps.
    #[arg(long)]
    no_continuous_batching: bool,
    /// Run every request alone (no merging across requests).
    #[arg(long)]
    no_batching: bool,
    /// Requests queued per replica at most; beyond, 503 with `Retry-After`.
    #[arg(long, default_value_t = 1024)]
    queue_capacity: usize,
    /// Request body bytes at most (413 beyond).
    #[arg(long, default_value_t = 32 << 20)]
    max_body_bytes: usize,
    /// Texts per embeddings / predict request at most.
    #[arg(long, default_value_t = 1024)]
    max_inputs: usize,
    /// Bytes per text, prompt or conversation at most.
    #[arg(long, default_value_t = 1 << 20)]
    max_input_bytes: usize,
    /// `max_tokens` a request may ask for at most.
    #[arg(long, default_value_t = 4096)]
    max_tokens_limit: usize,
    /// `max_tokens` of a chat request that gives none.
    #[arg(long, default_value_t = 256)]
    default_max_tokens: usize,
    /// Seconds before an unanswered request gets 504 (its generation is stopped).
    #[arg(long, default_value_t = 300)]
    request_timeout: u64,
    /// Seconds in-flight requests get to finish after SIGTERM / Ctrl-C.
    #[arg(long, default_value_t = 30)]
    shutdown_timeout: u64,
}

/// Loads the models, binds, and serves until SIGTERM / Ctrl-C.
pub(crate) fn run(cli: &Cli, args: &ServeArgs) -> anyhow::Result<()> {
    if let Some(on) = cli.fusion {
        ipfs_accelerate::set_kernel_fusion(on);
    }
    // Without --model, the embedded sentence-embedding model is served.
    let embedded = ["embedded".to_string()];
    let names = if cli.models.is_empty() {
        &embedded[..]
    } else {
        &cli.models[..]
    };
    let models = names
        .iter()
        .map(|m| ModelSpec::parse(m))
        .collect::<Result<Vec<_>, _>>()?;
    let options = ServeOptions {
        models,
        replicas: match &args.replicas {
            Some(list) => ReplicaSpec::parse_list(list)?,
            None => Vec::new(),
        },
        backends: backend_list(cli)?,
        offline: cli.offline,
        quantization: quantization(cli)?,
        precision: cli.precision,
        api_key: args.api_key.clone().filter(|k| !k.is_empty()),
        batching: Batching {
            enabled: !args.no_batching,
            max_batch: args.max_batch.max(1),
            max_wait: Duration::from_millis(args.max_wait_ms),
            max_generations: args.max_generations.max(1),
            continuous: !args.no_continuous_batching,
        },
        queue_capacity: args.queue_capacity.max(1),
        max_body_bytes: args.max_body_bytes,
        max_inputs: args.max_inputs.max(1),
        max_input_bytes: args.max_input_bytes.max(1),
        max_tokens_limit: args.max_tokens_limit.max(1),
        default_max_tokens: args.default_max_tokens.max(1),
        request_timeout: Duration::from_secs(args.request_timeout.max(1)),
        shutdown_timeout: Duration::from_secs(args.shutdown_timeout),
    };
    let server = Server::load(options).context("loading the models")?;
    for pool in server.pools() {
        let backends: Vec<String> = pool
            .replicas
            .iter()
            .map(|r| format!("{}#{}", r.backend, r.index))
            .collect();
        eprintln!(
            "model {} ({}) on {}",
            pool.name,
            pool.kind.name(),
            backends.join(", ")
        );
        for (backend, reason) in &pool.not_loaded {
            eprintln!("note: replica on {backend} not loaded: {reason}");
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
            .await
            .with_context(|| format!("binding {}:{}", args.host, args.port))?;
        let address = listener.local_addr()?;
        eprintln!("listening on http://{address}");
        ipfs_accelerate_serve::serve(server, listener, ipfs_accelerate_serve::shutdown_signal())
            .await?;
        eprintln!("stopped");
        anyhow::Ok(())
    })
}
