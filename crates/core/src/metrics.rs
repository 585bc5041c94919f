//! Measured timings of one pipeline call.

use std::time::{Duration, Instant};

/// The timing breakdown of a call, all measured with a monotonic clock (device work is
/// synchronised before the clock is read).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Metrics {
    /// Backend the call ran on.
    pub backend: String,
    /// Model load and backend initialisation (reported once, on the first call of a pipeline).
    pub init: Duration,
    /// Tokenisation / image / audio preprocessing.
    pub preprocess: Duration,
    /// Model forward on the device.
    pub inference: Duration,
    /// Pooling, softmax, span extraction, decoding.
    pub postprocess: Duration,
    /// Wall-clock time of the whole call.
    pub total: Duration,
    /// Items processed (texts, images, ...).
    pub items: usize,
    /// Tokens processed, where that applies (padding included).
    pub tokens: usize,
    /// Inputs that were truncated to the model's maximum length.
    pub truncated: usize,
    /// Memory in use by the backend after the call, when known.
    pub memory_bytes: Option<u64>,
}

impl Metrics {
    /// Items per second over the total time.
    pub fn items_per_second(&self) -> f64 {
        per_second(self.items, self.total)
    }

    /// Tokens per second over the inference time.
    pub fn tokens_per_second(&self) -> f64 {
        per_second(self.tokens, self.inference)
    }
}

fn per_second(n: usize, d: Duration) -> f64 {
    let s = d.as_secs_f64();
    if s > 0.0 {
        n as f64 / s
    } else {
        0.0
    }
}

/// A started clock; `lap` returns the time since the previous lap.
#[derive(Debug, Clone, Copy)]
pub struct Stopwatch {
    start: Instant,
    last: Instant,
}

impl Default for Stopwatch {
    fn default() -> Self {
        Self::start()
    }
}

impl Stopwatch {
    /// Starts the clock.
    pub fn start() -> Self {
        let now = Instant::now();
        Stopwatch {
            start: now,
            last: now,
        }
    }

    /// Time since the previous lap (or the start).
    pub fn lap(&mut self) -> Duration {
        let now = Instant::now();
        let d = now - self.last;
        self.last = now;
        d
    }

    /// Time since the start.
    pub fn total(&self) -> Duration {
        self.start.elapsed()
    }
}
