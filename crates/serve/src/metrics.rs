//! Prometheus metrics of the server (`GET /metrics`, text format).

use std::time::Duration;

use prometheus::{
    Encoder, Gauge, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

use crate::pool::{Pool, Replica};

/// The server's metric families.
pub struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    latency: HistogramVec,
    batch_size: HistogramVec,
    queue_depth: IntGaugeVec,
    replica_healthy: IntGaugeVec,
    generated_tokens: IntCounterVec,
    generation_joins: IntCounterVec,
    decode_rate: GaugeVec,
    device_memory: IntGaugeVec,
    in_flight: Gauge,
}

fn histogram(name: &str, help: &str, labels: &[&str], buckets: Vec<f64>) -> HistogramVec {
    HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets), labels)
        .expect("a valid histogram definition")
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Self {
        let registry = Registry::new_custom(Some("ipfs_accelerate".into()), None)
            .expect("a valid registry prefix");
        let requests = IntCounterVec::new(
            Opts::new(
                "requests_total",
                "HTTP requests by endpoint, model and status",
            ),
            &["endpoint", "model", "status"],
        )
        .expect("a valid counter");
        let latency = histogram(
            "request_duration_seconds",
            "Request latency from arrival to the last byte of the answer being produced",
            &["endpoint", "model"],
            prometheus::exponential_buckets(0.001, 2.0, 18).expect("valid buckets"),
        );
        let batch_size = histogram(
            "batch_size",
            "Items per batched encoder forward; requests per generation batch as it starts",
            &["model"],
            vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0],
        );
        let queue_depth = IntGaugeVec::new(
            Opts::new("queue_depth", "Items queued or running per replica"),
            &["model", "replica", "backend"],
        )
        .expect("a valid gauge");
        let replica_healthy = IntGaugeVec::new(
            Opts::new(
                "replica_healthy",
                "1 while a replica serves, 0 once taken out",
            ),
            &["model", "replica", "backend"],
        )
        .expect("a valid gauge");
        let generated_tokens = IntCounterVec::new(
            Opts::new("generated_tokens_total", "Tokens generated"),
            &["model"],
        )
        .expect("a valid counter");
        let generation_joins = IntCounterVec::new(
            Opts::new(
                "generation_joins_total",
                "Generation requests that joined a batch while it decoded (continuous batching)",
            ),
            &["model"],
        )
        .expect("a valid counter");
        let decode_rate = GaugeVec::new(
            Opts::new(
                "decode_tokens_per_second",
                "Decode speed of the last generation",
            ),
            &["model"],
        )
        .expect("a valid gauge");
        let device_memory = IntGaugeVec::new(
            Opts::new(
                "device_memory_bytes",
                "Device memory in use as the backend reports it after a replica's last call",
            ),
            &["model", "replica", "backend"],
        )
        .expect("a valid gauge");
        let in_flight =
            Gauge::new("requests_in_flight", "Requests being answered").expect("a valid gauge");
        for c in [
            Box::new(requests.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(latency.clone()),
            Box::new(batch_size.clone()),
            Box::new(queue_depth.clone()),
            Box::new(replica_healthy.clone()),
            Box::new(generated_tokens.clone()),
            Box::new(generation_joins.clone()),
            Box::new(decode_rate.clone()),
            Box::new(device_memory.clone()),
            Box::new(in_flight.clone()),
        ] {
            registry.register(c).expect("metric names are unique");
        }
        Metrics {
            registry,
            requests,
            latency,
            batch_size,
            queue_depth,
            replica_healthy,
            generated_tokens,
            generation_joins,
            decode_rate,
            device_memory,
            in_flight,
        }
    }

    /// A finished request.
    pub fn observe_request(&self, endpoint: &str, model: &str, status: u16, took: Duration) {
        self.requests
            .with_label_values(&[endpoint, model, &status.to_string()])
            .inc();
        self.latency
            .with_label_values(&[endpoint, model])
            .observe(took.as_secs_f64());
    }

    /// Requests being answered: +1 on arrival, -1 when done.
    pub fn in_flight(&self, delta: f64) {
        self.in_flight.add(delta);
    }

    /// Generation requests that joined a running batch.
    pub fn observe_joins(&self, model: &str, requests: usize) {
        self.generation_joins
            .with_label_values(&[model])
            .inc_by(requests as u64);
    }

    /// One batched forward of `items` (a generation batch: its requests as it starts).
    pub fn observe_batch(&self, model: &str, items: usize) {
        self.batch_size
            .with_label_values(&[model])
            .observe(items as f64);
    }

    /// One finished generation.
    pub fn observe_generation(&self, model: &str, tokens: usize, tokens_per_s: f64) {
        self.generated_tokens
            .with_label_values(&[model])
            .inc_by(tokens as u64);
        if tokens_per_s > 0.0 {
            self.decode_rate
                .with_label_values(&[model])
                .set(tokens_per_s);
        }
    }

    /// The device memory a call's metrics report.
    pub fn observe_memory(
        &self,
        model: &str,
        replica: &Replica,
        metrics: &ipfs_accelerate::Metrics,
    ) {
        if let Some(bytes) = metrics.memory_bytes {
            self.device_memory
                .with_label_values(&[model, &replica.index.to_string(), &replica.backend])
                .set(i64::try_from(bytes).unwrap_or(i64::MAX));
        }
    }

    /// The text exposition, with the pools' queue depths and health read now.
    pub fn render(&self, pools: &[std::sync::Arc<Pool>]) -> String {
        for pool in pools {
            for r in &pool.replicas {
                let labels = [pool.name.as_str(), &r.index.to_string(), &r.backend];
                self.queue_depth
                    .with_label_values(&labels)
                    .set(r.depth() as i64);
                self.replica_healthy
                    .with_label_values(&labels)
                    .set(i64::from(r.failure().is_none()));
            }
        }
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("text encoding into memory");
        String::from_utf8(out).unwrap_or_default()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
